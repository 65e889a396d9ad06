"""The Ray Data callables of the attribution job: sentence factors, then pair cells.

    FactorActor: sentences -> one row per sentence: P (D x S, float32 bytes), e(x), e(r), tokens, error
    PairCells:   pairs     -> one row per pair: Explainer.pair's numbers, its cells and word cells as lists

Both can be called without Ray (`FactorActor(...)(table)`, `PairCells([factor tables], "cos")(table)`),
which is how the tests compare them with `Explainer.pair`. In the job, one FactorActor pool serves the whole run
(stage1.FactorStream) and PairCells runs inside Ray tasks (`pair_cells`), wave by wave: stage 2 is light,
and its task workers stay warm across waves.

Why the factors travel as they do (measured in docs/STORE.md): a factor is D x S float32, ~22 KB for an
STS-B sentence under all-MiniLM-L6-v2 (D = 384, S ~ 14), ~1/30 s of CPU work per KB to make, so one copy
through the object store is noise next to computing it. The factors of one wave are made once
(stage 1); each stage-2 worker reads the wave's blocks once, zero-copy on its node, and looks factors
up by sentence id, so a sentence shared by many pairs is neither recomputed nor shipped per pair. A
Ray Data join instead would hash-shuffle two factors with every pair (2 x per pair instead of 1 x per
sentence per node) and needs polars plus CPU-holding aggregator actors.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from xsbert_core.memory import TensorBudget
from xsbert_core.metrics import grouped_rank_bounds, grouped_top_k
from xsbert_core.pairs import completeness_target, pair_matrix, similarity_score
from xsbert_core.results import SentenceFactors
from xsbert_core.settings import EngineSettings
from xsbert_core.words import averaging_matrix

from ..config import CELL_CHOICES, DEFAULT_BATCH_SIZE_CPU
from ..store import SCHEMAS
from .hooks import Hooks
from .memory import actor_memory, device_lost

logger = logging.getLogger(__name__)

FACTOR_SCHEMA = pa.schema(
    [
        ("sentence_id", pa.string()),
        ("text", pa.string()),
        ("n_tokens", pa.int32()),
        ("dim", pa.int32()),
        ("factor", pa.large_binary()),  # float32, C order, shape (dim, n_tokens)
        ("embedding", pa.binary()),  # float32 e(x), (dim,)
        ("reference_embedding", pa.binary()),  # float32 e(r), (dim,)
        ("factor_error", pa.float64()),
        ("n_steps", pa.int32()),
        ("truncated", pa.bool_()),
        ("tokens", pa.list_(pa.string())),
        ("word_ids", pa.list_(pa.int32())),  # null for special tokens
        ("token_start", pa.list_(pa.int32())),  # character offsets of each token in text
        ("token_end", pa.list_(pa.int32())),
        ("words", pa.list_(pa.string())),  # the sentence's words (xsbert_core.words), for the `sentences` table
        ("failure", pa.string()),  # null, or why the engine could not attribute this sentence
        ("compute_s", pa.float64()),  # the actor's seconds in the engine for this sentence's batch / batch size
        # Groups of the call that ran out of memory and were halved (xsbert_core.memory), on the call's first row
        # (0 on the others: a wave's sum counts each call once).
        ("oom_retries", pa.int32()),
    ]
)

# Per pair, the TOP_K cells of largest |value| (abs) or value, largest first, ties by the smaller row then column:
# over all cells, over the cells of two content tokens, over the word cells (docs/STORE.md, `pairs`).
TOP_K = 10
TOP_CELLS: tuple[str, ...] = ("top10_abs", "top10_value", "content_top10_abs", "content_top10_value",
                              "word_top10_abs", "word_top10_value")  # fmt: skip

# Stage 2's row per pair: Explainer.pair's numbers, the cell counts, and either the cells themselves as lists
# (the driver writes them) or the names of the parts the task wrote them into (the workers write them).
PAIR_SCHEMA = pa.schema(
    [
        ("ord", pa.int64()),
        ("pair_id", pa.string()),
        ("score", pa.float64()),
        ("attribution_sum", pa.float64()),
        ("positive_sum", pa.float64()),
        ("negative_sum", pa.float64()),
        ("ref_sim_a", pa.float64()),
        ("ref_sim_b", pa.float64()),
        ("ref_term", pa.float64()),
        ("target", pa.float64()),
        ("completeness_error", pa.float64()),
        ("factor_error_a", pa.float64()),
        ("factor_error_b", pa.float64()),
        ("steps_a", pa.int32()),
        ("steps_b", pa.int32()),
        ("truncated_a", pa.bool_()),
        ("truncated_b", pa.bool_()),
        ("n_tokens_a", pa.int32()),
        ("n_tokens_b", pa.int32()),
        ("failure", pa.string()),
        ("n_cells", pa.int32()),
        ("n_word_cells", pa.int32()),
        *((name, SCHEMAS["pairs"].field(name).type) for name in TOP_CELLS),
        ("cells_part", pa.string()),  # the part holding this pair's cells, when a worker wrote it
        ("word_cells_part", pa.string()),
        ("cell_i", pa.list_(pa.int32())),
        ("cell_j", pa.list_(pa.int32())),
        ("cell_token_a", pa.list_(pa.string())),
        ("cell_token_b", pa.list_(pa.string())),
        ("cell_value", pa.list_(pa.float64())),
        ("cell_value_rank", pa.list_(pa.float32())),
        ("cell_content_rank", pa.list_(pa.float32())),
        ("word_u", pa.list_(pa.int32())),
        ("word_v", pa.list_(pa.int32())),
        ("word_a", pa.list_(pa.string())),
        ("word_b", pa.list_(pa.string())),
        ("word_value", pa.list_(pa.float64())),
        ("word_value_rank", pa.list_(pa.float32())),
    ]
)
# The per-pair numbers (everything before the cell columns).
PAIR_NUMBERS: tuple[str, ...] = tuple(PAIR_SCHEMA.names[: PAIR_SCHEMA.names.index("cells_part")])
CELL_LISTS = {"cell_i": "i", "cell_j": "j", "cell_token_a": "token_a", "cell_token_b": "token_b", "cell_value": "value",
              "cell_value_rank": "value_rank", "cell_content_rank": "content_rank"}
WORD_LISTS = {"word_u": "u", "word_v": "v", "word_a": "word_a", "word_b": "word_b", "word_value": "value",
              "word_value_rank": "value_rank"}
# --------------------------------------------------------------------------- stage 1
# A sentence whose factor error is still above the tolerance at max_steps fails with this prefix (its pairs are
# quarantined with reason `not_converged`, jobs.attribution.stage2.wave_tables).
NOT_CONVERGED = "not_converged: "


def not_converged(res: SentenceFactors, tolerance: float | None) -> str:
    """The failure message of a sentence that did not reach the tolerance."""
    return (f"{NOT_CONVERGED}factor error {res.error:.3e} > tolerance {tolerance:g} at max_steps N={res.n_steps}")


def factor_rows(ids: list[str], texts: list[str], results: list[SentenceFactors | str],
                tolerance: float | None = None) -> pa.Table:  # fmt: skip
    """FACTOR_SCHEMA rows: a SentenceFactors, or a failure message, per sentence. A SentenceFactors that did not
    converge (adaptive N stopped at max_steps above `tolerance`) is a failure too: `not_converged(...)`."""
    cols: dict[str, list[Any]] = {name: [] for name in FACTOR_SCHEMA.names}
    for sid, text, res in zip(ids, texts, results):
        if not isinstance(res, str) and not res.converged:
            res = not_converged(res, tolerance)
        cols["sentence_id"].append(sid)
        # what the tokens' offsets index: with an attributed prompt the model read prompt + text
        cols["text"].append(text if isinstance(res, str) else res.text)
        if isinstance(res, str):
            for name in FACTOR_SCHEMA.names[2:-3]:
                cols[name].append(None)
            cols["failure"].append(res)
            cols["compute_s"].append(None)
            cols["oom_retries"].append(0)
            continue
        p = res.factor.detach().to("cpu", torch.float32).contiguous().numpy()
        cols["n_tokens"].append(p.shape[1])
        cols["dim"].append(p.shape[0])
        cols["factor"].append(p.tobytes())
        cols["embedding"].append(res.embedding.detach().to("cpu", torch.float32).numpy().tobytes())
        cols["reference_embedding"].append(res.reference_embedding.detach().to("cpu", torch.float32).numpy().tobytes())
        cols["factor_error"].append(float(res.error))
        cols["n_steps"].append(int(res.n_steps))
        cols["truncated"].append(bool(res.truncated))
        cols["tokens"].append(list(res.tokens))
        cols["word_ids"].append(list(res.word_ids))
        cols["token_start"].append([int(o[0]) for o in res.offsets])
        cols["token_end"].append([int(o[1]) for o in res.offsets])
        cols["words"].append([w.text for w in res.words])
        cols["failure"].append(None)
        cols["compute_s"].append(None)
        cols["oom_retries"].append(0)
    return pa.table(cols, schema=FACTOR_SCHEMA)


def one_row_per_sentence(batch: pa.Table) -> pa.Table:
    """A batch whose rows hold lists of sentences (sentence_id and text as lists: the job's batches, one per row)
    as one row per sentence, each row's other columns repeated; a batch of one sentence per row as it is."""
    if not pa.types.is_list(batch.schema.field("sentence_id").type):
        return batch
    parents = pc.list_parent_indices(batch.column("sentence_id"))
    cols = {name: pc.list_flatten(batch.column(name)) for name in ("sentence_id", "text")}
    cols |= {name: batch.column(name).take(parents) for name in batch.column_names if name not in cols}
    return pa.table(cols)


class FactorActor:
    """Sentences (sentence_id, text, any other columns; or rows of sentence lists, see one_row_per_sentence) ->
    FACTOR_SCHEMA rows, then the other columns as they came. Loads the engine of `engine` (the run's, resolved:
    Explainer.engine) once per actor, on `device` with `threads` torch threads, and computes `batch_size` sentences
    per engine call. `hooks`: faults a test injects (hooks.py)."""

    def __init__(self, engine: EngineSettings, device: str = "cpu", threads: int | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE_CPU,
                 memory_limit: int | None = None, gpu_share: float | None = None,
                 hooks: Hooks | None = None) -> None:  # fmt: skip
        self.hooks = hooks or Hooks()
        self.hooks.actor_started()
        if threads:
            torch.set_num_threads(threads)
        from xsbert_core.explainer import Explainer  # here: stage 2's cell tasks import this module without a model
        from xsbert_core.models import transformers_bars

        with transformers_bars(False):  # one "Loading weights" bar per actor start is noise in the job log
            self.explainer = Explainer.from_settings(engine, device=device)
        # The factor batch's memory: planned within a budget on a GPU, and a limit where one is asked for
        # (jobs/attribution/memory.py: the caching allocator's on CUDA, each call's tensors' on a CPU).
        self.explainer.memory.budget, self.tensor_limit = actor_memory(self.explainer, memory_limit, gpu_share)
        self.batch_size = batch_size

    def _factors(self, texts: list[str]) -> list[SentenceFactors]:
        self.hooks.engine_call(texts)
        return self.explainer.factors(texts, batch_size=self.batch_size)

    def _results(self, texts: list[str]) -> list[SentenceFactors | str]:
        """Each text's factors, or why it has none: a batch that fails is cut in halves and each half tried again
        (a batch that runs out of memory is halved inside the engine first: Explainer, xsbert_core.memory), so one
        bad sentence costs log2(batch) retries and fails alone, with its error as the reason its pairs are
        quarantined. An error that leaves the GPU unusable (a device-side assert, an illegal address) ends this
        process instead: Ray restarts the actor and retries the batch (--max-retries)."""
        try:
            return list(self._factors(texts))
        except Exception as exc:  # noqa: BLE001 - one bad text must not sink its batch
            reason = f"{type(exc).__name__}: {exc}"[:500]
        if device_lost(self.explainer.split.device):
            logger.error("the GPU is unusable after %s; ending this actor so that Ray restarts it", reason)
            os._exit(70)
        if len(texts) == 1:
            return [reason]
        logger.warning("factor batch of %d sentences failed (%s); retrying it in halves", len(texts), reason[:200])
        half = len(texts) // 2
        return self._results(texts[:half]) + self._results(texts[half:])

    def __call__(self, batch: pa.Table) -> pa.Table:
        batch = one_row_per_sentence(batch)
        ids = batch.column("sentence_id").to_pylist()
        texts = batch.column("text").to_pylist()
        self.hooks.before_factors(texts)
        t0 = time.perf_counter()
        ooms = self.explainer.memory.out_of_memory
        with TensorBudget(self.tensor_limit) if self.tensor_limit else contextlib.nullcontext():
            results = self._results(texts)
        rows = factor_rows(ids, texts, results, self.explainer.tolerance)
        share = (time.perf_counter() - t0) / max(1, len(texts))
        rows = rows.set_column(rows.schema.get_field_index("compute_s"), "compute_s", pa.array([share] * len(texts)))
        ooms = self.explainer.memory.out_of_memory - ooms
        rows = rows.set_column(rows.schema.get_field_index("oom_retries"), "oom_retries",
                               pa.array([ooms] + [0] * (len(texts) - 1), pa.int32()))  # fmt: skip
        for name in batch.column_names:  # the job's own columns (its `wave`) pass through
            if name not in rows.column_names:
                rows = rows.append_column(batch.schema.field(name), batch.column(name))
        return rows


# --------------------------------------------------------------------------- stage 2
def _tensor(buf: pa.Buffer | bytes, shape: tuple[int, ...]) -> torch.Tensor:
    arr = np.frombuffer(buf, dtype=np.float32).reshape(shape)
    with warnings.catch_warnings():  # a read-only, zero-copy view of the object store; never written
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


class PairCells:
    """Pairs (ord, pair_id, sentence_id_a, sentence_id_b) -> their numbers and cells.

    The numbers are Explainer.pair's (same functions, same float32 factors, float64 arithmetic):
    A = P_a^T P_b / (||e(a)|| ||e(b)||), its sums, the reference terms, target and error.
    Cells with |A_ij| < min_abs (and word cells with |W_uv| < min_abs) are left out; the sums are not. `cells`
    (CELL_CHOICES) chooses which cells are stored at all: every cell, the same-token cells (token_a = token_b;
    word cells: word_a = word_b), or none; again the sums, ranks and top cells are over every cell.
    Each cell carries its average rank among the pair's cells (value_rank: ascending, ties share their mean rank,
    over the whole matrix, before min_abs) and among the cells of two content tokens (content_rank; null when the
    row or column is a special token, one without a word id); a word cell its rank among the pair's word cells.
    Each pair carries its top-10 cells by |value| and by value (TOP_CELLS), over all, content and word cells.
    `tables(batch)` gives the cells as flat tables (one row per cell, the store's columns), built column-wise
    with numpy and one Arrow `take` per batch for the token strings; `__call__` gives PAIR_SCHEMA rows with the
    cells as lists.
    """

    def __init__(self, tables: list[pa.Table], similarity: str, min_abs: float = 0.0, cells: str = "all") -> None:
        from xsbert_core.pairs import canonical_similarity

        if cells not in CELL_CHOICES:
            raise ValueError(f"cells must be one of {', '.join(CELL_CHOICES)}, got {cells!r}")
        self.similarity = canonical_similarity(similarity)
        self.min_abs = float(min_abs)
        self.cells = cells
        self.factors = pa.concat_tables([t.select(FACTOR_SCHEMA.names) for t in tables]) if tables else None
        ids = self.factors.column("sentence_id").to_pylist() if self.factors is not None else []
        self.index = {sid: k for k, sid in enumerate(ids)}
        self._cache: dict[str, SentenceFactors | str] = {}
        self._words: dict[str, tuple[list[str], np.ndarray]] = {}
        self._content: dict[str, np.ndarray] = {}

    def sentence(self, sid: str) -> SentenceFactors | str:
        """The SentenceFactors of `sid` (zero-copy views), or its failure message."""
        if sid in self._cache:
            return self._cache[sid]
        k = self.index.get(sid)
        if k is None:
            res: SentenceFactors | str = f"no factor for sentence {sid}"
        else:
            row = {name: self.factors.column(name)[k] for name in FACTOR_SCHEMA.names}
            if row["failure"].is_valid:
                res = row["failure"].as_py()
            else:
                d, s = row["dim"].as_py(), row["n_tokens"].as_py()
                start, end = row["token_start"].as_py(), row["token_end"].as_py()
                res = SentenceFactors(
                    text=row["text"].as_py(),
                    tokens=row["tokens"].as_py(),
                    word_ids=row["word_ids"].as_py(),
                    offsets=list(zip(start, end)),
                    factor=_tensor(row["factor"].as_buffer(), (d, s)),
                    embedding=_tensor(row["embedding"].as_buffer(), (d,)),
                    reference_embedding=_tensor(row["reference_embedding"].as_buffer(), (d,)),
                    n_steps=row["n_steps"].as_py(),
                    error=row["factor_error"].as_py(),
                    truncated=row["truncated"].as_py(),
                )
        self._cache[sid] = res
        return res

    def words(self, sid: str, f: SentenceFactors) -> tuple[list[str], np.ndarray]:
        """The sentence's word texts and its averaging matrix M (U x S), once per sentence."""
        if sid not in self._words:
            ws = f.words
            self._words[sid] = ([w.text for w in ws], averaging_matrix(ws, len(f.tokens)))
        return self._words[sid]

    def content(self, sid: str, f: SentenceFactors) -> np.ndarray:
        """Which of the sentence's tokens are content tokens (have a word id; not [CLS], [SEP], <s> ...)."""
        if sid not in self._content:
            self._content[sid] = np.array([w is not None for w in f.word_ids], dtype=bool)
        return self._content[sid]

    def numbers(self, fa: SentenceFactors, fb: SentenceFactors) -> tuple[dict[str, Any], np.ndarray | None]:
        """(the pair's numbers as in Explainer.pair, A) or ({failure}, None) when A is not finite."""
        sim = self.similarity
        a_mat = pair_matrix(fa.factor, fb.factor, fa.embedding, fb.embedding, sim).cpu().numpy()
        target = completeness_target(fa.embedding, fb.embedding, fa.reference_embedding, fb.reference_embedding, sim)
        total = float(a_mat.sum())
        row: dict[str, Any] = {
            "score": similarity_score(fa.embedding, fb.embedding, sim),
            "attribution_sum": total,
            "positive_sum": float(a_mat[a_mat > 0].sum()),
            "negative_sum": float(a_mat[a_mat < 0].sum()),
            "ref_sim_a": similarity_score(fa.embedding, fb.reference_embedding, sim),
            "ref_sim_b": similarity_score(fb.embedding, fa.reference_embedding, sim),
            "ref_term": similarity_score(fa.reference_embedding, fb.reference_embedding, sim),
            "target": target,
            "completeness_error": total - target,
            "factor_error_a": fa.error,
            "factor_error_b": fb.error,
            "steps_a": fa.n_steps,
            "steps_b": fb.n_steps,
            "truncated_a": fa.truncated,
            "truncated_b": fb.truncated,
            "n_tokens_a": len(fa.tokens),
            "n_tokens_b": len(fb.tokens),
            "failure": None,
        }
        if not (np.isfinite(a_mat).all() and math.isfinite(row["score"])):
            return {"failure": "NumericalError: NaN/Inf in the pair matrix"}, None
        return row, a_mat

    def _kept(self, m: np.ndarray, names_a: list[str], names_b: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The (rows, columns) of the cells of m to store, row-major: all, or those whose row and column name the
        same token (word) when `cells` is same-token, none for none; of those, |value| >= min_abs."""
        if self.cells == "none":
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.cells == "same-token":
            keep = np.asarray(names_a, dtype=object)[:, None] == np.asarray(names_b, dtype=object)[None, :]
            if self.min_abs > 0:
                keep &= np.abs(m) >= self.min_abs
            return np.nonzero(keep)
        if self.min_abs > 0:
            return np.nonzero(np.abs(m) >= self.min_abs)
        i, j = np.indices(m.shape)
        return i.ravel(), j.ravel()

    def tables(self, batch: pa.Table) -> tuple[pa.Table, pa.Table, pa.Table]:
        """(numbers: PAIR_NUMBERS + n_cells, n_word_cells, one row per pair in batch order; cells; word_cells),
        the cell tables with the store's columns (jobs/store/ SCHEMAS), in pair then row-major order."""
        numbers: dict[str, list[Any]] = {name: [] for name in PAIR_NUMBERS if name not in TOP_CELLS}
        c_pair, c_i, c_j, c_ta, c_tb, c_val = [], [], [], [], [], []
        w_pair, w_u, w_v, w_ta, w_tb, w_val = [], [], [], [], [], []
        grids, word_grids = Grids(batch.num_rows), Grids(batch.num_rows)  # for ranks and top cells
        strings: list[str] = []  # tokens and words of the batch's pairs; cells index into it
        for k, (ord_, pid, sa, sb) in enumerate(zip(
            batch.column("ord").to_pylist(), batch.column("pair_id").to_pylist(),
            batch.column("sentence_id_a").to_pylist(), batch.column("sentence_id_b").to_pylist(),
        )):  # fmt: skip
            fa, fb = self.sentence(sa), self.sentence(sb)
            a_mat = None
            if isinstance(fa, str) or isinstance(fb, str):
                row: dict[str, Any] = {"failure": fa if isinstance(fa, str) else fb}
            else:
                row, a_mat = self.numbers(fa, fb)
            row.update(ord=ord_, pair_id=pid, n_cells=0, n_word_cells=0)
            if a_mat is not None:
                i, j = self._kept(a_mat, fa.tokens, fb.tokens)
                base = len(strings)
                strings.extend(fa.tokens)
                strings.extend(fb.tokens)
                c_pair.append(np.full(len(i), k, np.int64))
                c_i.append(i)
                c_j.append(j)
                c_ta.append(base + i)
                c_tb.append(base + len(fa.tokens) + j)
                c_val.append(a_mat[i, j])
                grids.add(k, a_mat, i, j, np.outer(self.content(sa, fa), self.content(sb, fb)))
                (na, ma), (nb, mb) = self.words(sa, fa), self.words(sb, fb)
                w_mat = ma @ a_mat @ mb.T
                u, v = self._kept(w_mat, na, nb)
                base = len(strings)
                strings.extend(na)
                strings.extend(nb)
                w_pair.append(np.full(len(u), k, np.int64))
                w_u.append(u)
                w_v.append(v)
                w_ta.append(base + u)
                w_tb.append(base + len(na) + v)
                w_val.append(w_mat[u, v])
                word_grids.add(k, w_mat, u, v)
                row.update(n_cells=len(i), n_word_cells=len(u))
            for name in numbers:
                numbers[name].append(row.get(name))
        num = pa.table(numbers, schema=pa.schema([PAIR_SCHEMA.field(n) for n in numbers]))
        for by in ("abs", "value"):
            tops = {f"top10_{by}": grids.top_cells(by), f"content_top10_{by}": grids.top_cells(by, content=True),
                    f"word_top10_{by}": word_grids.top_cells(by, names=("u", "v"))}  # fmt: skip
            for name, array in tops.items():
                num = num.append_column(PAIR_SCHEMA.field(name), array)
        text = pa.array(strings, pa.string())
        pair_ids = batch.column("pair_id").combine_chunks() if batch.num_rows else pa.array([], pa.string())

        def flat(names: tuple[str, ...], cols: list[list[np.ndarray]]) -> dict[str, pa.Array]:
            def cat(parts: list[np.ndarray], dtype) -> np.ndarray:
                return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

            return {
                "pair_id": pair_ids.take(pa.array(cat(cols[0], np.int64))),
                names[0]: pa.array(cat(cols[1], np.int32)),
                names[1]: pa.array(cat(cols[2], np.int32)),
                names[2]: text.take(pa.array(cat(cols[3], np.int64))),
                names[3]: text.take(pa.array(cat(cols[4], np.int64))),
                "value": pa.array(cat(cols[5], np.float64)),
            }  # fmt: skip

        cells = pa.table(flat(("i", "j", "token_a", "token_b"), [c_pair, c_i, c_j, c_ta, c_tb, c_val])
                         | {"value_rank": grids.ranks(), "content_rank": grids.ranks(content=True)})  # fmt: skip
        word_cells = pa.table(flat(("u", "v", "word_a", "word_b"), [w_pair, w_u, w_v, w_ta, w_tb, w_val])
                              | {"value_rank": word_grids.ranks()})  # fmt: skip
        return num, cells, word_cells

    def __call__(self, batch: pa.Table) -> pa.Table:
        """PAIR_SCHEMA rows, the cells as lists (a failed pair: its failure, no lists)."""
        num, cells, word_cells = self.tables(batch)
        return with_lists(num, cells, word_cells)


class Grids:
    """A batch's matrices, one after another (each flattened row-major), for the ranks and top cells of each pair's
    matrix in a few numpy calls per batch: `add` each pair's matrix and the cells it keeps, then read `ranks` (per
    kept cell, in the order added) and `top_cells` (a list per pair of the batch, null for a pair without one)."""

    def __init__(self, n_pairs: int) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (values, content, kept positions)
        self.start = np.zeros(n_pairs, np.int64)  # the pair's first position
        self.size = np.zeros(n_pairs, np.int64)
        self.n_cols = np.ones(n_pairs, np.int64)
        self.has = np.zeros(n_pairs, bool)
        self.total = 0
        self._flat: tuple[np.ndarray, ...] | None = None
        self._sorted: dict[bool, tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]] = {}

    def add(self, k: int, m: np.ndarray, rows: np.ndarray, cols: np.ndarray, content: np.ndarray | None = None) -> None:
        """Pair k's matrix m, the cells (rows, cols) it keeps, and which cells are content cells (default: all)."""
        mask = np.ones(m.size, bool) if content is None else content.ravel()
        self.parts.append((m.ravel(), mask, self.total + rows * m.shape[1] + cols))
        self.start[k], self.size[k], self.n_cols[k], self.has[k] = self.total, m.size, m.shape[1], True
        self.total += m.size

    def _arrays(self) -> tuple[np.ndarray, ...]:
        """(values, content mask, kept positions, the pair of each position), over the whole batch."""
        if self._flat is None:

            def cat(k: int, dtype) -> np.ndarray:
                return np.concatenate([part[k] for part in self.parts]) if self.parts else np.zeros(0, dtype)

            group = np.repeat(np.arange(len(self.size)), self.size)
            self._flat = (cat(0, np.float64), cat(1, bool), cat(2, np.int64), group)
        return self._flat

    def _bounds(self, content: bool) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
        """(positions, their pairs, grouped_rank_bounds of their values): all cells or the content cells; one sort
        each, shared by the ranks and the top cells."""
        if content not in self._sorted:
            values, mask, _, group = self._arrays()
            pos = np.flatnonzero(mask) if content else np.arange(values.size)
            self._sorted[content] = (pos, group[pos], grouped_rank_bounds(values[pos], group[pos]))
        return self._sorted[content]

    def ranks(self, content: bool = False) -> pa.Array:
        """Average rank of each kept cell among its pair's cells (content: among the content cells; null for the
        others), float32."""
        values, _, kept, _ = self._arrays()
        pos, _, (low, high, _) = self._bounds(content)
        ranks = np.full(values.size, np.nan)
        ranks[pos] = (low + high) / 2.0
        out = ranks[kept].astype(np.float32)
        return pa.array(out, mask=np.isnan(out))

    def top_cells(self, by: str, content: bool = False, names: tuple[str, str] = ("i", "j")) -> pa.Array:
        """Per pair, its TOP_K cells (of its content cells) of largest |value| (by 'abs') or value ('value'),
        largest first, ties by the smaller row then column, as structs {names[0]: row, names[1]: column}."""
        values, _, _, _ = self._arrays()
        pos, pair, bounds = self._bounds(content)
        rows, cols = np.divmod(pos - self.start[pair], self.n_cols[pair])
        return top_cell_lists(values[pos], pair, rows, cols, by, names, has=self.has, bounds=bounds)


def top_cell_lists(
    values: np.ndarray, pair: np.ndarray, rows: np.ndarray, cols: np.ndarray, by: str, names: tuple[str, str],
    has: np.ndarray, bounds: tuple[np.ndarray, ...] | None = None,
) -> pa.Array:
    """The pairs' cells (pair: 0-based pair of each cell) as one list per pair of `has` (null where has is False):
    its TOP_K cells of largest |value| (by 'abs') or value ('value'), largest first, ties by the smaller row then
    column (the cells of a pair come in row-major order), as structs {names[0]: row, names[1]: column}."""
    chosen = grouped_top_k(values, pair, TOP_K, by, bounds)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(pair[chosen], minlength=len(has)))]).astype(np.int32)
    cells = pa.StructArray.from_arrays(
        [pa.array(rows[chosen].astype(np.int32)), pa.array(cols[chosen].astype(np.int32))], names=list(names)
    )
    return pa.ListArray.from_arrays(pa.array(offsets), cells, mask=pa.array(~has))


