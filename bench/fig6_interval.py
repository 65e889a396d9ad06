"""Fig 6's shares with bootstrap intervals over pairs: sql/syntactic_relations.sql at the grain of one pair.

sql/syntactic_relations.sql counts the relation pairs of every pair's top word cells over the whole run. This script
runs the same file with its `labelled` step keeping the pair id, counts per pair (top cells; nsubj–nsubj; same
function; unaligned or unparsed), checks that the per-pair counts add up to the file's own totals, and resamples
pairs (with replacement, seeded) for 95% percentile intervals of the shares. --sample N gives the same numbers on
the run's pairs that `jobs.attribute --sample N --seed S` selects (samples nest: the 300 inside all 1,379), for a
run of every row of one split.

    python bench/fig6_interval.py --run runs/<id> [--sample 300 --seed 0] [--top-share 0.1] [--out fig6.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jobs import sqlfiles, sqlrun  # noqa: E402
from jobs.attribution.inputs import sample_positions  # noqa: E402

SQL = sqlfiles.SQL_DIR / "syntactic_relations.sql"
# The file's `labelled` step, and the same step keeping the pair (the only change to the file's logic).
LABELLED = "        coalesce(parses_a.relation, 'unparsed') as relation_of_a,\n"
LABELLED_WITH_PAIR = "        top_cells.pair_id,\n" + LABELLED
PER_PAIR = """
per_pair as (
    select
        pair_id,
        count(*) as n,
        count(*) filter (where relation_of_a = 'nsubj' and relation_of_b = 'nsubj') as nsubj_nsubj,
        count(*) filter (
            where relation_of_a = relation_of_b and relation_of_a not in ('unaligned', 'unparsed')
        ) as same_function,
        count(*) filter (
            where relation_of_a in ('unaligned', 'unparsed') or relation_of_b in ('unaligned', 'unparsed')
        ) as unaligned,
    from labelled
    group by pair_id
)

select * from per_pair order by pair_id
"""


def per_pair_sql() -> str:
    text = sqlfiles.text(SQL)  # with the macros of sql/lib/ it reads
    if text.count(LABELLED) != 1 or "relation_pairs as (" not in text:
        raise SystemExit(f"{SQL}: its `labelled` step changed; update {Path(__file__).name}")
    head = text.replace(LABELLED, LABELLED_WITH_PAIR).split("relation_pairs as (")[0].rstrip().rstrip(",")
    return head + ",\n" + PER_PAIR


def shares(counts: np.ndarray) -> dict[str, float]:
    """counts: (pairs, 4) of n, nsubj_nsubj, same_function, unaligned -> shares of all top cells."""
    total = counts.sum(axis=0)
    same, mixed = total[2] / total[0], (total[0] - total[2] - total[3]) / total[0]
    parsed = same + mixed  # 0 in a resample of pairs whose top cells all have an unaligned word: no value then
    return {"nsubj_nsubj_share": total[1] / total[0], "same_function_share": same, "mixed_share": mixed,
            "unaligned_share": total[3] / total[0], "same_of_parsed": same / parsed if parsed else float("nan")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/fig6_interval.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--sample", type=int, default=None, help="the pairs of jobs.attribute --sample N (by row)")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample")
    p.add_argument("--top-share", type=float, default=0.10)
    p.add_argument("--resamples", type=int, default=2000)
    p.add_argument("--bootstrap-seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = p.parse_args(argv)

    con = sqlrun.connect(args.run, variables={"top_share": args.top_share})
    df = sqlrun.query(con, per_pair_sql()).to_pandas()
    whole = sqlrun.run_file(con, SQL).to_pandas()
    rows = sqlrun.query(con, "select pair_id, row from pairs").to_pandas()  # the view: the run's pairs
    df = df.merge(rows, on="pair_id", how="inner")
    n_rows = len(rows)
    if int(df["n"].sum()) != int(whole["n"].sum()):
        raise SystemExit(f"per-pair top cells {int(df['n'].sum())} != the file's {int(whole['n'].sum())}")
    if args.sample is not None:
        # --sample draws positions among the split's rows in source order: the k-th smallest `row` is position k
        keep = sample_positions(n_rows, args.sample, args.seed)
        if keep is not None:
            df = df[df["row"].isin(set(np.sort(rows["row"].to_numpy())[keep].tolist()))]
    counts = df[["n", "nsubj_nsubj", "same_function", "unaligned"]].to_numpy(dtype=float)
    point = shares(counts)
    rng = np.random.default_rng(args.bootstrap_seed)
    draws = [shares(counts[rng.integers(0, len(counts), len(counts))]) for _ in range(args.resamples)]
    result: dict[str, Any] = {
        "run": str(args.run), "pairs": len(df), "top_cells": int(counts[:, 0].sum()), "top_share": args.top_share,
        "sample": args.sample, "seed": args.seed, "resamples": args.resamples,
        "shares": {k: {"value": v, "ci95": [float(np.nanpercentile([d[k] for d in draws], q)) for q in (2.5, 97.5)]}
                   for k, v in point.items()},
    }  # fmt: skip
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
