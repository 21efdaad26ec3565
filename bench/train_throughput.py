"""Training throughput of transformer_lib against torch.nn.Transformer and the textbook model.

    python -m bench.train_throughput --compile   # small + base; writes results/bench_train.json
    python -m bench.train_throughput --configs tiny --repeats 1 --no-memory --out /tmp/t.json

One training step is: forward, generator (Linear + log_softmax), label-smoothed loss,
backward, Adam step. The four models of ``bench.train_models`` (ours, ``nn.Transformer``, the
textbook model, ours with explicit attention) do it on the same seeded batches (lengths 16–64,
padded, with masks), in the variants of ``bench.train_steps``: fp32 or bf16 autocast, dropout
everywhere or the paper's placement, with or without the padding skip, chapter 5's Dropout
or ``nn.Dropout``, the trainer's step or the reference step, ours with its attention on
the fused kernel in training too (``*_fused_attention``: the default before
``MultiHeadedAttention``'s rule, its evidence), and (``--compile``) the fast setting under
``torch.compile``. The variants are interleaved (round-robin over rounds; a
round is one step on every batch of the list) and the median round is reported as target
tokens per second (non-pad decoder tokens, i.e. ``Batch.ntokens``). Model-FLOPs utilization
divides the analytic model FLOPs (``bench.flops``) per second by the peak of a 2048² matmul
measured in the same run. Peak memory: the peak of tensor bytes allocated during one step
above those alive before it (activations saved for backward, gradients, temporaries), from
the PyTorch profiler's memory timeline; parameters and Adam state are not included. The
micro-benchmarks of ``bench.micro`` follow (``--no-extras`` skips them).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench import micro
from bench.common import (
    RESULTS,
    format_table,
    git_commit,
    interleaved_times,
    load_average,
    machine_description,
    matmul_peak,
    median,
    now_iso,
    peak_step_memory,
    write_json,
)
from bench.flops import counted_flops, train_flops
from bench.train_models import (
    CONFIGS,
    BenchConfig,
    build_nn,
    build_ours,
    random_batches,
    same_math_check,
)
from bench.train_steps import DEFAULT_VARIANTS, FAST_SETTING, VARIANTS, Step, build_variant
from transformer_lib.training import Batch
from transformer_lib.translation.data import PAD

# --------------------------------------------------------------------------- one configuration


def _build_steps(
    cfg: BenchConfig,
    variants: list[str],
    compile_variants: list[str],
    batches: list[Batch],
    device: torch.device,
    verbose: bool,
) -> tuple[dict[str, Step], dict[str, float]]:
    """The step function of every variant, and the compile time of the compiled ones."""
    steps = {name: build_variant(name, cfg, device)[1] for name in variants}
    compile_s: dict[str, float] = {}
    for name in compile_variants:
        key = f"{name}_compiled"
        steps[key] = build_variant(name, cfg, device, compile=True)[1]
        t0 = time.perf_counter()
        for b in batches:  # compiles (and recompiles for new shapes) outside the timing
            steps[key](b)
        compile_s[key] = time.perf_counter() - t0
        if verbose:
            print(f"  compiled {key} in {compile_s[key]:.0f} s", flush=True)
    return steps, compile_s


def _padded_flops(cfg: BenchConfig, batches: list[Batch]) -> dict[tuple[bool, bool], float]:
    """FLOPs on the padded tensors per round, keyed by (generator on real tokens only,
    feed-forward skips padding)."""
    return {
        (real, skip): sum(
            train_flops(cfg, b, padded=True, real_token_generator=real, skip_padding=skip)
            for b in batches
        )
        for real in (False, True)
        for skip in (False, True)
    }


def _variant_row(name: str, ts: list[float], tokens: float, flops: dict) -> dict[str, Any]:
    """The JSON row of one timed variant (``flops``: "model" and the ``_padded_flops``)."""
    t = median(ts)
    v = VARIANTS[name.removesuffix("_compiled")]
    padded = flops["padded"][v.uses_trainer_step, v.skips_padding]
    return {
        "model": v.builder,
        "precision": "bf16-autocast" if v.precision == "bf16" else "fp32",
        "compiled": name.endswith("_compiled"),
        "paper_dropout": v.paper_dropout,
        "trainer_step": v.uses_trainer_step,
        "skip_padding": v.skips_padding,
        "nn_dropout": v.uses_nn_dropout,
        "round_s_median": t,
        "round_s_all": [round(x, 4) for x in ts],
        "tokens_per_s": tokens / t,
        "model_tflops_per_s": flops["model"] / t / 1e12,
        "padded_tflops_per_s": padded / t / 1e12,
        "peak_step_memory_bytes": None,
    }


def _batch_summary(b: Batch) -> dict[str, int]:
    return {
        "sentences": int(b.src.size(0)),
        "src_padded_len": int(b.src.size(1)),
        "tgt_padded_len": int(b.tgt.size(1)),
        "src_tokens": int((b.src != PAD).sum()),
        "tgt_tokens": int(b.ntokens),
    }


def _flop_check(cfg: BenchConfig, name: str, step: Step, batch: Batch) -> dict[str, Any]:
    """The analytic padded FLOPs of one step against PyTorch's FLOP counter."""
    v = VARIANTS[name]
    return {
        "variant": name,
        "counted_padded_flops_batch0": counted_flops(step, batch),
        "analytic_padded_flops_batch0": train_flops(
            cfg,
            batch,
            padded=True,
            real_token_generator=v.uses_trainer_step,
            skip_padding=v.skips_padding,
        ),
    }


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def run_config(
    cfg: BenchConfig,
    variants: list[str],
    device: torch.device,
    *,
    compile_variants: list[str] = (),
    measure_memory: bool = True,
    verbose: bool = True,
) -> dict[str, Any]:
    """Interleaved throughput (+ memory, FLOPs) of ``variants`` on one configuration."""
    batches = random_batches(cfg, device)
    tokens = sum(float(b.ntokens) for b in batches)
    steps, compile_s = _build_steps(cfg, variants, compile_variants, batches, device, verbose)
    rounds = {k: (lambda s=s: [s(b) for b in batches]) for k, s in steps.items()}
    t0 = time.perf_counter()
    progress = cfg.name if verbose else None
    times = interleaved_times(rounds, cfg.warmup, cfg.repeats, progress=progress)
    timing_s = time.perf_counter() - t0
    flops = {"model": sum(train_flops(cfg, b) for b in batches)}
    flops["padded"] = _padded_flops(cfg, batches)
    rows = {name: _variant_row(name, ts, tokens, flops) for name, ts in times.items()}
    for name, seconds in compile_s.items():
        rows[name]["compile_s"] = seconds
    if measure_memory:  # the profiler pass costs a few steps' time
        for name, step in steps.items():
            rows[name]["peak_step_memory_bytes"] = peak_step_memory(lambda s=step: s(batches[0]))
    ref = rows.get("nn_transformer_fp32")
    for r in rows.values():
        r["vs_nn_transformer_fp32"] = r["tokens_per_s"] / ref["tokens_per_s"] if ref else None
    cpu = torch.device("cpu")
    return {
        "config": dataclasses.asdict(cfg),
        "params": {
            "ours": _params(build_ours(cfg, cpu)),
            "nn_transformer": _params(build_nn(cfg, cpu)),
        },
        "batches": [_batch_summary(b) for b in batches],
        "target_tokens_per_round": tokens,
        "model_flops_per_round": flops["model"],
        "padded_flops_per_round": {
            "generator_on_all_positions": flops["padded"][False, False],
            "generator_on_real_tokens": flops["padded"][True, False],
            "generator_and_ffn_on_real_tokens": flops["padded"][True, True],
        },
        "flop_counter_check": _flop_check(cfg, variants[0], steps[variants[0]], batches[0]),
        "timing_wall_s": timing_s,
        "variants": rows,
        "ratios": ratios(rows),
        "fastest": fastest(rows),
    }


