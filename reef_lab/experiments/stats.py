"""Intervals over seeds, one way for everything that compares runs: the studies and benchmarks (scripts/common.py),
the apps and a notebook. A Student t interval: a few seeds make a wide one, which the normal 1.96 would hide."""

from __future__ import annotations

import math

# Student t quantiles (two-sided 95%) by degrees of freedom; beyond 30 the normal 1.96 is within 2%.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
       21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042}


def t95(n: int) -> float:
    """The two-sided 95% t quantile for the mean of n values (n - 1 degrees of freedom; 1.96 beyond 30)."""
    return T95.get(max(n - 1, 1), 1.96)


def mean_ci(values: list[float], single: float = float("nan")) -> tuple[float, float]:
    """The mean and the half-width of its 95% confidence interval; `single`: the half-width of one value (nan: no
    interval; a plot may want 0)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, single
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t95(n) * sd / math.sqrt(n)


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean (nan bounds for a single value)."""
    m, h = mean_ci(values)
    return m, m - h, m + h
