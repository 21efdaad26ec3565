"""Training throughput of transformer_lib against torch.nn.Transformer and the textbook path.

    python bench/train_throughput.py        # small + base; writes results/bench_train.json
    python bench/train_throughput.py --configs small --compile --out /tmp/t.json

One training step is: forward, generator (Linear + log_softmax), label-smoothed loss, backward,
Adam step. Four models do it on the same seeded batches (lengths 16–64, padded, with masks):

* ``ours``: ``transformer_lib.model.make_model`` (SDPA fast path in every attention layer), in
  the step of ``transformer_lib.trainer`` (generator on non-padding positions, fused Adam);
* ``nn_transformer``: ``torch.nn.Transformer`` with the same sizes, dropout and norm placement
  (post-norm), fed by the same embedding modules (a deep copy of ours: scaled embeddings +
  sinusoidal positions + dropout) and the same generator and loss, in a plain training loop's
  step (generator on every position, default Adam; the ``_trainer_step`` variant gives it ours).
  nn.Transformer's encoder and decoder always end with an extra LayerNorm (two more LayerNorms
  than ours): a negligible cost;
* ``textbook``: the same model with every piece computed the way its formula reads, i.e. the
  reference definitions the chapters test the package against: chapter 1's explicit
  ``softmax(QKᵀ/√d_k)V`` in every attention layer (``store_attention = True``), chapter 5's
  LayerNorm written out (mean, variance, normalize), and chapter 6's label-smoothed KL built
  from the dense (N, V) target distribution;
* ``explicit_attention``: ours with only the attention on the explicit path (the other two
  pieces as shipped), to show what attention alone contributes.

and, as options, the same under bf16 autocast, with the paper's dropout placement
(``make_model(attn_dropout=0, ffn_dropout=0)``: residual and embedding dropout only), and
under ``torch.compile``. The models are interleaved (round-robin over rounds; a round is one step on
every batch of the list) and the median round is reported as target tokens per second (non-pad
decoder tokens, i.e. ``Batch.ntokens``). Model-FLOPs utilisation divides the analytic model FLOPs
(see :func:`train_flops`) per second by the peak of a 2048² matmul measured in the same run.
Peak memory: the peak of tensor bytes allocated during one step above those alive before it
(activations saved for backward, gradients, temporaries), from the PyTorch profiler's memory
timeline; parameters and Adam state (alive before the step) are not included.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    RESULTS,
    format_table,
    git_commit,
    interleaved_times,
    load_average,
    machine_description,
    matmul_peak,
    median,
    now_iso,
    peak_step_memory,
    write_json,
)

from transformer_lib.layers import Dropout, Generator, LayerNorm, layer_norm_by_hand  # noqa: E402
from transformer_lib.model import make_model  # noqa: E402
from transformer_lib.multihead import MultiHeadedAttention  # noqa: E402
from transformer_lib.training import (  # noqa: E402
    Batch,
    LabelSmoothing,
    smoothed_kl_by_definition,
)

PAD = 0


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Model size and batch shape of one benchmark configuration."""

    name: str
    d_model: int
    N: int  # encoder layers = decoder layers
    h: int
    d_ff: int
    vocab: int = 8000  # source and target vocabulary (separate embeddings, as make_model's default)
    dropout: float = 0.1  # everywhere: embeddings, residuals, attention weights, FFN
    batch_size: int = 64  # sentence pairs per batch
    min_len: int = 16  # source and target lengths drawn uniformly from [min_len, max_len]
    max_len: int = 64
    n_batches: int = 4  # batches per timed round (one step each)
    warmup: int = 1  # untimed rounds
    repeats: int = 5  # timed rounds per model
    smoothing: float = 0.1


CONFIGS = {
    "small": BenchConfig("small", d_model=256, N=3, h=4, d_ff=1024, n_batches=2, repeats=4),
    "base": BenchConfig(
        "base", d_model=512, N=6, h=8, d_ff=2048, batch_size=48, n_batches=1, repeats=3
    ),
    # For tests and quick looks; not part of the committed results.
    "tiny": BenchConfig(
        "tiny",
        d_model=32,
        N=1,
        h=2,
        d_ff=64,
        vocab=50,
        batch_size=4,
        min_len=3,
        max_len=9,
        n_batches=2,
        warmup=1,
        repeats=2,
    ),
}


# --------------------------------------------------------------------------- data


def make_batches(cfg: BenchConfig, device: torch.device, seed: int = 0) -> list[Batch]:
    """A fixed, seeded list of padded batches; every sentence has its own source/target length.

    Token ids are drawn from [1, vocab) (0 is padding). ``Batch`` builds the masks, shifts the
    target and counts the non-pad target tokens.
    """
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(cfg.n_batches):
        s_lens = [rng.randint(cfg.min_len, cfg.max_len) for _ in range(cfg.batch_size)]
        t_lens = [rng.randint(cfg.min_len, cfg.max_len) for _ in range(cfg.batch_size)]
        src = torch.full((cfg.batch_size, max(s_lens)), PAD, dtype=torch.long)
        tgt = torch.full((cfg.batch_size, max(t_lens) + 1), PAD, dtype=torch.long)  # +1: shift
        for i, (s, t) in enumerate(zip(s_lens, t_lens)):
            src[i, :s] = torch.randint(1, cfg.vocab, (s,), generator=g)
            tgt[i, : t + 1] = torch.randint(1, cfg.vocab, (t + 1,), generator=g)
        batches.append(Batch(src.to(device), tgt.to(device), PAD))
    return batches


# --------------------------------------------------------------------------- models


class NNTransformerSeq2Seq(nn.Module):
    """torch.nn.Transformer between our embeddings and our generator (nn masks: True = masked)."""

    def __init__(
        self, core: nn.Transformer, src_embed: nn.Module, tgt_embed: nn.Module, generator: nn.Module
    ):
        super().__init__()
        self.core, self.src_embed, self.tgt_embed, self.generator = (
            core,
            src_embed,
            tgt_embed,
            generator,
        )

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_pad = src == PAD  # (B, S) True = padding
        tgt_pad = tgt == PAD  # (B, T)
        T = tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)  # True = future
        return self.core(
            self.src_embed(src),
            self.tgt_embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )  # (B, T, d_model)


def build_ours(
    cfg: BenchConfig,
    device: torch.device,
    seed: int = 0,
    paper_dropout: bool = False,
    skip_padding: bool = True,
) -> nn.Module:
    """``make_model`` at cfg's size; ``paper_dropout`` sets attention and FFN dropout to 0;
    ``skip_padding=False`` runs the feed-forward blocks on padding positions too."""
    torch.manual_seed(seed)
    extra = {"attn_dropout": 0.0, "ffn_dropout": 0.0} if paper_dropout else {}
    return make_model(
        cfg.vocab,
        cfg.vocab,
        N=cfg.N,
        d_model=cfg.d_model,
        d_ff=cfg.d_ff,
        h=cfg.h,
        dropout=cfg.dropout,
        skip_padding=skip_padding,
        **extra,
    ).to(device)


