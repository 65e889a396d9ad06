"""Precision of the JVPs (xsbert_core/precision.py): bf16 / fp16 against float32, TF32's flags, the run id.

bf16 and fp16 are checked against the float32 engine (the slow, obviously correct path here is float32 itself,
which tests/test_factors_reference.py checks against reverse mode). Stated tolerances, max |P_low - P_fp32| over
max |P_fp32|: fp16 <= 1e-2, bf16 <= 5e-2 (bfloat16 keeps 8 bits of mantissa, eps 7.8e-3; float16 11 bits,
eps 9.8e-4), measured here well below them. bench/results/precision.md has MiniLM's numbers on 50 STS-B pairs.
"""

from __future__ import annotations

import pytest
import torch

from xsbert_core import Explainer, InputError
from xsbert_core.precision import PRECISIONS, canonical_precision, tf32_matmuls

TEXTS = ["A man is playing a guitar on stage.", "Someone performs music with an instrument.", "Hi."]
BOUND = {"fp16": 1e-2, "bf16": 5e-2}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def tiny_bert(tiny):
    return tiny.get("bert")


@pytest.fixture(scope="module")
def fp32(tiny_bert):
    return Explainer(tiny_bert, layer=1, steps=8).factors(TEXTS)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_factors_match_float32_within_the_stated_bound(tiny_bert, fp32, precision):
    ex = Explainer(tiny_bert, layer=1, steps=8, precision=precision)
    low = ex.factors(TEXTS)
    for lo, hi in zip(low, fp32):
        assert lo.factor.dtype == torch.float32  # cast back before the sum over nodes
        rel = _rel(lo.factor, hi.factor)
        assert 0 < rel <= BOUND[precision], (precision, rel)  # > 0: the JVPs did run in the lower precision
        # the endpoints are float32's, to the bit: the completeness check is against float32's e(x) - e(r)
        assert torch.equal(lo.embedding, hi.embedding) and torch.equal(lo.reference_embedding, hi.reference_embedding)
        assert abs(lo.error - hi.error) <= BOUND[precision]
    assert ex.settings["precision"] == precision
    # the copy was cast, not the model the explainer was given
    assert next(tiny_bert.parameters()).dtype == torch.float32
    assert ex.jvp_split.dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_pairs_of_the_real_model(minilm, precision):
    """all-MiniLM-L6-v2 (real weights), layer 4, GL N=10: cells and completeness against float32."""
    base = Explainer(minilm, layer=4, steps=10).explain(*TEXTS[:2])
    res = Explainer(minilm, layer=4, steps=10, precision=precision).explain(*TEXTS[:2])
    scale = abs(base.matrix).max()
    assert 0 < abs(res.matrix - base.matrix).max() / scale <= BOUND[precision]
    assert res.score == base.score and res.target == base.target
    assert abs(res.error) <= abs(base.error) + BOUND[precision] * abs(base.target)


def test_tf32_flags_are_on_during_the_jvps_only_and_restored(tiny_bert):
    """TF32 is a CUDA setting: on a CPU the numbers are float32's, so what is checked is the flags, as a forward hook
    on the last encoder layer sees them (endpoints: off; JVPs: on), and that both come back as they were."""
    seen: list[tuple[bool, bool]] = []
    layer = tiny_bert[0].auto_model.encoder.layer[-1]
    handle = layer.register_forward_hook(
        lambda *_: seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
    )
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        for start in [(False, True), (True, False)]:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = start
            ex = Explainer(tiny_bert, layer=1, steps=2, precision="tf32")
            seen.clear()  # after the split model's own check at construction (TF32 off too)
            tf = ex.factors(TEXTS[:1])[0]
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == start  # restored
            # endpoints (e of the input and the reference: one call of the last layer, the forward to h stops below
            # it) with TF32 off; then the JVPs with it on
            assert seen[:1] == [(False, False)] and len(seen) > 1
            assert set(seen[1:]) == {(True, True)}
            # fp32 turns a process-wide TF32 off for its JVPs (and restores it)
            ex = Explainer(tiny_bert, layer=1, steps=2, precision="fp32")
            seen.clear()
            fp = ex.factors(TEXTS[:1])[0]
            assert set(seen) == {(False, False)}
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == start
            assert torch.equal(tf.factor, fp.factor)  # on a CPU, TF32 changes no number
    finally:
        handle.remove()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_tf32_context_restores_after_an_error():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with pytest.raises(RuntimeError), tf32_matmuls(not before[0]):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before[0])
        raise RuntimeError("boom")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_precision_names(tiny_bert):
    assert [canonical_precision(x) for x in ("float32", "TF32", "bfloat16", "half")] == list(PRECISIONS)
    with pytest.raises(InputError, match="Unknown precision 'fp8'; valid: fp32, tf32, bf16, fp16"):
        Explainer(tiny_bert, layer=1, precision="fp8")


