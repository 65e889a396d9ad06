"""Forward-mode sentence factors == the slow reverse-mode reference (one backward pass per dimension).

Tiny random BERT / MPNet / RoBERTa / DistilBERT / XLM-R encoders, several layers, both quadrature
rules, both modes, mean / cls / max pooling. The text under test is computed inside a batch with a
longer text, so it is padded: padding must not leak into its factor.
"""

from __future__ import annotations

import pytest
import torch

from xsbert_core import Explainer
from xsbert_core.reverse import sentence_factor_reverse

TEXT = "The guitarist plays unbelievably well."
LONGER = (
    "A man is playing a guitar on stage, and the children are playing football in the park "
    "while two dogs run across the snowy field."
)
STEPS = 3
TOL = 1e-5


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm())


def check_against_reverse(model, layer, mode, rule, steps=STEPS):
    ex = Explainer(model, layer=layer, mode=mode, rule=rule, steps=steps)
    fast, other = ex.factors([TEXT, LONGER])
    assert len(fast.tokens) < len(other.tokens)  # TEXT really was padded inside the batch
    ref = sentence_factor_reverse(ex.split, TEXT, rule, steps)
    assert fast.factor.shape == ref.shape == (fast.embedding.shape[0], len(fast.tokens))
    assert float(ref.norm()) > 0
    assert rel_err(fast.factor, ref) <= TOL
    return ex, fast, ref


LAYERS_4 = (0, 2, 3, -3)  # first, middle, last, negative (= 1) of a 4-layer model


@pytest.mark.parametrize("mode", ["approx", "exact"])
@pytest.mark.parametrize("rule", ["riemann", "gauss-legendre"])
@pytest.mark.parametrize("layer", LAYERS_4)
@pytest.mark.parametrize("arch", ["bert", "mpnet", "roberta"])
def test_forward_equals_reverse(tiny, arch, layer, rule, mode):
    check_against_reverse(tiny.get(arch, n_layers=4), layer, mode, rule)


@pytest.mark.parametrize("mode", ["approx", "exact"])
@pytest.mark.parametrize("rule", ["riemann", "gauss-legendre"])
@pytest.mark.parametrize("layer", [0, -1])
def test_forward_equals_reverse_distilbert(tiny, layer, rule, mode):
    model = tiny.get("distilbert", n_layers=2)
    assert type(model[0].auto_model).__name__ == "DistilBertModel"
    ex, _, _ = check_against_reverse(model, layer, mode, rule)
    assert ex.split.n_layers == 2


@pytest.mark.parametrize("mode", ["approx", "exact"])
@pytest.mark.parametrize(
    "arch,pooling",
    [("bert", "cls"), ("bert", "max"), ("mpnet", "max"), ("roberta", "cls"), ("distilbert", "max"), ("xlmr", "mean")],
)
def test_forward_equals_reverse_other_poolings(tiny, arch, pooling, mode):
    model = tiny.get(arch, pooling=pooling)
    assert model[1].pooling_mode == pooling
    check_against_reverse(model, 1, mode, "gauss-legendre")


def test_exact_mode_differs_from_approx_under_max_pooling(tiny):
    """Under mean/cls pooling the shift is constant and P is mode-independent; under max it is not."""
    model = tiny.get("bert", pooling="max")
    fa = Explainer(model, layer=1, mode="approx", steps=STEPS).factors([TEXT])[0]
    fe = Explainer(model, layer=1, mode="exact", steps=STEPS).factors([TEXT])[0]
    assert rel_err(fe.factor, fa.factor) > 1e-3


@pytest.mark.parametrize("similarity", ["cos", "dot"])
def test_same_weights_approx_and_exact_pair_matrices_are_proportional(tiny, similarity):
    """Mean pooling: P is mode-independent, so A_exact = c * A_approx with one c > 0 per pair,
    c = ||e(a)|| ||e(b)|| / (||e'(a)|| ||e'(b)||) for cos (e' = e - e(r)) and c = 1 for dot. Hence any
    rank-based disagreement between an approximate and an exact attribution comes from different weights
    (docs/RESULTS.md, agreement), not from the mode."""
    model = tiny.get("bert", n_layers=3)
    approx = Explainer(model, layer=1, mode="approx", similarity=similarity, steps=STEPS)
    exact = Explainer(model, layer=1, mode="exact", similarity=similarity, steps=STEPS)
    fa, fb = approx.factors([TEXT, LONGER])
    ea, eb = exact.factors([TEXT, LONGER])
    ra, re_ = approx.pair(fa, fb), exact.pair(ea, eb)
    assert abs(ra.score - re_.score) > 1e-3  # the two modes score different embeddings
    c = 1.0
    if similarity == "cos":
        c = float(fa.embedding.norm() * fb.embedding.norm() / (ea.embedding.norm() * eb.embedding.norm()))
        assert abs(c - 1) > 1e-2 and abs(ra.attribution_sum - re_.attribution_sum) > 1e-3
    assert torch.allclose(torch.from_numpy(re_.matrix), c * torch.from_numpy(ra.matrix), rtol=1e-5, atol=1e-9)


