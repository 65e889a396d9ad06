"""Pair datasets in; validated pairs and quarantined rows out.

    source  = built-in name (stsb, qqp; negation, adjectives: generated, jobs/attribution/datasets.py)
              | local file (TSV/CSV/Parquet/JSONL, .gz ok)
              | local `datasets` folder | `datasets` hub name ("glue/qqp", "name:config")
    rows    = read(source) -> split filter -> --sample (seeded) -> --limit, in chunks of source rows
              (stream_pairs; load_pairs joins them)
    columns = recognised by name (flags override): text a/b, label, pair id; plus pass-through
              columns (the source's, and --keep-columns) copied as strings into `pairs`
    good, quarantine = validate(rows)          every row lands in exactly one of the two

A row's `row` is its 0-based position in the source (the file, or the hub split) before any
sampling, so it is stable when a dataset grows at the end. Its `pair_id` is the dataset's own id
as a string (several id columns are joined with ':'), else `str(row)`.
"""

from __future__ import annotations

import csv
import errno
import gzip
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from xsbert_core import InputError
from xsbert_core.models import hub_cached, hub_unreachable

from ..store import SCHEMAS
from . import datasets as _datasets

BUNDLED_STSB = Path(__file__).resolve().parents[1] / "data" / "stsb.tsv.gz"
# A QQP subset of GLUE's train split, in its TSV layout (id, qid1, qid2, question1, question2, is_duplicate), is not
# shipped (Quora's terms): `--dataset qqp` reads the file of --qqp-path or of this variable, else the hub's GLUE QQP.
QQP_ENV = "XSBERT_QQP"

BUILTINS: tuple[str, ...] = ("stsb", "qqp", "negation", "adjectives")
# Generated from code (jobs/attribution/datasets.py): name -> its pass-through columns.
GENERATED: dict[str, tuple[str, ...]] = {"negation": (), "adjectives": _datasets.ADJECTIVE_COLUMNS}
# Pass-through columns travel through normalise/validate under this prefix (no clash with own columns).
KEEP_PREFIX = "keep:"
STSB_SPLITS = {"train": "train", "dev": "dev", "validation": "dev", "test": "test"}
# STS-B's similarity scores: 0 (unrelated) to 5 (the same meaning); the training losses and Table 1 take score / 5.
STSB_LABELS = (0.0, 5.0)

# Recognised without flags, first match wins (compared case-insensitively).
TEXT_A_COLUMNS = ("sentence1", "question1", "text_a", "sentence_a", "text1", "premise")
TEXT_B_COLUMNS = ("sentence2", "question2", "text_b", "sentence_b", "text2", "hypothesis")
LABEL_COLUMNS = ("score", "label", "is_duplicate", "similarity_score", "relatedness_score")
ID_COLUMNS = ("pair_id", "id", "idx", "sid")
NO_COLUMN = ("", "none", "-")  # --id-column none: row numbers; --label-column none: no labels
# The column a reader adds for rows it could not take apart: what was wrong (None for the rows that are fine).
MALFORMED = "__malformed__"

# Labels that must be 0 or 1; other label columns must be finite numbers (and in --label-range).
BINARY_LABEL_COLUMNS = ("is_duplicate",)

# Quarantine reasons, in the order they are checked (a row gets the first that applies).
REASONS: tuple[str, ...] = (
    "malformed_row",  # a JSONL line that is not a JSON object; a TSV/CSV row with more or fewer fields than the header;
    # a text that is a list or a mapping (validate.STRUCTURED)
    "missing_pair_id",
    "duplicate_pair_id",  # the second and later rows with an id already seen
    "empty_text_a",
    "empty_text_b",
    "undecodable_text_a",  # bytes that are not UTF-8, lone surrogates, U+FFFD, NUL
    "undecodable_text_b",
    "bad_label",  # not a number, not finite, outside the label range, not 0/1 for is_duplicate
    "no_content_a",  # no token but special ones ([CLS] [SEP], <s> </s>, ...) or whitespace under the model's tokenizer
    "no_content_b",
    "too_long_a",  # more tokens than the model's max_seq_length (--truncation quarantine); more than --max-chars
    # characters in any mode, checked right after the empty texts, before any tokenizer sees the text
    "too_long_b",
    "attribution_error",  # the engine failed on the pair (NaN/Inf); retried on every rerun
    "not_converged",  # adaptive N: a sentence's factor error still above --tolerance at --max-steps
)


