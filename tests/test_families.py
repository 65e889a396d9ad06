"""Every supported family, on a tiny random model built from its transformers config (tests/conftest.py):

    completeness   sum A converges to its target as N grows (gauss-legendre N = 2, 8, 32)
    independent    the engine's factors, e(x), e(r) and pair numbers equal tests/independent.py's (reverse mode,
                   the model's own forward with layer L's input replaced, own pooling) to 1e-5, approx and exact
    poolings       every sentence-transformers pooling mode, against the independent pooling
    prompts        attributed like any token, or excluded (zero columns dropped); a Pooling that leaves the prompt
                   out (include_prompt=False) pools as model.encode(prompt=...) does
    errors         an unsupported family names the supported ones; exact mode with a Dense bias says why, and so does
                   training an exact decoder; a fused attention kernel falls back to eager, saying so; a split that
                   does not reproduce the model errs
    the job        `python -m jobs.attribute --executor local` on three pairs, per family; one family through Ray;
                   `xsbert explain` per family

The families: BERT, MPNet, RoBERTa, DistilBERT, XLM-R (the paper's and BGE/E5's backbones), DeBERTa-v2 (with v2's
convolution), ELECTRA (with a narrower embedding and its projection), ModernBERT (alternating local/global
attention with a 4-token window, rotary), GTE, Nomic BERT (rotary, gated MLPs) and Qwen3 (a decoder: causal,
grouped-query, alternating full/sliding layers, last-token pooling, <|endoftext|> appended and used as pad).
"""

from __future__ import annotations

import json
from pathlib import Path

import independent as ind
import numpy as np
import pytest
import torch
from conftest import ARCHS
from jobtools import q, stsb_rows, write_tsv

from xsbert_core import Explainer, InputError, UnsupportedModelError

A = "The guitarist plays unbelievably well."
B = "A man is playing a guitar on stage, and the children are playing football in the park."
STEPS = 3
TOL = 1e-5
LAYERS = 4
# The pooling each family's embedders use: decoders pool the last token, the encoders mean-pool (or CLS).
POOLING = {"qwen3": "lasttoken", "modernbert": "cls"}


def pooling(arch: str) -> str:
    return POOLING.get(arch, "mean")


def rel(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    scale = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / scale) if scale > 0 else float(np.linalg.norm(got))


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def check_against_independent(model, ex: Explainer, fs, layer: int, mode: str, rule: str, **prompt) -> None:
    """ex's factors of (A, B) against tests/independent.py's, and the pair's numbers."""
    refs = [ind.sentence(model, t, layer, mode, rule, STEPS, **prompt) for t in (A, B)]
    for f, r in zip(fs, refs):
        assert f.factor.shape == r.factor.shape
        assert rel(as_np(f.factor), r.factor) <= TOL
        assert rel(as_np(f.embedding), r.e_x) <= TOL
        if mode == "exact":
            assert not torch.any(f.reference_embedding) and not np.any(r.e_r)
        else:
            assert rel(as_np(f.reference_embedding), r.e_r) <= TOL
    got = ex.pair(*fs)
    want = ind.pair(*refs, "cos")
    assert rel(got.matrix, want["matrix"]) <= TOL
    for name in ("score", "ref_sim_a", "ref_sim_b", "ref_term", "target", "error"):
        assert abs(getattr(got, name) - want[name]) <= TOL, name


# --------------------------------------------------------------------------------------------- per family
@pytest.mark.parametrize("arch", ARCHS)
def test_completeness_converges(tiny, arch):
    """sum A -> target: the completeness error shrinks as N grows, to quadrature noise; per sentence too."""
    model = tiny.get(arch, pooling(arch), n_layers=LAYERS)
    errors = []
    for n in (2, 8, 32):
        ex = Explainer(model, layer=2, steps=n)
        res = ex.explain(A, B)
        errors.append((abs(res.error), max(res.factor_error_a, res.factor_error_b)))
        assert res.settings["family"] == model[0].auto_model.config.model_type
    (e2, f2), (e8, f8), (e32, f32) = errors
    assert e32 < e2 and f8 < f2 and f32 <= max(f8, 1e-6)  # down to float32 noise (~1e-7)
    assert e32 <= 1e-5 and f32 <= 1e-4


