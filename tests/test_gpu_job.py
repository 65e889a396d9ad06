"""The prepared GPU run on a CPU (bench/gpu_run.py, bench/gpu_job.py, bench/gpu_settings.py), with tiny models and
Ray's logical GPUs, end to end as it goes there: the bundle written with --only and a freeze of the target (--have),
cut into parts, packed into calls; each call's command as the plan prints it (its parts copied out of the checkout);
the last one checks the parts, installs the wheels (pip --target), the models and the data, and runs every piece; the
report; a second start that resumes.

Subprocesses: the pieces start their own Ray (with GPUs it does not have), which the shared test Ray must not be.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from jobtools import qqp_file

ROOT = Path(__file__).resolve().parents[1]
# `python3` in the calls' commands is this interpreter, as it is the machine's own Python there
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
       "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}  # fmt: skip


def py(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


# Two pieces (each starts its own Python, torch and, for a job, Ray): the job with GPU actors and the precision
# sweep. The others are these with other models and settings, or the factor batch under a memory limit, whose
# machinery tests/test_memory.py and tests/test_job_gpu.py check; `python bench/gpu_run.py device --dry-run` runs
# them all on a CPU.
PIECES = ("job-minilm", "sweep-minilm")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_prepared_gpu_run_goes_through_on_logical_gpus(tmp_path, tiny):
    # two tiny 10-layer models under the real ones' folder names (the pieces use layers 4, 8 and 9)
    src = tmp_path / "src"
    for k, name in enumerate(("all-MiniLM-L6-v2", "all-mpnet-base-v2")):
        tiny.build("bert", n_layers=10, seed=k).save(str(src / name))
    data = qqp_file(tmp_path / "qqp_glue_train_subset.tsv.gz", 12)
    have = tmp_path / "freeze.txt"  # the target has everything here but tqdm (and the project)
    freeze = py("-m", "pip", "freeze").stdout.splitlines()
    have.write_text("\n".join(line for line in freeze if not line.lower().startswith(("tqdm", "-e", "xsbert"))))
    bundle = tmp_path / "bundle"
    py("-m", "jobs.bundle", "--out", str(bundle), "--only", "tqdm", "--have", str(have), "--models",
       f"{src / 'all-MiniLM-L6-v2'},{src / 'all-mpnet-base-v2'}", "--float16", "--datasets", str(data),
       "--part-size", "96KiB")  # fmt: skip
    manifest = json.loads((bundle / "manifest.json").read_text())
    wheels = sorted(i["file"].split("-")[0].lower() for i in manifest["items"] if i["kind"] == "wheel")
    assert wheels == ["tqdm", "xsbert_scale"], wheels
    assert [i.get("no_deps") for i in manifest["items"] if i.get("project")] == [True]

    # here, beforehand: the same pairs on the CPU, from the models as the bundle rebuilds them
    here = tmp_path / "here"
    py(str(bundle / "install.py"), "--models-only", "--into", str(here))
    cpu_rows = tmp_path / "cpu-rows"
    for key, layer in (("minilm", 4),):  # job-mpnet does not run here
        folder = here / "models" / ("all-MiniLM-L6-v2" if key == "minilm" else "all-mpnet-base-v2")
        py("bench/gpu_job.py", "cpu-rows", "--model", str(folder), "--layer", str(layer), "--steps", "2",
           "--compare", "4", "--qqp-path", str(data), "--out", str(cpu_rows / key), "--runs", str(tmp_path / "cpu"))

    calls, there, out = tmp_path / "calls", tmp_path / "xb", tmp_path / "out"
    py("bench/gpu_run.py", "plan", "--bundle", str(bundle), "--calls", str(calls), "--carry-mib", "0.5",
       "--there-bundle", str(there), "--there-work", str(tmp_path / "xw"), "--deadline-s", "1500",
       "--device-args", f"--dry-run --cpu-rows {cpu_rows} --only {','.join(PIECES)}")  # fmt: skip
    plan = json.loads((calls / "plan.json").read_text())
    assert len(plan["calls"]) >= 3 and all(c["carry_mib"] <= 0.5 for c in plan["calls"][1:])
    assert sum(len(list((calls / f"c{c['call']}" / "parts").iterdir())) for c in plan["calls"]) == plan["parts"]
    out.mkdir()
    for c in plan["calls"]:  # as the device tool runs them: in the checkout, $OUT set
        proc = subprocess.run(["bash", "-c", c["command"]], capture_output=True, text=True, cwd=ROOT, timeout=1800,
                              env={**ENV, "OUT": str(out)})  # fmt: skip
        assert proc.returncode == 0, (c["command"], proc.stdout[-3000:], proc.stderr[-3000:])

    prog = json.loads((out / "progress.json").read_text())
    pieces = prog["pieces"]
    assert pieces["install"]["rc"] == 0 and pieces["install"]["unmet"] == []
    check = prog["ray_check"]  # Ray started and stopped once before the job pieces
    assert check["rc"] == 0 and json.loads(check["said"])["resources"]["CPU"] > 0, check
    ran = [k for k in pieces if k != "install"]
    assert ran == list(PIECES), ran
    assert all(pieces[k]["rc"] == 0 for k in ran), {k: pieces[k].get("tail") for k in ran}
    assert sorted(p.name for p in out.iterdir()) == ["freeze.txt", "pip-freeze.txt", "progress.json", "results.tgz",
                                                     "run.log"]  # fmt: skip
    assert (out / "freeze.txt").read_text() == (out / "pip-freeze.txt").read_text()  # the machine's, either way

    # what came back holds every figure of the report
    md = tmp_path / "gpu-job.md"
    md.write_text("# plan\n\n<!-- measured: written by `python bench/gpu_run.py report` -->\nold\n")
    text = py("bench/gpu_run.py", "report", str(out), "--into", str(tmp_path / "rep"),  # OUT's folder, or its tgz
              "--results-md", str(md)).stdout  # fmt: skip
    bad = subprocess.run([sys.executable, "bench/gpu_run.py", "report", str(tmp_path / "rep"), "--into",
                          str(tmp_path / "rep-2")], capture_output=True, text=True, env=ENV, cwd=ROOT)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"gpu_run: error: {tmp_path / 'rep'}: no results.tgz there (give the folder a device call's OUT came back in, "
        "or its results.tgz)"]  # fmt: skip
    res = tmp_path / "rep" / "results"
    job = json.loads((res / "job-minilm" / "gpu-job.json").read_text())
    assert job["status"] == "done" and (job["job"]["n_in"], job["job"]["n_done"]) == (8, 8)
    res_gpu = job["job"]["resources"]
    assert (res_gpu["cluster_gpus"], res_gpu["gpus_per_actor"], res_gpu["device"]) == (2.0, 1.0, "cpu")
    assert sum(job["job"]["shares"].values()) == pytest.approx(1.0)
    assert [w["pairs"] for w in job["job_waves"]] == [4, 4]  # waves of 4 pairs
    assert job["engine"]["sentences"] == job["job"]["sentences"] and job["ratio"]["job_over_engine_sentences_per_s"] > 0
    c = job["compare_cpu"]
    # both on this CPU from the same rebuilt weights: every pair agrees, to float32 rounding
    assert (c["pairs"], c["agree"], c["same_weights"]) == (4, 4, True) and c["cells_max_rel_diff"] < 1e-5
    sweep = json.loads((res / "sweep-minilm.json").read_text())
    assert {"fp32", "bf16"} <= {v["precision"] for v in sweep["cells"].values()}
    assert all("cells_max_diff_over_max_abs" in v for k, v in sweep["cells"].items() if not k.startswith("fp32-b16-"))
    assert "Full QQP" in text and "### sweep minilm" in text and md.read_text().startswith("# plan\n")
    assert "old" not in md.read_text()

    # a second start resumes: nothing is measured again
    last = plan["calls"][-1]["command"]
    proc = subprocess.run(["bash", "-c", last], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**ENV, "OUT": str(out)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    again = json.loads((out / "progress.json").read_text())
    assert len(again["starts"]) == 2 and again["pieces"] == pieces

    # a fresh machine given what came back, the job piece's record taken out (as if the first machine had been given
    # back before it): it installs and checks Ray again (progress.json says both were done, on the other machine),
    # runs the job piece and measures nothing else again
    fresh, out2 = tmp_path / "xw-fresh", tmp_path / "out2"
    out2.mkdir()
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "results.tgz") as tar:
        tar.extractall(unpacked, filter="data")
    kept = json.loads((unpacked / "results" / "progress.json").read_text())
    del kept["pieces"]["job-minilm"]
    (unpacked / "results" / "progress.json").write_text(json.dumps(kept))
    shutil.rmtree(unpacked / "results" / "job-minilm")
    with tarfile.open(tmp_path / "came-back.tgz", "w:gz") as tar:
        tar.add(unpacked / "results", arcname="results")
    resume = last.replace(str(tmp_path / "xw"), str(fresh)) + f" --resume-from {tmp_path / 'came-back.tgz'}"
    proc = subprocess.run(["bash", "-c", resume], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**ENV, "OUT": str(out2)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    third = json.loads((out2 / "progress.json").read_text())
    assert len(third["starts"]) == 3 and (fresh / "xs" / "bundle.json").is_file()
    assert third["pieces"]["install"]["start"] == 3 and third["pieces"]["install"]["rc"] == 0
    assert third["ray_check"]["start"] == 3 and third["ray_check"]["rc"] == 0
    assert third["pieces"]["job-minilm"]["rc"] == 0
    assert {k: v for k, v in third["pieces"].items() if k not in ("install", "job-minilm")} == \
        {k: v for k, v in pieces.items() if k not in ("install", "job-minilm")}  # fmt: skip
    # the machine's own packages, as a later bundle's --have: not those of the bundle's site on PYTHONPATH
    own = subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, cwd=ROOT,
                         env={k: v for k, v in ENV.items() if k != "PYTHONPATH"}).stdout  # fmt: skip
    assert (out2 / "pip-freeze.txt").read_text() == own


def test_what_stands_between_the_estimate_and_the_hour():
    """The report divides each stage by the hour that prepare leaves; where prepare alone takes the hour, it says so
    instead of dividing by nothing."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_run import to_the_hour

    assert "x3.0 too slow" in to_the_hour(1.5, 0.25, 0.5) and "x0.5." in to_the_hour(1.5, 0.25, 0.5)
    said = to_the_hour(219.4, 157.3, 64.3)
    assert "prepare alone takes 64.30 h" in said and " x" not in said


