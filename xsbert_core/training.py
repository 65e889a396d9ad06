"""Fine-tuning the paper's model variants (EACL 2024, Table 1) with sentence-transformers' trainer.

    tuned  unmodified architecture        f = cos(e(a), e(b))      CosineSimilarityLoss
    exact  embedding shift, T(x) - T(r)    f = cos(e(a), e(b))      CosineSimilarityLoss   e(r) = 0
    orig   embedding shift + dot product   f = e(a) . e(b)          DotProductMSELoss      e(r) = 0   (losses.py)

Labels are similarities in [0, 1] (STS-B scores / 5). The hyper-parameters default to the paper's
(App. A): batch 16, 5 epochs, AdamW, weight decay 0.1, lr 2e-5, linear warm-up over 10% of the training steps
(App. A: "taking 10% of the data for linear warm-up"; the authors' public train.py, lucasmllr/xsbert, warms up over
ceil(steps per epoch x epochs x 0.1) steps: 180 of STS-B's 1,800), MSE loss (App. B; ours: CosineSimilarityLoss,
the MSE of the cosine against label / 5, which the paper does not name). App. A states no checkpoint rule: the saved
model is the last epoch (CHECKPOINTS[0]); the epoch with the best dev score is kept beside it as our option, not the
paper's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError, UnsupportedModelError
from .models import transformers_bars

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch import nn

logger = logging.getLogger(__name__)

VARIANTS: tuple[str, ...] = ("tuned", "exact", "orig")
VARIANT_SIMILARITY = {"tuned": "cosine", "exact": "cosine", "orig": "dot"}
# Which epoch a trained model is: the last (App. A states no rule, so the recipe's training as it ends), or the one with
# the best dev score (ours: an option, not the paper's).
CHECKPOINTS: tuple[str, ...] = ("last-epoch", "best-dev")
MIN_DEV_PAIRS = 2  # the dev Spearman, evaluated each epoch, is undefined on fewer
MODELS_DIR = "models"  # where jobs.train saves the models (--out) and jobs.evaluate looks for them (--models)
# A trained model's folder holds its last epoch; the best-dev epoch is saved beside it, in <folder> + BEST_SUFFIX.
BEST_SUFFIX = f"-{CHECKPOINTS[1]}"
# The training record in a saved model folder (jobs.train writes it: data, variant, hyper-parameters, dev score,
# weights' sha256); its model_id marks a folder a study trained (jobs.trained).
TRAINING_RECORD = "xsbert_training.json"
# cuBLAS's setting for reproducible results (PyTorch's notes on randomness); read when a process first uses cuBLAS.
CUBLAS_DETERMINISTIC = ":4096:8"


def base_name(model: str | Path) -> str:
    """A model's short name, what its trained variants' folders are named after (<base name>-<variant>): the last
    part of its folder or hub id (sentence-transformers/all-MiniLM-L6-v2 -> all-MiniLM-L6-v2)."""
    return Path(str(model)).name or str(model)


def checkpoint_folder(folder: Path, checkpoint: str) -> Path:
    """Where a trained model's `checkpoint` is saved: the last epoch in `folder` itself, the best dev epoch beside it
    in <folder> + BEST_SUFFIX."""
    if checkpoint not in CHECKPOINTS:
        raise InputError(f"checkpoint {checkpoint!r}: expected one of {', '.join(CHECKPOINTS)}")
    return folder if checkpoint == CHECKPOINTS[0] else folder.with_name(folder.name + BEST_SUFFIX)


@dataclass(frozen=True)
class TrainConfig:
    """The paper's hyper-parameters (App. A), the seed, and whether the run is deterministic; `max_steps` > 0 caps
    training (tests). `deterministic`: PyTorch's deterministic algorithms (warn-only where an op has none) and
    cuBLAS's fixed workspace, so that the same recipe on the same hardware and software gives the same weights
    bit for bit; not the paper's setting (it changes no expected value, only the summation order)."""

    epochs: float = 5
    batch_size: int = 16
    learning_rate: float = 2e-5
    weight_decay: float = 0.1
    warmup_ratio: float = 0.1
    seed: int = 0
    max_steps: int = -1
    deterministic: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "optimizer": "AdamW", "scheduler": "linear warm-up, then linear decay"}


@dataclass(frozen=True)
class TrainData:
    """The pairs a variant is fine-tuned on (§4.2: STS-B train; labels / 5 ours) and scored on after each epoch (dev):
    a dataset as the jobs' loaders take it (`stsb`, the bundled copy, or a file with a split column), its two splits,
    and the first N pairs of each only (smoke tests). The defaults of jobs.train's flags, a study's `train` block and
    jobs.trained.TrainSpec."""

    dataset: str = "stsb"
    train_split: str = "train"
    dev_split: str = "dev"
    train_limit: int | None = None
    dev_limit: int | None = None


