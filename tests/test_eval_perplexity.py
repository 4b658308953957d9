import math
from itertools import pairwise

import pytest
import torch
from tiny_models import hand_written_rope, tiny_model

from yarnlib.eval.methods import Method, apply_method, parse_methods
from yarnlib.eval.perplexity import run_perplexity, token_nlls, windows
from yarnlib.eval.store import CellStore

ORIGINAL = 256  # the tiny models' max_position_embeddings
THETA = 50000.0  # and their rope_theta
# initializer_range of a model whose logits are far from uniform: on the default tiny model
# (0.02) every method's perplexity is within 1e-5 of plain RoPE's, so a method never applied
# would go unnoticed.
SHARP = 0.5


def reference_nll(model, ids, window=None, stride=None):
    """The straightforward loop: full logits of each window, log-softmax, gather."""
    n = len(ids)
    window, stride = window or n, stride or window or n
    total, count, scored, begin = 0.0, 0, 1, 0
    while True:
        end = min(begin + window, n)
        with torch.no_grad():
            logits = model(input_ids=ids[None, begin:end]).logits[0].double()
        logp = logits.log_softmax(-1)
        for t in range(max(scored, begin + 1), end):
            total -= float(logp[t - 1 - begin, ids[t]])
            count += 1
        scored = max(scored, end)
        if end == n:
            return total, count
        begin += stride


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def sharp_model():
    return tiny_model(initializer_range=SHARP)


def native_twin(m: Method, length: int):
    """The sharp model's weights in plain transformers, its rope configured natively for ``m``
    on a sequence of ``length`` tokens (written by hand, not by yarnlib)."""
    yarn = {"rope_type": "yarn", "original_max_position_embeddings": ORIGINAL}
    stretch = length / ORIGINAL
    params, max_positions = {
        "none": ({"rope_type": "default"}, ORIGINAL),
        "linear": ({"rope_type": "linear", "factor": m.factor}, ORIGINAL),
        "yarn": ({**yarn, "factor": m.factor}, ORIGINAL * m.factor),
        "dynamic_ntk": ({"rope_type": "dynamic", "factor": m.factor}, ORIGINAL),
        # dynamic YaRN on `length` tokens is YaRN at factor length / L (plain RoPE up to L)
        "dynamic_yarn": (
            {**yarn, "factor": stretch} if stretch > 1 else {"rope_type": "default"},
            max(length, ORIGINAL),
        ),
    }[m.method]
    return tiny_model(
        initializer_range=SHARP,
        **hand_written_rope({**params, "rope_theta": THETA}),
        max_position_embeddings=int(max_positions),
    )


def test_each_method_equals_transformers_configured_for_it(sharp_model, tmp_path):
    docs = [
        torch.randint(0, 128, (400,), generator=torch.Generator().manual_seed(i)) for i in range(2)
    ]
    methods = parse_methods("none,linear:2,yarn:2,dynamic_yarn:2,dynamic_ntk:4")
    lengths = [128, 384]
    store = CellStore(tmp_path, ("method", "length"), {}, resume=False)
    chosen, skipped = {n: [0, 1] for n in lengths}, dict.fromkeys(lengths, 0)
    run_perplexity(sharp_model, docs, methods, lengths, chosen, skipped, store, ORIGINAL)
    for m in methods:
        for n in lengths:
            twin = native_twin(m, n)
            totals = [reference_nll(twin, doc[:n]) for doc in docs]
            expected = math.exp(sum(t for t, _ in totals) / sum(c for _, c in totals))
            got = store.done[(m.label, n)]["perplexity"]
            assert math.isclose(got, expected, rel_tol=1e-5), (m.label, n, got, expected)
    # beyond L the methods are told apart by far more than the tolerance
    beyond = sorted(store.done[(m.label, 384)]["perplexity"] for m in methods)
    assert min(b / a - 1 for a, b in pairwise(beyond)) > 100 * 1e-5, beyond


@pytest.mark.parametrize("window,stride", [(None, None), (128, 64), (100, 100), (96, 40)])
def test_perplexity_equals_full_logits(model, window, stride):
    ids = torch.randint(0, 128, (300,), generator=torch.Generator().manual_seed(1))
    nll = token_nlls(model, ids, window, stride, chunk_size=37)
    scored = nll[~torch.isnan(nll)]
    total, count = reference_nll(model, ids, window, stride)
    assert scored.numel() == count
    assert math.isclose(float(scored.double().sum()), total, rel_tol=1e-5)


