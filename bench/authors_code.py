"""Cross-check against the paper's authors' implementation (lucasmllr/xsbert), which this repo does not contain.

    python bench/authors_code.py --authors /path/to/xsbert-checkout --model mpnet --layer 11 --steps 4 --pairs 2
    python bench/authors_code.py --authors /path/to/xsbert-checkout --model minilm --layer 5 --steps 4 --pairs 3
    python bench/authors_code.py --authors /path/to/xsbert-checkout --model minilm --layer 5 --steps 4 --pairs 3 \
        --reference tokenizer

The checkout is imported from its own folder (nothing of it is copied here). For each of the --pairs
shortest STS-B test pairs of a seeded sample of 50 (held out: no test of ours uses them) it computes the token x
token matrix with the authors' `XSMPNet` / `XSRoberta.explain_similarity` (model built as in their
demo_shelf_model notebook: their `ReferenceTransformer` + mean `Pooling`, no `Normalize`; cos) and with ours,
`Explainer(..., mode="approx", similarity="cos", rule="riemann", steps=N)`: the authors' path interpolates
alpha = 1, 1 - 1/N, ..., 1/N with weight 1/N, which is our `riemann` rule; their layer index `idx` hooks the
input of encoder layer idx, our `--layer`. It prints, per pair, max |A_theirs - A_ours| / max |A_ours| and the
Frobenius relative difference.

Their `ReferenceTransformer` builds the reference from the hard-coded ids 0, 1, 2 (`<s> <pad> ... </s>` in a
RoBERTa/MPNet vocabulary). On a BERT vocabulary (all-MiniLM-L6-v2) these are `[PAD] [unused0] ... [unused1]`.
`--reference tokenizer` replaces that reference row by the tokenizer's own ids (`[CLS] [PAD] ... [SEP]`, what
ours and retrivex use) with a forward pre-hook on the HF model's embeddings: their code runs unchanged either way.

Their MPNet hooks read a layer's positional inputs in the layout of transformers 4.x (hidden, mask, head_mask,
position_bias); transformers 5.x passes (hidden, mask, position_bias), and their XSMPNet then fails with an
IndexError. For mpnet the script puts two pre-hooks of its own around theirs on every layer (insert a None
head_mask before, remove it after), so their hooks see the layout they were written for.

Their package imports `wget` (only to download their fine-tuned checkpoints, which this script does not use);
where `wget` is not installed an empty module stands in for it so that the package imports.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODELS = {
    "mpnet": "sentence-transformers/all-mpnet-base-v2",
    "minilm": "sentence-transformers/all-MiniLM-L6-v2",
}


def _import_authors(path: str):
    if "wget" not in sys.modules:
        try:
            import wget  # noqa: F401
        except ImportError:
            sys.modules["wget"] = types.ModuleType("wget")  # used only by their checkpoint download
    sys.path.insert(0, os.path.abspath(path))
    from xsbert import models as theirs  # noqa: PLC0415

    return theirs


def _tokenizer_reference_hook(tokenizer):
    """Forward pre-hook on the embeddings module: the last batch row (their reference) -> [CLS] PAD ... PAD [SEP].

    On the embeddings, not on the HF model: sentence-transformers calls the model's `forward` directly, which
    runs no hook of the model itself; its embeddings module is called as usual.
    """

    def swap(ids):
        if ids is None or ids.shape[0] < 2:
            return ids
        ids = ids.clone()
        ids[-1, 0] = tokenizer.cls_token_id
        ids[-1, 1:-1] = tokenizer.pad_token_id
        ids[-1, -1] = tokenizer.sep_token_id
        return ids

    def hook(module, args, kwargs):
        if "input_ids" in kwargs:
            kwargs["input_ids"] = swap(kwargs["input_ids"])
        elif args:
            args = (swap(args[0]),) + tuple(args[1:])
        return args, kwargs

    return hook


def _adapt_mpnet_layer_calls(auto_model) -> bool:
    """Their MPNet hooks read a layer's positional inputs as (hidden, mask, head_mask, position_bias), the layout of
    transformers 4.x; 5.x calls MPNetLayer(hidden, mask, position_bias). Around their hooks (a pre-hook before,
    one after, on every layer) insert a None head_mask and take it out again, so their code runs unchanged.
    Returns whether the adapters were needed."""
    import inspect

    layers = auto_model.encoder.layer
    if "head_mask" in inspect.signature(type(layers[0]).forward).parameters:
        return False

    def insert(module, args):
        return (args[0], args[1], None) + tuple(args[2:]) if len(args) == 3 else None

    def remove(module, args):
        return (args[0], args[1]) + tuple(args[3:]) if len(args) == 4 and args[2] is None else None

    for layer in layers:
        layer.register_forward_pre_hook(insert, prepend=True)
        layer.register_forward_pre_hook(remove)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--authors", required=True, help="path to a checkout of lucasmllr/xsbert")
    p.add_argument("--model", choices=sorted(MODELS), default="mpnet")
    p.add_argument("--layer", type=int, default=11)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--seed", type=int, default=40)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--reference", choices=("as-is", "tokenizer"), default="as-is",
                   help="their hard-coded reference ids 0,1,2, or the tokenizer's own (a hook, their code unchanged)")
    args = p.parse_args(argv)

    import numpy as np
    import torch
    from sentence_transformers.models import Pooling

    from jobs.evaluation.inputs import stsb
    from xsbert_core import Explainer, resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    theirs = _import_authors(args.authors)
    folder = resolve_model(MODELS[args.model])
    transformer = theirs.ReferenceTransformer(folder)
    pooling = Pooling(transformer.get_word_embedding_dimension())  # mean pooling, as their notebooks
    cls = theirs.XSMPNet if args.model == "mpnet" else theirs.XSRoberta
    model = cls(modules=[transformer, pooling], device="cpu")
    model.eval()
    tok = transformer.tokenizer
    if args.reference == "tokenizer":
        transformer.auto_model.embeddings.register_forward_pre_hook(_tokenizer_reference_hook(tok), with_kwargs=True)
    model.init_attribution_to_layer(idx=args.layer, N_steps=args.steps)
    adapted = args.model == "mpnet" and _adapt_mpnet_layer_calls(transformer.auto_model)

    ours = Explainer(MODELS[args.model], layer=args.layer, mode="approx", similarity="cos", rule="riemann",
                     steps=args.steps)
    # The --pairs shortest pairs (by characters) of a seeded sample of 50: their code takes D backward passes
    # per sentence, so short texts keep the check cheap.
    texts_a, texts_b, _, _ = stsb("test", sample=50, seed=args.seed)
    short = sorted(range(len(texts_a)), key=lambda i: len(texts_a[i]) + len(texts_b[i]))[: args.pairs]
    texts_a, texts_b = [texts_a[i] for i in short], [texts_b[i] for i in short]
    print(f"model {MODELS[args.model]}  layer {args.layer}  riemann N={args.steps}  reference {args.reference}  "
          f"torch {torch.__version__}" + ("  (MPNet layer-call adapters around their hooks)" if adapted else ""))
    worst = 0.0
    for a, b in zip(texts_a, texts_b):
        t0 = time.perf_counter()
        theirs_matrix = model.explain_similarity(a, b, sim_measure="cos", verbose=False)[0].double().numpy()
        t1 = time.perf_counter()
        res = ours.explain(a, b)
        t2 = time.perf_counter()
        mine = res.matrix
        if theirs_matrix.shape != mine.shape:
            print(f"  shape mismatch {theirs_matrix.shape} vs {mine.shape}: {a!r} / {b!r}")
            return 1
        rel_max = float(np.abs(theirs_matrix - mine).max() / np.abs(mine).max())
        rel_fro = float(np.linalg.norm(theirs_matrix - mine) / np.linalg.norm(mine))
        worst = max(worst, rel_max)
        print(f"  {mine.shape[0]}x{mine.shape[1]} tokens  max-rel {rel_max:.2e}  fro-rel {rel_fro:.2e}  "
              f"sums theirs {theirs_matrix.sum():+.5f} ours {mine.sum():+.5f}  "
              f"({t1 - t0:.0f} s theirs, {t2 - t1:.0f} s ours)  {a[:40]!r} / {b[:40]!r}")
    print(f"worst max-rel {worst:.2e} over {len(texts_a)} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
