"""Seeded coordinate searches over two spaces of rotary tables for a target length N:

- ``yarn``: the YaRN knobs (factor, beta_fast, beta_slow, attention factor);
- ``per-dim``: LongRoPE-style per-frequency divisors of the native inv_freq (non-decreasing
  from high to low frequency, each >= 1, the lowest frequency's >= N/L) and the attention
  factor, exported as longrope with equal short and long factors.

One model stays loaded; a trial only patches its rotary tables (``yarnlib.patch`` re-scales
from the native settings) and scores the calibration samples with the evaluation's
``token_nlls``. The objective is the mean NLL of the tokens at positions >= the original
context L, where the model sees more context than in pre-training; with a proxy length M < N
the search scores the first M tokens, and the best candidates are confirmed at N. A ``scorer``
replaces it (``yarnlib.tune.needle``: the NLL of retrieved keys, or a mix of both).

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
from yarnlib.frequencies import base_inv_freq
from yarnlib.spec import RopeScaling
from yarnlib.spec_file import patch_arguments

SPACES = ("yarn", "per-dim")
KNOBS = ("factor", "beta_fast", "beta_slow", "attention_factor")
# first step of each knob: a ratio for the log-scaled ones, a difference for the attention factor
FIRST_STEPS = {"factor": 1.25, "beta_fast": 2.0, "beta_slow": 2.0, "attention_factor": 0.05}
# per-dim: one ratio for every group of divisors, the same attention step as yarn's
PER_DIM_STEPS = {"divisors": 1.5, "attention_factor": 0.05}
LOG_SCALED = frozenset({"factor", "beta_fast", "beta_slow", "divisors"})
GROUPS = 8  # per-dim moves scale this many runs of neighbouring frequencies (or single ones)
DIVISOR_DIGITS = 6  # at 32k tokens a 1e-4 change of a divisor turns a mid frequency by 0.1 rad
ATTENTION_RANGE = (0.5, 2.0)
BETA_RANGE = (1 / 16, 1024.0)
MAX_FACTOR_RATIO = 4.0  # the factor stays within [N/L, 4 N/L]
HALVINGS = 6  # a round without improvement halves the steps; stop after this many
SIGNIFICANT = 4  # knob values are rounded, so the trial keys of a replay match exactly


def rounded(value: float, digits: int = SIGNIFICANT) -> float:
    return float(f"{value:.{digits}g}")


def start_point(min_factor: float) -> dict[str, float]:
    """The YaRN defaults (attention factor 0.1 ln s + 1) at the smallest factor reaching N."""
    return {
        "factor": min_factor,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": 0.1 * math.log(min_factor) + 1.0,
    }


def space_of(point: dict) -> str:
    return "per-dim" if "divisors" in point else "yarn"


def to_spec(native: RopeScaling, original: int, point: dict) -> RopeScaling:
    if "divisors" in point:  # longrope running the same tables at every length
        divisors = list(point["divisors"])
        return native.rescaled(
            "longrope", point["factor"], original, short_factor=divisors, long_factor=divisors,
            attention_factor=point["attention_factor"],
        )  # fmt: skip
    return native.rescaled("yarn", point["factor"], original, **{k: point[k] for k in KNOBS[1:]})


def trial_key(point: dict, length: int | None = None) -> str:
    """``space:values``, and ``@M`` for a trial scored at a proxy length M."""
    if "divisors" in point:
        values = "divisors=" + "/".join(f"{d:g}" for d in point["divisors"])
        values += f",attention_factor={point['attention_factor']:g}"
    else:
        values = ",".join(f"{k}={point[k]:g}" for k in KNOBS)
    key = f"{space_of(point)}:{values}"
    return key if length is None else f"{key}@{length}"


def repaired(divisors, min_last: float, slow_from: int | None = None) -> tuple[float, ...]:
    """Valid divisors near ``divisors``: each >= 1 and >= the one before (lower frequencies
    are stretched at least as much), the lowest frequency's >= N/L (so it turns no further by N
    than natively by L), none above MAX_FACTOR_RATIO N/L (the yarn factor's box). With
    ``slow_from``, the divisors from that index on are >= N/L too."""
    out, floor, cap = [], 1.0, MAX_FACTOR_RATIO * min_last
    for i, d in enumerate(divisors):
        floor = max(floor, min(rounded(float(d), DIVISOR_DIGITS), cap))
        if i == slow_from:
            floor = max(floor, min_last)
        out.append(floor)
    out[-1] = max(out[-1], min_last)
    return tuple(out)


def first_slow(native: RopeScaling, original: int) -> int | None:
    """Index of the first frequency whose wavelength exceeds L (None: there is none). Such a
    frequency never completes a turn within L, so a divisor below N/L takes it to angles the
    model never saw; the slowest YaRN ramp (beta_slow = 1) interpolates exactly these fully."""
    base = base_inv_freq(native.rope_theta, native.rotary_dim).double()
    slow = (2 * math.pi / base > original).nonzero()
    return int(slow[0]) if len(slow) else None


def per_dim_point(
    native: RopeScaling, original: int, point: dict, min_factor: float, slow_from=None
) -> dict:
    """The per-dim point running (up to rounding) the tables of a yarn ``point``: the divisors
    native inv_freq / yarn inv_freq (repaired, ``slow_from`` as there), its attention factor."""
    spec = to_spec(native, original, point)
    base = base_inv_freq(native.rope_theta, native.rotary_dim).double()
    divisors = (base / spec.inv_freq().double()).tolist()
    return {
        "factor": min_factor,  # the target length N = L × factor: what the config advertises
        "divisors": repaired(divisors, min_factor, slow_from),
        "attention_factor": rounded(spec.attention_factor()),
    }


def groups(count: int) -> list[range]:
    size = max(1, count // GROUPS)
    return [range(i, min(i + size, count)) for i in range(0, count, size)]


def moved_per_dim(point, coordinate, steps: dict, direction: int, min_factor: float, slow_from):
    """``point`` with a group of divisors scaled (then repaired) or its attention factor
    stepped; None where that changes nothing."""
    if coordinate == "attention_factor":
        value = point["attention_factor"] + direction * steps["attention_factor"]
        new = rounded(min(max(value, ATTENTION_RANGE[0]), ATTENTION_RANGE[1]))
        candidate = {**point, "attention_factor": new}
    else:
        ratio = steps["divisors"] ** direction
        divisors = [d * ratio if i in coordinate else d for i, d in enumerate(point["divisors"])]
        candidate = {**point, "divisors": repaired(divisors, min_factor, slow_from)}
    return None if candidate == point else candidate


def moved(point, knob: str, steps: dict, direction: int, min_factor: float) -> dict | None:
    """``point`` with one knob stepped, or None outside the search box (or where it is stuck)."""
    value, step = point[knob], steps[knob]
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
def objective(
    model, samples: list[torch.Tensor], spec: RopeScaling, original: int, length: int | None = None
) -> dict:
    """Mean NLL beyond L (the objective) and within L, over the first ``length`` tokens (all
    by default) of ``samples`` run with ``spec``."""
    yarnlib.patch(model, **patch_arguments(spec))
    beyond, within = [], []
    for ids in samples:
        nll = token_nlls(model, ids[:length]).double()
        within.append(nll[1:original])
        beyond.append(nll[original:])
    beyond_t, within_t = torch.cat(beyond), torch.cat(within)
    return {
        "objective": float(beyond_t.mean()),
        "nll_within_original": float(within_t.mean()),
        "tokens_beyond_original": beyond_t.numel(),
    }


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation: Pearson's of the ranks (ties share their mean rank); None
    below two values or when one side is constant."""

    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in order[i : j + 1]:
                out[k] = (i + j) / 2 + 1
            i = j + 1
        return out

    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} and {len(ys)} values; allowed: as many of each")
    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


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
    proxy_length: int | None = None  # score the search at M tokens, confirm at N
    slow_in_range: bool = False  # per-dim: divisors >= N/L for every frequency slower than L
    # (spec, length or None) -> scores with "objective"; default: mean NLL beyond L of samples
    scorer: Callable[[RopeScaling, int | None], dict] | None = None
    seen: set[str] = field(default_factory=set)  # trial keys this run has spent budget on
    computed: int = 0
    best: dict | None = None
    best_point: dict | None = None
    start: dict | None = None  # the first point scored
    trials: dict[str, tuple[dict, dict]] = field(default_factory=dict)  # key: (point, record)
    cap: int = 0  # the budget of the current phase
    bar: tqdm | None = field(default=None, repr=False)

    def score(self, point: dict, length: int | None) -> tuple[dict, bool]:
        """The trial record of ``point`` at ``length`` (None: N) from the store, or computed
        (not yet stored); and whether it was computed."""
        key = trial_key(point, length)
        record = self.store.done.get((key,))
        if record is None:
            spec = to_spec(self.native, self.original, point)
            started = time.perf_counter()
            if self.scorer is not None:
                scores = self.scorer(spec, length)
            else:
                scores = objective(self.model, self.samples, spec, self.original, length)
            record = {
                "key": key,
                "trial": len(self.store.done),
                "space": space_of(point),
                "length": length or self.target_length,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in point.items()},
                **scores,
                "spec": spec.fields(),
                "seconds": round(time.perf_counter() - started, 3),
            }
            return record, True
        return record, False

    def keep(self, record: dict, fresh: bool) -> None:
        if fresh:
            self.store.add(record)
            self.computed += 1

    def evaluate(self, point: dict) -> float | None:
        """The objective at ``point``: from the store, or computed and appended; None once the
        budget of this phase is spent."""
        key = trial_key(point, self.proxy_length)
        if key not in self.seen:  # a point the search revisits costs nothing
            if len(self.seen) >= self.cap:
                return None
            self.seen.add(key)
            self.bar.update(1)
        record, fresh = self.score(point, self.proxy_length)
        self.trials[key] = (point, record)
        self.start = self.start or point
        if self.best is None or record["objective"] < self.best["objective"]:
            self.best, self.best_point = record, point
            self.bar.set_postfix_str(f"best {record['objective']:.4f}")
            if self.on_best is not None:  # before the trial is stored: a kill in between
                # leaves the best on disk, and the rerun recomputes only that trial
                self.on_best(to_spec(self.native, self.original, point), record)
        self.keep(record, fresh)
        return record["objective"]

    def same_tables(self, a: dict, b: dict) -> bool:
        """Whether two points run the same rotary tables (truncated correction ranges make
        a beta change below one dimension a no-op)."""
        fa = to_spec(self.native, self.original, a).frequencies()
        fb = to_spec(self.native, self.original, b).frequencies()
        return fa.attention_factor == fb.attention_factor and torch.equal(fa.inv_freq, fb.inv_freq)

    def descend(self, point: dict, coordinates: list, steps: dict, move, rng) -> None:
        """Coordinate search from ``point``: each coordinate in a seeded order, both
        directions, stepping on while that helps; a round without improvement shrinks the
        steps; ends after HALVINGS shrinks or with the phase's budget."""
        current = self.evaluate(point)
        halvings = 0
        while current is not None and halvings <= HALVINGS:
            improved = False
            for coordinate in rng.sample(coordinates, len(coordinates)):
                for direction in rng.sample((1, -1), 2):
                    moved_here, probe = False, point
                    # keep stepping while it helps (a knob far from its optimum needs
                    # several steps); steps that leave the tables as they are cost nothing
                    while candidate := move(probe, coordinate, steps, direction):
                        probe = candidate
                        if self.same_tables(candidate, point):
                            continue
                        value = self.evaluate(candidate)
                        if value is None:
                            return
                        if value >= current:
                            break
                        point, current, moved_here = candidate, value, True
                    if moved_here:
                        improved = True
                        break
            if not improved:
                halvings += 1
                steps = {k: math.sqrt(s) if k in LOG_SCALED else s / 2 for k, s in steps.items()}

    def best_in(self, space: str, length: int | None = None) -> tuple[dict, dict] | None:
        """(point, record) of the best trial of ``space`` this run scored at ``length``
        (default: the search's length)."""
        length = length or self.proxy_length or self.target_length
        found = [
            t for t in self.trials.values() if t[1]["space"] == space and t[1]["length"] == length
        ]
        return min(found, key=lambda t: t[1]["objective"]) if found else None

    def run(self, seed: int, space: str = "yarn") -> dict:
        """The yarn search from the YaRN defaults, the per-dim search from the YaRN defaults'
        tables, or (``both``) the yarn search on half the budget and the per-dim search from
        its best on the rest; returns the best trial record."""
        if space not in (*SPACES, "both"):
            raise ValueError(f"space: {space!r}; allowed: {', '.join(SPACES)}, both")
        rng = random.Random(seed)
        lo = self.target_length / self.original  # the smallest factor reaching N
        start = start_point(lo)
        with tqdm(total=self.budget, desc="tune", unit="trial") as self.bar:
            if space != "per-dim":
                self.cap = self.budget if space == "yarn" else (self.budget + 1) // 2
                self.descend(start, list(KNOBS), dict(FIRST_STEPS), self.yarn_move(lo), rng)
                start = self.best_in("yarn")[0]
            if space != "yarn":
                self.cap = self.budget
                slow = first_slow(self.native, self.original) if self.slow_in_range else None
                point = per_dim_point(self.native, self.original, start, lo, slow)
                coordinates = [*groups(len(point["divisors"])), "attention_factor"]
                move = self.per_dim_move(lo, slow)
                self.descend(point, coordinates, dict(PER_DIM_STEPS), move, rng)
        return self.best

    @staticmethod
    def yarn_move(lo: float):
        return lambda point, knob, steps, direction: moved(point, knob, steps, direction, lo)

    @staticmethod
    def per_dim_move(lo: float, slow_from: int | None):
        return lambda point, c, steps, direction: moved_per_dim(
            point, c, steps, direction, lo, slow_from
        )

    def confirm(self, count: int) -> dict:
        """Proxy only: re-score at N the ``count`` best trials with distinct tables, the start
        and each space's best; the best at N becomes the best (and is passed to on_best).
        Returns the ranking report: each candidate at M and N, and their Spearman correlation."""
        ranked = sorted(self.trials.values(), key=lambda t: t[1]["objective"])
        chosen: list[tuple[dict, dict]] = []
        for trial in ranked:
            if len(chosen) < count and not any(self.same_tables(trial[0], c[0]) for c in chosen):
                chosen.append(trial)
        extra = [self.trials[trial_key(self.start, self.proxy_length)]]
        extra += [t for s in SPACES if (t := self.best_in(s)) is not None]
        chosen += [t for t in extra if all(t[1]["key"] != c[1]["key"] for c in chosen)]
        rows, best = [], None
        for point, proxy_record in chosen:
            record, fresh = self.score(point, None)
            if best is None or record["objective"] < best[1]["objective"]:
                best = point, record
            self.keep(record, fresh)
            self.trials[record["key"]] = (point, record)
            rows.append(
                {"key": record["key"], "space": record["space"],
                 "objective_proxy": proxy_record["objective"], "objective": record["objective"]}
            )  # fmt: skip
        self.best_point, self.best = best
        if self.on_best is not None:
            self.on_best(to_spec(self.native, self.original, self.best_point), self.best)
        proxy = [r["objective_proxy"] for r in rows]
        return {
            "proxy_length": self.proxy_length,
            "candidates": rows,
            "spearman": spearman(proxy, [r["objective"] for r in rows]),
        }
