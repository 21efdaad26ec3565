"""Chapter 11 (transformer_lib.after): decoder-/encoder-only models, sampling, the LM cache,
masked-token corruption, grouped-query attention, rotary embeddings, KV-cache bytes.

References are independent of the code under test: complex multiplication for RoPE, the
package's MultiHeadedAttention and a per-head softmax loop for GQA, a brute-force nucleus,
re-running the whole prefix for the cache.
"""

from __future__ import annotations

import math

import pytest
import torch

from transformer_lib.after import (
    GroupedQueryAttention,
    LMCache,
    RotaryAttention,
    TransformerLM,
    apply_rope,
    filter_logits,
    generate,
    gqa_from_multihead,
    kv_cache_bytes,
    lm_step,
    mask_tokens,
    sample_next,
)
from transformer_lib.multihead import MultiHeadedAttention


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------ RoPE


def _rope_complex(x: torch.Tensor, start: int, base: float = 10000.0) -> torch.Tensor:
    """Reference: pair (2i, 2i+1) as the complex number x_2i + j x_2i+1, times e^{j m w_i}."""
    d, n = x.size(-1), x.size(-2)
    z = torch.view_as_complex(x.double().unflatten(-1, (d // 2, 2)).contiguous())
    w = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = torch.arange(start, start + n, dtype=torch.float64)
    rot = torch.polar(torch.ones(n, d // 2, dtype=torch.float64), m[:, None] * w)
    return torch.view_as_real(z * rot).flatten(-2)


@pytest.mark.parametrize("start", [0, 1, 37, 5000])
def test_rope_matches_complex_rotation(start):
    x = torch.randn(2, 3, 7, 16, generator=_gen(), dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x, start), _rope_complex(x, start))


def test_rope_is_a_rotation():
    x = torch.randn(5, 32, generator=_gen(), dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x, 0)[0], x[0])  # position 0: angle 0
    torch.testing.assert_close(apply_rope(x, 9).norm(dim=-1), x.norm(dim=-1))


def test_rope_scores_depend_on_offset_only():
    g = _gen(1)
    q = torch.randn(1, 64, generator=g, dtype=torch.float64)
    k = torch.randn(1, 64, generator=g, dtype=torch.float64)
    for offset in (0, 1, 5, 200):
        scores = [float(apply_rope(q, m + offset) @ apply_rope(k, m)[0]) for m in (0, 3, 100, 4000)]
        assert max(scores) - min(scores) < 1e-9, (offset, scores)
    # and different offsets do give different scores
    assert abs(float(apply_rope(q, 5) @ apply_rope(k, 0)[0]) - float(q @ k[0])) > 1e-3


def test_rope_keeps_dtype_and_rejects_bad_input():
    x = torch.randn(4, 8)
    assert apply_rope(x, 2).dtype == torch.float32
    with pytest.raises(ValueError, match="x"):
        apply_rope(torch.randn(4, 7))
    with pytest.raises(ValueError, match="start"):
        apply_rope(x, -1)
    with pytest.raises(ValueError, match="start"):
        apply_rope(x, 1.5)
    with pytest.raises(ValueError, match="base"):
        apply_rope(x, 0, base=0.0)


# ------------------------------------------------------------------------------ GQA


@pytest.mark.parametrize("bias", [True, False])
def test_gqa_with_one_group_per_head_equals_multihead(bias):
    torch.manual_seed(0)
    mha = MultiHeadedAttention(4, 32, dropout=0.0, bias=bias).eval()
    with torch.no_grad():  # non-zero biases, so that they are checked too
        for p in mha.parameters():
            p.add_(0.1 * torch.randn_like(p))
    gqa = gqa_from_multihead(mha).eval()
    assert gqa.kv_heads == gqa.h == 4
    x = torch.randn(3, 6, 32)
    mem = torch.randn(3, 9, 32)
    causal = torch.ones(1, 6, 6, dtype=torch.bool).tril()
    pad = torch.ones(3, 1, 9, dtype=torch.bool)
    pad[1, :, 5:] = False
    torch.testing.assert_close(gqa(x, x, x, causal), mha(x, x, x, causal))
    torch.testing.assert_close(gqa(x, mem, mem, pad), mha(x, mem, mem, pad))
    torch.testing.assert_close(gqa(x, x, x), mha(x, x, x))


def _gqa_reference(attn: GroupedQueryAttention, x: torch.Tensor, mask: torch.Tensor | None):
    """Per query head: softmax(q_i k_g^T / sqrt(d_k)) v_g with g = i // (h / kv_heads)."""
    d_k, h, kv = attn.d_k, attn.h, attn.kv_heads
    q = attn.q_proj(x)
    kvp = attn.kv_proj(x)
    k, v = kvp[..., : kv * d_k], kvp[..., kv * d_k :]
    heads = []
    for i in range(h):
        g = i // (h // kv)
        qi = q[..., i * d_k : (i + 1) * d_k]
        kg, vg = k[..., g * d_k : (g + 1) * d_k], v[..., g * d_k : (g + 1) * d_k]
        s = qi @ kg.transpose(-2, -1) / math.sqrt(d_k)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        heads.append(s.softmax(-1) @ vg)
    return attn.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8])
def test_gqa_matches_per_head_reference(kv_heads):
    torch.manual_seed(0)
    attn = GroupedQueryAttention(8, 64, kv_heads).eval()
    x = torch.randn(2, 7, 64)
    mask = torch.ones(1, 7, 7, dtype=torch.bool).tril()
    torch.testing.assert_close(attn(x, x, x, mask), _gqa_reference(attn, x, mask))


def test_mqa_shapes_and_parameters():
    mqa = GroupedQueryAttention(8, 64, kv_heads=1, bias=False)
    x, mem = torch.randn(2, 5, 64), torch.randn(2, 11, 64)
    k, v = mqa.project_kv(mem, mem)
    assert k.shape == v.shape == (2, 1, 11, 8)
    assert mqa(x, mem, mem).shape == (2, 5, 64)
    assert mqa.attend(x, k, v).shape == (2, 5, 64)
    assert mqa.kv_proj.weight.shape == (2 * 8, 64)  # one key head + one value head
    full = GroupedQueryAttention(8, 64, kv_heads=8, bias=False)
    n = sum(p.numel() for p in mqa.parameters())
    assert sum(p.numel() for p in full.parameters()) - n == 64 * 2 * (64 - 8)


def test_gqa_rejects_bad_arguments():
    with pytest.raises(ValueError, match="kv_heads"):
        GroupedQueryAttention(8, 64, kv_heads=3)
    with pytest.raises(ValueError, match="d_model"):
        GroupedQueryAttention(8, 60, kv_heads=2)
    with pytest.raises(ValueError, match="kv_heads"):
        GroupedQueryAttention(8, 64, kv_heads=0)
    with pytest.raises(ValueError, match="dropout"):
        GroupedQueryAttention(8, 64, kv_heads=2, dropout=1.0)
    attn = GroupedQueryAttention(8, 64, 2)
    with pytest.raises(ValueError, match="query"):
        attn(torch.randn(2, 5, 32), torch.randn(2, 5, 64), torch.randn(2, 5, 64))
    with pytest.raises(ValueError, match="key"):
        attn.project_kv(torch.randn(2, 5), torch.randn(2, 5, 64))
    with pytest.raises(ValueError, match="mha"):
        gqa_from_multihead(attn)
    with pytest.raises(ValueError, match="d_model / h"):
        RotaryAttention(4, 12, 2)  # d_k = 3 cannot be rotated in pairs


def test_rotary_attention_is_translation_invariant():
    """Shifting every position by the same amount changes nothing (relative scores)."""
    torch.manual_seed(0)
    attn = RotaryAttention(4, 32, 2).eval()
    x = torch.randn(1, 6, 32)
    k, v = attn.project_kv(x, x)
    out = attn.attend(x, k, v)
    # the same keys and queries, as if at positions 10..15: rotate by hand
    q = attn._split(attn.q_proj(x))
    scores0 = apply_rope(q, 0) @ apply_rope(k, 0).repeat_interleave(2, 1).transpose(-2, -1)
    scores10 = apply_rope(q, 10) @ apply_rope(k, 10).repeat_interleave(2, 1).transpose(-2, -1)
    torch.testing.assert_close(scores0, scores10, atol=1e-4, rtol=1e-4)
    assert out.shape == (1, 6, 32)


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


# ------------------------------------------------------------------------------ cache bytes


def test_kv_cache_bytes_formula_and_real_cache():
    # Llama 2 70B: 80 layers, 8 KV heads of 128, 4096 tokens, fp16
    assert kv_cache_bytes(80, 8, 128, 4096) == 2 * 80 * 8 * 128 * 4096 * 2
    lm = TransformerLM(
        30, N=3, d_model=32, d_ff=64, h=4, self_attn=GroupedQueryAttention(4, 32, 2)
    ).eval()
    cache = LMCache(lm)
    with torch.no_grad():
        lm_step(lm, cache, torch.randint(4, 30, (5, 7), generator=_gen()))
    held = sum(
        k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in cache.self_kv
    )
    assert held == kv_cache_bytes(3, 2, 8, 7, batch=5, bytes_per_value=4)
    with pytest.raises(ValueError, match="kv_heads"):
        kv_cache_bytes(80, 0, 128, 4096)
