"""Shelf all-mpnet-base-v2's attribution runs for the paper's Fig 6, 8 and 9 on one GPU, without Ray or DuckDB.

The runs that docs/RESULTS.md lists as needing no training: the negation sentences and the paper's adjective pairs
at several fixed N (a sign is counted only where a pair's completeness error is well below the value it signs: the
analysis picks, per pair, the smallest N that satisfies it), and the STS-B test pairs for Fig 6 (a seeded 300 first,
then all 1,379: --sample is nested, so growing the run computes only the rest). Each is one `jobs.attribute
--executor local` run into --out/runs (the store's layout), resumed where it stopped; progress.json records each
piece as it finishes (run id, counts, completeness errors, wall time, device, command), and --tar rewrites a
tar.gz of --out after every piece, so a run stopped at a time limit still leaves what it finished.

Needs only torch, transformers, sentence-transformers, pyarrow, pandas and scipy (a GPU machine's own), and the
model as a folder: e.g. the float16 parts of `python -m jobs.bundle --no-wheels --models all-mpnet-base-v2 --float16`
reassembled there with `install.py --models-only`.

    python bench/shelf_gpu.py --model /tmp/xs/models/all-mpnet-base-v2 --out shelf-gpu --tar OUT/shelf-gpu.tgz

Here, with the tar.gz unpacked: `python -m jobs.parse --run shelf-gpu/runs/<id>` (the Fig 6 parses, on the CPU),
then `xsbert sql --run shelf-gpu/runs/<id> -f negation | adjectives | syntactic_relations`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs import attribute as attribute_job
from xsbert_core import XsbertError

LAYER = 9  # §4's layer; Fig 6/8/9's sections state none (assumed, as jobs/paper.py marks it)
ADJECTIVE_PAIRS = 46  # the first 46 rows of --dataset adjectives: the paper's template, two pairs per triplet


@dataclass(frozen=True)
class Piece:
    """One attribution run: a dataset (its first `limit` pairs, of a seeded `sample` where given) at a fixed
    Gauss-Legendre N."""

    name: str
    dataset: str
    steps: int
    sample: int | None = None
    limit: int | None = None

    def argv(self, model: str, layer: int, runs: Path, device: str | None, wave_size: int,
             smoke_limit: int | None = None) -> list[str]:
        argv = ["--dataset", self.dataset]
        if self.dataset in ("stsb", "negation"):  # both read STS-B test
            argv += ["--split", "test"]
        if self.sample is not None:
            argv += ["--sample", str(self.sample), "--seed", "0"]
        limits = [n for n in (self.limit, smoke_limit) if n is not None]
        if limits:
            argv += ["--limit", str(min(limits))]
        argv += ["--model", model, "--layer", str(layer), "--rule", "gauss-legendre", "--steps", str(self.steps),
                 "--executor", "local", "--wave-size", str(wave_size), "--out", str(runs), "-q"]  # fmt: skip
        return argv + (["--device", device] if device else [])


def pieces(stsb_steps: int) -> list[Piece]:
    """In the order of their value: a first count of each figure, then larger N, then the rest of STS-B."""
    return [
        Piece("negation-N32", "negation", 32),
        Piece("adjectives-N32", "adjectives", 32, limit=ADJECTIVE_PAIRS),
        Piece(f"stsb-300-N{stsb_steps}", "stsb", stsb_steps, sample=300),
        Piece("negation-N64", "negation", 64),
        Piece("adjectives-N64", "adjectives", 64, limit=ADJECTIVE_PAIRS),
        Piece("negation-N128", "negation", 128),
        Piece(f"stsb-all-N{stsb_steps}", "stsb", stsb_steps),
        Piece("adjectives-N128", "adjectives", 128, limit=ADJECTIVE_PAIRS),
        Piece("negation-N256", "negation", 256),
    ]


def device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def save(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/shelf_gpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the shelf model: a folder or a name")
    p.add_argument("--out", type=Path, required=True, help="results folder: runs/ (the store) and progress.json")
    p.add_argument("--layer", type=int, default=LAYER)
    p.add_argument("--stsb-steps", type=int, default=32, help="N of the STS-B runs (Fig 6)")
    p.add_argument("--wave-size", type=int, default=256, help="pairs per committed wave (what a stop keeps)")
    p.add_argument("--limit", type=int, default=None, help="the first N pairs of each piece (smoke tests)")
    p.add_argument("--device", default=None, help="attribution device (default: cuda where torch sees one)")
    p.add_argument("--only", default=None, help="comma-separated piece names (default: all, in order)")
    p.add_argument("--tar", type=Path, default=None, help="rewrite this tar.gz of --out after each piece")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    attribute_job.quiet_console()
    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    progress_file = args.out / "progress.json"
    progress = json.loads(progress_file.read_text()) if progress_file.is_file() else {"pieces": {}}
    progress["device"] = device_info()
    wanted = set(args.only.split(",")) if args.only else None
    for piece in pieces(args.stsb_steps):
        if (wanted and piece.name not in wanted) or piece.name in progress["pieces"]:
            continue
        argv_run = piece.argv(args.model, args.layer, runs, args.device, args.wave_size, args.limit)
        start = time.perf_counter()
        try:
            summary = attribute_job.main(attribute_job.settings(argv_run))
        except XsbertError as exc:
            print(f"shelf_gpu: {piece.name}: error: {exc}", file=sys.stderr, flush=True)
            save(progress_file, {**progress, "errors": {**progress.get("errors", {}), piece.name: str(exc)}})
            continue
        record = {k: summary[k] for k in ("run_id", "n_in", "n_done", "n_quarantined", "computed_pairs",
                                          "computed_sentences", "mean_abs_completeness_error",
                                          "max_abs_completeness_error", "wall_s")}  # fmt: skip
        record.update(dataset=piece.dataset, steps=piece.steps, layer=args.layer, process_wall_s=time.perf_counter() - start,
                      command="python -m jobs.attribute " + " ".join(shlex.quote(x) for x in argv_run))
        progress["pieces"][piece.name] = record
        save(progress_file, progress)
        print(f"shelf_gpu: done {piece.name}: run {record['run_id']}, {record['n_done']} done, "
              f"{record['n_quarantined']} quarantined, {record['wall_s']:.1f} s", flush=True)  # fmt: skip
        if args.tar:
            tmp_tar = args.tar.with_name(args.tar.name + ".tmp")
            with tarfile.open(tmp_tar, "w:gz") as tar:
                tar.add(args.out, arcname=args.out.name)
            tmp_tar.replace(args.tar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
