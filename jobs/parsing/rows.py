"""A run's `parses` rows from the parser output: UD labels, relabelling, alignment to the run's words."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import polars as pl
import pyarrow as pa

from xsbert_core import InputError
from xsbert_core.syntax import ALIGNMENTS, ParsedWord, align, clearnlp_to_ud
from xsbert_core.words import words_of

from ..store import SCHEMAS
from .actor import parsed_words
from .cache import ParseCache
from .choice import ParserSpec

logger = logging.getLogger("jobs.parse")

# Sentences whose parse the UD conversion rejects are logged one by one up to this many; the rest are counted in the
# job's summary (404k QQP questions: 43 of them).
UNUSABLE_SHOWN = 3


def parse_rows(sentences: pl.DataFrame, parses: dict[str, dict[str, Any]], spec: ParserSpec,
               unusable: set[str] | None = None) -> pl.DataFrame:  # fmt: skip
    """The `parses` rows (SCHEMAS["parses"]) of these sentences: one per (sentence_id, u), sorted.

    `parses` maps sentence_id to its cache row. A text the parser failed on (or whose spaCy tree the UD
    conversion rejects) gets alignment 'none' on every word; the rejected ones are added to `unusable`, each logged
    the first time while it holds at most UNUSABLE_SHOWN.
    """
    unusable = set() if unusable is None else unusable
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMAS["parses"].names}
    for row in sentences.sort("sentence_id").iter_rows(named=True):
        sid, text = row["sentence_id"], row["text"]
        offsets = list(zip(row["token_start"], row["token_end"]))
        words = words_of(text, row["word_ids"], offsets)
        if [w.text for w in words] != list(row["words"]):
            raise InputError(f"sentence {sid}: its words do not match its tokens' offsets (a damaged sentences table)")
        cached = parses[sid]
        parsed: list[ParsedWord] | None = None
        if cached["error"] is None:
            try:
                parsed = parsed_words(cached)
                if spec.name == "spacy":
                    parsed = clearnlp_to_ud(parsed)
            except ValueError as exc:
                if sid not in unusable and len(unusable) < UNUSABLE_SHOWN:
                    logger.warning("sentence %s: unusable parse (%s); its words are flagged; more are counted in "
                                   "the summary", sid, exc)  # fmt: skip
                unusable.add(sid)
                parsed = None
        for a in align(text, words, offsets, parsed):
            cols["sentence_id"].append(sid)
            cols["u"].append(a.u)
            cols["word"].append(a.word)
            cols["upos"].append(a.upos)
            cols["deprel"].append(a.deprel)
            cols["deprel_raw"].append(a.deprel_raw)
            cols["head"].append(a.head)
            cols["aligned"].append(a.aligned)
            cols["alignment"].append(a.alignment)
    n = len(cols["u"])
    cols["parser"], cols["parser_version"], cols["parser_model"] = [spec.name] * n, [spec.version] * n, [spec.model] * n
    schema = {"u": pl.Int32, "head": pl.Int32, "aligned": pl.Boolean}
    return pl.DataFrame(cols, schema={name: schema.get(name, pl.String) for name in cols})


def realigned(frame: pl.DataFrame, cache: ParseCache, spec: ParserSpec, size: int, counts: Counter[str],
              failed: set[str], unusable: set[str] | None = None) -> Iterator[pa.Table]:  # fmt: skip
    """The `parses` rows of these sentences (parse_rows), `size` sentences at a time in sentence_id order, so that
    only one chunk's cache rows and words are in memory. Counts each alignment and the failed sentences into
    `counts` and adds the failed ids to `failed` (the unusable parses' to `unusable`) as it goes."""
    for chunk in frame.sort("sentence_id").iter_slices(size):
        ids = chunk.get_column("sentence_id").to_list()
        parses = cache.lookup(dict(zip(ids, chunk.get_column("text").to_list())))
        if len(parses) < len(ids):
            raise RuntimeError(f"{len(ids) - len(parses)} parsed texts are missing from the cache {cache.path} "
                               "(removed while this job ran?); the same command parses them again")  # fmt: skip
        bad = [sid for sid in ids if parses[sid]["error"] is not None]
        failed.update(bad)
        rows = parse_rows(chunk, parses, spec, unusable)
        counts.update(alignment_counts(rows) | {"failed_sentences": len(bad)})
        yield rows.to_arrow()


def alignment_counts(frame: pl.DataFrame) -> dict[str, int]:
    counts = dict(Counter(frame.get_column("alignment").to_list())) if frame.height else {}
    return {kind: int(counts.get(kind, 0)) for kind in ALIGNMENTS}
