"""A job in a subprocess with test hooks (jobs/attribution/hooks.py), which the jobs take as an object, never from
their environment:

    python tests/hooked.py jobs.attribute hold_after_wave=1 -- --dataset stsb --limit 8 ...
    python tests/hooked.py jobs.pipeline hold_after_wave=1 -- --config study.yaml

The module is jobs.attribute or jobs.pipeline (their `cli` takes the hooks); each NAME=VALUE before `--` is a field
of Hooks (an integer where the field is one); the rest is the job's command line. tests/jobtools.py's `hooked`
builds the command."""

from __future__ import annotations

import dataclasses
import importlib
import sys


def main(argv: list[str]) -> int:
    from jobs.attribution.hooks import Hooks

    split = argv.index("--")
    module, given = argv[0], dict(item.split("=", 1) for item in argv[1:split])
    types = {f.name: str(f.type) for f in dataclasses.fields(Hooks)}
    hooks = Hooks(**{k: int(v) if "int" in types[k] else v for k, v in given.items()})
    return importlib.import_module(module).cli(argv[split + 1 :], hooks=hooks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
