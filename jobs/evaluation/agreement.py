"""The agreement stage's runs: tuned (approximate) and exact attributions of one seeded STS-B sample per layer through
jobs.attribute, N chosen per layer on a pilot, and sql/agreement.sql over each comparison (exact vs tuned, and the
noise floor's tuned vs tuned', exact vs exact')."""

from __future__ import annotations

import argparse
import logging
import shlex
from typing import TYPE_CHECKING, Any

import numpy as np

from xsbert_core.settings import from_namespace

from ..config import Attribution, Execution, JobSettings, Output, Selection

if TYPE_CHECKING:
    import polars as pl

logger = logging.getLogger("jobs.evaluate")

# The comparisons of the agreement stage: (label, run, run2) by the names of layer_runs' runs; the noise floor's
# are there only where the second-seed models are.
COMPARISONS = (("exact vs tuned", "exact", "tuned"), ("tuned vs tuned'", "tuned", "tuned2"),
               ("exact vs exact'", "exact", "exact2"))


def pilot_errors(model_path: str, layer: int, pairs: list[tuple[str, str]], grid: list[int], bound: float) -> dict:
    """Mean |completeness error| over `pairs` for N in grid, ascending, until it is <= bound."""
    from xsbert_core import Explainer, load_model

    model = load_model(model_path)
    out: dict[int, float] = {}
    for n in grid:
        ex = Explainer(model, layer=layer, steps=n)
        out[n] = float(np.mean([abs(r.error) for r in ex.explain_pairs(pairs)]))
        if out[n] <= bound:
            break
    return out


def attribute(model: str, layer: int, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    """One jobs.attribute run (fixed N = steps) on the seeded STS-B sample; its summary (run_dir, errors, timings)."""
    from .. import attribute as job

    settings = JobSettings(
        selection=Selection(dataset="stsb", split=args.split, sample=args.sample, seed=args.seed),
        attribution=Attribution(model=model, layer=layer, steps=steps, tolerance=None),
        execution=Execution(**from_namespace(args, Execution)),
        output=Output(out=args.runs, quiet=bool(args.quiet)),
    )
    summary = job.main(settings)
    summary["command"] = "python -m jobs.attribute " + shlex.join(settings.command())
    return summary


def sql_file(name: str, run: str, run2: str | None = None, **variables: Any) -> pl.DataFrame:
    from ..sqlrun import connect, run_file

    con = connect(run, run2, variables or None)
    try:
        return run_file(con, f"{name}.sql")
    finally:
        con.close()


def _run_record(summary: dict[str, Any]) -> dict[str, Any]:
    keys = ("run_dir", "run_id", "n_done", "n_quarantined", "mean_abs_completeness_error", "max_abs_completeness_error",
            "wall_s", "command")  # fmt: skip
    return {k: summary[k] for k in keys}


def layer_runs(models: dict[str, str], layer: int, args: argparse.Namespace, pilot: list[tuple[str, str]],
               record: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """tuned (approx) and exact runs at `layer`, N chosen as jobs.evaluate's agreement stage says (unless `record`
    holds them already); then the second seed's models (tuned2, exact2: the noise floor), where `models` has them, at
    the same N."""
    if record is None:
        record = {"layer": layer, "pilot": {}, "models": {}}
        chosen = []
        for name in ("tuned", "exact"):
            errs = pilot_errors(models[name], layer, pilot, args.steps_grid, args.max_error / 2)
            record["pilot"][name] = {str(n): e for n, e in errs.items()}
            chosen.append(next((n for n, e in errs.items() if e <= args.max_error / 2), max(args.steps_grid)))
        steps = max(chosen)
        while True:
            runs = {name: attribute(models[name], layer, steps, args) for name in ("tuned", "exact")}
            worst = max(r["mean_abs_completeness_error"] for r in runs.values())
            if worst <= args.max_error or steps >= 4 * max(args.steps_grid):
                break
            logger.warning("layer %d: mean |error| %.2e > %.0e at N=%d; doubling N", layer, worst, args.max_error, steps)
            steps *= 2
        record.update(steps=steps, runs={name: _run_record(r) for name, r in runs.items()},
                      models={name: models[name] for name in runs})  # fmt: skip
    for name in ("tuned2", "exact2"):
        if name in models and name not in record["runs"]:
            run = attribute(models[name], layer, record["steps"], args)
            record["runs"][name] = _run_record(run)
            record["models"][name] = models[name]
            if run["mean_abs_completeness_error"] > args.max_error:
                logger.warning("layer %d: %s's mean |error| %.2e > %.0e at the layer's N=%d", layer, name,
                               run["mean_abs_completeness_error"], args.max_error, record["steps"])  # fmt: skip
    return record


def agreement_frames(rec: dict[str, Any]) -> list[pl.DataFrame]:
    """sql/agreement.sql for each comparison whose two runs the layer has, content tokens (our default; the paper
    states no token set) and every cell, with the comparison, layer, N and the larger mean |completeness error| of its
    two runs."""
    import polars as pl

    frames, recorded = [], rec.get("runs", {})
    for label, first, second in COMPARISONS:
        if first not in recorded or second not in recorded:
            continue
        runs = recorded[first], recorded[second]
        df = pl.concat([sql_file("agreement", runs[0]["run_dir"], runs[1]["run_dir"], include_special=special)
                        for special in (False, True)])  # fmt: skip
        worst = max(r["mean_abs_completeness_error"] for r in runs)
        frames.append(df.with_columns(pl.lit(rec["layer"]).alias("layer"), pl.lit(label).alias("comparison"),
                                      pl.lit(rec["steps"]).alias("steps"), pl.lit(worst).alias("max_mean_abs_error")))
    return frames
