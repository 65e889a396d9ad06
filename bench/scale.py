"""Full-QQP scale rehearsal: the real `jobs.attribute` at 1k ... 404k pairs with a near-free model of real output size.

    python bench/scale.py --pairs 1000 10000                  # sizes to run (each into a fresh store)
    python bench/scale.py --pairs 404290 --wave-size 16384    # the full QQP size
    python bench/scale.py --pairs 10000 --resume              # also: SIGKILL the driver late, time the resume
    python bench/scale.py --pairs 10000 --cell-writer driver  # the cells through the driver (as before workers wrote them)
    python bench/scale.py --pairs 404290 --wave-size 16384 --batch-size 128 --s3 --kill-late  # S3, kill, resume

What it runs, and why it is a fair rehearsal (bench/results/scale.md says the same beside the numbers):

* Pairs: `make_pairs(n)` builds n pairs of real QQP questions (a QQP subset file, $XSBERT_QQP; the 23,497-pair
  one measured: 43,948 unique questions) with the full release's rate of shared questions (537,933 unique
  questions over 404,290 pairs, scaled to n). Where more unique texts are needed than the subset has, variant r >= 1 of a question is the
  question with one extra word (MARKERS[r - 1], a single WordPiece token) before its final `?`: real texts, real
  lengths + 1 token. Slots: every unique text once, the rest drawn uniformly (seeded), shuffled into pairs
  (never a text with itself); labels drawn at QQP's duplicate rate.
* Model: `rehearsal_model()`: all-MiniLM-L6-v2's tokenizer, a random BERT with one layer of hidden size 32, mean
  pooling and a Dense 32 -> 384 after it, so the embedding (and every factor the job ships: D x S floats) has
  MiniLM's size D = 384 while the attribution costs almost nothing; attributed at layer 0, riemann N = 2 (--rule,
  --steps: another quadrature, into a store of its own, e.g. the second run of the two-run SQL files).
* The job: `python -m jobs.attribute` in a subprocess on a local Ray (started by the job), `-q`, into a fresh
  store; then the same command again (nothing to do); optionally a third store whose driver is SIGKILLed once
  all but the last wave have committed, and the resume timed (--resume), or that kill and resume in the one store
  (--kill-late: at 404k it saves the time of a second full run). --s3 puts the stores on a moto_server on
  127.0.0.1, reached over HTTP by the job's own store code (objects in the server's memory: its RSS is sampled). A sampler thread records, every 0.25 s, the
  driver's RSS, the largest and the summed RSS of Ray's worker processes, and the bytes used in /dev/shm (Ray's
  object store on Linux).

Results: bench/results/scale.json (every measurement) and the table in bench/results/scale.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gzip
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The real QQP questions the pairs are made of: a QQP subset file (GLUE's TSV layout), not in the repository.
QQP = os.environ.get("XSBERT_QQP")
CACHE = Path(os.environ.get("XSBERT_BENCH_CACHE", ROOT / "bench" / ".cache" / "scale"))
RESULTS_JSON = ROOT / "bench" / "results" / "scale.json"
RESULTS_MD = ROOT / "bench" / "results" / "scale.md"

QQP_FULL_PAIRS = 404_290
QQP_FULL_QUESTIONS = 537_933
QQP_DUPLICATE_RATE = 0.3692  # is_duplicate = 1 in the full release
MARKERS = ("also", "really", "now", "then", "here", "there", "today", "again", "too", "still", "please", "indeed",
           "though", "instead", "anyway", "maybe", "actually", "exactly", "overall", "generally")  # fmt: skip
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
JOB_FLAGS = ["--layer", "0", "-q"]  # with --rule and --steps (riemann, 2 unless given)


# --------------------------------------------------------------------------- data and model
def make_pairs(n: int, seed: int = 0) -> Path:
    """CACHE/pairs-<n>.parquet: n pairs of real QQP questions with the full release's share of repeated questions."""
    import numpy as np
    import pandas as pd

    path = CACHE / f"pairs-{n}.parquet"
    if path.exists():
        return path
    if not QQP:
        raise SystemExit("bench/scale.py: error: the pairs are made of real QQP questions: set $XSBERT_QQP to a QQP "
                         "subset file")  # fmt: skip
    with gzip.open(QQP, "rt", encoding="utf-8") as fh:
        df = pd.read_csv(fh, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    base = list(pd.unique(pd.concat([df.question1, df.question2])))
    unique = min(2 * n, max(2, round(n * QQP_FULL_QUESTIONS / QQP_FULL_PAIRS)))
    if unique > len(base) * (len(MARKERS) + 1):
        raise SystemExit(f"{n} pairs need {unique} unique questions; at most {len(base) * (len(MARKERS) + 1)}")

    def variant(k: int) -> str:
        q, r = base[k % len(base)], k // len(base)
        if r == 0:
            return q
        word = MARKERS[r - 1]
        return f"{q[:-1].rstrip()} {word}?" if q.endswith("?") else f"{q} {word}"

    rng = np.random.default_rng(seed)
    texts = [variant(k) for k in range(unique)]
    slots = np.concatenate([np.arange(unique), rng.integers(0, unique, 2 * n - unique)])
    rng.shuffle(slots)
    a, b = slots[0::2].copy(), slots[1::2].copy()
    same = np.nonzero(a == b)[0]
    while len(same):  # never a question with itself
        b[same] = rng.integers(0, unique, len(same))
        same = same[a[same] == b[same]]
    out = pd.DataFrame({
        "id": np.arange(n).astype(str),
        "question1": [texts[k] for k in a],
        "question2": [texts[k] for k in b],
        "is_duplicate": (rng.random(n) < QQP_DUPLICATE_RATE).astype(int).astype(str),
    })  # fmt: skip
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    out.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path


def rehearsal_model() -> Path:
    """CACHE/rehearsal-model: MiniLM's tokenizer, random 1-layer BERT (hidden 32) -> mean pooling -> Dense 32->384."""
    folder = CACHE / "rehearsal-model"
    if (folder / "modules.json").exists():
        return folder
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from xsbert_core import resolve_model

    torch.manual_seed(0)
    minilm = Path(resolve_model(MINILM))
    tok = BertTokenizerFast.from_pretrained(minilm)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="rehearsal-"))
    BertModel(config).save_pretrained(tmp / "bert")
    tok.save_pretrained(tmp / "bert")
    word = models.Transformer(str(tmp / "bert"), max_seq_length=256)
    pool = models.Pooling(32, pooling_mode="mean")
    dense = models.Dense(32, 384, activation_function=torch.nn.Identity())
    model = SentenceTransformer(modules=[word, pool, dense])
    folder.parent.mkdir(parents=True, exist_ok=True)
    model.save(str(folder))
    shutil.rmtree(tmp, ignore_errors=True)
    return folder


