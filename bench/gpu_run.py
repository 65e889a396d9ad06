"""The whole GPU measurement of the attribution job as one prepared run: the offline bundle carried over in calls of
a few tens of MiB, installed there, then every measurement in the order of its value, results written as they come.

Here (PyPI reachable), once:

    python -m jobs.bundle --out bench/.cache/gpu-bundle --python 3.12 --platform manylinux_2_28_x86_64 \\
        --part-size 25MiB --only 'ray[data]' --have bench/gpu_have.txt \\
        --models all-MiniLM-L6-v2,all-mpnet-base-v2 --float16 --datasets qqp
    python bench/gpu_run.py plan          # the parts into calls (bench/.cache/gpu-calls/c1 ... cK) and their commands

There, call by call (plan prints each command and what it carries): calls 1..K-1 copy their parts to --bundle; the
last copies its own and runs

    python3 bench/gpu_run.py device --bundle /tmp/xb --work /tmp/xw --out $OUT

which checks every part, installs the wheels (pip --target, beside the machine's own torch), the models and the data,
and runs the pieces below, each in its own process, stopping before --deadline-s. After each piece it rewrites
OUT/results.tgz (every result but the stores), OUT/progress.json, OUT/run.log and OUT/pip-freeze.txt (the machine's
own packages: a later bundle's --have). A second start (same --work) resumes: finished pieces are kept; with
--resume-from results.tgz a fresh machine starts from what came back, installing and checking Ray again (what was
installed lives on the machine, not in results.tgz). A piece that a killed start left running is killed first.

  job-minilm      bench/gpu_job.py run: the real job, GPU actors, 2,000 QQP pairs in waves of 1,000 (WAVE),
                  all-MiniLM-L6-v2 layer 4
  job-mpnet       the same, all-mpnet-base-v2 layer 8 (the engine alone on 512 of its questions)
  sweep-mpnet     bench/gpu_settings.py sweep: precision x factor batch x GPU chunk, mpnet layer 8, N = 24
  adaptive-mpnet  adaptive N by panels (the default), by doubling, and the fixed N of equal worst-case error, mpnet
                  layer 8
  sweep-minilm    the sweep for MiniLM layer 4, N = 10
  adaptive-minilm the same for MiniLM
  shelf-n128      the run that ran out of an 80 GB card before the factor batch was fixed: shelf mpnet, layer 9,
                  negation at N = 128 (configs/shelf-gpu.yaml's negation-N128)
  memory-minilm   bench/gpu_settings.py memory: the factor batch as N grows (whole, planned, under a limit)

Before the job pieces, Ray is started once and stopped (ray-check, at most RAY_CHECK_S): where it does not start, the
job pieces are skipped with its output, and the time goes to the pieces that need no Ray. A job piece stops itself
after a wave when the time left would not hold another (bench/gpu_job.py --stop-by); job-minilm has at most
JOB_MINILM_CAP_S (none in a --dry-run), and where it was cut at that before its job ended (a job that stalls),
job-mpnet is skipped: it would stall the same way.

Here again: `python bench/gpu_run.py report OUT` (the folder that came back, or its results.tgz) writes the
measured part of bench/results/gpu-job.md, with the full-QQP estimate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "bench" / ".cache" / "gpu-bundle"
CALLS = ROOT / "bench" / ".cache" / "gpu-calls"
CPU_ROWS = ROOT / "bench" / "results" / "gpu-job-cpu"
RESULTS_MD = ROOT / "bench" / "results" / "gpu-job.md"
MEASURED = "<!-- measured: written by `python bench/gpu_run.py report` -->"
MiB = 2**20
# What one call may carry besides the working tree: 64 MiB a call for the tree and the carried paths together.
CARRY_LIMIT_MIB = 64
MODELS = {"minilm": ("all-MiniLM-L6-v2", 4, 10), "mpnet": ("all-mpnet-base-v2", 8, 24)}  # folder, layer, sweep's N
# Ray started and stopped as the job pieces start it (bench/gpu_job.py ray-check), before them (seconds at most).
RAY_CHECK_S = 120
RAY_SAID = "ray-check: "  # the line that gives its resources
# job-minilm's most seconds (~1.5 min expected on one GPU): a job that stalls leaves the rest its time.
JOB_MINILM_CAP_S = 240
QQP_PAIRS, QQP_QUESTIONS = 404_290, 537_933  # GLUE QQP train: pairs and unique questions
# Pairs per wave of the job pieces. The GPU default, 16,384, would make the 2,000 pairs one wave: no wave's stage 2
# beside the next one's stage 1 (as in a full run), one row of per-wave figures, and nothing kept if the time runs out.
WAVE = 1_000


# --------------------------------------------------------------------------- plan (here)
def tree_bytes() -> int:
    """The working tree that travels with each call: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout.decode()  # fmt: skip
    return sum((ROOT / f).stat().st_size for f in out.split("\0") if f and (ROOT / f).is_file())


