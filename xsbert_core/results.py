"""What the engine returns: one text's factor (`SentenceFactors`) and one pair's attributions (`PairAttribution`).

Plain data (torch tensors and numpy arrays), apart from the Explainer that makes them (xsbert_core.explainer), so
that what only reads or combines them (the job's stage-2 cell tasks, `xsbert show`) needs no model library, and
what holds no tensor (`xsbert show`'s PairAttribution) not torch either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .quadrature import Panel
from .words import Word, words_of

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class SentenceFactors:
    """One text's factor P (D x S) and what it sums to: sum_s P[:, s] ~ embedding - reference_embedding."""

    text: str
    tokens: list[str]
    word_ids: list[int | None]
    offsets: list[tuple[int, int]]
    factor: Tensor  # (D, S)
    embedding: Tensor  # e(x), (D,)
    reference_embedding: Tensor  # e(r), (D,); zero in exact mode
    n_steps: int
    error: float  # ||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)||
    truncated: bool
    converged: bool = True  # error <= the explainer's tolerance (always True without one)
    # The prompt the model read before the text ("" without one). Attributed: `text` is prompt + text and the
    # prompt's tokens are tokens of it. Excluded: `text` is the text alone, the prompt's (zero) columns are dropped.
    prompt: str = ""
    prompt_excluded: bool = False
    # The pieces of [0, 1] the rule ran on (adaptive N by panels, xsbert_core.refine), in order; None: [0, 1] whole.
    panels: list[Panel] | None = None

    @property
    def words(self) -> list[Word]:
        return words_of(self.text, self.word_ids, self.offsets)


@dataclass
class PairAttribution:
    """Attributions for one pair: matrix[i, j] explains how token i of a and token j of b add to the score."""

    tokens_a: list[str]
    tokens_b: list[str]
    matrix: np.ndarray  # (S_a, S_b), float64
    score: float  # f(a, b)
    attribution_sum: float  # sum A
    positive_sum: float
    negative_sum: float
    ref_sim_a: float  # f(a, r_b)
    ref_sim_b: float  # f(b, r_a)
    ref_term: float  # f(r_a, r_b)
    target: float  # bracket / c: what sum A converges to (= score in exact mode)
    error: float  # sum A - target
    factor_error_a: float
    factor_error_b: float
    steps_a: int
    steps_b: int
    truncated_a: bool
    truncated_b: bool
    words_a: list[str] | None = None
    words_b: list[str] | None = None
    word_matrix: np.ndarray | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    def top_cells(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k cells of largest |A|: (i, j, value)."""
        flat = np.argsort(-np.abs(self.matrix), axis=None)[:k]
        return [(int(i), int(j), float(self.matrix[i, j])) for i, j in zip(*np.unravel_index(flat, self.matrix.shape))]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tokens, matrix as rows, every scalar, words if computed, settings."""
        out: dict[str, Any] = {
            "tokens_a": self.tokens_a,
            "tokens_b": self.tokens_b,
            "matrix": self.matrix.tolist(),
            "score": self.score,
            "attribution_sum": self.attribution_sum,
            "positive_sum": self.positive_sum,
            "negative_sum": self.negative_sum,
            "ref_sim_a": self.ref_sim_a,
            "ref_sim_b": self.ref_sim_b,
            "ref_term": self.ref_term,
            "target": self.target,
            "error": self.error,
            "factor_error_a": self.factor_error_a,
            "factor_error_b": self.factor_error_b,
            "steps_a": self.steps_a,
            "steps_b": self.steps_b,
            "truncated_a": self.truncated_a,
            "truncated_b": self.truncated_b,
            "settings": self.settings,
        }
        if self.word_matrix is not None:
            out.update(words_a=self.words_a, words_b=self.words_b, word_matrix=self.word_matrix.tolist())
        return out