@dataclass(frozen=True)
class TrainProgress:
    """Where a training is: `step` of `max_steps` optimizer steps, `epoch` (fractional), `seconds` since its first
    step began, and the last logged training `loss` and dev Spearman. The time left is the rate so far times the
    steps left: eta_s = seconds / step x (max_steps - step)."""

    step: int
    max_steps: int
    epoch: float
    seconds: float
    loss: float | None = None
    dev_spearman: float | None = None

    @property
    def eta_s(self) -> float | None:
        if self.step <= 0 or self.max_steps <= 0:
            return None
        return self.seconds / self.step * max(0, self.max_steps - self.step)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "eta_s": self.eta_s}

    def __str__(self) -> str:
        line = f"step {self.step}/{self.max_steps} (epoch {self.epoch:.2f}), {self.seconds:.0f} s"
        if self.eta_s is not None:
            line += f", ~{self.eta_s:.0f} s left"
        if self.loss is not None:
            line += f", loss {self.loss:.4g}"
        if self.dev_spearman is not None:
            line += f", dev Spearman {self.dev_spearman:.4f}"
        return line


# Named recipes (a study config's `recipe: paper`); each is the TrainConfig it names.
RECIPES: dict[str, TrainConfig] = {"paper": TrainConfig()}


def _progress_callback(on_progress: Callable[[TrainProgress], None] | None,
                       on_step: Callable[[TrainProgress], None] | None, evaluator):  # fmt: skip
    """A transformers TrainerCallback that passes a TrainProgress to on_progress at the start, at each log and each
    evaluation (the evaluator's metric name gains its prefix when it first runs: read at each log), and to on_step
    after every optimizer step."""
    import time

    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        t0 = 0.0
        loss: float | None = None
        dev: float | None = None

        def now(self, state) -> TrainProgress:
            return TrainProgress(step=int(state.global_step), max_steps=int(state.max_steps),
                                 epoch=float(state.epoch or 0.0), seconds=time.perf_counter() - self.t0,
                                 loss=self.loss, dev_spearman=self.dev)  # fmt: skip

        def report(self, state) -> None:
            if on_progress is not None:
                on_progress(self.now(state))

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()
            self.report(state)

        def on_step_end(self, args, state, control, **kwargs):
            if on_step is not None:
                on_step(self.now(state))

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            self.loss = float(logs["loss"]) if "loss" in logs else self.loss
            dev_key = f"eval_{evaluator.primary_metric}"
            self.dev = float(logs[dev_key]) if dev_key in logs else self.dev
            self.report(state)

    return Progress()


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True):
    """PyTorch's deterministic algorithms (warn-only), cuDNN's deterministic mode and cuBLAS's fixed workspace while
    the block runs, restored after. transformers' enable_full_determinism does the same but also sets
    CUDA_LAUNCH_BLOCKING, which makes every kernel launch synchronous (a launch-bound training several times
    slower). CUBLAS_WORKSPACE_CONFIG counts only in a process whose cuBLAS starts after it is set."""
    if not enabled:
        yield
        return
    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              os.environ.get("CUBLAS_WORKSPACE_CONFIG"))  # fmt: skip
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        if before[4] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[4]