def plan(args) -> dict[str, Any]:
    """The bundle's parts packed into calls of at most --carry-mib each (largest first), each call a folder of hard
    links (cK/parts/..., manifest.json and install.py in c1); the commands, in plan.json and on stdout."""
    bundle, calls = Path(args.bundle), Path(args.calls)
    manifest = json.loads((bundle / "manifest.json").read_text())
    parts = sorted(((p["file"], p["size"]) for i in manifest["items"] for p in i["parts"]), key=lambda x: -x[1])
    cap = int(args.carry_mib * MiB)
    extra = (bundle / "manifest.json").stat().st_size + (bundle / "install.py").stat().st_size
    loads: list[list[tuple[str, int]]] = [[]]
    sizes = [extra]
    for name, size in parts:  # first fit, largest first
        k = next((k for k, used in enumerate(sizes) if used + size <= cap), None)
        if k is None:
            loads.append([])
            sizes.append(0)
            k = len(loads) - 1
        loads[k].append((name, size))
        sizes[k] += size
    order = sorted(range(len(loads)), key=lambda k: (k != 0, -sizes[k]))  # c1 (manifest) first, the lightest last
    shutil.rmtree(calls, ignore_errors=True)
    tree = tree_bytes()
    out: dict[str, Any] = {"bundle": str(bundle), "parts": len(parts), "bundle_mib": sum(s for _, s in parts) / MiB,
                           "tree_mib": tree / MiB, "carry_mib": args.carry_mib, "calls": []}  # fmt: skip
    for n, k in enumerate(order, 1):
        folder = calls / f"c{n}"
        (folder / "parts").mkdir(parents=True)
        for name, _ in loads[k]:
            os.link(bundle / name, folder / name)
        if k == 0:
            for name in ("manifest.json", "install.py"):
                os.link(bundle / name, folder / name)
        rel = folder.relative_to(ROOT).as_posix() if folder.is_relative_to(ROOT) else str(folder)
        copy = f"mkdir -p {args.there_bundle} && cp -a {rel}/. {args.there_bundle}/"
        last = n == len(order)
        command = (f"{copy} && PYTHONUNBUFFERED=1 python3 bench/gpu_run.py device --bundle {args.there_bundle} "
                   f'--work {args.there_work} --out "$OUT" --deadline-s {args.deadline_s} {args.device_args}'.rstrip()
                   if last
                   else f"{copy} && ls {args.there_bundle}/parts | wc -l")  # fmt: skip
        if n == 1 and not last:  # the machine's packages come back with the first call, whatever the last one does
            command += ' && python3 -m pip freeze > "$OUT/freeze.txt"'

        out["calls"].append({"call": n, "carry": [rel], "carry_mib": sizes[k] / MiB,
                             "with_tree_mib": (sizes[k] + tree) / MiB, "command": command,
                             "timeout_s": args.deadline_s + 60 if last else 120})  # fmt: skip
        if (sizes[k] + tree) / MiB > CARRY_LIMIT_MIB:
            raise SystemExit(f"plan: call {n} carries {(sizes[k] + tree) / MiB:.1f} MiB with the working tree, over "
                             f"{CARRY_LIMIT_MIB}: a smaller --carry-mib")  # fmt: skip
    (calls / "plan.json").write_text(json.dumps(out, indent=1))
    print(f"plan: {out['parts']} parts, {out['bundle_mib']:.1f} MiB in {len(order)} calls; the working tree is "
          f"{out['tree_mib']:.1f} MiB")  # fmt: skip
    for c in out["calls"]:
        print(f"  call {c['call']}: carry {c['carry']} ({c['carry_mib']:.1f} MiB, {c['with_tree_mib']:.1f} with the "
              f"tree), timeout_s {c['timeout_s']}:\n    {c['command']}")  # fmt: skip
    print("  the last call by the device time left B (budget_left_s after the call before it): "
          + "; ".join(f"B {b}: timeout_s {t}, --deadline-s {t - 60}" for b, t in last_call_limits()))
    return out


