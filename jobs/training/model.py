"""One model trained and saved (jobs.train, and a study's train stage through jobs/training/study.py): the training
pairs, the fine-tuning (xsbert_core.training), the last epoch and the best-dev one saved with their model card and
training record, written beside the target first so that a killed training leaves the old models as they were."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import xsbert_core
from xsbert_core import InputError
from xsbert_core.models import transformers_bars
from xsbert_core.training import (
    CHECKPOINTS,
    MIN_DEV_PAIRS,
    TRAINING_RECORD,
    VARIANT_SIMILARITY,
    TrainConfig,
    TrainData,
    TrainProgress,
    build_variant,
    checkpoint_folder,
    fine_tune,
    pairs_dataset,
)

from ..attribution.inputs import STSB_LABELS
from ..attribution.validate import load_pairs, validate
from ..processes import held_by, lock_file, owned_path, release_removing, remove_orphans

logger = logging.getLogger("jobs.train")

LABEL_MAX = STSB_LABELS[1]  # the losses take similarities in [0, 1]


def training_pairs(dataset: str, split: str, limit: int | None) -> tuple[list[str], list[str], list[float]]:
    """A split's pairs with their labels / 5 (the losses' similarities in [0, 1]); rows the job would quarantine are
    left out with a warning; an InputError for a pair without a label or a label outside 0..5."""
    pairs = load_pairs(dataset, split=split, limit=limit)
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    if len(quarantine):
        logger.warning("%d %s rows left out: %s", len(quarantine), split, quarantine.reason.value_counts().to_dict())
    if good.label.isna().any():
        n = int(good.label.isna().sum())
        raise InputError(f"{dataset} {split}: {n} pairs have no label; training needs labels")
    labels = (good.label / LABEL_MAX).tolist()
    if not all(0.0 <= x <= 1.0 for x in labels):
        raise InputError(f"{dataset} {split}: labels must lie in 0..{LABEL_MAX:g}")
    return good.text_a.tolist(), good.text_b.tolist(), labels


def check_sizes(train_of: str, n_train: int, dev_of: str, n_dev: int) -> None:
    """An InputError, before the model loads, for a training with no training pair or fewer than MIN_DEV_PAIRS dev
    pairs (its dev Spearman would fail after the first epoch)."""
    if n_train < 1:
        raise InputError(f"{train_of}: no training pairs to train on")
    if n_dev < MIN_DEV_PAIRS:
        raise InputError(f"{dev_of}: {n_dev} dev pair(s); the dev Spearman needs at least {MIN_DEV_PAIRS}")


def model_card(info: dict[str, Any]) -> str:
    """README.md of the saved model: what it is, how it was trained, how well it does, how to load it."""
    hp = info["hyperparameters"]
    def num(value: Any, digits: int) -> str:
        return f"{float(value):.{digits}f}" if value not in (None, "") else ""

    history = "\n".join(
        f"| {num(h.get('epoch'), 2)} | {h.get('step', '')} | {num(h.get('loss'), 5)} | "
        f"{num(h.get('eval_' + info['metric']), 4)} |"
        for h in info["history"]
    ) or "| | | (fewer steps than the logging interval) | |"
    capped = ", capped by --max-steps" if hp["max_steps"] > 0 else ""
    best = info.get("best")
    if info.get("checkpoint") == "best-dev":
        checkpoint = (f"the epoch with the best dev score (epoch {best['epoch']:g} of {hp['epochs']:g}, step "
                      f"{best['step']}; our option, not the paper's: App. A states no checkpoint rule); the last "
                      f"epoch is `{info['last_epoch_path']}`")  # fmt: skip
    else:
        checkpoint = "the last epoch (App. A states no checkpoint rule)" + (
            f"; the best dev epoch, {best['epoch']:g}, is `{info['best_dev_path']}`" if info.get("best_dev_path") else "")
    recipe = f" Recipe {info['recipe']!r}, model id `{info['model_id']}` (jobs.pipeline's train stage)." if info.get(
        "model_id") else ""
    versions = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items()) or "versions not recorded"
    load = (
        "import xsbert_core                      # registers the shift module with sentence-transformers\n"
        "from sentence_transformers import SentenceTransformer\n"
        f'model = SentenceTransformer("{info["path"]}")   # or trust_remote_code=True without the import'
        if info["variant"] in ("exact", "orig")
        else f'from sentence_transformers import SentenceTransformer\nmodel = SentenceTransformer("{info["path"]}")'
    )
    shift = (
        "Its first module is `xsbert_core.shift.ShiftedTransformer`: token embeddings minus the reference's "
        "(`[CLS] PAD … PAD [SEP]` of the same length) before pooling, so e(r) = 0 and token-pair attributions "
        "sum exactly to the prediction (xsbert-scale attributes it in `exact` mode by default)."
        if info["variant"] in ("exact", "orig")
        else "Unmodified architecture: attributions of it are approximate (`approx` mode)."
    )
    return f"""---
