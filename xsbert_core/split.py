"""A sentence-transformers model split at encoder layer L.

    h(x) = hidden_states[L](x)             the S x H states entering encoder layer L
    e(x) = tail(h(x))                      layers L..n-1, then pooling (+ Dense), no Normalize
    exact mode:  e(x) = pool(T(x) - T(r))  token embeddings of the reference subtracted, so e(r) = 0
                                           (a ShiftedTransformer model computes the same in its forward)

`tail` re-enters the HF model with its embeddings output replaced by `h` and its layer list sliced
to L..n-1, so masks, position bias (MPNet) and layer signatures stay the model's own.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from sentence_transformers import SentenceTransformer
from torch import Tensor, nn

from .errors import InputError, TruncationError, UnsupportedModelError
from .references import pad_token_id, reference_ids
from .shift import is_shifted, outer_reference_ids

logger = logging.getLogger(__name__)

Mode = Literal["approx", "exact"]
Truncation = Literal["warn", "error"]
MODES: tuple[str, ...] = ("approx", "exact")
TRUNCATION_POLICIES: tuple[str, ...] = ("warn", "error")

# Where the encoder layers live, by architecture family.
_LAYER_PATHS = ("encoder.layer", "transformer.layer", "encoder.layers")


def _find_layers(auto_model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    for path in _LAYER_PATHS:
        owner_path, attr = path.rsplit(".", 1)
        owner = getattr(auto_model, owner_path, None)
        layers = getattr(owner, attr, None) if owner is not None else None
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return owner, attr, layers
    raise UnsupportedModelError(
        f"{type(auto_model).__name__} has no encoder layer list ({', '.join(_LAYER_PATHS)}): supported are "
        "BERT-like encoders (BERT/MiniLM, MPNet, RoBERTa/XLM-R, DistilBERT)"
    )


def control_token_ids(tokenizer) -> frozenset[int]:
    """Ids of the tokenizer's special tokens but its unknown token: [CLS] [SEP] [PAD] [MASK], <s> </s> <pad> <mask>.

    [UNK] / <unk> is content: it stands for characters of the text the vocabulary lacks.
    """
    unk = tokenizer.unk_token_id
    return frozenset(int(i) for i in tokenizer.all_special_ids if i != unk)


def content_count(text: str, ids, offsets, control: frozenset[int]) -> int:
    """How many tokens of `text` carry content: not a control token, and over at least one character that is not
    whitespace (a byte-level BPE `Ġ` on its own is a space). The model's tokenization is taken as it is: a literal
    `[SEP]` in the text is the [SEP] token (a control token), as `SentenceTransformer.encode` sees it."""
    return sum(1 for i, (s, e) in zip(ids, offsets) if int(i) not in control and text[s:e].strip())


@dataclass
class TokenBatch:
    """A padded batch of tokenized texts and their references, all (B, S)."""

    texts: list[str]
    features: dict[str, Tensor]  # input_ids, attention_mask[, token_type_ids]: what the HF model takes
    reference_ids: Tensor
    lengths: list[int]
    truncated: list[bool]
    tokens: list[list[str]]
    word_ids: list[list[int | None]]
    offsets: list[list[tuple[int, int]]]

    def reference_features(self) -> dict[str, Tensor]:
        return {**self.features, "input_ids": self.reference_ids}

    def select(self, rows: list[int]) -> TokenBatch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        s = max(self.lengths[i] for i in rows)
        return TokenBatch(
            texts=[self.texts[i] for i in rows],
            features={k: v[idx, :s] for k, v in self.features.items()},
            reference_ids=self.reference_ids[idx, :s],
            lengths=[self.lengths[i] for i in rows],
            truncated=[self.truncated[i] for i in rows],
            tokens=[self.tokens[i] for i in rows],
            word_ids=[self.word_ids[i] for i in rows],
            offsets=[self.offsets[i] for i in rows],
        )


class SplitModel:
    """`model` split at layer `layer` (negative counts from the top: -1 is the last layer's input)."""

    def __init__(self, model: SentenceTransformer, layer: int, mode: Mode = "approx") -> None:
        if mode not in MODES:
            raise InputError(f"Unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        self.shifted = is_shifted(model)
        if self.shifted and mode != "exact":
            raise InputError(
                "this model is reference-shifted (an exact model: e(x) = pool(T(x) - T(r))), so its attributions "
                "are exact; mode 'approx' would attribute an unshifted embedding the model never produces. "
                "Use mode 'exact' (the default for such a model)"
            )
        first = model[0]
        auto_model = getattr(first, "auto_model", None)
        if auto_model is None:
            raise UnsupportedModelError(
                f"The first module of the model is {type(first).__name__}, not a Hugging Face Transformer"
            )
        self.model = model
        self.auto_model = auto_model
        self.tokenizer = first.tokenizer
        if not getattr(self.tokenizer, "is_fast", False):
            raise UnsupportedModelError("A fast (Rust) tokenizer is needed for word ids and offsets")
        self._owner, self._attr, self._layers = _find_layers(auto_model)
        if not isinstance(getattr(auto_model, "embeddings", None), nn.Module):
            raise UnsupportedModelError(f"{type(auto_model).__name__} has no `embeddings` module to split after")
        impl = getattr(auto_model.config, "_attn_implementation", "eager")
        if impl not in (None, "eager"):
            warnings.warn(
                f"attention implementation {impl!r}: forward-mode AD needs 'eager'; load the model with "
                "xsbert_core.load_model or model_kwargs={'attn_implementation': 'eager'}",
                stacklevel=2,
            )
        self.n_layers = len(self._layers)
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise InputError(f"layer must be an integer, got {layer!r}")
        resolved = layer + self.n_layers if layer < 0 else layer
        if not 0 <= resolved < self.n_layers:
            raise InputError(
                f"layer {layer} is out of range for a model with {self.n_layers} encoder layers "
                f"(valid: 0..{self.n_layers - 1}, or -{self.n_layers}..-1 from the top)"
            )
        self.layer = resolved
        self.mode: Mode = mode
        modules = [model[i] for i in range(1, len(model))]
        while modules and type(modules[-1]).__name__ == "Normalize":
            modules.pop()
        self.post = modules
        self.pad_id = pad_token_id(self.tokenizer)
        self.control_ids = control_token_ids(self.tokenizer)
        self.max_seq_length = int(first.max_seq_length or self.tokenizer.model_max_length)
        self.hidden_size = int(auto_model.config.hidden_size)
        self._model_inputs = [
            k for k in ("input_ids", "attention_mask", "token_type_ids") if k in self.tokenizer.model_input_names
        ]

    @property
    def device(self) -> torch.device:
        return next(self.auto_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.auto_model.parameters()).dtype

    def cast(self, dtype: torch.dtype) -> SplitModel:
        """The same split (layer, mode) of a copy of the model with its parameters and buffers cast to `dtype`
        (this one when it has that dtype already): what reduced-precision JVPs run through (xsbert_core.precision).
        """
        if dtype == self.dtype:
            return self
        import copy

        return SplitModel(copy.deepcopy(self.model).to(dtype), self.layer, self.mode)

    # -------------------------------------------------------------- tokenization
    def tokenize(self, texts: list[str], truncation: Truncation = "warn") -> TokenBatch:
        """Tokenize like the model does, flag (or reject) texts over max_seq_length, build references."""
        if truncation not in TRUNCATION_POLICIES:
            raise InputError(f"Unknown truncation policy {truncation!r}; valid: {', '.join(TRUNCATION_POLICIES)}")
        for text in texts:
            if not isinstance(text, str):
                raise InputError(f"Texts must be strings, got {type(text).__name__}")
            if not text.strip():
                raise InputError("Empty or whitespace-only text cannot be attributed")
        full_lengths = [len(ids) for ids in self.tokenizer(texts, truncation=False)["input_ids"]]
        truncated = [n > self.max_seq_length for n in full_lengths]
        for text, n, cut in zip(texts, full_lengths, truncated):
            if cut and truncation == "error":
                raise TruncationError(
                    f"Text of {n} tokens exceeds max_seq_length={self.max_seq_length}: {text[:60]!r}..."
                )
            if cut:
                logger.warning("Truncating a text of %d tokens to max_seq_length=%d", n, self.max_seq_length)
        enc = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="pt",
            return_special_tokens_mask=True,
            return_offsets_mapping=True,
        )
        # No content: only zero-width or control characters, or only special-token strings ("[CLS] [SEP]",
        # "<s></s>") and whitespace. Then e(x) = e(r) up to the specials' positions: nothing to attribute.
        for b, (text, n) in enumerate(zip(texts, enc["attention_mask"].sum(-1).tolist())):
            ids, offsets = enc["input_ids"][b, :n].tolist(), enc["offset_mapping"][b, :n].tolist()
            if content_count(text, ids, offsets, self.control_ids) == 0:
                raise InputError(
                    f"Text {text[:60]!r} has no tokens but special ones (or whitespace) after tokenization "
                    f"({' '.join(self.tokenizer.convert_ids_to_tokens(ids))}): nothing to attribute"
                )
        features = {k: enc[k].to(self.device) for k in self._model_inputs if k in enc}
        mask = enc["attention_mask"]
        lengths = mask.sum(-1).tolist()
        ref = reference_ids(enc["input_ids"], enc["special_tokens_mask"], mask, self.pad_id)
        if self.shifted and not torch.equal(ref, outer_reference_ids(enc["input_ids"], mask, self.pad_id)):
            # The model's own shift keeps the first and last token; the engine keeps the added specials.
            raise UnsupportedModelError(
                "the tokenizer adds special tokens other than one at each end, so the model's embedding shift "
                "and the engine's reference differ"
            )
        ref = ref.to(self.device)
        return TokenBatch(
            texts=list(texts),
            features=features,
            reference_ids=ref,
            lengths=lengths,
            truncated=truncated,
            tokens=[self.tokenizer.convert_ids_to_tokens(enc["input_ids"][b, :n]) for b, n in enumerate(lengths)],
            word_ids=[enc.word_ids(b)[:n] for b, n in enumerate(lengths)],
            offsets=[[tuple(o) for o in enc["offset_mapping"][b, :n].tolist()] for b, n in enumerate(lengths)],
        )

    def content_counts(self, texts: list[str]) -> list[int]:
        """Content tokens per text, untruncated (`content_count`): 0 is a text `tokenize` rejects as no content."""
        return self.token_counts(texts)[1]

    def token_counts(self, texts: list[str]) -> tuple[list[int], list[int]]:
        """(tokens, content tokens) per text, untruncated, from one tokenizer call: tokens count the special ones
        (what max_seq_length bounds), content tokens are `content_count`'s."""
        enc = self.tokenizer(list(texts), truncation=False, return_offsets_mapping=True)
        ids_all, offsets_all = enc["input_ids"], enc["offset_mapping"]
        return [len(ids) for ids in ids_all], [
            content_count(text, ids, offsets, self.control_ids)
            for text, ids, offsets in zip(texts, ids_all, offsets_all)
        ]

    # ------------------------------------------------------------------ forward
    @contextlib.contextmanager
    def _entering_at_layer(self, hidden: Tensor):
        """Within: the HF model's embeddings output is `hidden` and its layers are L..n-1."""
        handle = self.auto_model.embeddings.register_forward_hook(lambda module, inputs, output: hidden)
        setattr(self._owner, self._attr, nn.ModuleList(list(self._layers)[self.layer :]))
        try:
            yield
        finally:
            setattr(self._owner, self._attr, self._layers)
            handle.remove()

    @torch.no_grad()
    def hidden(self, features: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(h, T): hidden states entering layer L and the last layer's token embeddings, (B, S, H)."""
        out = self.auto_model(**features, output_hidden_states=True)
        return out.hidden_states[self.layer], out.last_hidden_state

    def tail(self, hidden: Tensor, features: dict[str, Tensor], shift: Tensor | None = None) -> Tensor:
        """e = pool(T_L(hidden) - shift), shape (B, D); differentiable in `hidden`.

        `shift` is the reference's last-layer token embeddings in exact mode, None in approx mode.
        """
        with self._entering_at_layer(hidden):
            token_embeddings = self.auto_model(**features).last_hidden_state
        if shift is not None:
            token_embeddings = token_embeddings - shift
        out = {"token_embeddings": token_embeddings, "attention_mask": features["attention_mask"]}
        for module in self.post:
            out = module(out)
        return out["sentence_embedding"]
