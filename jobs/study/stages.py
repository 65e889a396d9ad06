"""The study's stages, train -> attribute -> parse -> report, each skipped where its output is up to date (state.py);
then the study page (write_index) and the findings, one line each."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from typing import Any

from xsbert_core import InputError
from xsbert_core.training import TrainProgress

from .. import config, paper
from ..attribution.hooks import Hooks
from ..store import MANIFEST, Location, disk_failure, selections, short_hash
from ..store.files import read_text
from .schema import Study, job_settings
from .state import Reports, State, code_state, run_state, unparsed


def say(line: str) -> None:
    print(line, flush=True)


def stage_train(study: Study, on_progress: Callable[[str, TrainProgress], bool | None] | None = None,
                poll_s: float = 30.0) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every model the config declares with `train:`, trained once per model id (jobs/training/study.py); {model name:
    {"path", "model_id", "trained", "record", ...}}. Meanwhile every `poll_s`, each running training's progress:
    `on_progress(names, TrainProgress)`, by default a line `train NAME: step S/N (epoch E), T s, ~L s left`."""
    from ..training.study import ensure_trained

    specs = study.trained()
    if not specs:
        return {}
    return ensure_trained(specs, study.models_dir, executor=study.ray.executor or "ray",
                          per_gpu=study.trainings_per_gpu, address=study.ray.address, say=say,
                          on_progress=on_progress, poll_s=poll_s)  # fmt: skip


