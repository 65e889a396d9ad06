"""An attribution run after prepare: stages 1-2 wave by wave into the store (`compute`), the summary (counts in =
done + quarantined, `summarize`) and the manifest (`update_manifest`); `attribute` is the three."""

from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from xsbert_core import EngineSettings

from ..config import DEFAULT_WAVE_SIZE_CPU, DEFAULT_WAVE_SIZE_GPU, JobSettings, Output
from ..store import STORE_VERSION, TABLES, RunStore, open_store, pair_keys
from .executor import Executor
from .hooks import Hooks
from .memory import driver_memory_mb, release_memory, system_memory_pool
from .prepare import Prepared
from .stage2 import JobFailedError, _quarantine_table, wave_tables, written_parts
from .worklist import SentenceKeys


@dataclass
class Progress:
    """What stage 1-2 did in this invocation (one entry per wave)."""

    wrote: list[Path] = field(default_factory=list)
    waves: list[dict[str, Any]] = field(default_factory=list)
    failures: list[pd.DataFrame] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)
    ray: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WaveDone:
    """A committed wave, as `compute` reports it to its `on_wave` callback. str() is the progress line the commands
    print; `timings` is the wave's entry of Progress.waves (pairs, sentences, factors_s, cells_s, commit_s,
    attribution_s, ...)."""

    number: int  # 1-based
    of: int
    timings: dict[str, Any]

    def __str__(self) -> str:
        t = self.timings
        return (f"wave {self.number}/{self.of}: {t['pairs']} pairs, {t['sentences']} sentences, "
                f"factors {t['factors_s']:.1f}s, cells {t['cells_s']:.1f}s")  # fmt: skip


def open_executor(job: JobSettings, store: RunStore, engine: EngineSettings, hooks: Hooks) -> Executor:
    """The executor of `job` (--executor, executor.py) for a run into `store` with the engine settings `engine`
    (resolved)."""
    if job.execution.executor == "local":  # without Ray: `import ray` never runs on this path
        from .local import LocalExecutor

        return LocalExecutor(job, store, engine, hooks)
    from .on_ray import RayExecutor

    return RayExecutor(job, store, engine, hooks)


