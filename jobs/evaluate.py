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
need only torch and sentence-transformers, so a GPU machine without polars computes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from xsbert_core.cli import writable_folder
from xsbert_core.errors import CommandParser, exit_status
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.settings import DEFAULT_LAYER, add_arguments
from xsbert_core.training import CHECKPOINTS, VARIANTS, base_name

from .config import Execution
from .console import quiet_console
from .evaluation.agreement import agreement_frames, attribute, layer_runs, sql_file
from .evaluation.figures import plot_all, write_table
from .evaluation.inputs import (
    DEFAULT_CHECKPOINT,
    checkpoint_path,
    is_model,
    model_paths,
    require_models,
    stsb,
)
from .evaluation.table1 import table1

STAGES = ("table1", "agreement", "figures")
DEFAULT_STEPS_GRID = (4, 8, 16, 32, 64, 128)
# What summary.json records of an invocation's settings (each save writes them with its results).
SETTINGS = ("base", "models", "split", "sample", "seed", "max_error", "checkpoint")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(
        prog="python -m jobs.evaluate",
        description="Table 1 with significance, exact-vs-approximate agreement at every layer, Fig 2-5.",
    )
    p.add_argument("--base", default=DEFAULT_MODEL, help="the off-the-shelf model (shelf) the variants were tuned from")
    p.add_argument("--models", default="models", help="folder with <base name>-{tuned,exact,orig} from jobs.train")
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", default="all", help="'all' or comma-separated layer indices for the agreement stage")
    p.add_argument("--max-error", type=float, default=1e-2, help="bound on each run's mean |completeness error|")
    p.add_argument("--steps-grid", default=",".join(map(str, DEFAULT_STEPS_GRID)), help="candidate N, ascending")
    p.add_argument("--pilot-pairs", type=int, default=12, help="pairs of the sample used to choose N per layer")
    p.add_argument("--fig-layer", type=int, default=DEFAULT_LAYER, help="layer of the Fig 2/5 runs")
    p.add_argument("--aso-iterations", type=int, default=1000,
                   help="bootstrap iterations of the ASO test (deepsig's default; ~1-3 min per direction on CPU)")
    p.add_argument("--runs", default="runs", help="store root of the attribution runs")
    p.add_argument("--out", default=None, help="results folder (default docs/results/<base name>)")
    # where the attribution runs compute: jobs.attribute's own flags (jobs/config.py Execution), e.g. --executor local
    add_arguments(p.add_argument_group("execution of the attribution runs (as in jobs.attribute)"), Execution)
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in args.stages if s not in STAGES]
    if bad:
        p.error(f"unknown stage(s) {', '.join(bad)}; valid: {', '.join(STAGES)}")
    try:
        args.steps_grid = sorted({int(x) for x in args.steps_grid.split(",")})
    except ValueError:
        p.error(f"--steps-grid must be comma-separated integers, got {args.steps_grid!r}")
    return args


