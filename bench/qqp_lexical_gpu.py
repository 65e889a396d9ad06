"""The lexical-bias run of the paper's Table 4 setting on one GPU machine without Ray.

    python bench/qqp_lexical_gpu.py --out runs --qqp-path FILE      # every pair of a QQP subset file
    python bench/qqp_lexical_gpu.py --out runs --limit 2000         # the 2,000 pairs of the longest questions
    python bench/qqp_lexical_gpu.py --out runs -- --tolerance 1e-3  # anything after -- goes to jobs.attribute

all-mpnet-base-v2 off the shelf ("Shelf"), layer 8, Gauss-Legendre N = 24 (the setting bench/results/gpu.md timed),
over a QQP subset file (--qqp-path or $XSBERT_QQP; GLUE's TSV layout), storing only the same-token cells
(jobs.attribute --cells same-token) through the Ray-less executor (--executor local; torch, transformers,
sentence-transformers, pyarrow and pandas are all it needs). The pairs go longest question first: the script writes
the subset once, sorted by the longer side's token count (descending, ties in file order), to
<out>/_inputs/qqp-longest-first.tsv, and the job cuts that order into waves (--wave-size pairs each, in length
buckets, each wave's questions again longest first in batches of --batch-size): an out-of-memory batch shows in the
first wave, and each wave is committed to the store as it finishes. A run cut short keeps its committed waves; the
same command, from the same folder, resumes it (the sorted file and the run id are the same). Read the result with

    xsbert sql --run runs/<run id> --file lexical_ranks --var min_count=30

The GPU run itself has not been made yet; this script is checked on CPU with a tiny random model of mpnet's
architecture (tests/test_qqp_lexical_gpu.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

MODEL = "sentence-transformers/all-mpnet-base-v2"
SORTED_NAME = "qqp-longest-first.tsv"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python bench/qqp_lexical_gpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs", help="store root (the run is <out>/<run id>)")
    p.add_argument("--qqp-path", default=None, help="the QQP subset file (default: $XSBERT_QQP)")
    p.add_argument("--model", default=MODEL)
    p.add_argument("--layer", type=int, default=8)
    p.add_argument("--rule", default="gauss-legendre")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--limit", type=int, default=None, help="only the N pairs of the longest questions")
    p.add_argument("--wave-size", type=int, default=2048, help="pairs per committed wave")
    p.add_argument("--batch-size", type=int, default=None, help="questions per engine call (job default)")
    p.add_argument("--device", default=None, help="default: cuda when torch sees a GPU, else cpu")
    return p.parse_args(argv), extra


def longest_first(path: Path, model: str) -> pd.DataFrame:
    """The QQP subset's rows, sorted by the longer question's token count under `model`'s tokenizer, longest first
    (a stable sort: ties keep the file's order)."""
    from transformers import AutoTokenizer

    from xsbert_core.models import resolve_model

    frame = pd.read_csv(path, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    lengths = [max(len(a), len(b)) for a, b in zip(tokenizer(frame.question1.tolist())["input_ids"],
                                                   tokenizer(frame.question2.tolist())["input_ids"])]  # fmt: skip
    order = sorted(range(len(frame)), key=lambda k: -lengths[k])
    return frame.iloc[order].reset_index(drop=True)


def sorted_input(out: Path, qqp: Path, model: str) -> Path:
    """<out>/_inputs/qqp-longest-first.tsv, written when missing or different (the same bytes for the same subset and
    tokenizer, so a rerun finds the same dataset and run id)."""
    frame = longest_first(qqp, model)
    text = frame.to_csv(sep="\t", index=False, quoting=3, lineterminator="\n")
    target = out / "_inputs" / SORTED_NAME
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
    return target


def job_argv(args: argparse.Namespace, dataset: Path, extra: list[str]) -> list[str]:
    argv = ["--dataset", str(dataset), "--id-column", "id", "--text-a-column", "question1",
            "--text-b-column", "question2", "--label-column", "is_duplicate", "--model", args.model,
            "--layer", str(args.layer), "--rule", args.rule, "--steps", str(args.steps), "--cells", "same-token",
            "--executor", "local", "--wave-size", str(args.wave_size), "--out", str(args.out)]  # fmt: skip
    if args.limit is not None:
        argv += ["--limit", str(args.limit)]
    if args.batch_size is not None:
        argv += ["--batch-size", str(args.batch_size)]
    if args.device is not None:
        argv += ["--device", args.device]
    return argv + extra


def main(argv: list[str] | None = None) -> int:
    from jobs.attribute import cli
    from jobs.attribution import inputs as _inputs

    args, extra = parse_args(argv)
    qqp = _inputs.qqp_path(args.qqp_path)
    if qqp is None:
        print("qqp_lexical_gpu: error: no QQP subset file (--qqp-path FILE or $XSBERT_QQP)", file=sys.stderr)
        return 2
    dataset = sorted_input(Path(args.out), Path(qqp), args.model)
    return cli(job_argv(args, dataset, extra))


if __name__ == "__main__":
    sys.exit(main())
