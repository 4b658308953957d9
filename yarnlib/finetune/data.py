"""Training data: documents tokenized once (cached on disk), each followed by EOS, concatenated
and cut into rows of exactly ``seq_len`` tokens (the tail that does not fill a row is dropped).

A row may hold the end of one document and the start of the next. Position ids restart at 0
at every document start and at every row start, so a row never depends on the previous row and
flash-attn's varlen path (which finds sequence starts where position_ids == 0) sees the same
boundaries as the block mask built from them on CPU.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from yarnlib import atomic
from yarnlib.chunked_loss import IGNORE_INDEX, shift_labels
from yarnlib.documents import load_documents


def _source_fingerprint(source: str) -> object:
    """Local files by path, size and mtime (a change re-tokenizes); hub ids by name."""
    path = Path(source)
    if not path.exists():
        return source
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    return [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]


def _tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    blob = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab())
    return hashlib.sha1(blob.encode()).hexdigest()


def cache_key(sources, tokenizer, text_column, split, dataset_config) -> str:
    blob = json.dumps(
        {
            "sources": [_source_fingerprint(s) for s in sources],
            "tokenizer": _tokenizer_fingerprint(tokenizer),
            "eos": tokenizer.eos_token_id,
            "text_column": text_column,
            "split": split,
            "dataset_config": dataset_config,
        },
        sort_keys=True,
    )
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


@dataclass
class TokenStream:
    """All documents back to back (each ending with EOS) and where each document starts."""

    tokens: torch.Tensor  # int32 [total]
    doc_starts: torch.Tensor  # int64 [documents], ascending, first is 0
    key: str  # the cache key (file paths, sizes and mtimes, tokenizer)

    def digest(self) -> str:
        """The tokens' own fingerprint, which checkpoints record: a fresh clone of the same
        files (other mtimes) resumes, other data is refused."""
        blob = self.tokens.numpy().tobytes() + self.doc_starts.numpy().tobytes()
        return hashlib.sha1(blob).hexdigest()[:16]


def tokenize(
    sources: list[str],
    tokenizer,
    cache_dir: Path,
    text_column: str = "text",
    split: str = "train",
    dataset_config: str | None = None,
    show_progress: bool = True,
) -> TokenStream:
    """Tokenize every document (no BOS/EOS added by the tokenizer; one EOS appended)."""
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer: it defines no eos_token; packing needs one between documents")
    key = cache_key(sources, tokenizer, text_column, split, dataset_config)
    path = Path(cache_dir) / f"tokens-{key}.pt"
    if path.is_file():
        try:  # tensors only: a planted cache file must not run code (torch < 2.6 default)
            cached = torch.load(path, weights_only=True)
        except pickle.UnpicklingError as error:
            raise ValueError(
                f"cache: {path} is not a token cache yarnlib wrote ({str(error).splitlines()[0]}); "
                "allowed: delete it and it is rebuilt"
            ) from None
        return TokenStream(cached["tokens"], cached["doc_starts"], key)
    docs = load_documents(sources, text_column, split, dataset_config)
    pieces = []
    for _, text in tqdm(docs, desc="tokenizing", unit="doc", disable=not show_progress):
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        pieces.append(torch.tensor([*ids, tokenizer.eos_token_id], dtype=torch.int32))
    if not pieces:
        raise ValueError(f"dataset: no documents in {sources!r}")
    lengths = torch.tensor([p.numel() for p in pieces])
    stream = TokenStream(torch.cat(pieces), torch.cumsum(lengths, 0) - lengths, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"tokens": stream.tokens, "doc_starts": stream.doc_starts}
    atomic.write_with(path, lambda f: torch.save(tensors, f), "cache")  # never a bad cache
    return stream


class PackedRows:
    """Row ``i`` is tokens ``[i·seq_len, (i+1)·seq_len)`` of the stream."""

    def __init__(self, stream: TokenStream, seq_len: int):
        self.stream = stream
        self.seq_len = seq_len

    def __len__(self) -> int:
        return self.stream.tokens.numel() // self.seq_len

    def input_ids(self, rows: torch.Tensor) -> torch.Tensor:
        offsets = rows[:, None] * self.seq_len + torch.arange(self.seq_len)
        return self.stream.tokens[offsets].long()

    def position_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Positions counted from the latest document start or row start, whichever is later."""
        row_start = rows[:, None] * self.seq_len
        offsets = row_start + torch.arange(self.seq_len)
        starts = self.stream.doc_starts
        doc = torch.searchsorted(starts, offsets, right=True) - 1
        return offsets - torch.maximum(starts[doc], row_start)


def labels_for(input_ids: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """Next-token labels; with per-document positions a document's last token (its EOS) does
    not learn to predict the next, unrelated document."""
    labels = shift_labels(input_ids)
    if position_ids is None:
        return labels
    next_is_start = torch.nn.functional.pad(position_ids[:, 1:] == 0, (0, 1), value=True)
    return labels.masked_fill(next_is_start, IGNORE_INDEX)
