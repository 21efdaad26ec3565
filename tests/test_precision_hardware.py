"""precision "auto" on a CPU: bf16 exactly where the CPU has bfloat16 instructions (x86
AVX512_BF16 or AMX-BF16, Arm BF16) and ONEDNN_MAX_CPU_ISA lets oneDNN use them.

oneDNN's own check, ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``, says True on every AVX-512
CPU; on one without bf16 instructions (Skylake-SP to Ice Lake) a training step under bf16
autocast took 1.68x as long as in fp32 (measured with ONEDNN_MAX_CPU_ISA=AVX512_CORE on a
Sapphire Rapids CPU; natively there 0.72x). The expected answers below are written out by hand
from oneDNN's ISA table, not computed by the rule under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib.translation import precision

ROOT = Path(__file__).resolve().parents[1]

SKYLAKE = {"architecture": "x86_64", "avx2": True, "avx512_f": True, "avx512_vnni": True,
           "avx512_bf16": False, "amx_bf16": False}
COOPER_LAKE = {**SKYLAKE, "avx512_bf16": True}
SAPPHIRE_RAPIDS = {**COOPER_LAKE, "amx_bf16": True, "amx_tile": True}
AMX_ONLY = {**SKYLAKE, "amx_bf16": True}  # no such CPU; either flag is enough
HASWELL = {"architecture": "x86_64", "avx2": True, "avx512_f": False}
NEOVERSE_V1 = {"architecture": "aarch64", "neon": True, "bf16": True, "sve": True,
               "sve_bf16": True}
NEOVERSE_N1 = {"architecture": "aarch64", "neon": True, "bf16": False, "sve": False}
SVE_BF16_ONLY = {**NEOVERSE_N1, "sve": True, "sve_bf16": True}


@pytest.mark.parametrize(("caps", "native"), [
    (SKYLAKE, False), (HASWELL, False), (NEOVERSE_N1, False), ({}, False),
    (COOPER_LAKE, True), (SAPPHIRE_RAPIDS, True), (AMX_ONLY, True), (NEOVERSE_V1, True),
    (SVE_BF16_ONLY, True),
], ids=["skylake_avx512", "haswell_avx2", "arm_no_bf16", "nothing_known", "cooper_lake",
        "sapphire_rapids", "amx_only", "arm_bf16", "arm_sve_bf16"])
def test_bf16_is_native_only_with_bf16_instructions(caps, native, monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert precision.cpu_bf16_native(caps, {}) is native
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)  # the default query
    assert precision.resolve_precision("auto", "cpu") == ("bf16" if native else "fp32")
    has = "has" if native else "has no"
    assert precision.precision_note("auto", "cpu") == \
        f"precision: {'bf16' if native else 'fp32'} (auto: this CPU {has} native bfloat16)"


# oneDNN's ISA names: below AVX512_CORE_BF16 bf16 is emulated, from it on native.
BELOW = ["SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
         "avx512_core", " AVX2 "]
FROM_BF16 = ["AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX",
             "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16", "DEFAULT", "ALL",
             "avx512_core_amx", "", "NOT_AN_ISA"]  # an unknown value: oneDNN ignores it


@pytest.mark.parametrize("isa", BELOW)
def test_an_isa_limit_below_bf16_makes_it_emulated(isa, monkeypatch):
    assert precision.cpu_bf16_native(SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": isa}) is False
    assert precision.cpu_bf16_native(SAPPHIRE_RAPIDS, {"DNNL_MAX_CPU_ISA": isa}) is False
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: SAPPHIRE_RAPIDS)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert precision.resolve_precision("auto", "cpu") == "fp32"
    assert precision.resolve_precision("auto", torch.device("cpu")) == "fp32"


@pytest.mark.parametrize("isa", FROM_BF16)
def test_an_isa_limit_at_or_above_bf16_keeps_it_native(isa):
    assert precision.cpu_bf16_native(SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": isa}) is True
    # the limit only lowers: no flag, no bf16, whatever the variable says
    assert precision.cpu_bf16_native(SKYLAKE, {"ONEDNN_MAX_CPU_ISA": isa}) is False


def test_onednn_name_wins_over_the_older_dnnl_name_and_no_onednn_means_emulated(monkeypatch):
    env = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "DNNL_MAX_CPU_ISA": "AVX2"}
    assert precision.cpu_bf16_native(SAPPHIRE_RAPIDS, env) is True
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX512_CORE_AMX"}
    assert precision.cpu_bf16_native(SAPPHIRE_RAPIDS, env) is False
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert precision.cpu_bf16_native(SAPPHIRE_RAPIDS, {}) is False


def _cpuinfo_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return None
    line = next((x for x in text.splitlines() if x.startswith(("flags", "Features"))), None)
    return set(line.split(":", 1)[1].split()) if line else None


def _auto_in_a_fresh_process(**env: str) -> str:
    code = ("from transformer_lib.translation import resolve_precision; "
            "print(resolve_precision('auto', 'cpu'))")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(_cpuinfo_flags() is None, reason="needs /proc/cpuinfo (Linux)")
def test_this_machine_real_process_agrees_with_the_kernels_own_flags():
    """Without a limit: bf16 exactly where Linux lists avx512_bf16, amx_bf16 or Arm's bf16."""
    flags = _cpuinfo_flags()
    expected = "bf16" if flags & {"avx512_bf16", "amx_bf16", "bf16", "svebf16"} else "fp32"
    assert _auto_in_a_fresh_process() == expected


@pytest.mark.skipif(not torch.cpu.get_capabilities().get("avx512_f"),
                    reason="an AVX-512 CPU imitates one without bf16")
def test_avx512_without_bf16_real_process_picks_fp32_where_onednn_says_bf16_is_supported():
    """ONEDNN_MAX_CPU_ISA=AVX512_CORE, test-emulated's avx512 kind: oneDNN's check still says
    True (the old, wrong rule), the rule here says fp32."""
    assert _auto_in_a_fresh_process(ONEDNN_MAX_CPU_ISA="AVX512_CORE") == "fp32"
    code = "import torch; print(torch.ops.mkldnn._is_mkldnn_bf16_supported())"
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    assert done.stdout.strip() == "True"
