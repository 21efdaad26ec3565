"""Embeddings, layer norm, residual sublayers, feed-forward, encoder and decoder (generated).

Written from chapters/05_model.ipynb (5. Layers and the full model)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = [
    "Embeddings",
    "layer_norm_by_hand",
    "check_norm_args",
    "check_features",
    "LayerNorm",
    "SublayerConnection",
    "Dropout",
    "PositionwiseFeedForward",
    "clones",
    "EncoderLayer",
    "Encoder",
    "visible_positions",
    "on_positions",
    "DecoderLayer",
    "Decoder",
    "Generator",
]

import copy
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib.attention import check_positive_int, check_probability


def _is_integer_tensor(x: Tensor) -> bool:
    return isinstance(x, Tensor) and x.dtype in (torch.int64, torch.int32)


class Embeddings(nn.Module):
    """Token embeddings scaled by sqrt(d_model).

    Args:
        vocab: vocabulary size (rows of the table).
        d_model: embedding width.
        padding_idx: optional id whose row starts as the zero vector and
            gets no gradient through the lookup.

    ``forward(x)``: x (batch, len) int64/int32 token ids -> (batch, len,
    d_model). Paper section 3.4. Defined in chapter 5.
    """

    def __init__(self, vocab: int, d_model: int, padding_idx: int | None = None) -> None:
        super().__init__()
        vocab = check_positive_int(vocab, "vocab")
        d_model = check_positive_int(d_model, "d_model")
        if padding_idx is not None and not 0 <= padding_idx < vocab:
            raise ValueError(f"padding_idx must be in [0, vocab={vocab}), got {padding_idx}")
        self.lut = nn.Embedding(vocab, d_model, padding_idx=padding_idx)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        if not _is_integer_tensor(x):
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be a tensor of integer token ids (torch.long), got {got}")
        return self.lut(x) * math.sqrt(self.d_model)  # (batch, len, d_model)


def layer_norm_by_hand(x: Tensor, g: Tensor, b: Tensor, eps: float = 1e-6) -> Tensor:
    """g * (x - mean) / sqrt(var + eps) + b over the last dimension, by hand.

    The reference definition ``LayerNorm`` is tested against (and the
    benchmarks' textbook model uses): x (..., d), gain g and bias b (d,) ->
    same shape as x. Defined in chapter 5.
    """
    mean = x.mean(-1, keepdim=True)  # (..., 1)
    # (..., 1), biased: divides by d
    var = x.var(-1, keepdim=True, correction=0)
    return g * (x - mean) / torch.sqrt(var + eps) + b


def check_norm_args(features: int, eps: float) -> tuple[int, float]:
    """A norm's width and epsilon, checked (``LayerNorm``, ``RMSNorm``).

    features must be a positive int and eps a positive number; the error
    names the argument. Defined in chapter 5.
    """
    features = check_positive_int(features, "features")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    return features, eps


def check_features(x: Tensor, features: int) -> None:
    """Raise a ValueError unless x's last dimension has ``features`` entries.

    Without it a wrong width fails inside torch (``F.layer_norm``) or,
    when the last dimension is 1, broadcasts silently (``RMSNorm``).
    Defined in chapter 5.
    """
    if x.size(-1) != features:
        raise ValueError(
            f"x must have {features} features in its last dimension, got shape {tuple(x.shape)}"
        )


class LayerNorm(nn.Module):
    """Layer norm over the last dim: g * (x - mean) / sqrt(var + eps) + b.

    Uses the biased variance and eps inside the square root, so it equals
    ``nn.LayerNorm``.

    Args:
        features: size of the last dimension (d_model).
        eps: added to the variance for numerical stability.

    ``forward(x)``: x (..., features) -> same shape. Parameters ``weight``
    (gain g, ones) and ``bias`` (b, zeros). Ba et al. (2016); paper section
    3.1. Defined in chapter 5.
    """

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        features, eps = check_norm_args(features, eps)
        self.weight = nn.Parameter(torch.ones(features))  # gain g
        self.bias = nn.Parameter(torch.zeros(features))  # bias b
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        check_features(x, self.weight.numel())
        # layer_norm_by_hand(x, self.weight, self.bias, self.eps), fused
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


class SublayerConnection(nn.Module):
    """A residual connection around a sublayer, layer norm after or before it.

    post-norm (``norm_first=False``, the paper):
    ``norm(x + dropout(sublayer(x)))``.

    pre-norm (``norm_first=True``, a deviation):
    ``x + dropout(sublayer(norm(x)))``.

    Args:
        size: d_model.
        dropout: dropout probability applied to the sublayer's output (paper
            section 5.4).
        norm_first: pre-norm if True.

    ``forward(x, sublayer)``: x (batch, len, size); sublayer maps such a
    tensor to one of the same shape. Paper section 3.1 (residual + LayerNorm).
    Defined in chapter 5.
    """

    def __init__(self, size: int, dropout: float, norm_first: bool = False) -> None:
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = Dropout(check_probability(dropout))
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))  # pre-norm
        # post-norm: LayerNorm(x + Sublayer(x))
        return self.norm(x + self.dropout(sublayer(x)))


class Dropout(nn.Dropout):
    """``nn.Dropout`` with a CPU mask of 16 random bits per entry: faster.

    Args:
        p: probability of zeroing an entry, in [0, 1).

    ``forward(x)``: in training, each entry is zeroed with probability p
    rounded to a multiple of 2^-16 (at most 1 - 2^-16; 0.1 becomes
    0.100006), and the others are scaled by one over the kept probability;
    in evaluation (or with p = 0), x itself. Other devices use
    ``nn.Dropout``'s kernel. Paper section 5.4. Defined in chapter 5.
    """

    def __init__(self, p: float = 0.1) -> None:
        super().__init__(check_probability(p, "p"))

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu":
            return super().forward(x)
        # one 64-bit draw gives four 16-bit entries, read from -2^15 to
        # 2^15 - 1; an entry survives with probability 1 - drop / 2^16
        drop = min(round(self.p * 2**16), 2**16 - 1)
        n = x.numel()
        bits = torch.empty((n + 3) // 4, dtype=torch.int64)
        bits = bits.random_(-(2**63), None).view(torch.int16)[:n]
        keep = bits.view(x.shape) >= drop - 2**15
        return torch.where(keep, x * (2**16 / (2**16 - drop)), 0.0)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, at each position separately.

    Args:
        d_model: input and output width.
        d_ff: hidden width (2048 = 4 * 512 in the paper).
        dropout: dropout on the hidden activations.
        activation: "relu" (the paper) or "gelu".

    ``forward(x)``: (batch, len, d_model) -> (batch, len, d_model). Paper
    section 3.3. Defined in chapter 5.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        dropout: float = 0.1,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        d_ff = check_positive_int(d_ff, "d_ff")
        if activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {activation!r}")
        self.w_1 = nn.Linear(d_model, d_ff)  # W1, b1
        self.w_2 = nn.Linear(d_ff, d_model)  # W2, b2
        self.dropout = Dropout(check_probability(dropout))
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        act = F.relu if self.activation == "relu" else F.gelu
        hidden = self.dropout(act(self.w_1(x)))  # (batch, len, d_ff)
        return self.w_2(hidden)  # (batch, len, d_model)


def clones(module: nn.Module, N: int) -> nn.ModuleList:
    """N independent deep copies of ``module`` (no shared weights), in a list.

    Args:
        module: the module to copy.
        N: number of copies (>= 1).

    The paper stacks N = 6 identical layers with separate weights (section
    3.1). The copies start equal; ``make_model`` re-initializes them. Defined
    in chapter 5.
    """
    N = check_positive_int(N, "N")
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


class EncoderLayer(nn.Module):
    """One encoder layer: self-attention and feed-forward, each in a residual.

    Args:
        size: d_model.
        self_attn: a MultiHeadedAttention (chapter 3).
        feed_forward: a PositionwiseFeedForward.
        dropout: residual dropout.
        norm_first: pre-norm blocks if True (a deviation; the paper is
            post-norm).
        skip_padding: run the feed-forward block on the visible positions only
            (see ``visible_positions``); padding positions then pass through
            it unchanged. Exact for the package's padding and causal masks;
            pass False with a mask under which some real position is seen
            by no query (its output would skip the block too).

    ``forward(x, mask)``: x (batch, src_len, d_model), mask bool (batch, 1,
    src_len) with True = may attend -> (batch, src_len, d_model). Paper
    section 3.1. Defined in chapter 5.
    """

    def __init__(
        self,
        size: int,
        self_attn: nn.Module,
        feed_forward: nn.Module,
        dropout: float,
        norm_first: bool = False,
        skip_padding: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first), 2)
        self.size = size
        self.norm_first = norm_first
        self.skip_padding = skip_padding

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        # 1) self-attention
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))
        # 2) feed-forward
        if not self.skip_padding:
            return self.sublayer[1](x, self.feed_forward)
        # the same on the real positions only (engineering note below)
        rows = visible_positions(mask, x)
        return on_positions(lambda y: self.sublayer[1](y, self.feed_forward), x, rows)


class Encoder(nn.Module):
    """N encoder layers (separate weights), and a final LayerNorm if pre-norm.

    Args:
        layer: an EncoderLayer to copy N times.
        N: number of layers (6 in the paper).

    ``forward(x, mask)``: x (batch, src_len, d_model) embedded source, mask
    (batch, 1, src_len) -> memory (batch, src_len, d_model). Paper section
    3.1. Defined in chapter 5.
    """

    def __init__(self, layer: EncoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)  # checks N
        # Post-norm layers end normalized already; a pre-norm stack needs
        # one last norm.
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)  # (batch, src_len, d_model)
        return self.norm(x)


def visible_positions(mask: Tensor | None, x: Tensor) -> Tensor | None:
    """Flat indices into ``x.flatten(0, 1)`` of the positions a query may see.

    mask: a self-attention mask, bool (batch | 1, q_len | 1, len), True = may
    attend; x (batch, len, d_model). A position whose key no query may attend
    to (its column is all False) is treated as padding: it influences no
    other position, so only its own output would change, and under
    ``padding_mask`` and ``subsequent_mask`` such a position is padding.
    Returns None when every position is visible, or when the mask is not a
    plain 3-d self-attention mask. Defined in chapter 5.
    """
    if mask is None or mask.dim() != 3 or mask.size(-1) != x.size(1):
        return None
    if mask.device.type == "meta" or torch.compiler.is_compiling():
        # how many positions are visible is data, unknown when tracing shapes
        return None
    # (batch, len): seen by some query
    seen = mask.any(dim=-2).expand(x.size(0), x.size(1))
    if bool(seen.all()):
        return None
    return seen.flatten().nonzero().squeeze(1)  # (n_visible,)


def on_positions(f: Callable[[Tensor], Tensor], x: Tensor, rows: Tensor | None) -> Tensor:
    """Position-wise ``f`` on the positions ``rows`` of x only.

    x (batch, len, d); rows: flat indices from ``visible_positions`` (None =
    all positions). ``f`` sees (n_visible, d) instead of (batch, len, d).
    Defined in chapter 5.
    """
    if rows is None:
        return f(x)
    flat = x.flatten(0, 1)  # (batch·len, d)
    out = f(flat.index_select(0, rows))  # (n_visible, d)
    # hidden positions keep their input
    return flat.index_copy(0, rows, out).view_as(x)


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, attention to memory, FFN.

    Args:
        size: d_model.
        self_attn: MultiHeadedAttention over the target prefix (causal mask).
        src_attn: MultiHeadedAttention from the target to the memory (encoder
            output).
        feed_forward: a PositionwiseFeedForward.
        dropout: residual dropout.
        norm_first: pre-norm blocks if True (a deviation; the paper is
            post-norm).
        skip_padding: run the feed-forward block on the visible positions only
            (see ``visible_positions``, applied to ``tgt_mask``).

    ``forward(x, memory, src_mask, tgt_mask)``: x (batch, tgt_len, d_model),
    memory (batch, src_len, d_model), src_mask (batch, 1, src_len), tgt_mask
    (batch | 1, tgt_len, tgt_len) -> (batch, tgt_len, d_model). Paper section
    3.1. Defined in chapter 5.
    """

    def __init__(
        self,
        size: int,
        self_attn: nn.Module,
        src_attn: nn.Module,
        feed_forward: nn.Module,
        dropout: float,
        norm_first: bool = False,
        skip_padding: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first), 3)
        self.size = size
        self.norm_first = norm_first
        self.skip_padding = skip_padding

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        m = memory
        # 1) masked self-attention
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        # 2) attention to the memory
        x = self.sublayer[1](x, lambda y: self.src_attn(y, m, m, src_mask))
        # 3) feed-forward
        if not self.skip_padding:
            return self.sublayer[2](x, self.feed_forward)
        # the same on the real positions only (engineering note, section 5.6)
        rows = visible_positions(tgt_mask, x)
        return on_positions(lambda y: self.sublayer[2](y, self.feed_forward), x, rows)


class Decoder(nn.Module):
    """N decoder layers (separate weights), and a final LayerNorm if pre-norm.

    Args:
        layer: a DecoderLayer to copy N times.
        N: number of layers (6 in the paper).

    ``forward(x, memory, src_mask, tgt_mask)``: x (batch, tgt_len, d_model)
    embedded target prefix; every layer attends to the same memory -> (batch,
    tgt_len, d_model). Paper section 3.1. Defined in chapter 5.
    """

    def __init__(self, layer: DecoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)  # checks N
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        for layer in self.layers:
            # (batch, tgt_len, d_model)
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


class Generator(nn.Module):
    """The output layer: a linear map to vocabulary logits, then log-softmax.

    Args:
        d_model: input width.
        vocab: target vocabulary size.

    ``forward(x)``: (batch, len, d_model) -> log-probabilities (batch, len,
    vocab). Paper section 3.4. Defined in chapter 5.
    """

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        vocab = check_positive_int(vocab, "vocab")
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(self.proj(x), dim=-1)  # (batch, len, vocab)
