"""The GPU branch of the job's resource plan, on a local Ray with two logical GPUs.

`ray.init(num_gpus=2)` declares two GPUs that do not exist; Ray schedules on them all the same. With
`--device cpu` the factor actors are placed exactly as on a GPU cluster (one GPU each, GPU batch and
wave sizes, two calls in flight per actor) and compute on the CPU: the GPU actor path runs end to end
on a machine without a GPU. Its own module: a Ray's resources are fixed when it starts.

A factor actor that runs out of memory here runs out of its --factor-memory: on a CPU the tensors one call holds are
counted as torch makes them (xsbert_core.memory.TensorBudget) and the op that passes the limit fails with
torch.OutOfMemoryError, as an allocation fails on a GPU under its caching allocator's limit
(torch.cuda.set_per_process_memory_fraction, what the flag sets there). tests/test_memory.py has the engine run out
of a process limit the kernel enforces (RLIMIT_DATA), which a Ray worker cannot take: it refuses the worker's threads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from jobtools import job_error, q, run_job, stsb_rows, write_tsv

from jobs.attribute import settings
from jobs.attribution.stage1 import resources
from jobs.config import DEFAULT_BATCH_SIZE_GPU, DEFAULT_WAVE_SIZE_GPU
from xsbert_core import InputError


@pytest.fixture(scope="module")
def gpu_ray():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # an in-process Ray, not about submission: conftest.ray_cluster
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():  # another module's Ray: this module needs its own resources
        ray.shutdown()
    # The dashboard serves the state API, which tells what each actor was given.
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=True, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


def test_resources_plan_one_actor_per_gpu(gpu_ray):
    res = resources(settings(["--dataset", "stsb"]).execution, gpu_ray)
    assert (res["cluster_gpus"], res["num_actors"], res["gpus_per_actor"], res["device"]) == (2.0, 2, 1.0, "cuda")
    assert (res["batch_size"], res["tasks_in_flight"]) == (DEFAULT_BATCH_SIZE_GPU, 2)
    # The pool lives beside stage 2 for the whole run: it reserves all CPUs but one, which the stage-2 tasks take.
    assert (res["cpus_per_actor"], res["cells_cpus"]) == (0.5, 1.0)
    half = resources(settings(["--dataset", "stsb", "--gpus-per-actor", "0.5"]).execution, gpu_ray)
    assert (half["num_actors"], half["cpus_per_actor"], half["cells_cpus"]) == (4, 0.25, 1.0)
    forced = resources(settings(["--dataset", "stsb", "--device", "cpu", "--gpus-per-actor", "0"]).execution, gpu_ray)
    assert (forced["device"], forced["num_actors"], forced["batch_size"]) == ("cpu", 2, 16)  # the CPU branch
    with pytest.raises(InputError, match=r"^--device cuda: the factor actors get no GPU \(--gpus-per-actor 0\)"):
        resources(settings(["--dataset", "stsb", "--device", "cuda", "--gpus-per-actor", "0"]).execution, gpu_ray)


@pytest.mark.slow
def test_factor_actors_run_on_logical_gpus(gpu_ray, tmp_path):
    from ray.util.state import list_actors

    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(4, start=80))
    # --batch-size 4: two factor batches, so that the pool starts both actors; --num-actors 2, one per logical GPU,
    # is the default here (resources() above), which FAST's one actor would override
    s = run_job(tmp_path / "runs", "--dataset", str(data), "--device", "cpu", "--batch-size", "4", "--num-actors", "2")
    run_dir = Path(s["run_dir"])
    assert (s["n_done"], s["computed_pairs"]) == (4, 4)
    assert q(run_dir, "select count(*), count(distinct pair_id) from {cells}")[0][1] == 4
    res = json.loads((run_dir / "manifest.json").read_text())["runs"][-1]["resources"]
    assert (res["cluster_gpus"], res["num_actors"], res["gpus_per_actor"], res["device"]) == (2.0, 2, 1.0, "cpu")
    assert (res["wave_size"], res["tasks_in_flight"]) == (DEFAULT_WAVE_SIZE_GPU, 2)
    ctx = gpu_ray.get_runtime_context()
    listed = list_actors(address=ctx.gcs_address, detail=True, limit=1000)
    actors = [a for a in listed if "FactorActor" in a.class_name and a.job_id == ctx.get_job_id()]
    assert len(actors) == 2, [a.class_name for a in actors]
    assert all(a.required_resources.get("GPU") == 1.0 for a in actors), [a.required_resources for a in actors]


@pytest.mark.slow
def test_an_actor_that_runs_out_of_memory_halves_its_batch_and_loses_no_pair(gpu_ray, tmp_path, tiny):
    import numpy as np
    import pyarrow.parquet as pq

    model = tmp_path / "tiny-st"
    tiny.build("bert").save(str(model))
    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(8, start=40))
    flags = ["--dataset", str(data), "--model", str(model), "--layer", "1", "--steps", "16", "--device", "cpu",
             "--batch-size", "16"]  # fmt: skip
    free = run_job(tmp_path / "free", *flags)
    # one batch of the 16 sentences at N = 16 holds ~40-80 MB of tensors at once (tiny BERT, CPU chunk); 24 MiB
    # holds a quarter or a half of it
    tight = run_job(tmp_path / "tight", *flags, "--factor-memory", "24MiB")
    assert (tight["n_in"], tight["n_done"], tight["n_quarantined"]) == (8, 8, 0)
    run = json.loads((Path(tight["run_dir"]) / "manifest.json").read_text())["runs"][-1]
    assert run["resources"]["factor_memory"] == 24 * 2**20
    assert sum(w["oom_retries"] for w in run["waves"]) >= 1  # it ran out, halved, and went on
    assert json.loads((Path(free["run_dir"]) / "manifest.json").read_text())["runs"][-1]["waves"][0]["oom_retries"] == 0

    def cells(s):
        t = pq.read_table(Path(s["run_dir"]) / "cells").to_pandas()
        return t.sort_values(["pair_id", "i", "j"]).value.to_numpy()

    a, b = cells(free), cells(tight)
    assert len(a) == len(b) and np.abs(a - b).max() <= 1e-5 * np.abs(a).max()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="about GPUs this torch cannot use")
def test_a_factor_actor_that_cannot_start_stops_the_run_in_one_line_that_says_why(gpu_ray, tmp_path):
    """Factor actors placed on GPUs this torch cannot use (a CPU-only torch on GPU nodes; here Ray's logical GPUs,
    the actors' default device cuda) fail in their __init__: the run stops with that error in its last line, not as
    a batch that killed its worker. The job is a process of its own, on this Ray, and its console is the user's: Ray's
    forwarded traceback of the actor is one line there (raycluster.ConsoleLines), Ray Data's account of it is kept
    off (test_job.py's console filter test). Last in the module: its dead actor would count among
    test_factor_actors_run_on_logical_gpus' actors."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(2, start=80))
    env = {**os.environ, "PYTHONPATH": str(root), "RAY_ADDRESS": gpu_ray.get_runtime_context().gcs_address}
    done = subprocess.run([sys.executable, "-m", "jobs.attribute", "--dataset", str(data), "--layer", "-1", "--steps",
                           "2", "--num-actors", "1", "--max-retries", "0", "--out", str(tmp_path / "runs"), "-q"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-3000:]
    assert job_error(done.stderr).startswith("jobs.attribute: error: wave 1/1 failed: a factor actor could not start: "
                                             "InputError: device 'cuda': no CUDA device here (")  # fmt: skip
    assert any(line.endswith("a traceback, left out here: the worker's log file keeps it (Ray's logs folder on its "
                             "node, /tmp/ray/session_latest/logs by default)") for line in err), err  # fmt: skip
