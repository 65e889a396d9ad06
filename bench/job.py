"""Job benchmark: throughput of the Ray job `python -m jobs.attribute` on QQP pairs, and its store.

    python bench/job.py                          # CPU: 1,000 QQP pairs, all-MiniLM-L6-v2, this machine
    python bench/job.py --pairs 200 --steps 4    # shorter
    python bench/job.py --executor local         # the job's stages in one process, without Ray
    python bench/job.py --gpu                    # all-mpnet-base-v2, layer 8, one GPU actor; extrapolated
                                                 # to the full QQP (404,290 pairs). Exits 0 without a GPU.

It runs the real job in a subprocess (a local Ray started by the job's own `ray.init()`) on the
first --pairs rows of a QQP subset file (--qqp-path or $XSBERT_QQP), into a fresh output directory (a reused one
would recompute nothing: the run id is idempotent), then reads the store with DuckDB:

  pairs/s, sentences/s   computed pairs (unique sentences) per second, over three time bases:
                         the whole process, the job's own wall_s (manifest.json), and its compute
                         time (the waves' factor + cell stages: what grows with the data)
  unique-sentence ratio  unique sentences / (2 x pairs): each unique sentence is integrated once
  store bytes per pair   bytes on disk of the run directory / stored pairs
  engine alone           the baseline, in the same run after the job: one factor actor as the job builds it
                         (jobs.attribution.actors.FactorActor with the job's engine settings, device, torch threads
                         and batch size) called in this process, without Ray, on a seeded sample of
                         --engine-sentences of the run's unique sentences, longest first in the job's batches. The
                         job's compute sentences/s over (the engine's sentences/s x the job's actors) is the share
                         of its actors' ideal rate the job reaches: what Ray, the driver, stage 2 and the writes cost.

The markdown table is printed and written into bench/results/job.md (its own section per mode,
so a GPU run does not overwrite the CPU table and vice versa).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from jobs.config import EXECUTORS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "job.md"

# The full Quora release (= GLUE QQP train + dev): pairs, and distinct questions among them.
QQP_FULL_PAIRS = 404_290
QQP_FULL_QUESTIONS = 537_933
# GPU workers in cluster.yaml (max_workers of the GPU group), for the cluster-wide estimate.
CLUSTER_GPUS = 8

CPU_DEFAULTS = {"model": "sentence-transformers/all-MiniLM-L6-v2", "layer": None, "pairs": 1000}
GPU_DEFAULTS = {"model": "all-mpnet-base-v2", "layer": 8, "pairs": 5000}
ENGINE_SENTENCES = 400  # the engine alone's sample of the run's unique sentences


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="all-mpnet-base-v2 layer 8 on one GPU actor")
    p.add_argument("--pairs", type=int, default=None, help="QQP pairs (default 1000 CPU, 5000 GPU)")
    p.add_argument("--dataset", default="qqp", help="--dataset of the job (default qqp: the subset of --qqp-path)")
    p.add_argument("--qqp-path", default=os.environ.get("XSBERT_QQP"),
                   help="the QQP subset file for --dataset qqp (default: $XSBERT_QQP)")
    p.add_argument("--model", default=None)
    p.add_argument("--layer", type=int, default=None, help="default: the job's (CPU), 8 (GPU)")
    p.add_argument("--steps", type=int, default=None, help="quadrature nodes (default: the job's)")
    p.add_argument("--num-actors", type=int, default=None)
    p.add_argument("--executor", choices=EXECUTORS, default=EXECUTORS[0],
                   help="the job's --executor (local: its stages in one process, without Ray)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--out", default=None, help="run root (default: a temp dir, removed afterwards)")
    p.add_argument("--results", default=str(RESULTS), help="markdown file to update ('' = don't write)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the job is killed")
    p.add_argument("--engine-sentences", type=int, default=ENGINE_SENTENCES,
                   help="unique sentences of the run the engine alone computes (a seeded sample; 0: none)")
    return p


# Flags that say where things go and how long to wait, not what is measured: left out of the results' command line.
NOT_MEASURED = ("help", "out", "results", "timeout", "qqp_path")


def command_line(args: argparse.Namespace) -> str:
    """`python bench/job.py ...` with every flag that sets what is measured, read from the parser's own flags (a new
    flag shows here without a word more) and the values the run used (the model and pairs filled in by main)."""
    words = ["python", "bench/job.py"]
    for action in build_parser()._actions:
        value = getattr(args, action.dest, None)
        if action.dest in NOT_MEASURED or value is None or value is False or value == action.default:
            continue
        words += [action.option_strings[-1], *([] if action.nargs == 0 else [str(value)])]
    return shlex.join(words)


# --------------------------------------------------------------------------- running the job
def job_command(args: argparse.Namespace, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "jobs.attribute", "--dataset", args.dataset, "--limit", str(args.pairs)]
    if args.dataset == "qqp":
        if not args.qqp_path:
            raise SystemExit("bench/job.py: error: --dataset qqp needs a QQP subset file: --qqp-path FILE or $XSBERT_QQP")
        cmd += ["--qqp-path", args.qqp_path]
    cmd += ["--model", args.model, "--out", str(out), "--quiet"]
    for flag, value in (
        ("--layer", args.layer),
        ("--steps", args.steps),
        ("--num-actors", args.num_actors),
        ("--gpus-per-actor", 1 if args.gpu else None),
        ("--batch-size", args.batch_size),
        ("--executor", None if args.executor == EXECUTORS[0] else args.executor),
    ):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def run_job(cmd: list[str], timeout: float) -> tuple[str, float]:
    """Run the job, echoing its output; return (output, wall seconds)."""
    # The job's own local Ray (no submission, no join): no token written into the machine's ~/.ray/auth_token.
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)  # a local Ray of its own, not a cluster this shell points at
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            lines.append(line)
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                raise TimeoutError(f"job still running after {timeout:.0f}s")
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    wall = time.perf_counter() - t0
    output = "".join(lines)
    if proc.returncode != 0:
        raise RuntimeError(f"job exited with {proc.returncode}")
    return output, wall


def store_dir(output: str) -> Path:
    found = re.findall(r"^store: (.+)$", output, flags=re.MULTILINE)
    if not found:
        raise RuntimeError("the job did not print `store: <run dir>`")
    return Path(found[-1].strip())


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def table_rows(run_dir: Path, table: str) -> int:
    import duckdb

    files = list((run_dir / table).glob("**/*.parquet"))
    if not files:
        return 0
    return (
        duckdb.connect().execute(f"select count(*) from read_parquet('{run_dir / table}/**/*.parquet')").fetchone()[0]
    )


# --------------------------------------------------------------------------- measuring
class LoadSampler:
    """Samples the 1-minute load average every few seconds while the job runs (other work shows up)."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def start(self) -> None:
        self.samples.append(os.getloadavg()[0])
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)