def build_variant(model: SentenceTransformer, variant: str) -> SentenceTransformer:
    """The untrained variant of `model`, in place: tuned unchanged, exact shifted, orig shifted + dot.

    Raises InputError for an unknown variant and UnsupportedModelError for a model the shift cannot wrap.
    """
    from .shift import is_shifted, shifted  # here: a study's training settings are read without sentence-transformers

    if variant not in VARIANTS:
        raise InputError(f"Unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    if is_shifted(model):
        raise UnsupportedModelError("the base model is already reference-shifted: start from an unshifted model")
    if variant in ("exact", "orig"):
        shifted(model, drop_normalize=variant == "orig")
    model.similarity_fn_name = VARIANT_SIMILARITY[variant]
    return model


def variant_loss(model: SentenceTransformer, variant: str) -> nn.Module:
    """CosineSimilarityLoss for tuned/exact, DotProductMSELoss for orig."""
    from sentence_transformers.sentence_transformer.losses import CosineSimilarityLoss

    from .losses import DotProductMSELoss

    return DotProductMSELoss(model) if variant == "orig" else CosineSimilarityLoss(model)


def pairs_dataset(texts_a: Sequence[str], texts_b: Sequence[str], labels: Sequence[float]):
    """A `datasets.Dataset` with columns sentence1, sentence2, score (the trainer's input layout)."""
    from datasets import Dataset

    if not (len(texts_a) == len(texts_b) == len(labels)) or not len(labels):
        raise InputError(f"need equally many texts and labels, at least one (got {len(texts_a)}, {len(texts_b)}, "
                         f"{len(labels)})")  # fmt: skip
    bad = [x for x in labels if not (isinstance(x, (int, float)) and math.isfinite(x))]
    if bad:
        raise InputError(f"{len(bad)} labels are not finite numbers (first: {bad[0]!r})")
    columns = {"sentence1": list(texts_a), "sentence2": list(texts_b), "score": [float(x) for x in labels]}
    return Dataset.from_dict(columns)


def dev_evaluator(dev, variant: str, name: str = "sts-dev"):
    """Spearman of the variant's similarity against the dev labels (sentence-transformers' evaluator)."""
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    return EmbeddingSimilarityEvaluator(
        dev["sentence1"], dev["sentence2"], dev["score"], main_similarity=VARIANT_SIMILARITY[variant],
        similarity_fn_names=[VARIANT_SIMILARITY[variant]], name=name, write_csv=False,
    )  # fmt: skip


def fine_tune(
    model: SentenceTransformer,
    variant: str,
    train,
    dev,
    config: TrainConfig,
    work_dir: str,
    progress: bool = True,
    on_progress: Callable[[TrainProgress], None] | None = None,
    on_step: Callable[[TrainProgress], None] | None = None,
) -> dict[str, Any]:
    """Train `model` (already `build_variant`-ed) on `train`, evaluating on `dev` every epoch; `model` ends as the
    last epoch left it.

    Returns {"dev_spearman": final dev Spearman, "history": [{epoch, step, dev_spearman, loss?}, ...],
    "steps": optimizer steps, "best": the epoch with the highest dev Spearman (the first of ties) as {"epoch",
    "step", "dev_spearman", "checkpoint": its model folder under `work_dir`}, or None when no epoch was evaluated
    (--max-steps)}. Every epoch is saved under `work_dir` (the trainer's checkpoints, model weights only), so the
    last epoch (the model) and the best-dev epoch (our option; App. A states no rule) can both be kept.
    `on_progress(TrainProgress)`: at the start, at every logged step (every 50) and after every dev evaluation;
    `on_step(TrainProgress)`: after every optimizer step (what either raises ends the training, and fine_tune with it).
    """
    import torch
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    class Trainer(SentenceTransformerTrainer):
        def add_model_card_callback(self, default_args_dict: dict[str, Any]) -> None:
            """None: the trained model's card is jobs.train's own (saved with create_model_card=False), and the
            callback's widget examples draw a progress bar of their own, even with disable_tqdm (sentence-transformers
            documents overriding this method to drop the callback)."""

    evaluator = dev_evaluator(dev, variant)
    per_epoch = config.max_steps <= 0
    args = SentenceTransformerTrainingArguments(
        output_dir=work_dir,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        per_device_eval_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_ratio,  # transformers >= 5: a float in (0, 1) is the warm-up ratio
        lr_scheduler_type="linear",
        optim="adamw_torch",
        seed=config.seed,
        data_seed=config.seed,
        eval_strategy="epoch" if per_epoch else "no",
        save_strategy="epoch" if per_epoch else "no",
        save_only_model=True,  # the model of each epoch, no optimizer state
        logging_strategy="steps",
        logging_steps=50 if config.max_steps <= 0 else max(1, min(50, config.max_steps)),
        report_to="none",
        disable_tqdm=not progress,
        use_cpu=not torch.cuda.is_available(),
        dataloader_drop_last=False,
    )
    with deterministic_algorithms(config.deterministic), transformers_bars(progress):
        trainer = Trainer(
            model=model, args=args, train_dataset=train, loss=variant_loss(model, variant), evaluator=evaluator,
            callbacks=[_progress_callback(on_progress, on_step, evaluator)] if on_progress or on_step else None,
        )
        if not progress:  # without the bar the trainer prints each log's dict instead: quiet means neither
            from transformers.trainer_callback import PrinterCallback

            trainer.remove_callback(PrinterCallback)
        output = trainer.train()
    final = evaluator(model)
    key = evaluator.primary_metric
    history = [
        {k: v for k, v in entry.items() if k in ("epoch", "step", "loss", f"eval_{key}")}
        for entry in trainer.state.log_history
        if "loss" in entry or f"eval_{key}" in entry
    ]
    evaluated = [h for h in history if f"eval_{key}" in h]
    best = None
    if evaluated:
        top = max(evaluated, key=lambda h: h[f"eval_{key}"])  # max keeps the first of equal scores
        best = {"epoch": float(top["epoch"]), "step": int(top["step"]), "dev_spearman": float(top[f"eval_{key}"]),
                "checkpoint": str(Path(work_dir) / f"checkpoint-{int(top['step'])}")}  # fmt: skip
    return {"dev_spearman": float(final[key]), "metric": key, "history": history, "steps": int(output.global_step),
            "best": best}
