"""Validation of the selected rows: normalised texts, labels and ids; each row either good or quarantined with its
reason (`validate`); the rows of a source streamed chunk by chunk through it (`stream_pairs`; `load_pairs` joins
them). Reading and selecting the rows: inputs.py."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from xsbert_core import InputError
from xsbert_core.errors import is_blank

from ..store import pair_keys
from .inputs import (
    BINARY_LABEL_COLUMNS,
    CHUNK_ROWS,
    KEEP_PREFIX,
    MALFORMED,
    Columns,
    Pairs,
    Source,
    iter_source,
    recognise_columns,
    resolve_source,
    sample_positions,
    select_chunks,
)

logger = logging.getLogger(__name__)


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and not value.strip()


def _as_text(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="surrogateescape")
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value if isinstance(value, str) else str(value)


def _id_part(value: Any) -> str | None:
    if _is_missing(value):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="backslashreplace")
    return str(value).strip()


# Values that are no text: a list (Parquet's list columns, JSON arrays), a mapping, an array. str() of one would be
# attributed as the text "['a', 'b']"; such a row is a malformed_row instead.
STRUCTURED = (list, tuple, dict, set, np.ndarray)


def _not_text(a: Any, b: Any) -> str | None:
    """What is wrong with a row whose text_a or text_b is a structured value, or None."""
    for side, value in (("a", a), ("b", b)):
        if isinstance(value, STRUCTURED):
            return f"text_{side} is a {type(value).__name__}, not text"
    return None


def normalise(df: pd.DataFrame, columns: Columns) -> pd.DataFrame:
    """row, pair_id (str or None), text_a, text_b, label_raw, malformed (what the reader found wrong, or None), and
    keep:<name> (str or None) per pass-through column: one row per source row."""
    rows = np.array(df["__row__"], dtype=np.int64)  # a copy: no view of the source chunk outlives it
    if columns.ids:
        parts = [[_id_part(v) for v in df[c].tolist()] for c in columns.ids]
        ids = [None if any(p is None for p in ps) else ":".join(ps) for ps in zip(*parts)]
    else:
        ids = [str(r) for r in rows]
    why = df[MALFORMED].tolist() if MALFORMED in df.columns else [None] * len(df)
    raw_a, raw_b = df[columns.text_a].tolist(), df[columns.text_b].tolist()
    # what the reader said was wrong, else a text that is no text, else None
    malformed = [w if isinstance(w, str) else _not_text(a, b) for w, a, b in zip(why, raw_a, raw_b)]
    return pd.DataFrame(
        {
            "row": pd.Series(rows, dtype=np.int64),
            "pair_id": pd.Series(ids, dtype=object),
            "text_a": pd.Series([_as_text(v) for v in raw_a], dtype=object),
            "text_b": pd.Series([_as_text(v) for v in raw_b], dtype=object),
            "label_raw": pd.Series(df[columns.label].tolist() if columns.label else [None] * len(df), dtype=object),
            "malformed": pd.Series(malformed, dtype=object),
            **{
                KEEP_PREFIX + str(c): pd.Series([safe_text(_as_text(v), 10_000) for v in df[c].tolist()], dtype=object)
                for c in columns.keep
            },
        }
    )


# --------------------------------------------------------------------------- validation
def undecodable(text: str) -> bool:
    """Not valid text: lone surrogates (from bytes that are not UTF-8, or JSON escapes), U+FFFD, NUL."""
    if "\ufffd" in text or "\x00" in text:
        return True
    try:  # strict UTF-8 refuses exactly the surrogates U+D800..U+DFFF (category Cs), in C, not a loop per character
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def parse_label(value: Any, kind: str, bounds: tuple[float, float] | None) -> tuple[float | None, str | None]:
    """(label or None, problem or None). Null or blank: no label; NaN/Inf (as text or as a float): a bad label."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, None
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", errors="replace")
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        return None, f"not a number: {str(value)[:40]!r}"
    if not math.isfinite(number):
        return None, f"not finite: {value!r}"
    if kind == "binary" and number not in (0.0, 1.0):
        return None, f"{value!r} is not 0 or 1"
    if bounds is not None and not bounds[0] <= number <= bounds[1]:
        return None, f"{value!r} is outside [{bounds[0]:g}, {bounds[1]:g}]"
    return number, None


