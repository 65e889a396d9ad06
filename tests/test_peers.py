"""Our matrices against other implementations of the same math, on tiny random encoders.

- retrivex (PyPI): `IntJacobianExplainableTransformer.explain`, integrated Jacobians of an off-the-shelf
  sentence-transformers model (Moeller et al., EACL 2024), the whole token x token matrix. Its conventions, where
  they meet ours: the reference is [CLS] PAD ... PAD [SEP] from the tokenizer (ours too), attention over all its
  positions (ours too), the hook interpolates the hidden states entering encoder layer `layer_index` (our `layer`),
  alpha = 1, 1 - 1/N, ..., 1/N with weight 1/N (our rule `riemann`), and cos divides by ||e(a)|| ||e(b)||. One
  difference: it attributes the model's whole pipeline, a trailing `Normalize` included, where ours (and the
  authors' code) drop it; so the two agree on models without `Normalize`, and the test models have none. It does
  not carry MPNet's relative-position bias (batch 2) to the N + 1 interpolated rows, so MPNet models fail in it
  (the authors' XSMPNet has a hook for that); the test covers BERT, the architecture both handle.
- captum's LayerIntegratedGradients: integrated gradients of a scalar g at the hidden states entering layer L
  (the output of layer L - 1), baseline = the reference's hidden states. For
      g(x) = e(x) . v / c,   v = sum_j P_b[:, j],   c = ||e(a)|| ||e(b)||,
  the attribution of token i of a is sum_k Delta[i, k] sum_n w_n dg/dh[i, k] = sum_d P_a[d, i] v_d / c: the row
  sum sum_j A[i, j] of our matrix, to float rounding (same quadrature: captum's `riemann_right` is our riemann,
  its `gausslegendre` our gauss-legendre). With v = e(b) - e(r_b), the value sum_j P_b[:, j] converges to, the row
  sums agree to the factor error of b; column sums are the same with a and b swapped.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from xsbert_core import Explainer

A = "The children are playing football in the park."
B = "Two dogs run across the snowy field."
LAYER = 2  # of 3: the hidden states entering layer 2 = the output of layer 1


def _trainable(tiny, cls, arch: str = "bert", n_layers: int = 3):
    """A tiny model whose parameters require grad (the peers differentiate through autograd), in eval mode."""
    from conftest import MAX_SEQ_LENGTH
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    path = tiny.folder(arch, n_layers)
    first = Transformer(str(path), model_kwargs={"attn_implementation": "eager"}, max_seq_length=MAX_SEQ_LENGTH)
    model = cls(modules=[first, Pooling(first.get_embedding_dimension(), pooling_mode="mean")], device="cpu")
    model.eval()
    return model


def _rel(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.abs(x - y).max() / np.abs(y).max())


# --------------------------------------------------------------------------- retrivex
@pytest.mark.parametrize("layer,steps", [(0, 8), (LAYER, 16)])
def test_retrivex_matrix_equals_ours_riemann(tiny, layer, steps):
    stransformers = pytest.importorskip("retrivex.stransformers", reason="the `peers` extra (make test installs it)")
    # retrivex's alphas come from torch.arange(1, 0, -1/N): exactly N of them for these N (a power of two).
    assert len(torch.arange(1.0, 0.0, -1.0 / steps)) == steps
    peer = _trainable(tiny, stransformers.IntJacobianExplainableTransformer)
    theirs, tokens_a, tokens_b, details = peer.explain(
        A, B, similarity_metric="cosine", return_details=True, show_progress=False, layer_index=layer,
        num_interpolation_steps=steps,
    )
    ours = Explainer(_trainable(tiny, SentenceTransformer), layer=layer, mode="approx", similarity="cos",
                     rule="riemann", steps=steps).explain(A, B)
    theirs = theirs.double().numpy()
    assert theirs.shape == ours.matrix.shape == (len(tokens_a), len(tokens_b))
    assert _rel(theirs, ours.matrix) < 1e-5
    # Its reference terms are ours: f(a, r_b), f(b, r_a), f(r_a, r_b) and the score.
    assert details["query_candidate_similarity"] == pytest.approx(ours.score, abs=1e-6)
    assert details["query_reference_similarity"] == pytest.approx(ours.ref_sim_a, abs=1e-6)
    assert details["candidate_reference_similarity"] == pytest.approx(ours.ref_sim_b, abs=1e-6)
    assert details["references_similarity"] == pytest.approx(ours.ref_term, abs=1e-6)
    # Not a vacuous match: the matrix is not near zero and not rank one in disguise.
    assert np.abs(ours.matrix).max() > 1e-3 and np.linalg.matrix_rank(ours.matrix, tol=1e-6) > 1


def test_retrivex_differs_on_a_normalized_pipeline(tiny):
    """The one convention that differs: retrivex keeps a trailing Normalize in what it differentiates."""
    stransformers = pytest.importorskip("retrivex.stransformers", reason="the `peers` extra (make test installs it)")
    from sentence_transformers.sentence_transformer.modules import Normalize

    peer = _trainable(tiny, stransformers.IntJacobianExplainableTransformer)
    peer.append(Normalize())
    theirs = peer.explain(A, B, similarity_metric="cosine", show_progress=False, layer_index=LAYER,
                          num_interpolation_steps=8)[0].double().numpy()
    ours = Explainer(tiny.build("bert", normalize=True), layer=LAYER, mode="approx", similarity="cos",
                     rule="riemann", steps=8).explain(A, B).matrix
    assert _rel(theirs, ours) > 1e-2


# --------------------------------------------------------------------------- captum
def _captum_token_attributions(model, layer: int, text: str, v: torch.Tensor, c: float, method: str, steps: int):
    """LayerIntegratedGradients of g(x) = e(x) . v / c at the hidden states entering `layer`, summed over H."""
    attr_mod = pytest.importorskip("captum.attr", reason="the `peers` extra (make test installs it)")
    first, pooling = model[0], model[1]
    auto = first.auto_model
    enc = first.tokenizer([text], return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    special = first.tokenizer.get_special_tokens_mask(ids[0].tolist(), already_has_special_tokens=True)
    ref = torch.where(torch.tensor(special, dtype=torch.bool), ids[0], first.tokenizer.pad_token_id).unsqueeze(0)
    extra = {k: enc[k] for k in ("token_type_ids",) if k in enc}

    def g(input_ids, attention_mask):
        t = auto(input_ids=input_ids, attention_mask=attention_mask,
                 **{k: x.expand(input_ids.shape[0], -1) for k, x in extra.items()}).last_hidden_state
        e = pooling({"token_embeddings": t, "attention_mask": attention_mask})["sentence_embedding"]
        return e @ v / c

    target = auto.embeddings if layer == 0 else auto.encoder.layer[layer - 1]
    lig = attr_mod.LayerIntegratedGradients(g, target)
    attributions = lig.attribute(ids, baselines=ref, additional_forward_args=(mask,), n_steps=steps, method=method)
    if isinstance(attributions, tuple):
        attributions = attributions[0]
    return attributions[0].sum(-1).double().numpy()


@pytest.mark.parametrize("rule,method", [("riemann", "riemann_right"), ("gauss-legendre", "gausslegendre")])
def test_captum_layer_ig_gives_our_row_and_column_sums(tiny, rule, method):
    steps = 12
    model = _trainable(tiny, SentenceTransformer)
    ex = Explainer(model, layer=LAYER, mode="approx", similarity="cos", rule=rule, steps=steps)
    fa, fb = ex.factors([A, B])
    res = ex.pair(fa, fb)
    c = float(fa.embedding.double().norm() * fb.embedding.double().norm())
    rows = _captum_token_attributions(model, LAYER, A, fb.factor.sum(1).float(), c, method, steps)
    cols = _captum_token_attributions(model, LAYER, B, fa.factor.sum(1).float(), c, method, steps)
    assert _rel(rows, res.matrix.sum(1)) < 1e-4
    assert _rel(cols, res.matrix.sum(0)) < 1e-4
    # captum's own v = e(b) - e(r_b) (no factor of ours): the row sums agree to b's factor error,
    # |sum_d P_a[d, i] (v_true - v)_d| / c <= ||P_a[:, i]|| * error_b * ||v_true|| / c.
    v_true = (fb.embedding - fb.reference_embedding).float()
    rows_true = _captum_token_attributions(model, LAYER, A, v_true, c, method, steps)
    bound = float(np.linalg.norm(fa.factor.double().numpy(), axis=0).max()) * fb.error * float(v_true.norm()) / c
    assert np.abs(rows_true - res.matrix.sum(1)).max() <= 1.01 * bound + 1e-5 * float(np.abs(rows_true).max())