def test_explain_cli_takes_precision(tiny, tmp_path, capsys):
    import json

    from xsbert_core.cli import main

    folder = tmp_path / "m"
    tiny.get("bert").save(str(folder))
    out = tmp_path / "r.json"
    assert main(["explain", "Hi there.", "Hello.", "--model", str(folder), "--layer", "1", "--steps", "4",
                 "--precision", "bf16", "--json", str(out)]) == 0  # fmt: skip
    assert "bf16" in capsys.readouterr().out.splitlines()[0]
    assert json.loads(out.read_text())["settings"]["precision"] == "bf16"
    with pytest.raises(SystemExit):
        main(["explain", "--model", str(folder), "--precision", "fp8"])


# --------------------------------------------------------------------------- the job's run id, the pipeline
class _Settings:
    def __init__(self, **extra) -> None:
        self.settings = {"model": "m", "layer": 3, "n_layers": 6, "mode": "approx", "similarity": "cos",
                         "rule": "gauss-legendre", "steps": 16, "tolerance": None, "max_steps": None,
                         **extra}  # fmt: skip


def test_float32_run_ids_are_those_made_before_precision_was_a_setting():
    from jobs.attribute import settings
    from jobs.attribution.prepare import run_config
    from jobs.attribution.validate import load_pairs
    from jobs.store import run_id

    pairs = load_pairs("stsb", split="test", limit=3)
    args = settings(["--dataset", "stsb", "--steps", "16"]).attribution
    before = run_config(args, _Settings(), "w" * 64, pairs)  # an explainer without the precision setting
    assert "precision" not in before
    fp32 = run_config(args, _Settings(precision="fp32"), "w" * 64, pairs)
    assert fp32 == before and run_id(fp32) == run_id(before)
    ids = {run_id(run_config(args, _Settings(precision=p), "w" * 64, pairs)) for p in PRECISIONS}
    assert len(ids) == len(PRECISIONS)  # each reduced precision is a run of its own
    assert run_config(args, _Settings(precision="bf16"), "w" * 64, pairs)["precision"] == "bf16"


def test_pipeline_passes_precision_to_the_job(tmp_path):
    from jobs import attribute
    from jobs.study import schema as study_schema

    tree = {"study": "p", "datasets": {"d": {"source": "stsb", "split": "test", "limit": 2}},
            "models": {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}, "defaults": {"precision": "fp16"},
            "runs": {"a": {"dataset": "d", "model": "minilm"}, "b": {"dataset": "d", "model": "minilm",
                                                                   "precision": "bf16", "steps": 4}}}  # fmt: skip
    study = study_schema.Study.model_validate(tree)
    a = study_schema.job_settings(study, "a")
    b = study_schema.job_settings(study, "b")
    assert (a.attribution.precision, b.attribution.precision) == ("fp16", "bf16")
    assert attribute.settings(b.command()) == b
    with pytest.raises(Exception, match="precision"):
        study_schema.Study.model_validate({**tree, "defaults": {"precision": "fp8"}})
