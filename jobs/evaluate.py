"""Evaluate the paper's model variants: Table 1 with significance, exact-vs-approximate agreement at every
layer, reference terms and positive/negative sums (EACL 2024: Table 1, Fig 2-5).

    python -m jobs.train --variant tuned && python -m jobs.train --variant exact && python -m jobs.train --variant orig
    python -m jobs.evaluate                                    # all stages, all layers, 300 STS-B test pairs
    python -m jobs.evaluate --stages table1                    # only Table 1 (seconds)
    python -m jobs.evaluate --layers 3,4,5 --sample 1379       # agreement at three layers on all test pairs

Stages:
  table1     Spearman x 100 of each model's predicted similarity vs gold on STS-B test (all pairs), for
             shelf (the base model), tuned, exact, orig; the almost-stochastic-order test (Dror et al. 2019,
             deepsig) on squared errors (prediction - label/5)^2 between tuned and exact, both directions.
  agreement  the same seeded sample of STS-B test pairs attributed by `tuned` (approx mode) and `exact`
             (exact mode) through jobs.attribute at every requested layer; per layer N is the smallest of
             --steps-grid whose mean |completeness error| on --pilot-pairs pairs is <= --max-error / 2 for
             both models, then checked on the full runs (N doubles until their mean is <= --max-error);
             agreement by score bin from sql/agreement.sql.
  figures    shelf (approx) and exact runs at --fig-layer: sql/reference_terms.sql (Fig 2) and
             sql/pos_neg_sums.sql (Fig 5); plots of Fig 2-5.
Everything lands in --out: Markdown, CSV and Parquet tables, PNG figures, summary.json (commands, N per
layer, run directories, timings).
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
from typing import Any

import numpy as np
import polars as pl

from xsbert_core import Explainer, InputError, XsbertError, load_model
from xsbert_core.explainer import DEFAULT_LAYER, model_similarity
from xsbert_core.metrics import aso_both_ways, pearson, spearman
from xsbert_core.models import DEFAULT_MODEL

from . import paper
from ._inputs import load_pairs, validate

logger = logging.getLogger("jobs.evaluate")

STAGES = ("table1", "agreement", "figures")
VARIANTS = ("tuned", "exact", "orig")
LABEL_MAX = 5.0
# The paper's figures for all-mpnet-base-v2 (jobs/paper.py, the one table of them), shown beside ours.
PAPER_TABLE1 = {v: paper.get(f"table1_{v}").value for v in ("shelf", *VARIANTS)}
# Fig 3/4 points: label -> (layers below mpnet's last, value), drawn as many layers below our last.
_FIG3, _FIG4_L11, _FIG4_L8 = (paper.get(k) for k in ("fig3_spearman_top", "fig4_jaccard_top10_l11",
                                                     "fig4_jaccard_top10_l8"))  # fmt: skip
_FIG2_NEAR, _FIG2_BELOW = paper.get("fig2_ref_sim_near_zero"), paper.get("fig2_ref_term_below")
PAPER_FIG3 = {f"paper, mpnet L11 (its last), s>0.75: {_FIG3.value:.2f}": (0, _FIG3.value)}
PAPER_FIG4 = {f"paper, mpnet L11 (its last), top-10, s>0.5: {_FIG4_L11.value:.2f}": (0, _FIG4_L11.value),
              f"paper, mpnet L8 (3 below its last), top-10, s>0.5: {_FIG4_L8.value:.2f}": (3, _FIG4_L8.value)}
DEFAULT_STEPS_GRID = (4, 8, 16, 32, 64, 128)
SETTINGS = ("base", "models", "split", "sample", "seed", "max_error")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m jobs.evaluate",
        description="Table 1 with significance, exact-vs-approximate agreement at every layer, Fig 2-5.",
    )
    p.add_argument("--base", default=DEFAULT_MODEL, help="the off-the-shelf model (shelf) the variants were tuned from")
    p.add_argument("--models", default="models", help="folder with <base name>-{tuned,exact,orig} from jobs.train")
    for v in VARIANTS:
        p.add_argument(f"--{v}", default=None, help=f"the {v} model folder (default <models>/<base name>-{v})")
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
    p.add_argument("--num-actors", type=int, default=None, help="factor actors per run (jobs.attribute)")
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
    """shelf -> the base model name; tuned/exact/orig -> their folders (checked to exist)."""
    paths = {"shelf": str(args.base)}
    for v in VARIANTS:
        folder = Path(getattr(args, v) or Path(args.models) / f"{base_name(args.base)}-{v}")
        paths[v] = str(folder)
    return paths


def require_models(paths: dict[str, str], needed: tuple[str, ...]) -> None:
    missing = [f"{v} ({paths[v]})" for v in needed if not (Path(paths[v]) / "modules.json").is_file()]
    if missing:
        raise InputError(
            f"model folder(s) not found: {', '.join(missing)}; train them first: "
            + " && ".join(f"python -m jobs.train --variant {v}" for v in VARIANTS)
        )


def stsb(split: str, sample: int | None = None, seed: int = 0) -> tuple[list[str], list[str], np.ndarray, list[str]]:
    pairs = load_pairs("stsb", split=split, sample=sample, seed=seed)
    good, _ = validate(pairs.rows, pairs.label_kind, pairs.label_range, None, None, False)
    return good.text_a.tolist(), good.text_b.tolist(), good.label.to_numpy(), good.pair_id.tolist()


# --------------------------------------------------------------------------- Table 1
def predictions(path: str, texts_a: list[str], texts_b: list[str]) -> tuple[np.ndarray, str]:
    """The model's own predicted similarity per pair (its similarity function; shift included), and its name."""
    model = load_model(path, attn_implementation=None)
    unique = list(dict.fromkeys(texts_a + texts_b))
    emb = model.encode(unique, batch_size=64, convert_to_tensor=True, show_progress_bar=False)
    index = {t: k for k, t in enumerate(unique)}
    ea, eb = emb[[index[t] for t in texts_a]], emb[[index[t] for t in texts_b]]
    scores = model.similarity_pairwise(ea, eb).double().cpu().numpy()
    return scores, model_similarity(model)


