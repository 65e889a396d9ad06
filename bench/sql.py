"""SQL benchmark: every analysis in sql/*.sql on a synthetic run store of full-QQP size, timed on this machine.

    python bench/sql.py                    # 404,290 pairs (~112M cells): generate the store, time every sql/ file
    python bench/sql.py --reuse            # keep the store of an earlier run with the same --pairs/--seed
    python bench/sql.py --pairs 2000       # smoke run (seconds, once the parsed templates are cached)
    python bench/sql.py --reuse --only agreement --var pair_fraction=0.1 --repeat 3
    python bench/sql.py --reuse --check --generate-only   # verify the store's invariants (CHECKS)
    python bench/sql.py --run runs/<id> [--run2 runs/<id2>]  # an existing job store instead (nothing generated)


The store is bench/synthstore's (`runs.open_store`: its docstring says what is real and what is modelled).

Timing: each sql/ file found at run time is run by the duckdb CLI (the documented way:
`duckdb -cmd "set variable run = ..." -f sql/x.sql`, CSV to a file) in a fresh process with
threads = --threads and memory_limit = --memory-limit, spilling to a folder in the store, run2 and the
--var variables set for every file. Recorded: wall seconds; CPU seconds and peak RSS of the CLI (GNU
time); rows out; and the cores the rest of the machine used meanwhile (/proc/stat minus the CLI's CPU
time). Floors per table: count(*) (footers only) and a full scan (a hash over every column). A run
measured while other work used > 0.5 core is repeated (--retries) and the fastest kept.
Results: bench/results/sql.md and sql.json (with the sha256 of each timed file). With --run, the analyses run
on a run directory that `python -m jobs.attribute` (and `jobs.parse`, for the parse-based files) wrote, e.g. the
404k-pair rehearsal store of bench/scale.py; the two-run files get --run2, which defaults to --run (the same
work as two runs; the answers are trivially 1). Results then go to bench/results/sql-run.md and .json.
In sql.md, anything after the line NOTES_MARKER is kept when the file is rewritten.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqltiming import DUCKDB_CLI, time_all
from synthstore import QQP, QQP_FULL_PAIRS
from synthstore.corpus import EMBEDDING_DIM
from synthstore.runs import check_store, existing_run, open_store

from jobs.sqlfiles import SQL_DIR

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "sql.md"
RUN_RESULTS = ROOT / "bench" / "results" / "sql-run.md"  # --run: an existing job store
NOTES_MARKER = "<!-- notes: kept when bench/sql.py rewrites this file -->"
DEFAULT_STORE = Path(tempfile.gettempdir()) / "xsbert-bench-sql"
TARGET_S = 60.0  # the target per analysis on 2 cores: a minute


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/sql.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default=str(DEFAULT_STORE), help=f"store root (default {DEFAULT_STORE})")
    p.add_argument("--run", default=None, help="time the analyses on this existing run directory (nothing generated)")
    p.add_argument("--run2", default=None, help="with --run: the second run of the two-run files (default: --run)")
    p.add_argument("--pairs", type=int, default=QQP_FULL_PAIRS, help=f"pairs to generate (default {QQP_FULL_PAIRS:,})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse", action="store_true", help="keep a complete store made with the same --pairs and --seed")
    p.add_argument("--wave-size", type=int, default=16_384, help="pairs per part (the job's GPU wave size)")
    p.add_argument("--embedding-dim", type=int, default=EMBEDDING_DIM, help="length of sentences.embedding")
    p.add_argument("--generate-only", action="store_true", help="make the store, time nothing")
    p.add_argument("--check", action="store_true", help="verify the store's invariants with DuckDB first")
    p.add_argument("--sql-dir", default=str(SQL_DIR), help="folder of the analyses (every *.sql in it)")
    p.add_argument("--only", nargs="*", default=None, help="analyses to time (file stems), default all")
    p.add_argument("--no-floors", action="store_true", help="skip the per-table count(*) / scan floors")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--memory-limit", default="6GB", help="DuckDB memory_limit (default 6GB)")
    p.add_argument("--repeat", type=int, default=1, help="timed runs per analysis (the fastest is reported)")
    p.add_argument("--retries", type=int, default=2, help="extra runs when other work used > 0.5 core meanwhile")
    p.add_argument("--timeout", type=float, default=900, help="seconds before an analysis is killed")
    p.add_argument("--profile", action="store_true", help="also write DuckDB's JSON profile of each analysis")
    p.add_argument(
        "--var", action="append", default=[], metavar="NAME=VALUE",
        help="a DuckDB variable for every analysis (e.g. pair_fraction=0.1); repeatable",
    )  # fmt: skip
    p.add_argument("--results", default=None,
                   help=f"markdown file to write ('' = don't; default {RESULTS}, with --run {RUN_RESULTS}); JSON beside it")
    return p.parse_args(argv)



# =========================================================================== report
def machine() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {mem:.0f} GiB RAM"


def duckdb_version() -> str:
    try:
        return subprocess.run([str(DUCKDB_CLI), "-version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "?"


def command_line(args: argparse.Namespace) -> str:
    parts = ["python bench/sql.py"]
    if args.run:
        parts.append(f"--run {args.run}" + (f" --run2 {args.run2}" if args.run2 else ""))
    elif args.pairs != QQP_FULL_PAIRS:
        parts.append(f"--pairs {args.pairs}")
    if args.reuse and not args.run:
        parts.append("--reuse")
    if args.memory_limit != "6GB":
        parts.append(f"--memory-limit {args.memory_limit}")
    if args.threads != 2:
        parts.append(f"--threads {args.threads}")
    if args.only:
        parts.append("--only " + " ".join(args.only))
    parts += [f"--var {v}" for v in args.var]
    if args.repeat != 1:
        parts.append(f"--repeat {args.repeat}")
    return " ".join(parts)


def verdict(wall: float, cpu: float, threads: int) -> str:
    """Target met? 'yes' when the wall time is within it; 'no' when even CPU time / threads (the wall time
    on idle cores with perfect parallelism) is above it; else open: only contention put it over."""
    if wall <= TARGET_S:
        return "yes"
    if math.isnan(cpu) or cpu / threads > TARGET_S:  # nan: CPU time unknown
        return "**no**"
    return f"open (CPU/{threads} = {cpu / threads:.0f} s)"


def table_head(args: argparse.Namespace, load: tuple) -> list[str]:
    """The first lines of a results section: the command, the machine, DuckDB's settings, the load."""
    return [
        f"## `{command_line(args)}` ({dt.date.today().isoformat()})",
        "",
        "| | |",
        "|---|---|",
        f"| machine | {machine()} |",
        (
            f"| DuckDB | CLI {duckdb_version()}, threads = {args.threads}, memory_limit = {args.memory_limit}, "
            "a fresh process per query |"
        ),
        f"| 1-min load average at start / end of the timings | {load[0]:.2f} / {load[1]:.2f} |",
    ]


