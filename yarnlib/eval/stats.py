"""Intervals for rates measured from independent draws."""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # the two-sided 95 % quantile of the standard normal


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial rate (95 % by default): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0/n or n/n."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(
            f"successes/trials: {successes}/{trials}; allowed: 0 <= successes <= trials and "
            "trials >= 1"
        )
    p, z2 = successes / trials, z * z
    denominator = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    # at 0/n and n/n the exact bound is 0 or 1; the formula gives it up to float rounding
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def rate_fields(successes: int, trials: int) -> dict:
    """``accuracy`` with its Wilson 95 % interval, as the result files carry them."""
    low, high = wilson(successes, trials)
    return {
        "correct": successes,
        "trials": trials,
        "accuracy": successes / trials,
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
    }


def percent_interval(record: dict) -> str:
    """``93% [78–98]``: a rate and its interval for a table cell."""
    return f"{record['accuracy']:.0%} [{100 * record['ci_low']:.0f}–{100 * record['ci_high']:.0f}]"


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value for two rows scored on the same prompts: of the prompts
    on which they disagree, ``only_a`` were right in row a alone and ``only_b`` in row b alone;
    under "equally good" each disagreement is a fair coin. Prompts both got right or both
    missed carry no information on the difference."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"only_a/only_b: {only_a}/{only_b}; allowed: counts >= 0")
    n, k = only_a + only_b, min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)