def table1(paths: dict[str, str], split: str, aso_iterations: int = 1000) -> tuple[pl.DataFrame, dict[str, Any]]:
    """One row per model: Spearman x 100 (and Pearson) of prediction vs gold; ASO on squared errors."""
    a, b, gold, _ = stsb(split)
    rows, errors = [], {}
    for name, path in paths.items():
        pred, sim = predictions(path, a, b)
        errors[name] = (pred - gold / LABEL_MAX) ** 2
        rows.append({"model": name, "path": path, "similarity": sim, "n_pairs": len(gold),
                     "spearman_x100": 100 * spearman(pred, gold), "pearson_x100": 100 * pearson(pred, gold),
                     "mse": float(errors[name].mean()), "paper_spearman_x100": PAPER_TABLE1.get(name)})  # fmt: skip
    test: dict[str, Any] = {}
    if "tuned" in errors and "exact" in errors:
        both = aso_both_ways(errors["tuned"], errors["exact"], confidence_level=0.95, seed=0,
                             num_bootstrap_iterations=aso_iterations)  # fmt: skip
        test = {"test": "almost stochastic order (Dror et al. 2019, deepsig.aso)", "scores": "squared errors",
                "confidence_level": 0.95, "bootstrap_iterations": aso_iterations,
                "eps_min_tuned_better": both["eps_a_better"],
                "eps_min_exact_better": both["eps_b_better"]}  # fmt: skip
    return pl.DataFrame(rows), test


# --------------------------------------------------------------------------- attribution runs
def pilot_errors(model_path: str, layer: int, pairs: list[tuple[str, str]], grid: list[int], bound: float) -> dict:
    """Mean |completeness error| over `pairs` for N in grid, ascending, until it is <= bound."""
    model = load_model(model_path)
    out: dict[int, float] = {}
    for n in grid:
        ex = Explainer(model, layer=layer, steps=n)
        out[n] = float(np.mean([abs(r.error) for r in ex.explain_pairs(pairs)]))
        if out[n] <= bound:
            break
    return out


def attribute(model: str, layer: int, steps: int, args: argparse.Namespace) -> dict[str, Any]:
    """One jobs.attribute run on the seeded STS-B sample; its summary (run_dir, errors, timings)."""
    from jobs import attribute as job

    argv = ["--dataset", "stsb", "--split", args.split, "--sample", str(args.sample), "--seed", str(args.seed),
            "--model", model, "--layer", str(layer), "--steps", str(steps), "--out", args.runs]  # fmt: skip
    if args.num_actors:
        argv += ["--num-actors", str(args.num_actors)]
    if args.quiet:
        argv.append("-q")
    summary = job.main(job.parse_args(argv))
    summary["command"] = "python -m jobs.attribute " + " ".join(shlex.quote(x) for x in argv)
    return summary


def sql_file(name: str, run: str, run2: str | None = None, **variables: Any) -> pl.DataFrame:
    from ._sql import connect, run_file

    con = connect(run, run2, variables or None)
    try:
        return run_file(con, f"{name}.sql")
    finally:
        con.close()


