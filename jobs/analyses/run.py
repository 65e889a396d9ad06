"""Running the analyses on a run (and a second run): check each, run its SQL, summarize, write its tables and draw
its figures; then the examples, the page and report.json."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from xsbert_core import InputError
from xsbert_core.cli import writable_folder

from .. import sqlfiles, sqlrun
from ..processes import held_by, lock_file
from ..store import StoreError, disk_failure
from .base import REPORT_JSON, SERVE_URL, Analysis, Context, Finding, Section
from .examples import plot_examples
from .facts import run_facts
from .format import markdown_table, plural
from .page import write_json, write_page


def _write_tables(section: Section, df: pl.DataFrame, ctx: Context) -> None:
    csv, md = f"{section.name}.csv", f"{section.name}.md"
    with open(ctx.out / csv, "w", encoding="utf-8", newline="") as fh:
        sqlrun.write_csv(df, fh)
    lines = [f"# {section.title}", "", f"`sql/{section.name}.sql` — paper: {section.paper}.", ""]
    lines += [f"- {f.text}" + (f" (paper: {f.paper})" if f.paper else "") for f in section.findings]
    lines += ["", markdown_table(df), ""]
    (ctx.out / md).write_text("\n".join(lines), encoding="utf-8")
    section.files = [csv, md]


def run_analysis(spec: Analysis, ctx: Context) -> Section:
    """Check, run, summarize, write and plot one analysis; a skip or a failure is recorded with its reason."""
    section = Section(spec.name, spec.title, spec.paper)
    try:
        reason = spec.check(ctx) if spec.check else None
        if reason is None:
            df = sqlrun.run_file(ctx.con, sqlfiles.SQL_DIR / f"{spec.name}.sql")
            reason = spec.empty(df, ctx) if spec.empty else None
    except InputError as exc:  # a table or manifest the file reads is missing: the runner says what makes it
        reason = str(exc)
    except duckdb.Error as exc:
        section.status, section.reason = "failed", f"the query failed: {sqlrun.error_line(exc, ctx.con)}"
        return section
    if reason is not None:
        section.status, section.reason = "skipped", reason
        return section
    section.frame = ctx.results[spec.name] = df
    section.findings = spec.summarize(df, ctx)
    _write_tables(section, df, ctx)
    try:
        section.figures = spec.plot(df, ctx)
        section.key_figure = spec.key_figure if spec.key_figure in [name for name, _ in section.figures] else None
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn must not cost the other sections
        section.status, section.reason = "failed", f"its figure failed: {type(exc).__name__}: {exc}"
    return section


def run_extra_file(path: Path, ctx: Context) -> Section:
    """A sql/ file the report has no section for: its table, and a sentence with its size."""
    section = Section(path.stem, path.stem.replace("_", " ").capitalize(), "—")
    needs_run2 = "getvariable('run2')" in path.read_text(encoding="utf-8")
    if needs_run2 and ctx.run2 is None:
        section.status, section.reason = "skipped", "needs a second run: pass --run2 DIR"
        return section
    try:
        df = sqlrun.run_file(ctx.con, path)
    except InputError as exc:
        section.status, section.reason = "skipped", str(exc)
        return section
    except duckdb.Error as exc:
        section.status, section.reason = "failed", f"the query failed: {sqlrun.error_line(exc, ctx.con)}"
        return section
    section.frame = df
    section.findings = [Finding(f"sql/{path.name} returned {df.height} rows (see the table).", {"rows": df.height})]
    _write_tables(section, df, ctx)
    return section


def _prepare_out(out: str | Path, runs: list[sqlrun.Run]) -> Path:
    """Create --out (a local folder) and check it is writable and not a run directory."""
    if sqlrun.run_location(out).is_remote:
        raise InputError(f"--out {out}: the report is written to a local folder (copy it to object storage after)")
    out = Path(out)
    resolved = out.expanduser().resolve()
    for run in runs:
        if isinstance(run, Path) and resolved == run.resolve():
            raise InputError(f"--out {out} is a run directory: choose another folder for the report")
    return writable_folder(resolved, f"--out {out}", create=True)


def open_context(
    run: str | Path, run2: str | Path | None, out: str | Path, variables: dict[str, Any], note: str | None = None
) -> Context:
    """Check the runs and --out, connect (views and variables), read the runs' facts; InputError on bad input."""
    first = sqlrun.check_run(run)
    second = sqlrun.check_run(run2, "--run2") if run2 is not None else None
    folder = _prepare_out(out, [first] + ([second] if second else []))
    try:
        con = sqlrun.connect(first, second, variables)
        facts = run_facts(con, first)
        facts2 = run_facts(con, second, "_2") if second is not None else None
    except duckdb.Error as exc:  # a table that is not readable Parquet, or lacks a column every run has
        raise InputError(f"cannot read the run: {sqlrun.one_line(exc)}") from exc
    return Context(con, first, second, folder, facts, facts2, note=note)


