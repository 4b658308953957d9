"""Documents for the evaluations and fine-tuning: a ``datasets`` id, or local ``.txt`` /
``.jsonl`` / ``.parquet`` files and folders of them (a plain text file is one document)."""

from __future__ import annotations

import json
import sys
from importlib.resources import files
from pathlib import Path

# 14 public-domain plays shipped as package data (yarnlib/data/shakespeare/README.md), so a
# clone and an installed wheel both have them; setuptools installs unzipped, so this is a path.
DEFAULT_DATASET = Path(str(files("yarnlib") / "data" / "shakespeare"))
SUFFIXES = (".txt", ".jsonl", ".parquet")


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; a binary file (undecodable bytes, or a NUL byte) is refused."""
    data = path.read_bytes()
    undecodable = len(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        text, undecodable = "", error.start
    bad = min(undecodable, data.find(0) if 0 in data else len(data))  # the first offending byte
    if bad < len(data):
        raise ValueError(
            f"dataset: {path} is binary, not UTF-8 text (byte 0x{data[bad]:02x} at offset {bad}); "
            "allowed: UTF-8 .txt/.jsonl files, or .parquet"
        )
    return text


def _jsonl_texts(path: Path, column: str) -> list[str]:
    texts = []
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"dataset: {path}:{number}: malformed JSON: {error.msg}") from None
        if not isinstance(row, dict) or column not in row:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(
                f"text_column: {column!r} not in {path}:{number}; available columns: {keys}"
            )
        texts.append(str(row[column]))
    return texts


def _parquet_texts(path: Path, column: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except pa.ArrowException as error:
        raise ValueError(f"dataset: {path} is not a parquet file ({error})") from None
    if column not in names:
        raise ValueError(f"text_column: {column!r} not in {path}; available columns: {names}")
    return [str(t) for t in pq.read_table(path, columns=[column]).column(column).to_pylist()]


def _file_documents(path: Path, column: str) -> list[tuple[str, str]]:
    if path.suffix == ".txt":
        return [(path.stem, _read_text(path))]
    texts = _jsonl_texts(path, column) if path.suffix == ".jsonl" else _parquet_texts(path, column)
    return [(f"{path.stem}[{i}]", text) for i, text in enumerate(texts)]


def _looks_local(source: str) -> bool:
    """A datasets id is ``name`` or ``owner/name``: anything else can only be a local path."""
    return source.startswith(("/", ".", "~")) or source.count("/") > 1 or source.endswith(SUFFIXES)


def _hub_documents(name: str, column: str, split: str, config: str | None) -> list[tuple]:
    if _looks_local(name):
        raise ValueError(
            f"dataset: {name!r} does not exist; allowed: an existing .txt/.jsonl/.parquet file or "
            "folder, or a datasets id (name or owner/name)"
        )
    # said before any network access: a mistyped local folder reads like an owner/name id
    print(f"dataset: {name!r} is not a local path; loading it as a datasets id", file=sys.stderr)
    import datasets

    try:
        data = datasets.load_dataset(name, config, split=split)
    except Exception as error:  # datasets raises many types for a missing / offline dataset
        raise ValueError(
            f"dataset: {name!r} is neither a local .txt/.jsonl/.parquet file or folder nor a "
            f"loadable datasets id ({type(error).__name__}: {error})"
        ) from None
    if column not in data.column_names:
        raise ValueError(
            f"text_column: {column!r} not in dataset {name!r}; available: {data.column_names}"
        )
    return [(f"{name}[{i}]", str(t)) for i, t in enumerate(data[column])]


def load_documents(
    sources: list[str] | None = None,
    text_column: str = "text",
    split: str = "test",
    config: str | None = None,
) -> list[tuple[str, str]]:
    """``(name, text)`` for every document, in a stable order (folders sorted by file name)."""
    docs: list[tuple[str, str]] = []
    for source in sources or [str(DEFAULT_DATASET)]:
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES)
            if not files:
                raise ValueError(f"dataset: no {', '.join(SUFFIXES)} files in folder {source!r}")
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                raise ValueError(
                    f"dataset: {source!r} has suffix {path.suffix!r}; "
                    f"allowed: {', '.join(SUFFIXES)}"
                )
            files = [path]
        else:
            docs += _hub_documents(source, text_column, split, config)
            continue
        for file in files:
            docs += _file_documents(file, text_column)
    return docs


def select_samples(
    token_counts: list[int], lengths: list[int], samples: int
) -> tuple[dict[int, list[int]], dict[int, int]]:
    """For each length, the first ``samples`` documents with at least that many tokens, and how
    many documents were skipped as too short. Each sample is a document's first L tokens."""
    chosen, skipped = {}, {}
    longest = max(token_counts, default=0)
    if token_counts and longest == 0:
        raise ValueError(
            f"tokenizer: it encodes none of the {len(token_counts)} documents into a single "
            "token; allowed: a tokenizer that encodes this text (check the model's tokenizer "
            "files, e.g. a vocabulary without these characters and no unknown token)"
        )
    for length in lengths:
        if length > longest:
            raise ValueError(
                f"lengths: {length} tokens is longer than every document (longest: {longest} "
                "tokens); allowed: lengths up to the longest document"
            )
        fits = [i for i, n in enumerate(token_counts) if n >= length]
        chosen[length] = fits[:samples]
        skipped[length] = len(token_counts) - len(fits)
    return chosen, skipped
