"""Tests for chapter 3: MultiHeadedAttention (transformer_lib.multihead).

The reference is torch.nn.MultiheadAttention with the same weights; remember that its boolean
masks mean True = may NOT attend, the opposite of this book's convention.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_lib.attention import attention
from transformer_lib.multihead import MultiHeadedAttention, _fast_attention, fused_attention


def make_pair(h=4, d_model=32, bias=True, dtype=torch.float32, seed=0):
    """Our layer and nn.MultiheadAttention with identical weights, both in eval mode."""
    torch.manual_seed(seed)
    ours = MultiHeadedAttention(h, d_model, dropout=0.0, bias=bias).to(dtype).eval()
    ref = nn.MultiheadAttention(d_model, h, bias=bias, batch_first=True).to(dtype).eval()
    with torch.no_grad():
        # Random (not default) values everywhere, biases included, so nothing is trivially zero.
        for p in ours.parameters():
            p.normal_(0, 0.3)
        ref.in_proj_weight.copy_(ours.in_proj.weight)
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(ours.in_proj.bias)
            ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ours, ref


def padding(lengths, k_len):
    """(batch, k_len) bool, True at real tokens."""
    return torch.arange(k_len)[None, :] < torch.tensor(lengths)[:, None]


# --- parity with torch.nn.MultiheadAttention --------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("store", [False, True])
def test_self_attention_matches_torch(bias, store):
    ours, ref = make_pair(bias=bias)
    ours.store_attention = store
    x = torch.randn(3, 7, 32)
    expected, w_avg = ref(x, x, x)
    torch.testing.assert_close(ours(x, x, x), expected)
    if store:
        torch.testing.assert_close(ours.attn.mean(1), w_avg)  # nn.MHA averages over heads


@pytest.mark.parametrize("store", [False, True])
def test_cross_attention_with_padding_matches_torch(store):
    ours, ref = make_pair(h=8, d_model=64)
    ours.store_attention = store
    query, memory = torch.randn(3, 4, 64), torch.randn(3, 9, 64)
    keep = padding([9, 6, 2], 9)  # (batch, k_len)
    expected, w_heads = ref(
        query, memory, memory, key_padding_mask=~keep, average_attn_weights=False
    )
    got = ours(query, memory, memory, mask=keep[:, None, :])  # (batch, 1, k_len)
    torch.testing.assert_close(got, expected)
    if store:
        assert ours.attn.shape == (3, 8, 4, 9)
        torch.testing.assert_close(ours.attn, w_heads)


def test_cross_attention_with_distinct_key_and_value_matches_torch():
    ours, ref = make_pair()
    query, key, value = torch.randn(2, 3, 32), torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    torch.testing.assert_close(ours(query, key, value), ref(query, key, value)[0])


@pytest.mark.parametrize("store", [False, True])
def test_causal_and_padding_masks_match_torch(store):
    ours, ref = make_pair()
    ours.store_attention = store
    x = torch.randn(3, 6, 32)
    keep = padding([6, 4, 1], 6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    expected, w_heads = ref(
        x, x, x, key_padding_mask=~keep, attn_mask=~causal, average_attn_weights=False
    )
    got = ours(x, x, x, mask=keep[:, None, :] & causal)  # (batch, 6, 6)
    torch.testing.assert_close(got, expected)
    if store:
        torch.testing.assert_close(ours.attn, w_heads)
    # The 2-D (q_len, k_len) causal mask alone broadcasts too.
    torch.testing.assert_close(ours(x, x, x, mask=causal), ref(x, x, x, attn_mask=~causal)[0])


def test_per_head_mask_matches_torch_3d_attn_mask():
    ours, ref = make_pair(h=4)
    x = torch.randn(2, 5, 32)
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(2, 4, 5, 5, generator=gen) < 0.7
    mask |= torch.eye(5, dtype=torch.bool)  # every query keeps itself: no fully masked row
    expected = ref(x, x, x, attn_mask=~mask.reshape(2 * 4, 5, 5))[0]  # (batch·h, q, k)
    torch.testing.assert_close(ours(x, x, x, mask=mask), expected)
    ours.store_attention = True
    torch.testing.assert_close(ours(x, x, x, mask=mask), expected)
    assert torch.all(ours.attn[~mask] == 0)


def test_float64_matches_torch():
    ours, ref = make_pair(dtype=torch.float64)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    out = ours(x, x, x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref(x, x, x)[0], rtol=1e-12, atol=1e-12)


# --- the two attention paths ------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 3),
    q_len=st.integers(1, 6),
    k_len=st.integers(1, 6),
    h=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 10_000),
    p_keep=st.floats(0.0, 1.0),
)
def test_fast_path_equals_explicit_path(batch, q_len, k_len, h, seed, p_keep):
    torch.manual_seed(seed)
    layer = MultiHeadedAttention(h, 16, dropout=0.1).eval()
    query, memory = torch.randn(batch, q_len, 16), torch.randn(batch, k_len, 16)
    mask = torch.rand(batch, q_len, k_len) < p_keep  # may contain fully masked rows
    fast = layer(query, memory, memory, mask)
    assert layer.attn is None
    layer.store_attention = True
    explicit = layer(query, memory, memory, mask)
    assert layer.attn.shape == (batch, h, q_len, k_len)
    torch.testing.assert_close(fast, explicit)


@pytest.mark.parametrize("store", [False, True])
def test_fully_masked_rows_are_finite_and_zero(store):
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 16, dropout=0.0)
    layer.store_attention = store
    x = torch.randn(2, 5, 16, requires_grad=True)
    mask = torch.ones(2, 5, 5, dtype=torch.bool)
    mask[0, 2] = False  # query 2 of sequence 0 may attend to nothing
    mask[1] = False  # sequence 1 sees nothing at all
    out = layer(x, x, x, mask)
    # Before W^O the row is zero, so after it the output is exactly out_proj's bias.
    torch.testing.assert_close(out[0, 2], layer.out_proj.bias)
    torch.testing.assert_close(out[1], layer.out_proj.bias.expand(5, -1))
    if store:
        assert torch.all(layer.attn[0, :, 2] == 0) and torch.all(layer.attn[1] == 0)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("mask_kind", ["none", "padding", "per_head", "fully_masked_rows"])
def test_fused_attention_equals_chapter_1_attention(mask_kind):
    """fused_attention is chapter 1's attention on split heads, fully masked rows included
    (a zero output where the kernel alone would give something else)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 8, generator=g)
    k, v = torch.randn(2, 3, 6, 8, generator=g), torch.randn(2, 3, 6, 8, generator=g)
    mask = {
        "none": None,
        "padding": padding([6, 3], 6)[:, None, None, :],  # (batch, 1, 1, k_len)
        "per_head": torch.rand(2, 3, 4, 6, generator=g) < 0.7,
        "fully_masked_rows": torch.ones(2, 1, 4, 6, dtype=torch.bool),
    }[mask_kind]
    if mask_kind == "fully_masked_rows":
        mask[0, :, 1] = False  # query 1 of sentence 0 sees no key
        mask[1] = False  # sentence 1 sees nothing
    expected, _ = attention(q, k, v, mask)
    torch.testing.assert_close(fused_attention(q, k, v, mask, 0.0), expected)
    if mask is not None:
        assert (fused_attention(q, k, v, mask, 0.0)[~mask.any(-1).expand(2, 3, 4)] == 0).all()


