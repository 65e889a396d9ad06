"""The shelf figures' runs: bench/shelf_gpu.py (without Ray) on a tiny random MPNet on the CPU, a few pairs per piece,
then again (nothing recomputed); and the analysis that reads its negation runs at several N, sql/negation_signs.sql,
on them. The analyses themselves are tested against slow references in tests/test_sql_intervals.py."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from jobs import sqlrun

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
LIMIT = 3


def script(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / name), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def shelf(tiny, tmp_path_factory):
    """bench/shelf_gpu.py on a tiny MPNet: negation at N = 4 and 8 (the pieces' N are the script's; --limit keeps
    them small), the paper's adjective pairs at 4; then the same command again."""
    root = tmp_path_factory.mktemp("shelf")
    args = ["--model", str(tiny.folder("mpnet", 3)), "--out", str(root / "shelf-gpu"), "--tar", str(root / "s.tgz"),
            "--layer", "1", "--limit", str(LIMIT), "--device", "cpu",
            "--only", "negation-N32,negation-N64,adjectives-N32"]  # fmt: skip
    first = script("shelf_gpu.py", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    second = script("shelf_gpu.py", *args)
    return root, first, second


def test_shelf_gpu_runs_each_piece_once_and_archives_it(shelf):
    root, first, second = shelf
    progress = json.loads((root / "shelf-gpu" / "progress.json").read_text())
    assert list(progress["pieces"]) == ["negation-N32", "adjectives-N32", "negation-N64"]  # the script's order
    assert progress["device"]["torch"]
    for name, piece in progress["pieces"].items():
        assert piece["n_in"] == LIMIT == piece["n_done"] + piece["n_quarantined"], name
        assert f"--steps {piece['steps']}" in piece["command"] and "--executor local" in piece["command"]
        assert (root / "shelf-gpu" / "runs" / piece["run_id"] / "pairs").is_dir()
    assert first.stdout.count("shelf_gpu: done") == 3
    assert second.returncode == 0 and "shelf_gpu: done" not in second.stdout  # a rerun computes nothing
    with tarfile.open(root / "s.tgz") as tar:
        names = set(tar.getnames())
    assert "shelf-gpu/progress.json" in names
    assert {f"shelf-gpu/runs/{p['run_id']}/manifest.json" for p in progress["pieces"].values()} <= names


def test_negation_signs_read_the_pieces_at_several_n(shelf):
    """The negation pieces (N = 32 and 64 on a tiny MPNet) through sql/negation_signs.sql, the runs given in any
    order: each pair's sign at the smallest N whose error is below a tenth of |not|, every pair accounted for."""
    root, _, _ = shelf
    pieces = json.loads((root / "shelf-gpu" / "progress.json").read_text())["pieces"]
    runs = {p["steps"]: str(root / "shelf-gpu" / "runs" / p["run_id"]) for p in pieces.values()
            if p["dataset"] == "negation"}  # fmt: skip
    con = sqlrun.connect(runs[64], None, {"other_runs": runs[32], "resamples": 20})
    df = sqlrun.run_file(con, "negation_signs")
    assert df.height == LIMIT and set(df["n_runs"]) == {2} and df["steps"].to_list() == [[32, 64]] * LIMIT
    rows = {}
    for n, run in runs.items():
        one = sqlrun.connect(run)
        neg = sqlrun.run_file(one, "negation").to_pandas().set_index("pair_id")
        err = sqlrun.query(one, "select pair_id, completeness_error from pairs").to_pandas().set_index("pair_id")
        rows[n] = neg.join(err)
    for row in df.iter_rows(named=True):
        pid = row["pair_id"]
        clear = [n for n in (32, 64)
                 if abs(rows[n].loc[pid, "completeness_error"]) < 0.1 * abs(rows[n].loc[pid, "not_attribution"])]
        assert row["chosen_steps"] == (clear[0] if clear else None)  # fmt: skip
    first = df.row(0, named=True)
    assert first["n_clear"] + first["n_not_clear"] == LIMIT
