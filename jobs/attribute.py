"""Attribute every pair of a dataset on Ray (or, with --executor local, in this process without Ray) and write the
Parquet store (docs/STORE.md).

    python -m jobs.attribute                       # the embedded default: a seeded STS-B test sample
    python -m jobs.attribute --dataset stsb --split test --limit 20 --steps 4 --out runs
    ray job submit --working-dir . -- python -m jobs.attribute --dataset qqp --num-actors 8
    python -m jobs.attribute --dataset qqp --executor local --device cuda --cells same-token   # no Ray needed

Pipeline: the pairs are cut into waves (a few thousand each; each wave commits atomically, so a killed run
resumes), and one Ray Data pipeline computes the sentence factors of every wave, wave after wave, in one actor pool
(of a group of waves, for runs of more than STAGE1_GROUP_BLOCKS factor batches):

    read, validate, tokenise in chunks of 16,384 rows -> quarantine | the work list (a memory-mapped spill file)
    -> waves in wave_order | per wave: its unique sentences, longest first, in blocks of --batch-size
    -> map_batches(FactorActor, ActorPoolStrategy)   sentence factors P, e(x), e(r)   [stage 1, GPU if any]
       streamed back to the driver; once all of a wave's sentences are back (the pool goes on with the next):
    -> pair_cells (Ray tasks, PAIR_BATCH pairs each)  pair numbers + cells + word cells  [stage 2, CPU]
    -> part files of pairs, cells, word_cells, sentences (+ quarantine), renamed into place, pairs last

--executor local (jobs/attribution/local.py) runs stages 1-2 in this process instead, without Ray: the same waves
and factor batches through one FactorActor on --device, the same PairCells over PAIR_BATCH pairs, the same commits;
the store (and its run id) is the one a Ray run of the same settings writes, and either executor resumes the other's
run. The machinery is jobs/attribution/ (its __init__ names the modules); the settings, jobs/config.py.

From Python: `main(settings(argv))` runs the job as the command does; a caller that times or watches its two steps
(bench/gpu_job.py, bench/driver_setup.py) calls them itself: `prepared = prepare(job)` (read, validate, tokenise,
load the engine, the run id) and then `attribute(prepared, on_wave=print)` (the waves into the store; the summary)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xsbert_core.errors import CommandParser, exit_status

from .attribution.hooks import Hooks
from .config import DEFAULT_DATASET, DEFAULT_SAMPLE, DEFAULT_SPLIT, JobSettings
from .console import quiet_console

if TYPE_CHECKING:
    from .attribution.prepare import prepare
    from .attribution.run import attribute

__all__ = ["attribute", "cli", "main", "parse_args", "prepare", "print_summary", "settings"]


def __getattr__(name: str) -> Any:
    """`prepare` and `attribute` on first use: they load the engine (torch, sentence-transformers: seconds), which
    --help, a bad flag and a bad setting do without."""
    if name == "prepare":
        from .attribution.prepare import prepare

        return prepare
    if name == "attribute":
        from .attribution.run import attribute

        return attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """jobs.attribute's flags: one per field of jobs/config.py's JobSettings (JobSettings.add_arguments)."""
    p = CommandParser(
        prog="python -m jobs.attribute",
        description="Token-pair attributions for every pair of a dataset, on Ray, into a Parquet store. "
        f"Without --dataset: --dataset {DEFAULT_DATASET} --split {DEFAULT_SPLIT} --sample {DEFAULT_SAMPLE} --seed 0.",
    )
    JobSettings.add_arguments(p)
    args = p.parse_args(argv)
    if args.dataset is None:  # the embedded default
        args.dataset = DEFAULT_DATASET
        args.split = args.split or DEFAULT_SPLIT
        if args.sample is None and args.limit is None:
            args.sample = DEFAULT_SAMPLE
    return args


def settings(argv: list[str] | None = None) -> JobSettings:
    """The typed settings of a command line (parse_args, then jobs/config.py's JobSettings)."""
    return JobSettings.from_args(parse_args(argv))


def main(job: JobSettings | argparse.Namespace, hooks: Hooks | None = None) -> dict[str, Any]:
    """Run the job (prepare -> attribute) of `job` (or of parse_args's flags); returns the summary (also printed).
    `hooks`: faults to inject (tests only; jobs/attribution/hooks.py)."""
    if isinstance(job, argparse.Namespace):
        job = JobSettings.from_args(job)
    from .attribution.prepare import prepare
    from .attribution.run import attribute

    summary = attribute(prepare(job), on_wave=lambda wave: print(wave, flush=True), hooks=hooks)
    print_summary(summary, summary["run_dir"])
    return summary


def print_summary(s: dict[str, Any], run_dir: str | Path) -> None:
    err = (
        f"mean {s['mean_abs_completeness_error']:.2e}, max {s['max_abs_completeness_error']:.2e}"
        if s["mean_abs_completeness_error"] is not None
        else "n/a"
    )
    reasons = ", ".join(f"{k} {v}" for k, v in s["quarantine_reasons"].items()) or "none"
    lines = [
        "",
        f"run {s['run_id']}: {s['n_in']} pairs in = {s['n_done']} done + {s['n_quarantined']} quarantined",
        f"  computed now        {s['computed_pairs']} pairs, {s['computed_sentences']} unique sentences, "
        f"{s['waves']} wave(s)",
        f"  throughput          {s['pairs_per_s']:.2f} pairs/s, {s['sentences_per_s']:.2f} sentences/s (wall)",
        f"  quarantined         {reasons}",
        f"  |completeness err|  {err}",
        f"  wall time           {s['wall_s']:.1f} s",
        *([f"  duplicate rows      {s['duplicates_dropped']} dropped (retried stage-2 batches; copies were equal)"]
          if s["duplicates_dropped"] else []),
        *([f"  ray                 job {s['ray']['job_id']} on {s['ray']['gcs_address']}"] if s["ray"] else []),
        "try:",
        f"  xsbert sql --run {run_dir} \"select pair_id, label, round(score, 3) as score, "
        "round(attribution_sum, 3) as sum_a, completeness_error from pairs order by score desc limit 5\"",
        f"store: {run_dir}",
    ]
    print("\n".join(lines), flush=True)
    if s.get("advice"):
        print(f"warning: {s['advice']}", file=sys.stderr, flush=True)


def cli(argv: list[str] | None = None, hooks: Hooks | None = None) -> int:
    args = parse_args(argv)
    quiet_console(args.quiet)
    return exit_status("jobs.attribute", lambda: main(args, hooks),
                       interrupted="the committed waves stay, the wave in progress was removed; the same command "
                                   "resumes")  # fmt: skip


if __name__ == "__main__":
    sys.exit(cli())
