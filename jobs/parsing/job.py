"""jobs.parse's job: the runs' sentences not parsed yet, their unique texts minus the parser cache's, parsed (on Ray
or here), then realigned to each run's tokenizer words and appended to its `parses` table."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

from xsbert_core import InputError
from xsbert_core.cli import writable_folder
from xsbert_core.models import cache_dir
from xsbert_core.syntax import ALIGNMENTS

from ..config import ParseSettings
from ..store import resolve
from .cache import CACHE_DIRNAME, ParseCache
from .choice import choose_parser
from .pool import parse_here, parse_on_ray
from .rows import realigned
from .runs import check_run, open_run, write_manifest


def parse_runs(args: ParseSettings, echo: bool = True) -> dict[str, Any]:
    """Parse every sentence of `args.runs` not parsed yet, once per text, and write each run's new `parses` rows;
    returns the summary. `echo`: say which parser was chosen and show the pool's progress."""
    t_start = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    from ..sqlrun.runs import check_run as check_run_folder

    for run in dict.fromkeys(args.runs):  # missing, a file, a store root: said as the other verbs say it
        check_run_folder(run, "--run")
    paths = list(dict.fromkeys(resolve(r) for r in args.runs))
    for path in paths:
        check_run(path)
    if args.cache:
        cache_root = Path(args.cache).expanduser()
    elif isinstance(paths[0], str):  # a run on object storage (resolve: a URI): the parser cache stays here
        cache_root = cache_dir() / "parses"
    else:
        cache_root = paths[0].parent / CACHE_DIRNAME  # type: ignore[union-attr]
    writable_folder(cache_root, f"--cache {args.cache}" if args.cache else f"the parser cache {cache_root}")
    spec = choose_parser(args.parser, args.stanza_dir, args.stanza_download)
    if echo:
        print(f"parser: {spec.name} {spec.version}, model {spec.model} ({spec.why})", flush=True)
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
    return summary
