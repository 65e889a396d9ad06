"""The work list of a run and its keys, held in memory-mapped files rather than the driver's heap: the pairs to
attribute spilled chunk by chunk (`SpillFile`, `WorkList`), their order into waves (`wave_order`), and the set of
sentence ids stored already (`SentenceKeys`)."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..store import pair_keys
from .validate import sorted_find

_HEX = np.full(256, 255, dtype=np.uint64)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint64)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint64)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint64)


def mapped_keys(pieces: Iterable[np.ndarray], directory: str | None = None) -> np.ndarray:
    """The concatenation of `pieces` (uint64 arrays) as a read-only memory-mapped file under `directory` (default:
    tempfile's), its folder removed at once: the keys' pages are the kernel's to drop and read again (file-backed),
    not the driver's own heap, which so holds none of them however many pairs a run has. Written piece by piece."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="xsbert-keys-", dir=directory)
    try:
        path, n = os.path.join(folder, "keys.u64"), 0
        with open(path, "wb") as fh:
            for piece in pieces:
                np.ascontiguousarray(piece, np.uint64).tofile(fh)
                n += len(piece)
        return np.memmap(path, np.uint64, mode="r", shape=(n,)) if n else np.zeros(0, np.uint64)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def sorted_contains(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """One bool per query: in the sorted array `keys`? (sorted_find's second half.)"""
    return sorted_find(keys, queries)[1]


def _merge_sorted(old: np.ndarray, new: np.ndarray, chunk: int = 1 << 20) -> Iterator[np.ndarray]:
    """The sorted union of the sorted, disjoint `old` and `new`, `chunk` keys of `old` at a time."""
    at = np.searchsorted(old, new)  # new[k] goes before old[at[k]]
    j = 0
    for start in range(0, len(old), chunk):
        stop = min(start + chunk, len(old))
        k = int(np.searchsorted(at, stop))  # those that go before old[stop]
        yield np.sort(np.concatenate([old[start:stop], new[j:k]]))
        j = k
    yield new[j:]


class SentenceKeys:
    """The set of sentence ids a run has stored, as sorted 64-bit integers (the ids are 16 hex digits) in a
    memory-mapped file (mapped_keys): 8 bytes per sentence of the page cache instead of a Python string in a set
    (~90; 404k QQP pairs have ~540k sentences), none of the driver's heap. add() writes the merged keys to a new
    file (a wave's new keys and one chunk of the old ones in memory at a time)."""

    def __init__(self, ids: Iterable[str] | pa.Array | pa.ChunkedArray = (), directory: str | None = None) -> None:
        self.directory = directory
        self.keys = mapped_keys([np.unique(self._keys(ids))], directory)

    @staticmethod
    def _keys(ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
        """The ids as uint64, read from the Arrow string buffers (no Python object per id)."""
        arr = ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(list(ids), pa.string())
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arr = arr.cast(pa.string())
        if arr.null_count:
            raise ValueError("a sentence id is missing (null)")
        if not len(arr):
            return np.zeros(0, np.uint64)
        offsets = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + len(arr) + 1]
        if np.any(np.diff(offsets) != 16):
            raise ValueError("a sentence id is not 16 hex digits")
        digits = _HEX[np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0] : offsets[-1]].reshape(len(arr), 16)]
        if np.any(digits == 255):
            raise ValueError("a sentence id is not 16 hex digits")
        keys = np.zeros(len(arr), np.uint64)
        for k in range(16):
            keys = (keys << np.uint64(4)) | digits[:, k]
        return keys

    def contains(self, ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> np.ndarray:
        """One bool per id: stored already?"""
        return sorted_contains(self.keys, self._keys(ids))

    def add(self, ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> None:
        new = np.unique(self._keys(ids))
        new = new[~sorted_contains(self.keys, new)]
        if len(new):
            self.keys = mapped_keys(_merge_sorted(self.keys, new), self.directory)

    def __len__(self) -> int:
        return len(self.keys)


class SpillFile:
    """An Arrow IPC file written table by table, then mapped read-only: its record batches are zero-copy views of
    the mapping, so their pages are the kernel's to drop and read again. The file lives in a fresh folder under
    `directory` (default: tempfile's, i.e. $TMPDIR) that is removed as soon as the file is mapped (or discard()ed):
    the mapping keeps the pages readable, and nothing is left behind when the process stops, even when killed."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.schema: pa.Schema | None = None
        self.batches: list[pa.RecordBatch] = []  # after finish()
        self.starts = np.zeros(1, np.int64)  # the first row of each batch, and the row count last
        self._folder: str | None = None
        self._sink: Any = None
        self._writer: Any = None
        self._mapped = False

    def write(self, table: pa.Table) -> None:
        import tempfile

        if self._mapped:
            raise RuntimeError("the spill file is mapped already: nothing more can be written")
        if self._writer is None:
            self._folder = tempfile.mkdtemp(prefix="xsbert-worklist-", dir=self.directory)
            self._sink = pa.OSFile(os.path.join(self._folder, "pairs.arrow"), "wb")
            self.schema = table.schema
            self._writer = pa.ipc.new_file(self._sink, self.schema)
        self._writer.write_table(table.cast(self.schema))

    def finish(self) -> None:
        """Close, map and unlink (nothing written: nothing to map)."""
        if self._writer is None or self._mapped:
            return
        try:
            self._writer.close()
            self._sink.close()
            reader = pa.ipc.open_file(pa.memory_map(os.path.join(self._folder, "pairs.arrow"), "r"))  # type: ignore[arg-type]
            self.batches = [reader.get_batch(k) for k in range(reader.num_record_batches)]
            self.starts = np.cumsum([0] + [b.num_rows for b in self.batches])
            self._mapped = True
        finally:
            self.discard()

    def discard(self) -> None:
        """Close and remove the folder (finish() does, once mapped; after an error, the caller)."""
        import shutil

        with contextlib.suppress(Exception):
            if self._writer is not None and not self._mapped:
                self._writer.close()
                self._sink.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def take(self, rows: np.ndarray) -> pa.Table:
        """The rows at positions `rows`, in that order: taken batch by batch (a take over the whole file at once
        would first join its batches, i.e. read all of it into memory)."""
        by_row = np.argsort(rows, kind="stable")
        sorted_rows = rows[by_row]
        batch = np.searchsorted(self.starts, sorted_rows, side="right") - 1
        bounds = np.flatnonzero(np.diff(batch)) + 1
        pieces = [self.batches[batch[lo]].take(pa.array(sorted_rows[lo:hi] - self.starts[batch[lo]]))
                  for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(rows)]) if hi > lo]  # fmt: skip
        return pa.Table.from_batches(pieces, schema=self.schema).take(pa.array(np.argsort(by_row)))

    def rows(self, start: int, stop: int) -> pa.Table:
        """Rows [start, stop) as zero-copy slices of the mapping."""
        parts = []
        for k, b in enumerate(self.batches):
            lo, hi = max(start, int(self.starts[k])), min(stop, int(self.starts[k + 1]))
            if hi > lo:
                parts.append(b.slice(lo - int(self.starts[k]), hi - lo))
        return pa.Table.from_batches(parts, schema=self.schema)


class WorkList:
    """The pairs a run attributes, spilled chunk by chunk as prepare() validates them, with 8-byte keys per pair
    (of its id) and per text (its sentence id): the driver holds one chunk or one wave of the pairs at a time, not
    the run's (404k QQP-like pairs: ~85 MB in Arrow buffers, ~0.85 GB at 4M). The keys (24 bytes per pair) are in
    memory while prepare() appends, then memory-mapped (mapped_keys); the texts' keys go once plan() has used them.

    append() each chunk (rows of compact()'s form with sentence ids: with_sentence_ids) to a SpillFile in input
    order; finish() maps it. plan() picks the pairs to compute, orders them (wave_order) and copies them wave by
    wave into a second SpillFile in that order, dropping the first: wave(w) is then one contiguous stretch of the
    mapping, as few pages as the wave's rows fill. plan() is called once."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.num_rows = 0
        self.wave_size = 1
        self.n_planned = 0
        self._chunks = SpillFile(directory)  # input order, until plan()
        self._waves: SpillFile | None = None  # plan order
        self._keys: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.pair_keys = self.keys_a = self.keys_b = np.zeros(0, np.uint64)

    def append(self, frame: pd.DataFrame) -> None:
        """Rows to attribute, after those appended before."""
        table = pa.Table.from_pandas(frame, preserve_index=False)
        self._chunks.write(table)
        self._keys.append((pair_keys(table.column("pair_id")), SentenceKeys._keys(table.column("sentence_id_a")),
                           SentenceKeys._keys(table.column("sentence_id_b"))))  # fmt: skip
        self.num_rows += table.num_rows

    def finish(self) -> WorkList:
        """Map the file; no more rows."""
        self._chunks.finish()
        if self._keys:
            self.pair_keys, self.keys_a, self.keys_b = (mapped_keys(k, self.directory) for k in zip(*self._keys))
            self._keys = []
        return self

    def discard(self) -> None:
        self._chunks.discard()
        if self._waves is not None:
            self._waves.discard()

    def plan(self, todo: np.ndarray | None, wave_size: int) -> int:
        """Compute the rows where `todo` (one bool per row; None: all) in wave_order, `wave_size` rows per wave;
        returns the number of waves. Components are found on the texts' sentence ids (64-bit keys)."""
        if wave_size < 1:
            raise ValueError(f"wave_size must be >= 1, got {wave_size}")
        if self._waves is not None:
            raise RuntimeError("the work list is planned already")
        self.finish()
        rows = np.arange(self.num_rows) if todo is None else np.flatnonzero(todo)
        m = len(rows)
        nodes, codes = np.unique(np.concatenate([self.keys_a[rows], self.keys_b[rows]]), return_inverse=True)
        order = rows[wave_order_codes(codes[:m], codes[m:], len(nodes))]
        del rows, nodes, codes
        self._waves = SpillFile(self.directory)
        try:
            for start in range(0, m, wave_size):
                self._waves.write(self._chunks.take(order[start : start + wave_size]))
            self._waves.finish()
        except BaseException:
            self._waves.discard()
            raise
        self._chunks = SpillFile(self.directory)  # the input-order mapping goes with its last reference
        self.keys_a = self.keys_b = np.zeros(0, np.uint64)  # the plan's alone
        self.wave_size, self.n_planned = wave_size, m
        return self.n_waves

    @property
    def n_waves(self) -> int:
        return math.ceil(self.n_planned / self.wave_size)

    def wave(self, w: int) -> pd.DataFrame:
        """The rows of wave w (plan()'s order) as a frame like compact()'s: strings in Arrow buffers, numbers in
        numpy, a fresh RangeIndex."""
        if not 0 <= w < self.n_waves or self._waves is None:
            raise IndexError(f"wave {w} of {self.n_waves}")
        part = self._waves.rows(w * self.wave_size, (w + 1) * self.wave_size)
        return part.to_pandas(types_mapper=_arrow_strings, self_destruct=False).reset_index(drop=True)


def _arrow_strings(type_: pa.DataType) -> pd.ArrowDtype | None:
    return pd.ArrowDtype(type_) if pa.types.is_string(type_) or pa.types.is_large_string(type_) else None


def wave_order(text_a: np.ndarray, text_b: np.ndarray) -> np.ndarray:
    """The order in which pairs are cut into waves: grouped by connected component of the graph whose nodes are
    the sentences and whose edges are the pairs (components in the order of their first pair, pairs in input
    order within one). A wave computes the factors of every sentence its pairs use and keeps none for the next
    wave, so a sentence whose pairs fall in two waves is integrated twice; grouped, only a component larger
    than what is left of a wave is split. (QQP-like pairs, 100k, waves of 16,384: 186,966 sentences integrated in
    input order, 133,055 grouped, 133,044 unique; bench/results/scale.md.)"""
    n = len(text_a)
    codes, uniques = pd.factorize(np.concatenate([text_a, text_b]))
    return wave_order_codes(codes[:n], codes[n:], len(uniques))


def wave_order_codes(a: np.ndarray, b: np.ndarray, n_nodes: int) -> np.ndarray:
    """wave_order on the pairs' sentences as integer codes in [0, n_nodes) (the same order for any coding)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    n = len(a)
    if n == 0:
        return np.arange(0)
    graph = coo_matrix((np.ones(n, np.int8), (a, b)), shape=(n_nodes, n_nodes))
    n_comp, label = connected_components(graph, directed=False)
    comp = label[a]
    first = np.full(n_comp, n, dtype=np.int64)
    np.minimum.at(first, comp, np.arange(n))
    return np.lexsort((np.arange(n), first[comp]))