def test_chunking_changes_nothing(model):
    ids = torch.randint(0, 128, (200,), generator=torch.Generator().manual_seed(2))
    base = token_nlls(model, ids, 64, 32, chunk_size=1)
    for chunk in (5, 64, 4096):
        got = token_nlls(model, ids, 64, 32, chunk_size=chunk)
        torch.testing.assert_close(got, base, rtol=1e-5, atol=0, equal_nan=True)


def test_windows_score_every_token_once():
    for n, w, s in [(300, 128, 64), (50, None, None), (301, 64, 1)]:
        covered = [t for _, end, first in windows(n, w, s) for t in range(first, end)]
        assert covered == list(range(1, n))
    # Non-overlapping windows cannot predict their first token (no context inside the window).
    covered = [t for _, end, first in windows(300, 100, 100) for t in range(first, end)]
    assert covered == [t for t in range(1, 300) if t not in (100, 200)]


def test_shared_forwards_equal_separate_runs(model, tmp_path):
    """Lengths share one forward where frequencies agree; the numbers equal one run per length."""
    docs = [
        torch.randint(0, 128, (600,), generator=torch.Generator().manual_seed(i)) for i in range(2)
    ]
    methods = parse_methods("none,yarn:2,dynamic_yarn:2,dynamic_ntk:4")
    lengths = [128, 256, 384, 512]
    chosen = {n: [0, 1] for n in lengths}
    skipped = dict.fromkeys(lengths, 0)
    store = CellStore(tmp_path, ("method", "length"), {}, resume=False)
    run_perplexity(model, docs, methods, lengths, chosen, skipped, store, ORIGINAL)
    for m in methods:
        apply_method(model, m)
        for n in lengths:
            totals = [reference_nll(model, doc[:n]) for doc in docs]
            expected = math.exp(sum(t for t, _ in totals) / sum(c for _, c in totals))
            got = store.done[(m.label, n)]["perplexity"]
            assert math.isclose(got, expected, rel_tol=1e-5), (m.label, n)
    apply_method(model, Method("none", 1.0))
    groups = {(r["method"], tuple(r["shared_forward_lengths"])) for r in store.done.values()}
    assert ("none", (128, 256, 384, 512)) in groups
    assert ("dynamic_yarn:2", (128, 256)) in groups and ("dynamic_yarn:2", (384,)) in groups


def test_records_name_the_scaling_each_row_ran(tmp_path):
    """``none`` runs a model as saved: a model saved with yarn x2 records yarn x2 for that row
    (and its numbers equal the yarn:2 row of the same model unscaled), not "none" x1."""
    yarn2 = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": ORIGINAL}
    saved_scaled = tiny_model(
        initializer_range=SHARP,
        **hand_written_rope({**yarn2, "rope_theta": THETA}),
        max_position_embeddings=2 * ORIGINAL,
    )
    docs = [torch.randint(0, 128, (384,), generator=torch.Generator().manual_seed(5))]
    fields = {}
    plain = tiny_model(initializer_range=SHARP)
    for name, model, methods in [("scaled", saved_scaled, "none,linear:2"),
                                 ("plain", plain, "none,yarn:2")]:  # fmt: skip
        store = CellStore(tmp_path / name, ("method", "length"), {}, resume=False)
        run_perplexity(model, docs, parse_methods(methods), [384], {384: [0]}, {384: 0}, store,
                       ORIGINAL)  # fmt: skip
        fields[name] = {k[0]: (r["scaling"], r["factor"], r["perplexity"])
                        for k, r in store.done.items()}  # fmt: skip
    assert [v[:2] for v in fields["scaled"].values()] == [("yarn", 2.0), ("linear", 2.0)]
    assert [v[:2] for v in fields["plain"].values()] == [("none", 1.0), ("yarn", 2.0)]
    assert math.isclose(fields["scaled"]["none"][2], fields["plain"]["yarn:2"][2], rel_tol=1e-5)
