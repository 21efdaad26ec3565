"""Chapter 11, sections 11.3 and 11.4 (transformer_lib.attention_variants): grouped-query
attention, KV-cache bytes, rotary position embeddings.

References are independent of the code under test: complex multiplication for RoPE, the
package's MultiHeadedAttention and a per-head softmax loop for GQA.
"""

from __future__ import annotations

import math

import pytest
import torch

from transformer_lib.attention_variants import (
    GroupedQueryAttention,
    RotaryAttention,
    apply_rope,
    gqa_from_multihead,
    kv_cache_bytes,
)
from transformer_lib.lm import LMCache, TransformerLM, lm_step
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


class _QueryOnlyRotary(RotaryAttention):
    """A wrong RoPE: rotating the queries only leaves the scores on absolute positions."""

    def rotate(self, q, k):
        return apply_rope(q, k.size(2) - q.size(2), self.base), k


def _shifted_outputs(attn, x: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """attn's causal self-attention over x, at positions 0.. and at positions p.. (with p
    positions in front that no query may attend to)."""
    n = x.size(1)
    causal = torch.ones(1, n, n, dtype=torch.bool).tril()
    y = torch.cat([torch.randn(x.size(0), p, x.size(2)), x], dim=1)
    mask = torch.ones(1, p + n, p + n, dtype=torch.bool).tril()
    mask[..., :p] = False  # the first p keys are hidden from every query
    return attn(x, x, x, causal), attn(y, y, y, mask)[:, p:]


def test_rotary_attention_depends_on_relative_positions_only():
    """Shifting every position by the same p leaves every output unchanged; a rotation of
    the queries alone (absolute positions) does not pass the same check."""
    torch.manual_seed(0)
    rope = RotaryAttention(4, 32, kv_heads=2).eval()
    wrong = _QueryOnlyRotary(4, 32, kv_heads=2).eval()
    wrong.load_state_dict(rope.state_dict())
    x = torch.randn(2, 6, 32)
    for p in (1, 7, 300):
        at_0, at_p = _shifted_outputs(rope, x, p)
        torch.testing.assert_close(at_p, at_0, atol=1e-5, rtol=1e-5)
        at_0, at_p = _shifted_outputs(wrong, x, p)
        assert not torch.allclose(at_p, at_0, atol=1e-3)


def _gqa_from_rotary(rope: RotaryAttention) -> GroupedQueryAttention:
    """The same weights without the rotation."""
    plain = GroupedQueryAttention(rope.h, rope.d_model, rope.kv_heads).eval()
    plain.load_state_dict(rope.state_dict())
    return plain


def test_rotary_attention_uses_positions_and_queries_are_the_last_rows():
    """Unlike attention without positions, the output depends on the order of the keys; and
    queries over a longer key sequence (a cache) sit at its last positions."""
    torch.manual_seed(1)
    rope = RotaryAttention(4, 32, kv_heads=1).eval()
    plain = _gqa_from_rotary(rope)
    x = torch.randn(1, 5, 32)
    q = x[:, -1:]  # the last position asks
    perm = torch.tensor([3, 0, 4, 1, 2])
    # without positions, attention is a weighted sum over a set: key order does not matter
    torch.testing.assert_close(plain(q, x[:, perm], x[:, perm]), plain(q, x, x))
    assert not torch.allclose(rope(q, x[:, perm], x[:, perm]), rope(q, x, x), atol=1e-4)
    assert not torch.allclose(rope(x, x, x), plain(x, x, x), atol=1e-4)
    # the last two queries attending over five cached keys = rows 3, 4 of the full pass
    causal = torch.ones(1, 5, 5, dtype=torch.bool).tril()
    k, v = rope.project_kv(x, x)
    torch.testing.assert_close(
        rope.attend(x[:, 3:], k, v, causal[:, 3:]), rope(x, x, x, causal)[:, 3:]
    )


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
