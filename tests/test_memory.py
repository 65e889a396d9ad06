"""The factor batch's memory (xsbert_core.memory): the model's batch shrinks as N grows, and a batch that really runs
out of memory is halved and retried with the same results.

Running out of memory is real here, not simulated: a subprocess lowers its own data limit (RLIMIT_DATA, which the
kernel enforces on every private allocation, torch's CPU allocator included) and torch's allocation fails the way it
fails on a full machine ("DefaultCPUAllocator: can't allocate memory"). A CUDA card's caching allocator fails the same
way under torch.cuda.set_per_process_memory_fraction, which is what a factor actor's memory limit sets on a GPU
(jobs/attribution/memory.py). MALLOC_MMAP_THRESHOLD_ makes glibc map every large block and unmap it when freed, so
that the limit counts the live tensors and not blocks the heap kept. Peaks of integrate's tensors are read with
xsbert_core.memory.TensorBudget as a meter (every op's outputs, counted at their storage until freed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xsbert_core import Explainer
from xsbert_core.factors import endpoints, integrate
from xsbert_core.memory import FactorMemory, Shape, TensorBudget, batch_bytes, is_out_of_memory

MPNET = Shape(hidden=768, intermediate=3072, heads=12, dim=768, chunk_elements=2**30)
GIB = 2**30


def test_the_batch_that_fits_shrinks_as_n_grows():
    """all-mpnet-base-v2's shape at the GPU chunk, 120-token questions, a budget of 40 GiB (half an 80 GB card)."""
    budget = 40 * GIB
    mem = FactorMemory(MPNET, budget=budget)
    sizes = {n: mem.batch_size(n, 120, 128) for n in (16, 32, 64, 128, 256)}
    assert sizes[16] == sizes[32] == sizes[64] == 128  # a whole GPU batch at the start of adaptive N
    assert 128 > sizes[128] > sizes[256] >= 32  # the rows outgrow the budget: fewer sentences per group
    assert sizes[256] == pytest.approx(sizes[128] / 2, rel=0.15)  # the rows dominate: doubling N about halves it
    for n, b in sizes.items():  # what it chose fits, one more sentence would not
        assert batch_bytes(MPNET, b, n, 120) <= budget
        assert b == 128 or batch_bytes(MPNET, b + 1, n, 120) > budget
    assert FactorMemory(MPNET, budget=None).batch_size(256, 120, 128) == 128  # no budget: the whole batch


def test_bytes_grow_with_the_rows_and_shrink_in_reduced_precision():
    rows = 3 * 4 * 768  # float32 bytes per (row, token) of the rows while x(alpha) is built
    assert batch_bytes(MPNET, 128, 256, 120) - batch_bytes(MPNET, 128, 128, 120) == 128 * 128 * 120 * rows
    assert batch_bytes(MPNET, 128, 256, 120, "bf16") < batch_bytes(MPNET, 128, 256, 120, "fp32")  # half activations
    assert batch_bytes(MPNET, 128, 256, 120, exact=True) >= batch_bytes(MPNET, 128, 256, 120)


def test_running_out_caps_later_batches_at_half():
    mem = FactorMemory(MPNET, budget=None)
    mem.ran_out(128, 128, 40)
    assert mem.out_of_memory == 1
    assert mem.batch_size(128, 40, 128) == 64  # half the rows x tokens that failed
    assert mem.batch_size(256, 40, 128) == 32
    assert mem.batch_size(16, 40, 128) == 128
    assert mem.batch_size(128, 400, 128) == 6  # longer sentences: fewer
    assert mem.batch_size(256, 2000, 1) == 1  # one sentence is always tried


def test_out_of_memory_is_told_from_other_errors():
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                                         "allocate memory: you tried to allocate 419430400 bytes."))  # fmt: skip
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_out_of_memory(ValueError("out of memory"))


SCRIPT = r"""
import json, resource, sys
import torch
from xsbert_core import Explainer
from xsbert_core.memory import is_out_of_memory

torch.set_num_threads(1)
model, limit_mb = sys.argv[1], int(sys.argv[2])
texts = [f"the {w} house near the old river was not as big as we thought it was" for w in
         ("red", "blue", "green", "small", "tall", "warm", "cold", "dark")]
kw = dict(layer=1, rule="gauss-legendre", steps=64, device="cpu", internal_batch_size=72)
free = Explainer(model, **kw).factors(texts, batch_size=8)  # no limit

ex = Explainer(model, **kw)
ex.factors(texts[:1], batch_size=1)  # lazy initialisations before the limit


def data_bytes():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmData")).split()[1]) * 1024


soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
resource.setrlimit(resource.RLIMIT_DATA, (data_bytes() + limit_mb * 2**20, hard))
try:
    try:  # the limit is real: one allocation of the whole batch's rows fails
        torch.empty(8 * 64 * 24 * 32 * 3, dtype=torch.float32)
        direct = None
    except RuntimeError as exc:
        direct = str(exc)
    got = ex.factors(texts, batch_size=8)
finally:
    resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
diff = max(float((a.factor - b.factor).abs().max()) for a, b in zip(free, got))
scale = max(float(a.factor.abs().max()) for a in free)
print(json.dumps({"direct": direct, "direct_is_oom": direct is not None and is_out_of_memory(RuntimeError(direct)),
                  "out_of_memory": ex.memory.out_of_memory, "cap": ex.memory.cap_row_tokens,
                  "rel_diff": diff / scale, "per_call": ex.internal_batch_size, "n": len(got), "steps": [g.n_steps for g in got]}))
"""