@pytest.mark.parametrize("mode,layer", [("approx", 1), ("exact", -1)])
@pytest.mark.parametrize("arch", ARCHS)
def test_engine_equals_the_independent_reference(tiny, arch, mode, layer):
    """The shorter text is padded inside the engine's batch; the independent reference runs each alone."""
    model = tiny.get(arch, pooling(arch), n_layers=LAYERS)
    ex = Explainer(model, layer=layer, mode=mode, rule="gauss-legendre", steps=STEPS)
    fs = ex.factors([A, B])
    assert len(fs[0].tokens) != len(fs[1].tokens)  # the shorter was padded in the batch
    check_against_independent(model, ex, fs, layer, mode, "gauss-legendre")


@pytest.mark.parametrize("arch", ARCHS)
def test_the_path_starts_at_the_models_own_reference_at_layer_0(tiny, arch):
    """At layer 0 the path's start, tail(h(r)) with the text's own features, is the model's own embedding of the
    reference ids: nothing outside the layer loop reads the text's ids (DeBERTa-v2's convolution after layer 0 reads
    the encoder's input, which must be the one replaced); in exact mode sum A -> f(a, b)."""
    model = tiny.get(arch, pooling(arch), n_layers=LAYERS)
    ex = Explainer(model, layer=0, steps=STEPS)
    batch = ex.split.tokenize([A, B])
    with torch.no_grad():  # the model's own forward on the reference ids (no Normalize: its embedding is e)
        own = model(dict(batch.reference_features()))["sentence_embedding"]
    for k, f in enumerate(ex.factors([A, B])):
        assert rel(as_np(f.reference_embedding), as_np(own[k])) <= TOL
    if arch == "deberta-v2":
        assert model[0].auto_model.encoder.conv is not None  # the layout this test is about
        res = Explainer(model, layer=0, mode="exact", rule="gauss-legendre", steps=64).explain(A, B)
        assert abs(res.attribution_sum - res.score) <= 1e-4 and res.target == pytest.approx(res.score, abs=1e-6)


@pytest.mark.parametrize(
    "arch,mode",
    [("qwen3", "weightedmean"), ("qwen3", "mean"), ("bert", "lasttoken"), ("modernbert", "max"),
     ("gte", "weightedmean"), ("nomic_bert", "cls"), ("electra", "mean_sqrt_len_tokens"), ("deberta-v2", "max"),
     ("xlmr", "lasttoken"), ("distilbert", "weightedmean")],
)  # fmt: skip
def test_every_pooling_mode(tiny, arch, mode):
    model = tiny.get(arch, mode, n_layers=LAYERS)
    assert model[1].pooling_mode == mode
    ex = Explainer(model, layer=2, rule="riemann", steps=STEPS)
    fs = ex.factors([A, B])
    own = model.encode([A], convert_to_tensor=True)[0]  # no Normalize: the pipeline's embedding is e(x)
    assert rel(as_np(fs[0].embedding), as_np(own)) <= TOL
    check_against_independent(model, ex, fs, 2, "approx", "riemann")


def test_decoder_reference_is_pad_then_the_appended_eos(tiny):
    """Qwen3's tokenizer adds no BOS and appends <|endoftext|> (also its pad token): r = PAD ... PAD <|endoftext|>,
    and at layer 0 the pooled last token has Delta = 0, so all of the attribution reaches the text's tokens."""
    model = tiny.get("qwen3", "lasttoken", n_layers=LAYERS)
    ex = Explainer(model, layer=0, steps=24)
    batch = ex.split.tokenize([A])
    ids, ref = batch.features["input_ids"][0].tolist(), batch.reference_ids[0].tolist()
    eos = model[0].tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert ids[-1] == eos and ids[0] != eos and ref == [eos] * len(ids)
    f = ex.factors([A])[0]
    assert f.tokens[-1] == "<|endoftext|>" and not torch.any(f.factor[:, -1])
    assert f.error < 1e-4


