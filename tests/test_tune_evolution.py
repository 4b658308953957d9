"""LongRoPE's evolutionary search in yarnlib's space (issue 29): valid children, the budget,
resume, and progress from its start, on the hand-built task of test_tune_needle."""

import random

import torch
from test_tune_needle import SL, SN, runs, slow_task_model

from yarnlib.eval.store import CellStore
from yarnlib.spec import RopeScaling
from yarnlib.tune.evolution import DEFAULTS, STEP, Evolution, evolve, scaled
from yarnlib.tune.search import MAX_FACTOR_RATIO, Search, per_dim_point, start_point, trial_key


def search_of(tmp_path, budget, name="s"):
    model = slow_task_model()
    native = RopeScaling.from_hf(model.config)
    samples = [torch.tensor(runs(s)) for s in (100, 101)]
    store = CellStore(tmp_path / name, ("key",), {}, True, "trials.jsonl")
    return Search(model, samples, native, SL, SN, store, budget)


def on_grid(value: float) -> bool:
    return abs(value / STEP - round(value / STEP)) < 1e-6


def test_children_stay_in_the_space(tmp_path):
    """Mutants: divisors non-decreasing, in [1, 4 N/L], the lowest frequency's >= N/L, redrawn
    values on the 0.01 grid, never a point already seen. Crossover children: every gene from
    one parent or the other, never a point already evaluated (a parent included)."""
    search = search_of(tmp_path, budget=10**6)
    search.cap = search.budget
    search.bar = type("Bar", (), {"update": lambda *a: None, "set_postfix_str": lambda *a: None})()
    lo = SN / SL
    start = per_dim_point(search.native, SL, start_point(lo), lo)
    evo = Evolution(search, start, seed=0, sizes=dict(DEFAULTS), slow_from=None)
    points = [evo.mutate(start)[0] for _ in range(30)]
    assert len({(p["divisors"], p["attention_factor"]) for p in points}) == 30
    for p in points:
        d = p["divisors"]
        assert list(d) == sorted(d) and d[0] >= 1 and d[-1] >= lo
        assert max(d) <= MAX_FACTOR_RATIO * lo
        changed = [x for x, y in zip(d, start["divisors"], strict=True) if x != y]
        assert all(on_grid(x) or x == lo for x in changed)
        assert abs(p["attention_factor"] - start["attention_factor"]) <= 0.1 + 1e-9
    rng, children = random.Random(1), 0
    for _ in range(20):
        a, b = rng.sample(points, 2)
        evaluated = set(search.store.done)
        crossed = evo.crossover(a, b)  # None: no new child in its tries (then LongRoPE mutates)
        if crossed is None:
            continue
        children += 1
        child = crossed[0]
        assert (trial_key(child),) not in evaluated  # the store is keyed on (trial key,)
        assert len(search.store.done) == len(evaluated) + 1
        genes = [*child["divisors"], child["attention_factor"]]
        first, second = (
            [*a["divisors"], a["attention_factor"]],
            [*b["divisors"], b["attention_factor"]],
        )
        assert all(g in (x, y) for g, x, y in zip(genes, first, second, strict=True))
    assert children >= 10


def test_budget_resume_and_progress(tmp_path):
    """At most ``budget`` evaluations; a rerun takes every one from the trials file; the best
    beats the start (the YaRN defaults' tables)."""
    search = search_of(tmp_path, budget=40)
    best = evolve(search, seed=0, sizes=scaled(0.25))
    assert len(search.store.done) == 40 and search.computed == 40
    start = min(search.store.done.values(), key=lambda r: r["trial"])
    assert best["objective"] < start["objective"] - 0.3
    again = search_of(tmp_path, budget=40)
    assert evolve(again, seed=0, sizes=scaled(0.25))["key"] == best["key"]
    assert again.computed == 0
    assert scaled(0.25) == {"population": 16, "generations": 10, "mutations": 4,
                            "crossovers": 4, "crossover_tries": 5, "parents": 8}  # fmt: skip
