"""The settings of the jobs, each declared once: a field of a dataclass here carries its name, type, default,
choices and help (xsbert_core/settings.py's `setting`). The command lines of jobs.attribute, jobs.parse and
jobs.report are made from these fields (`add_arguments`), and so is the study config schema of jobs.pipeline
(`jobs.study.schema.schema_fields`); the stages take these objects, never argv or an argparse.Namespace.

    JobSettings    jobs.attribute's settings
      selection    Selection     which pairs: dataset, split, columns, sample / limit
      attribution  Attribution   how they are attributed: the engine's settings (xsbert_core.EngineSettings, as in
                                 `xsbert explain`; `engine` gives them to the actors), truncation, min_abs, cells
      execution    Execution     where and how: executor, Ray, actors, batches, waves, retries, device
      output       Output        the store root, object-storage retries, progress bars
    ParseSettings  jobs.parse's; ReportSettings  jobs.report's

    RunConfig      what changes the stored numbers, one field each; the run id is the hash of its canonical JSON
                   (jobs.store.run_id over `RunConfig.as_dict()`)

Each field is the destination of the flag of the same name (`--max-steps` -> max_steps); tests/test_config.py checks
that every flag has exactly one field. A field's metadata `key` is its name in a study config where that differs
(`address` for ray_address), `study: False` leaves it out of the study config, `study_help` is said in the study
config's schema only, after the help. Plain dataclasses, not pydantic:
`--executor local` runs where pydantic is not installed (tests/test_local_executor.py).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from xsbert_core import InputError
from xsbert_core.precision import DEFAULT_PRECISION
from xsbert_core.refine import DOUBLE
from xsbert_core.settings import (
    DEFAULT_LAYER,
    DEFAULT_MAX_STEPS,
    DEFAULT_RULE,
    DEFAULT_STEPS,
    Bounded,
    EngineSettings,
    add_arguments,
    from_namespace,
    setting,
    to_flags,
)

from .store.retry import STORE_RETRY_S

__all__ = [
    "DEFAULT_LAYER", "DEFAULT_MAX_STEPS", "DEFAULT_RULE", "DEFAULT_STEPS", "GROUPS", "Attribution", "Execution",
    "JobSettings", "Output", "ParseSettings", "ReportSettings", "RunConfig", "Selection",
]  # fmt: skip

# The embedded default (no --dataset): bundled STS-B test, a seeded sample that finishes in a few
# minutes on 2 CPU cores with all-MiniLM-L6-v2 at the engine's default layer and N (measured: ~0.6 s
# per sentence per core at layer 3, N = 16; 100 pairs are ~190 unique sentences).
DEFAULT_DATASET = "stsb"
DEFAULT_SPLIT = "test"
DEFAULT_SAMPLE = 100
DEFAULT_OUT = "runs"
# Adaptive N is the dataset default: without --steps and --tolerance, each sentence's N grows from DEFAULT_STEPS
# (by panels, --refine; up to --max-steps nodes) until its factor error ||sum_s P[:, s] - (e(x) - e(r))|| /
# ||e(x) - e(r)|| is <= this; a sentence still above it at --max-steps quarantines its pairs (reason
# `not_converged`). `--steps N` alone is a fixed N (the behaviour, and the run ids, of runs before adaptive N became
# the default). bench/adaptive.py measures the nodes it gives STS-B sentences and what it costs against a fixed N of
# equal worst-case error.
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
# Of a GPU actor's share of its card (--gpus-per-actor), what its factor batches are planned in when no
# --factor-memory is given (jobs.attribution.memory); the rest is for the model, the caching allocator's rounding and
# cuBLAS's workspaces.
GPU_PLAN_SHARE = 0.85
# Characters a text may have before it is tokenized: a longer one is quarantined (too_long_a / too_long_b) at once,
# in every --truncation mode, without being tokenized (a 50 MB field took minutes of CPU and 3 GB in the tokenizer).
# Far above any model's max_seq_length (512 tokens are a few thousand characters); not in the run id: it decides
# which rows are attributed, not the numbers of one.
DEFAULT_MAX_CHARS = 100_000
TRUNCATION_CHOICES = ("quarantine", "warn", "error")
# Which cells a run stores (--cells; docs/STORE.md): every cell, the same-token cells (token_a = token_b; word cells:
# word_a = word_b), or none. The pair's numbers, ranks and top cells are over all cells whatever is stored.
CELL_CHOICES: tuple[str, ...] = ("all", "same-token", "none")
CELL_WRITERS = ("auto", "workers", "driver")
EXECUTORS = ("ray", "local")


@dataclass(frozen=True)
class Selection(Bounded):
    """Which pairs a run attributes (jobs.attribute's data flags). sample/limit/seed select rows and change no
    row's numbers: they are not in the run id."""

    dataset: str = setting(key="source", required=False,
                           help="stsb (bundled) | qqp (the --qqp-path / $XSBERT_QQP file, else the hub's GLUE "
                                "QQP) | negation | adjectives (generated, docs/ANALYSES.md) | "
                                "a TSV/CSV/Parquet/JSONL file (.gz ok) | a `datasets` folder | "
                                "a hub name such as glue/qqp or sentence-transformers/stsb")  # fmt: skip
    split: str | None = setting(None, help="split (stsb: train|dev|test, default test; qqp: train)")
    config: str | None = setting(None, help="a hub dataset's config (or a `datasets` folder's), e.g. mrpc for "
                                            "nyu-mll/glue; glue/qqp needs none. Not a study config (that is "
                                            "python -m jobs.pipeline --config)")  # fmt: skip
    qqp_path: str | None = setting(None, help="a QQP subset file of the train split, GLUE's TSV layout (default: "
                                              "$XSBERT_QQP; without either, --dataset qqp is the hub's GLUE QQP)")
    limit: int | None = setting(None, ge=1, help="the first N rows (after --sample)")
    sample: int | None = setting(None, ge=1, help="a seeded random sample of N rows")
    seed: int = setting(0, help="seed of --sample")
    text_a_column: str | None = setting(None, key="text_a", help="the first text's column")
    text_b_column: str | None = setting(None, key="text_b", help="the second text's column")
    label_column: str | None = setting(None, key="label", help="the label's column; 'none' for no labels")
    id_column: str | None = setting(None, key="id", help="id column(s), comma-separated; 'none' for row numbers")
    label_range: str | None = setting(None, metavar="LO:HI", pattern=r"^-?[0-9.]+:-?[0-9.]+$",
                                      help="labels outside are quarantined")  # fmt: skip
    # A study config lists them (keep: [a, b]); the command line joins them with commas.
    keep_columns: str | None = setting(None, metavar="A,B", key="keep", study_list=True,
                                       help="dataset columns copied as strings into the pairs table (part of the "
                                            "run config)")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        self.label_bounds()  # checked when made, as a bound is

    def label_bounds(self) -> tuple[float, float] | None:
        """--label-range as (lo, hi); InputError when it is not LO:HI with LO <= HI (else every label is out)."""
        if not self.label_range:
            return None
        try:
            lo, hi = (float(x) for x in self.label_range.split(":"))
        except ValueError as exc:
            raise InputError(f"--label-range must be LO:HI, got {self.label_range!r}") from exc
        if math.isnan(lo) or math.isnan(hi):  # no label compares with NaN: every one would be quarantined
            raise InputError(f"--label-range must be LO:HI of two numbers, got {self.label_range!r}")
        if lo > hi:
            raise InputError(f"--label-range {self.label_range}: LO is above HI, so every label would be quarantined")
        return lo, hi


@dataclass(frozen=True)
class Attribution(EngineSettings):
    """How the pairs are attributed: the engine's settings (xsbert_core.EngineSettings, as in `xsbert explain`) with
    the job's defaults, and what the store keeps of them.

    N: adaptive by default. Neither steps nor tolerance: N starts at DEFAULT_STEPS and grows per sentence (`refine`)
    until DEFAULT_ADAPTIVE_TOLERANCE; a tolerance alone: from DEFAULT_STEPS to it; steps alone: that fixed N (tolerance
    None). The rule is applied here, once, so that `Attribution(steps=8)` and `--steps 8` are the same fixed N;
    after construction `steps` is always set."""

    steps: int | None = setting(None, ge=1, help=f"quadrature nodes N: a fixed N when given without --tolerance; else "
                                                 f"where adaptive N starts (default {DEFAULT_STEPS})")  # fmt: skip
    tolerance: float | None = setting(None, gt=0,
                                      help="adaptive N: N grows per sentence (--refine) until its factor error <= this "
                                           f"(default {DEFAULT_ADAPTIVE_TOLERANCE:g} unless --steps is given); a "
                                           "sentence still above it at --max-steps quarantines its pairs "
                                           "(not_converged)")  # fmt: skip
    truncation: str = setting("quarantine", choices=TRUNCATION_CHOICES,
                              help="texts over max_seq_length: quarantine the pair (default), warn (truncate and "
                                   "flag), or error (stop before computing)")  # fmt: skip
    max_chars: int = setting(DEFAULT_MAX_CHARS, ge=1,
                             help="texts longer than this many characters are quarantined (too_long) before they are "
                                  f"tokenized, whatever --truncation says (default {DEFAULT_MAX_CHARS:,}); not in the "
                                  "run id")  # fmt: skip
    min_abs: float = setting(0.0, ge=0, help="store only cells with |value| >= this (sums unchanged)")
    cells: str = setting("all", choices=CELL_CHOICES,
                         help="which cells to store: all (default), same-token (token_a = token_b, word_a = word_b: "
                              "what sql/lexical_ranks.sql reads: ~4%% of QQP's) or none; part of the run id; the "
                              "pairs' sums, ranks and top cells stay over every cell")  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()  # the bounds
        steps, tolerance = self.steps, self.tolerance
        if steps is None:  # adaptive N: from DEFAULT_STEPS to the tolerance given, else the default one
            steps, tolerance = DEFAULT_STEPS, DEFAULT_ADAPTIVE_TOLERANCE if tolerance is None else tolerance
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "tolerance", tolerance)

    @property
    def adaptive_default(self) -> bool:
        """N is the job's default (adaptive from DEFAULT_STEPS to DEFAULT_ADAPTIVE_TOLERANCE)."""
        return (self.steps, self.tolerance) == (DEFAULT_STEPS, DEFAULT_ADAPTIVE_TOLERANCE)

    @property
    def engine_truncation(self) -> str:
        """The engine's truncation: it stops on `error`, and flags (warn) otherwise; the job quarantines."""
        return "error" if self.truncation == "error" else "warn"

    @property
    def engine(self) -> EngineSettings:
        """The engine's settings of these (the engine's truncation: `engine_truncation`)."""
        given = {f.name: getattr(self, f.name) for f in fields(EngineSettings)}
        return EngineSettings(**{**given, "truncation": self.engine_truncation})