def test_store_attention_rows_sum_to_one_and_are_kept():
    torch.manual_seed(0)
    layer = MultiHeadedAttention(2, 8, dropout=0.0)
    layer.store_attention = True
    x = torch.randn(2, 4, 8)
    layer(x, x, x)
    torch.testing.assert_close(layer.attn.sum(-1), torch.ones(2, 2, 4))
    layer.store_attention = False
    layer(x, x, x)
    assert layer.attn is None


# --- properties that hold for any weights -----------------------------------------------------


@pytest.mark.parametrize("store", [False, True])
def test_causality(store):
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 16, dropout=0.0).eval()
    layer.store_attention = store
    x = torch.randn(2, 6, 16)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    changed = x.clone()
    changed[:, 4:] = torch.randn(2, 2, 16)  # change the future of position 3
    torch.testing.assert_close(
        layer(x, x, x, causal)[:, :4], layer(changed, changed, changed, causal)[:, :4]
    )
    assert not torch.allclose(
        layer(x, x, x, causal)[:, 4:], layer(changed, changed, changed, causal)[:, 4:]
    )


@pytest.mark.parametrize("store", [False, True])
def test_padding_invariance(store):
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 16, dropout=0.0).eval()
    layer.store_attention = store
    query, memory = torch.randn(2, 3, 16), torch.randn(2, 7, 16)
    keep = padding([7, 4], 7)[:, None, :]
    other = memory.clone()
    other[1, 4:] = 100 * torch.randn(3, 16)  # garbage in the padded positions
    torch.testing.assert_close(layer(query, memory, memory, keep), layer(query, other, other, keep))
    # And equal to running the second sequence alone, without its padding.
    alone = layer(query[1:], memory[1:, :4], memory[1:, :4])
    torch.testing.assert_close(layer(query, memory, memory, keep)[1:], alone)


