"""Long-context perplexity: token-level NLL of each document's first L tokens, optionally with
a sliding window, the head applied in chunks (never a [tokens × vocab] logits tensor).

Lengths at which a method's frequencies are the same share one forward per document:
attention is causal, so the NLL of the first L tokens of a longer forward is exactly the NLL
of a forward of L tokens. That is every length for a static method; for a dynamic method,
every length up to the original context (plain RoPE there), and each longer length alone.
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from yarnlib.chunked_loss import token_nll
from yarnlib.eval.measure import Meter
from yarnlib.eval.methods import Method, apply_method, scaling_fields
from yarnlib.eval.store import CellStore

DOCUMENTS = "perplexity_documents.jsonl"  # one line per finished document, beside the cells


def windows(n: int, window: int | None, stride: int | None) -> list[tuple[int, int, int]]:
    """``(begin, end, first_target)`` per forward: each token 1..n-1 is scored by exactly one
    window, the first one that reaches it (so it sees up to ``window - 1`` tokens of context)."""
    window = window or n
    stride = stride or window
    spans, begin, scored = [], 0, 1
    while True:
        end = min(begin + window, n)
        first = max(scored, begin + 1)
        if first < end:
            spans.append((begin, end, first))
            scored = end
        if end == n:
            return spans
        begin += stride


@torch.no_grad()
def token_nlls(
    model,
    input_ids: torch.Tensor,
    window: int | None = None,
    stride: int | None = None,
    chunk_size: int = 1024,
    progress=None,
) -> torch.Tensor:
    """float32 NLL of every token of the 1-D ``input_ids`` given what precedes it in its window;
    NaN where a token is not scored (position 0, and gaps when ``stride > window``)."""
    device = next(model.parameters()).device
    ids = input_ids.to(device)
    nll = torch.full((ids.shape[0],), float("nan"))
    head = model.get_output_embeddings()
    for begin, end, first in windows(ids.shape[0], window, stride):
        hidden = model.base_model(input_ids=ids[None, begin:end], use_cache=False)
        hidden = hidden.last_hidden_state[0, first - 1 - begin : end - 1 - begin]
        nll[first:end] = token_nll(hidden, head, ids[first:end], chunk_size).float().cpu()
        if progress is not None:
            progress.update(end - begin)
    return nll


def shared_groups(m: Method, lengths: list[int], original: int | None) -> list[list[int]]:
    """Lengths that can share forwards (see the module docstring)."""
    if not m.is_dynamic:
        return [lengths] if lengths else []
    short = [n for n in lengths if original is not None and n <= original]
    return ([short] if short else []) + [[n] for n in lengths if n not in short]


def forward_plan(
    methods: list[Method],
    lengths: list[int],
    chosen: dict[int, list[int]],
    store: CellStore,
    original: int | None,
) -> list[tuple[Method, list[int], dict[int, int]]]:
    """``(method, lengths computed together, {document: forward length})`` for missing cells."""
    plan = []
    for m in methods:
        missing = [n for n in lengths if not store.has(method=m.label, length=n)]
        for group in shared_groups(m, missing, original):
            docs: dict[int, int] = {}
            for n in group:
                for d in chosen[n]:
                    docs[d] = max(docs.get(d, 0), n)
            plan.append((m, group, docs))
    return plan


def run_perplexity(
    model,
    documents: list[torch.Tensor],
    methods: list[Method],
    lengths: list[int],
    chosen: dict[int, list[int]],
    skipped: dict[int, int],
    store: CellStore,
    original: int | None = None,
    window: int | None = None,
    stride: int | None = None,
    chunk_size: int = 1024,
    max_cells: int | None = None,
    document_store: CellStore | None = None,
) -> list[tuple[str, int]]:
    """Compute every missing (method, length) cell into ``store``; returns the cells computed.

    ``original`` is the model's original context (where dynamic methods start to scale).

    ``max_cells`` stops once at least that many cells are done (a budget, and the way tests
    interrupt a run); a group of lengths sharing forwards always finishes together.
    ``document_store`` (keys method, document, forward_length) holds each finished document's
    NLL sums, so a run killed inside a cell (a 32k forward is half an hour on a CPU core)
    resumes from its last document.
    """
    plan = forward_plan(methods, lengths, chosen, store, original)
    total = sum(sum(docs.values()) for _, _, docs in plan)
    computed: list[tuple[str, int]] = []
    device = next(model.parameters()).device
    with tqdm(total=total, unit="tok", unit_scale=True, desc="perplexity") as bar:
        for m, group, docs in plan:
            if max_cells is not None and len(computed) >= max_cells:
                break
            apply_method(model, m)
            bar.set_postfix_str(f"{m.label} @ {max(group)}")
            sums = {n: [] for n in group}
            resumed = 0
            with Meter(device) as meter:
                for d, forward_length in docs.items():
                    needed = [n for n in group if d in chosen[n]]
                    key = dict(method=m.label, document=d, forward_length=forward_length)
                    kept = {}
                    if document_store is not None and document_store.has(**key):
                        kept = document_store.done[document_store.key(key)]["scored"]
                    if all(str(n) in kept for n in needed):
                        resumed += forward_length
                        bar.update(forward_length)
                    else:
                        nll = token_nlls(
                            model, documents[d][:forward_length], window, stride, chunk_size, bar
                        )
                        kept = {}
                        for n in needed:
                            scored = nll[:n][~torch.isnan(nll[:n])]
                            kept[str(n)] = (float(scored.double().sum()), scored.numel())
                        if document_store is not None:
                            document_store.add({"scored": kept, **key})  # the key last
                    for n in needed:
                        sums[n].append(tuple(kept[str(n)]))
            for n in group:
                total_nll = sum(s for s, _ in sums[n])
                tokens = sum(c for _, c in sums[n])
                store.add(
                    {
                        "method": m.label,
                        **scaling_fields(model, m),
                        "length": n,
                        "perplexity": math.exp(total_nll / tokens),
                        "nll": total_nll / tokens,
                        "tokens": tokens,
                        "samples": len(sums[n]),
                        "skipped_short_documents": skipped[n],
                        "sample_perplexities": [math.exp(s / c) for s, c in sums[n]],
                        "forward_length": max(group),
                        "shared_forward_lengths": group,
                        "resumed_tokens": resumed,  # taken from document_store: not in the timing
                        **meter.fields(sum(docs.values()) - resumed),
                    }
                )
                computed.append((m.label, n))
    apply_method(model, Method("none", 1.0))
    return computed


def table(
    records: list[dict],
    value: str = "perplexity",
    fmt: str = "{:.2f}",
    column: int = 9,
    count: str | None = None,
) -> str:
    """Methods down, lengths across, ``column`` characters a value; with ``count``, a last row
    with the fewest ``count`` (samples) of each length's cells."""
    lengths = sorted({r["length"] for r in records})
    methods = list(dict.fromkeys(r["method"] for r in records))
    cell = {(r["method"], r["length"]): r[value] for r in records}
    width = max([len(m) for m in methods] + [6])
    lines = [f"{'method':<{width}} " + " ".join(f"{n:>{column}}" for n in lengths)]
    for m in methods:
        values = [cell.get((m, n)) for n in lengths]
        lines.append(
            f"{m:<{width}} "
            + " ".join(f"{'-' if v is None else fmt.format(v):>{column}}" for v in values)
        )
    if count is not None:
        fewest = [min(r[count] for r in records if r["length"] == n) for n in lengths]
        lines.append(f"{count:<{width}} " + " ".join(f"{k:>{column}}" for k in fewest))
    return "\n".join(lines)
