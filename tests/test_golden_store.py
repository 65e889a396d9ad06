"""The same settings write the same store: golden expectations recorded from the code of 2026-11-27 (3f026a2).

One small run (4 bundled STS-B test pairs, all-MiniLM-L6-v2 at its last layer, N = 2, waves of 2 pairs, factor
batches of 2 sentences, `--executor local`, which writes what a Ray run of the same settings writes:
tests/test_local_executor.py) is computed, and compared with tests/data/golden_store.json.gz:

- the run id, and the manifest's `config` (what the run id hashes), `settings` and `cells`, exactly;
- per table: the part files' names, the Arrow schema of each part (with its metadata) and the row count, exactly;
- per table: every row, every column, sorted by the table's key (tests/jobtools.py ORDER): strings, integers,
  booleans and nulls exactly, floats to rel 1e-4 / abs 1e-6, and a vector's elements (an embedding) to abs 1e-5 of
  the vector's largest |element| too (another CPU's kernels round differently: an AVX-512 machine's embeddings came
  out up to 9e-7 of that scale apart from the golden's, 1.2e-6 apart near zero in a vector of scale 4.8);
- the sha256 of every Parquet part, byte for byte, wherever every float above came out bit-identical (the same
  CPU kernels): pyarrow's writer is deterministic, so equal values must give equal files.

Besides, the run ids and configs of a few other settings (adaptive N, --cells, --precision, --min-abs,
--truncation, --rule, --mode, --similarity, the embedded default) are pinned through `prepare` (nothing computed);
the adaptive ones (adaptive N, the embedded default, a --tolerance) since 2026-11-29, when adaptive N by panels became
the default (their configs say `refine`; the 2026-11-28 ids, at the cap of 512, were adaptive N by doubling).
Regenerate (only when a change of the numbers or of the layout is intended, in the commit that makes it):
`XSBERT_GOLDEN_WRITE=1 .venv/bin/python -m pytest -q tests/test_golden_store.py`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from jobtools import ORDER, TABLES

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_store.json.gz"
WRITE = os.environ.get("XSBERT_GOLDEN_WRITE") == "1"
BASE = ["--dataset", "stsb", "--split", "test", "--limit", "4", "--layer", "-1", "--steps", "2"]
RUN = [*BASE, "--wave-size", "2", "--batch-size", "2", "--cpus-per-actor", "1", "--executor", "local", "--quiet"]
# Settings whose run ids (and configs) are pinned without computing anything.
VARIANTS = {
    "base": BASE,
    "embedded_default": [],
    "adaptive": ["--dataset", "stsb", "--split", "test", "--limit", "4", "--layer", "-1"],
    "adaptive_tolerance": [*BASE, "--tolerance", "1e-2", "--max-steps", "64"],
    "cells_same_token": [*BASE, "--cells", "same-token"],
    "cells_none": [*BASE, "--cells", "none"],
    "precision_bf16": [*BASE, "--precision", "bf16"],
    "min_abs_truncation": [*BASE, "--min-abs", "0.01", "--truncation", "warn"],
    "riemann_approx_dot": [*BASE, "--rule", "riemann", "--mode", "approx", "--similarity", "dot", "--layer", "2"],
    "selection_only": ["--dataset", "stsb", "--split", "test", "--sample", "3", "--seed", "5", "--layer", "-1",
                       "--steps", "2"],  # fmt: skip
}
REL, ABS = 1e-4, 1e-6
VECTOR_REL = 1e-5  # of a float vector's largest |element|: each element's abs tolerance


def _key(row: dict[str, Any], table: str) -> tuple:
    return tuple(str(row[c.strip()]) if not isinstance(row[c.strip()], int) else row[c.strip()]
                 for c in ORDER[table].split(","))  # fmt: skip


def store_record(run_dir: Path) -> dict[str, Any]:
    """What is compared of a run directory (the module docstring says how)."""
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    tables: dict[str, Any] = {}
    for table in TABLES:
        parts = sorted((run_dir / table).glob("*.parquet"))
        rows: list[dict[str, Any]] = []
        for p in parts:
            rows += pq.read_table(p).to_pylist()
        tables[table] = {
            "parts": [p.name for p in parts],
            "schemas": [pq.read_schema(p).to_string(show_schema_metadata=True) for p in parts],
            "n_rows": len(rows),
            "rows": sorted(rows, key=lambda r: _key(r, table)),
            "sha256": [hashlib.sha256(p.read_bytes()).hexdigest() for p in parts],
        }
    return {"run_id": run_dir.name, "config": manifest["config"], "settings": manifest["settings"],
            "cells": manifest["cells"], "tables": tables}  # fmt: skip


def compare(got: Any, want: Any, where: str, exact: list[bool], abs_tol: float = ABS) -> None:
    """Assert `got` equals `want`: floats to REL and `abs_tol` (ABS, or VECTOR_REL of the largest |element| of the
    float vector they are in), exact[0] turning False when one is not bit-equal; all else ==."""
    if isinstance(want, float) and isinstance(got, float):
        if math.isnan(want):
            assert math.isnan(got), where
            return
        if got != want:
            exact[0] = False
        assert got == pytest.approx(want, rel=REL, abs=abs_tol), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for k in want:
            compare(got[k], want[k], f"{where}.{k}", exact)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        vector = bool(want) and all(isinstance(w, float) and math.isfinite(w) for w in want)
        tol = max(ABS, VECTOR_REL * max(abs(w) for w in want)) if vector else ABS
        for k, (g, w) in enumerate(zip(got, want)):
            compare(g, w, f"{where}[{k}]", exact, tol)
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


def variant_ids(tmp_path: Path) -> dict[str, Any]:
    from jobs.attribute import settings
    from jobs.attribution.prepare import prepare

    out = {}
    for name, flags in VARIANTS.items():
        prep = prepare(settings([*flags, "--out", str(tmp_path / "peek")]))
        prep.work.discard()
        out[name] = {"run_id": prep.run_id, "config": prep.config}
    return out


@pytest.mark.slow
def test_the_same_settings_write_the_same_store(tmp_path, capsys):
    from jobs.attribute import main, parse_args

    summary = main(parse_args([*RUN, "--out", str(tmp_path / "runs")]))
    capsys.readouterr()
    got = {"store": store_record(Path(summary["run_dir"])), "variants": variant_ids(tmp_path)}
    if WRITE:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(GOLDEN, "wt", encoding="utf-8") as fh:
            json.dump(got, fh, indent=0, sort_keys=True)
        pytest.skip(f"wrote {GOLDEN}")
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as fh:
        want = json.load(fh)
    got = json.loads(json.dumps(got))  # the golden file's types (tuples -> lists)
    assert summary["n_done"] == 4 and summary["waves"] == 2
    assert got["variants"] == want["variants"]  # run ids and configs, exactly
    hashes = {t: got["store"]["tables"][t].pop("sha256") for t in TABLES}
    want_hashes = {t: want["store"]["tables"][t].pop("sha256") for t in TABLES}
    exact = [True]
    compare(got["store"], want["store"], "store", exact)
    if exact[0]:  # every float bit-identical: the Parquet files must be too
        assert hashes == want_hashes
