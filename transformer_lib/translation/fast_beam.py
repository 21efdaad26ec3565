"""Beam search for translation, with less work around the products (hand-written).

``decoding.beam_search`` (chapter 7) is the readable version; ``beam_search`` here searches
the same way for an ``EncoderDecoder`` and is what ``translate_sentences`` runs in fp32 on the
CPU. It changes how the work is done, not what is computed; the summation order changes in
places, so scores can differ from chapter 7's in the last bits (``tests/test_fast_beam.py``:
the same hypotheses on random models and on 200 validation sentences of the shipped one):

* on CPUs not made by Intel the products run in oneDNN instead of MKL (``onednn_default``):
  on an AMD EPYC a whole translation with MKL's products took 1.13x (rounds 1.07-1.27x)
  the time with oneDNN's on two threads, within noise on one
  (``experiments/product_engine/results_epyc.json``);
* the encoder output's keys and values are projected once per sentence, not once per beam,
  and the k beams of a sentence attend to them together (the beams as k queries of one
  sentence: the keys and values are read once, not k times);
* the self-attention cache is preallocated, time-major, ``(max_len, rows, h, d_k)``: a step
  writes its position in place, and following the beams' parents copies the filled part
  once into a second buffer (``index_select(out=...)``), instead of a ``cat`` and an
  ``index_select`` that each allocate and copy the whole cache;
* the decoder layers run without the input checks and mask repairs that ``forward`` needs
  for arbitrary input (the masks here are known: no padding in the prefix, a source with at
  least one token);
* the candidates are ranked without adding each beam's score to the whole vocabulary: each
  beam's 2k best tokens are taken first (log P(prefix) + log P(token) is increasing in the
  token's log-probability), then the best 2k of the k·2k (chapter 9's vocabulary-wide ops).

Models with their own incremental decoder (``start_decoding``, the GRU of chapter 8) and
re-decoding without a cache go to ``decoding.beam_search``.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib import decoding
from transformer_lib.decoding import (
    _add_live,
    _check_beam_args,
    _finish,
    _keep_live,
    _mark_done,
    gnmt_length_penalty,
)
from transformer_lib.layers import (
    EncoderLayer,
    Generator,
    PositionwiseFeedForward,
    on_positions,
    visible_positions,
)
from transformer_lib.multihead import MultiHeadedAttention

__all__ = ["beam_search", "supports", "onednn_default"]

_MHA_PROJECT = MultiHeadedAttention._project


def supports(model: nn.Module, src: Tensor) -> bool:
    """Whether ``beam_search`` here decodes `model` (else ``decoding.beam_search``): an
    ``EncoderDecoder`` of chapter 5's layers in eval mode, on the CPU, without autocast (in
    bf16 chapter 3's attention computes in fp32, which this path does not repeat)."""
    layers = [*getattr(getattr(model, "encoder", None), "layers", []),
              *getattr(getattr(model, "decoder", None), "layers", [])]
    return (getattr(model, "start_decoding", None) is None and bool(layers)
            and all(isinstance(getattr(layer, "self_attn", None), MultiHeadedAttention)
                    for layer in layers)
            and not model.training and src.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu"))


class _BeamCache:
    """Keys and values of every decoder layer for the beams of a batch of sentences.

    ``src_kv[l]``: (batch, h, src_len, d_k) each, one per sentence. ``self_kv``: per layer
    two flat buffers viewed as (max_len, rows, h, d_k), and a spare pair that
    ``reorder`` copies into.
    """

    def __init__(self, model: nn.Module, memory: Tensor, k: int, max_len: int,
                 linear: _Linear) -> None:
        layers = model.decoder.layers
        self.k, self.length, self.rows = k, 0, memory.size(0) * k
        attn = layers[0].self_attn
        self.shape = (attn.h, attn.d_k)
        d, split = attn.d_model, (memory.size(0), memory.size(1), 2, *self.shape)
        # (batch, src_len, 2, h, d_k) -> keys and values (batch, h, src_len, d_k)
        kvs = [_project(linear, layer.src_attn, memory, slice(d, 3 * d)).view(split)
               for layer in layers]
        self.src_kv = [(kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)) for kv in kvs]
        size = max_len * self.rows * attn.h * attn.d_k
        self.buffers = [[memory.new_empty(size) for _ in range(4)] for _ in layers]

    def _view(self, flat: Tensor) -> Tensor:
        step = self.rows * self.shape[0] * self.shape[1]  # one position of every row
        return flat[: flat.numel() // step * step].view(-1, self.rows, *self.shape)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k, v (rows, h, 1, d_k) at the newest position -> all (rows, h, t+1, d_k)."""
        t, bufs = self.length, self.buffers[layer]
        kb, vb = self._view(bufs[0]), self._view(bufs[1])
        kb[t].copy_(k.squeeze(2))
        vb[t].copy_(v.squeeze(2))
        return kb[: t + 1].permute(1, 2, 0, 3), vb[: t + 1].permute(1, 2, 0, 3)

    def reorder(self, rows: Tensor, sentences: Tensor | None) -> None:
        """Keep cache rows ``rows``; ``sentences``: the source entries that stay."""
        t, n = self.length, rows.numel()
        for bufs in self.buffers:
            for old, new in ((0, 2), (1, 3)):
                src = self._view(bufs[old])[:t]
                dst = bufs[new][: t * n * src[0, 0].numel()].view(t, n, *self.shape)
                torch.index_select(src, 1, rows, out=dst)
            bufs[:] = [bufs[2], bufs[3], bufs[0], bufs[1]]
        self.rows = n
        if sentences is not None:
            self.src_kv = [(k.index_select(0, sentences), v.index_select(0, sentences))
                           for k, v in self.src_kv]


def onednn_default() -> bool:
    """Whether the products run in oneDNN by default: on CPUs not made by Intel.

    PyTorch's fp32 ``nn.Linear`` calls MKL, which on other vendors' CPUs takes slower code
    paths; with oneDNN's products (also in PyTorch) a translation measured faster on an AMD
    EPYC on two threads, and no faster on an Intel Xeon (``experiments/product_engine``).
    ``TRANSFORMER_LIB_ONEDNN=1`` or ``0`` overrides.
    """
    forced = os.environ.get("TRANSFORMER_LIB_ONEDNN")
    if forced in ("0", "1"):
        return forced == "1"
    return torch.backends.mkldnn.is_available() and _cpu_vendor() not in ("GenuineIntel", "")


@functools.cache
def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("vendor_id")), "")
    except OSError:
        return ""