@dataclass(frozen=True)
class Execution(Bounded):
    """Where and how the pairs are computed; none of it changes a number (not in the run id)."""

    executor: str = setting("ray", choices=EXECUTORS,
                            help="ray (default): the factors and the pairs' cells computed on a Ray cluster; local: in "
                                 "this process, without Ray (Ray need not be installed; same store, same run id): one "
                                 "model on --device, e.g. one GPU",
                            study_help="In a study: the train, attribute and parse stages (jobs.parse --executor "
                                       "local)")  # fmt: skip
    ray_address: str | None = setting(None, key="address",
                                      help="join this cluster (default: $RAY_ADDRESS, else start one)")
    num_actors: int | None = setting(None, ge=1,
                                     help="factor actors (default: one per GPU, else per CPU; --executor local: one)")
    gpus_per_actor: float | None = setting(None, ge=0, help="default 1 when the cluster has GPUs, else 0")
    cpus_per_actor: float | None = setting(None, gt=0,
                                           help="CPUs (and torch threads) per factor actor (default 1; --executor "
                                                "local: torch's own default)")  # fmt: skip
    batch_size: int | None = setting(None, ge=1, help=f"sentences per actor batch (default {DEFAULT_BATCH_SIZE_CPU} "
                                                      f"CPU / {DEFAULT_BATCH_SIZE_GPU} GPU)")  # fmt: skip
    wave_size: int | None = setting(None, ge=1, help=f"pairs per atomic commit (default {DEFAULT_WAVE_SIZE_CPU} CPU / "
                                                     f"{DEFAULT_WAVE_SIZE_GPU} GPU)")  # fmt: skip
    max_retries: int = setting(DEFAULT_MAX_RETRIES, ge=0,
                               help="a batch whose worker died is retried this often (on a restarted actor), then the "
                                    "run fails")  # fmt: skip
    cell_writer: str = setting("auto", choices=CELL_WRITERS,
                               help="who writes the cells and word cells: the tasks that compute them (workers; "
                                    "the driver only commits) or the driver. auto, decided before each wave: workers "
                                    "on object storage or where every node sees the local store root (nodes that join "
                                    "are asked), else the driver; workers stops the job before a wave with a node "
                                    "that does not see it")  # fmt: skip
    device: str | None = setting(None, help="torch device of the factor actors (default: cuda when they get GPUs, "
                                            "else cpu)")  # fmt: skip
    factor_memory: str | None = setting(None, metavar="SIZE",
                                        help="memory a factor actor may take for its batches beyond its model, e.g. "
                                             "40GiB: on a GPU the caching allocator's limit, within which batches are "
                                             f"planned (default: {GPU_PLAN_SHARE * 100:g}%% of the actor's share of "
                                             "the card, planned, no limit); on a CPU the limit of the tensors one "
                                             "call holds. A batch that runs out is halved and retried, never "
                                             "dropped")  # fmt: skip

    def factor_memory_bytes(self) -> int | None:
        """--factor-memory in bytes (None when not given); InputError naming the flag when it is no size."""
        if self.factor_memory is None:
            return None
        from .bundling import BundleError, parse_size

        try:
            return parse_size(self.factor_memory)
        except BundleError as exc:
            raise InputError(f"--factor-memory: {exc}") from None


