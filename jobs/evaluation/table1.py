"""Table 1: Spearman x 100 of each model's predicted similarity against the gold labels, and the almost-stochastic-order
test between tuned and exact (App. B). Its predictions need only torch and sentence-transformers (table1_rows); the
table itself is polars."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from xsbert_core.metrics import ASO_CONFIDENCE_LEVEL, ASO_ITERATIONS, aso_both_ways, pearson, spearman
from xsbert_core.training import CHECKPOINTS, VARIANTS

from .. import paper
from ..attribution.inputs import STSB_LABELS
from .inputs import DEFAULT_CHECKPOINT, SECOND_SEED, checkpoint_path, is_model, stsb

if TYPE_CHECKING:
    import polars as pl

LABEL_MAX = STSB_LABELS[1]  # Table 1's squared errors are of cosine against score / 5
# The paper's figures for all-mpnet-base-v2 (jobs/paper.py, the one table of them), shown beside ours.
PAPER_TABLE1 = {v: paper.get(f"table1_{v}").value for v in ("shelf", *VARIANTS)}


def predictions(path: str, texts_a: list[str], texts_b: list[str]) -> dict[str, np.ndarray]:
    """Each pair's predicted similarity by the model (its shift included): {"cos": cosine, own: its own similarity
    function's, when that is not cosine (the orig variant's dot product)}."""
    import torch

    from xsbert_core import load_model
    from xsbert_core.explainer import model_similarity

    model = load_model(path, device="cuda" if torch.cuda.is_available() else "cpu", attn_implementation=None)
    unique = list(dict.fromkeys(texts_a + texts_b))
    emb = model.encode(unique, batch_size=64, convert_to_tensor=True, show_progress_bar=False)
    index = {t: k for k, t in enumerate(unique)}
    ea, eb = emb[[index[t] for t in texts_a]], emb[[index[t] for t in texts_b]]
    scores = {"cos": torch.nn.functional.cosine_similarity(ea, eb, dim=-1).double().cpu().numpy()}
    own = model_similarity(model)
    if own != "cos":
        scores[own] = model.similarity_pairwise(ea, eb).double().cpu().numpy()
    return scores


def table1_rows(paths: dict[str, str], split: str, sample: int | None = None
                ) -> tuple[list[dict[str, Any]], dict[tuple[str, str], np.ndarray], dict[str, Any]]:  # fmt: skip
    """Table 1 without polars: (rows as `table1` describes them, each model's squared errors of cosine by (model,
    checkpoint), {"pair_id", "label", "predictions": {"<model>/<checkpoint>/<similarity>": per pair}})."""
    a, b, gold, pair_ids = stsb(split, sample)
    rows, errors = [], {}
    per_pair: dict[str, Any] = {"pair_id": list(pair_ids), "label": gold.tolist(), "predictions": {}}
    for name, path in paths.items():
        if name not in ("shelf", *VARIANTS, *SECOND_SEED):
            continue
        for checkpoint in ("-",) if name == "shelf" else CHECKPOINTS:
            folder = path if name == "shelf" else checkpoint_path(path, checkpoint)
            if name != "shelf" and not is_model(folder):
                continue
            for sim, pred in predictions(folder, a, b).items():
                per_pair["predictions"][f"{name}/{checkpoint}/{sim}"] = pred.tolist()
                if sim == "cos":
                    errors[name, checkpoint] = (pred - gold / LABEL_MAX) ** 2
                shown = sim == "cos" and checkpoint in ("-", DEFAULT_CHECKPOINT)
                rows.append({"model": name, "checkpoint": checkpoint, "similarity": sim, "path": folder,
                             "n_pairs": len(gold), "spearman_x100": 100 * spearman(pred, gold),
                             "pearson_x100": 100 * pearson(pred, gold),
                             "mse": float(((pred - gold / LABEL_MAX) ** 2).mean()),
                             "paper_spearman_x100": PAPER_TABLE1.get(name) if shown else None})  # fmt: skip
    return rows, errors, per_pair


def aso_tests(errors: dict[tuple[str, str], np.ndarray], aso_iterations: int = ASO_ITERATIONS) -> dict[str, Any]:
    """The almost-stochastic-order test between tuned and exact on their squared errors, per checkpoint both have
    (App. B: the paper's threshold is epsilon = 0.3; epsilon_min below it says the one is better)."""
    tests: dict[str, Any] = {}
    for checkpoint in CHECKPOINTS:
        if ("tuned", checkpoint) in errors and ("exact", checkpoint) in errors:
            both = aso_both_ways(errors["tuned", checkpoint], errors["exact", checkpoint],
                                 confidence_level=ASO_CONFIDENCE_LEVEL, seed=0,
                                 num_bootstrap_iterations=aso_iterations)  # fmt: skip
            tests[checkpoint] = {"test": "almost stochastic order (Dror et al. 2019, deepsig.aso)",
                                 "scores": "squared errors of cosine", "confidence_level": ASO_CONFIDENCE_LEVEL,
                                 "bootstrap_iterations": aso_iterations, "paper_epsilon": 0.3,
                                 "eps_min_tuned_better": both["eps_a_better"],
                                 "eps_min_exact_better": both["eps_b_better"]}  # fmt: skip
    return tests


def table1(paths: dict[str, str], split: str, aso_iterations: int = ASO_ITERATIONS,
           sample: int | None = None) -> tuple[pl.DataFrame, dict[str, Any]]:  # fmt: skip
    """One row per model, checkpoint and similarity: Spearman x 100 (and Pearson) of prediction vs gold, cosine
    for every model (the paper's protocol, §4.2) and the model's own similarity beside it where that differs; a
    trained model at its last epoch and, where jobs.train saved it, its best dev epoch (ours). ASO on squared errors
    of tuned vs exact per checkpoint. `paper_spearman_x100` only on rows of cosine at the last epoch (App. A states
    no checkpoint rule; the last epoch is the recipe's model); the paper's model is all-mpnet-base-v2 whatever ours
    is. The second seed's models (tuned2, exact2), where they exist, get rows too: the spread of one recipe over
    seeds, beside tuned vs exact. `sample`: a seeded sample of the split instead of all of it (smoke tests)."""
    import polars as pl

    rows, errors, _ = table1_rows(paths, split, sample)
    return pl.DataFrame(rows), aso_tests(errors, aso_iterations)