def layer_runs(paths: dict[str, str], layer: int, args: argparse.Namespace, pilot: list[tuple[str, str]]) -> dict:
    """tuned (approx) and exact runs at `layer` with N chosen as the module docstring says."""
    record: dict[str, Any] = {"layer": layer, "pilot": {}}
    chosen = []
    for name in ("tuned", "exact"):
        errs = pilot_errors(paths[name], layer, pilot, args.steps_grid, args.max_error / 2)
        record["pilot"][name] = {str(n): e for n, e in errs.items()}
        chosen.append(next((n for n, e in errs.items() if e <= args.max_error / 2), max(args.steps_grid)))
    steps = max(chosen)
    while True:
        runs = {name: attribute(paths[name], layer, steps, args) for name in ("tuned", "exact")}
        worst = max(r["mean_abs_completeness_error"] for r in runs.values())
        if worst <= args.max_error or steps >= 4 * max(args.steps_grid):
            break
        logger.warning("layer %d: mean |error| %.2e > %.0e at N=%d; doubling N", layer, worst, args.max_error, steps)
        steps *= 2
    record.update(
        steps=steps,
        runs={name: {k: r[k] for k in ("run_dir", "run_id", "n_done", "n_quarantined", "mean_abs_completeness_error",
                                        "max_abs_completeness_error", "wall_s", "command")}
              for name, r in runs.items()},  # fmt: skip
    )
    return record


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


def _pairs_columns(run: str, columns: list[str]) -> dict[str, np.ndarray]:
    import duckdb

    glob = Path(run) / "pairs" / "*.parquet"
    rows = duckdb.sql(f"select {', '.join(columns)} from read_parquet('{glob}')").fetchnumpy()
    return {c: np.asarray(rows[c], dtype=float) for c in columns}


def plot_all(out: Path, summary: dict[str, Any]) -> list[Path]:
    """Fig 2-5 as PNG from what the stages wrote (agreement.parquet, the runs of summary['figures'])."""
    from xsbert_core.plots import plot_by_layer, plot_histograms

    written: list[Path] = []
    if (out / "agreement.parquet").exists():
        ag = pl.read_parquet(out / "agreement.parquet").sort("layer")
        every = None
        if "include_special" in ag.columns:  # content tokens drawn, every cell's Spearman beside them
            every = ag.filter(pl.col("include_special"), pl.col("score_bin") == "all")
            ag = ag.filter(~pl.col("include_special"))
        overall = ag.filter(pl.col("score_bin") == "all")
        layers = overall["layer"].to_list()
        top = ag.filter(pl.col("bin_low") == 0.75)
        n_layers = int(summary.get("n_layers") or (max(layers) + 1))

        def below_last(points: dict[str, tuple[int, float]]) -> dict[str, tuple[float, float]]:
            return {label: (n_layers - 1 - below, value) for label, (below, value) in points.items()}

        series = {"Spearman, all pairs": (overall["spearman_mean"].to_numpy(), overall["spearman_std"].to_numpy()),
                  "Pearson, all pairs": (overall["pearson_mean"].to_numpy(), None)}  # fmt: skip
        if top.height == len(layers):
            series["Spearman, mean score in (0.75, 1]"] = (top["spearman_mean"].to_numpy(), None)
        if every is not None and every.height == len(layers):
            series["Spearman, all pairs, every cell (special tokens in)"] = (every["spearman_mean"].to_numpy(), None)
        written.append(plot_by_layer(layers, series, out / "fig3_agreement_correlation.png",
                                     "Exact vs approximate attributions: rank correlation per pair",
                                     "correlation of token cells",
                                     reference=below_last(PAPER_FIG3), bounds=(-1.0, 1.0)))  # fmt: skip
        jac = {"top-3 Jaccard": (overall["jaccard_top3_mean"].to_numpy(), overall["jaccard_top3_std"].to_numpy()),
               "top-10 Jaccard": (overall["jaccard_top10_mean"].to_numpy(), overall["jaccard_top10_std"].to_numpy())}
        written.append(plot_by_layer(layers, jac, out / "fig4_agreement_jaccard.png",
                                     "Exact vs approximate attributions: top-k token pairs shared", "Jaccard index",
                                     reference=below_last(PAPER_FIG4), bounds=(0.0, 1.0)))  # fmt: skip
    fig = summary.get("figures")
    if fig:
        shelf = _pairs_columns(fig["runs"]["shelf"], ["ref_sim_a", "ref_sim_b", "ref_term", "positive_sum",
                                                      "negative_sum"])  # fmt: skip
        exact = _pairs_columns(fig["runs"]["exact"], ["positive_sum", "negative_sum"])
        sims = np.concatenate([shelf["ref_sim_a"], shelf["ref_sim_b"]])
        near = float(np.mean(np.abs(sims) <= 0.1))
        below = float(np.mean(shelf["ref_term"] < 0.9))
        written.append(plot_histograms(
            {"f(a, r_b) and f(b, r_a)": sims, "f(r_a, r_b)": shelf["ref_term"]},
            out / "fig2_reference_terms.png", f"Reference terms, shelf model, layer {fig['layer']}", "cosine",
            vlines={"-0.1": -0.1, "+0.1": 0.1, "0.9": 0.9},
            note=f"{near:.1%} of reference similarities within ±0.1 (paper {_FIG2_NEAR.text})\n"
                 f"{below:.1%} of reference terms < 0.9 (paper {_FIG2_BELOW.text})"))  # fmt: skip
        written.append(plot_histograms(
            {"shelf (approx): positive sum": shelf["positive_sum"], "exact: positive sum": exact["positive_sum"],
             "shelf (approx): negative sum": shelf["negative_sum"], "exact: negative sum": exact["negative_sum"]},
            out / "fig5_pos_neg_sums.png", f"Positive and negative attribution sums, layer {fig['layer']}",
            "sum of positive / negative cells",
            vlines={"max exact (1)": 1.0, "max approx (2)": 2.0},
            note=f"positive sum > max score: shelf {np.mean(shelf['positive_sum'] > 2):.1%}, "
                 f"exact {np.mean(exact['positive_sum'] > 1):.1%}"))  # fmt: skip
    return written


