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
import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xsbert_core import InputError
from xsbert_core.cli import writable_folder
from xsbert_core.errors import CommandParser, exit_status
from xsbert_core.metrics import aso_both_ways, pearson, spearman
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.settings import DEFAULT_LAYER, add_arguments, from_namespace
from xsbert_core.training import CHECKPOINTS, checkpoint_folder

from . import paper
from .attribution.validate import load_pairs, validate
from .config import Attribution, Execution, JobSettings, Output, Selection
from .console import quiet_console

if TYPE_CHECKING:
    import polars as pl

logger = logging.getLogger("jobs.evaluate")

STAGES = ("table1", "agreement", "figures")
VARIANTS = ("tuned", "exact", "orig")
SECOND_SEED = ("tuned2", "exact2")  # the noise floor's models: one recipe, another seed
LABEL_MAX = 5.0
# The paper's figures for all-mpnet-base-v2 (jobs/paper.py, the one table of them), shown beside ours.
PAPER_TABLE1 = {v: paper.get(f"table1_{v}").value for v in ("shelf", *VARIANTS)}
# Fig 3/4 points: label -> (layers below mpnet's last, value), drawn as many layers below our last.
_FIG3, _FIG4_L11, _FIG4_L8 = (paper.get(k) for k in ("fig3_spearman_top", "fig4_jaccard_top10_l11",
                                                     "fig4_jaccard_top10_l8"))  # fmt: skip
_FIG2_NEAR, _FIG2_BELOW = paper.get("fig2_ref_sim_near_zero"), paper.get("fig2_ref_term_below")
PAPER_FIG3 = {f"paper (§4.4): mpnet exact vs tuned, L11 (\"layer eleven\"), s>0.75: {_FIG3.value:.2f}":
              (0, _FIG3.value)}
PAPER_FIG4 = {f"paper (§4.4): mpnet, L11, top-10, s>0.5: {_FIG4_L11.value:.2f}": (0, _FIG4_L11.value),
              f"paper (§4.4): mpnet, L8 (3 below L11), top-10, s>0.5: {_FIG4_L8.value:.2f}": (3, _FIG4_L8.value)}
# The paper's Fig 4 values are for pairs of mean score s > 0.5 (paper.FIG4_SCORE_ABOVE): ours are drawn on the same
# subset.
DEFAULT_STEPS_GRID = (4, 8, 16, 32, 64, 128)
# jobs.train saves both epochs; the last is the model (App. A states no checkpoint rule), the best-dev one is ours.
DEFAULT_CHECKPOINT = CHECKPOINTS[0]
# The comparisons of the agreement stage: (label, run, run2) by the names of layer_runs' runs; the noise floor's
# are there only where the second-seed models are.
COMPARISONS = (("exact vs tuned", "exact", "tuned"), ("tuned vs tuned'", "tuned", "tuned2"),
               ("exact vs exact'", "exact", "exact2"))
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


def base_name(base: str) -> str:
    return Path(str(base)).name or str(base)


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
    missing = [f"{v} ({' or '.join(checkpoint_path(paths[v], c) for c in checkpoints)})" for v in needed
               if not any(is_model(checkpoint_path(paths[v], c)) for c in checkpoints)]  # fmt: skip
    if missing:
        hint = ("; models trained before jobs.train kept the best dev epoch have only the last one: "
                "--checkpoint last-epoch" if checkpoints == ("best-dev",) else "")  # fmt: skip
        raise InputError(
            f"model folder(s) not found: {', '.join(missing)}; train them first: "
            + " && ".join(f"python -m jobs.train --variant {v}" for v in VARIANTS) + hint
        )


def stsb(split: str, sample: int | None = None, seed: int = 0) -> tuple[list[str], list[str], np.ndarray, list[str]]:
    pairs = load_pairs("stsb", split=split, sample=sample, seed=seed)
    good, _ = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    return good.text_a.tolist(), good.text_b.tolist(), good.label.to_numpy(), good.pair_id.tolist()