def last_call_limits(budgets: tuple[int, ...] = (600, 540, 480, 420, 360, 300)) -> list[tuple[int, int]]:
    """(B, timeout_s) of the last call: min(560, B - 20) seconds, so that the machine's time is not cut under it;
    its --deadline-s is 60 s less, so that the last piece ends and its results are packed before the call is cut."""
    return [(b, min(560, b - 20)) for b in budgets]


# --------------------------------------------------------------------------- device (there)
# --dry-run (tests/test_gpu_job.py): the same pieces on a CPU with tiny models, few pairs, small N, Ray's logical GPUs.
DRY = {"job": ["--allow-cpu", "--logical-gpus", "2", "--device", "cpu", "--pairs", "8", "--compare", "4", "--steps",
               "2", "--job-arg=--batch-size=4", "--job-arg=--wave-size=4"],
       "settings": ["--dry-run", "--pairs", "4", "--steps", "2"],
       "shelf": ["--limit", "4", "--device", "cpu"]}  # fmt: skip


def pieces(bundle_into: Path, results: Path, deadline: float, cpu_rows: Path = CPU_ROWS,
           dry_run: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """(name, command, the least time worth starting it with), in the order of their value."""
    py = sys.executable
    models = {k: str(bundle_into / "models" / folder) for k, (folder, _, _) in MODELS.items()}
    qqp = str(bundle_into / "data" / "qqp_glue_train_subset.tsv.gz")
    out = []
    for key, engine in (("minilm", 0), ("mpnet", 512)):
        _, layer, _ = MODELS[key]
        out.append({"name": f"job-{key}", "min_s": 90 if key == "minilm" else 180,
                    # no cap in a dry run: a CPU's speed (a loaded one's, under test) says nothing of a stall
                    **({"cap_s": JOB_MINILM_CAP_S} if key == "minilm" and not dry_run else {}),
                    "argv": [py, "bench/gpu_job.py", "run", "--model", models[key], "--layer", str(layer),
                             "--qqp-path", qqp, "--cpu-rows", str(cpu_rows / key), "--engine-sentences", str(engine),
                             f"--job-arg=--wave-size={WAVE}", "--out", str(results / f"job-{key}")]})  # fmt: skip
    for key in ("mpnet", "minilm"):
        _, layer, steps = MODELS[key]
        common = ["--model", models[key], "--layer", str(layer), "--qqp-path", qqp, "--deadline", f"{deadline:.0f}"]
        out.append({"name": f"sweep-{key}", "min_s": 40, "argv": [py, "bench/gpu_settings.py", "sweep", *common,
                    "--steps", str(steps), "--out", str(results / f"sweep-{key}.json")]})  # fmt: skip
        out.append({"name": f"adaptive-{key}", "min_s": 25, "argv": [py, "bench/gpu_settings.py", "adaptive", *common,
                    "--out", str(results / f"adaptive-{key}.json")]})  # fmt: skip
    out.insert(5, {"name": "shelf-n128", "min_s": 45,
                   "argv": [py, "-m", "jobs.attribute", "--dataset", "negation", "--split", "test", "--model",
                            models["mpnet"], "--layer", "9", "--rule", "gauss-legendre", "--steps", "128",
                            "--executor", "local", "--wave-size", "256", "--out", str(results / "shelf-n128"),
                            "-q"]})  # fmt: skip
    out.append({"name": "memory-minilm", "min_s": 40,
                "argv": [py, "bench/gpu_settings.py", "memory", "--model", models["minilm"], "--layer", "4",
                         "--qqp-path", qqp, "--pairs", "256", "--deadline", f"{deadline:.0f}",
                         "--out", str(results / "memory-minilm.json")]})  # fmt: skip
    if dry_run:
        for piece in out:
            kind = piece["name"].split("-")[0]
            piece["argv"] += DRY.get({"job": "job", "shelf": "shelf"}.get(kind, "settings"), [])
            if kind == "shelf":
                piece["argv"][piece["argv"].index("--steps") + 1] = "4"
    return out


class Progress:
    """progress.json in --work, copied to OUT with results.tgz after each step."""

    def __init__(self, work: Path, out: Path) -> None:
        self.work, self.out = work, out
        self.path = work / "results" / "progress.json"
        self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"pieces": {}, "starts": []}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1))
        shutil.copyfile(self.path, self.out / "progress.json")
        tmp = self.out / "results.tgz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:  # the stores stay: only what the report reads
            tar.add(self.work / "results", arcname="results",
                    filter=lambda t: None if "/runs" in t.name or "/shelf-n128/" in t.name else t)
        os.replace(tmp, self.out / "results.tgz")


