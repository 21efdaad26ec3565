"""Chapter 11, sections 11.1 and 11.2 (transformer_lib.lm): decoder- and encoder-only models,
sampling, the LM cache and generation, masked-token corruption.

References are independent of the code under test: a brute-force nucleus, re-running the whole
prefix for the cache.
"""

from __future__ import annotations

import pytest
import torch

from transformer_lib.attention_variants import GroupedQueryAttention, RotaryAttention
from transformer_lib.lm import (
    LMCache,
    TransformerLM,
    filter_logits,
    generate,
    lm_step,
    mask_tokens,
    sample_next,
)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------ sampling


def test_top_k_keeps_exactly_k_even_with_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.5, 2.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    for k in range(1, 7):
        kept = filter_logits(logits, top_k=k).isfinite()
        assert kept.sum(-1).tolist() == [k, k]
    kept = filter_logits(logits, top_k=2).isfinite()[0]
    assert kept[[1, 2, 3]].sum() == 2 and not kept[[0, 4, 5]].any()
    assert filter_logits(logits, top_k=100).isfinite().all()


def _nucleus_reference(probs: list[float], p: float) -> set[int]:
    """Smallest set of most probable tokens with mass >= p, by trying sizes in order."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    for size in range(1, len(probs) + 1):
        if sum(probs[i] for i in order[:size]) >= p:
            return set(order[:size])
    return set(order)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.99, 1.0])
def test_top_p_keeps_the_smallest_set_with_mass_p(seed, p):
    logits = torch.randn(12, generator=_gen(seed), dtype=torch.float64) * 2
    probs = logits.softmax(-1).tolist()
    kept = set(filter_logits(logits, top_p=p).isfinite().nonzero().flatten().tolist())
    assert kept == _nucleus_reference(probs, p)
    assert sum(probs[i] for i in kept) >= p - 1e-12


def test_filters_combine_and_reject_bad_values():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    assert filter_logits(logits, top_k=4, top_p=0.5).isfinite().tolist() == [
        True,
        False,
        False,
        False,
        False,
    ]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="top_k"):
            filter_logits(logits, top_k=bad)
    for bad in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="top_p"):
            filter_logits(logits, top_p=bad)


def test_temperature_to_zero_is_greedy():
    logits = torch.randn(64, 50, generator=_gen(3))
    greedy = logits.argmax(-1)
    assert torch.equal(sample_next(logits, 0.0), greedy)
    assert torch.equal(sample_next(logits, 1e-4, generator=_gen(0)), greedy)
    # at temperature 1 sampling does differ from greedy somewhere
    assert not torch.equal(sample_next(logits, 1.0, generator=_gen(0)), greedy)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, -1.0)



def test_a_tiny_temperature_is_greedy_not_an_overflow():
    # logits / 1e-40 overflow to inf; the best score is moved to 0 first
    logits = torch.randn(16, 30, generator=_gen(5)) * 10
    for t in (1e-40, 1e-30, 1e-12):
        assert torch.equal(sample_next(logits, t, generator=_gen(0)), logits.argmax(-1))


def test_a_row_with_no_finite_best_score_is_refused():
    good = torch.randn(2, 5)
    for bad in (float("-inf"), float("inf"), float("nan")):
        logits = torch.cat([good, torch.full((1, 5), bad)])
        for t in (0.0, 1.0):
            with pytest.raises(ValueError, match="finite largest value in every row"):
                sample_next(logits, t)

def test_top_k_one_is_greedy_and_samples_only_kept_tokens():
    logits = torch.randn(200, 30, generator=_gen(4))
    assert torch.equal(sample_next(logits, 1.0, top_k=1, generator=_gen(0)), logits.argmax(-1))
    drawn = sample_next(logits, 1.0, top_k=3, generator=_gen(0))
    top3 = logits.topk(3, dim=-1).indices
    assert (drawn[:, None] == top3).any(-1).all()


# ------------------------------------------------------------------------------ the LM


def _lms():
    torch.manual_seed(0)
    plain = TransformerLM(40, N=2, d_model=32, d_ff=64, h=4, dropout=0.0).eval()
    rope = TransformerLM(
        40,
        N=2,
        d_model=32,
        d_ff=64,
        h=4,
        dropout=0.0,
        self_attn=RotaryAttention(4, 32, kv_heads=2),
        positional="none",
    ).eval()
    return {"sinusoidal MHA": plain, "RoPE GQA": rope}


@pytest.mark.parametrize("name", ["sinusoidal MHA", "RoPE GQA"])
def test_lm_is_causal(name):
    lm = _lms()[name]
    x = torch.randint(4, 40, (3, 10), generator=_gen())
    for t in (3, 9):
        y = x.clone()
        y[:, t:] = (y[:, t:] + 7) % 36 + 4  # change token t and everything after it
        with torch.no_grad():
            a, b = lm.generator(lm(x)), lm.generator(lm(y))
        torch.testing.assert_close(a[:, :t], b[:, :t])
        assert not torch.allclose(a[:, t], b[:, t])


def test_encoder_only_sees_both_sides_and_ignores_padding():
    torch.manual_seed(0)
    enc = TransformerLM(40, N=2, d_model=32, d_ff=64, h=4, dropout=0.0, causal=False).eval()
    x = torch.randint(4, 40, (2, 8), generator=_gen())
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 36 + 4
    with torch.no_grad():
        assert not torch.allclose(enc(x)[:, 0], enc(y)[:, 0])  # position 0 sees the last token
        padded = torch.cat([x, torch.zeros(2, 3, dtype=torch.long)], dim=1)
        torch.testing.assert_close(enc(padded, pad=0)[:, :8], enc(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["sinusoidal MHA", "RoPE GQA"])
def test_lm_step_equals_full_forward(name):
    lm = _lms()[name]
    x = torch.randint(4, 40, (2, 9), generator=_gen())
    cache = LMCache(lm)
    with torch.no_grad():
        full = lm(x)
        parts = [lm_step(lm, cache, x[:, :4]), lm_step(lm, cache, x[:, 4:5])]
        parts.append(lm_step(lm, cache, x[:, 5:]))
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    k, _ = cache.self_kv[0]
    attn = lm.blocks.layers[0].self_attn
    assert k.shape == (2, getattr(attn, "kv_heads", attn.h), 9, 8)


@pytest.mark.parametrize("name", ["sinusoidal MHA", "RoPE GQA"])
@pytest.mark.parametrize("kwargs", [{}, {"temperature": 1.0, "top_p": 0.9}, {"top_k": 5}])
def test_generate_cached_equals_uncached(name, kwargs):
    lm = _lms()[name]
    prompt = torch.randint(4, 40, (3, 4), generator=_gen())
    runs = [
        generate(lm, prompt, 12, **kwargs, use_cache=c, generator=_gen(7)) for c in (True, False)
    ]
    assert torch.equal(runs[0], runs[1])
    assert runs[0].shape == (3, 16) and torch.equal(runs[0][:, :4], prompt)


def test_generate_stops_at_end_symbol_and_validates():
    lm = _lms()["sinusoidal MHA"]
    prompt = torch.randint(4, 40, (2, 3), generator=_gen())
    first = generate(lm, prompt, 1)[:, -1]
    # the first greedy token as the end symbol: the row finishes at once
    out = generate(lm, prompt[:1], 20, end_symbol=int(first[0]))
    assert out.shape == (1, 4) and out[0, -1] == first[0]
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(lm, prompt, -1)
    with pytest.raises(ValueError, match="prompt"):
        generate(lm, prompt.float(), 2)
    enc = TransformerLM(40, N=1, d_model=32, d_ff=64, h=4, causal=False)
    with pytest.raises(ValueError, match="causal"):
        generate(enc, prompt, 2)
    for end in (40, -1, 2.0):  # not an id the model can emit: never matched
        with pytest.raises(ValueError, match="end_symbol"):
            generate(lm, prompt, 2, end_symbol=end)


def test_ids_outside_the_vocabulary_are_a_value_error_not_an_index_error():
    lm = _lms()["sinusoidal MHA"]  # vocabulary of 40
    ok = torch.randint(4, 40, (2, 3), generator=_gen())
    for bad in (ok + 40, ok - 50):
        with pytest.raises(ValueError, match=r"token ids in \[0, 40\)"):
            lm(bad)
        with pytest.raises(ValueError, match=r"token ids in \[0, 40\)"):
            lm_step(lm, LMCache(lm), bad)
        with pytest.raises(ValueError, match=r"prompt must hold token ids"):
            generate(lm, bad, 2)
    assert lm(ok[:0]).shape == (0, 3, 32)  # an empty batch is still fine


def test_lm_rejects_bad_arguments():
    with pytest.raises(ValueError, match="vocab"):
        TransformerLM(0)
    with pytest.raises(ValueError, match="positional"):
        TransformerLM(10, positional="learned")
    with pytest.raises(ValueError, match="self_attn"):
        TransformerLM(10, d_model=32, d_ff=64, self_attn=GroupedQueryAttention(4, 64, 2))
    with pytest.raises(ValueError, match="d_model"):
        TransformerLM(10, d_model=30, h=4)
    with pytest.raises(ValueError, match="tokens"):
        TransformerLM(10, d_model=32, d_ff=64)(torch.randn(2, 3))


# ------------------------------------------------------------------------------ masking


def test_mask_tokens_follows_the_80_10_10_rule():
    tokens = torch.randint(4, 1000, (400, 100), generator=_gen())
    tokens[:, :5] = torch.arange(4).repeat(2)[:5]  # special ids, never chosen
    inputs, labels = mask_tokens(tokens, 1000, 4, 1000, generator=_gen(1))
    chosen = labels != -100
    assert not chosen[:, :5].any()
    assert torch.equal(labels[chosen], tokens[chosen])
    assert torch.equal(inputs[~chosen], tokens[~chosen])
    share = chosen.sum() / (tokens >= 4).sum()
    assert abs(float(share) - 0.15) < 0.005
    masked = (inputs[chosen] == 1000).float().mean()
    kept = (inputs[chosen] == tokens[chosen]).float().mean()
    changed = 1 - masked - kept
    assert abs(float(masked) - 0.8) < 0.01
    assert abs(float(kept) - 0.1) < 0.01  # (plus the rare random draw of the same token)
    assert abs(float(changed) - 0.1) < 0.01
    assert ((inputs >= 4) & (inputs <= 1000)).logical_or(~chosen).all()


def test_mask_tokens_is_reproducible_and_validates():
    tokens = torch.randint(4, 50, (4, 30), generator=_gen())
    a = mask_tokens(tokens, 50, 4, 50, generator=_gen(5))
    b = mask_tokens(tokens, 50, 4, 50, generator=_gen(5))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="p must"):
        mask_tokens(tokens, 50, 4, 50, p=0.0)
    with pytest.raises(ValueError, match="low and high"):
        mask_tokens(tokens, 50, 10, 5)
    with pytest.raises(ValueError, match="tokens"):
        mask_tokens(tokens.float(), 50, 4, 50)
    for bad in (-1, 2.0, True):  # a [MASK] id the embedding cannot look up
        with pytest.raises(ValueError, match="mask_id"):
            mask_tokens(tokens, bad, 4, 50)
