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


@pytest.mark.parametrize("text", ["caf\udcff", "\ud83d alone"])
def test_a_lone_surrogate_is_rejected_before_the_tokenizer(ex, text):
    """Bytes that were not UTF-8 (surrogateescape) or half of a UTF-16 pair: a clear InputError, not the tokenizer's
    TypeError."""
    with pytest.raises(InputError, match="not UTF-8 text|lone surrogate"):
        ex.explain(text, "A fine text.")


@pytest.mark.parametrize("text", ["\u200b", "\x00\x01", "\u0301"])
@pytest.mark.parametrize("mode", ["approx", "exact"])
def test_text_without_any_token_is_rejected(minilm, text, mode):
    """Zero-width / control characters only: the tokenizer keeps nothing but [CLS] [SEP].

    Such a text cannot be attributed (e(x) = e(r), and in exact mode e(x) = 0 makes cos undefined).
    """
    ex = Explainer(minilm, layer=-1, mode=mode, steps=2)
    with pytest.raises(InputError, match="no tokens"):
        ex.explain(text, "A man plays guitar.")


# Texts of special-token strings only: the model's own tokenization makes them [CLS] [CLS] [SEP] [SEP] (no content).
ONLY_SPECIALS = {
    "bert": ["[CLS] [SEP]", "[CLS][SEP]", " [SEP] ", "[PAD] [MASK]", "[CLS]\t[SEP]\n[SEP]"],
    "roberta": ["<s></s>", "<s> </s>", "</s>", "<pad><mask>", " <s>\t</s> "],  # BPE's lone Ġ / ĉ: whitespace
}
# Content the model's tokenizer keeps: a special-token string inside other text is that special token, a
# string of the other vocabulary's specials is text, and the unknown token stands for real characters.
WITH_CONTENT = {
    "bert": ["Hello [SEP] world", "[CLS] guitar [SEP]", "<s></s>", "[UNK]", "[SEP] é [SEP]"],
    "roberta": ["The dog <mask> runs </s>", "<s>guitar</s>", "[CLS] [SEP]", "<unk>"],
}


@pytest.mark.parametrize("arch,text", [(a, t) for a, ts in ONLY_SPECIALS.items() for t in ts])
def test_text_of_special_token_strings_only_is_rejected_before_any_computation(tiny, arch, text):
    """`[CLS] [SEP]` (BERT) or `<s></s>` (RoBERTa): tokens all special, nothing to attribute: one InputError that
    names the text, raised by the tokenization, before any forward pass."""
    ex = Explainer(tiny.get(arch), layer=1, steps=2)
    assert ex.split.content_counts([text, "A fine text."]) == [0, ex.split.content_counts(["A fine text."])[0]]

    def no_computation(module, args):  # a forward pre-hook on the token embeddings: any forward pass stops here
        raise AssertionError("computed before rejecting the text")

    hook = ex.split.auto_model.get_input_embeddings().register_forward_pre_hook(no_computation)
    try:
        with pytest.raises(AssertionError, match="computed before"):
            ex.explain("A fine text.", "Another one.")  # the hook sees a forward pass
        for call in (
            lambda: ex.explain(text, "A fine text."),
            lambda: ex.explain("A fine text.", text),
            lambda: ex.factors(["A fine text.", text]),
            lambda: ex.explain_pairs([("A fine text.", "Another one."), (text, "A fine text.")]),
        ):
            with pytest.raises(InputError, match="no tokens but special ones") as info:
                call()
            message = str(info.value)
            assert "\n" not in message and repr(text) in message
    finally:
        hook.remove()


@pytest.mark.parametrize("arch,text", [(a, t) for a, ts in WITH_CONTENT.items() for t in ts])
def test_special_token_strings_inside_content_are_tokenized_as_the_model_does(tiny, arch, text):
    """Not rejected; tokens and embedding are `SentenceTransformer.encode`'s (a literal [SEP] is the [SEP] token)."""
    model = tiny.get(arch)
    ex = Explainer(model, layer=1, steps=2)
    assert ex.split.content_counts([text])[0] > 0
    sf = ex.factors([text])[0]
    tok = model[0].tokenizer
    assert sf.tokens == tok.convert_ids_to_tokens(tok(text)["input_ids"])
    assert torch.allclose(sf.embedding, model.encode(text, convert_to_tensor=True).cpu(), atol=1e-5)
    res = ex.explain(text, "A fine text.")
    assert res.matrix.shape == (len(sf.tokens), len(res.tokens_b)) and math.isfinite(res.attribution_sum)


