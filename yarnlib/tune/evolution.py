"""LongRoPE's evolutionary search over per-frequency divisors, in yarnlib's search space, as the
anchor the coordinate search is measured against (``benchmarks/tune_search_compare.py``).

The algorithm and its defaults follow microsoft/LongRoPE (``evolution/algorithms``,
``dim_mono`` with ``default_hyper_params/dim_mono.json``): an initial population of the start
and mutations of it; each generation keeps the best ``parents`` and adds ``mutations``
mutants of random parents and ``crossovers`` children of two distinct parents; a mutation
redraws each divisor with probability 0.3 on a grid of ``step`` between its neighbours (so the
divisors stay non-decreasing), a crossover takes each divisor of the second parent with
probability 0.3 x 0.5 until the child is new, else it mutates the first parent. Candidates
already seen are drawn again. ``evo_scale`` multiplies the sizes, as there.

Adapted to yarnlib's space so that both searches search the same set of tables: divisors
within [1, 4 N/L] with the lowest frequency's >= N/L (``repaired``, optionally the slow
frequencies' floor), and the attention factor as one more gene, redrawn with probability 0.3
on the same grid within +-0.1 of its value (LongRoPE fixes it by a formula). Every evaluation
goes through ``Search.evaluate``: the same budget, trials file and resume as the coordinate
search.
"""

from __future__ import annotations

import random

from tqdm.auto import tqdm

from yarnlib.tune.search import (
    ATTENTION_RANGE,
    MAX_FACTOR_RATIO,
    Search,
    first_slow,
    per_dim_point,
    repaired,
    rounded,
    start_point,
)

# microsoft/LongRoPE evolution/default_hyper_params/dim_mono.json
DEFAULTS = {
    "population": 64,
    "generations": 40,
    "mutations": 16,
    "crossovers": 16,
    "crossover_tries": 20,
    "parents": 32,
}
STEP = 0.01  # "list_step": the grid of the divisors
MUTATE = 0.3  # per-gene probability of a redraw (mutation) or of a swap attempt (crossover)


def scaled(evo_scale: float) -> dict[str, int]:
    return {k: max(1, int(evo_scale * v)) for k, v in DEFAULTS.items()}


class Evolution:
    """One evolutionary search run through ``search`` (per-dim points) from ``start``."""

    def __init__(self, search: Search, start: dict, seed: int, sizes: dict[str, int], slow_from):
        self.search, self.start, self.sizes = search, start, sizes
        self.rng = random.Random(seed)
        self.lo = search.target_length / search.original
        self.slow_from = slow_from
        self.seen: set[tuple] = set()

    def valid(self, divisors, attention: float) -> dict:
        fixed = repaired(divisors, self.lo, self.slow_from)
        return {**self.start, "divisors": fixed, "attention_factor": rounded(attention)}

    def fresh(self, point: dict) -> bool:
        return (point["divisors"], point["attention_factor"]) not in self.seen

    def score(self, point: dict) -> tuple[dict, float | None]:
        self.seen.add((point["divisors"], point["attention_factor"]))
        return point, self.search.evaluate(point)

    def grid(self, low: float, high: float) -> float:
        steps = max(0, int(round((high - low) / STEP)))
        return low + STEP * self.rng.randint(0, steps)

    def mutate(self, point: dict) -> tuple[dict, float | None]:
        cap = MAX_FACTOR_RATIO * self.lo
        for _ in range(1000):  # redraw until new (LongRoPE loops without bound)
            divisors = list(point["divisors"])
            for i in range(len(divisors)):
                if self.rng.random() < MUTATE:
                    low = 1.0 if i == 0 else divisors[i - 1]
                    high = cap if i == len(divisors) - 1 else divisors[i + 1]
                    divisors[i] = self.grid(low, max(low, high))
            attention = point["attention_factor"]
            if self.rng.random() < MUTATE:
                low = max(ATTENTION_RANGE[0], attention - 0.1)
                attention = self.grid(low, min(ATTENTION_RANGE[1], attention + 0.1))
            child = self.valid(divisors, attention)
            if self.fresh(child):
                return self.score(child)
        return point, None

    def crossover(self, first: dict, second: dict) -> tuple[dict, float | None] | None:
        genes = [*first["divisors"], first["attention_factor"]]
        other = [*second["divisors"], second["attention_factor"]]
        if genes == other:
            return None
        for _ in range(self.sizes["crossover_tries"]):
            for i in range(len(genes)):
                if self.rng.random() < MUTATE:
                    if self.rng.random() < 0.5:
                        genes = [*genes[:i], other[i], *genes[i + 1 :]]
                    child = {**first, "divisors": tuple(genes[:-1]), "attention_factor": genes[-1]}
                    # both parents lie in the box; a child out of order is dropped, as there
                    if list(child["divisors"]) == sorted(child["divisors"]) and self.fresh(child):
                        return self.score(child)
        return None

    def run(self) -> None:
        """LongRoPE's generations, or fewer where the search's budget ends first."""
        population = [self.score(self.start)]
        while len(population) < self.sizes["population"]:
            population.append(self.mutate(self.start))
            if population[-1][1] is None:
                return
        for _ in range(self.sizes["generations"]):
            parents = sorted(population, key=lambda p: p[1])[: self.sizes["parents"]]
            population = list(parents)
            for _ in range(self.sizes["mutations"]):
                population.append(self.mutate(self.rng.choice(parents)[0]))
                if population[-1][1] is None:
                    return
            for _ in range(self.sizes["crossovers"]):
                i, j = sorted(self.rng.sample(range(len(parents)), 2))
                child = self.crossover(parents[i][0], parents[j][0])
                population.append(child or self.mutate(parents[i][0]))
                if population[-1][1] is None:
                    return


def evolve(search: Search, seed: int, sizes: dict[str, int] | None = None) -> dict:
    """The evolutionary search over the per-dim space from the YaRN defaults' tables (the
    coordinate search's per-dim start), on ``search``'s budget; returns the best record."""
    lo = search.target_length / search.original
    slow = first_slow(search.native, search.original) if search.slow_in_range else None
    start = per_dim_point(search.native, search.original, start_point(lo), lo, slow)
    with tqdm(total=search.budget, desc="evolution", unit="trial") as search.bar:
        search.cap = search.budget
        Evolution(search, start, seed, sizes or dict(DEFAULTS), slow).run()
    return search.best