class Pieces:
    """The piece running now, in its own process group (so that a timeout kills its Ray and actors with it), its
    group in --work's piece.pid: a start after one that was killed (the call's own limit, a signal) first kills what
    that one left running, and a SIGTERM to this process kills the running piece's group before it exits."""

    def __init__(self, work: Path) -> None:
        self.pidfile = work / "piece.pid"
        self.proc: subprocess.Popen | None = None
        self.kill_left()
        signal.signal(signal.SIGTERM, self._terminated)

    def kill_left(self) -> None:
        try:
            group = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
            print(f"gpu_run: killed the process group {group} an earlier start left running", flush=True)
        self.pidfile.unlink(missing_ok=True)

    def _terminated(self, signum, frame) -> None:
        self.stop()
        raise SystemExit(128 + signum)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.pidfile.unlink(missing_ok=True)

    def sh(self, argv: list[str], log: Path, env: dict[str, str], timeout: float) -> tuple[int, float, str]:
        """Run argv (its own process group, killed at timeout), its output appended to `log`; (rc, seconds, tail)."""
        t0 = time.time()
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"\n$ {shlex.join(argv)}\n")
            fh.flush()
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                         start_new_session=True)  # fmt: skip
            self.pidfile.write_text(str(self.proc.pid))
            try:
                rc = self.proc.wait(timeout=max(1.0, timeout))
            except subprocess.TimeoutExpired:
                rc = 124
            self.stop()
            self.proc = None
        tail = log.read_text(encoding="utf-8", errors="replace")[-1500:]
        return rc, time.time() - t0, tail


# What only the machine that ran them holds: a --resume-from on a fresh machine installs and checks Ray again.
MACHINE_KEYS = ("check", "install")


