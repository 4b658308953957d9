"""Editing a JSON object's text member by member, so that key order, indentation and every
unrelated byte of a file stay as they were, with a record of each edit that undoes it."""

from __future__ import annotations

import json
import re
from typing import Any

DECODER = json.JSONDecoder()
WHITESPACE = re.compile(r"[ \t\r\n]*")


def member_spans(text: str) -> dict[str, tuple[int, int, int]]:
    """Top-level members of a valid JSON object: key -> (key start, value start, value end)."""
    i = WHITESPACE.match(text, text.index("{") + 1).end()
    out: dict[str, tuple[int, int, int]] = {}
    while text[i] != "}":
        key, colon = json.decoder.scanstring(text, i + 1)
        value_start = WHITESPACE.match(text, WHITESPACE.match(text, colon).end() + 1).end()
        _, end = DECODER.raw_decode(text, value_start)
        out[key] = (i, value_start, end)
        i = WHITESPACE.match(text, end).end()
        if text[i] == ",":
            i = WHITESPACE.match(text, i + 1).end()
    return out


class JsonText:
    """A JSON object's text, edited member by member, recording how to undo each edit."""

    def __init__(self, text: str):
        self.text = text
        match = re.match(r"\s*\{(\r?\n)([ \t]*)\S", text)
        self.newline, self.indent = match.groups() if match else ("\n", None)
        self.values: dict[str, Any] = {}  # original values of replaced members
        self.texts: dict[str, str] = {}  # their exact text, where re-serialising differs
        self.added: list[str] = []
        self.removed: list[dict[str, Any]] = []  # {"after": key or None, "text": chunk}

    def set(self, key: str, value: Any) -> None:
        members = member_spans(self.text)
        if key not in members:
            end = max(m[2] for m in members.values())
            sep = ", " if self.indent is None else "," + self.newline + self.indent
            entry = f"{sep}{json.dumps(key)}: {self.dump(value)}"
            self.text = self.text[:end] + entry + self.text[end:]
            self.added.append(key)
            return
        _, start, end = members[key]
        old_text = self.text[start:end]
        old = json.loads(old_text)
        if old == value:
            return
        self.values[key] = old
        if self.dump(old) != old_text:
            self.texts[key] = old_text
        self.replace(key, self.dump(value))

    def dump(self, value: Any) -> str:
        """``value`` as a top-level member in this file's style."""
        if self.indent is None:
            return json.dumps(value, ensure_ascii=False)
        text = json.dumps(value, indent=self.indent, ensure_ascii=False)
        return text.replace("\n", self.newline + self.indent)

    def replace(self, key: str, value_text: str) -> None:
        _, start, end = member_spans(self.text)[key]
        self.text = self.text[:start] + value_text + self.text[end:]

    def remove(self, key: str) -> None:
        """Cut the member with the separator before it (after the first one), or after it."""
        members = list(member_spans(self.text).items())
        index = [k for k, _ in members].index(key)
        key_start, _, end = members[index][1]
        if index:
            after, start = members[index - 1][0], members[index - 1][1][2]
        else:
            after, start = None, key_start
            if len(members) > 1:
                end = members[1][1][0]
        self.removed.append({"after": after, "text": self.text[start:end]})
        self.text = self.text[:start] + self.text[end:]

    def insert(self, chunk: str, after: str | None) -> None:
        members = member_spans(self.text)
        if after is None:
            pos = min(m[0] for m in members.values())
        else:  # a missing anchor (edited away since) appends at the end
            pos = members[after][2] if after in members else max(m[2] for m in members.values())
        self.text = self.text[:pos] + chunk + self.text[pos:]

    def record(self) -> dict[str, Any]:
        record = {
            "values": self.values,
            "texts": self.texts,
            "added": self.added,
            "removed": self.removed,
        }
        return {k: v for k, v in record.items() if v}


def undo(text: str, record: dict[str, Any]) -> str:
    doc = JsonText(text)
    present = member_spans(text)
    for key in reversed(record.get("added", [])):
        if key in present:
            doc.remove(key)
    for key, value in record.get("values", {}).items():
        if key in present:
            doc.replace(key, record.get("texts", {}).get(key) or doc.dump(value))
    for item in reversed(record.get("removed", [])):
        doc.insert(item["text"], item["after"])
    return doc.text