def stage_attribute(study: Study, paths: dict[str, str] | None = None, names: list[str] | None = None,
                    on_run: Any = None, hooks: Hooks | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every run of the study (or those of `names`, in that order) through jobs.attribute's stages; {run name: its
    summary}. `paths`: the trained models' folders (stage_train's); `on_run(name, summary)` after each run; `hooks`:
    faults to inject (tests only, jobs/attribution/hooks.py)."""
    from ..attribution.prepare import prepare
    from ..attribution.run import attribute

    summaries = {}
    for name in names if names is not None else study.runs:
        job = job_settings(study, name, paths)
        t0 = time.perf_counter()
        try:
            prep = prepare(job)
        except InputError as exc:  # which run of the study, and its settings' key: the message alone names neither
            raise InputError(f"runs.{name}: {exc}") from None
        s = attribute(prep, on_wave=lambda wave, n=name: say(f"attribute {n}: {wave}"), hooks=hooks)
        s["command"] = "python -m jobs.attribute " + shlex.join(job.command())
        summaries[name] = s
        counts = f"{s['n_in']} pairs = {s['n_done']} done + {s['n_quarantined']} quarantined"
        if s.get("mean_abs_completeness_error") is not None:
            counts += f", |completeness err| mean {s['mean_abs_completeness_error']:.1e}"
        if s["computed_pairs"] == 0 and s["wrote_files"] == 0:
            say(f"attribute {name}: up to date ({counts}; run {s['run_id']})")
        else:
            say(f"attribute {name}: computed {s['computed_pairs']} pairs in {time.perf_counter() - t0:.0f} s "
                f"({counts}; run {s['run_id']})")  # fmt: skip
        if s.get("advice"):
            say(f"attribute {name}: warning: {s['advice']}")
        if note := union_note(s["run_dir"], s["n_done"]):
            say(f"attribute {name}: note: {note}")
        if on_run is not None:
            on_run(name, s)
    return summaries


def union_note(run_dir: str, n_done: int) -> str | None:
    """When the run folder holds more pairs than this selection of rows attributed (`n_done`), from several selections
    (a run's id hashes what its attributions depend on, not --sample, --seed or --limit: docs/STORE.md), that its
    report covers them all, beside the counts of this selection alone; else None."""
    try:
        text = read_text(Location.parse(run_dir).join(MANIFEST))
        manifest = json.loads(text) if text else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # the report says what is wrong with the manifest
    found = selections(manifest) if isinstance(manifest, dict) else []
    if len(found) < 2:
        return None
    rows = ((manifest.get("tables") or {}).get("pairs") or {}).get("rows")
    if not isinstance(rows, int) or rows <= n_done:
        return None
    held = f" ({rows:,} pairs)"
    return (f"the run folder holds the pairs of {len(found)} selections of rows{held}, and its report covers them all "
            "(a new folder for this selection alone: another `out`)")


def stage_parse(study: Study, run_dirs: dict[str, str]) -> dict[str, Any] | None:
    """jobs.parse over the runs that have unparsed sentences (all of them in one call: one parse per text). With the
    stage off, nothing of jobs.parse is imported (a machine without its packages runs the other stages)."""
    if not study.parse.enabled:
        say("parse: off in the config")
        return None
    todo = {name: n for name, d in run_dirs.items() if (n := unparsed(d))}
    if not todo:
        say(f"parse: up to date ({len(run_dirs)} run(s))")
        return None
    from .. import parse

    job = config.ParseSettings(runs=tuple(str(run_dirs[n]) for n in todo), parser=study.parse.parser,
                               stanza_dir=study.parse.stanza_dir, executor=study.ray.executor or "ray",
                               ray_address=study.ray.address, quiet=True)
    t0 = time.perf_counter()
    summary = parse.main(job, echo=False)
    say(f"parse: {sum(todo.values())} sentences of {', '.join(todo)} -> {summary['parsed']} parsed, "
        f"{summary['reused']} from the cache ({summary['parser']}, {time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return summary


def stage_report(study: Study, run_dirs: dict[str, str]) -> tuple[Reports, list[dict[str, Any]]]:
    """jobs.report per run and per comparison, each redone only when what it reads changed."""
    from .. import report
    from ..analyses.base import REPORT_JSON

    reports = Reports(study.report_root())
    state = State(reports)
    code = code_state()
    serve_url = study_serve_url(study)
    jobs = [(name, run_dirs[name], None) for name in study.runs]
    jobs += [(name, run_dirs[c.run], run_dirs[c.run2]) for name, c in study.compare.items()]
    done = []
    for name, run, run2 in jobs:
        out = reports.local / name
        fingerprint = short_hash({"code": code, "vars": study.report.vars, "serve_url": serve_url,
                                  "study": study.study, "run": [str(run), run_state(run)],
                                  "run2": [str(run2), run_state(run2)] if run2 else None})  # fmt: skip
        previous = state.get(name)
        fresh = previous and previous.get("fingerprint") == fingerprint and "findings" in previous
        if fresh and reports.exists(f"{name}/{REPORT_JSON}"):
            say(f"report {name}: up to date ({reports.where(name)})")
            done.append({"name": name, "out": out, "findings": previous["findings"], "run": str(run),
                         "run2": str(run2) if run2 else None})  # fmt: skip
            continue
        job = config.ReportSettings(run=str(run), out=str(out), run2=str(run2) if run2 else None, quiet=True,
                                    vars=tuple(f"{key}={value}" for key, value in study.report.vars.items()),
                                    serve_url=serve_url, study=study.study)  # fmt: skip
        t0 = time.perf_counter()
        result = report.main(job)
        failed = [s.name for s in result["sections"] if s.status == "failed"]
        reports.publish(name)
        say(f"report {name}: written in {time.perf_counter() - t0:.0f} s ({reports.where(name)})"
            + (f"; failed sections: {', '.join(failed)}" if failed else ""))  # fmt: skip
        found = report_findings(result["sections"])
        if not failed:
            state.put(name, {"fingerprint": fingerprint, "findings": found})
        done.append({"name": name, "out": out, "findings": found, "run": str(run),
                     "run2": str(run2) if run2 else None})  # fmt: skip
    state.save()
    return reports, done


def study_serve_url(study: Study) -> str:
    """Where the study's pages link `xsbert serve` (report.serve_url; 'none': no links), for the run reports and the
    study page alike."""
    from ..analyses.base import SERVE_URL

    return study.report.serve_url or SERVE_URL


# --------------------------------------------------------------------------- the end: index and findings
PAPER_MODEL = paper.MODEL


def like_for_like(model: str) -> bool:
    """The paper's figures are for all-mpnet-base-v2: shown beside a finding only for that model."""
    return model.rstrip("/").split("/")[-1].lower() == PAPER_MODEL


def report_findings(sections) -> list[dict[str, Any]]:
    """The findings of a jobs.report result, one per line: {section, text, paper}; a failed analysis is one too.
    Skipped analyses (not applicable to the run) are on the report's page, not in the summary."""
    out = []
    for s in sections:
        if s.status == "ok" and s.name != "examples":
            out += [{"section": s.name, "text": f.text, "paper": f.paper, "like_for_like": f.like_for_like}
                    for f in s.findings]  # fmt: skip
        elif s.status == "failed":
            out.append({"section": s.name, "text": f"failed: {s.reason}", "paper": None})
    return out


def finding_lines(found: list[dict[str, Any]], paper_ok: bool) -> list[str]:
    """`section: text`, with the paper's number beside it only like for like: the run's model is the paper's
    (`paper_ok`) and the finding's model, layer, subset and metric are the paper's (jobs.report, jobs.paper)."""
    return [f"{f['section']}: {f['text']}" + (f" (paper: {f['paper']})" if paper_ok and f.get("like_for_like")
                                              and f["paper"] else "") for f in found]  # fmt: skip


def write_index(target: Reports, study: Study, reports: list[dict[str, Any]], models: dict[str, str]) -> str:
    """The study's index page (jobs/analyses/study.py, from each report's report.json): key figures, headline
    numbers, findings."""
    from ..analyses.base import REPORT_JSON
    from ..analyses.study import StudyReport, study_page

    root = target.local
    items = []
    for r in reports:
        try:
            text = target.read_text(f"{r['name']}/{REPORT_JSON}")
            doc = json.loads(text) if text else None
        except (OSError, json.JSONDecodeError):
            doc = None
        items.append(StudyReport(r["name"], r["run"] + (f" vs {r['run2']}" if r["run2"] else ""), doc,
                                 like_for_like(models.get(r["name"], "")), r["findings"]))  # fmt: skip
    serve_url = study_serve_url(study)
    page = study_page(study.study, items, None if serve_url == "none" else serve_url)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "index.html").write_text(page, encoding="utf-8")
    except OSError as exc:
        raise disk_failure(exc.filename or root / "index.html", exc) from None
    target.publish("index.html")
    return f"{target.root}/index.html"