@dataclass(frozen=True)
class Output(Bounded):
    """Where the run goes and how the job talks."""

    out: str = setting(DEFAULT_OUT, help="store root: a local folder, s3://bucket/prefix or gs://bucket/prefix; the "
                                         "run is <out>/<run id>")  # fmt: skip
    store_retry_s: float | None = setting(None, ge=0, metavar="S", study=False,
                                          help="how long one call to object storage is retried when the store "
                                               "answers 5xx/408/429 or the connection fails, with backoff and jitter, "
                                               "before the job stops (exit 2; the same command resumes); default "
                                               f"$XSBERT_STORE_RETRY_S, else {STORE_RETRY_S:.0f} s")  # fmt: skip
    quiet: bool = setting(False, flags=("-q",), help="no Ray Data progress bars")


GROUPS = {"selection": Selection, "attribution": Attribution, "execution": Execution, "output": Output}
# jobs.attribute's flag groups, as its --help shows them
GROUP_TITLES = {"selection": "data", "attribution": "attribution (as in `xsbert explain`)",
                "execution": "execution", "output": "output"}  # fmt: skip


@dataclass(frozen=True)
class JobSettings:
    """Every setting of one jobs.attribute run."""

    selection: Selection
    attribution: Attribution = field(default_factory=Attribution)
    execution: Execution = field(default_factory=Execution)
    output: Output = field(default_factory=Output)

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """jobs.attribute's flags: one per field of the four groups, in groups of its --help (--dataset defaults
        to None: jobs.attribute fills in the embedded default)."""
        for name, group in GROUPS.items():
            add_arguments(parser.add_argument_group(GROUP_TITLES[name]), group)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> JobSettings:
        """From jobs.attribute's parsed flags (each flag's destination is its field's name)."""
        return cls(**{name: group(**from_namespace(args, group)) for name, group in GROUPS.items()})

    def command(self) -> list[str]:
        """The jobs.attribute flags that give these settings (what is not a default), for a summary's `command`:
        `python -m jobs.attribute` + these runs the same job."""
        argv: list[str] = ["--dataset", self.selection.dataset]
        for name in GROUPS:
            argv += to_flags(getattr(self, name), skip=("dataset", "steps", "tolerance"))
        a = self.attribution
        if not a.adaptive_default:  # the pair decides fixed or adaptive N
            argv += ["--steps", str(a.steps)] + (["--tolerance", str(a.tolerance)] if a.tolerance is not None else [])
        return argv


