"""Seeded coordinate search over the YaRN knobs (factor, beta_fast, beta_slow, attention factor).

One model stays loaded; a trial only patches its rotary tables (``yarnlib.patch`` re-scales
from the native settings) and scores the calibration samples with the evaluation's
``token_nlls``. The objective is the mean NLL of the tokens at positions >= the original
context L, where the model sees more context than in pre-training.

The search is a deterministic function of its settings, its seed and the objective values,
so a rerun replays it and takes every value already in ``trials.jsonl`` from there: it never
recomputes a finished trial and continues exactly where the last run stopped.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

import yarnlib
from yarnlib.eval.perplexity import token_nlls
from yarnlib.eval.store import CellStore
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import patch_arguments

KNOBS = ("factor", "beta_fast", "beta_slow", "attention_factor")
# first step of each knob: a ratio for the log-scaled ones, a difference for the attention factor
FIRST_STEPS = {"factor": 1.25, "beta_fast": 2.0, "beta_slow": 2.0, "attention_factor": 0.05}
LOG_SCALED = frozenset({"factor", "beta_fast", "beta_slow"})
ATTENTION_RANGE = (0.5, 2.0)
BETA_RANGE = (1 / 16, 1024.0)
MAX_FACTOR_RATIO = 4.0  # the factor stays within [N/L, 4 N/L]
HALVINGS = 6  # a round without improvement halves the steps; stop after this many
SIGNIFICANT = 4  # knob values are rounded, so the trial keys of a replay match exactly


def rounded(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}")


def start_point(min_factor: float) -> dict[str, float]:
    """The YaRN defaults (attention factor 0.1 ln s + 1) at the smallest factor reaching N."""
    return {
        "factor": min_factor,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": 0.1 * math.log(min_factor) + 1.0,
    }


def to_spec(native: RopeScaling, original: int, point: dict[str, float]) -> RopeScaling:
    return native.rescaled("yarn", point["factor"], original, **{k: point[k] for k in KNOBS[1:]})


def trial_key(point: dict[str, float]) -> str:
    return ",".join(f"{k}={point[k]:g}" for k in KNOBS)


def moved(point, knob: str, step: float, direction: int, min_factor: float) -> dict | None:
    """``point`` with one knob stepped, or None outside the search box (or where it is stuck)."""
    value = point[knob]
    new = value * step**direction if knob in LOG_SCALED else value + direction * step
    if knob == "factor":
        new = min(max(new, min_factor), MAX_FACTOR_RATIO * min_factor)
    if knob == "attention_factor":
        new = min(max(new, ATTENTION_RANGE[0]), ATTENTION_RANGE[1])
    if knob.startswith("beta"):
        new = min(max(new, BETA_RANGE[0]), BETA_RANGE[1])
    new = max(rounded(new), min_factor) if knob == "factor" else rounded(new)
    candidate = {**point, knob: new}
    if new == value or candidate["beta_fast"] < candidate["beta_slow"]:
        return None
    return candidate


@torch.no_grad()
def objective(model, samples: list[torch.Tensor], spec: RopeScaling, original: int) -> dict:
    """Mean NLL beyond L (the objective) and within L, over ``samples`` run with ``spec``."""
    yarnlib.patch(model, **patch_arguments(spec))
    beyond, within = [], []
    for ids in samples:
        nll = token_nlls(model, ids).double()
        within.append(nll[1:original])
        beyond.append(nll[original:])
    beyond_t, within_t = torch.cat(beyond), torch.cat(within)
    return {
        "objective": float(beyond_t.mean()),
        "nll_within_original": float(within_t.mean()),
        "tokens_beyond_original": beyond_t.numel(),
    }


@dataclass
class Search:
    """State of one search: the trials in its store, the best so far, the budget used."""

    model: torch.nn.Module
    samples: list[torch.Tensor]
    native: RopeScaling
    original: int
    target_length: int
    store: CellStore
    budget: int
    on_best: Callable[[RopeScaling, dict], None] | None = None  # on every new best
    seen: set[str] = field(default_factory=set)  # trial keys this run has spent budget on
    computed: int = 0
    best: dict | None = None
    best_point: dict | None = None
    bar: tqdm | None = field(default=None, repr=False)

    def evaluate(self, point: dict[str, float]) -> float | None:
        """The objective at ``point``: from the store, or computed and appended; None once the
        budget is spent."""
        key = trial_key(point)
        if key not in self.seen:  # a point the search revisits costs nothing
            if len(self.seen) >= self.budget:
                return None
            self.seen.add(key)
            self.bar.update(1)
        record = self.store.done.get((key,))
        fresh = record is None
        if fresh:
            spec = to_spec(self.native, self.original, point)
            started = time.perf_counter()
            scores = objective(self.model, self.samples, spec, self.original)
            record = {
                "key": key,
                "trial": len(self.store.done),
                **point,
                **scores,
                "spec": spec.fields(),
                "seconds": round(time.perf_counter() - started, 3),
            }
        if self.best is None or record["objective"] < self.best["objective"]:
            self.best, self.best_point = record, point
            self.bar.set_postfix_str(f"best {record['objective']:.4f}")
            if self.on_best is not None:  # before the trial is stored: a kill in between
                # leaves the best on disk, and the rerun recomputes only that trial
                self.on_best(to_spec(self.native, self.original, point), record)
        if fresh:
            self.store.add(record)
            self.computed += 1
        return record["objective"]

    def same_tables(self, a: dict[str, float], b: dict[str, float]) -> bool:
        """Whether two points run the same rotary tables (truncated correction ranges make
        a beta change below one dimension a no-op)."""
        fa = to_spec(self.native, self.original, a).frequencies()
        fb = to_spec(self.native, self.original, b).frequencies()
        return fa.attention_factor == fb.attention_factor and torch.equal(fa.inv_freq, fb.inv_freq)

    def run(self, seed: int) -> dict:
        """Coordinate search from the YaRN defaults; returns the best trial record."""
        rng = random.Random(seed)
        lo = self.target_length / self.original  # the smallest factor reaching N
        steps = dict(FIRST_STEPS)
        point = start_point(lo)
        with tqdm(total=self.budget, desc="tune", unit="trial") as self.bar:
            current = self.evaluate(point)
            halvings = 0
            while current is not None and halvings <= HALVINGS:
                improved = False
                for knob in rng.sample(KNOBS, len(KNOBS)):
                    for direction in rng.sample((1, -1), 2):
                        moved_here, probe = False, point
                        # keep stepping while it helps (a knob far from its optimum needs
                        # several steps); steps that leave the tables as they are cost nothing
                        while candidate := moved(probe, knob, steps[knob], direction, lo):
                            probe = candidate
                            if self.same_tables(candidate, point):
                                continue
                            value = self.evaluate(candidate)
                            if value is None:
                                return self.best
                            if value >= current:
                                break
                            point, current, moved_here = candidate, value, True
                        if moved_here:
                            improved = True
                            break
                if not improved:
                    halvings += 1
                    steps = {
                        k: math.sqrt(s) if k in LOG_SCALED else s / 2 for k, s in steps.items()
                    }
        return self.best
