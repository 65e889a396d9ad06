"""bench/paper_gpu.py end to end on the CPU with a tiny random model of mpnet's architecture (12 layers, so that
configs/paper-gpu.yaml's layers exist): prepare here (the model's float16 parts in batch folders), run "there" in a
process where what the GPU machine lacks cannot be imported (Ray, DuckDB, polars, spaCy, stanza, deepsig, the object
storage clients), stopped after a piece and resumed, its results fetched in parts of a small size over several calls,
received and reported here; then a second call on a bare work folder (a fresh machine) that retrains (the same
weights: training is deterministic) and skips every run the first one sent back."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jobtools import qqp_file
from test_local_executor import HIDE  # the sitecustomize that hides packages from a subprocess

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "paper_gpu.py"
# What the GPU machine lacks and the run there must never import (the wheels it gets, pydantic and datasets, are here).
MISSING_THERE = ("ray", "duckdb", "polars", "spacy", "stanza", "deepsig", "boto3", "botocore", "google", "moto")
RUNS = "exact-L11,tuned-L11,exact-L9,shelf-L9,negation-exact-L9,exact-qqp-L8,shelf-qqp-L8"
SMALL = ["--set", "datasets.stsb-test.limit=3", "--set", "datasets.negation.limit=2", "--set", "defaults.steps=2",
         "--set", "defaults.tolerance=null"]  # fmt: skip
for _m in ("tuned", "exact", "orig"):
    SMALL += ["--set", f"models.{_m}.train.recipe={{epochs: 1, batch_size: 4}}", "--set",
              f"models.{_m}.train.train_limit=8", "--set", f"models.{_m}.train.dev_limit=6"]  # fmt: skip


def there_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a process "there": what the GPU machine lacks cannot be imported."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "sitecustomize.py").write_text(HIDE.format(hidden=sorted(MISSING_THERE)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    env.pop("XSBERT_QQP", None)  # the QQP subset there is the one `prepare` carried, or none
    return env


def there(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "run", *args], cwd=tmp_path, env=there_env(tmp_path),
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def prepare_tiny(tiny, transfer: Path) -> None:
    """Here: a one-layer tiny MPNet's float16 parts in batch folders of at most 1 MiB (no wheels)."""
    assert here("prepare", "--into", str(transfer), "--base", str(tiny.folder("mpnet", 1)), "--part-mib", "0.5",
                "--batch-mib", "1", "--no-wheels") == 0  # fmt: skip


def long_trainings(epochs: int) -> list[str]:
    """--set for the three trainings on 8 pairs in batches of 4 (2 steps an epoch), dev on 2, for `epochs`."""
    return [x for m in ("tuned", "exact", "orig") for x in (
        "--set", f"models.{m}.train.recipe={{epochs: {epochs}, batch_size: 4}}", "--set",
        f"models.{m}.train.train_limit=8", "--set", f"models.{m}.train.dev_limit=2")]  # fmt: skip


def here(*args: str) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import paper_gpu
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return paper_gpu.main(list(args))