@settings(max_examples=20, deadline=None)
@given(perm_seed=st.integers(0, 1000), n=st.integers(2, 8))
def test_self_attention_is_permutation_equivariant(perm_seed, n):
    torch.manual_seed(1)
    layer = MultiHeadedAttention(2, 8, dropout=0.0).eval()
    x = torch.randn(1, n, 8)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(perm_seed))
    xp = x[:, perm]
    torch.testing.assert_close(layer(xp, xp, xp), layer(x, x, x)[:, perm])


@pytest.mark.parametrize("store", [False, True])
def test_gradients_reach_every_parameter(store):
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 16, dropout=0.0)
    layer.store_attention = store
    query, memory = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    (layer(query, memory, memory) ** 2).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # Every block of in_proj (W^Q, W^K, W^V) gets a gradient, not just the whole matrix.
    for block in layer.in_proj.weight.grad.chunk(3):
        assert block.abs().sum() > 0


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    layer = MultiHeadedAttention(2, 16, dropout=0.5)
    x = torch.randn(2, 8, 16)
    layer.eval()
    a, b = layer(x, x, x), layer(x, x, x)
    torch.testing.assert_close(a, b)
    layer.train()
    assert not torch.allclose(layer(x, x, x), a)
    layer.store_attention = True
    layer(x, x, x)
    kept = layer.attn[layer.attn > 0]
    assert (layer.attn == 0).any()  # some weights dropped
    assert kept.max() > 1 / 8  # survivors rescaled by 1/(1 - p)


# --- fused projections, project_kv and attend, the KV cache -----------------------------------


def test_fused_projection_equals_separate_projections():
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 16, dropout=0.0).eval()
    x = torch.randn(2, 5, 16)
    fused = layer(x, x, x)  # query is key is value: one product for Q, K and V
    separate = layer(x, x.clone(), x.clone())  # three distinct tensors: three products
    memory = x.clone()
    kv_fused = layer(x, memory, memory)  # key is value: one product for K and V
    torch.testing.assert_close(fused, separate)
    torch.testing.assert_close(fused, kv_fused)


@pytest.mark.parametrize("same_kv", [True, False])
def test_project_kv_then_attend_equals_forward(same_kv):
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 16, dropout=0.0).eval()
    query, key = torch.randn(2, 3, 16), torch.randn(2, 6, 16)
    value = key if same_kv else torch.randn(2, 6, 16)
    keep = padding([6, 3], 6)[:, None, :]
    k, v = layer.project_kv(key, value)
    assert k.shape == v.shape == (2, 4, 6, 4)
    torch.testing.assert_close(layer.attend(query, k, v, keep), layer(query, key, value, keep))
    # The split heads are the corresponding rows of in_proj applied to key / value.
    w, b = layer.in_proj.weight, layer.in_proj.bias
    k_ref = (key @ w[16:32].T + b[16:32]).view(2, 6, 4, 4).transpose(1, 2)
    torch.testing.assert_close(k, k_ref)


def test_kv_cache_step_by_step_equals_full_causal_forward():
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 32, dropout=0.0).eval()
    seq = torch.randn(2, 7, 32)
    full = layer(seq, seq, seq, torch.ones(7, 7, dtype=torch.bool).tril())
    k_cache = torch.empty(2, 4, 0, 8)
    v_cache = torch.empty(2, 4, 0, 8)
    for t in range(7):
        new = seq[:, t : t + 1]
        k_new, v_new = layer.project_kv(new, new)
        k_cache, v_cache = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
        torch.testing.assert_close(layer.attend(new, k_cache, v_cache), full[:, t : t + 1])


def test_cross_attention_cache_with_padding_mask():
    torch.manual_seed(0)
    layer = MultiHeadedAttention(2, 16, dropout=0.0).eval()
    memory, target = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    keep = padding([5, 2], 5)[:, None, :]
    k, v = layer.project_kv(memory, memory)  # once
    steps = [layer.attend(target[:, t : t + 1], k, v, keep) for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, 1), layer(target, memory, memory, keep))


# --- devices and dtypes -----------------------------------------------------------------------