def main(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    out = Path(args.out or Path("docs") / "results" / base_name(args.base))
    out.mkdir(parents=True, exist_ok=True)
    paths = model_paths(args)
    needed = {"table1": VARIANTS, "agreement": ("tuned", "exact"), "figures": ("exact",)}
    require_models(paths, tuple(sorted({v for s in args.stages for v in needed[s]})))
    summary_path = out / "summary.json"
    summary: dict[str, Any] = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.update(base=str(args.base), models=paths, split=args.split, sample=args.sample, seed=args.seed,
                   max_error=args.max_error)  # fmt: skip
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
        n_layers = Explainer(load_model(paths["exact"]), layer=0, steps=1).split.n_layers
        summary["n_layers"] = n_layers
        # "all": the deepest layer first, the cheapest to attribute (and the paper's), so an interrupted
        # evaluation has those; a rerun reuses every layer recorded in summary.json.
        layers = list(range(n_layers))[::-1] if args.layers == "all" else [int(x) for x in args.layers.split(",")]
        fig_layer = args.fig_layer % n_layers
        records = {int(k): v for k, v in summary.get("layers", {}).items()}

        def run_layer(layer: int) -> dict:
            if layer not in records:
                records[layer] = layer_runs(paths, layer, args, pilot)
                summary["layers"] = {str(k): v for k, v in sorted(records.items())}
                save("n_layers", "layers")
            return records[layer]

        if "agreement" in args.stages:
            frames = []
            for layer in layers:
                run_layer(layer)
            for layer in sorted(records):  # the requested layers and those recorded by earlier invocations
                rec = records[layer]
                # content tokens (the paper's cells, agreement.sql's default), every cell beside it
                df = pl.concat([sql_file("agreement", rec["runs"]["exact"]["run_dir"], rec["runs"]["tuned"]["run_dir"],
                                         include_special=special) for special in (False, True)])  # fmt: skip
                worst = max(r["mean_abs_completeness_error"] for r in rec["runs"].values())
                frames.append(df.with_columns(pl.lit(layer).alias("layer"), pl.lit(rec["steps"]).alias("steps"),
                                              pl.lit(worst).alias("max_mean_abs_error")))  # fmt: skip
                rho = df.filter(pl.col("score_bin") == "all", ~pl.col("include_special"))["spearman_mean"][0]
                shown = "undefined (no pair with a correlation)" if rho is None else f"{rho:.3f}"
                print(f"layer {layer}: N={rec['steps']}, mean |error| <= {worst:.1e}, spearman {shown}", flush=True)
            first = ["layer", "steps", "max_mean_abs_error"]
            agreement = pl.concat(frames).select([*first, *(c for c in frames[0].columns if c not in first)])
            write_table(agreement, out, "agreement", "Exact vs approximate agreement by layer and score bin")
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
            terms = pl.concat([sql_file("reference_terms", r).with_columns(pl.lit(n).alias("model"))
                               for n, r in runs.items()])  # fmt: skip
            sums = pl.concat([sql_file("pos_neg_sums", r).with_columns(pl.lit(n).alias("model"))
                              for n, r in runs.items()])  # fmt: skip
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
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.command = "python -m jobs.evaluate " + " ".join(shlex.quote(a) for a in argv)
    try:
        main(args)
    except XsbertError as exc:
        print(f"jobs.evaluate: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