def build_nn(
    cfg: BenchConfig,
    device: torch.device,
    seed: int = 0,
    paper_dropout: bool = False,
    skip_padding: bool = False,
) -> NNTransformerSeq2Seq:
    """nn.Transformer with cfg's sizes, post-norm, ReLU; embeddings/generator copied from ours.

    ``skip_padding`` must be False: nn.Transformer's training path computes every position.
    """
    if skip_padding:
        raise ValueError("skip_padding must be False for nn.Transformer")
    ours = build_ours(cfg, torch.device("cpu"), seed)
    core = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.h,
        num_encoder_layers=cfg.N,
        num_decoder_layers=cfg.N,
        dim_feedforward=cfg.d_ff,
        dropout=cfg.dropout,
        activation="relu",
        layer_norm_eps=1e-6,  # transformer_lib.layers.LayerNorm's eps
        batch_first=True,
        norm_first=False,
    )
    if paper_dropout:  # the same placement as make_model(attn_dropout=0, ffn_dropout=0)
        for layer in [*core.encoder.layers, *core.decoder.layers]:
            layer.dropout.p = 0.0  # the FFN's hidden activations (dropout1/2/3 stay)
            for mha in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if mha is not None:
                    mha.dropout = 0.0  # the attention weights
    model = NNTransformerSeq2Seq(
        core,
        copy.deepcopy(ours.src_embed),
        copy.deepcopy(ours.tgt_embed),
        copy.deepcopy(ours.generator),
    )
    return model.to(device)


class LayerNormByHand(nn.Module):
    """A module around chapter 5's ``layer_norm_by_hand``, with an existing LayerNorm's parameters.

    mean, biased variance, subtract, add eps, square root, divide, scale, shift: seven
    elementwise/reduction operations, each a pass over the tensor, and as many in the backward.
    """

    def __init__(self, norm: LayerNorm) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_by_hand(x, self.weight, self.bias, self.eps)


def nn_dropouts(model: nn.Module) -> int:
    """Replace every chapter-5 ``Dropout`` by an ``nn.Dropout`` of the same p (the same
    distribution, PyTorch's mask sampler). Returns the number of modules replaced."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Dropout):
                setattr(parent, name, nn.Dropout(child.p))
                n += 1
    return n


def layernorms_by_hand(model: nn.Module) -> int:
    """Replace every ``transformer_lib.layers.LayerNorm`` by :class:`LayerNormByHand` (same
    parameters, same function). Returns the number of modules replaced."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, LayerNorm):
                setattr(parent, name, LayerNormByHand(child))
                n += 1
    return n


def explicit_attention(model: nn.Module, n_expected: int) -> nn.Module:
    """Route every ``MultiHeadedAttention`` through chapter 1's explicit path."""
    n = 0
    for m in model.modules():
        if isinstance(m, MultiHeadedAttention):
            m.store_attention = True
            n += 1
    if n != n_expected:
        raise RuntimeError(f"expected {n_expected} attention layers, found {n}")
    return model


def build_explicit_attention(
    cfg: BenchConfig,
    device: torch.device,
    seed: int = 0,
    paper_dropout: bool = False,
    skip_padding: bool = True,
) -> nn.Module:
    """Ours with every attention layer on chapter 1's explicit path (``store_attention``)."""
    model = build_ours(cfg, device, seed, paper_dropout, skip_padding)
    return explicit_attention(model, 3 * cfg.N)


def build_textbook(
    cfg: BenchConfig,
    device: torch.device,
    seed: int = 0,
    paper_dropout: bool = False,
    skip_padding: bool = False,
) -> nn.Module:
    """Ours with explicit attention, LayerNorm by hand, ``nn.Dropout`` and every position
    computed, as the Annotated Transformer does (the step adds the dense loss)."""
    model = build_explicit_attention(cfg, device, seed, paper_dropout, skip_padding)
    layernorms_by_hand(model)
    nn_dropouts(model)
    return model


# --------------------------------------------------------------------------- one step


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def kl_by_definition(logp: torch.Tensor, target: torch.Tensor, crit: LabelSmoothing):
    """Chapter 6's definition: the dense (N, V) smoothed target, then the safe KL sum."""
    return smoothed_kl_by_definition(logp, crit.target_distribution(target, logp.dtype))