def device(args) -> int:
    t0 = time.time()
    deadline = t0 + args.deadline_s
    work, out, bundle = Path(args.work), Path(args.out), Path(args.bundle)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.resume_from and not (work / "results" / "progress.json").is_file():
        with tarfile.open(args.resume_from) as tar:
            tar.extractall(work, filter="data")
    prog = Progress(work, out)
    prog.data["starts"].append(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    start = len(prog.data["starts"])
    log = out / "run.log"
    into, site = work / "xs", work / "site"
    # the checkout first: the driver and the Ray workers import the same jobs/ (the bundled project wheel is its copy);
    # no Ray token (a local Ray writes one under $HOME, which such a machine need not let it write)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]), "HF_HUB_OFFLINE": "1",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    runner = Pieces(work)
    # installed on this machine: its own install folder, from an install that succeeded (progress.json alone came
    # back with a --resume-from, from another machine)
    installed = (into / "bundle.json").is_file() and prog.data["pieces"].get("install", {}).get("rc") == 0
    if not installed:
        for key in MACHINE_KEYS:
            prog.data["pieces"].pop(key, None)
        prog.data.pop("ray_check", None)
        rc, secs, tail = runner.sh([sys.executable, str(bundle / "install.py"), "--check", "--bundle", str(bundle)],
                                   log, env, 120)  # fmt: skip
        if rc != 0:
            prog.data["pieces"]["check"] = {"rc": rc, "seconds": secs, "tail": tail, "start": start}
            prog.save()
            print(tail, file=sys.stderr)
            return 3
        rc, secs, tail = runner.sh([sys.executable, str(bundle / "install.py"), "--bundle", str(bundle), "--into",
                                    str(into), "--target", str(site)], log, env, 600)  # fmt: skip
        bundled = json.loads((into / "bundle.json").read_text()) if (into / "bundle.json").is_file() else {}
        prog.data["pieces"]["install"] = {"rc": rc, "seconds": secs, "unmet": bundled.get("unmet"), "start": start,
                                          "bundle_mib": sum(i["size"] for i in bundled.get("items", [])) / MiB}
        # the machine's own packages (what a later bundle's --have is): without the bundle's site on PYTHONPATH
        own = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        freeze = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, env=own)
        (out / "pip-freeze.txt").write_text(freeze.stdout)
        prog.data["nvidia_smi"] = nvidia_smi_q()
        prog.save()
        if rc != 0:
            print(tail, file=sys.stderr)
            return 4
    todo = [p for p in pieces(into, work / "results", deadline, Path(args.cpu_rows), args.dry_run)
            if prog.data["pieces"].get(p["name"], {}).get("rc") != 0
            and not (args.only and p["name"] not in args.only.split(","))]  # fmt: skip
    if any(p["name"].startswith("job-") for p in todo) and prog.data.get("ray_check", {}).get("rc") != 0:
        rc, secs, tail = runner.sh([sys.executable, "bench/gpu_job.py", "ray-check"], log, env,
                                   min(RAY_CHECK_S, deadline - time.time()))  # fmt: skip
        said = [line.removeprefix(RAY_SAID) for line in tail.splitlines() if line.startswith(RAY_SAID)]
        prog.data["ray_check"] = {"rc": rc, "seconds": secs, "start": start,
                                  **({"said": said[-1]} if said and rc == 0 else {"tail": tail})}  # fmt: skip
        prog.save()
        print(f"gpu_run: ray-check: rc {rc} in {secs:.0f} s", flush=True)
    for piece in todo:
        name, left = piece["name"], deadline - time.time()
        why = skip_reason(name, prog.data, work / "results")
        if why is None and left < piece["min_s"]:
            why = f"{left:.0f} s left, needs {piece['min_s']}"
        if why is not None:
            prog.data["pieces"].setdefault(name, {})["skipped"] = why
            prog.save()
            print(f"gpu_run: {name}: skipped: {why}", flush=True)
            continue
        budget = min(left - 5, piece.get("cap_s", left))
        if name.startswith("job-"):  # it stops itself after a wave rather than be cut
            piece["argv"] = [*piece["argv"], f"--stop-by={time.time() + budget:.0f}"]
        print(f"gpu_run: {name} ({left:.0f} s left)", flush=True)
        rc, secs, tail = runner.sh(piece["argv"], log, env, budget)
        prog.data["pieces"][name] = {"rc": rc, "seconds": secs, "argv": piece["argv"],
                                     **({"tail": tail} if rc else {})}  # fmt: skip
        if name == "shelf-n128" and rc == 0:
            prog.data["pieces"][name]["summary"] = shelf_summary(work / "results" / "shelf-n128")
        prog.save()
        print(f"gpu_run: {name}: rc {rc} in {secs:.0f} s", flush=True)
    prog.data["wall_s"] = time.time() - t0
    prog.save()
    return 0


