"""configs/qqp-lexical-gpu.yaml on the CPU: a tiny random model of mpnet's architecture, a handful of pairs in QQP's
file layout (STS-B test sentences: no QQP text ships with the repository) given as datasets.qqp.qqp_path, through
`python -m jobs.pipeline` in a process where what such a machine lacks (Ray, DuckDB, polars, ...) cannot be
imported (tests/test_paper_gpu.py's list); then the attribute stage again (nothing left to compute)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from jobtools import qqp_file
from test_local_executor import HIDE
from test_paper_gpu import MISSING_THERE

from jobs import pipeline

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "qqp-lexical-gpu.yaml"


def test_the_study_stores_same_token_cells_without_ray_and_resumes(tiny, tmp_path):
    small = qqp_file(tmp_path / "qqp.tsv.gz", 6)
    out = tmp_path / "runs"
    sets = [f"models.shelf={tiny.folder('mpnet')}", f"datasets.qqp.qqp_path={small}", f"out={out}",
            "runs.shelf-qqp-L8.layer=1", "runs.shelf-qqp-L8.steps=2", "ray.wave_size=2"]  # fmt: skip
    cmd = [sys.executable, "-m", "jobs.pipeline", "--config", str(CONFIG), *(x for s in sets for x in ("--set", s))]
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE.format(hidden=sorted(MISSING_THERE)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "hide"), str(ROOT)])}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "6 pairs = 6 done + 0 quarantined" in done.stdout
    (run,) = list(out.iterdir())
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["cells"] == "same-token" and manifest["config"]["layer"] == 1
    assert manifest["runs"][0]["resources"]["executor"] == "local"
    cells = pq.read_table(run / "cells").to_pylist()
    assert cells and all(c["token_a"] == c["token_b"] for c in cells)
    assert len(list((run / "pairs").glob("part-*.parquet"))) == 3  # waves of 2 pairs, each committed
    # The same study again: nothing left to compute.
    (again,) = pipeline.stage_attribute(pipeline.load_config(CONFIG, sets)).values()
    assert again["computed_pairs"] == 0 and again["run_id"] == run.name