@pytest.mark.parametrize("store", [False, True])
def test_meta_device_shapes(store):
    layer = MultiHeadedAttention(4, 16, dropout=0.1).to("meta")
    layer.store_attention = store
    x = torch.randn(2, 5, 16, device="meta")
    mask = torch.ones(2, 1, 5, dtype=torch.bool, device="meta")
    out = layer(x, x, x, mask)
    assert out.device.type == "meta" and out.shape == (2, 5, 16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    torch.manual_seed(0)
    layer = MultiHeadedAttention(4, 16, dropout=0.0).eval()
    x = torch.randn(2, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    expected = layer(x, x, x, mask)
    got = layer.cuda()(x.cuda(), x.cuda(), x.cuda(), mask.cuda())
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


def test_integer_mask_is_accepted_as_bool():
    torch.manual_seed(0)
    layer = MultiHeadedAttention(2, 8, dropout=0.0).eval()
    x = torch.randn(1, 4, 8)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    torch.testing.assert_close(layer(x, x, x, causal.long()), layer(x, x, x, causal))


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(h=3, d_model=16), r"d_model must be divisible by h .*d_model=16 and h=3"),
        (dict(h=0, d_model=16), r"h must be a positive integer, got 0"),
        (dict(h=2, d_model=0), r"d_model must be a positive integer"),
        (dict(h=2.0, d_model=16), r"h must be a positive integer"),
        (dict(h=2, d_model=16, dropout=1.0), r"dropout must be a probability in \[0, 1\)"),
        (dict(h=2, d_model=16, dropout=-0.1), r"dropout must be a probability"),
        # the shared check_probability of chapter 1: bool, NaN and non-numbers too
        (dict(h=2, d_model=16, dropout=True), r"dropout must be a real number.*bool True"),
        (dict(h=2, d_model=16, dropout=float("nan")), r"dropout must be a probability.*nan"),
        (dict(h=2, d_model=16, dropout=float("inf")), r"dropout must be a probability.*inf"),
        (dict(h=2, d_model=16, dropout="0.1"), r"dropout must be a real number.*str"),
    ],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadedAttention(**kwargs)


def test_dropout_rate_is_stored_as_a_float():
    # an int 0 or a numpy-like Real is accepted and becomes nn.Dropout's float p
    assert MultiHeadedAttention(2, 16, dropout=0).dropout.p == 0.0
    assert isinstance(MultiHeadedAttention(2, 16, dropout=0).dropout.p, float)


def test_forward_errors():
    layer = MultiHeadedAttention(2, 8)
    x = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"query's last dimension must be d_model=8"):
        layer(torch.randn(2, 4, 6), x, x)
    with pytest.raises(ValueError, match=r"query must be a floating-point tensor of shape"):
        layer(torch.randn(4, 8), x, x)
    with pytest.raises(ValueError, match=r"key's last dimension must be d_model=8"):
        layer(x, torch.randn(2, 4, 6), torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match=r"value must have the key's batch size 2"):
        layer(x, x.clone(), torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match=r"value must have as many positions as key"):
        layer(x, x.clone(), torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"key must have the query's batch size 2"):
        layer(x, torch.randn(3, 4, 8), torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 5\) is not broadcastable"):
        layer(x, x, x, torch.ones(2, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask must be a bool"):
        layer(x, x, x, torch.ones(2, 1, 4))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 3, 4, 4\) is not broadcastable"):
        layer(x, x, x, torch.ones(2, 3, 4, 4, dtype=torch.bool))  # 3 heads, layer has 2


def test_attend_errors():
    layer = MultiHeadedAttention(2, 8)
    query = torch.randn(2, 3, 8)
    k, v = layer.project_kv(torch.randn(2, 5, 8), torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"k must be projected by project_kv.*h=2"):
        layer.attend(query, k.transpose(1, 2), v)
    with pytest.raises(ValueError, match=r"v must be projected by project_kv"):
        layer.attend(query, k, v[:, :, :4])
    with pytest.raises(ValueError, match=r"k must be projected"):
        layer.attend(query, torch.randn(2, 5, 8), v)


def test_bf16_autocast_on_cpu_attends_in_fp32_and_keeps_the_mask_convention():
    torch.manual_seed(0)
    mha = MultiHeadedAttention(4, 32, dropout=0.0).eval()
    x = torch.randn(3, 6, 32)
    mask = torch.ones(3, 6, 6, dtype=torch.bool).tril()
    mask[1, 2] = False  # a query with no key: zero output
    ref = mha(x, x, x, mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = (t.to(torch.bfloat16) for t in (x, x, x))
        heads = [mha._split(t) for t in (q, k, v)]  # (3, 4, 6, 8) bf16
        inner = _fast_attention(*heads, mask.unsqueeze(1), 0.0)
        out = mha(x, x, x, mask)
    assert inner.dtype == torch.bfloat16  # the caller's dtype comes back
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)  # bf16 projections
    assert torch.equal(inner[1, :, 2], torch.zeros(4, 8, dtype=torch.bfloat16))