def skip_reason(name: str, progress: dict[str, Any], results: Path) -> str | None:
    """Why a piece is not started, from what ran before it (None: start it): a job piece when Ray did not start;
    job-mpnet when job-minilm was cut at its cap before its job ended (it stalled; the same job would stall again).
    A job that ended and was cut in the steps after it (the subset, the engine alone) did not stall."""
    check = progress.get("ray_check")
    if name.startswith("job-") and check is not None and check.get("rc") != 0:
        return f"Ray did not start (ray-check rc {check.get('rc')}: {check.get('tail', '')[-300:].strip()})"
    if name == "job-mpnet" and progress.get("pieces", {}).get("job-minilm", {}).get("rc") == 124:
        record = results / "job-minilm" / "gpu-job.json"
        ended = record.is_file() and "job" in json.loads(record.read_text())
        if not ended:
            return "job-minilm was cut at its cap before its job ended: the job stalled"
    return None


def nvidia_smi_q() -> str | None:
    """`nvidia-smi -q`'s first 4,000 characters (None where there is none, it fails or it hangs)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        return subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=30).stdout[:4000]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -q: {exc}"


def shelf_summary(store: Path) -> dict[str, Any]:
    """The shelf-n128 run's manifest: its last run's counts, wall time and waves' memory halvings."""
    manifest = json.loads(next(store.glob("*/manifest.json")).read_text())
    run = manifest["runs"][-1]
    return {**run["counts"], "wall_s": run["wall_s"], "mean_abs_completeness_error": run["mean_abs_completeness_error"],
            "max_abs_completeness_error": run["max_abs_completeness_error"],
            "oom_retries": sum(w.get("oom_retries", 0) for w in run["waves"]), "device": run["resources"]["device"]}


# --------------------------------------------------------------------------- report (here)
def estimate(job: dict[str, Any], engine: dict[str, Any] | None) -> dict[str, Any]:
    """Full QQP from one job's measured rates. Stage 1 (GPU) goes by unique questions (a 2,000-pair sample has ~2 per
    pair, all of QQP 1.33), stage 2 and the commits (CPUs, the driver) by pairs; the waves of a full run overlap the
    two (the pool goes on with the next wave while stage 2 runs), so the slower of them sets the pace."""
    st, n_s, n_p = job["stages"], job["sentences"], job["pairs"]
    if "actor_attribution_s" in st:
        gpu_s = st["actor_attribution_s"] / n_s  # actor-seconds in the engine per question
    elif engine:  # a job stopped after some waves (bench/gpu_job.py --stop-by): its actors' seconds are not recorded
        gpu_s = engine["seconds"] / engine["sentences"]
    else:
        raise ValueError("no GPU seconds per question: the job recorded no actor-seconds and the engine did not run")
    cpu_s = (st["stage2_cells_s"] + st.get("commit_s", 0.0)) / n_p  # per pair (a stopped job's commits: in other_s)
    stage1_h, stage2_h = QQP_QUESTIONS * gpu_s / 3600, QQP_PAIRS * cpu_s / 3600
    prepare_h = QQP_PAIRS * st["prepare_s"] / n_p / 3600
    out = {"stage1_h": stage1_h, "stage2_h": stage2_h, "prepare_h": prepare_h,
           "overlapped_h": prepare_h + max(stage1_h, stage2_h), "sequential_h": prepare_h + stage1_h + stage2_h,
           "limit": "the GPU (stage 1)" if stage1_h >= stage2_h else "the CPUs and the driver (stage 2, commits)",
           "two_gpus_h": prepare_h + max(stage1_h / 2, stage2_h),
           "end_to_end_rate_h": QQP_PAIRS / job["pairs_per_s"] / 3600,
           "stage1_from": "the actors" if "actor_attribution_s" in st else "the engine alone"}  # fmt: skip
    if engine:
        out["engine_alone_h"] = QQP_QUESTIONS / engine["sentences_per_s"] / 3600
    return out