def report(args: argparse.Namespace, desc: dict[str, Any], timing: dict[str, Any], load: tuple) -> str:
    cnt, st = desc["counts"], desc["stats"]
    run_b = desc["run_bytes"]
    lines = [
        *table_head(args, load),
        f"| store | {desc['store_bytes'] / 1e9:.2f} GB on disk for both runs (run 1: "
        + ", ".join(f"{t} {b / 1e6:,.0f} MB" for t, b in run_b.items())
        + "; run 2 shares sentences and parses) |",
        f"| pairs (quarantined) | {cnt['pairs']:,} ({cnt['quarantine']:,}) |",
        (
            f"| cells / word cells / same-token cells (per run) | {cnt['cells']:,} / {cnt['word_cells']:,} / "
            f"{cnt['same_token_cells']:,} |"
        ),
        f"| cells / word cells per pair | {cnt['cells'] / cnt['pairs']:.1f} / {cnt['word_cells'] / cnt['pairs']:.1f} |",
        (
            f"| sentences (in > 1 pair; most pairs of one) | {cnt['sentences']:,} "
            f"({st['sentences_in_more_than_one_pair']:,}; {st['max_pairs_per_sentence']}) |"
        ),
        f"| parses rows | {cnt['parses']:,} |",
        f"| planted pairs: negation / adjectives | {st['planted_negation_pairs']} / {st['planted_adjective_pairs']} |",
        f"| generation (s), parts per table | {desc['generate_s']:.0f}, {-(-cnt['pairs'] // desc['wave_size'])} |",
        "",
        LEGEND,
        "",
    ]
    return "\n".join(lines + timing_tables(args, timing)) + "\n"


