"""Agreement and evaluation metrics: rank correlation, top-k overlap, and the ASO significance test.

    spearman(x, y) = pearson(rank(x), rank(y)),  ranks averaged over ties (1-based)
    jaccard_top_k(x, y, k) = |top_k(x) & top_k(y)| / |top_k(x) | top_k(y)|,  top_k by |value|
    aso(a, b): Dror et al. (2019) almost stochastic order, epsilon_min that A is better than B (deepsig)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import InputError


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
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    # boundaries of runs of equal values in sorted order
    starts = np.flatnonzero(np.r_[True, sorted_a[1:] != sorted_a[:-1]])
    ends = np.r_[starts[1:], a.size]
    mean_rank = (starts + ends + 1) / 2.0  # ranks starts+1 .. ends, averaged
    ranks = np.empty(a.size)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


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


def jaccard_top_k(x: Sequence[float], y: Sequence[float], k: int) -> float:
    """Jaccard index of the positions of the k largest |values| of x and of y (ties: lower position first)."""
    a, b = _vectors(x, y)
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    k = min(k, a.size)
    top_a = set(np.argsort(-np.abs(a), kind="mergesort")[:k].tolist())
    top_b = set(np.argsort(-np.abs(b), kind="mergesort")[:k].tolist())
    return len(top_a & top_b) / len(top_a | top_b)


def aso(
    scores_a: Sequence[float],
    scores_b: Sequence[float],
    confidence_level: float = 0.95,
    seed: int = 0,
    num_bootstrap_iterations: int = 1000,
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
