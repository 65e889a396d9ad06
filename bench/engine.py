"""Engine benchmark: forward-mode factors vs the reverse-mode reference and vs a plain forward.

Everything is measured in one run on this machine; ratios compare timings from that same run.

    python bench/engine.py                      # all-MiniLM-L6-v2 and all-mpnet-base-v2, layer -3 (= 9 for mpnet)
    python bench/engine.py --models minilm --pairs 16

For each model it reports
  throughput:       engine pairs/s over --pairs pairs (riemann N=--steps and the chosen gauss-legendre N)
  same-N speed-up:  engine (rule riemann, N=--steps) vs reverse mode (one backward pass per embedding
                    dimension per node: the reference code's algorithm), both timed on the same
                    --reverse-pairs pairs (engine cost grows ~S^2, reverse ~S: comparing different
                    pairs would bias the ratio)
  equal-error speed-up: engine with the smallest gauss-legendre N whose mean factor error is <= that of
                    riemann N=--ref-steps, vs reverse mode at riemann N=--ref-steps, same pairs. Reverse cost is
                    N x (one forward + D backward passes): the N=--steps timing is scaled by
                    ref_steps/steps unless --reverse-full times it directly.
  forward ratio:    engine time / no-grad forward of the same batch of sequences the engine pushes
                    tangents through (B*N*S rows), and / forward of the B*N interpolation points alone
  peak RSS:         a fresh process attributing one 512-token text (max_seq_length raised to 512;
                    layer -1 and N=1 by default: memory is bounded per jvp chunk, time is not the point)

    python bench/engine.py --models "" --families all     # every supported family (xsbert_core.families)

--families: per family, a random model of all-MiniLM-L6-v2's shape (384 hidden, 6 layers, 12 heads, 1536 FFN;
MiniLM's WordPiece tokenizer for all, the family's own layers, masks and positions; last-token pooling for the
decoder, mean for the others), loaded with transformers' default attention (SDPA where the family has it): the
engine says when the kernel cannot take forward-mode AD and falls back to eager, and the table says which ran. It
reports the engine (riemann N=--steps, --family-pairs STS-B pairs) / a no-grad forward through the same split model
of the same B*N*S rows, the best of --family-rounds runs of each, alternated, in wall-clock and in this process's CPU
seconds (less disturbed by other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from xsbert_core import Explainer, load_model
from xsbert_core.factors import endpoints
from xsbert_core.quadrature import nodes_and_weights
from xsbert_core.reverse import sentence_factor_reverse

MODELS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet": "all-mpnet-base-v2"}
GL_CANDIDATES = (4, 6, 8, 10, 12, 16, 20, 24, 32)
STSB_PATHS = (ROOT / "jobs" / "data" / "stsb.tsv.gz",)  # the bundled STS-B


def stsb_test_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    path = next(p for p in STSB_PATHS if p.exists())
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE) if r["split"] == "test"]
    idx = np.random.default_rng(seed).choice(len(rows), size=n, replace=False)
    return [(rows[i]["sentence1"], rows[i]["sentence2"]) for i in idx]


def timed(fn, clock=time.perf_counter):
    t0 = clock()
    out = fn()
    return out, clock() - t0


def engine_run(model, layer, rule, steps, pairs):
    ex = Explainer(model, layer=layer, rule=rule, steps=steps)
    res, dt = timed(lambda: ex.explain_pairs(pairs))
    errs = np.array([e for r in res for e in (r.factor_error_a, r.factor_error_b)])
    return ex, dt, errs


def engine_time_on(model, layer, rule, steps, pairs, min_seconds: float = 3.0) -> float:
    """Seconds per call of the engine on exactly these pairs: best of repeated runs (>= 3, >= min_seconds)."""
    ex = Explainer(model, layer=layer, rule=rule, steps=steps)
    times: list[float] = []
    while len(times) < 3 or sum(times) < min_seconds:
        times.append(timed(lambda: ex.explain_pairs(pairs))[1])
    return min(times)


def reverse_run(ex: Explainer, rule: str, steps: int, pairs):
    def go():
        return [
            (sentence_factor_reverse(ex.split, a, rule, steps), sentence_factor_reverse(ex.split, b, rule, steps))
            for a, b in pairs
        ]

    return timed(go)


@torch.no_grad()
def plain_forward(ex: Explainer, texts: list[str], steps: int, expand_tokens: bool, clock=time.perf_counter) -> float:
    """No-grad forward through the same split model of the interpolation points x(alpha_n)
    (expand_tokens: each repeated once per token, the batch the engine pushes tangents through)."""
    alphas, _ = nodes_and_weights("riemann", steps)
    total = 0.0
    batch = ex.split.tokenize(texts)
    order = sorted(range(len(texts)), key=lambda i: batch.lengths[i])
    for k in range(0, len(order), 32):
        sub = batch.select(order[k : k + 32])
        ends = endpoints(ex.split, sub)
        a = torch.as_tensor(alphas, dtype=ends.h_x.dtype)
        n = len(alphas)
        x = ends.h_r.repeat_interleave(n, 0) + a.repeat(len(sub.texts))[:, None, None] * ends.delta.repeat_interleave(
            n, 0
        )
        feats = {k2: v.repeat_interleave(n, 0) for k2, v in sub.features.items()}
        reps = max(sub.lengths) if expand_tokens else 1
        rows = x.shape[0]
        chunk = max(1, 4096 // x.shape[1])
        t0 = clock()
        for _ in range(reps):
            for r0 in range(0, rows, chunk):
                ex.split.tail(x[r0 : r0 + chunk], {k2: v[r0 : r0 + chunk] for k2, v in feats.items()}, None)
        total += clock() - t0
    return total


def rss_probe(model_name: str, layer: int, tokens: int, steps: int) -> dict:
    """Run in a fresh process: peak RSS for one long text.

    Peak RSS is the process's own high-water mark, VmHWM in /proc/self/status. Not getrusage's
    ru_maxrss: Linux carries that across fork + exec, so a child started by a large benchmark
    process would report the parent's peak."""
    code = f"""
import json, resource, time, torch
def peak_mb():
    try:
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
torch.set_num_threads({torch.get_num_threads()})
from xsbert_core import Explainer, load_model
m = load_model({model_name!r})
m.max_seq_length = {tokens}
base = peak_mb()
ex = Explainer(m, layer={layer}, steps={steps})
text = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 60)
t0 = time.perf_counter(); f = ex.factors([text])[0]; dt = time.perf_counter() - t0
print(json.dumps(dict(tokens=len(f.tokens), seconds=dt, rss_after_load_mb=base, peak_rss_mb=peak_mb(), error=f.error)))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"rss probe failed: {out.stderr[-2000:]}")
    return json.loads(lines[-1])


# all-MiniLM-L6-v2's shape: the families are compared at one size.
FAMILY_SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


def family_config(model_type: str, vocab_size: int, pad_id: int):
    """A config of `model_type` in FAMILY_SHAPE, the family's other settings as its embedders have them."""
    import transformers as tf

    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, max_position_embeddings=514, **FAMILY_SHAPE)
    if model_type == "distilbert":
        return tf.DistilBertConfig(vocab_size=vocab_size, pad_token_id=pad_id, dim=384, n_layers=6, n_heads=12,
                                   hidden_dim=1536)  # fmt: skip
    if model_type == "deberta-v2":
        return tf.DebertaV2Config(**common, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                  position_biased_input=False, position_buckets=256, norm_rel_ebd="layer_norm",
                                  share_att_key=True, type_vocab_size=0)  # fmt: skip
    if model_type == "electra":
        return tf.ElectraConfig(**common, embedding_size=192)
    if model_type == "modernbert":
        ids = dict(bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102)  # MiniLM's [CLS], [SEP]
        return tf.ModernBertConfig(**common, local_attention=128, global_attn_every_n_layers=3, **ids)
    if model_type == "qwen3":
        common.pop("pad_token_id")
        return tf.Qwen3Config(**common, num_key_value_heads=4, head_dim=32)
    if model_type == "nomic_bert":
        return tf.NomicBertConfig(**common, head_dim=32)
    cls = {"bert": tf.BertConfig, "mpnet": tf.MPNetConfig, "roberta": tf.RobertaConfig,
           "xlm-roberta": tf.XLMRobertaConfig, "gte": tf.GteConfig}[model_type]  # fmt: skip
    return cls(**common)


