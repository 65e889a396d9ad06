"""Batched == one at a time: batch composition, internal batch size and duplicates change no number."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from xsbert_core import Explainer

TEXTS = [
    "Hi.",
    "A man is playing a guitar on stage.",
    "The quick brown fox jumps over the lazy dog near the riverbank this morning.",
    "Dogs run.",
    "Someone performs music with an instrument.",
    "Notwithstanding the circumstances, parliamentarians deliberated interminably.",
    "Yes",
    "Two children are playing football in the park while it rains.",
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def assert_same_factors(got, want, tol=1e-5):
    assert got.text == want.text
    assert got.tokens == want.tokens
    assert got.word_ids == want.word_ids and got.offsets == want.offsets
    assert got.factor.shape == want.factor.shape
    assert rel(got.factor, want.factor) <= tol
    assert rel(got.embedding, want.embedding) <= tol
    if float(want.reference_embedding.norm()) > 0:
        assert rel(got.reference_embedding, want.reference_embedding) <= tol
    else:
        assert torch.count_nonzero(got.reference_embedding) == 0
    assert got.n_steps == want.n_steps
    assert got.error == pytest.approx(want.error, rel=1e-3, abs=1e-6)


@pytest.fixture(scope="module")
def minilm_single(minilm):
    ex = Explainer(minilm, layer=-3, steps=4)
    return {t: ex.factors([t])[0] for t in TEXTS}


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 3, 32])
def test_minilm_batched_equals_single(minilm, minilm_single, batch_size):
    ex = Explainer(minilm, layer=-3, steps=4)
    fs = ex.factors(TEXTS, batch_size=batch_size)
    assert [f.text for f in fs] == TEXTS  # input order kept although batches are sorted by length
    lengths = {len(f.tokens) for f in fs}
    assert len(lengths) > 4  # really different lengths
    for f in fs:
        assert_same_factors(f, minilm_single[f.text])


@pytest.mark.slow
@pytest.mark.parametrize("ibs", [1, 7, 64, 100_000])  # 100k: every row and token in one jvp call, as on a GPU
def test_minilm_internal_batch_size_invariance(minilm, ibs):
    texts = [TEXTS[0], TEXTS[1], TEXTS[3]]
    base = Explainer(minilm, layer=-3, steps=3, internal_batch_size=None).factors(texts, batch_size=4)
    got = Explainer(minilm, layer=-3, steps=3, internal_batch_size=ibs).factors(texts, batch_size=4)
    for g, b in zip(got, base):
        assert_same_factors(g, b)


@pytest.mark.parametrize(
    "arch,pooling,mode",
    [
        ("bert", "mean", "approx"),
        ("bert", "mean", "exact"),
        ("mpnet", "cls", "approx"),
        ("roberta", "max", "approx"),
        ("roberta", "max", "exact"),
        ("distilbert", "mean", "exact"),
    ],
)
def test_tiny_batched_and_chunked_equal_single(tiny, arch, pooling, mode):
    model = tiny.get(arch, pooling=pooling)
    single = {t: Explainer(model, layer=1, mode=mode, steps=3).factors([t])[0] for t in TEXTS}
    # one jvp call per (sentence, node, token) costs Python overhead: small ibs on short texts only
    runs = [
        (TEXTS, 3, None),
        (TEXTS[:2] + TEXTS[3:5], 4, 7),
        (TEXTS, 2, 64),
        ([TEXTS[0], TEXTS[3], TEXTS[6]], 3, 1),
    ]
    for texts, batch_size, ibs in runs:
        ex = Explainer(model, layer=1, mode=mode, steps=3, internal_batch_size=ibs)
        for f in ex.factors(texts, batch_size=batch_size):
            assert_same_factors(f, single[f.text])


@pytest.mark.parametrize("ibs", [None, 1, 7, 64])
def test_jvp_calls_are_cut_to_their_own_rows_length(tiny, ibs):
    """A batch of short texts and one long one: each jvp call takes consecutive (sentence, node) rows, as many as
    the chunk allows for the longest of them, and runs them at that length, not the batch's padded one."""
    from xsbert_core.factors import jvp_chunks, row_chunks

    split = Explainer(tiny.get("bert"), layer=1, steps=2).split
    lengths = [3] * 8 + [5] * 6 + [40] * 4  # rows of one batch, shortest sentences first (Explainer.factors' order)
    chunks = list(row_chunks(split, lengths, ibs))
    assert [r for r0, r1, _ in chunks for r in range(r0, r1)] == list(range(len(lengths)))  # each row once, in order
    for r0, r1, longest in chunks:
        assert longest == max(lengths[r0:r1])
        assert r1 - r0 <= jvp_chunks(split, longest, ibs)[1]
        if r1 < len(lengths):  # as many rows as fit: the next one would not
            assert r1 + 1 - r0 > jvp_chunks(split, max(lengths[r0 : r1 + 1]), ibs)[1]
    if ibs is not None:  # a chunk smaller than the batch: the short rows run at their own length, not at 40
        assert chunks[0][2] < 40 and chunks[-1][2] == 40


