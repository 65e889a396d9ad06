"""The real attribution job with GPU actors, beside the engine alone on the same questions, in one process.

On a machine with a CUDA GPU and the offline bundle installed (docs/OFFLINE.md; bench/gpu_run.py does both), with
that environment's Python:

    python bench/gpu_job.py run --model DIR/models/all-mpnet-base-v2 --layer 8 --qqp-path DIR/data/qqp.tsv.gz \
        --cpu-rows bench/results/gpu-job-cpu/mpnet --out OUT/job-mpnet                                   # there
    python bench/gpu_job.py cpu-rows --model ... --layer 8 --qqp-path ... --out bench/results/gpu-job-cpu/mpnet  # here

`run` measures, writing OUT/gpu-job.json again after every step (a run cut short still tells what it measured) and
one line per second of samples to OUT/samples.jsonl:

  job      `jobs.attribute` in this process (settings -> prepare -> attribute, as `python -m jobs.attribute` runs it)
           on the first --pairs QQP pairs (2,000) at the job's defaults on a GPU (adaptive N from 16 to a factor
           error of 1e-3, Gauss-Legendre, float32; one factor actor per GPU, batches of 128, waves of 16,384 pairs),
           on a local Ray: pairs/s and sentences/s end to end; the share of the wall time in each stage (prepare:
           read, tokenise, load; stage 1: waiting for factors; stage 2: pair cells; commit); per wave, GPU
           utilisation and memory (nvidia-smi, each second), the driver's memory (the job's own per-wave record)
           and the Ray workers' (psutil, each second), the factor batches that ran out of memory and were halved
  engine   the engine alone (Explainer.factors, what a factor actor calls, with the actor's settings and memory
           budget) on the same unique questions (a seeded sample of --engine-sentences of them), longest first in
           batches of 128, on the same GPU after the job's Ray is shut down: sentences/s, torch.cuda's peak memory;
           the job's rate over the engine's is the job's overhead on a GPU node
  subset   the first --compare (20) pairs (source rows): the stored ones' rows (pairs and cells) written to
           OUT/subset-*.parquet, the quarantined ones' reasons to OUT/subset-quarantined.json, and with --cpu-rows set
           beside the same pairs attributed on a CPU beforehand (`cpu-rows`, the same model folder): per pair both
           stored, max |A_gpu - A_cpu| against the pair's completeness errors; those either side quarantined, named

With --stop-by (a time, seconds since the epoch; bench/gpu_run.py passes its deadline) the job stops after the first
wave past which another wave as long as the last one, and the steps after the job, would not end in time: what the
committed waves measured is kept (status "stopped"), the subset and the engine alone run as usual, and the report
takes stage 1's GPU seconds per question from the engine alone.

Without a GPU, `run --allow-cpu --logical-gpus 2 --device cpu` runs the same path with Ray told of GPUs it does not
have (tests/test_gpu_job.py, with a tiny model).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

MODEL, LAYER = "sentence-transformers/all-MiniLM-L6-v2", 4  # MiniLM's layer 4 of 6: mpnet's 8 of 12
BATCH = 128  # jobs.attribute DEFAULT_BATCH_SIZE_GPU
PAIRS, COMPARE, ENGINE_SENTENCES = 2_000, 20, 0  # 0: the engine on every unique question of the job
QQP_PAIRS, QQP_QUESTIONS = 404_290, 537_933  # full GLUE QQP train, as bench/gpu.py
# What the steps after the job need of --stop-by's time: Ray's shutdown, the subset, the engine alone (seconds).
RESERVE_S = 60
# What the job record keeps of each wave's timings (jobs.attribution.run.WaveDone), beside its wall time and samples.
WAVE_TIMINGS = ("pairs", "sentences", "factors_s", "cells_s", "commit_s", "attribution_s")


class StopJob(Exception):
    """Raised after a committed wave when the time before --stop-by would not hold another one."""


def stop_now(now: float, stop_by: float, wave_s: float, waves_left: int) -> bool:
    """After a wave: stop when another wave 1.5 times as long as this one, then the steps after the job (RESERVE_S),
    would end after `stop_by` (0: no limit); never when no wave is left."""
    return bool(stop_by) and waves_left > 0 and now + 1.5 * wave_s + RESERVE_S > stop_by


class Recorder:
    """The result JSON, written again (atomically) after each step."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "gpu-job.json"
        self.data: dict[str, Any] = {}

    def update(self, **kw: Any) -> None:
        self.data.update(kw)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def nvidia_smi() -> dict[str, Any] | None:
    """GPU utilisation and memory, and each compute process's memory, by nvidia-smi (None where it is absent)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)  # fmt: skip
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [[x.strip() for x in line.split(",")] for line in gpu.stdout.strip().splitlines() if line.strip()]
    procs = [[x.strip() for x in line.split(",")] for line in apps.stdout.strip().splitlines() if line.strip()]
    with contextlib.suppress(ValueError, IndexError):
        return {"util_pct": [float(r[0]) for r in rows], "mem_used_mib": [float(r[1]) for r in rows],
                "mem_total_mib": [float(r[2]) for r in rows],
                "proc_mem_mib": {int(p[0]): float(p[1]) for p in procs if len(p) == 2 and p[1].isdigit()}}  # fmt: skip
    return None


def ray_workers_mb() -> dict[str, float]:
    """Resident memory of the Ray worker processes of the Ray this process started (its descendants whose titles
    start with `ray::`: the raylet is this process's child, the workers the raylet's), in MB."""
    import psutil

    sizes = []
    with contextlib.suppress(psutil.Error):
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error, IndexError):
                title = (p.cmdline() or [""])[0] or p.name()
                if title.startswith("ray::"):
                    sizes.append(p.memory_info().rss / 2**20)
    return {"workers": len(sizes), "workers_rss_mb": sum(sizes), "largest_worker_mb": max(sizes, default=0.0)}


class Sampler(threading.Thread):
    """Once a second: nvidia-smi, the Ray workers' memory, this process's; each sample a line of samples.jsonl."""

    def __init__(self, path: Path, every: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.path, self.every = path, every
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.phase = "start"

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        with open(self.path, "a", encoding="utf-8") as fh:
            while not self.stop.is_set():
                s: dict[str, Any] = {"t": time.time(), "phase": self.phase,
                                     "driver_rss_mb": me.memory_info().rss / 2**20, **ray_workers_mb()}
                if (smi := nvidia_smi()) is not None:
                    s["gpu"] = smi
                self.samples.append(s)
                fh.write(json.dumps(s) + "\n")
                fh.flush()
                self.stop.wait(self.every)

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """Aggregates of the samples taken in [t0, t1]."""
        got = [s for s in self.samples if t0 <= s["t"] <= t1]
        out: dict[str, Any] = {"samples": len(got)}
        if not got:
            return out
        out["workers_rss_mb_max"] = max(s["workers_rss_mb"] for s in got)
        out["largest_worker_mb_max"] = max(s["largest_worker_mb"] for s in got)
        out["driver_rss_mb_max"] = max(s["driver_rss_mb"] for s in got)
        gpu = [s["gpu"] for s in got if "gpu" in s]
        if gpu:
            util = [u for g in gpu for u in g["util_pct"]]
            out["gpu_util_pct_mean"] = sum(util) / len(util)
            out["gpu_util_pct_max"] = max(util)
            out["gpu_mem_used_mib_max"] = max(m for g in gpu for m in g["mem_used_mib"])
            out["gpu_proc_mem_mib_max"] = max((m for g in gpu for m in g["proc_mem_mib"].values()), default=0.0)
        return out


def environment(device: str) -> dict[str, Any]:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.node(),
           "cpus": os.cpu_count(), "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "device": device}  # fmt: skip
    with contextlib.suppress(Exception):
        import ray

        env["ray"] = ray.__version__
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["gpus"] = torch.cuda.device_count()
    with contextlib.suppress(Exception):
        import subprocess as sp

        env["commit"] = sp.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, timeout=10).stdout.strip() or None  # fmt: skip
    return env


def torch_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpus() -> int:
    """The cores this process may use (its affinity: a container's own, where os.cpu_count() says the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start_ray(gpus: int, logical: bool) -> None:
    """The job's Ray, told of `gpus` GPUs: the ones torch sees, so that no detection of Ray's own can leave them out
    (the workers' output reaches the driver, run.log, as with the job's own start of Ray), or `logical` ones it does
    not have (the GPU actor path on a CPU machine). `ray-check` starts and stops the same one before the job pieces."""
    import logging

    import ray

    from jobs.raycluster import once_more_if_slow

    quiet = {"log_to_driver": False} if logical else {"logging_level": logging.WARNING}
    once_more_if_slow(lambda: ray.init(num_cpus=cpus(), num_gpus=gpus, include_dashboard=False, **quiet),
                      ray.shutdown)  # fmt: skip


def _cuda_seen(batch: dict[str, Any]) -> dict[str, Any]:
    """A Ray Data task's view of the GPU: whether torch sees CUDA there, and CUDA_VISIBLE_DEVICES as Ray set it."""
    import numpy as np
    import torch

    n = len(batch["id"])
    return {"cuda": np.array([torch.cuda.is_available()] * n),
            "visible": np.array([os.environ.get("CUDA_VISIBLE_DEVICES", "")] * n)}  # fmt: skip


def ray_check() -> int:
    """Ray started as the job starts it on this machine, one Ray Data task on a GPU (where torch sees one: ray[data]'s
    own requirements meet the machine's pandas and pyarrow here, and the task must see CUDA), its resources and the
    task's view printed on one line, and stopped. Exit 1 when a GPU task sees no CUDA."""
    import ray
    import ray.data

    gpus = torch_cuda_devices()
    start_ray(gpus, logical=False)
    task = ray.data.range(1).map_batches(_cuda_seen, batch_size=1, num_gpus=1 if gpus else 0).take_all()[0]
    seen = {"cuda": bool(task["cuda"]), "visible": str(task["visible"])}
    print("ray-check:", json.dumps({"resources": ray.cluster_resources(), "cuda_devices": gpus, "task": seen}),
          flush=True)  # fmt: skip
    ray.shutdown()
    if gpus and not seen["cuda"]:
        print(f"ray-check: a Ray task given a GPU sees no CUDA (CUDA_VISIBLE_DEVICES={seen['visible']!r})",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def job_args(a: argparse.Namespace, out_runs: Path, limit: int) -> list[str]:
    argv = ["--dataset", a.dataset, "--limit", str(limit), "--model", a.model, "--layer", str(a.layer),
            "--out", str(out_runs), "--quiet"]  # fmt: skip
    if a.steps:  # else the job's default: adaptive N
        argv += ["--steps", str(a.steps)]
    if a.qqp_path:
        argv += ["--qqp-path", a.qqp_path]
    if a.device:
        argv += ["--device", a.device]
    return argv + list(a.job_arg or [])


def run_job(a: argparse.Namespace, rec: Recorder, sampler: Sampler) -> dict[str, Any]:
    """jobs.attribute in this process; per-wave records merged with the sampler's windows."""
    from jobs.attribute import attribute, prepare, settings
    from jobs.attribution.run import WaveDone

    gpus = a.logical_gpus or torch_cuda_devices()
    if gpus:  # else (a CPU, no logical GPUs) the job starts its own Ray, or none with --executor local
        start_ray(gpus, logical=bool(a.logical_gpus))
    args = settings(job_args(a, Path(a.out) / "runs", a.pairs))
    sampler.phase = "prepare"
    t0 = time.time()
    prep = prepare(args)
    t_prep = time.time()
    waves: list[dict[str, Any]] = []
    last = [t_prep]

    def on_wave(done: WaveDone) -> None:
        now = time.time()
        wave = {"line": str(done), "t_end": now, "seconds": now - last[0], **sampler.window(last[0], now),
                **{k: done.timings[k] for k in WAVE_TIMINGS if k in done.timings}}  # fmt: skip
        waves.append(wave)
        last[0] = now
        print(f"gpu_job: {done}", flush=True)
        rec.update(job_waves=waves)
        if stop_now(now, a.stop_by, wave["seconds"], done.of - done.number):
            raise StopJob(f"stopped after wave {done.number}/{done.of}: {a.stop_by - now:.0f} s left before "
                          f"--stop-by, the wave took {wave['seconds']:.0f} s and the steps after the job need "
                          f"{RESERVE_S} s")  # fmt: skip

    sampler.phase = "job"
    try:
        summary = attribute(prep, on_wave=on_wave)
    except StopJob as exc:
        print(f"gpu_job: {exc}", flush=True)
        return stopped_job(a, rec, sampler, prep, waves, str(exc), t0, t_prep)
    t1 = time.time()
    manifest = json.loads((Path(summary["run_dir"]) / "manifest.json").read_text())
    last_run = manifest["runs"][-1]
    for w, timings in zip(waves, last_run["waves"]):
        w.update(timings)
    stage = {"prepare_s": t_prep - t0,
             "stage1_wait_s": sum(w.get("factors_s", 0.0) + w.get("factor_meta_s", 0.0) for w in last_run["waves"]),
             "stage2_cells_s": sum(w.get("cells_s", 0.0) for w in last_run["waves"]),
             "commit_s": sum(w.get("commit_s", 0.0) for w in last_run["waves"]),
             "actor_attribution_s": sum(w.get("attribution_s", 0.0) for w in last_run["waves"])}  # fmt: skip
    wall = t1 - t0
    stage["other_s"] = wall - stage["prepare_s"] - stage["stage1_wait_s"] - stage["stage2_cells_s"] - stage["commit_s"]
    job = {"argv": job_args(a, Path("runs"), a.pairs), "wall_s": wall, "attribute_s": t1 - t_prep,
           "pairs": summary["computed_pairs"], "sentences": summary["computed_sentences"],
           "n_in": summary["n_in"], "n_done": summary["n_done"], "n_quarantined": summary["n_quarantined"],
           "pairs_per_s": summary["computed_pairs"] / wall, "sentences_per_s": summary["computed_sentences"] / wall,
           "stages": stage, "shares": {k: v / wall for k, v in stage.items() if k != "actor_attribution_s"},
           "resources": last_run["resources"], "weights_sha256": manifest["config"]["weights_sha256"],
           "run_id": summary["run_id"], "run_dir": summary["run_dir"],
           "mean_abs_completeness_error": summary["mean_abs_completeness_error"],
           "whole": sampler.window(t0, t1)}  # fmt: skip
    rec.update(job=job, job_waves=waves)
    return job


def stopped_job(a: argparse.Namespace, rec: Recorder, sampler: Sampler, prep, waves: list[dict[str, Any]],
                why: str, t0: float, t_prep: float) -> dict[str, Any]:
    """The job record of a run stopped after some waves: its committed waves as on_wave got them (the manifest
    records a run when it ends), the store's counts; stage 1 in the report from the engine alone."""
    import pyarrow.parquet as pq

    t1 = time.time()
    run_dir = Path(prep.settings.output.out) / prep.run_id
    pairs, sentences = sum(w.get("pairs", 0) for w in waves), sum(w.get("sentences", 0) for w in waves)
    wall = t1 - t0
    stage = {"prepare_s": t_prep - t0, "stage1_wait_s": sum(w.get("factors_s", 0.0) for w in waves),
             "stage2_cells_s": sum(w.get("cells_s", 0.0) for w in waves),
             "commit_s": sum(w.get("commit_s", 0.0) for w in waves)}  # fmt: skip
    stage["other_s"] = wall - sum(stage.values())
    job = {"argv": job_args(a, Path("runs"), a.pairs), "stopped": why, "wall_s": wall, "attribute_s": t1 - t_prep,
           "pairs": pairs, "sentences": sentences, "n_in": prep.n_in,
           "n_done": pq.read_table(run_dir / "pairs", columns=["pair_id"]).num_rows,
           "n_quarantined": len(quarantined_pairs(run_dir)),
           "pairs_per_s": pairs / wall, "sentences_per_s": sentences / wall, "stages": stage,
           "shares": {k: v / wall for k, v in stage.items()}, "weights_sha256": prep.config["weights_sha256"],
           "run_id": prep.run_id, "run_dir": str(run_dir), "whole": sampler.window(t0, t1)}  # fmt: skip
    rec.update(job=job, job_waves=waves)
    return job


def unique_questions(run_dir: Path) -> list[str]:
    """The unique sentences the job attributed, from its store (the same texts the engine gets)."""
    import pyarrow.parquet as pq

    return sorted(set(pq.read_table(run_dir / "sentences", columns=["text"]).column("text").to_pylist()))


def run_engine(a: argparse.Namespace, texts: list[str], rec: Recorder, sampler: Sampler) -> dict[str, Any]:
    """Explainer.factors alone on `texts` (a seeded sample of --engine-sentences of them), with the factor actor's
    engine settings and memory budget, longest first in batches of BATCH, on the job's device."""
    import random

    import torch

    from jobs.attribute import settings
    from jobs.attribution.memory import actor_memory
    from xsbert_core import Explainer

    if a.engine_sentences and a.engine_sentences < len(texts):
        texts = sorted(random.Random(0).sample(texts, a.engine_sentences))
    at = settings(job_args(a, Path("runs"), a.pairs)).attribution
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sampler.phase = "engine"
    ex = Explainer(a.model, layer=at.layer, mode=at.mode, similarity=at.similarity, rule=at.rule, steps=at.steps,
                   tolerance=at.tolerance, max_steps=at.max_steps, precision=at.precision, device=device)  # fmt: skip
    ex.memory.budget, _ = actor_memory(ex, None, 1.0)  # the budget a factor actor with the whole GPU plans in
    lengths = [len(i) for i in ex.split.tokenizer(texts, truncation=False)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: (-lengths[i], texts[i]))
    ordered = [texts[i] for i in order]
    batches = [ordered[k : k + BATCH] for k in range(0, len(ordered), BATCH)]
    ex.factors(ordered[:4])  # warm-up: kernels, allocator
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    steps: list[int] = []
    for b in batches:
        steps += [sf.n_steps for sf in ex.factors(b, batch_size=BATCH)]
    if cuda:
        torch.cuda.synchronize()
    t1 = time.time()
    eng = {"sentences": len(texts), "of_unique": a.engine_sentences or None, "tokens": sum(lengths),
           "seconds": t1 - t0, "sentences_per_s": len(texts) / (t1 - t0), "device": device, "batch": BATCH,
           "steps_hist": {str(n): steps.count(n) for n in sorted(set(steps))},
           "out_of_memory": ex.memory.out_of_memory, "whole": sampler.window(t0, t1)}  # fmt: skip
    if cuda:
        eng["torch_cuda_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        eng["torch_cuda_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    rec.update(engine=eng)
    del ex
    if cuda:
        torch.cuda.empty_cache()
    return eng


def quarantined_pairs(run_dir: Path, below_row: int | None = None) -> dict[str, str]:
    """{pair_id: reason} of the run's quarantined pairs in source order (those of source rows below `below_row`)."""
    from jobs.store import run_at

    keys = sorted(run_at(run_dir).quarantine_keys(), key=lambda q: q[0])
    return {pid: reason for row, pid, reason in keys if below_row is None or row < below_row}


def write_subset(run_dir: Path, out: Path, n: int, rec: Recorder) -> dict[str, Any]:
    """The first n pairs (source rows 0..n-1) of the run: the stored ones' pairs rows and cells, as Parquet under
    `out`, and the quarantined ones' reasons (subset-quarantined.json)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pairs = pq.read_table(run_dir / "pairs")
    pairs = pairs.filter(pc.less(pairs.column("row"), n)).sort_by([("row", "ascending")])
    ids = pairs.column("pair_id")
    cells = pq.read_table(run_dir / "cells")
    cells = cells.filter(pc.is_in(cells.column("pair_id"), value_set=ids))
    pq.write_table(pairs, out / "subset-pairs.parquet")
    pq.write_table(cells, out / "subset-cells.parquet")
    quarantined = quarantined_pairs(run_dir, below_row=n)
    (out / "subset-quarantined.json").write_text(json.dumps(quarantined, indent=1))
    sub = {"pairs": pairs.num_rows, "cells": cells.num_rows, "limit": n, "quarantined": len(quarantined)}
    rec.update(subset=sub)
    return sub


def run(a: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available() and not a.allow_cpu:
        print("bench/gpu_job.py run: no GPU (torch.cuda.is_available() is False); --allow-cpu --logical-gpus 2 "
              "--device cpu for a dry run", file=sys.stderr)  # fmt: skip
        return 2
    out = Path(a.out)
    rec = Recorder(out)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    rec.update(environment=environment(device), settings={"model": a.model, "layer": a.layer, "steps": a.steps,
               "pairs": a.pairs, "dataset": a.dataset, "compare": a.compare, "logical_gpus": a.logical_gpus,
               "engine_sentences": a.engine_sentences}, status="running")  # fmt: skip
    sampler = Sampler(out / "samples.jsonl")
    sampler.start()
    try:
        job = run_job(a, rec, sampler)
        import ray

        ray.shutdown()  # the actors leave the GPU before the engine runs alone
        run_dir = Path(job["run_dir"])
        write_subset(run_dir, out, a.compare, rec)
        if a.cpu_rows and (Path(a.cpu_rows) / "weights.json").is_file():
            rec.update(compare_cpu=compare_rows(out, Path(a.cpu_rows), job["weights_sha256"]))
        elif a.cpu_rows:
            rec.update(compare_cpu={"error": f"no CPU rows in {a.cpu_rows}"})
        eng = run_engine(a, unique_questions(run_dir), rec, sampler)
        rec.update(ratio={"job_over_engine_sentences_per_s": job["sentences_per_s"] / eng["sentences_per_s"]})
        rec.update(status="stopped" if job.get("stopped") else "done")
    finally:
        sampler.stop.set()
        sampler.join(timeout=5)
    print(json.dumps({k: rec.data.get(k) for k in ("job", "engine", "ratio", "subset", "compare_cpu")}, indent=1,
                     default=str))  # fmt: skip
    return 0


# --------------------------------------------------------------------------- the same pairs on a CPU
def cpu_rows(a: argparse.Namespace) -> int:
    """The first --compare pairs attributed here, on the CPU, with the job's settings (--executor local): their pairs
    rows and cells into --out (pairs.parquet, cells.parquet, weights.json), for `run --cpu-rows` to compare with."""
    import pyarrow.parquet as pq

    from jobs.attribute import main as job_main
    from jobs.attribute import parse_args

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    argv = ["--dataset", a.dataset, "--limit", str(a.compare), "--model", a.model, "--layer", str(a.layer),
            "--device", "cpu", "--executor", "local", "--out", str(Path(a.runs)), "--quiet"]  # fmt: skip
    argv += ["--qqp-path", a.qqp_path] if a.qqp_path else []
    argv += ["--steps", str(a.steps)] if a.steps else []
    summary = job_main(parse_args(argv))
    run_dir = Path(summary["run_dir"])
    pq.write_table(pq.read_table(run_dir / "pairs"), out / "pairs.parquet")
    pq.write_table(pq.read_table(run_dir / "cells"), out / "cells.parquet")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    computed = [r for r in manifest["runs"] if r["counts"]["computed_pairs"]]  # the runs that attributed them
    quarantined = quarantined_pairs(run_dir)
    (out / "weights.json").write_text(json.dumps({"weights_sha256": manifest["config"]["weights_sha256"],
                                                  "config": manifest["config"], "argv": argv,
                                                  "quarantined": quarantined,
                                                  "attribution_wall_s": sum(r["wall_s"] for r in computed),
                                                  "threads": [r["resources"]["threads"] for r in computed]},
                                                 indent=1))  # fmt: skip
    print(f"cpu-rows: {summary['n_done']} pairs -> {out}"
          + (f" ({len(quarantined)} quarantined)" if quarantined else ""))
    return 0


def compare_rows(out: Path, cpu: Path, weights_sha256: str) -> dict[str, Any]:
    """The stored subset against the CPU's rows of the same pairs: per pair, max |A_gpu - A_cpu| over its cells and
    |sum A_gpu - sum A_cpu|, beside the two runs' completeness errors; a pair agrees when its sums differ by no more
    than its two completeness errors together (each sum is within its error of the same target). The first pairs
    that both runs attributed (stored or quarantined) are the ones looked at; those one side did not store are named
    with that side's reason."""
    import numpy as np
    import pyarrow.parquet as pq

    gp = pq.read_table(out / "subset-pairs.parquet").to_pandas().set_index("pair_id")
    cp = pq.read_table(cpu / "pairs.parquet").to_pandas().set_index("pair_id")
    cpu_run = json.loads((cpu / "weights.json").read_text())
    cpu_q = cpu_run.get("quarantined", {})
    gpu_q = json.loads((out / "subset-quarantined.json").read_text())
    both = {*cp.index, *cpu_q} & {*gp.index, *gpu_q}  # the first pairs each side attributed
    common = [p for p in gp.index if p in cp.index]
    gc_ = pq.read_table(out / "subset-cells.parquet").to_pandas().set_index(["pair_id", "i", "j"]).sort_index()
    cc = pq.read_table(cpu / "cells.parquet").to_pandas().set_index(["pair_id", "i", "j"]).sort_index()
    per_pair = []
    for pid in common:
        g, c = gc_.loc[pid].value, cc.loc[pid].value
        if len(g) != len(c) or not g.index.equals(c.index):
            per_pair.append({"pair_id": pid, "error": f"cells differ: {len(g)} vs {len(c)}"})
            continue
        d_sum = abs(float(gp.attribution_sum[pid] - cp.attribution_sum[pid]))
        bound = abs(float(gp.completeness_error[pid])) + abs(float(cp.completeness_error[pid]))
        per_pair.append({"pair_id": pid, "cells_max_abs_diff": float(np.abs(g.values - c.values).max()),
                         "max_abs_a": float(np.abs(c.values).max()), "sum_abs_diff": d_sum,
                         "completeness_error_gpu": float(gp.completeness_error[pid]),
                         "completeness_error_cpu": float(cp.completeness_error[pid]),
                         "steps_gpu": [int(gp.steps_a[pid]), int(gp.steps_b[pid])],
                         "steps_cpu": [int(cp.steps_a[pid]), int(cp.steps_b[pid])],
                         "agrees": bool(d_sum <= bound + 1e-9)})  # fmt: skip
    ok = [p for p in per_pair if "error" not in p]
    return {"pairs": len(common), "compared": len(ok), "agree": sum(p["agrees"] for p in ok),
            "same_weights": cpu_run["weights_sha256"] == weights_sha256,
            "cpu_quarantined": {p: cpu_q[p] for p in sorted(both) if p in cpu_q},
            "gpu_quarantined": {p: gpu_q[p] for p in sorted(both) if p in gpu_q},
            "cells_max_abs_diff": max((p["cells_max_abs_diff"] for p in ok), default=None),
            "cells_max_rel_diff": max((p["cells_max_abs_diff"] / p["max_abs_a"] for p in ok), default=None),
            "sum_max_abs_diff": max((p["sum_abs_diff"] for p in ok), default=None),
            "same_steps": sum(p["steps_gpu"] == p["steps_cpu"] for p in ok), "per_pair": per_pair}  # fmt: skip


# --------------------------------------------------------------------------- report (here)
def report(path: str) -> str:
    """The markdown of one `run`'s gpu-job.json (bench/gpu_run.py report puts one per model into gpu-job.md)."""
    r = json.loads(Path(path).read_text())
    env, job, s = r["environment"], r.get("job"), r["settings"]
    n = f"N={s['steps']}" if s.get("steps") else "adaptive N (the job's default)"
    lines = [f"### {Path(s['model']).name}, layer {s['layer']}: the first {s['pairs']:,} pairs of {s['dataset']}", "",
             f"{env.get('gpu', env['device'])}, torch {env['torch']}, ray {env.get('ray')}, Python {env['python']}, "
             f"{env['cpus']} CPUs; {env['stamp']}, commit {env.get('commit')}; {n}; status {r.get('status')}.",
             ""]  # fmt: skip
    if job:
        eng = r.get("engine")
        if job.get("stopped"):
            lines += [f"The job {job['stopped']}: {job['pairs']:,} of {job['n_in']:,} pairs; stage 1's GPU seconds "
                      "per question in the estimate are the engine's alone.", ""]  # fmt: skip
        lines += ["| | pairs | sentences | wall s | pairs/s | sentences/s |", "|---|---|---|---|---|---|",
                  f"| job (end to end) | {job['pairs']:,} | {job['sentences']:,} | {job['wall_s']:.1f} | "
                  f"{job['pairs_per_s']:.1f} | {job['sentences_per_s']:.1f} |"]  # fmt: skip
        if eng:
            of = f" (a seeded sample of the {job['sentences']:,})" if eng.get("of_unique") else ""
            lines.append(f"| engine alone{of} | | {eng['sentences']:,} | {eng['seconds']:.1f} | | "
                         f"{eng['sentences_per_s']:.1f} |")  # fmt: skip
        if r.get("ratio"):
            lines += ["", f"Job / engine (sentences/s): **{r['ratio']['job_over_engine_sentences_per_s']:.2f}**."]
        lines += ["", "Shares of the job's wall time: " + ", ".join(f"{k[:-2]} {v:.0%}" for k, v in
                                                                    job["shares"].items()) + ".", ""]  # fmt: skip
        lines += ["| wave | pairs | sentences | s | factors s | cells s | commit s | GPU util % mean / max | "
                  "GPU mem MiB max | driver private MB | workers RSS MB max | batches out of memory |",
                  "|" + "---|" * 12]  # fmt: skip
        for k, w in enumerate(r.get("job_waves", []), 1):
            util = (f"{w['gpu_util_pct_mean']:.0f} / {w['gpu_util_pct_max']:.0f}" if "gpu_util_pct_mean" in w
                    else "n/a")  # fmt: skip
            lines.append(f"| {k} | {w.get('pairs', '')} | {w.get('sentences', '')} | {w['seconds']:.1f} | "
                         f"{w.get('factors_s', 0):.1f} | {w.get('cells_s', 0):.1f} | {w.get('commit_s', 0):.1f} | "
                         f"{util} | {w.get('gpu_mem_used_mib_max', 'n/a')} | {w.get('driver_private_mb', 0):.0f} | "
                         f"{w.get('workers_rss_mb_max', 0):.0f} | {w.get('oom_retries', 0)} |")  # fmt: skip
        if eng:
            peak = (f"torch.cuda peak {eng['torch_cuda_peak_allocated_gib']:.1f} GiB allocated, "
                    f"{eng['torch_cuda_peak_reserved_gib']:.1f} reserved; " if "torch_cuda_peak_allocated_gib" in eng
                    else "")  # fmt: skip
            lines += ["", f"Engine alone: {peak}N per sentence {eng.get('steps_hist')}."]
    if "compare_cpu" in r and "error" in r["compare_cpu"]:
        lines += ["", f"No comparison with a CPU run: {r['compare_cpu']['error']}."]
    elif "compare_cpu" in r:
        c = r["compare_cpu"]
        lines += ["", f"The {c['pairs']} of the first pairs that both runs stored, the GPU's rows against the "
                  f"CPU's (same weights: {c['same_weights']}): {c['agree']} of {c['compared']} agree within their "
                  f"completeness errors "
                  f"(|sum A_gpu - sum A_cpu| <= |error_gpu| + |error_cpu|); cells max |diff| "
                  f"{c['cells_max_abs_diff']:.2e} (relative to the pair's max |A|: {c['cells_max_rel_diff']:.2e}); "
                  f"the same N for both sentences in {c['same_steps']} pairs."]  # fmt: skip
        if c.get("cpu_quarantined") or c.get("gpu_quarantined"):
            lines[-1] += " Quarantined among the first pairs: " + "; ".join(
                f"on the {side.upper()} {len(q)}{' (' + ', '.join(f'{p} {r}' for p, r in q.items()) + ')' if q else ''}"
                for side, q in (("cpu", c.get("cpu_quarantined", {})), ("gpu", c.get("gpu_quarantined", {})))) + "."
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, text in (("run", "measure (on the GPU machine)"), ("cpu-rows", "the same pairs on this CPU (here)")):
        r = sub.add_parser(name, help=text)
        r.add_argument("--out", required=True, help="run: gpu-job.json, samples.jsonl, the runs, the subset; "
                                                    "cpu-rows: pairs.parquet, cells.parquet, weights.json")
        r.add_argument("--pairs", type=int, default=PAIRS)
        r.add_argument("--dataset", default="qqp")
        r.add_argument("--qqp-path", default=None, help="the bundled QQP subset (DIR/data/...), else as jobs.attribute")
        r.add_argument("--model", default=MODEL)
        r.add_argument("--layer", type=int, default=LAYER)
        r.add_argument("--steps", type=int, default=None, help="a fixed N (default: the job's adaptive N)")
        r.add_argument("--compare", type=int, default=COMPARE, help="pairs whose stored rows are compared")
    r = sub.choices["run"]
    r.add_argument("--cpu-rows", default=None, help="a `cpu-rows` folder of the same pairs and model")
    r.add_argument("--engine-sentences", type=int, default=ENGINE_SENTENCES,
                   help="the engine alone on a seeded sample of this many of the job's questions (0: all)")
    r.add_argument("--device", default=None, help="the actors' and the engine's device (default cuda when there)")
    r.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a dry run of the path)")
    r.add_argument("--logical-gpus", type=int, default=0, help="start Ray with this many GPUs it does not have")
    r.add_argument("--stop-by", type=float, default=0.0,
                   help="a time (seconds since the epoch): stop the job after the last wave that leaves time for "
                        "another and the steps after it (0: run every wave)")
    r.add_argument("--job-arg", action="append",
                   help="one more jobs.attribute argument (repeat), e.g. --job-arg=--wave-size=4096")
    sub.choices["cpu-rows"].add_argument("--runs", default=str(ROOT / "bench" / ".cache" / "gpu-cpu-runs"),
                                         help="the CPU run's store root")  # fmt: skip
    sub.add_parser("ray-check", help="start Ray as `run` does here, print its resources, stop it")
    rep = sub.add_parser("report", help="the markdown of one run's gpu-job.json")
    rep.add_argument("result")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if a.cmd == "run":
        return run(a)
    if a.cmd == "cpu-rows":
        return cpu_rows(a)
    if a.cmd == "ray-check":
        return ray_check()
    print(report(a.result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
