"""bench/paper_gpu.py end to end on the CPU: a tiny random model of mpnet's architecture as the shelf, every piece
(five trainings of one short epoch on 8 pairs, Table 1 on 40 STS-B test pairs, attributions without Ray on 4 STS-B
test pairs, 3 negation and 3 adjective pairs), then a rerun that skips everything.

The results folder must hold no model weights, read with `xsbert sql` and the SQL files as the store's runs do, and
stay small (under 64 MiB here: results meant to travel back from a GPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl

from jobs import evaluate

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = 4
# Run the script and report whether Ray was imported on the way (the local executor must not need it).
RUNNER = ("import runpy, sys; sys.argv = ['paper_gpu.py', *sys.argv[1:]]; code = 0\n"
          "try:\n    runpy.run_path({script!r}, run_name='__main__')\n"
          "except SystemExit as e:\n    code = e.code or 0\n"
          "print('RAY_IMPORTED', 'ray' in sys.modules); sys.exit(code)")  # fmt: skip


def run_script(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = RUNNER.format(script=str(ROOT / "bench" / "paper_gpu.py"))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def parquet_state(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in sorted(out.rglob("*.parquet"))}


def test_paper_gpu_end_to_end_with_a_tiny_mpnet_and_a_rerun_that_skips(tiny, tmp_path):
    shelf = tiny.folder("mpnet", 3)
    out, models = tmp_path / "results", tmp_path / "models"
    args = ["--base", str(shelf), "--out", str(out), "--models", str(models), "--sample", str(SAMPLE),
            "--layers-first", "2", "--fig-layer", "1", "--layers-rest", "", "--negation-limit", "3",
            "--adjectives-limit", "3", "--tolerance", "1e-2", "--steps", "4", "--max-steps", "8",
            "--aso-iterations", "20", "--epochs", "1", "--batch-size", "4", "--train-limit", "8", "--dev-limit", "6",
            "--table1-sample", "40", "--device", "cpu", "-q"]  # fmt: skip
    first = run_script(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "RAY_IMPORTED False" in first.stdout

    pieces = json.loads((out / "progress.json").read_text())["pieces"]
    order = list(pieces)
    # The order of value: tuned + exact, Table 1, their runs at the first layers, orig, second seeds, figures.
    assert order[:3] == ["train-tuned", "train-exact", "table1-exact+shelf+tuned"]
    assert order.index("run-stsb-exact-L2") < order.index("train-orig") < order.index("train-tuned2")
    assert order[-1] == "all"
    runs = {k: v for k, v in pieces.items() if k.startswith("run-")}
    assert set(runs) == {"run-stsb-tuned-L2", "run-stsb-exact-L2", "run-stsb-tuned2-L2", "run-stsb-exact2-L2",
                         *(f"run-stsb-{m}-L1" for m in ("exact", "shelf", "tuned", "tuned2", "exact2")),
                         "run-negation-exact-L1", "run-negation-shelf-L1", "run-adjectives-exact-L1",
                         "run-adjectives-shelf-L1"}  # fmt: skip
    for name, rec in runs.items():  # counts in = counts out + quarantined, every run complete
        expected = 3 if "negation" in name or "adjectives" in name else SAMPLE
        assert rec["n_in"] == expected == rec["n_done"] + rec["n_quarantined"], name
        assert (out / rec["run_dir"] / "pairs").is_dir()

    # Table 1: every model, both checkpoints of the trained ones, cosine for all and orig's dot beside it; ASO.
    t1 = pl.read_parquet(out / "table1.parquet")
    assert set(t1["model"]) == {"shelf", "tuned", "exact", "orig", "tuned2", "exact2"}
    assert t1.filter(pl.col("model") == "orig")["similarity"].to_list().count("dot") == 2
    assert set(t1["n_pairs"]) == {40}
    meta = json.loads((out / "table1.json").read_text())
    assert set(meta["aso"]) == {"best-dev", "last-epoch"}
    assert sorted(p.name for p in (out / "training").iterdir()) == sorted(
        f"{shelf.name}-{m}{c}.json" for m in ("tuned", "exact", "orig", "tuned-seed1", "exact-seed1")
        for c in ("", "-best-dev"))  # fmt: skip

    # The same pairs in every STS-B run: the agreement's SQL reads two runs here, as jobs.evaluate does.
    ex, tu = (str(out / runs[f"run-stsb-{m}-L2"]["run_dir"]) for m in ("exact", "tuned"))
    pairs = evaluate.sql_file("agreement", ex, tu)
    assert pairs.filter(pl.col("score_bin") == "all")["n_pairs"].to_list() == [SAMPLE]
    agreement = pl.read_parquet(out / "agreement.parquet")
    assert set(agreement["comparison"]) == {"exact vs tuned", "tuned vs tuned'", "exact vs exact'"}
    assert set(agreement["layer"]) == {1, 2}
    sql = subprocess.run([sys.executable, "-m", "jobs.cli", "sql", "--run", ex, "--csv",
                          "select count(*) as n, count(distinct pair_id) as p from pairs"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert sql.returncode == 0, sql.stderr
    assert sql.stdout.split()[-1] == f"{SAMPLE},{SAMPLE}"

    # Results, not models; small.
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".safetensors", ".bin", ".pt")]
    assert sum(p.stat().st_size for p in files) < 64 * 2**20

    # A rerun trains nothing, remakes no table and recomputes no pair.
    before = parquet_state(out)
    second = run_script(args, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "training " not in second.stdout and "paper_gpu: done" not in second.stdout
    assert parquet_state(out) == before