def forward_rows(ex: Explainer, compute) -> collections.Counter:
    """How often each token sequence (padding left out) enters the model's token embeddings while `compute()` runs:
    what was computed, seen through a forward pre-hook."""
    embeddings = ex.split.auto_model.get_input_embeddings()
    pad = ex.model.tokenizer.pad_token_id
    seen: collections.Counter = collections.Counter()

    def count(module, args):
        ids = args[0]
        seen.update(tuple(t for t in row if t != pad) for row in ids.reshape(-1, ids.shape[-1]).tolist())

    hook = embeddings.register_forward_pre_hook(count)
    try:
        compute()
    finally:
        hook.remove()
    return seen


def test_duplicates_are_computed_once(tiny):
    """Texts given several times cost what they cost once: the same forward passes as the unique texts alone."""
    model = tiny.get("bert")
    ex = Explainer(model, layer=1, steps=2)
    texts = ["a cat", "a dog", "a cat", "the bird sings", "a dog", "a cat"]
    once = forward_rows(ex, lambda: ex.factors(list(dict.fromkeys(texts)), batch_size=2))
    fs = []
    assert forward_rows(ex, lambda: fs.extend(ex.factors(texts, batch_size=2))) == once
    assert len(once) > len(set(texts))  # each text (and the reference) did go through the model
    assert [f.text for f in fs] == texts
    assert fs[0] is fs[2] is fs[5] and fs[1] is fs[4]


def test_explain_pairs_equals_explain(tiny):
    model = tiny.get("roberta")
    ex = Explainer(model, layer=1, steps=4)
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[2], TEXTS[3]), (TEXTS[1], TEXTS[0]), (TEXTS[4], TEXTS[4])]
    pairs.append((TEXTS[5], TEXTS[1]))
    unique = list(dict.fromkeys(t for p in pairs for t in p))
    many = []
    pairs_rows = forward_rows(ex, lambda: many.extend(ex.explain_pairs(pairs, batch_size=3)))
    assert pairs_rows == forward_rows(ex, lambda: ex.factors(unique, batch_size=3))  # each sentence once
    assert len(many) == len(pairs)
    for (a, b), res in zip(pairs, many):
        one = ex.explain(a, b)
        assert res.tokens_a == one.tokens_a and res.tokens_b == one.tokens_b
        assert res.matrix.shape == (len(res.tokens_a), len(res.tokens_b))
        np.testing.assert_allclose(res.matrix, one.matrix, rtol=1e-5, atol=1e-7)
        for key in ("score", "attribution_sum", "target", "ref_sim_a", "ref_sim_b", "ref_term"):
            assert getattr(res, key) == pytest.approx(getattr(one, key), rel=1e-5, abs=1e-6)
        # one completeness error per pair, of that pair
        assert np.isfinite(res.error)
        assert res.error == pytest.approx(res.attribution_sum - res.target, abs=1e-12)
    # the bracket is symmetric in (a, b): the swapped pair has the same error, the others their own
    assert many[2].error == pytest.approx(many[0].error, rel=1e-9, abs=1e-12)
    errors = [many[i].error for i in (0, 1, 3, 4)]
    assert len(set(errors)) == len(errors)
    # swapping a and b transposes the matrix
    np.testing.assert_allclose(many[2].matrix, many[0].matrix.T, rtol=1e-9, atol=1e-12)
    assert many[2].score == pytest.approx(many[0].score)


def test_empty_list_gives_empty_result(tiny):
    ex = Explainer(tiny.get("bert"), layer=1, steps=2)
    assert ex.factors([]) == []
    assert ex.explain_pairs([]) == []


def test_the_jvp_chunk_follows_the_device():
    """CPU: the chunk measured on 2 cores (2**23 elements); a GPU: 1/64 of its memory within [2**23, 2**30], the
    largest chunk measured (bench/results/gpu.md: 2**30 on an H100 80 GB, 16.6-20.6x faster than 2**23)."""
    import torch

    from xsbert_core.factors import DEFAULT_CHUNK_ELEMENTS, GPU_CHUNK_ELEMENTS_MAX, chunk_elements, gpu_chunk_elements

    assert chunk_elements(torch.device("cpu")) == DEFAULT_CHUNK_ELEMENTS == 2**23
    assert gpu_chunk_elements(85_520_809_984) == GPU_CHUNK_ELEMENTS_MAX == 2**30  # H100 80 GB, as torch reports it
    assert gpu_chunk_elements(16 * 2**30) == 2**28  # a 16 GB card: 1/64 of it
    assert gpu_chunk_elements(2**28) == DEFAULT_CHUNK_ELEMENTS  # never below the CPU's
