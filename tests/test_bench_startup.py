"""bench/startup.py on a hand-built store: each command and its baseline timed in fresh processes, the medians and
their ratio written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import startup as bench  # noqa: E402
from test_serve import make_store  # noqa: E402


@pytest.mark.slow
def test_the_bench_times_each_command_beside_its_baseline(tmp_path):
    run, _ = make_store(tmp_path, "run", n_pairs=4)
    stem = tmp_path / "startup"
    assert bench.main(["--run", str(run), "--repeat", "1", "--out-stem", str(stem)]) == 0
    r = json.loads(stem.with_suffix(".json").read_text())
    assert [row["command"] for row in r["rows"]] == ["xsbert sql", "xsbert show"] and r["run"] == str(run)
    for row in r["rows"]:
        assert len(row["runs_s"]) == len(row["baseline_runs_s"]) == 1 and row["median_s"] > 0
        assert row["ratio"] == row["baseline_median_s"] / row["median_s"]
    assert "| `xsbert sql` |" in stem.with_suffix(".md").read_text()