def test_left_padding_tokenizer_gives_the_models_own_embeddings(tiny):
    """The decoder's tokenizer pads on the left; the engine pads on the right: the same e(x) as encode()."""
    model = tiny.get("qwen3", "lasttoken", n_layers=LAYERS)
    assert model[0].tokenizer.padding_side == "left"
    fs = Explainer(model, layer=1, steps=2).factors([A, B])
    own = model.encode([A, B], convert_to_tensor=True)  # one left-padded batch
    for f, e in zip(fs, own):
        assert rel(as_np(f.embedding), as_np(e)) <= 1e-5


def test_the_split_forwards_keep_no_key_value_cache(tiny):
    """A decoder's forward that enters or stops at layer L makes no key/value cache: one made from the config has a
    slot per layer of the sliced list while the layers keep their own indices (transformers 5.17 indexed past its
    end), and under jvp it would hold every call's keys and values with their tangents. The config is restored."""
    from xsbert_core.families import FAMILIES, entered_at, input_of

    model = tiny.get("qwen3", "lasttoken", n_layers=LAYERS)
    ex = Explainer(model, layer=2, steps=2)
    auto, family = model[0].auto_model, FAMILIES["qwen3"]
    feats = ex.split.tokenize([A, B]).features
    configured, auto.config.use_cache = auto.config.use_cache, True  # as sentence-transformers 6.0 leaves it
    seen: list[tuple[int, object]] = []  # (layer, the cache it was handed), each layer call
    hooks = [block.register_forward_pre_hook(  # the keyword is `past_key_values` up to transformers 5.17, `cache` later
        lambda m, a, kw, i=i: seen.append((i, kw.get("cache", kw.get("past_key_values")))), with_kwargs=True)
        for i, block in enumerate(auto.layers)]  # fmt: skip
    try:
        with torch.no_grad():
            h = input_of(auto, family, 2, feats)
            stopped, seen[:] = list(seen), []
            with entered_at(auto, family, 2, h):
                auto(**feats)
            entered, seen[:] = list(seen), []
            auto(**feats)  # the model's own forward, outside: a cache as configured
    finally:
        auto.config.use_cache = configured
        for hook in hooks:
            hook.remove()
    assert stopped == [(0, None), (1, None), (2, None)] and entered == [(2, None), (3, None)]
    assert [i for i, _ in seen] == [0, 1, 2, 3] and all(c is not None for _, c in seen)


# --------------------------------------------------------------------------------------------- prompts
PROMPTS = {"query": "search_query: ", "document": "search_document: "}


@pytest.mark.parametrize("arch", ["nomic_bert", "qwen3"])
def test_prompt_is_attributed_like_any_token(tiny, arch):
    model = tiny.build(arch, pooling(arch), n_layers=LAYERS, prompts=PROMPTS)
    ex = Explainer(model, layer=1, rule="gauss-legendre", steps=STEPS, prompt_name="query")
    fs = ex.factors([A, B])
    assert fs[0].text == PROMPTS["query"] + A and fs[0].prompt == PROMPTS["query"]
    n_prompt = sum(1 for i, (s, e) in enumerate(fs[0].offsets) if fs[0].word_ids[i] is not None
                   and e <= len(PROMPTS["query"]))  # fmt: skip
    assert n_prompt >= 3 and float(fs[0].factor[:, :n_prompt + 1].abs().sum()) > 0
    assert [w.text for w in fs[0].words][:3] == ["search", "_", "query"]
    own = model.encode([A], prompt_name="query", convert_to_tensor=True)[0]
    assert rel(as_np(fs[0].embedding), as_np(own)) <= TOL
    check_against_independent(model, ex, fs, 1, "approx", "gauss-legendre", prompt=PROMPTS["query"])


