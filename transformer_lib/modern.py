"""Today's decoder block: RMSNorm, SwiGLU and a Llama-style language model (generated).

Written from chapters/11_what_came_after.ipynb (11. What came after)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["RMSNorm", "SwiGLU", "make_modern_lm"]

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib.attention import check_positive_int, check_probability
from transformer_lib.attention_variants import RotaryAttention
from transformer_lib.layers import Dropout, check_features, check_norm_args
from transformer_lib.lm import TransformerLM


class RMSNorm(nn.Module):
    """Root-mean-square norm: g * x / sqrt(mean(x^2) + eps).

    Layer norm (chapter 5) without its two shifts: no mean is subtracted
    and no bias is added; only the size of each vector is normalized
    (Zhang and Sennrich, 2019).

    Args:
        features: size of the last dimension (d_model).
        eps: added to the mean square for numerical stability.

    ``forward(x)``: x (..., features) -> same shape. Parameter ``weight``
    (the gain g, ones). Defined in chapter 11.
    """

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        features, eps = check_norm_args(features, eps)  # as LayerNorm's
        self.weight = nn.Parameter(torch.ones(features))  # gain g
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        check_features(x, self.weight.numel())
        # At least float32: in float16 a feature of 256 or more squares to
        # infinity, and the whole vector would come out as zeros.
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        # (..., 1): one root mean square per vector
        rms = xf.pow(2).mean(-1, keepdim=True).add(self.eps).sqrt()
        return self.weight * (xf / rms).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


class SwiGLU(nn.Module):
    """FFN(x) = (SiLU(x W1) * x W3) W2: a gated feed-forward block, no biases.

    SiLU(z) = z * sigmoid(z). The gate SiLU(x W1) scales, feature by
    feature, the value x W3 (Shazeer, 2020). Three matrices instead of two:
    with d_ff two thirds of the 2017 block's, the weights stay the same in
    number (the 2017 block's biases aside).

    Args:
        d_model: input and output width.
        d_ff: hidden width.
        dropout: dropout on the hidden activations, in [0, 1).

    ``forward(x)``: (batch, len, d_model) -> (batch, len, d_model).
    Defined in chapter 11.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        d_ff = check_positive_int(d_ff, "d_ff")
        self.w_1 = nn.Linear(d_model, d_ff, bias=False)  # the gate
        self.w_3 = nn.Linear(d_model, d_ff, bias=False)  # the value
        self.w_2 = nn.Linear(d_ff, d_model, bias=False)  # back to d_model
        self.dropout = Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.silu(self.w_1(x)) * self.w_3(x)  # (batch, len, d_ff)
        return self.w_2(self.dropout(hidden))  # (batch, len, d_model)


def make_modern_lm(
    vocab: int,
    N: int = 2,
    d_model: int = 128,
    d_ff: int = 344,
    h: int = 4,
    kv_heads: int = 2,
    dropout: float = 0.1,
) -> TransformerLM:
    """Chapter 11's decoder-only model, built from today's parts.

    The skeleton is ``TransformerLM``'s (pre-norm blocks, chapter 5); its
    parts are swapped: RMSNorm for every LayerNorm, SwiGLU for the ReLU
    feed-forward block, grouped-query attention with rotary positions
    (``RotaryAttention``, sections 11.3 and 11.4) for multi-head attention
    and added sinusoids, and no bias in any linear layer or norm: a block
    as in Llama 2 (Touvron et al., 2023). Arguments as ``TransformerLM``,
    plus ``kv_heads``. Defined in chapter 11.
    """
    attn = RotaryAttention(h, d_model, kv_heads, dropout, bias=False)
    model = TransformerLM(vocab, N, d_model, d_ff, h, dropout, self_attn=attn, positional="none")
    for layer in model.blocks.layers:  # the same skeleton, new parts
        layer.feed_forward = SwiGLU(d_model, d_ff, dropout)
        for sublayer in layer.sublayer:
            sublayer.norm = RMSNorm(d_model)
    model.blocks.norm = RMSNorm(d_model)  # the last norm of a pre-norm stack
    model.generator.proj = nn.Linear(d_model, vocab, bias=False)
    for w in model.parameters():  # Xavier, as TransformerLM does
        if w.dim() > 1:
            nn.init.xavier_uniform_(w)
    return model