# --------------------------------------------------------------------------- Table 1
def predictions(path: str, texts_a: list[str], texts_b: list[str]) -> dict[str, np.ndarray]:
    """Each pair's predicted similarity by the model (its shift included): {"cos": cosine, own: its own similarity
    function's, when that is not cosine (the orig variant's dot product)}."""
    import torch

    from xsbert_core import load_model
    from xsbert_core.explainer import model_similarity

    model = load_model(path, device="cuda" if torch.cuda.is_available() else "cpu", attn_implementation=None)
    unique = list(dict.fromkeys(texts_a + texts_b))
    emb = model.encode(unique, batch_size=64, convert_to_tensor=True, show_progress_bar=False)
    index = {t: k for k, t in enumerate(unique)}
    ea, eb = emb[[index[t] for t in texts_a]], emb[[index[t] for t in texts_b]]
    scores = {"cos": torch.nn.functional.cosine_similarity(ea, eb, dim=-1).double().cpu().numpy()}
    own = model_similarity(model)
    if own != "cos":
        scores[own] = model.similarity_pairwise(ea, eb).double().cpu().numpy()
    return scores


def table1_rows(paths: dict[str, str], split: str, sample: int | None = None
                ) -> tuple[list[dict[str, Any]], dict[tuple[str, str], np.ndarray], dict[str, Any]]:  # fmt: skip
    """Table 1 without polars: (rows as `table1` describes them, each model's squared errors of cosine by (model,
    checkpoint), {"pair_id", "label", "predictions": {"<model>/<checkpoint>/<similarity>": per pair}})."""
    a, b, gold, pair_ids = stsb(split, sample)
    rows, errors = [], {}
    per_pair: dict[str, Any] = {"pair_id": list(pair_ids), "label": gold.tolist(), "predictions": {}}
    for name, path in paths.items():
        if name not in ("shelf", *VARIANTS, *SECOND_SEED):
            continue
        for checkpoint in ("-",) if name == "shelf" else CHECKPOINTS:
            folder = path if name == "shelf" else checkpoint_path(path, checkpoint)
            if name != "shelf" and not is_model(folder):
                continue
            for sim, pred in predictions(folder, a, b).items():
                per_pair["predictions"][f"{name}/{checkpoint}/{sim}"] = pred.tolist()
                if sim == "cos":
                    errors[name, checkpoint] = (pred - gold / LABEL_MAX) ** 2
                shown = sim == "cos" and checkpoint in ("-", DEFAULT_CHECKPOINT)
                rows.append({"model": name, "checkpoint": checkpoint, "similarity": sim, "path": folder,
                             "n_pairs": len(gold), "spearman_x100": 100 * spearman(pred, gold),
                             "pearson_x100": 100 * pearson(pred, gold),
                             "mse": float(((pred - gold / LABEL_MAX) ** 2).mean()),
                             "paper_spearman_x100": PAPER_TABLE1.get(name) if shown else None})  # fmt: skip
    return rows, errors, per_pair


def aso_tests(errors: dict[tuple[str, str], np.ndarray], aso_iterations: int = 1000) -> dict[str, Any]:
    """The almost-stochastic-order test between tuned and exact on their squared errors, per checkpoint both have
    (App. B: the paper's threshold is epsilon = 0.3; epsilon_min below it says the one is better)."""
    tests: dict[str, Any] = {}
    for checkpoint in CHECKPOINTS:
        if ("tuned", checkpoint) in errors and ("exact", checkpoint) in errors:
            both = aso_both_ways(errors["tuned", checkpoint], errors["exact", checkpoint], confidence_level=0.95,
                                 seed=0, num_bootstrap_iterations=aso_iterations)  # fmt: skip
            tests[checkpoint] = {"test": "almost stochastic order (Dror et al. 2019, deepsig.aso)",
                                 "scores": "squared errors of cosine", "confidence_level": 0.95,
                                 "bootstrap_iterations": aso_iterations, "paper_epsilon": 0.3,
                                 "eps_min_tuned_better": both["eps_a_better"],
                                 "eps_min_exact_better": both["eps_b_better"]}  # fmt: skip
    return tests


