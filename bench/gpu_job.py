"""The real attribution job with GPU actors, beside the engine alone on the same questions, in one process.

On a machine with a CUDA GPU and the offline bundle installed (docs/OFFLINE.md), with that environment's Python:

    python bench/gpu_job.py run --qqp-path DIR/data/qqp_glue_train_subset.tsv.gz --out gpu-job   # there
    python bench/gpu_job.py compare gpu-job                  # here: the 50 stored pairs against a CPU run of them
    python bench/gpu_job.py report gpu-job/gpu-job.json      # here: bench/results/gpu-job.md

`run` measures, writing gpu-job/gpu-job.json again after every step (a run cut short still tells what it measured)
and one line per second of samples to gpu-job/samples.jsonl:

  job      `jobs.attribute` in this process (prepare -> attribute, as `python -m jobs.attribute` runs it) on the
           first --pairs QQP pairs (20,000) with all-MiniLM-L6-v2 at layer 4, Gauss-Legendre N=10 (the full-QQP
           settings of bench/gpu.py), on a local Ray with one factor actor per GPU (the job's GPU defaults: batch
           128, waves of 16,384 pairs): pairs/s and sentences/s end to end; the share of the wall time in each stage
           (prepare: read, tokenise, load; stage 1: waiting for factors; stage 2: pair cells; commit); per wave, GPU
           utilisation and memory (nvidia-smi, each second), the driver's memory (the job's own per-wave record) and
           the Ray workers' (psutil, each second)
  engine   the engine alone (Explainer.factors, what a factor actor calls) on the same unique questions, longest
           first in batches of 128, on the same GPU after the job's Ray is shut down: sentences/s, torch.cuda's
           peak memory; the job's rate over the engine's is the job's overhead on a GPU node
  subset   the first --compare (50) pairs' stored rows (pairs and cells) written to gpu-job/subset-*.parquet, for
           `compare` to set beside a CPU run of the same pairs

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
if (ROOT / "jobs").is_dir() and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results" / "gpu-job.md"
MODEL, LAYER, STEPS, RULE = "sentence-transformers/all-MiniLM-L6-v2", 4, 10, "gauss-legendre"  # as bench/gpu.py
BATCH = 128  # jobs.attribute DEFAULT_BATCH_SIZE_GPU
QQP_PAIRS, QQP_QUESTIONS = 404_290, 537_933  # full GLUE QQP train, as bench/gpu.py


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


def job_args(a: argparse.Namespace, out_runs: Path, limit: int) -> list[str]:
    argv = ["--dataset", a.dataset, "--limit", str(limit), "--model", a.model, "--layer", str(a.layer),
            "--rule", a.rule, "--steps", str(a.steps), "--out", str(out_runs), "--quiet"]  # fmt: skip
    if a.qqp_path:
        argv += ["--qqp-path", a.qqp_path]
    if a.device:
        argv += ["--device", a.device]
    return argv + list(a.job_arg or [])


def run_job(a: argparse.Namespace, rec: Recorder, sampler: Sampler) -> dict[str, Any]:
    """jobs.attribute in this process; per-wave records merged with the sampler's windows."""
    import ray

    from jobs.attribute import settings
    from jobs.attribution.prepare import prepare
    from jobs.attribution.run import attribute

    if a.logical_gpus:  # Ray told of GPUs that are not there: the GPU actor path on a CPU machine
        ray.init(num_cpus=os.cpu_count() or 1, num_gpus=a.logical_gpus, include_dashboard=False,
                 log_to_driver=False)  # fmt: skip
    args = settings(job_args(a, Path(a.out) / "runs", a.pairs))
    sampler.phase = "prepare"
    t0 = time.time()
    prep = prepare(args)
    t_prep = time.time()
    waves: list[dict[str, Any]] = []
    last = [t_prep]

    def on_wave(line: str) -> None:
        now = time.time()
        waves.append({"line": line, "t_end": now, "seconds": now - last[0], **sampler.window(last[0], now)})
        last[0] = now
        print(f"gpu_job: {line}", flush=True)
        rec.update(job_waves=waves)

    sampler.phase = "job"
    summary = attribute(prep, on_wave=on_wave)
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


