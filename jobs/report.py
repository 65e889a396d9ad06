"""A run's answers in one folder: every applicable analysis of sql/, its tables, figures and findings.

    python -m jobs.report --run runs/<id> --out reports/<id>
    python -m jobs.report --run runs/<exact> --run2 runs/<approx> --out reports/x --var min_count=10

For each analysis of sql/ (docs/ANALYSES.md) the report decides from the data whether it applies (pairs at
all, gold labels, an approximate run, a `parses` table, pairs that differ by a standalone *not*, adjective
triplets, a second run with the same tokenizer and shared pairs), runs it through jobs.sqlrun, writes
`<name>.csv` and `<name>.md`, draws its figures (xsbert_core.plots) and states each finding in one plain
sentence, beside the paper's number where jobs/paper.py has one. An analysis that does not apply is skipped
with the reason. Then a few example heatmaps of real pairs, `index.html` (self-contained: relative links,
inline CSS, no script), `report.json` (the same findings with their numbers) and a short summary on stdout.
No Ray: DuckDB over the run's Parquet and matplotlib. The analyses themselves live in jobs/analyses/ (one module
per sql/ file, the registry this verb walks).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from xsbert_core.errors import CommandParser, command_name, exit_status
from xsbert_core.settings import add_arguments

from . import sqlrun
from .analyses import write_report
from .config import SERVE_URL, ReportSettings

PROG = "python -m jobs.report"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(
        prog=PROG,
        description="Run every applicable analysis of sql/ on a run (and a second run), write CSV, Markdown, "
        "figures and index.html into --out, and print the findings.",
    )
    add_arguments(p, ReportSettings)  # one flag per field (jobs/config.py)
    return p.parse_args(argv)


def main(job: ReportSettings | argparse.Namespace) -> dict[str, Any]:
    """Write the report; returns {'out', 'sections': [Section], 'summary': [lines]}."""
    if isinstance(job, argparse.Namespace):
        job = ReportSettings.from_args(job, command=None)
    command = job.command or f"{PROG} " + shlex.join(job.flags())
    if job.note:  # the note is on the page already: the command names it
        command = command.replace(shlex.quote(job.note), "'(the note above)'").replace(job.note, "(the note above)")
    out, sections, summary = write_report(job.run, job.run2, job.out, sqlrun.parse_vars(list(job.vars)), command,
                                          note=job.note, serve_url=job.serve_url or SERVE_URL,
                                          study=job.study)  # fmt: skip
    if not job.quiet:
        print("\n".join(summary), flush=True)
    return {"out": out, "sections": sections, "summary": summary}


def cli(argv: list[str] | None = None) -> int:
    """Exit 0 when the report is written (skips included), 1 when an analysis failed, 2 on bad input."""
    args = parse_args(argv)
    command = f"{PROG} " + shlex.join(sys.argv[1:] if argv is None else argv)
    name = command_name(PROG)

    def report() -> int:
        failed = [s for s in main(ReportSettings.from_args(args, command))["sections"] if s.status == "failed"]
        for s in failed:
            print(f"{name}: {s.name} failed: {s.reason}", file=sys.stderr)
        return 1 if failed else 0

    return exit_status(name, report, interrupted="the report in --out may be incomplete; the same command writes "
                                                 "it again")  # fmt: skip


if __name__ == "__main__":
    sys.exit(cli())
