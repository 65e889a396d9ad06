"""Agreement and evaluation metrics: rank correlation, top-k overlap, and the ASO significance test.

    spearman(x, y) = pearson(rank(x), rank(y)),  ranks averaged over ties (1-based)
    top_k(x, k) = the positions of the k largest |x| (or x), largest first, ties: lower position first
    grouped_average_ranks, grouped_top_k: the same within each of many groups, from one sort (grouped_rank_bounds)
    jaccard_top_k(x, y, k) = |top_k(x) & top_k(y)| / |top_k(x) | top_k(y)|,  top_k by |value|
    aso(a, b): Dror et al. (2019) almost stochastic order, epsilon_min that A is better than B (deepsig)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InputError

# The ASO test's settings where a caller gives none: deepsig's own defaults.
ASO_CONFIDENCE_LEVEL = 0.95
ASO_ITERATIONS = 1000


def _vectors(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise InputError(f"need two sequences of the same length, got {a.size} and {b.size}")
    if a.size < 2:
        raise InputError("need at least two values to correlate")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise InputError("values must be finite")
    return a, b


def average_ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks of x, tied values sharing the mean of the ranks they span."""
    a = np.asarray(x, dtype=np.float64).ravel()
    return grouped_average_ranks(a, np.zeros(a.size, dtype=np.int64))


def grouped_rank_bounds(x: Sequence[float], groups: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each x[k], within its group (groups[k]): the first and last 1-based rank its value spans (low = high
    unless tied) and the group's size; for many groups in one sort."""
    a, g = np.asarray(x, dtype=np.float64).ravel(), np.asarray(groups).ravel()
    if a.size and g.min() >= 0 and g.max() < 1 << 16:
        by_value = np.argsort(a)  # the order among equal values does not matter here
        order = by_value[np.argsort(g[by_value].astype(np.uint16), kind="stable")]  # a radix sort by group
    else:
        order = np.lexsort((a, g))
    sorted_a, sorted_g = a[order], g[order]
    new_group = np.ones(a.size + 1, dtype=bool)  # sorted position k starts a group (k < n)
    np.not_equal(sorted_g[1:], sorted_g[:-1], out=new_group[1:-1])
    first = new_group.copy()  # ... or a run of equal values
    first[1:-1] |= sorted_a[1:] != sorted_a[:-1]
    bounds = np.flatnonzero(first)  # the runs' starts, then n
    run = np.cumsum(first[:-1]) - 1  # the run of each sorted position
    group_bounds = np.flatnonzero(new_group)
    group = np.cumsum(new_group[:-1]) - 1
    start = group_bounds[group]
    low, high, size = np.empty(a.size, np.int64), np.empty(a.size, np.int64), np.empty(a.size, np.int64)
    low[order] = bounds[run] - start + 1
    high[order] = bounds[run + 1] - start
    size[order] = group_bounds[group + 1] - start
    return low, high, size


def grouped_average_ranks(x: Sequence[float], groups: Sequence[int]) -> np.ndarray:
    """average_ranks within each group (groups[k]: the group of x[k]), for many groups in one sort."""
    low, high, _ = grouped_rank_bounds(x, groups)
    return (low + high) / 2.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; nan when either side is constant."""
    a, b = _vectors(x, y)
    a, b = a - a.mean(), b - b.mean()
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denom) if denom > 0 else float("nan")


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of the average ranks (ties share their mean rank)."""
    a, b = _vectors(x, y)
    return pearson(average_ranks(a), average_ranks(b))


def top_k(x: Sequence[float], k: int, by: str = "abs") -> np.ndarray:
    """Positions of the k largest |x| (by 'abs') or x (by 'value'), largest first; ties: lower position first.
    All positions, in that order, when x has fewer than k values."""
    a = np.asarray(x, dtype=np.float64).ravel()
    return grouped_top_k(a, np.zeros(a.size, dtype=np.int64), k, by)


def grouped_top_k(
    x: Sequence[float], groups: Sequence[int], k: int, by: str = "abs",
    bounds: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """top_k within each group: the positions of each group's top k, group by group (groups in increasing order).
    bounds: grouped_rank_bounds(x, groups), when already at hand (the candidates come from it)."""
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    if by not in ("abs", "value"):
        raise InputError(f"by: 'abs' or 'value', got {by!r}")
    a, g = np.asarray(x, dtype=np.float64).ravel(), np.asarray(groups).ravel()
    low, high, size = bounds if bounds is not None else grouped_rank_bounds(a, g)
    # Candidates: fewer than k values of the group above (or, for |x|, also below) the value's tie run. A value
    # >= 0 with k larger values has k larger |values|, and so has a value < 0 with k smaller ones.
    candidate = high > size - k
    if by == "abs":
        candidate |= low <= k
    pos = np.flatnonzero(candidate)
    key = -np.abs(a[pos]) if by == "abs" else -a[pos]
    order = pos[np.lexsort((pos, key, g[pos]))]
    sorted_g = g[order]
    new_group = np.ones(order.size, dtype=bool)
    np.not_equal(sorted_g[1:], sorted_g[:-1], out=new_group[1:])
    starts = np.flatnonzero(new_group)
    place = np.arange(order.size) - starts[np.cumsum(new_group) - 1]  # 0 for the largest of its group
    return order[place < k]


def jaccard_top_k(x: Sequence[float], y: Sequence[float], k: int) -> float:
    """Jaccard index of the positions of the k largest |values| of x and of y (ties: lower position first)."""
    a, b = _vectors(x, y)
    top_a, top_b = set(top_k(a, k).tolist()), set(top_k(b, k).tolist())
    return len(top_a & top_b) / len(top_a | top_b)


def aso(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    confidence_level: float = ASO_CONFIDENCE_LEVEL,
    seed: int = 0,
    num_bootstrap_iterations: int = ASO_ITERATIONS,
) -> float:
    """epsilon_min of the almost-stochastic-order test (Dror et al. 2019) that A is better than B (higher = better).

    deepsig's `aso`, unchanged: epsilon_min < 0.5 rejects "A is not better than B" at `confidence_level`
    (0.2-0.3 is the stricter reading). For errors (lower = better) pass their negatives.
    """
    from deepsig import aso as deepsig_aso

    a = np.asarray(scores_a, dtype=np.float64)
    b = np.asarray(scores_b, dtype=np.float64)
    if a.size < 2 or b.size < 2 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise InputError("the ASO test needs at least two finite scores per side")
    return float(
        deepsig_aso(a, b, confidence_level=confidence_level, num_bootstrap_iterations=num_bootstrap_iterations,
                    seed=seed, show_progress=False)  # fmt: skip
    )


def aso_both_ways(errors_a: Sequence[float], errors_b: Sequence[float], **kwargs: Any) -> dict[str, float]:
    """ASO on errors (lower = better): epsilon_min that A beats B, and that B beats A."""
    neg_a, neg_b = -np.asarray(errors_a, dtype=np.float64), -np.asarray(errors_b, dtype=np.float64)
    return {"eps_a_better": aso(neg_a, neg_b, **kwargs), "eps_b_better": aso(neg_b, neg_a, **kwargs)}