def test_embedded_special_token_string_is_the_special_token():
    """What the docs say: `Hello [SEP] world` has the [SEP] token inside (not `[`, `sep`, `]`)."""
    from transformers import AutoTokenizer

    from xsbert_core import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("sentence-transformers/all-MiniLM-L6-v2"))
    assert tok.tokenize("Hello [SEP] world") == ["hello", "[SEP]", "world"]


def test_cli_exits_2_on_a_text_of_special_tokens_only(capsys, tmp_path):
    from xsbert_core.cli import main

    out = tmp_path / "never.json"
    code = main(["explain", "[CLS] [SEP]", "Some text.", "--steps", "1", "--json", str(out)])
    err = capsys.readouterr().err
    messages = [line for line in err.splitlines() if line.startswith("xsbert explain: error:")]
    assert code == 2 and len(messages) == 1 and "'[CLS] [SEP]' has no tokens but special ones" in messages[0]
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_job_quarantines_texts_without_content_as_the_engine_rejects_them(tiny, arch):
    """validate (jobs/attribution/validate.py) with the engine's content counts: no_content_a/_b for the texts the
    engine rejects, in the reasons' order (empty text first, too long after), every row in exactly one of good and
    quarantine."""
    import numpy as np
    import pandas as pd

    from jobs.attribution.inputs import REASONS
    from jobs.attribution.validate import validate
    from jobs.store import pair_keys

    ex = Explainer(tiny.get(arch), layer=1, steps=2)
    tok = ex.split.tokenizer
    none_a, none_b = ONLY_SPECIALS[arch][0], ONLY_SPECIALS[arch][1]
    many_specials = " ".join([ONLY_SPECIALS[arch][2].strip()] * 60)  # > max_seq_length 48, still no content
    rows = [  # pair_id, text_a, text_b, expected reason
        ("g1", "A man plays the guitar.", "Someone plays music.", None),
        ("g2", WITH_CONTENT[arch][0], "A fine text.", None),  # an embedded special token: content
        ("g3", WITH_CONTENT[arch][2], WITH_CONTENT[arch][3], None),  # the other vocabulary's specials; unknown
        ("n1", none_a, "A fine text.", "no_content_a"),
        ("n2", "A fine text.", none_b, "no_content_b"),
        ("n3", none_a, none_b, "no_content_a"),  # the first text that has none, as for the other reasons
        ("n4", many_specials, "A fine text.", "no_content_a"),  # before too_long_a
        ("e1", "  ", none_b, "empty_text_a"),
        ("t1", " ".join(["guitar"] * 60), "A fine text.", "too_long_a"),
    ]
    frame = pd.DataFrame({
        "row": pd.Series(range(len(rows)), dtype="int64"),
        "pair_id": pd.Series([r[0] for r in rows], dtype=object),
        "text_a": pd.Series([r[1] for r in rows], dtype=object),
        "text_b": pd.Series([r[2] for r in rows], dtype=object),
        "label_raw": pd.Series([None] * len(rows), dtype=object),
        "malformed": pd.Series([False] * len(rows), dtype=bool),
    })  # fmt: skip
    def two_passes(texts):  # the counts from the tokenizer and the engine's content counts, apart
        return [len(x) for x in tok(texts, truncation=False)["input_ids"]], ex.split.content_counts(texts)

    good, quarantine = validate(frame, "none", None, count=two_passes, max_tokens=ex.split.max_seq_length,
                                quarantine_long=True)  # fmt: skip
    assert len(frame) == len(good) + len(quarantine)  # counts in = out + quarantined
    assert good.pair_id.tolist() == [r[0] for r in rows if r[3] is None]
    assert dict(zip(quarantine.pair_id, quarantine.reason)) == {r[0]: r[3] for r in rows if r[3]}
    assert REASONS.index("bad_label") < REASONS.index("no_content_a") < REASONS.index("too_long_a")
    detail = quarantine.set_index("pair_id").detail
    assert "special" in detail["n1"] and "max_seq_length" in detail["t1"]
    # The engine agrees row by row: the good rows are attributed, every no-content text raises.
    ex.explain_pairs(list(zip(good.text_a, good.text_b)))
    for text in (none_a, none_b, many_specials):
        with pytest.raises(InputError, match="no tokens but special ones"):
            ex.factors([text])
    # The job's way: one tokenizer pass for both counts (SplitModel.token_counts), the same frames.
    good_both, quarantine_both = validate(frame, "none", None, count=ex.split.token_counts,
                                          max_tokens=ex.split.max_seq_length, quarantine_long=True)  # fmt: skip
    pd.testing.assert_frame_equal(good_both, good)
    pd.testing.assert_frame_equal(quarantine_both, quarantine)
    # Without a tokenizer (jobs.train, jobs.evaluate), such a row is not quarantined.
    good_without, _ = validate(frame.iloc[:4], "none", None)
    assert good_without.pair_id.tolist() == ["g1", "g2", "g3", "n1"]
    # A rerun: pairs already in the store are not tokenised again (their rows stay good, n_tokens 0); every other
    # row is checked as before, and the checks without a tokenizer still see the stored ones.
    seen: list[str] = []

    def counting(count):
        def wrapped(texts):
            seen.extend(texts)
            return count(texts)

        return wrapped

    stored = {"g1", "g2"}  # given to validate as the job does: their 64-bit keys (RunStore.done_pair_keys)
    dup = pd.concat([frame, frame.iloc[[0]].assign(row=len(frame))], ignore_index=True)  # g1 again: a duplicate id
    good_re, quarantine_re = validate(dup, "none", None, count=counting(two_passes), max_tokens=ex.split.max_seq_length,
                                      quarantine_long=True, stored=np.unique(pair_keys(sorted(stored))))  # fmt: skip
    assert good_re.pair_id.tolist() == good.pair_id.tolist() and len(dup) == len(good_re) + len(quarantine_re)
    assert dict(zip(quarantine_re.pair_id, quarantine_re.reason)) == {
        **{r[0]: r[3] for r in rows if r[3]}, "g1": "duplicate_pair_id"}  # fmt: skip
    only_stored = {t for r in rows if r[0] in stored for t in r[1:3]} - {t for r in rows if r[0] not in stored
                                                                          for t in r[1:3]}  # fmt: skip
    assert only_stored and not only_stored & set(seen) and WITH_CONTENT[arch][2] in seen
    by_id = good_re.set_index("pair_id")
    assert by_id.n_tokens_a["g1"] == 0 and by_id.n_tokens_a["g3"] == good.set_index("pair_id").n_tokens_a["g3"] > 0


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


