"""bench/negation_recheck.py: the not-token's total attribution from token-set JVPs equals the engine's matrix row
sums, so a recheck of Fig 8's signs with it is a recheck of the engine's numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import negation_recheck as nr  # noqa: E402

from xsbert_core import Explainer  # noqa: E402

PAIRS = [("p1", "The cat is not on the mat.", "The cat is on the mat."),
         ("p2", "Not a good idea at all.", "A good idea at all.")]  # fmt: skip


@pytest.fixture(scope="module")
def explainer(tiny):
    return Explainer(tiny.get("bert"), layer=1, mode="approx", similarity="cos", rule="gauss-legendre", steps=6)


def test_masked_factors_are_the_engine_columns_summed(explainer):
    text = PAIRS[0][1]
    (sf,) = explainer.factors([text])
    s = sf.factor.shape[1]
    gen = torch.Generator().manual_seed(0)
    masks = torch.stack([torch.ones(s), torch.rand(s, generator=gen), (torch.arange(s) == 3).float()])
    p, e_x, e_r = nr.masked_factors(explainer.split, [text], [masks], "gauss-legendre", 6)
    want = sf.factor.double() @ masks.double().T  # (D, K)
    assert p.shape == (1, sf.factor.shape[0], 3)
    np.testing.assert_allclose(p[0].double().numpy(), want.numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(e_x[0].numpy(), sf.embedding.numpy(), atol=1e-6)
    np.testing.assert_allclose(e_r[0].numpy(), sf.reference_embedding.numpy(), atol=1e-6)


def test_not_values_match_the_pair_matrix(explainer):
    got = nr.not_values(explainer.split, PAIRS, "gauss-legendre", 6)
    for (pid, a, b), v in zip(PAIRS, got):
        res = explainer.explain(a, b)
        rows = nr.not_tokens(explainer.split, a)
        assert [res.tokens_a[k].lower().strip("#") for k in rows] == ["not"]
        assert v.pair_id == pid and v.steps == 6
        assert v.not_attribution == pytest.approx(float(res.matrix[rows].sum()), abs=1e-5)
        assert v.attribution_sum == pytest.approx(res.attribution_sum, abs=1e-5)
        assert v.target == pytest.approx(res.target, abs=1e-6)
        assert v.error == pytest.approx(res.error, abs=1e-5)


def test_not_tokens_needs_exactly_one_standalone_not(explainer):
    with pytest.raises(ValueError, match="exactly one"):
        nr.not_tokens(explainer.split, "Not now, not ever.")
    with pytest.raises(ValueError, match="exactly one"):
        nr.not_tokens(explainer.split, "Nothing is knotted.")


def test_rounded_float16_rounds_a_copy(tiny):
    model = tiny.build("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    twin = nr.rounded_float16(model)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])  # the original is untouched
    changed = 0
    for (k, v), w in zip(model.state_dict().items(), twin.state_dict().values()):
        if v.dtype == torch.float32:
            assert torch.equal(w, v.half().float())
            changed += not torch.equal(w, v)
    assert changed > 0


def test_chosen_takes_the_smallest_clear_n():
    def v(n, val, err):
        return nr.NotValue("p", n, val, 0.0, 0.0, err)

    assert nr.chosen({32: v(32, 0.1, 0.02), 64: v(64, 0.1, 0.005), 128: v(128, 0.1, 1e-6)}, 0.1).steps == 64
    assert nr.chosen({32: v(32, -0.01, 0.002), 64: v(64, -0.01, 0.0011)}, 0.1) is None
    assert nr.chosen({32: v(32, -0.05, 0.001)}, 0.1).steps == 32
