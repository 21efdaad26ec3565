"""Sinusoidal and learned positional encodings (generated).

Written from chapters/04_positional_encoding.ipynb (4. Positional encoding)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["sinusoidal_positions", "PositionalEncoding", "LearnedPositionalEmbedding"]

import math
import operator

import torch
from torch import Tensor, nn

from transformer_lib.attention import check_positive_int, check_probability


def _sinusoids(positions: Tensor, d_model: int, base: float) -> Tensor:
    """float64 sinusoids for the given positions: (len,) -> (len, d_model),
    sin in the even columns, cos in the odd ones."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    omega = base ** (-two_i / d_model)  # frequencies ω_i = base^(-2i/d_model)
    angles = positions.to(torch.float64)[:, None] * omega  # (len, d_model/2)
    # (len, d_model/2, 2) -> (len, d_model): sin, cos, sin, cos, …
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)


def sinusoidal_positions(
    seq_len: int,
    d_model: int,
    base: float = 10000.0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The sinusoidal position table of "Attention Is All You Need" (3.5).

    ``PE[pos, 2i] = sin(pos / base^(2i/d_model))`` and
    ``PE[pos, 2i+1] = cos(...)``: sines in the even columns, cosines in the
    odd ones (the interleaved layout).

    Args:
        seq_len: number of positions (rows), ``>= 0``.
        d_model: model width (columns), a positive even number.
        base: the paper's ``n = 10000``; the longest wavelength is just under
            ``2π·base``.
        device, dtype: of the result. The table is computed in float64 on the
            CPU and then cast, so large positions stay accurate (and devices
            without float64 work).

    Returns:
        (seq_len, d_model) tensor.

    Defined in chapter 4.
    """
    _check_table(seq_len, d_model, base, dtype)
    pe = _sinusoids(torch.arange(seq_len), d_model, float(base))
    return pe.to(device=device, dtype=dtype)  # (seq_len, d_model)


def _check_table(seq_len: int, d_model: int, base: float, dtype: torch.dtype) -> None:
    """ValueError unless ``sinusoidal_positions``'s arguments are valid."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be an integer >= 0, got {seq_len!r}")
    check_positive_int(d_model, "d_model")
    if d_model % 2:
        raise ValueError(
            f"d_model must be even (columns come in sin/cos pairs), got d_model={d_model}"
        )
    if not (isinstance(base, (int, float)) and math.isfinite(base) and base > 0):
        raise ValueError(f"base must be a finite number > 0, got {base!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")


def _check_positions(x: Tensor, d_model: int, start: int, max_len: int | None = None) -> int:
    """Validate ``x`` (…, seq, d_model) and the first position ``start``;
    return start as an int. With ``max_len`` (a learned table), the
    positions must also fit in the table."""
    if not isinstance(x, Tensor) or x.dim() < 2 or not x.is_floating_point():
        got = (tuple(x.shape), x.dtype) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"x must be a floating-point tensor of shape (batch, seq, d_model={d_model}), got {got}"
        )
    if x.size(-1) != d_model:
        raise ValueError(
            f"x's last dimension must be d_model={d_model}, got x of shape {tuple(x.shape)}"
        )
    try:
        start = operator.index(start)
    except TypeError:
        raise ValueError(f"start must be an integer position >= 0, got {start!r}") from None
    if start < 0:
        raise ValueError(f"start must be an integer position >= 0, got {start}")
    end = start + x.size(-2)
    if max_len is not None and end > max_len:
        raise ValueError(
            f"positions {start}..{end - 1} do not fit "
            f"max_len={max_len}: learned position embeddings exist "
            "only for positions < max_len and cannot extrapolate (build "
            "the module with a larger max_len, or use PositionalEncoding)"
        )
    return start


class PositionalEncoding(nn.Module):
    """Add sinusoidal positional encodings to embeddings, then apply dropout.

    Implements Section 3.5 of "Attention Is All You Need" (dropout on the sum:
    Section 5.4).

    Args:
        d_model: model width (even).
        dropout: dropout probability applied to ``x + PE``, in [0, 1).
        max_len: rows precomputed in the buffer ``pe`` (max_len, d_model).
            Longer inputs still work: the missing rows are computed on the
            fly, since sinusoids exist for any position.
        base: the base ``n`` of the frequencies (10000 in the paper).

    Defined in chapter 4.
    """

    def __init__(
        self,
        d_model: int,
        dropout: float,
        max_len: int = 5000,
        base: float = 10000.0,
    ) -> None:
        super().__init__()
        p = check_probability(dropout, "dropout")
        max_len = check_positive_int(max_len, "max_len")
        self.d_model, self.base = d_model, float(base)
        self.dropout = nn.Dropout(p)
        # validates d_model and base
        pe = sinusoidal_positions(max_len, d_model, base)
        self.register_buffer("pe", pe, persistent=False)  # (max_len, d_model)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x: (batch, seq, d_model) whose first token is at position
        ``start`` -> same shape."""
        start = _check_positions(x, self.d_model, start)
        end = start + x.size(-2)
        if end <= self.pe.size(0):
            pe = self.pe[start:end]  # (seq, d_model)
        else:  # past the table: the same formula, only for the rows needed
            pe = _sinusoids(torch.arange(start, end), self.d_model, self.base)
            pe = pe.to(device=x.device, dtype=self.pe.dtype)  # (seq, d_model)
        return self.dropout(x + pe.to(x.dtype))


class LearnedPositionalEmbedding(nn.Module):
    """Add a learned embedding of each position (as in BERT), then dropout.

    The alternative to sinusoids mentioned in Section 3.5 of "Attention Is
    All You Need" (Table 3, row E). Unlike sinusoids, it cannot go past
    ``max_len``.

    Args:
        d_model: model width.
        dropout: dropout probability applied to ``x + P``, in [0, 1).
        max_len: number of positions with a trained vector (``embedding``:
            (max_len, d_model)).

    Defined in chapter 4.
    """

    def __init__(self, d_model: int, dropout: float, max_len: int) -> None:
        super().__init__()
        p = check_probability(dropout, "dropout")
        max_len = check_positive_int(max_len, "max_len")
        d_model = check_positive_int(d_model, "d_model")
        self.d_model, self.max_len = d_model, max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(p)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x: (batch, seq, d_model) whose first token is at position
        ``start`` -> same shape."""
        # a table has no row past max_len: positions beyond it are refused
        start = _check_positions(x, self.d_model, start, self.max_len)
        end = start + x.size(-2)
        positions = torch.arange(start, end, device=x.device)  # (seq,)
        # (batch, seq, d_model)
        return self.dropout(x + self.embedding(positions).to(x.dtype))