@dataclass
class Source:
    """Where rows come from, and what identifies the dataset in the run id."""

    kind: str  # "file" | "hub" | "hub-folder" | "generated"
    location: str  # file path, `datasets` folder, or hub name
    identity: str  # the dataset's name in the run id: built-in name, hub name, or the path as given
    split: str | None = None
    config: str | None = None
    id_columns: tuple[str, ...] | None = None  # None: recognise; (): row numbers
    label_range: tuple[float, float] | None = None
    split_column: str | None = None  # the file's split column, filtered by `split`
    whole_file_split: bool = False  # the file is `split` as a whole (the QQP subset: GLUE train)
    keep_columns: tuple[str, ...] = ()  # pass-through columns the dataset declares (copied into `pairs`)


@dataclass
class Columns:
    text_a: str
    text_b: str
    label: str | None
    ids: tuple[str, ...]  # empty: row numbers are the pair ids
    keep: tuple[str, ...] = ()  # pass-through columns, appended to `pairs` as strings

    def as_dict(self) -> dict[str, Any]:
        out = {"text_a": self.text_a, "text_b": self.text_b, "label": self.label, "id": list(self.ids)}
        if self.keep:  # only then: the run ids of runs without pass-through columns stay as they were
            out["keep"] = list(self.keep)
        return out


@dataclass
class Pairs:
    """The rows selected for a run, normalised: row, pair_id, text_a, text_b, label_raw (object dtype)."""

    rows: pd.DataFrame
    columns: Columns
    source: Source
    label_kind: str  # "binary" | "range" | "number" | "none"
    label_range: tuple[float, float] | None
    n_source_rows: int  # rows in the source (after the split filter), before sampling
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- resolving --dataset
def qqp_path(explicit: str | None = None) -> Path | None:
    """The QQP subset file: --qqp-path, else $XSBERT_QQP; None without either (`qqp` is then the hub's GLUE QQP)."""
    for candidate in (explicit, os.environ.get(QQP_ENV)):
        if candidate:
            path = Path(candidate).expanduser()
            if not path.exists():
                raise InputError(f"QQP file {path} does not exist (from --qqp-path / ${QQP_ENV})")
            return path
    return None


def require_qqp(explicit: str | None = None, who: str = "this") -> Path:
    """The QQP subset file for what cannot do without one (the benchmarks); InputError naming both ways to give it."""
    path = qqp_path(explicit)
    if path is None:
        raise InputError(f"{who} needs a QQP subset file (GLUE's TSV layout): pass --qqp-path FILE or set ${QQP_ENV}")
    return path


def resolve_source(
    dataset: str, split: str | None = None, config: str | None = None, qqp: str | None = None,
    config_key: str = "--config",
) -> Source:
    """Turn --dataset/--split/--config into a Source (no reading yet). A config is a hub dataset's (or a `datasets`
    folder's): given for any other dataset it is an InputError (`config_key`: how the message names it), not dropped."""
    source = _resolve_source(dataset, split, config, qqp)
    if config is not None and source.config != config:
        what = {"generated": "is generated", "file": "is a file"}.get(
            source.kind, f"is {source.identity}, whose config is {source.config}")  # qqp without a subset file
        hint = (f"; a study config runs with python -m jobs.pipeline --config {config}"
                if config_key == "--config" and config.lower().endswith((".yaml", ".yml")) else "")
        raise InputError(f"{config_key} {config}: only a hub dataset or a `datasets` folder takes a config, and "
                         f"{dataset.strip()} {what}{hint}")  # fmt: skip
    return source


