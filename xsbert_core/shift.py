"""The embedding shift that gives a model exact attributions (Moeller et al. 2023, 2024).

    T'(x) = T(x) - T(r)          token embeddings minus the reference's, before pooling
    e(x)  = pool(T'(x))          so e(r) = pool(T(r) - T(r)) = 0 exactly, and sum A -> f(a, b)

r is the reference of x: `[CLS/BOS] PAD ... PAD [SEP/EOS]` of the same length (docs/DESIGN.md §1).
`ShiftedTransformer` is a sentence-transformers `Transformer` with that shift built into its forward,
so a fine-tuned exact model is an ordinary sentence-transformers model folder: `model.encode`,
training and saving work as usual, and the engine recognises it (`is_shifted`) and attributes it in
exact mode. Being a subclass (rather than a separate module between Transformer and Pooling), it needs
no reference to a sibling module and keeps the Transformer's weights and state-dict keys unchanged.

Loading a saved shifted model: sentence-transformers >= 6 imports module classes outside its own
namespace only with `trust_remote_code=True`, even from an installed package. Importing `xsbert_core`
registers this one class with sentence-transformers, so that plain `SentenceTransformer(path)` loads
it in any process that imported `xsbert_core` (`xsbert_core.load_model` always does);
`SentenceTransformer(path, trust_remote_code=True)` works without that import.
"""

from __future__ import annotations

import logging
import types

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Transformer
from torch import Tensor

from .errors import UnsupportedModelError
from .references import pad_token_id

logger = logging.getLogger(__name__)

CLASS_REF = "xsbert_core.shift.ShiftedTransformer"


def outer_reference_ids(input_ids: Tensor, attention_mask: Tensor, pad_id: int) -> Tensor:
    """r for a padded batch (B, S): the first and last attended token of each row kept, all else pad_id.

    For single-sentence inputs these are exactly the special tokens the tokenizer adds ([CLS]/[SEP],
    <s>/</s>), which is what `references.reference_ids` keeps; `SplitModel` checks the two agree.
    """
    mask = attention_mask.bool()
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    attended = torch.where(mask, positions, torch.full_like(positions, -1))
    last = attended.max(dim=1, keepdim=True).values
    first = torch.where(mask, positions, torch.full_like(positions, mask.shape[1])).min(dim=1, keepdim=True).values
    keep = mask & ((positions == first) | (positions == last))
    return torch.where(keep, input_ids, torch.full_like(input_ids, pad_id))


class ShiftedTransformer(Transformer):
    """A `Transformer` whose token embeddings are T(x) - T(r) (r: the reference of x, same length).

    Everything else (loading, tokenization, saving, config) is the Transformer's own. The reference pass
    is part of the graph, so fine-tuning trains the model with the shift, as the paper's exact models.
    """

    def forward(self, features: dict[str, Tensor], **kwargs) -> dict[str, Tensor]:
        ref = dict(features)
        ref["input_ids"] = outer_reference_ids(
            features["input_ids"], features["attention_mask"], pad_token_id(self.tokenizer)
        )
        shift = super().forward(ref, **kwargs)["token_embeddings"]
        out = super().forward(features, **kwargs)
        out["token_embeddings"] = out["token_embeddings"] - shift
        return out


def is_shifted(model: SentenceTransformer) -> bool:
    """True when the model's embeddings are reference-shifted (its first module is a ShiftedTransformer)."""
    return len(model) > 0 and isinstance(model[0], ShiftedTransformer)


def shifted(model: SentenceTransformer, drop_normalize: bool = False) -> SentenceTransformer:
    """The same model with the embedding shift: its first module becomes a ShiftedTransformer, in place.

    The weights are shared (nothing is copied). `drop_normalize` removes a trailing Normalize module
    (needed for the dot-product variant, where normalising would turn dot into cosine).
    Raises UnsupportedModelError when the model cannot be shifted.
    """
    first = model[0] if len(model) else None
    if is_shifted(model):
        raise UnsupportedModelError("the model is already reference-shifted")
    if type(first) is not Transformer:
        raise UnsupportedModelError(
            f"the embedding shift wraps a sentence-transformers Transformer as the first module; this model "
            f"starts with {type(first).__name__}"
        )
    tok = first.tokenizer
    probe = tok(["shift probe"], return_special_tokens_mask=True)
    special = probe["special_tokens_mask"][0]
    if len(special) < 3 or not (special[0] == 1 and special[-1] == 1 and sum(special) == 2):
        raise UnsupportedModelError(
            f"the embedding shift needs a tokenizer that adds exactly one special token at each end "
            f"([CLS] ... [SEP] or <s> ... </s>); {type(tok).__name__} gives special mask {special}"
        )
    pad_token_id(tok)  # raises if the tokenizer has no pad token
    first.__class__ = ShiftedTransformer  # a subclass with no state of its own: the swap is safe
    if drop_normalize:
        while len(model) > 1 and isinstance(model[len(model) - 1], Normalize):
            del model[len(model) - 1]
    return model


def register_with_sentence_transformers() -> None:
    """Let plain `SentenceTransformer(path)` resolve CLASS_REF to ShiftedTransformer (see module docstring).

    sentence-transformers >= 6 resolves a `modules.json` type through `BaseModel._module_classes` before
    importing it; this adds exactly our own class there. Older versions import installed classes anyway.
    """
    try:
        from sentence_transformers.base.model import BaseModel
    except ImportError:  # pragma: no cover - sentence-transformers < 6: installed classes import as is
        return
    current = dict(getattr(BaseModel, "_module_classes", {}) or {})
    if current.get(CLASS_REF) is not ShiftedTransformer:
        current[CLASS_REF] = ShiftedTransformer
        BaseModel._module_classes = types.MappingProxyType(current)
