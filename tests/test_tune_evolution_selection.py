"""LongRoPE's evolution in yarnlib's space: which candidates breed, and how far a mutation may
move the last divisor (issue 52, mutation round 4), on the hand-built task of test_tune_needle."""

from test_tune_evolution import search_of
from test_tune_needle import SL, SN
from tqdm.auto import tqdm

from yarnlib.tune.evolution import Evolution
from yarnlib.tune.search import MAX_FACTOR_RATIO, per_dim_point, start_point, trial_key


class Recorded(Evolution):
    """The evolution as it runs, noting every point it breeds from (mutations and crossovers)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bred_from: list[dict] = []

    def mutate(self, point):
        self.bred_from.append(point)
        return super().mutate(point)

    def crossover(self, first, second):
        self.bred_from += [first, second]
        return super().crossover(first, second)


def distance(spec, length=None) -> dict:
    """A smooth objective of the table itself (squared distance of the divisors and the
    attention factor from an arbitrary point), so that distinct candidates never tie."""
    target = [1.0 + 0.37 * i for i in range(len(spec.short_factor))]
    far = sum((d - t) ** 2 for d, t in zip(spec.short_factor, target, strict=True))
    value = far + (spec.attention_factor() - 1.05) ** 2
    return {"objective": value, "nll_within_original": value}


def evolution_of(tmp_path, sizes, seed=0):
    search = search_of(tmp_path, budget=10**6)
    search.scorer = distance
    search.cap = search.budget
    lo = SN / SL
    start = per_dim_point(search.native, SL, start_point(lo), lo)
    return search, start, Recorded(search, start, seed, sizes, slow_from=None)


def test_a_generation_breeds_only_from_the_best_of_the_population(tmp_path):
    """A population of 6 (the start and 5 mutants of it) keeps its 2 best as parents: every
    mutant and crossover child of the next generation comes from one of those two, by the
    objective values in the trials file (a distinct value for each: no tie decides)."""
    sizes = {"population": 6, "generations": 1, "mutations": 3, "crossovers": 2,
             "crossover_tries": 5, "parents": 2}  # fmt: skip
    search, start, evolution = evolution_of(tmp_path, sizes)
    with tqdm(disable=True) as search.bar:
        evolution.run()
    records = sorted(search.store.done.values(), key=lambda r: r["trial"])
    population = records[:6]
    assert len(records) == 6 + 3 + 2  # the second generation's mutants and children
    assert evolution.bred_from[:5] == [start] * 5  # the first population: mutants of the start
    best_two = {r["key"] for r in sorted(population, key=lambda r: r["objective"])[:2]}
    assert len({r["objective"] for r in population}) == 6
    bred = {trial_key(p) for p in evolution.bred_from[5:]}
    assert bred and bred <= best_two


def test_a_mutation_moves_the_last_divisor_anywhere_up_to_the_cap(tmp_path):
    """LongRoPE redraws a divisor between its neighbours; the last one has none above, so its
    range ends at the space's cap 4 N/L: redrawn ~60 times in 200 mutants, it reaches the
    upper half of [its lower neighbour, 4 N/L] (all 60 below it: probability 2^-60)."""
    search, start, evolution = evolution_of(tmp_path, dict.fromkeys(("crossover_tries",), 1))
    with tqdm(disable=True) as search.bar:
        last = [evolution.mutate(start)[0]["divisors"][-1] for _ in range(200)]
    cap = MAX_FACTOR_RATIO * SN / SL
    below = start["divisors"][-2]
    assert start["divisors"][-1] < (below + cap) / 2 < max(last) <= cap
