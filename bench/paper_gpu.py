"""The paper's trained models on one GPU machine with no network, no Ray and size-limited transfers.

The study is a pipeline config (configs/paper-gpu.yaml: all-mpnet-base-v2's Tuned, Exact and Orig trained by the
paper's recipe, then Fig 3/4/5/8's runs in the order of their value, and last Fig 10's on a QQP sample); this script
only carries it there, runs its stages piece by piece, and carries the results back:

    here    python bench/paper_gpu.py prepare [--into TRANSFER] [--qqp FILE]
            all-mpnet-base-v2 as float16 parts (jobs.bundle), the QQP subset file of the QQP runs (--qqp, default
            $XSBERT_QQP; without one those runs are left out there), and the wheels of what such a machine lacks for
            the stages that run there (DEVICE_WHEELS), grouped into TRANSFER/batch-NN folders of at most --batch-mib
            each, one per call; TRANSFER is bench/.cache/paper-gpu/transfer, git-ignored (a call's working tree
            carries every file git does not ignore)
            python bench/paper_gpu.py plan [--done RESULTS/progress.json]
            the calls, one per batch, each with its carry list and exact command: each copies its own batch out of
            the checkout into /tmp/pt there (the next call's checkout replaces this one's; /tmp lasts while the
            machine does), the first also sends back the machine's `pip freeze` and runs `run --check`, the last runs
            the study from /tmp/pt (carrying --done's file too, where given); then the fetch calls
    there   python3 bench/paper_gpu.py run --transfer /tmp/pt --work /tmp/paper-gpu --out "$OUT" [--received N]
            installs the wheels and the model from the batches (every part checked), then: the train stage
            (jobs.pipeline's: Tuned, Exact, Orig at once on the GPU, deterministic) -> Table 1's predictions (by
            encoding: jobs.evaluation.table1.table1_rows) -> the runs (jobs.pipeline's attribute stage, --executor
            local), one piece at a time. After each piece its new files become a tar in parts of at most --part-mib
            (the outbox), and OUT gets outbox.json (the pieces, their parts and checksums, the progress) and the first
            parts not yet received (--received: how many of the outbox's parts, in order, have come back), at most
            --out-files files of --out-mib together; while the trainings run, their progress (step, seconds, time
            left) goes into OUT's outbox.json every --poll-s, so a call killed mid-training still tells their rate.
            The same command again resumes: what is trained or done is skipped, an unfinished run resumes from its
            committed waves, and OUT gets the next parts; with --fetch it only gives OUT the next parts.
    here    python bench/paper_gpu.py receive --parts OUT1 OUT2 ... [--into RESULTS] [--transfer TRANSFER]
            checks and joins every piece whose parts are all there, extracts it into RESULTS (default
            bench/.cache/paper-gpu/results, git-ignored: runs/ in the store's layout, training/, table1.json,
            progress.json), and says the next fetch call's --received; with --transfer, the models sent back by
            `run --send-weights` (float16 differences to the base) rebuilt into RESULTS/models
            python bench/paper_gpu.py report [--results RESULTS] --out reports/paper-gpu
            Table 1 with the almost-stochastic-order test (App. B), and jobs.pipeline's report stage over the runs
            and comparisons that came back (DuckDB, here), with the paper's figures beside ours where like for like

A later `run` on a bare machine goes on where an earlier one ended: `run --done RESULTS/progress.json` (carried by
the run call: `plan --done`) keeps the earlier Table 1, trains only the models of the runs left, and skips each run
that came back whose settings are the same and whose model, where trained again, has the same weights' sha256 as then
(training is deterministic: the same recipe on the same GPU and software gives the same weights; a model that differs
has its runs done again).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
try:
    import jobs  # noqa: F401  the installed package (make setup), here
except ModuleNotFoundError:  # there: a copy of the repository on a machine that has no pip install of it (`run`)
    sys.path.insert(0, str(ROOT))

from paper_gpu_transfer import (  # noqa: E402  beside this file: what carries the study there and back
    BASE,
    BATCH_MIB,
    DEVICE_WHEELS,
    OUT_FILES,
    OUT_MIB,
    OUTBOX,
    PART_MIB,
    PROGRESS,
    RESULTS,
    THERE_TRANSFER,
    THERE_WORK,
    TRANSFER,
    Outbox,
    carried_qqp,
    gather,
    gpu_train,
    install_base,
    install_wheels,
    plan,
    prepare,
    qqp_item,
    read_json,
    receive,
    say,
    write_json,
)

from jobs.bundling import BundleError  # noqa: E402
from xsbert_core.metrics import ASO_ITERATIONS  # noqa: E402

CONFIG = ROOT / "configs" / "paper-gpu.yaml"


# --------------------------------------------------------------------------- there: the study, piece by piece
def device_info() -> dict[str, Any]:
    import sentence_transformers
    import torch
    import transformers

    info: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                            "sentence-transformers": sentence_transformers.__version__,
                            "python": sys.version.split()[0], "cuda": torch.cuda.is_available()}  # fmt: skip
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


class _Stop(Exception):
    pass


def check(transfer: Path | None, work: Path) -> dict[str, Any]:
    """Before the weights are all there: the wheels installed, what the stages import imported, the versions and the
    GPU printed, and which of the bundle's parts have arrived."""
    found: dict[str, Any] = {}
    if transfer:
        bundle, wheels = gather(transfer, work)
        install_wheels(wheels, work / "site")
        manifest = json.loads((bundle / "manifest.json").read_text())
        parts = [p["file"] for i in manifest["items"] for p in i["parts"]]
        here_now = [f for f in parts if (bundle / f).exists()]
        found["parts"] = f"{len(here_now)} of {len(parts)}"
        found["qqp"] = (qqp_item(manifest["items"]) or {"file": "not carried"})["file"]
    import datasets  # noqa: F401  the trainer's data
    import pydantic  # noqa: F401  the study config
    from sentence_transformers import SentenceTransformerTrainer  # noqa: F401

    from jobs import evaluate, pipeline  # noqa: F401

    for name in ("torch", "transformers", "sentence-transformers", "datasets", "pydantic", "pyarrow", "pandas",
                 "huggingface-hub", "typing-extensions", "accelerate", "numpy"):  # fmt: skip
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "missing"
    found.update(device_info())
    say("check: " + json.dumps(found))
    return found


