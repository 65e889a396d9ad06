"""Quadrature rules over alpha in [0, 1] (docs/DESIGN.md §1)."""

from __future__ import annotations

import numpy as np
import pytest

from xsbert_core import nodes_and_weights


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_riemann_is_right_riemann_with_exactly_n_points(n):
    alphas, weights = nodes_and_weights("riemann", n)
    np.testing.assert_array_equal(alphas, np.arange(1, n + 1) / n)
    np.testing.assert_array_equal(weights, np.full(n, 1.0 / n))
    assert alphas.dtype == weights.dtype == np.float64


@pytest.mark.parametrize("n", [1, 2, 4, 8, 32])
def test_gauss_legendre_nodes_in_unit_interval_and_exact_to_degree_2n_minus_1(n):
    alphas, weights = nodes_and_weights("gauss-legendre", n)
    assert len(alphas) == len(weights) == n
    assert np.all((alphas > 0) & (alphas < 1)) and np.all(weights > 0)
    assert weights.sum() == pytest.approx(1.0, abs=1e-14)
    for degree in range(2 * n):
        assert np.sum(weights * alphas**degree) == pytest.approx(1.0 / (degree + 1), rel=1e-12, abs=1e-14)
    if n <= 4:  # and not beyond (for large n the degree-2n error falls below float resolution)
        assert abs(np.sum(weights * alphas ** (2 * n)) - 1.0 / (2 * n + 1)) > 1e-6


def test_gauss_legendre_beats_riemann_on_a_smooth_integrand():
    f = np.exp  # int_0^1 e^a da = e - 1
    exact = np.e - 1
    a, w = nodes_and_weights("riemann", 16)
    riemann_err = abs(np.sum(w * f(a)) - exact)
    a, w = nodes_and_weights("gauss-legendre", 4)
    gl_err = abs(np.sum(w * f(a)) - exact)
    assert gl_err < 1e-6 < riemann_err