def _resolve_source(dataset: str, split: str | None, config: str | None, qqp: str | None) -> Source:
    key = dataset.strip()
    if key.lower() in GENERATED:
        name = key.lower()
        s = STSB_SPLITS.get((split or "test").lower()) if name == "negation" else None
        if name == "negation" and s is None:
            raise InputError(f"negation takes the STS-B splits {', '.join(sorted(set(STSB_SPLITS)))}; got {split!r}")
        if name == "adjectives" and split is not None:
            raise InputError("adjectives has no splits (the triplets x templates of jobs/attribution/datasets.py)")
        return Source(kind="generated", location=name, identity=name, split=s, id_columns=("pair_id",),
                      keep_columns=GENERATED[name])  # fmt: skip
    if key.lower() == "stsb":
        s = STSB_SPLITS.get((split or "test").lower())
        if s is None:
            raise InputError(f"stsb has splits {', '.join(sorted(set(STSB_SPLITS)))}; got {split!r}")
        # sid repeats across source files and years; (source_file, year, sid) is unique in the file.
        return Source(
            kind="file", location=str(BUNDLED_STSB), identity="stsb", split=s,
            id_columns=("source_file", "year", "sid"), label_range=STSB_LABELS, split_column="split",
        )  # fmt: skip
    if key.lower() == "qqp":
        path = qqp_path(qqp)
        if path is not None and (split or "train") == "train":
            return Source(kind="file", location=str(path), identity="qqp", split="train", id_columns=("id",),
                          whole_file_split=True)  # fmt: skip
        # The full QQP (or another split) comes from the hub.
        return Source(kind="hub", location="glue", identity="glue/qqp", config="qqp", split=split or "train")
    path = Path(key).expanduser()
    kind = _path_kind(path)
    if kind == "file":
        return Source(kind="file", location=str(path), identity=os.path.normpath(key), split=split)
    if kind == "folder":
        return Source(kind="hub-folder", location=str(path), identity=os.path.normpath(key), split=split,
                      config=config)  # fmt: skip
    if kind is not None:
        raise InputError(f"--dataset {key!r}: {kind}")
    if os.sep in key and (key.startswith((".", os.sep, "~")) or Path(key).suffix):
        raise InputError(f"--dataset {key!r}: no such file or folder")
    name, cfg = key, config
    if cfg is None and ":" in key:
        name, cfg = key.split(":", 1)
    elif cfg is None and key.count("/") == 1 and key.split("/")[0].lower() in ("glue", "super_glue"):
        name, cfg = key.split("/")  # glue/qqp -> load_dataset("glue", "qqp")
    return Source(kind="hub", location=name, identity=key if config is None else f"{key}:{config}",
                  config=cfg, split=split)  # fmt: skip


def _path_kind(path: Path) -> str | None:
    """'file' (a regular file, or a link to one), 'folder', None when nothing is there; else what is there instead,
    as the error says it: a named pipe, a device, a socket, a link loop, a link to nothing, or why it cannot be
    looked at (a dataset is read more than once: first its columns, then its rows, so it must be a regular file)."""
    try:
        st = path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a loop of symbolic links (too many levels of symbolic links), not a file"
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "a symbolic link to nothing (its target does not exist)" if path.is_symlink() else None
        return f"cannot look at it: [Errno {exc.errno}] {os.strerror(exc.errno) if exc.errno else exc}"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    what = ("a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else "a character device" if stat.S_ISCHR(st.st_mode)
            else "a block device" if stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "not a regular file")  # fmt: skip
    return f"{what}, not a file: the job reads a dataset more than once (its columns, then its rows); give a file"


def _unique_columns(path: str, names: Sequence[Any]) -> list[Any]:
    """`names`, or one InputError when two of them are the same name (columns are recognised case-insensitively, so
    `Score` and `score` are the same): which of them the job read would be a guess."""
    seen: dict[str, int] = {}
    for k, name in enumerate(names):
        low = str(name).strip().lower()
        if low in seen:
            first = names[seen[low]]
            same = "twice" if str(first) == str(name) else f"as {first!r} and {name!r} (columns are matched ignoring case)"
            raise InputError(f"{path}: the column name {str(name)!r} appears {same}, columns {seen[low] + 1} and "
                             f"{k + 1}: rename one of them")  # fmt: skip
        seen[low] = k
    return list(names)


