"""Training throughput of chapter 8's race: the Transformer against the GRU baseline, by threads.

    python -m bench.rnn_speed                 # writes results/bench_rnn.json (about 2 minutes)
    python -m bench.rnn_speed --steps 4 --out /tmp/x.json   # a quick smoke run

Both models are built from the race's configs (configs/multi30k_transformer_30min.toml and
configs/multi30k_gru.toml) with the shipped model's tokenizer, and take the same optimizer
steps (the package's `train_step`, with the configs' clipping) on the same length-bucketed
Multi30k batches, in one precision for both: "auto" (the default) is bf16 autocast, the
race's, where the CPU has bf16 natively, else fp32 (emulated bf16 would time the emulation).
For each thread count the two models' steps are interleaved (bench.common.interleaved_times),
so background load hits both alike; the table reports target tokens per second and the
Transformer/GRU ratio, and each model's speed-up from one thread to two. Chapter 8 reads the
JSON.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.common import (
    RESULTS,
    ROOT,
    format_table,
    git_commit,
    interleaved_times,
    load_average,
    machine_description,
    median,
    now_iso,
    write_json,
)
from transformer_lib import translation
from transformer_lib.training import Batch, LabelSmoothing, train_step
from transformer_lib.translation.data import (
    PAD,
    collate,
    encode_pairs,
    load_multi30k,
    load_tokenizer,
    make_batches,
)
from transformer_lib.translation.pretrained import pretrained_path

CONFIGS = {
    "transformer": ROOT / "configs" / "multi30k_transformer_30min.toml",
    "gru": ROOT / "configs" / "multi30k_gru.toml",
}


def _stepper(cfg: translation.Config, vocab: int, batches: list[Batch], precision: str):
    """A callable doing one optimizer step per call, cycling through `batches`."""
    torch.manual_seed(cfg.seed)
    model = cfg.build_model(vocab).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=cfg.adam_betas, eps=cfg.adam_eps)
    criterion = LabelSmoothing(vocab, PAD, cfg.label_smoothing)
    position = [0]

    def step() -> None:
        b = batches[position[0] % len(batches)]
        position[0] += 1
        train_step(model, [b], criterion, opt, precision=precision, clip_norm=cfg.clip_norm)

    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=24, help="timed steps per model and thread count")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", type=Path, default=RESULTS / "bench_rnn.json")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                    help="auto: bf16 autocast where this CPU has it natively, else fp32")
    args = ap.parse_args()
    precision = translation.resolve_precision(args.precision, "cpu")
    tok = load_tokenizer(pretrained_path() / "tokenizer.json")
    vocab = tok.get_vocab_size()
    cfgs = {name: translation.load_config(path) for name, path in CONFIGS.items()}
    examples = encode_pairs(load_multi30k("train"), tok, cfgs["transformer"].drop_longer_than)
    max_tokens = cfgs["transformer"].max_tokens
    order = make_batches(examples, max_tokens, shuffle=True, seed=0)[: args.steps]
    batches = [Batch(*collate(examples, idx, pad=PAD), pad=PAD) for idx in order]
    tokens = sum(b.ntokens for b in batches)
    load_start, rows, threads_before = load_average(), [], torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            steps = {name: _stepper(cfg, vocab, batches, precision) for name, cfg in cfgs.items()}
            times = interleaved_times(steps, warmup=2, repeats=args.steps,
                                      progress=f"{threads} thread(s)")
            per_step = {name: median(t) for name, t in times.items()}
            row = {"threads": threads}
            for name, seconds in per_step.items():
                row[f"{name}_tokens_per_s"] = tokens / len(batches) / seconds
            row["transformer_over_gru"] = per_step["gru"] / per_step["transformer"]
            rows.append(row)
    finally:
        torch.set_num_threads(threads_before)
    for name in cfgs:
        key = f"{name}_tokens_per_s"
        rows[-1][f"{name}_speedup_vs_1_thread"] = rows[-1][key] / rows[0][key]
    columns = ["threads", "transformer_tokens_per_s", "gru_tokens_per_s", "transformer_over_gru"]
    print(f"precision: {precision} ({args.precision})")
    print(format_table(rows, columns))
    for name in cfgs:
        print(f"{name}: {rows[-1][f'{name}_speedup_vs_1_thread']:.2f}x from "
              f"{args.threads[0]} to {args.threads[-1]} threads")
    params = {name: translation.parameter_count(cfg, vocab) for name, cfg in cfgs.items()}
    write_json(args.out, {
        "benchmark": "rnn_speed",
        "description": __doc__.split("\n\n")[2].replace("\n", " "),
        "command": f"python -m bench.rnn_speed --steps {args.steps}"
                   + ("" if args.precision == "auto" else f" --precision {args.precision}"),
        "date": now_iso(),
        "git_commit": git_commit(),
        "machine": machine_description() | {"load_average_start": load_start,
                                            "load_average_end": load_average()},
        "steps": args.steps,
        "precision": precision,
        "target_tokens_per_step": tokens / len(batches),
        "parameters": params,
        "rows": rows,
    })
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
