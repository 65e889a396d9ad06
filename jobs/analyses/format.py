"""How the report writes numbers and tables: percentages, signed values, plurals, Markdown tables."""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl


def missing(x: Any) -> bool:
    """No number: null, or a NaN (the sql/ files return null for undefined statistics; NaN is guarded all the
    same)."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x: float | None) -> str:
    """A share as a percentage with one decimal: 0.1234 -> '12.3%'."""
    return "n/a" if missing(x) else f"{100 * x:.1f}%"


def num(x: float | None, digits: int = 2) -> str:
    """A number with `digits` decimals; 'n/a' for null or NaN."""
    return "n/a" if missing(x) else f"{x:.{digits}f}"


def signed(x: float | None, digits: int = 3) -> str:
    """An attribution with its sign: +0.123 / -0.045."""
    return "n/a" if missing(x) else f"{x:+.{digits}f}"


def plural(n: int, word: str) -> str:
    """'1 pair', '3 pairs'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def markdown_table(df: pl.DataFrame, max_rows: int | None = None) -> str:
    """The frame as a GitHub Markdown table (floats to 4 significant digits, `|` escaped)."""
    rows = df.head(max_rows) if max_rows is not None else df
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for row in rows.iter_rows():
        lines.append("| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |")
    if max_rows is not None and df.height > max_rows:
        lines.append(f"\n({max_rows} of {df.height} rows)")
    return "\n".join(lines)
