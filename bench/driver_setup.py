"""Where the driver's setup peaks: `prepare` and the start of `compute`, step by step, in one process (no Ray).

    python bench/driver_setup.py --pairs 10000 100000 404290     # bench/scale.py's pairs and rehearsal model

For each size, a fresh process runs the steps the job's driver runs before its first wave, on bench/scale.py's
pairs (bench/.cache/scale/pairs-N.parquet, made by `python bench/scale.py --pairs N`) and rehearsal model, and
records after each step its private memory (RssAnon) and its peak during the step: the private memory at the step's
start plus the rise of the resident peak (VmHWM, reset before the step through /proc/self/clear_refs) over the
resident memory at the start, which counts the pages of memory-mapped files (the work list's) too, and the private
memory's own peak, read every 5 ms by a thread. Figures are MB above the private memory after the imports and the
model load. Memory only: times are printed, not claimed. Results: bench/results/driver_setup.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("XSBERT_BENCH_CACHE", ROOT / "bench" / ".cache" / "scale"))
RESULTS = ROOT / "bench" / "results" / "driver_setup.md"


def status() -> dict[str, float]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("RssAnon", "VmHWM", "VmRSS"):
            out[key] = int(line.split()[1]) / 1024
    return out


def pymalloc_arenas_mb() -> float:
    """MB of pymalloc's arenas (1 MiB each on 64-bit CPython 3.10+) now mapped, from sys._debugmallocstats(), which
    writes to the C stderr: an arena is given back only when none of its small objects is alive."""
    import re
    import tempfile

    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode()
    arenas = int(re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text).group(1).replace(",", ""))
    size = int(re.search(r"(\d+) arenas \* (\d+) bytes/arena", text).group(2))
    return arenas * size / 2**20


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def child(n: int) -> None:
    from jobs.attribute import prepare, settings
    from jobs.attribution.memory import malloc_in_use, release_memory, system_memory_pool

    data, model = CACHE / f"pairs-{n}.parquet", CACHE / "rehearsal-model"
    args = settings(["--dataset", str(data), "--text-a-column", "question1", "--text-b-column", "question2",
                       "--label-column", "is_duplicate", "--id-column", "id", "--model", str(model),
                       "--out", f"/tmp/xsbert-driver-setup-{os.getpid()}", "--layer", "0", "-q"])  # fmt: skip
    from xsbert_core import Explainer

    Explainer(str(model), layer=0)  # the imports and a model load, outside the measured steps
    release_memory()
    base, base_malloc, base_arenas = status()["RssAnon"], malloc_in_use() or 0, pymalloc_arenas_mb()
    rows = []
    state: dict = {}

    def step(name, fn):
        import threading

        reset_peak()
        start = status()
        anon_peak = [start["RssAnon"]]
        done = threading.Event()

        def sample():  # the private memory's peak, read every 5 ms (VmHWM counts mapped file pages too)
            while not done.wait(0.005):
                anon_peak[0] = max(anon_peak[0], status()["RssAnon"])

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        done.set()
        sampler.join()
        release_memory()
        s = status()
        rows.append({"step": name, "seconds": round(dt, 1), "anon_after_mb": round(s["RssAnon"] - base, 1),
                     "anon_peak_mb": round(max(anon_peak[0], s["RssAnon"]) - base, 1),
                     "peak_mb": round(start["RssAnon"] - base + s["VmHWM"] - start["VmRSS"], 1),
                     "malloc_mb": round(((malloc_in_use() or 0) - base_malloc) / 2**20, 1),
                     "pymalloc_arenas_mb": round(pymalloc_arenas_mb() - base_arenas, 1)})  # fmt: skip

    # prepare reads, validates, tokenises and spills the source chunk by chunk (jobs.attribution.inputs.CHUNK_ROWS rows).
    step("prepare (read, validate, tokenise, spill)", lambda: state.update(prep=prepare(args)))
    def plan():
        with system_memory_pool():  # as compute() plans it
            state["prep"].work.plan(None, 16384)

    step("wave plan (wave_order on 64-bit keys, rewritten in wave order)", plan)
    step("wave 1 read back", lambda: state.update(wave=state["prep"].work.wave(0)))
    state.pop("wave")
    step("wave 1 dropped", lambda: None)
    print(json.dumps({"pairs": n, "base_anon_mb": round(base, 1), "steps": rows}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, nargs="+", default=[10000, 100000, 404290])
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        child(args.child)
        return
    results = []
    for n in args.pairs:
        out = subprocess.run([sys.executable, __file__, "--child", str(n)], capture_output=True, text=True, check=False)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
        if line is None:
            raise SystemExit(f"{n} pairs: {out.stderr[-2000:]}")
        results.append(json.loads(line))
        print(line, flush=True)
    steps = [s["step"] for s in results[0]["steps"]]
    lines = ["# The driver's setup, step by step (bench/driver_setup.py)", "",
             f"    python bench/driver_setup.py --pairs {' '.join(map(str, args.pairs))}", "",
             "MB above the process's private memory after imports and model load: private memory after the step "
             "(RssAnon) / its peak during the step (RssAnon read every 5 ms) / the resident peak during the step "
             "(private memory at its start + the rise of VmHWM, which counts the pages of mapped files too) / glibc's "
             "bytes in use after the step (mallinfo2, after malloc_trim: live allocations, not pages kept) / pymalloc's "
             "arenas mapped after the step (Python's small objects; an arena goes back only when all of it is free).",
             "",
             "| step | " + " | ".join(f"{r['pairs']:,} pairs" for r in results) + " |",
             "|---|" + "---|" * len(results)]  # fmt: skip
    for k, name in enumerate(steps):
        cells = [f"{r['steps'][k]['anon_after_mb']:.0f} / {r['steps'][k]['anon_peak_mb']:.0f} / "
                 f"{r['steps'][k]['peak_mb']:.0f} / {r['steps'][k]['malloc_mb']:.0f} / "
                 f"{r['steps'][k]['pymalloc_arenas_mb']:.0f}" for r in results]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores.", ""]
    earlier = RESULTS.read_text().partition("\n## Earlier")[2] if RESULTS.exists() else ""
    if earlier:  # the hand-kept record of earlier measurements stays below the new table
        lines += ["## Earlier" + earlier.rstrip("\n"), ""]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
