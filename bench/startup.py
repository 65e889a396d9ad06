"""How long the commands that need no model take from start to exit: `xsbert --help`, `xsbert sql` and `xsbert show`
on a stored run, and `python -m jobs.attribute --help`.

    python bench/startup.py                   # the first run under runs/ (`make run` writes them)
    python bench/startup.py --run runs/<id> --repeat 7

Each command runs in a fresh process, --repeat times, alternating with its baselines; the medians are kept. A
baseline is the same command with a library imported first, what the command imported before a change:
- `import torch`: the `xsbert` command itself up to fcb134d (its settings imported xsbert_core.precision, which
  imported torch for three dtypes);
- `import sentence_transformers`: what importing xsbert_core did up to c9d8177 (it loads the engine's names on first
  use since b729b5c), and jobs.attribute up to a055423 (it imports the job's machinery when the job runs since).
Since both, the read side (the store, `xsbert`, `xsbert sql`, `xsbert serve`, `xsbert show`) imports neither, nor do
jobs.attribute, jobs.train and jobs.evaluate before they load a model (--help, a flag they do not take). Results:
bench/results/startup.md and startup.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from precision import provenance

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"
# The baselines: the Python run first, and what it stands for.
BASELINES = {"import torch": "the `xsbert` command up to fcb134d",
             "import sentence_transformers": "importing xsbert_core up to c9d8177, jobs.attribute up to "
                                             "a055423"}  # fmt: skip


def commands(run: Path, pair: str) -> dict[str, tuple[str, list[str]]]:
    """The commands timed: (the module `python -m` runs, its arguments)."""
    return {"xsbert --help": ("jobs.cli", ["--help"]),
            "xsbert sql": ("jobs.cli", ["sql", "--run", str(run), "select count(*) as pairs from pairs"]),
            "xsbert show": ("jobs.cli", ["show", "--run", str(run), "--pair", pair]),
            "python -m jobs.attribute --help": ("jobs.attribute", ["--help"])}  # fmt: skip


def timed(command: tuple[str, list[str]], first: str = "") -> float:
    """Seconds from start to exit of `python -m <module> <argv>` in a fresh process (`first`: Python run before it)."""
    module, argv = command
    code = f"{first}\nimport runpy\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"startup.py: error: python -m {module} {' '.join(argv)} failed: "
                         f"{proc.stderr.strip()[-500:]}")  # fmt: skip
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, help="a run directory (default: the first under runs/)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--note", default="", help="what else the machine was doing, recorded beside it")
    ap.add_argument("--out-stem", type=Path, default=OUT / "startup", help="<stem>.json and <stem>.md")
    ap.add_argument("--command", action="append", choices=list(commands(Path("."), "")),
                    help="only this command (repeat for more; default: all)")
    args = ap.parse_args(argv)
    run = args.run or next((p for p in sorted((ROOT / "runs").glob("*")) if (p / "pairs").is_dir()), None)
    if run is None or not (run / "pairs").is_dir():
        raise SystemExit("startup.py: error: no run to read: give --run, or run `make run` first")
    run = run.resolve()
    import duckdb

    pair = duckdb.sql(f"select min(pair_id) from read_parquet('{run}/pairs/*.parquet')").fetchall()[0][0]
    rows = []
    for name, cmd in commands(run, pair).items():
        if args.command and name not in args.command:
            continue
        timed(cmd)  # warm the file cache
        now, before = [], {first: [] for first in BASELINES}
        for _ in range(args.repeat):
            now.append(timed(cmd))
            for first, runs in before.items():
                runs.append(timed(cmd, first))
        median = statistics.median(now)
        baselines = {first: {"median_s": statistics.median(runs), "ratio": statistics.median(runs) / median,
                             "runs_s": runs} for first, runs in before.items()}  # fmt: skip
        rows.append({"command": name, "median_s": median, "runs_s": now, "baselines": baselines})
    result = {**provenance("startup.py", argv if argv is not None else sys.argv[1:], args.note),
              "run": str(run.relative_to(ROOT) if run.is_relative_to(ROOT) else run), "repeat": args.repeat,
              "baselines": BASELINES, "rows": rows}  # fmt: skip
    args.out_stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    said = "; ".join(f"`{first}` first ({what})" for first, what in BASELINES.items())
    lines = ["# Start to exit of the commands that need no model (`python bench/startup.py`)", "",
             f"{result['stamp']}, commit {result['commit']}, {result['machine']}, torch {result['torch']}; "
             f"`{result['command']}`; the run {result['run']}; median of {args.repeat} fresh processes each, "
             f"alternating with the baselines, the same command with a library imported first: {said}.", "",
             "| command | seconds | " + " | ".join(f"`{first}` first: seconds | ratio" for first in BASELINES) + " |",
             "|---|---|" + "---|---|" * len(BASELINES)]  # fmt: skip
    lines += [f"| `{r['command']}` | {r['median_s']:.2f} | "
              + " | ".join(f"{b['median_s']:.2f} | {b['ratio']:.2f}x" for b in r["baselines"].values()) + " |"
              for r in rows]
    args.out_stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
