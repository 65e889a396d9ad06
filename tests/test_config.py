"""jobs/config.py: the typed settings of an attribution run, one field per jobs.attribute flag; RunConfig, the run id's
fields listed once; the pipeline's study config and the command line give the same settings; no argv or
argparse.Namespace below the entry points."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import re
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
    assert (Attribution(tolerance=0.1).steps, Attribution(tolerance=0.1).tolerance) == (config.DEFAULT_STEPS, 0.1)


@pytest.mark.parametrize("argv,given", [
    ([], {}),
    (["--steps", "8"], {"steps": 8}),
    (["--tolerance", "0.01"], {"tolerance": 0.01}),
    (["--steps", "4", "--tolerance", "0.01"], {"steps": 4, "tolerance": 0.01}),
])  # fmt: skip
def test_the_constructor_and_the_command_line_agree_on_n(argv, given):
    """The steps/tolerance rule lives in Attribution: `Attribution(steps=8)` is `--steps 8`, a fixed N (before, the
    constructor kept the default tolerance: adaptive from 8)."""
    from jobs.attribute import settings

    assert Attribution(**given) == settings(["--dataset", "stsb", *argv]).attribution


def test_the_engine_settings_of_the_job_are_xsbert_explains():
    """The job's attribution flags are the engine's (xsbert_core.EngineSettings, `xsbert explain`'s) and its own; the
    engine gets the job's settings as one object, with the engine's truncation."""
    from xsbert_core import EngineSettings

    engine = {f.name for f in dataclasses.fields(EngineSettings)}
    assert engine < {f.name for f in dataclasses.fields(Attribution)}
    a = Attribution(model="m", layer=2, steps=4, truncation="quarantine", prompt="q: ", exclude_prompt=True)
    assert a.engine == EngineSettings(model="m", layer=2, steps=4, tolerance=None, truncation="warn", prompt="q: ",
                                      exclude_prompt=True)  # fmt: skip
    assert Attribution(truncation="error").engine.truncation == "error"


def test_run_config_leaves_out_the_settings_older_stores_lacked():
    base = dict(store_version=3, code_version="0", model="m", weights_sha256="w", mode="approx", similarity="cos",
                layer=3, n_layers=6, rule="gauss-legendre", steps=16, tolerance=None, max_steps=None,
                truncation="quarantine", min_abs=0.0, dataset={"name": "stsb"})  # fmt: skip
    plain = RunConfig(**base).as_dict()
    assert plain == base  # cells=all and precision=fp32: not in the config, so the run ids of older stores stand
    assert RunConfig(**base, cells="all", precision="fp32").as_dict() == base
    assert RunConfig(**base, cells="none", precision="bf16").as_dict() == {**base, "cells": "none", "precision": "bf16"}


def test_bench_sql_run_ids_are_unchanged():
    """The SQL benchmark's synthetic runs (bench/synthstore/runs.py) build their config as a RunConfig: the same dict (and run ids) as the one it
    wrote by hand before (recorded from 3f026a2)."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from synthstore import runs as bench_sql
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from jobs.store import run_id

    assert run_id(bench_sql.run_config(3, 1000, 0)) == BENCH_SQL_RUN_ID


def test_the_pipeline_config_is_made_from_the_jobs_fields():
    """The study config's blocks are the settings' fields (their name or `key`), with their choices, bounds and help:
    declared once, in jobs/config.py."""
    from jobs.study import schema as study_schema

    def keys(cls, skip=()):
        return {f.metadata.get("key", f.name) for f in dataclasses.fields(cls)
                if f.metadata.get("study", True) and f.name not in skip}  # fmt: skip

    assert set(study_schema.Attribution.model_fields) == keys(Attribution, skip=("model",))
    assert set(study_schema.Ray.model_fields) == keys(config.Execution)
    assert set(study_schema.Dataset.model_fields) == keys(config.Selection) | {"hub"}
    assert "address" in study_schema.Ray.model_fields and "source" in study_schema.Dataset.model_fields
    for cls, block in ((Attribution, study_schema.Attribution), (config.Execution, study_schema.Ray)):
        for f in dataclasses.fields(cls):
            if f.name in block.model_fields:
                assert block.model_fields[f.name].description == study_schema.described(
                    f.metadata["help"], f.metadata.get("study_help")), f.name  # fmt: skip
    with pytest.raises(study_schema.ValidationError, match="Input should be 'all', 'same-token' or 'none'"):
        study_schema.Attribution(cells="some")
    with pytest.raises(study_schema.ValidationError, match="greater than or equal to 1"):
        study_schema.Ray(wave_size=0)


def test_a_study_and_a_command_line_give_the_same_settings(tmp_path):
    from jobs import pipeline
    from jobs.attribute import settings
    from jobs.study import schema as study_schema

    path = tmp_path / "s.yaml"
    path.write_text("study: s\nout: o\ndatasets:\n  d: {source: owner/pairs, text_a: q1, keep: [a, b], sample: 3}\n"
                    "models:\n  m: some/model\ndefaults: {steps: 8, cells: same-token}\n"
                    "runs:\n  r: {dataset: d, model: m, layer: 2, tolerance: 0.01}\n"
                    "ray: {executor: local, address: auto, wave_size: 4}\n")  # fmt: skip
    job = study_schema.job_settings(pipeline.load_config(path), "r")
    argv = ["--dataset", "owner/pairs", "--text-a-column", "q1", "--keep-columns", "a,b", "--sample", "3", "--model",
            "some/model", "--steps", "8", "--cells", "same-token", "--layer", "2", "--tolerance", "0.01",
            "--executor", "local", "--ray-address", "auto", "--wave-size", "4", "--out", "o"]  # fmt: skip
    assert job == settings(argv)


# Run ids of the embedded default study (configs/default.yaml), recorded from the code of 702d563: what the
# pipeline's settings give, the same as the command lines of its summaries.
DEFAULT_STUDY_RUN_IDS = {"stsb": "9a0cb5e52af890e8", "negation": "dddf9a50c113f6bb", "adjectives": "37ef5df30de3b792"}


@pytest.mark.slow
def test_the_default_studys_run_ids_are_unchanged(tmp_path):
    from jobs import pipeline
    from jobs.attribute import settings
    from jobs.attribution.prepare import prepare
    from jobs.study import schema as study_schema

    study = pipeline.load_config(ROOT / "configs" / "default.yaml")
    for name, want in DEFAULT_STUDY_RUN_IDS.items():
        job = study_schema.job_settings(study, name)
        job = dataclasses.replace(job, output=dataclasses.replace(job.output, out=str(tmp_path / "peek")))
        prep = prepare(job)
        prep.work.discard()
        assert prep.run_id == want, name
        assert settings(job.command()) == job


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
        "vars", "command", "study"}
    assert ReportSettings.from_args(report.parse_args(rep.flags()), command=None) == rep


