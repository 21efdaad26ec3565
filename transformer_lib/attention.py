"""Scaled dot-product attention, the masked softmax and the shared input checks (generated).

Written from chapters/01_attention.ipynb (1. Attention)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = [
    "masked_softmax",
    "attention",
    "check_mask",
    "check_probability",
    "check_positive_int",
    "AdditiveAttention",
]

import math
import numbers

import torch
from torch import Tensor, nn


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last dimension that gives masked entries zero weight.

    Args:
        scores: attention scores ``(..., q_len, k_len)``, floating point.
        mask: bool tensor broadcastable to ``scores`` (True = may attend),
            already validated (see :func:`check_mask`), or None.

    Returns weights of the same shape as ``scores``. Rows where every key is
    masked get all-zero weights (not NaN, not uniform): "nothing to attend
    to". Section 3.2.3 of the paper (masking inside scaled dot-product
    attention); chapter 2 explains the choice. Defined in chapter 1.
    """
    if mask is None:
        return scores.softmax(dim=-1)
    # 1) the most negative finite value: exp(min - max) underflows to exactly
    #    0, and unlike -inf a fully masked row does not become
    #    (-inf) - (-inf) = NaN inside the softmax.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # 2) softmax, then 3) zero the masked entries, which turns fully masked
    #    rows into zeros (they came out of the softmax uniform).
    return scores.softmax(dim=-1).masked_fill(~mask, 0.0)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout: nn.Module | None = None,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention: ``softmax(Q Kᵀ / √d_k) V``.

    Args:
        query: ``(..., q_len, d_k)``.
        key: ``(..., k_len, d_k)``.
        value: ``(..., k_len, d_v)``.
        mask: bool (or 0/1 integer) tensor broadcastable to ``(..., q_len,
            k_len)``, True where a query may attend to a key. Masked keys get
            exactly zero weight; a query with no key allowed gets zero weights
            and a zero output.
        dropout: module applied to the attention weights (e.g.
            ``nn.Dropout(0.1)``), or None.

    Returns:
        ``(output, weights)``: output ``(..., q_len, d_v)`` and the weights
        actually used, ``(..., q_len, k_len)`` (after dropout), so that
        ``output == weights @ value``.

    "Attention Is All You Need", Section 3.2.1 (Equation 1). Defined in
    chapter 1.
    """
    _check_attention_args(query, key, value, dropout)  # names a bad argument
    d_k = query.size(-1)
    # 1) scores: every query against every key, scaled by 1/√d_k
    # (..., q_len, k_len)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)
    # 2) weights: softmax over the keys, masked keys at exactly zero
    if mask is not None:
        mask = check_mask(mask, query.size(-2), key.size(-2), batch_shape=scores.shape[:-2])
    weights = masked_softmax(scores, mask)  # (..., q_len, k_len)
    if dropout is not None:
        weights = dropout(weights)
    # 3) output: the weighted average of the values
    return weights @ value, weights  # (..., q_len, d_v), (..., q_len, k_len)


def check_mask(
    mask: Tensor,
    q_len: int,
    k_len: int,
    name: str = "mask",
    *,
    batch_shape: tuple[int, ...] | torch.Size | None = None,
) -> Tensor:
    """Validate an attention mask; return it as bool (True = may attend).

    Args:
        mask: bool or integer (0/1) tensor broadcastable to ``(..., q_len,
            k_len)``; a nonzero integer means "may attend". Floating masks are
            rejected: an additive float mask (0 / -inf) and a multiplicative
            one (1 / 0) mean opposite things.
        q_len: number of queries (the second-to-last dimension of the scores).
        k_len: number of keys (the last dimension of the scores).
        name: the argument's name, used in error messages.
        batch_shape: if given, the leading dimensions of the scores; the mask
            must broadcast to ``(*batch_shape, q_len, k_len)`` without
            enlarging it.

    Only shapes and dtypes are checked (cheap enough for every forward pass).
    Implements the masking of "Attention Is All You Need", Section 3.2.3.
    Defined in chapter 1.
    """
    expected = f"(..., q_len={q_len}, k_len={k_len})"
    if not isinstance(mask, Tensor):
        raise ValueError(
            f"{name} must be a bool tensor broadcastable to {expected}, got {type(mask).__name__}"
        )
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise ValueError(
            f"{name} must be a bool (or 0/1 integer) tensor with True = may "
            f"attend, got dtype {mask.dtype}; convert an additive float mask "
            f"with `{name} == 0` or a 0/1 float mask with `{name}.bool()`"
        )
    shape = tuple(mask.shape)
    ok = (mask.dim() < 1 or shape[-1] in (1, k_len)) and (mask.dim() < 2 or shape[-2] in (1, q_len))
    if ok and batch_shape is not None:
        full = (*tuple(batch_shape), q_len, k_len)
        try:
            ok = torch.broadcast_shapes(shape, full) == torch.Size(full)
        except RuntimeError:
            ok = False
        expected = f"{full}"
    if not ok:
        raise ValueError(f"{name} of shape {shape} is not broadcastable to {expected}")
    return mask if mask.dtype == torch.bool else mask != 0


def check_probability(p: object, name: str = "dropout") -> float:
    """Validate a probability such as a dropout rate and return it as a float.

    Args:
        p: a real number in ``[0, 1)``; ``bool``, non-numbers, NaN and
            infinities are rejected (``bool`` is an ``int`` in Python, so
            ``False`` would otherwise pass silently as 0).
        name: the argument's name, used in the error message.

    Returns ``float(p)``; raises ValueError naming ``name`` otherwise. Used
    for every dropout rate in the package: the paper's P_drop (Section 5.4)
    and the rates the paper does not have (dropout on attention weights and
    on feed-forward activations, chapter 5). Defined in chapter 1.
    """
    # bool is a subclass of int, so it must be rejected before the Real check
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise ValueError(f"{name} must be a real number in [0, 1), got {type(p).__name__} {p!r}")
    value = float(p)
    # NaN fails both comparisons, so it is rejected here too
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1), got {p!r}")
    return value


def check_positive_int(value: object, name: str) -> int:
    """Validate a size or a count such as ``h`` or ``N``; return it as an int.

    Args:
        value: an integer >= 1 (a Python or NumPy integer). ``bool`` is
            rejected (``True`` is the int 1 in Python, so ``N=True`` would
            otherwise build one layer), and so are floats, even whole ones
            such as ``8.0``.
        name: the argument's name, used in the error message.

    Returns ``int(value)``; raises ValueError naming ``name`` otherwise. Used
    for most sizes in the package: the paper's ``h``, ``d_model``, ``d_ff``
    and ``N`` (Section 3), vocabulary sizes and table lengths. Defined in
    chapter 1.
    """
    # bool is a subclass of int, so it must be rejected before the check
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    """Shape/dtype checks shared by the attention functions.

    Raises ValueError naming the argument at fault.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or t.dim() < 2 or not t.is_floating_point():
            got = (tuple(t.shape), t.dtype) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must be a floating-point tensor of shape (..., len, features), got {got}"
            )
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise ValueError(
            f"key and value must have query's dtype {query.dtype}, "
            f"got key {key.dtype} and value {value.dtype}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            "value must have as many positions as key "
            f"(k_len={key.size(-2)}), got value of shape "
            f"{tuple(value.shape)} for key of shape {tuple(key.shape)}"
        )
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(
            "the leading (batch/head) dimensions of query "
            f"{tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} must broadcast"
        ) from None


