"""Adaptive N by panels (xsbert_core.refine): the rule on pieces of [0, 1], a piece halved where its own error is.

The panels' factors are checked against the slow reverse-mode reference on the same panels, the panels' errors
against the path's points at their ends, and the loop against its contract: the tolerance met, panels that tile
[0, 1], max_steps nodes at most, the node count the sum of the panels'.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from xsbert_core import Explainer
from xsbert_core.factors import endpoints, integrate, integrate_panels, path_embeddings
from xsbert_core.quadrature import Panel, nodes_and_weights, panel_nodes_and_weights
from xsbert_core.refine import node_passes, over_share, plan_round
from xsbert_core.reverse import sentence_factor_reverse

EASY = "Hi."
HARD = "A man is playing a guitar on stage."
TEXTS = [EASY, HARD, "Yes.", "Someone performs music with an instrument."]


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref.double()).norm() / ref.double().norm())


def recomputed_error(sf) -> float:
    target = (sf.embedding - sf.reference_embedding).double()
    return float((sf.factor.double().sum(-1) - target).norm() / target.norm())


# --------------------------------------------------------------------------- the panels' rule
@pytest.mark.parametrize("rule", ["riemann", "gauss-legendre"])
def test_a_panel_of_the_whole_path_is_the_rule_exactly(rule):
    a, w = panel_nodes_and_weights(rule, Panel(0.0, 1.0, 7))
    a0, w0 = nodes_and_weights(rule, 7)
    assert np.array_equal(a, a0) and np.array_equal(w, w0)


def test_gauss_legendre_on_panels_is_exact_for_polynomials_piecewise():
    """n nodes per panel integrate degree 2n - 1 exactly on each panel: a function that is a different cubic on
    each half of [0, 1] is integrated exactly by two panels of 2 nodes, not by one."""
    def f(x):
        return np.where(x < 0.5, x**3, 1.0 - 2.0 * x**2)

    exact = 0.5**4 / 4 + (0.5 - 2.0 * (1.0 - 0.125) / 3.0)
    whole = Panel(0.0, 1.0, 2)
    got = sum(float(np.dot(w, f(a))) for a, w in map(lambda p: panel_nodes_and_weights("gl", p), whole.halves()))
    assert got == pytest.approx(exact, abs=1e-14)
    a, w = panel_nodes_and_weights("gl", whole)
    assert abs(float(np.dot(w, f(a))) - exact) > 1e-3


def test_plan_round_halves_the_panels_above_their_share_worst_first_within_the_budget():
    left, right = Panel(0.0, 0.5, 4), Panel(0.5, 1.0, 4)
    # tol 1e-2: a half's share is 5e-3
    assert plan_round([left, right], [4e-3, 6e-3], 1e-2, nodes=8, max_steps=64) == ([left], [right])
    assert plan_round([left, right], [1e-3, 2e-3], 1e-2, nodes=8, max_steps=64) == ([left, right], [])
    assert plan_round([left, right], [9e-3, 6e-3], 1e-2, nodes=8, max_steps=64) == ([], [left, right])
    # room for one more panel's nodes: the one furthest above its share
    assert plan_round([left, right], [6e-3, 9e-3], 1e-2, nodes=8, max_steps=12) == ([left], [right])
    assert plan_round([left, right], [6e-3, 9e-3], 1e-2, nodes=8, max_steps=11) == ([left, right], [])
    assert over_share(Panel(0.25, 0.5, 4), 5e-3, 1e-2) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        plan_round([left], [1.0, 2.0], 1e-2, nodes=4, max_steps=8)


def test_node_passes_count_what_each_refinement_computed_and_dropped():
    assert node_passes(16, None, 16) == 16 and node_passes(512, None, 16) == 16 + 32 + 64 + 128 + 256 + 512
    # [0, 1] -> halves -> the left half's halves: [0, 1], [0, .5], [.5, 1], [0, .25], [.25, .5] computed
    final = [Panel(0.0, 0.25, 4), Panel(0.25, 0.5, 4), Panel(0.5, 1.0, 4)]
    assert node_passes(12, final, 4) == 5 * 4


# --------------------------------------------------------------------------- the factors on panels
PANELS = [Panel(0.0, 0.25, 3), Panel(0.25, 0.375, 3), Panel(0.375, 0.5, 3), Panel(0.5, 1.0, 3)]


@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_panel_factors_equal_the_reverse_reference_on_the_same_panels(tiny, mode):
    ex = Explainer(tiny.get("bert", n_layers=4), layer=1, mode=mode, steps=3)
    batch = ex.split.tokenize([HARD, EASY])
    ends = endpoints(ex.split, batch)
    parts = integrate_panels(ex.split, ends, "gl", [PANELS, [Panel(0.0, 1.0, 5)]])
    assert parts.shape[0] == len(PANELS) + 1
    n = batch.lengths[0]
    ref = sentence_factor_reverse(ex.split, HARD, "gl", 0, panels=PANELS)
    assert rel(parts[: len(PANELS)].sum(0)[:, :n], ref) <= 1e-5
    for panel, part in zip(PANELS, parts):
        assert rel(part[:, :n], sentence_factor_reverse(ex.split, HARD, "gl", 0, panels=[panel])) <= 1e-5
    # one whole panel per sentence is `integrate` at that N, bit for bit
    whole = integrate_panels(ex.split, ends, "gl", [[Panel(0.0, 1.0, 5)]] * 2)
    assert torch.equal(whole, integrate(ex.split, ends, "gl", 5))


def test_the_path_points_close_each_panel_and_equal_the_ends(tiny):
    """sum_s P_p[:, s] -> e(x(b_p)) - e(x(a_p)) as the panel's nodes grow; at alpha 0 and 1 the points are e(r),
    e(x)."""
    ex = Explainer(tiny.get("bert", n_layers=4), layer=1, mode="approx", steps=3)
    ends = endpoints(ex.split, ex.split.tokenize([HARD]))
    e = path_embeddings(ex.split, ends, [0, 0, 0], [0.0, 0.3, 1.0])
    assert torch.allclose(e[0], ends.e_r[0], atol=1e-6) and torch.allclose(e[2], ends.e_x[0], atol=1e-6)
    panel = Panel(0.3, 1.0, 0)
    gaps = []
    for n in (1, 2, 8):
        part = integrate_panels(ex.split, ends, "gl", [[Panel(panel.a, panel.b, n)]])[0]
        gaps.append(float((part.sum(-1) - (e[2] - e[1])).norm()))
    assert gaps[2] < 1e-3 * gaps[0] and gaps[2] < 1e-5


def test_each_panels_error_is_its_own_completeness_gap(tiny):
    """The error the loop decides on: ||sum_s P_p[:, s] - (e(x(b_p)) - e(x(a_p)))|| / ||e(x) - e(r)||, the panel's
    factor by the reverse reference and its ends by the plain model's tail."""
    ex = Explainer(tiny.get("bert", n_layers=4), layer=1, mode="approx", steps=1)
    panels = [Panel(0.0, 0.25, 1), Panel(0.25, 0.5, 1), Panel(0.5, 1.0, 1)]  # one node each: gaps well above rounding
    batch = ex.split.tokenize([HARD, EASY])
    [(row, sf, parts, errors)] = ex._integrate_rows(batch, [0], {0: panels})
    ends = endpoints(ex.split, ex.split.tokenize([HARD]))
    scale = float((ends.e_x[0] - ends.e_r[0]).double().norm())
    for panel, part, error in zip(panels, parts, errors):
        e = path_embeddings(ex.split, ends, [0, 0], [panel.a, panel.b])
        ref = sentence_factor_reverse(ex.split, HARD, "gl", 0, panels=[panel])
        assert rel(part, ref) <= 1e-5
        gap = float((ref.double().sum(-1) - (e[1] - e[0]).double()).norm()) / scale
        assert error == pytest.approx(gap, rel=1e-3)
    assert min(errors) > 1e-4
    assert sf.n_steps == 3 and torch.allclose(sf.factor, parts.sum(0))


