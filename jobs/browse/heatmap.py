"""One stored pair (its cells, word cells and sentences, from its wave's parts) and its heatmaps: the diverging
colours, the SVG layout, the top cells."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xsbert_core.results import PairAttribution

from ..store import part_seq
from .run import (
    PAIR_FIELDS,
    TOP_CELLS,
    Page,
    RunInfo,
)

# Diverging colours (RdBu, reversed): blue negative, white 0, red positive; value / bound in [-1, 1].
_STOPS = ((-1.0, (33, 102, 172)), (-0.5, (146, 197, 222)), (0.0, (247, 247, 247)), (0.5, (244, 165, 130)),
          (1.0, (178, 24, 43)))  # fmt: skip


def colour(value: float, bound: float) -> str:
    """The cell's fill: diverging, white at 0, full red at +bound, full blue at -bound."""
    x = 0.0 if bound <= 0 or not math.isfinite(value) else max(-1.0, min(1.0, value / bound))
    for (x0, c0), (x1, c1) in zip(_STOPS, _STOPS[1:]):
        if x <= x1:
            f = (x - x0) / (x1 - x0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1))
    return "#%02x%02x%02x" % _STOPS[-1][1]


# Cell sizes in px: a map is drawn about AUTO_PX wide, its cells never smaller than MIN_CELL_PX (its 11 px token
# labels stay readable; a wider map scrolls in its box) nor larger than MAX_AUTO_PX; `cell=` on the pair page asks for
# a size from MIN_ASKED_PX to MAX_CELL_PX.
AUTO_PX = 880
MIN_CELL_PX = 20
MAX_AUTO_PX = 32
MIN_ASKED_PX = 6
MAX_CELL_PX = 64


