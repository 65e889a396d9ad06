"""bench/gpu_job.py on the CPU: the job with GPU actors on Ray's logical GPUs and a tiny model, the engine alone on
the same questions, the stored subset, then `compare` against a CPU run of the same pairs and `report`.

Subprocesses: the benchmark starts its own Ray (with GPUs it does not have), which the shared test Ray must not be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jobtools import stsb_rows, write_tsv

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_job_bench_runs_on_logical_gpus(tmp_path, tiny):
    model = tmp_path / "tiny-st"
    tiny.build("bert").save(str(model))
    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(8, start=40))
    out = tmp_path / "gpu-job"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    common = ["--model", str(model)]
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_job.py"), "run", "--out", str(out), "--allow-cpu",
                          "--logical-gpus", "2", "--device", "cpu", "--dataset", str(data), "--pairs", "8",
                          "--layer", "1", "--steps", "2", "--compare", "5", "--job-arg=--wave-size=4", *common],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    r = json.loads((out / "gpu-job.json").read_text())
    assert r["status"] == "done"
    job = r["job"]
    assert (job["n_in"], job["n_done"], job["pairs"]) == (8, 8, 8)
    res = job["resources"]
    assert (res["cluster_gpus"], res["gpus_per_actor"], res["device"]) == (2.0, 1.0, "cpu")  # GPU actors, CPU compute
    assert len(r["job_waves"]) == 2 and all(w["pairs"] == 4 for w in r["job_waves"])  # waves of 4 pairs
    assert all("driver_private_mb" in w and w["samples"] >= 0 for w in r["job_waves"])
    assert sum(job["shares"].values()) == pytest.approx(1.0)
    assert all(v >= 0 for k, v in job["stages"].items() if k != "other_s")
    assert r["engine"]["sentences"] == job["sentences"] and r["engine"]["sentences_per_s"] > 0
    assert r["ratio"]["job_over_engine_sentences_per_s"] > 0
    assert r["subset"]["pairs"] == 5 and r["subset"]["cells"] > 0
    assert (out / "samples.jsonl").read_text().count("\n") >= 1

    cmp = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_job.py"), "compare", str(out)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)  # fmt: skip
    assert cmp.returncode == 0, cmp.stdout[-2000:] + cmp.stderr[-3000:]
    c = json.loads((out / "gpu-job.json").read_text())["compare_cpu"]
    # both runs computed on this CPU with the same weights: the same numbers, to float32 rounding
    assert c["pairs"] == 5 and c["same_weights"] and c["cells_max_rel_diff"] < 1e-5

    md = tmp_path / "gpu-job.md"
    rep = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_job.py"), "report", str(out / "gpu-job.json"),
                          "--results", str(md)], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert rep.returncode == 0, rep.stderr[-2000:]
    text = md.read_text()
    assert "Job / engine" in text and "| 2 | 4 |" in text and "CPU run of them" in text
