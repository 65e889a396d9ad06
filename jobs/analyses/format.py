"""How the report writes numbers and tables: percentages, signed values, plurals, Markdown tables."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from ..pages import cell, plural  # noqa: F401 - the pages' filters, the report's text uses them too


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


def markdown_table(df: pl.DataFrame, max_rows: int | None = None) -> str:
    """The frame as a GitHub Markdown table (floats to 4 significant digits, `|` escaped)."""
    rows = df.head(max_rows) if max_rows is not None else df
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    for row in rows.iter_rows():
        lines.append("| " + " | ".join(cell(v).replace("|", "\\|") for v in row) + " |")
    if max_rows is not None and df.height > max_rows:
        lines.append(f"\n({max_rows} of {df.height} rows)")
    return "\n".join(lines)
