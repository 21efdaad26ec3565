"""Numeric precision of a run or a translation: fp32, bf16 autocast, or "auto" (hand-written).

"auto" is an order for the machine that runs, not a property of a model: bf16 where the device
computes in bfloat16 natively, else fp32. Where bf16 is only emulated (a CPU with AVX2 but no
AVX512-BF16/AMX), bf16 autocast is slower than fp32: translating with beam 4 1.9x, a training
step over 20x (the performance appendix measures 39x on an imitated AVX2 CPU).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["resolve_precision", "precision_note", "autocast"]


def _bf16_native(device: torch.device) -> bool:
    """Whether `device` computes in bfloat16 in hardware (elsewhere autocast emulates it)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu":
        return False
    try:  # oneDNN's answer: AVX512-BF16 or AMX on x86 (not AVX2), bf16 instructions on Arm
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """The precision that runs on `device`: "fp32" or "bf16" as given; "auto" picks bf16 where
    `device` has it natively, else fp32.

    Raises ValueError naming `precision` for any other value.
    """
    if precision not in ("fp32", "bf16", "auto"):
        raise ValueError(f"precision must be 'fp32', 'bf16' or 'auto', got {precision!r}")
    if precision != "auto":
        return precision
    return "bf16" if _bf16_native(torch.device(device)) else "fp32"


def precision_note(precision: str, device: torch.device | str, *, fast: bool = False) -> str:
    """One line for a log: the precision `precision` resolves to on `device`, and why."""
    device = torch.device(device)
    used, native = resolve_precision(precision, device), _bf16_native(device)
    here = f"this {'GPU' if device.type == 'cuda' else device.type.upper()}"
    if fast and not native:
        return (f"precision: fp32 (fast: {here} has no native bfloat16, where bf16 autocast is "
                "emulated and 20-40x slower; fast trains in fp32 with the paper's dropout "
                "placement)")
    if precision == "auto":
        return f"precision: {used} (auto: {here} has {'' if native else 'no '}native bfloat16)"
    if used == "bf16" and not native:
        return (f"precision: bf16 (as asked; {here} has no native bfloat16, so it is emulated "
                "and slower than fp32, which precision 'auto' would pick)")
    return f"precision: {used}"


def autocast(precision: str, device: torch.device) -> Any:
    """bfloat16 autocast where `precision` resolves to "bf16" (weights stay fp32), else nothing."""
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
