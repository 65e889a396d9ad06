"""Trained models of a study (jobs.pipeline's train stage): fine-tuned once per recipe, then reused.

A study declares a model to fine-tune by its base, its variant (tuned, exact, orig: xsbert_core.training) and its
recipe (`paper`: App. A's hyper-parameters, xsbert_core.training.RECIPES). Its model id is the hash of everything that
changes its weights (`model_config`: the base's weights, the variant, every hyper-parameter and the seed, the data,
the code version), as a run id is of what changes a run's numbers. It is trained once per id into

    <models_dir>/<model id>/<base name>-<variant>            the last epoch (App. A states no checkpoint rule)
    <models_dir>/<model id>/<base name>-<variant>-best-dev   the epoch with the best dev score (ours, an option)

and reused while the id is the same: an unchanged recipe trains nothing, a changed one trains a new model beside the
old. A training writes into a temporary folder beside them (its trainer's per-epoch checkpoints in it too: jobs.train)
and renames it into place when both checkpoints are saved, so a killed training leaves nothing that passes for a model;
the next training of that id on the same host removes what it left.

Where it trains: with the local executor in spawned processes of this machine (`per_gpu` at once per GPU: small models
leave most of a GPU idle; one process without a GPU, its trainings one after another); with Ray each is a task with
1/per_gpu of a GPU where the cluster has GPUs (one CPU where it has none), in a fresh worker, writing into models_dir,
which the driver and every node must see (a local folder on one machine, a shared folder on several). While a training
runs it keeps its progress in <models_dir>/.<model id>.progress.json (xsbert_core.training.TrainProgress: step, epoch,
seconds, time left), which ensure_trained reads every `poll_s` and passes to `on_progress`; the file goes when the
training ends. Where `on_progress` returns True, every training of the call stops after its current step (a stop file
beside the progress): nothing of it is kept, and ensure_trained raises TrainingStopped (a caller's deadline, not a
fault).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xsbert_core
from xsbert_core import InputError, XsbertError
from xsbert_core.training import (
    CHECKPOINTS,
    TRAINING_RECORD,
    TrainConfig,
    TrainData,
    TrainProgress,
    base_name,
    checkpoint_folder,
)

from .. import config
from ..processes import owned_path, remove_orphans
from ..store import short_hash

EXECUTORS = config.EXECUTORS  # where a training runs: as the job's stages


@dataclass(frozen=True)
class TrainSpec:
    """One model to fine-tune: `base` as load_model takes it, the variant, the recipe (its name for the card and its
    hyper-parameters), the data, and which saved epoch the study's runs use (not part of the id: both are saved)."""

    base: str
    variant: str
    recipe: TrainConfig
    recipe_name: str = "paper"
    dataset: str = TrainData.dataset
    train_split: str = TrainData.train_split
    dev_split: str = TrainData.dev_split
    train_limit: int | None = None
    dev_limit: int | None = None
    checkpoint: str = CHECKPOINTS[0]


def data_fingerprint(dataset: str) -> str:
    """A built-in dataset by its name (its rows are the code version's); a file by its bytes' sha256."""
    path = Path(dataset).expanduser()
    if not path.is_file():
        return dataset
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


def model_config(spec: TrainSpec, base_weights_sha256: str) -> dict[str, Any]:
    """What changes the trained weights, each once; model_id hashes it. Not the checkpoint (both epochs are kept),
    not the base's name or path (its weights are), not the device or library versions (recorded in the card)."""
    return {
        "code_version": xsbert_core.__version__,
        "base_weights_sha256": base_weights_sha256,
        "variant": spec.variant,
        "recipe": asdict(spec.recipe),
        "data": {"dataset": data_fingerprint(spec.dataset), "train_split": spec.train_split,
                 "dev_split": spec.dev_split, "train_limit": spec.train_limit, "dev_limit": spec.dev_limit},
    }  # fmt: skip


def model_id(config: dict[str, Any]) -> str:
    return short_hash(config)