def add_mfu(results: dict[str, Any], peaks: dict[str, float]) -> None:
    """Model-FLOPs utilization of every variant: achieved model FLOP/s ÷ the matmul peak.

    bf16-autocast variants are divided by the bf16 peak, fp32 ones by the fp32 peak. ``mfu``
    counts the useful FLOPs (each sentence at its own length); ``hfu_padded`` the FLOPs on the
    padded tensors, which is what the hardware executes.
    """
    for res in results.values():
        for row in res["variants"].values():
            ref = "bf16" if row["precision"].startswith("bf16") else "fp32"
            row["peak_reference"] = ref
            row["mfu"] = row["model_tflops_per_s"] * 1e12 / peaks[ref]
            row["hfu_padded"] = row["padded_tflops_per_s"] * 1e12 / peaks[ref]


# Pairs of variants that isolate one change (besides every variant vs nn.Transformer fp32).
RATIO_PAIRS = [
    ("ours_fp32", "nn_transformer_fp32_trainer_step"),
    ("nn_transformer_fp32_trainer_step", "nn_transformer_fp32"),
    ("ours_fp32", "textbook_fp32"),
    ("ours_fp32", "explicit_attention_fp32"),
    ("ours_fp32", "ours_fp32_fused_attention"),  # the attention rule's evidence
    ("ours_bf16", "ours_bf16_fused_attention"),
    ("nn_transformer_fp32", "textbook_fp32"),
    ("ours_bf16", "nn_transformer_bf16"),
    ("ours_bf16", "ours_fp32"),
    ("nn_transformer_bf16", "nn_transformer_fp32"),
    ("ours_fp32_paper_dropout", "ours_fp32"),
    ("ours_fp32_paper_dropout", "nn_transformer_fp32_paper_dropout"),
    ("ours_fp32_paper_dropout", "textbook_fp32_paper_dropout"),
    ("nn_transformer_fp32_paper_dropout", "nn_transformer_fp32"),
    ("ours_bf16_paper_dropout", "ours_bf16"),
    ("ours_bf16_paper_dropout", "nn_transformer_bf16_paper_dropout"),
    ("ours_bf16_paper_dropout", "ours_fp32_paper_dropout"),
    ("ours_fp32", "ours_fp32_no_padding_skip"),
    (FAST_SETTING, f"{FAST_SETTING}_no_padding_skip"),
    ("ours_fp32", "ours_fp32_nn_dropout"),
    (FAST_SETTING, f"{FAST_SETTING}_nn_dropout"),
    (f"{FAST_SETTING}_compiled", FAST_SETTING),
]


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Throughput ratios whose keys name both sides: ``"A_vs_B"`` = tokens/s of A ÷ of B.

    Every variant against nn.Transformer fp32, plus the pairs that isolate one change.
    """
    pairs = [(a, "nn_transformer_fp32") for a in rows if a != "nn_transformer_fp32"]
    out = {}
    for a, b in pairs + RATIO_PAIRS:
        if a in rows and b in rows:
            out[f"{a}_vs_{b}"] = rows[a]["tokens_per_s"] / rows[b]["tokens_per_s"]
    return out


def fastest(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Our fastest variant, and its throughput ratio to nn.Transformer fp32."""
    ref = rows.get("nn_transformer_fp32", {}).get("tokens_per_s")
    cands = [k for k, r in rows.items() if r["model"] == "ours"]
    if not cands:
        return {}
    best = max(cands, key=lambda k: rows[k]["tokens_per_s"])
    return {
        "variant": best,
        "vs_nn_transformer_fp32": rows[best]["tokens_per_s"] / ref if ref else None,
    }


