"""Counted nouns in what the commands print: "1 cell", "2 cells", "1 GPU"."""


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
