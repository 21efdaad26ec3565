"""Time and memory of attention against sequence length: explicit softmax(QKᵀ/√d_k)V vs SDPA.

    python -m bench.attention_scaling       # n = 64 … 4096; writes results/bench_attention.json
    python -m bench.attention_scaling --lengths 64 128 256 --out /tmp/a.json

Two implementations of the same function, on the same (batch, h, n, d_k) inputs:

* ``explicit``: chapter 1's ``transformer_lib.attention.attention``: it materializes the
  (n × n) scores and weights of every head, so time and memory grow as n².
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``. On this CPU it dispatches to a
  fused, FlashAttention-style kernel (Dao et al., 2022) that walks over blocks of keys with an
  online softmax: time still grows as n² (every query meets every key) but the n × n matrix never
  exists, so memory grows as n.
* ``sdpa_dropout``: the same call with ``dropout_p=0.1`` (training with attention dropout, as the
  Transformer's attention layers do). PyTorch's CPU flash kernel has no dropout, so this falls
  back to the "math" kernel: measured in ``forward+backward`` mode only, to show what attention
  dropout costs in training.

Modes: ``forward`` (inference, under ``torch.no_grad``) and ``forward+backward`` (a training
step's share: the gradient of ``output.sum()`` with respect to q, k and v). Implementations are
interleaved at each length; the median of the repeats is reported, with the time ratio to the
previous (half) length: 4 for an n² cost, 2 for a linear one. Peak memory is the peak of tensor
bytes allocated during one call (the PyTorch profiler's memory timeline), beside the analytic size
of one (batch, h, n, n) fp32 matrix.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench.common import (
    RESULTS,
    format_table,
    git_commit,
    interleaved_times,
    load_average,
    machine_description,
    median,
    now_iso,
    peak_step_memory,
    write_json,
)
from transformer_lib.attention import attention

IMPLS = ("explicit", "sdpa", "sdpa_dropout")
MODES = ("forward", "forward+backward")
DEFAULT_LENGTHS = [64, 128, 256, 512, 1024, 2048, 4096]


def make_qkv(
    batch: int,
    h: int,
    n: int,
    d_k: int,
    *,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    requires_grad: bool = False,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded query, key, value tensors of shape (batch, h, n, d_k)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(batch, h, n, d_k, generator=g) for _ in range(3))
    return tuple(t.to(device=device, dtype=dtype).requires_grad_(requires_grad) for t in (q, k, v))


def attend(impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Output (batch, h, n, d_k) of one implementation (see the module docstring)."""
    if impl == "explicit":
        return attention(q, k, v)[0]
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v)
    if impl == "sdpa_dropout":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_call(impl: str, mode: str, qkv, device: torch.device):
    """A no-argument callable running one forward (or forward+backward) of ``impl``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    q, k, v = qkv
    if mode == "forward":

        def call() -> None:
            with torch.no_grad():
                attend(impl, q, k, v)
            _sync(device)

    else:

        def call() -> None:
            for t in (q, k, v):
                t.grad = None
            attend(impl, q, k, v).sum().backward()
            _sync(device)

    return call


def check_same_output(device: torch.device, n: int = 256) -> float:
    """Max |explicit − sdpa| on one input: the two compute the same function (a sanity check)."""
    q, k, v = make_qkv(2, 4, n, 64, device=device)
    with torch.no_grad():
        diff = (attend("explicit", q, k, v) - attend("sdpa", q, k, v)).abs().max().item()
    torch.testing.assert_close(attend("explicit", q, k, v), attend("sdpa", q, k, v))
    return diff


def _repeats_for(seconds_per_call: float, budget: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(budget / max(seconds_per_call, 1e-6))))


def benchmark(
    lengths: list[int],
    *,
    batch: int = 2,
    h: int = 8,
    d_k: int = 64,
    device: torch.device | str = "cpu",
    min_repeats: int = 3,
    max_repeats: int = 15,
    budget_s: float = 1.0,
    explicit_limit_s: float = 8.0,
    measure_memory: bool = True,
    verbose: bool = True,
) -> dict[str, Any]:
    """Measure every (impl, mode) at every length; returns the JSON-ready result.

    Args:
        lengths: sequence lengths n, increasing.
        batch, h, d_k: the other dimensions of q, k, v (batch, h, n, d_k).
        device: where the tensors live.
        min_repeats, max_repeats, budget_s: timed repeats per length: about ``budget_s`` seconds
            of calls per implementation, clamped to [min_repeats, max_repeats].
        explicit_limit_s: once one explicit forward+backward takes longer than this, larger
            lengths skip the explicit (and math-fallback) paths; listed under ``skipped``.
        measure_memory: also record the peak tensor memory of one call (profiler).
    """
    if not lengths or sorted(lengths) != list(lengths) or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty increasing list of ints >= 1, got {lengths}")
    device = torch.device(device)
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    too_slow: set[str] = set()
    for n in lengths:
        for mode in MODES:
            impls = [i for i in IMPLS if not (i == "sdpa_dropout" and mode == "forward")]
            active = [i for i in impls if i not in too_slow]
            for i in impls:
                if i in too_slow:
                    skipped.append({"impl": i, "mode": mode, "n": n, "reason": "too slow"})
            qkv = make_qkv(batch, h, n, d_k, device=device, requires_grad=mode != "forward")
            calls = {i: make_call(i, mode, qkv, device) for i in active}
            # One untimed call each (warm-up) also sizes the number of repeats.
            first = {}
            for i, call in calls.items():
                t0 = time.perf_counter()
                call()
                first[i] = time.perf_counter() - t0
            reps = _repeats_for(max(first.values()), budget_s, min_repeats, max_repeats)
            times = interleaved_times(calls, warmup=0, repeats=reps)
            for i in active:
                peak = peak_step_memory(calls[i]) if measure_memory else None
                rows.append(
                    {
                        "impl": i,
                        "mode": mode,
                        "n": n,
                        "batch": batch,
                        "h": h,
                        "d_k": d_k,
                        "repeats": reps,
                        "time_ms": 1e3 * median(times[i]),
                        "time_ms_all": [round(1e3 * t, 4) for t in times[i]],
                        "peak_bytes": peak,
                        "nxn_matrix_bytes": batch * h * n * n * 4,
                    }
                )
                if mode == "forward+backward" and median(times[i]) > explicit_limit_s:
                    if i != "sdpa":
                        too_slow.add(i)
            if verbose:
                done = ", ".join(f"{i} {1e3 * median(times[i]):.1f} ms" for i in active)
                print(f"n={n:5d} {mode:16s} x{reps:2d}: {done}", flush=True)
    _add_ratios(rows)
    return {
        "rows": rows,
        "skipped": skipped,
        "slopes": fit_slopes(rows),
    }


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Time (and memory) ratio to the same impl/mode at half the length, where measured."""
    index = {(r["impl"], r["mode"], r["n"]): r for r in rows}
    for r in rows:
        prev = index.get((r["impl"], r["mode"], r["n"] // 2)) if r["n"] % 2 == 0 else None
        r["time_ratio_per_doubling"] = r["time_ms"] / prev["time_ms"] if prev else None
        ok = prev and prev["peak_bytes"] and r["peak_bytes"]
        r["memory_ratio_per_doubling"] = r["peak_bytes"] / prev["peak_bytes"] if ok else None


def fit_slopes(rows: list[dict[str, Any]], min_n: int = 512) -> dict[str, dict[str, float]]:
    """Least-squares slope of log(time) and log(memory) against log(n), over n >= min_n.

    A slope of 2 is quadratic growth, 1 linear. Small lengths are left out because fixed costs
    (kernel launch, Python) dominate there and flatten the curve. Falls back to all lengths when
    fewer than two are >= min_n.
    """
    out: dict[str, dict[str, float]] = {}
    for impl in IMPLS:
        for mode in MODES:
            sel = [r for r in rows if r["impl"] == impl and r["mode"] == mode]
            big = [r for r in sel if r["n"] >= min_n]
            sel = big if len(big) >= 2 else sel
            if len(sel) < 2:
                continue
            key = f"{impl}/{mode}"
            out[key] = {"from_n": sel[0]["n"], "to_n": sel[-1]["n"]}
            out[key]["time_slope"] = _slope([r["n"] for r in sel], [r["time_ms"] for r in sel])
            mem = [(r["n"], r["peak_bytes"]) for r in sel if r["peak_bytes"]]
            if len(mem) >= 2:
                out[key]["memory_slope"] = _slope(*zip(*mem))
    return out


def _slope(xs, ys) -> float:
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly)) / den if den else float("nan")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-k", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--budget", type=float, default=1.0, help="seconds of timed calls per point")
    p.add_argument("--no-memory", action="store_true", help="skip the profiler memory pass")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_attention.json")
    args = p.parse_args(argv)
    commit = git_commit()  # now: the code that runs, even if files change later

    torch.manual_seed(0)
    t_start = time.perf_counter()
    machine = machine_description()
    device = torch.device(args.device)
    diff = check_same_output(device)
    print(f"same function: max |explicit - sdpa| at n=256 = {diff:.2e}")
    res = benchmark(
        args.lengths,
        batch=args.batch,
        h=args.heads,
        d_k=args.d_k,
        device=device,
        budget_s=args.budget,
        measure_memory=not args.no_memory,
    )
    machine["load_average_end"] = load_average()
    out = {
        "benchmark": "attention_scaling",
        "description": (
            "Median wall-clock time and peak tensor memory of one attention call vs sequence "
            "length n, for chapter 1's explicit attention and PyTorch's fused "
            "scaled_dot_product_attention (and SDPA with dropout_p=0.1, which falls back to the "
            "math kernel on CPU). Peak memory: bytes of tensors allocated during one call "
            "(PyTorch profiler memory timeline), inputs excluded."
        ),
        "command": " ".join(
            ["python -m bench.attention_scaling", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": now_iso(),
        "git_commit": commit,
        "machine": machine,
        "device": str(device),
        "settings": {
            "batch": args.batch,
            "h": args.heads,
            "d_k": args.d_k,
            "dtype": "float32",
            "lengths": args.lengths,
            "sdpa_dropout_p": 0.1,
        },
        "sanity_max_abs_diff_explicit_vs_sdpa": diff,
        **res,
        "wall_time_s": round(time.perf_counter() - t_start, 1),
    }
    write_json(args.out, out)
    cols = ["impl", "mode", "n", "time_ms", "time_ratio_per_doubling", "peak_MiB", "nxn_MiB"]
    table = [
        {
            **r,
            "peak_MiB": r["peak_bytes"] / 2**20 if r["peak_bytes"] else None,
            "nxn_MiB": r["nxn_matrix_bytes"] / 2**20,
        }
        for r in sorted(res["rows"], key=lambda r: (r["mode"], r["impl"], r["n"]))
    ]
    print(format_table(table, cols))
    for key, s in res["slopes"].items():
        mem = f", memory slope {s['memory_slope']:.2f}" if "memory_slope" in s else ""
        print(f"{key}: log-log time slope {s['time_slope']:.2f}{mem} (n {s['from_n']}–{s['to_n']})")
    if res["skipped"]:
        print("skipped (too slow):", sorted({(s["impl"], s["n"]) for s in res["skipped"]}))
    print(f"wrote {args.out} in {out['wall_time_s']} s")
    return out


if __name__ == "__main__":
    main()
