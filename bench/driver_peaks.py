"""Where the job's driver peaks: its private memory (RssAnon) sampled every 0.1 s with the code the main thread is
in, grouped by step; and what one executed Ray Data dataset leaves behind in a driver.

    python bench/driver_peaks.py job -- --dataset bench/.cache/scale/pairs-10000.parquet --text-a-column question1 \\
        --text-b-column question2 --id-column id --model bench/.cache/scale/rehearsal-model --out /tmp/peaks \\
        --layer 0 --steps 2 --wave-size 4096 --batch-size 128 -q
    python bench/driver_peaks.py ray-data --datasets 100 [--tasks]
    python bench/driver_peaks.py floors --group-blocks 64 [--no-collect] [--trace 10] -- --dataset <pairs-100000.parquet> \
        --text-a-column question1 --text-b-column question2 --id-column id --model <rehearsal-model> \
        --out /tmp/floors --layer 0 --rule riemann --steps 2 --wave-size 2048 --batch-size 128 --limit 30000 -q
    ARROW_DEFAULT_MEMORY_POOL=system python bench/driver_peaks.py parquet-write <run>/sentences/part-000024.parquet \
        [--settings base] [--row-group-size 8192]

`job` runs `jobs.attribute` in this process (the arguments after `--`, as its command line takes them) and prints,
per step of the driver (the innermost frame of jobs/ or of pyarrow's Parquet writer), the largest RssAnon seen in
it and how often it was seen; then, per commit (a wave ends with one), the largest RssAnon since the last one, the
step it fell in, and the lowest in the 3 s after it. `ray-data` executes N small
datasets (32 blocks, a map_batches each, as stage 2 did per wave before 057d443) or with `--tasks` the
same calls as plain Ray tasks of one remote function (as stage 2 does now), and prints the driver's RssAnon and the
count of Python objects every 10. `floors` runs `jobs.attribute` here with stage 1 in groups of N factor batches,
with or without the garbage collection when a group ends (STAGE1_COLLECT), and prints the driver's floor after
each wave.
`parquet-write` writes one store part again with the store's settings (or the base
settings of the other tables, or another row-group size) and prints the memory that took and the file's size.
A sample is a sample: a step shorter than 0.1 s can be missed, and the sampling thread takes the GIL like any
other (~1% of the driver's time).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

STEP_FILES = ("jobs/", "pyarrow/parquet")


def rss_anon_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def step_of(frame) -> tuple[str, bool]:
    """(the innermost frame of the job's own code, with the Parquet writer's below it if any, as file:function;
    whether the driver is inside a store commit)."""
    stack = traceback.extract_stack(frame)
    names = [f"{f.filename.rsplit('/', 1)[-1]}:{f.name}" for f in stack if any(k in f.filename for k in STEP_FILES)]
    committing = any(f.name == "commit" and f.filename.endswith(("store/local.py", "store/object.py")) for f in stack)
    return (" > ".join(names[-2:]) if names else "(outside jobs/)"), committing


def job(argv: list[str], period: float = 0.1) -> None:
    import jobs.attribute as attribute
    from jobs.attribution import stage1

    main_id = threading.main_thread().ident
    peaks: dict[str, float] = collections.defaultdict(float)
    seen: collections.Counter = collections.Counter()
    timeline: list[tuple[float, float, str, bool]] = []
    stop = threading.Event()
    t0 = time.perf_counter()

    def sample() -> None:
        while not stop.is_set():
            frame = sys._current_frames().get(main_id)
            (step, committing), mb = (step_of(frame) if frame else ("-", False)), rss_anon_mb()
            peaks[step] = max(peaks[step], mb)
            seen[step] += 1
            timeline.append((time.perf_counter() - t0, mb, step, committing))
            stop.wait(period)

    # What FactorStream holds of other waves when a wave's blocks are all back (stage 1 running ahead).
    held: list[int] = []
    wave = stage1.FactorStream.wave

    def counting_wave(self, w):
        out = wave(self, w)
        held.append(sum(len(blocks) for blocks in self._got.values()))
        return out

    stage1.FactorStream.wave = counting_wave
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        attribute.cli(argv)
    finally:
        stop.set()
        thread.join()
        stage1.FactorStream.wave = wave
    print(f"\nfactor blocks of later waves held when each wave was complete: {held}")
    print("\nlargest RssAnon (MB) by the step the driver was in (samples every %.1f s):" % period)
    for step, mb in sorted(peaks.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {mb:7.0f}  {seen[step]:6d}x  {step}")
    # The peak of each stretch between two commits, and the step it fell in.
    print("\nper wave (a wave ends with its commit): its largest RssAnon and where")
    ends = [k for k, x in enumerate(timeline) if x[3] and (k + 1 == len(timeline) or not timeline[k + 1][3])]
    start = 0
    for wave, end in enumerate(ends, 1):  # the first commit may be the quarantine's, before wave 1
        t, mb, step, _ = max(timeline[start : end + 1], key=lambda x: x[1])
        floor = min(x[1] for x in timeline[end + 1 : end + 30]) if end + 1 < len(timeline) else float("nan")
        print(f"  commit {wave}: peak {mb:.0f} MB at {t:.1f} s in {step}; {floor:.0f} MB after it")
        start = end + 1


def floors(argv: list[str], group_blocks: int | None, collect: bool, trace: int = 0) -> None:
    """Run jobs.attribute here (the arguments after `--`) with stage 1 in groups of `group_blocks` factor batches,
    with or without the collection at each group switch, and print the driver's floor after each wave (the
    manifest's `driver_private_mb`, RssAnon after the wave's memory went back) and the part of it glibc's malloc
    has handed out (`driver_malloc_mb`). With `trace` (frames per traceback),
    tracemalloc runs too: Python's traced heap after each wave, the object types and allocation sites that grew
    from the first wave to the last."""
    import jobs.attribute as attribute
    from jobs.attribution import run, stage1

    if group_blocks:
        stage1.STAGE1_GROUP_BLOCKS = group_blocks
    stage1.STAGE1_COLLECT = collect
    traced: list[dict] = []
    memory = run.driver_memory_mb
    if trace:
        import tracemalloc

        tracemalloc.start(trace)
        first: list = []

        def traced_memory() -> dict[str, float]:
            # After each wave, once its memory went back: Python's traced heap, the objects by type, and (from the
            # second wave on) the allocation sites that grew since the end of the first.
            gc.collect()
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            types = collections.Counter(type(o).__name__ for o in gc.get_objects())
            traced.append({"traced_mb": round(sum(s.size for s in snap.statistics("filename")) / 2**20, 2),
                           "types": types})  # fmt: skip
            if not first:
                first.append(snap)
            else:
                traced[-1]["grew"] = snap.compare_to(first[0], "traceback")[:12]
            return memory()

        run.driver_memory_mb = traced_memory
    try:
        summary = attribute.main(attribute.parse_args(argv))
    finally:
        run.driver_memory_mb = memory
    from jobs.store import open_store

    manifest = open_store(*str(summary["run_dir"]).rsplit("/", 1)).read_manifest()
    waves = manifest["runs"][-1]["waves"]
    print(json.dumps({"group_blocks": stage1.STAGE1_GROUP_BLOCKS, "collect": collect, "waves": len(waves),
                      "floor_mb": [round(w["driver_private_mb"]) for w in waves],
                      "malloc_mb": [round(w.get("driver_malloc_mb", float("nan")), 1) for w in waves]}))  # fmt: skip
    if traced:
        print(json.dumps({"traced_mb": [t["traced_mb"] for t in traced]}))
        grew = traced[-1]["types"] - traced[0]["types"]
        print("Python objects that grew from wave 1 to the last:", dict(grew.most_common(15)))
        print("allocation sites that grew from wave 1 to the last (KB, count; innermost frame last):")
        for stat in traced[-1].get("grew", []):
            if stat.size_diff <= 0:
                continue
            print(f"  {stat.size_diff / 1024:+9.1f} KB {stat.count_diff:+7d}")
            for line in stat.traceback.format(limit=min(trace, 8)):
                print("     ", line)


def _fn(t):
    import numpy as np
    import pyarrow as pa

    return pa.table({"x": t.column("x"), "y": pa.array(np.ones(t.num_rows))})


def ray_data(n: int, tasks: bool = False) -> None:
    """N rounds of 32 blocks through `_fn`: each round a Ray Data dataset (map_batches), or with `tasks` the same
    32 calls as plain Ray tasks of one remote function (what stage 2 does per wave since 057d443)."""
    import numpy as np
    import pyarrow as pa
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    remote = ray.remote(_fn).options(num_cpus=0.5, max_retries=3)

    blocks = [pa.table({"x": np.arange(k * 512, (k + 1) * 512)}) for k in range(32)]
    for i in range(n + 1):
        if i % 10 == 0:
            gc.collect()
            print(json.dumps({"rounds": i, "as": "tasks" if tasks else "datasets",
                              "rss_anon_mb": round(rss_anon_mb(), 1), "python_objects": len(gc.get_objects())}),
                  flush=True)  # fmt: skip
        if i < n and tasks:
            ray.get([remote.remote(b) for b in blocks])
        elif i < n:
            ds = ray.data.from_arrow(blocks).map_batches(_fn, batch_size=512, batch_format="pyarrow", num_cpus=0.5)
            ray.get(ds.to_arrow_refs())
            del ds
    ray.shutdown()


def parquet_write(part: str, row_group_size: int | None, settings: str = "store") -> None:
    """Write one store part again with the store's Parquet settings for its table (the folder it is in; `settings`
    "base": PARQUET_OPTIONS alone, the sentences' settings before their row groups and vector encoding; or
    another row-group size) and print the largest RssAnon above the table read and released, sampled every 2 ms,
    and the file's size; the pool is pyarrow's default or $ARROW_DEFAULT_MEMORY_POOL's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.store import PARQUET_OPTIONS, parquet_options

    table = pq.read_table(part).combine_chunks()
    pa.default_memory_pool().release_unused()
    store = parquet_options(Path(part).parent.name, table.schema) if settings == "store" else dict(PARQUET_OPTIONS)
    options = {**store, **({"row_group_size": row_group_size} if row_group_size else {})}
    peak, stop = [0.0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_anon_mb())
            stop.wait(0.002)

    base = rss_anon_mb()
    thread = threading.Thread(target=sample)
    thread.start()
    with tempfile_dir() as d:
        pq.write_table(table, f"{d}/part.parquet", **options)
        stop.set()
        thread.join()
        size = os.path.getsize(f"{d}/part.parquet")
    print(json.dumps({"rows": table.num_rows, "table_mb": round(table.nbytes / 2**20),
                      "pool": pa.default_memory_pool().backend_name, "settings": settings,
                      "row_group_size": options["row_group_size"], "write_peak_above_mb": round(peak[0] - base),
                      "file_mb": round(size / 2**20, 1)}))  # fmt: skip