@pytest.mark.slow
def test_a_batch_that_runs_out_of_memory_is_halved_and_gives_the_same_factors(tmp_path, tiny):
    folder = tmp_path / "tiny-st"
    tiny.build("bert").save(str(folder))
    script = tmp_path / "oom.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # fmt: skip
    # The 8 sentences' rows at N = 64 take 3 x 8*64*S*H*4 bytes (S ~ 17, H = 32: ~3.3 MB) while x(alpha) is
    # built; a limit of 2 MB above the warm process leaves room for a few sentences' rows at a time, not eight.
    proc = subprocess.run([sys.executable, str(script), str(folder), "4"], capture_output=True, text=True, env=env,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["direct_is_oom"], r["direct"]  # torch's own allocation failed under the limit
    assert r["n"] == 8 and r["steps"] == [64] * 8
    assert r["out_of_memory"] >= 1 and r["cap"] is not None  # it ran out, halved, and remembered
    assert r["rel_diff"] < 1e-5  # the same factors as without a limit, to float32 rounding


def test_the_budget_counts_allocations_not_views_of_tensors_made_before():
    """A view shares the storage of the tensor it views: the transpose that F.linear takes of a weight made before
    the budget is no allocation. Counted as one, a model's weights stayed in the count for as long as they lived,
    and a budget meant for the call's own tensors ran out at one sentence (all-MiniLM-L6-v2 in the memory piece's
    dry run, bench/gpu_settings.py)."""
    weight = torch.ones(256, 1024)  # 1 MiB, made before
    x = torch.ones(4, 1024)
    with TensorBudget(64 * 2**10) as meter:  # 64 KiB: the weight would pass it
        y = torch.nn.functional.linear(x, weight)  # aten.t(weight), a view, then the product: 4 KiB
        y.add_(1.0)  # in place: no allocation either
        z = y.t().contiguous()  # a copy: 4 KiB more
    assert meter.now == meter.peak == y.untyped_storage().nbytes() + z.untyped_storage().nbytes() == 8 * 2**10
    del y
    assert meter.now == 4 * 2**10  # freed storages leave the count


def test_the_rows_cost_what_the_model_says_not_once_per_token_tangent(tiny):
    """Forward AD gives a view's tangent the size of the view's base: integrate pushing a slice of the B*N rows
    through jvp zero-filled J x B*N*S*H values per call (J token tangents), so its memory grew ~J times faster with
    B*N than its rows. Here the peak of integrate's tensors grows from (B, N) = (2, 8) to (4, 32) by no more than
    xsbert_core.memory's model says (3 float32 copies of the rows while x(alpha) is built)."""
    texts = [f"the {w} house near the old river was not as big as we thought" for w in
             ("red", "blue", "green", "small", "tall", "warm", "cold", "dark")]  # fmt: skip
    ex = Explainer(tiny.get("bert"), layer=1, rule="gauss-legendre", steps=2, device="cpu")
    peaks, model = {}, {}
    for b, n in ((2, 8), (4, 32)):
        batch = ex.split.tokenize(texts[:b])
        ends = endpoints(ex.split, batch)
        s = batch.features["input_ids"].shape[1]
        per_call = s  # one row of S token tangents per jvp call: the rows outnumber one call's
        integrate(ex.split, ends, "gauss-legendre", 2, per_call)  # warm-up
        with TensorBudget(None) as meter:
            integrate(ex.split, ends, "gauss-legendre", n, per_call)
        peaks[b, n] = meter.peak
        shape = Shape(hidden=32, intermediate=64, heads=4, dim=32, chunk_elements=0, sequences_per_call=per_call)
        model[b, n] = batch_bytes(shape, b, n, s)
    grew, modelled = peaks[4, 32] - peaks[2, 8], model[4, 32] - model[2, 8]
    assert 0.5 * modelled < grew <= 1.1 * modelled, (grew, modelled, peaks)