def to_the_hour(stage1_h: float, stage2_h: float, prepare_h: float) -> str:
    """What stands between the two models' estimate and 1 h: each stage against the hour that prepare leaves."""
    left = 1.0 - prepare_h
    if left <= 0:
        return (f"Between them and 1 h: prepare alone takes {prepare_h:.2f} h; then stage 1 {stage1_h:.2f} h of GPU "
                f"time and stage 2 and the commits {stage2_h:.2f} h of CPU and driver time.")
    return (f"Between them and 1 h: prepare {prepare_h:.2f} h leaves {left:.2f} h, in which stage 1's "
            f"{stage1_h:.2f} h of GPU time is x{stage1_h / left:.1f} too slow for one GPU (that many GPUs, or a "
            f"faster engine), and stage 2 and the commits' {stage2_h:.2f} h of CPU and driver time "
            f"x{stage2_h / left:.1f}.")


class ReportError(Exception):
    """`report` cannot read what it was given (one line, exit 2)."""


def report(args) -> str:
    from gpu_job import report as job_report

    results = Path(args.results)
    results = results / "results.tgz" if results.is_dir() else results
    if not results.is_file() or not tarfile.is_tarfile(results):
        raise ReportError(f"{args.results}: no results.tgz there (give the folder a device call's OUT came back in, "
                          "or its results.tgz)")  # fmt: skip
    folder = Path(args.into)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tarfile.open(results) as tar:
        tar.extractall(folder, filter="data")
    res = folder / "results"
    prog = json.loads((res / "progress.json").read_text())
    inst = prog["pieces"].get("install", {})
    lines = [MEASURED, "", "## Measured", "",
             f"Started {', '.join(prog['starts'])}; install {inst.get('seconds', 0):.0f} s "
             f"({inst.get('bundle_mib', 0):.0f} MiB of parts; requirements the machine lacked: "
             f"{inst.get('unmet') or 'none'}); the last start ran {prog.get('wall_s', 0):.0f} s.", "",
             "| piece | exit | seconds |", "|---|---|---|"]  # fmt: skip
    lines += [f"| {k} | {v.get('rc', v.get('skipped'))} | {v.get('seconds', 0):.0f} |"
              for k, v in prog["pieces"].items()]
    rows = []
    for key in MODELS:
        path = res / f"job-{key}" / "gpu-job.json"
        if not path.is_file():
            continue
        lines += ["", job_report(str(path))]
        r = json.loads(path.read_text())
        if r.get("job"):
            rows.append((key, estimate(r["job"], r.get("engine"))))
    if rows:
        lines += ["", "### Full QQP (404,290 pairs, 537,933 unique questions) at these rates", "",
                  "| model | stage 1 (GPU) h | stage 2 + commits h | prepare h | overlapped h | sequential h | "
                  "2 GPUs h | engine alone h | limited by |", "|" + "---|" * 9]  # fmt: skip
        for key, e in rows:
            lines.append(f"| {key} | {e['stage1_h']:.2f} | {e['stage2_h']:.2f} | {e['prepare_h']:.2f} | "
                         f"{e['overlapped_h']:.2f} | {e['sequential_h']:.2f} | {e['two_gpus_h']:.2f} | "
                         f"{e.get('engine_alone_h', float('nan')):.2f} | {e['limit']} |")  # fmt: skip
        lines += [f"\n{key}'s stage 1 is the engine alone's GPU seconds per question (its job stopped early)."
                  for key, e in rows if e["stage1_from"] != "the actors"]
        both = sum(e["overlapped_h"] for _, e in rows)
        s1, s2, prep = (sum(e[k] for _, e in rows) for k in ("stage1_h", "stage2_h", "prepare_h"))
        lines += ["", f"Both models, one after the other on one GPU: **{both:.2f} h** (overlapped waves); the goal is "
                  f"1 h." + (" " + to_the_hour(s1, s2, prep) if both > 1 else "")]
    for key in ("mpnet", "minilm"):
        for what in ("sweep", "adaptive"):
            path = res / f"{what}-{key}.json"
            if path.is_file():
                lines += ["", f"### {what} {key}", "", *cells_table(json.loads(path.read_text()))]
    if "summary" in prog["pieces"].get("shelf-n128", {}):
        s = prog["pieces"]["shelf-n128"]["summary"]
        lines += ["", "### shelf mpnet, layer 9, negation at N = 128 (shelf_gpu.md: 37 s with the one-by-one fallback)",
                  "", f"{s['n_done']} done, {s['n_quarantined']} quarantined, {s['wall_s']:.1f} s, "
                  f"{s['oom_retries']} batches out of memory; max |completeness error| "
                  f"{s['max_abs_completeness_error']:.1e}."]  # fmt: skip
    if (res / "memory-minilm.json").is_file():
        lines += ["", "### memory minilm", "", *cells_table(json.loads((res / "memory-minilm.json").read_text()))]
    text = "\n".join(lines) + "\n"
    md = Path(args.results_md)
    head = md.read_text().split(MEASURED)[0].rstrip() + "\n\n" if md.is_file() else ""
    md.write_text(head + text)
    print(text)
    return text


