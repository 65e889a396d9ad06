"""The engine against an implementation that shares none of its code (tests/independent.py).

Factors, e(x), e(r), the pair matrix and every pair number, for BERT-, MPNet- and RoBERTa-style
tiny random encoders, approximate and exact mode, cos and dot, both rules, first / middle / last
layer; then the real all-MiniLM-L6-v2 once. The text under test is padded inside the engine's batch
(it is shorter than its partner), while the reference runs it alone: padding must not leak.

Also the two identities the engine's endpoints rest on, checked against the sentence-transformers
pipeline itself: approximate mode's e(r) is the model's own embedding of the reference token ids,
and exact mode's e(x) is pool(T(x) - T(r)).
"""

from __future__ import annotations

import independent as ind
import numpy as np
import pytest
import torch

from xsbert_core import Explainer

A = "The guitarist plays unbelievably well."
B = "A man is playing a guitar on stage, and the children are playing football in the park."
STEPS = 3
TOL = 1e-5  # relative; float32 models, the two agree to ~5e-7


def rel(got, ref) -> float:
    """Relative error in the Frobenius norm (exact zero only matches exact zero)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / scale) if scale > 0 else float(np.linalg.norm(got))


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


_REFERENCES: dict[tuple, tuple[ind.Sentence, ind.Sentence]] = {}


def references(model, key: tuple, layer: int, mode: str, rule: str) -> tuple[ind.Sentence, ind.Sentence]:
    """The independent factors of A and B, computed once per (model, layer, mode, rule)."""
    k = (*key, layer, mode, rule)
    if k not in _REFERENCES:
        _REFERENCES[k] = tuple(ind.sentence(model, t, layer, mode, rule, STEPS) for t in (A, B))  # type: ignore
    return _REFERENCES[k]


@pytest.mark.parametrize("similarity", ["cos", "dot"])
@pytest.mark.parametrize("mode", ["approx", "exact"])
@pytest.mark.parametrize("layer", [0, 2, -1])
@pytest.mark.parametrize("arch", ["bert", "mpnet", "roberta"])
def test_engine_equals_the_independent_reference(tiny, arch, layer, mode, similarity):
    model = tiny.get(arch, n_layers=4)
    for rule in ("gauss-legendre", "riemann"):
        ra, rb = references(model, (arch, 4), layer, mode, rule)
        ex = Explainer(model, layer=layer, mode=mode, similarity=similarity, rule=rule, steps=STEPS)
        fa, fb = ex.factors([A, B])
        assert len(fa.tokens) != len(fb.tokens)  # the shorter one was padded inside the engine's batch
        for f, r in ((fa, ra), (fb, rb)):
            assert f.factor.shape == r.factor.shape
            assert rel(as_np(f.factor), r.factor) <= TOL
            assert rel(as_np(f.embedding), r.e_x) <= TOL
            if mode == "exact":
                assert not torch.any(f.reference_embedding) and not np.any(r.e_r)  # e(r) = 0 exactly
            else:
                assert rel(as_np(f.reference_embedding), r.e_r) <= TOL and np.linalg.norm(r.e_r) > 0
        got = ex.pair(fa, fb)
        want = ind.pair(ra, rb, similarity)
        assert rel(got.matrix, want["matrix"]) <= TOL
        scale = max(1.0, abs(want["score"]))  # dot products are O(|e|^2), not O(1)
        for name in ("score", "ref_sim_a", "ref_sim_b", "ref_term", "target", "error"):
            assert abs(getattr(got, name) - want[name]) <= TOL * scale, name
        assert got.attribution_sum == pytest.approx(float(want["matrix"].sum()), rel=TOL, abs=TOL * scale)


def test_the_comparison_discriminates(tiny):
    """1e-5 is a real bar: a neighbouring layer, one node fewer, the other rule or mode is far off."""
    model = tiny.get("bert", n_layers=4)
    ex = Explainer(model, layer=2, mode="approx", rule="gauss-legendre", steps=STEPS)
    fa = ex.factors([A, B])[0]
    ra = references(model, ("bert", 4), 2, "approx", "gauss-legendre")[0]
    assert rel(as_np(fa.factor), ra.factor) <= TOL
    for other, at_least in (
        (ind.sentence(model, A, 1, "approx", "gauss-legendre", STEPS).factor, 0.1),
        (ind.sentence(model, A, 2, "approx", "riemann", STEPS).factor, 1e-2),
        (ind.sentence(model, A, 2, "approx", "gauss-legendre", STEPS - 1).factor, 100 * TOL),  # GL converges fast
    ):
        assert rel(as_np(fa.factor), other) > at_least
    # exact vs approx: same factor under mean pooling, different e(x) and e(r)
    re_ = references(model, ("bert", 4), 2, "exact", "gauss-legendre")[0]
    assert rel(re_.e_x, ra.e_x) > 1e-2


@pytest.mark.parametrize("arch", ["bert", "mpnet", "roberta"])
def test_independent_reference_checks_itself(tiny, arch):
    """Its layer loop reproduces every HF hidden state, its pooling the pipeline's, padding changes nothing."""
    model = tiny.get(arch, n_layers=4)
    feats = ind.tokenize(model, B)
    states, last = ind.hf_states(model, feats)
    mask = feats["attention_mask"]
    for layer in range(4):
        assert torch.allclose(ind.run_layers(model, states[0], mask, 0, layer), states[layer], atol=1e-6)
        assert torch.allclose(ind.run_layers(model, states[layer], mask, layer), last, atol=1e-6)
    assert torch.allclose(ind.pool(last, mask, "mean"), ind.pipeline_embedding(model, feats), atol=1e-6)
    alone = ind.sentence(model, A, 1, "approx", "gauss-legendre", 2)
    longest = len(ind.tokenize(model, B)["input_ids"][0]) + 3
    padded = ind.sentence(model, A, 1, "approx", "gauss-legendre", 2, pad_to=longest)
    assert rel(padded.factor, alone.factor) < 1e-5 and rel(padded.e_x, alone.e_x) < 1e-6
    assert alone.reference_ids[1:-1] == [model[0].tokenizer.pad_token_id] * (len(alone.ids) - 2)
    assert (alone.reference_ids[0], alone.reference_ids[-1]) == (alone.ids[0], alone.ids[-1])


