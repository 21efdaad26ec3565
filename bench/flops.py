"""The analytic FLOPs model of one training step, behind the appendix's MFU column.

Imported by ``bench.train_throughput`` (run ``python -m bench.train_throughput``); measures
nothing by itself. :func:`train_flops` counts the matrix-product FLOPs of a step from the
model's sizes and a batch's lengths; :func:`counted_flops` counts them with PyTorch's
``FlopCounterMode``, the independent check that the tests (and every benchmark run, on its
first batch) compare the formula with.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.train_models import BenchConfig
from transformer_lib.training import Batch
from transformer_lib.translation.data import PAD


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
    src_real = batch.src != PAD  # (B, S)
    tgt_real = batch.tgt != PAD  # (B, T)
    if padded:
        s = torch.full((batch.src.size(0),), batch.src.size(1), dtype=torch.float64)
        t = torch.full((batch.tgt.size(0),), batch.tgt.size(1), dtype=torch.float64)
    else:
        s = src_real.sum(1).double().cpu()
        t = tgt_real.sum(1).double().cpu()
    S, T = float(s.sum()), float(t.sum())
    # the feed-forward blocks' tokens: the padded tensors, or the real tokens when skipping
    S_ffn, T_ffn = (float(src_real.sum()), float(tgt_real.sum())) if skip_padding else (S, T)
    enc_linear = cfg.N * (4 * d * d * S + 2 * d * d_ff * S_ffn)
    dec_linear = cfg.N * ((4 * d * d + 2 * d * d) * T + 2 * d * d_ff * T_ffn + 2 * d * d * S)
    gen_linear = d * V * (float((batch.tgt_y != PAD).sum()) if real_token_generator else T)
    attn = cfg.N * 4 * d * float((s * s).sum() + (t * t).sum() + (t * s).sum())
    forward = 2 * (enc_linear + dec_linear + gen_linear) + attn
    return 3.0 * forward


def counted_flops(step: Callable[[Batch], object], batch: Batch) -> float:
    """FLOPs of one step as counted by ``torch.utils.flop_counter.FlopCounterMode`` (a check)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step(batch)
    return float(counter.get_total_flops())