@dataclass(frozen=True)
class RunConfig:
    """Everything that changes the stored numbers, listed once; its hash is the run id (the manifest's `config`).
    Not --limit/--sample: they select rows, they change no row's numbers (a larger selection later computes only
    what is new). A field with `engine` in its metadata is the engine's resolved setting of that name
    (Explainer.settings: `auto` mode and similarity, a negative layer, made definite).

    A field with `omitted_at` in its metadata is left out of the hash while it has that value: the run ids of
    stores made before it was a setting stay what they were (`cells`: stores of every cell; `precision`:
    float32 runs; `prompt`, `exclude_prompt`: runs without a prompt; `refine`: fixed N, or adaptive N by doubling,
    the only way before 2026-11-29)."""

    store_version: int
    code_version: str
    model: str = field(metadata={"engine": True})
    weights_sha256: str
    mode: str = field(metadata={"engine": True})
    similarity: str = field(metadata={"engine": True})
    layer: int = field(metadata={"engine": True})
    n_layers: int = field(metadata={"engine": True})
    rule: str = field(metadata={"engine": True})
    steps: int = field(metadata={"engine": True})
    tolerance: float | None = field(metadata={"engine": True})
    max_steps: int | None = field(metadata={"engine": True})  # None for a fixed N
    truncation: str  # the job's (quarantine | warn | error), not the engine's
    min_abs: float
    dataset: dict[str, Any]  # name, config, split, columns
    cells: str = field(default="all", metadata={"omitted_at": "all"})
    precision: str = field(default=DEFAULT_PRECISION, metadata={"omitted_at": DEFAULT_PRECISION, "engine": True})
    prompt: str = field(default="", metadata={"omitted_at": "", "engine": True})  # the resolved prompt string
    exclude_prompt: bool = field(default=False, metadata={"omitted_at": False, "engine": True})
    refine: str = field(default=DOUBLE, metadata={"omitted_at": DOUBLE, "engine": True})

    @staticmethod
    def engine_fields(settings: dict[str, Any]) -> dict[str, Any]:
        """The fields that are the engine's, from its resolved settings (Explainer.settings; a field with a default
        takes it where the settings lack it)."""
        return {f.name: settings[f.name] if f.default is MISSING else settings.get(f.name, f.default)
                for f in fields(RunConfig) if f.metadata.get("engine")}  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        """The config as the manifest records it and the run id hashes it."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if "omitted_at" in f.metadata and value == f.metadata["omitted_at"]:
                continue
            out[f.name] = value
        return out


# --------------------------------------------------------------------------- jobs.parse and jobs.report
PARSE_BATCH_SIZE = 64  # texts per parser-actor call
# Texts per part of the parser cache: ~1-2 min of spaCy on 2 cores, ~1 MB of Parquet; QQP's 537k questions make ~27.
PARSE_COMMIT_EVERY = 20_000
PARSERS = ("auto", "stanza", "spacy")
CACHE_DIRNAME = "_parses"  # the parser cache's folder beside the runs, without --cache


# `xsbert serve`'s --host and --port defaults (jobs/serve.py), declared here with the other settings rather than in
# jobs/browse, whose import loads DuckDB, which no job needs to start (bench/startup.py); and so where it answers by
# default, which the reports link their sections and examples to.
SERVE_HOST = "127.0.0.1"
SERVE_PORT = 8000
SERVE_URL = f"http://{SERVE_HOST}:{SERVE_PORT}"


@dataclass(frozen=True)
class ParseSettings(Bounded):
    """jobs.parse's settings, one field per flag; built from its arguments (`from_args`) or by jobs.pipeline's parse
    stage."""

    runs: tuple[str, ...] = setting(flag="--run", nargs="+", metavar="DIR",
                                    help="run directories written by jobs.attribute")
    parser: str = setting("auto", choices=PARSERS,
                          help="stanza (the paper's; needs its English models), spacy (en_core_web_sm from PyPI, "
                               "labels converted to UD), or auto: stanza when its models are found, else spacy "
                               "(default)")  # fmt: skip
    stanza_dir: str | None = setting(None, help="stanza resources folder (default: $STANZA_RESOURCES_DIR, then "
                                                "stanza's default folder)")  # fmt: skip
    stanza_download: bool = setting(False, help="with --parser stanza: download the English models into the stanza "
                                                "folder when missing (needs the hub)")  # fmt: skip
    cache: str | None = setting(None, help=f"parser-output cache root; parses live in <cache>/<parser-version-model>/ "
                                           f"(default: the folder {CACHE_DIRNAME} beside the first --run, e.g. "
                                           f"runs/{CACHE_DIRNAME} for runs/<id>)")  # fmt: skip
    replace: bool = setting(False, help="rewrite each run's parses with this parser (needed when a run was parsed by "
                                        "another one)")  # fmt: skip
    num_actors: int | None = setting(None, ge=1, help="parser actors (default: one per CPU, leaving one CPU for Ray "
                                                      "Data's other operators)")  # fmt: skip
    batch_size: int = setting(PARSE_BATCH_SIZE, ge=1, help="texts per actor call")
    commit_every: int = setting(PARSE_COMMIT_EVERY, ge=1,
                                help="texts per part of the parser cache, written as they are parsed: a stopped run "
                                     "keeps what it parsed and the same command parses only the rest (default "
                                     f"{PARSE_COMMIT_EVERY:,})")  # fmt: skip
    executor: str = setting("ray", choices=EXECUTORS,
                            help="ray: an actor pool on Ray (default); local: one parser in this process, without Ray "
                                 "(the same parses, for a few hundred texts where starting Ray and its actors costs "
                                 "more than parsing)")  # fmt: skip
    ray_address: str | None = setting(None, help="join this cluster (default: $RAY_ADDRESS, else start one)")
    quiet: bool = setting(False, flags=("-q",), help="no Ray Data progress bars (the summary is printed)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ParseSettings:
        return cls(**from_namespace(args, cls))


def check_serve_url(url: str | None, what: str) -> None:
    """A serve URL is 'none' or http(s)://HOST[:PORT][/...]: the page's links are made from it (InputError if not)."""
    from urllib.parse import urlsplit

    if url is None or url == "none":
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"{what} {url!r}: not an http:// or https:// address (or 'none': no links)")


