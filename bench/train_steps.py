"""The timed variants of the training benchmark and the training step each one runs.

Imported by ``bench.train_throughput`` (run ``python -m bench.train_throughput``); measures
nothing by itself. A variant is a model (``bench.train_models``) plus a setting: precision,
dropout placement, padding skip on or off, dropout module, and one of two training steps:

* **the trainer's step**: ``transformer_lib.training.train_step``, the one definition the
  trainer and chapter 6 use (generator on the real target tokens only, gradient clipping at
  the trainer's norm), with Adam fused as the trainer builds it;
* **the reference step** (:func:`reference_step`): a plain training loop's step as the
  Annotated Transformer writes it (generator on every position, the default Adam, no
  clipping; for the textbook model the loss by its definition). It is kept on purpose: it is
  what the package's step is compared against.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from bench.train_models import (
    BUILDERS,
    BenchConfig,
    every_position,
    fused_attention,
    nn_dropouts,
)
from transformer_lib.training import Batch, LabelSmoothing, smoothed_kl_by_definition, train_step
from transformer_lib.translation import Config
from transformer_lib.translation.data import PAD

TRAINER_CLIP_NORM = Config.clip_norm  # the trainer's default: the norm the trainer clips at


@dataclasses.dataclass(frozen=True)
class Variant:
    """One model + setting whose training step is timed (all through public knobs)."""

    builder: str  # "ours", "nn", "textbook" or "explicit_attention"
    precision: str = "fp32"  # or "bf16": autocast to bfloat16 for forward and generator
    paper_dropout: bool = False  # no dropout on attention weights / FFN hidden (paper, 5.4)
    # the trainer's step (see the module docstring); None: the builder's default, True for
    # ours/explicit_attention, False for nn and textbook (the reference step)
    trainer_step: bool | None = None
    # feed-forward blocks on the visible positions only (make_model's default); None: the
    # builder's default, True for ours/explicit_attention, False for nn and textbook
    skip_padding: bool | None = None
    # nn.Dropout in place of chapter 5's Dropout (its mask drawn by PyTorch's Bernoulli sampler)
    nn_dropout: bool = False
    # PyTorch's fused attention kernel in training too, dropout on the weights included (the
    # default before MultiHeadedAttention's rule; ours only)
    fused_attention: bool = False

    def _or_default(self, value: bool | None) -> bool:
        """An explicit setting, else the package's own behavior for ours/explicit_attention."""
        return value if value is not None else self.builder in ("ours", "explicit_attention")

    @property
    def uses_trainer_step(self) -> bool:
        """Whether the step is the trainer's (the generator then sees real tokens only)."""
        return self._or_default(self.trainer_step)

    @property
    def skips_padding(self) -> bool:
        """Whether the feed-forward blocks skip the padding positions."""
        return self._or_default(self.skip_padding)

    @property
    def uses_nn_dropout(self) -> bool:
        """Whether every dropout is PyTorch's ``nn.Dropout`` (always so for nn and textbook)."""
        return self.nn_dropout or self.builder in ("nn", "textbook")


BF16 = "bf16"
VARIANTS = {
    "ours_fp32": Variant("ours"),
    "ours_fp32_no_padding_skip": Variant("ours", skip_padding=False),
    "ours_fp32_nn_dropout": Variant("ours", nn_dropout=True),
    "nn_transformer_fp32": Variant("nn"),
    "nn_transformer_fp32_trainer_step": Variant("nn", trainer_step=True),
    "textbook_fp32": Variant("textbook"),
    "textbook_fp32_paper_dropout": Variant("textbook", paper_dropout=True),
    "explicit_attention_fp32": Variant("explicit_attention"),
    "ours_fp32_fused_attention": Variant("ours", fused_attention=True),
    "ours_bf16": Variant("ours", BF16),
    "nn_transformer_bf16": Variant("nn", BF16),
    "ours_bf16_fused_attention": Variant("ours", BF16, fused_attention=True),
    "ours_fp32_paper_dropout": Variant("ours", paper_dropout=True),
    "nn_transformer_fp32_paper_dropout": Variant("nn", paper_dropout=True),
    "ours_bf16_paper_dropout": Variant("ours", BF16, paper_dropout=True),
    "ours_bf16_paper_dropout_no_padding_skip": Variant(
        "ours", BF16, paper_dropout=True, skip_padding=False
    ),
    "ours_bf16_paper_dropout_nn_dropout": Variant(
        "ours", BF16, paper_dropout=True, nn_dropout=True
    ),
    "nn_transformer_bf16_paper_dropout": Variant("nn", BF16, paper_dropout=True),
}
# The trainer's `fast = true` (CLI `--fast`): bf16 autocast and the paper's dropout placement.
FAST_SETTING = "ours_bf16_paper_dropout"
DEFAULT_VARIANTS = {
    "small": list(VARIANTS),
    "base": [
        "ours_fp32",
        "ours_fp32_no_padding_skip",
        "ours_fp32_nn_dropout",
        "nn_transformer_fp32",
        "nn_transformer_fp32_trainer_step",
        "textbook_fp32",
        "explicit_attention_fp32",
        "ours_fp32_fused_attention",
        "ours_bf16",
        "nn_transformer_bf16",
        "ours_bf16_fused_attention",
        "ours_fp32_paper_dropout",
        "nn_transformer_fp32_paper_dropout",
        "textbook_fp32_paper_dropout",
        "ours_bf16_paper_dropout",
    ],
    "tiny": list(VARIANTS),
}

