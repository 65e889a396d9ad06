"""The study's index page (jobs/analyses/study.py, written by jobs.pipeline): the key figures of each report first,
then the headline numbers beside the paper's (like for like) or the settings that differ, then the findings grouped
by analysis in collapsible parts, each linking to its pairs in `xsbert serve` when one serves that run, else to the
run's page; and in headless Chromium every figure loads.

The reports are jobs.report's over small hand-built stores (tests/test_serve.py's, no Ray): the page is checked
against their report.json."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from browser import Chromium, find_chromium
from test_pipeline import base_config, write_config
from test_serve import Served, make_store

from jobs import paper, pipeline, report
from jobs.analyses.study import StudyReport, _paper_cell, serving, study_page
from jobs.study import state as study_state

# A port nothing listens on: no `xsbert serve` answers there.
NO_SERVE = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict[str, Any]:
    """Two runs of 12 pairs, a report of the first (`n2`) and of the two (`n2-vs-n3`), written where a study
    config's report root is, and the config."""
    root = tmp_path_factory.mktemp("study")
    run, _ = make_store(root / "runs", "run", n_pairs=12, seed=1)
    run2, _ = make_store(root / "runs", "run2", n_pairs=12, seed=2, scale=0.5)
    reports = root / "reports"
    for name, args in (("n2", ["--run", str(run)]), ("n2-vs-n3", ["--run", str(run), "--run2", str(run2)])):
        assert report.cli([*args, "--out", str(reports / name), "--var", "min_count=2", "-q"]) == 0
    config = base_config(root)
    config["report"] = {"out": str(reports), "serve_url": NO_SERVE}
    docs = {n: json.loads((reports / n / "report.json").read_text(encoding="utf-8")) for n in ("n2", "n2-vs-n3")}
    return {"root": root, "run": run, "run2": run2, "reports": reports, "docs": docs,
            "study": pipeline.load_config(write_config(root / "study.yaml", config))}  # fmt: skip


def write_index(study: dict[str, Any]) -> str:
    """jobs.pipeline's index over the two reports; the page's text."""
    items = [{"name": n, "run": str(study["run"]), "run2": str(study["run2"]) if n != "n2" else None, "findings": []}
             for n in ("n2", "n2-vs-n3")]  # fmt: skip
    models = {n: "sentence-transformers/all-MiniLM-L6-v2" for n in ("n2", "n2-vs-n3")}
    where = pipeline.write_index(study_state.Reports(str(study["reports"])), study["study"], items, models)
    assert where == f"{study['reports']}/index.html"
    return (study["reports"] / "index.html").read_text(encoding="utf-8")


def test_figures_first_then_the_headline_table_then_the_findings(study):
    page = write_index(study)
    figures, table, findings = (page.index(f"<h2 id='{x}'>") for x in ("figures", "headline", "findings"))
    assert figures < table < findings
    grid = page[figures:table]
    for name, doc in study["docs"].items():
        key = [s for s in doc["sections"] if s["status"] == "ok" and s.get("key_figure")]
        assert {s["name"] for s in key} >= {"examples", "table1", "pos_neg_sums"}
        shown = re.findall(rf"<img src='{re.escape(name)}/([^']+)'", grid)
        assert sorted(shown) == sorted(s["key_figure"] for s in key)  # one key figure per analysis that has one
        assert shown[0] == "example-1.png"  # the typical pair's heatmap first
        assert all((study["reports"] / name / f).is_file() for f in shown)
        assert f"<a href='{name}/index.html#table1'>" in grid  # each figure opens its analysis on the run's page
    examples = next(s for s in study["docs"]["n2"]["sections"] if s["name"] == "examples")
    assert examples["findings"][0]["text"].startswith("Example 1 (a typical pair (the median score))")


def test_the_headline_table_has_each_analysis_number_and_the_paper_like_for_like_only(study):
    page = write_index(study)
    table = page[page.index("<h2 id='headline'>"):page.index("<h2 id='findings'>")]
    rows = re.findall(r"<tr><td><a href='([^/]+)/index.html'>.*?</tr>", table, re.DOTALL)
    want = [(n, f) for n, doc in study["docs"].items() for s in doc["sections"] if s["status"] == "ok"
            for f in s["findings"] if f.get("headline")]  # fmt: skip
    assert rows == [n for n, _ in want] and len(rows) >= 8
    for (name, f), row in zip(want, re.findall(r"<tr><td><a href='[^']+'>.*?</tr>", table, re.DOTALL)):
        assert f"<td class='ours'>{_html(f['headline']['ours'])}</td>" in row
        if f.get("paper_key"):  # the hand-built model is not the paper's: the settings that differ, no number
            assert "paper-differs" in row and "not like for like" in row and _html(f["differs"][0]) in row
            assert f"<b>{paper.get(f['paper_key']).text}</b>" not in row
        else:
            assert "no such number in the paper" in row
    assert "Spearman × 100 of the scores against the gold labels" in table
    # like for like, with the paper's model: its number, bold
    table1 = paper.get("table1_shelf")
    same = _paper_cell({"paper_key": "table1_shelf", "like_for_like": True, "differs": []}, True)
    assert same == {"kind": "same", "text": table1.text, "where": table1.figure}
    assert _paper_cell({"paper_key": "table1_shelf", "like_for_like": True, "differs": []}, False)["kind"] == "differs"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#39;").replace(
        '"', "&#34;")  # fmt: skip