def engine_rate(model: str, texts: list[str], **settings) -> float:
    """Seconds per sentence of Explainer.factors alone (one process, 1 torch thread, batches of 64)."""
    import torch

    from xsbert_core import Explainer

    torch.set_num_threads(1)
    ex = Explainer(model, **settings)
    ex.factors(texts[:4])  # warm-up
    t0 = time.perf_counter()
    for k in range(0, len(texts), 64):
        ex.factors(texts[k : k + 64], batch_size=64)
    return (time.perf_counter() - t0) / len(texts)


# --------------------------------------------------------------------------- sampling
class Sampler(threading.Thread):
    """Peak RSS of the driver (the job's process) and of Ray's workers, and peak /dev/shm use, every `period` s.

    The driver's RSS counts the object-store pages it has mapped (RssShmem: shared with /dev/shm, not the
    driver's own memory), so its private part (RssAnon) is sampled too; with an `endpoint` pid (--s3: the
    moto_server, which keeps the objects in memory) its RSS as well."""

    def __init__(self, pid: int, period: float = 0.25, endpoint: int | None = None) -> None:
        super().__init__(daemon=True)
        self.pid, self.period, self.endpoint = pid, period, endpoint
        self.endpoint_rss = 0
        self.stop_event = threading.Event()
        self.driver_rss = self.worker_rss_max = self.workers_rss_sum = self.shm_used = 0
        self.driver_anon = self.driver_shmem = 0
        self.wave_anon = self.wave_shmem = 0  # the peaks since the last wave's commit line (mark())
        self.by_wave: list[tuple[float, float]] = []
        self.shm_base = self._shm()

    @staticmethod
    def _shm() -> int:
        try:
            return shutil.disk_usage("/dev/shm").used
        except OSError:
            return 0

    @staticmethod
    def _status(pid: int) -> tuple[int, int]:
        """(RssAnon, RssShmem) of `pid` in bytes, from /proc (0, 0 where there is none)."""
        fields = {"RssAnon": 0, "RssShmem": 0}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in fields:
                    fields[key] = int(value.split()[0]) * 1024
        return fields["RssAnon"], fields["RssShmem"]

    def run(self) -> None:
        import psutil

        while not self.stop_event.is_set():
            with contextlib.suppress(psutil.Error):
                self.driver_rss = max(self.driver_rss, psutil.Process(self.pid).memory_info().rss)
                anon, shmem = self._status(self.pid)
                self.driver_anon, self.driver_shmem = max(self.driver_anon, anon), max(self.driver_shmem, shmem)
                self.wave_anon, self.wave_shmem = max(self.wave_anon, anon), max(self.wave_shmem, shmem)
            if self.endpoint is not None:
                with contextlib.suppress(psutil.Error):
                    self.endpoint_rss = max(self.endpoint_rss, psutil.Process(self.endpoint).memory_info().rss)
            total = biggest = 0
            for proc in psutil.process_iter(["name", "cmdline"]):
                try:
                    name = proc.info["name"] or ""
                    cmd = " ".join(proc.info["cmdline"] or [])
                    if name.startswith("ray::") or "default_worker.py" in cmd:
                        rss = proc.memory_info().rss
                        total, biggest = total + rss, max(biggest, rss)
                except psutil.Error:
                    continue
            self.workers_rss_sum = max(self.workers_rss_sum, total)
            self.worker_rss_max = max(self.worker_rss_max, biggest)
            self.shm_used = max(self.shm_used, self._shm() - self.shm_base)
            self.stop_event.wait(self.period)

    def mark(self) -> None:
        """A wave has committed: close its segment (the driver's peak RssAnon and RssShmem since the last mark;
        the first segment holds the start, `prepare` and wave 1)."""
        anon, shmem = self._status(self.pid)
        self.by_wave.append((max(self.wave_anon, anon) / 2**20, max(self.wave_shmem, shmem) / 2**20))
        self.wave_anon = self.wave_shmem = 0

    def stop(self) -> dict[str, float]:
        self.stop_event.set()
        self.join(timeout=5)
        mb = 1 / 2**20
        return {"driver_rss_mb": self.driver_rss * mb, "driver_anon_mb": self.driver_anon * mb,
                "driver_shmem_mb": self.driver_shmem * mb, "worker_rss_max_mb": self.worker_rss_max * mb,
                "workers_rss_sum_mb": self.workers_rss_sum * mb, "shm_peak_mb": self.shm_used * mb,
                "endpoint_rss_mb": self.endpoint_rss * mb if self.endpoint is not None else None,
                "driver_anon_by_wave_mb": [round(a) for a, _ in self.by_wave],
                "driver_shmem_by_wave_mb": [round(s) for _, s in self.by_wave]}  # fmt: skip