# A report folder's lock: one report written into it at a time (two pipelines of one study, two jobs.report).
REPORT_LOCK = ".report.lock"


@contextlib.contextmanager
def writing(out: Path) -> Iterator[None]:
    """The report folder `out` held for writing: a second writer fails at once in one line rather than mix its files
    with this one's (an exclusive flock on <out>/.report.lock, released when the block ends, also by a kill); a write
    that fails (a full disk) is one line that names the file and the errno."""
    try:
        lock = lock_file(out / REPORT_LOCK)
    except OSError as exc:
        raise disk_failure(out / REPORT_LOCK, exc) from None
    if lock is None:
        raise StoreError(f"another report is being written into {out} (its lock {REPORT_LOCK} is held by "
                         f"{held_by(out / REPORT_LOCK)}): try again when it has finished, or give this one another "
                         "folder")  # fmt: skip
    try:
        yield
    except OSError as exc:  # a full or read-only disk, while writing a table, a figure or the page
        raise disk_failure(exc.filename or out, exc) from None
    finally:
        lock.close()


def clear_previous(out: Path) -> None:
    """Remove the tables and figures of an earlier report in `out` (one with report.json), so that a section
    skipped now leaves no stale files; nothing else is touched."""
    if not (out / REPORT_JSON).is_file():
        return
    from .registry import ANALYSES

    names = {spec.name for spec in ANALYSES} | {p.stem for p in sqlfiles.SQL_DIR.glob("*.sql")}
    for path in out.iterdir():
        stem = path.name.split(".")[0].split("-")[0]
        if path.is_file() and path.suffix in (".csv", ".md", ".png") and (stem in names or stem == "example"):
            path.unlink()


def write_report(
    run: str | Path, run2: str | Path | None, out: str | Path, variables: dict[str, Any], command: str,
    note: str | None = None, serve_url: str | None = SERVE_URL, study: str | None = None,
) -> tuple[Path, list[Section], list[str]]:
    """Every analysis of the registry (then every other sql/ file, then the examples) on `run` (and `run2`), into
    `out`: tables, figures, index.html, report.json; returns (out, sections, summary lines). InputError on bad
    input."""
    from .registry import ANALYSES

    sql_files = sorted(sqlfiles.SQL_DIR.glob("*.sql"))
    sqlfiles.check_analysis_vars(variables)  # --var min_cout, min_count=abc: one line now, not after the reads
    ctx = open_context(run, run2, out, variables, note)
    ctx.serve_url = None if serve_url in (None, "", "none") else serve_url.rstrip("/")
    ctx.study = study
    out, facts = ctx.out, ctx.facts

    with writing(out):
        clear_previous(out)
        sections = [run_analysis(spec, ctx) for spec in ANALYSES]
        known = {spec.name for spec in ANALYSES}
        sections += [run_extra_file(p, ctx) for p in sql_files if p.stem not in known]
        sections.append(plot_examples(ctx))
        write_page(sections, ctx, command)
        write_json(sections, ctx, command)

    summary = [(f"report: {out / 'index.html'} ({facts['n_pairs']} pairs, {facts['model']}, layer {facts['layer']}, "
               f"{facts['mode']})")]  # fmt: skip
    if not facts["n_pairs"]:
        summary.append("the run has 0 pairs: nothing to analyse")
    for s in sections:
        if s.name == "examples":
            summary.append(f"examples: {plural(len(s.figures), 'heatmap')}" if s.status == "ok"
                           else f"examples: {s.status}: {s.reason}")  # fmt: skip
        elif s.status == "ok":
            summary += [f"{s.name}: {f.text}" + (f" (paper: {f.paper})" if f.paper else "") for f in s.findings]
        else:
            summary.append(f"{s.name}: {s.status}: {s.reason}")
    return out, sections, summary
