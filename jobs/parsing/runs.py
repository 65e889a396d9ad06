"""The runs jobs.parse writes into: each opened (and locked) with its sentences and what is parsed already, and its
manifest's "parses" entry written after new parses land."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from xsbert_core import InputError

from ..store import RunStore, run_at
from .cache import ParseCache
from .choice import ParserSpec
from .rows import alignment_counts

REQUIRED_SENTENCE_COLUMNS = ("sentence_id", "text", "word_ids", "token_start", "token_end", "words")


@dataclass
class Run:
    """One run directory: its store (locked while the job works), its sentences and parses so far."""

    path: Path
    store: RunStore
    sentences: pl.DataFrame
    parsed_ids: pl.Series  # unique sentence ids with parses (strings in Arrow buffers, not one object per id)
    parsers: set[tuple[str, str, str]]
    has_parses: bool


def check_run(path: Path | str) -> None:
    """A clear error unless `path` is a run with a readable sentences table and, when it has one, a readable
    manifest (the job adds its "parses" entry to it after parsing: said before anything is parsed)."""
    store = run_at(path)
    store.require("sentences", REQUIRED_SENTENCE_COLUMNS)
    store.read_manifest()


def open_run(path: Path | str, stack: contextlib.ExitStack) -> Run:
    store = run_at(path)
    try:
        stack.enter_context(store)
    except RuntimeError as exc:  # the writer lock is held (jobs.attribute or another jobs.parse)
        raise InputError(str(exc)) from exc
    table = store.read_table("sentences", list(REQUIRED_SENTENCE_COLUMNS))
    if table is None:  # its only parts belonged to a commit cut short, which opening the store removed
        raise InputError(f"{path} has no committed sentences: rerun jobs.attribute on it first")
    sentences: pl.DataFrame = pl.from_arrow(table)  # type: ignore[assignment]
    sentences = sentences.unique(subset="sentence_id", keep="first", maintain_order=True)
    done = store.read_table("parses", ["sentence_id", "parser", "parser_version", "parser_model"])
    parsed_ids = pl.Series("sentence_id", [], dtype=pl.String)
    parsers: set[tuple[str, str, str]] = set()
    if done is not None and done.num_rows:  # one row per word: kept out of Python objects
        frame: pl.DataFrame = pl.from_arrow(done)  # type: ignore[assignment]
        parsed_ids = frame.get_column("sentence_id").unique()
        parsers = set(frame.select("parser", "parser_version", "parser_model").unique().iter_rows())
    return Run(path, store, sentences, parsed_ids, parsers, bool(store.parts("parses")))


def write_manifest(run: Run, spec: ParserSpec, cache: ParseCache, info: dict[str, Any], started_at: str,
                   wall: float) -> None:  # fmt: skip
    """manifest.json "parses": the parser, the table's totals, and one entry per invocation that wrote."""
    manifest = run.store.read_manifest() or {"run_id": run.store.run_id}
    table = run.store.read_table("parses", ["alignment"])
    frame = (
        pl.from_arrow(table) if table is not None else pl.DataFrame({"alignment": []}, schema={"alignment": pl.String})
    )
    counts = alignment_counts(frame)  # type: ignore[arg-type]
    entry = manifest.get("parses") or {"runs": []}
    entry.update(
        parser=spec.name, parser_version=spec.version, parser_model=spec.model, cache=str(cache.path),
        path="parses/*.parquet", parts=len(run.store.parts("parses")), rows=sum(counts.values()),
        alignment=counts, updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )  # fmt: skip
    entry["runs"].append({"started_at": started_at, "wall_s": wall, **{k: info[k] for k in (
        "sentences", "rows", "aligned", "alignment", "failed_sentences")}})  # fmt: skip
    manifest["parses"] = entry
    run.store.write_manifest(manifest)
