"""`python -m jobs.attribute` in a subprocess with test hooks (jobs/attribution/hooks.py), which the job takes as an
object, never from its environment:

    python tests/hooked.py hold_after_wave=1 -- --dataset stsb --limit 8 ...

Each NAME=VALUE before `--` is a field of Hooks (an integer where the field is one); the rest is jobs.attribute's
command line. tests/jobtools.py's `hooked_attribute` builds the command."""

from __future__ import annotations

import dataclasses
import sys


def main(argv: list[str]) -> int:
    from jobs.attribute import cli
    from jobs.attribution.hooks import Hooks

    split = argv.index("--")
    given = dict(item.split("=", 1) for item in argv[:split])
    types = {f.name: f.type for f in dataclasses.fields(Hooks)}
    hooks = Hooks(**{k: int(v) if "int" in str(types[k]) else v for k, v in given.items()})
    return cli(argv[split + 1 :], hooks=hooks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