# --------------------------------------------------------------------------- running the job
def job_command(data: Path, model: Path, out: str, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "jobs.attribute", "--dataset", str(data), "--text-a-column", "question1",
           "--text-b-column", "question2", "--label-column", "is_duplicate", "--id-column", "id",
           "--model", str(model), "--out", out, *JOB_FLAGS, "--rule", args.rule, "--steps", str(args.steps)]  # fmt: skip
    for flag, value in (("--wave-size", args.wave_size), ("--batch-size", args.batch_size),
                        ("--cell-writer", args.cell_writer), ("--num-actors", args.num_actors)):  # fmt: skip
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def run(cmd: list[str], kill_when=None, timeout: float = 6 * 3600, env: dict[str, str] | None = None,
        endpoint=None) -> dict:
    """Run the job; returns wall time, peaks and its output. kill_when(): True -> SIGKILL the driver's group.
    `env`: added to the job's environment; `endpoint`: the S3 server whose process RSS is sampled too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)  # fmt: skip
    sampler = Sampler(proc.pid, endpoint=endpoint.process.pid if endpoint is not None else None)
    sampler.start()
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("wave "):  # the job's line after each wave's commit
                sampler.mark()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed = False
    try:
        while proc.poll() is None:
            if kill_when is not None and kill_when():
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            if time.perf_counter() - t0 > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                raise SystemExit(f"timeout after {timeout:.0f} s: {' '.join(cmd)}")
            time.sleep(0.2)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.perf_counter() - t0
    peaks = sampler.stop()
    reader.join(timeout=5)
    out = "".join(lines)
    if proc.returncode != 0 and not killed:
        raise SystemExit(f"job failed ({proc.returncode}):\n{out[-4000:]}")
    return {"wall_s": wall, "killed": killed, "output": out, **peaks}


class Where:
    """Where a run's stores go: a local folder, or (--s3) a bucket of a moto_server on 127.0.0.1 reached over HTTP
    by the job's own store code (the AWS_* variables of `env`), as a cluster's job reaches object storage."""

    def __init__(self, work: str, s3: bool) -> None:
        self.server = None
        self.env: dict[str, str] = {}
        self.work = work
        if s3:
            sys.path.insert(0, str(ROOT / "tests"))
            from s3tools import start_moto

            self.server = start_moto(CACHE / "moto", bucket="xsbert-scale")
            self.env = dict(self.server.env)

    def out(self, tag: str, name: str) -> str:
        if self.server is None:
            return str(Path(self.work) / tag / name)
        return self.server.uri(tag, name)

    def clear(self, tag: str) -> None:
        if self.server is None:
            shutil.rmtree(Path(self.work) / tag, ignore_errors=True)
        else:
            for key, _ in self.objects(self.server.uri(tag)):
                self.server.client().delete_object(Bucket=self.server.bucket, Key=key)

    def objects(self, out: str) -> list[tuple[str, int]]:
        """(key or path, bytes) of every file under `out`."""
        if self.server is None:
            return [(str(p), p.stat().st_size) for p in Path(out).rglob("*") if p.is_file()]
        prefix = out.removeprefix(f"s3://{self.server.bucket}/").rstrip("/") + "/"
        pages = self.server.client().get_paginator("list_objects_v2").paginate(Bucket=self.server.bucket, Prefix=prefix)
        return [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]

    def manifest(self, out: str) -> dict:
        found = [key for key, _ in self.objects(out) if key.endswith("/manifest.json")]
        if len(found) != 1:
            raise SystemExit(f"expected one run under {out}, found {len(found)}")
        if self.server is None:
            return json.loads(Path(found[0]).read_text())
        body = self.server.client().get_object(Bucket=self.server.bucket, Key=found[0])["Body"].read()
        return json.loads(body)

    def pair_parts(self, out: str) -> int:
        """Committed waves so far: the `pairs` parts (one per wave)."""
        return sum("/pairs/part-" in key and key.endswith(".parquet") for key, _ in self.objects(out))

    def bytes(self, out: str) -> int:
        return sum(size for _, size in self.objects(out))

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def all_but_last_wave(where: Where, out: str, n_waves: int, every: float = 5.0):
    """A kill_when for run(): True once all but the last of `n_waves` waves have committed under `out` (looked up
    at most every `every` s: on S3 a listing is an HTTP call)."""
    checked = [-every]

    def late() -> bool:
        if time.perf_counter() - checked[0] < every:
            return False
        checked[0] = time.perf_counter()
        return where.pair_parts(out) >= max(1, n_waves - 1)

    return late


def measure(n: int, args: argparse.Namespace, model: Path, where: Where) -> dict:
    data = make_pairs(n)
    tag = f"n{n}-{args.cell_writer or 'auto'}"  # the local stores stay for bench/sql.py: <work>/<tag>/runs
    if (args.rule, args.steps) != ("riemann", 2):  # another quadrature: another store (the two-run SQL files)
        tag += f"-{args.rule}{args.steps}"
    where.clear(tag)
    out = where.out(tag, "runs")
    cmd = job_command(data, model, out, args)
    print(f"[{n} pairs] {' '.join(cmd)}", flush=True)
    n_waves = -(-n // (args.wave_size or 2048))
    if args.kill_late:  # one store: SIGKILL once all but the last wave have committed, then resume it
        killed = run(cmd, kill_when=all_but_last_wave(where, out, n_waves), env=where.env, endpoint=where.server)
        if not killed["killed"]:
            raise SystemExit(f"the run finished before all but its last wave ({n_waves - 1}) had committed")
        waves_before = where.pair_parts(out)
        print(f"[{n} pairs] killed at {killed['wall_s']:.1f} s after {waves_before} waves", flush=True)
        first = run(cmd, env=where.env, endpoint=where.server)
        print(f"[{n} pairs] resume {first['wall_s']:.1f} s", flush=True)
    else:
        first = run(cmd, env=where.env, endpoint=where.server)
    manifest = where.manifest(out)
    entry = manifest["runs"][-1]
    waves = entry["waves"]
    job_wall = entry["wall_s"]
    split = {key: sum(w.get(key, 0.0) for w in waves) for key in ("factors_s", "factor_meta_s", "cells_s", "commit_s")}
    row = {
        "pairs": n,
        "quadrature": f"{args.rule} N={args.steps}",
        "store_on": "s3 (moto_server, 127.0.0.1)" if where.server else "local disk",
        "stored_pairs": entry["counts"]["n_done"],
        "quarantined": entry["counts"]["n_quarantined"],
        "sentences": entry["counts"]["computed_sentences"],
        "waves": len(waves),
        "wave_size": entry["resources"]["wave_size"],
        "cell_writer": entry["resources"].get("cell_writer", "driver"),
        "process_wall_s": first["wall_s"],
        "job_wall_s": job_wall,
        **split,
        "orchestration_s": job_wall - sum(split.values()),
        "actors": entry["resources"]["num_actors"],
        # attribution compute: the factor actors' seconds inside the engine, spread over the actors
        "attribution_s": sum(w.get("attribution_s", 0.0) for w in waves) / entry["resources"]["num_actors"],
        "ms_per_pair_process": 1000 * first["wall_s"] / n,
        "ms_per_pair_job": 1000 * job_wall / n,
        "driver_rss_mb": first["driver_rss_mb"],
        "driver_anon_mb": first["driver_anon_mb"],
        "driver_shmem_mb": first["driver_shmem_mb"],
        "driver_anon_by_wave_mb": first["driver_anon_by_wave_mb"],
        "driver_shmem_by_wave_mb": first["driver_shmem_by_wave_mb"],
        # the job's own record: its private memory once each wave's was released (the floor; peaks above)
        "driver_floor_by_wave_mb": [round(w["driver_private_mb"]) for w in waves if "driver_private_mb" in w],
        # of it, glibc's bytes in use (live, not kept by the allocator)
        "driver_malloc_by_wave_mb": [round(w["driver_malloc_mb"], 1) for w in waves if "driver_malloc_mb" in w],
        "worker_rss_max_mb": first["worker_rss_max_mb"],
        "workers_rss_sum_mb": first["workers_rss_sum_mb"],
        "shm_peak_mb": first["shm_peak_mb"],
        "endpoint_rss_mb": first.get("endpoint_rss_mb"),
        "store_mb": where.bytes(out) / 2**20,
        "cells": manifest["tables"]["cells"]["rows"],
        "cell_parts": manifest["tables"]["cells"]["parts"],
    }
    if args.kill_late:  # the columns above are the resume's; the killed invocation left no manifest entry
        row.update(
            killed_after_s=killed["wall_s"], waves_before_kill=waves_before, resume_s=first["wall_s"],
            resume_recomputed_pairs=entry["counts"]["computed_pairs"], total_wall_s=killed["wall_s"] + first["wall_s"],
            killed_driver_rss_mb=killed["driver_rss_mb"], killed_driver_anon_mb=killed["driver_anon_mb"],
            killed_driver_shmem_mb=killed["driver_shmem_mb"], killed_shm_peak_mb=killed["shm_peak_mb"],
            killed_driver_anon_by_wave_mb=killed["driver_anon_by_wave_mb"],
            killed_driver_shmem_by_wave_mb=killed["driver_shmem_by_wave_mb"],
            killed_endpoint_rss_mb=killed.get("endpoint_rss_mb"),
        )  # fmt: skip
    print(f"[{n} pairs] first run {first['wall_s']:.1f} s", flush=True)
    again = run(cmd, env=where.env, endpoint=where.server)
    row["rerun_s"] = again["wall_s"]
    row["rerun_driver_rss_mb"] = again["driver_rss_mb"]
    print(f"[{n} pairs] rerun {again['wall_s']:.1f} s", flush=True)
    if args.resume:
        out2 = where.out(tag, "killed")
        killed2 = run(job_command(data, model, out2, args), kill_when=all_but_last_wave(where, out2, len(waves)),
                      env=where.env, endpoint=where.server)  # fmt: skip
        resumed = run(job_command(data, model, out2, args), env=where.env, endpoint=where.server)
        entry2 = where.manifest(out2)["runs"][-1]
        row.update(killed_after_s=killed2["wall_s"], resume_s=resumed["wall_s"],
                   resume_recomputed_pairs=entry2["counts"]["computed_pairs"])  # fmt: skip
        print(f"[{n} pairs] killed at {killed2['wall_s']:.1f} s, resume {resumed['wall_s']:.1f} s "
              f"({row['resume_recomputed_pairs']} pairs recomputed)", flush=True)  # fmt: skip
    return row


def integrations(n: int, wave: int) -> dict[str, int]:
    """Sentences integrated by a run of the n rehearsal pairs in waves of `wave`: in input order, and in the job's
    wave order (jobs.attribution.worklist.wave_order: pairs grouped by connected component), against the unique
    count."""
    import numpy as np
    import pandas as pd

    from jobs.attribution.worklist import wave_order

    d = pd.read_parquet(make_pairs(n))
    a, b = d.question1.to_numpy(), d.question2.to_numpy()

    def count(order: np.ndarray) -> int:
        return sum(len(set(a[order[k : k + wave]]) | set(b[order[k : k + wave]])) for k in range(0, n, wave))

    return {"pairs": n, "wave": wave, "unique": len(set(a) | set(b)), "input_order": count(np.arange(n)),
            "wave_order": count(wave_order(a, b))}  # fmt: skip


COLUMNS = (
    ("label", "run", "{}"), ("pairs", "pairs", "{:,}"), ("sentences", "sentences computed (summed over waves)", "{:,}"),
    ("quadrature", "quadrature (layer 0)", "{}"),
    ("store_on", "store on", "{}"), ("waves", "waves", "{}"), ("wave_size", "wave size", "{:,}"),
    ("cell_writer", "cells written by", "{}"),
    ("process_wall_s", "process wall (s)", "{:.1f}"), ("job_wall_s", "job wall (s)", "{:.1f}"),
    ("attribution_s", "attribution compute (s, engine time / actors)", "{:.1f}"), ("factors_s", "stage 1: driver waits for factors (s)", "{:.1f}"), ("cells_s", "stage 2 (s)", "{:.1f}"), ("commit_s", "commits (s)", "{:.2f}"),
    ("orchestration_s", "driver rest (s)", "{:.1f}"), ("ms_per_pair_process", "ms/pair (process)", "{:.2f}"),
    ("overhead_ms_per_pair", "ms/pair besides attribution", "{:.2f}"),
    ("driver_rss_mb", "driver peak RSS (MB)", "{:,.0f}"),
    ("driver_anon_mb", "driver peak private memory, RssAnon (MB)", "{:,.0f}"),
    ("driver_shmem_mb", "driver peak object-store pages mapped, RssShmem (MB)", "{:,.0f}"), ("worker_rss_max_mb", "largest worker RSS (MB)", "{:,.0f}"),
    ("shm_peak_mb", "/dev/shm peak (MB)", "{:,.0f}"), ("store_mb", "store (MB)", "{:,.1f}"),
    ("cells", "cells", "{:,}"), ("cell_parts", "cells parts", "{:,}"), ("rerun_s", "rerun, nothing to do (s)", "{:.1f}"),
    ("resume_s", "resume after SIGKILL (s)", "{:.1f}"), ("resume_recomputed_pairs", "pairs recomputed", "{:,}"),
    ("endpoint_rss_mb", "S3 endpoint (moto_server) peak RSS (MB)", "{:,.0f}"),
    ("killed_after_s", "--kill-late: killed after (s)", "{:.1f}"), ("waves_before_kill", "--kill-late: waves committed then", "{}"),
    ("killed_driver_anon_mb", "--kill-late: killed driver's peak RssAnon (MB)", "{:,.0f}"),
    ("killed_driver_shmem_mb", "--kill-late: killed driver's peak RssShmem (MB)", "{:,.0f}"),
    ("killed_shm_peak_mb", "--kill-late: /dev/shm peak while killed run (MB)", "{:,.0f}"),
)  # fmt: skip


def _whole_run(row: dict) -> dict:
    """A --kill-late row as one run: wall = killed + resumed invocation, peaks the larger of the two; the
    manifest's split (stages, attribution, sentences) covers the resumed invocation only, so it is left out."""
    if "total_wall_s" not in row:
        return row
    out = dict(row)
    out.update(process_wall_s=row["total_wall_s"], ms_per_pair_process=1000 * row["total_wall_s"] / row["pairs"],
               **{k: None for k in ("job_wall_s", "attribution_s", "factors_s", "cells_s", "commit_s",
                                    "orchestration_s", "sentences", "waves")})  # fmt: skip
    for key in ("driver_rss_mb", "driver_anon_mb", "driver_shmem_mb", "shm_peak_mb", "endpoint_rss_mb"):
        out[key] = max(row.get(key) or 0, row.get(f"killed_{key}") or 0)
    return out


