"""The report's index.html (jobs/templates/report.html) and report.json."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import time
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np

from ..pages import environment
from .base import REPORT_JSON, Context, Section
from .facts import coverage_label
from .format import pct

# Rows of each result shown on the page (the CSV and Markdown files have all of them).
PREVIEW_ROWS = 10


def serve_link(page: str, run_id: str) -> str:
    """An `xsbert serve` page (path and query) for the run `run_id`: the link names its run (`run=<id>`), and a server
    that serves another run answers it with a 404 that says so (jobs.browse.pages.check_run), never with its own
    run's pairs."""
    return f"{page}{'&' if '?' in page else '?'}{urllib.parse.urlencode({'run': run_id})}"


def serve_pages(run_id: str) -> dict[str, str]:
    """The `xsbert serve` page of each analysis that names one, for the run `run_id`: the page links its section
    there."""
    from .registry import ANALYSES

    return {a.name: serve_link(a.serve_page, run_id) for a in ANALYSES if a.serve_page}


def _settings_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    layer = facts["layer"] if facts["n_layers"] is None else f"{facts['layer']} of {facts['n_layers']}"
    rows = [
        ("run", f"{facts['run_id']} ({facts['path']})"),
        ("model", str(facts["model"])),
        ("layer", str(layer)),
        ("mode / similarity", f"{facts['mode']} / {facts['similarity']}"),
        ("N (quadrature)", f"{facts['steps']} ({facts['rule']})"),
        ("dataset", " ".join(str(x) for x in (facts["dataset"], facts["split"]) if x)),
        ("pairs", f"{facts['n_pairs']:,} ({facts['n_labelled']:,} labelled; {facts['n_quarantined']:,} quarantined)"),
        ("sentences / cells / word cells", (f"{facts['n_sentences']:,} / {facts['n_cells']:,} / "
                                           f"{facts['n_word_cells']:,}")),
        ("mean |completeness error|", "n/a" if facts["mean_abs_completeness_error"] is None
         else f"{facts['mean_abs_completeness_error']:.2e} (max {facts['max_abs_completeness_error']:.2e})"),
    ]  # fmt: skip
    if facts["min_abs"]:
        rows.append(("cells stored", f"|value| ≥ {facts['min_abs']} (--min-abs)"))
    parses = facts["parses"]
    rows.append(("parses", "none (python -m jobs.parse --run DIR)" if parses is None else
                 f"{parses['parsers']}: {parses['rows']:,} words, {pct(parses['aligned_share'])} aligned one-to-one"))
    return rows


def write_page(sections: list[Section], ctx: Context, command: str) -> Path:
    """index.html from jobs/templates/report.html: commands, settings, the findings, then one part per section."""
    facts = [("run", ctx.facts)] + ([("run2", ctx.facts2)] if ctx.facts2 else [])
    tables = [dict(_settings_rows(f)) for _, f in facts]
    keys = list(dict.fromkeys(k for t in tables for k in t))
    page = environment().get_template("report.html").render(
        run=ctx.facts, note=ctx.note, made=time.strftime("%Y-%m-%d %H:%M"),
        coverage=[(n, coverage_label(f)) for n, f in facts],
        commands=[c for _, f in facts for c in f["commands"]] + [command],
        run_names=[n for n, _ in facts], settings=[(k, [t.get(k, "") for t in tables]) for k in keys],
        sections=sections, preview_rows=PREVIEW_ROWS, serve_url=ctx.serve_url, study=ctx.study,
        serve_pages=serve_pages(ctx.facts["run_id"]),
        serve_command=shlex.join(["xsbert", "serve", "--run", str(ctx.run)]
                                 + (["--run2", str(ctx.run2)] if ctx.run2 is not None else [])),
    )  # fmt: skip
    path = ctx.out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.integer, np.floating)):
        return _jsonable(value.item())
    return value


def write_json(sections: list[Section], ctx: Context, command: str) -> Path:
    """report.json: the runs' facts and every section's status, reason, findings (with numbers, headline and the
    paper's value), files and figures (the study page's is `key_figure`), and its `xsbert serve` page."""
    pages = {**serve_pages(ctx.facts["run_id"]), "examples": serve_link("/pairs", ctx.facts["run_id"])}
    doc = {
        "command": command, "run": ctx.facts, "run2": ctx.facts2,
        "sections": [{"name": s.name, "title": s.title, "paper": s.paper, "status": s.status, "reason": s.reason,
                      "findings": [{"text": f.text, "paper": f.paper, "like_for_like": f.like_for_like,
                                    "paper_key": f.paper_key, "differs": f.differs,
                                    "headline": dataclasses.asdict(f.headline) if f.headline else None,
                                    "values": {k: _jsonable(v) for k, v in f.values.items()}} for f in s.findings],
                      "files": s.files, "figures": [name for name, _ in s.figures],
                      "captions": [caption for _, caption in s.figures], "key_figure": s.key_figure,
                      "serve_page": pages.get(s.name)} for s in sections],
    }  # fmt: skip
    path = ctx.out / REPORT_JSON
    path.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    return path
