"""An independent implementation of the attribution method (docs/DESIGN.md §1), for tests only.

It shares no code with xsbert_core's engine (split, families, factors, references, pairs, reverse, quadrature,
explainer): it reads the plain HF model (`model[0].auto_model`), its tokenizer and the pooling mode of
the sentence-transformers pipeline, and writes every step out, one sentence at a time:

    ids     tokenizer(prompt + text), specials included
    r       the tokens the tokenizer adds kept (those of tokenizer(text) that tokenizer(text, add_special_tokens=
            False) lacks at either end: [CLS]/[SEP], <s>/</s>, a decoder's <|endoftext|>), every other position the
            tokenizer's pad id (with exclude_prompt the prompt's tokens kept too); same length, attention over all
    h(.)    HF hidden_states[L] of x and of r
    e(.)    BERT-like families (ARCHITECTURES): encoder layers L..n-1 called one by one (additive extended mask;
            MPNet: + its relative position bias). The others (HOOKED): the model's own full forward, unmodified,
            with the input of layer L replaced by a forward pre-hook (layers before L run and are overwritten).
            Then pooling (every sentence-transformers mode, own code, the prompt left out when the Pooling says
            include_prompt=False); exact mode pools T(.) - T(r)
    P[k,s]  sum_n w_n sum_h de_k/dx[s, h](x(alpha_n)) * Delta[s, h], x(alpha) = h(r) + alpha Delta:
            reverse mode, one backward pass per embedding dimension at each node
    A       P_a^T P_b / (|e(a)| |e(b)|)  (dot: no division)
    target  [e(a).e(b) - e(a).e(r_b) - e(r_a).e(b) + e(r_a).e(r_b)] / c

Slow (D backward passes per node) and obviously correct; the engine must agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

ARCHITECTURES = ("bert", "roberta", "xlm-roberta", "mpnet", "distilbert", "electra")  # layer calls written out below
# The other families: where the layer list lives; e(.) is the full forward with layer L's input replaced.
HOOKED = {"deberta-v2": "encoder.layer", "modernbert": "layers", "gte": "layers", "nomic_bert": "layers",
          "qwen3": "layers"}  # fmt: skip
POOLINGS = ("mean", "cls", "max", "lasttoken", "weightedmean", "mean_sqrt_len_tokens")


def nodes(rule: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """riemann: alpha_n = n/N, w_n = 1/N; gauss-legendre: numpy's nodes on [-1, 1] mapped to [0, 1]."""
    if rule == "riemann":
        return np.arange(1, n + 1) / n, np.full(n, 1.0 / n)
    if rule == "gauss-legendre":
        x, w = np.polynomial.legendre.leggauss(n)
        return (x + 1) / 2, w / 2
    raise ValueError(rule)


def pooling_mode(model) -> str:
    """The pipeline's pooling (one of POOLINGS); after it only a Normalize may follow (dropped)."""
    pool = model[1]
    mode = getattr(pool, "pooling_mode", None)
    assert mode in POOLINGS, mode
    assert all(type(model[k]).__name__ == "Normalize" for k in range(2, len(model))), "only Normalize after pooling"
    return mode


def pooled_prompt_length(model, prompt: str) -> int:
    """How many leading tokens the Pooling leaves out when it says include_prompt=False (0 otherwise): the prompt
    tokenized alone, less a trailing special token (sentence-transformers' definition)."""
    if not prompt or getattr(model[1], "include_prompt", True):
        return 0
    tok = model[0].tokenizer
    ids = tok(prompt)["input_ids"]
    return len(ids) - (1 if ids[-1] in tok.all_special_ids else 0)


def pool(tokens: Tensor, mask: Tensor, mode: str, skip: int = 0) -> Tensor:
    """(B, S, H) token embeddings -> (B, H) sentence embeddings, right padding and the first `skip` tokens excluded.

    weightedmean: token s (0-based) weighs s + 1; lasttoken: the last attended token, whatever `skip`."""
    n = mask.sum(1)
    if mode == "lasttoken":
        return tokens[torch.arange(tokens.shape[0]), n - 1]
    m = mask.to(tokens.dtype).clone()
    m[:, :skip] = 0
    m = m.unsqueeze(-1)
    if mode == "mean":
        return (tokens * m).sum(1) / m.sum(1).clamp_min(1e-9)
    if mode == "mean_sqrt_len_tokens":
        return (tokens * m).sum(1) / m.sum(1).clamp_min(1e-9).sqrt()
    if mode == "weightedmean":
        w = m * torch.arange(1, tokens.shape[1] + 1, dtype=tokens.dtype)[None, :, None]
        return (tokens * w).sum(1) / w.sum(1).clamp_min(1e-9)
    if mode == "cls":
        return tokens[:, skip]
    if mode == "max":
        return torch.where(m.bool(), tokens, torch.full_like(tokens, torch.finfo(tokens.dtype).min)).max(1).values
    raise ValueError(mode)