def test_reference_comparison_discriminates(tiny):
    """The 1e-5 check is meaningful: a neighbouring layer or another N gives a clearly different factor."""
    model = tiny.get("bert", n_layers=4)
    ex = Explainer(model, layer=2, rule="gauss-legendre", steps=STEPS)
    fast = ex.factors([TEXT])[0]
    other_n = sentence_factor_reverse(ex.split, TEXT, "gauss-legendre", STEPS + 1)
    assert rel_err(fast.factor, other_n) > 1e-4
    other_layer = Explainer(model, layer=1, rule="gauss-legendre", steps=STEPS)
    ref_other_layer = sentence_factor_reverse(other_layer.split, TEXT, "gauss-legendre", STEPS)
    assert rel_err(fast.factor, ref_other_layer) > 1e-3


# ----------------------------------------------------------------- the split itself, independently
@pytest.mark.parametrize("arch", ["bert", "mpnet", "roberta", "distilbert", "xlmr"])
def test_split_endpoints_match_plain_model(tiny, arch):
    """h(x) = the embeddings output pushed through encoder layers 0..L-1 one by one (tests/independent.py,
    each text alone, unpadded); e(x) is the pipeline's own output (tiny models have no Normalize)."""
    import independent as ind

    from xsbert_core.factors import endpoints

    model = tiny.get(arch, n_layers=3)
    texts = [TEXT, LONGER]
    expected = model.encode(texts, convert_to_tensor=True, batch_size=8)
    alone = [ind.tokenize(model, t) for t in texts]
    with torch.no_grad():  # token types are all 0 here, the embeddings' default
        embedded = [model[0].auto_model.embeddings(input_ids=f["input_ids"]) for f in alone]
    for layer in (0, 1, 2):
        ex = Explainer(model, layer=layer, steps=1)
        batch = ex.split.tokenize(texts)
        ends = endpoints(ex.split, batch)
        for b, (feats, h0) in enumerate(zip(alone, embedded)):
            n = batch.lengths[b]
            assert batch.features["input_ids"][b, :n].tolist() == feats["input_ids"][0].tolist()
            with torch.no_grad():
                h_l = ind.run_layers(model, h0, feats["attention_mask"], 0, layer)[0]
            assert torch.allclose(ends.h_x[b, :n], h_l, atol=1e-5), (layer, b)
        assert torch.allclose(ends.e_x, expected, rtol=1e-5, atol=1e-5)
        fs = ex.factors(texts)
        assert torch.allclose(torch.stack([f.embedding for f in fs]), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_model_unchanged_after_explaining(tiny, arch):
    """The split restores the layer list and the embeddings output: encode() is unchanged afterwards."""
    model = tiny.build(arch)
    before = model.encode([TEXT, LONGER], convert_to_tensor=True)
    layers_before = list(model[0].auto_model.modules())
    Explainer(model, layer=2, steps=2).explain(TEXT, LONGER)
    Explainer(model, layer=0, steps=2, mode="exact").explain(TEXT, LONGER)
    after = model.encode([TEXT, LONGER], convert_to_tensor=True)
    assert torch.equal(before, after)
    assert list(model[0].auto_model.modules()) == layers_before


@pytest.mark.parametrize(
    "arch,pad_name", [("bert", "[PAD]"), ("mpnet", "<pad>"), ("roberta", "<pad>"), ("xlmr", "<pad>")]
)
def test_reference_tokens_come_from_the_tokenizer(tiny, arch, pad_name):
    """r = [CLS/BOS] PAD ... PAD [SEP/EOS], same length, ids from the model's own tokenizer."""
    model = tiny.get(arch)
    tok = model[0].tokenizer
    ex = Explainer(model, layer=1)
    batch = ex.split.tokenize([TEXT, LONGER])
    for b in range(2):
        n = batch.lengths[b]
        ids = batch.features["input_ids"][b, :n]
        ref = tok.convert_ids_to_tokens(batch.reference_ids[b, :n].tolist())
        assert ref[0] == tok.convert_ids_to_tokens(int(ids[0])) == (tok.cls_token or tok.bos_token)
        assert ref[-1] == tok.convert_ids_to_tokens(int(ids[-1])) == (tok.sep_token or tok.eos_token)
        assert ref[1:-1] == [pad_name] * (n - 2)
        assert tok.pad_token == pad_name
    # the attention mask of the reference is the input's: all S positions
    assert torch.equal(batch.reference_features()["attention_mask"], batch.features["attention_mask"])


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_exact_mode_reference_embedding_is_zero_and_completeness(tiny, arch):
    """Exact mode: e(r) = 0 exactly; per-sentence completeness sum_s P -> e(x) - e(r) at large N."""
    model = tiny.get(arch)
    for mode in ("approx", "exact"):
        ex = Explainer(model, layer=1, mode=mode, steps=32)
        f, g = ex.factors([TEXT, LONGER])
        for sf in (f, g):
            if mode == "exact":
                assert torch.count_nonzero(sf.reference_embedding) == 0
            else:
                assert float(sf.reference_embedding.norm()) > 0
            target = (sf.embedding - sf.reference_embedding).double()
            got = sf.factor.double().sum(-1)
            recomputed = float((got - target).norm() / target.norm())
            assert recomputed == pytest.approx(sf.error, rel=1e-3, abs=1e-9)
            assert sf.error < 1e-4
