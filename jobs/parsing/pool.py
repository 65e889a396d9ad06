"""Parsing texts on Ray (an actor pool whose output streams into the cache), or in this process (`--executor local`)."""

from __future__ import annotations

import sys
import time
from typing import Any

import pyarrow as pa

from xsbert_core import InputError

from ..config import ParseSettings
from ..raycluster import init_ray, quiet_ray, spare_cpus
from .actor import CACHE_SCHEMA, ParserActor
from .cache import ParseCache
from .choice import ParserSpec


def pool(args: ParseSettings, ray, n_blocks: int) -> tuple[int, float]:
    """(actors, CPUs per actor): the spare CPUs stay free for Ray Data's other operators (docs/DESIGN.md §5)."""
    cpus = float(ray.cluster_resources().get("CPU", 1))
    budget = cpus - spare_cpus(cpus)
    n = max(1, min(args.num_actors or max(1, int(budget)), n_blocks))
    return n, min(1.0, budget / n)


class CacheFeed:
    """Parsed rows into the cache every `--commit-every` texts (one atomic part each), the first row per text only (a
    retried batch only adds copies), so a run stopped part-way keeps what it parsed."""

    def __init__(self, args: ParseSettings, cache: ParseCache, todo: dict[str, str], echo: bool) -> None:
        self.commit_every, self.cache, self.todo, self.echo = args.commit_every, cache, todo, echo
        self.parts = 0  # written to the cache
        self.seen: set[str] = set()
        self.pending: list[pa.Table] = []
        self.t0 = time.perf_counter()

    def add(self, block: pa.Table) -> None:
        self.pending.append(block.cast(CACHE_SCHEMA))
        if sum(t.num_rows for t in self.pending) >= self.commit_every:
            self.flush()  # a failed cache write is raised as itself, not as the parser's failure

    def flush(self) -> None:
        """Commit the pending rows (first row per id not committed before)."""
        if not self.pending:
            return
        rows = pa.concat_tables(self.pending)
        self.pending.clear()
        first = []
        for k, sid in enumerate(rows.column("sentence_id").to_pylist()):
            if sid not in self.seen:
                self.seen.add(sid)
                first.append(k)
        rows = rows.take(pa.array(first, pa.int64()))
        self.cache.add(rows)  # sorted by sentence_id there
        self.parts += 1
        if self.echo:
            rate = len(self.seen) / max(time.perf_counter() - self.t0, 1e-9)
            print(f"parsed {len(self.seen):,} of {len(self.todo):,} texts ({rate:.0f}/s), in the cache", flush=True)

    def close(self, where: str) -> None:
        """The last rows into the cache; every text must have come back."""
        self.flush()
        if self.seen != set(self.todo):
            raise RuntimeError(f"{len(set(self.todo) - self.seen)} texts came back from no {where}")


def text_blocks(todo: dict[str, str], batch_size: int) -> list[pa.Table]:
    """The texts {sentence_id: text} in blocks of `batch_size`, longest first (the last call is a short one)."""
    ids = sorted(todo, key=lambda s: (-len(todo[s]), s))
    return [pa.table({"sentence_id": ids[k : k + batch_size], "text": [todo[s] for s in ids[k : k + batch_size]]})
            for k in range(0, len(ids), batch_size)]  # fmt: skip


def parse_here(args: ParseSettings, spec: ParserSpec, todo: dict[str, str], cache: ParseCache,
               echo: bool = True) -> dict[str, Any]:  # fmt: skip
    """`--executor local`: the same blocks through one ParserActor in this process, without Ray, into the cache as
    parse_on_ray's pool writes them (for a study too small to repay starting Ray and its actors)."""
    feed = CacheFeed(args, cache, todo, echo)
    blocks = text_blocks(todo, args.batch_size)
    try:
        parser = ParserActor(spec.name, spec.stanza_dir, args.batch_size)
    except Exception as exc:  # noqa: BLE001 - e.g. stanza models that do not load: one line, not a traceback
        last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise InputError(f"the {spec.name} parser failed to load ({type(exc).__name__}): {last}") from exc
    for block in blocks:
        feed.add(parser(block))
    feed.close("parser")
    return {"actors": 1, "cpus_per_actor": None, "cache_parts": feed.parts}


def parse_on_ray(args: ParseSettings, spec: ParserSpec, todo: dict[str, str], cache: ParseCache,
                 echo: bool = True) -> dict[str, Any]:  # fmt: skip
    """Parse the texts {sentence_id: text} with an actor pool into the cache (CACHE_SCHEMA rows, one per text);
    returns the pool's size and the number of cache parts written.

    The parses stream back as the actors finish them and go into the cache every `--commit-every` texts (one
    atomic part each), so a run stopped part-way (a killed driver, a lost cluster) keeps what it parsed: the same
    command looks the cache up first and parses only the rest."""
    ray = init_ray(args.ray_address)
    from ray.data import ActorPoolStrategy

    quiet_ray(ray, progress_bars=not args.quiet and sys.stderr.isatty())
    bs = args.batch_size
    blocks = text_blocks(todo, bs)
    n_actors, cpus_per_actor = pool(args, ray, len(blocks))
    feed = CacheFeed(args, cache, todo, echo)

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
            feed.flush()  # what the actors finished before the failure stays in the cache
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise InputError(f"the {spec.name} parser failed on Ray ({type(exc).__name__}): {last}; "
                             f"{len(feed.seen):,} of {len(todo):,} texts were parsed and kept in the cache "
                             "(the same command parses only the rest)") from exc  # fmt: skip
        feed.add(block)
    feed.close("parser actor")
    return {"actors": n_actors, "cpus_per_actor": cpus_per_actor, "cache_parts": feed.parts}
