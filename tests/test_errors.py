"""Every bad input gets its own error (xsbert_core/errors.py), raised before any heavy work."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from xsbert_core import (
    Explainer,
    InputError,
    NumericalError,
    TruncationError,
    UnsupportedModelError,
    XsbertError,
    nodes_and_weights,
)


@pytest.fixture(scope="module")
def bert(tiny):
    return tiny.get("bert", n_layers=4)


@pytest.fixture(scope="module")
def ex(bert):
    return Explainer(bert, layer=1, steps=2)


# --------------------------------------------------------------------------------- texts
@pytest.mark.parametrize("text", ["", " ", "   \t\n ", "\u3000"])
def test_empty_and_whitespace_texts(ex, text):
    with pytest.raises(InputError, match="[Ee]mpty"):
        ex.factors(["A fine text.", text])
    with pytest.raises(InputError):
        ex.explain(text, "A fine text.")
    with pytest.raises(InputError):
        ex.explain_pairs([("A fine text.", "Another one."), ("A fine text.", text)])


@pytest.mark.parametrize("text", ["\u200b", "\x00\x01", "\u0301"])
@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_text_without_any_token_is_rejected(minilm, text, mode):
    """Zero-width / control characters only: the tokenizer keeps nothing but [CLS] [SEP].

    Such a text cannot be attributed (e(x) = e(r), and in exact mode e(x) = 0 makes cos undefined).
    """
    ex = Explainer(minilm, layer=-1, mode=mode, steps=2)
    with pytest.raises(InputError, match="no tokens"):
        ex.explain(text, "A man plays guitar.")


def test_non_string_text(ex):
    with pytest.raises(InputError, match="strings"):
        ex.factors(["ok", None])  # type: ignore[list-item]
    with pytest.raises(InputError):
        ex.factors(["ok", 3])  # type: ignore[list-item]


# ------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("layer", [4, 5, 100, -5, -100])
def test_layer_out_of_range(bert, layer):
    with pytest.raises(InputError, match="out of range"):
        Explainer(bert, layer=layer)


@pytest.mark.parametrize("layer,resolved", [(0, 0), (3, 3), (-1, 3), (-4, 0)])
def test_layer_in_range_resolves(bert, layer, resolved):
    assert Explainer(bert, layer=layer).layer == resolved


@pytest.mark.parametrize("layer", [1.0, 1.5, "1", True, None])
def test_layer_not_an_integer(bert, layer):
    with pytest.raises(InputError):
        Explainer(bert, layer=layer)


@pytest.mark.parametrize("steps", [0, -1, 2.5, 2.0, "4", True, None])
def test_bad_steps(bert, steps):
    with pytest.raises(InputError, match="steps"):
        Explainer(bert, layer=1, steps=steps)


@pytest.mark.parametrize("tolerance", [0, -1e-3, math.nan, math.inf])
def test_bad_tolerance(bert, tolerance):
    with pytest.raises(InputError, match="tolerance"):
        Explainer(bert, layer=1, tolerance=tolerance)


def test_max_steps_below_steps(bert):
    with pytest.raises(InputError, match="max_steps"):
        Explainer(bert, layer=1, steps=8, tolerance=1e-3, max_steps=4)


def test_bad_internal_batch_size(bert):
    with pytest.raises(InputError, match="internal_batch_size"):
        Explainer(bert, layer=1, internal_batch_size=0)


@pytest.mark.parametrize("kwargs,word", [
    ({"rule": "simpson"}, "rule"),
    ({"rule": ""}, "rule"),
    ({"similarity": "euclidean"}, "similarity"),
    ({"mode": "tuned"}, "mode"),
    ({"mode": "Exact "}, "mode"),
])
def test_unknown_rule_similarity_mode(bert, kwargs, word):
    with pytest.raises(InputError, match=word):
        Explainer(bert, layer=1, **kwargs)


def test_known_aliases_are_accepted(bert):
    ex = Explainer(bert, layer=1, rule="GL", similarity="cosine")
    assert ex.rule == "gauss-legendre" and ex.similarity == "cos"
    assert Explainer(bert, layer=1, rule="riemann_right", similarity="dot_product").rule == "riemann"


def test_unknown_truncation_policy(bert):
    with pytest.raises(InputError, match="truncation"):
        Explainer(bert, layer=1, truncation="drop")  # type: ignore[arg-type]  # at construction, not first use


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_bad_factor_batch_size(bert, batch_size):
    with pytest.raises(InputError, match="batch_size"):
        Explainer(bert, layer=1).factors(["A text."], batch_size=batch_size)


def test_quadrature_rejects_bad_n():
    for n in (0, -3, 1.5, True):
        with pytest.raises(ValueError):
            nodes_and_weights("riemann", n)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        nodes_and_weights("trapezoid", 4)


def test_errors_are_xsbert_errors():
    assert issubclass(TruncationError, InputError)
    for cls in (InputError, UnsupportedModelError, NumericalError):
        assert issubclass(cls, XsbertError)
    assert issubclass(InputError, ValueError)  # callers catching ValueError still catch it


# -------------------------------------------------------------------------- architecture
def test_first_module_not_a_transformer():
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    model = SentenceTransformer(modules=[Dense(8, 4)], device="cpu")
    with pytest.raises(UnsupportedModelError, match="not a Hugging Face Transformer"):
        Explainer(model, layer=0)


def test_hf_model_without_encoder_layers(tiny, tmp_path):
    """A decoder (GPT-2: layers under `h`) has no encoder layer list to split."""
    import transformers as tf
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tok = tiny.tokenizer("roberta")
    config = tf.GPT2Config(
        vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    tf.GPT2Model(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = SentenceTransformer(
        modules=[Transformer(str(tmp_path), model_kwargs={"attn_implementation": "eager"}), Pooling(32)], device="cpu"
    )
    assert type(model[0].auto_model).__name__ == "GPT2Model"
    with pytest.raises(UnsupportedModelError, match="encoder layer"):
        Explainer(model, layer=0)


def test_sdpa_attention_warns(tiny):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    path = tiny.folder("bert", 3, 0)
    model = SentenceTransformer(
        modules=[Transformer(str(path), model_kwargs={"attn_implementation": "sdpa"}), Pooling(32)], device="cpu"
    )
    with pytest.warns(UserWarning, match="eager"):
        Explainer(model, layer=0)


# ------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("where,value", [("above", math.nan), ("below", math.nan), ("above", math.inf)])
def test_nan_or_inf_in_the_model_raises_numerical_error(tiny, where, value):
    model = tiny.build("bert", n_layers=3)  # private copy: poisoned below
    layer = model[0].auto_model.encoder.layer[2 if where == "above" else 0]
    with torch.no_grad():
        layer.output.dense.weight[0, 0] = value
    ex = Explainer(model, layer=1, steps=2)
    with pytest.raises(NumericalError):
        ex.factors(["A man plays guitar."])
    with pytest.raises(NumericalError):
        ex.explain("A man plays guitar.", "Someone plays music.")


# ----------------------------------------------------------------------------- truncation
LONG = " ".join(["guitar music"] * 40)  # 80 words: > 48 tokens of the tiny models


def test_long_text_is_truncated_with_a_warning(tiny, caplog):
    model = tiny.get("bert")
    ex = Explainer(model, layer=1, steps=2)
    assert ex.split.max_seq_length == 48
    with caplog.at_level(logging.WARNING, logger="xsbert_core"):
        res = ex.explain(LONG, "Short text.")
    assert any("Truncating" in r.getMessage() and r.name.startswith("xsbert_core") for r in caplog.records)
    assert res.truncated_a is True and res.truncated_b is False
    assert len(res.tokens_a) == 48 and res.tokens_a[0] == "[CLS]" and res.tokens_a[-1] == "[SEP]"
    assert res.matrix.shape == (48, len(res.tokens_b))
    assert res.to_dict()["truncated_a"] is True


def test_text_of_exactly_max_length_is_not_truncated(tiny):
    model = tiny.get("bert")
    tok = model[0].tokenizer
    text = " ".join(["guitar"] * 46)  # 46 words + [CLS] + [SEP] = 48 tokens
    assert len(tok(text)["input_ids"]) == 48
    sf = Explainer(model, layer=1, steps=1, truncation="error").factors([text])[0]
    assert sf.truncated is False and len(sf.tokens) == 48


def test_truncation_error_policy(tiny):
    ex = Explainer(tiny.get("bert"), layer=1, steps=2, truncation="error")
    with pytest.raises(TruncationError, match="max_seq_length"):
        ex.explain(LONG, "Short text.")
    with pytest.raises(InputError):  # TruncationError is an InputError
        ex.factors(["Short text.", LONG])