class _Linear:
    """Calls an ``nn.Linear`` (or rows of its weight) with MKL (PyTorch's) or oneDNN."""

    def __init__(self, onednn: bool) -> None:
        self.onednn = onednn

    def __call__(self, m: nn.Module, x: Tensor, rows: slice | None = None) -> Tensor:
        if type(m) is not nn.Linear:  # quantized or custom layers: as they are
            return m(x) if rows is None else m._project(x, rows)
        w, b = m.weight, m.bias
        if rows is not None:
            w, b = w[rows], None if b is None else b[rows]
        if self.onednn and x.dtype == torch.float32 and w.dtype == torch.float32:
            return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
        return F.linear(x, w, b)


def _project(linear: _Linear, a: nn.Module, x: Tensor, rows: slice) -> Tensor:
    """``a._project(x, rows)``: rows of the fused W^Q, W^K, W^V."""
    if getattr(type(a), "_project", None) is _MHA_PROJECT:
        return linear(a.in_proj, x, rows)
    return a._project(x, rows)  # an override (int8): its own product


def _feed_forward(linear: _Linear, ff: nn.Module, x: Tensor) -> Tensor:
    if not isinstance(ff, PositionwiseFeedForward):
        return ff(x)
    act = F.relu if ff.activation == "relu" else F.gelu
    return linear(ff.w_2, act(linear(ff.w_1, x)))