@pytest.mark.parametrize("arch", ["nomic_bert", "qwen3"])
def test_excluded_prompt_gets_no_attribution(tiny, arch):
    model = tiny.build(arch, pooling(arch), n_layers=LAYERS, prompts=PROMPTS)
    ex = Explainer(model, layer=1, rule="gauss-legendre", steps=STEPS, prompt_name="query", exclude_prompt=True)
    fs = ex.factors([A, B])
    plain = Explainer(model, layer=1, steps=STEPS, prompt="").factors([A])[0]
    assert fs[0].text == A and fs[0].prompt_excluded and fs[0].tokens == plain.tokens  # the prompt's tokens dropped
    assert [w.text for w in fs[0].words] == [w.text for w in plain.words] and fs[0].word_ids == plain.word_ids
    check_against_independent(model, ex, fs, 1, "approx", "gauss-legendre", prompt=PROMPTS["query"],
                              exclude_prompt=True)  # fmt: skip
    res = Explainer(model, layer=1, steps=24, prompt_name="query", exclude_prompt=True).explain(A, B)
    assert abs(res.error) <= 1e-5  # completeness from the path that holds the prompt
    with pytest.raises(InputError, match="exact mode"):
        Explainer(model, layer=1, mode="exact", prompt_name="query", exclude_prompt=True)


def test_decoder_excluded_prompt_is_the_reference_that_keeps_it(tiny):
    """Causal attention: the prompt's hidden states do not see the text, so holding them at h(x) is exactly the
    reference that keeps the prompt's tokens."""
    model = tiny.build("qwen3", "lasttoken", n_layers=LAYERS, prompts=PROMPTS)
    ex = Explainer(model, layer=2, steps=2, prompt_name="query", exclude_prompt=True)
    batch = ex.split.tokenize([A], prompt=PROMPTS["query"], exclude_prompt=True)
    h_x, _ = ex.split.hidden(batch.features)
    h_r, _ = ex.split.hidden(batch.reference_features())
    m = batch.prompt_mask[0]
    assert int(m.sum()) >= 3 and torch.allclose(h_r[0, m], h_x[0, m], atol=1e-6)


def test_pooling_that_leaves_the_prompt_out(tiny):
    """include_prompt=False (INSTRUCTOR-style): e(x) as model.encode(prompt=...) pools it, against the independent."""
    model = tiny.build("modernbert", "mean", n_layers=LAYERS, include_prompt=False, prompts=PROMPTS)
    ex = Explainer(model, layer=2, rule="gauss-legendre", steps=STEPS, prompt_name="document")
    fs = ex.factors([A, B])
    own = model.encode([A], prompt_name="document", convert_to_tensor=True)[0]
    with_prompt = Explainer(tiny.get("modernbert", "mean", n_layers=LAYERS), layer=2, steps=1,
                            prompt=PROMPTS["document"]).factors([A])[0]  # fmt: skip
    assert rel(as_np(fs[0].embedding), as_np(own)) <= TOL
    assert rel(as_np(fs[0].embedding), as_np(with_prompt.embedding)) > 1e-3  # the prompt really was left out
    check_against_independent(model, ex, fs, 2, "approx", "gauss-legendre", prompt=PROMPTS["document"])


def test_default_prompt_and_per_side_prompts(tiny):
    model = tiny.build("gte", "mean", n_layers=LAYERS, prompts=PROMPTS)
    model.default_prompt_name = "query"
    assert Explainer(model, layer=1, steps=1).prompt == PROMPTS["query"]
    assert Explainer(model, layer=1, steps=1, prompt="").prompt == ""
    ex = Explainer(model, layer=1, steps=2, prompt="")
    res = ex.explain(A, B, prompt_a=PROMPTS["query"], prompt_b=PROMPTS["document"])
    assert res.tokens_a[1:4] == ["search", "_", "query"] and res.tokens_b[1:4] == ["search", "_", "document"]
    with pytest.raises(InputError, match="no prompt named 'passage'.*'query', 'document'"):
        Explainer(model, layer=1, prompt_name="passage")


