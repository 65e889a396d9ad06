"""The SQL benchmark's timing: each sql/ file run by the duckdb CLI in a fresh process, its wall and CPU seconds, peak
RSS and rows out, with the cores the rest of the machine used meanwhile (bench/sql.py says how)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from synthstore import log

ROOT = Path(__file__).resolve().parents[1]
DUCKDB_CLI = Path(sys.executable).parent / "duckdb"  # the duckdb CLI of this environment (pip: duckdb-cli)


def cpu_busy() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


GNU_TIME = Path("/usr/bin/time")


def peak_rss_poll(pid: int, stop: threading.Event, out: list[int]) -> None:
    """Poll the largest VmHWM (peak RSS of a process's current image, kB) in the process tree of `pid`
    every 50 ms until `stop` (the CLI wrapper's child is the real duckdb binary)."""
    import psutil

    while not stop.wait(0.05):
        with contextlib.suppress(psutil.Error):
            for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                with contextlib.suppress(OSError, StopIteration, ValueError), open(f"/proc/{p.pid}/status") as fh:
                    out.append(int(next(line for line in fh if line.startswith("VmHWM:")).split()[1]))


def duckdb_run(
    sql: str, desc: dict[str, Any], args: argparse.Namespace, out_csv: Path, profile: Path | None = None
) -> dict[str, Any]:
    """Run one SQL statement (or file, sql = '-f PATH') in a fresh duckdb CLI process; measure it.

    Peak RSS comes from GNU time's %M (the largest maximum resident set among the CLI wrapper and the
    duckdb binary it runs); the rusage of a direct child of this Python process would report this
    process's RSS (the child starts as its copy). Without /usr/bin/time, or when the run is killed,
    the VmHWM of the process tree is polled instead.
    """
    # absolute: the CLI runs from the repository root (below), wherever the store was named from
    spill = Path(args.store).resolve() / "_spill"
    spill.mkdir(exist_ok=True)
    run, run2 = (Path(desc[k]).resolve() for k in ("run", "run2"))
    settings = [
        f"set threads = {args.threads}", f"set memory_limit = '{args.memory_limit}'",
        f"set temp_directory = '{spill}'", f"set variable run = '{run}'", f"set variable run2 = '{run2}'",
    ]  # fmt: skip
    for item in args.var:
        name, value = item.split("=", 1)
        settings.append(f"set variable {name} = {value}")
    if profile is not None:
        settings += ["set enable_profiling = 'json'", f"set profiling_output = '{profile}'"]
    cmd = [str(DUCKDB_CLI), "-csv", "-bail", "-cmd", "; ".join(settings) + ";"]
    cmd += ["-f", sql[3:]] if sql.startswith("-f ") else ["-c", sql]
    time_out = out_csv.with_suffix(".time")
    time_out.unlink(missing_ok=True)
    if GNU_TIME.exists():
        cmd = [str(GNU_TIME), "-f", "%M %U %S", "-o", str(time_out)] + cmd
    err_path = out_csv.with_suffix(".err")
    load0 = os.getloadavg()[0]
    busy0 = cpu_busy()
    polled: list[int] = []
    with open(out_csv, "w") as out, open(err_path, "w") as err:
        t0 = time.perf_counter()
        # from the repository root: a sql/ file `.read`s sql/lib/ from there (jobs/sqlfiles.py)
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT, start_new_session=True)
        stop = threading.Event()
        poller = threading.Thread(target=peak_rss_poll, args=(proc.pid, stop, polled), daemon=True)
        poller.start()
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # time, the CLI wrapper and duckdb itself
            proc.wait()
        wall = time.perf_counter() - t0
        stop.set()
        poller.join()
    other_busy = cpu_busy() - busy0
    error = err_path.read_text(errors="replace").strip()
    fields = time_out.read_text().split() if time_out.exists() else []
    if len(fields) >= 3 and proc.returncode >= 0:
        if error.startswith("Command exited with non-zero status"):  # GNU time's own line
            error = "\n".join(error.splitlines()[:-1]) or error
        rss_kb, cpu = int(fields[-3]), float(fields[-2]) + float(fields[-1])
    else:  # no GNU time, or killed: the polled peak; CPU time unknown
        rss_kb, cpu = max(polled, default=0), float("nan")
    rows = None
    if proc.returncode == 0:
        with open(out_csv, newline="") as fh:
            rows = max(0, sum(1 for _ in csv.reader(fh)) - 1)
    elif wall >= args.timeout:
        error = f"killed after {args.timeout:.0f}s"
    return {
        "wall_s": wall, "peak_rss_mb": rss_kb / 1024, "rows": rows, "cpu_s": cpu, "cores_used": cpu / wall,
        "other_cores": max(0.0, (other_busy - cpu) / wall), "load1_start": load0,
        "exit": proc.returncode, "error": error.strip().splitlines()[0] if proc.returncode and error.strip() else "",
    }  # fmt: skip


def measure(sql: str, desc: dict[str, Any], args: argparse.Namespace, work: Path, name: str) -> dict[str, Any]:
    """The fastest of --repeat runs, plus up to --retries more while other work was using > 0.5 core."""
    tries = []
    limit = args.repeat + args.retries
    while len(tries) < limit:
        profile = work / f"{name}.profile.json" if args.profile and not tries else None
        r = duckdb_run(sql, desc, args, work / f"{name}.csv", profile)
        tries.append(r)
        if r["exit"] != 0:
            break
        if len(tries) >= args.repeat and min(t["other_cores"] for t in tries) <= 0.5:
            break
    ok = [t for t in tries if t["exit"] == 0] or tries
    best = dict(min(ok, key=lambda t: t["wall_s"]))
    best["runs"] = len(tries)
    best["all_wall_s"] = [round(t["wall_s"], 2) for t in tries]
    return best


def analyses(args: argparse.Namespace) -> list[Path]:
    files = sorted(Path(args.sql_dir).glob("*.sql"))
    if args.only:
        files = [f for f in files if f.stem in args.only]
    return files


def floors(desc: dict[str, Any], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    out = []
    for table in ("pairs", "cells", "word_cells", "sentences", "parses", "quarantine"):
        if desc["counts"].get(table) is None:  # --run: a table the run does not have (parses before jobs.parse)
            continue
        src = f"read_parquet('{desc['run']}/{table}/*.parquet')"
        for kind, sql in (("count(*)", f"select count(*) from {src}"),
                          ("scan", f"select count(*), bit_xor(hash(t)) from {src} as t")):  # fmt: skip
            r = measure(sql, desc, args, work, f"floor-{table}-{kind[:4]}")
            r.update(table=table, kind=kind)
            out.append(r)
            log(f"floor {table:<10} {kind:<8} {r['wall_s']:6.2f}s  {r['peak_rss_mb']:7.0f} MB")
    return out


def time_all(desc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.store) / "_out"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results = []
    files = analyses(args)
    if not files:
        log(f"no *.sql in {args.sql_dir}")
    for f in files:
        text = f.read_bytes()
        two_run = b"getvariable('run2')" in text
        r = measure(f"-f {f.resolve()}", desc, args, work, f.stem)
        r.update(
            analysis=f.stem, file=str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f), two_run=two_run,
            sha256=hashlib.sha256(text).hexdigest()[:16],
        )  # fmt: skip
        results.append(r)
        status = "ok" if r["exit"] == 0 else f"FAILED: {r['error']}"
        log(f"{f.stem:<24} {r['wall_s']:7.2f}s  {r['peak_rss_mb']:7.0f} MB  rows {r['rows']}  "
            f"other {r['other_cores']:.1f} cores  {status}")  # fmt: skip
    floor = [] if args.no_floors else floors(desc, args, work)
    return {"analyses": results, "floors": floor, "out_dir": str(work)}