def main(args: argparse.Namespace) -> dict[str, Any]:
    import polars as pl

    t0 = time.perf_counter()
    out = Path(args.out or Path("docs") / "results" / base_name(args.base))
    writable_folder(out, f"--out {out}", create=True)  # before any model loads
    paths = model_paths(args)
    needed = {"table1": VARIANTS, "agreement": ("tuned", "exact"), "figures": ("exact",)}
    require_models(paths, tuple(sorted({v for s in args.stages for v in needed[s]})))
    attributed = {s for s in args.stages if s != "table1"}
    require_models(paths, tuple(sorted({v for s in attributed for v in needed[s]})), (args.checkpoint,))
    # the folders the attribution stages use: the chosen epoch of each trained model (the noise floor's too)
    models = {name: checkpoint_path(path, args.checkpoint) for name, path in paths.items() if name != "shelf"}
    models = {name: path for name, path in models.items() if name in VARIANTS or is_model(path)}
    summary_path = out / "summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.update(base=str(args.base), models=paths, split=args.split, sample=args.sample, seed=args.seed,
                   max_error=args.max_error, checkpoint=args.checkpoint)  # fmt: skip
    summary.setdefault("commands", {})

    def save(*keys: str) -> None:
        """Write `keys` of summary (and the run settings, and commands) into summary.json as it is on disk now,
        so that two invocations on one --out (say table1 beside a long agreement run) keep each other's results."""
        disk = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        for key in (*SETTINGS, *keys):
            if key in summary:
                disk[key] = summary[key]
        disk["commands"] = {**disk.get("commands", {}), **summary["commands"]}
        tmp = summary_path.with_name(f".{summary_path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(disk, indent=1, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, summary_path)
        summary.update(disk)

    if "table1" in args.stages:
        t = time.perf_counter()
        df, test = table1(paths, args.split, args.aso_iterations)
        print(write_table(df, out, "table1", f"Table 1: Spearman x 100, STS-B {args.split}"), flush=True)
        summary["table1"] = {"rows": df.to_dicts(), "aso": test, "seconds": time.perf_counter() - t}
        summary["commands"]["table1"] = args.command
        print(json.dumps(test, indent=1), flush=True)
        save("table1")

    if "agreement" in args.stages or "figures" in args.stages:
        a, b, _, _ = stsb(args.split, args.sample, args.seed)
        pilot = list(zip(a, b))[: args.pilot_pairs]
        from xsbert_core import Explainer, load_model

        n_layers = Explainer(load_model(models["exact"]), layer=0, steps=1).split.n_layers
        summary["n_layers"] = n_layers
        # "all": the deepest layer first, the cheapest to attribute (and the paper's), so an interrupted
        # evaluation has those; a rerun reuses every layer recorded in summary.json.
        layers = list(range(n_layers))[::-1] if args.layers == "all" else [int(x) for x in args.layers.split(",")]
        fig_layer = args.fig_layer % n_layers
        records = {int(k): v for k, v in summary.get("layers", {}).items()}

        def run_layer(layer: int) -> dict:
            rec = records.get(layer)
            if rec is not None and any(rec.get("models", {}).get(n) != models[n] for n in ("tuned", "exact")):
                rec = None  # recorded with other model folders (another checkpoint, an earlier training): redo
            missing = rec is None or any(n in models and n not in rec["runs"] for n in ("tuned2", "exact2"))
            if missing:
                records[layer] = layer_runs(models, layer, args, pilot, rec)
                summary["layers"] = {str(k): v for k, v in sorted(records.items())}
                save("n_layers", "layers")
            return records[layer]

        if "agreement" in args.stages:
            frames = []
            for layer in layers:
                run_layer(layer)
            for layer in sorted(records):  # the requested layers and those recorded by earlier invocations
                for df in agreement_frames(records[layer]):
                    frames.append(df)
                    rho = df.filter(pl.col("score_bin") == "all", ~pl.col("include_special"))["spearman_mean"][0]
                    shown = "undefined (no pair with a correlation)" if rho is None else f"{rho:.3f}"
                    print(f"layer {layer}, {df['comparison'][0]}: N={df['steps'][0]}, mean |error| <= "
                          f"{df['max_mean_abs_error'][0]:.1e}, spearman {shown}", flush=True)  # fmt: skip
            first = ["layer", "comparison", "steps", "max_mean_abs_error"]
            agreement = pl.concat(frames).select([*first, *(c for c in frames[0].columns if c not in first)])
            write_table(agreement, out, "agreement", "Agreement by layer and score bin: exact vs approximate (tuned), "
                        "and the noise floor (the same recipe trained with another seed)")
            summary["commands"]["agreement"] = args.command
            save()

        if "figures" in args.stages:
            rec = run_layer(fig_layer)
            shelf = summary.get("shelf_run")
            if not shelf or shelf.get("layer") != fig_layer or shelf.get("steps") != rec["steps"]:
                s = attribute(paths["shelf"], fig_layer, rec["steps"], args)
                shelf = {"layer": fig_layer, "steps": rec["steps"], "run_dir": s["run_dir"], "command": s["command"],
                         "mean_abs_completeness_error": s["mean_abs_completeness_error"]}  # fmt: skip
                summary["shelf_run"] = shelf
                save("shelf_run")
            runs = {"shelf": shelf["run_dir"], "exact": rec["runs"]["exact"]["run_dir"]}
            # Each on the pairs both runs hold: a store is found by its settings, not its sample, so a later
            # `jobs.attribute` with the same settings and more pairs (all 1,379) adds them to the same run.
            other = {"shelf": runs["exact"], "exact": runs["shelf"]}
            terms, sums = (pl.concat([sql_file(name, r, pairs_of=other[n]).with_columns(pl.lit(n).alias("model"))
                                      for n, r in runs.items()])
                           for name in ("reference_terms", "pos_neg_sums"))  # fmt: skip
            write_table(terms.select(["model", *terms.columns[:-1]]), out, "reference_terms",
                        f"Reference terms (Fig 2), layer {fig_layer}")  # fmt: skip
            write_table(sums.select(["model", *sums.columns[:-1]]), out, "pos_neg_sums",
                        f"Positive / negative sums (Fig 5), layer {fig_layer}")  # fmt: skip
            summary["figures"] = {"layer": fig_layer, "runs": runs}
            summary["commands"]["figures"] = args.command
            save("figures")

    if {"agreement", "figures"} & set(args.stages):
        written = plot_all(out, summary)
        summary["plots"] = sorted({*summary.get("plots", []), *(str(p) for p in written)})
        save("plots")
    summary.setdefault("seconds", {})[",".join(args.stages)] = time.perf_counter() - t0
    save("seconds")
    print(f"results: {out}", flush=True)
    return summary


def cli(argv: list[str] | None = None) -> int:
    quiet_console()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.command = "python -m jobs.evaluate " + " ".join(shlex.quote(a) for a in argv)
    return exit_status("jobs.evaluate", lambda: main(args),
                       interrupted="the results saved in summary.json stay; the same command reuses them")


if __name__ == "__main__":
    sys.exit(cli())