def _lists(n_per_pair: pa.Array, ok: np.ndarray, flat: pa.Table, names: dict[str, str]) -> dict[str, pa.Array]:
    """The flat cell columns as one list per pair (null for failed pairs)."""
    counts = np.asarray(n_per_pair.to_numpy(zero_copy_only=False), dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    mask = pa.array(~ok)
    return {
        dst: pa.ListArray.from_arrays(offsets, flat.column(src).combine_chunks(), mask=mask)
        for dst, src in names.items()
    }


def with_lists(
    num: pa.Table, cells: pa.Table | None, word_cells: pa.Table | None, parts: tuple[str | None, ...] | None = None
) -> pa.Table:
    """PAIR_SCHEMA rows from `tables`' output: with the cells as lists, or (workers wrote them) the parts' names."""
    n = num.num_rows
    ok = np.asarray(num.column("failure").is_null().to_numpy(zero_copy_only=False), dtype=bool)
    cols: dict[str, Any] = {name: num.column(name) for name in num.column_names}
    if parts is None:
        cols |= _lists(num.column("n_cells"), ok, cells, CELL_LISTS)
        cols |= _lists(num.column("n_word_cells"), ok, word_cells, WORD_LISTS)
        cols.update(cells_part=pa.nulls(n, pa.string()), word_cells_part=pa.nulls(n, pa.string()))
    else:
        cols.update(cells_part=pa.array([parts[0]] * n, pa.string()),
                    word_cells_part=pa.array([parts[1]] * n, pa.string()))
        for name in (*CELL_LISTS, *WORD_LISTS):
            cols[name] = pa.nulls(n, PAIR_SCHEMA.field(name).type)
    return pa.table({name: cols[name] for name in PAIR_SCHEMA.names}, schema=PAIR_SCHEMA)


# One PairCells per worker process, for the wave whose factor blocks it was built from.
_WORKER_CACHE: dict[tuple[str, ...], PairCells] = {}


def pair_cells(
    batch: pa.Table,
    factor_refs: list,
    similarity: str,
    min_abs: float = 0.0,
    sink: Any = None,
    seq: int | None = None,
    cells: str = "all",
    hooks: Hooks | None = None,
) -> pa.Table:
    """Stage 2 as a Ray task: look the wave's factors up (read once per worker, zero-copy), then PairCells.

    With a `sink` (jobs/store/ PartSink) the task writes the batch's cells and word cells itself, as parts
    of wave `seq` named by the batch's first `ord`, and returns only the numbers and the parts' names; the
    driver commits the wave (its pairs part) once every batch has come back."""
    import ray

    if hooks is not None:
        hooks.cells_task()
    key = tuple(ref.hex() for ref in factor_refs) + (similarity, repr(min_abs), cells)
    if key not in _WORKER_CACHE:
        _WORKER_CACHE.clear()  # the previous wave's factors are released
        _WORKER_CACHE[key] = PairCells(ray.get(list(factor_refs)), similarity, min_abs, cells)
    return pair_rows(_WORKER_CACHE[key], batch, sink, seq)


def pair_rows(pair_cells_: PairCells, batch: pa.Table, sink: Any = None, seq: int | None = None) -> pa.Table:
    """PAIR_SCHEMA rows of a batch of pairs (stage 2 of one batch, in a Ray task or in the driver's process):
    with a `sink`, the batch's cells and word cells written as parts of wave `seq` (named by its first `ord`) and
    the rows naming them; without, the cells as lists."""
    num, cells, word_cells = pair_cells_.tables(batch)
    if sink is None or not getattr(sink, "here", lambda: True)():  # a node without the run folder: to the driver
        return with_lists(num, cells, word_cells)
    first = int(batch.column("ord")[0].as_py())
    parts = tuple(sink.write(t, seq, first, data) if data.num_rows else None
                  for t, data in (("cells", cells), ("word_cells", word_cells)))  # fmt: skip
    return with_lists(num, None, None, parts)
