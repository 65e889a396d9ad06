"""A run's facts (settings from its manifest, counts from its views) and our setting spelled as jobs.paper spells
the paper's (model, layer, subset), so that a finding can stand beside the paper's number like for like."""

from __future__ import annotations

import json
import shlex
from dataclasses import fields
from typing import Any

import duckdb

from xsbert_core import InputError

from .. import paper, sqlrun
from ..config import RunConfig
from ..store import MANIFEST, selections
from .base import Context, first_row


def run_facts(con: duckdb.DuckDBPyConnection, run: sqlrun.Run, suffix: str = "") -> dict[str, Any]:
    """Settings (manifest config) and counts of one run, from its views."""
    manifest_path = sqlrun.join(run, MANIFEST)
    try:
        text = sqlrun.read_text(manifest_path)
        manifest = json.loads(text) if text is not None else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{manifest_path}: not readable JSON ({exc})") from exc
    if manifest is None:  # a report of "unknown model, layer None" would read as a finding
        raise sqlrun.no_manifest(run, "--run2" if suffix else "--run")
    if not isinstance(manifest, dict):
        raise InputError(f"{manifest_path}: not a JSON object")
    config = manifest.get("config") or {}
    dataset = config.get("dataset") or {}
    counts = first_row(con, f"""
        select count(*), count(label), avg(abs(completeness_error)), max(abs(completeness_error)),
               min(score), max(score)
        from pairs{suffix}""")  # fmt: skip
    facts: dict[str, Any] = {
        "path": str(run),
        "run_id": manifest.get("run_id", sqlrun.run_name(run)),
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
        "selections": selections(manifest),
    }
    if sqlrun.has_table(run, "parses"):
        parsers, rows, aligned = first_row(con, f"""
            select string_agg(distinct parser || ' ' || coalesce(parser_model, ''), ', '), count(*), avg(aligned::int)
            from parses{suffix}""")  # fmt: skip
        facts["parses"] = {"parsers": parsers, "rows": rows, "aligned_share": aligned}
    for entry in manifest.get("runs") or []:
        if isinstance(entry, dict):
            # the invocation's own command (recorded since 2026-12-01), else one made from the config
            facts["commands"].append(entry.get("command") or attribute_command(config, entry.get("selection") or {}))
    return facts


def selection_label(selection: dict[str, Any]) -> str:
    """'STS-B test: a seeded sample of 300 of its 1,379 rows (--sample 300 --seed 0)' and the like."""
    dataset = str(selection.get("dataset") or "unknown dataset")
    name = " ".join(str(x) for x in (DATASET_NAMES.get(dataset, dataset), selection.get("split")) if x)
    total = selection.get("n_source_rows")
    of = f" of its {total:,} rows" if isinstance(total, int) else ""
    sample, limit = selection.get("sample"), selection.get("limit")
    if sample is not None:
        rows = f"a seeded sample of {sample:,}{of or ' rows'} (--sample {sample} --seed {selection.get('seed', 0)})"
        if limit is not None:
            rows += f", its first {limit:,} (--limit {limit})"
    elif limit is not None:
        rows = f"the first {limit:,}{of or ' rows'} (--limit {limit})"
    else:
        rows = f"every row ({total:,})" if isinstance(total, int) else "every row"
    return f"{name}: {rows}"


def coverage_label(facts: dict[str, Any]) -> str:
    """Which pairs a report covers: the run's pair count and the selection(s) of rows that put them there; a run
    folder grown by several selections (e.g. --sample 10, then --sample 20) holds, and the report covers, their
    union."""
    n, found = facts["n_pairs"], facts.get("selections") or []
    pairs = f"{n:,} pairs" if n != 1 else "1 pair"
    quarantined = f" ({facts['n_quarantined']:,} more quarantined)" if facts.get("n_quarantined") else ""
    if not found:
        return f"the run's {pairs}{quarantined}; manifest.json records no selection"
    parts = [selection_label(s) + (f", {s['n_in']:,} pairs in" if s.get("n_in") is not None else "")
             for s in found]  # fmt: skip
    if len(found) == 1:
        return f"the run's {pairs}{quarantined}, from {parts[0]}"
    return (f"the run's {pairs}{quarantined}: the union of {len(found)} selections written into this run folder "
            f"({'; '.join(parts)})")