# --------------------------------------------------------------------------- the targets

_SAME_MATH = "both with the paper's dropout placement"
TARGETS = [
    # (config, ratio key, threshold, description). "Same math" holds under either dropout
    # placement as long as both sides use the same one, so both are reported.
    *(
        (cfg, key, thr, desc)
        for cfg in ("small", "base")
        for key, thr, desc in (
            (
                "ours_fp32_vs_nn_transformer_fp32",
                1.10,
                "ours fp32 >= 1.10x nn.Transformer fp32, dropout everywhere (nn's placement)",
            ),
            (
                "ours_fp32_paper_dropout_vs_nn_transformer_fp32_paper_dropout",
                1.10,
                f"ours fp32 >= 1.10x nn.Transformer fp32, {_SAME_MATH}",
            ),
            (
                "ours_fp32_vs_textbook_fp32",
                1.5,
                "ours fp32 >= 1.5x the textbook model, dropout everywhere",
            ),
            (
                "ours_fp32_paper_dropout_vs_textbook_fp32_paper_dropout",
                1.5,
                f"ours fp32 >= 1.5x the textbook model, {_SAME_MATH}",
            ),
        )
    ),
    (
        "small",
        f"{FAST_SETTING}_vs_nn_transformer_fp32",
        2.5,
        "the trainer's fast setting (bf16, paper dropout) >= 2.5x nn.Transformer fp32",
    ),
]


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each performance target with its measured value and whether it is met."""
    out = []
    for cfg, key, thr, desc in TARGETS:
        v = results.get(cfg, {}).get("ratios", {}).get(key)
        met = None if v is None else bool(v >= thr)
        out.append(
            {"config": cfg, "ratio": key, "value": v, "threshold": thr, "met": met, "target": desc}
        )
    return out


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["small", "base"], choices=list(CONFIGS))
    p.add_argument(
        "--variants",
        nargs="+",
        default=None,
        choices=list(VARIANTS),
        help="default: every variant for small, a subset for base",
    )
    p.add_argument(
        "--compile", action="store_true", help=f"also time torch.compile'd {FAST_SETTING}"
    )
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default: 5)")
    p.add_argument("--no-memory", action="store_true", help="skip the profiler memory pass")
    p.add_argument(
        "--no-extras", action="store_true", help="skip the micro-benchmarks and bucketing"
    )
    p.add_argument("--bucketing-vocab", type=int, default=8000, help="BPE vocabulary size")
    p.add_argument("--bucketing-max-tokens", type=int, default=3000, help="token budget of a batch")
    p.add_argument(
        "--bucketing-pairs", type=int, default=None, help="Multi30k pairs (default: all)"
    )
    p.add_argument("--peak-n", type=int, default=2048, help="matmul size for the FLOP/s peak")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_train.json")
    return p.parse_args(argv)


def measure_peaks(n: int, device: torch.device) -> dict[str, float]:
    """The fp32 and bf16 matmul peaks (FLOP/s) at this moment."""
    return {
        "fp32": matmul_peak(torch.float32, n=n, device=device),
        "bf16": matmul_peak(torch.bfloat16, n=n, device=device),
    }


def run_configs(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """:func:`run_config` on every configuration asked for; prints a short table of each."""
    results: dict[str, Any] = {}
    for name in args.configs:
        cfg = CONFIGS[name]
        if args.repeats:
            cfg = dataclasses.replace(cfg, repeats=args.repeats)
        variants = args.variants or DEFAULT_VARIANTS[name]
        compiled = [FAST_SETTING] if args.compile and name != "base" else []
        print(
            f"[{name}] d_model={cfg.d_model} N={cfg.N} h={cfg.h} d_ff={cfg.d_ff} "
            f"batch={cfg.batch_size}x{cfg.n_batches}: {', '.join(variants + compiled)}",
            flush=True,
        )
        results[name] = run_config(
            cfg, variants, device, compile_variants=compiled, measure_memory=not args.no_memory
        )
        rows = [{"variant": k, **v} for k, v in results[name]["variants"].items()]
        print(format_table(rows, ["variant", "tokens_per_s", "vs_nn_transformer_fp32"]))
    return results


def run_extras(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The micro-benchmarks of ``bench.micro`` at the sizes of the configurations run."""
    first = CONFIGS[args.configs[0]]
    d_models = sorted({CONFIGS[c].d_model for c in args.configs})
    return {
        "fused_qkv": [micro.fused_qkv_micro(d, 3000, device) for d in d_models],
        "layernorm": [micro.layernorm_micro(d, 3000, device) for d in d_models],
        "loss": micro.loss_micro(first.vocab, 2500, device),
        "dropout": [  # the residual stream's width and the FFN hidden layer's
            micro.dropout_micro(w, 4096, device, repeats=10) for d in d_models for w in (d, 4 * d)
        ],
        "attention_dtype": micro.attention_dtype_micro(first, device),
        "bucketing": micro.bucketing_experiment(
            first,
            device,
            max_tokens=args.bucketing_max_tokens,
            max_pairs=args.bucketing_pairs,
            vocab_size=args.bucketing_vocab,
        ),
    }


