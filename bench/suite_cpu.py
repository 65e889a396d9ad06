"""Where the CPU of one `make test` run goes: by kind of process, by test file, by test.

    python bench/suite_cpu.py run                      # `make test`, sampled; then the report
    python bench/suite_cpu.py run -- tests/test_job.py # pytest's arguments after --
    python bench/suite_cpu.py report DIR               # the report of a sampled run again

The suite is CPU-bound on two cores (bench/results/tests.md), so what a change saves is CPU seconds, wherever they
are spent: in the test processes, in the processes they wait for (commands, training workers), and in the Rays they
start (daemons, Ray Data's actors, factor actors, stage-2 tasks). `run` puts bench/suite_cpu_site on PYTHONPATH: its
sitecustomize samples every Python process once a second and its pytest plugin records each test's start, end and
the CPU of its test process and of the children it reaped. The machine's busy CPU seconds (/proc/stat) over the
run bound them all. Results: bench/results/tests.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(__file__).resolve().parent / "suite_cpu_site"


def busy_cpu_s() -> float:
    """The machine's busy CPU seconds since boot (/proc/stat: every state but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run(folder: Path, args: list[str]) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    # `make test` itself (its test processes: the Makefile's), with the plugin and pytest's arguments added
    env = {**os.environ, "XSBERT_SUITE_CPU": str(folder),
           "PYTEST_ADDOPTS": shlex.join(["-p", "suite_cpu_plugin", *args]),
           "PYTHONPATH": os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    busy, start = busy_cpu_s(), time.time()
    code = subprocess.call(["make", "-s", "test"], cwd=ROOT, env=env)
    (folder / "machine.json").write_text(json.dumps({"wall_s": time.time() - start, "busy_cpu_s": busy_cpu_s() - busy,
                                                     "exit": code, "args": args}))  # fmt: skip
    print(report(folder))
    return code


def kind(proc: dict) -> str:
    argv = " ".join(proc["argv"])
    if "default_worker.py" in argv:  # a Ray worker: an actor or a task; by what it imported
        if proc["sentence_transformers"]:
            return "Ray workers that imported sentence_transformers (factor actors, trainings)"
        return "Ray workers that imported torch (stage-2 tasks)" if proc["torch"] else "other Ray workers"
    for part, name in (("log_monitor.py", "Ray log monitors"), ("dashboard/agent.py", "Ray dashboard agents"),
                       ("dashboard/dashboard.py", "Ray dashboards"), ("monitor.py", "Ray monitors"),
                       ("moto_server", "moto_server")):  # fmt: skip
        if part in argv:
            return name
    tool = Path(proc["argv"][0]).name if proc["argv"] else "?"
    if tool in ("-c", "-m"):  # sampled before Python set argv[0] to the module: its arguments tell it
        tool = f"python {tool} {' '.join(proc['argv'][1:3])[:40]}".rstrip()
    return f"commands: {tool}" + (" (imported sentence_transformers)" if proc["sentence_transformers"] else "")


def report(folder: Path) -> str:
    tests = [json.loads(line) for f in sorted(folder.glob("tests-*.jsonl")) for line in f.read_text().splitlines()]
    procs = []
    for f in (folder / "procs").glob("*.json"):
        try:
            procs.append(json.loads(f.read_text()))
        except ValueError:
            continue  # caught mid-write at the end
    machine = json.loads((folder / "machine.json").read_text()) if (folder / "machine.json").exists() else {}
    test_pids = {t["pid"]: t["worker"] for t in tests}
    by_worker: dict[str, list[dict]] = collections.defaultdict(list)
    for t in tests:
        by_worker[t["worker"]].append(t)

    def running(worker: str, when: float) -> str:
        for t in by_worker[worker]:
            if t["t0"] <= when <= t["t1"] + 0.5:
                return t["test"]
        return "(between tests)"

    # What a test costs: its process's own CPU, and what it started. The latter two ways, each missing some: the
    # children it reaped (a process it started that has not ended is not in there yet: a Ray's workers come in when
    # the Ray stops, with the test that stops it) and the sampled Python processes under it, by the test running
    # when they started (a command started with an environment of its own is not sampled; C++ daemons never are).
    # The larger of the two counts, per test and per file.
    kinds, counts = collections.Counter(), collections.Counter()
    own, reaped, sampled = collections.Counter(), collections.Counter(), collections.Counter()
    for t in tests:
        own[t["test"]] += t["own"]
        reaped[t["test"]] += t["children"]
    for p in procs:
        if p["pid"] in test_pids:
            continue
        k = kind(p)
        kinds[k] += p["cpu"]
        counts[k] += 1
        owner = next((a for a in p["ancestors"] if a in test_pids), None)
        if owner is not None:
            sampled[running(test_pids[owner], p["t0"])] += p["cpu"]
    per_test = collections.Counter({t: own[t] + max(reaped[t], sampled[t]) for t in own | sampled})

    def by_file(counter: collections.Counter) -> collections.Counter:
        out: collections.Counter = collections.Counter()
        for test, cpu in counter.items():
            out[test.split("::")[0]] += cpu
        return out

    files = by_file(own), by_file(reaped), by_file(sampled)
    per_file = collections.Counter({f: files[0][f] + max(files[1][f], files[2][f]) for f in files[0] | files[2]})

    lines = [f"# {folder}", ""]
    if machine:
        lines.append(f"wall {machine['wall_s']:.0f} s; the machine's busy CPU {machine['busy_cpu_s']:.0f} s; exit "
                     f"{machine['exit']}")  # fmt: skip
    lines += [f"{len(tests)} tests; their processes' own CPU {sum(own.values()):.0f} s, the children they reaped "
              f"{sum(reaped.values()):.0f} s", "",
              "| Python processes besides the test processes | how many | CPU-s |", "|---|---|---|"]
    lines += [f"| {k} | {counts[k]} | {v:.1f} |" for k, v in kinds.most_common()]
    lines += ["", "| test file: its tests' own CPU + the larger of reaped and sampled | CPU-s |", "|---|---|"]
    lines += [f"| {f} | {v:.0f} |" for f, v in per_file.most_common(25)]
    lines += ["", "| test (the 25 largest) | CPU-s |", "|---|---|"]
    lines += [f"| {t} | {v:.0f} |" for t, v in per_test.most_common(25)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("run", help="`make test`'s command, sampled, then the report")
    r.add_argument("--out", type=Path, help="where the samples go (default: a fresh temp folder)")
    r.add_argument("pytest_args", nargs="*", help="pytest's arguments, after --")
    p = sub.add_parser("report", help="the report of a sampled run")
    p.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "report":
        print(report(args.folder))
        return 0
    return run(args.out or Path(tempfile.mkdtemp(prefix="suite-cpu-")), args.pytest_args)


if __name__ == "__main__":
    raise SystemExit(main())
