"""A run of an older store version, copied as the current version with the columns stage 2 now writes, computed by
stage 2's own code (jobs.attribution.actors.Grids) from the stored cells, so that a large run need not be attributed
again to gain them.

    python -m jobs.store.upgrade SRC_RUN DST_RUN

cells: value_rank, content_rank; word_cells: value_rank; pairs: the top-10 lists (TOP_CELLS). Each matrix is rebuilt
from its cells, so SRC must hold every cell of every pair (no --min-abs): the upgrade stops with a one-line error
otherwise. sentences and quarantine are hard-linked; manifest.json is copied with config.store_version set to the
current version and an `upgraded_from` note. Local run directories only. Prints its wall time.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from xsbert_core.errors import CommandParser, command_name, exit_status

from .layout import MANIFEST, SCHEMAS, STORE_VERSION, write_json_atomic, write_parquet

PROG = "python -m jobs.store.upgrade"


class UpgradeError(Exception):
    """A source run the upgrade cannot copy (missing cells, not a run directory)."""


def pair_runs(table: pa.Table) -> list[tuple[str, int, int]]:
    """(pair_id, start, end) of the runs of equal pair_id, in table order (the job writes a pair's cells together)."""
    ids = table.column("pair_id").to_pylist()
    runs, start = [], 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or ids[k] != ids[start]:
            runs.append((ids[start], start, k))
            start = k
    return runs


def matrix(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int], pid: str) -> np.ndarray:
    """The pair's full matrix from its cells: m[rows[k], cols[k]] = values[k]; every cell must be there."""
    if len(values) != shape[0] * shape[1]:
        raise UpgradeError(f"pair {pid}: {len(values)} cells for a {shape[0]} x {shape[1]} matrix (a pruned run?)")
    m = np.empty(shape)
    m[rows, cols] = values
    return m


def _write(table: pa.Table, name: str, path: Path) -> None:
    write_parquet(table.select(SCHEMAS[name].names).cast(SCHEMAS[name]), path, name)


def upgrade(src: Path, dst: Path, log=print) -> int:
    """Copy the run directory `src` into `dst` as STORE_VERSION, the ranks and top-cell lists computed from the stored
    cells; the number of pairs."""
    from jobs.attribution.actors import TOP_CELLS, Grids  # stage 2's own code for the new columns

    if not (src / MANIFEST).is_file():
        raise UpgradeError(f"{src}: not a run directory (no manifest.json)")
    version = json.loads((src / MANIFEST).read_text()).get("config", {}).get("store_version")
    if isinstance(version, int) and version >= STORE_VERSION:
        which = "the current one" if version == STORE_VERSION else f"newer than this code's {STORE_VERSION}"
        raise UpgradeError(f"{src} is already store version {version}, {which}: nothing to upgrade")
    t0 = time.perf_counter()
    pairs = pq.read_table(src / "pairs", columns=["pair_id", "sentence_id_a", "sentence_id_b",
                                                  "n_tokens_a", "n_tokens_b"]).to_pylist()  # fmt: skip
    sent = pq.read_table(src / "sentences", columns=["sentence_id", "word_ids", "n_words"])
    content = {s: np.array([w is not None for w in wids])
               for s, wids in zip(sent.column("sentence_id").to_pylist(), sent.column("word_ids").to_pylist())}
    n_words = dict(zip(sent.column("sentence_id").to_pylist(), sent.column("n_words").to_pylist()))
    info = {p["pair_id"]: p for p in pairs}
    tops: dict[str, dict[str, list]] = {}
    for table, (r, c) in (("cells", ("i", "j")), ("word_cells", ("u", "v"))):
        (dst / table).mkdir(parents=True, exist_ok=True)
        for part in sorted((src / table).glob("part-*.parquet")):
            data = pq.read_table(part)
            data = data.drop_columns([n for n in ("value_rank", "content_rank") if n in data.column_names])
            rows, cols = data.column(r).to_numpy(), data.column(c).to_numpy()
            values = data.column("value").to_numpy()
            runs = pair_runs(data)
            grids = Grids(len(runs))
            for k, (pid, a, b) in enumerate(runs):
                p = info[pid]
                sa, sb = p["sentence_id_a"], p["sentence_id_b"]
                shape = (p["n_tokens_a"], p["n_tokens_b"]) if table == "cells" else (n_words[sa], n_words[sb])
                m = matrix(rows[a:b], cols[a:b], values[a:b], shape, pid)
                grids.add(k, m, rows[a:b], cols[a:b], np.outer(content[sa], content[sb]) if table == "cells" else None)
            data = data.append_column("value_rank", grids.ranks())
            if table == "cells":
                data = data.append_column("content_rank", grids.ranks(content=True))
            names = ("i", "j") if table == "cells" else ("u", "v")
            for by in ("abs", "value"):
                for name, array in (((f"top10_{by}", grids.top_cells(by)),
                                     (f"content_top10_{by}", grids.top_cells(by, True))) if table == "cells" else
                                    ((f"word_top10_{by}", grids.top_cells(by, names=names)),)):  # fmt: skip
                    for (pid, _, _), top in zip(runs, array.to_pylist()):
                        tops.setdefault(pid, {})[name] = top
            _write(data, table, dst / table / part.name)
        log(f"{table}: {time.perf_counter() - t0:.0f} s")
    (dst / "pairs").mkdir(exist_ok=True)
    for part in sorted((src / "pairs").glob("part-*.parquet")):
        data = pq.read_table(part)
        data = data.drop_columns([n for n in TOP_CELLS if n in data.column_names])
        ids = data.column("pair_id").to_pylist()
        for name in TOP_CELLS:
            data = data.append_column(name, pa.array([tops.get(i, {}).get(name) for i in ids],
                                                     SCHEMAS["pairs"].field(name).type))  # fmt: skip
        _write(data, "pairs", dst / "pairs" / part.name)
    for table in ("sentences", "quarantine"):
        (dst / table).mkdir(exist_ok=True)
        for f in (src / table).iterdir() if (src / table).is_dir() else ():
            if not (dst / table / f.name).exists():
                os.link(f, dst / table / f.name)
    manifest = json.loads((src / MANIFEST).read_text())
    manifest["config"]["store_version"] = STORE_VERSION
    manifest["upgraded_from"] = {"run": str(src), "by": PROG}
    write_json_atomic(dst / MANIFEST, manifest)  # last: a destination with a manifest is a whole run
    log(f"done: {len(info)} pairs in {time.perf_counter() - t0:.0f} s")
    return len(info)


def main(argv: list[str] | None = None) -> int:
    ap = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="the run directory to upgrade (read only)")
    ap.add_argument("dst", type=Path, help="the run directory to write, as the current store version")
    args = ap.parse_args(argv)

    def body() -> None:
        upgrade(args.src, args.dst, log=lambda line: print(line, flush=True))

    return exit_status(command_name(PROG), body, f"{args.dst} has no manifest.json until an upgrade finishes; run it again",
                       errors=(UpgradeError, OSError))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
