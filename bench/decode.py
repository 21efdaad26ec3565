"""Decoding time against output length: greedy without and with the KV cache, and beam search.

    python -m bench.decode                  # lengths 16 32 64 128; writes results/bench_decode.json
    python -m bench.decode --lengths 16 32 --repeats 2 --out /tmp/decode.json

Three ways to generate ``n`` tokens for a small batch of sentences with chapter 7's decoders:

* ``greedy_no_cache``: ``greedy_decode(..., use_cache=False)``, the textbook loop: every step
  re-runs the whole decoder over the prefix, so step t costs O(t) positions (O(t²) attention
  scores) and n tokens cost O(n²) position-passes.
* ``greedy_cache``: ``greedy_decode(..., use_cache=True)``: every step runs the decoder on the one
  new position and attends over cached keys/values: O(1) positions per step (O(t) attention
  scores), O(n) position-passes in all.
* ``beam4_cache``: ``beam_search(..., beam_size=4)`` with the cache: 4× the rows of greedy, plus
  the bookkeeping (top-k, reordering the cache).

The model is a randomly initialised ``make_model`` in eval mode (timing does not depend on the
weights). To force exactly ``n`` generated tokens, greedy runs without an end symbol, and beam
search gets an end symbol whose output bias is -1e9, so no hypothesis finishes before
``max_len``. Implementations are interleaved at every length (``bench/common.py``); the table
reports the median of the repeats and the ratio of each time to ``greedy_no_cache`` measured in
the same run. The script also checks that the cached and uncached greedy outputs are identical.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.common import (
    RESULTS,
    format_table,
    git_commit,
    interleaved_times,
    load_average,
    machine_description,
    median,
    now_iso,
    write_json,
)
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.model import make_model

PAD, BOS, EOS = 0, 1, 2
METHODS = ("greedy_no_cache", "greedy_cache", "beam4_cache")
DEFAULT_LENGTHS = [16, 32, 64, 128]


def build(
    *, vocab: int, layers: int, d_model: int, heads: int, batch: int, src_len: int
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Random model (EOS suppressed) and a padded batch of sources with its mask."""
    torch.manual_seed(0)
    model = make_model(
        vocab, vocab, N=layers, d_model=d_model, d_ff=4 * d_model, h=heads, dropout=0.1
    ).eval()
    out_proj = [m for m in model.generator.modules() if isinstance(m, nn.Linear)][-1]
    with torch.no_grad():
        out_proj.bias[EOS] = -1e9  # never finish: every run decodes max_len tokens
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, vocab, (batch, src_len), generator=g)
    src[1:, src_len * 3 // 4 :] = PAD  # some padding, as in a real batch
    return model, src, (src != PAD).unsqueeze(-2)


def methods(model: nn.Module, src: torch.Tensor, src_mask: torch.Tensor, n: int) -> dict[str, Any]:
    """A no-argument callable per method, each generating ``n`` tokens per sentence."""
    max_len = n + 1  # the start symbol counts towards max_len
    return {
        "greedy_no_cache": lambda: greedy_decode(model, src, src_mask, max_len, BOS, None, False),
        "greedy_cache": lambda: greedy_decode(model, src, src_mask, max_len, BOS, None, True),
        "beam4_cache": lambda: beam_search(model, src, src_mask, max_len, BOS, EOS, beam_size=4),
    }


def measure(
    model: nn.Module, src: torch.Tensor, src_mask: torch.Tensor, lengths: list[int], repeats: int
) -> list[dict[str, Any]]:
    """One row per output length: median seconds of every method, ratios to the uncached loop,
    and whether cached and uncached greedy decoding gave identical tokens."""
    start = time.perf_counter()
    for fn in methods(model, src, src_mask, 8).values():  # warm-up: kernels, allocator
        fn()
    rows = []
    for n in lengths:
        fns = methods(model, src, src_mask, n)
        same = torch.equal(fns["greedy_no_cache"](), fns["greedy_cache"]())
        times = interleaved_times(fns, warmup=0, repeats=repeats)
        base = median(times["greedy_no_cache"])
        row: dict[str, Any] = {"output_length": n, "tokens_identical": same}
        for name in METHODS:
            row[f"{name}_s"] = median(times[name])
            row[f"{name}_ratio"] = median(times[name]) / base
            row[f"{name}_all_s"] = [round(t, 6) for t in times[name]]
        rows.append(row)
        print(f"n={n}: done ({time.perf_counter() - start:.0f} s so far)", file=sys.stderr)
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=DEFAULT_LENGTHS)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--src-len", type=int, default=24)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="N, for the encoder and the decoder")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_decode.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the JSON file (``--out``) and return its content."""
    args = parse_args(argv)
    commit = git_commit()  # now: the code that runs, even if files change later
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description()
    start = time.perf_counter()
    model, src, src_mask = build(
        vocab=args.vocab,
        layers=args.layers,
        d_model=args.d_model,
        heads=args.heads,
        batch=args.batch,
        src_len=args.src_len,
    )
    rows = measure(model, src, src_mask, args.lengths, args.repeats)
    print(format_table(rows, ["output_length", *(f"{m}_s" for m in METHODS)]))
    print()
    print(format_table(rows, ["output_length", *(f"{m}_ratio" for m in METHODS)]))
    speedup = 1 / rows[-1]["greedy_cache_ratio"]
    print(f"\nKV cache speed-up at {rows[-1]['output_length']} tokens: {speedup:.1f}x")
    out = {
        "benchmark": "decode",
        "description": __doc__.split("\n\n")[0],
        "command": " ".join(["python -m bench.decode", *(sys.argv[1:] if argv is None else argv)]),
        "date": now_iso(),
        "git_commit": commit,
        "machine": machine,
        "load_average_end": load_average(),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "config": {
            "model": {
                "N": args.layers,
                "d_model": args.d_model,
                "d_ff": 4 * args.d_model,
                "h": args.heads,
                "vocab": args.vocab,
                "weights": "random (seed 0), eval",
            },
            "batch": args.batch,
            "src_len": args.src_len,
            "beam_size": 4,
            "repeats": args.repeats,
            "statistic": "median",
            "output_length": "generated tokens, not counting the start symbol (max_len - 1)",
        },
        "results": rows,
    }
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    # a non-zero exit status if the cache ever changed the greedy output
    sys.exit(0 if all(r["tokens_identical"] for r in main()["results"]) else 1)