def tokenize(model, text: str, pad_to: int | None = None, prompt: str = "") -> dict[str, Tensor]:
    """The model's features of prompt + text (input_ids, attention_mask[, token_type_ids]), right-padded to pad_to."""
    tok = model[0].tokenizer
    enc = tok(prompt + text, return_tensors="pt", truncation=True, max_length=model[0].max_seq_length)
    feats = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
    if pad_to is not None and pad_to > feats["input_ids"].shape[1]:
        extra = pad_to - feats["input_ids"].shape[1]
        fill = {"input_ids": tok.pad_token_id, "attention_mask": 0, "token_type_ids": 0}
        feats = {k: torch.cat([v, torch.full((1, extra), fill[k], dtype=v.dtype)], 1) for k, v in feats.items()}
    return feats


def added_ends(model, text: str) -> tuple[int, int]:
    """(head, tail): how many tokens the tokenizer adds before and after the text's own tokens."""
    tok = model[0].tokenizer
    full, bare = tok(text)["input_ids"], tok(text, add_special_tokens=False)["input_ids"]
    head = next(k for k in range(len(full) - len(bare) + 1) if full[k : k + len(bare)] == bare)
    return head, len(full) - len(bare) - head


def prompt_positions(model, text: str, prompt: str) -> list[int]:
    """Positions of the prompt's tokens in tokenizer(prompt + text): after the added head, up to the first token
    whose characters reach into the text."""
    tok = model[0].tokenizer
    enc = tok(prompt + text, return_offsets_mapping=True)
    head, tail = added_ends(model, prompt + text)
    spans = enc["offset_mapping"][head : len(enc["input_ids"]) - tail]
    return [head + k for k, (_, end) in enumerate(spans) if end <= len(prompt)]


def reference_features(
    model, feats: dict[str, Tensor], text: str, prompt: str = "", keep_prompt: bool = False
) -> dict[str, Tensor]:
    """r: the tokens the tokenizer added kept (and the prompt's, keep_prompt), every other position the pad id."""
    pad = model[0].tokenizer.pad_token_id
    assert pad is not None
    ids = feats["input_ids"].clone()
    n = int(feats["attention_mask"][0].sum())
    head, tail = added_ends(model, prompt + text)
    keep = set(range(head)) | set(range(n - tail, n))
    if keep_prompt:
        keep |= set(prompt_positions(model, text, prompt))
    for s in range(ids.shape[1]):
        if s not in keep:
            ids[0, s] = pad
    return {**feats, "input_ids": ids}


def _extended_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, S) 0/1 -> (B, 1, 1, S) additive: 0 where attended, the dtype's minimum elsewhere."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def run_hooked(model, hidden: Tensor, feats: dict[str, Tensor], layer: int) -> Tensor:
    """The last hidden state of the HF model's own forward with the input of layer `layer` replaced by `hidden`."""
    auto = model[0].auto_model
    owner = auto
    *path, attr = HOOKED[auto.config.model_type].split(".")
    for name in path:
        owner = getattr(owner, name)
    target = getattr(owner, attr)[layer]

    def swap(module, args, kwargs):
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": hidden}
        return (hidden, *args[1:]), kwargs

    handle = target.register_forward_pre_hook(swap, with_kwargs=True)
    try:
        return auto(**feats).last_hidden_state
    finally:
        handle.remove()


def run_layers(model, hidden: Tensor, mask: Tensor, start: int, stop: int | None = None) -> Tensor:
    """Encoder layers start..stop-1 of the HF model, called one by one with keyword arguments."""
    auto = model[0].auto_model
    arch = auto.config.model_type
    assert arch in ARCHITECTURES, arch
    layers = list(encoder_layers(model))
    stop = len(layers) if stop is None else stop
    ext = _extended_mask(mask, hidden.dtype)
    bias = auto.encoder.compute_position_bias(hidden) if arch == "mpnet" else None
    for layer in layers[start:stop]:
        if arch == "mpnet":
            out = layer(hidden_states=hidden, attention_mask=ext, position_bias=bias)
        else:
            out = layer(hidden_states=hidden, attention_mask=ext)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


def encoder_layers(model) -> list:
    """The HF model's layer list: `transformer.layer` for DistilBERT, HOOKED's path, `encoder.layer` for the others."""
    auto = model[0].auto_model
    kind = auto.config.model_type
    if kind in HOOKED:
        owner = auto
        *path, attr = HOOKED[kind].split(".")
        for name in path:
            owner = getattr(owner, name)
        return list(getattr(owner, attr))
    owner = auto.transformer if kind == "distilbert" else auto.encoder
    return list(owner.layer)


@torch.no_grad()
def hf_states(model, feats: dict[str, Tensor]) -> tuple[tuple[Tensor, ...], Tensor]:
    """All HF hidden states and the last layer's token embeddings of the plain model."""
    out = model[0].auto_model(**feats, output_hidden_states=True)
    return out.hidden_states, out.last_hidden_state