def make_step(
    kind: str,
    model: nn.Module,
    cfg: BenchConfig,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    *,
    dense_loss: bool = False,
    trainer_step: bool = False,
) -> Callable[[Batch], float]:
    """A function running one training step on a batch and returning the loss per token.

    ``kind`` is "ours" (called as ``model(src, tgt, src_mask, tgt_mask)``) or "nn" (called with
    the token tensors; it builds nn-style masks itself). Forward and generator run under
    autocast when ``amp_dtype`` is given; the loss is computed in fp32 on the log-probabilities
    (as ``transformer_lib.trainer`` does) with chapter 6's ``LabelSmoothing``, the same for
    every model, or with ``dense_loss`` by its definition (:func:`kl_by_definition`).
    ``trainer_step`` does what ``transformer_lib.trainer`` does: the generator runs on the
    non-padding target positions only (padding positions add exactly 0 to the loss), and Adam
    is PyTorch's fused implementation (one kernel for the whole update); otherwise the step is a
    plain training loop's: the generator on every position and the default Adam.
    """
    if kind not in ("ours", "nn"):
        raise ValueError(f"kind must be 'ours' or 'nn', got {kind!r}")
    model.train()
    criterion = LabelSmoothing(cfg.vocab, PAD, cfg.smoothing).to(device)
    opt = torch.optim.Adam(
        model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=trainer_step or None
    )

    def step(b: Batch) -> float:
        with _autocast(device, amp_dtype):
            if kind == "ours":
                out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)  # (B, T, d_model)
            else:
                out = model(b.src, b.tgt)
            if trainer_step:
                keep = b.tgt_y != PAD  # (B, T)
                logp, y = model.generator(out[keep]), b.tgt_y[keep]  # (n_real, vocab), (n_real,)
            else:
                logp, y = model.generator(out), b.tgt_y  # (B, T, vocab), (B, T)
        logp, y = logp.float().reshape(-1, logp.size(-1)), y.reshape(-1)
        loss = kl_by_definition(logp, y, criterion) if dense_loss else criterion(logp, y)
        loss = loss / float(b.ntokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()  # .item() also waits for an asynchronous device

    return step


# --------------------------------------------------------------------------- FLOPs


def train_flops(
    cfg: BenchConfig,
    batch: Batch,
    padded: bool = False,
    real_token_generator: bool = False,
    skip_padding: bool = False,
) -> float:
    """Analytic FLOPs of one training step: forward matmuls × 3 (backward = 2 × forward).

    Linear layers: 2 FLOPs per weight per token in the forward pass, counted on the tokens each
    layer actually sees (encoder layers and the cross-attention K/V projections on source
    tokens; decoder layers and the generator on target tokens). Attention: Q·Kᵀ and weights·V
    are 2·n_q·n_k·d_model FLOPs each per layer (all h heads together), counted on the full
    n_q × n_k rectangle (causal masking does not halve what the kernels compute). Embedding
    lookups, biases, softmax, LayerNorm and the optimizer are left out (they are not matmuls).

    ``padded=False`` counts each sentence at its own length (the useful work: model FLOPs);
    ``padded=True`` counts the padded tensors (what the kernels execute), except for the
    generator when ``real_token_generator`` (it then runs on the real target tokens only) and
    for the feed-forward blocks when ``skip_padding`` (they then run on the real tokens only).
    """
    d, d_ff, V = cfg.d_model, cfg.d_ff, cfg.vocab
    src_mask = batch.src != PAD  # (B, S)
    tgt_mask = batch.tgt != PAD  # (B, T)
    if padded:
        s = torch.full((batch.src.size(0),), batch.src.size(1), dtype=torch.float64)
        t = torch.full((batch.tgt.size(0),), batch.tgt.size(1), dtype=torch.float64)
    else:
        s = src_mask.sum(1).double().cpu()
        t = tgt_mask.sum(1).double().cpu()
    S, T = float(s.sum()), float(t.sum())
    # the feed-forward blocks' tokens: the padded tensors, or the real tokens when skipping
    S_ffn, T_ffn = (float(src_mask.sum()), float(tgt_mask.sum())) if skip_padding else (S, T)
    enc_linear = cfg.N * (4 * d * d * S + 2 * d * d_ff * S_ffn)
    dec_linear = cfg.N * ((4 * d * d + 2 * d * d) * T + 2 * d * d_ff * T_ffn + 2 * d * d * S)
    gen_linear = d * V * (float((batch.tgt_y != PAD).sum()) if real_token_generator else T)
    attn = cfg.N * 4 * d * float((s * s).sum() + (t * t).sum() + (t * s).sum())
    forward = 2 * (enc_linear + dec_linear + gen_linear) + attn
    return 3.0 * forward


def counted_flops(step: Callable[[Batch], float], batch: Batch) -> float:
    """FLOPs of one step as counted by ``torch.utils.flop_counter.FlopCounterMode`` (a check)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step(batch)
    return float(counter.get_total_flops())


# --------------------------------------------------------------------------- same math check


def copy_ours_to_nn(ours: nn.Module, theirs: NNTransformerSeq2Seq) -> None:
    """Copy every weight of our model into the nn.Transformer wrapper (same math afterwards)."""
    theirs.src_embed.load_state_dict(ours.src_embed.state_dict())
    theirs.tgt_embed.load_state_dict(ours.tgt_embed.state_dict())
    theirs.generator.load_state_dict(ours.generator.state_dict())
    _copy_stack(ours.encoder.layers, theirs.core.encoder.layers, decoder=False)
    _copy_stack(ours.decoder.layers, theirs.core.decoder.layers, decoder=True)


def _copy_mha(src: MultiHeadedAttention, dst: nn.MultiheadAttention) -> None:
    dst.in_proj_weight.copy_(src.in_proj.weight)
    dst.in_proj_bias.copy_(src.in_proj.bias)
    dst.out_proj.weight.copy_(src.out_proj.weight)
    dst.out_proj.bias.copy_(src.out_proj.bias)


def _copy_norm(src: nn.Module, dst: nn.LayerNorm) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


@torch.no_grad()
def _copy_stack(ours_layers, nn_layers, decoder: bool) -> None:
    for o, t in zip(ours_layers, nn_layers):
        _copy_mha(o.self_attn, t.self_attn)
        if decoder:
            _copy_mha(o.src_attn, t.multihead_attn)
        ff = o.feed_forward
        t.linear1.load_state_dict(ff.w_1.state_dict())
        t.linear2.load_state_dict(ff.w_2.state_dict())
        norms = [s.norm for s in o.sublayer]
        dsts = [t.norm1, t.norm2] + ([t.norm3] if decoder else [])
        for a, b in zip(norms, dsts):
            _copy_norm(a, b)


@torch.no_grad()
def same_math_check(cfg: BenchConfig, device: torch.device) -> float:
    """Max |log-prob difference| between ours and nn.Transformer with copied weights (eval mode).

    nn.Transformer's extra final LayerNorms are removed for this check (``norm = None``): with
    them the two would differ by exactly those two layers. Compared at non-pad target positions.
    """
    ours = build_ours(cfg, device).eval()
    theirs = build_nn(cfg, device).eval()
    theirs.core.encoder.enable_nested_tensor = False  # keep the check on the dense path
    theirs.core.encoder.use_nested_tensor = False
    theirs.core.encoder.norm = None
    theirs.core.decoder.norm = None
    copy_ours_to_nn(ours, theirs)
    b = make_batches(cfg, device, seed=123)[0]
    a = ours.generator(ours(b.src, b.tgt, b.src_mask, b.tgt_mask))
    c = theirs.generator(theirs(b.src, b.tgt))
    keep = b.tgt != PAD
    torch.testing.assert_close(a[keep], c[keep], atol=1e-4, rtol=1e-4)
    return float((a[keep] - c[keep]).abs().max())


# --------------------------------------------------------------------------- the benchmark


@dataclasses.dataclass(frozen=True)
class Variant:
    """One model + setting whose training step is timed (all through public knobs)."""

    builder: str  # "ours", "nn", "textbook" or "explicit_attention"
    amp: torch.dtype | None = None  # autocast dtype, None = fp32
    paper_dropout: bool = False  # no dropout on attention weights / FFN hidden (paper, 5.4)
    # the package trainer's step (generator on non-padding positions, fused Adam); None: the
    # builder's default, True for ours/explicit_attention, False for nn and textbook
    trainer_step: bool | None = None
    # feed-forward blocks on the visible positions only (make_model's default); None: the
    # builder's default, True for ours/explicit_attention, False for nn and textbook
    skip_padding: bool | None = None
    # nn.Dropout in place of chapter 5's Dropout (its mask drawn by PyTorch's Bernoulli sampler)
    nn_dropout: bool = False

    @property
    def uses_trainer_step(self) -> bool:
        """Whether the step is the trainer's (the generator then sees real tokens only)."""
        if self.trainer_step is not None:
            return self.trainer_step
        return self.builder in ("ours", "explicit_attention")

    @property
    def skips_padding(self) -> bool:
        """Whether the feed-forward blocks skip the padding positions."""
        if self.skip_padding is not None:
            return self.skip_padding
        return self.builder in ("ours", "explicit_attention")

    @property
    def kind(self) -> str:
        return "nn" if self.builder == "nn" else "ours"


BF16 = torch.bfloat16
VARIANTS = {
    "ours_fp32": Variant("ours"),
    "ours_fp32_no_padding_skip": Variant("ours", skip_padding=False),
    "ours_fp32_nn_dropout": Variant("ours", nn_dropout=True),
    "nn_transformer_fp32": Variant("nn"),
    "nn_transformer_fp32_trainer_step": Variant("nn", trainer_step=True),
    "textbook_fp32": Variant("textbook"),
    "textbook_fp32_paper_dropout": Variant("textbook", paper_dropout=True),
    "explicit_attention_fp32": Variant("explicit_attention"),
    "ours_bf16": Variant("ours", BF16),
    "nn_transformer_bf16": Variant("nn", BF16),
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
BUILDERS = {
    "ours": build_ours,
    "nn": build_nn,
    "textbook": build_textbook,
    "explicit_attention": build_explicit_attention,
}
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
        "ours_bf16",
        "nn_transformer_bf16",
        "ours_fp32_paper_dropout",
        "nn_transformer_fp32_paper_dropout",
        "textbook_fp32_paper_dropout",
        "ours_bf16_paper_dropout",
    ],
    "tiny": list(VARIANTS),
}
# The trainer's `fast = true` (CLI `--fast`): bf16 autocast and the paper's dropout placement.
FAST_SETTING = "ours_bf16_paper_dropout"


