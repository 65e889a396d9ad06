"""An evaluation from start to end (python -m jobs.evaluate): its stages in order (Table 1, the agreement runs layer by
layer, the figures' runs), each saving what it found into <out>/summary.json as it ends, so that an interrupted
evaluation keeps it and the same command reuses it."""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xsbert_core.cli import writable_folder
from xsbert_core.training import VARIANTS, base_name

from ..processes import waiting_lock
from .agreement import agreement_frames, attribute, layer_runs, sql_file
from .figures import plot_all, write_table
from .inputs import checkpoint_path, is_model, model_paths, require_models, stsb
from .table1 import table1

# The models each stage reads.
NEEDS = {"table1": VARIANTS, "agreement": ("tuned", "exact"), "figures": ("exact",)}
# What summary.json records of an invocation's settings (each save writes them with its results).
SETTINGS = ("base", "models", "split", "sample", "seed", "max_error", "checkpoint")
# Where an evaluation's results go without --out: <RESULTS_DIR>/<base name>.
RESULTS_DIR = "docs/results"


class Summary:
    """<out>/summary.json: what an evaluation has found so far (`data`), read at the start and saved after each stage.
    Two invocations on one --out (say table1 beside a long agreement run) keep each other's results: a save writes
    its own keys, the settings and the commands into the file as it is on disk then, atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("commands", {})

    def save(self, *keys: str) -> None:
        """Merge this invocation's `keys` (and the settings, commands) into the file as it is on disk, under a lock
        (.summary.json.lock beside it) so that another invocation's save between the read and the write is not
        lost."""
        with waiting_lock(self.path.with_name(f".{self.path.name}.lock")):
            disk = json.loads(self.path.read_text()) if self.path.exists() else {}
            for key in (*SETTINGS, *keys):
                if key in self.data:
                    disk[key] = self.data[key]
            disk["commands"] = {**disk.get("commands", {}), **self.data["commands"]}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(disk, indent=1, default=str) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        self.data.update(disk)


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Run `args.stages` (jobs.evaluate's flags) into `args.out`; returns summary.json's contents."""
    t0 = time.perf_counter()
    out = Path(args.out or Path(RESULTS_DIR) / base_name(args.base))
    writable_folder(out, f"--out {out}")  # before the models are looked for; made once they are found
    paths = model_paths(args)
    require_models(paths, tuple(sorted({v for s in args.stages for v in NEEDS[s]})))
    attributed = {s for s in args.stages if s != "table1"}
    require_models(paths, tuple(sorted({v for s in attributed for v in NEEDS[s]})), (args.checkpoint,))
    writable_folder(out, f"--out {out}", create=True)  # before any model loads
    # the folders the attribution stages use: the chosen epoch of each trained model (the noise floor's too)
    models = {name: checkpoint_path(path, args.checkpoint) for name, path in paths.items() if name != "shelf"}
    models = {name: path for name, path in models.items() if name in VARIANTS or is_model(path)}
    # the layers' range is the model's: said before Table 1 and the runs, not after them
    plan = layer_plan(args, models["exact"]) if attributed else None
    summary = Summary(out / "summary.json")
    summary.data.update(base=str(args.base), models=paths, split=args.split, sample=args.sample, seed=args.seed,
                        max_error=args.max_error, checkpoint=args.checkpoint)  # fmt: skip
    if "table1" in args.stages:
        table1_stage(args, paths, out, summary)
    if plan is not None:
        attribution_stages(args, paths, models, out, summary, plan)
        written = plot_all(out, summary.data)
        summary.data["plots"] = sorted({*summary.data.get("plots", []), *(str(p) for p in written)})
        summary.save("plots")
    summary.data.setdefault("seconds", {})[",".join(args.stages)] = time.perf_counter() - t0
    summary.save("seconds")
    print(f"results: {out}", flush=True)
    return summary.data


