"""Parsing texts on Ray: an actor pool whose output streams into the cache."""

from __future__ import annotations

import sys
import time
from typing import Any

import pyarrow as pa

from xsbert_core import InputError

from ..config import ParseSettings
from ..raycluster import init_ray, quiet_ray
from .actor import CACHE_SCHEMA, ParserActor
from .cache import ParseCache
from .choice import ParserSpec


def pool(args: ParseSettings, ray, n_blocks: int) -> tuple[int, float]:
    """(actors, CPUs per actor): one CPU stays free for Ray Data's other operators (docs/DESIGN.md §5)."""
    cpus = float(ray.cluster_resources().get("CPU", 1))
    budget = max(0.5, cpus - 1)
    n = max(1, min(args.num_actors or max(1, int(budget)), n_blocks))
    return n, min(1.0, budget / n)


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
