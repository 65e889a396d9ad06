"""A sentence-transformers model split at layer L.

    h(x) = hidden_states[L](x)             the S x H states entering layer L
    e(x) = tail(h(x))                      layers L..n-1, then pooling (+ Dense), no Normalize
    exact mode:  e(x) = pool(T(x) - T(r))  token embeddings of the reference subtracted, so e(r) = 0
                                           (a ShiftedTransformer model computes the same in its forward)

`tail` re-enters the HF model at layer L (xsbert_core.families: the layer list sliced to L..n-1, the input of
layer L replaced by `h`), so masks (padding, causal, sliding-window), position terms (absolute, relative, rotary)
and layer signatures stay the model's own. Any pooling sentence-transformers has (mean, cls, max, lasttoken,
weightedmean, mean_sqrt_len_tokens, and their concatenations) is the model's own Pooling module.

Prompts (instruction prefixes, `prompt + text` as sentence-transformers encodes them) are part of the input. By
default their tokens are attributed like any other: the reference replaces them with the pad token. With
`exclude_prompt` the reference keeps them (as it keeps [CLS]/[SEP]) and the path holds them at their own hidden
states, h(start)[prompt] = h(x)[prompt], so Delta is 0 there and they receive no attribution: their columns of P are
exactly 0 and are dropped.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from sentence_transformers import SentenceTransformer
from torch import Tensor

from .errors import InputError, TruncationError, UnsupportedModelError, check_text
from .families import Family, entered_at, family_of, input_of, layer_list
from .precision import tf32_matmuls
from .references import pad_token_id, reference_ids
from .settings import MODES, TRUNCATION_POLICIES
from .shift import is_shifted, outer_reference_ids

logger = logging.getLogger(__name__)

Mode = Literal["approx", "exact"]
Truncation = Literal["warn", "error"]

# A text that checks, when a split model is made, that entering the model at layer L reproduces its own embedding
# (long enough for ModernBERT's and Qwen3's sliding windows to matter).
PROBE_TEXT = "The probe checks that the split model computes the same embedding as the model itself, token by token."
# Relative difference allowed between the split model's e(x) and the model's own (float32; a few ulps of the sums).
PROBE_RTOL = 1e-4


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
    """A padded batch of tokenized texts and their references, all (B, S), padded on the right.

    `texts` are what the model reads: `prompt + text` when a prompt is given. `prompt_mask` marks the prompt's tokens
    (all False without a prompt); `prompt_length` is what sentence-transformers' Pooling takes to leave a prompt out
    of the pooling (its `include_prompt=False`): the prompt's own token count less a trailing special token.
    """

    texts: list[str]
    features: dict[str, Tensor]  # input_ids, attention_mask[, token_type_ids]: what the HF model takes
    reference_ids: Tensor
    lengths: list[int]
    truncated: list[bool]
    tokens: list[list[str]]
    word_ids: list[list[int | None]]
    offsets: list[list[tuple[int, int]]]
    prompt_mask: Tensor | None = None  # (B, S) bool
    prompt: str = ""
    prompt_length: int | None = None
    exclude_prompt: bool = False

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
            prompt_mask=self.prompt_mask[idx.to(self.prompt_mask.device), :s] if self.prompt_mask is not None else None,
            prompt=self.prompt,
            prompt_length=self.prompt_length,
            exclude_prompt=self.exclude_prompt,
        )


def resolve_layer(layer: int, n_layers: int, name: str = "layer") -> int:
    """`layer` as an index 0..n_layers - 1 (negative: from the top, -1 the last); an InputError of one line, the
    layer called `name`, when the model has no such layer."""
    resolved = layer + n_layers if layer < 0 else layer
    if not 0 <= resolved < n_layers:
        raise InputError(f"{name} {layer} is out of range for a model with {n_layers} layers "
                         f"(valid: 0..{n_layers - 1}, or -{n_layers}..-1 from the top)")
    return resolved


class SplitModel:
    """`model` split at layer `layer` (negative counts from the top: -1 is the last layer's input)."""

    def __init__(self, model: SentenceTransformer, layer: int, mode: Mode = "approx", check: bool = True) -> None:
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
        self.family: Family = family_of(auto_model)
        _, _, self._layers = layer_list(auto_model, self.family)
        self.n_layers = len(self._layers)
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise InputError(f"layer must be an integer, got {layer!r}")
        self.layer = resolve_layer(layer, self.n_layers)
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
        if mode == "exact":
            self._check_zero_reference()
        self._ensure_forward_ad()
        if check:
            self._check_entering()

    # ------------------------------------------------------------------ checks
    def _check_zero_reference(self) -> None:
        """Exact mode's e(r) = post(pool(T(r) - T(r))) must be 0: every module after the transformer maps zero token
        embeddings to a zero embedding (pooling does; a Dense layer with a bias or a non-odd activation does not)."""
        zeros = torch.zeros(1, 3, self.hidden_size, dtype=self.dtype, device=self.device)
        mask = torch.ones(1, 3, dtype=torch.long, device=self.device)
        out: dict = {"token_embeddings": zeros, "attention_mask": mask}
        for module in self.post:
            with torch.no_grad():
                out = module(dict(out))
            value = out.get("sentence_embedding", out.get("token_embeddings"))
            if value is not None and torch.any(value != 0):
                raise UnsupportedModelError(
                    f"exact mode needs e(r) = 0 (the shifted token embeddings of the reference are 0), but the "
                    f"model's {type(module).__name__} module maps zero to a nonzero embedding (a bias or a non-odd "
                    "activation): use mode 'approx'"
                )

    def _ensure_forward_ad(self) -> None:
        """Forward-mode AD through the model's attention kernel, else the eager kernel (saying so).

        Fused kernels (SDPA, flash attention) have no forward-mode rule in torch: one JVP through layer L on a tiny
        input tells; on NotImplementedError the model is switched to eager attention in place (the same numbers; a
        slower forward) and a warning names the kernel.
        """
        impl = getattr(self.auto_model.config, "_attn_implementation", None) or "eager"
        if impl == "eager":
            return
        feats = self._features(self.tokenizer(["forward mode"], return_tensors="pt"))
        try:
            with torch.no_grad():
                h, _ = self.hidden(feats)
                torch.func.jvp(lambda x: self.tail(x, feats), (h,), (torch.ones_like(h),))
            return
        except (NotImplementedError, RuntimeError) as exc:
            reason = str(exc).splitlines()[0][:160]
        set_impl = getattr(self.auto_model, "set_attn_implementation", None)
        if set_impl is None:
            raise UnsupportedModelError(
                f"attention implementation {impl!r} has no forward-mode AD ({reason}); load the model with "
                "model_kwargs={'attn_implementation': 'eager'}"
            )
        set_impl("eager")
        warnings.warn(
            f"{self.family.name}: attention implementation {impl!r} cannot take forward-mode AD ({reason}); "
            "switched the model to 'eager' attention",
            stacklevel=3,
        )

    def _check_entering(self) -> None:
        """tail(h_L(x)) equals the model's own embedding of x (approx mode's e), and tail(h_L(r)) with x's features
        (the path's start, as the engine computes it) the model's own embedding of the reference r: entering at layer
        L changed nothing at either end of the path.

        Catches a family whose forward depends on where its layer loop starts, or reads the input ids outside the
        layer loop, in a way xsbert_core.families does not handle (for instance after a transformers upgrade): a
        clear error instead of wrong attributions.
        """
        if self.dtype != torch.float32:
            return
        enc = self.tokenizer([PROBE_TEXT], truncation=True, max_length=self.max_seq_length, return_tensors="pt",
                             return_special_tokens_mask=True)  # fmt: skip
        feats = self._features(enc)
        ref = {**feats, "input_ids": reference_ids(feats["input_ids"], enc["special_tokens_mask"].to(self.device),
                                                   feats["attention_mask"], self.pad_id)}  # fmt: skip
        with torch.no_grad(), tf32_matmuls(False):
            own_x, own_r = self._own_embedding(feats), self._own_embedding(ref)
            split_x = self.tail(self.hidden(feats)[0], feats)
            split_r = self.tail(self.hidden(ref)[0], feats)
        if not all(torch.isfinite(e).all() for e in (own_x, own_r, split_x, split_r)):
            return  # a model that makes NaN/Inf: the attributions say so (NumericalError), not this check
        scale = own_x.norm().clamp_min(1e-30)
        for end, split, own in (("embedding", split_x, own_x), ("reference's embedding", split_r, own_r)):
            err = float((split - own).norm() / scale)
            if not err <= PROBE_RTOL:
                raise UnsupportedModelError(
                    f"{type(self.auto_model).__name__} split at layer {self.layer} does not reproduce the model's own "
                    f"{end} (relative difference {err:.1e}): its forward depends on where the layer loop starts in a "
                    f"way the engine does not handle for {self.family.name}"
                )

    def _own_embedding(self, features: dict[str, Tensor]) -> Tensor:
        """The model's own sentence embedding of `features` (its forward, then the modules after the transformer
        without a trailing Normalize): what `tail` must reproduce."""
        out = self.auto_model(**features).last_hidden_state
        own = {"token_embeddings": out, "attention_mask": features["attention_mask"]}
        for module in self.post:
            own = module(own)
        return own["sentence_embedding"]

    def _features(self, enc) -> dict[str, Tensor]:
        return {k: enc[k].to(self.device) for k in self._model_inputs if k in enc}

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
    def prompt_length(self, prompt: str) -> int:
        """sentence-transformers' prompt length: the prompt's own tokens, less a trailing special token."""
        ids = self.tokenizer([prompt], truncation=True, max_length=self.max_seq_length)["input_ids"][0]
        return len(ids) - (1 if ids and ids[-1] in self.tokenizer.all_special_ids else 0)

    def tokenize(
        self,
        texts: list[str],
        truncation: Truncation = "warn",
        prompt: str | None = None,
        exclude_prompt: bool = False,
    ) -> TokenBatch:
        """Tokenize like the model does, flag (or reject) texts over max_seq_length, build references.

        With a prompt the model reads `prompt + text` (as sentence-transformers' encode(prompt=...)); the prompt's
        tokens are the non-special tokens that end within the prompt's characters. Padding is on the right whatever
        the tokenizer's side (a decoder's left padding gives the same embeddings: the masks hide the pads, rotary
        attention depends on position differences only).
        """
        if truncation not in TRUNCATION_POLICIES:
            raise InputError(f"Unknown truncation policy {truncation!r}; valid: {', '.join(TRUNCATION_POLICIES)}")
        if prompt is not None and not isinstance(prompt, str):
            raise InputError(f"A prompt must be a string, got {type(prompt).__name__}")
        prompt = prompt or ""
        if exclude_prompt and self.mode == "exact" and prompt:
            raise InputError(
                "exclude_prompt holds the prompt's hidden states fixed along the path, so the path starts at a point "
                "whose embedding is not 0: exact mode's e(r) = 0 (sum A -> f(a, b)) cannot hold. Use mode 'approx', "
                "or attribute the prompt"
            )
        for text in texts:
            check_text(text)
        inputs = [prompt + text for text in texts]
        # untruncated on purpose, to measure: the tokenizer's too-long warning (verbose) would say it twice
        full_lengths = [len(ids) for ids in self.tokenizer(inputs, truncation=False, verbose=False)["input_ids"]]
        truncated = [n > self.max_seq_length for n in full_lengths]
        for text, n, cut in zip(texts, full_lengths, truncated):
            if cut and truncation == "error":
                raise TruncationError(
                    f"Text of {n} tokens exceeds max_seq_length={self.max_seq_length}: {text[:60]!r}..."
                )
            if cut:
                logger.warning("Truncating a text of %d tokens to max_seq_length=%d", n, self.max_seq_length)
        enc = self.tokenizer(
            inputs,
            padding=True,
            padding_side="right",
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="pt",
            return_special_tokens_mask=True,
            return_offsets_mapping=True,
        )
        mask = enc["attention_mask"]
        special = enc["special_tokens_mask"].bool() & mask.bool()
        ends = enc["offset_mapping"][..., 1]
        prompt_mask = mask.bool() & ~special & (ends <= len(prompt)) if prompt else torch.zeros_like(special)
        # No content: only zero-width or control characters that the tokenizer drops (WordPiece, SentencePiece; a
        # byte-level BPE, as ModernBERT's and Qwen3's, keeps their bytes as tokens, which are attributed), or only
        # special-token strings ("[CLS] [SEP]", "<s></s>") and whitespace. Then e(x) = e(r) up to the specials'
        # positions: nothing to attribute.
        for b, (text, n) in enumerate(zip(inputs, mask.sum(-1).tolist())):
            keep = (~prompt_mask[b, :n]).tolist()
            ids = [i for i, k in zip(enc["input_ids"][b, :n].tolist(), keep) if k]
            offsets = [o for o, k in zip(enc["offset_mapping"][b, :n].tolist(), keep) if k]
            if content_count(text, ids, offsets, self.control_ids) == 0:
                raise InputError(
                    f"Text {text[len(prompt):][:60]!r} has no tokens but special ones (or whitespace) after "
                    f"tokenization ({' '.join(self.tokenizer.convert_ids_to_tokens(ids))}): nothing to attribute"
                )
        features = self._features(enc)
        lengths = mask.sum(-1).tolist()
        kept = enc["special_tokens_mask"] | (prompt_mask.long() if exclude_prompt else 0)
        ref = reference_ids(enc["input_ids"], kept, mask, self.pad_id)
        if self.shifted and not torch.equal(ref, outer_reference_ids(enc["input_ids"], mask, self.pad_id)):
            # The model's own shift keeps the first and last token; the engine keeps the added specials.
            raise UnsupportedModelError(
                "the tokenizer adds special tokens other than one at each end, so the model's embedding shift "
                "and the engine's reference differ"
            )
        ref = ref.to(self.device)
        return TokenBatch(
            texts=inputs,
            features=features,
            reference_ids=ref,
            lengths=lengths,
            truncated=truncated,
            tokens=[self.tokenizer.convert_ids_to_tokens(enc["input_ids"][b, :n]) for b, n in enumerate(lengths)],
            word_ids=[enc.word_ids(b)[:n] for b, n in enumerate(lengths)],
            offsets=[[tuple(o) for o in enc["offset_mapping"][b, :n].tolist()] for b, n in enumerate(lengths)],
            prompt_mask=prompt_mask.to(self.device),
            prompt=prompt,
            prompt_length=self.prompt_length(prompt) if prompt else None,
            exclude_prompt=bool(exclude_prompt and prompt),
        )

    def content_counts(self, texts: list[str], prompt: str = "") -> list[int]:
        """Content tokens per text, untruncated (`content_count`): 0 is a text `tokenize` rejects as no content."""
        return self.token_counts(texts, prompt)[1]

    def token_counts(self, texts: list[str], prompt: str = "") -> tuple[list[int], list[int]]:
        """(tokens, content tokens) per text, untruncated, from one tokenizer call: tokens count the special ones and
        the prompt's (what max_seq_length bounds), content tokens are `content_count`'s of the text's own tokens."""
        inputs = [prompt + text for text in texts]
        enc = self.tokenizer(inputs, truncation=False, return_offsets_mapping=True, verbose=False)
        ids_all, offsets_all = enc["input_ids"], enc["offset_mapping"]
        cut = len(prompt)
        counts = []
        for text, ids, offsets in zip(inputs, ids_all, offsets_all):
            own = [(i, o) for i, o in zip(ids, offsets) if not prompt or o[1] > cut]
            counts.append(content_count(text, [i for i, _ in own], [o for _, o in own], self.control_ids))
        return [len(ids) for ids in ids_all], counts

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def hidden(self, features: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(h, T): hidden states entering layer L and the last layer's token embeddings, (B, S, H)."""
        out = self.auto_model(**features, output_hidden_states=True)
        return out.hidden_states[self.layer], out.last_hidden_state

    @torch.no_grad()
    def entering(self, features: dict[str, Tensor]) -> Tensor:
        """h: the hidden states entering layer L, (B, S, H), from a forward that stops there (families.input_of)."""
        return input_of(self.auto_model, self.family, self.layer, features)

    def tail(
        self, hidden: Tensor, features: dict[str, Tensor], shift: Tensor | None = None, prompt_length: int | None = None
    ) -> Tensor:
        """e = pool(T_L(hidden) - shift), shape (B, D); differentiable in `hidden`.

        `shift` is the reference's last-layer token embeddings in exact mode, None in approx mode. `prompt_length`
        goes to the pooling (which leaves the prompt out when the model's Pooling says include_prompt=False).
        """
        with entered_at(self.auto_model, self.family, self.layer, hidden):
            token_embeddings = self.auto_model(**features).last_hidden_state
        if shift is not None:
            token_embeddings = token_embeddings - shift
        out = {"token_embeddings": token_embeddings, "attention_mask": features["attention_mask"]}
        if prompt_length:
            out["prompt_length"] = prompt_length
        for module in self.post:
            out = module(out)
        return out["sentence_embedding"]