def test_the_comparison_with_the_cpu_rows_names_the_pairs_either_side_did_not_store(tmp_path):
    """The first pairs each run attributed, stored or quarantined (cpu-rows and the run's subset record which, and
    why), are the ones looked at: the pairs both stored are compared, and those one side quarantined are named with
    its reason; a pair only one run attributed is left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_job import compare_rows, report

    def rows(folder: Path, prefix: str, ids: list[str], shift: float) -> None:
        folder.mkdir()
        pq.write_table(pa.table({"pair_id": ids, "attribution_sum": [0.5 + shift] * len(ids),
                                 "completeness_error": [1e-3] * len(ids), "steps_a": [16] * len(ids),
                                 "steps_b": [32] * len(ids)}), folder / f"{prefix}pairs.parquet")  # fmt: skip
        cells = [(p, i, j, 0.25 + shift / 4) for p in ids for i in range(2) for j in range(2)]
        pq.write_table(pa.table({k: list(v) for k, v in zip(("pair_id", "i", "j", "value"), zip(*cells))}),
                       folder / f"{prefix}cells.parquet")  # fmt: skip

    rows(tmp_path / "cpu", "", ["a", "b", "c", "f"], 0.0)  # f: beyond the GPU's first pairs
    quarantined = {"d": "not_converged"}
    (tmp_path / "cpu" / "weights.json").write_text(json.dumps({"weights_sha256": "w", "quarantined": quarantined}))
    rows(tmp_path / "gpu", "subset-", ["a", "c", "d"], 1e-4)
    (tmp_path / "gpu" / "subset-quarantined.json").write_text(json.dumps({"b": "attribution_error"}))
    c = compare_rows(tmp_path / "gpu", tmp_path / "cpu", "w")
    assert (c["pairs"], c["compared"], c["agree"], c["same_weights"]) == (2, 2, 2, True)
    assert c["cpu_quarantined"] == {"d": "not_converged"} and c["gpu_quarantined"] == {"b": "attribution_error"}
    r = {"environment": {"device": "cuda", "torch": "2", "python": "3.12", "cpus": 16, "stamp": "now"},
         "settings": {"model": "m", "layer": 8, "pairs": 3, "dataset": "qqp"}, "compare_cpu": c}
    (tmp_path / "gpu-job.json").write_text(json.dumps(r))
    said = report(str(tmp_path / "gpu-job.json"))
    assert "Quarantined among the first pairs: on the CPU 1 (d not_converged); on the GPU 1 (b attribution_error)." \
        in said, said


def test_a_second_start_of_the_settings_pieces_keeps_their_finished_cells(tmp_path, tiny):
    """adaptive and memory redid every cell after a start that was cut; now, as sweep does, a second start keeps what
    the first wrote: adaptive computes only the fixed N, from the largest N the kept doubling gave (here 8, written
    by hand where the tiny model would need fewer), and memory computes nothing where all of an N's ways are kept."""
    folder = tmp_path / "model"
    tiny.build("bert", n_layers=6, seed=0).save(str(folder))
    data = qqp_file(tmp_path / "qqp.tsv.gz", 4)
    common = ["--model", str(folder), "--layer", "4", "--qqp-path", str(data), "--pairs", "4", "--dry-run"]
    out = tmp_path / "adaptive.json"
    kept = {"seconds": 1.0, "steps_hist": {"4": 3, "8": 2}, "marker": "kept"}
    out.write_text(json.dumps({"cells": {"panels": {**kept}, "double": {**kept}}}))
    py("bench/gpu_settings.py", "adaptive", *common, "--out", str(out))
    cells = json.loads(out.read_text())["cells"]
    assert cells["panels"]["marker"] == cells["double"]["marker"] == "kept"
    assert set(cells["fixed"]["steps_hist"]) == {"8"}  # every question at the kept doubling's largest N
    mem = tmp_path / "memory.json"
    done = {f"N{n}-{way}": {"marker": "kept"} for n in (4, 8) for way in ("whole", "planned", "limited")}
    mem.write_text(json.dumps({"cells": done}))
    py("bench/gpu_settings.py", "memory", *common, "--out", str(mem))
    assert json.loads(mem.read_text())["cells"] == done


