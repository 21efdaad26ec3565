"""Does a leaner decoder step close the gap to CTranslate2? A sketch, measured against chapter 7.

    python -m experiments.decode_speed.sketch     # ~4 min → experiments/decode_speed/results.json

The performance appendix profiles translation with the shipped model and lists what lies
around the matrix products: many small operations per step, a cache grown by ``torch.cat``,
an attention kernel for a single query. This sketch removes the first two without touching
the package: ``lean_step`` computes the same decoder step as chapter 7's ``decode_step`` for a
pre-norm model, with

* no argument checks (chapter 3's attention validates its inputs and the mask at every call),
* one product for the new position's query, key and value (chapter 7 makes two),
* the source mask turned into an additive float mask once per batch, not at every step,
* a cache written into buffers allocated ahead (doubled when full), laid out
  (2, positions, rows, h, d_k) so the prefix a step reads is one slice; beam reordering
  gathers only the filled part.

``lean_decoding()`` swaps it into ``beam_search`` (through the private ``_NextTokenLogProbs``:
this is an experiment, not an API). The script translates the Multi30k test set with the
shipped settings, both steps interleaved (``bench.common.interleaved_times``), in fp32 and on
``quantize_int8``'s copy, checks that every translation is identical, and records the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bench.common import git_commit, interleaved_times, machine_description, now_iso, write_json
from transformer_lib import decoding
from transformer_lib.translation import inference
from transformer_lib.translation.data import load_multi30k
from transformer_lib.translation.pretrained import load_pretrained
from transformer_lib.translation.quantize import quantize_int8

OUT = Path(__file__).with_name("results.json")


class LeanCache:
    """Self-attention keys and values in buffers of (2, capacity, rows, h, d_k), one per layer.

    The capacity starts small and doubles when a step needs more (a batch's longest output
    is not known here), so a step writes into memory allocated before, and a reordering
    copies only the positions decoded so far.
    """

    def __init__(self, model: nn.Module, memory: Tensor, src_mask: Tensor, capacity: int = 16
                 ) -> None:
        layers = model.decoder.layers
        attn = layers[0].self_attn
        self.h, self.d_k, self.length = attn.h, attn.d_k, 0
        self.src_kv = [layer.src_attn.project_kv(memory, memory) for layer in layers]
        self.kv = [self._empty(memory, capacity, memory.size(0)) for _ in layers]
        allowed = src_mask.unsqueeze(1)  # (rows, 1, 1, src_len)
        self.add_mask = torch.zeros(allowed.shape, dtype=memory.dtype).masked_fill(
            ~allowed, float("-inf"))

    def _empty(self, like: Tensor, capacity: int, rows: int) -> Tensor:
        return like.new_empty(2, capacity, rows, self.h, self.d_k)

    def make_room(self) -> None:
        """Room for one more position: double the buffers when they are full."""
        t = self.length
        for i, kv in enumerate(self.kv):
            if t == kv.size(1):
                new = self._empty(kv, 2 * t, kv.size(2))
                new[:, :t] = kv
                self.kv[i] = new

    def reorder(self, index: Tensor, sources: bool = False) -> None:
        t = self.length
        for i, kv in enumerate(self.kv):
            new = self._empty(kv, kv.size(1), index.numel())
            new[:, :t] = kv[:, :t].index_select(2, index)
            self.kv[i] = new
        if sources:
            self.src_kv = [(k.index_select(0, index), v.index_select(0, index))
                           for k, v in self.src_kv]
            self.add_mask = self.add_mask.index_select(0, index)


def lean_step(model: nn.Module, cache: LeanCache, tokens: Tensor) -> Tensor:
    """``decode_step`` of a pre-norm model: tokens (rows, 1) -> (rows, 1, d_model)."""
    cache.make_room()
    t, h, d_k = cache.length, cache.h, cache.d_k
    x = model.tgt_embed[1](model.tgt_embed[0](tokens), start=t)  # (rows, 1, d)
    rows, d = x.size(0), h * d_k
    for layer, kv, (src_k, src_v) in zip(model.decoder.layers, cache.kv, cache.src_kv):
        self_attn, src_attn = layer.self_attn, layer.src_attn
        norms = [s.norm for s in layer.sublayer]
        y = F.layer_norm(x, (d,), norms[0].weight, norms[0].bias, norms[0].eps)
        qkv = F.linear(y, self_attn.in_proj.weight, self_attn.in_proj.bias).view(rows, 3, h, d_k)
        kv[:, t] = qkv[:, 1:].transpose(0, 1)  # the new key and value, (2, rows, h, d_k)
        k, v = kv[:, : t + 1].permute(0, 2, 3, 1, 4)  # each (rows, h, t+1, d_k)
        a = F.scaled_dot_product_attention(qkv[:, 0].unsqueeze(2), k, v)  # (rows, h, 1, d_k)
        x = x + self_attn.out_proj(a.reshape(rows, 1, d))
        y = F.layer_norm(x, (d,), norms[1].weight, norms[1].bias, norms[1].eps)
        w, b = src_attn.in_proj.weight[:d], src_attn.in_proj.bias[:d]
        q = F.linear(y, w, b).view(rows, 1, h, d_k).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, src_k, src_v, attn_mask=cache.add_mask)
        x = x + src_attn.out_proj(a.reshape(rows, 1, d))
        y = F.layer_norm(x, (d,), norms[2].weight, norms[2].bias, norms[2].eps)
        x = x + layer.feed_forward.w_2(F.relu(layer.feed_forward.w_1(y)))
    cache.length += 1
    return model.decoder.norm(x)


@contextlib.contextmanager
def lean_decoding() -> Iterator[None]:
    """Within the block, ``beam_search`` and ``greedy_decode`` decode with ``lean_step``."""
    cls = decoding._NextTokenLogProbs
    saved = cls.__init__, cls.__call__

    def init(self: Any, model: nn.Module, memory: Tensor, src_mask: Tensor, use_cache: bool
             ) -> None:
        if not model.decoder.layers[0].sublayer[0].norm_first:
            raise ValueError("lean_step is written for pre-norm models")
        self.model, self.memory, self.src_mask = model, memory, src_mask
        self.cache = LeanCache(model, memory, src_mask)

    def call(self: Any, ys: Tensor) -> Tensor:
        return self.model.generator(lean_step(self.model, self.cache, ys[:, -1:])[:, -1]).float()

    cls.__init__, cls.__call__ = init, call
    try:
        yield
    finally:
        cls.__init__, cls.__call__ = saved


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="test sentences (all: 1,000)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    commit = git_commit()
    torch.set_num_threads(args.threads)
    model, tok, cfg = load_pretrained(device="cpu")
    test = load_multi30k("test", cfg.data_dir, cfg.src_lang, cfg.tgt_lang, limit=args.limit)
    sentences = [s for s, _ in test]
    outputs: dict[str, list[str]] = {}

    def system(m: nn.Module, lean: bool, name: str) -> Any:
        def run() -> None:
            with lean_decoding() if lean else contextlib.nullcontext():
                out = inference.translate_sentences(m, tok, sentences, beam_size=cfg.beam_size,
                                                    precision="fp32", **cfg.decode_kwargs())
            assert outputs.setdefault(name, out) == out, f"{name}: a round translated otherwise"
        return run

    int8 = quantize_int8(model)
    fns = {f"{step}_{kind}": system(m, step == "lean", f"{kind}_{step}")
           for step in ("chapter7", "lean") for kind, m in (("fp32", model), ("int8", int8))}
    times = interleaved_times(fns, warmup=1, repeats=args.repeats, progress="decode_speed")
    identical = {kind: outputs[f"{kind}_chapter7"] == outputs[f"{kind}_lean"]
                 for kind in ("fp32", "int8")}
    med = {name: round(statistics.median(ts), 3) for name, ts in times.items()}
    result = {
        "git_commit": commit, "machine": machine_description(), "date": now_iso(),
        "sentences": len(sentences), "beam_size": cfg.beam_size, "threads": args.threads,
        "identical_translations": identical,
        "seconds": {name: [round(x, 3) for x in ts] for name, ts in times.items()},
        "median_seconds": med,
        "lean_speedup": {kind: round(med[f"chapter7_{kind}"] / med[f"lean_{kind}"], 3)
                         for kind in ("fp32", "int8")},
    }
    write_json(args.out, result)
    print({k: result[k] for k in ("identical_translations", "median_seconds", "lean_speedup")})
    return result


if __name__ == "__main__":
    main()
