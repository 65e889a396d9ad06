"""Token -> word aggregation (paper section 5.1): a word's attribution is the mean over its tokens.

Words come from the tokenizer's word ids (WordPiece, BPE and SentencePiece alike); special tokens
([CLS], </s>, ...) have no word id and belong to no word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Word:
    """One word: its text in the input, and the indices of its tokens."""

    text: str
    tokens: tuple[int, ...]


def words_of(text: str, word_ids: list[int | None], offsets: list[tuple[int, int]]) -> list[Word]:
    """Group token indices by word id, in order; the word's text spans its tokens' character offsets.

    Groups whose span is only whitespace are not words.
    """
    groups: dict[int, list[int]] = {}
    for i, wid in enumerate(word_ids):
        if wid is not None:
            groups.setdefault(wid, []).append(i)
    words = []
    for wid in sorted(groups):
        idx = groups[wid]
        start = min(offsets[i][0] for i in idx)
        end = max(offsets[i][1] for i in idx)
        word = text[start:end].strip()
        if not word:  # whitespace-only pre-token (byte-level BPE's lone 'Ġ' for extra spaces): no word
            continue
        words.append(Word(text=word, tokens=tuple(idx)))
    return words


def averaging_matrix(words: list[Word], n_tokens: int) -> np.ndarray:
    """M of shape (U, S): M[u, i] = 1/|u| if token i belongs to word u, else 0."""
    m = np.zeros((len(words), n_tokens))
    for u, w in enumerate(words):
        m[u, list(w.tokens)] = 1.0 / len(w.tokens)
    return m


def word_matrix(matrix: np.ndarray, words_a: list[Word], words_b: list[Word]) -> np.ndarray:
    """Word-pair attributions W (U_a, U_b): W[u, v] = mean over tokens i in u, j in v of A[i, j]."""
    a = np.asarray(matrix, dtype=np.float64)
    return averaging_matrix(words_a, a.shape[0]) @ a @ averaging_matrix(words_b, a.shape[1]).T