# --------------------------------------------------------------------------------------------- errors
def test_unsupported_family_names_the_supported_ones(tiny, tmp_path):
    import transformers as tf
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tok = tiny.tokenizer("qwen3")
    config = tf.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    tf.GPT2Model(config).save_pretrained(tmp_path / "gpt2")
    tok.save_pretrained(tmp_path / "gpt2")
    first = Transformer(str(tmp_path / "gpt2"), model_kwargs={"attn_implementation": "eager"})
    model = SentenceTransformer(modules=[first, Pooling(32, pooling_mode="lasttoken")], device="cpu")
    with pytest.raises(UnsupportedModelError) as info:
        Explainer(model, layer=1)
    msg = str(info.value)
    assert "GPT2Model" in msg and "'gpt2'" in msg
    for name in ("ModernBERT", "GTE", "Nomic", "Qwen3", "DeBERTa", "ELECTRA", "MPNet", "DistilBERT"):
        assert name in msg


def test_exact_mode_with_a_dense_bias_says_why(tiny):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    base = tiny.build("gte", "mean", n_layers=2)
    model = SentenceTransformer(modules=[base[0], base[1], Dense(32, 16, bias=True)], device="cpu")
    with pytest.raises(UnsupportedModelError, match="exact mode needs e\\(r\\) = 0.*Dense"):
        Explainer(model, layer=1, mode="exact")
    Explainer(model, layer=1, mode="approx", steps=1).explain(A, B)  # approx mode is fine


def test_training_an_exact_decoder_says_why_not(tiny):
    """The embedding shift of a trained exact model keeps the first and last token; Qwen3's tokenizer adds only the
    last one, so the model's shift and the engine's reference would differ: shifted() refuses, naming why. (The
    engine's exact mode on the model as it is works: test_engine_equals_the_independent_reference.)"""
    from xsbert_core import shifted

    with pytest.raises(UnsupportedModelError, match="exactly one special token at each end"):
        shifted(tiny.build("qwen3", "lasttoken", n_layers=2))
    shifted(tiny.build("modernbert", "mean", n_layers=2))  # [CLS] ... [SEP]: fine


@pytest.mark.parametrize("arch", ["modernbert", "qwen3", "bert"])
def test_fused_attention_falls_back_to_eager(tiny, arch):
    model = tiny.build(arch, pooling(arch), n_layers=2, attention="sdpa")
    assert model[0].auto_model.config._attn_implementation == "sdpa"
    with pytest.warns(UserWarning, match="'sdpa' cannot take forward-mode AD.*switched the model to 'eager'"):
        ex = Explainer(model, layer=1, steps=2)
    assert model[0].auto_model.config._attn_implementation == "eager"
    got = ex.explain(A, B)
    want = Explainer(tiny.get(arch, pooling(arch), n_layers=2), layer=1, steps=2).explain(A, B)
    assert np.allclose(got.matrix, want.matrix, atol=1e-6)


def test_a_split_that_does_not_reproduce_the_model_is_an_error(tiny):
    """A layout the engine does not know (here: a per-layer list one longer than the layers, which the engine
    does not slice, while the model indexes it by its loop counter) changes e(x): the probe says so."""
    model = tiny.build("qwen3", "lasttoken", n_layers=LAYERS)
    config = model[0].auto_model.config
    config.layer_types = [*config.layer_types, "full_attention"]
    Explainer(model, layer=0, steps=1)  # entering at layer 0 changes no loop index
    with pytest.raises(UnsupportedModelError, match="does not reproduce the model's own embedding"):
        Explainer(model, layer=1, steps=1)


def test_a_forward_that_reads_the_ids_outside_the_layers_is_an_error(tiny):
    """A layout whose output depends on the input ids outside the layer loop (here: the embedding output added to
    the last layer's, as DeBERTa-v2's convolution adds the encoder's input to layer 0's) gives the text's own
    embedding at the path's end but not the reference's at its start: the probe says so, at any layer."""
    model = tiny.build("bert", n_layers=LAYERS)
    auto = model[0].auto_model
    seen: list[torch.Tensor] = []

    def add_embeddings(module, args, out):
        return (out[0] + 0.5 * seen[-1], *out[1:]) if isinstance(out, tuple) else out + 0.5 * seen[-1]

    auto.embeddings.register_forward_hook(lambda module, args, out: seen.append(out))
    auto.encoder.layer[-1].register_forward_hook(add_embeddings)
    with pytest.raises(UnsupportedModelError, match="does not reproduce the model's own reference's embedding"):
        Explainer(model, layer=2, steps=1)


