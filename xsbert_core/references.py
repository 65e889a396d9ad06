"""Reference inputs: the all-padding sentence of the same length.

For an input of S tokens the reference is  [CLS/BOS] PAD ... PAD [SEP/EOS]  (length S, attention
over all S positions): every special token the tokenizer added stays, every other token becomes the
tokenizer's pad token. Ids come from the tokenizer, never hard-coded.

Decoders: the same rule. A tokenizer that adds BOS and EOS gives BOS PAD ... PAD EOS; Qwen3-Embedding's adds no BOS
and appends <|endoftext|> (also its pad token), so r = <|endoftext|> x S. Same length, so the same positions
(rotary phases) and the same causal structure; the pooled last token is the same token in x and r, so at layer 0
its Delta is 0 and the attribution reaches it only through attention to the text, as [CLS] under CLS pooling
(docs/MODELS.md, "The reference of a decoder").
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import UnsupportedModelError


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id (BERT: 0, RoBERTa/MPNet: 1, ...)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise UnsupportedModelError(
            f"Tokenizer {type(tokenizer).__name__} has no pad token: the reference input cannot be built"
        )
    return int(pad)


def reference_ids(input_ids: Tensor, special_tokens_mask: Tensor, attention_mask: Tensor, pad_id: int) -> Tensor:
    """Reference ids r for a padded batch, shape (B, S) like input_ids.

    r[b, s] = input_ids[b, s] where the token is special ([CLS]/[SEP], <s>/</s>), else pad_id.
    Positions outside attention_mask are batch padding and stay pad_id.
    """
    keep = special_tokens_mask.bool() & attention_mask.bool()
    return torch.where(keep, input_ids, torch.full_like(input_ids, pad_id))
