"""Results of an evaluation: one JSONL line per finished cell (so ``--resume`` skips it), then
a final JSON and CSV with every cell."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import torch

from yarnlib import atomic

CELLS = "cells.jsonl"


def settings_id(settings: dict[str, Any]) -> str:
    """A short hash of what makes cells comparable (model, data, samples, …): a resumed run
    reuses only cells computed under the same settings."""
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:12]


def content_id(token_ids) -> str:
    """A short hash of token id tensors: stored results are keyed on the text they measured, so a
    file changed at the same path is measured again, not reused."""
    digest = hashlib.sha1()
    for ids in token_ids:
        digest.update(str(len(ids)).encode() + b":" + ids.to(dtype=torch.int64).numpy().tobytes())
    return digest.hexdigest()[:12]


class CellStore:
    def __init__(
        self,
        output: str | Path,
        key_fields: tuple[str, ...],
        settings: dict,
        resume: bool,
        filename: str = CELLS,
        row_settings: dict[str, dict] | None = None,
        required: tuple[str, ...] = (),
        aliases: tuple[dict, ...] = (),
        labels: tuple[str, ...] | None = None,
    ):
        """``row_settings``: what else makes one method's cells comparable (a spec file's
        content, by row label): an edited file recomputes its own row, not the others.
        ``required``: the fields a stored record must hold besides its key (what is read back).
        ``aliases``: earlier compositions of ``settings`` (with a field since dropped from the
        key) whose records still count: results written before stay resumable.
        ``labels``: the labels of the rows asked for; other rows' records stay in the file but out
        of this run's results (a spec row is out anyway unless asked: its id holds the spec)."""
        self.output = Path(output)
        self.path = self.output / filename
        try:
            self.output.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # e.g. --output names a file
            raise ValueError(
                f"output: {self.output} cannot be a results folder ({error.strerror}); "
                "allowed: a new or existing folder"
            ) from None
        atomic.refuse_symlink(self.path)  # appends would go into whatever it points to
        if self.path.exists() and not self.path.is_file():
            raise ValueError(f"output: {self.path} is not a file; allowed: {filename} as a file")
        self.key_fields = key_fields
        self.required = required
        self.settings = settings
        self.row_settings = row_settings or {}
        self.labels = labels
        self.id, self.ids = self._ids(settings)
        self.alias_ids = [self._ids(a) for a in aliases]
        self.done: dict[tuple, dict] = {}
        self.cut_short = False  # the last line lacks its newline: a kill during an append
        if resume and self.path.is_file():
            text = self.path.read_text()
            self.cut_short = bool(text) and not text.endswith("\n")
            for number, line in enumerate(text.splitlines(), 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
                self._check(record, number)
                if self.labels is not None and record.get("method") not in self.labels:
                    continue
                if record["settings_id"] in self.ids_of(record):
                    self.done[self.key(record)] = record
        else:
            atomic.write_text(self.path, "")  # a fresh run starts a fresh file

    def _check(self, record, number: int) -> None:
        """Refuse a line that parses but is no cell record (edited by hand, another file)."""
        needed = (*self.key_fields, *self.required, "settings_id")
        missing = [f for f in needed if f not in record] if isinstance(record, dict) else needed
        if missing:
            raise ValueError(
                f"resume: {self.path}:{number} is not a cell record (missing {', '.join(missing)}"
                f" in {json.dumps(record)[:80]}); allowed: lines this command wrote. Delete the "
                "line, or run without --resume to start over"
            )

    def _ids(self, settings: dict) -> tuple[str, dict[str, str]]:
        """The id of ``settings`` and of each spec row under it."""
        rows = {m: settings_id({**settings, "row": r}) for m, r in self.row_settings.items()}
        return settings_id(settings), rows

    def id_of(self, record: dict) -> str:
        return self.ids.get(record.get("method"), self.id)

    def ids_of(self, record: dict) -> set[str]:
        """The ids under which a stored record counts: the current one and its aliases'."""
        method = record.get("method")
        return {self.id_of(record), *(rows.get(method, base) for base, rows in self.alias_ids)}

    def key(self, record: dict) -> tuple:
        return tuple(record[f] for f in self.key_fields)

    def has(self, **key) -> bool:
        return tuple(key[f] for f in self.key_fields) in self.done

    def complete(self, methods, lengths, depths=None) -> bool:
        """Whether every (method, length[, depth]) cell is done (then no model needs loading)."""
        cells = [
            dict(method=m.label, length=n, **({} if depths is None else {"depth": d}))
            for m in methods
            for n in lengths
            for d in (depths or [None])
        ]
        return all(self.has(**cell) for cell in cells)

    def add(self, record: dict) -> None:
        record = {**record, "settings_id": self.id_of(record)}
        # Rewrite-free append, flushed to disk: a kill loses at most the cell in progress.
        # a new line after a cut-short one: appended to it, this cell would be lost too
        atomic.append_text(self.path, ("\n" if self.cut_short else "") + json.dumps(record) + "\n")
        self.cut_short = False
        self.done[self.key(record)] = record

    def write_final(self, name: str, extra: dict | None = None) -> tuple[Path, Path]:
        """``{name}.json`` (settings + cells + extra) and ``{name}.csv`` (one row per cell)."""
        cells = list(self.done.values())
        json_path = self.output / f"{name}.json"
        rows = {"row_settings": self.row_settings} if self.row_settings else {}
        payload = {"settings": self.settings, **rows, "cells": cells, **(extra or {})}
        atomic.write_text(json_path, json.dumps(payload, indent=2, default=str) + "\n")
        return json_path, write_csv(self.output / f"{name}.csv", cells)


def write_csv(path: Path, rows: list[dict]) -> Path:
    """One line per row, the columns of every row's flat (not list or dict) values."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k, v in row.items() if k not in columns and not _nested(v)]
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return atomic.write_text(path, text.getvalue())


def _nested(value: Any) -> bool:
    return isinstance(value, (list, dict))
