"""Pair matrices from two sentence factors, and what they sum to.

    A = P_a^T P_b / (||e(a)|| ||e(b)||)        (cos;  dot: A = P_a^T P_b)
    sum A -> [e(a).e(b) - e(a).e(r_b) - e(r_a).e(b) + e(r_a).e(r_b)] / c,   c = ||e(a)|| ||e(b)||

In exact mode e(r) = 0 and the bracket is the score itself.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .settings import SIMILARITIES

Similarity = Literal["cos", "dot"]
_ALIASES = {"cos": "cos", "cosine": "cos", "cos_sim": "cos", "dot": "dot", "dot_product": "dot"}


def canonical_similarity(similarity: str) -> Similarity:
    """Map 'cos'/'cosine'/'dot'/... to 'cos' or 'dot'; raise ValueError otherwise."""
    key = str(similarity).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"Unknown similarity {similarity!r}; valid: {', '.join(SIMILARITIES)}")
    return _ALIASES[key]  # type: ignore[return-value]


def _scale(e_a: Tensor, e_b: Tensor, similarity: Similarity) -> float:
    return float(e_a.double().norm() * e_b.double().norm()) if similarity == "cos" else 1.0


def similarity_score(u: Tensor, v: Tensor, similarity: Similarity = "cos") -> float:
    """f(u, v) = cos(u, v) (0 when either is the zero vector, as e(r) in exact mode) or u . v."""
    dot = float(u.double() @ v.double())
    if similarity == "dot":
        return dot
    norms = float(u.double().norm() * v.double().norm())
    return dot / norms if norms > 0 else 0.0


def pair_matrix(p_a: Tensor, p_b: Tensor, e_a: Tensor, e_b: Tensor, similarity: Similarity = "cos") -> Tensor:
    """Token-pair attributions, shape (S_a, S_b), float64.

    A = P_a^T P_b / (||e(a)|| ||e(b)||)   (dot: A = P_a^T P_b)
    """
    return (p_a.double().T @ p_b.double()) / _scale(e_a, e_b, similarity)


def completeness_target(e_a: Tensor, e_b: Tensor, r_a: Tensor, r_b: Tensor, similarity: Similarity = "cos") -> float:
    """[e(a).e(b) - e(a).e(r_b) - e(r_a).e(b) + e(r_a).e(r_b)] / c: what sum A converges to."""
    a, b, ra, rb = (t.double() for t in (e_a, e_b, r_a, r_b))
    bracket = a @ b - a @ rb - ra @ b + ra @ rb
    return float(bracket) / _scale(e_a, e_b, similarity)


def compute_completeness_error(
    matrix: Tensor, e_a: Tensor, e_b: Tensor, r_a: Tensor, r_b: Tensor, similarity: Similarity = "cos"
) -> float:
    """sum A - completeness_target(...): the quadrature's residual for one pair (captum's delta)."""
    return float(torch.as_tensor(matrix).double().sum()) - completeness_target(e_a, e_b, r_a, r_b, similarity)