def parquet_state(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*.parquet"))}


def test_check_there_imports_what_the_stages_need_and_counts_the_parts(tiny, tmp_path):
    """`run --check` (the first call, before the weights are all there): the stages' imports work where Ray, DuckDB,
    polars, ... cannot be imported (and they cannot: the probe), and it says how many parts have arrived."""
    transfer = tmp_path / "transfer"
    prepare_tiny(tiny, transfer)
    last = sorted(transfer.glob("batch-*"))[-1]
    last.rename(tmp_path / "later")  # the last batch has not come yet
    done = there(tmp_path, "--check", "--transfer", str(transfer), "--work", str(tmp_path / "work"))
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.split("paper_gpu: check: ", 1)[1].splitlines()[0])
    n_later = len(list((tmp_path / "later" / "parts").iterdir()))
    have, total = (int(x) for x in found["parts"].split(" of "))
    assert total - have == n_later > 0 and found["pydantic"] != "missing" and found["cuda"] is False
    assert found["qqp"] == "not carried"
    hide = tmp_path / "hide"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    probe = subprocess.run([sys.executable, "-c", "import duckdb"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'duckdb'" in probe.stderr


# The wheels `prepare` sends (pydantic and what it needs; datasets and its own are only imported by the training):
# there they exist only in the work folder's site, where `run --check` installed them.
WHEELS = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection")


def test_a_later_call_imports_the_wheels_the_first_one_installed(tiny, tmp_path):
    """The first call (`run --check`) installs the wheels into the work folder's site; a later call's `run` is a new
    process, and must put that folder on its path before it imports the study config (pydantic). Here pydantic can
    be imported from that folder only: the run gets as far as its deadline (0 s: before the training)."""
    transfer, work = tmp_path / "transfer", tmp_path / "work"
    prepare_tiny(tiny, transfer)
    site = work / "site"
    for name in WHEELS:  # what install_wheels leaves there, copied from this environment
        spec = importlib.util.find_spec(name)
        if spec.submodule_search_locations:
            shutil.copytree(next(iter(spec.submodule_search_locations)), site / name)
        else:
            shutil.copyfile(spec.origin, site / Path(spec.origin).name)
    (site / ".installed").write_text("\n".join(WHEELS) + "\n")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE.format(hidden=sorted({*MISSING_THERE, *WHEELS})), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)]), "HIDDEN_ONLY_FROM": str(site)}
    probe = subprocess.run([sys.executable, "-c", "import pydantic"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'pydantic'" in probe.stderr
    done = subprocess.run([sys.executable, str(SCRIPT), "run", "--transfer", str(transfer), "--work", str(work),
                           "--out", str(tmp_path / "out"), "--deadline-s", "0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped after the deadline, before train" in done.stdout


def test_a_call_killed_while_training_sends_back_how_far_the_trainings_came(tiny, tmp_path, capsys):
    """A call that runs out of time during the trainings is killed with nothing finished; OUT still holds outbox.json
    with each training's last progress (written every --poll-s), and `receive` here says it."""
    import time

    transfer, work, out = tmp_path / "transfer", tmp_path / "work", tmp_path / "out"
    prepare_tiny(tiny, transfer)
    call = subprocess.Popen([sys.executable, str(SCRIPT), "run", "--transfer", str(transfer), "--work", str(work),
                             "--out", str(out), "--poll-s", "0.1", *long_trainings(200)], cwd=tmp_path,
                            env=there_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and call.poll() is None:
            box = json.loads((out / "outbox.json").read_text()) if (out / "outbox.json").is_file() else {}
            if any(p["step"] > 0 for p in box.get("progress", {}).get("training", {}).values()):
                break
            time.sleep(0.1)
        assert call.poll() is None, call.stderr.read().decode()[-3000:]
    finally:
        os.killpg(call.pid, 9)  # the time limit's kill: the call and its training processes
        call.wait()
    box = json.loads((out / "outbox.json").read_text())
    assert box["pieces"] == [] and "train" not in box["progress"]["pieces"]
    capsys.readouterr()
    assert here("receive", "--parts", str(out), "--into", str(tmp_path / "results")) == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if "(unfinished when the call's OUT was last" in ln]
    assert said and all("/400 (epoch " in ln and " s left" in ln for ln in said), said


def test_trainings_that_would_end_after_the_deadline_are_stopped_early(tiny, tmp_path, capsys):
    """--deadline-s: once a training's rate says it would end after the deadline (at its first report after a step),
    every training stops after its current step (those not started yet before their first), nothing of them is kept,
    and the call ends at once with OUT's outbox.json saying why and how far they came."""
    import re

    transfer, work, out = tmp_path / "transfer", tmp_path / "work", tmp_path / "out"
    prepare_tiny(tiny, transfer)
    done = there(tmp_path, "--transfer", str(transfer), "--work", str(work), "--out", str(out), "--poll-s", "0.1",
                 "--deadline-s", "60", *long_trainings(2000))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "would end at ~" in done.stdout and "stopped after the deadline, in train: trainings stopped" in done.stdout
    # no QQP subset came with the transfer: the QQP runs are left out, not looked for on the hub
    assert "left out: exact-qqp-L8, shelf-qqp-L8 (no QQP subset file came with the transfer" in done.stdout
    box = json.loads((out / "outbox.json").read_text())
    why = box["progress"]["training_stopped"]
    assert "(kept)" not in why and "exact stopped at step 0/4000" in why and "orig stopped at step 0/4000" in why
    asked, ended = (int(re.search(rf"{w} at step (\d+)/4000", why).group(1)) for w in ("tuned", "tuned stopped"))
    assert 0 < asked <= ended  # how soon after: tests/test_training.py (on_step)
    assert all(p["max_steps"] == 4000 and p["step"] < 4000 for p in box["progress"]["training"].values())
    assert not [p for p in (work / "models").iterdir()]  # no model, no partial folder, no progress or stop file
    assert here("receive", "--parts", str(out), "--into", str(tmp_path / "results")) == 0
    assert f"train: {why}" in capsys.readouterr().out
    # asked for by name, a QQP run without the file is a one-line error
    asked = there(tmp_path, "--transfer", str(transfer), "--work", str(work), "--only", "shelf-qqp-L8")
    assert asked.returncode == 2 and asked.stderr.strip().splitlines() == [
        "paper_gpu: error: --only: shelf-qqp-L8 need(s) the QQP subset file, which the transfer does not hold "
        "(prepare --qqp FILE)"]  # fmt: skip
    hub = there(tmp_path, "--transfer", str(transfer), "--work", str(work), "--only", "negation-exact-L9",
                "--set", "datasets.negation.source=glue/mrpc")  # any run whose data is on the hub
    assert hub.returncode == 2 and hub.stderr.strip().splitlines() == [
        "paper_gpu: error: --only: negation-exact-L9 need(s) glue/mrpc from the hub, out of reach here"]



def bench_module(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def checkout_copy(src: Path, dest: Path) -> None:
    """What a call's machine gets of the checkout `src`: its tracked files and the untracked ones git does not ignore
    (the paths the call's carry list names come on top)."""
    names = subprocess.run(["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, names):
        if (src / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / name, dest / name)


def test_the_planned_calls_each_carry_their_own_batch_and_the_run_finds_them_all(tiny, tmp_path, capsys):
    """`plan`'s calls as the device tool runs them: each in a fresh copy of the checkout with only the paths its carry
    list names (one batch; the run call also the earlier attempt's progress.json), $OUT an empty folder, on one
    machine whose disk (device/) lasts from call to call. The earlier batches are only where the earlier calls
    copied them, outside the checkout, and the run installs the model from there. The earlier plan's run call
    (--transfer naming the checkout's batches) fails on the same layout: its checkout holds its own batch only."""
    here_, device = tmp_path / "here", tmp_path / "device"
    checkout_copy(ROOT, here_)  # this checkout, as a repository with nothing committed and the same .gitignore
    subprocess.run(["git", "init", "-q", str(here_)], check=True)
    cache = here_ / "bench" / ".cache" / "paper-gpu"
    assert here("prepare", "--into", str(cache / "transfer"), "--base", str(tiny.folder("mpnet", 1)), "--part-mib",
                "0.2", "--batch-mib", "0.4", "--no-wheels") == 0  # fmt: skip
    batches = sorted(p.name for p in (cache / "transfer").glob("batch-*"))
    assert len(batches) >= 3, batches
    done = cache / "results" / "progress.json"  # an earlier attempt's, as `receive` wrote it
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"pieces": {}, "models": {}, "runs": {}}))
    assert here("plan", "--transfer", str(cache / "transfer"), "--there", str(device / "pt"), "--work",
                str(device / "work"), "--deadline-s", "0", "--done", str(done)) == 0  # fmt: skip
    # nothing `prepare`, `plan` or `receive` write travels with a call's working tree; batches that would are refused
    assert subprocess.run(["git", "-C", str(here_), "status", "--porcelain", "--untracked-files=all", "bench/.cache"],
                          capture_output=True, text=True, check=True).stdout == ""  # fmt: skip
    shutil.copytree(cache / "transfer", here_ / "transfer", ignore=shutil.ignore_patterns("plan.json"))
    capsys.readouterr()
    assert here("plan", "--transfer", str(here_ / "transfer")) == 2
    assert "paper_gpu: error: --transfer's batch transfer/batch-01 is not git-ignored" in capsys.readouterr().err
    shutil.rmtree(here_ / "transfer")
    calls = json.loads((cache / "transfer" / "plan.json").read_text())["calls"]
    rel = "bench/.cache/paper-gpu"
    assert [c["carry"] for c in calls] == [[f"{rel}/transfer/{b}"] for b in batches[:-1]] + [
        [f"{rel}/transfer/{batches[-1]}", f"{rel}/results/progress.json"]]  # fmt: skip
    assert all(c["with_tree_mib"] < 64 for c in calls)
    # `python3` in the commands is this interpreter, as it is the machine's own Python there
    env = {**there_env(tmp_path), "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}

    def call(k: int, carry: list[str], command: str) -> tuple[subprocess.CompletedProcess, Path]:
        tree, out = tmp_path / f"call-{k}" / "checkout", tmp_path / f"call-{k}" / "out"
        checkout_copy(here_, tree)
        for path in carry:
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (here_ / path).is_dir() else shutil.copy2)(here_ / path, tree / path)
        out.mkdir()
        path = os.pathsep.join([str(tmp_path / "hide"), str(tree)])  # the checkout's jobs/, not this one's
        done = subprocess.run(["bash", "-c", command], cwd=tree, capture_output=True, text=True, timeout=600,
                              env={**env, "OUT": str(out), "PYTHONPATH": path})  # fmt: skip
        return done, out

    for c in calls:
        done, out = call(c["call"], c["carry"], c["command"])
        assert done.returncode == 0, (c["command"], done.stdout[-2000:], done.stderr[-2000:])
        if c["call"] == 1:  # the machine's own packages, and the check with the first batch's parts
            assert "torch" in (out / "freeze.txt").read_text()
            found = json.loads(done.stdout.split("paper_gpu: check: ", 1)[1].splitlines()[0])
            assert 0 < int(found["parts"].split(" of ")[0]) < int(found["parts"].split(" of ")[1])
    assert "stopped after the deadline, before train" in done.stdout
    assert sorted(p.name for p in (device / "pt").iterdir()) == batches
    assert (device / "work" / "xs" / "models" / tiny.folder("mpnet", 1).name / "model.safetensors").is_file()

    # the earlier plan: the run call names the batches in the checkout, where only its own one is
    old = (f'python3 bench/paper_gpu.py run --transfer {rel}/transfer --work {device / "work-old"} --out "$OUT" '
           "--deadline-s 0")  # fmt: skip
    done, _ = call(len(calls) + 1, calls[-1]["carry"], old)
    assert done.returncode == 2 and "holds the bundle's manifest.json (batch-01)" in done.stderr, done.stderr
    # a run call that did not carry --done's file stops at once (it had run every earlier run again), as does one
    # whose machine lost the earlier batches (started afresh)
    run = calls[-1]["command"].split(" && ")[-1].replace(str(device / "work"), str(device / "work-fresh"))
    done, _ = call(len(calls) + 2, calls[-1]["carry"][:1], run)
    assert done.returncode == 2 and f"--done {rel}/results/progress.json: no such file" in done.stderr, done.stderr
    shutil.rmtree(device / "pt" / batches[1])
    done, _ = call(len(calls) + 3, calls[-1]["carry"], run)
    assert done.returncode == 2 and "parts are not under" in done.stderr and batches[1] not in done.stderr, done.stderr


def test_a_kill_while_out_is_filled_leaves_an_out_that_receive_reads(tmp_path, monkeypatch):
    """Outbox.fill after a second piece, killed at each of its copies in turn (the copy cut short): OUT still holds
    outbox.json, and `receive` extracts every piece whose parts are whole there."""
    import random

    transfer = bench_module("paper_gpu_transfer")
    rng = random.Random(0)
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    box = transfer.Outbox(results, tmp_path / "outbox", part_mib=0.01)  # parts of 10 KiB
    data = {name: rng.randbytes(25_000) for name in ("a.bin", "b.bin")}
    (results / "a.bin").write_bytes(data["a.bin"])
    box.pack("one", {"pieces": {"one": {}}})
    box.fill(out, 0)
    (results / "b.bin").write_bytes(data["b.bin"])
    box.pack("two", {"pieces": {"one": {}, "two": {}}})
    real, kills = shutil.copyfile, 0

    class Killed(Exception):
        pass

    while True:
        copies = []

        def cut_short(src, dst, copies=copies):
            copies.append(dst)
            if len(copies) <= kills:
                return real(src, dst)
            Path(dst).write_bytes(Path(src).read_bytes()[: Path(src).stat().st_size // 2])
            raise Killed

        killed = tmp_path / f"out-{kills}"
        shutil.copytree(out, killed)
        monkeypatch.setattr(transfer.shutil, "copyfile", cut_short)
        try:
            box.fill(killed, 0)
        except Killed:
            pass
        else:
            break
        finally:
            monkeypatch.setattr(transfer.shutil, "copyfile", real)
        got = [name.rsplit("-", 1)[1] for name in transfer.receive([killed], tmp_path / f"got-{kills}")["pieces"]]
        assert got in (["one.tar"], ["one.tar", "two.tar"]), (kills, got)
        for name in ("a.bin", "b.bin")[: len(got)]:
            assert (tmp_path / f"got-{kills}" / name).read_bytes() == data[name]
        kills += 1
    assert kills >= 2  # a kill at each of the second piece's parts and at outbox.json
    assert len(transfer.receive([killed], tmp_path / "got")["pieces"]) == 2


def test_the_next_attempt_received_into_the_same_folder_adds_to_the_first(tmp_path):
    """Two attempts (two bare machines, each outbox numbered from 1) received into one results folder, the first
    alone, then both OUTs at once: the second's pieces are extracted too (not taken for the first's), and
    progress.json holds both attempts' runs, models and pieces, the second's record where both have one."""
    transfer = bench_module("paper_gpu_transfer")
    into = tmp_path / "results"
    attempts = {1: {"runs": ["exact-L11", "tuned-L11"], "models": ["tuned", "exact", "orig"], "table1": True},
                2: {"runs": ["tuned-L9"], "models": ["tuned"], "table1": False}}  # fmt: skip
    for k, attempt in attempts.items():
        results = tmp_path / f"machine-{k}" / "results"
        (results / "runs").mkdir(parents=True)
        box = transfer.Outbox(results, results.parent / "outbox", part_mib=1)
        progress = {"pieces": {"train": {}}, "models": {m: {"attempt": k} for m in attempt["models"]}, "runs": {}}
        transfer.write_json(results / "progress.json", progress)
        box.pack("train", progress)
        if attempt["table1"]:
            (results / "table1.json").write_text("{}")
            progress["pieces"]["table1"] = {}
            transfer.write_json(results / "progress.json", progress)
            box.pack("table1", progress)
        for run in attempt["runs"]:
            (results / "runs" / run).mkdir()
            (results / "runs" / run / "manifest.json").write_text(json.dumps({"attempt": k}))
            progress["runs"][run] = {"run_dir": f"runs/{run}", "attempt": k}
            transfer.write_json(results / "progress.json", progress)
            box.pack(run, progress)
        box.fill(tmp_path / f"out-{k}", 0)
    transfer.receive([tmp_path / "out-1"], into)
    got = transfer.receive([tmp_path / "out-1", tmp_path / "out-2"], into)
    assert (got["received"], got["total"]) == (2, 2) and len(got["pieces"]) == 4 + 2
    merged = json.loads((into / "progress.json").read_text())
    assert {n: r["attempt"] for n, r in merged["runs"].items()} == {"exact-L11": 1, "tuned-L11": 1, "tuned-L9": 2}
    assert {n: m["attempt"] for n, m in merged["models"].items()} == {"tuned": 2, "exact": 1, "orig": 1}
    assert set(merged["pieces"]) == {"train", "table1"} and (into / "table1.json").is_file()
    assert json.loads((into / "runs" / "tuned-L9" / "manifest.json").read_text()) == {"attempt": 2}

@pytest.mark.slow
def test_prepare_run_resume_fetch_receive_report_and_a_second_session(tiny, tmp_path, capsys):
    base = tiny.folder("mpnet", 12)
    transfer = tmp_path / "transfer"
    # here: the model's float16 parts and a QQP subset file in batch folders of at most 1 MiB (this environment has
    # pydantic and datasets)
    assert here("prepare", "--into", str(transfer), "--base", str(base), "--part-mib", "0.5", "--batch-mib", "1",
                "--no-wheels", "--qqp", str(qqp_file(tmp_path / "qqp.tsv.gz", 3))) == 0  # fmt: skip
    batches = sorted(transfer.glob("batch-*"))
    assert len(batches) >= 2 and (batches[0] / "manifest.json").is_file()
    assert all(sum(f.stat().st_size for f in b.rglob("*") if f.is_file()) <= 2**20 for b in batches)

    work = tmp_path / "work"
    common = ["--transfer", str(transfer), "--work", str(work), "--only", RUNS, "--table1-sample", "20",
              "--part-mib", "0.2", "--out-files", "4", "--out-mib", "1", *SMALL]  # fmt: skip
    # there, first call: install, train the three, Table 1, two runs; stopped after the second
    first = there(tmp_path, *common, "--out", str(tmp_path / "out-1"), "--stop-after", "tuned-L11", "--poll-s", "0.05")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "stopped after tuned-L11" in first.stdout
    progress = json.loads((work / "results" / "progress.json").read_text())
    # the trainings' progress as they ran (8 pairs in batches of 4, one epoch: 2 steps each)
    assert progress["training"] and set(progress["training"]) <= {"tuned", "exact", "orig"}
    assert all(p["max_steps"] == 2 and 0 <= p["step"] <= 2 for p in progress["training"].values())
    assert set(progress["models"]) == {"tuned", "exact", "orig"}
    assert list(progress["runs"]) == ["exact-L11", "tuned-L11"]
    assert progress["device"]["cuda"] is False and all(m["weights_sha256"] for m in progress["models"].values())
    out1 = sorted(p.name for p in (tmp_path / "out-1").iterdir())
    assert "outbox.json" in out1 and len(out1) <= 4
    assert sum(p.stat().st_size for p in (tmp_path / "out-1").iterdir()) <= 2**20

    # there, second call: resumes (nothing trained or attributed again) and finishes; OUT gets the next parts
    before = parquet_state(work / "results" / "runs")
    received = len(out1) - 1
    second = there(tmp_path, *common, "--out", str(tmp_path / "out-2"), "--received", str(received),
                   "--send-weights", "exact")  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert "training " not in second.stdout and "done all" in second.stdout
    after = parquet_state(work / "results" / "runs")
    assert all(after[k] == v for k, v in before.items())
    outs = [tmp_path / "out-1", tmp_path / "out-2"]
    box = json.loads((tmp_path / "out-2" / "outbox.json").read_text())
    total = sum(len(p["parts"]) for p in box["pieces"])
    received += len(list((tmp_path / "out-2").glob("*.tar.*")))
    k = 3
    while received < total:  # fetch calls: only the next parts
        out = tmp_path / f"out-{k}"
        fetch = there(tmp_path, "--work", str(work), "--out", str(out), "--fetch", "--received", str(received),
                      "--out-files", "4", "--out-mib", "1")  # fmt: skip
        assert fetch.returncode == 0, fetch.stderr[-2000:]
        got = len(list(out.glob("*.tar.*")))
        assert 0 < got <= 3
        received, k = received + got, k + 1
        outs.append(out)

    # here: receive every piece; the results are the machine's, byte for byte
    results = tmp_path / "results"
    assert here("receive", "--parts", *map(str, outs), "--into", str(results), "--transfer", str(transfer)) == 0
    for f in (work / "results").rglob("*.parquet"):
        assert (results / f.relative_to(work / "results")).read_bytes() == f.read_bytes()
    # Exact's weights came back as float16 differences to the base, rebuilt here against the same float16 base
    from safetensors.torch import load_file

    trained = Path(json.loads((work / "results" / "training" / "exact.json").read_text())["path"])
    rebuilt = load_file(results / "models" / trained.name / "model.safetensors")
    weights = load_file(trained / "model.safetensors")
    assert rebuilt.keys() == weights.keys()
    assert max((rebuilt[k] - weights[k]).abs().max().item() for k in weights) < 1e-4
    progress = json.loads((results / "progress.json").read_text())
    assert set(progress["runs"]) == set(RUNS.split(",")) and all(r["complete"] for r in progress["runs"].values())
    t1 = json.loads((results / "table1.json").read_text())
    assert {(r["model"], r["checkpoint"]) for r in t1["rows"]} >= {("shelf", "-"), ("tuned", "last-epoch"),
                                                                   ("exact", "last-epoch"), ("orig", "last-epoch")}
    # results, not models: the only weights here are the ones asked for, rebuilt from their differences
    assert not [p for p in (work / "results").rglob("*") if p.suffix in (".safetensors", ".bin", ".pt")]
    assert [p.parent.name for p in results.rglob("*.safetensors")] == [trained.name]

    # here: Table 1 with ASO, and the report stage over what came back
    capsys.readouterr()
    assert here("report", "--results", str(results), "--out", str(tmp_path / "reports"), "--aso-iterations", "20",
                *SMALL) == 0  # fmt: skip
    said = capsys.readouterr().out
    aso = json.loads((results / "table1-aso.json").read_text())["aso"]
    assert set(aso) == {"last-epoch", "best-dev"} and "ASO last-epoch: eps_min" in said
    assert "table1 exact last-epoch cos:" in said
    for name in (*RUNS.split(","), "agreement-L11", "lexical-qqp-L8"):
        assert (tmp_path / "reports" / name / "index.html").is_file(), name
    for name in ("exact-qqp-L8", "shelf-qqp-L8"):  # the carried QQP file's 3 pairs (config: a sample of 2,000)
        run = progress["runs"][name]
        manifest = json.loads((results / run["run_dir"] / "manifest.json").read_text())
        assert manifest["cells"] == "same-token" and (run["n_in"], run["n_done"]) == (3, 3), (name, run)
    assert not (tmp_path / "reports" / "agreement-L9").exists()  # tuned-L9 was not run

    # a second call on a bare machine, given the first one's progress: Table 1 and every run that came back are
    # skipped; it trains only the model of the run left (tuned-L9), and gets the same weights (deterministic)
    work2 = tmp_path / "work-2"
    session2 = [x if x != str(work) else str(work2) for x in common]
    session2[session2.index("--only") + 1] = f"{RUNS},tuned-L9"
    again = there(tmp_path, *session2, "--out", str(tmp_path / "out-b"), "--done", str(results / "progress.json"))
    assert again.returncode == 0, again.stderr[-3000:]
    progress2 = json.loads((work2 / "results" / "progress.json").read_text())
    assert set(progress2["models"]) == {"tuned"}
    assert progress2["models"]["tuned"]["weights_sha256"] == progress["models"]["tuned"]["weights_sha256"]
    assert list(progress2["runs"]) == ["tuned-L9"] and "table1" not in progress2["pieces"]
    # received into the same results folder: progress.json has both attempts' runs, and the report finds tuned-L9
    outs = [tmp_path / "out-b"]
    box = json.loads((outs[0] / "outbox.json").read_text())
    received, total = len(list(outs[0].glob("*.tar.*"))), sum(len(p["parts"]) for p in box["pieces"])
    while received < total:
        outs.append(tmp_path / f"out-b{len(outs)}")
        fetch = there(tmp_path, "--work", str(work2), "--out", str(outs[-1]), "--fetch", "--received", str(received),
                      "--out-files", "4", "--out-mib", "1")  # fmt: skip
        assert fetch.returncode == 0, fetch.stderr[-2000:]
        received += len(list(outs[-1].glob("*.tar.*")))
    assert here("receive", "--parts", *map(str, outs), "--into", str(results)) == 0
    merged = json.loads((results / "progress.json").read_text())
    assert set(merged["runs"]) == {*RUNS.split(","), "tuned-L9"} and set(merged["models"]) == {"tuned", "exact", "orig"}
    assert "table1" in merged["pieces"] and merged["runs"]["tuned-L9"] == progress2["runs"]["tuned-L9"]
    assert (results / merged["runs"]["tuned-L9"]["run_dir"] / "manifest.json").is_file()
