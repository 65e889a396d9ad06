"""configs/shelf-gpu.yaml, the shelf figures' study: its runs are the ones made on a GPU (bench/results/shelf_gpu.json:
the same jobs.attribute settings, so the same run ids), and a tiny version of it (a tiny random MPNet, a few pairs per
dataset) runs through `python -m jobs.pipeline` in a process where what such a machine lacks (Ray, DuckDB, polars,
spaCy, stanza, ...) cannot be imported, then again (nothing recomputed); then the analysis that reads its negation
runs at several N, sql/negation_signs.sql, on them. The analyses themselves are tested against slow references in
tests/test_sql_intervals.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_local_executor import HIDE
from test_paper_gpu import MISSING_THERE

from jobs import attribute, pipeline, sqlrun
from jobs.study import schema as study_schema

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "shelf-gpu.yaml"
LIMIT = 3
SCALE = 16  # the tiny study's N: the config's divided by this


def test_the_configs_runs_are_the_runs_made_on_the_gpu(tiny):
    """Each run's settings equal those of the command recorded for it (its --model aside), in the same order."""
    model = str(tiny.folder("mpnet", 3))
    study = pipeline.load_config(CONFIG, [f"models.shelf={model}"])
    recorded = json.loads((ROOT / "bench" / "results" / "shelf_gpu.json").read_text())["pieces"]
    assert list(study.runs) == list(recorded)
    for name, piece in recorded.items():
        argv = shlex.split(piece["command"])[3:]  # python -m jobs.attribute ...
        argv[argv.index("--model") + 1] = model
        argv[argv.index("--out") + 1] = study.out
        assert study_schema.job_settings(study, name) == attribute.settings(argv), name


@pytest.fixture(scope="module")
def shelf(tiny, tmp_path_factory):
    """The study on a tiny MPNet, LIMIT pairs per dataset, at layer 1, each run at a sixteenth of its N (kept small:
    32 -> 2, 64 -> 4, ...), where Ray and DuckDB cannot be imported; then the attribute stage again, here."""
    root = tmp_path_factory.mktemp("shelf")
    study = pipeline.load_config(CONFIG, [f"models.shelf={tiny.folder('mpnet', 3)}"])
    sets = [f"models.shelf={tiny.folder('mpnet', 3)}", f"out={root / 'runs'}", "defaults.layer=1",
            *(f"datasets.{d}.limit={LIMIT}" for d in study.datasets),
            *(f"runs.{name}.steps={run.steps // SCALE}" for name, run in study.runs.items())]  # fmt: skip
    (root / "hide").mkdir()
    (root / "hide" / "sitecustomize.py").write_text(HIDE.format(hidden=sorted(MISSING_THERE)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "hide"), str(ROOT)])}
    cmd = [sys.executable, "-m", "jobs.pipeline", "--config", str(CONFIG), *(x for s in sets for x in ("--set", s))]
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    again = pipeline.stage_attribute(pipeline.load_config(CONFIG, sets))
    return first, again


@pytest.mark.slow
def test_the_study_runs_each_run_once_without_ray_or_duckdb(shelf):
    first, again = shelf
    computed = [line.split(":")[0].removeprefix("attribute ") for line in first.stdout.splitlines()
                if line.startswith("attribute ") and ": computed " in line]  # fmt: skip
    assert computed == list(again)  # every run, in the config's order
    for name, s in again.items():
        assert s["n_in"] == LIMIT == s["n_done"] + s["n_quarantined"], name
        assert s["computed_pairs"] == 0, name  # the rerun computes nothing
        assert "--executor local" in s["command"] and (Path(s["run_dir"]) / "pairs").is_dir()
    assert again["stsb-300-N32"]["run_id"] != again["negation-N32"]["run_id"]


@pytest.mark.slow
def test_negation_signs_read_the_runs_at_several_n(shelf):
    """The negation runs (the config's N = 32 and 64, here 2 and 4, on a tiny MPNet) through sql/negation_signs.sql,
    the runs given in any order: each pair's sign at the smallest N whose error is below a tenth of |not|, every pair
    accounted for."""
    _, again = shelf
    small, large = 32 // SCALE, 64 // SCALE
    runs = {n: str(again[f"negation-N{n * SCALE}"]["run_dir"]) for n in (small, large)}
    con = sqlrun.connect(runs[large], None, {"other_runs": runs[small], "resamples": 20})
    df = sqlrun.run_file(con, "negation_signs")
    assert df.height == LIMIT and set(df["n_runs"]) == {2} and df["steps"].to_list() == [[small, large]] * LIMIT
    rows = {}
    for n, run in runs.items():
        one = sqlrun.connect(run)
        neg = sqlrun.run_file(one, "negation").to_pandas().set_index("pair_id")
        err = sqlrun.query(one, "select pair_id, completeness_error from pairs").to_pandas().set_index("pair_id")
        rows[n] = neg.join(err)
    for row in df.iter_rows(named=True):
        pid = row["pair_id"]
        clear = [n for n in (small, large)
                 if abs(rows[n].loc[pid, "completeness_error"]) < 0.1 * abs(rows[n].loc[pid, "not_attribution"])]
        assert row["chosen_steps"] == (clear[0] if clear else None)  # fmt: skip
    first = df.row(0, named=True)
    assert first["n_clear"] + first["n_not_clear"] == LIMIT
