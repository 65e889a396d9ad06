"""Sentence factors by forward-mode AD: one Jacobian-vector product per token.

    P[k, s] = sum_n w_n sum_h de_k/dx[s, h] (x(alpha_n)) * Delta[s, h]
    x(alpha) = h(r) + alpha * Delta,   Delta = h(x) - h(r)

Column s is the JVP of e at x(alpha_n) with tangent Delta restricted to token s, summed over the
quadrature. Tangents of many tokens and many (sentence, node) rows go through one vmap'd jvp;
chunks bound memory; linear layers take the rule for constant parameters (xsbert_core.tangent_rules).
By completeness, sum_s P[:, s] -> e(x) - e(r).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.func import jvp, vmap

from .precision import DEFAULT_PRECISION, Precision, jvp_dtype, tf32_matmuls
from .quadrature import Panel, panel_nodes_and_weights
from .split import SplitModel, TokenBatch
from .tangent_rules import constant_parameters

# Elements of the largest per-sequence activation allowed in one chunk (~32 MB of float32 per
# activation tensor); bounds peak memory for long texts, keeps short texts in large chunks.
# Measured on 2 CPU cores (48 STS-B sentences, riemann N=4): 2**23 is 1.34x faster than 2**25 for
# all-MiniLM-L6-v2 and 1.16x for all-mpnet-base-v2; 2**21 is slower again (per-call overhead).
DEFAULT_CHUNK_ELEMENTS = 2**23
# On a GPU the CPU's chunk leaves the card idle between small kernels. Measured on one H100 80 GB
# (bench/gpu.py, bench/results/gpu.md; 256 QQP questions, batches of 128): 2**30 elements ran MiniLM
# (layer 4, GL N=10) 16.6x and mpnet (layer 8, GL N=24) 20.6x faster than 2**23, at GPU peaks of 19 and
# 29 GiB; 2**27 was 13.2x and 13.1x. A card gets 1/64 of its memory in elements (2**30 on 80 GB),
# never more than 2**30 (the largest measured) nor less than the CPU's chunk.
GPU_CHUNK_ELEMENTS_MAX = 2**30


@dataclass
class Endpoints:
    """What the path integral needs for a batch: h(x), h(r), the exact-mode shift, e(x), e(r)."""

    batch: TokenBatch
    h_x: Tensor  # (B, S, H)
    h_r: Tensor  # (B, S, H)
    shift: Tensor | None  # (B, S, H) reference token embeddings (exact mode) or None
    e_x: Tensor  # (B, D)
    e_r: Tensor  # (B, D)

    @property
    def delta(self) -> Tensor:
        """Delta = h(x) - h(r), zero at batch-padding positions."""
        mask = self.batch.features["attention_mask"].unsqueeze(-1).to(self.h_x.dtype)
        return (self.h_x - self.h_r) * mask


@torch.no_grad()
def endpoints(split: SplitModel, batch: TokenBatch) -> Endpoints:
    """Run the model on inputs and references: hidden states at L and embeddings at both ends.

    Inputs and references go through the model as one batch of 2B rows (the same lengths and masks), and e(x), e(r)
    through the tail as another (on the inputs' features, as the path's points). In approx mode the forward stops at
    layer L (SplitModel.entering); exact mode runs it to the end for the reference's token embeddings T(r).

    With an excluded prompt (batch.exclude_prompt) the path starts at h(r) with the prompt's positions held at
    h(x): h_r[prompt] = h_x[prompt], so Delta is 0 there (split.py).
    """
    bsz = len(batch.texts)
    ref_features = batch.reference_features()
    both = {k: torch.cat([v, ref_features[k]]) for k, v in batch.features.items()}
    if split.mode == "exact":
        h, t = split.hidden(both)
        t_r = t[bsz:]
    else:
        h, t_r = split.entering(both), None
    h_x, h_r = h[:bsz], h[bsz:]
    if batch.exclude_prompt and batch.prompt_mask is not None:
        h_r = torch.where(batch.prompt_mask.unsqueeze(-1), h_x, h_r)
    twice = {k: torch.cat([v, v]) for k, v in batch.features.items()}
    e = split.tail(torch.cat([h_x, h_r]), twice, torch.cat([t_r, t_r]) if t_r is not None else None,
                   batch.prompt_length)  # fmt: skip
    return Endpoints(batch, h_x, h_r, t_r, e[:bsz], e[bsz:])


def gpu_chunk_elements(total_memory: int) -> int:
    """The chunk on a GPU of `total_memory` bytes: 1/64 of it in elements, within [CPU chunk, 2**30]."""
    return int(min(GPU_CHUNK_ELEMENTS_MAX, max(DEFAULT_CHUNK_ELEMENTS, total_memory // 64)))


def chunk_elements(device: torch.device) -> int:
    """Elements of the largest activation of one jvp call on `device` (CPU: DEFAULT_CHUNK_ELEMENTS)."""
    if device.type == "cuda":
        return gpu_chunk_elements(torch.cuda.get_device_properties(device).total_memory)
    return DEFAULT_CHUNK_ELEMENTS


def default_internal_batch_size(split: SplitModel, seq_len: int, chunk: int | None = None) -> int:
    """Sequences per jvp call so the largest activation (FFN or attention scores) stays within `chunk` elements
    (default: chunk_elements of the model's device)."""
    config = split.auto_model.config
    inter = int(getattr(config, "intermediate_size", 4 * split.hidden_size) or 4 * split.hidden_size)
    heads = int(getattr(config, "num_attention_heads", 12) or 12)
    per_seq = max(seq_len * inter, heads * seq_len * seq_len)
    return max(1, (chunk or chunk_elements(split.device)) // per_seq)


def jvp_chunks(split: SplitModel, seq_len: int, internal_batch_size: int | None = None,
               chunk: int | None = None) -> tuple[int, int]:  # fmt: skip
    """(token tangents, (sentence, node) rows) per jvp call: internal_batch_size sequences (default: sized from the
    text and `chunk`, default the device's), tokens first."""
    ibs = internal_batch_size or default_internal_batch_size(split, seq_len, chunk)
    tok_chunk = max(1, min(seq_len, ibs))
    return tok_chunk, max(1, ibs // tok_chunk)


def row_chunks(split: SplitModel, lengths: list[int], internal_batch_size: int | None = None,
               chunk: int | None = None) -> Iterator[tuple[int, int, int]]:  # fmt: skip
    """(first row, row after the last, longest length) of each jvp call over the rows of `lengths` (tokens per
    (sentence, node) row): consecutive rows, as many as jvp_chunks allows for the longest of them. Sized by the rows'
    own length, not the batch's padded one, so a batch with one long text does not pad every short one to it."""
    r0 = 0
    while r0 < len(lengths):
        longest, r1 = lengths[r0], r0 + 1
        while r1 < len(lengths):
            grown = max(longest, lengths[r1])
            if r1 + 1 - r0 > jvp_chunks(split, grown, internal_batch_size, chunk)[1]:
                break
            longest, r1 = grown, r1 + 1
        yield r0, r1, longest
        r0 = r1


@torch.no_grad()  # forward-mode AD runs under no_grad; without it a model whose parameters require grad builds a graph
def integrate(
    split: SplitModel,
    ends: Endpoints,
    rule: str,
    n_steps: int,
    internal_batch_size: int | None = None,
    precision: Precision = DEFAULT_PRECISION,
    jvp_split: SplitModel | None = None,
    chunk: int | None = None,
) -> Tensor:
    """Sentence factors of the batch, shape (B, D, S), float32; columns past a sentence's length are 0.

    precision (xsbert_core.precision): the JVPs' arithmetic. bf16 / fp16 push x(alpha_n) and the tangents, cast to
    that dtype, through `jvp_split` (the same split model cast to it: SplitModel.cast); each JVP's output is cast to
    float32 before it is weighted by w_n and summed. tf32 turns TF32 matrix products on during the JVPs only.
    """
    whole = [[Panel(0.0, 1.0, n_steps)] for _ in ends.batch.texts]
    return integrate_panels(split, ends, rule, whole, internal_batch_size, precision, jvp_split, chunk)


@torch.no_grad()
def integrate_panels(
    split: SplitModel,
    ends: Endpoints,
    rule: str,
    panels: Sequence[Sequence[Panel]],
    internal_batch_size: int | None = None,
    precision: Precision = DEFAULT_PRECISION,
    jvp_split: SplitModel | None = None,
    chunk: int | None = None,
) -> Tensor:
    """The factor of each panel of each sentence, shape (P, D, S) in the order of `panels` (sentence b's panels
    panels[b], P in all), float32:

        P_p[k, s] = sum_n (b_p - a_p) w_n sum_h de_k/dx[s, h] (x(a_p + (b_p - a_p) alpha_n)) * Delta[s, h]

    A sentence's factor over [0, 1] is the sum of its panels' when they tile [0, 1] (`integrate`: one panel each).
    By completeness on a panel, sum_s P_p[:, s] -> e(x(b_p)) - e(x(a_p)) (`path_embeddings`).
    precision, jvp_split, chunk, internal_batch_size: as `integrate`.
    """
    if len(panels) != len(ends.batch.texts):
        raise ValueError(f"panels for {len(panels)} sentences, the batch has {len(ends.batch.texts)}")
    feats = ends.batch.features
    _, seq_len, hid = ends.h_x.shape
    dtype, device = ends.h_x.dtype, ends.h_x.device
    low = jvp_dtype(precision)
    if low != dtype and (jvp_split is None or jvp_split.dtype != low):
        raise ValueError(f"precision {precision} needs jvp_split: the split model cast to {low}")
    tail_split = jvp_split if low != dtype else split
    # Rows: (sentence b, panel p, node n), b-major; each row's panel is its slot of the output.
    sentence: list[int] = []
    alphas, weights = [], []
    for b, own in enumerate(panels):
        for panel in own:
            a_n, w_n = panel_nodes_and_weights(rule, panel)
            sentence += [b] * len(a_n)
            alphas.append(a_n)
            weights.append(w_n)
    counts = [panel.n for own in panels for panel in own]
    row_slot = torch.arange(len(counts), device=device).repeat_interleave(torch.as_tensor(counts, device=device))
    row_sentence = torch.as_tensor(sentence, device=device, dtype=torch.long)
    row_alpha = torch.as_tensor(np.concatenate(alphas) if alphas else np.zeros(0), dtype=dtype, device=device)
    row_weight = torch.as_tensor(np.concatenate(weights) if weights else np.zeros(0), dtype=dtype, device=device)
    delta = ends.delta
    row_x = ends.h_r[row_sentence] + row_alpha[:, None, None] * delta[row_sentence]
    row_x = row_x.to(low)
    row_delta = delta[row_sentence].to(low)
    row_feats = {k: v[row_sentence] for k, v in feats.items()}
    row_shift = ends.shift[row_sentence].to(low) if ends.shift is not None else None
    row_len = torch.as_tensor(ends.batch.lengths, device=device)[row_sentence]

    dim = ends.e_x.shape[-1]
    factors = torch.zeros(len(counts), dim, seq_len, dtype=dtype, device=device)

    with tf32_matmuls(precision == "tf32"), constant_parameters():
        for r0, r1, longest in row_chunks(split, row_len.tolist(), internal_batch_size, chunk):
            tok_chunk = jvp_chunks(split, longest, internal_batch_size, chunk)[0]
            # The rows' own length: the positions past it are padding in every row of the call (masked out of
            # attention and pooling), so cutting them changes no number, only the work. A copy, not a view: forward
            # AD gives a view's tangent the size of its base (all B*N rows, per token tangent), which made each call
            # zero-fill J x B*N*S*H values and ran a 128-sentence batch at N = 128 out of an 80 GB card.
            x = row_x[r0:r1, :longest].clone()
            f = {k: v[r0:r1, :longest] for k, v in row_feats.items()}
            sh = row_shift[r0:r1, :longest] if row_shift is not None else None

            def e_of(h: Tensor, f=f, sh=sh) -> Tensor:
                return tail_split.tail(h, f, sh, ends.batch.prompt_length)

            def push(t: Tensor, x=x, e_of=e_of) -> Tensor:
                return jvp(e_of, (x,), (t,))[1]

            for s0 in range(0, longest, tok_chunk):
                s1 = min(s0 + tok_chunk, longest)
                tangents = torch.zeros(s1 - s0, r1 - r0, longest, hid, dtype=low, device=device)
                j = torch.arange(s1 - s0, device=device)
                tangents[j, :, s0 + j, :] = row_delta[r0:r1, s0:s1, :].transpose(0, 1)
                out = vmap(push)(tangents).to(dtype)  # (J, rows, D): J_e(x_row) . Delta_s, back in float32
                out = out * row_weight[r0:r1][None, :, None]
                factors[:, :, s0:s1].index_add_(0, row_slot[r0:r1], out.permute(1, 2, 0))
    return factors


@torch.no_grad()
def path_embeddings(split: SplitModel, ends: Endpoints, sentence: Sequence[int], alpha: Sequence[float],
                    internal_batch_size: int | None = None, chunk: int | None = None) -> Tensor:  # fmt: skip
    """e(x(alpha)) = tail(h(r) + alpha * Delta) of each (sentence, alpha), shape (M, D), float32: the path's points
    whose differences the panels' factors sum to. alpha 0 and 1 give e(r) and e(x) as `endpoints` does (the same
    tail on the same rows), up to float rounding."""
    if len(sentence) != len(alpha):
        raise ValueError("one alpha per sentence index")
    dtype, device = ends.h_x.dtype, ends.h_x.device
    dim = ends.e_x.shape[-1]
    if not len(sentence):
        return torch.zeros(0, dim, dtype=dtype, device=device)
    idx = torch.as_tensor(list(sentence), dtype=torch.long, device=device)
    a = torch.as_tensor(list(alpha), dtype=dtype, device=device)
    x = ends.h_r[idx] + a[:, None, None] * ends.delta[idx]
    feats = {k: v[idx] for k, v in ends.batch.features.items()}
    shift = ends.shift[idx] if ends.shift is not None else None
    lengths = [ends.batch.lengths[i] for i in idx.tolist()]
    out = [split.tail(x[r0:r1, :longest], {k: v[r0:r1, :longest] for k, v in feats.items()},
                      shift[r0:r1, :longest] if shift is not None else None, ends.batch.prompt_length)
           for r0, r1, longest in row_chunks(split, lengths, internal_batch_size, chunk)]  # fmt: skip
    return torch.cat(out)


def completeness_errors(factors: Tensor, e_x: Tensor, e_r: Tensor) -> np.ndarray:
    """Per sentence: ||sum_s P[:, s] - (e(x) - e(r))|| / ||e(x) - e(r)||  (relative completeness error), of factors
    (B, D, S) and embeddings (B, D)."""
    target = (e_x - e_r).double()
    got = factors.double().sum(-1)
    denom = target.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    return ((got - target).norm(dim=-1) / denom).cpu().numpy()

