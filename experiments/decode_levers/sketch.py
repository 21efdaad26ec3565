"""Do a lighter attention kernel for the new position, or larger batches, speed up translation?

    python -m experiments.decode_levers.sketch --out FILE  # ~15 min

``FILE``: ``experiments/decode_levers/results_<cpu>.json`` (``results_epyc.json``, ...).

Chapter 9's profile of ``translate`` puts about a seventh of the time into the attention
kernel and a sixth into the many small operations around the products. This sketch tries two
levers on the shipped model, without touching the package, against the package as it is:

* the decoder's self-attention for the one new position (one query over the cache) computed
  by chapter 1's formula instead of PyTorch's fused kernel, as two products and a softmax
  (``explicit``) or as an elementwise product summed over d_k (``summed``), which reads the
  time-major cache of ``fast_beam`` in its own order;
* more sentences per batch (``translate_sentences(batch_size=...)``, rows = sentences x beams):
  fewer steps in all, so each operation's fixed cost is paid fewer times.

The first ``--limit`` *validation* sentences are translated with beam search in fp32 (a lever
is chosen on validation, never on the test set), in interleaved rounds
(``bench.common.interleaved_times``), on one and on two threads. The record keeps every round,
each variant's per-round ratio (the package's time over the variant's: above 1 is faster),
its BLEU and how many translations equal the package's.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bench.common import git_commit, interleaved_times, machine_description, now_iso, write_json
from transformer_lib.translation import fast_beam, inference
from transformer_lib.translation.data import load_multi30k
from transformer_lib.translation.pretrained import load_pretrained
from transformer_lib.translation.scoring import bleu


def explicit(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d_k)) v by chapter 1's formula. q (rows, h, 1, d_k), k and v
    (rows, h, t, d_k) -> (rows, h, 1, d_k)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (rows, h, 1, t)
    return scores.softmax(dim=-1) @ v


def summed(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The same, with the products as elementwise products summed: no copy of a view."""
    scores = (q * k).sum(dim=-1) / math.sqrt(q.size(-1))  # (rows, h, t)
    weights = scores.softmax(dim=-1).unsqueeze(-1)  # (rows, h, t, 1)
    return (weights * v).sum(dim=-2, keepdim=True)  # (rows, h, 1, d_k)


class OneQueryAttention:
    """``torch.nn.functional`` for ``fast_beam``, with ``attend`` for its one unmasked case:
    the decoder's self-attention of the new position (the source attention has a mask, and
    the encoder has a mask and many queries). ``calls`` counts the replaced calls."""

    def __init__(self, attend: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
        self.attend, self.calls = attend, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(F, name)

    def scaled_dot_product_attention(self, q: Tensor, k: Tensor, v: Tensor,
                                     attn_mask: Tensor | None = None, **kw: Any) -> Tensor:
        if q.size(-2) != 1 or attn_mask is not None or kw:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)
        self.calls += 1
        return self.attend(q, k, v)


# name: (parent, what changed, rows per batch (None: the package's default), attention)
VARIANTS: dict[str, tuple[str | None, str, int | None, Callable | None]] = {
    "package": (None, "translate_sentences as shipped (256 rows a batch)", None, None),
    "explicit": ("package", "the new position's self-attention by chapter 1's formula",
                 None, explicit),
    "summed": ("package", "the same, as elementwise products summed", None, summed),
    "rows_512": ("package", "512 rows a batch (128 sentences of 4 beams)", 512, None),
    "rows_1024": ("package", "1,024 rows a batch (256 sentences)", 1024, None),
}


def translator(model: Any, tok: Any, cfg: Any, sources: list[str], name: str,
               replaced: dict[str, OneQueryAttention]) -> Callable[[], list[str]]:
    """A call that translates ``sources`` as variant ``name`` does."""
    batch = VARIANTS[name][2]
    sizes = {} if batch is None else {"batch_size": batch}
    attend = VARIANTS[name][3]

    def run() -> list[str]:
        if attend is not None:
            fast_beam.F = replaced.setdefault(name, OneQueryAttention(attend))
        try:
            return inference.translate_sentences(
                model, tok, sources, beam_size=cfg.beam_size, precision="fp32",
                **cfg.decode_kwargs(), **sizes)
        finally:
            fast_beam.F = F
    return run


def verdict(rounds: list[float]) -> str:
    """Chapter 9's rule: a gain (loss) only when every round is above (below) 1."""
    return "gain" if min(rounds) > 1 else "loss" if max(rounds) < 1 else "noise"


def measure(fns: dict[str, Callable[[], list[str]]], pairs: list[tuple[str, str]],
            repeats: int, label: str) -> dict[str, Any]:
    """One thread count: every variant's rounds, ratio to the package, BLEU, sameness."""
    outputs = {name: fn() for name, fn in fns.items()}  # also the warm-up
    times = interleaved_times(fns, 0, repeats, progress=label)
    run: dict[str, Any] = {}
    for name in fns:
        rounds = [p / t for p, t in zip(times["package"], times[name])]
        run[name] = {
            "seconds_all": [round(t, 4) for t in times[name]],
            "seconds": statistics.median(times[name]),
            "speedup": statistics.median(times["package"]) / statistics.median(times[name]),
            "speedup_per_round": rounds,
            "verdict": "the reference" if name == "package" else verdict(rounds),
            "bleu": round(bleu(outputs[name], pairs).score, 2),
            "same_as_package": sum(a == b for a, b in zip(outputs[name], outputs["package"])),
        }
        print(f"{label} {name}: {statistics.median(times[name]):.2f} s, "
              f"{run[name]['speedup']:.2f}x ({min(rounds):.2f}-{max(rounds):.2f}) "
              f"{run[name]['verdict']}; identical {run[name]['same_as_package']}/{len(pairs)}")
    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=500, help="validation sentences (default 500)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    args = p.parse_args(argv)
    model, tok, cfg = load_pretrained(device="cpu")
    pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang, limit=args.limit)
    sources = [s for s, _ in pairs]
    replaced: dict[str, OneQueryAttention] = {}
    result: dict[str, Any] = {
        "experiment": "decode_levers", "date": now_iso(), "git_commit": git_commit(),
        "machine": machine_description(), "split": "val", "sentences": len(sources),
        "beam_size": cfg.beam_size, "precision": "fp32", "repeats": args.repeats,
        "variants": {n: {"parent": v[0], "what_changed": v[1]} for n, v in VARIANTS.items()},
        "by_threads": {},
    }
    before = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            fns = {n: translator(model, tok, cfg, sources, n, replaced) for n in VARIANTS}
            result["by_threads"][str(threads)] = measure(
                fns, pairs, args.repeats, f"{threads} thread(s)")
    finally:
        torch.set_num_threads(before)
    result["replaced_attention_calls"] = {n: a.calls for n, a in replaced.items()}
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
