"""The jinja2 environment of the HTML pages (jobs/templates/): the report, the study index and `xsbert serve`; the
formatting its templates use (`plural`, `cell`: jobs.analyses.format writes the report's text with them too)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import jinja2
import markupsafe


def plural(n: int, word: str) -> str:
    """'1 pair', '3 pairs', '1,379 pairs'."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def cell(value: Any) -> str:
    """A table cell's text: floats to 4 significant digits, lists and dicts as JSON, None empty."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


# C0 controls but tab, newline and carriage return, and DEL: no HTML text may hold them (a NUL from a query string
# or a dataset would reach the page as it is; escaping leaves them alone).
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def printable(value: Any) -> Any:
    """Each value a template writes: a text's control characters as U+FFFD (markup the code made is left as it is)."""
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return _CONTROL.sub("\ufffd", value)
    return value


def environment() -> jinja2.Environment:
    """The page's templates (jobs/templates/): autoescaping on, so every text (dataset sentences, tokens, reasons)
    is escaped, and its control characters shown as U+FFFD (`printable`); the formatting in filters."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("jobs", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, finalize=printable)  # fmt: skip
    env.filters["plural"] = plural
    env.filters["cell"] = cell
    return env