def table1(paths: dict[str, str], split: str, aso_iterations: int = 1000,
           sample: int | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:  # fmt: skip
    """One row per model, checkpoint and similarity: Spearman x 100 (and Pearson) of prediction vs gold, cosine
    for every model (the paper's protocol, §4.2) and the model's own similarity beside it where that differs; a
    trained model at its last epoch and, where jobs.train saved it, its best dev epoch (ours). ASO on squared errors
    of tuned vs exact per checkpoint. `paper_spearman_x100` only on rows of cosine at the last epoch (App. A states
    no checkpoint rule; the last epoch is the recipe's model); the paper's model is all-mpnet-base-v2 whatever ours
    is. The second seed's models (tuned2, exact2), where they exist, get rows too: the spread of one recipe over
    seeds, beside tuned vs exact. `sample`: a seeded sample of the split instead of all of it (smoke tests)."""
    import polars as pl

    rows, errors, _ = table1_rows(paths, split, sample)
    return pl.DataFrame(rows), aso_tests(errors, aso_iterations)


# --------------------------------------------------------------------------- attribution runs
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
    from jobs import attribute as job

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
    from .sqlrun import connect, run_file

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
    """tuned (approx) and exact runs at `layer` with N chosen as the module docstring says (unless `record` holds
    them already); then the second seed's models (tuned2, exact2: the noise floor), where `models` has them, at the
    same N."""
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
    """sql/agreement.sql for each comparison whose two runs the layer has, content tokens (the paper's cells) and
    every cell, with the comparison, layer, N and the larger mean |completeness error| of its two runs."""
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


# --------------------------------------------------------------------------- output
def write_table(df: pl.DataFrame, out: Path, name: str, title: str, floats: int = 4) -> str:
    """<name>.csv, <name>.parquet and a Markdown table (returned and written to <name>.md)."""
    df.write_csv(out / f"{name}.csv")
    df.write_parquet(out / f"{name}.parquet")
    cols = df.columns

    def fmt(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.{floats}f}"
        return str(v)

    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.iter_rows()]
    text = "\n".join(lines) + "\n"
    (out / f"{name}.md").write_text(text, encoding="utf-8")
    return text


def _pairs_columns(run: str, columns: list[str], pairs_of: str) -> dict[str, np.ndarray]:
    """The pairs table's `columns` of `run`, on the pairs `pairs_of` (another run) holds too."""
    from .sqlrun import connect

    con = connect(run, variables={"pairs_of": pairs_of})  # the runs checked and read as xsbert sql reads them
    try:
        rows = con.sql(f"select {', '.join(columns)} from pairs where pair_id in "
                       "(select pair_id from read_parquet(getvariable('pairs_of') || '/pairs/*.parquet'))").fetchnumpy()
    finally:
        con.close()
    return {c: np.asarray(rows[c], dtype=float) for c in columns}


def approx_bound_holds(positive_sum: np.ndarray, negative_sum: np.ndarray, bound: float = 2.0) -> bool:
    """Whether the approximate-mode bound f(a, b) + 1 ≤ 2 holds on average: mean ΣA (positive + negative sums, what
    the attributions converge to) ≤ `bound`. Where it does not (the references' embeddings longer than the texts',
    docs/ANALYSES.md pos_neg_sums.sql), Fig 5 draws no line at 2 and gives no share above it."""
    return bool(np.mean(np.asarray(positive_sum) + np.asarray(negative_sum)) <= bound)


def _counts(values: list[int]) -> str:
    """'300', or '188–196' where the comparisons' counts differ."""
    return str(values[0]) if len(values) == 1 else f"{min(values)}–{max(values)}"


def _pooled_above(bins: pl.DataFrame, low: float, layers: list[int]) -> dict[str, np.ndarray]:
    """Per layer, the Jaccard means and sample stds of the pairs with mean score above `low`, pooled exactly from
    agreement.sql's bins above it (jobs.analyses.agreement.pool: the bins' counts, means and stds give the pooled ones)."""
    import polars as pl

    from .analyses.agreement import pool as _pool

    out: dict[str, list] = {"n_pairs": [], "jaccard_top3_mean": [], "jaccard_top3_std": [], "jaccard_top10_mean": [],
                            "jaccard_top10_std": []}  # fmt: skip
    for layer in layers:
        rows = bins.filter(pl.col("layer") == layer, pl.col("score_bin") != "all",
                           pl.col("bin_low") >= low - 1e-9).to_dicts()  # fmt: skip
        out["n_pairs"].append(sum(r["n_pairs"] or 0 for r in rows))
        for stat in ("jaccard_top3", "jaccard_top10"):
            mean, std, _ = _pool(rows, "n_pairs", stat)
            out[f"{stat}_mean"].append(np.nan if mean is None else mean)
            out[f"{stat}_std"].append(np.nan if std is None else std)
    return {k: (np.asarray(v) if k != "n_pairs" else v) for k, v in out.items()}


