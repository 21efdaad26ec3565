"""Shared helpers for the benchmarks: machine description, timing, peak memory, matmul peak.

Hand-written support code for ``bench/*.py`` (not part of ``transformer_lib``). Every benchmark
reports *ratios* between implementations measured in the same run, with the implementations
interleaved, so that load from other processes on a shared machine hits all of them alike.
Absolute numbers are recorded too, with the machine, the load average and the git commit they
came from (both from ``transformer_lib.translation.provenance``, the one record of provenance).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from transformer_lib.translation import resolve_precision
from transformer_lib.translation.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"

__all__ = [
    "ROOT",
    "RESULTS",
    "ISA_VARIABLES",
    "machine_description",
    "git_commit",
    "now_iso",
    "load_average",
    "interleaved_times",
    "median",
    "peak_step_memory",
    "matmul_peak",
    "write_json",
    "format_table",
]


# the variables that make a CPU run as a weaker one (an AVX2 machine on an AVX-512 one:
# ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2); a run
# under any of them is labeled "emulated" in its machine description
ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                 "CT2_FORCE_CPU_ISA")


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the OS does not report them)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_description() -> dict[str, Any]:
    """The machine, torch and Python of :func:`provenance`, flattened, with the load average.

    The keys the chapters read (``cpu_model``, ``cpu_flags``, ``logical_cores``,
    ``torch_version``, ``torch_threads``, ``load_average_start``) keep their names.
    ``bf16_native``: whether this CPU runs bfloat16 natively, i.e. has bf16 instructions
    (x86 AVX512_BF16 or AMX-BF16, Arm BF16) that ``ONEDNN_MAX_CPU_ISA`` leaves on (elsewhere
    bf16 autocast is emulated and slower than fp32); ``precision_auto``: what the trainer's
    precision "auto" (and ``fast``) resolves to on it; ``isa_environment`` and
    ``emulated``: the variables of :data:`ISA_VARIABLES` that are set (such a run measures
    an emulated, weaker CPU, and ``bf16_native`` is the answer under them).
    """
    p = provenance()
    machine, torch_info = p["machine"], p["torch"]
    return {
        "cpu_model": machine["cpu_model"],
        "cpu_flags": machine["cpu_flags"],
        "logical_cores": machine["logical_cores"],
        "torch_version": torch_info["version"],
        "torch_threads": torch_info["threads"],
        "torch_cpu_capability": torch_info["cpu_capability"],
        "bf16_native": machine["bf16_native"],
        "precision_auto": resolve_precision("auto", torch.device("cpu")),
        "python": p["python"],
        "platform": machine["os"],
        "load_average_start": load_average(),
        "isa_environment": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ},
        "emulated": any(k in os.environ for k in ISA_VARIABLES),
    }


def git_commit() -> str:
    """The commit of :func:`provenance` (40 hex digits), ``-dirty`` if tracked files outside
    ``results/`` changed (one benchmark's fresh output must not mark the next one's commit as
    dirty), or "unknown" without git."""
    p = provenance()
    if p["commit"] is None:
        return "unknown"
    return p["commit"] + ("-dirty" if p["dirty"] else "")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def interleaved_times(
    fns: dict[str, Callable[[], Any]], warmup: int, repeats: int, progress: str | None = None
) -> dict[str, list[float]]:
    """Wall-clock seconds of each callable, interleaved: A B C, B C A, C A B, ...

    Every callable runs ``warmup`` times (untimed), then ``repeats`` timed rounds in which each
    runs once. The starting callable rotates from round to round, so none always follows the
    same neighbor. Interleaving makes the *ratios* robust to background load on a shared
    machine: a burst of load slows whichever callables run during it, not one of them for its
    whole measurement. With ``progress`` (a label), each finished round is reported on stderr.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats=} {warmup=}")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
        if progress:
            spent = sum(sum(v) for v in times.values())
            print(f"  {progress}: round {r + 1}/{repeats} ({spent:.0f} s timed)", file=sys.stderr)
    return times


def peak_step_memory(fn: Callable[[], Any]) -> int | None:
    """Peak bytes of tensors allocated while ``fn()`` runs, above those alive before it.

    Uses the PyTorch profiler's memory timeline (every tensor allocation and free, on any device,
    including what autograd saves for backward, gradients, and temporaries freed before the call
    returns). Tensors that existed before the call (parameters, optimizer state after the first
    step) are not counted; allocator caching and fragmentation are not counted either. Returns
    None if this torch version lacks the (private) memory-profile API.
    """
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import Action
    except ImportError:
        return None
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        fn()
    try:
        timeline = prof._memory_profile().timeline
    except Exception:  # noqa: BLE001 - private API: degrade to "not measured"
        return None
    live = peak = 0
    for _t, action, _key, size in timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return int(peak)


def matmul_peak(
    dtype: torch.dtype, n: int = 2048, repeats: int = 5, device: str | torch.device = "cpu"
) -> float:
    """Achieved FLOP/s of an (n × n) @ (n × n) matmul in ``dtype``: the best of ``repeats``.

    The best (not the median) because this is the ceiling the model's matmuls could reach on
    this machine at this moment; 2·n³ FLOPs per product.
    """
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    a @ b  # warm-up: kernel selection, page faults
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain-text table (for the terminal) of ``rows`` restricted to ``columns``."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return "-" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover - quick look at the machine
    json.dump(machine_description(), sys.stdout, indent=2)
    print()