library_name: sentence-transformers
base_model: {info["base_model"]}
pipeline_tag: sentence-similarity
tags: [sentence-transformers, sentence-similarity, xsbert-scale, {info["variant"]}]
datasets: [sentence-transformers/stsb]
---

# {info["name"]}

`{info["base_model"]}` fine-tuned on STS-B train as the **{info["variant"]}** variant of Möller, Nikolaev & Padó
(EACL 2024, Table 1): similarity = **{info["similarity"]}**. {shift}

- Data: STS-B (bundled copy, `jobs/data/stsb.tsv.gz`), train split, {info["n_train"]} pairs, labels / 5; dev split
  ({info["n_dev"]} pairs) for evaluation every epoch.
- Loss: {info["loss"]}.
- Hyper-parameters: batch {hp["batch_size"]}, {hp["epochs"]:g} epochs, {hp["optimizer"]},
  weight decay {hp["weight_decay"]}, lr {hp["learning_rate"]}, {hp["warmup_ratio"]:.0%} linear warm-up,
  seed {hp["seed"]} ({info["steps"]} optimizer steps{capped}){", deterministic" if hp.get("deterministic") else ""}.{recipe}
- **Checkpoint: {checkpoint}. Dev Spearman ({info["metric"]}): {info["dev_spearman"]:.4f}**.
- Weights: `model.safetensors` sha256 `{info.get("weights_sha256", "not recorded")}`.
- Trained {info["finished_at"]} in {info["train_seconds"]:.0f} s on {info.get("device", "cpu")} with xsbert-scale
  {info["xsbert_version"]} ({versions}), command:

      {info["command"]}

## Use

```python
{load}
```

```bash
xsbert explain "A man plays a guitar." "Someone plays an instrument." --model {info["path"]}
```

## Training log

| epoch | step | loss | dev {info["metric"]} |
|---|---|---|---|
{history}
"""


def _device_name() -> str:
    """Where the trainer ran: the GPU's name when one is visible (the trainer moves the model there), else cpu."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _versions() -> dict[str, str]:
    import sentence_transformers
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "sentence-transformers": sentence_transformers.__version__}  # fmt: skip