def cell_size(n: int, asked: int | None = None) -> int:
    """The side of a cell in px for a map of n rows or columns (the larger): `asked` when given (clamped), else
    AUTO_PX / n within MIN_CELL_PX..MAX_AUTO_PX."""
    if asked:
        return max(MIN_ASKED_PX, min(MAX_CELL_PX, asked))
    return max(MIN_CELL_PX, min(MAX_AUTO_PX, AUTO_PX // max(n, 1)))


@dataclass
class Heatmap:
    """A matrix drawn as SVG rects: labels, per cell (value, fill), the colour bound (max |value|), the cell size
    (px; `asked` from the page, else sized to the matrix)."""

    title: str
    rows: list[str]
    cols: list[str]
    values: np.ndarray
    kind: str = "attribution"  # or "difference"
    asked: int | None = None
    bound: float = field(init=False)
    cell: int = field(init=False)

    def __post_init__(self) -> None:
        finite = self.values[np.isfinite(self.values)]
        self.bound = float(np.abs(finite).max()) if finite.size else 0.0
        self.cell = cell_size(max(len(self.rows), len(self.cols)), self.asked)

    @property
    def label_width(self) -> int:
        return 8 + 7 * max((len(r) for r in self.rows), default=1)

    @property
    def label_height(self) -> int:
        return 10 + int(6.2 * max((len(c) for c in self.cols), default=1))  # rotated 60°: ~6.6 px a character

    def cells(self):
        """(x, y, value, fill, row label, column label) per cell."""
        for i, row in enumerate(self.rows):
            for j, col in enumerate(self.cols):
                v = float(self.values[i, j])
                yield j * self.cell, i * self.cell, v, colour(v, self.bound), row, col

    def legend(self) -> list[tuple[float, str]]:
        return [(x, colour(x * self.bound, self.bound)) for x in (-1.0, -0.5, 0.0, 0.5, 1.0)]


def top_cells(values: np.ndarray, rows: list[str], cols: list[str], k: int = TOP_CELLS) -> dict[str, list[tuple]]:
    """The k largest positive and the k most negative cells: (value, i, j, row label, column label)."""
    flat = values.ravel()
    order = np.argsort(-flat, kind="stable")
    n = values.shape[1] if values.ndim == 2 and values.shape[1] else 1
    pos = [(float(flat[f]), f // n, f % n) for f in order[:k] if flat[f] > 0]
    neg = [(float(flat[f]), f // n, f % n) for f in order[::-1][:k] if flat[f] < 0]
    return {name: [(v, int(i), int(j), rows[i], cols[j]) for v, i, j in cells] for name, cells in
            (("positive", pos), ("negative", neg))}  # fmt: skip


@dataclass
class StoredPair:
    """One pair of one run as stored: its `pairs` row, the token and word matrices (cells not stored: 0), tokens."""

    run: RunInfo
    row: dict[str, Any]
    tokens_a: list[str]
    tokens_b: list[str]
    word_ids_a: list[int | None]
    word_ids_b: list[int | None]
    words_a: list[str]
    words_b: list[str]
    matrix: np.ndarray
    word_matrix: np.ndarray
    wave: int | None

    def attribution(self, words: bool) -> PairAttribution:
        """The pair as xsbert_core's PairAttribution (what `xsbert explain` computes), its settings the manifest's."""
        r = self.row

        def f(key: str, default: float = float("nan")) -> float:
            value = r.get(key)
            return default if value is None else float(value)

        return PairAttribution(
            tokens_a=self.tokens_a, tokens_b=self.tokens_b, matrix=self.matrix, score=f("score"),
            attribution_sum=f("attribution_sum"), positive_sum=f("positive_sum"), negative_sum=f("negative_sum"),
            ref_sim_a=f("ref_sim_a"), ref_sim_b=f("ref_sim_b"), ref_term=f("ref_term"), target=f("target"),
            error=f("completeness_error"), factor_error_a=f("factor_error_a"), factor_error_b=f("factor_error_b"),
            steps_a=int(r.get("steps_a") or 0), steps_b=int(r.get("steps_b") or 0),
            truncated_a=bool(r.get("truncated_a")), truncated_b=bool(r.get("truncated_b")),
            words_a=self.words_a if words else None, words_b=self.words_b if words else None,
            word_matrix=self.word_matrix if words else None, settings=self.run.settings,
        )  # fmt: skip


def _fill(shape: tuple[int, int], rows: list[tuple]) -> np.ndarray:
    m = np.zeros(shape)
    for x, y, v in rows:
        if 0 <= x < shape[0] and 0 <= y < shape[1] and v is not None:
            m[x, y] = v
    return m


def load_pair(page: Page, run: RunInfo, pair_id: str) -> StoredPair | None:
    """The pair's row, matrices and tokens from `run`; None when the run has no such pair. Reads the cells, word
    cells and sentences of the pair's wave only (the parts named part-<wave>*), else of the whole tables."""
    two = run.suffix == "_2"
    fields = [f for f in PAIR_FIELDS if f in run.columns]
    extra = sorted(run.columns - set(PAIR_FIELDS) - {"top10_abs", "top10_value", "content_top10_abs",
                                                      "content_top10_value", "word_top10_abs", "word_top10_value"})  # fmt: skip
    cols = ", ".join(fields + extra)
    found = page.run(
        f"the pair ({run.flag[2:]})",
        f"select {cols}, filename from read_parquet($pairs_parts, filename = true) where pair_id = $id",
        {"pairs_parts": run.parts_of("pairs"), "id": pair_id},
        view_sql=f"select {cols} from pairs{run.suffix} where pair_id = $id", run2=two)  # fmt: skip
    if not found:
        return None
    row = dict(zip(fields + extra + ["filename"], found[0]))
    wave = part_seq(str(row.pop("filename")).replace("\\", "/").rsplit("/", 1)[-1])

    def narrowed(title: str, table: str, select: str, where: str, params: dict[str, Any], expect: int) -> list[tuple]:
        view = f"select {select} from {table}{run.suffix} where {where}"
        if wave is not None and run.parts_of(table, wave):
            rows = page.run(title, f"select {select} from read_parquet($parts) where {where}",
                            {**params, "parts": run.parts_of(table, wave)}, view_sql=view, run2=two,
                            note=f"read from the parts of wave {wave} ({table}/part-{wave:06d}*.parquet)")  # fmt: skip
            if len(rows) >= expect:
                return rows
        return page.run(title, view, params, run2=two)

    ids = (row["sentence_id_a"], row["sentence_id_b"])
    sent = narrowed("the two sentences", "sentences", "sentence_id, tokens, word_ids, words",
                    "sentence_id in ($sentence_a, $sentence_b)", {"sentence_a": ids[0], "sentence_b": ids[1]},
                    len(set(ids)))  # fmt: skip
    by_id = {r[0]: r for r in sent}
    a, b = by_id.get(ids[0]), by_id.get(ids[1])
    tokens_a, ids_a, words_a = (list(a[1] or []), list(a[2] or []), list(a[3] or [])) if a else ([], [], [])
    tokens_b, ids_b, words_b = (list(b[1] or []), list(b[2] or []), list(b[3] or [])) if b else ([], [], [])
    n_cells = row.get("n_cells") or 0
    cells = narrowed("the token cells", "cells", "i, j, value, token_a, token_b", "pair_id = $id", {"id": pair_id},
                     1 if n_cells else 0)  # fmt: skip
    words = narrowed("the word cells", "word_cells", "u, v, value, word_a, word_b", "pair_id = $id", {"id": pair_id},
                     1 if (row.get("n_word_cells") or 0) else 0)  # fmt: skip
    if not tokens_a or not tokens_b:  # no sentences row: the tokens the cells name
        tokens_a = _labels([(r[0], r[3]) for r in cells], row.get("n_tokens_a"))
        tokens_b = _labels([(r[1], r[4]) for r in cells], row.get("n_tokens_b"))
        ids_a, ids_b = [None] * len(tokens_a), [None] * len(tokens_b)
    if not words_a or not words_b:
        words_a = _labels([(r[0], r[3]) for r in words], None)
        words_b = _labels([(r[1], r[4]) for r in words], None)
    matrix = _fill((len(tokens_a), len(tokens_b)), [(r[0], r[1], r[2]) for r in cells])
    word_matrix = _fill((len(words_a), len(words_b)), [(r[0], r[1], r[2]) for r in words])
    return StoredPair(run, row, tokens_a, tokens_b, ids_a, ids_b, words_a, words_b, matrix, word_matrix, wave)


def _labels(pairs: list[tuple[int, str]], n: int | None) -> list[str]:
    size = max([k + 1 for k, _ in pairs] + [n or 0])
    out = ["?"] * size
    for k, label in pairs:
        out[k] = label
    return out


def views(pair: StoredPair, level: str, specials: bool) -> tuple[np.ndarray, list[str], list[str]]:
    """The matrix shown: token level without the special tokens' rows and columns unless `specials`, or words."""
    if level == "word":
        return pair.word_matrix, pair.words_a, pair.words_b
    rows = [i for i, w in enumerate(pair.word_ids_a) if specials or w is not None] or list(range(len(pair.tokens_a)))
    cols = [j for j, w in enumerate(pair.word_ids_b) if specials or w is not None] or list(range(len(pair.tokens_b)))
    if len(pair.word_ids_a) != len(pair.tokens_a) or len(pair.word_ids_b) != len(pair.tokens_b):
        rows, cols = list(range(len(pair.tokens_a))), list(range(len(pair.tokens_b)))
    return pair.matrix[np.ix_(rows, cols)], [pair.tokens_a[i] for i in rows], [pair.tokens_b[j] for j in cols]