def label_rule(columns: Columns, source: Source, label_range: tuple[float, float] | None) -> tuple[str, Any]:
    if columns.label is None:
        return "none", None
    bounds = label_range or source.label_range
    if str(columns.label).lower() in BINARY_LABEL_COLUMNS or (source.identity in ("qqp", "glue/qqp")):
        return "binary", bounds
    return ("range" if bounds else "number"), bounds


def safe_text(value: Any, limit: int = 2000) -> str | None:
    """Text that Parquet can hold: lone surrogates written as \\udcXX escapes, cut at `limit` chars."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text[:limit].encode("utf-8", errors="backslashreplace").decode("utf-8")


def sorted_find(keys: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query: its position in the sorted array `keys` (clamped to the last one) and whether it is there. A binary
    search, so a memory-mapped `keys` is read O(q log n), where np.isin would sort a copy of all of it."""
    at = np.minimum(np.searchsorted(keys, queries), max(len(keys) - 1, 0))
    return at, (np.asarray(keys[at] == queries) if len(keys) else np.zeros(len(queries), bool))


class SeenIds:
    """The pair ids validate() has passed, across the chunks of one selection: sorted 64-bit keys (pair_keys) with
    the source row of each id's first occurrence (16 bytes per pair, not a Python string per id)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, np.uint64)
        self.rows = np.zeros(0, np.int64)

    def first_rows(self, keys: np.ndarray) -> np.ndarray:
        """Per key: the source row that first had it, or -1."""
        at, hit = sorted_find(self.keys, keys)
        return np.where(hit, self.rows[at], -1) if len(self.keys) else np.full(len(keys), -1, np.int64)

    def add(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Keys not seen before (the caller checked first_rows), with their rows."""
        keys, rows = np.concatenate([self.keys, keys]), np.concatenate([self.rows, rows])
        order = np.argsort(keys, kind="stable")
        self.keys, self.rows = keys[order], rows[order]

    def __len__(self) -> int:
        return len(self.keys)


# Texts per tokenizer call in validate(): bounds the driver's memory for the tokenizer's output.
TOKENIZE_CHUNK = 8192