def test_hf_model_of_an_unsupported_family(tiny, tmp_path):
    """GPT-2 (layers under `h`) is no supported family: the error names it and the supported ones."""
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
    with pytest.raises(UnsupportedModelError, match="model_type 'gpt2'.*not a supported architecture.*BERT"):
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


def test_truncation_error_policy(tiny, capfd, caplog):
    ex = Explainer(tiny.get("bert"), layer=1, steps=2, truncation="error")
    tok = ex.split.tokenizer
    tok.model_max_length = 48  # as sentence-transformers sets it: its max_seq_length
    tok.deprecation_warnings.clear()  # transformers warns once per tokenizer: this session's shared model may have
    with pytest.raises(TruncationError, match="max_seq_length"):
        ex.explain(LONG, "Short text.")
    with pytest.raises(InputError):  # TruncationError is an InputError
        ex.factors(["Short text.", LONG])
    # the lengths are measured untruncated on purpose: no tokenizer warning beside the one error
    assert "Token indices sequence length" not in capfd.readouterr().err
    assert not [r for r in caplog.records if "Token indices sequence length" in r.getMessage()]


def test_undecodable_is_the_per_character_definition():
    """validate.undecodable (strict UTF-8 encoding) against its definition: U+FFFD, NUL, or any character of
    Unicode category Cs (a surrogate), on every surrogate and on the code points around them."""
    import unicodedata

    from jobs.attribution.validate import undecodable

    def slow(text: str) -> bool:
        return "\ufffd" in text or "\x00" in text or any(unicodedata.category(ch) == "Cs" for ch in text)

    points = [*range(0, 0x300), *range(0xD000, 0xE100), 0xFFFD, 0xFFFE, 0x10000, 0x1F600, 0x10FFFF]
    texts = [f"a{chr(p)}b" for p in points] + ["", "plain", "Caf\udce9 au lait.", "\ud83d\ude00", "x\x00"]
    assert [undecodable(t) for t in texts] == [slow(t) for t in texts]
    assert sum(map(undecodable, texts)) == 0x800 + 2 + 3  # each surrogate, NUL and U+FFFD, three of the examples


