"""The model families the engine splits at a layer: where each keeps its layer list, how to enter it at layer L.

    e(x) = tail(h(x)),  h(x) = hidden_states[L](x)   (docs/DESIGN.md §1)

`tail` runs the Hugging Face model's own forward with its layer list sliced to L..n-1 and the hidden states entering
layer L replaced by `h` (a forward pre-hook on layer L), so masks (padding, causal, sliding-window), rotary and
relative position terms and the layers' signatures stay the model's own. Three things in some families depend on
where the loop starts, and are set for the slice while inside it:

    config.layer_types        a per-layer list (ModernBERT's alternating local/global attention, Qwen3's
                              full/sliding layers) that some models index by the loop counter: sliced to [L:]
    encoder.conv              DeBERTa-v2's convolution after the first layer, over the encoder's input: off for L > 0;
                              at L = 0 the encoder's input is the one replaced
    config.use_cache          a decoder's key/value cache (Qwen3; sentence-transformers 6.0 leaves it on): off, as
                              nothing is generated; a cache made from the config has a slot per layer of the slice
                              while the layers keep their own indices, and under jvp it would keep every call's keys
                              and values with their tangents
    embeddings_project        ELECTRA's projection between embeddings and layer 0: the pre-hook on layer L is
                              after it, so nothing to do

One more is a matter of work, not of numbers: DeBERTa-v2's attention multiplies q and k by the projections of its
whole relative-position table (2 x position_buckets rows, 512 in v3) and then gathers the S x S entries the
sequence's relative positions index. Those are the rows span - m .. span + m (m = the largest |relative position|,
at most S - 1), so within the slice each attention reads only rows span - m - 1 .. span + m of the table, with its
span set to m + 1 (`narrow_relative_positions`): the same entries gathered, each the same dot product, at a width
of about 2S instead of 512. Under vmap over token tangents the full table was also copied once per tangent.

`input_of` runs a forward up to layer L and no further: h(x) is what layer L's pre-hook sees, the very input
`entered_at` replaces, and the layers from L on are not run for it.

Families are recognised by `config.model_type`; any other raises UnsupportedModelError naming the supported ones.
docs/MODELS.md lists them with what was tested for each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from torch import Tensor, nn

from .errors import UnsupportedModelError


@dataclass(frozen=True)
class Family:
    """One architecture family: its HF model_type, the name users know it by, where its layers live."""

    model_type: str
    name: str
    layers: str  # attribute path of the nn.ModuleList of layers, from the HF base model
    causal: bool = False  # decoder: causal attention (last-token pooling is the usual choice)


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("bert", "BERT (MiniLM, BGE, E5)", "encoder.layer"),
        Family("mpnet", "MPNet", "encoder.layer"),
        Family("roberta", "RoBERTa", "encoder.layer"),
        Family("xlm-roberta", "XLM-RoBERTa (multilingual E5, BGE-M3)", "encoder.layer"),
        Family("distilbert", "DistilBERT", "transformer.layer"),
        Family("deberta-v2", "DeBERTa-v2/v3", "encoder.layer"),
        Family("electra", "ELECTRA", "encoder.layer"),
        Family("modernbert", "ModernBERT (gte-modernbert, modernbert-embed)", "layers"),
        Family("gte", "GTE v1.5 / mGTE", "layers"),
        Family("nomic_bert", "Nomic BERT (nomic-embed-text)", "layers"),
        Family("qwen3", "Qwen3 (Qwen3-Embedding)", "layers", causal=True),
    )
}


def supported_families() -> str:
    """The supported families for an error message: 'BERT (MiniLM, BGE, E5) [bert], MPNet [mpnet], ...'."""
    return ", ".join(f"{f.name} [{f.model_type}]" for f in FAMILIES.values())


def family_of(auto_model: nn.Module) -> Family:
    """The family of a Hugging Face base model, by its config's model_type; UnsupportedModelError if not supported."""
    config = getattr(auto_model, "config", None)
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise UnsupportedModelError(
            f"{type(auto_model).__name__} (model_type {model_type!r}) is not a supported architecture; "
            f"supported are: {supported_families()}"
        )
    return family


def layer_list(auto_model: nn.Module, family: Family) -> tuple[nn.Module, str, nn.ModuleList]:
    """(owner, attribute, layers): the module holding the layer list, its attribute name, the list itself."""
    owner: nn.Module | None = auto_model
    *path, attr = family.layers.split(".")
    for name in path:
        owner = getattr(owner, name, None)
    layers = getattr(owner, attr, None) if owner is not None else None
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise UnsupportedModelError(
            f"{type(auto_model).__name__} has no layer list at `{family.layers}` (its family, {family.name}, keeps "
            "it there): a model of this family from remote code or another transformers version is laid out "
            "differently"
        )
    return owner, attr, layers  # type: ignore[return-value]


