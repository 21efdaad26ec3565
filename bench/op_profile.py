"""Where a call's time goes: PyTorch's profiler, its operations grouped into a few kinds.

``bench/translate.py`` uses it to split a translation run into matrix products, the
attention kernel, the work over the whole vocabulary, cache copies and the rest, so that the
appendix can say from a measurement, not from a guess, which part of ours is slower than the
engine's. Shares come from profiled runs, which carry the profiler's own bookkeeping; the
time outside every PyTorch operation (Python, and the profiler itself) is reported as its
own line. One run can fall into a slow spell of a shared machine, so
``median_by_kind`` combines several, kind by kind.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch.profiler import ProfilerActivity, profile

# Operations by kind. Self times are summed, so a parent (aten::linear) and its child
# (aten::addmm) are not counted twice.
KINDS: dict[str, tuple[str, ...]] = {
    "matrix products": ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm",
                        "aten::linear", "aten::matmul", "quantized::linear_dynamic",
                        "mkldnn::_linear_pointwise"),
    "attention kernel": ("aten::scaled_dot_product_attention",
                         "aten::_scaled_dot_product_flash_attention_for_cpu",
                         "aten::_scaled_dot_product_attention_math"),
    "log-softmax and top-k over the vocabulary": ("aten::_log_softmax", "aten::log_softmax",
                                                  "aten::topk"),
    "cache copies (cat, index_select)": ("aten::cat", "aten::index_select"),
    "layer norm": ("aten::layer_norm", "aten::native_layer_norm"),
}
OTHER = "every other operation"
OUTSIDE = "outside PyTorch operations (Python, the profiler)"


def kind_of(name: str) -> str:
    """The kind an operation's name belongs to (``OTHER`` if none)."""
    return next((kind for kind, names in KINDS.items() if name in names), OTHER)


def time_by_kind(fn: Callable[[], Any]) -> dict[str, Any]:
    """Run ``fn`` once under the profiler; seconds and shares of its wall time by kind.

    Returns ``{"wall_s", "op_calls", "kinds": [{"kind", "seconds", "share", "calls"}]}``,
    the kinds in ``KINDS`` order, then ``OTHER`` and ``OUTSIDE`` (wall time minus the
    operations' self times). Calls count nested operators too (``aten::linear`` and the
    ``aten::addmm`` it runs are two).
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    seconds = dict.fromkeys([*KINDS, OTHER], 0.0)
    calls = dict.fromkeys([*KINDS, OTHER], 0)
    for event in prof.key_averages():
        kind = kind_of(event.key)
        seconds[kind] += event.self_cpu_time_total / 1e6  # µs
        calls[kind] += event.count
    seconds[OUTSIDE] = max(0.0, wall - sum(seconds.values()))
    return {
        "wall_s": round(wall, 3),
        "op_calls": sum(calls.values()),
        "kinds": [{"kind": k, "seconds": round(s, 3), "share": round(s / wall, 3),
                   "calls": calls.get(k)}  # None for OUTSIDE
                  for k, s in seconds.items()],
    }


def median_by_kind(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several ``time_by_kind`` results of the same call as one: each kind's median seconds.

    A slow spell of the machine during one run moves that run's numbers, not the medians of
    three or more. ``wall_s`` is the sum of the medians, so the shares add up to 1;
    ``wall_s_runs`` keeps each run's own wall time and ``runs`` their number.
    """
    if not runs:
        raise ValueError("runs must hold at least one time_by_kind result")
    by_kind = [{k["kind"]: k for k in r["kinds"]} for r in runs]
    names = list(by_kind[0])
    if any(list(kinds) != names for kinds in by_kind):
        raise ValueError("runs must split their time into the same kinds")
    seconds = {n: statistics.median(kinds[n]["seconds"] for kinds in by_kind) for n in names}
    wall = sum(seconds.values())
    return {
        "wall_s": round(wall, 3),
        "wall_s_runs": [r["wall_s"] for r in runs],
        "runs": len(runs),
        "op_calls": int(statistics.median(r["op_calls"] for r in runs)),
        "kinds": [{"kind": n, "seconds": round(seconds[n], 3),
                   "share": round(seconds[n] / wall, 3) if wall else 0.0,
                   "calls": by_kind[0][n]["calls"]}
                  for n in names],
    }