def _crash(exc: BaseException, max_retries: int) -> str:
    """What a crash of stage 1 was: a factor actor that could not start (the error its __init__ raised, the last line
    of the traceback Ray gives), or a batch that killed its worker every time it was tried."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    if getattr(exc, "actor_init_failed", False):
        return "a factor actor could not start: " + re.sub(r"^(?:\w+\.)+(?=\w+: )", "", lines[-1].strip())
    return (f"a batch killed its worker {max_retries + 1} times (--max-retries {max_retries}; {type(exc).__name__}: "
            f"{lines[0]})")


def compute(store: RunStore, prep: Prepared, on_wave: Callable[[WaveDone], None] | None = print,
            hooks: Hooks | None = None) -> Progress:  # fmt: skip
    """Stages 1-2 for the selection's pairs not in the store yet, wave by wave, each wave one commit, on the run's
    executor (executor.py: Ray, or with --executor local this process). The executor starts (Ray is started or
    joined) only when there is something to compute."""
    job, ex = prep.settings, prep.settings.execution
    hooks = hooks or Hooks()
    progress = Progress()
    work = prep.work
    todo = ~np.isin(work.pair_keys, store.done_pair_keys())
    known_q = store.quarantine_keys()
    quarantine = prep.quarantine
    new_q = quarantine[
        [(int(r), p, q) not in known_q for r, p, q in zip(quarantine.row, quarantine.pair_id, quarantine.reason)]
    ]
    if len(new_q):
        progress.wrote += store.commit(store.next_seq(), {"quarantine": _quarantine_table(new_q)})
    if not todo.any():
        return progress
    store.check_writable()  # a read-only store says so before anything is computed
    executor = open_executor(job, store, prep.explainer.engine, hooks)
    try:
        progress.ray, res = executor.ray, executor.resources
        wave_size = ex.wave_size or (DEFAULT_WAVE_SIZE_GPU if res["gpus_per_actor"] > 0 else DEFAULT_WAVE_SIZE_CPU)
        res.update(wave_size=wave_size, max_retries=ex.max_retries)
        progress.resources = res
        known_sentences = SentenceKeys(store.column("sentences", "sentence_id"))
        with system_memory_pool():  # the plan rewrites the work list: what it frees goes back to the OS
            n_waves = work.plan(todo, wave_size)  # the driver holds one wave of the work list at a time
        del todo
        stream = executor.stream_factors(work.wave(w) for w in range(n_waves))
        for w, wave in enumerate(work.wave(w) for w in range(n_waves)):
            seq = store.next_seq()
            sink = executor.sink(w)  # None: the driver writes the wave's cells (nodes that joined are asked first)
            try:
                factors, meta, timings = stream.wave(w)
            except executor.crashes as exc:
                raise JobFailedError(
                    f"wave {w + 1}/{n_waves} failed: {_crash(exc, ex.max_retries)}. {w} earlier wave(s) of this run "
                    f"are committed, nothing of wave {w + 1} was written; the same command resumes the run"
                ) from exc
            out, cell_timings = executor.compute_cells(wave, factors, sink, seq)
            del factors  # the wave's factors leave the object store
            factor_bytes = 4 * int(pc.sum(pc.multiply(meta.column("dim"), meta.column("n_tokens"))).as_py() or 0)
            timings.update(cell_timings,
                           attribution_s=float(pc.sum(meta.column("compute_s")).as_py() or 0.0),  # actor-seconds
                           oom_retries=int(pc.sum(meta.column("oom_retries")).as_py() or 0),
                           sentences=stream.sizes[w], factor_bytes=factor_bytes,
                           factor_bytes_per_sentence=factor_bytes / max(1, stream.sizes[w]))  # fmt: skip
            # The wave's tables and their Parquet encoding are the driver's largest step (the sentences table with
            # its embeddings, ~3.6 KB per sentence; writing 106 MB of it took +145 MB more with mimalloc, +52 with the
            # system allocator, bench/driver_peaks.py parquet-write): from the system allocator, they go back to the
            # OS after the commit (release_memory).
            with system_memory_pool():
                tables, failed = wave_tables(wave, meta, out, prep.pairs.source.split, known_sentences)
                if len(failed):
                    progress.failures.append(failed)
                    tables["quarantine"] = _quarantine_table(
                        failed[[(int(r), p, why) not in known_q
                                for r, p, why in zip(failed.row, failed.pair_id, failed.reason)]]  # fmt: skip
                    )
                t_commit = time.perf_counter()
                parts = written_parts(out)
                if sink is not None:
                    store.settle(seq, parts)  # every reported part there, no stray part of this wave
                    progress.wrote += [f"{t}/{name}" for t in sorted(parts) for name in sorted(parts[t])]
                progress.wrote += store.commit(seq, tables)
            timings["commit_s"] = time.perf_counter() - t_commit
            known_sentences.add(tables["sentences"].column("sentence_id"))
            timings.update(wave=w, pairs=tables["pairs"].num_rows,
                           cells=int(pc.sum(tables["pairs"].column("n_cells")).as_py() or 0))  # fmt: skip
            progress.waves.append(timings)
            if on_wave is not None:
                on_wave(WaveDone(w + 1, n_waves, timings))
            # What the wave's tables took from the heap goes back to the OS; what the driver keeps after that is
            # recorded per wave (a run's memory should not grow with its waves: bench/results/scale.md).
            del meta, out, tables, wave
            release_memory()
            timings.update(driver_memory_mb())
            hooks.wave_committed(w)
    finally:
        executor.close()
    return progress


def summarize(store: RunStore, prep: Prepared, progress: Progress) -> dict[str, Any]:
    """The selection's state in the store, whatever invocation computed it; counts in = done + quarantined."""
    quarantine, failures, stats = prep.quarantine, progress.failures, progress.waves
    stored = store.read_table("pairs", ["pair_id", "completeness_error"])
    abs_err = pd.Series([], dtype=np.float64)
    if stored is not None:  # the store's pairs of this selection, on their id keys (no Python string per pair)
        mine = np.isin(pair_keys(stored.column("pair_id")), prep.work.pair_keys)
        abs_err = pd.Series(stored.column("completeness_error").to_numpy(zero_copy_only=False)[mine]).abs()
    computed_pairs = sum(s["pairs"] for s in stats)
    computed_sentences = sum(s["sentences"] for s in stats)
    wall = time.perf_counter() - prep.t_start
    s = prep.explainer.settings
    summary: dict[str, Any] = dict(
        run_id=prep.run_id,
        run_dir=str(store.path),
        n_in=prep.n_in,
        n_done=len(abs_err),
        n_quarantined=len(quarantine) + sum(len(f) for f in failures),
        quarantine_reasons=pd.concat([quarantine.reason, *(f.reason for f in failures)]).value_counts()
        .sort_index().to_dict(),
        computed_pairs=computed_pairs,
        computed_sentences=computed_sentences,
        waves=len(stats),
        wall_s=wall,
        compute_s=sum(s["factors_s"] + s["factor_meta_s"] + s["cells_s"] for s in stats),
        pairs_per_s=computed_pairs / wall if computed_pairs else 0.0,
        sentences_per_s=computed_sentences / wall if computed_sentences else 0.0,
        mean_abs_completeness_error=float(abs_err.mean()) if len(abs_err) else None,
        max_abs_completeness_error=float(abs_err.max()) if len(abs_err) else None,
        wrote_files=len(progress.wrote),
        duplicates_dropped=sum(s["duplicates_dropped"] for s in stats),
        ray=progress.ray,
        settings=s,
    )
    summary["advice"] = completeness_advice(summary)
    if summary["n_in"] != summary["n_done"] + summary["n_quarantined"]:
        raise RuntimeError(f"count mismatch: in {summary['n_in']} != done {summary['n_done']} + "
                           f"quarantined {summary['n_quarantined']}")  # fmt: skip
    return summary


