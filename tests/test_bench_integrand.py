"""bench/integrand.py: its g(alpha) is the engine's integrand summed over tokens (so the Gauss-Legendre sum of g is
the factors' row sums), and its peak width is the span above half the height, its steepest change a jump's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import integrand as ig  # noqa: E402

from xsbert_core import Explainer  # noqa: E402
from xsbert_core.quadrature import nodes_and_weights  # noqa: E402

TEXT = "If a die is rolled. what is the probability that the number on top is a 3?"


def test_the_integrand_at_the_engines_nodes_sums_to_its_factors(tiny):
    ex = Explainer(tiny.get("bert"), layer=1, mode="approx", rule="gauss-legendre", steps=12)
    alphas, weights = nodes_and_weights("gauss-legendre", 12)
    g, target = ig.integrand(ex, TEXT, alphas, rows=5)  # several row chunks
    (sf,) = ex.factors([TEXT])
    np.testing.assert_allclose(weights @ g, sf.factor.double().sum(-1).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(target, (sf.embedding - sf.reference_embedding).double().numpy(), atol=1e-6)
    # a fine midpoint grid integrates it too: the identity the factor error measures
    g, target = ig.integrand(ex, TEXT, ig.midpoints(400))
    assert np.linalg.norm(g.mean(0) - target) / np.linalg.norm(target) < 1e-4


def test_the_peak_is_the_tallest_and_its_width_the_span_above_half():
    alphas = ig.midpoints(1000)
    norm = 1.0 + 9.0 * np.exp(-(((alphas - 0.36) / 0.01) ** 2)) + 4.0 * np.exp(-(((alphas - 0.8) / 0.05) ** 2))
    norm[700:] += 3.0  # a step: g's steepest change, though the peak is the tallest
    p = ig.peak(alphas, np.stack([norm, np.zeros_like(norm)], axis=1))
    assert abs(p["alpha"] - 0.36) < 1e-3 and abs(p["height"] - 10.0) < 5e-2 and p["median"] < 1.5
    # half of 10 is 5: 1 + 9 exp(-u^2) > 5 for |u| < sqrt(ln(9/4)), so a width of 2 * 0.01 * 0.9005
    assert abs(p["width_at_half"] - 0.018) < 2e-3 and p["from"] < 0.36 < p["to"]
    assert p["steepest_at"] == 0.7 and abs(p["steep_length"] * 3.0 * 1000 / p["height"] - 1) < 1e-2