# --------------------------------------------------------------------------- the loop
TOL = 3e-3  # some of TEXTS' panels are kept while others are halved (panels of unequal widths)


def uneven(sf) -> bool:
    return len({p.width for p in sf.panels}) > 1


@pytest.fixture(scope="module")
def by_panels(minilm):
    ex = Explainer(minilm, layer=-3, steps=2, tolerance=TOL, max_steps=64)  # panels: the default
    return ex, ex.factors(TEXTS, batch_size=4)


@pytest.mark.slow
def test_panels_meet_the_tolerance_and_tile_the_path(by_panels):
    ex, fs = by_panels
    for sf in fs:
        assert sf.converged and sf.error <= TOL
        assert recomputed_error(sf) == pytest.approx(sf.error, rel=1e-3, abs=1e-9)
        ps = sf.panels
        assert ps[0].a == 0.0 and ps[-1].b == 1.0 and all(p.b == q.a for p, q in zip(ps, ps[1:]))
        assert all(p.n == ex.steps for p in ps) and sf.n_steps == sum(p.n for p in ps) <= ex.max_steps
    assert len({len(sf.panels) for sf in fs}) > 1  # sentences differ: the test is not vacuous
    assert any(uneven(sf) for sf in fs)  # panels kept in one round, others halved


@pytest.mark.slow
def test_panels_factor_is_the_reverse_reference_on_its_own_panels(minilm, by_panels):
    """The loop keeps the right factors: the sentence's factor is the reverse-mode reference on its final panels."""
    ex, fs = by_panels
    sf = min((sf for sf in fs if uneven(sf)), key=lambda sf: len(sf.tokens))
    ref = sentence_factor_reverse(ex.split, sf.text, ex.rule, 0, panels=sf.panels)
    assert rel(sf.factor, ref) <= 1e-5