def test_the_job_stops_after_the_wave_past_which_time_would_run_out():
    """After each wave the job goes on only if another as long, and the steps after the job, end before --stop-by."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_job import RESERVE_S, stop_now

    assert not stop_now(now=100.0, stop_by=0.0, wave_s=50.0, waves_left=3)  # no limit
    assert not stop_now(now=100.0, stop_by=100.0 + 1.5 * 40.0 + RESERVE_S + 1, wave_s=40.0, waves_left=1)
    assert stop_now(now=100.0, stop_by=100.0 + 1.5 * 40.0 + RESERVE_S - 1, wave_s=40.0, waves_left=1)
    assert not stop_now(now=100.0, stop_by=50.0, wave_s=40.0, waves_left=0)  # the last wave: nothing to stop


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_job_stopped_by_the_deadline_keeps_its_waves_and_is_estimated_from_the_engine(tmp_path, tiny):
    """The job piece with --stop-by already past: it stops after its first wave of two (committed, kept), the subset
    and the engine alone run as usual, the record says it stopped, and the full-QQP estimate takes stage 1 from the
    engine alone. On the local executor: the stop is the driver's, after a committed wave, whichever executor ran it
    (the GPU actors' path: the prepared run above)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_job import report
    from gpu_run import estimate

    folder = tmp_path / "model"
    tiny.build("bert", n_layers=6, seed=0).save(str(folder))
    data = qqp_file(tmp_path / "qqp.tsv.gz", 8)
    out = tmp_path / "job"
    py("bench/gpu_job.py", "run", "--allow-cpu", "--device", "cpu", "--pairs", "8", "--compare", "4", "--steps", "2",
       "--model", str(folder), "--layer", "4", "--qqp-path", str(data), "--job-arg=--executor=local",
       "--job-arg=--batch-size=4", "--job-arg=--wave-size=4", "--stop-by", "1", "--out", str(out))  # fmt: skip
    r = json.loads((out / "gpu-job.json").read_text())
    job = r["job"]
    assert r["status"] == "stopped" and job["stopped"].startswith("stopped after wave 1/2")
    assert [w["pairs"] for w in r["job_waves"]] == [4] and (job["pairs"], job["n_done"], job["n_in"]) == (4, 4, 8)
    w = r["job_waves"][0]  # the wave's own timings, as the job reported them (jobs.attribution.run.WaveDone)
    assert w["line"].startswith("wave 1/2: 4 pairs") and w["commit_s"] > 0
    assert job["stages"]["commit_s"] == w["commit_s"]
    assert r["subset"]["pairs"] + r["subset"]["quarantined"] <= 4 and r["engine"]["sentences"] == job["sentences"]
    e = estimate(job, r["engine"])
    assert e["stage1_from"] == "the engine alone" and e["stage1_h"] > 0
    assert "The job stopped after wave 1/2" in report(str(out / "gpu-job.json"))


def test_the_job_pieces_are_skipped_where_ray_did_not_start_and_mpnet_where_minilm_stalled(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_run import skip_reason

    ok = {"ray_check": {"rc": 0}, "pieces": {"job-minilm": {"rc": 0}}}
    assert skip_reason("job-minilm", ok, tmp_path) is None and skip_reason("job-mpnet", ok, tmp_path) is None
    failed = {"ray_check": {"rc": 1, "tail": "RuntimeError: raylet died"}, "pieces": {}}
    assert skip_reason("job-minilm", failed, tmp_path).startswith(
        "Ray did not start (ray-check rc 1: RuntimeError: raylet")
    assert skip_reason("sweep-mpnet", failed, tmp_path) is None  # the pieces without Ray still run
    cut = {"ray_check": {"rc": 0}, "pieces": {"job-minilm": {"rc": 124}}}
    record = tmp_path / "job-minilm" / "gpu-job.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"status": "running", "job_waves": [{"pairs": 1000}]}))  # cut inside the job
    assert skip_reason("job-mpnet", cut, tmp_path) == "job-minilm was cut at its cap before its job ended: the job " \
        "stalled"  # fmt: skip
    record.write_text(json.dumps({"status": "running", "job": {"pairs": 2000}}))  # cut after it: the engine alone
    assert skip_reason("job-mpnet", cut, tmp_path) is None
    assert skip_reason("job-mpnet", {"ray_check": {"rc": 0}, "pieces": {"job-minilm": {"rc": 1}}}, tmp_path) is None