LEGEND = (
            f"Target: each analysis ≤ {TARGET_S:.0f} s on 2 cores, memory bounded. *wall*: the CLI process from "
            "start to exit (the fastest of the runs made, all in brackets); *CPU*: its user + system time; "
            "*peak RSS*: that process's maximum resident set (GNU "
            "time's %M); *cores*: its CPU time / wall; *other*: cores the rest of the machine used meanwhile "
            "(/proc/stat; a run with > 0.5 is repeated up to --retries times). *≤ 60 s*: yes when the wall time is; "
            "**no** when even CPU / threads is above 60 s (the wall time on idle cores with perfect parallelism); "
            "open when only the contention put it over."
        )


def timing_tables(args: argparse.Namespace, timing: dict[str, Any]) -> list[str]:
    """The per-analysis table (and the floors) of a timing, as markdown lines."""
    lines = [
        "| analysis | runs | wall (s) | CPU (s) | peak RSS (MB) | rows out | cores | other | ≤ 60 s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in timing["analyses"]:
        name = r["analysis"] + (" (run, run2)" if r["two_run"] else "")
        if r["exit"] != 0:
            lines.append(f"| {name} | {r['runs']} | {r['wall_s']:.1f} | | {r['peak_rss_mb']:,.0f} | failed: "
                         f"{r['error'][:120].replace('|', '/')} | | | n/a |")  # fmt: skip: not timed, not missed
            continue
        ok = verdict(r["wall_s"], r["cpu_s"], args.threads)
        walls = f"{r['wall_s']:.1f}"
        if r["runs"] > 1:
            walls += " (" + ", ".join(f"{w:.1f}" for w in r["all_wall_s"]) + ")"
        lines.append(f"| {name} | {r['runs']} | {walls} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:,.0f} | {r['rows']:,} | "
                     f"{r['cores_used']:.2f} | {r['other_cores']:.2f} | {ok} |")  # fmt: skip
    if timing["floors"]:
        lines += [
            "",
            (
                "Floors (run 1): `count(*)` reads only the Parquet footers; *scan* hashes every column of every "
                "row (`select count(*), bit_xor(hash(t)) from read_parquet(...) as t`)."
            ),
            "",
            "| table | count(*) wall (s) | RSS (MB) | scan wall (s) | scan CPU (s) | RSS (MB) |",
            "|---|---|---|---|---|---|",
        ]
        by = {(f["table"], f["kind"]): f for f in timing["floors"]}
        for table in dict.fromkeys(f["table"] for f in timing["floors"]):
            c, s = by[(table, "count(*)")], by[(table, "scan")]
            lines.append(f"| {table} | {c['wall_s']:.2f} | {c['peak_rss_mb']:,.0f} | {s['wall_s']:.2f} | "
                         f"{s['cpu_s']:.1f} | {s['peak_rss_mb']:,.0f} |")  # fmt: skip
    return lines


def report_run(args: argparse.Namespace, desc: dict[str, Any], timing: dict[str, Any], load: tuple) -> str:
    """--run: the timings on an existing job store."""
    cnt, cfg = desc["counts"], desc["config"]
    same = desc["run2"] == desc["run"]
    lines = [
        *table_head(args, load),
        f"| run | `{desc['run']}` |",
        f"| run2 (two-run files) | {'= run (the same work as two runs; the answers are trivially 1)' if same else desc['run2']} |",
        (
            f"| config | {cfg.get('model')}, {cfg.get('mode')}, {cfg.get('similarity')}, layer {cfg.get('layer')}, "
            f"{cfg.get('rule')} N = {cfg.get('steps')}, min_abs {cfg.get('min_abs')} |"
        ),
        "| rows | " + ", ".join(f"{t} {n:,}" for t, n in cnt.items() if n is not None)
        + ("; no parses (run `python -m jobs.parse --run RUN`)" if cnt.get("parses") is None else "") + " |",
        "| on disk | " + ", ".join(f"{t} {b / 1e6:,.0f} MB" for t, b in desc["run_bytes"].items() if b) + " |",
        "",
        LEGEND,
        "",
    ]
    return "\n".join(lines + timing_tables(args, timing)) + "\n"



def write_results(path: Path, text: str, payload: dict[str, Any], existing: bool = False) -> None:
    header = (
        "# SQL benchmark (bench/sql.py --run)\n\n"
        "Every analysis in `sql/` on an existing job store (see the docstring of bench/sql.py).\n\n"
    ) if existing else (
        "# SQL benchmark (bench/sql.py)\n\n"
        "Every analysis in `sql/` on a synthetic store of full-QQP size, made by the script from the QQP subset "
        "(real tokenizer, real parses, the real question-repeat rate; cell values fitted to `xsbert explain`); "
        "see the docstring of bench/synthstore/__init__.py for what is real and what is modelled.\n\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    notes = ""
    if path.exists() and NOTES_MARKER in (old := path.read_text(encoding="utf-8")):
        notes = "\n" + old[old.index(NOTES_MARKER):]
    path.write_text(header + text + notes, encoding="utf-8")
    path.with_suffix(".json").write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")


def main(args: argparse.Namespace) -> int:
    if args.pairs < 300:
        print("bench/sql.py: error: --pairs must be at least 300", file=sys.stderr)
        return 2
    if any(not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.+", v) for v in args.var):
        print("bench/sql.py: error: --var takes NAME=VALUE (VALUE a SQL literal, e.g. 0.1 or 'x')", file=sys.stderr)
        return 2
    if not args.run and not (QQP and Path(QQP).exists()):
        print(f"bench/sql.py: error: the synthetic store is made from a QQP subset file: set $XSBERT_QQP to it "
              f"({QQP or 'unset'})", file=sys.stderr)  # fmt: skip
        return 2
    if args.results is None:
        args.results = str(RUN_RESULTS if args.run else RESULTS)
    if args.run2 and not args.run:
        print("bench/sql.py: error: --run2 needs --run", file=sys.stderr)
        return 2
    if not args.generate_only and not DUCKDB_CLI.exists():
        print(f"bench/sql.py: error: no duckdb CLI at {DUCKDB_CLI} (pip install duckdb-cli)", file=sys.stderr)
        return 2
    desc = existing_run(args) if args.run else open_store(args)
    if args.check and not args.run:
        check_store(desc)
    if args.generate_only:
        return 0
    load0 = os.getloadavg()[0]
    timing = time_all(desc, args)
    load1 = os.getloadavg()[0]
    text = (report_run if args.run else report)(args, desc, timing, (load0, load1))
    print()
    print(text)
    if args.results:
        payload = {"date": dt.date.today().isoformat(), "command": command_line(args), "machine": machine(),
                   "duckdb": duckdb_version(), "threads": args.threads, "memory_limit": args.memory_limit,
                   "load1": [load0, load1], "store": desc, **timing}  # fmt: skip
        write_results(Path(args.results), text, payload, existing=bool(args.run))
        print(f"written: {args.results} and {Path(args.results).with_suffix('.json').name}")
    failed = [r["analysis"] for r in timing["analyses"] if r["exit"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(parse_args()))