def report(results: dict, match: str | None = None) -> str:
    """The markdown table of the measured rows (one column per row, one line per quantity): every row, or those
    whose label contains `match`."""
    rows = [_whole_run(r) for r in results["rows"] if match is None or match in r.get("label", "")]
    for r in rows:  # what is not attribution compute (the actors' engine seconds / actors), per pair
        if r.get("attribution_s") is not None:
            r["overhead_ms_per_pair"] = 1000 * (r["process_wall_s"] - r["attribution_s"]) / r["pairs"]
    head = "| | " + " | ".join(f"{r['pairs']:,}" for r in rows) + " |"
    lines = [head, "|---" * (len(rows) + 1) + "|"]
    for key, name, fmt in COLUMNS:
        cells = [fmt.format(r[key]) if r.get(key) is not None else "–" for r in rows]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--wave-size", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--num-actors", type=int, default=None)
    p.add_argument("--cell-writer", choices=("auto", "workers", "driver"), default=None)
    p.add_argument("--resume", action="store_true", help="also kill the driver late in a third store and resume")
    p.add_argument("--kill-late", action="store_true",
                   help="one store: SIGKILL the driver once all but the last wave have committed, time the resume, "
                        "then the rerun (a 404k run that measures the resume without a second full run)")
    p.add_argument("--s3", action="store_true",
                   help="the stores on S3: a moto_server on 127.0.0.1 (tests/s3tools.py) reached over HTTP")
    p.add_argument("--engine", action="store_true", help="also time Explainer.factors alone (rehearsal and MiniLM)")
    p.add_argument("--work", default=str(CACHE / "runs"), help="where the stores go (kept for the SQL bench)")
    p.add_argument("--label", default="", help="a note stored with the rows (e.g. 'before')")
    p.add_argument("--report", action="store_true", help="print the table of bench/results/scale.json and exit")
    p.add_argument("--match", default=None, help="with --report: only the rows whose label contains this")
    p.add_argument("--rule", default="riemann", help="the job's quadrature rule (a second store for the two-run SQL)")
    p.add_argument("--steps", type=int, default=2, help="the job's quadrature nodes N")
    p.add_argument("--integrations", type=int, nargs=2, metavar=("PAIRS", "WAVE"),
                   help="sentences integrated in input order vs the job's wave order, and exit")  # fmt: skip
    args = p.parse_args()
    if args.integrations:
        print(json.dumps(integrations(*args.integrations)))
        return
    if args.report:
        print(report(json.loads(RESULTS_JSON.read_text()), args.match))
        return
    model = rehearsal_model()
    results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {"rows": [], "engine": {}}
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    if args.engine:
        import pandas as pd

        texts = pd.read_parquet(make_pairs(1000)).question1.tolist()[:512]
        rate = engine_rate(str(model), texts, layer=0, rule="riemann", steps=2)
        minilm = engine_rate(MINILM, texts[:32], layer=3, rule="gauss-legendre", steps=12)
        results["engine"] = {"date": stamp, "rehearsal_ms_per_sentence": 1000 * rate,
                             "minilm_l3_gl12_ms_per_sentence": 1000 * minilm}  # fmt: skip
        print(f"engine: rehearsal {1000 * rate:.2f} ms/sentence, MiniLM layer 3 GL N=12 {1000 * minilm:.0f} ms/sentence")
    where = Where(args.work, args.s3)
    try:
        _measure_all(args, model, where, results, stamp)
    finally:
        where.stop()


def _measure_all(args: argparse.Namespace, model: Path, where: Where, results: dict, stamp: str) -> None:
    for n in args.pairs:
        row = measure(n, args, model, where)
        row.update(date=stamp, label=args.label, machine=f"{platform.machine()}, {os.cpu_count()} cores")
        results["rows"].append(row)
        RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
        RESULTS_JSON.write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps(row, indent=1), flush=True)


if __name__ == "__main__":
    main()