def validate(
    rows: pd.DataFrame,
    label_kind: str,
    label_bounds: tuple[float, float] | None,
    *,
    count: Callable[[list[str]], tuple[list[int], list[int]]] | None = None,
    max_tokens: int | None = None,
    quarantine_long: bool = False,
    max_chars: int | None = None,
    stored: np.ndarray | None = None,
    seen: SeenIds | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split normalised rows into (good, quarantine); each row lands in exactly one. Without `count`, only the checks
    that need no tokenizer run (ids, duplicates, empty or undecodable texts, labels).

    count:         (tokens, content tokens) per text from one tokenizer pass (the engine's Explainer.token_counts):
                   tokens, specials included, are n_tokens_a/_b (too_long_a/_b above max_tokens, when
                   quarantine_long); no content token is no_content_a/_b, a text the engine would reject. The texts
                   go to it in chunks of TOKENIZE_CHUNK (the tokenizer's output for a million texts at once would
                   hold gigabytes in the driver).
    stored:        the pair_keys of the pair ids already in the run's store (RunStore.done_pair_keys): their texts
                   are not tokenised again (they passed when they were computed; a rerun skips them), so n_tokens_a/_b
                   of such rows are 0. The checks that need no tokenizer (ids, duplicates, empty texts, labels) still
                   run on every row.
    seen:          the ids of the selection's earlier chunks (validate adds this chunk's): a later row with one of
                   them is a duplicate_pair_id, as within one call. None: this call's rows are the whole selection.
    max_chars:     a text longer than this (characters) is too_long_a/_b before any tokenizer sees it, whatever
                   `quarantine_long` says (--max-chars). None: no cap.

    good:       row, pair_id, text_a, text_b, label (float, NaN when none), n_tokens_a, n_tokens_b, and the
                keep:<name> pass-through columns
    quarantine: row, pair_id, reason, detail, text_a, text_b, label (the raw value as text)
    """
    reasons: list[tuple[str, str] | None] = [None] * len(rows)
    labels: list[float] = [math.nan] * len(rows)
    local: dict[str, int] = {}  # this chunk's ids -> their first source row
    keys = pair_keys(rows.pair_id.tolist()) if seen is not None or stored is not None else None
    earlier = seen.first_rows(keys) if seen is not None else None
    source_rows = rows.row.to_numpy()
    for k, r in enumerate(rows.itertuples(index=False)):
        if r.malformed:
            reasons[k] = ("malformed_row", r.malformed)
            continue
        if r.pair_id is None:
            reasons[k] = ("missing_pair_id", "the id column is empty")
            continue
        if earlier is not None and earlier[k] >= 0:
            first = int(earlier[k])
        else:
            first = int(source_rows[local[r.pair_id]]) if r.pair_id in local else -1
        if first >= 0:
            reasons[k] = ("duplicate_pair_id", f"same id as source row {first}")
            continue
        local[r.pair_id] = k
        for side, text in (("a", r.text_a), ("b", r.text_b)):
            if is_blank(text):
                reasons[k] = (f"empty_text_{side}", "empty or whitespace-only text")
                break
        if reasons[k]:
            continue
        if max_chars is not None:
            for side, text in (("a", r.text_a), ("b", r.text_b)):
                if len(text) > max_chars:
                    reasons[k] = (f"too_long_{side}", f"{len(text):,} characters > --max-chars {max_chars:,} "
                                                      "(not tokenized)")  # fmt: skip
                    break
            if reasons[k]:
                continue
        for side, text in (("a", r.text_a), ("b", r.text_b)):
            if undecodable(text):
                reasons[k] = (f"undecodable_text_{side}", "invalid UTF-8, lone surrogate, U+FFFD or NUL")
                break
        if reasons[k]:
            continue
        label, problem = parse_label(r.label_raw, label_kind, label_bounds)
        if problem:
            reasons[k] = ("bad_label", problem)
            continue
        labels[k] = math.nan if label is None else label
    if seen is not None:
        firsts = np.fromiter(local.values(), np.int64, len(local))
        seen.add(keys[firsts], source_rows[firsts])
    ok_all = [k for k, reason in enumerate(reasons) if reason is None]
    if stored is not None:
        in_store = np.isin(keys, stored)
        ok = [k for k in ok_all if not in_store[k]]  # the rows to tokenise
    else:
        ok = ok_all
    text_a, text_b = rows.text_a.tolist(), rows.text_b.tolist()  # indexed per row below: lists, not .iat
    n_a = np.zeros(len(rows), dtype=np.int64)
    n_b = np.zeros(len(rows), dtype=np.int64)
    texts = list(dict.fromkeys([text_a[k] for k in ok] + [text_b[k] for k in ok]))
    lengths: dict[str, int] = {}
    content: dict[str, int] = {}
    for start in range(0, len(texts) if count is not None else 0, TOKENIZE_CHUNK):
        chunk = texts[start : start + TOKENIZE_CHUNK]
        n_tokens, n_content = count(chunk)  # type: ignore[misc]
        lengths.update(zip(chunk, n_tokens))
        content.update(zip(chunk, n_content))
    if content:
        for k in ok:
            for side, text in (("a", text_a[k]), ("b", text_b[k])):
                if content[text] == 0:
                    reasons[k] = (f"no_content_{side}", "no token but special ones (or whitespace) after tokenization")
                    break
        ok = [k for k in ok if reasons[k] is None]
    if lengths and ok:
        for k in ok:
            n_a[k], n_b[k] = lengths[text_a[k]], lengths[text_b[k]]
            if quarantine_long and max_tokens is not None:
                for side, n in (("a", n_a[k]), ("b", n_b[k])):
                    if n > max_tokens:
                        reasons[k] = (f"too_long_{side}", f"{n} tokens > max_seq_length {max_tokens}")
                        break
    good_idx = [k for k, reason in enumerate(reasons) if reason is None]
    bad_idx = [k for k, reason in enumerate(reasons) if reason is not None]
    good = pd.DataFrame(
        {
            "row": rows.row.to_numpy()[good_idx],
            "pair_id": pd.Series(rows.pair_id.to_numpy()[good_idx], dtype=object),
            "text_a": pd.Series(rows.text_a.to_numpy()[good_idx], dtype=object),
            "text_b": pd.Series(rows.text_b.to_numpy()[good_idx], dtype=object),
            "label": np.asarray([labels[k] for k in good_idx], dtype=np.float64),
            "n_tokens_a": n_a[good_idx],
            "n_tokens_b": n_b[good_idx],
            **{c: pd.Series(rows[c].to_numpy()[good_idx], dtype=object) for c in rows.columns
               if str(c).startswith(KEEP_PREFIX)},  # fmt: skip
        }
    )
    quarantine = quarantine_frame(
        rows=rows.row.to_numpy()[bad_idx],
        pair_ids=[rows.pair_id.iat[k] for k in bad_idx],
        reasons=[reasons[k][0] for k in bad_idx],  # type: ignore[index]
        details=[reasons[k][1] for k in bad_idx],  # type: ignore[index]
        texts_a=[rows.text_a.iat[k] for k in bad_idx],
        texts_b=[rows.text_b.iat[k] for k in bad_idx],
        labels=[rows.label_raw.iat[k] for k in bad_idx],
    )
    return good, quarantine


def quarantine_frame(rows, pair_ids, reasons, details, texts_a, texts_b, labels) -> pd.DataFrame:
    """The quarantine table's rows (texts made Parquet-safe)."""
    return pd.DataFrame(
        {
            "row": pd.Series(np.asarray(rows, dtype=np.int64), dtype=np.int64),
            "pair_id": pd.Series([None if p is None else safe_text(p, 200) for p in pair_ids], dtype=object),
            "reason": pd.Series(list(reasons), dtype=object),
            "detail": pd.Series([safe_text(d, 500) for d in details], dtype=object),
            "text_a": pd.Series([safe_text(t) for t in texts_a], dtype=object),
            "text_b": pd.Series([safe_text(t) for t in texts_b], dtype=object),
            "label": pd.Series([None if v is None else safe_text(v, 100) for v in labels], dtype=object),
        }
    )


# --------------------------------------------------------------------------- everything above, in order
@dataclass
class PairStream:
    """load_pairs as a stream: the selection's Pairs (rows empty; n_source_rows grows as the chunks are read, final
    once they are) and its normalised rows in chunks of at most `chunk_rows` source rows."""

    pairs: Pairs
    chunks: Iterator[pd.DataFrame]


def stream_pairs(
    dataset: str,
    split: str | None = None,
    config: str | None = None,
    qqp: str | None = None,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    ids: str | None = None,
    label_range: tuple[float, float] | None = None,
    sample: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    keep: str | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> PairStream:
    """Resolve, read, pick columns, select rows, normalise: chunk by chunk, so that a large source is never in
    memory as a whole (--sample counts the rows in a first pass). Validation is separate (it needs the tokenizer)."""
    if sample is not None and sample < 1:
        raise InputError(f"--sample must be >= 1, got {sample}")
    if limit is not None and limit < 1:
        raise InputError(f"--limit must be >= 1, got {limit}")
    source = resolve_source(dataset, split, config, qqp)
    chunks = iter_source(source, chunk_rows)
    first = next(chunks)
    columns = recognise_columns(first, source, text_a, text_b, label, ids, keep)
    kind, bounds = label_rule(columns, source, label_range)
    positions = None
    if sample is not None:
        n = len(first) + sum(len(df) for df in chunks)
        if sample > n:  # what was asked cannot be had: said, not silently less
            split = f" ({source.split})" if source.split else ""
            logger.warning("--sample %d: %s%s has %d rows; all of them are taken", sample, source.identity, split, n)
        positions = sample_positions(n, sample, seed)
        chunks = iter_source(source, chunk_rows)
        first = next(chunks)
    pairs = Pairs(rows=normalise(first.iloc[:0], columns), columns=columns, source=source, label_kind=kind,
                  label_range=bounds, n_source_rows=0)  # fmt: skip
    held = [first]
    del first

    def every_chunk() -> Iterator[pd.DataFrame]:
        yield held.pop()  # not kept alive for the rest of the stream
        yield from chunks

    def counted(n: int) -> None:
        pairs.n_source_rows += n

    selected = (normalise(df, columns) for df in select_chunks(every_chunk(), positions, limit, counted))
    return PairStream(pairs=pairs, chunks=selected)


def load_pairs(dataset: str, **selection: Any) -> Pairs:
    """stream_pairs(dataset, **selection)'s rows in one frame (`rows`): for the selections that fit in memory
    (training, evaluation); the same arguments."""
    stream = stream_pairs(dataset, **selection)
    parts = list(stream.chunks)
    rows = pd.concat(parts, ignore_index=True) if parts else stream.pairs.rows
    return dataclasses.replace(stream.pairs, rows=rows)