@dataclass(frozen=True)
class ReportSettings:
    """jobs.report's settings, one field per flag; `command` is the command line the page shows (the pipeline passes
    the equivalent jobs.report command)."""

    run: str = setting(help="a run directory (<out>/<run id> of python -m jobs.attribute), local or s3://... / "
                            "gs://...")  # fmt: skip
    out: str = setting(help="folder for the report (created; files in it are overwritten)")
    run2: str | None = setting(None, help="a second run, for the two-run analyses (agreement, lexical ranks)")
    vars: tuple[str, ...] = setting((), flag="--var", action="append", metavar="NAME=VALUE",
                                    help="a DuckDB variable for the analyses, e.g. min_count=10, top_share=0.05 "
                                         "(repeatable)")  # fmt: skip
    note: str | None = setting(None, help="text shown at the top of the page (e.g. the commands that made the runs)")
    serve_url: str = setting(SERVE_URL, help=f"where `xsbert serve --run RUN` answers: the page links sections and "
                                             f"examples there (default {SERVE_URL}; 'none': no links)")  # fmt: skip
    quiet: bool = setting(False, flags=("-q",), help="print nothing but errors")
    command: str | None = setting(None, cli=False)
    study: str | None = setting(None, cli=False)  # the study whose page, in the folder above --out, lists this report

    def __post_init__(self) -> None:
        check_serve_url(self.serve_url, "--serve-url")

    def flags(self) -> list[str]:
        """The jobs.report command line of these settings (what the page shows when `command` is not given)."""
        return ["--run", str(self.run), "--out", str(self.out)] + to_flags(self, skip=("run", "out"), short=True)

    @classmethod
    def from_args(cls, args: argparse.Namespace, command: str | None) -> ReportSettings:
        return cls(**from_namespace(args, cls), command=command)
