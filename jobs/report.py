"""A run's answers in one folder: every applicable analysis of sql/, its tables, figures and findings.

    python -m jobs.report --run runs/<id> --out reports/<id>
    python -m jobs.report --run runs/<exact> --run2 runs/<approx> --out reports/x --var min_count=10

For each analysis of sql/ (docs/ANALYSES.md) the report decides from the data whether it applies (pairs at
all, gold labels, an approximate run, a `parses` table, pairs that differ by a standalone *not*, adjective
triplets, a second run with the same tokenizer and shared pairs), runs it through jobs._sql, writes
`<name>.csv` and `<name>.md`, draws its figures (xsbert_core.plots) and states each finding in one plain
sentence, beside the paper's number where DESIGN.md §4 has one. An analysis that does not apply is skipped
with the reason. Then a few example heatmaps of real pairs, `index.html` (self-contained: relative links,
inline CSS, no script), `report.json` (the same findings with their numbers) and a short summary on stdout.
No Ray: DuckDB over the run's Parquet and matplotlib.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import jinja2
import numpy as np
import polars as pl

from xsbert_core import InputError, XsbertError

from . import _sql, paper

PROG = "python -m jobs.report"
# Example heatmaps: pairs whose sides have at most this many word tokens are preferred (readable labels).
EXAMPLE_MAX_TOKENS = 24
# Bars per list in the ranked charts (top and bottom tokens, relation pairs).
TOP_K = 15
# Rows of each result shown on the page (the CSV and Markdown files have all of them).
PREVIEW_ROWS = 10
# Queries the report runs besides the analyses (the agreement pre-check, the reference norms): sql/report/.
REPORT_SQL = _sql.SQL_DIR / "report"
# The paper's headline subset of the agreement (Fig 3): pairs of mean score s > 0.75.
TOP_SCORE = 0.75
# Where `xsbert serve` listens by default (jobs/serve.py): the page links its sections and examples there.
SERVE_URL = "http://127.0.0.1:8000"
# The `xsbert serve` page that shows the pairs behind each section (path and query).
SERVE_PAGES = {
    "table1": "/pairs?sort=score", "reference_terms": "/pairs?sort=error", "agreement": "/pairs?sort=score",
    "pos_neg_sums": "/pairs?sort=positive", "syntactic_relations": "/pairs?sort=sum", "negation": "/pairs?token=not",
    "adjectives": "/pairs?sort=score", "lexical_ranks": "/tokens", "lexical_ranks_compare": "/tokens",
}  # fmt: skip


# --------------------------------------------------------------------------- what a section holds
@dataclass
class Finding:
    """One plain sentence; `values` are its numbers (report.json); `paper` the paper's number with its setting, if
    any (jobs.paper.beside: 'like-for-like', or the settings that differ); `like_for_like` whether they are equal."""

    text: str
    values: dict[str, Any] = field(default_factory=dict)
    paper: str | None = None
    like_for_like: bool | None = None


@dataclass
class Section:
    name: str
    title: str
    paper: str
    status: str = "ok"  # ok | skipped | failed
    reason: str | None = None
    findings: list[Finding] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    files: list[str] = field(default_factory=list)
    frame: pl.DataFrame | None = None


@dataclass
class Context:
    """The connection (views of run and run2, variables set), the runs' facts, the output folder."""

    con: duckdb.DuckDBPyConnection
    run: _sql.Run  # a local directory, or an object-store URI (s3://..., gs://...)
    run2: _sql.Run | None
    out: Path
    facts: dict[str, Any]
    facts2: dict[str, Any] | None
    results: dict[str, pl.DataFrame] = field(default_factory=dict)
    note: str | None = None
    serve_url: str | None = SERVE_URL  # links into `xsbert serve` (None: no links)

    def scalar(self, sql: str) -> Any:
        row = first_row(self.con, sql)
        return None if row is None else row[0]

    def frame(self, sql: str) -> pl.DataFrame:
        return self.con.sql(sql).pl()

    def var(self, name: str, default: Any) -> Any:
        value = self.scalar(f"select getvariable('{name}')")
        return default if value is None else value

    def columns(self, view: str) -> set[str]:
        return {r[0] for r in self.con.sql(f"describe {view}").fetchall()}

    @contextmanager
    def variable(self, name: str, value: Any) -> Iterator[None]:
        """The SQL variable `name` set to `value` inside the block, as it was (or unset) after it."""
        before = self.var(name, None)
        self.con.execute(f"set variable {name} = {_sql._literal(value)}")
        try:
            yield
        finally:
            if before is None:
                self.con.execute(f"reset variable {name}")
            else:
                self.con.execute(f"set variable {name} = {_sql._literal(before)}")


