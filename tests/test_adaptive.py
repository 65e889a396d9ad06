"""Adaptive N by doubling (--refine double): with a tolerance, N doubles per sentence until its factor error meets it
(or max_steps). The default, by panels, is tests/test_refine.py's; the job's default settings are checked here."""

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
    ex = Explainer(minilm, layer=-3, steps=2, tolerance=TOL, max_steps=64, refine="double")
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
    ex = Explainer(minilm, layer=-1, steps=2, tolerance=1e-12, max_steps=4, refine="double")
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
    ex = Explainer(minilm, layer=-1, steps=2, tolerance=5e-2, max_steps=32, refine="double")
    res = ex.explain(EASY, HARD)
    assert res.factor_error_a <= 5e-2 and res.factor_error_b <= 5e-2
    assert res.steps_a >= 2 and res.steps_b >= 2
    assert res.settings["tolerance"] == 5e-2 and res.settings["max_steps"] == 32
    assert torch.isfinite(torch.as_tensor(res.matrix)).all()


def test_sentence_factors_say_whether_they_converged(minilm):
    capped = Explainer(minilm, layer=-1, steps=2, tolerance=1e-12, max_steps=4, refine="double").factors([EASY])[0]
    assert capped.converged is False and capped.error > 1e-12 and capped.n_steps == 4
    loose = Explainer(minilm, layer=-1, steps=2, tolerance=1.0, max_steps=4, refine="double").factors([EASY])[0]
    assert loose.converged is True and loose.n_steps == 2
    assert Explainer(minilm, layer=-1, steps=2).factors([EASY])[0].converged is True  # fixed N: nothing to meet


# --------------------------------------------------------------------------- the dataset default (jobs.attribute)
def test_adaptive_n_is_the_dataset_default_and_steps_alone_is_fixed():
    from jobs.attribute import settings
    from jobs.config import DEFAULT_ADAPTIVE_TOLERANCE
    from xsbert_core.explainer import DEFAULT_MAX_STEPS, DEFAULT_STEPS

    def attribution(*argv: str):
        return settings(list(argv)).attribution

    default = attribution()
    assert (default.steps, default.tolerance, default.max_steps) == (DEFAULT_STEPS, DEFAULT_ADAPTIVE_TOLERANCE,
                                                                     DEFAULT_MAX_STEPS)  # fmt: skip
    assert (attribution("--steps", "12").steps, attribution("--steps", "12").tolerance) == (12, None)
    both = attribution("--steps", "4", "--tolerance", "1e-2")
    assert (both.steps, both.tolerance) == (4, 1e-2)
    assert (attribution("--tolerance", "1e-2").steps, attribution("--tolerance", "1e-2").tolerance) == (
        DEFAULT_STEPS, 1e-2)  # fmt: skip


def test_the_default_study_keeps_its_fixed_n_and_run_settings():
    """configs/default.yaml sets steps (N=12) and no tolerance: its runs stay fixed-N (their run ids unchanged)."""
    from pathlib import Path

    from jobs import attribute, pipeline
    from jobs.study import schema as study_schema

    study = pipeline.load_config(Path(__file__).resolve().parents[1] / "configs" / "default.yaml")
    for name in study.runs:
        job = study_schema.job_settings(study, name)
        a = job.attribution
        assert (a.steps, a.tolerance, a.precision) == (12, None, "fp32")
        assert attribute.settings(job.command()) == job


def test_a_sentence_above_the_tolerance_at_max_steps_is_a_not_converged_failure(minilm_folder):
    from jobs.attribution.actors import NOT_CONVERGED, FactorActor
    from jobs.attribution.stage2 import failure_reason
    from xsbert_core import EngineSettings

    actor = FactorActor(EngineSettings(str(minilm_folder), layer=-1, mode="approx", similarity="cos", steps=2,
                                       tolerance=1e-12, max_steps=4))  # fmt: skip
    import pyarrow as pa

    rows = actor(pa.table({"sentence_id": ["a", "b"], "text": [EASY, HARD]})).to_pylist()
    for row in rows:
        assert row["failure"].startswith(NOT_CONVERGED) and "tolerance 1e-12 at max_steps N=4" in row["failure"]
        assert row["factor"] is None
        assert failure_reason(row["failure"]) == "not_converged"
    assert failure_reason("NumericalError: NaN/Inf in attributions") == "attribution_error"


@pytest.mark.slow
def test_job_quarantines_the_pairs_of_sentences_that_did_not_converge(minilm, tmp_path):
    """A tolerance between the sentences' errors: the pairs of sentences above it at --max-steps are quarantined as
    not_converged, every stored pair's sentences meet it, and pairs in = stored + quarantined. (The local executor:
    the same factor actor and store code as a Ray run, tests/test_job*.py compare the two.)"""
    from jobtools import q, run_job, stsb_rows, write_tsv

    rows = stsb_rows(4)
    texts = list(dict.fromkeys([*rows.sentence1, *rows.sentence2]))
    errs = {n: {sf.text: sf.error for sf in Explainer(minilm, layer=-1, steps=n).factors(texts)} for n in (2, 4)}
    final = sorted(min(errs[2][t], errs[4][t]) for t in texts)
    k = len(final) // 2
    tol = float((final[k - 1] * final[k]) ** 0.5)  # between two sentences' errors, far from either
    converged = {t: errs[2][t] <= tol or errs[4][t] <= tol for t in texts}
    bad = {f"p{i:03d}" for i, (a, b) in enumerate(zip(rows.sentence1, rows.sentence2))
           if not (converged[a] and converged[b])}  # fmt: skip
    assert 0 < len(bad) < len(rows)
    s = run_job(tmp_path / "runs", "--dataset", str(write_tsv(tmp_path / "p.tsv", rows)), "--tolerance", repr(tol),
                "--max-steps", "4", "--refine", "double", "--executor", "local")  # fmt: skip
    run_dir = s["run_dir"]
    assert (s["n_in"], s["n_done"], s["n_quarantined"]) == (len(rows), len(rows) - len(bad), len(bad))
    assert s["quarantine_reasons"] == {"not_converged": len(bad)}
    got = q(run_dir, "select pair_id, reason, detail from {quarantine}")
    assert {p for p, _, _ in got} == bad and all(d.startswith("not_converged: factor error") for _, _, d in got)
    for a, b, sa, sb in q(run_dir, "select factor_error_a, factor_error_b, steps_a, steps_b from {pairs}"):
        assert a <= tol and b <= tol and {sa, sb} <= {2, 4}
    assert q(run_dir, "select count(*) from {sentences} where factor_error > " + repr(tol)) == [(0,)]
