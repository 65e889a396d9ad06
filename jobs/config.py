"""The settings of an attribution job, typed: built by `jobs.attribute`'s argument parser (`JobSettings.from_args`)
and by `jobs.pipeline` from a study config (`JobSettings.of`); the stages take these objects, never argv or an
argparse.Namespace.

    JobSettings
      selection    Selection     which pairs: dataset, split, columns, sample / limit
      attribution  Attribution   how they are attributed: the engine's settings, truncation, min_abs, cells
      execution    Execution     where and how: executor, Ray, actors, batches, waves, retries, device
      output       Output        the store root, object-storage retries, progress bars

    RunConfig      what changes the stored numbers, one field each; the run id is the hash of its canonical JSON
                   (jobs.store.run_id over `RunConfig.as_dict()`)

Each field of the four groups is the destination of the jobs.attribute flag of the same name (`--max-steps` ->
max_steps); tests/test_config.py checks that every flag has exactly one field. Plain dataclasses, not pydantic:
`--executor local` runs where pydantic is not installed (tests/test_local_executor.py); jobs.pipeline validates its
YAML with pydantic and builds these from it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from typing import Any

from xsbert_core import InputError
from xsbert_core.explainer import DEFAULT_LAYER, DEFAULT_MAX_STEPS, DEFAULT_RULE, DEFAULT_STEPS
from xsbert_core.models import DEFAULT_MODEL
from xsbert_core.precision import DEFAULT_PRECISION

# The embedded default (no --dataset): bundled STS-B test, a seeded sample that finishes in a few
# minutes on 2 CPU cores with all-MiniLM-L6-v2 at the engine's default layer and N (measured: ~0.6 s
# per sentence per core at layer 3, N = 16; 100 pairs are ~190 unique sentences).
DEFAULT_DATASET = "stsb"
DEFAULT_SPLIT = "test"
DEFAULT_SAMPLE = 100
DEFAULT_OUT = "runs"
# Adaptive N is the dataset default: without --steps and --tolerance, each sentence's N doubles from DEFAULT_STEPS
# (up to --max-steps) until its factor error ||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)|| is <= this; a
# sentence still above it at --max-steps quarantines its pairs (reason `not_converged`). `--steps N` alone is a fixed
# N (the behaviour, and the run ids, of runs before adaptive N became the default). bench/adaptive.py measures the
# nodes it gives STS-B sentences and what it costs against a fixed N of equal worst-case error.
DEFAULT_ADAPTIVE_TOLERANCE = 1e-3
# Sentences per actor call, of similar length (sorted, longest first). On CPU small batches balance the
# actors (a call is seconds to minutes; the last one decides the wave's tail), on GPU large ones fill it.
DEFAULT_BATCH_SIZE_CPU = 16
DEFAULT_BATCH_SIZE_GPU = 128
# Pairs per commit. Bounds the work lost to a kill and, with Ray Data's backpressure, the factors held in the object
# store (~22 KB per MiniLM sentence, ~2x for mpnet: the wave in stage 2 and what the actors computed ahead).
DEFAULT_WAVE_SIZE_CPU = 2048
DEFAULT_WAVE_SIZE_GPU = 16384
# A batch whose actor dies is retried on a restarted actor; bounded so a poisonous batch fails the run
# (Ray Data's own default is unbounded); the actors themselves restart as often as needed over a run.
DEFAULT_MAX_RETRIES = 3  # --max-retries: retries of a factor batch on a restarted actor (and of a cell task)
# Characters a text may have before it is tokenized: a longer one is quarantined (too_long_a / too_long_b) at once,
# in every --truncation mode, without being tokenized (a 50 MB field took minutes of CPU and 3 GB in the tokenizer).
# Far above any model's max_seq_length (512 tokens are a few thousand characters); not in the run id: it decides
# which rows are attributed, not the numbers of one.
DEFAULT_MAX_CHARS = 100_000
MODES = ("auto", "approx", "exact")
TRUNCATION_CHOICES = ("quarantine", "warn", "error")
CELL_WRITERS = ("auto", "workers", "driver")
EXECUTORS = ("ray", "local")


@dataclass(frozen=True)
class Selection:
    """Which pairs a run attributes (jobs.attribute's data flags). sample/limit/seed select rows and change no
    row's numbers: they are not in the run id."""

    dataset: str
    split: str | None = None
    config: str | None = None  # a hub dataset's config
    qqp_path: str | None = None
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    text_a_column: str | None = None
    text_b_column: str | None = None
    label_column: str | None = None
    id_column: str | None = None
    label_range: str | None = None  # "LO:HI"
    keep_columns: str | None = None  # "A,B"

    def label_bounds(self) -> tuple[float, float] | None:
        """--label-range as (lo, hi); InputError when it is not LO:HI."""
        if not self.label_range:
            return None
        try:
            lo, hi = (float(x) for x in self.label_range.split(":"))
        except ValueError as exc:
            raise InputError(f"--label-range must be LO:HI, got {self.label_range!r}") from exc
        return lo, hi


@dataclass(frozen=True)
class Attribution:
    """How the pairs are attributed: the engine's settings (as in `xsbert explain`) and what the store keeps of them.
    Resolved: `steps` is always set; `tolerance` None is a fixed N (`Attribution.adaptive_default` gives the
    dataset default, adaptive N)."""

    model: str = DEFAULT_MODEL
    layer: int = DEFAULT_LAYER
    mode: str = "auto"
    similarity: str = "auto"
    rule: str = DEFAULT_RULE
    steps: int = DEFAULT_STEPS
    tolerance: float | None = DEFAULT_ADAPTIVE_TOLERANCE
    max_steps: int = DEFAULT_MAX_STEPS
    precision: str = DEFAULT_PRECISION
    truncation: str = "quarantine"
    max_chars: int = DEFAULT_MAX_CHARS  # not in the run id (RunConfig): it selects rows, as --limit does
    min_abs: float = 0.0
    cells: str = "all"
    prompt: str | None = None  # instruction prefix of every sentence (None: the model's default prompt, if any)
    prompt_name: str | None = None  # the model's prompt of this name
    exclude_prompt: bool = False

    @staticmethod
    def steps_and_tolerance(steps: int | None, tolerance: float | None) -> tuple[int, float | None]:
        """Adaptive N by default: no steps -> DEFAULT_STEPS, and DEFAULT_ADAPTIVE_TOLERANCE unless a tolerance is
        given; steps alone -> that fixed N."""
        if steps is None:
            return DEFAULT_STEPS, DEFAULT_ADAPTIVE_TOLERANCE if tolerance is None else tolerance
        return steps, tolerance

    @property
    def engine_truncation(self) -> str:
        """The engine's truncation: it stops on `error`, and flags (warn) otherwise; the job quarantines."""
        return "error" if self.truncation == "error" else "warn"


@dataclass(frozen=True)
class Execution:
    """Where and how the pairs are computed; none of it changes a number (not in the run id)."""

    executor: str = "ray"
    ray_address: str | None = None
    num_actors: int | None = None
    gpus_per_actor: float | None = None
    cpus_per_actor: float | None = None
    batch_size: int | None = None
    wave_size: int | None = None
    max_retries: int = DEFAULT_MAX_RETRIES
    cell_writer: str = "auto"
    device: str | None = None
    factor_memory: str | None = None  # "8GiB": a factor actor's memory for its batches (jobs/attribution/memory.py)

    def factor_memory_bytes(self) -> int | None:
        """--factor-memory in bytes (None when not given); InputError naming the flag when it is no size."""
        if self.factor_memory is None:
            return None
        from ._offline import BundleError, parse_size

        try:
            return parse_size(self.factor_memory)
        except BundleError as exc:
            raise InputError(f"--factor-memory: {exc}") from None


@dataclass(frozen=True)
class Output:
    """Where the run goes and how the job talks."""

    out: str = DEFAULT_OUT
    store_retry_s: float | None = None
    quiet: bool = False


GROUPS = {"selection": Selection, "attribution": Attribution, "execution": Execution, "output": Output}


@dataclass(frozen=True)
class JobSettings:
    """Every setting of one jobs.attribute run."""

    selection: Selection
    attribution: Attribution = field(default_factory=Attribution)
    execution: Execution = field(default_factory=Execution)
    output: Output = field(default_factory=Output)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JobSettings:
        """From jobs.attribute's parsed flags (each flag's destination is its field's name)."""
        return cls(**{name: group(**{f.name: getattr(args, f.name) for f in fields(group)})
                      for name, group in GROUPS.items()})  # fmt: skip

    def command(self) -> list[str]:
        """The jobs.attribute flags that give these settings (what is not a default), for a summary's `command`:
        `python -m jobs.attribute` + these runs the same job."""
        argv: list[str] = ["--dataset", self.selection.dataset]
        for name, group in GROUPS.items():
            value, default = getattr(self, name), group(**({"dataset": ""} if group is Selection else {}))
            for f in fields(group):
                v = getattr(value, f.name)
                if f.name in ("dataset", "steps", "tolerance"):
                    continue  # below: the pair decides fixed or adaptive N
                if v == getattr(default, f.name):
                    continue
                flag = "--" + f.name.replace("_", "-")
                argv += [flag] if v is True else [flag, str(v)]
        a = self.attribution
        if (a.steps, a.tolerance) != Attribution.steps_and_tolerance(None, None):
            argv += ["--steps", str(a.steps)] + (["--tolerance", str(a.tolerance)] if a.tolerance is not None else [])
        return argv


@dataclass(frozen=True)
class RunConfig:
    """Everything that changes the stored numbers, listed once; its hash is the run id (the manifest's `config`).
    Not --limit/--sample: they select rows, they change no row's numbers (a larger selection later computes only
    what is new). The engine's own settings are its resolved ones (Explainer.settings: `auto` mode and similarity,
    a negative layer, made definite).

    A field with `omitted_at` in its metadata is left out of the hash while it has that value: the run ids of
    stores made before it was a setting stay what they were (`cells`: stores of every cell; `precision`:
    float32 runs; `prompt`, `exclude_prompt`: runs without a prompt)."""

    store_version: int
    code_version: str
    model: str
    weights_sha256: str
    mode: str
    similarity: str
    layer: int
    n_layers: int
    rule: str
    steps: int
    tolerance: float | None
    max_steps: int | None
    truncation: str
    min_abs: float
    dataset: dict[str, Any]  # name, config, split, columns
    cells: str = field(default="all", metadata={"omitted_at": "all"})
    precision: str = field(default=DEFAULT_PRECISION, metadata={"omitted_at": DEFAULT_PRECISION})
    prompt: str = field(default="", metadata={"omitted_at": ""})  # the resolved prompt string
    exclude_prompt: bool = field(default=False, metadata={"omitted_at": False})

    def as_dict(self) -> dict[str, Any]:
        """The config as the manifest records it and the run id hashes it."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if "omitted_at" in f.metadata and value == f.metadata["omitted_at"]:
                continue
            out[f.name] = value
        return out


# RunConfig's fields that are the engine's resolved settings (Explainer.settings; precision apart, for its default).
ENGINE_SETTINGS = ("model", "mode", "similarity", "layer", "n_layers", "rule", "steps", "tolerance", "max_steps")


# --------------------------------------------------------------------------- jobs.parse and jobs.report
PARSE_BATCH_SIZE = 64  # texts per parser-actor call
PARSE_COMMIT_EVERY = 20_000  # texts per part of the parser cache


@dataclass(frozen=True)
class ParseSettings:
    """jobs.parse's settings, one field per flag (`python -m jobs.parse --help` says what each does); built from its
    arguments (`from_args`) or by jobs.pipeline's parse stage."""

    runs: tuple[str, ...]
    parser: str = "auto"
    stanza_dir: str | None = None
    stanza_download: bool = False
    cache: str | None = None
    replace: bool = False
    num_actors: int | None = None  # None: one per CPU, leaving one for Ray Data's other operators
    batch_size: int = PARSE_BATCH_SIZE
    commit_every: int = PARSE_COMMIT_EVERY
    executor: str = "ray"
    ray_address: str | None = None
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ParseSettings:
        return cls(**{f.name: (tuple(args.run) if f.name == "runs" else getattr(args, f.name)) for f in fields(cls)})


@dataclass(frozen=True)
class ReportSettings:
    """jobs.report's settings, one field per flag; `command` is the command line the page shows (the pipeline passes
    the equivalent jobs.report command)."""

    run: str
    out: str
    run2: str | None = None
    vars: tuple[str, ...] = ()  # NAME=VALUE, as --var
    note: str | None = None
    serve_url: str | None = None  # None: jobs.analyses.base.SERVE_URL
    quiet: bool = False
    command: str | None = None

    def flags(self) -> list[str]:
        """The jobs.report command line of these settings (what the page shows when `command` is not given)."""
        out = ["--run", str(self.run), "--out", str(self.out)] + (["--run2", str(self.run2)] if self.run2 else [])
        out += [a for v in self.vars for a in ("--var", v)]
        out += ["--note", self.note] if self.note else []
        out += ["--serve-url", self.serve_url] if self.serve_url else []
        return out + (["-q"] if self.quiet else [])

    @classmethod
    def from_args(cls, args: argparse.Namespace, command: str | None) -> ReportSettings:
        return cls(run=args.run, out=args.out, run2=args.run2, vars=tuple(args.var), note=args.note,
                   serve_url=args.serve_url, quiet=args.quiet, command=command)  # fmt: skip