def _layer_step(layer: nn.Module, x: Tensor, cache: _BeamCache, l: int,
                src_mask: Tensor, linear: _Linear) -> Tensor:
    """``decoding._decoder_layer_step`` without the checks; the beams share the source."""
    rows, k = x.size(0), cache.k

    def self_attn(y: Tensor) -> Tensor:
        a = layer.self_attn
        d = a.d_model
        kv = _project(linear, a, y, slice(d, 3 * d)).view(rows, 1, 2, *cache.shape)
        keys, values = cache.append(l, kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2))
        q = _project(linear, a, y, slice(0, d)).view(rows, 1, *cache.shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys, values)
        return linear(a.out_proj, out.transpose(1, 2).flatten(-2))

    def src_attn(y: Tensor) -> Tensor:
        a = layer.src_attn
        src_k, src_v = cache.src_kv[l]
        # the k beams of a sentence as k queries: (batch, h, k, d_k)
        q = _project(linear, a, y, slice(0, a.d_model))
        q = q.view(rows // k, k, *cache.shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, src_k, src_v, attn_mask=src_mask)
        return linear(a.out_proj, out.transpose(1, 2).reshape(rows, 1, a.d_model))

    x = layer.sublayer[0](x, self_attn)
    x = layer.sublayer[1](x, src_attn)
    return layer.sublayer[2](x, lambda y: _feed_forward(linear, layer.feed_forward, y))


def _encode(model: nn.Module, src: Tensor, src_mask: Tensor, linear: _Linear) -> Tensor:
    """``model.encode(src, src_mask)`` (batch, src_len, d_model) with ``linear``'s products.

    Every source has a token (``_check_beam_args``), so no attention row is fully masked.
    """
    x, mask = model.src_embed(src), src_mask.unsqueeze(1)  # mask (batch, 1, 1, src_len)
    for layer in model.encoder.layers:
        a, ff = layer.self_attn, layer.feed_forward

        def self_attn(y: Tensor, a: nn.Module = a) -> Tensor:
            q, k, v = (t.unflatten(-1, (a.h, a.d_k)).transpose(1, 2)
                       for t in _project(linear, a, y, slice(None)).chunk(3, dim=-1))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return linear(a.out_proj, out.transpose(1, 2).flatten(-2))

        def feed_forward(y: Tensor, layer: nn.Module = layer, ff: nn.Module = ff) -> Tensor:
            return layer.sublayer[1](y, lambda z: _feed_forward(linear, ff, z))

        x = layer.sublayer[0](x, self_attn)
        if not layer.skip_padding:
            x = feed_forward(x)
        else:  # the feed-forward block on the real positions only, as EncoderLayer does
            x = on_positions(feed_forward, x, visible_positions(src_mask, x))
    return model.encoder.norm(x)


def _log_probs(model: nn.Module, cache: _BeamCache, tokens: Tensor, src_mask: Tensor,
               linear: _Linear, m: int) -> tuple[Tensor, Tensor]:
    """(rows, 1) newest tokens -> the m most probable next tokens of each row: their log P
    (rows, m) in float32, best first, and their ids (rows, m).

    (A top-k of the logits and one log-sum-exp instead of the log-softmax measured slower:
    0.94x, rounds 0.91-1.52x, one thread.)
    """
    embed, positional = model.tgt_embed[0], model.tgt_embed[1]
    x = positional(embed(tokens), start=cache.length)
    for l, layer in enumerate(model.decoder.layers):
        x = _layer_step(layer, x, cache, l, src_mask, linear)
    cache.length += 1
    x = model.decoder.norm(x)[:, -1]
    g = model.generator
    if type(g) is Generator:  # float32 even under autocast: the beams add these up
        log_probs = F.log_softmax(linear(g.proj, x), dim=-1).float()
    else:
        log_probs = g(x).float()
    return log_probs.topk(min(m, log_probs.size(-1)), dim=-1)


def _top_candidates(scores: Tensor, best: Tensor, token: Tensor, vocab: int, n: int
                    ) -> tuple[Tensor, Tensor]:
    """The n best extensions of every sentence's beams, best first.

    scores (batch, k); best, token (batch*k, m): each beam's m best log P and their ids ->
    values and flat indices beam·vocab + token (batch, n), as ``(scores[..., None] +
    log_probs).flatten(1).topk(n)`` over the whole vocabulary: log P(prefix) + log P(token)
    is increasing in the token's log P, so a sentence's n best are among its beams' n best.
    """
    batch, k = scores.shape
    m = best.size(-1)
    cand = (scores.unsqueeze(-1) + best.view(batch, k, m)).flatten(1)  # (batch, k*m)
    top, i = cand.topk(min(n, k * m), dim=-1)
    index = (i // m) * vocab + token.view(batch, k * m).gather(1, i)
    return top, index


@torch.inference_mode()
def beam_search(model: nn.Module, src: Tensor, src_mask: Tensor, max_len: int | list[int],
                start_symbol: int, end_symbol: int, beam_size: int = 4,
                length_penalty: float = 0.6, n_best: int = 1, onednn: bool | None = None
                ) -> list[list[tuple[Tensor, float]]]:
    """``decoding.beam_search`` (same arguments, same result), faster; see the module.

    `onednn`: the products in oneDNN (None: ``onednn_default()``), which rounds differently
    from MKL in the last bits; False gives ``decoding.beam_search``'s numbers exactly.
    """
    if not supports(model, src):
        return decoding.beam_search(model, src, src_mask, max_len, start_symbol, end_symbol,
                                    beam_size, length_penalty, n_best)
    limits = _check_beam_args(model, src, src_mask, max_len, start_symbol, end_symbol,
                              beam_size, n_best, length_penalty)
    lp = functools.partial(gnmt_length_penalty, alpha=length_penalty)
    batch, k, device = src.size(0), beam_size, src.device
    vocab = decoding._vocab_size(model)
    linear = _Linear(onednn_default() if onednn is None else onednn)
    if all(type(layer) is EncoderLayer for layer in model.encoder.layers):
        memory = _encode(model, src, src_mask, linear)  # (batch, src_len, d_model)
    else:
        memory = model.encode(src, src_mask)
    cache = _BeamCache(model, memory, k, max(limits, default=1), linear)
    mask = src_mask.unsqueeze(1)  # (batch, 1, 1, src_len)
    ys = torch.full((batch * k, 1), start_symbol, dtype=torch.long, device=device)
    scores = torch.full((batch, k), -math.inf, device=device)
    scores[:, 0] = 0.0  # all k beams start identical, so only beam 0 lives
    results = finished = [[] for _ in range(batch)]
    done = [False] * batch
    _add_live(finished, done, limits, scores, ys, lp(0))
    for t in range(1, max(limits, default=1)):
        if all(done):
            break
        best, ids = _log_probs(model, cache, ys[:, -1:], mask, linear, 2 * k)  # (batch*k, 2k)
        top, index = _top_candidates(scores, best, ids, vocab, 2 * k)
        origin, token = index // vocab, index % vocab
        is_eos = token == end_symbol
        _finish(finished, done, ys, top, origin, is_eos, end_symbol, lp(t))
        rank = torch.arange(top.size(1), device=device) + is_eos * top.size(1)
        keep = rank.argsort(dim=-1)[:, :k]
        scores = top.gather(1, keep)
        first_row = k * torch.arange(batch, device=device)[:, None]
        parents = (first_row + origin.gather(1, keep)).flatten()
        ys = torch.cat([ys.index_select(0, parents), token.gather(1, keep).view(-1, 1)], dim=1)
        _mark_done(finished, done, limits, scores, ys, n_best, lp)
        sentences = None
        if any(done):
            sentences = torch.tensor([b for b, d in enumerate(done) if not d], dtype=torch.long,
                                     device=device)
            finished, limits, scores, parents, ys = _keep_live(
                done, finished, limits, scores, parents, ys)
            batch, done = len(finished), [False] * len(finished)
            mask = mask.index_select(0, sentences)
        cache.reorder(parents, sentences)
    ranked = [sorted(f, key=lambda e: -e[0])[:n_best] for f in results]
    return [[(tokens, score) for score, tokens in r] for r in ranked]
