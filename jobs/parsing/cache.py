"""The parser-output cache, shared by runs: one row per text, keyed by parser name, version and model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from ..config import CACHE_DIRNAME  # noqa: F401 - the default of --cache, declared with it
from ..processes import waiting_lock
from ..store import PART_RE, fsync_dir, write_parquet_synced
from .actor import CACHE_SCHEMA
from .choice import ParserSpec


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
        with waiting_lock(self.path / ".lock"):
            seqs = [int(PART_RE.match(p.name).group(1)) for p in self.parts()]  # type: ignore[union-attr]
            seq = max(seqs, default=-1) + 1
            final = self.path / f"part-{seq:06d}.parquet"
            tmp = self.path / f".{final.name}.tmp"
            write_parquet_synced(rows.sort_by("sentence_id").cast(CACHE_SCHEMA), tmp, None)
            os.replace(tmp, final)
            fsync_dir(self.path)
        return final
