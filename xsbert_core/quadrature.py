"""Quadrature rules for the path integral over alpha in [0, 1].

A rule is nodes alpha_n in (0, 1] and weights w_n with  int_0^1 f(a) da ~ sum_n w_n f(alpha_n).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

Rule = Literal["riemann", "gauss-legendre"]

SUPPORTED_RULES: tuple[str, ...] = ("riemann", "gauss-legendre")

# Other spellings accepted for the two rules (captum's names among them).
_ALIASES = {
    "riemann": "riemann",
    "riemann_right": "riemann",
    "riemann-right": "riemann",
    "gauss-legendre": "gauss-legendre",
    "gausslegendre": "gauss-legendre",
    "gauss_legendre": "gauss-legendre",
    "gl": "gauss-legendre",
}


def canonical_rule(rule: str) -> Rule:
    """Map a rule name or alias to 'riemann' or 'gauss-legendre'; raise ValueError otherwise."""
    key = str(rule).strip().lower()
    if key not in _ALIASES:
        raise ValueError(f"Unknown quadrature rule {rule!r}; valid rules: {', '.join(SUPPORTED_RULES)}")
    return _ALIASES[key]  # type: ignore[return-value]


def nodes_and_weights(rule: str, n_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes alpha_n and weights w_n (float64 arrays of length n_steps).

    riemann:        alpha_n = n / N, w_n = 1 / N, n = 1..N   (the reference code's rule)
    gauss-legendre: Gauss-Legendre nodes x_n, weights v_n on [-1, 1] mapped to
                    alpha_n = (x_n + 1) / 2, w_n = v_n / 2
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"n_steps must be an integer >= 1, got {n_steps!r}")
    n = int(n_steps)
    rule = canonical_rule(rule)
    if rule == "riemann":
        alphas = np.arange(1, n + 1, dtype=np.float64) / n
        weights = np.full(n, 1.0 / n)
    else:
        x, v = np.polynomial.legendre.leggauss(n)
        alphas, weights = (x + 1.0) / 2.0, v / 2.0
    return alphas, weights


@dataclass(frozen=True)
class Panel:
    """A piece [a, b] of the path's [0, 1] with n nodes of a rule mapped into it."""

    a: float
    b: float
    n: int

    @property
    def width(self) -> float:
        return self.b - self.a

    def halves(self) -> tuple[Panel, Panel]:
        """[a, m] and [m, b], m = (a + b) / 2, each with n nodes."""
        m = (self.a + self.b) / 2.0
        return Panel(self.a, m, self.n), Panel(m, self.b, self.n)


def panel_nodes_and_weights(rule: str, panel: Panel) -> tuple[np.ndarray, np.ndarray]:
    """The rule's nodes and weights on [a, b]:  int_a^b f ~ sum_n (b - a) w_n f(a + (b - a) alpha_n).

    On [0, 1] these are nodes_and_weights(rule, n) exactly (0 + 1 * alpha = alpha in floating point).
    """
    alphas, weights = nodes_and_weights(rule, panel.n)
    return panel.a + panel.width * alphas, panel.width * weights