def build_variant(name: str, cfg: BenchConfig, device: torch.device, compile: bool = False):
    """(model, step function) of a named variant; ``compile`` wraps the model in torch.compile."""
    v = VARIANTS[name]
    model = BUILDERS[v.builder](
        cfg, device, paper_dropout=v.paper_dropout, skip_padding=v.skips_padding
    )
    if v.nn_dropout:
        nn_dropouts(model)
    runner = model
    if compile:
        runner = torch.compile(model)  # `runner.generator` reaches the (uncompiled) generator
    dense = v.builder == "textbook"
    return model, make_step(
        v.kind, runner, cfg, device, v.amp, dense_loss=dense, trainer_step=v.uses_trainer_step
    )


def run_config(
    cfg: BenchConfig,
    variants: list[str],
    device: torch.device,
    *,
    compile_variants: list[str] = (),
    measure_memory: bool = True,
    verbose: bool = True,
) -> dict[str, Any]:
    """Interleaved throughput (+ memory, FLOPs, MFU) of ``variants`` on one configuration."""
    batches = make_batches(cfg, device)
    tokens = sum(float(b.ntokens) for b in batches)
    steps: dict[str, Callable[[Batch], float]] = {}
    compile_s: dict[str, float] = {}
    for name in variants:
        steps[name] = build_variant(name, cfg, device)[1]
    for name in compile_variants:
        key = f"{name}_compiled"
        steps[key] = build_variant(name, cfg, device, compile=True)[1]
        t0 = time.perf_counter()
        for b in batches:  # compiles (and recompiles for new shapes) outside the timing
            steps[key](b)
        compile_s[key] = time.perf_counter() - t0
        if verbose:
            print(f"  compiled {key} in {compile_s[key]:.0f} s", flush=True)

    def round_of(step):
        return lambda: [step(b) for b in batches]

    t0 = time.perf_counter()
    times = interleaved_times(
        {k: round_of(s) for k, s in steps.items()},
        cfg.warmup,
        cfg.repeats,
        progress=cfg.name if verbose else None,
    )
    timing_s = time.perf_counter() - t0
    flops_model = sum(train_flops(cfg, b) for b in batches)
    flops_padded = {  # (generator on real tokens only, feed-forward skips padding)
        (real, skip): sum(
            train_flops(cfg, b, padded=True, real_token_generator=real, skip_padding=skip)
            for b in batches
        )
        for real in (False, True)
        for skip in (False, True)
    }
    rows = {}
    for name, ts in times.items():
        t = median(ts)
        v = VARIANTS[name.removesuffix("_compiled")]
        rows[name] = {
            "model": v.builder,
            "precision": "bf16-autocast" if v.amp is torch.bfloat16 else "fp32",
            "compiled": name.endswith("_compiled"),
            "paper_dropout": v.paper_dropout,
            "trainer_step": v.uses_trainer_step,
            "skip_padding": v.skips_padding,
            "nn_dropout": v.nn_dropout or v.builder in ("nn", "textbook"),
            "round_s_median": t,
            "round_s_all": [round(x, 4) for x in ts],
            "tokens_per_s": tokens / t,
            "model_tflops_per_s": flops_model / t / 1e12,
            "padded_tflops_per_s": flops_padded[v.uses_trainer_step, v.skips_padding] / t / 1e12,
            "peak_step_memory_bytes": None,
        }
        if name in compile_s:
            rows[name]["compile_s"] = compile_s[name]
    if measure_memory:  # the profiler pass costs a few steps' time
        for name, step in steps.items():
            rows[name]["peak_step_memory_bytes"] = peak_step_memory(lambda s=step: s(batches[0]))
    flop_check = counted_flops(steps[variants[0]], batches[0])
    ref = "nn_transformer_fp32"
    for r in rows.values():
        r["vs_nn_transformer_fp32"] = (
            r["tokens_per_s"] / rows[ref]["tokens_per_s"] if ref in rows else None
        )
    return {
        "config": dataclasses.asdict(cfg),
        "params": {
            "ours": sum(p.numel() for p in build_ours(cfg, torch.device("cpu")).parameters()),
            "nn_transformer": sum(
                p.numel() for p in build_nn(cfg, torch.device("cpu")).parameters()
            ),
        },
        "batches": [
            {
                "sentences": int(b.src.size(0)),
                "src_padded_len": int(b.src.size(1)),
                "tgt_padded_len": int(b.tgt.size(1)),
                "src_tokens": int((b.src != PAD).sum()),
                "tgt_tokens": int(b.ntokens),
            }
            for b in batches
        ],
        "target_tokens_per_round": tokens,
        "model_flops_per_round": flops_model,
        "padded_flops_per_round": {
            "generator_on_all_positions": flops_padded[False, False],
            "generator_on_real_tokens": flops_padded[True, False],
            "generator_and_ffn_on_real_tokens": flops_padded[True, True],
        },
        "flop_counter_check": {
            "variant": variants[0],
            "counted_padded_flops_batch0": flop_check,
            "analytic_padded_flops_batch0": train_flops(
                cfg,
                batches[0],
                padded=True,
                real_token_generator=VARIANTS[variants[0]].uses_trainer_step,
                skip_padding=VARIANTS[variants[0]].skips_padding,
            ),
        },
        "timing_wall_s": timing_s,
        "variants": rows,
        "ratios": ratios(rows),
        "fastest": fastest(rows),
    }


