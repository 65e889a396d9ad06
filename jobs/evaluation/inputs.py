"""The models an evaluation compares (the base model, its tuned, exact and orig fine-tunes at either checkpoint, the
noise floor's second seed) and its STS-B pairs."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import numpy as np

from xsbert_core import InputError
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.training import CHECKPOINTS, MODELS_DIR, VARIANTS, base_name, checkpoint_folder

from ..attribution.validate import load_pairs, validate

SECOND_SEED = ("tuned2", "exact2")  # the noise floor's models: one recipe, another seed
# jobs.train saves both epochs; the last is the model (App. A states no checkpoint rule), the best-dev one is ours.
DEFAULT_CHECKPOINT = CHECKPOINTS[0]


def model_paths(args: argparse.Namespace) -> dict[str, str]:
    """shelf -> the base model name; tuned/exact/orig -> their folders (the last epoch, as jobs.train saves them);
    tuned2/exact2 -> the second seed's folders where they exist (the noise floor)."""
    paths = {"shelf": str(args.base)}
    for v in VARIANTS:
        folder = Path(getattr(args, v) or Path(args.models) / f"{base_name(args.base)}-{v}")
        paths[v] = str(folder)
    for v in ("tuned", "exact"):
        folder = Path(args.models) / f"{base_name(args.base)}-{v}-seed{args.second_seed}"
        if any(is_model(checkpoint_path(str(folder), c)) for c in CHECKPOINTS):
            paths[f"{v}2"] = str(folder)
    return paths


def is_model(folder: str | Path) -> bool:
    return (Path(folder) / "modules.json").is_file()


def checkpoint_path(path: str, checkpoint: str) -> str:
    """The folder of a trained model's `checkpoint`: the last epoch is the folder itself, the best dev epoch its
    sibling <folder>-best-dev (xsbert_core.training.checkpoint_folder)."""
    return str(checkpoint_folder(Path(path), checkpoint))


def require_models(paths: dict[str, str], needed: tuple[str, ...],
                   checkpoints: tuple[str, ...] = CHECKPOINTS) -> None:
    """Each of `needed` has a saved model at one of `checkpoints` at least (Table 1 takes whichever are there; the
    attribution stages need the one --checkpoint names)."""
    absent = [v for v in needed if not any(is_model(checkpoint_path(paths[v], c)) for c in checkpoints)]
    if absent:
        missing = [f"{v} ({' or '.join(checkpoint_path(paths[v], c) for c in checkpoints)})" for v in absent]
        hint = ("; models trained before jobs.train kept the best dev epoch have only the last one: "
                "--checkpoint last-epoch" if checkpoints == ("best-dev",) else "")  # fmt: skip
        train = " && ".join(train_command(v, paths["shelf"], paths[v]) for v in VARIANTS if v in absent)
        raise InputError(f"model folder(s) not found: {', '.join(missing)}; train them first: {train}{hint}")


def train_command(variant: str, base: str, folder: str) -> str:
    """The jobs.train command that saves `variant` of `base` into `folder` (its last epoch; the best-dev one beside
    it): --model, --out and --name only where they are not jobs.train's defaults."""
    target = Path(folder)
    argv = ["--variant", variant]
    if base != DEFAULT_MODEL:
        argv += ["--model", base]
    if target.parent != Path(MODELS_DIR):
        argv += ["--out", str(target.parent)]
    if target.name != f"{base_name(base)}-{variant}":
        argv += ["--name", target.name]
    return "python -m jobs.train " + " ".join(shlex.quote(a) for a in argv)


def stsb(split: str, sample: int | None = None, seed: int = 0) -> tuple[list[str], list[str], np.ndarray, list[str]]:
    pairs = load_pairs("stsb", split=split, sample=sample, seed=seed)
    good, _ = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    return good.text_a.tolist(), good.text_b.tolist(), good.label.to_numpy(), good.pair_id.tolist()
