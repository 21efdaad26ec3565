"""The decode-speed experiment's lean step computes what chapter 7's step computes.

``experiments/decode_speed/sketch.py`` times a leaner decoder step against ``decode_step``; its
verdict means something only if both give the same translations. Here on a small random
pre-norm model: the step's output, step by step with a beam reordering in between, and whole
beam searches with padded sources of different lengths.
"""

from __future__ import annotations

import pytest
import torch

from experiments.decode_speed.sketch import LeanCache, lean_decoding, lean_step
from transformer_lib.decoding import KVCache, beam_search, decode_step, greedy_decode
from transformer_lib.model import make_model


def small_model(norm_first: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    model = make_model(13, 13, N=2, d_model=32, d_ff=64, h=4, dropout=0.0, norm_first=norm_first)
    return model.eval()


def sources() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0], [3, 4, 11, 2, 0]])
    return src, (src != 0).unsqueeze(-2)


@torch.no_grad()
def test_lean_step_equals_decode_step_across_a_reordering():
    model = small_model()
    src, src_mask = sources()
    memory = model.encode(src, src_mask)
    ours, lean = KVCache(model, memory), LeanCache(model, memory, src_mask, capacity=2)
    tokens = torch.tensor([[1], [1], [1]])
    for t in range(5):
        want = decode_step(model, ours, tokens, src_mask)
        got = lean_step(model, lean, tokens)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        tokens = model.generator(want[:, -1]).argmax(-1, keepdim=True)
        if t == 2:  # rows swap, one sentence leaves (as beam search reorders)
            index = torch.tensor([2, 0])
            ours.reorder(index, sources=True)
            lean.reorder(index, sources=True)
            tokens, src_mask = tokens[index], src_mask[index]


@torch.no_grad()
def test_searches_under_lean_decoding_give_the_same_hypotheses():
    model = small_model()
    src, src_mask = sources()
    want = beam_search(model, src, src_mask, [6, 9, 7], 1, 2, beam_size=3, n_best=2)
    with lean_decoding():
        got = beam_search(model, src, src_mask, [6, 9, 7], 1, 2, beam_size=3, n_best=2)
        greedy = greedy_decode(model, src, src_mask, 7, 1, 2)
    assert torch.equal(greedy, greedy_decode(model, src, src_mask, 7, 1, 2))
    for w, g in zip(want, got):
        assert [h.tolist() for h, _ in w] == [h.tolist() for h, _ in g]
        assert [s for _, s in w] == pytest.approx([s for _, s in g], abs=1e-5)


def test_lean_decoding_refuses_a_post_norm_model_and_restores_the_step():
    model = small_model(norm_first=False)
    src, src_mask = sources()
    with pytest.raises(ValueError, match="pre-norm"), lean_decoding():
        beam_search(model, src, src_mask, 5, 1, 2)
    beam_search(model, src, src_mask, 5, 1, 2)  # chapter 7's step again: no error
