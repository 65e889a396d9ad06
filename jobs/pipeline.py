"""A whole study in one command: attribute every run of a config, parse, analyse, report.

    python -m jobs.pipeline --config configs/default.yaml               # the README's `make run`
    python -m jobs.pipeline --config configs/default.yaml --set datasets.stsb.sample=300 --set out=runs-300
    ray job submit --working-dir . -- python -m jobs.pipeline --config configs/qqp-local.yaml

Stages, each skipped when its output is up to date for the same config:

    train      the models the config declares with `train:` (base, variant, recipe), each fine-tuned once per model
               id (the hash of what changes its weights: jobs/training/study.py) into <models_dir>/<id>/ and reused after;
               the runs on it follow
    attribute  jobs.attribute's stages (prepare -> attribute) per run: a run id hashes what changes the
               numbers, so an unchanged run computes nothing and a grown dataset only its new pairs
    parse      jobs.parse over the runs with sentences not parsed yet (spaCy/stanza UD parses)
    report     jobs.report per run and per comparison; redone only when a run's tables, the sql/ files,
               the report code or its variables changed (their fingerprint is kept in <report>/pipeline.json)

Then <report>/index.html shows the reports' key figures, their headline numbers beside the paper's and their findings
(jobs/analyses/study.py), and the findings are printed one line each.

The config is validated (pydantic, extra keys forbidden) before anything is computed; every problem is one
line `jobs.pipeline: error: ...` and exit 2. The schema is `Study` (jobs/study/schema.py); configs/*.yaml are
examples. The machinery is in jobs/study/: the schema, what tells a stage it is up to date (state.py), the stages.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from typing import Any

from xsbert_core.cli import writable_folder
from xsbert_core.errors import CommandParser, exit_status

from .attribution.hooks import Hooks
from .store import Location
from .study.schema import config_keys, load_config, weights_notes
from .study.stages import (
    PAPER_MODEL,
    finding_lines,
    like_for_like,
    say,
    stage_attribute,
    stage_parse,
    stage_report,
    stage_train,
    write_index,
)

PROG = "python -m jobs.pipeline"
# What a Ctrl-C (SIGINT) leaves: every stage commits whole units (a run's waves, a parse's parts, a report's folder).
INTERRUPTED = ("what was committed stays (whole waves, whole parts, whole reports) and nothing else; "
               "the same command resumes")  # fmt: skip


def main(args: argparse.Namespace, hooks: Hooks | None = None) -> dict[str, Any]:
    """Validate, then train -> attribute -> parse -> report; returns {'models', 'runs', 'parse', 'reports', 'index'}."""
    t0 = time.perf_counter()
    study = load_config(args.config, args.set)
    trained = study.trained()
    say(f"study {study.study}: {len(study.runs)} run(s), {len(study.compare)} comparison(s), store {study.out}"
        + (f", {len(trained)} model(s) to train into {study.models_dir}" if trained else ""))  # fmt: skip
    for line in weights_notes(study):
        say(line)
    # the local folders the study writes, checked before anything is trained or attributed
    if study.report.enabled and not Location.parse(study.report_root()).is_remote:
        writable_folder(study.report_root(), f"report.out {study.report_root()}")
    if trained:
        writable_folder(study.models_dir, f"models_dir {study.models_dir}")
    models = stage_train(study)
    summaries = stage_attribute(study, {name: m["path"] for name, m in models.items()}, hooks=hooks)
    run_dirs = {name: str(s["run_dir"]) for name, s in summaries.items()}
    parsed = stage_parse(study, run_dirs)
    result: dict[str, Any] = {"models": models, "runs": summaries, "parse": parsed, "reports": [], "index": None}
    if study.report.enabled:
        target, reports = stage_report(study, run_dirs)
        # a trained model is of its base's family: the paper's figures are for all-mpnet-base-v2 and its fine-tunes
        models = {n: study.base_of(r.model) for n, r in study.runs.items()}
        models |= {n: study.base_of(study.runs[c.run].model) for n, c in study.compare.items()}
        index = write_index(target, study, reports, models)
        result.update(reports=reports, index=index)
        say("")
        for r in reports:
            for line in finding_lines(r["findings"], like_for_like(models[r["name"]])):
                say(f"{r['name']}: {line}")
        if not any(like_for_like(m) for m in models.values()):
            say(f"(the paper's figures are for {PAPER_MODEL}; none of these runs uses it, so none is set beside "
                "a finding)")  # fmt: skip
        say(f"report: {index}")
    else:
        say("report: off in the config")
    say(f"study {study.study}: done in {time.perf_counter() - t0:.0f} s")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(
        prog=PROG,
        description="Bring a study up to date: attribute its runs, parse, run every applicable analysis, write "
        "the reports. Stages whose output is up to date are skipped.",
    )
    p.add_argument("--config", help="a study config (YAML), e.g. configs/default.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value by its dotted key (repeatable): --set datasets.stsb.sample=300, "
                        "--set out=/data/runs, --set defaults.steps=32")  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="validate the config (keys, values, references, datasets) and exit; no model is loaded")
    p.add_argument("--keys", action="store_true",
                   help="list every key a config takes (as --set names it), its type, default and meaning, with "
                        "the jobs.attribute flag of the same setting; needs no --config")  # fmt: skip
    args = p.parse_args(argv)
    if not args.config and not args.keys:
        p.error("the following arguments are required: --config")
    return args


def print_keys() -> None:
    """--keys: every key of a study config, a block of lines each (the key, its type and default; its meaning)."""
    for key, kind, default, said in config_keys():
        print(f"{key}: {kind}" + (f" = {default}" if default else ""))
        if said:
            print(textwrap.fill(said, 100, initial_indent="    ", subsequent_indent="    "))


def cli(argv: list[str] | None = None, hooks: Hooks | None = None) -> int:
    from .console import quiet_console

    args = parse_args(argv)

    def run() -> None:
        if args.keys:
            print_keys()
            return
        if args.check:
            study = load_config(args.config, args.set)
            print(f"{args.config}: ok (study {study.study}: {len(study.runs)} run(s), "
                  f"{len(study.compare)} comparison(s); a run's layer is checked when its model loads)")  # fmt: skip
            for line in weights_notes(study):
                print(line)
            return
        quiet_console(quiet=True)  # a line per stage; no library's loading bar, even at a terminal
        main(args, hooks)

    return exit_status("jobs.pipeline", run, interrupted=INTERRUPTED)


if __name__ == "__main__":
    sys.exit(cli())