def table1_stage(args: argparse.Namespace, paths: dict[str, str], out: Path, summary: Summary) -> None:
    """Table 1 with the ASO test (table1.py), written as a table and into summary.json."""
    t = time.perf_counter()
    df, test = table1(paths, args.split, args.aso_iterations)
    print(write_table(df, out, "table1", f"Table 1: Spearman x 100, STS-B {args.split}"), flush=True)
    summary.data["table1"] = {"rows": df.to_dicts(), "aso": test, "seconds": time.perf_counter() - t}
    summary.data["commands"]["table1"] = args.command
    print(json.dumps(test, indent=1), flush=True)
    summary.save("table1")


@dataclass(frozen=True)
class LayerPlan:
    """The attribution stages' layers, resolved against the exact model's `n_layers` (0..n_layers - 1): the agreement
    stage's in the order they are run, and the figures' runs' one."""

    n_layers: int
    layers: list[int]
    fig_layer: int


def layer_plan(args: argparse.Namespace, exact: str) -> LayerPlan:
    """The layers of --layers (agreement stage) and --fig-layer (figures stage), checked against the exact model's
    layer count (the model is loaded for it); a flag whose stage is not run is not checked."""
    from xsbert_core import Explainer, load_model
    from xsbert_core.split import resolve_layer  # here: the engine (torch) loads where a job runs, not for --help

    n_layers = Explainer(load_model(exact), layer=0, steps=1).split.n_layers
    # "all": the deepest layer first, the cheapest to attribute (and the paper's), so an interrupted
    # evaluation has those; a rerun reuses every layer recorded in summary.json.
    layers = list(range(n_layers))[::-1] if args.layers == "all" else args.layers
    if "agreement" in args.stages:
        layers = list(dict.fromkeys(resolve_layer(x, n_layers, "--layers: layer") for x in layers))
    fig_layer = resolve_layer(args.fig_layer, n_layers, "--fig-layer") if "figures" in args.stages else args.fig_layer
    return LayerPlan(n_layers, layers, fig_layer)


def attribution_stages(args: argparse.Namespace, paths: dict[str, str], models: dict[str, str], out: Path,
                       summary: Summary, plan: LayerPlan) -> None:  # fmt: skip
    """The agreement stage (every layer of `plan`'s runs, then the agreement table) and the figures' runs (shelf and
    exact at its fig_layer, Fig 2 and Fig 5's tables); a layer recorded in summary.json with the same models is
    reused."""
    import polars as pl

    a, b, _, _ = stsb(args.split, args.sample, args.seed)
    pilot = list(zip(a, b))[: args.pilot_pairs]
    summary.data["n_layers"] = plan.n_layers
    layers, fig_layer = plan.layers, plan.fig_layer
    records = {int(k): v for k, v in summary.data.get("layers", {}).items()}

    def run_layer(layer: int) -> dict:
        rec = records.get(layer)
        if rec is not None and any(rec.get("models", {}).get(n) != models[n] for n in ("tuned", "exact")):
            rec = None  # recorded with other model folders (another checkpoint, an earlier training): redo
        missing = rec is None or any(n in models and n not in rec["runs"] for n in ("tuned2", "exact2"))
        if missing:
            records[layer] = layer_runs(models, layer, args, pilot, rec)
            summary.data["layers"] = {str(k): v for k, v in sorted(records.items())}
            summary.save("n_layers", "layers")
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
        summary.data["commands"]["agreement"] = args.command
        summary.save()

    if "figures" in args.stages:
        rec = run_layer(fig_layer)
        shelf = summary.data.get("shelf_run")
        if not shelf or shelf.get("layer") != fig_layer or shelf.get("steps") != rec["steps"]:
            s = attribute(paths["shelf"], fig_layer, rec["steps"], args)
            shelf = {"layer": fig_layer, "steps": rec["steps"], "run_dir": s["run_dir"], "command": s["command"],
                     "mean_abs_completeness_error": s["mean_abs_completeness_error"]}  # fmt: skip
            summary.data["shelf_run"] = shelf
            summary.save("shelf_run")
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
        summary.data["figures"] = {"layer": fig_layer, "runs": runs}
        summary.data["commands"]["figures"] = args.command
        summary.save("figures")