def unique_questions(run_dir: Path) -> list[str]:
    """The unique sentences the job attributed, from its store (the same texts the engine gets)."""
    import pyarrow.parquet as pq

    return sorted(set(pq.read_table(run_dir / "sentences", columns=["text"]).column("text").to_pylist()))


def run_engine(a: argparse.Namespace, texts: list[str], rec: Recorder, sampler: Sampler) -> dict[str, Any]:
    """Explainer.factors alone on `texts`, longest first in batches of BATCH, on the job's device."""
    import torch

    from xsbert_core import Explainer

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sampler.phase = "engine"
    ex = Explainer(a.model, layer=a.layer, rule=a.rule, steps=a.steps, device=device)
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
    for b in batches:
        ex.factors(b, batch_size=BATCH)
    if cuda:
        torch.cuda.synchronize()
    t1 = time.time()
    eng = {"sentences": len(texts), "tokens": sum(lengths), "seconds": t1 - t0,
           "sentences_per_s": len(texts) / (t1 - t0), "device": device, "batch": BATCH,
           "whole": sampler.window(t0, t1)}  # fmt: skip
    if cuda:
        eng["torch_cuda_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        eng["torch_cuda_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    rec.update(engine=eng)
    return eng


def write_subset(run_dir: Path, out: Path, n: int, rec: Recorder) -> dict[str, Any]:
    """The first n pairs (by source row) of the run: their pairs rows and cells, as Parquet under `out`."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pairs = pq.read_table(run_dir / "pairs")
    pairs = pairs.sort_by([("row", "ascending")]).slice(0, n) if "row" in pairs.column_names else pairs.slice(0, n)
    ids = pairs.column("pair_id")
    cells = pq.read_table(run_dir / "cells")
    cells = cells.filter(pc.is_in(cells.column("pair_id"), value_set=ids))
    pq.write_table(pairs, out / "subset-pairs.parquet")
    pq.write_table(cells, out / "subset-cells.parquet")
    sub = {"pairs": pairs.num_rows, "cells": cells.num_rows, "limit": n}
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
    rec.update(environment=environment(device), settings={"model": a.model, "layer": a.layer, "rule": a.rule,
               "steps": a.steps, "pairs": a.pairs, "dataset": a.dataset, "compare": a.compare,
               "logical_gpus": a.logical_gpus}, status="running")  # fmt: skip
    sampler = Sampler(out / "samples.jsonl")
    sampler.start()
    try:
        job = run_job(a, rec, sampler)
        import ray

        ray.shutdown()  # the actors leave the GPU before the engine runs alone
        texts = unique_questions(Path(job["run_dir"]))
        eng = run_engine(a, texts, rec, sampler)
        rec.update(ratio={"job_over_engine_sentences_per_s": job["sentences_per_s"] / eng["sentences_per_s"]})
        write_subset(Path(job["run_dir"]), out, a.compare, rec)
        rec.update(status="done")
    finally:
        sampler.stop.set()
        sampler.join(timeout=5)
    print(json.dumps({k: rec.data.get(k) for k in ("job", "engine", "ratio", "subset")}, indent=1, default=str))
    return 0


# --------------------------------------------------------------------------- compare (here)
def compare(a: argparse.Namespace) -> int:
    """The stored subset against the same pairs attributed here, on the CPU, with the same settings."""
    import numpy as np
    import pyarrow.parquet as pq

    from jobs.attribute import main as job_main
    from jobs.attribute import parse_args

    out = Path(a.result)
    res = json.loads((out / "gpu-job.json").read_text())
    s = res["settings"]
    argv = ["--dataset", s["dataset"], "--limit", str(s["compare"]), "--model", a.model or s["model"],
            "--layer", str(s["layer"]), "--rule", s["rule"], "--steps", str(s["steps"]), "--device", "cpu",
            "--gpus-per-actor", "0", "--out", str(out / "cpu-runs"), "--quiet"]  # fmt: skip
    if a.qqp_path:
        argv += ["--qqp-path", a.qqp_path]
    summary = job_main(parse_args(argv))
    cpu_dir = Path(summary["run_dir"])
    gp = pq.read_table(out / "subset-pairs.parquet").to_pandas().set_index("pair_id")
    cp = pq.read_table(cpu_dir / "pairs").to_pandas().set_index("pair_id").loc[gp.index]
    gc_ = pq.read_table(out / "subset-cells.parquet").to_pandas().set_index(["pair_id", "i", "j"]).sort_index()
    cc = pq.read_table(cpu_dir / "cells").to_pandas().set_index(["pair_id", "i", "j"]).sort_index()
    cc = cc.loc[cc.index.get_level_values(0).isin(gp.index)]
    if len(gc_) != len(cc) or not gc_.index.equals(cc.index):
        print(f"compare: the two runs store different cells ({len(gc_)} vs {len(cc)})", file=sys.stderr)
        return 2
    scale = float(np.abs(cc.value).max())
    cmp = {"pairs": len(gp), "cells": len(cc), "cpu_run_dir": str(cpu_dir),
           "cells_max_abs_diff": float(np.abs(gc_.value - cc.value).max()), "cells_max_abs": scale,
           "cells_max_rel_diff": float(np.abs(gc_.value - cc.value).max() / scale),
           "sum_max_abs_diff": float(np.abs(gp.attribution_sum - cp.attribution_sum).max()),
           "score_max_abs_diff": float(np.abs(gp.score - cp.score).max()),
           "same_weights": json.loads((cpu_dir / "manifest.json").read_text())["config"]["weights_sha256"]
           == res.get("job", {}).get("weights_sha256")}  # fmt: skip
    res["compare_cpu"] = cmp
    (out / "gpu-job.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps(cmp, indent=1))
    return 0


# --------------------------------------------------------------------------- report (here)
def report(path: str) -> str:
    r = json.loads(Path(path).read_text())
    env, job = r["environment"], r.get("job")
    lines = [f"## {env.get('gpu', env['device'])}: the job with GPU actors ({env['stamp']}, "
             f"commit {env.get('commit')})",
             "", f"torch {env['torch']}, ray {env.get('ray')}, Python {env['python']}, {env['cpus']} CPUs; "
             f"status {r.get('status')}.", ""]  # fmt: skip
    s = r["settings"]
    lines += [f"Settings: {s['model']}, layer {s['layer']}, {s['rule']} N={s['steps']}, the first {s['pairs']:,} pairs "
              f"of {s['dataset']}.", ""]  # fmt: skip
    if job:
        eng = r.get("engine")
        lines += ["| | pairs | sentences | wall s | pairs/s | sentences/s |", "|---|---|---|---|---|---|",
                  f"| job (end to end) | {job['pairs']:,} | {job['sentences']:,} | {job['wall_s']:.1f} | "
                  f"{job['pairs_per_s']:.1f} | {job['sentences_per_s']:.1f} |"]  # fmt: skip
        if eng:
            lines.append(f"| engine alone | | {eng['sentences']:,} | {eng['seconds']:.1f} | | "
                         f"{eng['sentences_per_s']:.1f} |")  # fmt: skip
            lines += ["", f"Job / engine (sentences/s): **{r['ratio']['job_over_engine_sentences_per_s']:.2f}**."]
            q = QQP_QUESTIONS / eng["sentences_per_s"] / 3600
            lines.append(f"Full QQP ({QQP_PAIRS:,} pairs, {QQP_QUESTIONS:,} questions) at these rates: job "
                         f"{QQP_QUESTIONS / job['sentences_per_s'] / 3600:.2f} h, engine alone {q:.2f} h.")
        lines += ["", "Shares of the job's wall time: " + ", ".join(f"{k[:-2]} {v:.0%}" for k, v in
                                                                    job["shares"].items()), ""]  # fmt: skip
        lines += ["| wave | pairs | sentences | s | factors s | cells s | commit s | GPU util % mean / max | "
                  "GPU mem MiB max | driver private MB | workers RSS MB max |", "|" + "---|" * 11]  # fmt: skip
        for k, w in enumerate(r.get("job_waves", []), 1):
            util = (f"{w['gpu_util_pct_mean']:.0f} / {w['gpu_util_pct_max']:.0f}" if "gpu_util_pct_mean" in w
                    else "n/a")  # fmt: skip
            lines.append(f"| {k} | {w.get('pairs', '')} | {w.get('sentences', '')} | {w['seconds']:.1f} | "
                         f"{w.get('factors_s', 0):.1f} | {w.get('cells_s', 0):.1f} | {w.get('commit_s', 0):.1f} | "
                         f"{util} | {w.get('gpu_mem_used_mib_max', 'n/a')} | {w.get('driver_private_mb', 0):.0f} | "
                         f"{w.get('workers_rss_mb_max', 0):.0f} |")  # fmt: skip
        if eng and "torch_cuda_peak_allocated_gib" in eng:
            lines += ["", f"Engine alone: torch.cuda peak {eng['torch_cuda_peak_allocated_gib']:.1f} GiB allocated, "
                      f"{eng['torch_cuda_peak_reserved_gib']:.1f} GiB reserved."]  # fmt: skip
    if "compare_cpu" in r:
        c = r["compare_cpu"]
        lines += ["", f"The first {c['pairs']} pairs' stored cells against a CPU run of them (same weights: "
                  f"{c['same_weights']}): max |diff| {c['cells_max_abs_diff']:.2e} of max |A| {c['cells_max_abs']:.3f} "
                  f"(relative {c['cells_max_rel_diff']:.2e}); sums {c['sum_max_abs_diff']:.2e}, scores "
                  f"{c['score_max_abs_diff']:.2e}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure (on the GPU machine)")
    r.add_argument("--out", required=True, help="folder for gpu-job.json, samples.jsonl, the runs, the subset")
    r.add_argument("--pairs", type=int, default=20_000)
    r.add_argument("--dataset", default="qqp")
    r.add_argument("--qqp-path", default=None, help="the bundled QQP subset (DIR/data/...), else as jobs.attribute")
    r.add_argument("--model", default=MODEL)
    r.add_argument("--layer", type=int, default=LAYER)
    r.add_argument("--rule", default=RULE)
    r.add_argument("--steps", type=int, default=STEPS)
    r.add_argument("--compare", type=int, default=50, help="pairs whose stored values are kept for `compare`")
    r.add_argument("--device", default=None, help="the actors' and the engine's device (default cuda when there)")
    r.add_argument("--allow-cpu", action="store_true", help="run without a GPU (a dry run of the path)")
    r.add_argument("--logical-gpus", type=int, default=0, help="start Ray with this many GPUs it does not have")
    r.add_argument("--job-arg", action="append",
                   help="one more jobs.attribute argument (repeat), e.g. --job-arg=--wave-size=4096")
    c = sub.add_parser("compare", help="the stored subset against a CPU run of the same pairs (here)")
    c.add_argument("result", help="the run's --out folder")
    c.add_argument("--qqp-path", default=None)
    c.add_argument("--model", default=None, help="the same model here (default: the run's --model)")
    rep = sub.add_parser("report", help="write bench/results/gpu-job.md from gpu-job.json (here)")
    rep.add_argument("result")
    rep.add_argument("--results", default=str(RESULTS))
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if a.cmd == "run":
        return run(a)
    if a.cmd == "compare":
        return compare(a)
    text = report(a.result)
    Path(a.results).write_text("# The job with GPU actors on one GPU (bench/gpu_job.py)\n\n" + text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
