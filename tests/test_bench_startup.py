"""bench/startup.py on a hand-built store: each command and its baselines timed in fresh processes, the medians and
their ratios written."""

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
def test_the_bench_times_each_command_beside_its_baselines(tmp_path):
    run, _ = make_store(tmp_path, "run", n_pairs=4)
    stem = tmp_path / "startup"
    argv = ["--run", str(run), "--repeat", "1", "--out-stem", str(stem)]
    job = "python -m jobs.attribute --help"
    assert bench.main([*argv, "--command", "xsbert sql", "--command", job]) == 0  # two of four: 8 processes, not 16
    r = json.loads(stem.with_suffix(".json").read_text())
    assert [row["command"] for row in r["rows"]] == ["xsbert sql", job]
    assert r["run"] == str(run) and list(r["baselines"]) == ["import torch", "import sentence_transformers"]
    for row in r["rows"]:
        assert len(row["runs_s"]) == 1 and row["median_s"] > 0 and list(row["baselines"]) == list(r["baselines"])
        for b in row["baselines"].values():
            assert len(b["runs_s"]) == 1 and b["ratio"] == b["median_s"] / row["median_s"]
    md = stem.with_suffix(".md").read_text()
    assert "| `xsbert sql` |" in md and f"| `{job}` |" in md and "`import torch` first: seconds | ratio" in md