# ----------------------------------------------------------------- endpoints against the pipeline itself
def _engine_batch(model, layer: int, mode: str):
    ex = Explainer(model, layer=layer, mode=mode, steps=1)
    return ex, ex.factors([A, B])


@pytest.mark.parametrize("arch", ["bert", "mpnet", "roberta"])
def test_approx_reference_embedding_is_the_models_embedding_of_the_reference_ids(tiny, arch):
    model = tiny.get(arch, n_layers=3)
    _, fs = _engine_batch(model, 1, "approx")
    for text, f in zip((A, B), fs):
        ref = ind.reference_features(model, ind.tokenize(model, text), text)
        own = ind.pipeline_embedding(model, ref)[0]
        assert rel(as_np(f.reference_embedding), as_np(own)) <= TOL


@pytest.mark.parametrize("arch", ["bert", "mpnet", "roberta"])
def test_exact_embedding_is_pool_of_shifted_token_embeddings(tiny, arch):
    model = tiny.get(arch, n_layers=3)
    _, fs = _engine_batch(model, 1, "exact")
    for text, f in zip((A, B), fs):
        own = ind.exact_embedding(model, ind.tokenize(model, text), text)[0]
        assert rel(as_np(f.embedding), as_np(own)) <= TOL
        assert not torch.any(f.reference_embedding)
        # and it is not the unshifted embedding
        assert rel(as_np(f.embedding), as_np(ind.pipeline_embedding(model, ind.tokenize(model, text))[0])) > 1e-2


def test_minilm_endpoints_against_the_pipeline(minilm):
    """The real model: e(r) (approx) = its embedding of [CLS] PAD.. [SEP]; e(x) (exact) = pool(T(x) - T(r))."""
    _, approx = _engine_batch(minilm, -3, "approx")
    _, exact = _engine_batch(minilm, -3, "exact")
    for text, fa, fe in zip((A, B), approx, exact):
        feats = ind.tokenize(minilm, text)
        ref = ind.reference_features(minilm, feats, text)
        assert minilm[0].tokenizer.convert_ids_to_tokens(ref["input_ids"][0].tolist())[:2] == ["[CLS]", "[PAD]"]
        assert rel(as_np(fa.reference_embedding), as_np(ind.pipeline_embedding(minilm, ref)[0])) <= TOL
        assert rel(as_np(fa.embedding), as_np(ind.pipeline_embedding(minilm, feats)[0])) <= TOL
        assert rel(as_np(fe.embedding), as_np(ind.exact_embedding(minilm, feats, text)[0])) <= TOL


@pytest.mark.slow
def test_minilm_engine_equals_the_independent_reference(minilm):
    """The real model once: last layer, N = 2, a short pair (384 backward passes per node and text)."""
    a, b = "Hi there.", "A much longer sentence pads the first one."
    ex = Explainer(minilm, layer=-1, mode="approx", similarity="cos", rule="gauss-legendre", steps=2)
    fa, fb = ex.factors([a, b])
    ra, rb = (ind.sentence(minilm, t, -1, "approx", "gauss-legendre", 2) for t in (a, b))
    for f, r in ((fa, ra), (fb, rb)):
        assert rel(as_np(f.factor), r.factor) <= TOL
        assert rel(as_np(f.embedding), r.e_x) <= TOL and rel(as_np(f.reference_embedding), r.e_r) <= TOL
    got, want = ex.pair(fa, fb), ind.pair(ra, rb, "cos")
    assert rel(got.matrix, want["matrix"]) <= TOL
    for name in ("score", "ref_sim_a", "ref_sim_b", "ref_term", "target", "error"):
        assert getattr(got, name) == pytest.approx(want[name], abs=TOL), name