def update_manifest(store: RunStore, prep: Prepared, progress: Progress, summary: dict[str, Any]) -> None:
    """Record this invocation in manifest.json when it wrote anything, when the run has no manifest yet, or when the
    manifest's tables disagree with the store's (a manifest write that failed after a commit: the rerun fixes it)."""
    old = store.read_manifest()
    parts = {t: len(store.parts(t)) for t in TABLES}
    recorded = {t: v.get("parts") for t, v in (old or {}).get("tables", {}).items()}
    if not progress.wrote and old is not None and recorded == parts:  # parts are never rewritten: equal counts, equal
        return
    tables = {t: {"path": f"{t}/*.parquet", "parts": parts[t], "rows": n} for t, n in store.counts().items()}
    job = prep.settings
    manifest = old or {"run_id": prep.run_id, "created_at": prep.started_at, "runs": []}
    manifest.update(
        run_id=prep.run_id,
        store_version=STORE_VERSION,
        schema="docs/STORE.md",
        cells=job.attribution.cells,  # which cells the run stores (also config.cells when not all)
        config=prep.config,
        settings=prep.explainer.settings,
        updated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        tables=tables,
    )
    manifest["runs"].append(
        {
            "started_at": prep.started_at,
            # its settings (this run id again), not where it wrote: a store that is moved keeps a true command
            "command": "python -m jobs.attribute " + shlex.join(replace(job, output=Output()).command()),
            "selection": {"dataset": job.selection.dataset, "split": prep.pairs.source.split,
                          "limit": job.selection.limit, "sample": job.selection.sample, "seed": job.selection.seed,
                          "n_source_rows": prep.pairs.n_source_rows},
            "counts": {k: summary[k] for k in ("n_in", "n_done", "n_quarantined", "computed_pairs",
                                               "computed_sentences")},
            "quarantine_reasons": summary["quarantine_reasons"],
            "resources": progress.resources,
            "ray": progress.ray,
            "waves": progress.waves,
            "duplicates_dropped": summary["duplicates_dropped"],
            "wall_s": summary["wall_s"],
            "mean_abs_completeness_error": summary["mean_abs_completeness_error"],
            "max_abs_completeness_error": summary["max_abs_completeness_error"],
        }
    )  # fmt: skip
    store.write_manifest(manifest)


def attribute(prep: Prepared, on_wave: Callable[[WaveDone], None] | None = print,
              hooks: Hooks | None = None) -> dict[str, Any]:  # fmt: skip
    """Stages 1-2 into the store, then the summary; a rerun of the same selection computes and writes nothing.
    `hooks`: faults to inject (tests only; hooks.py)."""
    out = prep.settings.output
    with open_store(out.out, prep.run_id, prep.pairs.columns.keep, retry_s=out.store_retry_s) as store:
        try:
            progress = compute(store, prep, on_wave, hooks)
        except BaseException:  # a full disk, a store that stopped answering, a failed batch, Ctrl-C
            store.abandon()  # the failed wave's parts go now (readers never read them: committed parts only)
            raise
        progress.wrote += store.commit_missing_tables()
        summary = summarize(store, prep, progress)
        update_manifest(store, prep, progress, summary)
    return summary


# Mean |completeness error| above which a run's end warns (similarity units: 1e-2 is 1% of cosine's range).
COMPLETENESS_WARN = 1e-2


def completeness_advice(summary: dict[str, Any]) -> str | None:
    """A hint when the run's mean |completeness error| is large for its quadrature, else None.

    Riemann's error falls like 1/N, Gauss-Legendre's much faster; --tolerance picks N per sentence."""
    err = summary.get("mean_abs_completeness_error")
    if err is None or err <= COMPLETENESS_WARN:
        return None
    s = summary["settings"]
    if s.get("tolerance") is not None:
        fix = f"--max-steps {2 * int(s['max_steps'])} (adaptive N stopped at the cap) or a smaller --tolerance"
    elif s["rule"] == "riemann":
        target = 2 ** math.ceil(math.log2(max(2.0, s["steps"] * err / (COMPLETENESS_WARN / 2))))
        fix = f"--steps {target} (riemann's error falls like 1/N), --rule gauss-legendre --steps {max(16, s['steps'])}"
        fix += ", or --tolerance 1e-3"
    else:
        fix = f"--steps {4 * s['steps']} or --tolerance 1e-3 (adaptive N per sentence)"
    return (f"mean |completeness error| {err:.2e} is large for {s['rule']} N={s['steps']} at layer {s['layer']} "
            f"(> {COMPLETENESS_WARN:g}): the cells do not sum to what they should; rerun with {fix}")
