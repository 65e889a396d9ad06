"""Evaluate the paper's model variants: Table 1 with significance, exact-vs-approximate agreement at every
layer, reference terms and positive/negative sums (EACL 2024: Table 1, Fig 2-5).

    python -m jobs.train --variant tuned && python -m jobs.train --variant exact && python -m jobs.train --variant orig
    python -m jobs.evaluate                                    # all stages, all layers, 300 STS-B test pairs
    python -m jobs.evaluate --stages table1                    # only Table 1 (seconds)
    python -m jobs.evaluate --layers 3,4,5 --sample 1379       # agreement at three layers on all test pairs
    python -m jobs.train --variant tuned --seed 1 --name all-MiniLM-L6-v2-tuned-seed1   # the noise floor's model

Stages:
  table1     Spearman x 100 of each model's predicted similarity vs gold on STS-B test (all pairs), for
             shelf (the base model), tuned, exact, orig, each trained model at its last epoch (App. A states no
             checkpoint rule) and at its best-dev epoch (ours; jobs.train saves both), every model scored with
             cosine as the paper does (§4.2)
             and orig also with its own dot product; the almost-stochastic-order test (Dror et al. 2019,
             deepsig) on squared errors (prediction - label/5)^2 between tuned and exact, both directions,
             per checkpoint.
  agreement  the same seeded sample of STS-B test pairs attributed by `tuned` (approx mode) and `exact`
             (exact mode) through jobs.attribute at every requested layer; per layer N is the smallest of
             --steps-grid whose mean |completeness error| on --pilot-pairs pairs is <= --max-error / 2 for
             both models, then checked on the full runs (N doubles until their mean is <= --max-error);
             agreement by score bin from sql/agreement.sql. The noise floor beside it: where a second training
             of the same recipe with another seed exists (<models>/<base name>-tuned-seed<K>, -exact-seed<K>,
             K = --second-seed), it is attributed at the same layer and N, and tuned vs tuned' (exact vs
             exact') agreement is reported in the same table and figures.
  figures    shelf (approx) and exact runs at --fig-layer: sql/reference_terms.sql (Fig 2) and
             sql/pos_neg_sums.sql (Fig 5); plots of Fig 2-5.
Everything lands in --out: Markdown, CSV and Parquet tables, PNG figures, summary.json (commands, N per
layer, run directories, timings). polars is imported where a table is made: Table 1's predictions (table1_rows)
need only torch and sentence-transformers, so a GPU machine without polars computes them. The machinery is
jobs/evaluation/ (its __init__ names the modules).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from typing import Any

from xsbert_core.errors import CommandParser, exit_status
from xsbert_core.metrics import ASO_ITERATIONS
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.settings import DEFAULT_LAYER, DefaultsHelpFormatter, add_arguments
from xsbert_core.training import CHECKPOINTS, MODELS_DIR, VARIANTS

from .config import DEFAULT_OUT, Execution
from .console import quiet_console
from .evaluation.inputs import DEFAULT_CHECKPOINT
from .evaluation.run import RESULTS_DIR, evaluate

STAGES = ("table1", "agreement", "figures")
DEFAULT_STEPS_GRID = (4, 8, 16, 32, 64, 128)


def build_parser() -> CommandParser:
    """jobs.evaluate's parser (its --help shows each flag's default); parse_args checks what argparse cannot."""
    p = CommandParser(
        prog="python -m jobs.evaluate",
        description="Table 1 with significance, exact-vs-approximate agreement at every layer, Fig 2-5.",
        formatter_class=DefaultsHelpFormatter,  # each flag's default in --help
    )
    p.add_argument("--base", default=DEFAULT_MODEL, help="the off-the-shelf model (shelf) the variants were tuned from")
    p.add_argument("--models", default=MODELS_DIR, help="folder with <base name>-{tuned,exact,orig} from jobs.train")
    for v in VARIANTS:
        p.add_argument(f"--{v}", default=None, help=f"the {v} model folder (default <models>/<base name>-{v})")
    p.add_argument("--checkpoint", choices=CHECKPOINTS, default=DEFAULT_CHECKPOINT,
                   help="which saved epoch of each trained model the attribution stages use (Table 1 shows both): "
                        "last-epoch (<folder>; App. A states no rule) or best-dev (<folder>-best-dev; ours)")  # fmt: skip
    p.add_argument("--second-seed", type=int, default=1,
                   help="the noise floor's models are <models>/<base name>-{tuned,exact}-seed<K> (jobs.train --seed K "
                        "--name ...); used where they exist")  # fmt: skip
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated subset of {', '.join(STAGES)}")
    p.add_argument("--split", default="test", help="STS-B split to evaluate on")
    p.add_argument("--sample", type=int, default=300, help="seeded sample of pairs for the attribution stages")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample")
    p.add_argument("--layers", default="all",
                   help="'all' or comma-separated layer indices for the agreement stage (negative: from the top)")
    p.add_argument("--max-error", type=float, default=1e-2, help="bound on each run's mean |completeness error|")
    p.add_argument("--steps-grid", default=",".join(map(str, DEFAULT_STEPS_GRID)), help="candidate N, ascending")
    p.add_argument("--pilot-pairs", type=int, default=12, help="pairs of the sample used to choose N per layer")
    p.add_argument("--fig-layer", type=int, default=DEFAULT_LAYER,
                   help="layer of the Fig 2/5 runs (negative: from the top)")
    p.add_argument("--aso-iterations", type=int, default=ASO_ITERATIONS,
                   help=f"bootstrap iterations of the ASO test (default: {ASO_ITERATIONS}, deepsig's own; ~1-3 min per "
                        "direction on CPU)")  # fmt: skip
    p.add_argument("--runs", default=DEFAULT_OUT, help="store root of the attribution runs")
    p.add_argument("--out", default=None, help=f"results folder (default {RESULTS_DIR}/<base name>)")
    # where the attribution runs compute: jobs.attribute's own flags (jobs/config.py Execution), e.g. --executor local
    add_arguments(p.add_argument_group("execution of the attribution runs (as in jobs.attribute)"), Execution)
    p.add_argument("-q", "--quiet", action="store_true", help="no Ray Data progress bars in the attribution runs")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in args.stages if s not in STAGES]
    if bad:
        p.error(f"unknown stage(s) {', '.join(bad)}; valid: {', '.join(STAGES)}")
    try:
        args.layers = parse_layers(args.layers)
        args.steps_grid = parse_steps_grid(args.steps_grid)
        check_numbers(args)
    except ValueError as exc:
        p.error(str(exc))
    return args


def parse_layers(text: str) -> str | list[int]:
    """--layers: "all", or its comma-separated layer indices in order, each once (negative: from the top; their
    range is checked against the model, xsbert_core.split.resolve_layer); ValueError naming the flag if not."""
    if text.strip() == "all":
        return "all"
    try:
        layers = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--layers must be 'all' or comma-separated integers, got {text!r}") from None
    return list(dict.fromkeys(layers))


def parse_steps_grid(text: str) -> list[int]:
    """--steps-grid: the candidate N, positive integers in ascending order; ValueError naming the flag if not."""
    try:
        grid = [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--steps-grid must be comma-separated integers, got {text!r}") from None
    if grid[0] < 1 or any(b <= a for a, b in zip(grid, grid[1:])):
        raise ValueError(f"--steps-grid must be positive integers in ascending order, got {text!r}")
    return grid


def check_numbers(args: argparse.Namespace) -> None:
    """--max-error a positive number, --sample, --pilot-pairs and --aso-iterations >= 1; ValueError naming the
    flag if not."""
    if not (math.isfinite(args.max_error) and args.max_error > 0):
        raise ValueError(f"--max-error must be a positive number, got {args.max_error}")
    for flag, value in (("--sample", args.sample), ("--pilot-pairs", args.pilot_pairs),
                        ("--aso-iterations", args.aso_iterations)):  # fmt: skip
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the evaluation of parse_args's flags (jobs.evaluation.run); returns summary.json's contents."""
    return evaluate(args)


def cli(argv: list[str] | None = None) -> int:
    quiet_console()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.command = "python -m jobs.evaluate " + " ".join(shlex.quote(a) for a in argv)
    return exit_status("jobs.evaluate", lambda: main(args),
                       interrupted="the results saved in summary.json stay; the same command reuses them")


if __name__ == "__main__":
    sys.exit(cli())
