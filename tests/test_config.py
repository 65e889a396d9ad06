"""jobs/config.py: the typed settings of an attribution run, one field per jobs.attribute flag; RunConfig, the run id's
fields listed once; the pipeline's study config and the command line give the same settings; no argv or
argparse.Namespace below the entry points."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from jobs import config
from jobs.config import GROUPS, Attribution, JobSettings, RunConfig

ROOT = Path(__file__).resolve().parents[1]


def _flag_dests() -> set[str]:
    from jobs.attribute import parse_args

    return set(vars(parse_args(["--dataset", "stsb"])))


def test_every_flag_is_one_field_of_one_group():
    fields = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(fields) == len(set(fields))  # no field in two groups
    assert set(fields) == _flag_dests()


@pytest.mark.parametrize("argv", [
    ["--dataset", "stsb"],
    [],
    ["--dataset", "qqp", "--limit", "9", "--steps", "8", "--layer", "2", "--cells", "same-token", "--quiet"],
    ["--dataset", "x.tsv", "--steps", "4", "--tolerance", "0.01", "--max-steps", "64", "--precision", "bf16",
     "--executor", "local", "--num-actors", "3", "--gpus-per-actor", "0.5", "--out", "s3://b/p", "--store-retry-s", "9",
     "--keep-columns", "a,b", "--label-range", "0:5", "--min-abs", "0.01", "--truncation", "warn", "--seed", "3"],
    ["--tolerance", "0.01"],
])  # fmt: skip
def test_the_command_of_settings_gives_the_same_settings(argv):
    from jobs.attribute import settings

    job = settings(argv)
    assert settings(job.command()) == job


def test_adaptive_n_is_the_default_and_steps_alone_a_fixed_n():
    from jobs.attribute import settings

    assert (settings([]).attribution.steps, settings([]).attribution.tolerance) == (
        config.DEFAULT_STEPS, config.DEFAULT_ADAPTIVE_TOLERANCE)  # fmt: skip
    assert (settings(["--steps", "8"]).attribution.steps, settings(["--steps", "8"]).attribution.tolerance) == (8, None)
    assert Attribution.steps_and_tolerance(None, 0.1) == (config.DEFAULT_STEPS, 0.1)


def test_run_config_leaves_out_the_settings_older_stores_lacked():
    base = dict(store_version=3, code_version="0", model="m", weights_sha256="w", mode="approx", similarity="cos",
                layer=3, n_layers=6, rule="gauss-legendre", steps=16, tolerance=None, max_steps=None,
                truncation="quarantine", min_abs=0.0, dataset={"name": "stsb"})  # fmt: skip
    plain = RunConfig(**base).as_dict()
    assert plain == base  # cells=all and precision=fp32: not in the config, so the run ids of older stores stand
    assert RunConfig(**base, cells="all", precision="fp32").as_dict() == base
    assert RunConfig(**base, cells="none", precision="bf16").as_dict() == {**base, "cells": "none", "precision": "bf16"}


def test_bench_sql_run_ids_are_unchanged():
    """bench/sql.py's synthetic runs build their config as a RunConfig: the same dict (and run ids) as the one it
    wrote by hand before (recorded from 3f026a2)."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import sql as bench_sql
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from jobs.store import run_id

    assert run_id(bench_sql.run_config(3, 1000, 0)) == BENCH_SQL_RUN_ID


def test_the_pipeline_config_names_the_jobs_fields():
    from jobs import pipeline

    attribution = {f.name for f in dataclasses.fields(Attribution)}
    assert set(pipeline.Attribution.model_fields) <= attribution
    execution = {f.name for f in dataclasses.fields(config.Execution)}
    assert {"ray_address" if f == "address" else f for f in pipeline.Ray.model_fields} <= execution


def _namespace_users(path: Path) -> list[str]:
    """Functions of `path` that take an argparse.Namespace or an argv."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for a in node.args.args + node.args.kwonlyargs:
                text = ast.unparse(a.annotation) if a.annotation else ""
                if "Namespace" in text or a.arg == "argv":
                    out.append(node.name)
    return sorted(set(out))


def test_no_namespace_or_argv_below_the_entry_points():
    """jobs.attribute's machinery takes JobSettings (or one of its groups): only the entry points (parse_args,
    settings, main, cli) see a command line."""
    files = [ROOT / "jobs" / name for name in ("attribute.py", "config.py", "parse.py", "report.py", "pipeline.py")]
    for folder in ("attribution", "parsing", "analyses", "store"):
        files += sorted((ROOT / "jobs" / folder).glob("*.py"))
    for path in files:
        if path.is_file():
            assert set(_namespace_users(path)) <= {"parse_args", "settings", "main", "cli", "from_args"}, path


def test_job_settings_are_frozen():
    from jobs.attribute import settings

    job = settings(["--dataset", "stsb"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.attribution.steps = 3  # type: ignore[misc]
    assert isinstance(job, JobSettings)


BENCH_SQL_RUN_ID = "05f98437ab4484b8"  # bench/sql.py's run_config(3, 1000, 0) at 3f026a2


def test_parse_and_report_settings_have_one_field_per_flag():
    """jobs.parse and jobs.report take typed settings too (the pipeline builds them without a command line)."""
    from jobs import parse, report
    from jobs.config import ParseSettings, ReportSettings

    args = parse.parse_args(["--run", "runs/a", "runs/b", "--parser", "spacy", "--num-actors", "2", "-q"])
    job = ParseSettings.from_args(args)
    assert job == ParseSettings(runs=("runs/a", "runs/b"), parser="spacy", num_actors=2, quiet=True)
    assert {f.name for f in dataclasses.fields(ParseSettings)} == (set(vars(args)) - {"run"}) | {"runs"}
    assert ParseSettings.from_args(parse.parse_args(["--run", "r"])) == ParseSettings(runs=("r",))  # same defaults

    argv = ["--run", "r1", "--out", "o", "--run2", "r2", "--var", "min_count=3", "--note", "n", "-q"]
    rep = ReportSettings.from_args(report.parse_args(argv), command=None)
    assert {f.name for f in dataclasses.fields(ReportSettings)} == (set(vars(report.parse_args(argv))) - {"var"}) | {
        "vars", "command"}
    assert ReportSettings.from_args(report.parse_args(rep.flags()), command=None) == rep
