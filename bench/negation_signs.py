"""Fig 8's count of negative *not* attributions, each sign taken at an N where the pair's error is well below it.

The same negation pairs attributed at several N (one run each, ascending N: e.g. bench/shelf_gpu.py's negation runs
at N = 32, 64, 128, 256). sql/negation.sql runs on each; per pair, the sign is counted from the smallest N whose
completeness error |ΣA − target| is below `--margin` × |not attribution| (default a tenth); a pair that reaches no
such N is not counted (and listed). Prints and writes the count with its exact binomial 95% interval, the
probability of at most that count if the paper's share held, the 90th percentile of |relative|, and each pair's row.

    python bench/negation_signs.py runs/<N=32 run> runs/<N=64 run> ... [--definition paper|word_cells] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binomtest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from jobs import paper, sqlrun  # noqa: E402

PAPER_SHARE = {"shelf": "fig8_not_negative_shelf", "exact": "fig8_not_negative_exact"}


def run_rows(run: str, definition: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """(N of the run, {pair_id: the pair's negation row with its completeness error})."""
    con = sqlrun.connect(run, variables={"definition": definition})
    pairs = sqlrun.query(con, "select pair_id, completeness_error, steps_a, steps_b from pairs").to_pandas()
    steps = sorted({int(n) for n in pairs["steps_a"]} | {int(n) for n in pairs["steps_b"]})
    if len(steps) != 1:
        raise SystemExit(f"{run}: not one fixed N (N per sentence: {steps}); give runs of a fixed --steps")
    rows = sqlrun.run_file(con, "negation").to_pandas().merge(pairs, on="pair_id", how="left")
    return steps[0], {r["pair_id"]: r for r in rows.to_dict("records")}


def binomial_interval(k: int, n: int) -> list[float]:
    ci = binomtest(k, n).proportion_ci(method="exact")
    return [float(ci.low), float(ci.high)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/negation_signs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories of the same pairs at different fixed N")
    p.add_argument("--definition", default="paper", choices=("paper", "word_cells"), help="sql/negation.sql's")
    p.add_argument("--margin", type=float, default=0.1, help="a sign counts where |error| < margin x |not|")
    p.add_argument("--paper", default="shelf", choices=sorted(PAPER_SHARE), help="the paper's share to test against")
    p.add_argument("--out", type=Path, default=None, help="write the numbers as JSON")
    args = p.parse_args(argv)

    by_n = dict(sorted(run_rows(r, args.definition) for r in args.runs))
    ids = sorted(set.intersection(*(set(rows) for rows in by_n.values())))
    if not ids:
        raise SystemExit("the runs have no negation pair in common")
    chosen: list[dict[str, Any]] = []
    for pid in ids:
        row = next(({**rows[pid], "N": n} for n, rows in by_n.items()
                    if abs(rows[pid]["completeness_error"]) < args.margin * abs(rows[pid]["not_attribution"])),
                   None)  # fmt: skip
        values = {str(n): float(rows[pid]["not_attribution"]) for n, rows in by_n.items()}
        chosen.append({"pair_id": pid, "N": row["N"] if row else None, "not_attribution": values,
                       "counted": row is not None, "negative": bool(row and row["not_attribution"] < 0),
                       "relative": float(row["relative"]) if row else None,
                       "completeness_error": float(row["completeness_error"]) if row else None})  # fmt: skip
    counted = [c for c in chosen if c["counted"]]
    k, n = sum(c["negative"] for c in counted), len(counted)
    share = paper.get(PAPER_SHARE[args.paper]).value
    signs = np.sign([[c["not_attribution"][str(m)] for m in by_n] for c in chosen])
    result = {
        "definition": args.definition, "margin": args.margin, "N": list(by_n), "runs": args.runs,
        "pairs": len(ids), "counted": n, "negative": k, "share": k / n if n else None,
        "ci95": binomial_interval(k, n) if n else None,
        "p_at_most_if_paper": float(binomtest(k, n, share, alternative="less").pvalue) if n else None,
        "paper_share": share, "N_used": {str(m): sum(c["N"] == m for c in counted) for m in by_n},
        "not_counted": [c["pair_id"] for c in chosen if not c["counted"]],
        "pairs_whose_sign_differs_across_N": int((np.ptp(signs, axis=1) > 0).sum()),
        "p90_abs_relative": float(np.quantile([abs(c["relative"]) for c in counted], 0.9)) if n else None,
        "negative_values": sorted(round(c["not_attribution"][str(c["N"])], 4) for c in counted if c["negative"]),
        "rows": chosen,
    }  # fmt: skip
    summary = {k2: v for k2, v in result.items() if k2 != "rows"}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