def measure(args: argparse.Namespace, cmd: list[str]) -> dict:
    load = LoadSampler()
    load.start()
    try:
        output, process_wall = run_job(cmd, args.timeout)
    finally:
        load.stop()
    run_dir = store_dir(output)
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    last = manifest["runs"][-1]  # this invocation (a fresh --out holds exactly one)
    waves = last.get("waves", [])
    return {
        "run_dir": run_dir,
        "config": manifest.get("config", {}),
        "resources": last.get("resources", {}),
        "process_wall_s": process_wall,
        "job_wall_s": float(last["wall_s"]),
        "factors_s": sum(w["factors_s"] for w in waves),
        "cells_s": sum(w["cells_s"] for w in waves),
        "compute_s": sum(w["factors_s"] + w["factor_meta_s"] + w["cells_s"] for w in waves),
        "waves": len(waves),
        "pairs": table_rows(run_dir, "pairs"),
        "sentences": table_rows(run_dir, "sentences"),
        "computed_pairs": last["counts"]["computed_pairs"],
        "computed_sentences": last["counts"]["computed_sentences"],
        "cells": table_rows(run_dir, "cells"),
        "word_cells": table_rows(run_dir, "word_cells"),
        "quarantined": table_rows(run_dir, "quarantine"),
        "store_bytes": dir_bytes(run_dir),
        "load": (load.mean, load.max),
    }


