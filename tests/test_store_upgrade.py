"""`python -m jobs.store.upgrade`: a run without the columns stage 2 now derives from its cells (the ranks, the top-10
lists), upgraded, holds the same rows as the run the current job writes; a pruned run is refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from jobtools import TABLES, rows, run_job

from jobs.store import STORE_VERSION

DERIVED = {"cells": ("value_rank", "content_rank"), "word_cells": ("value_rank",),
           "pairs": ("top10_abs", "top10_value", "content_top10_abs", "content_top10_value", "word_top10_abs",
                     "word_top10_value")}  # fmt: skip


def _older(run: Path, dest: Path) -> Path:
    """A copy of `run` as an older version wrote it: without the derived columns, store_version one less."""
    for table in TABLES:
        (dest / table).mkdir(parents=True)
        for part in sorted((run / table).glob("*.parquet")):
            data = pq.read_table(part)
            pq.write_table(data.drop_columns(list(DERIVED.get(table, ()))), dest / table / part.name)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["store_version"] = STORE_VERSION - 1
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def _upgrade(src: Path, dst: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.store.upgrade", str(src), str(dst)], check=False,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("upgrade")
    summary = run_job(out / "runs", "--dataset", "stsb", "--split", "test", "--limit", "3", "--executor", "local")
    return Path(summary["run_dir"])


def test_upgrade_restores_the_derived_columns(run, tmp_path):
    old = _older(run, tmp_path / "old")
    assert "value_rank" not in pq.read_schema(next((old / "cells").glob("*.parquet"))).names
    done = _upgrade(old, tmp_path / "new")
    assert done.returncode == 0, done.stderr
    assert "done: 3 pairs" in done.stdout
    new = tmp_path / "new"
    for table in TABLES:
        assert rows(new, table) == rows(run, table), table
    manifest = json.loads((new / "manifest.json").read_text())
    assert manifest["config"] == json.loads((run / "manifest.json").read_text())["config"]
    assert manifest["upgraded_from"] == {"run": str(old), "by": "python -m jobs.store.upgrade"}


def test_a_pruned_run_is_refused_in_one_line(run, tmp_path):
    old = _older(run, tmp_path / "old")
    part = next((old / "cells").glob("*.parquet"))
    data = pq.read_table(part)
    pq.write_table(data.slice(1), part)  # the first pair loses a cell
    done = _upgrade(old, tmp_path / "new")
    assert done.returncode == 2
    assert done.stderr.startswith("jobs.store.upgrade: error: pair ") and "a pruned run?" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_run_of_the_current_version_is_refused_in_one_line(run, tmp_path):
    """It had been copied without a word, an `upgraded_from` note written into its manifest (exit 0)."""
    done = _upgrade(run, tmp_path / "new")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (f"jobs.store.upgrade: error: {run} is already store version {STORE_VERSION}, the current "
                           "one: nothing to upgrade\n")
    assert not (tmp_path / "new").exists()
