"""The jinja2 environment of the HTML pages (jobs/templates/): the report, the study index and `xsbert serve`."""

from __future__ import annotations

import jinja2


def environment() -> jinja2.Environment:
    """The page's templates (jobs/templates/): autoescaping on, so every text (dataset sentences, tokens, reasons)
    is escaped; the formatting in filters."""
    from .analyses.format import cell, plural

    env = jinja2.Environment(loader=jinja2.PackageLoader("jobs", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)  # fmt: skip
    env.filters["plural"] = lambda n, word: plural(n, word)
    env.filters["cell"] = cell
    return env
