"""bench/gpu.py sweep: the GPU sweep's code path, run here on the CPU with a tiny random BERT (--dry-run).

On a GPU the same command (without --dry-run) measures both models; what is checked here is that every cell of the
grid is measured and compared with float32, and that the full-QQP extrapolation adds the job's overhead per pair to
the engine time as bench/results/scale.md measured it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


@pytest.mark.slow
def test_sweep_dry_run_writes_every_cell_and_the_extrapolation(tmp_path):
    import gpu

    stem = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu.py"), "sweep", "--dry-run", "--out-stem", str(stem),
           "--precisions", "fp32", "tf32", "fp16", "--scales", "1", "--batches", "2", "4", "--sentences", "3",
           "--stsb-pairs", "1", "--overhead-ms", "2.5"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(stem.with_suffix(".json").read_text())
    assert r["dry_run"] and r["grid"]["precisions"] == ["fp32", "fp16"]  # tf32 dropped on a CPU
    assert [m["model"] for m in r["models"]] == ["minilm", "mpnet"]
    for m in r["models"]:
        assert m["sentences"] == 3
        cells = {(c["precision"], c["batch"], c["chunk"]): c for c in m["cells"]}
        assert set(cells) == {(p, b, 1) for p in ("fp32", "fp16") for b in (2, 4)}
        assert all(c["engine_s"] > 0 and 0 < c["factor_error_mean"] <= c["factor_error_max"] for c in cells.values())
        assert cells[("fp32", 2, 1)]["factor_max_rel_diff_vs_fp32"] == 0.0
        assert 0 < cells[("fp16", 2, 1)]["factor_max_rel_diff_vs_fp32"] < 1e-2
    assert [x["precision"] for x in r["stsb"]["runs"]] == ["fp32", "fp16"]
    for q in r["qqp"]:
        m = next(m for m in r["models"] if m["model"] == q["model"])
        best = min((c for c in m["cells"] if c["precision"] == q["precision"]), key=lambda c: c["engine_s"])
        assert (q["chunk"], q["batch"]) == (best["chunk"], best["batch"])
        assert q["engine_h"] == pytest.approx(gpu.QQP_QUESTIONS * best["engine_s"] / m["sentences"] / 3600)
        assert q["overhead_h"] == pytest.approx(gpu.QQP_PAIRS * 2.5e-3 / 3600)
        assert q["total_h"] == pytest.approx(q["engine_h"] + q["overhead_h"])
    md = stem.with_suffix(".md").read_text()
    assert "a dry run" in md and "Full QQP (537,933 questions, 404,290 pairs)" in md and "1-hour goal" in md


def test_sweep_without_a_gpu_says_so():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "sweep", "--out-stem", "/tmp/never"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the sweep would run")
    assert done.returncode != 0 and "no GPU" in done.stderr and "--dry-run" in done.stderr
