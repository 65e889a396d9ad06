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
run. The machinery is jobs/attribution/ (its __init__ names the modules); the settings, jobs/config.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from xsbert_core import XsbertError
from xsbert_core.explainer import DEFAULT_LAYER, DEFAULT_MAX_STEPS, DEFAULT_RULE, DEFAULT_STEPS
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.precision import DEFAULT_PRECISION, PRECISIONS
from xsbert_core.quadrature import SUPPORTED_RULES

from .store import STORE_RETRY_S
from .attribution.actors import CELL_CHOICES
from .attribution.prepare import prepare
from .attribution.run import attribute
from .config import (
    CELL_WRITERS,
    DEFAULT_ADAPTIVE_TOLERANCE,
    DEFAULT_DATASET,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_OUT,
    DEFAULT_SAMPLE,
    DEFAULT_SPLIT,
    EXECUTORS,
    TRUNCATION_CHOICES,
    Attribution,
    JobSettings,
)
from .console import quiet_console


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m jobs.attribute",
        description="Token-pair attributions for every pair of a dataset, on Ray, into a Parquet store. "
        f"Without --dataset: --dataset {DEFAULT_DATASET} --split {DEFAULT_SPLIT} --sample {DEFAULT_SAMPLE} --seed 0.",
    )
    d = p.add_argument_group("data")
    d.add_argument("--dataset", default=None,
                   help="stsb | qqp (bundled) | negation | adjectives (generated, docs/ANALYSES.md) | "
                        "a TSV/CSV/Parquet/JSONL file (.gz ok) | a `datasets` folder | "
                        "a hub name such as glue/qqp or sentence-transformers/stsb")  # fmt: skip
    d.add_argument("--split", default=None, help="split (stsb: train|dev|test, default test; qqp: train)")
    d.add_argument("--config", default=None, help="hub dataset config (glue/qqp needs none)")
    d.add_argument("--qqp-path", default=None,
                   help="a QQP subset file of the train split, GLUE's TSV layout (default: $XSBERT_QQP; without "
                        "either, --dataset qqp is the hub's GLUE QQP)")  # fmt: skip
    d.add_argument("--limit", type=int, default=None, help="the first N rows (after --sample)")
    d.add_argument("--sample", type=int, default=None, help="a seeded random sample of N rows")
    d.add_argument("--seed", type=int, default=0, help="seed of --sample")
    d.add_argument("--text-a-column", default=None)
    d.add_argument("--text-b-column", default=None)
    d.add_argument("--label-column", default=None, help="'none' for no labels")
    d.add_argument("--id-column", default=None, help="id column(s), comma-separated; 'none' for row numbers")
    d.add_argument("--label-range", default=None, metavar="LO:HI", help="labels outside are quarantined")
    d.add_argument("--keep-columns", default=None, metavar="A,B",
                   help="dataset columns copied as strings into the pairs table (part of the run config)")
    m = p.add_argument_group("attribution (as in `xsbert explain`)")
    m.add_argument("--model", default=DEFAULT_MODEL)
    m.add_argument("--layer", type=int, default=DEFAULT_LAYER)
    m.add_argument("--mode", choices=("auto", "approx", "exact"), default="auto",
                   help="auto: exact for a reference-shifted model, else approx")
    m.add_argument("--similarity", default="auto", help="cos, dot, or auto (the model's own similarity function)")
    m.add_argument("--rule", default=DEFAULT_RULE, help=" | ".join(SUPPORTED_RULES))
    m.add_argument("--steps", type=int, default=None,
                   help=f"quadrature nodes N: a fixed N when given without --tolerance; else where adaptive N starts "
                        f"(default {DEFAULT_STEPS})")  # fmt: skip
    m.add_argument("--tolerance", type=float, default=None,
                   help="adaptive N: N doubles per sentence until its factor error <= this (default "
                        f"{DEFAULT_ADAPTIVE_TOLERANCE:g} unless --steps is given); a sentence still above it at "
                        "--max-steps quarantines its pairs (not_converged)")  # fmt: skip
    m.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="cap for adaptive N")
    m.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                   help="arithmetic of the Jacobian-vector products (tf32: CUDA only; bf16/fp16: reduced-precision "
                        "JVPs, float32 sums); part of the run id unless fp32")  # fmt: skip
    m.add_argument("--truncation", choices=TRUNCATION_CHOICES, default="quarantine",
                   help="texts over max_seq_length: quarantine the pair (default), warn (truncate and flag), "
                        "or error (stop before computing)")  # fmt: skip
    m.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS,
                   help=f"texts longer than this many characters are quarantined (too_long) before they are "
                        f"tokenized, whatever --truncation says (default {DEFAULT_MAX_CHARS:,}); not in the run id")  # fmt: skip
    m.add_argument("--min-abs", type=float, default=0.0, help="store only cells with |value| >= this (sums unchanged)")
    m.add_argument("--prompt", default=None, metavar="TEXT",
                   help="instruction prefix read before every sentence (default: the model's default prompt, if "
                        "any; '' for none); its tokens are attributed like any other")
    m.add_argument("--prompt-name", default=None, metavar="NAME", help="the model's prompt of this name (`prompts`)")
    m.add_argument("--exclude-prompt", action="store_true",
                   help="the prompt's tokens get no attribution and are not stored (approx mode)")  # fmt: skip
    m.add_argument("--cells", choices=CELL_CHOICES, default="all",
                   help="which cells to store: all (default), same-token (token_a = token_b, word_a = word_b: what "
                        "sql/lexical_ranks.sql reads: ~4%% of QQP's) or none; part of the run id; the pairs' sums, "
                        "ranks and top cells stay over every cell")  # fmt: skip
    r = p.add_argument_group("execution")
    r.add_argument("--executor", choices=EXECUTORS, default="ray",
                   help="ray (default): stages 1-2 on a Ray cluster; local: in this process, without Ray (Ray need "
                        "not be installed; same store, same run id): one model on --device, e.g. one GPU")  # fmt: skip
    r.add_argument("--ray-address", default=None, help="join this cluster (default: $RAY_ADDRESS, else start one)")
    r.add_argument("--num-actors", type=int, default=None,
                   help="factor actors (default: one per GPU, else per CPU; --executor local: one)")
    r.add_argument("--gpus-per-actor", type=float, default=None, help="default 1 when the cluster has GPUs, else 0")
    r.add_argument("--cpus-per-actor", type=float, default=None,
                   help="CPUs (and torch threads) per factor actor (default 1; --executor local: torch's own default)")
    r.add_argument("--batch-size", type=int, default=None, help="sentences per actor batch (default 16 CPU / 128 GPU)")
    r.add_argument("--wave-size", type=int, default=None, help="pairs per atomic commit (default 2048 CPU / 16384 GPU)")
    r.add_argument("--max-retries", type=int, default=DEFAULT_MAX_RETRIES,
                   help="a batch whose worker died is retried this often (on a restarted actor), then the run fails")
    r.add_argument("--cell-writer", choices=CELL_WRITERS, default="auto",
                   help="who writes the cells and word cells: the stage-2 tasks (workers; the driver only commits) "
                        "or the driver. auto, decided before each wave: workers on object storage or where every "
                        "node sees the local --out (nodes that join are asked), else the driver; workers stops the "
                        "job before a wave with a node that does not see it")  # fmt: skip
    r.add_argument("--device", default=None,
                   help="torch device of the factor actors (default: cuda when they get GPUs, else cpu)")  # fmt: skip
    r.add_argument("--factor-memory", default=None, metavar="SIZE",
                   help="memory a factor actor may take for its batches beyond its model, e.g. 40GiB: on a GPU the "
                        "caching allocator's limit, within which batches are planned (default: 85%% of the actor's "
                        "share of the card, planned, no limit); on a CPU the limit of the tensors one call holds. A "
                        "batch that runs out is halved and retried, never dropped")  # fmt: skip
    o = p.add_argument_group("output")
    o.add_argument("--out", default=DEFAULT_OUT,
                   help="store root: a local folder, s3://bucket/prefix or gs://bucket/prefix; the run is <out>/<run id>")
    o.add_argument("--store-retry-s", type=float, default=None, metavar="S",
                   help="how long one call to object storage is retried when the store answers 5xx/429 or the "
                        "connection fails, with backoff and jitter, before the job stops (exit 2; the same command "
                        f"resumes); default $XSBERT_STORE_RETRY_S, else {STORE_RETRY_S:.0f} s")  # fmt: skip
    o.add_argument("-q", "--quiet", action="store_true", help="no Ray Data progress bars")
    args = p.parse_args(argv)
    if args.dataset is None:
        args.dataset = DEFAULT_DATASET
        args.split = args.split or DEFAULT_SPLIT
        if args.sample is None and args.limit is None:
            args.sample = DEFAULT_SAMPLE
    # adaptive N by default; --steps alone is a fixed N
    args.steps, args.tolerance = Attribution.steps_and_tolerance(args.steps, args.tolerance)
    return args


def settings(argv: list[str] | None = None) -> JobSettings:
    """The typed settings of a command line (parse_args, then jobs/config.py's JobSettings)."""
    return JobSettings.from_args(parse_args(argv))


def main(job: JobSettings | argparse.Namespace) -> dict[str, Any]:
    """Run the job (prepare -> attribute) of `job` (or of parse_args's flags); returns the summary (also printed)."""
    if isinstance(job, argparse.Namespace):
        job = JobSettings.from_args(job)
    summary = attribute(prepare(job), on_wave=lambda line: print(line, flush=True))
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


def cli(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_console()
    try:
        main(args)
    except XsbertError as exc:
        print(f"jobs.attribute: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jobs.attribute: interrupted: the committed waves stay, the wave in progress was removed; the same "
              "command resumes", file=sys.stderr)  # fmt: skip
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(cli())
