"""The pipeline's report root shared by studies running at the same time: pipeline.json saved by several processes
at once loses no save and no report's entry (jobs.study.state.State.save: a lock, a temporary file per save, a merge)."""

from __future__ import annotations

import json
import multiprocessing
import traceback
from pathlib import Path

from jobs.study import state as study_state

PROCESSES = 6
SAVES = 40


def _save_many(root: str, who: int, errors) -> None:
    """One study: SAVES saves of pipeline.json, each from a fresh load, each adding one report."""
    try:
        for k in range(SAVES):
            state = study_state.State(study_state.Reports(root))
            state.put(f"study{who}-report{k}", {"fingerprint": f"{who}:{k}", "findings": []})
            state.save()
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test with it
        errors.put(f"process {who}: {traceback.format_exc()}")


def test_concurrent_saves_keep_every_report(tmp_path: Path) -> None:
    root = tmp_path / "reports"
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    procs = [context.Process(target=_save_many, args=(str(root), i, errors)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert not failures, failures[0]
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    saved = json.loads((root / study_state.STATE_FILE).read_text(encoding="utf-8"))["reports"]
    expected = {f"study{i}-report{k}" for i in range(PROCESSES) for k in range(SAVES)}
    assert set(saved) == expected  # every study's every report: no save lost another's entries
    assert saved["study3-report7"]["fingerprint"] == "3:7"
    assert not list(root.glob(".pipeline.json*")), "a temporary file was left behind"


def test_a_save_keeps_the_entries_of_a_study_that_saved_since_it_loaded(tmp_path: Path) -> None:
    """Two studies load the same pipeline.json; each saves its own report; both reports are in the file after."""
    root = str(tmp_path / "reports")
    first, second = study_state.State(study_state.Reports(root)), study_state.State(study_state.Reports(root))
    first.put("a", {"fingerprint": "1"})
    second.put("b", {"fingerprint": "2"})
    first.save()
    second.save()
    path = Path(root) / study_state.STATE_FILE
    assert json.loads(path.read_text(encoding="utf-8"))["reports"] == {"a": {"fingerprint": "1"}, "b": {"fingerprint": "2"}}
    second.put("a", {"fingerprint": "3"})  # a report this study redid itself replaces the earlier entry
    second.save()
    assert json.loads(path.read_text(encoding="utf-8"))["reports"] == {"a": {"fingerprint": "3"}, "b": {"fingerprint": "2"}}