def test_findings_are_grouped_collapsible_and_link_the_pairs_on_the_run_page(study):
    page = write_index(study)
    part = page[page.index("<h2 id='findings'>"):]
    for name, doc in study["docs"].items():
        for s in doc["sections"]:
            if s["name"] == "examples" or s["status"] == "skipped":
                assert f"id='findings-{name}-{s['name']}'" not in part
                continue
            block = part.split(f"id='findings-{name}-{s['name']}'>", 1)[1].split("</details>", 1)[0]
            assert [unescape(x) for x in re.findall(r"<li>(.*?)</li>", block)] == [f["text"] for f in s["findings"]]
            # no xsbert serve answers: the analysis on the run's page
            assert f"<a class='run-page' href='{name}/index.html#{s['name']}'>The pairs behind it</a>" in block
    assert "<details open" not in part  # collapsed until opened


def test_with_xsbert_serve_running_the_findings_link_its_pages(study):
    served = Served(study["run"])  # serves the first run alone: the n2 report's, not the comparison's
    try:
        assert serving(served.url) == {"run": "run"}
        assert serving(NO_SERVE) == {}
        items = [StudyReport(n, n, d, False) for n, d in study["docs"].items()]
        page = study_page("tiny", items, served.url)
    finally:
        served.close()
    one = page.split("id='findings-n2'", 1)[1].split("</section>", 1)[0]
    both = page.split("id='findings-n2-vs-n3'", 1)[1].split("</section>", 1)[0]
    assert f"<a class='serve' href='{served.url}/pairs?sort=score&amp;run=run'>The pairs behind it</a>" in one
    assert "class='run-page'" not in one.split("id='findings-n2-table1'", 1)[1].split("</details>", 1)[0]
    assert "class='serve'" not in both  # run2 is not what it serves


@pytest.mark.skipif(find_chromium() is None,
                    reason="no chromium binary: Debian's `chromium` package (.ci/run installs it)")
def test_in_chromium_every_figure_of_the_study_page_loads(study):
    write_index(study)
    want = sum(1 for doc in study["docs"].values() for s in doc["sections"]
               if s["status"] == "ok" and s.get("key_figure"))  # fmt: skip
    with Chromium(1280, 1000) as browser:
        browser.goto((study["reports"] / "index.html").as_uri())
        images = browser.wait_for("""(() => { const i = [...document.querySelectorAll('#figures ~ section img')];
            i.forEach(x => x.loading = 'eager');
            return i.every(x => x.complete) && i.map(x => [x.getAttribute('src'), x.naturalWidth, x.naturalHeight]);
        })()""")  # fmt: skip
        assert len(images) == want
        assert all(w > 100 and h > 100 for _, w, h in images), images  # decoded PNGs, not broken-image icons
        # a group opens when its summary is clicked, and its link goes to a page that exists
        browser.eval("document.querySelector('#findings-n2-table1 summary').click()")
        assert browser.eval("document.querySelector('#findings-n2-table1').open")
        href = browser.eval("document.querySelector('#findings-n2-table1 a.run-page').href")
        assert href.startswith("file://") and Path(href[7:].split("#")[0]).is_file()


def test_a_long_note_under_a_figure_is_wrapped_not_widening_it(tmp_path):
    """The key figures sit in a grid: a note under the axes (the relation-pair chart's paper claim) is wrapped, so the
    figure stays about as wide as its axes rather than as its longest sentence."""
    import numpy as np
    from PIL import Image

    from xsbert_core.plots import plot_ranked_bars

    note = "734 top cells, spacy parses. " + "The paper says the same-function pairs are the most frequent. " * 5
    for name, text in (("short", None), ("long", note)):
        plot_ranked_bars(["nsubj", "obj", "root"], np.array([4.0, 2.0, 1.0]), tmp_path / f"{name}.png", "Relations",
                         "share (%)", note=text)  # fmt: skip
    short, long = (Image.open(tmp_path / f"{n}.png").size for n in ("short", "long"))
    assert long[0] <= short[0] * 1.15 and long[1] > short[1]  # as wide, taller
