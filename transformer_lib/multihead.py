"""Multi-head attention, with the fused-kernel path (generated).

Written from chapters/03_multihead_attention.ipynb (3. Multi-head attention)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["MultiHeadedAttention", "fused_attention"]

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib.attention import (
    attention,
    check_mask,
    check_positive_int,
    check_probability,
)


class MultiHeadedAttention(nn.Module):
    """Multi-head attention: h scaled dot-product attentions side by side.

    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O`` with
    ``head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)`` ("Attention Is All You
    Need", Section 3.2.2).

    Args:
        h: number of heads.
        d_model: model width; each head works in ``d_k = d_model // h``
            dimensions.
        dropout: dropout probability on the attention weights, in [0, 1).
        bias: whether the projections have biases (as in
            ``nn.MultiheadAttention``).

    Parameters: ``in_proj`` (d_model -> 3·d_model; rows ``[0:d]``,
    ``[d:2d]``, ``[2d:3d]`` are W^Q, W^K, W^V: the layout of
    ``nn.MultiheadAttention.in_proj_weight``) and ``out_proj`` (W^O). With
    ``store_attention = True`` the weights of the last call are kept in
    ``attn`` (batch, h, q_len, k_len), after dropout; otherwise ``attn`` is
    None.

    Which path attends, by rule: chapter 1's ``attention`` when the weights
    are stored, and when training with dropout on the weights (p > 0) on a
    CPU in bf16 or fp16 (under autocast); PyTorch's fused
    ``F.scaled_dot_product_attention`` otherwise (fp32, evaluation, p = 0,
    other devices). ``always_fused = True`` takes the fused kernel wherever
    the weights are not stored.

    Defined in chapter 3.
    """

    def __init__(self, h: int, d_model: int, dropout: float = 0.1, bias: bool = True) -> None:
        super().__init__()
        h = check_positive_int(h, "h")
        d_model = check_positive_int(d_model, "d_model")
        if d_model % h:
            raise ValueError(
                "d_model must be divisible by h (each head gets d_model / h "
                f"dimensions), got d_model={d_model} and h={h}"
            )
        p = check_probability(dropout, "dropout")
        self.h, self.d_k, self.d_model = h, d_model // h, d_model
        # [W^Q; W^K; W^V]
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.dropout = nn.Dropout(p)  # on the attention weights
        self.store_attention = False
        # True: the fused kernel even where the rule picks chapter 1's path
        self.always_fused = False
        self.attn: Tensor | None = None
        # nn.MultiheadAttention's initialization: Xavier for W^Q, W^K, W^V,
        # zero biases.
        nn.init.xavier_uniform_(self.in_proj.weight)
        if bias:
            nn.init.zeros_(self.in_proj.bias)
            nn.init.zeros_(self.out_proj.bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """query (batch, q_len, d_model), key and value (batch, k_len,
        d_model), mask bool broadcastable to (batch, q_len, k_len) or
        (batch, h, q_len, k_len), True = may attend
        -> (batch, q_len, d_model).
        """
        _check_input(query, "query", self.d_model)
        if query is key and key is value:  # self-attention: one product
            qkv = self._project(query, slice(None))  # (batch, len, 3·d)
            # 3 × (batch, h, len, d_k)
            q, k, v = (self._split(t) for t in qkv.chunk(3, dim=-1))
            return self._attend_heads(q, k, v, mask)
        _check_input(key, "key", self.d_model, batch=query.size(0))
        return self.attend(query, *self.project_kv(key, value), mask=mask)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """1) Project keys and values and split them into heads.

        key, value (batch, k_len, d_model) -> k, v, each (batch, h, k_len,
        d_k): what a key/value cache stores (chapter 7).
        """
        _check_input(key, "key", self.d_model)
        _check_input(value, "value", self.d_model, batch=key.size(0), batch_of="key")
        if value.size(1) != key.size(1):
            raise ValueError(
                f"value must have as many positions as key, got key of shape "
                f"{tuple(key.shape)} and value of shape {tuple(value.shape)}"
            )
        d = self.d_model
        if key is value:
            # e.g. attention over the encoder's `memory`: one product
            k, v = self._project(key, slice(d, 3 * d)).chunk(2, dim=-1)
        else:
            k = self._project(key, slice(d, 2 * d))
            v = self._project(value, slice(2 * d, 3 * d))
        return self._split(k), self._split(v)  # (batch, h, k_len, d_k) each

    def attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """Project ``query`` (batch, q_len, d_model) and attend over projected
        ``k``, ``v`` (batch, h, k_len, d_k) from :meth:`project_kv`
        -> (batch, q_len, d_model)."""
        _check_input(query, "query", self.d_model)
        _check_projected(k, v, query.size(0), self.h, self.d_k)
        # (batch, h, q_len, d_k)
        q = self._split(self._project(query, slice(0, self.d_model)))
        return self._attend_heads(q, k, v, mask)

    def _attend_heads(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """2) attend in every head, 3) concatenate the heads and apply W^O."""
        if mask is not None:  # (…, q_len, k_len) or (batch, h, q_len, k_len)
            no_head_dim = isinstance(mask, Tensor) and mask.dim() == 3
            batch_shape = (q.size(0),) if no_head_dim else (q.size(0), self.h)
            mask = check_mask(mask, q.size(2), k.size(2), batch_shape=batch_shape)
            if no_head_dim:
                # (batch, 1, q_len, k_len): the same in every head
                mask = mask.unsqueeze(1)
        if self.store_attention:  # chapter 1's attention, keeping the weights
            # (batch, h, q_len, d_k), (batch, h, q_len, k_len)
            x, self.attn = attention(q, k, v, mask, self.dropout)
        elif self._explicit_is_faster(q):  # the same, the weights dropped
            x, self.attn = attention(q, k, v, mask, self.dropout)[0], None
        else:  # PyTorch's fused kernel (chapter 3's engineering note)
            p = self.dropout.p if self.training else 0.0
            x, self.attn = _fast_attention(q, k, v, mask, p), None
        return self.out_proj(self._merge(x))  # (batch, q_len, d_model)

    def _explicit_is_faster(self, q: Tensor) -> bool:
        """The rule: chapter 1's attention when training with dropout on
        the weights on a CPU in bf16 or fp16."""
        # With dropout_p > 0 the fused kernel falls back to its math kernel
        # on a CPU, the same steps as chapter 1's attention, which
        # _fast_attention runs in fp32: under autocast the explicit path,
        # its products in bf16, measured faster. In fp32 the two measured
        # even, and without dropout the fused kernel is the faster one.
        return (
            self.training
            and self.dropout.p > 0
            and q.device.type == "cpu"
            and q.dtype in (torch.bfloat16, torch.float16)
            and not self.always_fused
        )

    def _project(self, x: Tensor, rows: slice) -> Tensor:
        """x @ in_proj[rows]ᵀ + bias[rows]: one, two or all three of W^Q,
        W^K, W^V at once."""
        b = self.in_proj.bias
        w = self.in_proj.weight[rows]
        return F.linear(x, w, None if b is None else b[rows])

    def _split(self, x: Tensor) -> Tensor:
        """(batch, len, d_model) -> (batch, h, len, d_k): head i gets columns
        i·d_k … (i+1)·d_k - 1."""
        return x.unflatten(-1, (self.h, self.d_k)).transpose(1, 2)

    def _merge(self, x: Tensor) -> Tensor:
        """(batch, h, len, d_k) -> (batch, len, d_model): concatenate the
        heads."""
        return x.transpose(1, 2).flatten(-2)


def _check_input(
    x: Tensor,
    name: str,
    d_model: int,
    batch: int | None = None,
    batch_of: str = "query",
) -> None:
    """ValueError unless ``x`` is a floating (batch, len, d_model) tensor
    (with ``batch`` rows)."""
    if not isinstance(x, Tensor) or x.dim() != 3 or not x.is_floating_point():
        got = (tuple(x.shape), x.dtype) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"{name} must be a floating-point tensor of shape "
            f"(batch, len, d_model={d_model}), got {got}"
        )
    if x.size(-1) != d_model:
        raise ValueError(
            f"{name}'s last dimension must be d_model={d_model}, "
            f"got {name} of shape {tuple(x.shape)}"
        )
    if batch is not None and x.size(0) != batch:
        raise ValueError(
            f"{name} must have the {batch_of}'s batch size {batch}, "
            f"got {name} of shape {tuple(x.shape)}"
        )


def _check_projected(k: Tensor, v: Tensor, batch: int, h: int, d_k: int) -> None:
    """ValueError unless ``k`` and ``v`` are (batch, h, k_len, d_k) tensors
    of one k_len, as :meth:`MultiHeadedAttention.project_kv` returns them."""
    for name, t in (("k", k), ("v", v)):
        if (
            not isinstance(t, Tensor)
            or t.dim() != 4
            or t.shape[:2] != (batch, h)
            or t.size(-1) != d_k
            or t.size(2) != k.size(2)
        ):
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must be projected by project_kv, of shape "
                f"(batch={batch}, h={h}, k_len, d_k={d_k}) like k, got {got}"
            )


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float) -> Tensor:
    """Scaled dot-product attention in every head, with the fused kernel.

    softmax(q k^T / sqrt(d_k)) v ("Attention Is All You Need", section
    3.2.1), computed by PyTorch's ``F.scaled_dot_product_attention``, which
    does not return the weights. Fully masked rows follow the book's
    convention: a query with no allowed key gets a zero output, like
    chapter 1's ``attention``, whatever the kernel would give for it.

    Args:
        q: (batch, h, q_len, d_k) queries, split into heads.
        k, v: (batch, h, k_len, d_k) keys and values.
        mask: bool, True = may attend, broadcastable to
            (batch, h, q_len, k_len); or None.
        p: dropout probability on the attention weights (0 in evaluation).

    Returns (batch, h, q_len, d_k). Defined in chapter 3.
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    sees_any = mask.any(dim=-1, keepdim=True)  # (…, q_len, 1)
    # The usual case, nothing to repair; checked on the CPU only (on a GPU,
    # reading the answer would make the host wait for the device).
    if q.device.type == "cpu" and bool(sees_any.all()):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    # Unmask fully masked rows for the kernel (no NaN, no NaN gradients),
    # then zero their outputs.
    keep = mask | ~sees_any
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p)
    return out.masked_fill(~sees_any, 0.0)  # (batch, h, q_len, d_k)


def _fast_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p: float) -> Tensor:
    """:func:`fused_attention`, in fp32 for bf16/fp16 inputs on a CPU.

    Same arguments and result (in the inputs' dtype). A speed-only variant:
    on the CPU the performance appendix measured (AVX-512 with bf16
    instructions and AMX matrix units), PyTorch's fused CPU kernel was
    slower in bf16 than in fp32.
    """
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        # autocast would cast the fp32 inputs straight back to bf16
        with torch.autocast("cpu", enabled=False):
            out = fused_attention(q.float(), k.float(), v.float(), mask, p)
        return out.to(q.dtype)
    return fused_attention(q, k, v, mask, p)