def model_folder(root: str | Path, spec: TrainSpec, mid: str, checkpoint: str | None = None) -> Path:
    """<root>/<id>/<base name>-<variant>[-best-dev]: the folder name ends in the variant (or -best-dev after it), as
    the reports read a model's variant from it (jobs/analyses/facts.py)."""
    return checkpoint_folder(Path(root) / mid / f"{base_name(spec.base)}-{spec.variant}", checkpoint or spec.checkpoint)


def trained_record(folder: Path, mid: str) -> dict[str, Any] | None:
    """The training record of a model folder trained for `mid`, else None (no folder, another id, no weights)."""
    try:
        record = json.loads((folder / TRAINING_RECORD).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("model_id") != mid or not (folder / "modules.json").is_file():
        return None
    return record


def fingerprint(base: str) -> str:
    """The base model's weights fingerprint (xsbert_core.weights_fingerprint: the run ids' too), loaded on the CPU."""
    from xsbert_core import load_model, weights_fingerprint

    return weights_fingerprint(load_model(base, device="cpu"))


def progress_file(root: str | Path, mid: str) -> Path:
    """Where a running training of model `mid` keeps its TrainProgress (a hidden file beside the model folders)."""
    return Path(root) / f".{mid}.progress.json"


class TrainingStopped(XsbertError):
    """The caller stopped the trainings (ensure_trained's on_progress returned True); nothing of them is kept."""


def stop_file(root: str | Path, mid: str) -> Path:
    """Its presence stops the running training of model `mid` after its current step."""
    return Path(root) / f".{mid}.stop"


def _work_name(mid: str) -> tuple[str, str]:
    """Where a training of model `mid` writes before its rename: a hidden folder, `<prefix><process tag><suffix>`."""
    return f".{mid}.partial-", ""


def _progress_tmp_name(root: str | Path, mid: str) -> tuple[str, str]:
    """The progress file's temporary copy, written then renamed over it: `<prefix><process tag><suffix>`."""
    return f"{progress_file(root, mid).name}.", ".tmp"


def clear_leftovers(root: str | Path, mid: str) -> list[Path]:
    """Remove what killed trainings of model `mid` on this host left in `root` (their temporary folders and progress
    files, whose processes are gone), and return it. Another host's, or a running process's, stay."""
    removed = []
    for prefix, suffix in (_work_name(mid), _progress_tmp_name(root, mid)):
        removed += remove_orphans(Path(root), prefix, suffix)
    return removed


def _write_progress(root: str | Path, mid: str, progress: TrainProgress) -> None:
    tmp = owned_path(Path(root), *_progress_tmp_name(root, mid))
    tmp.write_text(json.dumps(asdict(progress)), encoding="utf-8")
    tmp.replace(progress_file(root, mid))  # a reader sees the old state or the new one, never half of one


def read_progress(root: str | Path, mid: str) -> TrainProgress | None:
    """The running training's last TrainProgress, or None (not started, ended, or unreadable)."""
    try:
        return TrainProgress(**json.loads(progress_file(root, mid).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def train_into(spec: TrainSpec, mid: str, config: dict[str, Any], root: str) -> dict[str, Any]:
    """Train `spec` into <root>/<mid>/ (in a process of the local pool, or a Ray task's fresh worker), keeping its
    progress in progress_file(root, mid) meanwhile, and silent (the stage says what it does, from that file). Returns
    the last epoch's training record, or {"error": one line} for a bad input (so that it crosses a process boundary as
    text)."""
    from .model import train_model, write_card

    final = Path(root) / mid
    clear_leftovers(root, mid)
    work = owned_path(Path(root), *_work_name(mid))
    progress, stop = progress_file(root, mid), stop_file(root, mid)

    def on_step(p: TrainProgress) -> None:
        if stop.exists():
            raise TrainingStopped(f"stopped at step {p.step}/{p.max_steps}, {p.seconds:.0f} s in (asked to)")

    def on_progress(p: TrainProgress) -> None:
        _write_progress(root, mid, p)
        on_step(p)  # at the start too: a training begun after the stop ends before its first step

    try:
        if work.exists():
            shutil.rmtree(work)
        target = work / model_folder(root, spec, mid, "last-epoch").name
        record = {"model_id": mid, "recipe": spec.recipe_name, "model_config": config}
        command = f"python -m jobs.pipeline (train stage: {spec.variant} of {spec.base}, recipe {spec.recipe_name})"
        train_model(spec.base, spec.variant, spec.recipe, target, dataset=spec.dataset, train_split=spec.train_split,
                    dev_split=spec.dev_split, train_limit=spec.train_limit, dev_limit=spec.dev_limit,
                    command=command, quiet=True, say=lambda line: None, record=record,
                    on_progress=on_progress, on_step=on_step)  # fmt: skip
        try:
            work.rename(final)
        except OSError:  # another study trained the same id meanwhile: theirs stands
            theirs = trained_record(model_folder(root, spec, mid, "last-epoch"), mid)
            if theirs is None:
                raise
            shutil.rmtree(work, ignore_errors=True)
            return {**theirs, "reused": True}
        # the records name the folders they are in now
        for checkpoint in CHECKPOINTS:
            folder = model_folder(root, spec, mid, checkpoint)
            if (folder / TRAINING_RECORD).is_file():
                info = json.loads((folder / TRAINING_RECORD).read_text(encoding="utf-8"))
                last, best = model_folder(root, spec, mid, "last-epoch"), model_folder(root, spec, mid, "best-dev")
                info.update(path=str(folder), last_epoch_path=str(last),
                            best_dev_path=str(best) if info.get("best_dev_path") else None)  # fmt: skip
                write_card(folder, info)
        return json.loads((model_folder(root, spec, mid, "last-epoch") / TRAINING_RECORD).read_text(encoding="utf-8"))
    except XsbertError as exc:
        shutil.rmtree(work, ignore_errors=True)
        return {"error": str(exc)}
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        progress.unlink(missing_ok=True)


def _local(todo: list[tuple[TrainSpec, str, dict[str, Any]]], root: str, per_gpu: int, watch: Callable[[], None],
           poll_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """The trainings in spawned processes (CUDA and cuBLAS start in them after a training has set the deterministic
    settings, which each training sets again): per_gpu at once per GPU, one process without a GPU, whose trainings run
    one after another; `watch()` every poll_s meanwhile."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, wait

    import torch

    workers = max(1, min(len(todo), per_gpu * torch.cuda.device_count())) if torch.cuda.is_available() else 1
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(train_into, spec, mid, config, root) for spec, mid, config in todo]
        while wait(futures, timeout=poll_s).not_done:
            watch()
        return [f.result() for f in futures]


def _ray(todo: list[tuple[TrainSpec, str, dict[str, Any]]], root: str, per_gpu: int, address: str | None,
         watch: Callable[[], None], poll_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """Each training a Ray task in a fresh worker (max_calls=1), 1/per_gpu of a GPU where the cluster has GPUs;
    `watch()` every poll_s meanwhile."""
    from ..raycluster import init_ray

    ray = init_ray(address)
    resources = {"num_gpus": 1 / per_gpu} if ray.cluster_resources().get("GPU", 0) > 0 else {"num_cpus": 1}
    task = ray.remote(max_calls=1, max_retries=0, **resources)(train_into)
    refs = [task.remote(spec, mid, config, root) for spec, mid, config in todo]
    pending = refs
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=poll_s)
        if pending:
            watch()
    return ray.get(refs)


def ensure_trained(specs: dict[str, TrainSpec], root: str, executor: str = "ray", per_gpu: int = 1,
                   address: str | None = None, say: Callable[[str], None] = print,
                   on_progress: Callable[[str, TrainProgress], bool | None] | None = None,
                   poll_s: float = 30.0) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every model of `specs` trained (what its id already has is reused); {name: {"path": the folder of its checkpoint,
    "model_id", "trained": whether this call trained it, "seconds", "record": the last epoch's training record}}.
    InputError (one line naming the model) when a training cannot start. While trainings run, every `poll_s`:
    `on_progress(names, TrainProgress)` for each training whose progress moved (default: a `say` line); where it
    returns True, every training of this call stops after its current step and TrainingStopped is raised after they
    have (the trainings that had ended by then are kept)."""
    if executor not in EXECUTORS:
        raise InputError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if not specs:
        return {}
    root_path = Path(root).expanduser().resolve()
    fingerprints: dict[str, str] = {}
    plans: dict[str, tuple[TrainSpec, str, dict[str, Any]]] = {}
    for name, spec in specs.items():
        if spec.base not in fingerprints:
            fingerprints[spec.base] = fingerprint(spec.base)
        config = model_config(spec, fingerprints[spec.base])
        plans[name] = (spec, model_id(config), config)
    todo: dict[str, tuple[TrainSpec, str, dict[str, Any]]] = {}
    for name, (spec, mid, config) in plans.items():
        if trained_record(model_folder(root_path, spec, mid, "last-epoch"), mid) is None:
            todo.setdefault(mid, (spec, mid, config))  # two names, one recipe: trained once
    results: dict[str, dict[str, Any]] = {}
    if todo:
        names = {mid: ", ".join(n for n, p in plans.items() if p[1] == mid) for mid in todo}  # a model id's names
        root_path.mkdir(parents=True, exist_ok=True)
        for spec, mid, _ in todo.values():
            say(f"train {names[mid]}: training {spec.variant} of {spec.base}, recipe {spec.recipe_name} "
                f"(model {mid}) ...")  # fmt: skip
        t0 = time.perf_counter()
        jobs = list(todo.values())
        said: dict[str, str] = {}

        def say_progress(names: str, p: TrainProgress) -> None:  # a line per change of what it says
            if said.get(names) != (line := f"train {names}: {p}"):
                said[names] = line
                say(line)

        report = on_progress or say_progress
        seen: dict[str, TrainProgress] = {}
        stopped: list[str] = []

        def watch() -> None:
            for mid in todo:
                p = read_progress(root_path, mid)
                if p is not None and p != seen.get(mid):
                    seen[mid] = p
                    if report(names[mid], p) and not stopped:
                        stopped.append(f"{names[mid]} at step {p.step}/{p.max_steps}")
                        for other in todo:
                            stop_file(root_path, other).touch()

        for mid in todo:
            stop_file(root_path, mid).unlink(missing_ok=True)  # a stop meant for an earlier call
        try:
            if executor == "local":
                out = _local(jobs, str(root_path), per_gpu, watch, poll_s)
            else:
                out = _ray(jobs, str(root_path), per_gpu, address, watch, poll_s)
        finally:
            for mid in todo:
                stop_file(root_path, mid).unlink(missing_ok=True)
        if stopped:
            each = [f"{names[mid]} {record.get('error') or 'ended before the stop (kept)'}"
                    for (_, mid, _), record in zip(jobs, out)]
            raise TrainingStopped(f"trainings stopped by the caller ({stopped[0]}): {'; '.join(each)}")
        for (spec, mid, _), record in zip(jobs, out):
            if "error" in record:
                raise InputError(f"models.{names[mid]}: training failed: {record['error']}")
            results[mid] = {**record, "wall_s": time.perf_counter() - t0}
    summary: dict[str, dict[str, Any]] = {}
    for name, (spec, mid, _) in plans.items():
        folder = model_folder(root_path, spec, mid)
        record = trained_record(model_folder(root_path, spec, mid, "last-epoch"), mid)
        if record is None or not (folder / "modules.json").is_file():
            raise InputError(f"models.{name}: {folder} holds no {spec.checkpoint} model after training (the "
                             f"{spec.checkpoint} epoch is saved only where epochs are evaluated: no max_steps)")
        trained = mid in results and not results[mid].get("reused")
        summary[name] = {"path": str(folder), "model_id": mid, "trained": trained, "record": record,
                         "seconds": float(record.get("train_seconds", 0.0))}  # fmt: skip
        if trained:
            say(f"train {name}: trained in {record.get('train_seconds', 0):.0f} s, dev Spearman "
                f"{record.get('dev_spearman', float('nan')):.4f} (last epoch; {folder})")  # fmt: skip
        else:
            say(f"train {name}: up to date (model {mid}, {folder})")
    return summary