@pytest.mark.parametrize("mode,layer", [("approx", 1), ("exact", -1)])
def test_deberta_reads_only_the_relative_positions_the_text_uses(tiny, tmp_path, mode, layer):
    """v3's 256 position buckets (32 here) span more relative positions than a sentence has: inside the tail each
    attention reads only the rows of its table that the text's relative positions index (a span of m + 1 for the
    largest |position| m), and the factors are those of the model's own full table (the independent reference)."""
    import transformers as tf
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    folder = tiny.folder("deberta-v2", n_layers=LAYERS)
    config = tf.AutoConfig.from_pretrained(folder)
    config.position_buckets = 32
    torch.manual_seed(0)
    tf.AutoModel.from_config(config).eval().save_pretrained(tmp_path)
    tf.AutoTokenizer.from_pretrained(folder).save_pretrained(tmp_path)
    first = Transformer(str(tmp_path), model_kwargs={"attn_implementation": "eager"})
    model = SentenceTransformer(modules=[first, Pooling(first.get_embedding_dimension(), "mean")], device="cpu")
    model.eval()
    spans: list[int] = []
    for m in model[0].auto_model.modules():
        if hasattr(m, "disentangled_attention_bias"):
            own = m.disentangled_attention_bias
            m.disentangled_attention_bias = lambda *a, m=m, own=own: (spans.append(m.pos_ebd_size), own(*a))[1]
    ex = Explainer(model, layer=layer, mode=mode, rule="gauss-legendre", steps=STEPS)
    fs = ex.factors([A, B])
    longest = max(len(f.tokens) for f in fs)
    assert 32 in spans and min(spans) <= longest < 32  # the model's own forward: 32; the tail's: m + 1 <= S
    check_against_independent(model, ex, fs, layer, mode, "gauss-legendre")


@pytest.mark.parametrize("mode,calls", [("approx", [1, 1, 1, 1]), ("exact", [1, 1, 2, 2])])
def test_endpoints_run_each_layer_once(tiny, mode, calls):
    """Inputs and references go through the model as one batch, e(x) and e(r) through the tail as another; approx
    mode's forward stops at layer L (exact mode's runs on: the reference's last token embeddings are its shift)."""
    from xsbert_core.factors import endpoints

    model = tiny.build("bert", "mean", n_layers=LAYERS)
    ex = Explainer(model, layer=2, mode=mode, steps=1)
    seen = [0] * LAYERS
    for i, block in enumerate(model[0].auto_model.encoder.layer):
        block.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, seen[i] + 1))  # runs completed
    batch = ex.split.tokenize([A, B])
    ends = endpoints(ex.split, batch)
    assert seen == calls
    assert ends.h_x.shape == ends.h_r.shape == (2, max(batch.lengths), model[0].auto_model.config.hidden_size)


# --------------------------------------------------------------------------------------------- job and CLI
@pytest.fixture(scope="module")
def three_pairs(tmp_path_factory) -> Path:
    return write_tsv(tmp_path_factory.mktemp("pairs") / "pairs.tsv", stsb_rows(3))


def saved(tiny, arch: str, root: Path) -> Path:
    folder = root / f"{arch}-st"
    if not folder.exists():
        tiny.get(arch, pooling(arch), n_layers=LAYERS).save(str(folder))
    return folder


def attribute(folder: Path, data: Path, out: Path, *flags: str) -> dict:
    from jobs.attribute import main, parse_args

    return main(parse_args(["--dataset", str(data), "--model", str(folder), "--layer", "1", "--steps", "2",
                            "--batch-size", "4", "--out", str(out), "--quiet", *flags]))  # fmt: skip


