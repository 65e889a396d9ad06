"""The study's index page (jobs/templates/study.html): first a grid of each report's key figures, then a table of
the headline numbers beside the paper's (like for like) or the settings that differ, then the findings of each
report, grouped by analysis in collapsible parts, each linking to the pairs behind it.

The page is made from each report's report.json (jobs.analyses.page.write_json), so a report that is up to date
and not rewritten is shown the same as a fresh one. The links to the pairs go to `xsbert serve` when one answers
for that run at --serve-url as the page is written, else to the analysis on the run's own page."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from .. import paper
from ..pages import environment
from .facts import layer_label

# How long the page's writer waits for an `xsbert serve` at the serve URL (nothing listening answers at once).
SERVE_PROBE_S = 1.0
# The run ids a page of `xsbert serve` names (jobs/templates/serve_base.html).
_SERVE_RUN = re.compile(r"<meta name='xsbert-(run2?)' content='([^']*)'>")


@dataclass
class StudyReport:
    """One report of the study: its name (= its folder under the report root), the runs it reads, its report.json
    (None when it cannot be read) and whether the paper's numbers may go beside it (the run's model is the
    paper's); `findings` are the pipeline's lines for it, used when report.json is missing."""

    name: str
    runs: str
    doc: dict[str, Any] | None
    paper_ok: bool
    findings: list[dict[str, Any]] = field(default_factory=list)


def serving(serve_url: str | None, timeout: float = SERVE_PROBE_S) -> dict[str, str]:
    """The run ids an `xsbert serve` at `serve_url` shows ({'run': id, 'run2': id}); {} when none answers."""
    if not serve_url:
        return {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to it, never through a proxy
    try:
        with opener.open(f"{serve_url.rstrip('/')}/pairs?size=1", timeout=timeout) as answer:
            page = answer.read(65536).decode("utf-8", "replace")
    except (OSError, ValueError, urllib.error.URLError):
        return {}
    return dict(_SERVE_RUN.findall(page))


def _serves(served: dict[str, str], doc: dict[str, Any]) -> bool:
    """Whether the `xsbert serve` that shows `served` shows the runs of the report `doc`."""
    run = (doc.get("run") or {}).get("run_id")
    run2 = (doc.get("run2") or {}).get("run_id")
    return bool(run) and served.get("run") == run and (run2 is None or served.get("run2") == run2)


def _describe(doc: dict[str, Any] | None) -> str:
    """'all-MiniLM-L6-v2 · stsb test · layer 3 of 6 · approx · 30 pairs' (and the second run's)."""
    if not doc:
        return ""
    out = []
    for facts in (doc.get("run"), doc.get("run2")):
        if facts:
            data = " ".join(str(x) for x in (facts.get("dataset"), facts.get("split")) if x)
            model = str(facts.get("model") or "").rstrip("/").split("/")[-1]
            out.append(f"{model} · {data} · layer {layer_label(facts)} · {facts.get('mode')} · "
                       f"{facts.get('n_pairs', 0):,} pairs")  # fmt: skip
    return " vs ".join(out)


def _paper_cell(finding: dict[str, Any], paper_ok: bool) -> dict[str, Any]:
    """What the headline table says in the paper's column: its number where like for like, else the settings
    that differ (or that the paper gives no such number)."""
    key = finding.get("paper_key")
    if not key:
        return {"kind": "none", "text": "no such number in the paper"}
    value = paper.BY_KEY.get(key)
    if value is None:
        return {"kind": "none", "text": "no such number in the paper"}
    if finding.get("like_for_like") and paper_ok:
        return {"kind": "same", "text": value.text, "where": value.figure}
    differs = finding.get("differs") or ([] if paper_ok else [f"model: the paper's is {paper.MODEL}"])
    return {"kind": "differs", "where": value.figure, "text": "; ".join(differs) or "not like for like"}


def _finding_text(finding: dict[str, Any], paper_ok: bool) -> str:
    """The finding's sentence, with the paper's number beside it only like for like."""
    beside = finding.get("paper") if paper_ok and finding.get("like_for_like") else None
    return finding["text"] + (f" (paper: {beside})" if beside else "")


def study_context(study: str, reports: list[StudyReport], serve_url: str | None) -> dict[str, Any]:
    """The template's context: per report its figures, headline rows and findings grouped by analysis."""
    served = serving(serve_url)
    items, rows = [], []
    for r in reports:
        href = f"{r.name}/index.html"
        doc = r.doc or {}
        live = bool(served) and _serves(served, doc)
        figures, groups = [], []
        for s in doc.get("sections", []):
            anchor = f"{href}#{s['name']}"
            if s.get("status") == "ok" and s.get("key_figure"):
                names = s.get("figures") or []
                captions = s.get("captions") or []
                k = names.index(s["key_figure"]) if s["key_figure"] in names else -1
                figures.append({"src": f"{r.name}/{s['key_figure']}", "href": anchor, "title": s["title"],
                                "paper": s.get("paper"), "caption": captions[k] if 0 <= k < len(captions) else ""})
            if s["name"] == "examples" or s.get("status") == "skipped":
                continue
            pairs = (f"{serve_url.rstrip('/')}{s['serve_page']}" if live and serve_url and s.get("serve_page")
                     else anchor)  # fmt: skip
            groups.append({"name": s["name"], "title": s["title"], "paper": s.get("paper"), "status": s["status"],
                           "reason": s.get("reason"), "anchor": anchor, "pairs": pairs,
                           "live": live and pairs != anchor,
                           "findings": [_finding_text(f, r.paper_ok) for f in s.get("findings", [])]})  # fmt: skip
            for f in s.get("findings", []) if s["status"] == "ok" else []:
                if f.get("headline"):
                    rows.append({"report": r.name, "href": href, "section": s["title"], "anchor": anchor,
                                 "figure": s.get("paper"), "what": f["headline"]["what"],
                                 "ours": f["headline"]["ours"], "paper": _paper_cell(f, r.paper_ok)})  # fmt: skip
        if r.doc is None:  # no report.json: the pipeline's lines, ungrouped
            groups.append({"name": "findings", "title": "Findings", "paper": None, "status": "ok", "reason": None,
                           "anchor": href, "pairs": href, "live": False,
                           "findings": [_finding_text(f, r.paper_ok) for f in r.findings]})  # fmt: skip
        figures.sort(key=lambda f: not f["src"].endswith("/example-1.png"))  # the typical pair's heatmap first
        items.append({"name": r.name, "href": href, "runs": r.runs, "about": _describe(r.doc), "figures": figures,
                      "groups": groups, "live": live})  # fmt: skip
    return {"study": study, "reports": items, "rows": rows, "serve_url": serve_url, "served": served,
            "compared": any((r.doc or {}).get("run2") for r in reports),
            "paper_model": paper.MODEL}  # fmt: skip


def study_page(study: str, reports: list[StudyReport], serve_url: str | None) -> str:
    """The study's index.html (autoescaped: findings quote dataset sentences)."""
    return environment().get_template("study.html").render(**study_context(study, reports, serve_url))
