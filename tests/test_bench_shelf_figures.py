"""The shelf figures' scripts: bench/shelf_gpu.py (the runs, without Ray), bench/negation_signs.py (Fig 8's count,
each sign at an N where its error is small) and bench/fig6_interval.py (Fig 6's shares per pair, with intervals).

shelf_gpu runs a tiny random MPNet on the CPU with a few pairs per piece, then again (nothing recomputed);
negation_signs is checked against a plain loop over the per-run rows of sql/negation.sql; fig6_interval against
sql/syntactic_relations.sql's own shares, on hand-built runs whose top cells are known."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from test_sql import make_run, random_parses, random_run, relations_run, run_sql, write_table

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


def test_negation_signs_takes_each_sign_at_the_smallest_n_whose_error_is_small(shelf, tmp_path):
    root, _, _ = shelf
    pieces = json.loads((root / "shelf-gpu" / "progress.json").read_text())["pieces"]
    runs = {p["steps"]: str(root / "shelf-gpu" / "runs" / p["run_id"]) for p in pieces.values()
            if p["dataset"] == "negation"}  # fmt: skip
    out = tmp_path / "signs.json"
    done = script("negation_signs.py", runs[64], runs[32], "--margin", "0.5", "--out", str(out))  # any order
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["N"] == [32, 64] and result["pairs"] == LIMIT

    # The same by hand: sql/negation.sql on each run, the first N (ascending) whose |error| < margin x |not|.
    rows = {}
    for n, run in runs.items():
        con = sqlrun.connect(run, variables={"definition": "paper"})
        neg = sqlrun.run_file(con, "negation").to_pandas().set_index("pair_id")
        err = sqlrun.query(con, "select pair_id, completeness_error from pairs").to_pandas().set_index("pair_id")
        rows[n] = neg.join(err)
    expected = {}
    for pid in rows[32].index:
        picks = [n for n in (32, 64)
                 if abs(rows[n].loc[pid, "completeness_error"]) < 0.5 * abs(rows[n].loc[pid, "not_attribution"])]
        expected[pid] = picks[0] if picks else None  # fmt: skip
    got = {r["pair_id"]: r["N"] for r in result["rows"]}
    assert got == expected
    counted = [p for p, n in expected.items() if n is not None]
    assert result["counted"] == len(counted) and sorted(result["not_counted"]) == sorted(set(expected) - set(counted))
    assert result["negative"] == sum(rows[expected[p]].loc[p, "not_attribution"] < 0 for p in counted)
    assert result["counted"] + len(result["not_counted"]) == result["pairs"]  # every pair accounted for


def test_negation_signs_refuses_a_run_of_adaptive_n(tmp_path):
    pairs = [{"pair_id": "n1", "text_a": "This is not good.", "text_b": "This is good.", "sentence_id_a": "a",
              "sentence_id_b": "b", "score": 0.5, "completeness_error": 0.0, "steps_a": 16, "steps_b": 32}]  # fmt: skip
    run = make_run(tmp_path, "adaptive", pairs)
    done = script("negation_signs.py", str(run))
    assert done.returncode != 0 and "not one fixed N" in done.stderr


def test_fig6_interval_shares_are_the_sql_files_on_known_top_cells(tmp_path):
    run = relations_run(tmp_path)  # top cells: det-det, nsubj-nsubj, amod-unaligned, nsubj-unparsed, nsubj-root
    out = tmp_path / "fig6.json"
    done = script("fig6_interval.py", "--run", str(run), "--resamples", "50", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    shares = {k: v["value"] for k, v in result["shares"].items()}
    assert result["pairs"] == 4 and result["top_cells"] == 5
    assert shares == pytest.approx({"nsubj_nsubj_share": 0.2, "same_function_share": 0.4, "mixed_share": 0.2,
                                    "unaligned_share": 0.4, "same_of_parsed": 2 / 3})  # fmt: skip
    for v in result["shares"].values():
        assert v["ci95"][0] <= v["value"] <= v["ci95"][1]


def test_fig6_interval_point_values_equal_the_sql_file_on_a_random_run(tmp_path):
    rng = np.random.default_rng(7)
    run, data = random_run(tmp_path, "r", rng, n_pairs=12)
    write_table(run, "parses", random_parses(data, rng))
    done = script("fig6_interval.py", "--run", str(run), "--resamples", "20", "--top-share", "0.25")
    assert done.returncode == 0, done.stderr[-3000:]
    shares = {k: v["value"] for k, v in json.loads(io.StringIO(done.stdout).read())["shares"].items()}
    df = run_sql(run, "syntactic_relations.sql", top_share=0.25)
    row = df.row(0, named=True)
    for key in ("same_function_share", "mixed_share", "unaligned_share"):
        assert shares[key] == pytest.approx(row[key])
    nsubj = df.filter((df["relation_a"] == "nsubj") & (df["relation_b"] == "nsubj"))["share"].sum()
    assert shares["nsubj_nsubj_share"] == pytest.approx(nsubj)