def add_mfu(results: dict[str, Any], peaks: dict[str, float]) -> None:
    """Model-FLOPs utilisation of every variant: achieved model FLOP/s ÷ the matmul peak.

    bf16-autocast variants are divided by the bf16 peak, fp32 ones by the fp32 peak. ``mfu``
    counts the useful FLOPs (each sentence at its own length); ``hfu_padded`` the FLOPs on the
    padded tensors, which is what the hardware executes.
    """
    for res in results.values():
        for row in res["variants"].values():
            ref = "bf16" if row["precision"].startswith("bf16") else "fp32"
            row["peak_reference"] = ref
            row["mfu"] = row["model_tflops_per_s"] * 1e12 / peaks[ref]
            row["hfu_padded"] = row["padded_tflops_per_s"] * 1e12 / peaks[ref]


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Throughput ratios whose keys name both sides: ``"A_vs_B"`` = tokens/s of A ÷ of B.

    Every variant against nn.Transformer fp32, plus the pairs that isolate one change.
    """
    pairs = [(a, "nn_transformer_fp32") for a in rows if a != "nn_transformer_fp32"]
    pairs += [
        ("ours_fp32", "nn_transformer_fp32_trainer_step"),
        ("nn_transformer_fp32_trainer_step", "nn_transformer_fp32"),
        ("ours_fp32", "textbook_fp32"),
        ("ours_fp32", "explicit_attention_fp32"),
        ("nn_transformer_fp32", "textbook_fp32"),
        ("ours_bf16", "nn_transformer_bf16"),
        ("ours_bf16", "ours_fp32"),
        ("nn_transformer_bf16", "nn_transformer_fp32"),
        ("ours_fp32_paper_dropout", "ours_fp32"),
        ("ours_fp32_paper_dropout", "nn_transformer_fp32_paper_dropout"),
        ("ours_fp32_paper_dropout", "textbook_fp32_paper_dropout"),
        ("nn_transformer_fp32_paper_dropout", "nn_transformer_fp32"),
        ("ours_bf16_paper_dropout", "ours_bf16"),
        ("ours_bf16_paper_dropout", "nn_transformer_bf16_paper_dropout"),
        ("ours_bf16_paper_dropout", "ours_fp32_paper_dropout"),
        ("ours_fp32", "ours_fp32_no_padding_skip"),
        (FAST_SETTING, f"{FAST_SETTING}_no_padding_skip"),
        ("ours_fp32", "ours_fp32_nn_dropout"),
        (FAST_SETTING, f"{FAST_SETTING}_nn_dropout"),
        (f"{FAST_SETTING}_compiled", FAST_SETTING),
    ]
    out = {}
    for a, b in pairs:
        if a in rows and b in rows:
            out[f"{a}_vs_{b}"] = rows[a]["tokens_per_s"] / rows[b]["tokens_per_s"]
    return out


def fastest(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Our fastest variant, and its throughput ratio to nn.Transformer fp32."""
    ref = rows.get("nn_transformer_fp32", {}).get("tokens_per_s")
    cands = [k for k, r in rows.items() if r["model"] == "ours"]
    if not cands:
        return {}
    best = max(cands, key=lambda k: rows[k]["tokens_per_s"])
    return {
        "variant": best,
        "vs_nn_transformer_fp32": rows[best]["tokens_per_s"] / ref if ref else None,
    }


# --------------------------------------------------------------------------- micro-benchmarks


def fused_qkv_micro(
    d_model: int, tokens: int, device: torch.device, repeats: int = 10
) -> dict[str, float]:
    """Forward+backward of one (3·d_model × d_model) projection vs three (d_model × d_model) ones.

    Self-attention projects the same input three times; one matmul with the three weight
    matrices stacked reads the input once and gives the matmul kernel a wider problem.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, d_model, generator=g).to(device).requires_grad_(True)
    fused = nn.Linear(d_model, 3 * d_model).to(device)
    separate = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(3)).to(device)

    def run_fused():
        q, k, v = fused(x).chunk(3, dim=-1)
        (q.sum() + k.sum() + v.sum()).backward()

    def run_separate():
        q, k, v = (lin(x) for lin in separate)
        (q.sum() + k.sum() + v.sum()).backward()

    times = interleaved_times({"fused": run_fused, "separate": run_separate}, 2, repeats)
    f, s = median(times["fused"]), median(times["separate"])
    return {
        "d_model": d_model,
        "tokens": tokens,
        "fused_ms": 1e3 * f,
        "separate_ms": 1e3 * s,
        "separate_vs_fused_time": s / f,
    }


def layernorm_micro(
    d_model: int, tokens: int, device: torch.device, repeats: int = 10
) -> dict[str, float]:
    """Forward+backward of the LayerNorm formula written out vs the package's ``LayerNorm``.

    Both compute the same function (checked here with ``assert_close``); the package calls
    ``F.layer_norm`` (one fused kernel), the formula is seven operations that autograd records
    one by one.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, d_model, generator=g).to(device).requires_grad_(True)
    fused = LayerNorm(d_model).to(device)
    by_hand = LayerNormByHand(fused)
    torch.testing.assert_close(by_hand(x), fused(x))

    def run(mod):
        def call():
            x.grad = None
            mod(x).sum().backward()

        return call

    times = interleaved_times({"by_hand": run(by_hand), "fused": run(fused)}, 2, repeats)
    o, f = median(times["by_hand"]), median(times["fused"])
    return {
        "d_model": d_model,
        "tokens": tokens,
        "by_hand_ms": 1e3 * o,
        "fused_ms": 1e3 * f,
        "by_hand_vs_fused_time": o / f,
    }


def loss_micro(
    vocab: int, tokens: int, device: torch.device, smoothing: float = 0.1, repeats: int = 5
) -> dict[str, float]:
    """Forward+backward of the label-smoothed KL by its definition vs ``LabelSmoothing``.

    Same value and gradient (checked with ``assert_close``); the definition builds the (N, V)
    target distribution and makes about eight passes over N × V numbers, the package's closed
    form one gather and one row sum.
    """
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=g).to(device)
    target = torch.randint(1, vocab, (tokens,), generator=g).to(device)
    target[::9] = PAD  # some padding rows
    a = logits.log_softmax(-1).requires_grad_(True)
    b = a.detach().clone().requires_grad_(True)
    crit = LabelSmoothing(vocab, PAD, smoothing).to(device)
    la, lb = kl_by_definition(a, target, crit), crit(b, target)
    la.backward()
    lb.backward()
    torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(b.grad, a.grad)

    def run_definition():
        a.grad = None
        kl_by_definition(a, target, crit).backward()

    def run_closed():
        b.grad = None
        crit(b, target).backward()

    times = interleaved_times({"definition": run_definition, "closed": run_closed}, 1, repeats)
    c, f = median(times["definition"]), median(times["closed"])
    return {
        "vocab": vocab,
        "tokens": tokens,
        "definition_ms": 1e3 * c,
        "closed_form_ms": 1e3 * f,
        "definition_vs_closed_form_time": c / f,
    }


