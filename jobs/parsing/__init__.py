"""The machinery of jobs.parse: choosing the parser (choice), the Ray actor and its rows (actor), the parser-output
cache shared by runs (cache), a run's `parses` rows (rows), the actor pool on Ray or one parser in this process
(pool), the runs parsed into (runs), and the job that puts them together (job: `parse_runs`)."""

from __future__ import annotations

from .actor import CACHE_SCHEMA, DEFAULT_BATCH_SIZE, ParserActor, cache_rows, parsed_words
from .cache import CACHE_DIRNAME, ParseCache
from .choice import (
    PARSERS,
    SPACY_EXCLUDE,
    SPACY_MODEL,
    STANZA_DOWNLOAD_HINT,
    STANZA_PROCESSORS,
    STANZA_REQUIRED,
    ParserSpec,
    choose_parser,
    download_stanza,
    find_stanza,
    has_stanza_english,
    spacy_spec,
    stanza_candidates,
    stanza_spec,
)
from .job import parse_runs
from .pool import parse_here, parse_on_ray, pool
from .rows import UNUSABLE_SHOWN, alignment_counts, parse_rows, realigned

__all__ = [
    "CACHE_DIRNAME", "CACHE_SCHEMA", "DEFAULT_BATCH_SIZE", "PARSERS", "SPACY_EXCLUDE", "SPACY_MODEL",
    "STANZA_DOWNLOAD_HINT", "STANZA_PROCESSORS", "STANZA_REQUIRED", "UNUSABLE_SHOWN", "ParseCache", "ParserActor",
    "ParserSpec", "alignment_counts", "cache_rows", "choose_parser", "download_stanza", "find_stanza",
    "has_stanza_english", "parse_here", "parse_on_ray", "parse_rows",
    "parse_runs", "parsed_words", "pool", "realigned", "spacy_spec", "stanza_candidates", "stanza_spec",
]  # fmt: skip
