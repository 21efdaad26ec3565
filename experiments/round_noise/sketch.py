"""Why do the EPYC's rounds disagree, and do finer rounds tighten a ratio's range?

    python -m experiments.round_noise.sketch --out FILE  # ~22 min on 2 cores

``FILE``: ``experiments/round_noise/results_<cpu>.json`` (``results_epyc.json``, ...).

The benchmarks time each system's whole round in one block (``bench.common.interleaved_times``:
A's round, then B's, the first rotating). A machine whose speed drifts over seconds slows
whichever block runs during a slow spell, and the per-round ratios scatter with it. This
sketch cuts the same work into units (a batch of sentences to translate, one training step)
and times two systems on them in two ways, their rounds alternating:

- "blocks": every unit of A, then every unit of B (B first in odd rounds), as the benchmarks;
- "units": A's unit, then B's, unit by unit (the first rotating), summed per round.

Each workload runs both ways. "same code" pairs run one function twice, so any ratio other
than 1 is noise; the other pairs are the training benchmark's "the model alone over
``nn.Transformer`` given our step" (``nn_transformer_fp32_trainer_step`` over ``ours_fp32``),
built as ``bench.train_steps`` builds them. Every round's times are recorded.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import git_commit, machine_description, now_iso, write_json
from bench.train_models import CONFIGS, random_batches
from bench.train_steps import build_variant
from transformer_lib.translation import inference
from transformer_lib.translation.data import load_multi30k
from transformer_lib.translation.pretrained import load_pretrained

Unit = Callable[[], Any]
SCHEMES = ("blocks", "units")


def _timed(fn: Unit) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def blocks_round(a: list[Unit], b: list[Unit], r: int) -> tuple[list[float], list[float]]:
    """Seconds of each of A's units and of B's, each system's units in one block (B first if
    r is odd)."""
    first, second = (a, b) if r % 2 == 0 else (b, a)
    t_first = [_timed(u) for u in first]
    t_second = [_timed(u) for u in second]
    return (t_first, t_second) if r % 2 == 0 else (t_second, t_first)


def units_round(a: list[Unit], b: list[Unit], r: int) -> tuple[list[float], list[float]]:
    """Seconds of each of A's units and of B's, alternating unit by unit (the first
    rotating)."""
    ta: list[float] = []
    tb: list[float] = []
    for i, (ua, ub) in enumerate(zip(a, b, strict=True)):
        if (i + r) % 2 == 0:
            ta.append(_timed(ua))
            tb.append(_timed(ub))
        else:
            tb.append(_timed(ub))
            ta.append(_timed(ua))
    return ta, tb


def compare(a: list[Unit], b: list[Unit], rounds: int, label: str) -> dict[str, Any]:
    """Both schemes, their rounds alternating, after one untimed pass of every unit.
    Ratios are A's time over B's, per round: median and range."""
    for u in a + b:
        u()
    units: dict[str, dict[str, list[list[float]]]] = {s: {"a": [], "b": []} for s in SCHEMES}
    for r in range(rounds):
        for scheme, run in zip(SCHEMES, (blocks_round, units_round)):
            ta, tb = run(a, b, r)
            units[scheme]["a"].append(ta)
            units[scheme]["b"].append(tb)
        print(f"  {label}: round {r + 1}/{rounds}", flush=True)
    out: dict[str, Any] = {}
    for scheme, t in units.items():
        ta, tb = [sum(u) for u in t["a"]], [sum(u) for u in t["b"]]
        ratios = [x / y for x, y in zip(ta, tb)]
        out[scheme] = {
            "a_seconds_all": [round(x, 4) for x in ta],
            "b_seconds_all": [round(x, 4) for x in tb],
            "a_unit_seconds": [[round(x, 4) for x in u] for u in t["a"]],
            "b_unit_seconds": [[round(x, 4) for x in u] for u in t["b"]],
            "ratio_per_round": [round(x, 4) for x in ratios],
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "a_round_max_over_min": max(ta) / min(ta),
        }
        print(f"  {label} {scheme:>6}: A/B {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}); A's rounds vary "
              f"{out[scheme]['a_round_max_over_min']:.2f}x", flush=True)
    return out


def translate_units(limit: int, chunk: int) -> list[Unit]:
    """Translating the first `limit` validation sentences, shortest first, `chunk` at a time
    (64: one batch of beam search at the default batch size)."""
    model, tok, cfg = load_pretrained(device="cpu")
    val = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang, limit=limit)
    sources = sorted((s for s, _ in val), key=len)

    def unit(part: list[str]) -> Unit:
        return lambda: inference.translate_sentences(
            model, tok, part, beam_size=cfg.beam_size, precision="fp32",
            **cfg.decode_kwargs())

    return [unit(sources[i:i + chunk]) for i in range(0, len(sources), chunk)]


def train_units(size: str, variant: str, steps: int) -> list[Unit]:
    """`steps` training steps of `variant` on the benchmark's seeded batches of `size`, in
    turn (its own model and optimizer)."""
    cfg = CONFIGS[size]
    device = torch.device("cpu")
    batches = random_batches(cfg, device)
    torch.manual_seed(0)
    step = build_variant(variant, cfg, device)[1]
    order = [batches[i % len(batches)] for i in range(steps)]
    return [lambda b=b: step(b) for b in order]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--limit", type=int, default=320, help="validation sentences")
    p.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    args = p.parse_args(argv)
    result: dict[str, Any] = {
        "experiment": "round_noise",
        "date": now_iso(),
        "git_commit": git_commit(),
        "machine": machine_description(),
        "rounds": args.rounds,
        "workloads": {},
    }
    ours, nn_ours_step = "ours_fp32", "nn_transformer_fp32_trainer_step"
    plans = {  # name: (threads, A's units, B's units)
        "translate_same_code": (1, lambda: translate_units(args.limit, 64), None),
        "train_small_same_code": (2, lambda: train_units("small", ours, 4), None),
        "train_small_nn_over_ours": (
            2, lambda: train_units("small", nn_ours_step, 4),
            lambda: train_units("small", ours, 4)),
        "train_base_nn_over_ours": (
            2, lambda: train_units("base", nn_ours_step, 3),
            lambda: train_units("base", ours, 3)),
    }
    before = torch.get_num_threads()
    try:
        for name, (threads, make_a, make_b) in plans.items():
            torch.set_num_threads(threads)
            a = make_a()
            b = make_b() if make_b else make_a()  # "same code": a second, identical system
            run = compare(a, b, args.rounds, name)
            run["threads"] = threads
            run["units_per_round"] = len(a)  # of each system
            result["workloads"][name] = run
    finally:
        torch.set_num_threads(before)
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