def attribute_command(config: dict[str, Any], selection: dict[str, Any]) -> str:
    """A jobs.attribute command equivalent to one invocation recorded in manifest.json (config + selection), for a
    store whose invocations did not record their own: every key of the run id that has a flag (a key absent from
    the config is at the value that left it out: RunConfig's `omitted_at`)."""
    dataset = config.get("dataset") or {}
    flags: list[str] = ["--dataset", str(selection.get("dataset") or dataset.get("name"))]
    if selection.get("split") or dataset.get("split"):
        flags += ["--split", str(selection.get("split") or dataset.get("split"))]
    if selection.get("sample") is not None:
        flags += ["--sample", str(selection["sample"]), "--seed", str(selection.get("seed", 0))]
    if selection.get("limit") is not None:
        flags += ["--limit", str(selection["limit"])]
    adaptive = config.get("tolerance") is not None
    omitted = {f.name: f.metadata["omitted_at"] for f in fields(RunConfig) if "omitted_at" in f.metadata}
    for key, flag in (("model", "--model"), ("layer", "--layer"), ("mode", "--mode"), ("similarity", "--similarity"),
                      ("rule", "--rule"), ("steps", "--steps"), ("tolerance", "--tolerance"),
                      ("max_steps", "--max-steps"), ("min_abs", "--min-abs"), ("truncation", "--truncation"),
                      ("precision", "--precision"), ("cells", "--cells"), ("prompt", "--prompt"),
                      ("refine", "--refine")):  # fmt: skip
        value = config.get(key, omitted.get(key))
        if value is None or (key == "min_abs" and not value) or (key in ("max_steps", "refine") and not adaptive):
            continue  # defaults: no pruning; max-steps and refine only matter with a tolerance
        if key == "prompt" and not value:
            continue
        flags += [flag, str(value)]
    if config.get("exclude_prompt"):
        flags.append("--exclude-prompt")
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
    """'STS-B test (300 pairs)', '..., s > 0.75'; the negation dataset as jobs.paper names the paper's, with the run's
    STS-B split (--split; test by default)."""
    n = facts["n_pairs"] if n_pairs is None else n_pairs
    dataset = str(facts.get("dataset") or "unknown dataset")
    if dataset == "negation":
        text = f"STS-B {facts.get('split') or 'test'} sentences with one simple 'not' ({n:,} pairs)"
    else:
        name = " ".join(str(x) for x in (DATASET_NAMES.get(dataset, dataset), facts.get("split")) if x)
        text = f"{name} ({n:,} pairs)"
    return f"{text}, {scores}" if scores else text


def cite(key: str, model: str, layer: str, subset: str, metric: str) -> dict[str, Any]:
    """Finding fields for the paper's value `key` beside ours (our model, layer, subset and metric, spelled as
    jobs.paper spells the paper's): {'paper': text, 'like_for_like': bool, 'paper_key': key, 'differs': [the
    settings that differ]}."""
    value = paper.get(key)
    ours = {"model": model, "layer": layer, "subset": subset, "metric": metric}
    differs = paper.differences(value, ours)
    return {"paper": paper.beside(value, ours), "like_for_like": not differs, "paper_key": key, "differs": differs}


def two_layers(ctx: Context) -> str:
    one, two = layer_label(ctx.facts), layer_label(ctx.facts2)
    return one if one == two else f"{one} vs {two}"


def two_subsets(ctx: Context) -> str:
    """The two runs' data, once where they hold the same (dataset, split and number of pairs): 'QQP (2,000 pairs)',
    else 'QQP (2,000 pairs) vs QQP (700 pairs)' (a run stopped early holds fewer)."""
    one, two = subset_label(ctx.facts), subset_label(ctx.facts2)
    return one if one == two else f"{one} vs {two}"
