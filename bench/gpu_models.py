"""The models the one-GPU engine benchmarks time (bench/gpu.py's run, bench/gpu_sweep.py), where they come from, and
how a step is timed: all-MiniLM-L6-v2 with its weights, all-mpnet-base-v2 with random weights from its config (cost
does not depend on weight values), a tiny random BERT for dry runs; the jvp chunk scaled; the job's batches."""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import torch

from xsbert_core import Explainer, load_model
from xsbert_core.factors import DEFAULT_CHUNK_ELEMENTS

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "bench" / ".cache" / "gpu"
QQP_QUESTIONS = 537_933  # unique questions of GLUE QQP train (404,290 pairs), as in bench/results/scale.md
QQP_PAIRS = 404_290
# (folder in PACK, layer, Gauss-Legendre N at equal error: bench/results/engine.md)
MODELS = {"minilm": ("minilm-fp16", 4, 10), "mpnet": ("mpnet-config", 8, 24)}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t0


def build(key: str, device: str):
    folder, layer, steps = MODELS[key]
    path = PACK / folder
    if not path.exists():  # no pack here: the installed packages (MiniLM's weights; mpnet's folder for its config)
        from xsbert_core import resolve_model

        path = Path(resolve_model("sentence-transformers/all-MiniLM-L6-v2" if key == "minilm" else "all-mpnet-base-v2"))
    if key == "mpnet":  # random weights from the config, the folder's tokenizer, pooling and normalisation
        from transformers import AutoConfig, AutoModel

        work = Path("/tmp/xsbert-mpnet-random")
        if not (work / "model.safetensors").exists():
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(path, work)
            torch.manual_seed(0)
            AutoModel.from_config(AutoConfig.from_pretrained(path)).save_pretrained(work)
        path = work
    model = load_model(str(path), device=device).float()
    return model, layer, steps


def tiny_model(device: str):
    """A tiny random BERT (2 layers, hidden 32) with MiniLM's tokenizer, mean pooling: `sweep --dry-run`'s model."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from xsbert_core import resolve_model

    work = Path("/tmp/xsbert-gpu-dry-run-bert")
    if not (work / "config.json").exists():
        src = resolve_model("sentence-transformers/all-MiniLM-L6-v2")
        config = AutoConfig.from_pretrained(src, num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                            intermediate_size=64)  # fmt: skip
        torch.manual_seed(0)
        AutoModel.from_config(config).save_pretrained(work)
        AutoTokenizer.from_pretrained(src).save_pretrained(work)
    first = Transformer(str(work), model_kwargs={"attn_implementation": "eager"}, max_seq_length=64)
    model = SentenceTransformer(modules=[first, Pooling(first.get_embedding_dimension())], device=device)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


@contextlib.contextmanager
def chunk(scale: int):
    """Within: every jvp chunk is `scale` x the CPU's (xsbert_core.factors.chunk_elements replaced), on any device."""
    import xsbert_core.factors as fac

    original = fac.chunk_elements
    fac.chunk_elements = lambda device: DEFAULT_CHUNK_ELEMENTS * scale
    try:
        yield
    finally:
        fac.chunk_elements = original



def batches_of(ex: Explainer, texts: list[str], size: int) -> list[list[str]]:
    """The texts longest first in batches of `size`, as jobs.attribute hands a wave's sentences to its actors."""
    lengths = [len(i) for i in ex.split.tokenizer(texts, truncation=False)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: (-lengths[i], texts[i]))
    ordered = [texts[i] for i in order]
    return [ordered[k : k + size] for k in range(0, len(ordered), size)]
