"""Padding and causal (subsequent) masks (generated).

Written from chapters/02_masks.ipynb (2. Masks)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["padding_mask", "subsequent_mask"]

import operator

import torch
from torch import Tensor


def _check_token_ids(tokens: Tensor, pad: int) -> int:
    """ValueError unless ``tokens`` is a (batch, len) tensor of integer ids
    and ``pad`` an integer id; returns ``pad`` as an int."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2:
        got = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a (batch, len) tensor of token ids, got {got}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must hold integer token ids, got dtype {tokens.dtype}")
    if isinstance(pad, bool) or not hasattr(pad, "__index__"):
        raise ValueError(f"pad must be the integer id of the padding token, got {pad!r}")
    return operator.index(pad)


def _check_size(size: int) -> int:
    """ValueError unless ``size`` is an integer >= 1; returns it as an int."""
    if isinstance(size, bool):
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    try:
        size = operator.index(size)
    except TypeError:
        raise ValueError(f"size must be an integer >= 1, got {size!r}") from None
    if size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size}")
    return size


def padding_mask(tokens: Tensor, pad: int) -> Tensor:
    """The padding (key) mask of a batch of token ids: True where not padding.

    Args:
        tokens: integer token ids of shape ``(batch, len)``.
        pad: the id of the padding token.

    Returns a bool tensor of shape ``(batch, 1, len)`` on ``tokens``' device;
    the 1 broadcasts over the queries, so every query ignores the same padded
    keys. The paper does not spell padding out (it batches sentences of
    similar length, Section 5.1), but any padded batch needs it. Defined in
    chapter 2.
    """
    pad = _check_token_ids(tokens, pad)  # a clear error for bad ids or pad
    return (tokens != pad).unsqueeze(-2)  # (batch, 1, len)


def subsequent_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """The causal ("look-ahead") mask: position i may attend to 0, …, i only.

    Args:
        size: sequence length, an integer >= 1.
        device: where to create the mask (default: PyTorch's default device).

    Returns a bool tensor of shape ``(1, size, size)``, True on and below the
    diagonal; the leading 1 broadcasts over the batch. "Attention Is All You
    Need", Section 3.2.3 (masking in the decoder's self-attention). Defined in
    chapter 2.
    """
    size = _check_size(size)  # a clear error for a bad size
    ones = torch.ones(size, size, dtype=torch.bool, device=device)
    return torch.tril(ones).unsqueeze(0)  # (1, size, size)