# --------------------------------------------------------------------------------- a huge field
_PREPARE = """
import json, resource, sys, time
from jobs.attribute import settings
from jobs.attribution.prepare import prepare
t0 = time.perf_counter()
prep = prepare(settings(sys.argv[1:]))
q = prep.quarantine
print(json.dumps({"seconds": time.perf_counter() - t0, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "good": prep.work.num_rows, "quarantine": dict(zip(q.pair_id, q.reason)),
                  "detail": dict(zip(q.pair_id, q.detail)), "text": {p: len(t) for p, t in zip(q.pair_id, q.text_a)}}))
"""


def _prepare_in_a_child(tmp_path, rows: list[str], *flags: str) -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path

    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "pairs.tsv"
    data.write_text("id\tsentence1\tsentence2\tscore\n" + "".join(rows), encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", _PREPARE, "--dataset", str(data), "--layer", "-1", "--steps", "2",
                           "--out", str(tmp_path / "runs"), *flags], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_50_mb_field_is_quarantined_before_the_tokenizer_sees_it(tmp_path):
    """One text of 50 MB (10M words): too_long_a at once, never tokenized (before: minutes of CPU and 3.1 GB in the
    tokenizer). The job's peak memory stays within 600 MB of the same selection without it; the row's stored text is
    cut as every quarantined text is; --max-chars moves the cap."""
    fine = ["ok1\tA man plays the guitar.\tSomeone plays music.\t4.0\n", "ok2\tA dog runs.\tA cat sleeps.\t1.0\n"]
    huge = "big\t" + "word " * 10_000_000 + "\tShort.\t2.0\n"
    base = _prepare_in_a_child(tmp_path / "base", fine)
    got = _prepare_in_a_child(tmp_path / "huge", [fine[0], huge, fine[1]])
    assert got["good"] == base["good"] == 2 and got["quarantine"] == {"big": "too_long_a"}, got["quarantine"]
    assert "50,000,000 characters > --max-chars 100,000 (not tokenized)" in got["detail"]["big"], got["detail"]
    assert got["text"]["big"] <= 2000
    assert got["seconds"] < 60 and got["rss_mb"] < base["rss_mb"] + 600, (got["seconds"], got["rss_mb"], base["rss_mb"])
    # the cap is --max-chars: a small one quarantines a short text too, on either side, before anything else reads it
    import pandas as pd

    from jobs.attribution.validate import validate

    frame = pd.DataFrame({"row": pd.Series([0, 1, 2], dtype="int64"), "pair_id": ["a", "b", "c"],
                          "text_a": ["x" * 21, "fine", "fine"], "text_b": ["y", "z" * 21, "ok"],
                          "label_raw": [None] * 3, "malformed": [False] * 3})  # fmt: skip

    def no_tokenizer(texts):
        assert all(len(t) <= 20 for t in texts), texts
        return [3] * len(texts), [1] * len(texts)

    good, quarantine = validate(frame, "none", None, count=no_tokenizer, max_tokens=48, quarantine_long=True,
                                max_chars=20)  # fmt: skip
    assert good.pair_id.tolist() == ["c"] and dict(zip(quarantine.pair_id, quarantine.reason)) == {
        "a": "too_long_a", "b": "too_long_b"}  # fmt: skip
