"""Token -> word aggregation (paper section 5.1) for WordPiece, byte-level BPE and SentencePiece."""

from __future__ import annotations

import numpy as np
import pytest

from xsbert_core import Explainer
from xsbert_core.words import Word, averaging_matrix, word_matrix, words_of

A = "The guitarist plays unbelievably well."
B = "Someone performs music with an instrument."


def expected_word_matrix(matrix: np.ndarray, words_a, words_b) -> np.ndarray:
    """W[u, v] = mean of A over the tokens of word u (rows) and word v (columns), by explicit loops."""
    out = np.zeros((len(words_a), len(words_b)))
    for u, wa in enumerate(words_a):
        for v, wb in enumerate(words_b):
            out[u, v] = np.mean([matrix[i, j] for i in wa.tokens for j in wb.tokens])
    return out


def check_words(sf, expected_texts: list[str], marker: str):
    words = sf.words
    assert [w.text for w in words] == expected_texts
    special = {0, len(sf.tokens) - 1}
    covered = [i for w in words for i in w.tokens]
    assert len(covered) == len(set(covered))  # a token belongs to one word at most
    assert special.isdisjoint(covered)  # special tokens are in no word
    for w in words:
        assert list(w.tokens) == list(range(w.tokens[0], w.tokens[-1] + 1))  # contiguous
        pieces = "".join(sf.tokens[i] for i in w.tokens)
        assert pieces.replace(marker, "").lower() == w.text.replace(" ", "").lower()


@pytest.fixture(scope="module")
def bert_pair(tiny):
    ex = Explainer(tiny.get("bert"), layer=1, steps=2)
    return ex.explain(A, B, words=True), ex.factors([A, B])


def test_wordpiece_word_row_is_mean_of_its_pieces(bert_pair):
    res, (fa, fb) = bert_pair
    assert fa.tokens[4:9] == ["un", "##bel", "##ie", "##va", "##bly"]
    check_words(fa, ["The", "guitarist", "plays", "unbelievably", "well", "."], "##")
    check_words(fb, B[:-1].split() + ["."], "##")
    assert res.words_a == [w.text for w in fa.words] and res.words_b == [w.text for w in fb.words]
    assert res.word_matrix.shape == (len(res.words_a), len(res.words_b))
    np.testing.assert_allclose(res.word_matrix, expected_word_matrix(res.matrix, fa.words, fb.words), rtol=1e-12)
    # the multi-piece word's row is the mean of its pieces' rows (averaged over each column word)
    u = res.words_a.index("unbelievably")
    rows = res.matrix[4:9]  # tokens un ##bel ##ie ##va ##bly
    per_word_cols = np.stack([rows[:, list(w.tokens)].mean(1) for w in fb.words], 1)
    np.testing.assert_allclose(res.word_matrix[u], per_word_cols.mean(0), rtol=1e-12)
    # single-token words are the token cells themselves
    assert res.word_matrix[res.words_a.index("guitarist"), res.words_b.index("music")] == pytest.approx(
        res.matrix[2, fb.tokens.index("music")]
    )
    d = res.to_dict()
    assert d["words_a"] == res.words_a and np.allclose(d["word_matrix"], res.word_matrix)


def test_bpe_words(tiny):
    ex = Explainer(tiny.get("roberta"), layer=1, steps=2)
    text = "The guitarist plays unbelievably well."
    res = ex.explain(text, B, words=True)
    fa, fb = ex.factors([text, B])
    assert fa.tokens[0] == "<s>" and fa.tokens[-1] == "</s>"
    assert any(len(w.tokens) > 2 for w in fa.words)  # BPE really split some words
    check_words(fa, ["The", "guitarist", "plays", "unbelievably", "well", "."], "Ġ")
    check_words(fb, B[:-1].split() + ["."], "Ġ")
    np.testing.assert_allclose(res.word_matrix, expected_word_matrix(res.matrix, fa.words, fb.words), rtol=1e-12)


def test_bpe_whitespace_runs_are_not_words(tiny):
    """Byte-level BPE turns extra spaces into lone 'Ġ' tokens with their own word id: not input words."""
    ex = Explainer(tiny.get("roberta"), layer=1, steps=2)
    text = "  Leading spaces and  double  spaces. "
    fa = ex.factors([text])[0]
    assert "Ġ" in fa.tokens  # the tokenizer did produce whitespace-only tokens
    words = fa.words
    assert [w.text for w in words] == ["Leading", "spaces", "and", "double", "spaces", "."]
    res = ex.explain(text, B, words=True)
    assert res.words_a == ["Leading", "spaces", "and", "double", "spaces", "."]
    assert np.isfinite(res.word_matrix).all()


def test_sentencepiece_words(tiny):
    ex = Explainer(tiny.get("xlmr"), layer=1, steps=2)
    text = "The guitarist plays unbelievably well."
    fa, fb = ex.factors([text, B])
    # SentencePiece words are whitespace-separated (punctuation stays attached)
    check_words(fa, text.split(), "▁")
    check_words(fb, B.split(), "▁")
    res = ex.pair(fa, fb, words=True)
    np.testing.assert_allclose(res.word_matrix, expected_word_matrix(res.matrix, fa.words, fb.words), rtol=1e-12)


def test_words_of_and_averaging_matrix_directly():
    text = "ab cd"
    word_ids = [None, 0, 0, 1, None]
    offsets = [(0, 0), (0, 1), (1, 2), (3, 5), (0, 0)]
    words = words_of(text, word_ids, offsets)
    assert words == [Word("ab", (1, 2)), Word("cd", (3,))]
    m = averaging_matrix(words, 5)
    np.testing.assert_allclose(m, [[0, 0.5, 0.5, 0, 0], [0, 0, 0, 1, 0]])
    a = np.arange(25, dtype=float).reshape(5, 5)
    expected = [[(6 + 7 + 11 + 12) / 4, (8 + 13) / 2], [(16 + 17) / 2, 18]]
    np.testing.assert_allclose(word_matrix(a, words, words), expected)
