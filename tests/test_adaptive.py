"""Adaptive N: with a tolerance, N doubles per sentence until its factor error meets it (or max_steps)."""

from __future__ import annotations

import logging

import pytest
import torch

from xsbert_core import Explainer

EASY = "Hi."
HARD = "A man is playing a guitar on stage."
TEXTS = [EASY, HARD, "Yes.", "Someone performs music with an instrument."]
TOL = 1e-2


def recomputed_error(sf) -> float:
    target = (sf.embedding - sf.reference_embedding).double()
    return float((sf.factor.double().sum(-1) - target).norm() / target.norm())


@pytest.fixture(scope="module")
def adaptive(minilm):
    ex = Explainer(minilm, layer=-3, steps=2, tolerance=TOL, max_steps=64)
    return ex, ex.factors(TEXTS, batch_size=4)


@pytest.mark.slow
def test_every_sentence_meets_the_tolerance(adaptive):
    ex, fs = adaptive
    for sf in fs:
        assert sf.error <= TOL or sf.n_steps == ex.max_steps
        assert sf.error <= TOL  # these texts converge well before 64 nodes
        assert recomputed_error(sf) == pytest.approx(sf.error, rel=1e-3, abs=1e-9)


@pytest.mark.slow
def test_steps_double_and_differ_between_easy_and_hard(adaptive):
    ex, fs = adaptive
    steps = {sf.text: sf.n_steps for sf in fs}
    for n in steps.values():
        assert n >= ex.steps and n % ex.steps == 0 and (n // ex.steps) & (n // ex.steps - 1) == 0  # 2 * 2^k
    assert steps[EASY] < steps[HARD], steps
    assert len(set(steps.values())) > 1


@pytest.mark.slow
def test_adaptive_stops_at_the_first_sufficient_n(minilm, adaptive):
    """Each sentence's N is the first of 2, 4, 8, ... that meets the tolerance: N/2 did not."""
    _, fs = adaptive
    for sf in fs:
        fixed = Explainer(minilm, layer=-3, steps=sf.n_steps).factors([sf.text])[0]
        assert float((fixed.factor - sf.factor).norm() / fixed.factor.norm()) <= 1e-5
        assert fixed.error == pytest.approx(sf.error, rel=1e-3, abs=1e-9)
        if sf.n_steps > 2:
            half = Explainer(minilm, layer=-3, steps=sf.n_steps // 2).factors([sf.text])[0]
            assert half.error > TOL


def test_max_steps_caps_and_warns(minilm, caplog):
    ex = Explainer(minilm, layer=-1, steps=2, tolerance=1e-12, max_steps=4)
    with caplog.at_level(logging.WARNING, logger="xsbert_core"):
        fs = ex.factors([EASY, HARD])
    assert [sf.n_steps for sf in fs] == [4, 4]
    assert all(sf.error > 1e-12 for sf in fs)
    assert any("tolerance" in r.getMessage() and "max_steps=4" in r.getMessage() for r in caplog.records)


def test_without_tolerance_n_is_fixed(minilm):
    fs = Explainer(minilm, layer=-1, steps=2).factors([EASY, HARD])
    assert [sf.n_steps for sf in fs] == [2, 2]
    assert all(sf.error > TOL for sf in fs)  # N=2 is too few: the adaptive test above is not vacuous


def test_adaptive_pairs_report_steps(minilm):
    ex = Explainer(minilm, layer=-1, steps=2, tolerance=5e-2, max_steps=32)
    res = ex.explain(EASY, HARD)
    assert res.factor_error_a <= 5e-2 and res.factor_error_b <= 5e-2
    assert res.steps_a >= 2 and res.steps_b >= 2
    assert res.settings["tolerance"] == 5e-2 and res.settings["max_steps"] == 32
    assert torch.isfinite(torch.as_tensor(res.matrix)).all()