def _check_attention_args(query: Tensor, key: Tensor, value: Tensor, dropout: object) -> None:
    """The checks of :func:`attention`: :func:`_check_qkv`, one d_k for
    query and key, and a callable dropout (or None)."""
    _check_qkv(query, key, value)
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must have the same d_k (last dimension), "
            f"got query {tuple(query.shape)} and key {tuple(key.shape)}"
        )
    if dropout is not None and not callable(dropout):
        raise ValueError(f"dropout must be an nn.Module (e.g. nn.Dropout) or None, got {dropout!r}")


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau) attention: ``e_ij = vᵀ tanh(W q_i + U k_j)``.

    Args:
        query_size: features of a query (the decoder state ``s_{i-1}`` in
            Bahdanau et al.).
        key_size: features of a key (an encoder state ``h_j``).
        num_hiddens: size of the hidden layer of the scoring network.
        dropout: dropout probability on the attention weights.

    ``forward(query (batch, q_len, query_size), key (batch, k_len, key_size),
    value (batch, k_len, d_v), mask=None) -> (output (batch, q_len, d_v),
    weights (batch, q_len, k_len))`` with the same mask semantics as
    :func:`attention`. The compatibility function the Transformer paper
    contrasts with dot-product attention (Section 3.2.1); from Bahdanau et al.
    (2015). Defined in chapter 1.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        num_hiddens: int,
        dropout: float = 0.0,
    ):
        super().__init__()
        dropout = check_probability(dropout, "dropout")
        # W: query -> hidden
        self.W = nn.Linear(query_size, num_hiddens, bias=False)
        # U: key -> hidden
        self.U = nn.Linear(key_size, num_hiddens, bias=False)
        self.v = nn.Linear(num_hiddens, 1, bias=False)  # vᵀ: hidden -> score
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        _check_qkv(query, key, value)
        if query.size(-1) != self.W.in_features or key.size(-1) != self.U.in_features:
            raise ValueError(
                f"query must have {self.W.in_features} features and key "
                f"{self.U.in_features}, got query {tuple(query.shape)} and "
                f"key {tuple(key.shape)}"
            )
        # 1) project both sides into the hidden space, then add every query
        #    to every key
        q = self.W(query).unsqueeze(-2)  # (batch, q_len, 1, num_hiddens)
        k = self.U(key).unsqueeze(-3)  # (batch, 1, k_len, num_hiddens)
        # (batch, q_len, k_len)
        scores = self.v(torch.tanh(q + k)).squeeze(-1)
        # 2) weights over the keys (masked keys get none)
        if mask is not None:
            mask = check_mask(
                mask,
                query.size(-2),
                key.size(-2),
                batch_shape=scores.shape[:-2],
            )
        # (batch, q_len, k_len)
        weights = self.dropout(masked_softmax(scores, mask))
        # 3) the weighted average of the values:
        # (batch, q_len, d_v), (batch, q_len, k_len)
        return weights @ value, weights
