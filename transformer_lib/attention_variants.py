"""Grouped-query attention and rotary position embeddings (RoPE) (generated).

Written from chapters/11_what_came_after.ipynb (11. What came after)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = [
    "GroupedQueryAttention",
    "gqa_from_multihead",
    "kv_cache_bytes",
    "apply_rope",
    "RotaryAttention",
]

import operator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib.attention import (
    check_mask,
    check_positive_int,
    check_probability,
)
from transformer_lib.multihead import MultiHeadedAttention, fused_attention


def _check_heads(h: object, d_model: object, kv_heads: object) -> None:
    for name, n in (("h", h), ("d_model", d_model), ("kv_heads", kv_heads)):
        check_positive_int(n, name)
    if d_model % h:
        raise ValueError(f"d_model must be divisible by h, got d_model={d_model}, h={h}")
    if h % kv_heads:
        raise ValueError(
            "kv_heads must divide h (each group has h / kv_heads query "
            f"heads), got h={h}, kv_heads={kv_heads}"
        )


def _check_input(
    x: object,
    name: str,
    d_model: int,
    leading: tuple[int, ...] = (),
    of: str = "",
) -> None:
    """ValueError unless ``x`` is a floating (batch, len, d_model) tensor
    whose first dimensions are ``leading`` (those of the tensor ``of``)."""
    if (
        not isinstance(x, Tensor)
        or x.dim() != 3
        or x.size(-1) != d_model
        or not x.is_floating_point()
    ):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"{name} must be a floating-point tensor of shape "
            f"(batch, len, d_model={d_model}), got {got}"
        )
    if x.shape[: len(leading)] != leading:  # nothing may broadcast silently
        raise ValueError(
            f"{name} must share the first dimensions {tuple(leading)} of "
            f"{of}, got {name} of shape {tuple(x.shape)}"
        )


def _check_rope_args(x: object, start: object, base: object) -> int:
    if not isinstance(x, Tensor) or x.dim() < 2 or x.size(-1) % 2:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a (..., len, d) tensor with d even, got {got}")
    if isinstance(start, bool):
        raise ValueError(f"start must be an integer position >= 0, got {start!r}")
    try:
        start = operator.index(start)
    except TypeError:
        raise ValueError(f"start must be an integer position >= 0, got {start!r}") from None
    if start < 0:
        raise ValueError(f"start must be an integer position >= 0, got {start}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 0 < base < float("inf"):
        raise ValueError(f"base must be a finite number > 0, got {base!r}")
    return start


class GroupedQueryAttention(nn.Module):
    """Multi-head attention whose h query heads share kv_heads key/value
    heads.

    The query heads are split into kv_heads groups of h / kv_heads heads;
    each group attends with one shared key head and value head (Ainslie et
    al., 2023, GQA). kv_heads = h is multi-head attention ("Attention Is All
    You Need", section 3.2.2); kv_heads = 1 is multi-query attention
    (Shazeer, 2019). A key/value cache stores kv_heads heads instead of h.

    Args:
        h: query heads.
        d_model: model width; each head has d_k = d_model // h dimensions.
        kv_heads: key/value heads; must divide h.
        dropout: dropout on the attention weights, in [0, 1).
        bias: whether the projections have biases.

    Parameters: ``q_proj`` (W^Q, d_model -> d_model), ``kv_proj`` ([W^K;
    W^V], d_model -> 2 * kv_heads * d_k), ``out_proj`` (W^O). The interface
    is ``MultiHeadedAttention``'s: ``forward(query, key, value, mask)``,
    ``project_kv`` (what a cache stores) and ``attend``.
    Defined in chapter 11.
    """

    def __init__(
        self,
        h: int,
        d_model: int,
        kv_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        _check_heads(h, d_model, kv_heads)
        self.h, self.kv_heads, self.d_model = h, kv_heads, d_model
        self.d_k = d_model // h
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q
        # [W^K; W^V]: kv_heads heads each
        self.kv_proj = nn.Linear(d_model, 2 * kv_heads * self.d_k, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.p = check_probability(dropout, "dropout")

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """query (batch, q_len, d_model), key and value (batch, k_len,
        d_model), mask bool broadcastable to (batch, q_len, k_len)
        -> (batch, q_len, d_model)."""
        return self.attend(query, *self.project_kv(key, value), mask)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """key, value (batch, k_len, d_model) -> k, v, each (batch,
        kv_heads, k_len, d_k)."""
        _check_input(key, "key", self.d_model)
        # (batch, len) of the keys: one value per key
        _check_input(value, "value", self.d_model, key.shape[:2], "key")
        n = self.kv_heads * self.d_k
        w, b = self.kv_proj.weight, self.kv_proj.bias
        k = F.linear(key, w[:n], None if b is None else b[:n])
        v = F.linear(value, w[n:], None if b is None else b[n:])
        return self._split(k), self._split(v)  # (batch, kv_heads, k_len, d_k)

    def attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """query (batch, q_len, d_model) over projected k, v (batch,
        kv_heads, k_len, d_k) -> (batch, q_len, d_model). ``RotaryAttention``
        takes the queries to be the last q_len of the k_len positions
        (self-attention, or a step over a cache)."""
        _check_input(query, "query", self.d_model, k.shape[:1], "k")
        q = self._split(self.q_proj(query))  # (batch, h, q_len, d_k)
        q, k = self.rotate(q, k)
        # 1) each key/value head serves the h / kv_heads queries of its group
        group = self.h // self.kv_heads
        k = k.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k)
        v = v.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k)
        if mask is not None:  # (…, q_len, k_len) -> (…, 1, q_len, k_len)
            heads = () if getattr(mask, "ndim", 0) <= 3 else (self.h,)
            mask = check_mask(mask, q.size(2), k.size(2), batch_shape=(q.size(0), *heads))
            mask = mask.unsqueeze(-3) if mask.dim() == 3 else mask
        # 2) attend in every head, with chapter 3's fused kernel
        p = self.p if self.training else 0.0
        x = fused_attention(q, k, v, mask, p)  # (batch, h, q_len, d_k)
        # 3) concatenate the heads and apply W^O
        return self.out_proj(x.transpose(1, 2).flatten(-2))

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """A position-dependent change of q (batch, h, q_len, d_k) and k
        (batch, kv_heads, k_len, d_k) before scoring: none here (positions
        come with the embeddings); see ``RotaryAttention``."""
        return q, k

    def _split(self, x: Tensor) -> Tensor:
        """(batch, len, heads * d_k) -> (batch, heads, len, d_k)."""
        return x.unflatten(-1, (-1, self.d_k)).transpose(1, 2)


def gqa_from_multihead(mha: MultiHeadedAttention) -> GroupedQueryAttention:
    """A ``GroupedQueryAttention`` with kv_heads = h and ``mha``'s weights:
    the same function as ``mha``. Defined in chapter 11."""
    if not isinstance(mha, MultiHeadedAttention):
        raise ValueError(f"mha must be a MultiHeadedAttention, got {type(mha).__name__}")
    d, has_bias = mha.d_model, mha.in_proj.bias is not None
    gqa = GroupedQueryAttention(mha.h, d, mha.h, mha.dropout.p, has_bias)
    with torch.no_grad():  # in_proj rows: [W^Q; W^K; W^V]
        gqa.q_proj.weight.copy_(mha.in_proj.weight[:d])
        gqa.kv_proj.weight.copy_(mha.in_proj.weight[d:])
        gqa.out_proj.weight.copy_(mha.out_proj.weight)
        if has_bias:
            gqa.q_proj.bias.copy_(mha.in_proj.bias[:d])
            gqa.kv_proj.bias.copy_(mha.in_proj.bias[d:])
            gqa.out_proj.bias.copy_(mha.out_proj.bias)
    return gqa


def kv_cache_bytes(
    layers: int,
    kv_heads: int,
    d_head: int,
    context: int,
    batch: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """Bytes of a key/value cache holding ``context`` positions.

    2 (keys and values) * layers * kv_heads * d_head * context * batch *
    bytes_per_value; e.g. 2 bytes for fp16/bf16, 4 for fp32. Defined in
    chapter 11.
    """
    for name, n in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("d_head", d_head),
        ("context", context),
        ("batch", batch),
        ("bytes_per_value", bytes_per_value),
    ):
        check_positive_int(n, name)
    return 2 * layers * kv_heads * d_head * context * batch * bytes_per_value


def apply_rope(x: Tensor, start: int = 0, base: float = 10000.0) -> Tensor:
    """Rotary position embedding: rotate feature pairs by position angles.

    Pair i (features 2i and 2i + 1, the interleaved layout of chapter 4's
    table) of the row at position m is rotated by the angle
    m * base^(-2i/d): the frequencies of the sinusoidal encoding. For a
    query at position m and a key at n, the rotated q . k then depends on
    m - n only (Su et al., 2021, RoFormer).

    Args:
        x: (..., len, d) with d even; its rows are positions start, start +
            1, ... (e.g. queries or keys, (batch, heads, len, d_k)).
        start: the position of the first row, >= 0.
        base: the base of the frequencies (10000, as in chapter 4).

    Returns a tensor of x's shape and dtype. Defined in chapter 11.
    """
    start = _check_rope_args(x, start, base)
    d, n = x.size(-1), x.size(-2)
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pos = torch.arange(start, start + n, dtype=torch.float64)
    angle = (pos[:, None] * omega).to(x.device)  # (len, d/2), exact in fp64
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., len, d/2): each pair
    # (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) in every plane
    rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.flatten(-2)  # (..., len, d), pairs interleaved again


class RotaryAttention(GroupedQueryAttention):
    """Grouped-query attention with rotary position embeddings (RoPE).

    Queries and keys are rotated by ``apply_rope`` after their projection,
    so the scores depend on positions through their offset only, and no
    positional encoding is added to the embeddings (Su et al., 2021). Keys
    are rotated when read, so a cache holds them unrotated (simple, and the
    interface stays ``MultiHeadedAttention``'s; production code caches
    rotated keys). Arguments as ``GroupedQueryAttention``, plus ``base``.
    Defined in chapter 11.
    """

    def __init__(
        self,
        h: int,
        d_model: int,
        kv_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        base: float = 10000.0,
    ) -> None:
        super().__init__(h, d_model, kv_heads, dropout, bias)
        if self.d_k % 2:
            raise ValueError(f"d_model / h must be even, got {self.d_k}")
        self.base = float(base)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        k_len, q_len = k.size(2), q.size(2)
        if q_len > k_len:  # cross-attention has no shared positions
            raise ValueError(
                f"query has {q_len} positions, more than the keys' {k_len}: "
                "rotary attention reads its queries as the last positions "
                "of the keys' sequence"
            )
        k = apply_rope(k, 0, self.base)  # positions 0 .. k_len - 1
        q = apply_rope(q, k_len - q_len, self.base)  # the last q_len of them
        return q, k
