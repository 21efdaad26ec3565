"""Numeric precision of a run or a translation: fp32, bf16 autocast, or "auto" (hand-written).

"auto" is an order for the machine that runs, not a property of a model: bf16 where the device
computes in bfloat16 natively, else fp32. A CPU does so when it has bfloat16 instructions (x86:
AVX512_BF16 or AMX-BF16; Arm: BF16) and oneDNN, which runs PyTorch's bf16 matmuls, is allowed
to use them. Elsewhere bf16 autocast is emulated and slower than fp32: on an AVX2 CPU translating
with beam 4 1.9x, a training step over 20x (the performance appendix measures 39x on an imitated
AVX2 CPU); on AVX-512 without bf16 (Skylake-SP to Ice Lake, most cloud machines) a training step
1.7x. oneDNN's own check (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``) is not the rule: it
answers True on any AVX-512 CPU, bf16 instructions or not.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["resolve_precision", "precision_note", "autocast", "cpu_bf16_native"]

# torch.cpu.get_capabilities() flags of bfloat16 arithmetic: x86 AVX512_BF16 (dot products,
# Cooper Lake, Zen 4 on) and AMX-BF16 (tiles, Sapphire Rapids on); Arm BF16 (Neon) and SVE BF16.
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")
# Values of ONEDNN_MAX_CPU_ISA (oneDNN's names, any case) that stop oneDNN below its first ISA
# with bf16 instructions, AVX512_CORE_BF16. AVX2_VNNI_2 converts to and from bf16 but
# multiplies in fp32. Higher values (AVX512_CORE_BF16, AVX10_1_512 = AVX512_CORE_FP16,
# AVX512_CORE_AMX, ..., DEFAULT, ALL) and values oneDNN does not know leave bf16 on.
ISA_WITHOUT_BF16 = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)


def cpu_bf16_native(capabilities: Mapping[str, Any] | None = None,
                    environ: Mapping[str, str] | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively: it has bf16 instructions (`BF16_FLAGS`
    in `capabilities`, default ``torch.cpu.get_capabilities()``), torch has oneDNN, and
    ``ONEDNN_MAX_CPU_ISA`` (or its older name ``DNNL_MAX_CPU_ISA``) in `environ` (default
    ``os.environ``) does not hold oneDNN below them (`ISA_WITHOUT_BF16`).
    """
    if capabilities is None:
        try:
            capabilities = torch.cpu.get_capabilities()
        except (AttributeError, RuntimeError):  # a torch without the query: assume none
            return False
    env = os.environ if environ is None else environ
    isa = env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or ""
    return (any(capabilities.get(flag) is True for flag in BF16_FLAGS)
            and torch.backends.mkldnn.is_available()
            and isa.strip().upper() not in ISA_WITHOUT_BF16)


def _bf16_native(device: torch.device) -> bool:
    """Whether `device` computes in bfloat16 in hardware (elsewhere autocast emulates it)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return device.type == "cpu" and cpu_bf16_native()


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
