"""Completeness on the real all-MiniLM-L6-v2 (docs/DESIGN.md §1).

Exact mode: sum A -> f(a, b) as N grows. Approximate mode: sum A -> the bracket / c (`res.target`),
which is not the score. The engine's e(x) is the pipeline without its trailing Normalize.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from xsbert_core import Explainer

A = "A man is playing a guitar on stage."
B = "Someone performs music with an instrument."
NS = (2, 4, 8, 16, 32)


@pytest.fixture(scope="module")
def exact_runs(minilm):
    return {n: Explainer(minilm, layer=-3, mode="exact", rule="gauss-legendre", steps=n).explain(A, B) for n in NS}


@pytest.fixture(scope="module")
def approx_runs(minilm):
    return {n: Explainer(minilm, layer=-3, mode="approx", rule="gauss-legendre", steps=n).explain(A, B) for n in NS}


@pytest.mark.slow
def test_exact_sum_converges_to_score(exact_runs):
    errs = [abs(exact_runs[n].attribution_sum - exact_runs[n].score) for n in NS]
    # the score is the model's, not N's
    scores = [exact_runs[n].score for n in NS]
    assert max(scores) - min(scores) < 1e-6
    for prev, nxt in zip(errs, errs[1:]):
        assert nxt <= prev * 1.1, errs  # monotone, up to float noise
    assert errs[-1] < errs[0] / 100, errs
    assert errs[-1] <= 1e-3, errs
    # sum A is the sum of the matrix it reports
    res = exact_runs[32]
    assert res.attribution_sum == pytest.approx(float(res.matrix.sum()), abs=1e-9)
    assert res.positive_sum + res.negative_sum == pytest.approx(res.attribution_sum, abs=1e-9)
    assert res.positive_sum > 0 > res.negative_sum


@pytest.mark.slow
def test_exact_mode_reference_terms_vanish(minilm, exact_runs):
    res = exact_runs[8]
    assert res.ref_sim_a == 0.0 and res.ref_sim_b == 0.0 and res.ref_term == 0.0
    assert res.target == pytest.approx(res.score, abs=1e-9)
    assert res.error == pytest.approx(res.attribution_sum - res.score, abs=1e-9)
    fs = Explainer(minilm, layer=-3, mode="exact", steps=2).factors([A, B])
    for f in fs:
        assert f.reference_embedding.shape == f.embedding.shape
        assert torch.count_nonzero(f.reference_embedding) == 0
        assert float(f.embedding.norm()) > 0


@pytest.mark.slow
def test_approx_sum_converges_to_bracket_not_score(approx_runs):
    res = approx_runs[32]
    assert abs(res.attribution_sum - res.target) < 1e-3
    assert abs(res.attribution_sum - res.score) > 0.3
    assert abs(res.error - (res.attribution_sum - res.target)) < 1e-12
    errs = [abs(approx_runs[n].error) for n in NS]
    assert errs[-1] < errs[0] / 100, errs
    # off-the-shelf: references are not zero, the reference term is large (paper Fig. 2)
    assert res.ref_term > 0.5
    assert res.ref_term != 0 and res.ref_sim_a != 0 and res.ref_sim_b != 0


@pytest.mark.slow
def test_approx_target_is_the_design_bracket(minilm, approx_runs):
    """Recompute the bracket from e(a), e(b), e(r_a), e(r_b) independently of the engine's pairs module."""
    fa, fb = Explainer(minilm, layer=-3, mode="approx", steps=2).factors([A, B])
    ends = (fa.embedding, fb.embedding, fa.reference_embedding, fb.reference_embedding)
    a, b, ra, rb = (t.double().numpy() for t in ends)
    c = np.linalg.norm(a) * np.linalg.norm(b)
    bracket = (a @ b - a @ rb - ra @ b + ra @ rb) / c
    res = approx_runs[32]
    assert res.target == pytest.approx(bracket, abs=1e-6)
    assert res.score == pytest.approx(a @ b / c, abs=1e-6)
    cos = lambda u, v: float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))  # noqa: E731
    assert res.ref_sim_a == pytest.approx(cos(a, rb), abs=1e-6)
    assert res.ref_sim_b == pytest.approx(cos(b, ra), abs=1e-6)
    assert res.ref_term == pytest.approx(cos(ra, rb), abs=1e-6)
    # the matrix is P_a^T P_b / c
    fa32, fb32 = Explainer(minilm, layer=-3, mode="approx", steps=32).factors([A, B])
    expected = fa32.factor.double().numpy().T @ fb32.factor.double().numpy() / c
    np.testing.assert_allclose(res.matrix, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_per_sentence_factor_error_shrinks_with_n(approx_runs):
    for side in ("a", "b"):
        errs = [getattr(approx_runs[n], f"factor_error_{side}") for n in NS]
        for prev, nxt in zip(errs, errs[1:]):
            assert nxt <= prev * 1.1, errs
        assert errs[-1] < 1e-4 < errs[0], errs
        assert [getattr(approx_runs[n], f"steps_{side}") for n in NS] == list(NS)


@pytest.mark.slow
def test_riemann_converges_too_but_slower(minilm, exact_runs):
    errs = {}
    for n in (4, 32):
        res = Explainer(minilm, layer=-3, mode="exact", rule="riemann", steps=n).explain(A, B)
        errs[n] = abs(res.attribution_sum - res.score)
    assert errs[32] < errs[4]
    # at equal N, Gauss-Legendre is far more accurate on this smooth path
    assert abs(exact_runs[32].attribution_sum - exact_runs[32].score) < errs[32] / 10


def test_embedding_is_the_pipeline_without_normalize(minilm):
    assert type(minilm[-1]).__name__ == "Normalize"
    ex = Explainer(minilm, layer=-3, steps=1)
    fs = ex.factors([A, B, "Hi."])
    encoded = minilm.encode([A, B, "Hi."], convert_to_tensor=True)
    for f, e in zip(fs, encoded):
        norm = float(f.embedding.norm())
        assert abs(norm - 1.0) > 0.05  # Normalize was dropped
        assert abs(float(e.norm()) - 1.0) < 1e-5
        assert torch.allclose(f.embedding / norm, e, atol=1e-5)
    # and e(x) equals the same pipeline with Normalize removed
    unnormalized = SentenceTransformer(modules=[minilm[0], minilm[1]], device="cpu")
    raw = unnormalized.encode([A, B, "Hi."], convert_to_tensor=True)
    assert torch.allclose(torch.stack([f.embedding for f in fs]), raw, rtol=1e-5, atol=1e-5)
    # the score is cos(e(a), e(b)), the model's own similarity
    res = ex.pair(fs[0], fs[1])
    assert res.score == pytest.approx(float(encoded[0] @ encoded[1]), abs=1e-5)


def test_dot_similarity_matrix_and_target(minilm):
    """dot: A = P_a^T P_b and the bracket without division, written out in numpy from the factors; the
    score is the dot product of the pipeline's own (unnormalised) embeddings."""
    ex_dot = Explainer(minilm, layer=-1, similarity="dot", steps=8)
    fa, fb = ex_dot.factors([A, B])
    rd = ex_dot.pair(fa, fb)
    p_a, p_b = fa.factor.double().numpy(), fb.factor.double().numpy()
    ends = (fa.embedding, fb.embedding, fa.reference_embedding, fb.reference_embedding)
    a, b, ra, rb = (t.double().numpy() for t in ends)
    np.testing.assert_allclose(rd.matrix, p_a.T @ p_b, rtol=1e-9, atol=1e-12)
    assert rd.target == pytest.approx(a @ b - a @ rb - ra @ b + ra @ rb, rel=1e-9)
    assert (rd.ref_sim_a, rd.ref_sim_b, rd.ref_term) == pytest.approx((a @ rb, b @ ra, ra @ rb), rel=1e-9)
    assert rd.error == pytest.approx(float((p_a.T @ p_b).sum()) - rd.target, abs=1e-9)
    assert abs(rd.error) < 1e-2 * abs(rd.target)  # N = 8 at the last layer: nearly complete
    raw = SentenceTransformer(modules=[minilm[0], minilm[1]], device="cpu").encode([A, B], convert_to_tensor=True)
    assert rd.score == pytest.approx(float(raw[0].double() @ raw[1].double()), rel=1e-5)
    assert rd.score > 1.5  # unnormalised: a dot product, not a cosine
    assert rd.settings["similarity"] == "dot"
    # the same factors under cos: the same matrix divided by |e(a)| |e(b)|
    rc = Explainer(minilm, layer=-1, similarity="cos", steps=8).pair(fa, fb)
    np.testing.assert_allclose(rc.matrix, rd.matrix / (np.linalg.norm(a) * np.linalg.norm(b)), rtol=1e-9)


def test_minilm_forward_equals_reverse_at_last_layer(minilm):
    """The real model, D = 384 backward passes per node: one short text, last layer, N = 2."""
    from xsbert_core.reverse import sentence_factor_reverse

    ex = Explainer(minilm, layer=-1, mode="approx", rule="gauss-legendre", steps=2)
    fast = ex.factors(["Hi there.", "A much longer sentence pads the first one."])[0]
    ref = sentence_factor_reverse(ex.split, "Hi there.", "gauss-legendre", 2)
    assert float(((fast.factor.double() - ref.double()).norm() / ref.double().norm())) <= 1e-5