def plot_all(out: Path, summary: dict[str, Any]) -> list[Path]:
    """Fig 2-5 as PNG from what the stages wrote (agreement.parquet, the runs of summary['figures'])."""
    import polars as pl

    from xsbert_core.plots import plot_by_layer, plot_histograms

    written: list[Path] = []
    if (out / "agreement.parquet").exists():
        ag = pl.read_parquet(out / "agreement.parquet").sort("layer")
        noise: dict[str, pl.DataFrame] = {}
        noise_bins: dict[str, pl.DataFrame] = {}
        if "comparison" in ag.columns:  # the noise floor's comparisons drawn beside exact vs approximate
            for label in ag["comparison"].unique(maintain_order=True).to_list():
                if label != COMPARISONS[0][0]:
                    noise_bins[label] = ag.filter(pl.col("comparison") == label, ~pl.col("include_special"))
                    noise[label] = noise_bins[label].filter(pl.col("score_bin") == "all")
            ag = ag.filter(pl.col("comparison") == COMPARISONS[0][0])
        every = None
        if "include_special" in ag.columns:  # content tokens drawn, every cell's Spearman beside them
            every = ag.filter(pl.col("include_special"), pl.col("score_bin") == "all")
            ag = ag.filter(~pl.col("include_special"))
        overall = ag.filter(pl.col("score_bin") == "all")
        layers = overall["layer"].to_list()
        top = ag.filter(pl.col("bin_low") == paper.TOP_SCORE)
        n_layers = int(summary.get("n_layers") or (max(layers) + 1))
        model = base_name(str(summary.get("base") or "model"))
        span = (f"layers {min(layers)}–{max(layers)} of {n_layers}" if len(layers) > 1
                else f"layer {layers[0]} of {n_layers}")  # fmt: skip
        n_all = sorted(set(overall["n_pairs"].to_list()))
        n_top = sorted(set(top["n_pairs"].to_list()))

        def below_last(points: dict[str, tuple[int, float]]) -> dict[str, tuple[float, float]]:
            return {label: (n_layers - 1 - below, value) for label, (below, value) in points.items()}

        series = {"Spearman, all pairs": (overall["spearman_mean"].to_numpy(), overall["spearman_std"].to_numpy()),
                  "Pearson, all pairs": (overall["pearson_mean"].to_numpy(), None)}  # fmt: skip
        if top.height == len(layers):
            series["Spearman, mean score in (0.75, 1]"] = (top["spearman_mean"].to_numpy(), None)
        if every is not None and every.height == len(layers):
            series["Spearman, all pairs, every cell (special tokens in)"] = (every["spearman_mean"].to_numpy(), None)
        # a noise-floor series is drawn where it has every layer of the exact-vs-approximate one
        noise = {label: df for label, df in noise.items() if df["layer"].to_list() == layers}
        also = "\ndashed: one recipe trained with two seeds (the noise floor)" if noise else ""
        for label, df in noise.items():
            series[f"Spearman, all pairs, {label} (noise floor)"] = (df["spearman_mean"].to_numpy(), None)
        tokens = "content tokens" if "include_special" in ag.columns else "token cells"
        written.append(plot_by_layer(layers, series, out / "fig3_agreement_correlation.png",
                                     f"{model}, exact vs tuned (approximate), {span}\nrank correlation per pair{also}",
                                     f"correlation of token cells ({tokens})",
                                     reference=below_last(PAPER_FIG3), bounds=(-1.0, 1.0),
                                     dashed=tuple(k for k in series if "noise floor" in k),
                                     note=f"n = {_counts(n_all)} pairs per layer; mean score in (0.75, 1]: "
                                          f"{_counts(n_top)}; the paper's star: mpnet, another model and depth"))
        # fmt: skip
        # Fig 4 on the paper's subset, s > 0.5 (pooled exactly from the score bins above 0.5)
        above = {label: _pooled_above(df_all, paper.FIG4_SCORE_ABOVE, layers) for label, df_all in
                 [("exact vs tuned", ag)] + [(lab, frame) for lab, frame in noise_bins.items()]}  # fmt: skip
        main = above["exact vs tuned"]
        jac = {"top-3 Jaccard, s > 0.5": (main["jaccard_top3_mean"], main["jaccard_top3_std"]),
               "top-10 Jaccard, s > 0.5": (main["jaccard_top10_mean"], main["jaccard_top10_std"])}
        for label in noise:
            if label in above:
                jac[f"top-3, {label} (noise floor)"] = (above[label]["jaccard_top3_mean"], None)
                jac[f"top-10, {label} (noise floor)"] = (above[label]["jaccard_top10_mean"], None)
        n_above = ", ".join(f"{label} {_counts(sorted(set(v['n_pairs'])))}" for label, v in above.items())
        written.append(plot_by_layer(layers, jac, out / "fig4_agreement_jaccard.png",
                                     f"{model}, exact vs tuned (approximate), {span}\ntop-k token pairs shared, "
                                     f"pairs of mean score s > 0.5{also}",
                                     f"Jaccard index ({tokens}, top-k by |value|)",
                                     reference=below_last(PAPER_FIG4), bounds=(0.0, 1.0),
                                     dashed=tuple(k for k in jac if "noise floor" in k),
                                     note=f"n (s > 0.5) per layer: {n_above}"))  # fmt: skip
    fig = summary.get("figures")
    if fig:
        shelf = _pairs_columns(fig["runs"]["shelf"], ["ref_sim_a", "ref_sim_b", "ref_term", "positive_sum",
                                                      "negative_sum"], fig["runs"]["exact"])  # fmt: skip
        exact = _pairs_columns(fig["runs"]["exact"], ["positive_sum", "negative_sum"], fig["runs"]["shelf"])
        sims = np.concatenate([shelf["ref_sim_a"], shelf["ref_sim_b"]])
        near = float(np.mean(np.abs(sims) <= 0.1))
        below = float(np.mean(shelf["ref_term"] < 0.9))
        model_name, n_fig = base_name(str(summary.get("base") or "model")), len(shelf["ref_term"])
        written.append(plot_histograms(
            {"f(a, r_b) and f(b, r_a)": sims, "f(r_a, r_b)": shelf["ref_term"]},
            out / "fig2_reference_terms.png",
            f"{model_name} shelf: reference terms (no layer: forward quantities), n = {n_fig} pairs", "cosine",
            vlines={"-0.1": -0.1, "+0.1": 0.1, "0.9": 0.9},
            note=f"{near:.1%} of reference similarities within ±0.1 (paper {_FIG2_NEAR.text})\n"
                 f"{below:.1%} of reference terms < 0.9 (paper {_FIG2_BELOW.text})"))  # fmt: skip
        # 2 bounds the approximate sums only where ΣA converges below it: where the run's mean ΣA is above 2 (the
        # references' norms, docs/ANALYSES.md pos_neg_sums.sql), no "max approx" line is drawn
        mean_target = float(np.mean(shelf["positive_sum"] + shelf["negative_sum"]))
        bound_holds = approx_bound_holds(shelf["positive_sum"], shelf["negative_sum"])
        lines = {"max exact (1)": 1.0} | ({"max approx (2)": 2.0} if bound_holds else {})
        shelf_share = (f"shelf {np.mean(shelf['positive_sum'] > 2):.1%} (> 2)" if bound_holds else
                       f"shelf: no share (mean ΣA {mean_target:.2f} > 2: 2 is no bound for this model)")
        written.append(plot_histograms(
            {"shelf (approx): positive sum": shelf["positive_sum"], "exact: positive sum": exact["positive_sum"],
             "shelf (approx): negative sum": shelf["negative_sum"], "exact: negative sum": exact["negative_sum"]},
            out / "fig5_pos_neg_sums.png",
            f"{model_name}, shelf and exact, layer {fig['layer']}: positive and negative sums (n = {n_fig} pairs)",
            "sum of positive / negative cells", vlines=lines,
            note=f"positive sum > max score: {shelf_share}, exact {np.mean(exact['positive_sum'] > 1):.1%} (> 1)"))
        # fmt: skip
    return written


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