# --------------------------------------------------------------------------- reading
def _format_of(path: str) -> str:
    name = path.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    for ext, fmt in ((".tsv", "tsv"), (".tab", "tsv"), (".csv", "csv"), (".parquet", "parquet"), (".pq", "parquet"),
                     (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl")):  # fmt: skip
        if name.endswith(ext):
            return fmt
    raise InputError(f"{path}: unknown file type; use .tsv, .csv, .parquet or .jsonl (optionally .gz)")


def _open_text(path: str):
    # surrogateescape: bytes that are not UTF-8 survive as lone surrogates, which validation rejects.
    if path.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="surrogateescape", newline="")
    return open(path, encoding="utf-8", errors="surrogateescape", newline="")


def _frame(columns: Sequence[str], records: list[list[Any]], first_row: int = 0) -> pd.DataFrame:
    """A DataFrame of Python objects (pandas' string dtype would reject lone surrogates), with `__row__` numbered
    from `first_row`."""
    data = {c: pd.Series([r[k] if k < len(r) else None for r in records], dtype=object) for k, c in enumerate(columns)}
    df = pd.DataFrame(data, index=pd.RangeIndex(len(records)))
    df["__row__"] = np.arange(first_row, first_row + len(records), dtype=np.int64)
    return df


def _batched(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """Lists of `size` items (the last one shorter; one empty list for no items: a chunk still carries the columns)."""
    batch: list[Any] = []
    empty = True
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch, empty = [], False
    if batch or empty:
        yield batch


def _read_delimited(path: str, fmt: str, chunk_rows: int) -> Iterator[pd.DataFrame]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with _open_text(path) as fh:
        # TSV: no quoting (GLUE / STS-B files keep literal quotes); CSV: standard quoting.
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE) if fmt == "tsv" else csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise InputError(f"{path} is empty")
        header = _unique_columns(path, [h.lstrip("\ufeff").strip() for h in header])
        n = len(header)
        first = 0
        for records in _batched(reader, chunk_rows):
            frame = _frame(header, records, first)
            # A row of more or fewer fields than the header cannot be taken apart (a tab inside a TSV text, a stray
            # quote in a CSV): which of its fields is which is not known. An empty line has no fields: empty texts.
            wrong = [None if not r or len(r) == n else f"{len(r)} field(s) where the header has {n}" for r in records]
            if any(wrong):
                frame[MALFORMED] = pd.Series(wrong, dtype=object)
            yield frame
            first += len(records)


def _jsonl_records(path: str) -> Iterator[dict[str, Any]]:
    opener = gzip.open if path.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            text = line.decode("utf-8", errors="surrogateescape").strip()
            if not text:
                continue
            try:
                obj = json.loads(text, object_pairs_hook=lambda pairs: _object(path, number, pairs))
            except InputError:  # a key twice: said, not taken for a malformed row
                raise
            except ValueError:
                obj = None
            yield obj if isinstance(obj, dict) else {MALFORMED: "not a JSON object"}


def _object(path: str, line: int, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; one InputError when it has a key twice (json.loads would keep the last one silently)."""
    _unique_columns(f"{path} line {line}", [k for k, _ in pairs])
    return dict(pairs)


def _read_jsonl(path: str, chunk_rows: int) -> Iterator[pd.DataFrame]:
    # The columns are every key of every line, so a first pass collects them (keys only, nothing kept per line).
    columns = list(dict.fromkeys(k for r in _jsonl_records(path) for k in r))
    first = 0
    for records in _batched(_jsonl_records(path), chunk_rows):
        yield _frame(columns, [[r.get(c) for c in columns] for r in records], first)
        first += len(records)


def _read_parquet(path: str, chunk_rows: int) -> Iterator[pd.DataFrame]:
    import pyarrow.parquet as pq

    # Streamed through a 1 MiB buffer: a row group is not read whole (404k rows in one group: ~55 MB at once).
    file = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    names = _unique_columns(path, file.schema_arrow.names)
    first = 0
    for batch in file.iter_batches(batch_size=chunk_rows):
        yield _frame(names, list(zip(*(c.to_pylist() for c in batch.columns))), first)
        first += batch.num_rows
    if first == 0:
        yield _frame(names, [], 0)


_TABLE_SUFFIXES = {".parquet", ".json", ".jsonl", ".ndjson", ".arrow"}  # a folder of these is not read as CSV


def _folder_options(source: Source) -> dict[str, Any]:
    """What `datasets` is told for a local folder of CSV/TSV files: keep_default_na=False, so that its CSV reader
    (pandas) keeps a field as its text, as the job's own reader of a file does, instead of turning `nan`, `NA` or
    `null` into no value: a label `nan` is then a bad label in a folder as in a file, not a pair without a label."""
    if source.kind != "hub-folder":
        return {}
    suffixes = {Path(p.name.removesuffix(".gz").removesuffix(".bz2").removesuffix(".zst")).suffix.lower()
                for p in Path(source.location).rglob("*") if p.is_file() and not p.name.startswith(".")}  # fmt: skip
    csv_like = suffixes & {".csv", ".tsv"} and not suffixes & _TABLE_SUFFIXES
    return {"keep_default_na": False} if csv_like else {}


def _hub_dataset_cached(name: str) -> bool:
    """Whether this machine holds hub dataset `name` from an earlier download: its files in the hub's cache, or its
    prepared tables in `datasets`' cache (which `datasets` reads when the hub cannot be reached)."""
    import datasets

    prepared = Path(datasets.config.HF_DATASETS_CACHE) / name.replace("/", "___")
    return hub_cached(name, repo_type="dataset") is not None or prepared.is_dir()


def _read_datasets(source: Source, chunk_rows: int) -> Iterator[pd.DataFrame]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise InputError("reading hub datasets needs the `datasets` package") from exc
    hint = (
        "The built-in `qqp` reads a local subset file of the train split (--qqp-path or $XSBERT_QQP); without one "
        "it is the hub's GLUE QQP, which needs the Hugging Face hub (network), or a local copy passed as a file."
        if source.identity == "glue/qqp"
        else "Pass a local file (TSV/CSV/Parquet/JSONL) or run where the Hugging Face hub is reachable."
    )
    what = f"dataset {source.identity!r} (config {source.config!r}, split {source.split!r})"
    if source.kind == "hub" and (why := hub_unreachable()) is not None and not _hub_dataset_cached(source.location):
        raise InputError(f"could not load {what}: the Hugging Face hub cannot be reached ({why}) and no cache here "
                         f"holds it. {hint}")  # fmt: skip
    try:
        ds = datasets.load_dataset(source.location, source.config, split=source.split, **_folder_options(source))
    except Exception as exc:  # noqa: BLE001 - offline, unknown name, unknown split: one clear message
        raise InputError(
            f"could not load {what} with `datasets`: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. {hint}"
        ) from exc
    if isinstance(ds, datasets.DatasetDict):
        if len(ds) != 1:
            raise InputError(f"dataset {source.identity!r} has splits {', '.join(ds)}: choose one with --split")
        (source.split, ds), = ds.items()
    # The dataset is memory-mapped Arrow: only a chunk at a time becomes Python objects.
    names = ds.column_names
    for first in range(0, max(len(ds), 1), chunk_rows):
        part = ds[first : first + chunk_rows]
        yield _frame(names, [list(r) for r in zip(*(part[n] for n in names))], first)


def _readable(chunks: Iterator[pd.DataFrame], path: str, fmt: str) -> Iterator[pd.DataFrame]:
    """A file's chunks; a file that is not what its name says (not Parquet, not gzip) or was cut short is one
    InputError that names it, wherever in the stream that shows (the rows before it were read)."""
    import zlib

    import pyarrow as pa

    try:
        yield from chunks
    except (OSError, EOFError, zlib.error, pa.ArrowException) as exc:
        kind = {"parquet": "Parquet"}.get(fmt, fmt.upper())
        kind += ", gzip-compressed" if path.lower().endswith(".gz") else ""
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: cannot be read as {kind} ({why})") from None


# Source rows per chunk of the streaming read (iter_source): what the driver holds as Python objects at once.
CHUNK_ROWS = 16_384


def iter_source(source: Source, chunk_rows: int = CHUNK_ROWS) -> Iterator[pd.DataFrame]:
    """The source's rows (after the split filter) in chunks of at most `chunk_rows` source rows, object dtype, with a
    `__row__` column (the row's position in the source). The first chunk always comes, with the columns, if empty."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if source.kind == "file":
        fmt = _format_of(source.location)
        if fmt in ("tsv", "csv"):
            chunks = _read_delimited(source.location, fmt, chunk_rows)
        elif fmt == "parquet":
            chunks = _read_parquet(source.location, chunk_rows)
        else:
            chunks = _read_jsonl(source.location, chunk_rows)
        chunks = _readable(chunks, source.location, fmt)
        if source.split is None or source.whole_file_split:
            yield from chunks
            return
        kept = 0
        for k, df in enumerate(chunks):
            column = source.split_column or _find(df.columns, ("split",))
            if column is None:
                raise InputError(f"{source.location} has no `split` column to select --split {source.split!r} from")
            df = df[df[column].astype(str) == source.split].reset_index(drop=True)
            kept += len(df)
            if len(df) or k == 0:
                yield df
        if not kept:
            raise InputError(f"{source.location} has no rows with split == {source.split!r}")
        return
    if source.kind == "generated":
        if source.location == "negation":
            df = _datasets.negation_pairs(str(BUNDLED_STSB), source.split or "test")
        else:
            df = _datasets.adjective_pairs()
        df["__row__"] = np.arange(len(df), dtype=np.int64)
        for first in range(0, max(len(df), 1), chunk_rows):
            yield df.iloc[first : first + chunk_rows].reset_index(drop=True)
        return
    yield from _read_datasets(source, chunk_rows)


# --------------------------------------------------------------------------- columns
def _find(columns, candidates: Sequence[str]) -> str | None:
    lower = {str(c).lower(): c for c in columns}
    for name in candidates:
        if name in lower:
            return lower[name]
    return None


def _flag_columns(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if value.strip().lower() in NO_COLUMN:
        return ()
    return tuple(c.strip() for c in value.split(",") if c.strip())


def recognise_columns(
    df: pd.DataFrame,
    source: Source,
    text_a: str | None = None,
    text_b: str | None = None,
    label: str | None = None,
    ids: str | None = None,
    keep: str | None = None,
) -> Columns:
    """Pick the text, label and id columns: flags first, then the built-in's, then common names; and the
    pass-through columns: the source's, then --keep-columns (comma-separated)."""
    available = [c for c in df.columns if c != "__row__"]

    def must(name: str, flag: str) -> str:
        found = _find(available, (name.lower(),))
        if found is None:
            raise InputError(f"{flag} {name!r}: no such column (columns: {', '.join(map(str, available))})")
        return found

    col_a = must(text_a, "--text-a-column") if text_a else _find(available, TEXT_A_COLUMNS)
    col_b = must(text_b, "--text-b-column") if text_b else _find(available, TEXT_B_COLUMNS)
    if col_a is None or col_b is None:
        raise InputError(
            f"could not recognise the two text columns among {', '.join(map(str, available))}; "
            f"known names: {'/'.join(TEXT_A_COLUMNS)} and {'/'.join(TEXT_B_COLUMNS)}, "
            "or pass --text-a-column and --text-b-column"
        )
    flag_label = _flag_columns(label)
    if flag_label is None:
        col_label = _find(available, LABEL_COLUMNS)
    elif not flag_label:
        col_label = None
    else:
        col_label = must(flag_label[0], "--label-column")
    flag_ids = _flag_columns(ids)
    if flag_ids is not None:
        id_cols = tuple(must(c, "--id-column") for c in flag_ids)
    elif source.id_columns is not None:
        id_cols = source.id_columns
    else:
        found = _find(available, ID_COLUMNS)
        id_cols = (found,) if found is not None else ()
    keep_cols = tuple(dict.fromkeys([*source.keep_columns,
                                     *(must(c, "--keep-columns") for c in _flag_columns(keep) or ())]))  # fmt: skip
    taken = {name.lower() for name in SCHEMAS["pairs"].names}
    for name in keep_cols:
        if str(name).lower() in taken:
            raise InputError(f"--keep-columns {name!r}: `pairs` already has a column of that name")
    return Columns(text_a=col_a, text_b=col_b, label=col_label, ids=id_cols, keep=keep_cols)


# --------------------------------------------------------------------------- selection
def sample_positions(n: int, sample: int | None, seed: int) -> np.ndarray | None:
    """--sample N: the sorted positions of N of the n rows, drawn with the seed; None: every row.

    Samples nest: each position p gets the rank key h(seed, p) (splitmix64 of p + seed·φ·2⁶⁴, a seeded hash;
    keys are distinct, the hash being a bijection), and a sample of N is the N positions of smallest key. So with
    one seed the sample of 30 is inside the sample of 300, which adds exactly 270 rows; and a row's key does not
    depend on n (a source that grew keeps its old sample's rows, but for new rows that rank before them)."""
    if sample is None or sample >= n:
        return None
    keys = _splitmix64(np.arange(n, dtype=np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64))
    return np.sort(np.argpartition(keys, sample - 1)[:sample])


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele, Lea & Flood 2014) on uint64 values: a bijection that mixes every bit."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def select_chunks(chunks: Iterator[pd.DataFrame], positions: np.ndarray | None, limit: int | None,
                  counted: Callable[[int], None] = lambda n: None) -> Iterator[pd.DataFrame]:  # fmt: skip
    """The rows at `positions` (--sample; None: all) of the stream of chunks, then the first `limit` of those
    (--limit), in source order; `counted(n)` is told each chunk's size (the source's rows, selected or not)."""
    position = taken = 0
    for df in chunks:
        n = len(df)
        counted(n)
        if positions is not None:
            lo, hi = np.searchsorted(positions, [position, position + n])
            df = df.iloc[positions[lo:hi] - position]
        position += n
        if limit is not None:
            df = df.iloc[: max(0, limit - taken)]
        taken += len(df)
        if len(df):
            yield df.reset_index(drop=True)