def family_model(model_type: str, folder: Path):
    """A random SentenceTransformer of the family (FAMILY_SHAPE), saved to and loaded from `folder` with the
    default attention implementation."""
    import transformers as tf
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from xsbert_core import resolve_model

    tok = tf.AutoTokenizer.from_pretrained(resolve_model(MODELS["minilm"]))
    torch.manual_seed(0)
    tf.AutoModel.from_config(family_config(model_type, len(tok), tok.pad_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    first = Transformer(str(folder), max_seq_length=128)
    pooling = "lasttoken" if model_type == "qwen3" else "mean"
    model = SentenceTransformer(modules=[first, Pooling(first.get_embedding_dimension(), pooling_mode=pooling)],
                                device="cpu")  # fmt: skip
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def bench_family(model_type: str, args) -> dict:
    import tempfile
    import warnings

    with tempfile.TemporaryDirectory() as tmp:
        model = family_model(model_type, Path(tmp) / model_type)
    loaded = model[0].auto_model.config._attn_implementation
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ex = Explainer(model, layer=args.layer, rule="riemann", steps=args.steps)
    fallback = [str(w.message) for w in caught if "forward-mode AD" in str(w.message)]
    pairs = stsb_test_pairs(args.family_pairs, args.seed)
    texts = [t for p in pairs for t in p]
    engine_run(model, args.layer, "riemann", args.steps, pairs[:1])  # warm-up
    t_eng, t_fwd, c_eng, c_fwd = [], [], [], []
    for _ in range(args.family_rounds):  # alternated, so that a burst of load on a shared machine hits both
        t_eng.append(timed(lambda: ex.explain_pairs(pairs))[1])
        t_fwd.append(plain_forward(ex, texts, args.steps, expand_tokens=True))
        c_eng.append(timed(lambda: ex.explain_pairs(pairs), time.process_time)[1])
        c_fwd.append(plain_forward(ex, texts, args.steps, expand_tokens=True, clock=time.process_time))
    t_eng, t_fwd, c_eng, c_fwd = min(t_eng), min(t_fwd), min(c_eng), min(c_fwd)
    return {"family": model_type, "name": ex.split.family.name, "layer": ex.layer, "pairs": len(pairs),
            "steps": args.steps, "attention_loaded": loaded,
            "attention_used": model[0].auto_model.config._attn_implementation, "fallback": fallback[:1],
            "engine_s": t_eng, "forward_same_rows_s": t_fwd, "engine_over_forward_same_rows": t_eng / t_fwd,
            "engine_cpu_s": c_eng, "forward_same_rows_cpu_s": c_fwd, "cpu_ratio": c_eng / c_fwd}  # fmt: skip


def commit() -> str:
    """The commit the benchmark ran at (with "+changes" when the work tree differs from it)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=ROOT, check=False).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def families_markdown(results: list[dict], args) -> str:
    lines = [
        f"Engine / plain forward per family ({time.strftime('%Y-%m-%d')}, code {commit()}, {args.machine}, torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads; random models of all-MiniLM-L6-v2's shape, "
        f"layer {args.layer}, riemann N={args.steps}, {args.family_pairs} STS-B test pairs, seed {args.seed}; best "
        f"of {args.family_rounds} alternated runs each; load average {os.getloadavg()[0]:.1f} at the end). "
        f"Command: `python bench/engine.py {shlex.join(sys.argv[1:])}`",
        "",
        "Wall: the best wall-clock seconds; CPU: the best CPU seconds of this process (time.process_time), which other",
        "processes' load disturbs less on a shared machine.",
        "",
        "| family | attention loaded -> used | engine wall (s) | forward wall (s) | engine / forward, wall | engine / "
        "forward, CPU |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        used = r["attention_loaded"] + (f" -> {r['attention_used']} (no forward-mode AD)" if r["fallback"] else "")
        lines.append(f"| {r['name']} [{r['family']}] | {used} | {r['engine_s']:.2f} | {r['forward_same_rows_s']:.2f} "
                     f"| {r['engine_over_forward_same_rows']:.2f}x | {r['cpu_ratio']:.2f}x |")  # fmt: skip
    return "\n".join(lines) + "\n"


def bench_model(key: str, args) -> dict:
    name = MODELS[key]
    model = load_model(name)
    pairs = stsb_test_pairs(args.pairs, args.seed)
    rev_pairs = pairs[: args.reverse_pairs]
    texts = [t for p in pairs for t in p]
    r: dict = {"model": name, "pairs": len(pairs), "reverse_pairs": len(rev_pairs), "steps": args.steps}

    engine_run(model, args.layer, "riemann", args.steps, pairs[:1])  # warm-up: first-call allocations, lazy init

    # 1. same rule, same N
    ex, t_eng, errs = engine_run(model, args.layer, "riemann", args.steps, pairs)
    r.update(layer=ex.layer, dim=int(ex.model.get_embedding_dimension()))
    r["engine_pairs_per_s"] = len(pairs) / t_eng
    rev, t_rev = reverse_run(ex, "riemann", args.steps, rev_pairs)
    r["reverse_pairs_per_s"] = len(rev_pairs) / t_rev
    r["engine_same_pairs_per_s"] = len(rev_pairs) / engine_time_on(model, args.layer, "riemann", args.steps, rev_pairs)
    r["speedup_same_n"] = r["engine_same_pairs_per_s"] / r["reverse_pairs_per_s"]
    fwd = ex.factors([t for p in rev_pairs for t in p])
    rev_flat = [f for pr in rev for f in pr]
    r["max_rel_diff_vs_reverse"] = max(float((f.factor - g).norm() / g.norm()) for f, g in zip(fwd, rev_flat))
    r["riemann_n_mean_error"] = float(errs.mean())

    # 2. equal-or-better completeness error
    _, t_ref, errs_ref = engine_run(model, args.layer, "riemann", args.ref_steps, pairs)
    r["ref_steps"] = args.ref_steps
    r["riemann_ref_mean_error"] = float(errs_ref.mean())
    for n in GL_CANDIDATES:
        _, t_gl, errs_gl = engine_run(model, args.layer, "gauss-legendre", n, pairs)
        if errs_gl.mean() <= errs_ref.mean():
            break
    r.update(gl_steps=n, gl_mean_error=float(errs_gl.mean()), gl_pairs_per_s=len(pairs) / t_gl)
    if args.reverse_full:
        _, t_rev_ref = reverse_run(ex, "riemann", args.ref_steps, rev_pairs)
        r["reverse_ref_pairs_per_s"], r["reverse_ref_timing"] = len(rev_pairs) / t_rev_ref, "measured"
    else:
        r["reverse_ref_pairs_per_s"] = r["reverse_pairs_per_s"] * args.steps / args.ref_steps
        r["reverse_ref_timing"] = f"N={args.steps} timing x {args.ref_steps}/{args.steps}"
    r["gl_same_pairs_per_s"] = len(rev_pairs) / engine_time_on(model, args.layer, "gauss-legendre", n, rev_pairs)
    r["speedup_equal_error"] = r["gl_same_pairs_per_s"] / r["reverse_ref_pairs_per_s"]

    # 3. plain forward of the same batches
    t_fwd_tok = plain_forward(ex, texts, args.steps, expand_tokens=True)
    t_fwd = plain_forward(ex, texts, args.steps, expand_tokens=False)
    r["engine_over_forward_same_rows"] = t_eng / t_fwd_tok
    r["engine_over_forward_interp_points"] = t_eng / t_fwd

    # 4. memory for a 512-token text
    if not args.skip_rss:
        r["rss_512"] = rss_probe(name, args.rss_layer, 512, args.rss_steps)
    r["this_process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return r


def to_markdown(results: list[dict], args) -> str:
    lines = [
        f"Engine benchmark ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; STS-B test pairs, seed {args.seed}). Command: "
        f"`python bench/engine.py {shlex.join(sys.argv[1:])}`",
        "",
        "| | " + " | ".join(r["model"].split("/")[-1] + f" (layer {r['layer']}, D={r['dim']})" for r in results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def row(label, fmt):
        lines.append(f"| {label} | " + " | ".join(fmt(r) for r in results) + " |")

    row(
        "engine throughput, riemann N (pairs/s)",
        lambda r: f"{r['engine_pairs_per_s']:.2f} (N={r['steps']}, {r['pairs']} pairs)",
    )
    row(
        "same pairs: engine, riemann N (pairs/s)",
        lambda r: f"{r['engine_same_pairs_per_s']:.3f} ({r['reverse_pairs']} pairs)",
    )
    row("same pairs: reverse mode, riemann N (pairs/s)", lambda r: f"{r['reverse_pairs_per_s']:.4f}")
    row("**speed-up, same rule and N**", lambda r: f"**{r['speedup_same_n']:.0f}x**")
    row("max rel. diff engine vs reverse", lambda r: f"{r['max_rel_diff_vs_reverse']:.1e}")
    row("mean factor error, riemann N", lambda r: f"{r['riemann_n_mean_error']:.2e}")
    row("mean factor error, riemann N_ref", lambda r: f"{r['riemann_ref_mean_error']:.2e} (N_ref={r['ref_steps']})")
    row("smallest GL N with error <= that", lambda r: f"{r['gl_steps']} ({r['gl_mean_error']:.2e})")
    row("engine throughput, GL (pairs/s)", lambda r: f"{r['gl_pairs_per_s']:.2f} ({r['pairs']} pairs)")
    row("same pairs: engine GL (pairs/s)", lambda r: f"{r['gl_same_pairs_per_s']:.3f}")
    row(
        "same pairs: reverse riemann N_ref (pairs/s)",
        lambda r: f"{r['reverse_ref_pairs_per_s']:.5f} ({r['reverse_ref_timing']})",
    )
    row("**speed-up, equal-or-better error**", lambda r: f"**{r['speedup_equal_error']:.0f}x**")
    row("engine / forward of same B·N·S rows", lambda r: f"{r['engine_over_forward_same_rows']:.2f}x")
    row("engine / forward of B·N interpolation points", lambda r: f"{r['engine_over_forward_interp_points']:.1f}x")
    row(
        "512-token text: peak RSS (after load)",
        lambda r: (
            f"{r['rss_512']['peak_rss_mb']:.0f} MB ({r['rss_512']['rss_after_load_mb']:.0f} MB), "
            f"{r['rss_512']['seconds']:.1f} s"
            if "rss_512" in r
            else "skipped"
        ),
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="minilm,mpnet", help="comma list of: " + ", ".join(MODELS))
    p.add_argument("--layer", type=int, default=-3)
    p.add_argument("--pairs", type=int, default=24, help="pairs for engine timings")
    p.add_argument("--reverse-pairs", type=int, default=4, help="pairs for reverse-mode timings (the first of --pairs)")
    p.add_argument("--steps", type=int, default=4, help="N for the same-N comparison")
    p.add_argument("--ref-steps", type=int, default=50, help="riemann N of the reference code's setting")
    p.add_argument("--reverse-full", action="store_true", help="time reverse mode at --ref-steps directly")
    # Memory is bounded per jvp chunk, not per layer or node: one layer and one node keep the probe short.
    p.add_argument("--rss-steps", type=int, default=1)
    p.add_argument("--rss-layer", type=int, default=-1)
    p.add_argument("--skip-rss", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.md"))
    p.add_argument("--families", default="", help="comma list of model_types (xsbert_core.families), or all")
    p.add_argument("--family-pairs", type=int, default=6, help="STS-B pairs per family")
    p.add_argument("--family-rounds", type=int, default=3, help="engine and forward runs per family, alternated")
    p.add_argument("--families-out", default=str(ROOT / "bench" / "results" / "engine_families.md"))
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--machine", default=f"{os.cpu_count()} CPU cores", help="the machine, as the results name it")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for key in filter(None, (k.strip() for k in args.models.split(","))):
        print(f"== {key}", flush=True)
        results.append(bench_model(key, args))
        print(json.dumps(results[-1], indent=1), flush=True)
    if results:
        md = to_markdown(results, args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(md)
        Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
        print(md)
    if args.families:
        from xsbert_core.families import FAMILIES

        chosen = list(FAMILIES) if args.families == "all" else [k.strip() for k in args.families.split(",")]
        fam = []
        for key in chosen:
            print(f"== family {key}", flush=True)
            fam.append(bench_family(key, args))
            print(json.dumps(fam[-1], indent=1), flush=True)
        md = families_markdown(fam, args)
        Path(args.families_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.families_out).write_text(md)
        Path(args.families_out).with_suffix(".json").write_text(json.dumps(fam, indent=1))
        print(md)


if __name__ == "__main__":
    main()