def engine_alone(args: argparse.Namespace, m: dict, cmd: list[str]) -> dict | None:
    """The engine alone on a seeded sample of the run's unique sentences: one FactorActor as the job's (its engine
    settings, device, threads, batch size, factor memory), called here without Ray, the sentences longest first in
    the job's batches (stage 1's blocks), after a warm-up call. Returns its sentences/s, or None for 0 sentences."""
    if not args.engine_sentences:
        return None
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.attribute import settings
    from jobs.attribution.actors import FactorActor
    from jobs.attribution.hooks import Hooks
    from jobs.attribution.stage1 import actor_args

    rows = pq.read_table(m["run_dir"] / "sentences", columns=["sentence_id", "text", "n_tokens"]).to_pylist()
    rows = sorted(rows, key=lambda r: r["sentence_id"])
    if args.engine_sentences < len(rows):
        rows = random.Random(0).sample(rows, args.engine_sentences)
    rows.sort(key=lambda r: (-r["n_tokens"], r["text"]))
    job = settings(cmd[3:])  # the job's own command line, parsed as it parsed it
    res = m["resources"]
    actor = FactorActor(**actor_args(job.attribution.engine, res, Hooks()))
    size = res["batch_size"]
    blocks = [pa.table({"sentence_id": [[r["sentence_id"] for r in rows[k : k + size]]],
                        "text": [[r["text"] for r in rows[k : k + size]]]}) for k in range(0, len(rows), size)]  # fmt: skip
    actor(pa.table({"sentence_id": [["warm-up"]], "text": [[rows[-1]["text"]]]}))
    t0 = time.perf_counter()
    done = sum(actor(b).num_rows for b in blocks)
    seconds = time.perf_counter() - t0
    return {"sentences": done, "tokens": sum(r["n_tokens"] for r in rows), "seconds": seconds,
            "sentences_per_s": done / seconds, "threads": res["threads"], "device": res["device"]}  # fmt: skip


def machine() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} (+{os.cpu_count()} CPU cores)"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, CPU only"