def chunked_output_loss(
    generator: nn.Module, criterion: LabelSmoothing, x: Tensor, target: Tensor, chunk: int = 256
) -> Tensor:
    """``criterion(generator(x), target)``, computed ``chunk`` rows at a time (an experiment).

    Tried for the trainer and not adopted: in a whole training step it measured no faster
    than the plain generator + ``LabelSmoothing`` (see ``output_loss_micro`` and the appendix).

    Args:
        generator: a ``Generator`` (``proj``, a Linear layer, then log-softmax).
        criterion: a ``LabelSmoothing``.
        x: (N, d_model) decoder states. target: (N,) class ids.
        chunk: rows per piece (256 measured best on these CPUs).

    Returns the summed loss (a scalar), as the unchunked computation. With gradients enabled,
    each piece's gradients with respect to x and the generator's weight and bias are computed
    as soon as the piece is scored; the backward pass only scales them. No (N, V) tensor is
    ever held.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer (rows per piece), got {chunk!r}")
    if not isinstance(criterion, LabelSmoothing):
        raise ValueError(f"criterion must be a LabelSmoothing, got {type(criterion).__name__}")
    if x.dim() != 2 or target.shape != x.shape[:1]:
        raise ValueError(
            f"x must be (N, d_model) and target (N,), got x {tuple(x.shape)} and target "
            f"{tuple(target.shape)}"
        )
    if target.numel() and not 0 <= int(target.min()) <= int(target.max()) < criterion.size:
        raise ValueError(f"target ids must be in [0, size={criterion.size})")
    w, b = generator.proj.weight, generator.proj.bias
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, b))
    if not grads:
        return _chunked_output_loss(x, w, b, target, criterion, chunk, grads=False)[0]
    return _ChunkedOutputLoss.apply(x, w, b, target, criterion, chunk)


def _chunked_output_loss(x, weight, bias, target, criterion, chunk, grads):
    """(summed loss, d loss/d x, d loss/d weight, d loss/d bias), the last three if ``grads``."""
    loss_dtype = torch.promote_types(weight.dtype, torch.float32)  # fp32 at least
    total = torch.zeros((), dtype=loss_dtype, device=x.device)
    gx = torch.empty_like(x) if grads else None
    gw = torch.zeros_like(weight) if grads else None
    gb = torch.zeros_like(bias) if grads and bias is not None else None
    for start in range(0, x.size(0), chunk):
        rows = slice(start, start + chunk)
        xc, tc = x[rows], target[rows]  # (n, d_model), (n,)
        logits = F.linear(xc, weight, bias)  # (n, V); bf16 under autocast
        logp = logits.to(loss_dtype).log_softmax(-1)
        total += criterion.closed_form(logp, tc)
        if grads:
            # d loss / d logits = softmax - p on a counted row (p sums to 1 there), 0 on padding
            g = logp.exp_().sub_(criterion.target_distribution(tc))  # (n, V)
            g[tc == criterion.padding_idx] = 0
            g = g.to(weight.dtype)  # (under autocast the products below still run in bf16)
            gx[rows] = g @ weight  # (n, d_model)
            gw += g.t() @ xc  # (V, d_model)
            if gb is not None:
                gb += g.sum(0)
    return total, gx, gw, gb


class _ChunkedOutputLoss(torch.autograd.Function):
    """Forward: the chunked loss and its gradients. Backward: those gradients, scaled."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, criterion, chunk):
        total, gx, gw, gb = _chunked_output_loss(x, weight, bias, target, criterion, chunk, True)
        ctx.save_for_backward(gx, gw, gb)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        gx, gw, gb = ctx.saved_tensors
        return gx * grad, gw * grad, None if gb is None else gb * grad, None, None, None


def output_loss_micro(
    d_model: int, vocab: int, tokens: int, device: torch.device, repeats: int = 5
) -> list[dict[str, Any]]:
    """Generator + loss, forward+backward: log-probabilities then ``LabelSmoothing`` (plain)
    vs :func:`chunked_output_loss` (gradients computed as it goes), fp32 and bf16 autocast.

    The same loss and gradients (checked in fp32); the plain form writes and reads the (N, V)
    logits and log-probabilities several times over, the chunked one keeps pieces in cache.
    """
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, d_model, generator=g).to(device).requires_grad_(True)
    target = torch.randint(1, vocab, (tokens,), generator=g).to(device)
    torch.manual_seed(0)
    gen = Generator(d_model, vocab).to(device)
    crit = LabelSmoothing(vocab, PAD, 0.1).to(device)

    def plain():
        return crit(gen(h).float(), target)

    def chunked():
        return chunked_output_loss(gen, crit, h, target)

    grads = []
    for f in (plain, chunked):
        h.grad = gen.proj.weight.grad = gen.proj.bias.grad = None
        loss = f()
        loss.backward()
        grads.append((loss.detach(), h.grad, gen.proj.weight.grad, gen.proj.bias.grad))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    rows = []
    for amp in (None, torch.bfloat16):

        def run(f, amp=amp):
            def go():
                with _autocast(device, amp):
                    loss = f()
                loss.backward()

            return go

        times = interleaved_times({"plain": run(plain), "chunked": run(chunked)}, 1, repeats)
        p_, c_ = median(times["plain"]), median(times["chunked"])
        rows.append(
            {
                "precision": "fp32" if amp is None else "bf16-autocast",
                "d_model": d_model,
                "vocab": vocab,
                "tokens": tokens,
                "plain_ms": 1e3 * p_,
                "chunked_ms": 1e3 * c_,
                "plain_vs_chunked_time": p_ / c_,
            }
        )
    return rows


def dropout_micro(
    d_model: int, tokens: int, device: torch.device, p: float = 0.1, repeats: int = 5
) -> dict[str, Any]:
    """Forward+backward of ``nn.Dropout`` vs chapter 5's ``Dropout`` (mask: uniform >= p) on a
    (tokens, d_model) input; ``d_model`` is the width (also the FFN's hidden width)."""
    x = torch.randn(tokens, d_model, device=device, requires_grad=True)
    grad = torch.randn(tokens, d_model, device=device)  # a dense incoming gradient, as in a step
    mods = {"nn_dropout": nn.Dropout(p), "ours": Dropout(p)}

    def run(mod):
        def go():
            x.grad = None
            mod(x).backward(grad)

        return go

    times = interleaved_times({k: run(m) for k, m in mods.items()}, 1, repeats)
    a, b = median(times["nn_dropout"]), median(times["ours"])
    return {
        "d_model": d_model,
        "tokens": tokens,
        "p": p,
        "nn_dropout_ms": 1e3 * a,
        "ours_ms": 1e3 * b,
        "nn_dropout_vs_ours_time": a / b,
    }