@pytest.mark.parametrize("arch", ARCHS)
def test_job_end_to_end_local(tiny, arch, three_pairs, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"job-{arch}")
    summary = attribute(saved(tiny, arch, root), three_pairs, root / "runs", "--executor", "local")
    run = Path(summary["run_dir"])
    got = q(run, "select count(*), max(abs(completeness_error)), min(n_tokens_a) from {pairs}")[0]
    assert got[0] == 3 and got[2] > 2
    assert q(run, "select count(*) from {quarantine}")[0][0] == 0
    # the stored pair equals the Explainer's
    pair = q(run, "select p.score, p.attribution_sum, a.text, b.text from {pairs} p join {sentences} a "
                  "on a.sentence_id = p.sentence_id_a join {sentences} b on b.sentence_id = p.sentence_id_b "
                  "order by p.pair_id limit 1")[0]  # fmt: skip
    res = Explainer(tiny.get(arch, pooling(arch), n_layers=LAYERS), layer=1, steps=2).explain(pair[2], pair[3])
    assert pair[0] == pytest.approx(res.score, abs=1e-6) and pair[1] == pytest.approx(res.attribution_sum, abs=1e-5)


def test_job_with_a_prompt(tiny, three_pairs, tmp_path_factory):
    """--prompt: the stored sentence is what the model read (prompt + text, the prompt's tokens attributed);
    --exclude-prompt: the text alone. Each is a run of its own (the prompt is in the run id)."""
    root = tmp_path_factory.mktemp("job-prompt")
    folder = saved(tiny, "nomic_bert", root)
    plain = Path(attribute(folder, three_pairs, root / "runs", "--executor", "local")["run_dir"])
    kept = Path(attribute(folder, three_pairs, root / "runs", "--executor", "local", "--prompt", "query: ")["run_dir"])
    left = Path(attribute(folder, three_pairs, root / "runs", "--executor", "local", "--prompt", "query: ",
                          "--exclude-prompt")["run_dir"])  # fmt: skip
    assert len({plain.name, kept.name, left.name}) == 3
    sql = "select text, tokens from {sentences} order by sentence_id"
    for (t0, k0), (t1, k1), (t2, k2) in zip(q(plain, sql), q(kept, sql), q(left, sql)):
        assert t1 == "query: " + t0 and k1[:3] == ["[CLS]", "query", ":"] and len(k1) == len(k0) + 2
        assert t2 == t0 and k2 == k0
    assert q(left, "select count(*), max(abs(completeness_error)) < 1 from {pairs}")[0] == (3, True)


@pytest.mark.slow
def test_job_through_ray(tiny, three_pairs, tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("job-ray")
    folder = saved(tiny, "qwen3", root)
    ray_run = attribute(folder, three_pairs, root / "ray", "--num-actors", "1", "--cpus-per-actor", "1")["run_dir"]
    ray_run = Path(ray_run)
    local = Path(attribute(folder, three_pairs, root / "local", "--executor", "local")["run_dir"])
    assert ray_run.name == local.name  # same settings, same run id
    want = q(local, "select pair_id, score, attribution_sum from {pairs} order by pair_id")
    got = q(ray_run, "select pair_id, score, attribution_sum from {pairs} order by pair_id")
    assert len(got) == 3 and [g[0] for g in got] == [w[0] for w in want]
    assert np.allclose([g[1:] for g in got], [w[1:] for w in want], atol=1e-6)


@pytest.mark.parametrize("arch", ["modernbert", "gte", "nomic_bert", "qwen3", "deberta-v2", "electra"])
def test_xsbert_explain(tiny, arch, tmp_path, capsys):
    from jobs.cli import main

    folder = saved(tiny, arch, tmp_path)
    out = tmp_path / "explain.json"
    main(["explain", A, B, "--model", str(folder), "--layer", "1", "--steps", "16", "--json", str(out),
          "--prompt", "query: ", "--words"])  # fmt: skip
    printed = capsys.readouterr().out
    assert f"model {folder}" in printed and "top 5 token pairs" in printed
    res = json.loads(out.read_text())
    assert res["settings"]["family"] == arch and res["settings"]["prompt"] == "query: "
    assert abs(res["error"]) < 1e-2 and "query" in res["words_a"]