def cells_table(r: dict[str, Any]) -> list[str]:
    """A table of a gpu_settings.py result's cells: one row each, a column per number any cell has."""
    cells = r.get("cells", {})
    if not cells:
        return ["(no cell measured)"]
    cols = list(dict.fromkeys(k for c in cells.values() for k in c))  # every cell's numbers, in order of appearance

    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return ([f"{r.get('gpu') or r.get('device')}, {r.get('sentences')} questions; {r.get('stamp')}.", "",
             "| cell | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
            + [f"| {k} | " + " | ".join(fmt(c.get(col)) for col in cols) + " |" for k, c in cells.items()]
            + (["", f"Skipped (time): {', '.join(r['skipped'])}."] if r.get("skipped") else []))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="here: the bundle's parts into calls, and the calls' commands")
    pl.add_argument("--bundle", default=str(BUNDLE))
    pl.add_argument("--calls", default=str(CALLS))
    pl.add_argument("--carry-mib", type=float, default=50.0, help="parts per call, at most (MiB)")
    pl.add_argument("--there-bundle", default="/tmp/xb", help="where the calls gather the parts there")
    pl.add_argument("--there-work", default="/tmp/xw")
    pl.add_argument("--deadline-s", type=int, default=500)
    pl.add_argument("--device-args", default="", help="more arguments of the last call's `device` (tests: --dry-run)")
    d = sub.add_parser("device", help="there: check, install, measure")
    d.add_argument("--bundle", required=True, help="the folder the calls copied the parts into")
    d.add_argument("--work", required=True, help="installs and results (kept between starts)")
    d.add_argument("--out", required=True, help="what comes back: results.tgz, progress.json, run.log, pip-freeze")
    d.add_argument("--deadline-s", type=int, default=500, help="start nothing after this many seconds")
    d.add_argument("--resume-from", default=None, help="a results.tgz of an earlier start (on a fresh machine)")
    d.add_argument("--only", default=None, help="comma-separated piece names")
    d.add_argument("--cpu-rows", default=str(CPU_ROWS), help="the `gpu_job.py cpu-rows` folders, one per model")
    d.add_argument("--dry-run", action="store_true", help="on a CPU: tiny models, few pairs, Ray's logical GPUs")
    r = sub.add_parser("report", help="here: bench/results/gpu-job.md's measured part from results.tgz")
    r.add_argument("results", help="the folder a device call's OUT came back in, or its results.tgz")
    r.add_argument("--into", default=str(ROOT / "bench" / ".cache" / "gpu-results"))
    r.add_argument("--results-md", default=str(RESULTS_MD))
    a = p.parse_args(argv)
    if a.cmd == "plan":
        plan(a)
        return 0
    if a.cmd == "device":
        return device(a)
    try:
        report(a)
    except ReportError as exc:
        print(f"gpu_run: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