def same_run_key(command: list[str], model: str) -> list[str]:
    """A run's jobs.attribute flags without where its model and store are on this machine (--model becomes the
    study's model name, --out goes): equal across machines and calls for the same settings; the model's weights are
    compared by their sha256 beside it."""
    key, flags = [], iter(command)
    for flag in flags:
        if flag in ("--model", "--out"):
            next(flags, None)
            key += [flag, model] if flag == "--model" else []
        else:
            key.append(flag)
    return key


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.work: Path = args.work
        self.results = self.work / "results"
        self.results.mkdir(parents=True, exist_ok=True)
        self.progress = read_json(self.results / PROGRESS, {"pieces": {}, "models": {}, "runs": {}})
        self.outbox = Outbox(self.results, self.work / "outbox", args.part_mib)
        if args.done and not args.done.is_file():  # not carried: every run of the earlier attempt would run again
            raise BundleError(f"--done {args.done}: no such file (an earlier attempt's progress.json: the call "
                              "carries it)")  # fmt: skip
        self.done = read_json(args.done, {}) if args.done else {}

    def finish(self, piece: str, record: dict[str, Any] | None = None, key: str = "pieces") -> None:
        if record is not None:
            self.progress[key][piece] = {**record, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        self.progress["wall_s"] = self.progress.get("wall_s_before", 0) + time.perf_counter() - self.t0
        write_json(self.results / PROGRESS, self.progress)
        self.outbox.pack(piece, self.progress)
        self.outbox.fill(self.args.out, self.args.received, self.args.out_files, self.args.out_mib)  # a kill keeps it
        say(f"done {piece} ({time.perf_counter() - self.t0:.0f} s)")
        if self.args.stop_after == piece:
            raise _Stop(piece)

    def note_progress(self) -> None:
        """progress.json, and the progress alone into OUT's outbox.json (in the middle of a piece: no parts)."""
        write_json(self.results / PROGRESS, self.progress)
        self.outbox.note(self.progress, self.args.out)

    def training_progress(self, names: str, p: Any) -> bool:
        """A running training's TrainProgress, kept where a kill of this call still sends it back: progress.json's
        "training" and OUT's outbox.json (no parts: those come with the piece). True (stop the trainings) once a
        training's rate so far says it would end after --deadline-s: nothing after it could start, and the call's
        remaining time is better spent on a smaller cut."""
        now = time.perf_counter() - self.t0
        self.progress.setdefault("training", {})[names] = {**p.as_dict(), "call_s": now}
        self.note_progress()
        say(f"train {names}: {p}")
        deadline = self.args.deadline_s
        if deadline is None or p.step <= 0 or p.eta_s is None or now + p.eta_s <= deadline:
            return False
        say(f"train {names}: would end at ~{now + p.eta_s:.0f} s of this call, after --deadline-s {deadline:g}")
        return True

    def time_left(self, piece: str) -> None:
        if self.args.deadline_s is not None and time.perf_counter() - self.t0 > self.args.deadline_s:
            raise _Stop(f"the deadline, before {piece}")

    def run(self) -> None:
        a = self.args
        if not (a.transfer or a.base):
            raise BundleError("run needs --transfer (the batches of `prepare`) or --base (an installed model)")
        self.progress.setdefault("device", device_info())
        # the wheels (pydantic, datasets) first: installed by an earlier call or now, their folder on the path
        base = str(install_base(a.transfer, self.work)) if a.transfer else a.base
        if not a.transfer:
            install_wheels([], self.work / "site")
        from jobs import pipeline
        from jobs.attribution.inputs import QQP_ENV, resolve_source
        from jobs.evaluation.table1 import table1_rows
        from jobs.study import schema as study_schema
        from jobs.training.study import TrainingStopped
        from xsbert_core import InputError

        carried = carried_qqp(self.work) if a.transfer else None
        if carried and not os.environ.get(QQP_ENV):
            os.environ[QQP_ENV] = str(carried)  # the `qqp` datasets' file, as jobs.attribute finds it
        sets = [*a.set, f"models.shelf={base}", f"out={self.results / 'runs'}", f"models_dir={self.work / 'models'}"]
        study = pipeline.load_config(a.config, sets)
        only = [n.strip() for n in a.only.split(",")] if a.only else list(study.runs)
        unknown = [n for n in only if n not in study.runs]
        if unknown:
            raise InputError(f"--only: no run {', '.join(unknown)} in {a.config}")
        # A run whose data is on the hub (`qqp` without a subset file is GLUE's QQP there) is out of reach of a
        # machine without network: named in --only, an error; else left out, saying why
        data = {n: study.datasets[study.runs[n].dataset] for n in only}
        sources = {n: resolve_source(d.source, d.split, d.config, d.qqp_path) for n, d in data.items()}
        on_hub = [n for n in only if sources[n].kind == "hub"]
        if on_hub:
            if all(sources[n].identity == "glue/qqp" for n in on_hub):
                need = "the QQP subset file, which the transfer does not hold (prepare --qqp FILE)"
                left = "no QQP subset file came with the transfer: prepare --qqp FILE"
            else:
                hub = ", ".join(sorted({sources[n].identity for n in on_hub}))
                need = left = f"{hub} from the hub, out of reach here"
            if a.only:
                raise InputError(f"--only: {', '.join(on_hub)} need(s) {need}")
            say(f"left out: {', '.join(on_hub)} ({left})")
            only = [n for n in only if n not in on_hub]

        # What this call trains: every model while Table 1 is to be made, else the models of the runs to do (a run
        # an earlier call sent back needs its model only to be checked, and is skipped if that is not trained)
        done_runs = {**self.done.get("runs", {}), **self.progress["runs"]}
        table1_before = "table1" in self.done.get("pieces", {})
        wanted = set(study.trained()) if not table1_before else {
            study.runs[n].model for n in only if not done_runs.get(n, {}).get("complete")}  # fmt: skip
        train_study = study.model_copy(update={"models": {
            k: v for k, v in study.models.items() if not isinstance(v, study_schema.Train) or k in wanted}})  # fmt: skip
        self.time_left("train")
        t = time.perf_counter()
        try:
            models = pipeline.stage_train(train_study, on_progress=self.training_progress, poll_s=a.poll_s)
        except TrainingStopped as exc:
            self.progress["training_stopped"] = str(exc)
            self.note_progress()
            raise _Stop(f"the deadline, in train: {exc}") from None
        (self.results / "training").mkdir(exist_ok=True)
        for name, m in models.items():
            for folder in (Path(m["record"]["path"]), Path(m["record"].get("best_dev_path") or "")):
                if (folder / "xsbert_training.json").is_file():
                    suffix = "-best-dev" if folder.name.endswith("-best-dev") else ""
                    shutil.copyfile(folder / "xsbert_training.json", self.results / "training" / f"{name}{suffix}.json")
            self.progress["models"][name] = {k: m["record"].get(k) for k in (
                "model_id", "variant", "weights_sha256", "train_seconds", "dev_spearman", "steps", "device")}
        trained_now = [n for n, m in models.items() if m["trained"]]
        if trained_now or "train" not in self.progress["pieces"]:
            self.finish("train", {"trained": trained_now, "wall_s": time.perf_counter() - t})
        paths = {name: m["path"] for name, m in models.items()}

        self.time_left("table1")
        shas = {n: m["weights_sha256"] for n, m in self.progress["models"].items() if n in models}
        table1 = read_json(self.results / "table1.json", {})
        if not table1_before and table1.get("weights_sha256") != shas:
            t = time.perf_counter()
            # the last epochs' folders: table1_rows finds each one's best-dev epoch beside it
            by_variant = {"shelf": base} | {study.trained()[n].variant: m["record"]["path"] for n, m in models.items()}
            rows, _, per_pair = table1_rows(by_variant, "test", a.table1_sample)
            write_json(self.results / "table1.json", {"rows": rows, "per_pair": per_pair, "weights_sha256": shas,
                                                      "split": "test", "wall_s": time.perf_counter() - t})  # fmt: skip
            self.finish("table1", {"rows": len(rows), "wall_s": time.perf_counter() - t})

        previous = self.done.get("runs", {})
        for name in only:
            run = study.runs[name]
            trained_here = run.model in paths or run.model not in study.trained()
            where = paths if trained_here else {**paths, run.model: "(not trained by this call)"}
            command = study_schema.job_settings(study, name, where).command()
            settings = same_run_key(command, run.model)
            sha = shas.get(run.model)  # None: the shelf model (its weights are the bundle's, checked by sha256)
            old = self.progress["runs"].get(name) or previous.get(name)
            if old and old.get("settings") == settings and old["complete"] and (
                    old.get("weights_sha256") == sha or not trained_here):  # fmt: skip
                continue
            self.time_left(name)
            extra = {"command": command, "settings": settings, "model": run.model, "weights_sha256": sha,
                     "layer": run.layer}  # fmt: skip
            pipeline.stage_attribute(study, paths, names=[name],
                                     on_run=lambda n, s, extra=extra: self.record(n, s, extra))
        for name in a.send_weights.split(",") if a.send_weights else ():
            self.send_weights(name, base, models)
        if "all" not in self.progress["pieces"]:
            self.finish("all", {})

    def send_weights(self, name: str, base: str, models: dict[str, dict[str, Any]]) -> None:
        """A trained model's last epoch as float16 differences to the base (bench/gpu_train.py pack), into the outbox:
        the weights themselves, where retraining elsewhere would not give them bit for bit."""
        from xsbert_core import resolve_model

        if name not in models:
            raise BundleError(f"--send-weights: {name!r} is not a trained model of the study ({', '.join(models)})")
        piece, record = f"weights-{name}", models[name]["record"]
        if self.progress["pieces"].get(piece, {}).get("weights_sha256") == record["weights_sha256"]:
            return
        self.time_left(piece)
        folder = Path(record["path"])
        info = gpu_train().pack(Path(resolve_model(base)), folder.parent, self.results / "weights", folder.name,
                                self.args.part_mib)  # fmt: skip
        self.finish(piece, {"folder": folder.name, "weights_sha256": record["weights_sha256"],
                            "max_abs_rebuild_error": info["max_abs_rebuild_error"]})  # fmt: skip

    def record(self, name: str, s: dict[str, Any], extra: dict[str, Any]) -> None:
        """A run's piece: its summary's counts and errors, where it is, and what makes it the same run again."""
        rec = {k: s.get(k) for k in ("run_id", "n_in", "n_done", "n_quarantined", "computed_pairs",
                                     "mean_abs_completeness_error", "max_abs_completeness_error", "wall_s")}
        rec.update(extra, run_dir=os.path.relpath(s["run_dir"], self.results),
                   complete=s["n_in"] == s["n_done"] + s["n_quarantined"])  # fmt: skip
        self.finish(name, rec, key="runs")




def table1_report(results: Path, aso_iterations: int) -> dict[str, Any]:
    """Table 1's rows as the machine computed them, and the ASO test here (deepsig) from the per-pair predictions."""
    import numpy as np

    from jobs.evaluation import table1

    t1 = read_json(results / "table1.json")
    if not t1:
        return {}
    gold = np.asarray(t1["per_pair"]["label"]) / table1.LABEL_MAX
    errors = {}
    for key, pred in t1["per_pair"]["predictions"].items():
        model, checkpoint, sim = key.split("/")
        if sim == "cos":
            errors[model, checkpoint] = (np.asarray(pred) - gold) ** 2
    out = {"rows": t1["rows"], "aso": table1.aso_tests(errors, aso_iterations),
           "weights_sha256": t1["weights_sha256"]}
    write_json(results / "table1-aso.json", out)
    return out


def report(results: Path, config: Path, out: str, sets: list[str], aso_iterations: int) -> dict[str, Any]:
    """Table 1 + ASO, then jobs.pipeline's report stage over the runs and comparisons that came back."""
    from jobs import pipeline

    t1 = table1_report(results, aso_iterations)
    for row in t1.get("rows", []):
        paper = f" (paper {row['paper_spearman_x100']})" if row.get("paper_spearman_x100") is not None else ""
        say(f"table1 {row['model']} {row['checkpoint']} {row['similarity']}: {row['spearman_x100']:.2f}{paper}")
    for checkpoint, test in t1.get("aso", {}).items():
        say(f"ASO {checkpoint}: eps_min tuned better {test['eps_min_tuned_better']:.3f}, exact better "
            f"{test['eps_min_exact_better']:.3f} (the paper's threshold 0.3)")  # fmt: skip
    progress = read_json(results / PROGRESS, {})
    study = pipeline.load_config(config, [*sets, f"report.out={out}"])
    run_dirs = {n: str(results / r["run_dir"]) for n, r in progress.get("runs", {}).items() if n in study.runs}
    compare = {n: c for n, c in study.compare.items() if c.run in run_dirs and c.run2 in run_dirs}
    sub = study.model_copy(update={"runs": {n: r for n, r in study.runs.items() if n in run_dirs}, "compare": compare})
    if not sub.runs:
        return {"table1": t1, "reports": []}
    target, reports = pipeline.stage_report(sub, run_dirs)
    families = {n: sub.base_of(r.model) for n, r in sub.runs.items()}
    families |= {n: sub.base_of(sub.runs[c.run].model) for n, c in compare.items()}
    index = pipeline.write_index(target, sub, reports, families)
    for r in reports:
        for line in pipeline.finding_lines(r["findings"], pipeline.like_for_like(families[r["name"]])):
            say(f"{r['name']}: {line}")
    say(f"report: {index}")
    return {"table1": t1, "reports": reports, "index": index}


# --------------------------------------------------------------------------- the command line
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/paper_gpu.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("prepare", help="here: the model's float16 parts and the wheels, in batch folders")
    s.add_argument("--into", type=Path, default=TRANSFER,
                   help="a new folder, git-ignored: batch-01, batch-02, ... (default: "
                        f"{TRANSFER.relative_to(ROOT)})")
    s.add_argument("--base", default=BASE, help="the shelf model (a name or folder)")
    s.add_argument("--part-mib", type=float, default=25, help="largest part of the model (MiB)")
    s.add_argument("--batch-mib", type=float, default=BATCH_MIB, help="largest batch folder (MiB): one transfer")
    s.add_argument("--no-wheels", action="store_true", help="the machine has pydantic and datasets")
    s.add_argument("--qqp", type=Path, default=None,
                   help="the QQP subset file (GLUE's TSV layout) for the QQP runs (default: $XSBERT_QQP)")
    s.add_argument("--pin", action="append", default=[], metavar="NAME==VERSION",
                   help="another version of one of the wheels (e.g. one the machine's pyarrow takes)")
    n = sub.add_parser("plan", help="here: the calls that carry the batches there and run the study, with their "
                                    "carry lists and exact commands")  # fmt: skip
    n.add_argument("--transfer", type=Path, default=TRANSFER, help="the batches of `prepare` (git-ignored)")
    n.add_argument("--there", default=THERE_TRANSFER,
                   help="where each call copies its batch there, outside the checkout")
    n.add_argument("--work", default=THERE_WORK, help="the run's work folder there")
    n.add_argument("--timeout-s", type=int, default=540, help="the run call's limit (seconds)")
    n.add_argument("--deadline-s", type=float, default=420, help="the run's --deadline-s")
    n.add_argument("--done", type=Path, default=None,
                   help="an earlier attempt's progress.json (git-ignored, e.g. bench/.cache/paper-gpu/results/"
                        "progress.json): carried by the run call, given as its --done")  # fmt: skip
    n.add_argument("--run-args", default="", help="more arguments of the run call (e.g. --only ...)")
    r = sub.add_parser("run", help="there: install, train, Table 1, the runs; results into OUT in parts")
    r.add_argument("--config", type=Path, default=CONFIG)
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as jobs.pipeline's --set")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--transfer", type=Path, help="the folder holding the batch-NN folders of `prepare`")
    src.add_argument("--base", help="the shelf model as a folder or name, where it is installed already")
    r.add_argument("--work", type=Path, required=True, help="a folder that lasts while the machine does")
    r.add_argument("--out", type=Path, default=None, help="the folder whose files come back")
    r.add_argument("--received", type=int, default=0, help="how many of the outbox's parts have come back")
    r.add_argument("--fetch", action="store_true", help="only fill OUT with the next parts (after --received)")
    r.add_argument("--check", action="store_true",
                   help="only install the wheels, import what the stages need, print the versions, the GPU and the "
                        "parts that have arrived")  # fmt: skip
    r.add_argument("--done", type=Path, default=None, help="an earlier call's progress.json: its runs are skipped")
    r.add_argument("--only", default=None, help="comma-separated run names, in this order (default: the config's)")
    r.add_argument("--deadline-s", type=float, default=None,
                   help="start no piece after this many seconds, and stop the trainings once their rate says they "
                        "would end after it")  # fmt: skip
    r.add_argument("--poll-s", type=float, default=10.0,
                   help="seconds between readings of the trainings' progress (into OUT's outbox.json)")
    r.add_argument("--stop-after", default=None, help="stop after the piece of this name")
    r.add_argument("--table1-sample", type=int, default=None, help="seeded test pairs for Table 1 (default all)")
    r.add_argument("--send-weights", default=None, metavar="M1,M2",
                   help="after the runs: these trained models' weights as float16 differences to the base")
    r.add_argument("--part-mib", type=float, default=PART_MIB)
    r.add_argument("--out-files", type=int, default=OUT_FILES)
    r.add_argument("--out-mib", type=float, default=OUT_MIB)
    c = sub.add_parser("receive", help="here: join and extract the pieces whose parts came back")
    c.add_argument("--parts", type=Path, nargs="+", required=True, help="folders of parts (and outbox.json)")
    c.add_argument("--into", type=Path, default=RESULTS,
                   help=f"the results folder, git-ignored (default: {RESULTS.relative_to(ROOT)})")
    c.add_argument("--transfer", type=Path, default=None,
                   help="the batches of `prepare`: rebuild the weights that came back (<into>/models/)")
    t = sub.add_parser("report", help="here: Table 1 + ASO, the reports of the runs that came back")
    t.add_argument("--results", type=Path, default=RESULTS)
    t.add_argument("--config", type=Path, default=CONFIG)
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    t.add_argument("--out", default="reports/paper-gpu")
    t.add_argument("--aso-iterations", type=int, default=ASO_ITERATIONS,
                   help="bootstrap iterations (deepsig's default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from xsbert_core import XsbertError

    args = parse_args(argv)
    if args.verb == "run":  # there: no network (before anything imports huggingface_hub or datasets, which read them)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        if args.verb == "prepare":
            from jobs.attribution.inputs import qqp_path

            prepare(args.into, args.base, () if args.no_wheels else DEVICE_WHEELS, args.part_mib, args.batch_mib,
                    tuple(args.pin), qqp_path(str(args.qqp) if args.qqp else None))  # fmt: skip
        elif args.verb == "plan":
            plan(args.transfer, args.there, args.work, args.timeout_s, args.deadline_s, args.done, args.run_args)
        elif args.verb == "run" and args.check:
            check(args.transfer, args.work)
        elif args.verb == "run":
            from jobs.console import quiet_console

            quiet_console()
            runner = Runner(args)
            try:
                if not args.fetch:
                    runner.run()
            except _Stop as stop:
                say(f"stopped after {stop}")
            finally:
                if (runner.outbox.folder / OUTBOX).is_file():
                    runner.outbox.fill(args.out, args.received, args.out_files, args.out_mib)
        elif args.verb == "receive":
            receive(args.parts, args.into, args.transfer)
        else:
            report(args.results, args.config, args.out, args.set, args.aso_iterations)
    except (XsbertError, BundleError) as exc:
        print(f"paper_gpu: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
