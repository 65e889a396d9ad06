"""An offline bundle: everything the job needs on a machine with Python but no network, in parts of a chosen size.

    python -m jobs.bundle --out bundle --python 3.12 --platform manylinux_2_28_x86_64 --part-size 60MiB \\
        --exclude torch --models all-MiniLM-L6-v2,all-mpnet-base-v2 --float16 --datasets qqp
    # copy bundle/ to the machine, then there:
    python bundle/install.py --into /opt/xsbert --system-site-packages
    /opt/xsbert/bin/python -m jobs.attribute --dataset qqp --qqp-path /opt/xsbert/data/<$XSBERT_QQP's file name> \\
        --model /opt/xsbert/models/all-mpnet-base-v2 ...

What it writes (docs/OFFLINE.md): the wheels of the project's dependencies for the target interpreter and platform,
resolved and downloaded by pip itself (`pip install --dry-run --report`, then `pip download`), less what the target
has already (--exclude NAME: that distribution and whatever only it needs; --have FILE: every distribution a
`pip freeze` of the target lists, whose versions also pin the resolution; --target-python PY: resolve against that
interpreter's environment, as `pip install` there would), or only what some of the project's requirements need
(--only ray[data]: the job with Ray on a node that has the rest, the project wheel then installed --no-deps);
the project as a wheel; model folders (--float16: their float32 weights stored as float16, half the bytes, the max
rounding error in the manifest); dataset files -- every file cut into parts of at most --part-size, their sha256 in
manifest.json, and install.py (jobs/bundling/installer.py), which checks every part, reassembles and installs with
`pip --no-index`.

--no-wheels writes models and datasets alone: the way to carry a model folder to a machine that has the project,
e.g. all-mpnet-base-v2 (438 MB of float32 weights) as 220 MB of float16 parts:

    python -m jobs.bundle --no-wheels --models all-mpnet-base-v2 --float16 --part-size 15MiB --out mpnet-parts
    python mpnet-parts/install.py --models-only --into DIR        # -> DIR/models/all-mpnet-base-v2 (float32)

The machinery is jobs.bundling; this module reads the command line.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from xsbert_core.errors import CommandParser, exit_status

from .bundling import BundleError, parse_size
from .bundling.write import bundle

DEFAULT_PART_SIZE = "60MiB"
# --python: what pip's --python-version takes (3, 3.12, 3.12.1)
PYTHON_RE = re.compile(r"^\d+(\.\d+){0,2}$")
# --platform: a wheel platform tag's shape (pip's --platform takes any word, and a wrong one resolves to nothing)
PLATFORM_RE = re.compile(r"^(?:(?:manylinux(?:1|2010|2014|_\d+_\d+)|musllinux_\d+_\d+|linux|macosx_\d+_\d+|win)"
                         r"_[a-z0-9_]+|win32)$")


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in (text or "").split(",") if s.strip())


def _requirements(text: str | None) -> tuple[str, ...]:
    """'ray[data,default],pyarrow' -> ('ray[data,default]', 'pyarrow'): commas inside brackets stay."""
    return tuple(s.strip() for s in re.split(r",(?![^\[]*\])", text or "") if s.strip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = CommandParser(prog="python -m jobs.bundle", description=__doc__.split("\n\n")[0],
                      epilog="docs/OFFLINE.md has the whole story.")  # fmt: skip
    p.add_argument("--out", required=True, type=Path, help="the bundle's folder (new or empty)")
    p.add_argument("--part-size", default=DEFAULT_PART_SIZE,
                   help=f"largest part, e.g. 15MiB (default {DEFAULT_PART_SIZE})")
    w = p.add_argument_group("wheels")
    w.add_argument("--python", default=None, help="target Python version, e.g. 3.12 (default: this interpreter's)")
    w.add_argument("--platform", default=None,
                   help="target platform tag, e.g. manylinux_2_28_x86_64 (older glibc levels included; "
                        "default: this machine's)")  # fmt: skip
    w.add_argument("--exclude", default=None, metavar="A,B",
                   help="distributions the target has (e.g. torch): left out with whatever only they need")
    w.add_argument("--have", type=Path, default=None, metavar="FREEZE",
                   help="a `pip freeze` of the target: its distributions are left out and pin the resolution")
    w.add_argument("--target-python", default=None, metavar="PY",
                   help="resolve against this interpreter's environment (what it has stays out)")
    w.add_argument("--only", default=None, metavar="REQ,REQ",
                   help="carry only these of the project's requirements (and what they need), e.g. 'ray[data]'; "
                        "the project itself is then installed --no-deps")  # fmt: skip
    w.add_argument("--no-wheels", action="store_true", help="models and datasets only")
    m = p.add_argument_group("models and data")
    m.add_argument("--models", default=None, metavar="M1,M2", help="model names or folders (as --model takes them)")
    m.add_argument("--float16", action="store_true", help="models' float32 weights stored as float16 (half the bytes)")
    m.add_argument("--datasets", default=None, metavar="D1,D2",
                   help="qqp (the QQP subset file $XSBERT_QQP names) or files; stsb, negation and adjectives ship "
                        "in the project itself")  # fmt: skip
    args = p.parse_args(argv)
    if args.python is not None and not PYTHON_RE.match(args.python):
        p.error(f"--python {args.python}: not a Python version (e.g. 3.12)")
    if args.platform is not None and not PLATFORM_RE.match(args.platform):
        p.error(f"--platform {args.platform}: not a platform tag (e.g. manylinux_2_28_x86_64, musllinux_1_2_aarch64, "
                "macosx_11_0_arm64, win_amd64)")
    return args


def cli(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def write() -> None:
        part_size = parse_size(args.part_size)
        if args.no_wheels and not (args.models or args.datasets):
            raise BundleError("--no-wheels with no --models and no --datasets: nothing to bundle")
        bundle(args.out, part_size, args.python, args.platform, _names(args.exclude), args.have, args.target_python,
               _names(args.models), args.float16, _names(args.datasets), wheels=not args.no_wheels,
               only=_requirements(args.only))  # fmt: skip

    # Ctrl-C: bundle() removes what it wrote on the way out
    return exit_status("jobs.bundle", write, interrupted="nothing of the bundle was kept", errors=(BundleError,))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(cli())