@dataclass
class Sentence:
    """One text's factor (D, S, float64), e(x), e(r) (float64), its ids and reference ids (unpadded)."""

    ids: list[int]
    reference_ids: list[int]
    factor: np.ndarray
    e_x: np.ndarray
    e_r: np.ndarray


def sentence(
    model,
    text: str,
    layer: int,
    mode: str,
    rule: str,
    steps: int,
    pad_to: int | None = None,
    prompt: str = "",
    exclude_prompt: bool = False,
) -> Sentence:
    """The independent factor of `text` at layer `layer` (negative: from the top).

    prompt: read before the text (its tokens are columns of the factor); exclude_prompt: the reference keeps the
    prompt's tokens, the path holds them at h(x), and their (zero) columns are dropped from the factor."""
    n_layers = len(encoder_layers(model))
    layer = layer + n_layers if layer < 0 else layer
    how = pooling_mode(model)
    skip = pooled_prompt_length(model, prompt)
    x = tokenize(model, text, pad_to, prompt)
    r = reference_features(model, x, text, prompt)
    mask = x["attention_mask"]
    n = int(mask[0].sum())
    hx_all, _ = hf_states(model, x)
    hr_all, t_r = hf_states(model, r)
    h_x, h_r = hx_all[layer], hr_all[layer]
    held = prompt_positions(model, text, prompt) if (prompt and exclude_prompt) else []
    if held:
        assert mode == "approx"
        h_r = hf_states(model, reference_features(model, x, text, prompt, keep_prompt=True))[0][layer].clone()
        h_r[0, held] = h_x[0, held]
    shift = t_r if mode == "exact" else None
    delta = (h_x - h_r) * mask[..., None].to(h_x.dtype)
    hooked = model[0].auto_model.config.model_type in HOOKED

    def e_of(h: Tensor) -> Tensor:
        t = run_hooked(model, h, x, layer) if hooked else run_layers(model, h, mask, layer)
        if shift is not None:
            t = t - shift
        return pool(t, mask, how, skip)[0]

    with torch.no_grad():
        e_x, e_r = e_of(h_x), e_of(h_r)
    dim = e_x.shape[0]
    factor = np.zeros((dim, h_x.shape[1]))
    alphas, weights = nodes(rule, steps)
    for alpha, weight in zip(alphas, weights):
        point = (h_r + float(alpha) * delta).detach().requires_grad_(True)
        with torch.enable_grad():
            e = e_of(point)
            for k in range(dim):
                (grad,) = torch.autograd.grad(e[k], point, retain_graph=k < dim - 1)
                factor[k] += weight * (grad[0] * delta[0]).sum(-1).double().numpy()
    columns = [s for s in range(n) if s not in held]
    assert not np.any(factor[:, held])
    return Sentence(
        ids=[x["input_ids"][0, s].item() for s in columns],
        reference_ids=r["input_ids"][0, :n].tolist(),
        factor=factor[:, columns],
        e_x=e_x.double().numpy(),
        e_r=e_r.double().numpy(),
    )


def pair(a: Sentence, b: Sentence, similarity: str) -> dict[str, object]:
    """The pair matrix, score, reference terms, what sum A converges to, and its error."""
    norm = float(np.linalg.norm(a.e_x) * np.linalg.norm(b.e_x))
    c = norm if similarity == "cos" else 1.0

    def f(u: np.ndarray, v: np.ndarray) -> float:
        if similarity == "dot":
            return float(u @ v)
        d = float(np.linalg.norm(u) * np.linalg.norm(v))
        return float(u @ v) / d if d > 0 else 0.0

    matrix = a.factor.T @ b.factor / c
    target = float(a.e_x @ b.e_x - a.e_x @ b.e_r - a.e_r @ b.e_x + a.e_r @ b.e_r) / c
    return {
        "matrix": matrix,
        "score": f(a.e_x, b.e_x),
        "ref_sim_a": f(a.e_x, b.e_r),
        "ref_sim_b": f(b.e_x, a.e_r),
        "ref_term": f(a.e_r, b.e_r),
        "target": target,
        "error": float(matrix.sum()) - target,
    }


@torch.no_grad()
def pipeline_embedding(model, feats: dict[str, Tensor]) -> Tensor:
    """The sentence-transformers pipeline's own embedding of `feats` (modules 0 and 1: no Normalize)."""
    out = model[0]({k: v.clone() for k, v in feats.items()})
    return model[1](out)["sentence_embedding"]


@torch.no_grad()
def exact_embedding(model, feats: dict[str, Tensor], text: str) -> Tensor:
    """Exact mode's e(x) = pool(T(x) - T(r)), with the pipeline's own Transformer and Pooling modules."""
    ref = reference_features(model, feats, text)
    t_x = model[0]({k: v.clone() for k, v in feats.items()})["token_embeddings"]
    t_r = model[0]({k: v.clone() for k, v in ref.items()})["token_embeddings"]
    shifted = {"token_embeddings": t_x - t_r, "attention_mask": feats["attention_mask"]}
    return model[1](shifted)["sentence_embedding"]
