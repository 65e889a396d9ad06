"""The Ray actor that parses texts, and the rows it returns (the parser-output cache's schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from xsbert_core.syntax import ParsedWord

from ..config import PARSE_BATCH_SIZE
from .choice import SPACY_EXCLUDE, SPACY_MODEL, STANZA_PROCESSORS

# Texts per actor call: spaCy took ~7 s for 2,416 STS-B sentences on one core here, so a call is well under a
# second; small enough to balance the actors, large enough for nlp.pipe's batching.
DEFAULT_BATCH_SIZE = PARSE_BATCH_SIZE

# The parser-output cache: one row per text, the parser's words in its own labels (ClearNLP for spaCy:
# the UD conversion runs at realignment, so a better conversion needs no reparse). head: -1 for a root.
CACHE_SCHEMA = pa.schema(
    [
        ("sentence_id", pa.string()),
        ("text", pa.string()),
        ("error", pa.string()),  # null, or why the parser failed on this text
        ("word_text", pa.list_(pa.string())),
        ("word_start", pa.list_(pa.int32())),
        ("word_end", pa.list_(pa.int32())),
        ("word_upos", pa.list_(pa.string())),
        ("word_xpos", pa.list_(pa.string())),
        ("word_lemma", pa.list_(pa.string())),
        ("word_deprel", pa.list_(pa.string())),
        ("word_head", pa.list_(pa.int32())),
    ]
)


def cache_rows(ids: list[str], texts: list[str], results: list[list[ParsedWord] | str]) -> pa.Table:
    """CACHE_SCHEMA rows: a parse, or the parser's failure message, per text."""
    cols: dict[str, list[Any]] = {name: [] for name in CACHE_SCHEMA.names}
    for sid, text, res in zip(ids, texts, results):
        cols["sentence_id"].append(sid)
        cols["text"].append(text)
        failed = isinstance(res, str)
        cols["error"].append(res if failed else None)
        words: list[ParsedWord] = [] if failed else res  # type: ignore[assignment]
        cols["word_text"].append([w.text for w in words])
        cols["word_start"].append([w.start for w in words])
        cols["word_end"].append([w.end for w in words])
        cols["word_upos"].append([w.upos for w in words])
        cols["word_xpos"].append([w.xpos for w in words])
        cols["word_lemma"].append([w.lemma for w in words])
        cols["word_deprel"].append([w.deprel for w in words])
        cols["word_head"].append([-1 if w.head is None else w.head for w in words])
    return pa.table(cols, schema=CACHE_SCHEMA)


def parsed_words(row: dict[str, Any]) -> list[ParsedWord]:
    """A cache row back to the parser's words (its own labels)."""
    return [
        ParsedWord(text=t, start=s, end=e, upos=up, deprel=d, head=None if h < 0 else h, xpos=xp, lemma=lem)
        for t, s, e, up, xp, lem, d, h in zip(
            row["word_text"],
            row["word_start"],
            row["word_end"],
            row["word_upos"],
            row["word_xpos"],
            row["word_lemma"],
            row["word_deprel"],
            row["word_head"],
        )  # fmt: skip
    ]


class ParserActor:
    """Texts (sentence_id, text) -> CACHE_SCHEMA rows. Loads the parser once per actor; a text the parser
    fails on gets its error message instead of words (the batch is retried text by text)."""

    def __init__(self, parser: str, stanza_dir: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        from xsbert_core.syntax import read_stanza, spacy_words

        self.parser = parser
        self.batch_size = batch_size
        if parser == "spacy":
            import spacy

            self.nlp = spacy.load(SPACY_MODEL, exclude=list(SPACY_EXCLUDE))
            self.read = spacy_words
        elif parser == "stanza":
            import stanza

            processors = [
                p for p in STANZA_PROCESSORS if p != "mwt" or (Path(stanza_dir or "") / "en" / "mwt").is_dir()
            ]
            self.nlp = stanza.Pipeline(
                "en", dir=stanza_dir, processors=",".join(processors), download_method=None, use_gpu=False,
                logging_level="WARN",
            )  # fmt: skip
            self.read = read_stanza
        else:
            raise ValueError(f"unknown parser {parser!r}")

    def parse(self, texts: list[str]) -> list[list[ParsedWord] | str]:
        """One result per text: its words, or `ErrorType: message`."""
        try:
            if self.parser == "spacy":
                docs = list(self.nlp.pipe(texts, batch_size=self.batch_size))
            else:
                import stanza

                docs = self.nlp([stanza.Document([], text=t) for t in texts])
            return [self.read(d) for d in docs]
        except Exception:  # noqa: BLE001 - one bad text must not sink its batch: one by one
            out: list[list[ParsedWord] | str] = []
            for text in texts:
                try:
                    out.append(self.read(self.nlp(text)))
                except Exception as exc:  # noqa: BLE001
                    out.append(f"{type(exc).__name__}: {exc}"[:500])
            return out

    def __call__(self, batch: pa.Table) -> pa.Table:
        ids = batch.column("sentence_id").to_pylist()
        texts = batch.column("text").to_pylist()
        return cache_rows(ids, texts, self.parse(texts))
