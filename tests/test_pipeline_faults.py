"""jobs.pipeline and jobs.report when things go wrong around them: a Ctrl-C (SIGINT) in the middle of a study, a report
folder on a full disk, and two reports written into one folder at once. Each is one line (never a traceback), leaves
only whole units behind (waves, reports), and the same command resumes.

The study is tests/test_pipeline.py's tiny one, trimmed: 8 bundled STS-B pairs in waves of 4 through the shared
local Ray; the report tests use tests/test_sql.py's hand-built runs (no model)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from jobtools import hooked, q, stsb_rows, write_tsv
from test_committed_reads import tmpfs
from test_pipeline import base_config, write_config
from test_sql import random_run

from jobs import report
from jobs.analyses.run import REPORT_LOCK

ROOT = Path(__file__).resolve().parents[1]
PAGE = 4096


def fill(mnt: Path, leave_pages: int = 0) -> Path:
    """A ballast file that takes every page of the tmpfs at `mnt` but `leave_pages`."""
    ballast = mnt / "ballast"
    st = os.statvfs(mnt)
    with open(ballast, "wb", buffering=0) as fh, contextlib.suppress(OSError):
        fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave_pages * PAGE))
    return ballast


@pytest.fixture(scope="module")
def hand_run(tmp_path_factory) -> Path:
    run, _ = random_run(tmp_path_factory.mktemp("report-faults"), "r", np.random.default_rng(3), n_pairs=30)
    return run


def report_cli(run: Path, out: Path, capsys) -> tuple[int, list[str]]:
    code = report.cli(["--run", str(run), "--out", str(out), "-q"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_report_folder_on_a_full_disk_is_one_line(hand_run, tmp_path, capsys):
    """jobs.report into a folder whose disk fills while it writes the tables: one line naming the file and errno 28,
    exit 2 (before: a traceback); with space again the same command writes the whole report."""
    with tmpfs(tmp_path / "disk", 256 * PAGE) as mnt:
        out = mnt / "report"
        ballast = fill(mnt, leave_pages=2)
        code, err = report_cli(hand_run, out, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("jobs.report: error: cannot write "), err
        assert str(out) in err[0] and "[Errno 28] No space left on device" in err[0], err
        ballast.unlink()
        code, err = report_cli(hand_run, out, capsys)
        assert code == 0 and (out / "index.html").is_file() and (out / "report.json").is_file(), err


def test_two_reports_into_one_folder_the_second_stops_at_once(hand_run, tmp_path, capsys):
    """A report folder another writer holds (a second pipeline of the same study, a second jobs.report): one line,
    exit 2, nothing of that folder touched (before: both wrote and cleared the same files at once); once it is
    free the report is written."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text("{}", encoding="utf-8")  # an earlier report, which a writer would clear
    (out / "table1.csv").write_text("theirs\n", encoding="utf-8")
    with open(out / REPORT_LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, err = report_cli(hand_run, out, capsys)
    assert code == 2 and len(err) == 1 and "another report is being written into" in err[0], err
    assert (out / "table1.csv").read_text(encoding="utf-8") == "theirs\n"
    code, err = report_cli(hand_run, out, capsys)
    assert code == 0 and (out / "table1.csv").read_text(encoding="utf-8") != "theirs\n", err


# --------------------------------------------------------------------------- a study through Ray
def study(tmp_path: Path) -> Path:
    tree = base_config(tmp_path, write_tsv(tmp_path / "pairs.tsv", stsb_rows(8, start=40)))
    tree["runs"] = {"n2": tree["runs"]["n2"]}
    tree["compare"] = {}
    tree["parse"] = {"enabled": False}
    tree["report"]["enabled"] = False
    tree["ray"] = {"num_actors": 1, "batch_size": 4, "wave_size": 4}
    return write_config(tmp_path / "study.yaml", tree)


def pipeline(config: Path, capsys, *extra: str) -> tuple[int, str, list[str]]:
    """The command line of jobs.pipeline, in this process (on the module's Ray): exit code, stdout, stderr's lines."""
    from jobs.pipeline import cli

    code = cli(["--config", str(config), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


@pytest.mark.slow
def test_ctrl_c_during_a_study_is_one_line_and_the_same_command_resumes(ray_cluster, tmp_path, capsys):
    """SIGINT once the first wave is committed (the job, a process of its own, held there): one line and exit 130
    (before: a traceback), the first wave kept, nothing of the second; the same command computes the second wave
    only. Then the report folder on a full disk: the study's report stage stops in one line, exit 2, and writes it
    once there is space."""
    config = study(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    proc = subprocess.Popen(hooked("jobs.pipeline", "--config", str(config), hold_after_wave=1), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    seen: list[str] = []
    held = threading.Event()

    def watch() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if "attribute n2: wave 1/2" in line:
                held.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        assert held.wait(300), "".join(seen)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: the terminal's whole process group
        err = proc.stderr.read()  # type: ignore[union-attr]
        assert proc.wait(timeout=120) == 130, err[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-1].startswith("jobs.pipeline: interrupted: "), err[-3000:]
    run = next((tmp_path / "runs").iterdir())
    assert q(run, "select count(*) from {pairs}") == [(4,)]
    assert [p.name for p in (run / "cells").glob("*.parquet")] == ["part-000000-0000000.parquet"]

    code, stdout, lines = pipeline(config, capsys)
    assert code == 0 and "attribute n2: computed 4 pairs" in stdout, lines[-20:]
    assert q(run, "select count(*), sum(n_cells) from {pairs}") == q(run, "select count(distinct pair_id), count(*) "
                                                                       "from {cells}")  # fmt: skip

    with tmpfs(tmp_path / "disk", 256 * PAGE) as mnt:
        ballast = fill(mnt, leave_pages=2)
        sets = ["--set", "report.enabled=true", "--set", f"report.out={mnt / 'reports'}"]
        code, _, lines = pipeline(config, capsys, *sets)
        assert code == 2 and not any("Traceback" in line for line in lines), lines[-20:]
        assert lines[-1].startswith("jobs.pipeline: error: cannot write ") and "[Errno 28]" in lines[-1], lines[-3:]
        ballast.unlink()
        code, _, lines = pipeline(config, capsys, *sets)
        assert code == 0 and (mnt / "reports" / "index.html").is_file(), lines[-20:]