def attention_dtype_micro(
    cfg: BenchConfig, device: torch.device, repeats: int = 10
) -> dict[str, float]:
    """Forward+backward of causal SDPA at cfg's shapes: fused kernel in fp32 and in bf16, and
    the unfused "math" kernel in bf16 (which upcasts to fp32 inside).

    Why the package attends in fp32 under bf16 autocast on a CPU (chapter 3): on CPUs without
    AMX, PyTorch's fused CPU kernel is slower in bf16 than in fp32.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(0)
    B, h, n, d_k = cfg.batch_size, cfg.h, cfg.max_len, cfg.d_model // cfg.h
    base = [torch.randn(B, h, n, d_k, generator=g).to(device) for _ in range(3)]
    mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()

    def run(dtype, backend):
        q, k, v = (t.to(dtype).requires_grad_(True) for t in base)

        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()

        return call

    fns = {
        "fused_fp32": run(torch.float32, SDPBackend.FLASH_ATTENTION),
        "fused_bf16": run(torch.bfloat16, SDPBackend.FLASH_ATTENTION),
        "math_bf16": run(torch.bfloat16, SDPBackend.MATH),
    }
    times = interleaved_times(fns, 2, repeats)
    ms = {k: 1e3 * median(v) for k, v in times.items()}
    return {
        "shape": [B, h, n, d_k],
        **{f"{k}_ms": v for k, v in ms.items()},
        "fused_bf16_vs_fused_fp32_time": ms["fused_bf16"] / ms["fused_fp32"],
        "math_bf16_vs_fused_fp32_time": ms["math_bf16"] / ms["fused_fp32"],
    }


def bucketing_experiment(
    cfg: BenchConfig,
    device: torch.device,
    max_tokens: int = 3000,
    n_batches: int = 3,
    repeats: int = 2,
    max_pairs: int | None = None,
    vocab_size: int = 8000,
) -> dict[str, Any] | None:
    """Padding and real-token throughput of length-bucketed vs randomly packed Multi30k batches.

    Uses ``transformer_lib.data`` (joint BPE over the Multi30k training set, both batching
    schemes with the same token budget) and our fp32 model at ``cfg``'s size. Returns None when
    the data is not available. ``max_pairs`` keeps only the first pairs (for quick runs).
    """
    try:
        from transformer_lib import data
    except ImportError:
        return None
    try:
        pairs = data.load_multi30k("train")[:max_pairs]
    except Exception as err:  # noqa: BLE001 - no data here: report and skip
        print(f"  bucketing experiment skipped: {err}")
        return None
    tok = data.train_tokenizer((s for p in pairs for s in p), vocab_size=vocab_size)
    examples = data.encode_pairs(pairs, tok)
    padding = data.compare_padding(examples, max_tokens, seed=0)
    schemes = {}
    for name, bucket in (("bucketed", True), ("random", False)):
        idx = data.make_batches(examples, max_tokens, shuffle=True, seed=0, bucket=bucket)
        chosen = idx[:n_batches]
        schemes[name] = [
            Batch(*data.collate(examples, i, pad=data.PAD, device=device), pad=data.PAD)
            for i in chosen
        ]
    vocab = tok.get_vocab_size()
    cfg_v = dataclasses.replace(cfg, vocab=vocab)
    step_b = make_step("ours", build_ours(cfg_v, device), cfg_v, device)
    step_r = make_step("ours", build_ours(cfg_v, device), cfg_v, device)
    fns = {
        "bucketed": lambda: [step_b(b) for b in schemes["bucketed"]],
        "random": lambda: [step_r(b) for b in schemes["random"]],
    }
    times = interleaved_times(fns, 1, repeats)
    out: dict[str, Any] = {
        "max_tokens": max_tokens,
        "batches_timed": n_batches,
        "vocab": vocab,
        "model": cfg.name,
        **padding,
    }
    for name in fns:
        toks = sum(float(b.ntokens) for b in schemes[name])
        sents = sum(int(b.src.size(0)) for b in schemes[name])
        t = median(times[name])
        out[f"{name}_tokens_per_s"] = toks / t
        out[f"{name}_sentences_per_batch"] = sents / n_batches
    out["bucketed_vs_random_tokens_per_s"] = (
        out["bucketed_tokens_per_s"] / out["random_tokens_per_s"]
    )
    return out


# --------------------------------------------------------------------------- main


TARGETS = [
    # (config, ratio key, threshold, description). "Same math" holds under either dropout
    # placement as long as both sides use the same one, so both are reported.
    *(
        (cfg, key, thr, desc)
        for cfg in ("small", "base")
        for key, thr, desc in (
            (
                "ours_fp32_vs_nn_transformer_fp32",
                1.10,
                "ours fp32 >= 1.10x nn.Transformer fp32, dropout everywhere (nn's placement)",
            ),
            (
                "ours_fp32_paper_dropout_vs_nn_transformer_fp32_paper_dropout",
                1.10,
                "ours fp32 >= 1.10x nn.Transformer fp32, both with the paper's dropout placement",
            ),
            (
                "ours_fp32_vs_textbook_fp32",
                1.5,
                "ours fp32 >= 1.5x the textbook model, dropout everywhere",
            ),
            (
                "ours_fp32_paper_dropout_vs_textbook_fp32_paper_dropout",
                1.5,
                "ours fp32 >= 1.5x the textbook model, both with the paper's dropout placement",
            ),
        )
    ),
    (
        "small",
        f"{FAST_SETTING}_vs_nn_transformer_fp32",
        2.5,
        "the trainer's fast setting (bf16, paper dropout) >= 2.5x nn.Transformer fp32",
    ),
]


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the performance issue with its measured value and whether it is met."""
    out = []
    for cfg, key, thr, desc in TARGETS:
        v = results.get(cfg, {}).get("ratios", {}).get(key)
        out.append(
            {
                "config": cfg,
                "ratio": key,
                "value": v,
                "threshold": thr,
                "met": None if v is None else bool(v >= thr),
                "target": desc,
            }
        )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["small", "base"], choices=list(CONFIGS))
    p.add_argument(
        "--variants",
        nargs="+",
        default=None,
        choices=list(VARIANTS),
        help="default: every variant for small, a subset for base",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help=f"also time torch.compile'd {FAST_SETTING} (small only)",
    )
    p.add_argument("--repeats", type=int, default=None, help="override timed rounds")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument(
        "--no-extras",
        action="store_true",
        help="skip the fused-QKV micro-benchmark and the bucketing experiment",
    )
    p.add_argument("--bucketing-vocab", type=int, default=8000, help="BPE vocabulary size")
    p.add_argument("--peak-n", type=int, default=2048, help="matmul size for the FLOP/s peak")
    p.add_argument(
        "--bucketing-pairs", type=int, default=None, help="Multi30k pairs (default: all)"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_train.json")
    args = p.parse_args(argv)
    commit = git_commit()  # now: the code that runs, even if files change later

    t_start = time.perf_counter()
    device = torch.device(args.device)
    machine = machine_description()
    print(
        f"{machine['cpu_model']}, {machine['torch_threads']} threads, torch "
        f"{machine['torch_version']}, load {machine['load_average_start']}",
        flush=True,
    )
    peaks = {
        "fp32": matmul_peak(torch.float32, n=args.peak_n, device=device),
        "bf16": matmul_peak(torch.bfloat16, n=args.peak_n, device=device),
    }
    print(
        f"matmul {args.peak_n}² peak: fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, "
        f"bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s",
        flush=True,
    )
    diff = same_math_check(CONFIGS[args.configs[0]], device)
    print(
        f"same math: ours vs nn.Transformer (copied weights, final norms off): "
        f"max |Δ log-prob| = {diff:.2e}",
        flush=True,
    )

    results: dict[str, Any] = {}
    for name in args.configs:
        cfg = CONFIGS[name]
        if args.repeats:
            cfg = dataclasses.replace(cfg, repeats=args.repeats)
        variants = args.variants or DEFAULT_VARIANTS[name]
        compiled = [FAST_SETTING] if args.compile and name != "base" else []
        print(
            f"[{name}] d_model={cfg.d_model} N={cfg.N} h={cfg.h} d_ff={cfg.d_ff} "
            f"batch={cfg.batch_size}x{cfg.n_batches}: {', '.join(variants + compiled)}",
            flush=True,
        )
        results[name] = run_config(
            cfg,
            variants,
            device,
            compile_variants=compiled,
            measure_memory=not args.no_memory,
        )
        rows = [{"variant": k, **v} for k, v in results[name]["variants"].items()]
        print(format_table(rows, ["variant", "tokens_per_s", "vs_nn_transformer_fp32"]), flush=True)

    extras: dict[str, Any] = {}
    if not args.no_extras:
        d_models = sorted({CONFIGS[c].d_model for c in args.configs})
        extras["fused_qkv"] = [fused_qkv_micro(d, 3000, device) for d in d_models]
        extras["layernorm"] = [layernorm_micro(d, 3000, device) for d in d_models]
        extras["loss"] = loss_micro(CONFIGS[args.configs[0]].vocab, 2500, device)
        first = CONFIGS[args.configs[0]]
        extras["output_loss"] = output_loss_micro(first.d_model, first.vocab, 2500, device)
        extras["dropout"] = [  # the residual stream's width and the FFN hidden layer's
            dropout_micro(w, 4096, device, repeats=10) for d in d_models for w in (d, 4 * d)
        ]
        extras["attention_dtype"] = attention_dtype_micro(CONFIGS[args.configs[0]], device)
        print(
            "causal SDPA fwd+bwd, fused bf16 / fused fp32 time "
            f"{extras['attention_dtype']['fused_bf16_vs_fused_fp32_time']:.2f}",
            flush=True,
        )
        for row in extras["layernorm"]:
            print(
                f"LayerNorm d_model={row['d_model']}: by hand/fused time "
                f"{row['by_hand_vs_fused_time']:.2f}",
                flush=True,
            )
        print(
            "label smoothing, definition/closed form time "
            f"{extras['loss']['definition_vs_closed_form_time']:.2f}",
            flush=True,
        )
        for row in extras["output_loss"]:
            print(
                f"generator + loss {row['precision']}: plain/chunked time "
                f"{row['plain_vs_chunked_time']:.2f}",
                flush=True,
            )
        for row in extras["dropout"]:
            print(
                f"dropout d_model={row['d_model']}: nn.Dropout/ours time "
                f"{row['nn_dropout_vs_ours_time']:.2f}",
                flush=True,
            )
        for row in extras["fused_qkv"]:
            print(
                f"fused QKV d_model={row['d_model']}: separate/fused time "
                f"{row['separate_vs_fused_time']:.2f}",
                flush=True,
            )
        extras["bucketing"] = bucketing_experiment(
            CONFIGS[args.configs[0]],
            device,
            max_pairs=args.bucketing_pairs,
            vocab_size=args.bucketing_vocab,
        )
        if extras["bucketing"]:
            bk = extras["bucketing"]
            print(
                f"bucketing: padding {bk['bucketed_padding']:.1%} vs random "
                f"{bk['random_padding']:.1%}; real tokens/s ratio "
                f"{bk['bucketed_vs_random_tokens_per_s']:.2f}",
                flush=True,
            )

    peaks_end = {
        "fp32": matmul_peak(torch.float32, n=args.peak_n, device=device),
        "bf16": matmul_peak(torch.bfloat16, n=args.peak_n, device=device),
    }
    best = {k: max(peaks[k], peaks_end[k]) for k in peaks}
    add_mfu(results, best)
    for name in results:
        rows = [
            {"variant": k, **v, "peak_MiB": (v["peak_step_memory_bytes"] or 0) / 2**20 or None}
            for k, v in results[name]["variants"].items()
        ]
        print(f"[{name}]")
        print(
            format_table(
                rows, ["variant", "tokens_per_s", "vs_nn_transformer_fp32", "mfu", "peak_MiB"]
            ),
            flush=True,
        )
    machine["load_average_end"] = load_average()
    targets = check_targets(results)
    out = {
        "benchmark": "train_throughput",
        "description": __doc__.strip().split("\n\n", 2)[-1],
        "command": " ".join(
            ["python", "bench/train_throughput.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": now_iso(),
        "git_commit": commit,
        "machine": machine,
        "device": str(device),
        "matmul_peak_flops": {
            "start": peaks,
            "end": peaks_end,
            "used_for_mfu": best,
            "n": args.peak_n,
            "note": "best of 5 (n x n) @ (n x n) products at the start and at the end of the run; "
            "MFU divides by the larger of the two",
        },
        "same_math_max_abs_diff": diff,
        "configs": results,
        "extras": extras,
        "targets": targets,
        "wall_time_s": round(time.perf_counter() - t_start, 1),
    }
    write_json(args.out, out)
    for t in targets:
        v = "not measured" if t["value"] is None else f"{t['value']:.2f}"
        met = {True: "MET", False: "NOT MET", None: "-"}[t["met"]]
        print(f"target [{t['config']}] {t['target']}: {v} -> {met}")
    print(f"wrote {args.out} in {out['wall_time_s']} s")
    return out


if __name__ == "__main__":
    main()