@pytest.mark.slow
def test_panels_agree_with_doubling_to_the_tolerance(minilm, by_panels):
    ex, fs = by_panels
    doubled = Explainer(minilm, layer=-3, steps=2, tolerance=TOL, max_steps=64, refine="double").factors(
        TEXTS, batch_size=4)
    fine = Explainer(minilm, layer=-3, steps=128).factors(TEXTS, batch_size=4)
    for sp, sd, sr in zip(fs, doubled, fine):
        assert sp.text == sd.text == sr.text and sd.panels is None
        assert rel(sp.factor, sr.factor) <= 5 * TOL and rel(sd.factor, sr.factor) <= 5 * TOL


def test_panels_stop_at_max_steps_and_warn(minilm, caplog):
    ex = Explainer(minilm, layer=-1, steps=2, tolerance=1e-12, max_steps=7, refine="panels")
    with caplog.at_level(logging.WARNING, logger="xsbert_core"):
        fs = ex.factors([EASY, HARD])
    for sf in fs:
        assert not sf.converged and sf.error > 1e-12
        assert sf.n_steps == sum(p.n for p in sf.panels) == 6  # 2 -> 4 -> 6: one more panel would make 8
    assert any("tolerance" in r.getMessage() and "max_steps=7" in r.getMessage() for r in caplog.records)


def test_panels_without_a_tolerance_are_the_fixed_rule(minilm):
    fixed = Explainer(minilm, layer=-1, steps=3).factors([HARD])[0]
    panels = Explainer(minilm, layer=-1, steps=3, refine="panels").factors([HARD])[0]
    assert torch.equal(fixed.factor, panels.factor) and fixed.n_steps == panels.n_steps == 3
    assert panels.panels is None and panels.converged


def test_an_unknown_refinement_is_a_clear_error(minilm):
    from xsbert_core import InputError

    with pytest.raises(InputError, match="Unknown refinement 'halve'; valid: double, panels"):
        Explainer(minilm, layer=-1, refine="halve")


@pytest.mark.slow
def test_the_job_refines_by_panels_under_its_own_run_id(tmp_path):
    """jobs.attribute --refine panels: the actors load the setting, the stored N is each sentence's nodes in all,
    every stored sentence meets the tolerance, and the run id is not the doubling run's (whose config leaves
    `refine` out, as stores made before it was a setting)."""
    import json

    from jobtools import q, run_job, stsb_rows, write_tsv

    data = write_tsv(tmp_path / "p.tsv", stsb_rows(3))
    flags = ["--dataset", str(data), "--layer", "-3", "--steps", "2", "--tolerance", "3e-3", "--max-steps", "64",
             "--executor", "local"]
    panels = run_job(tmp_path / "runs", *flags, "--refine", "panels")
    doubled = run_job(tmp_path / "runs", *flags, "--refine", "double")
    assert run_job(tmp_path / "runs", *flags)["run_id"] == panels["run_id"]  # panels: the default
    assert panels["run_id"] != doubled["run_id"]
    assert (panels["n_in"], panels["n_done"]) == (3, 3)
    config = json.loads((Path(panels["run_dir"]) / "manifest.json").read_text())["config"]
    assert config["refine"] == "panels"
    assert "refine" not in json.loads((Path(doubled["run_dir"]) / "manifest.json").read_text())["config"]
    steps = q(panels["run_dir"], "select n_steps, factor_error from {sentences}")
    assert steps and all(n % 2 == 0 and 2 <= n <= 64 and err <= 3e-3 for n, err in steps)
    doubled_steps = {n for n, in q(doubled["run_dir"], "select n_steps from {sentences}")}
    assert doubled_steps <= {2, 4, 8, 16, 32, 64}
    assert {n for n, _ in steps} - {2, 4, 8, 16, 32, 64}  # panels give N that doubling cannot


def test_the_printed_settings_say_how_n_grew(minilm):
    from xsbert_core.cli import format_view

    res = Explainer(minilm, layer=-1, steps=2, tolerance=5e-2, max_steps=8).explain(EASY, HARD)
    assert "N=2 to 0.05 by panels (at most 8 nodes)" in format_view(res, EASY, HARD, top=1).splitlines()[0]
    del res.settings["refine"]  # a stored run's settings from before `refine` was one: adaptive N by doubling
    assert "N=2 to 0.05 by doubling (at most 8 nodes)" in format_view(res, EASY, HARD, top=1).splitlines()[0]
    fixed = Explainer(minilm, layer=-1, steps=2).explain(EASY, HARD)
    assert format_view(fixed, EASY, HARD, top=1).splitlines()[0].endswith("N=2")