# --------------------------------------------------------------------------- formatting
def missing(x: Any) -> bool:
    """No number: null, or a NaN (the sql/ files return null for undefined statistics; NaN is guarded all the
    same)."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x: float | None) -> str:
    """A share as a percentage with one decimal: 0.1234 -> '12.3%'."""
    return "n/a" if missing(x) else f"{100 * x:.1f}%"


def num(x: float | None, digits: int = 2) -> str:
    """A number with `digits` decimals; 'n/a' for null or NaN."""
    return "n/a" if missing(x) else f"{x:.{digits}f}"


def signed(x: float | None, digits: int = 3) -> str:
    """An attribution with its sign: +0.123 / -0.045."""
    return "n/a" if missing(x) else f"{x:+.{digits}f}"


def plural(n: int, word: str) -> str:
    """'1 pair', '3 pairs'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def markdown_table(df: pl.DataFrame, max_rows: int | None = None) -> str:
    """The frame as a GitHub Markdown table (floats to 4 significant digits, `|` escaped)."""
    rows = df.head(max_rows) if max_rows is not None else df
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for row in rows.iter_rows():
        lines.append("| " + " | ".join(_cell(v).replace("|", "\\|") for v in row) + " |")
    if max_rows is not None and df.height > max_rows:
        lines.append(f"\n({max_rows} of {df.height} rows)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the runs' facts
def _quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def first_row(con: duckdb.DuckDBPyConnection, sql: str) -> tuple | None:
    """The first row of a query's result, or None."""
    rows = con.sql(sql).limit(1).fetchall()
    return rows[0] if rows else None


def run_facts(con: duckdb.DuckDBPyConnection, run: _sql.Run, suffix: str = "") -> dict[str, Any]:
    """Settings (manifest config) and counts of one run, from its views."""
    manifest_path = _sql.join(run, "manifest.json")
    try:
        text = _sql.read_text(manifest_path)
        manifest = json.loads(text) if text is not None else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{manifest_path}: not readable JSON ({exc})") from exc
    config = manifest.get("config") or {}
    dataset = config.get("dataset") or {}
    counts = first_row(con, f"""
        select count(*), count(label), avg(abs(completeness_error)), max(abs(completeness_error)),
               min(score), max(score)
        from pairs{suffix}""")  # fmt: skip
    facts: dict[str, Any] = {
        "path": str(run),
        "run_id": manifest.get("run_id", _sql.run_name(run)),
        "model": config.get("model"),
        "layer": config.get("layer"),
        "n_layers": config.get("n_layers"),
        "mode": config.get("mode"),
        "similarity": config.get("similarity"),
        "steps": config.get("steps"),
        "rule": config.get("rule"),
        "min_abs": config.get("min_abs"),
        "cells": config.get("cells") or "all",  # jobs.attribute --cells (runs before the option: all)
        "dataset": dataset.get("name") if isinstance(dataset, dict) else dataset,
        "split": dataset.get("split") if isinstance(dataset, dict) else None,
        "n_pairs": counts[0],
        "n_labelled": counts[1],
        "mean_abs_completeness_error": counts[2],
        "max_abs_completeness_error": counts[3],
        "n_quarantined": first_row(con, f"select count(*) from quarantine{suffix}")[0],
        "n_sentences": first_row(con, f"select count(*) from sentences{suffix}")[0],
        "n_cells": first_row(con, f"select count(*) from cells{suffix}")[0],
        "n_word_cells": first_row(con, f"select count(*) from word_cells{suffix}")[0],
        "parses": None,
        "commands": [],
    }
    if _sql.has_table(run, "parses"):
        parsers, rows, aligned = first_row(con, f"""
            select string_agg(distinct parser || ' ' || coalesce(parser_model, ''), ', '), count(*), avg(aligned::int)
            from parses{suffix}""")  # fmt: skip
        facts["parses"] = {"parsers": parsers, "rows": rows, "aligned_share": aligned}
    for entry in manifest.get("runs") or []:
        if isinstance(entry, dict):
            facts["commands"].append(attribute_command(config, entry.get("selection") or {}))
    return facts


def attribute_command(config: dict[str, Any], selection: dict[str, Any]) -> str:
    """A jobs.attribute command equivalent to one invocation recorded in manifest.json (config + selection)."""
    dataset = config.get("dataset") or {}
    flags: list[str] = ["--dataset", str(selection.get("dataset") or dataset.get("name"))]
    if selection.get("split") or dataset.get("split"):
        flags += ["--split", str(selection.get("split") or dataset.get("split"))]
    if selection.get("sample") is not None:
        flags += ["--sample", str(selection["sample"]), "--seed", str(selection.get("seed", 0))]
    if selection.get("limit") is not None:
        flags += ["--limit", str(selection["limit"])]
    for key, flag in (("model", "--model"), ("layer", "--layer"), ("mode", "--mode"), ("similarity", "--similarity"),
                      ("rule", "--rule"), ("steps", "--steps"), ("tolerance", "--tolerance"),
                      ("max_steps", "--max-steps"), ("min_abs", "--min-abs")):  # fmt: skip
        value = config.get(key)
        if value is None or (key == "min_abs" and not value) or (key == "max_steps" and not config.get("tolerance")):
            continue  # defaults: no pruning; max-steps only matters with a tolerance
        flags += [flag, str(value)]
    return "python -m jobs.attribute " + shlex.join(flags)


def run_difference(facts: dict[str, Any], facts2: dict[str, Any]) -> tuple[str, str]:
    """How the two runs differ in their settings, as ('layer 3', 'layer 4'); ('run', 'run2') when they do not."""
    keys = [k for k in ("model", "mode", "similarity", "layer", "steps", "rule", "min_abs")
            if facts.get(k) != facts2.get(k)]
    if not keys:
        return "run", "run2"
    name = {"steps": "N", "min_abs": "min-abs"}
    return tuple(", ".join(f"{name.get(k, k)} {f.get(k)}" for k in keys)  # type: ignore[return-value]
                 for f in (facts, facts2))


# --------------------------------------------------------------------------- our setting, as jobs.paper spells its own
DATASET_NAMES = {"stsb": "STS-B", "qqp": "QQP"}
VARIANT_SUFFIXES = ("tuned", "exact", "orig")


def model_variant(facts: dict[str, Any]) -> tuple[str, str]:
    """(base model name, variant): 'models/all-MiniLM-L6-v2-exact' -> ('all-MiniLM-L6-v2', 'exact'); a model without
    a variant suffix is off the shelf ('shelf'), unless the run is exact-mode (an exact model)."""
    name = str(facts.get("model") or "unknown model").rstrip("/").split("/")[-1]
    for variant in VARIANT_SUFFIXES:
        if name.endswith(f"-{variant}"):
            return name[: -len(variant) - 1], variant
    return name, "exact" if facts.get("mode") == "exact" else "shelf"


def model_label(facts: dict[str, Any]) -> str:
    """'all-MiniLM-L6-v2 shelf', as jobs.paper writes 'all-mpnet-base-v2 shelf'."""
    return " ".join(model_variant(facts))


def pair_model_label(facts: dict[str, Any], facts2: dict[str, Any]) -> str:
    """Two runs: 'all-MiniLM-L6-v2, exact vs tuned (approximate)' when one is exact-mode and the other approximate
    over the same base model, as jobs.paper spells the paper's Fig 3/4 ('..., exact vs shelf' for Fig 10's);
    else both runs' models and modes."""
    (base1, variant1), (base2, variant2) = model_variant(facts), model_variant(facts2)
    modes = (facts.get("mode"), facts2.get("mode"))
    if base1 == base2 and set(modes) == {"exact", "approx"}:
        other = variant2 if modes[0] == "exact" else variant1
        return f"{base1}, exact vs {other} (approximate)"
    return f"{model_label(facts)} ({facts.get('mode')}) vs {model_label(facts2)} ({facts2.get('mode')})"


def paper_comparison(facts: dict[str, Any], facts2: dict[str, Any]) -> str | None:
    """Why two runs are not the paper's kind of two-run comparison (exact vs approximate attributions of one base
    model at one layer, Fig 3/4; two variants of one model at one layer, Fig 10), or None when they are; the
    report sets no paper number beside another kind (two layers of one model, say)."""
    one, two = run_difference(facts, facts2)
    if layer_label(facts) != layer_label(facts2):
        return f"the two runs differ in layer ({one} vs {two})"
    if model_variant(facts)[0] != model_variant(facts2)[0]:
        return f"the two runs are different base models ({one} vs {two})"
    if model_variant(facts) == model_variant(facts2) and facts.get("mode") == facts2.get("mode"):
        return f"the two runs are one model in one mode ({one} vs {two})"
    return None


def layer_label(facts: dict[str, Any]) -> str:
    """'3 of 6' (a negative --layer counts from the top: -3 of 12 is 9 of 12)."""
    layer, n = facts.get("layer"), facts.get("n_layers")
    if layer is None:
        return "unknown"
    layer = int(layer)
    if n:
        return f"{layer % int(n) if layer < 0 else layer} of {n}"
    return str(layer)


def subset_label(facts: dict[str, Any], n_pairs: int | None = None, scores: str | None = None) -> str:
    """'STS-B test (300 pairs)', '..., s > 0.75'; the negation dataset as jobs.paper names the paper's."""
    n = facts["n_pairs"] if n_pairs is None else n_pairs
    dataset = str(facts.get("dataset") or "unknown dataset")
    if dataset == "negation":
        text = f"STS-B test sentences with one simple 'not' ({n:,} pairs)"
    else:
        name = " ".join(str(x) for x in (DATASET_NAMES.get(dataset, dataset), facts.get("split")) if x)
        text = f"{name} ({n:,} pairs)"
    return f"{text}, {scores}" if scores else text


def cite(key: str, model: str, layer: str, subset: str, metric: str) -> dict[str, Any]:
    """Finding fields for the paper's value `key` beside ours (our model, layer, subset and metric, spelled as
    jobs.paper spells the paper's): {'paper': text, 'like_for_like': bool}."""
    value = paper.get(key)
    ours = {"model": model, "layer": layer, "subset": subset, "metric": metric}
    return {"paper": paper.beside(value, ours), "like_for_like": not paper.differences(value, ours)}


# --------------------------------------------------------------------------- applicability (from the data)
def _needs_pairs(ctx: Context) -> str | None:
    return None if ctx.facts["n_pairs"] else "the run has no pairs"


def _needs_two_runs(ctx: Context) -> str | None:
    if ctx.run2 is None:
        return "needs a second run: pass --run2 DIR (e.g. the same pairs in another mode, layer or model)"
    if not ctx.facts["n_pairs"] or not ctx.facts2["n_pairs"]:
        return "one of the two runs has no pairs"
    return None


def _needs_cells(ctx: Context, which: str = "all", both: bool = False) -> str | None:
    """A reason to skip when the run (both: and run2) does not store the cells an analysis reads: `all` (every
    cell) or `same-token` (every cell, or the same-token ones: jobs.attribute --cells)."""
    for facts in (ctx.facts, ctx.facts2) if both else (ctx.facts,):
        cells = (facts or {}).get("cells", "all")
        if cells != "all" and not (which == "same-token" and cells == "same-token"):
            need = "every cell" if which == "all" else "the same-token cells"
            fix = "all" if which == "all" else "same-token or all"
            return f"run {facts['path']} stores --cells {cells}; this analysis needs {need} (--cells {fix})"
    return None


def check_negation(ctx: Context) -> str | None:
    return _needs_pairs(ctx) or _needs_cells(ctx)


def check_lexical_ranks(ctx: Context) -> str | None:
    return _needs_pairs(ctx) or _needs_cells(ctx, "same-token")


def check_lexical_ranks_compare(ctx: Context) -> str | None:
    return _needs_two_runs(ctx) or _needs_cells(ctx, "same-token", both=True)


def check_table1(ctx: Context) -> str | None:
    return _needs_pairs(ctx) or (
        None if ctx.facts["n_labelled"] else "the run's pairs have no gold labels (its dataset has none)"
    )


def check_reference_terms(ctx: Context) -> str | None:
    if reason := _needs_pairs(ctx):
        return reason
    if ctx.facts["mode"] == "exact":
        return ("an exact-mode run: its reference terms are 0 by definition (this analysis is for approximate "
                "runs, --mode approx)")  # fmt: skip
    if not ctx.scalar("select count(*) from pairs where ref_sim_a <> 0 or ref_sim_b <> 0 or ref_term <> 0"):
        return "the run's reference similarities and terms are all 0 or missing (as in an exact-mode run)"
    return None


def check_pos_neg_sums(ctx: Context) -> str | None:
    if reason := _needs_pairs(ctx):
        return reason
    if not ctx.scalar("select count(positive_sum) from pairs"):
        return "the run's pairs have no positive_sum / negative_sum values"
    return None


def check_syntactic_relations(ctx: Context) -> str | None:
    if reason := _needs_pairs(ctx) or _needs_cells(ctx):
        return reason
    if not _sql.has_table(ctx.run, "parses"):
        return f"the run has no parses table: run python -m jobs.parse --run {ctx.run}"
    return None


def check_adjectives(ctx: Context) -> str | None:
    if reason := _needs_pairs(ctx) or _needs_cells(ctx):
        return reason
    missing = {"triplet", "kind"} - ctx.columns("pairs")
    if missing:
        return (f"pairs has no {'/'.join(sorted(missing))} column: these are adjective-triplet pairs of "
                "python -m jobs.attribute --dataset adjectives")  # fmt: skip
    if not ctx.scalar("select count(*) from pairs where triplet is not null"):
        return "no pair has a triplet (python -m jobs.attribute --dataset adjectives makes them)"
    return None


def check_agreement(ctx: Context) -> str | None:
    if reason := _needs_two_runs(ctx) or _needs_cells(ctx, both=True):
        return reason
    check = _sql.run_file(ctx.con, REPORT_SQL / "agreement_check.sql").row(0, named=True)
    shared, same_texts, differ = (check[k] for k in ("n_shared_pairs", "n_same_texts", "n_retokenized_sentences"))
    if not shared:
        return "the two runs share no pair_id: agreement compares the same pairs attributed twice"
    if not same_texts:
        return (f"the {plural(shared, 'pair_id')} the two runs share hold different texts in each: agreement "
                "compares the same pairs attributed twice")  # fmt: skip
    if differ:
        return (f"the two runs tokenize {differ} shared sentences differently (different tokenizers): their cells "
                "do not correspond")  # fmt: skip
    return None


# --------------------------------------------------------------------------- "empty result" reasons
def empty_lexical(df: pl.DataFrame, ctx: Context) -> str | None:
    if df.height:
        return None
    m = ctx.var("min_count", 30)
    return f"no token has at least {m} same-token cells (min_count); lower it, e.g. --var min_count={max(1, m // 5)}"


def empty_lexical_compare(df: pl.DataFrame, ctx: Context) -> str | None:
    if df.height:
        return None
    m = ctx.var("min_count", 30)
    return f"no token has at least {m} same-token cells in both runs (min_count; --var min_count=N lowers it)"


def empty_negation(df: pl.DataFrame, ctx: Context) -> str | None:
    if df.height:
        return None
    return ("no pair differs by a standalone 'not' on one side (python -m jobs.attribute --dataset negation makes "
            "such pairs)")  # fmt: skip


def empty_agreement(df: pl.DataFrame, ctx: Context) -> str | None:
    total = df.filter(pl.col("score_bin") == "all")
    if total.height and total["n_pairs"][0]:
        return None
    return "the two runs share no cell (pair_id, i, j)"


# --------------------------------------------------------------------------- findings and figures per analysis
def _table1_key(ctx: Context) -> str:
    """The paper's Table 1 row for this run's model: its variant (shelf, tuned, exact, orig); a dot-product run is
    set against Orig (which the paper scores with cosine, like the others)."""
    if ctx.facts["similarity"] == "dot":
        return "table1_orig"
    return f"table1_{model_variant(ctx.facts)[1]}"


def table1(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.row(0, named=True)
    values = {k: row[k] for k in ("n_pairs", "spearman_x100", "spearman", "pearson")}
    if missing(row["spearman"]):
        return [Finding(f"Score vs gold label: Spearman is undefined over {plural(row['n_pairs'], 'labelled pair')} "
                        "(fewer than two, or constant scores or labels).", values)]  # fmt: skip
    return [Finding(
        f"The model's similarity ranks the gold labels with Spearman × 100 = {num(row['spearman_x100'], 1)} over "
        f"{row['n_pairs']} labelled pairs (Pearson {num(row['pearson'])}).",
        values, **cite(_table1_key(ctx), model_label(ctx.facts), "-", subset_label(ctx.facts, row["n_pairs"]),
                       f"Spearman × 100, {ctx.facts['similarity']}"),
    )]  # fmt: skip


def plot_table1(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_scatter

    data = ctx.frame("select label, score from pairs where label is not null and score is not null")
    plot_scatter(data["label"].to_numpy(), data["score"].to_numpy(), ctx.out / "table1.png",
                 f"Score vs gold label (Spearman × 100 = {num(df['spearman_x100'][0], 1)})", "gold label",
                 f"predicted similarity ({ctx.facts['similarity']})")  # fmt: skip
    return [("table1.png", "Predicted similarity f(a, b) against the gold label, one point per pair.")]


def reference_terms(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    rows = {r["quantity"]: r for r in df.iter_rows(named=True)}
    sim, term = rows["ref_sim"], rows["ref_term"]
    # forward quantities of the whole model: no layer, as the paper's Fig 2 (jobs.paper)
    setting = (model_label(ctx.facts), paper.NO_LAYER, subset_label(ctx.facts))
    return [
        Finding(f"{pct(sim['share_near_zero'])} of the reference similarities f(a, r_b), f(b, r_a) lie within "
                f"±{num(sim['near_zero'])} of 0 (median {num(sim['median'], 3)}, n = {sim['n']}).",
                {"share_near_zero": sim["share_near_zero"], "near_zero": sim["near_zero"], "n": sim["n"]},
                **cite("fig2_ref_sim_near_zero", *setting, f"share with |f| ≤ {sim['near_zero']:g}")),
        Finding(f"{pct(term['share_below_threshold'])} of the reference terms f(r_a, r_b) are below "
                f"{num(term['term_threshold'])} (median {num(term['median'], 3)}).",
                {"share_below_threshold": term["share_below_threshold"], "term_threshold": term["term_threshold"],
                 "n": term["n"]},
                **cite("fig2_ref_term_below", *setting, f"share with f < {term['term_threshold']:g}")),
    ]  # fmt: skip


def plot_reference_terms(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_cdfs, plot_histograms

    rows = {r["quantity"]: r for r in df.iter_rows(named=True)}
    nz, th = rows["ref_sim"]["near_zero"], rows["ref_term"]["term_threshold"]
    data = ctx.frame("select ref_sim_a, ref_sim_b, ref_term from pairs")
    a, b, t = (data[c].to_numpy() for c in ("ref_sim_a", "ref_sim_b", "ref_term"))
    plot_histograms({"f(a, r_b)": a, "f(b, r_a)": b}, ctx.out / "reference_terms-similarities.png",
                    "Reference similarities (ideal: 0)", "cosine similarity", vlines={f"−{nz:g}": -nz, f"+{nz:g}": nz})
    plot_histograms({"f(r_a, r_b)": t}, ctx.out / "reference_terms-term.png", "Reference term (ideal: 1)",
                    "cosine similarity of the two references", vlines={f"{th:g}": th})
    plot_cdfs({"|f(a, r_b)|": np.abs(a), "|f(b, r_a)|": np.abs(b), "1 − f(r_a, r_b)": 1 - t},
              ctx.out / "reference_terms-cdf.png", "Distance of the reference terms from their ideal values",
              "distance from the ideal value", vlines={f"{nz:g}": nz})  # fmt: skip
    return [
        ("reference_terms-similarities.png", "Histogram of the reference similarities of every pair."),
        ("reference_terms-term.png", "Histogram of the reference term f(r_a, r_b)."),
        ("reference_terms-cdf.png", ("Cumulative share of pairs by distance of each reference term from its "
         "ideal value (0 for the similarities, 1 for the term).")),
    ]  # fmt: skip


def pos_neg_sums(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.filter(pl.col("score_bin") == "all").row(0, named=True)
    values = {k: row[k] for k in ("n_pairs", "share_positive_exceeds", "max_score", "mean_positive_sum",
                                  "mean_negative_sum", "mean_attribution_sum")}  # fmt: skip
    sums = (f"mean positive sum {num(row['mean_positive_sum'])}, mean negative sum {num(row['mean_negative_sum'])}, "
            f"mean total {num(row['mean_attribution_sum'])}")  # fmt: skip
    if row["max_score"] is None:
        return [Finding(f"Dot-product scores have no maximum, so no share is given (set --var max_score=X); {sums}.",
                        values)]  # fmt: skip
    broken = reference_norms(ctx, row["max_score"]) if row["mode"] == "approx" else []
    if broken:  # the bound is shown not to hold: a share of sums above it says nothing
        return [Finding(f"Over {row['n_pairs']} pairs: {sums}.", values), *broken]
    bound = "f(a, b) ≤ 1" if row["mode"] == "exact" else "f(a, b) + 1 with ideal references"
    return [Finding(
        f"The positive attributions alone exceed {num(row['max_score'], 0)} (the largest total, {bound}) in "
        f"{pct(row['share_positive_exceeds'])} of {row['n_pairs']} pairs ({sums}).", values)]  # fmt: skip


def reference_norms(ctx: Context, max_score: float) -> list[Finding]:
    """Approximate mode: when ΣA converges above max_score on average (sql/report/reference_norms.sql), the bound
    does not hold: say so and why (the references' embedding norms); [] when it holds."""
    # the file's bound is pos_neg_sums' max_score (from the manifest when not set)
    unset = ctx.var("max_score", None) is None
    with ctx.variable("max_score", float(max_score)) if unset else nullcontext():
        row = _sql.run_file(ctx.con, REPORT_SQL / "reference_norms.sql").row(0, named=True)
    if not row["is_bound_exceeded"]:
        return []
    target, score, ratio = row["mean_target"], row["mean_score"], row["reference_norm_ratio"]
    why = ""
    if not missing(ratio):
        why = (f": the reference embeddings are {ratio:.1f}× as long as the sentences' (mean norm "
               f"{num(row['mean_reference_norm'])} vs {num(row['mean_embedding_norm'])}), so the reference term "
               f"f(r_a, r_b)·‖r_a‖‖r_b‖ / (‖a‖‖b‖) adds about {num(row['mean_target_minus_score'])} rather than 1")
    return [Finding(
        f"In this run ΣA converges to {num(target)} on average against a mean score of {num(score)}{why}; the bound "
        f"{num(max_score, 0)} of approximate mode does not hold for this model and layer, so the share of positive "
        f"sums above {num(max_score, 0)} is not given.",
        {"mean_target": target, "mean_score": score, "mean_embedding_norm": row["mean_embedding_norm"],
         "mean_reference_norm": row["mean_reference_norm"], "is_bound_exceeded": True})]  # fmt: skip


def plot_pos_neg_sums(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_by_bin, plot_cdfs, plot_scatter

    max_score = df["max_score"][0]
    data = ctx.frame("select score, positive_sum, negative_sum from pairs")
    broken = max_score is not None and df["mode"][0] == "approx" and bool(reference_norms(ctx, max_score))
    # where the run shows the approximate-mode bound does not hold, no line is drawn for it
    lines = {f"max score {max_score:g}": max_score} if max_score is not None and not broken else None
    line = ("no line is drawn for the approximate-mode bound 2: this run's ΣA converges above it on average (see the "
            "findings)" if broken else "the dashed line is the largest possible total")  # fmt: skip
    n = data.height
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}, n = {n} pairs"
    plot_scatter(np.concatenate([data["score"].to_numpy()] * 2),
                 np.concatenate([data["positive_sum"].to_numpy(), data["negative_sum"].to_numpy()]),
                 ctx.out / "pos_neg_sums-scatter.png", f"Positive and negative attribution sums per pair\n{run}",
                 f"score f(a, b) ({ctx.facts['similarity']})", "sum of attributions",
                 groups=["positive sum"] * n + ["negative sum"] * n, hlines=lines)  # fmt: skip
    plot_cdfs({"positive sum": data["positive_sum"].to_numpy(), "|negative sum|": -data["negative_sum"].to_numpy()},
              ctx.out / "pos_neg_sums-cdf.png", f"Cumulative share of pairs by the size of each part\n{run}",
              "sum of attributions (absolute)", vlines=lines)  # fmt: skip
    bins = df.filter(pl.col("score_bin") != "all")
    plot_by_bin(bins["score_bin"].to_list(),
                {"mean positive sum": (bins["mean_positive_sum"].to_numpy(), None),
                 "mean negative sum": (bins["mean_negative_sum"].to_numpy(), None),
                 "mean total ΣA": (bins["mean_attribution_sum"].to_numpy(), None),
                 "mean score": (bins["mean_score"].to_numpy(), None)},
                ctx.out / "pos_neg_sums-bins.png", "Attribution sums by score", "sum of attributions",
                counts=bins["n_pairs"].to_list())  # fmt: skip
    return [
        ("pos_neg_sums-scatter.png", f"Each pair's positive and negative sum against its score; {line}."),
        ("pos_neg_sums-cdf.png", f"Cumulative share of pairs by positive sum and by |negative sum|; {line}."),
        ("pos_neg_sums-bins.png", "Means per score bin (the bins of the table)."),
    ]  # fmt: skip


def is_bin_edge(x: float, bin_width: float) -> bool:
    """Whether x is a boundary of the score bins of width `bin_width` (multiples of it, as in the sql/ files)."""
    k = x / bin_width
    return abs(k - round(k)) < 1e-9


def _pool(rows: list[dict[str, Any]], n_key: str, stat: str) -> tuple[float | None, float | None, int]:
    """Mean and sample std of a per-pair statistic over several bins, from each bin's count, mean and sample std:
    M = sum n_i m_i / N; s^2 = (sum (n_i - 1) s_i^2 + sum n_i (m_i - M)^2) / (N - 1) — the same as over the pairs."""
    parts = [(r[n_key], r[f"{stat}_mean"], r[f"{stat}_std"]) for r in rows if r[n_key] and not missing(r[f"{stat}_mean"])]
    n = sum(k for k, _, _ in parts)
    if not n:
        return None, None, 0
    mean = sum(k * m for k, m, _ in parts) / n
    if n < 2:
        return mean, None, n
    within = sum((k - 1) * (0.0 if missing(sd) else sd) ** 2 for k, _, sd in parts)
    between = sum(k * (m - mean) ** 2 for k, m, _ in parts)
    return mean, math.sqrt((within + between) / (n - 1)), n


def above(df: pl.DataFrame, low: float, ctx: Context) -> dict[str, Any] | None:
    """The agreement of the pairs with mean score s > low, pooled from agreement.sql's bins above `low` (exact:
    the bins' counts, means and standard deviations determine the pooled ones); None when `low` is not a bin edge at
    the run's bin_width (then no set of bins is s > low), {'n_pairs': 0, ...} when no pair is above it."""
    if not is_bin_edge(low, float(ctx.var("bin_width", 0.25))):
        return None
    rows = df.filter(pl.col("score_bin") != "all", pl.col("bin_low") >= low - 1e-9).to_dicts()
    out: dict[str, Any] = {"n_pairs": sum(r["n_pairs"] or 0 for r in rows),
                           "n_correlated": sum(r["n_correlated"] or 0 for r in rows)}  # fmt: skip
    for stat in ("spearman", "pearson"):
        out[f"{stat}_mean"], out[f"{stat}_std"], _ = _pool(rows, "n_correlated", stat)
    for stat in ("jaccard_top3", "jaccard_top10"):
        out[f"{stat}_mean"], out[f"{stat}_std"], _ = _pool(rows, "n_pairs", stat)
    return out


def agreement_tokens(df: pl.DataFrame) -> str:
    """Which token cells agreement.sql compared (its include_special column), as jobs.paper spells the paper's
    ('content tokens')."""
    return "all tokens" if df["include_special"][0] else "content tokens"


def _correlated(row: dict[str, Any]) -> str:
    """What the correlations are over when some of the row's pairs have none (agreement.sql: null, not counted in
    n_correlated): '' when all have one."""
    n, k = row["n_pairs"], row["n_correlated"]
    if k == n:
        return ""
    if k == 0:
        return " (none has a correlation: each shares one cell or has constant values)"
    return f" (over the {plural(k, 'pair')} with a correlation; {n - k} of {n} share one cell or have constant values)"


def every_cell_agreement(ctx: Context) -> dict[str, Any] | None:
    """agreement.sql's 'all' row with include_special = true (every cell), the figure beside the content one; the
    connection's variables are left as they were."""
    with ctx.variable("include_special", True):
        df = _sql.run_file(ctx.con, _sql.SQL_DIR / "agreement.sql")
    rows = df.filter(pl.col("score_bin") == "all")
    return rows.row(0, named=True) if rows.height else None


def _every_cell_reading(content: dict[str, Any], every: dict[str, Any]) -> str:
    """How the every-cell Spearman compares with the content one, as the numbers shown say it."""
    a, b = content["spearman_mean"], every["spearman_mean"]
    if missing(a) or missing(b) or num(a) == num(b):
        return ""
    return (": higher than over content tokens (the special tokens' cells tie, e.g. exactly 0 in both runs at "
            "shallow layers, and ties lift Spearman)" if b > a else ": lower than over content tokens")


def agreement(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.filter(pl.col("score_bin") == "all").row(0, named=True)
    keys = ("n_pairs", "n_correlated", "spearman_mean", "spearman_std", "pearson_mean", "jaccard_top3_mean",
            "jaccard_top10_mean")  # fmt: skip
    one, two = run_difference(ctx.facts, ctx.facts2)
    tokens = agreement_tokens(df)
    model = pair_model_label(ctx.facts, ctx.facts2)
    layer = layer_label(ctx.facts) if layer_label(ctx.facts) == layer_label(ctx.facts2) else (
        f"{layer_label(ctx.facts)} vs {layer_label(ctx.facts2)}")  # fmt: skip
    jaccard = "fig4_jaccard_top10_l8" if layer == paper.get("fig4_jaccard_top10_l8").layer else "fig4_jaccard_top10_l11"
    spread = "" if missing(row["spearman_std"]) else f" ± {num(row['spearman_std'])}"
    over = _correlated(row)
    level = df["level"][0]
    cells = "word matrices" if level == "word" else f"token matrices ({tokens})"
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    out = [Finding(
        f"Over {row['n_pairs']} shared pairs the {cells} of run ({one}) and run2 ({two}) agree with Spearman "
        f"{num(row['spearman_mean'])}{spread}, Pearson {num(row['pearson_mean'])}{over}, and their "
        f"top-10 cells overlap with Jaccard {num(row['jaccard_top10_mean'])} (top-3: {num(row['jaccard_top3_mean'])}).",
        {k: row[k] for k in keys},
    )]  # fmt: skip
    if level == "token" and tokens == "content tokens":
        every = every_cell_agreement(ctx)
        if every is not None:
            out.append(Finding(
                f"Over every cell (special tokens' rows and columns included) the same pairs read Spearman "
                f"{num(every['spearman_mean'])}, top-10 Jaccard {num(every['jaccard_top10_mean'])} (top-3: "
                f"{num(every['jaccard_top3_mean'])}){_every_cell_reading(row, every)}.",
                {f"every_cell_{k}": every[k] for k in keys}))  # fmt: skip
    bin_width = float(ctx.var("bin_width", 0.25))
    for low, key, what in ((0.5, jaccard, "jaccard"), (TOP_SCORE, "fig3_spearman_top", "spearman")):
        part = above(df, low, ctx)
        if part is None:
            out.append(Finding(
                f"The pairs with mean score above {low:g} (the paper's subset for {paper.get(key).figure}) are not a "
                f"set of bins at bin_width = {bin_width:g}: no figure for them (--var bin_width=0.25 gives one).",
                {"bin_width": bin_width, "score_above": low}))  # fmt: skip
            continue
        if not part["n_pairs"]:
            continue
        subset = subset_label(ctx.facts, row["n_pairs"], f"s > {low:g}")
        values = {k: part[k] for k in keys} | {"score_above": low}
        if what == "jaccard":
            metric = f"top-10 Jaccard by |value|, {tokens}"
            text = (f"Among the {plural(part['n_pairs'], 'pair')} with mean score above {low:g} the top-10 cells "
                    f"overlap with Jaccard {num(part['jaccard_top10_mean'])} "
                    f"(top-3: {num(part['jaccard_top3_mean'])}).")
        else:
            spread = "" if missing(part["spearman_std"]) else f" ± {num(part['spearman_std'])}"
            metric = f"Spearman per pair, {tokens}"
            text = (f"Among the {plural(part['n_pairs'], 'pair')} with mean score above {low:g} the Spearman agreement "
                    f"is {num(part['spearman_mean'])}{spread}{_correlated(part)}.")
        out.append(Finding(text, values, **({} if unlike else cite(key, model, layer, subset, metric))))
    if unlike:
        out.append(Finding(
            f"The paper's Fig 3/4 numbers ({paper.get('fig3_spearman_top').model}, one layer at a time) are not set "
            f"beside these: {unlike}, so the comparison is not like for like in kind.", {"paper_comparison": unlike}))
    return out


def plot_agreement(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_by_bin

    bins = df.filter(pl.col("score_bin") != "all", pl.col("n_pairs") > 0)
    # The paper's s > 0.75 value goes on a bin only when one bin is exactly s > 0.75 of cosine scores, (0.75, 1.0].
    fig3 = paper.get("fig3_spearman_top")
    last = bins.filter((pl.col("bin_low") - TOP_SCORE).abs() < 1e-9, (pl.col("bin_high") - 1.0).abs() < 1e-9)
    top_bin = last["score_bin"][0] if last.height else None
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    reference = ({f"paper {fig3.value:.2f} (mpnet exact vs tuned, L11; not like for like)": (top_bin, fig3.value)}
                 if top_bin and not unlike else None)  # fmt: skip
    series = {name: (bins[f"{col}_mean"].to_numpy(), bins[f"{col}_std"].to_numpy())
              for name, col in (("Spearman", "spearman"), ("Pearson", "pearson"), ("top-3 Jaccard", "jaccard_top3"),
                                ("top-10 Jaccard", "jaccard_top10"))}  # fmt: skip
    one, two = run_difference(ctx.facts, ctx.facts2)
    plot_by_bin(bins["score_bin"].to_list(), series, ctx.out / "agreement.png",
                f"Agreement of run ({one}) and run2 ({two})\n{pair_model_label(ctx.facts, ctx.facts2)}, layer "
                f"{_two_layers(ctx)}", "agreement (mean; shaded ± 1 std)",
                counts=bins["n_pairs"].to_list(), reference=reference,
                note=f"n = {int(bins['n_pairs'].sum())} pairs in all")  # fmt: skip
    if unlike:
        star = f"the paper's Fig 3 value is not drawn: {unlike}, not the paper's exact-vs-approximate comparison"
    elif reference:
        star = (f"the star is the paper's Spearman for s > 0.75 ({fig3.model}, layer {fig3.layer}), drawn at the "
                f"{top_bin} bin; not like for like (model and layer differ, see the findings)")
    else:
        star = "the paper's s > 0.75 is not one bin at this bin_width, so its value is not drawn"
    return [("agreement.png", f"Per-pair agreement of run and run2, mean ± std per bin of the pair's mean score; {star}.")]


def _parser_label(ctx: Context) -> str:
    """The parser of the run's parses table as the subset names it ('spacy en_core_web_sm parses'), beside the
    paper's stanza (jobs.paper: Fig 6's subset)."""
    parses = ctx.facts.get("parses") or {}
    parser = (parses.get("parsers") or "unknown parser").strip()
    if ctx.var("parser", None):
        parser = f"{ctx.var('parser', None)} (--var parser)"
    return f"{parser} parses"


def syntactic_relations(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    row = df.row(0, named=True)
    same, mixed, unaligned = row["same_function_share"], row["mixed_share"], row["unaligned_share"]
    parsed = same / (same + mixed) if same + mixed else None
    top_share = ctx.var("top_share", 0.10)
    real = df.filter(~pl.col("relation_a").is_in(["unaligned", "unparsed"]),
                     ~pl.col("relation_b").is_in(["unaligned", "unparsed"]))  # fmt: skip
    # our setting as jobs.paper spells the paper's: the parser is part of the subset (the paper's: stanza)
    setting = (model_label(ctx.facts), layer_label(ctx.facts), f"{subset_label(ctx.facts)}, {_parser_label(ctx)}")
    out = [Finding(
        f"Of the top {100 * top_share:g}% word cells of each pair ({df['n'].sum()} cells), {pct(same)} join two words "
        f"with the same syntactic function, {pct(mixed)} two different functions, and {pct(unaligned)} a word the "
        f"parser did not align ({_parser_label(ctx)}).",
        {"n_cells": int(df["n"].sum()), "same_function_share": same, "mixed_share": mixed,
         "unaligned_share": unaligned, "same_share_of_parsed": parsed},
    )]  # fmt: skip
    if real.height:
        first = real.row(0, named=True)
        kind = "a same-function pair" if first["is_same_function"] else "a pair of two different functions"
        out.append(Finding(
            f"The most frequent relation pair of the top cells is {first['relation_a']}–{first['relation_b']} "
            f"({kind}, {pct(first['share'])} of the top cells); the {min(real.height, 5)} most frequent hold "
            f"{pct(real.head(5)['share'].sum())} of them.",
            {"relation_a": first["relation_a"], "relation_b": first["relation_b"], "share": first["share"],
             "is_same_function": bool(first["is_same_function"]), "top5_share": real.head(5)["share"].sum()},
            **cite("fig6_same_function", *setting, f"the most frequent relation pairs of the top {100 * top_share:g}% "
                   "cells")))  # fmt: skip
        nsubj = real.filter(pl.col("relation_a") == "nsubj", pl.col("relation_b") == "nsubj")
        share = nsubj["share"][0] if nsubj.height else 0.0
        out.append(Finding(
            f"nsubj–nsubj holds {pct(share)} of the top cells.", {"nsubj_share": share},
            **cite("fig6_nsubj_share", *setting, f"share of the top {100 * top_share:g}% cells with relation pair "
                   "nsubj–nsubj")))  # fmt: skip
    if parsed is not None:  # our summary (the paper gives no such split): over cells between two parsed words
        n_parsed = int(real["n"].sum())
        out.append(Finding(
            f"Of the {n_parsed} top cells between two parsed words, {pct(parsed)} join the same syntactic function "
            f"and {pct(1 - parsed)} two different ones (our summary; the paper gives no such split).",
            {"same_share_of_parsed": parsed, "mixed_share_of_parsed": 1 - parsed, "n_parsed_cells": n_parsed}))
    return out


def plot_syntactic_relations(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_ranked_bars

    top = df.head(TOP_K)
    groups = ["same function" if s else ("unaligned / unparsed" if {a, b} & {"unaligned", "unparsed"} else "mixed")
              for a, b, s in zip(top["relation_a"], top["relation_b"], top["is_same_function"])]  # fmt: skip
    labels = [a if a == b else f"{a} – {b}" for a, b in zip(top["relation_a"], top["relation_b"])]
    claim, nsubj = paper.get("fig6_same_function"), paper.get("fig6_nsubj_share")
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}, n = {plural(ctx.facts['n_pairs'], 'pair')}"
    plot_ranked_bars(labels, top["share"].to_numpy() * 100, ctx.out / "syntactic_relations.png",
                     f"Relations of the top word pairs ({top.height} most frequent of {df.height})\n{run}",
                     "share of the top cells (%)", groups=groups,
                     group_colors={"same function": "#1f77b4", "mixed": "#ff7f0e",
                                   "unaligned / unparsed": "#b0b0b0"},
                     note=(f"{int(df['n'].sum())} top cells, {_parser_label(ctx)}. Paper ({nsubj.section}, "
                           f"{nsubj.model}, stanza): {claim.text}; nsubj–nsubj ≈ {nsubj.text}"))  # fmt: skip
    figures = [("syntactic_relations.png", ("The most frequent relation pairs of the top word cells; a single name "
                "means the same relation on both sides. The paper's Fig 6 (stanza parses) finds same-function pairs "
                "the most frequent, nsubj–nsubj about 7%, not a large share of all top attributions."))]  # fmt: skip
    same, mixed = df["same_function_share"][0], df["mixed_share"][0]
    if same + mixed:
        n_parsed = int(df.filter(~pl.col("relation_a").is_in(["unaligned", "unparsed"]),
                                 ~pl.col("relation_b").is_in(["unaligned", "unparsed"]))["n"].sum())  # fmt: skip
        plot_ranked_bars(["same function", "mixed"], 100 * np.array([same, mixed]) / (same + mixed),
                         ctx.out / "syntactic_relations-split.png",
                         f"Top word cells between two parsed words: same function vs mixed\n{run}", "share (%)",
                         groups=["same function", "mixed"],
                         group_colors={"same function": "#1f77b4", "mixed": "#ff7f0e"},
                         note=f"n = {n_parsed} cells, {_parser_label(ctx)}; our summary: the paper gives no such "
                              "split", value_format="{:.1f}%")  # fmt: skip
        figures.append(("syntactic_relations-split.png", (
            "Our summary of the top cells whose two words both have a relation: same function on both sides vs two "
            "different functions. The paper states no such share (its Fig 6 ranks the relation pairs), so no paper "
            "value is drawn.")))  # fmt: skip
    return figures


def _negation_paper(df: pl.DataFrame) -> bool:
    """Whether negation.sql ran with the paper's definition (the default): the total attribution to the not token,
    relative to the prediction f(a, b); else ours (--var definition=word_cells)."""
    return "definition" not in df.columns or df["definition"][0] == "paper"


def _negation_words(df: pl.DataFrame) -> tuple[str, str, str]:
    """(what the not attribution is, the relative size's symbol, its denominator) for the definition used."""
    if _negation_paper(df):
        return paper.NOT_TOTAL, "not / f(a, b)", "the prediction f(a, b) (the score)"
    return "its word cells against every word of the other side", "not / ΣW", "ΣW, the pair's word cells"


def negation(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    share, p90, n = df["share_negative"][0], df["p90_abs_relative"][0], df.height
    mean_relative = df["relative"].mean()
    what, symbol, denominator = _negation_words(df)
    setting = (model_label(ctx.facts), layer_label(ctx.facts), subset_label(ctx.facts))
    paper_def = _negation_paper(df)
    kind = model_variant(ctx.facts)[1] == "exact"
    out = [
        Finding(f"The 'not' attribution ({what}) is negative in {pct(share)} of the {n} pairs that differ by a "
                "standalone 'not'.", {"share_negative": share, "n_pairs": n, "n_negative": int(df["is_negative"].sum()),
                                      "definition": "paper" if paper_def else "word_cells"},
                **cite(_negation_key(ctx), *setting, f"share of negative 'not' attributions "
                       f"({paper.NOT_TOTAL if paper_def else 'word cells'})")),
        Finding(f"In 90% of the pairs |{symbol}| ({denominator}) is at most {num(p90, 3)}; on average the 'not' "
                f"contributes {signed(df['not_attribution'].mean())} (relative size {signed(mean_relative)}).",
                {"p90_abs_relative": p90, "mean_relative": mean_relative,
                 "mean_not_attribution": df["not_attribution"].mean()},
                **cite("fig8_not_relative_exact" if kind else "fig8_not_relative_shelf", *setting,
                       f"90th percentile of |not / f(a, b)| ({paper.NOT_TOTAL})" if paper_def else
                       "90th percentile of |not / ΣW| (word cells)")),
    ]  # fmt: skip
    if "completeness_error" in ctx.columns("pairs"):
        err = ctx.frame("select pair_id, abs(completeness_error) as err from pairs")
        joined = df.join(err, on="pair_id", how="left")
        clear = joined.filter(pl.col("err") < pl.col("not_attribution").abs() / 10)
        out.append(Finding(
            f"The sign is clear (the pair's |completeness error| below a tenth of |not|) in {clear.height} of {n} "
            f"pairs; of those, {int(clear['is_negative'].sum())} are negative. A sign with a larger error is not "
            "counted as evidence either way.",
            {"n_sign_clear": clear.height, "n_negative_sign_clear": int(clear["is_negative"].sum())}))
    return out


def _negation_key(ctx: Context) -> str:
    """The paper's Fig 8 value for this run's kind of model: exact for an exact model, else off the shelf."""
    return "fig8_not_negative_exact" if model_variant(ctx.facts)[1] == "exact" else "fig8_not_negative_shelf"


def plot_negation(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_cdfs, plot_histograms, plot_ranked_bars

    shelf, exact = paper.get("fig8_not_negative_shelf"), paper.get("fig8_not_negative_exact")
    ours = f"this run: {model_label(ctx.facts)}, layer {layer_label(ctx.facts)}"
    n = df.height
    what, symbol, denominator = _negation_words(df)
    plot_ranked_bars([ours, f"paper: {shelf.model}, layer {shelf.layer.split(' (')[0]} (assumed)",
                      f"paper: {exact.model}, layer {exact.layer.split(' (')[0]} (assumed)"],
                     100 * np.array([df["share_negative"][0], shelf.value, exact.value]),
                     ctx.out / "negation-share.png", f"Share of negative 'not' attributions (this run: n = {n} pairs)",
                     "share of pairs (%)",
                     groups=["this run", "paper (Fig 8)", "paper (Fig 8)"],
                     group_colors={"this run": "#1f77b4", "paper (Fig 8)": "#9a9a9a"},
                     note=f"this run: {subset_label(ctx.facts)}, {what}\npaper: {shelf.subset}, {paper.NOT_TOTAL}",
                     value_format="{:.1f}%")  # fmt: skip
    p90 = df["p90_abs_relative"][0]
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}, n = {n} pairs"
    plot_histograms({symbol: df["relative"].to_numpy()}, ctx.out / "negation-hist.png",
                    f"Relative size of the 'not' attribution\n{run}", f"{symbol} ({denominator})", vlines={"0": 0.0})
    marks = {f"90th percentile {p90:.3f}": p90}
    if _negation_paper(df):
        key = "fig8_not_relative_exact" if model_variant(ctx.facts)[1] == "exact" else "fig8_not_relative_shelf"
        ref = paper.get(key)
        marks[f"paper ({ref.model.split()[-1]} mpnet): {ref.value:g}"] = ref.value
    plot_cdfs({f"|{symbol}|": np.abs(df["relative"].to_numpy())}, ctx.out / "negation-cdf.png",
              f"Cumulative share of pairs by |{symbol}|\n{run}", f"|{symbol}|", vlines=marks)  # fmt: skip
    return [("negation-share.png", ("Share of pairs whose 'not' attribution is negative, this run beside the paper's "
             "two values (Fig 8, all-mpnet-base-v2; its layer is our assumption); the settings differ where the labels "
             "do.")),
            ("negation-hist.png", (f"The 'not' attribution ({what}) relative to {denominator}"
             + (" — the paper's definition (Fig 8)." if _negation_paper(df) else
                " — our definition (--var definition=word_cells); the paper's is relative to f(a, b)."))),
            ("negation-cdf.png", "Cumulative share of pairs by the absolute relative size"
             + ("; the paper's 90% bound for its model is marked (another model and subset)." if
                _negation_paper(df) else "."))]  # fmt: skip


def _adjective_means(df: pl.DataFrame) -> pl.DataFrame:
    """Per triplet: the mean synonym and opposite cell over templates (rows without a cell left out)."""
    return (
        df.filter(pl.col("attribution").is_not_null())
        .group_by("triplet")
        .agg(synonym=pl.col("attribution").filter(pl.col("kind") == "synonym").mean(),
             opposite=pl.col("attribution").filter(pl.col("kind") == "opposite").mean())
        .drop_nulls()
        .sort("synonym", descending=True)
    )


# The paper's adjective pairs (Fig 9): two per triplet (anchor–synonym, anchor–opposite) in one template, 46 pairs;
# --dataset adjectives adds three more templates (184 pairs), our extension.
PAPER_TEMPLATE = "This house is X."


def _adjective_summary(df: pl.DataFrame) -> dict[str, Any]:
    cells = df.filter(pl.col("attribution").is_not_null())
    syn, opp = (cells.filter(pl.col("kind") == k)["attribution"] for k in ("synonym", "opposite"))
    per = _adjective_means(df)
    return {"mean_synonym": syn.mean(), "mean_opposite": opp.mean(), "n_synonym": syn.len(), "n_opposite": opp.len(),
            "n_triplets": per.height, "n_synonym_larger": int((per["synonym"] > per["opposite"]).sum()),
            "n_without_cell": df.height - cells.height}  # fmt: skip


def adjectives(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    out = []
    own = df.filter(pl.col("template") == PAPER_TEMPLATE) if "template" in df.columns else df.head(0)
    if own.height:  # the paper's set first: the default comparison
        v = _adjective_summary(own)
        out.append(Finding(
            f"The paper's set (“{PAPER_TEMPLATE}”, two pairs per triplet, {own.height} pairs): the adjective cell "
            f"averages {signed(v['mean_synonym'])} for synonyms and {signed(v['mean_opposite'])} for opposites; the "
            f"synonym's is larger in {v['n_synonym_larger']} of {v['n_triplets']} triplets.",
            {f"paper_set_{k}": x for k, x in v.items()} | {"paper_set_n_pairs": own.height}))  # fmt: skip
    values = _adjective_summary(df)
    n_templates = df["template"].n_unique() if "template" in df.columns else 1
    label = (f"Our extension, all {n_templates} templates pooled ({df.height} pairs)" if own.height and
             n_templates > 1 else f"Over all {df.height} pairs")  # fmt: skip
    if not own.height or n_templates > 1:
        out.append(Finding(
            f"{label}: the adjective cell averages {signed(values['mean_synonym'])} for synonyms and "
            f"{signed(values['mean_opposite'])} for opposites ({values['n_synonym']} and {values['n_opposite']} "
            f"pairs); the synonym's (mean over templates) is larger in {values['n_synonym_larger']} of "
            f"{values['n_triplets']} triplets.", values))  # fmt: skip
    if values["n_without_cell"]:
        out.append(Finding(f"{values['n_without_cell']} adjective pairs have no single adjective cell (the texts "
                           "differ in more than one word, or the cell was pruned by --min-abs).",
                           {"n_without_cell": values["n_without_cell"]}))  # fmt: skip
    return out


def plot_adjectives(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_histograms, plot_paired_dots

    own = df.filter(pl.col("template") == PAPER_TEMPLATE) if "template" in df.columns else df.head(0)
    shown = own if own.height else df
    which = (f"the paper's set, “{PAPER_TEMPLATE}”" if own.height else "all templates")
    run = f"{model_label(ctx.facts)}, layer {layer_label(ctx.facts)}"
    cells = shown.filter(pl.col("attribution").is_not_null())
    plot_histograms({k: cells.filter(pl.col("kind") == k)["attribution"].to_numpy() for k in ("synonym", "opposite")},
                    ctx.out / "adjectives-hist.png",
                    f"Attribution of the adjective pair's cell\n{run}, {which}, n = {cells.height} pairs",
                    "word-cell attribution", bins=24, vlines={"0": 0.0})  # fmt: skip
    per = _adjective_means(df)
    n_templates = df["template"].n_unique() if "template" in df.columns else 1
    plot_paired_dots(per["triplet"].to_list(), per["synonym"].to_numpy(), per["opposite"].to_numpy(),
                     ("anchor–synonym", "anchor–opposite"), ctx.out / "adjectives-triplets.png",
                     f"Adjective cell per triplet, mean over {plural(n_templates, 'template')}\n{run}, "
                     f"n = {df.height} pairs", "word-cell attribution")  # fmt: skip
    figures = [("adjectives-hist.png", "Attribution of the adjective cell in anchor–synonym vs anchor–opposite "
                f"pairs: {which} ({cells.height} pairs)."),
               ("adjectives-triplets.png", "Per triplet (anchor/synonym/opposite), the mean cell over the templates"
                + (" (our extension: the paper uses one template)." if n_templates > 1 else "."))]  # fmt: skip
    return figures


def _placement(rank: int, total: int) -> str:
    third = rank / total
    return "in the top third" if third <= 1 / 3 else ("in the bottom third" if third > 2 / 3 else "in the middle third")


def lexical_ranks(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    k, m = df.height, ctx.var("min_count", 30)
    first, last = df.row(0, named=True), df.row(k - 1, named=True)
    out = [Finding(
        f"Of {k} tokens with at least {m} same-token cells (our reading of the paper's 'words appearing 30 and more "
        f"times': same-token cells, not occurrences), '{first['token']}' attributes most to itself (mean "
        f"{signed(first['mean'])}) and '{last['token']}' least ({signed(last['mean'])}).",
        {"n_tokens": k, "min_count": m, "top": first["token"], "top_mean": first["mean"], "bottom": last["token"],
         "bottom_mean": last["mean"]},
    )]  # fmt: skip
    nots = df.filter(pl.col("token").str.to_lowercase().str.strip_chars_start("Ġ▁") == "not")
    if nots.height:
        r = nots.row(0, named=True)
        out.append(Finding(
            f"'{r['token']}' ranks {r['rank']} of {k} tokens (mean {signed(r['mean'])}), {_placement(r['rank'], k)}.",
            {"token": r["token"], "rank": r["rank"], "n_tokens": k, "mean": r["mean"]}))  # fmt: skip
    return out


def plot_lexical_ranks(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_ranked_bars

    k = min(TOP_K, df.height // 2) if df.height > 2 * TOP_K else df.height
    shown = pl.concat([df.head(k), df.tail(k)]) if df.height > 2 * TOP_K else df
    labels = [f"{t} ({r})" for t, r in zip(shown["token"], shown["rank"])]
    title = (f"Top and bottom {k} of {df.height} tokens by same-token attribution" if df.height > 2 * TOP_K
             else f"{df.height} tokens by same-token attribution")  # fmt: skip
    plot_ranked_bars(labels, shown["mean"].to_numpy(), ctx.out / "lexical_ranks.png", title,
                     "mean attribution of the token to itself (± std)", errors=shown["std"].fill_null(0).to_numpy(),
                     gap_after=k if df.height > 2 * TOP_K else None)  # fmt: skip
    return [("lexical_ranks.png", ("Mean same-token attribution (token_a = token_b) per token, with its rank; "
             "whiskers: one standard deviation."))]  # fmt: skip


def lexical_ranks_compare(df: pl.DataFrame, ctx: Context) -> list[Finding]:
    rho, n = df["spearman"][0], df["n_shared"][0]
    moved = df.with_columns(shift=(pl.col("shared_rank_1") - pl.col("shared_rank_2")).abs()).sort(
        "shift", descending=True).row(0, named=True)  # fmt: skip
    one, two = run_difference(ctx.facts, ctx.facts2)
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    out = [Finding(
        f"The lexical ranks of run ({one}) and run2 ({two}) correlate with Spearman ρ = {num(rho)} over {n} shared "
        f"tokens; '{moved['token']}' "
        f"moves most (shared rank {num(moved['shared_rank_1'], 1)} vs {num(moved['shared_rank_2'], 1)}).",
        {"spearman": rho, "n_shared": n, "most_moved": moved["token"]},
        **({} if unlike else cite("fig10_rank_spearman", pair_model_label(ctx.facts, ctx.facts2), _two_layers(ctx),
                                  subset_label(ctx.facts), _lexical_metric(ctx))),
    )]  # fmt: skip
    if unlike:
        fig10 = paper.get("fig10_rank_spearman")
        out.append(Finding(
            f"The paper's ρ = {fig10.text} ({fig10.figure}: {fig10.model}, layer {fig10.layer}, {fig10.subset}) is "
            f"not set beside this: {unlike}, another kind of comparison.", {"paper_comparison": unlike}))
    return out


def _two_layers(ctx: Context) -> str:
    one, two = layer_label(ctx.facts), layer_label(ctx.facts2)
    return one if one == two else f"{one} vs {two}"


def _lexical_metric(ctx: Context) -> str:
    """The lexical-rank comparison as jobs.paper spells the paper's."""
    special = "ranked" if ctx.var("include_special", True) is not False else "left out"
    return (f"Spearman of lexical ranks, tokens with ≥ {ctx.var('min_count', 30)} same-token cells, special tokens "
            f"{special}")


def plot_lexical_ranks_compare(df: pl.DataFrame, ctx: Context) -> list[tuple[str, str]]:
    from xsbert_core.plots import plot_scatter

    x, y = df["shared_rank_1"].to_numpy(), df["shared_rank_2"].to_numpy()
    shift = np.abs(x - y)
    annotate = sorted(set(np.argsort(x)[:5]) | set(np.argsort(-x)[:3]) | set(np.argsort(-shift)[:4]))
    fig10 = paper.get("fig10_rank_spearman")
    unlike = paper_comparison(ctx.facts, ctx.facts2)
    note = f"n = {len(x)} shared tokens"
    if not unlike:
        note += (f"\npaper ({fig10.figure}): ρ = {fig10.text}, {fig10.model}, layer {fig10.layer}, QQP\n"
                 f"({'like-for-like' if _lexical_like(ctx) else 'not like-for-like'}: see the finding)")
    axis = {k: f"rank in {k} ({model_label(f)}, layer {layer_label(f)})" for k, f in (("run", ctx.facts),
                                                                                      ("run2", ctx.facts2))}
    plot_scatter(x, y, ctx.out / "lexical_ranks_compare.png",
                 f"Lexical ranks of the two runs (Spearman ρ = {num(df['spearman'][0])})", axis["run"], axis["run2"],
                 labels=df["token"].to_list(), annotate=[int(k) for k in annotate], diagonal=True, invert=True,
                 note=note)  # fmt: skip
    paper_part = (f"the paper's ρ (Fig 10) is not drawn: {unlike}" if unlike else
                  "the paper's ρ (Fig 10) is written below the axes")
    return [("lexical_ranks_compare.png", ("Rank of each shared token in both runs (1 = largest mean self-attribution, "
             f"top left); the dashed line is equal rank; {paper_part}."))]


def _lexical_like(ctx: Context) -> bool:
    return not paper.differences(paper.get("fig10_rank_spearman"), {
        "model": pair_model_label(ctx.facts, ctx.facts2), "layer": _two_layers(ctx),
        "subset": subset_label(ctx.facts), "metric": _lexical_metric(ctx)})


@dataclass
class Analysis:
    name: str
    title: str
    paper: str
    check: Callable[[Context], str | None] | None
    summarize: Callable[[pl.DataFrame, Context], list[Finding]]
    plot: Callable[[pl.DataFrame, Context], list[tuple[str, str]]]
    empty: Callable[[pl.DataFrame, Context], str | None] | None = None


# In the paper's order (DESIGN.md §4).
ANALYSES: tuple[Analysis, ...] = (
    Analysis("table1", "Scores vs gold labels", "Table 1", check_table1, table1, plot_table1),
    Analysis("reference_terms", "Reference terms", "Fig 2", check_reference_terms, reference_terms,
             plot_reference_terms),
    Analysis("agreement", "Agreement of two runs", "Fig 3/4", check_agreement, agreement, plot_agreement,
             empty_agreement),
    Analysis("pos_neg_sums", "Positive and negative sums", "Fig 5", check_pos_neg_sums, pos_neg_sums,
             plot_pos_neg_sums),
    Analysis("syntactic_relations", "Syntactic relations of the top word pairs", "Fig 6", check_syntactic_relations,
             syntactic_relations, plot_syntactic_relations),
    Analysis("negation", "Negation", "Fig 8", check_negation, negation, plot_negation, empty_negation),
    Analysis("adjectives", "Adjective synonyms vs opposites", "Table 2, Fig 9", check_adjectives, adjectives,
             plot_adjectives),
    Analysis("lexical_ranks", "Lexical ranks", "Fig 10, Tables 3–4", check_lexical_ranks, lexical_ranks,
             plot_lexical_ranks,
             empty_lexical),
    Analysis("lexical_ranks_compare", "Lexical ranks of two runs", "Fig 10, Tables 3–4", check_lexical_ranks_compare,
             lexical_ranks_compare, plot_lexical_ranks_compare, empty_lexical_compare),
)  # fmt: skip


# --------------------------------------------------------------------------- running the sections
def _write_tables(section: Section, df: pl.DataFrame, ctx: Context) -> None:
    csv, md = f"{section.name}.csv", f"{section.name}.md"
    with open(ctx.out / csv, "w", encoding="utf-8", newline="") as fh:
        _sql.write_csv(df, fh)
    lines = [f"# {section.title}", "", f"`sql/{section.name}.sql` — paper: {section.paper}.", ""]
    lines += [f"- {f.text}" + (f" (paper: {f.paper})" if f.paper else "") for f in section.findings]
    lines += ["", markdown_table(df), ""]
    (ctx.out / md).write_text("\n".join(lines), encoding="utf-8")
    section.files = [csv, md]


def run_analysis(spec: Analysis, ctx: Context) -> Section:
    """Check, run, summarize, write and plot one analysis; a skip or a failure is recorded with its reason."""
    section = Section(spec.name, spec.title, spec.paper)
    try:
        reason = spec.check(ctx) if spec.check else None
        if reason is None:
            df = _sql.run_file(ctx.con, _sql.SQL_DIR / f"{spec.name}.sql")
            reason = spec.empty(df, ctx) if spec.empty else None
    except InputError as exc:  # a table or manifest the file reads is missing: the runner says what makes it
        reason = str(exc)
    except duckdb.Error as exc:
        section.status, section.reason = "failed", f"the query failed: {_sql.error_line(exc, ctx.con)}"
        return section
    if reason is not None:
        section.status, section.reason = "skipped", reason
        return section
    section.frame = ctx.results[spec.name] = df
    section.findings = spec.summarize(df, ctx)
    _write_tables(section, df, ctx)
    try:
        section.figures = spec.plot(df, ctx)
    except Exception as exc:  # noqa: BLE001 - a figure that cannot be drawn must not cost the other sections
        section.status, section.reason = "failed", f"its figure failed: {type(exc).__name__}: {exc}"
    return section


def run_extra_file(path: Path, ctx: Context) -> Section:
    """A sql/ file the report has no section for: its table, and a sentence with its size."""
    section = Section(path.stem, path.stem.replace("_", " ").capitalize(), "—")
    needs_run2 = "getvariable('run2')" in path.read_text(encoding="utf-8")
    if needs_run2 and ctx.run2 is None:
        section.status, section.reason = "skipped", "needs a second run: pass --run2 DIR"
        return section
    try:
        df = _sql.run_file(ctx.con, path)
    except InputError as exc:
        section.status, section.reason = "skipped", str(exc)
        return section
    except duckdb.Error as exc:
        section.status, section.reason = "failed", f"the query failed: {_sql.error_line(exc, ctx.con)}"
        return section
    section.frame = df
    section.findings = [Finding(f"sql/{path.name} returned {df.height} rows (see the table).", {"rows": df.height})]
    _write_tables(section, df, ctx)
    return section


# --------------------------------------------------------------------------- example heatmaps
def _example_pairs(ctx: Context) -> list[tuple[str, str]]:
    """(pair_id, why) of a few interesting pairs: highest and lowest score, the most negative cell, a negation
    pair, an adjective synonym and opposite pair; short pairs (readable labels) first."""
    picked: list[tuple[str, str]] = []

    def add(pid: str | None, why: str) -> None:
        if pid is not None and pid not in [p for p, _ in picked]:
            picked.append((pid, why))

    stored = "coalesce(n_cells, 1) > 0"  # pairs whose cells were all pruned (--min-abs) show nothing
    short = f"coalesce(greatest(n_tokens_a, n_tokens_b), 0) <= {EXAMPLE_MAX_TOKENS + 2} and {stored}"
    for order, why in (("desc", "highest score"), ("asc", "lowest score")):
        pid = ctx.scalar(f"select pair_id from pairs where {short} order by score {order}, pair_id limit 1")
        add(pid or ctx.scalar(f"select pair_id from pairs where {stored} order by score {order}, pair_id limit 1"), why)
    pid = ctx.scalar(f"""
        select cells.pair_id from cells join pairs using (pair_id)
        where {short} and cells.value < 0 order by cells.value, cells.pair_id limit 1""")  # fmt: skip
    add(pid, "the most negative token cell")
    neg = ctx.results.get("negation")
    if neg is not None and neg.height:
        row = neg.sort("not_attribution").row(0, named=True)
        add(row["pair_id"], "negation pair with the smallest 'not' attribution")
    adj = ctx.results.get("adjectives")
    if adj is not None:  # both kinds of one triplet and template, the paper's own if there
        cells = adj.filter(pl.col("attribution").is_not_null()).sort(
            pl.col("template") != "This house is X.", pl.col("triplet") != "beautiful/pretty/ugly", "triplet",
            "template", "kind")  # fmt: skip
        if cells.height:
            first = cells.row(0, named=True)
            both = cells.filter(pl.col("triplet") == first["triplet"], pl.col("template") == first["template"])
            for row in both.sort("kind", descending=True).iter_rows(named=True):
                add(row["pair_id"], f"adjective pair ({row['kind']})")
    return picked


def pair_matrix(ctx: Context, pid: str) -> tuple[np.ndarray, list[str], list[str], str] | None:
    """A pair's token matrix without special tokens (cells not stored, --min-abs, are 0), or its word matrix
    when it has no token cells; None when it has neither."""
    sides = ctx.con.sql("""
        select sa.tokens, sa.word_ids, sa.words, sb.tokens, sb.word_ids, sb.words
        from pairs p join sentences sa on sa.sentence_id = p.sentence_id_a
                     join sentences sb on sb.sentence_id = p.sentence_id_b
        where p.pair_id = ?""", params=[pid]).fetchall()  # fmt: skip
    if not sides:
        return None
    tokens_a, ids_a, words_a, tokens_b, ids_b, words_b = sides[0]
    for table, (x, y), (la, lb) in (("cells", ("i", "j"), (tokens_a, tokens_b)),
                                    ("word_cells", ("u", "v"), (words_a, words_b))):  # fmt: skip
        cells = ctx.con.sql(f"select {x} as x, {y} as y, value from {table} where pair_id = ?", params=[pid]).pl()
        if cells.height and la and lb:
            matrix = np.zeros((len(la), len(lb)))
            matrix[cells["x"].to_numpy(), cells["y"].to_numpy()] = cells["value"].to_numpy()
            if table == "cells":
                rows = [i for i, w in enumerate(ids_a or []) if w is not None] or list(range(len(la)))
                cols = [j for j, w in enumerate(ids_b or []) if w is not None] or list(range(len(lb)))
                return matrix[np.ix_(rows, cols)], [la[i] for i in rows], [lb[j] for j in cols], "token"
            return matrix, list(la), list(lb), "word"
    return None


def plot_examples(ctx: Context) -> Section:
    """Heatmaps of a few real pairs (_example_pairs) with xsbert_core.plots.plot_attributions."""
    from xsbert_core.plots import plot_attributions

    section = Section("examples", "Example pairs", "Fig 1 (heatmaps)")
    if not ctx.facts["n_pairs"]:
        section.status, section.reason = "skipped", "the run has no pairs"
        return section
    if ctx.facts["cells"] != "all":  # a matrix of the stored cells alone would show mostly zeros
        section.status, section.reason = "skipped", f"the run stores --cells {ctx.facts['cells']}, not every cell"
        return section
    for pid, why in _example_pairs(ctx):
        found = pair_matrix(ctx, pid)
        if found is None:
            continue
        matrix, labels_a, labels_b, level = found
        text_a, text_b, score, total = first_row(ctx.con, f"""
            select text_a, text_b, score, attribution_sum from pairs where pair_id = {_quote(pid)}""")  # fmt: skip
        k = len(section.figures) + 1
        name = f"example-{k}.png"
        plot_attributions(matrix, labels_a, labels_b, ctx.out / name,
                          title=f"{why}: score {num(score, 3)}, ΣA {num(total, 3)}")  # fmt: skip
        what = "Token cells, special tokens left out" if level == "token" else "Word cells (no token cells stored)"
        section.figures.append((name, (f"{why.capitalize()} — pair {pid}; rows: “{text_a}”, columns: “{text_b}”. "
                                      f"{what}; red positive, blue negative.")))  # fmt: skip
        section.findings.append(Finding(f"Example {k} ({why}): “{text_a}” / “{text_b}”, score {num(score, 3)}.",
                                        {"pair_id": pid, "score": score, "attribution_sum": total}))  # fmt: skip
    if not section.figures:
        section.status, section.reason = "skipped", "no pair has stored cells"
    return section


# --------------------------------------------------------------------------- the page
def environment() -> jinja2.Environment:
    """The page's templates (jobs/templates/): autoescaping on, so every text (dataset sentences, tokens, reasons)
    is escaped; the formatting in filters."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("jobs", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)  # fmt: skip
    env.filters["plural"] = lambda n, word: plural(n, word)
    env.filters["cell"] = _cell
    return env


def _settings_rows(facts: dict[str, Any]) -> list[tuple[str, str]]:
    layer = facts["layer"] if facts["n_layers"] is None else f"{facts['layer']} of {facts['n_layers']}"
    rows = [
        ("run", f"{facts['run_id']} ({facts['path']})"),
        ("model", str(facts["model"])),
        ("layer", str(layer)),
        ("mode / similarity", f"{facts['mode']} / {facts['similarity']}"),
        ("N (quadrature)", f"{facts['steps']} ({facts['rule']})"),
        ("dataset", " ".join(str(x) for x in (facts["dataset"], facts["split"]) if x)),
        ("pairs", f"{facts['n_pairs']:,} ({facts['n_labelled']:,} labelled; {facts['n_quarantined']:,} quarantined)"),
        ("sentences / cells / word cells", (f"{facts['n_sentences']:,} / {facts['n_cells']:,} / "
                                           f"{facts['n_word_cells']:,}")),
        ("mean |completeness error|", "n/a" if facts["mean_abs_completeness_error"] is None
         else f"{facts['mean_abs_completeness_error']:.2e} (max {facts['max_abs_completeness_error']:.2e})"),
    ]  # fmt: skip
    if facts["min_abs"]:
        rows.append(("cells stored", f"|value| ≥ {facts['min_abs']} (--min-abs)"))
    parses = facts["parses"]
    rows.append(("parses", "none (python -m jobs.parse --run DIR)" if parses is None else
                 f"{parses['parsers']}: {parses['rows']:,} words, {pct(parses['aligned_share'])} aligned one-to-one"))
    return rows


def write_page(sections: list[Section], ctx: Context, command: str) -> Path:
    """index.html from jobs/templates/report.html: commands, settings, the findings, then one part per section."""
    facts = [("run", ctx.facts)] + ([("run2", ctx.facts2)] if ctx.facts2 else [])
    tables = [dict(_settings_rows(f)) for _, f in facts]
    keys = list(dict.fromkeys(k for t in tables for k in t))
    page = environment().get_template("report.html").render(
        run=ctx.facts, note=ctx.note, made=time.strftime("%Y-%m-%d %H:%M"),
        commands=[c for _, f in facts for c in f["commands"]] + [command],
        run_names=[n for n, _ in facts], settings=[(k, [t.get(k, "") for t in tables]) for k in keys],
        sections=sections, preview_rows=PREVIEW_ROWS, serve_url=ctx.serve_url, serve_pages=SERVE_PAGES,
        serve_command=shlex.join(["xsbert", "serve", "--run", str(ctx.run)]
                                 + (["--run2", str(ctx.run2)] if ctx.run2 is not None else [])),
    )  # fmt: skip
    path = ctx.out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.integer, np.floating)):
        return _jsonable(value.item())
    return value


def write_json(sections: list[Section], ctx: Context, command: str) -> Path:
    """report.json: the runs' facts and every section's status, reason, findings (with numbers) and files."""
    doc = {
        "command": command, "run": ctx.facts, "run2": ctx.facts2,
        "sections": [{"name": s.name, "title": s.title, "paper": s.paper, "status": s.status, "reason": s.reason,
                      "findings": [{"text": f.text, "paper": f.paper, "like_for_like": f.like_for_like,
                                    "values": {k: _jsonable(v) for k, v in f.values.items()}} for f in s.findings],
                      "files": s.files, "figures": [name for name, _ in s.figures]} for s in sections],
    }  # fmt: skip
    path = ctx.out / "report.json"
    path.write_text(json.dumps(doc, indent=1, default=str), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- entry point
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run every applicable analysis of sql/ on a run (and a second run), write CSV, Markdown, "
        "figures and index.html into --out, and print the findings.",
    )
    p.add_argument("--run", required=True,
                   help="a run directory (<out>/<run id> of python -m jobs.attribute), local or s3://... / gs://...")
    p.add_argument("--run2", default=None, help="a second run, for the two-run analyses (agreement, lexical ranks)")
    p.add_argument("--out", required=True, help="folder for the report (created; files in it are overwritten)")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="a DuckDB variable for the analyses, e.g. min_count=10, top_share=0.05 (repeatable)")
    p.add_argument("--note", default=None, help="text shown at the top of the page (e.g. the commands that made the runs)")
    p.add_argument("--serve-url", default=SERVE_URL,
                   help=f"where `xsbert serve --run RUN` answers: the page links sections and examples there (default "
                        f"{SERVE_URL}; 'none': no links)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p.parse_args(argv)


def _prepare_out(out: str | Path, runs: list[_sql.Run]) -> Path:
    """Create --out (a local folder) and check it is writable and not a run directory."""
    if _sql.is_remote(out):
        raise InputError(f"--out {out}: the report is written to a local folder (copy it to object storage after)")
    out = Path(out)
    resolved = out.expanduser().resolve()
    for run in runs:
        if isinstance(run, Path) and resolved == run.resolve():
            raise InputError(f"--out {out} is a run directory: choose another folder for the report")
    if resolved.exists() and not resolved.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    try:
        resolved.mkdir(parents=True, exist_ok=True)
        probe = resolved / ".report-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write there ({exc.strerror or exc})") from exc
    return resolved


def open_context(
    run: str | Path, run2: str | Path | None, out: str | Path, variables: dict[str, Any], note: str | None = None
) -> Context:
    """Check the runs and --out, connect (views and variables), read the runs' facts; InputError on bad input."""
    first = _sql.check_run(run)
    second = _sql.check_run(run2, "--run2") if run2 is not None else None
    folder = _prepare_out(out, [first] + ([second] if second else []))
    try:
        con = _sql.connect(first, second, variables)
        facts = run_facts(con, first)
        facts2 = run_facts(con, second, "_2") if second is not None else None
    except duckdb.Error as exc:  # a table that is not readable Parquet, or lacks a column every run has
        raise InputError(f"cannot read the run: {str(exc).strip().splitlines()[0]}") from exc
    return Context(con, first, second, folder, facts, facts2, note=note)


def clear_previous(out: Path) -> None:
    """Remove the tables and figures of an earlier report in `out` (one with report.json), so that a section
    skipped now leaves no stale files; nothing else is touched."""
    if not (out / "report.json").is_file():
        return
    names = {spec.name for spec in ANALYSES} | {p.stem for p in _sql.SQL_DIR.glob("*.sql")}
    for path in out.iterdir():
        stem = path.name.split(".")[0].split("-")[0]
        if path.is_file() and path.suffix in (".csv", ".md", ".png") and (stem in names or stem == "example"):
            path.unlink()


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Write the report; returns {'out', 'sections': [Section], 'summary': [lines]}."""
    ctx = open_context(args.run, args.run2, args.out, _sql.parse_vars(args.var), args.note)
    serve_url = getattr(args, "serve_url", SERVE_URL)
    ctx.serve_url = None if serve_url in (None, "", "none") else serve_url.rstrip("/")
    out, facts = ctx.out, ctx.facts
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    if args.note:  # the note is on the page already: the command names it
        argv = ["(the note above)" if a == args.note else a.replace(args.note, "(the note above)") for a in argv]
    command = f"{PROG} " + shlex.join(argv)

    clear_previous(out)
    sections = [run_analysis(spec, ctx) for spec in ANALYSES]
    known = {spec.name for spec in ANALYSES}
    sections += [run_extra_file(p, ctx) for p in sorted(_sql.SQL_DIR.glob("*.sql")) if p.stem not in known]
    sections.append(plot_examples(ctx))
    write_page(sections, ctx, command)
    write_json(sections, ctx, command)

    summary = [(f"report: {out / 'index.html'} ({facts['n_pairs']} pairs, {facts['model']}, layer {facts['layer']}, "
               f"{facts['mode']})")]  # fmt: skip
    if not facts["n_pairs"]:
        summary.append("the run has 0 pairs: nothing to analyse")
    for s in sections:
        if s.name == "examples":
            summary.append(f"examples: {plural(len(s.figures), 'heatmap')}" if s.status == "ok"
                           else f"examples: {s.status}: {s.reason}")  # fmt: skip
        elif s.status == "ok":
            summary += [f"{s.name}: {f.text}" + (f" (paper: {f.paper})" if f.paper else "") for f in s.findings]
        else:
            summary.append(f"{s.name}: {s.status}: {s.reason}")
    if not args.quiet:
        print("\n".join(summary), flush=True)
    return {"out": out, "sections": sections, "summary": summary}


def cli(argv: list[str] | None = None) -> int:
    """Exit 0 when the report is written (skips included), 1 when an analysis failed, 2 on bad input."""
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        result = main(args)
    except XsbertError as exc:
        print(f"{PROG.split()[-1]}: error: {exc}", file=sys.stderr)
        return 2
    failed = [s for s in result["sections"] if s.status == "failed"]
    for s in failed:
        print(f"{PROG.split()[-1]}: {s.name} failed: {s.reason}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(cli())