def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def report(args: argparse.Namespace, m: dict) -> str:
    pairs, sentences = m["computed_pairs"], m["computed_sentences"]
    cfg, res = m["config"], m["resources"]
    title = "GPU" if args.gpu else "CPU"
    rate = {  # (pairs/s, sentences/s) over three time bases
        "process": (pairs / m["process_wall_s"], sentences / m["process_wall_s"]),
        "job": (pairs / m["job_wall_s"], sentences / m["job_wall_s"]),
        "compute": (pairs / m["compute_s"], sentences / m["compute_s"]),
    }
    rows = [
        ("machine", machine()),
        (
            f"1-min load average during the run, mean / max ({os.cpu_count()} cores; the job alone: ~2)",
            "{:.1f} / {:.1f}".format(*m["load"]),
        ),
        (
            "model / layer / rule / steps (adaptive N's tolerance)",
            f"{cfg.get('model')} / {cfg.get('layer')} / {cfg.get('rule')} / {cfg.get('steps')} "
            f"({cfg.get('tolerance') or 'fixed N'})",
        ),
        (
            "actors",
            (
                f"{res.get('num_actors')} x ({res.get('cpus_per_actor')} CPU, {res.get('gpus_per_actor')} GPU, "
                f"{res.get('threads')} torch threads) on {res.get('device')}, executor {res.get('executor', 'ray')}"
            ),
        ),
        ("dataset", f"first {args.pairs:,} rows of {args.dataset} ({cfg.get('dataset', {}).get('name')})"),
        ("pairs stored (quarantined)", f"{fmt_int(m['pairs'])} ({fmt_int(m['quarantined'])})"),
        ("unique sentences", fmt_int(sentences)),
        ("unique-sentence ratio (unique / 2·pairs)", f"{sentences / max(1, 2 * pairs):.3f}"),
        (
            "wall time: process / job / compute (s)",
            f"{m['process_wall_s']:.1f} / {m['job_wall_s']:.1f} / {m['compute_s']:.1f}",
        ),
        ("  of which sentence factors / pair cells (s)", f"{m['factors_s']:.1f} / {m['cells_s']:.1f}"),
        ("pairs/s: process / job / compute", " / ".join(f"{rate[k][0]:.2f}" for k in ("process", "job", "compute"))),
        (
            "sentences/s: process / job / compute",
            " / ".join(f"{rate[k][1]:.2f}" for k in ("process", "job", "compute")),
        ),
        ("store size (MB)", f"{m['store_bytes'] / 1e6:.2f}"),
        ("store bytes per pair", fmt_int(m["store_bytes"] / max(1, m["pairs"]))),
        (
            "cells / word cells per pair",
            f"{m['cells'] / max(1, m['pairs']):.1f} / {m['word_cells'] / max(1, m['pairs']):.1f}",
        ),
    ]
    if eng := m.get("engine"):
        ideal = eng["sentences_per_s"] * res["num_actors"]
        rows += [
            (
                f"engine alone, one actor ({eng['threads']} torch threads, {eng['device']}), same run, "
                f"{eng['sentences']:,} of the unique sentences: sentences/s",
                f"{eng['sentences_per_s']:.2f}",
            ),
            (
                f"job compute sentences/s / (engine alone x {res['num_actors']} actors)",
                f"**{rate['compute'][1] / ideal:.2f}**",
            ),
            ("job process sentences/s / (engine alone x actors)", f"{rate['process'][1] / ideal:.2f}"),
        ]
    if args.gpu:
        pairs_s, sentences_s = rate["compute"]
        by_pairs_h = QQP_FULL_PAIRS / pairs_s / 3600
        by_sentences_h = QQP_FULL_QUESTIONS / sentences_s / 3600
        rows += [
            (f"full QQP, {QQP_FULL_PAIRS:,} pairs at compute pairs/s, 1 GPU (h)", f"{by_pairs_h:.2f}"),
            (
                f"full QQP, {QQP_FULL_QUESTIONS:,} unique questions at compute sentences/s, 1 GPU (h)",
                f"{by_sentences_h:.2f}",
            ),
            (
                f"same, {CLUSTER_GPUS} GPU workers (cluster.yaml), linear scaling (h)",
                f"{by_sentences_h / CLUSTER_GPUS:.2f}",
            ),
            (
                "full QQP store at this bytes/pair (GB)",
                f"{QQP_FULL_PAIRS * m['store_bytes'] / max(1, m['pairs']) / 1e9:.1f}",
            ),
        ]
    lines = [
        f"## {title}: `{command_line(args)}` ({dt.date.today().isoformat()})",
        "",
        "| metric | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
        "Time bases: *process* = the whole `python -m jobs.attribute` process (imports, driver model load,",
        "Ray start, reading, attribution, writing); *job* = the job's own `wall_s` in manifest.json (from",
        "its start, after imports); *compute* = the waves' stage-1 (factor actors, including their model",
        "load) plus stage-2 (pair cells) time, i.e. the part that grows with the data.",
    ]
    if args.gpu:
        lines += [
            "",
            "The extrapolation uses the compute rate (start-up is paid once) and the sentence count: the cost",
            f"is per unique sentence, and the full QQP repeats questions ({QQP_FULL_QUESTIONS:,} distinct in",
            f"{2 * QQP_FULL_PAIRS:,} slots) more than a short prefix does. Stage 2 (cells) runs on CPU and",
            "scales with pairs, not sentences: see its share above.",
        ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, key: str, text: str) -> None:
    """Replace this mode's section of the results file (between its markers), keeping the other."""
    begin, end = f"<!-- bench/job.py {key} -->", f"<!-- /bench/job.py {key} -->"
    block = f"{begin}\n{text}{end}\n"
    old = path.read_text(encoding="utf-8") if path.exists() else "# Job benchmark (bench/job.py)\n\n"
    if begin in old and end in old:
        new = old[: old.index(begin)] + block + old[old.index(end) + len(end) + 1 :]
    else:
        new = old.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new, encoding="utf-8")


def main(args: argparse.Namespace) -> int:
    defaults = GPU_DEFAULTS if args.gpu else CPU_DEFAULTS
    args.model = args.model or defaults["model"]
    args.pairs = args.pairs or defaults["pairs"]
    if args.layer is None:
        args.layer = defaults["layer"]
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print(
                "bench/job.py --gpu: no GPU on this machine (torch.cuda.is_available() is False); "
                "nothing measured. Run it on a GPU node, e.g. a worker of cluster.yaml."
            )
            return 0
        if args.num_actors is None:
            args.num_actors = 1

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="xsbert-bench-job-"))
    try:
        cmd = job_command(args, out)
        m = measure(args, cmd)
        m["engine"] = engine_alone(args, m, cmd)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    text = report(args, m)
    print()
    print(text)
    if args.results:
        write_section(Path(args.results), "gpu" if args.gpu else "cpu", text)
        print(f"written: {args.results}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(build_parser().parse_args()))
    except (RuntimeError, TimeoutError) as exc:  # the job's own output, above, says why
        sys.exit(f"bench/job.py: error: {exc}")