def weights_sha256(folder: Path) -> str:
    """sha256 of the folder's model.safetensors: the trained weights' checksum (`sha256sum model.safetensors`)."""
    h = hashlib.sha256()
    with open(folder / "model.safetensors", "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def train_model(base: str, variant: str, config: TrainConfig, target: Path, *, dataset: str = TrainData.dataset,
                train_split: str = TrainData.train_split, dev_split: str = TrainData.dev_split,
                train_limit: int | None = None, dev_limit: int | None = None, command: str = "", quiet: bool = False,
                say: Callable[[str], None] = functools.partial(print, flush=True),
                record: dict[str, Any] | None = None,
                on_progress: Callable[[TrainProgress], None] | None = None,
                on_step: Callable[[TrainProgress], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Fine-tune `variant` of `base` by `config` on `dataset`'s train split (dev evaluated every epoch); save the last
    epoch into `target` and, where epochs were evaluated, the best-dev epoch into its sibling <target>-best-dev (both
    replaced if there); return the training record, written with the model card into each folder. `record`: extra
    fields of the record (jobs.pipeline's model id and recipe name); `on_progress`, `on_step`: fine_tune's; `quiet`: no
    progress bar (the trainer's, nor transformers' own while it loads and saves); `say`: where its lines go.

    Everything is written into a hidden folder beside `target` first (the trainer's per-epoch checkpoints too), and
    the finished folders replace the old ones at the end: a killed training leaves the old models as they were and no
    half-written one; the next training into `target` on the same host removes what it left."""
    with transformers_bars(not quiet):  # quiet: no bar of transformers' either (loading, saving)
        # sentence-transformers (seconds to import) here, where a model is trained, not for --help or a bad flag
        from sentence_transformers import SentenceTransformer

        from xsbert_core import load_model

        # Everything that can fail fails before training: data, model, the variant's construction.
        train_a, train_b, train_y = training_pairs(dataset, train_split, train_limit)
        dev_a, dev_b, dev_y = training_pairs(dataset, dev_split, dev_limit)
        check_sizes(f"{dataset} {train_split}", len(train_a), f"{dataset} {dev_split}", len(dev_a))
        model = load_model(base, attn_implementation=None)  # fused attention: ~1.3x faster training
        for p in model.parameters():  # load_model freezes the weights for attribution: training needs them back
            p.requires_grad_(True)
        model.train()
        build_variant(model, variant)
        train, dev = pairs_dataset(train_a, train_b, train_y), pairs_dataset(dev_a, dev_b, dev_y)
        # the folder's lock after what can fail: a bad input writes nothing; a second training into `target`
        # stops here, before it trains
        with training_lock(target):
            say(f"training {variant} from {base}: {len(train)} train / {len(dev)} dev pairs, "
                f"similarity {VARIANT_SIMILARITY[variant]}")  # fmt: skip
            name = target.name
            best_target = checkpoint_folder(target, CHECKPOINTS[1])
            partial = f".{name}.partial-"  # + the process's tag: a training into `target`, before it replaces it
            remove_orphans(target.parent, partial)  # what killed ones left
            staging = owned_path(target.parent, partial)
            staging.mkdir(parents=True)
            try:
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="xsbert-train-", dir=staging) as work:
                    result = fine_tune(model, variant, train, dev, config, work, progress=not quiet,
                                       on_progress=on_progress, on_step=on_step)  # fmt: skip
                    best = result["best"]
                    # The epoch with the best dev score, from the trainer's checkpoint of it before the work dir goes.
                    best_model = SentenceTransformer(best.pop("checkpoint"), device="cpu") if best else None
                seconds = time.perf_counter() - t0
                model.eval()
                last, best_staged = (staging / c for c in CHECKPOINTS)
                model.save(str(last), create_model_card=False)
                info = {
                    "name": name,
                    "path": str(target),
                    "variant": variant,
                    "base_model": str(base),
                    "similarity": VARIANT_SIMILARITY[variant],
                    "loss": "DotProductMSELoss (MSE of e(a)·e(b) vs label)" if variant == "orig"
                    else "CosineSimilarityLoss (MSE of cos vs label)",
                    "dataset": dataset,
                    "n_train": len(train),
                    "n_dev": len(dev),
                    "hyperparameters": config.as_dict(),
                    **result,
                    **(record or {}),
                    "train_seconds": seconds,
                    "device": _device_name(),
                    "versions": _versions(),
                    "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "xsbert_version": xsbert_core.__version__,
                    "command": command,
                    "weights_sha256": weights_sha256(last),
                    "checkpoint": CHECKPOINTS[0],
                    "last_epoch_path": str(target),
                    "best_dev_path": str(best_target) if best else None,
                }
                write_card(last, info)
                if best_model is not None:
                    best_model.save(str(best_staged), create_model_card=False)
                    write_card(best_staged, {**info, "path": str(best_target), "name": best_target.name,
                                             "checkpoint": CHECKPOINTS[1], "dev_spearman": best["dev_spearman"],
                                             "weights_sha256": weights_sha256(best_staged)})  # fmt: skip
                    _replace(best_target, best_staged)
                elif best_target.exists():  # an earlier training's best epoch: not this model's
                    shutil.rmtree(best_target)
                _replace(target, last)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            say(f"dev Spearman ({result['metric']}) {result['dev_spearman']:.4f} after {result['steps']} steps (last "
                f"epoch), {seconds:.0f} s\nsaved: {target}")  # fmt: skip
            if best:
                say(f"dev Spearman ({result['metric']}) {best['dev_spearman']:.4f} at epoch {best['epoch']:g} (best dev; "
                    f"ours)\nsaved: {best_target}")  # fmt: skip
            return info


@contextlib.contextmanager
def training_lock(target: Path) -> Iterator[None]:
    """An exclusive lock on training into `target` (the file .<name>.lock beside it) for the whole training: a second
    training into the same folder (jobs.train's --name, two studies sharing a models folder) is one line at once,
    where both trained and the later one replaced the other's model without a word. The file goes with the lock
    (one a killed training left is taken by the next)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.parent / f".{target.name}.lock"
    fh = lock_file(lock)
    if fh is None:
        raise InputError(f"another training is writing {target} (lock held by {held_by(lock)}); wait for it to "
                         "finish, or give this one another name")  # fmt: skip
    try:
        yield
    finally:
        release_removing(fh)


def _replace(folder: Path, finished: Path) -> None:
    """`finished` (a folder of the training's staging folder) renamed to `folder`, the old `folder` (if any) moved
    aside into the staging folder first and removed after: a reader finds the old model or the new one, save for the
    instant between the two renames; a kill in that instant leaves the old one in the staging folder, which the next
    training removes with the rest of what the killed one left."""
    old = finished.with_name(f"{finished.name}.old")
    if folder.exists():
        folder.rename(old)
    finished.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def write_card(folder: Path, info: dict[str, Any]) -> None:
    """The model card (README.md) and xsbert_training.json of a saved model folder."""
    (folder / "README.md").write_text(model_card(info), encoding="utf-8")
    (folder / TRAINING_RECORD).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