def test_a_setting_out_of_its_bounds_fails_when_made_naming_its_flag():
    """A field's bounds (ge, gt, lt), declared once in its metadata, are checked when the settings are made (the
    command line's values too, before anything loads); unset (None) passes."""
    from xsbert_core import InputError
    from xsbert_core.settings import EngineSettings

    for make, message in ((lambda: EngineSettings(steps=0), "--steps must be >= 1, got 0"),
                          (lambda: Attribution(tolerance=0.0), "--tolerance must be > 0, got 0.0"),
                          (lambda: config.Execution(max_retries=-1), "--max-retries must be >= 0, got -1"),
                          (lambda: config.Selection("stsb", limit=0), "--limit must be >= 1, got 0"),
                          (lambda: config.Output(store_retry_s=-1.0), "--store-retry-s must be >= 0, got -1.0"),
                          (lambda: config.Selection("stsb", label_range="5:0"),
                           "--label-range 5:0: LO is above HI, so every label would be quarantined"),
                          (lambda: config.Selection("stsb", label_range="nan:5"),
                           "--label-range must be LO:HI of two numbers, got 'nan:5'")):  # fmt: skip
        with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
            make()
    assert config.Execution(num_actors=None, max_retries=0).max_retries == 0


@pytest.mark.parametrize("argv,message", [
    (["--config", "configs/default.yaml"],
     "--config configs/default.yaml: only a hub dataset or a `datasets` folder takes a config, and stsb is a file; a "
     "study config runs with python -m jobs.pipeline --config configs/default.yaml"),
    (["--dataset", "negation", "--config", "mrpc"],
     "--config mrpc: only a hub dataset or a `datasets` folder takes a config, and negation is generated"),
    (["--dataset", "jobs/data/stsb.tsv.gz", "--config", "study.yml"],
     "--config study.yml: only a hub dataset or a `datasets` folder takes a config, and jobs/data/stsb.tsv.gz is "
     "a file; a study config runs with python -m jobs.pipeline --config study.yml"),
])  # fmt: skip
def test_a_config_for_a_dataset_not_from_the_hub_is_one_line_before_anything_is_made(tmp_path, capsys, argv, message):
    """jobs.attribute --config is a hub dataset's config: given for any other dataset it had been dropped without a
    word (`--config configs/default.yaml` attributed the embedded STS-B sample); now one line, exit 2, --out not made,
    and a study YAML is pointed to jobs.pipeline."""
    from jobs.attribute import cli, settings

    out = tmp_path / "runs"
    assert cli([*argv, "--executor", "local", "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"jobs.attribute: error: {message}\n"
    assert not out.exists()
    # a hub dataset (or a `datasets` folder) keeps its config
    assert settings(["--dataset", "nyu-mll/glue", "--config", "mrpc"]).selection.config == "mrpc"


def test_a_study_config_for_a_dataset_not_from_the_hub_names_its_key(tmp_path):
    from jobs.study.schema import load_config
    from xsbert_core import InputError

    with pytest.raises(InputError, match=r"datasets\.stsb: config mrpc: only a hub dataset or a `datasets` folder "
                                         r"takes a config, and stsb is a file$"):
        load_config(ROOT / "configs/default.yaml", ["datasets.stsb.config=mrpc"])


def _help_parsers() -> dict:
    """Each command whose flags are settings (add_arguments) or its own (jobs.train, jobs.evaluate): its parser."""
    import argparse

    from jobs import evaluate, train
    from xsbert_core.cli import build_parser
    from xsbert_core.errors import CommandParser
    from xsbert_core.settings import add_arguments

    def of(*classes) -> argparse.ArgumentParser:
        p = CommandParser(prog="x")
        for cls in classes:
            add_arguments(p, cls)
        return p

    explain = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["explain"]
    return {"jobs.attribute": of(*GROUPS.values()), "jobs.parse": of(config.ParseSettings),
            "jobs.report": of(config.ReportSettings), "xsbert explain": explain, "jobs.train": train.build_parser(),
            "jobs.evaluate": evaluate.build_parser()}  # fmt: skip


@pytest.mark.parametrize("command", ["jobs.attribute", "jobs.parse", "jobs.report", "xsbert explain", "jobs.train",
                                     "jobs.evaluate"])  # fmt: skip
def test_help_gives_every_flag_a_line_and_its_default(command):
    """--help shows each flag's default (docs/CLUSTER.md says it does): a flag with a default (not None, an empty list
    or a switch's False) whose help does not state it gets ` (default: ...)`; and no flag is bare."""
    import argparse

    parser = _help_parsers()[command]
    text = parser.format_help()
    entries: dict[str, str] = {}
    for block in re.split(r"\n(?=  -)", text):  # one block per option: `  --flag METAVAR  help...`
        if block.startswith("  -"):
            words = " ".join(block.split())
            for option in re.findall(r"(?:^|, )(-{1,2}[\w-]+)", words):
                entries[option] = words
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        entry = entries[action.option_strings[-1]]
        assert action.help, f"{command} {action.option_strings[-1]}: no help"
        if action.nargs != 0 and action.default not in (None, [], ()):
            assert "default" in entry, f"{command} {action.option_strings[-1]}: its default is not shown: {entry}"
    shown = " ".join(text.split())
    expected = {"xsbert explain": ["negative counts from the top (default: -3)", "(default: gauss-legendre)",
                                   "(default: 512)", "(default: none, a fixed N)"],
                "jobs.attribute": ["seed of --sample (default: 0)", "(default: runs)", "(default: 3)"],
                "jobs.train": ["AdamW learning rate (default: 2e-05)", "(default: -1, no cap)", "(default: 16)"],
                "jobs.evaluate": ["(default: 4,8,16,32,64,128)", "(default: last-epoch)", "(default: 1000,"]}
    for words in expected.get(command, []):
        assert words in shown, (command, words)


def test_each_commands_help_of_the_execution_flags_is_true_there():
    """jobs.evaluate takes jobs.attribute's execution flags: their help names no flag of jobs.attribute's that means
    another thing there (--out is evaluate's results folder, its store root is --runs) and says nothing of a study;
    what --executor means in a study is said in the study config's schema."""
    from jobs.study.schema import Study

    for command in ("jobs.attribute", "jobs.evaluate"):
        text = " ".join(_help_parsers()[command].format_help().split())
        cell_writer = text[text.index("--cell-writer {auto,workers,driver} who"):]
        assert "--out" not in cell_writer[:cell_writer.index(" --device")], command
        assert "local store root" in cell_writer
        assert "In a study" not in text and "stages 1-2" not in text, command
    ray = Study.model_json_schema()["$defs"]["Ray"]["properties"]
    assert ray["executor"]["description"].endswith(". In a study: the train, attribute and parse stages (jobs.parse "
                                                   "--executor local)")  # fmt: skip


def test_the_reports_serve_url_is_where_xsbert_serve_answers_by_default():
    """Declared once, in jobs.config (which imports no DuckDB), as `xsbert serve`'s --host and --port defaults and the
    URL the reports link to; the study schema says the same URL."""
    import subprocess
    import sys

    from jobs.serve import add_parsers
    from jobs.study.schema import Study

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="verb"))
    served = parser.parse_args(["serve", "--run", "r"])
    assert config.SERVE_URL == f"http://{served.host}:{served.port}" == config.ReportSettings("r", "o").serve_url
    assert f"(default {config.SERVE_URL};" in Study.model_json_schema()["$defs"]["Report"]["properties"]["serve_url"][
        "description"]  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", "import sys, jobs.config; print('duckdb' in sys.modules)"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert loaded.strip() == "False"