def tempfile_dir():
    import tempfile

    return tempfile.TemporaryDirectory(prefix="driver-peaks-")


def job_args(rest: list[str]) -> list[str]:
    """jobs.attribute's arguments: what follows the command's `--`."""
    return [a for a in rest if a != "--"] if rest[:1] == ["--"] else rest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    j = sub.add_parser("job", help="run jobs.attribute here, sampling the driver")
    j.add_argument("args", nargs=argparse.REMAINDER, help="-- then jobs.attribute's arguments")
    r = sub.add_parser("ray-data", help="what executed datasets leave in the driver")
    r.add_argument("--datasets", type=int, default=100, help="rounds of 32 blocks")
    r.add_argument("--tasks", action="store_true", help="each round as plain Ray tasks, not a dataset")
    f = sub.add_parser("floors", help="the driver's floor after each wave, stage 1 in groups of N factor batches")
    f.add_argument("--group-blocks", type=int, default=None, help="STAGE1_GROUP_BLOCKS for this run")
    f.add_argument("--no-collect", action="store_true", help="no garbage collection when a group ends")
    f.add_argument("--trace", type=int, default=0, metavar="FRAMES",
                   help="tracemalloc with FRAMES frames: what grew in Python's heap from the first wave to the last")
    f.add_argument("args", nargs=argparse.REMAINDER, help="-- then jobs.attribute's arguments")
    w = sub.add_parser("parquet-write", help="the memory of writing one store part again")
    w.add_argument("part", help="a Parquet part of a store, e.g. <run>/sentences/part-000024.parquet")
    w.add_argument("--row-group-size", type=int, default=None)
    w.add_argument("--settings", choices=("store", "base"), default="store",
                   help="the store's settings for the part's table, or PARQUET_OPTIONS alone (the other tables')")
    args = p.parse_args()
    if args.what == "parquet-write":
        parquet_write(args.part, args.row_group_size, args.settings)
    elif args.what == "floors":
        floors(job_args(args.args), args.group_blocks, not args.no_collect, args.trace)
    elif args.what == "job":
        job(job_args(args.args))
    else:
        ray_data(args.datasets, args.tasks)


if __name__ == "__main__":
    main()