@contextlib.contextmanager
def entered_at(auto_model: nn.Module, family: Family, layer: int, hidden: Tensor) -> Iterator[None]:
    """Within: a forward of `auto_model` runs layers layer..n-1 only, the first of them on `hidden` (B, S, H)."""
    owner, attr, layers = layer_list(auto_model, family)
    first = layers[layer]

    def replace_input(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": hidden}
        return (hidden, *args[1:]), kwargs

    config = auto_model.config
    layer_types = getattr(config, "layer_types", None)
    slice_types = layer > 0 and isinstance(layer_types, list) and len(layer_types) == len(layers)
    encoder = getattr(auto_model, "encoder", None)
    # DeBERTa-v2's convolution adds the encoder's own input to layer 0's output: at layer 0 the encoder's input is
    # replaced (layer 0 and the convolution both read `hidden`); above it the convolution is behind the split (its
    # output is in `hidden`) and is switched off.
    has_conv = getattr(encoder, "conv", None) is not None
    conv = encoder.conv if has_conv and layer > 0 else None
    narrowed = relative_positions_narrowed(family, list(layers)[layer:])
    entered = encoder if has_conv and layer == 0 else first
    handle = entered.register_forward_pre_hook(replace_input, with_kwargs=True)
    setattr(owner, attr, nn.ModuleList(list(layers)[layer:]))
    if slice_types:
        config.layer_types = layer_types[layer:]
    if conv is not None:
        encoder.conv = None
    try:
        with narrowed, no_cache(config):
            yield
    finally:
        if conv is not None:
            encoder.conv = conv
        if slice_types:
            config.layer_types = layer_types
        setattr(owner, attr, layers)
        handle.remove()


class _Reached(Exception):
    """Raised by `input_of`'s pre-hook on layer L: the forward has computed what was asked for."""


def input_of(auto_model: nn.Module, family: Family, layer: int, features: dict[str, Tensor]) -> Tensor:
    """The hidden states entering layer `layer` (B, S, H) in a forward of `auto_model` on `features`, which stops
    there: layers layer..n-1 do not run."""
    _, _, layers = layer_list(auto_model, family)
    got: list[Tensor] = []

    def capture(module: nn.Module, args: tuple, kwargs: dict) -> None:
        got.append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])
        raise _Reached

    narrowed = relative_positions_narrowed(family, list(layers)[:layer])
    handle = layers[layer].register_forward_pre_hook(capture, with_kwargs=True)
    try:
        with narrowed, no_cache(auto_model.config):
            auto_model(**features)
    except _Reached:
        pass
    finally:
        handle.remove()
    if not got:
        raise UnsupportedModelError(f"{type(auto_model).__name__}'s forward did not reach layer {layer}")
    return got[0]


@contextlib.contextmanager
def no_cache(config) -> Iterator[None]:
    """Within: `config.use_cache` is False where the config has one (decoders), so a forward keeps no key/value
    cache."""
    if not hasattr(config, "use_cache"):
        yield
        return
    before = config.use_cache
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = before


def relative_positions_narrowed(family: Family, layers: list[nn.Module]) -> contextlib.AbstractContextManager[None]:
    """`narrow_relative_positions(layers)` for DeBERTa-v2, whose attention reads a relative-position table; nothing
    for every other family."""
    return narrow_relative_positions(layers) if family.model_type == "deberta-v2" else contextlib.nullcontext()


@contextlib.contextmanager
def narrow_relative_positions(layers: list[nn.Module]) -> Iterator[None]:
    """Within: DeBERTa-v2's disentangled attentions in `layers` read only the rows of the relative-position table
    that the call's relative positions index (module docstring).

    With span = pos_ebd_size and m = max |relative_pos| < span - 1, the attention's c2p and p2c indices are
    span + relative_pos and span - relative_pos, all within [span - m, span + m]: given the table's rows
    span - m - 1 .. span + m and a span of m + 1, the module's own code (its rows 0 .. 2m + 1, its indices
    m + 1 +- relative_pos, none clamped) gathers the same rows. Otherwise (m >= span - 1: the rows used reach the
    table's ends, where the module clamps) it runs unchanged.
    """
    handles = []
    spans: dict[nn.Module, int] = {}
    for module in (m for layer in layers for m in layer.modules()):
        span = getattr(module, "pos_ebd_size", None)
        if not (hasattr(module, "disentangled_attention_bias") and getattr(module, "relative_attention", False)
                and isinstance(span, int)):  # fmt: skip
            continue
        spans[module] = span

        def narrow(mod: nn.Module, args: tuple, kwargs: dict, span: int = span) -> tuple[tuple, dict] | None:
            rel, table = kwargs.get("relative_pos"), kwargs.get("rel_embeddings")
            mod.pos_ebd_size = span
            if rel is None or table is None or table.shape[-2] < 2 * span:
                return None
            m = int(rel.abs().max())
            if m + 1 >= span:
                return None
            mod.pos_ebd_size = m + 1
            return args, {**kwargs, "rel_embeddings": table[..., span - m - 1 : span + m + 1, :]}

        def restore(mod: nn.Module, args: tuple, output, span: int = span) -> None:
            mod.pos_ebd_size = span

        handles.append(module.register_forward_pre_hook(narrow, with_kwargs=True))
        handles.append(module.register_forward_hook(restore))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for module, span in spans.items():
            module.pos_ebd_size = span