Step = Callable[[Batch], float]  # one optimizer update on a batch; returns the loss per token


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def kl_by_definition(logp: torch.Tensor, target: torch.Tensor, crit: LabelSmoothing):
    """Chapter 6's definition: the dense (N, V) smoothed target, then the safe KL sum."""
    return smoothed_kl_by_definition(logp, crit.target_distribution(target, logp.dtype))


def reference_step(
    model: nn.Module,
    cfg: BenchConfig,
    device: torch.device,
    precision: str = "fp32",
    *,
    dense_loss: bool = False,
) -> Step:
    """The reference the package's step is compared against: a plain training loop's step.

    As the Annotated Transformer writes it: forward, the generator on every position (padding
    included), chapter 6's ``LabelSmoothing`` on the fp32 log-probabilities (with
    ``dense_loss``, the loss by its definition, :func:`kl_by_definition`), backward of the loss
    per token, PyTorch's default Adam, no gradient clipping. ``precision="bf16"`` runs forward
    and generator under bf16 autocast.
    """
    model.train()
    criterion = LabelSmoothing(cfg.vocab, PAD, cfg.smoothing).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(b: Batch) -> float:
        with _autocast(device, precision):
            out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)  # (B, T, d_model)
            logp = model.generator(out)  # (B, T, vocab)
        logp, y = logp.float().reshape(-1, logp.size(-1)), b.tgt_y.reshape(-1)
        loss = kl_by_definition(logp, y, criterion) if dense_loss else criterion(logp, y)
        loss = loss / float(b.ntokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # .item() also waits for an asynchronous device

    return step


def package_step(
    model: nn.Module,
    cfg: BenchConfig,
    device: torch.device,
    precision: str = "fp32",
    *,
    clip_norm: float | None = TRAINER_CLIP_NORM,
) -> Step:
    """The trainer's step: ``transformer_lib.training.train_step`` on one batch.

    With Adam as the trainer builds it (``fused``: one kernel updates every parameter) and
    the trainer's gradient clipping. Returns the loss per real target token.
    """
    model.train()
    criterion = LabelSmoothing(cfg.vocab, PAD, cfg.smoothing).to(device)
    opt = torch.optim.Adam(
        model.parameters(),
        lr=1e-4,
        betas=(0.9, 0.98),
        eps=1e-9,
        fused=device.type in ("cpu", "cuda") or None,
    )

    def step(b: Batch) -> float:
        loss, ntokens = train_step(
            model, [b], criterion, opt, precision=precision, clip_norm=clip_norm
        )
        return loss / ntokens

    return step


def build_variant(
    name: str, cfg: BenchConfig, device: torch.device, compile: bool = False
) -> tuple[nn.Module, Step]:
    """(model, step function) of a named variant; ``compile`` wraps the model in torch.compile."""
    v = VARIANTS[name]
    model = BUILDERS[v.builder](cfg, device, paper_dropout=v.paper_dropout)
    if not v.skips_padding:
        every_position(model)
    if v.nn_dropout:
        nn_dropouts(model)
    if v.fused_attention:
        fused_attention(model, 3 * cfg.N)
    runner = model
    if compile:
        runner = torch.compile(model)  # `runner.generator` reaches the (uncompiled) generator
    if v.uses_trainer_step:
        return model, package_step(runner, cfg, device, v.precision)
    dense = v.builder == "textbook"
    return model, reference_step(runner, cfg, device, v.precision, dense_loss=dense)