def print_extras(extras: dict[str, Any]) -> None:
    """One line per micro-benchmark: the time of the alternative ÷ the package's."""
    ad = extras["attention_dtype"]
    lines = [f"causal SDPA, fused bf16 / fp32 time {ad['fused_bf16_vs_fused_fp32_time']:.2f}"]
    lines += [
        f"LayerNorm d_model={r['d_model']}: by hand/fused time {r['by_hand_vs_fused_time']:.2f}"
        for r in extras["layernorm"]
    ]
    lo = extras["loss"]
    lines.append(
        f"label smoothing, definition/closed form {lo['definition_vs_closed_form_time']:.2f}"
    )
    lines += [
        f"dropout width {r['d_model']}: nn.Dropout/ours time {r['nn_dropout_vs_ours_time']:.2f}"
        for r in extras["dropout"]
    ]
    lines += [
        f"QKV d_model={r['d_model']}: separate/fused time {r['separate_vs_fused_time']:.2f}"
        for r in extras["fused_qkv"]
    ]
    bk = extras["bucketing"]
    if bk:
        lines.append(
            f"bucketing: padding {bk['bucketed_padding']:.1%} vs random "
            f"{bk['random_padding']:.1%}; real tokens/s ratio "
            f"{bk['bucketed_vs_random_tokens_per_s']:.2f}"
        )
    print("\n".join(lines), flush=True)


def print_summary(results: dict[str, Any], targets: list[dict[str, Any]]) -> None:
    """Every configuration's table (with MFU and peak memory), then the targets."""
    cols = ["variant", "tokens_per_s", "vs_nn_transformer_fp32", "mfu", "peak_MiB"]
    for name, res in results.items():
        rows = [
            {"variant": k, **v, "peak_MiB": (v["peak_step_memory_bytes"] or 0) / 2**20 or None}
            for k, v in res["variants"].items()
        ]
        print(f"[{name}]\n{format_table(rows, cols)}")
    for t in targets:
        v = "not measured" if t["value"] is None else f"{t['value']:.2f}"
        met = {True: "MET", False: "NOT MET", None: "-"}[t["met"]]
        print(f"target [{t['config']}] {t['target']}: {v} -> {met}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the JSON file (``--out``) and return its content."""
    args = parse_args(argv)
    commit = git_commit()  # now: the code that runs, even if files change later
    t_start = time.perf_counter()
    device = torch.device(args.device)
    machine = machine_description()
    print(
        f"{machine['cpu_model']}, {machine['torch_threads']} threads, torch "
        f"{machine['torch_version']}, load {machine['load_average_start']}",
        flush=True,
    )
    peaks = measure_peaks(args.peak_n, device)
    diff = same_math_check(CONFIGS[args.configs[0]], device)
    print(f"same math: ours vs nn.Transformer, max |Δ log-prob| = {diff:.2e}", flush=True)
    results = run_configs(args, device)
    extras = {} if args.no_extras else run_extras(args, device)
    if extras:
        print_extras(extras)
    peaks_end = measure_peaks(args.peak_n, device)
    best = {k: max(peaks[k], peaks_end[k]) for k in peaks}
    add_mfu(results, best)
    machine["load_average_end"] = load_average()
    targets = check_targets(results)
    print_summary(results, targets)
    out = {
        "benchmark": "train_throughput",
        "description": __doc__.strip().split("\n\n", 2)[-1],
        "command": " ".join(
            ["python -m bench.train_throughput", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": now_iso(),
        "git_commit": commit,
        "machine": machine,
        "device": str(device),
        "matmul_peak_flops": {
            "start": peaks,
            "end": peaks_end,
            "used_for_mfu": best,
            "n": args.peak_n,
            "note": "best of 5 (n x n) @ (n x n) products at the start and at the end of the "
            "run; MFU divides by the larger of the two",
        },
        "same_math_max_abs_diff": diff,
        "configs": results,
        "extras": extras,
        "targets": targets,
        "wall_time_s": round(time.perf_counter() - t_start, 1),
    }
    write_json(args.out, out)
    print(f"wrote {args.out} in {out['wall_time_s']} s")
    return out


if __name__ == "__main__":
    main()
