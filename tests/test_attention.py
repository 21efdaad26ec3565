"""Tests for chapter 1: scaled dot-product attention, additive attention and the mask helpers.

References are independent implementations: ``F.scaled_dot_product_attention``, explicit loops
over the paper's equations, and ``torch.autograd.gradcheck``.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_lib.attention import (
    AdditiveAttention,
    attention,
    check_mask,
    check_positive_int,
    check_probability,
    masked_softmax,
)

SETTINGS = settings(max_examples=25, deadline=None)


def make_qkv(batch=(2,), q_len=3, k_len=5, d_k=4, d_v=6, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, q_len, d_k, generator=g, dtype=dtype)
    k = torch.randn(*batch, k_len, d_k, generator=g, dtype=dtype)
    v = torch.randn(*batch, k_len, d_v, generator=g, dtype=dtype)
    return q, k, v


def random_mask(shape, seed=0, p_keep=0.6, ensure_row=True):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < p_keep
    if ensure_row:  # every query sees at least one key
        mask[..., 0] = True
    return mask


# ----------------------------------------------------------------------------- attention


@pytest.mark.parametrize("batch", [(), (3,), (2, 4), (2, 3, 2)])
@pytest.mark.parametrize("q_len,k_len,d_k,d_v", [(1, 1, 1, 1), (3, 5, 4, 6), (7, 2, 8, 3)])
def test_attention_shapes(batch, q_len, k_len, d_k, d_v):
    q, k, v = make_qkv(batch, q_len, k_len, d_k, d_v)
    out, w = attention(q, k, v)
    assert out.shape == (*batch, q_len, d_v)
    assert w.shape == (*batch, q_len, k_len)


def test_attention_broadcasts_leading_dims():
    # one set of keys/values shared by a batch of queries
    q, _, _ = make_qkv((2, 4), 3, 5)
    _, k, v = make_qkv((1, 4), 3, 5, seed=1)
    out, w = attention(q, k, v)
    assert out.shape == (2, 4, 3, 6) and w.shape == (2, 4, 3, 5)
    torch.testing.assert_close(out[1], attention(q[1], k[0], v[0])[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [(2,), (2, 3)])
def test_attention_matches_sdpa_without_mask(dtype, batch):
    q, k, v = make_qkv(batch, 4, 6, 8, 5, dtype=dtype)
    out, _ = attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "mask_shape",
    [(2, 3, 4, 6), (2, 1, 4, 6), (2, 1, 1, 6), (1, 4, 6), (4, 6), (6,)],
)
def test_attention_matches_sdpa_with_bool_mask(dtype, mask_shape):
    q, k, v = make_qkv((2, 3), 4, 6, 8, 5, dtype=dtype)
    mask = random_mask(mask_shape, seed=3)
    out, w = attention(q, k, v, mask=mask)
    # PyTorch wants at least a (q_len, k_len) mask: give it the same mask, expanded
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.expand(*mask_shape[:-2], 4, 6)
    )
    torch.testing.assert_close(out, expected)
    # weights are the softmax of the masked scaled scores
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(w, scores.softmax(-1))


def test_attention_matches_explicit_sum():
    q, k, v = make_qkv((), 3, 4, 5, 2, dtype=torch.float64)
    out, w = attention(q, k, v)
    for i in range(3):
        e = torch.tensor(
            [sum(q[i, l] * k[j, l] for l in range(5)) / math.sqrt(5) for j in range(4)]
        )
        alpha = e.exp() / e.exp().sum()
        torch.testing.assert_close(w[i], alpha.to(w.dtype))
        torch.testing.assert_close(out[i], sum(alpha[j] * v[j] for j in range(4)))


def test_weights_rows_sum_to_one_or_zero():
    q, k, v = make_qkv((2,), 5, 4)
    mask = random_mask((2, 5, 4), seed=1, ensure_row=False)
    mask[0, 2] = False  # a fully masked query
    _, w = attention(q, k, v, mask=mask)
    sums = w.sum(-1)
    has_key = mask.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all()
    assert (w >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_fully_masked_rows_give_zero_output_and_no_nan(dtype):
    q, k, v = make_qkv((2,), 3, 4, dtype=dtype)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[1, 0] = False  # query 0 of item 1 sees nothing
    mask[0] = False  # item 0 sees nothing at all
    q.requires_grad_(True)
    out, w = attention(q, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (w[0] == 0).all() and (out[0] == 0).all()
    assert (w[1, 0] == 0).all() and (out[1, 0] == 0).all()
    assert (w[1, 1:].sum(-1) - 1).abs().max() < 1e-2
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    assert (q.grad[0] == 0).all()  # nothing to attend to: no gradient either


def test_masked_keys_get_exactly_zero_weight():
    q, k, v = make_qkv((2, 2), 4, 7)
    # large scores on the masked keys must not leak any weight
    k[..., 3, :] = 50.0 * q.mean(-2)
    mask = torch.ones(7, dtype=torch.bool)
    mask[3] = False
    _, w = attention(q, k, v, mask=mask)
    assert (w[..., 3] == 0).all()


def test_changing_masked_keys_and_values_does_not_change_output():
    q, k, v = make_qkv((2,), 4, 6)
    mask = random_mask((2, 1, 6), seed=5)
    out, w = attention(q, k, v, mask=mask)
    hidden = ~mask[:, 0]  # (2, 6): masked key positions
    k2, v2 = k.clone(), v.clone()
    k2[hidden] = 1e4 * torch.randn_like(k2[hidden])
    v2[hidden] = 1e4 * torch.randn_like(v2[hidden])
    out2, w2 = attention(q, k2, v2, mask=mask)
    torch.testing.assert_close(out2, out)
    torch.testing.assert_close(w2, w)


@pytest.mark.parametrize("int_dtype", [torch.int64, torch.int32, torch.uint8, torch.int8])
def test_integer_mask_equals_bool_mask(int_dtype):
    q, k, v = make_qkv((2,), 3, 5)
    mask = random_mask((2, 1, 5), seed=2)
    out_b, w_b = attention(q, k, v, mask=mask)
    out_i, w_i = attention(q, k, v, mask=mask.to(int_dtype))
    torch.testing.assert_close(out_i, out_b)
    torch.testing.assert_close(w_i, w_b)


def test_gradcheck_float64_with_mask():
    q, k, v = make_qkv((2,), 3, 4, 3, 2, dtype=torch.float64)
    mask = random_mask((2, 3, 4), seed=4)
    mask[1, 2] = False  # include a fully masked row
    inputs = tuple(t.clone().requires_grad_(True) for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c, mask=mask), inputs)


def test_gradients_match_sdpa():
    q, k, v = make_qkv((2, 2), 3, 5, dtype=torch.float64)
    mask = random_mask((2, 1, 3, 5), seed=6)
    ours = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = [t.clone().requires_grad_(True) for t in (q, k, v)]
    g = torch.randn(2, 2, 3, 6, dtype=torch.float64)
    (attention(*ours, mask=mask)[0] * g).sum().backward()
    (F.scaled_dot_product_attention(*ref, attn_mask=mask) * g).sum().backward()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.grad, b.grad)


def test_dropout_applied_only_in_training():
    q, k, v = make_qkv((4,), 8, 8)
    drop = nn.Dropout(0.5)
    ref_out, ref_w = attention(q, k, v)
    drop.eval()
    out_eval, w_eval = attention(q, k, v, dropout=drop)
    torch.testing.assert_close(out_eval, ref_out)
    torch.testing.assert_close(w_eval, ref_w)
    drop.train()
    torch.manual_seed(0)
    out_train, w_train = attention(q, k, v, dropout=drop)
    dropped = w_train == 0
    assert 0 < dropped.float().mean() < 1
    torch.testing.assert_close(w_train[~dropped], 2 * ref_w[~dropped])  # inverted dropout
    torch.testing.assert_close(out_train, w_train @ v)  # returned weights are the ones used


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_preserved(dtype):
    q, k, v = make_qkv((2,), 3, 4, dtype=dtype)
    out, w = attention(q, k, v, mask=torch.ones(4, dtype=torch.bool))
    assert out.dtype == dtype and w.dtype == dtype


def test_device_preserved_on_meta_device():
    # the meta device has no data: this checks that nothing is created on the CPU by default
    q, k, v = (t.to("meta") for t in make_qkv((2,), 3, 4))
    out, w = attention(q, k, v, mask=torch.ones(2, 1, 4, dtype=torch.bool, device="meta"))
    assert out.device.type == "meta" and w.device.type == "meta"
    out, w = AdditiveAttention(4, 4, 5).to("meta")(q, k, v)
    assert out.device.type == "meta" and w.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    q, k, v = make_qkv((2,), 3, 4)
    mask = random_mask((2, 1, 4))
    out, w = attention(*(t.cuda() for t in (q, k, v)), mask=mask.cuda())
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), attention(q, k, v, mask=mask)[0])


# ------------------------------------------------------------------------ property tests

sizes = st.integers(min_value=1, max_value=6)


@SETTINGS
@given(q_len=sizes, k_len=sizes, d_k=sizes, d_v=sizes, seed=st.integers(0, 2**16))
def test_property_permuting_keys_and_values_together(q_len, k_len, d_k, d_v, seed):
    q, k, v = make_qkv((2,), q_len, k_len, d_k, d_v, dtype=torch.float64, seed=seed)
    mask = random_mask((2, 1, k_len), seed=seed)
    perm = torch.randperm(k_len, generator=torch.Generator().manual_seed(seed))
    out, w = attention(q, k, v, mask=mask)
    out_p, w_p = attention(q, k[:, perm], v[:, perm], mask=mask[..., perm])
    torch.testing.assert_close(out_p, out)
    torch.testing.assert_close(w_p, w[..., perm])


@SETTINGS
@given(q_len=sizes, k_len=sizes, d_k=sizes, seed=st.integers(0, 2**16))
def test_property_permuting_queries_permutes_outputs(q_len, k_len, d_k, seed):
    q, k, v = make_qkv((2,), q_len, k_len, d_k, 3, dtype=torch.float64, seed=seed)
    perm = torch.randperm(q_len, generator=torch.Generator().manual_seed(seed))
    out, _ = attention(q, k, v)
    torch.testing.assert_close(attention(q[:, perm], k, v)[0], out[:, perm])


@SETTINGS
@given(q_len=sizes, k_len=st.integers(2, 6), seed=st.integers(0, 2**16))
def test_property_masked_positions_are_ignored(q_len, k_len, seed):
    q, k, v = make_qkv((2,), q_len, k_len, 4, 3, dtype=torch.float64, seed=seed)
    mask = random_mask((2, q_len, k_len), seed=seed, ensure_row=False)
    out, w = attention(q, k, v, mask=mask)
    # the same as attention over only the visible keys, query by query
    for b in range(2):
        for i in range(q_len):
            keep = mask[b, i]
            if keep.any():
                o, _ = attention(q[b, i : i + 1], k[b, keep], v[b, keep])
                torch.testing.assert_close(out[b, i], o[0])
            else:
                assert (out[b, i] == 0).all() and (w[b, i] == 0).all()


@SETTINGS
@given(q_len=sizes, k_len=sizes, d_k=sizes, d_v=sizes, seed=st.integers(0, 2**16))
def test_property_output_is_a_convex_combination_of_values(q_len, k_len, d_k, d_v, seed):
    q, k, v = make_qkv((), q_len, k_len, d_k, d_v, dtype=torch.float64, seed=seed)
    out, w = attention(q, k, v)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(q_len, dtype=torch.float64))
    lo, hi = v.min(0).values, v.max(0).values
    assert (out >= lo - 1e-12).all() and (out <= hi + 1e-12).all()


@SETTINGS
@given(shift=st.floats(-50, 50), seed=st.integers(0, 2**16))
def test_property_shifting_all_scores_changes_nothing(shift, seed):
    # adding the same vector c to every key adds q·c to every score of query q: no effect
    q, k, v = make_qkv((2,), 3, 4, 5, 2, dtype=torch.float64, seed=seed)
    c = shift * torch.ones(5, dtype=torch.float64)
    torch.testing.assert_close(attention(q, k + c, v)[0], attention(q, k, v)[0])


# ---------------------------------------------------------------------------- errors


def test_error_floating_mask():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=r"mask must be a bool .*got dtype torch.float32"):
        attention(q, k, v, mask=torch.ones(2, 3, 5))


def test_error_mask_not_broadcastable():
    q, k, v = make_qkv()  # q_len=3, k_len=5
    with pytest.raises(ValueError, match=r"mask of shape \(2, 3, 4\) is not broadcastable"):
        attention(q, k, v, mask=torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 2, 5\) is not broadcastable"):
        attention(q, k, v, mask=torch.ones(2, 2, 5, dtype=torch.bool))
    # a mask with more batch dimensions than the scores would silently enlarge the output
    with pytest.raises(ValueError, match=r"mask of shape \(4, 2, 3, 5\).*\(2, 3, 5\)"):
        attention(q, k, v, mask=torch.ones(4, 2, 3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3, 5\).*\(2, 3, 5\)"):
        attention(q, k, v, mask=torch.ones(3, 3, 5, dtype=torch.bool))


def test_error_mask_not_a_tensor():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=r"mask must be a bool tensor .*got list"):
        attention(q, k, v, mask=[[True] * 5] * 3)


def test_error_d_k_mismatch():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=r"query and key must have the same d_k"):
        attention(q, k[..., :3], v)


def test_error_k_len_mismatch():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=r"value must have as many positions as key \(k_len=5\)"):
        attention(q, k, v[:, :4])


@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_error_non_floating_inputs(name):
    args = dict(zip(("query", "key", "value"), make_qkv()))
    args[name] = args[name].long()
    with pytest.raises(ValueError, match=rf"{name} must be a floating-point tensor"):
        attention(**args)


def test_error_one_dimensional_query():
    q, k, v = make_qkv(())
    with pytest.raises(ValueError, match=r"query must be a floating-point tensor of shape"):
        attention(q[0], k, v)


def test_error_dtype_mismatch():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=r"key and value must have query's dtype"):
        attention(q, k.double(), v)


def test_error_batch_dims_do_not_broadcast():
    q, _, _ = make_qkv((2,))
    _, k, v = make_qkv((3,))
    with pytest.raises(ValueError, match=r"leading \(batch/head\) dimensions .* must broadcast"):
        attention(q, k, v)


def test_error_dropout_not_a_module():
    q, k, v = make_qkv()
    with pytest.raises(ValueError, match=r"dropout must be an nn.Module"):
        attention(q, k, v, dropout=0.1)


# ------------------------------------------------------------------- helpers


def test_check_mask_returns_bool_and_accepts_broadcastable_shapes():
    for shape in [(3, 5), (1, 5), (3, 1), (5,), (2, 1, 5), (2, 4, 3, 5)]:
        m = check_mask(torch.ones(shape, dtype=torch.int64), q_len=3, k_len=5)
        assert m.dtype == torch.bool and m.shape == shape
    m = torch.ones(3, 5, dtype=torch.bool)
    assert check_mask(m, 3, 5) is m  # no copy for bool masks
    assert check_mask(torch.tensor([2, 0, -1]), 1, 3).tolist() == [True, False, True]


def test_check_mask_uses_given_name_and_batch_shape():
    with pytest.raises(ValueError, match=r"src_mask of shape \(2, 1, 4\)"):
        check_mask(torch.ones(2, 1, 4, dtype=torch.bool), 3, 5, name="src_mask")
    check_mask(torch.ones(2, 1, 5, dtype=torch.bool), 3, 5, batch_shape=(2,))
    with pytest.raises(ValueError, match=r"not broadcastable to \(4, 3, 5\)"):
        check_mask(torch.ones(2, 1, 5, dtype=torch.bool), 3, 5, batch_shape=(4,))


@pytest.mark.parametrize("p", [0, 0.0, 0.1, 0.5, 0.999, 1 - 1e-12])
def test_check_probability_accepts_numbers_in_unit_interval(p):
    got = check_probability(p)
    assert type(got) is float and got == float(p)


def test_check_probability_accepts_other_real_types():
    np = pytest.importorskip("numpy")
    assert check_probability(np.float32(0.25)) == 0.25
    assert check_probability(np.int64(0)) == 0.0
    from fractions import Fraction

    assert check_probability(Fraction(1, 4)) == 0.25


@pytest.mark.parametrize(
    "p,match",
    [
        (1.0, r"p_drop must be a probability in \[0, 1\), got 1.0"),
        (1, r"p_drop must be a probability in \[0, 1\), got 1"),
        (-0.1, r"p_drop must be a probability in \[0, 1\), got -0.1"),
        (1.5, r"p_drop must be a probability in \[0, 1\), got 1.5"),
        (float("nan"), r"p_drop must be a probability in \[0, 1\), got nan"),
        (float("inf"), r"p_drop must be a probability in \[0, 1\), got inf"),
        (float("-inf"), r"p_drop must be a probability in \[0, 1\), got -inf"),
        (True, r"p_drop must be a real number in \[0, 1\), got bool True"),
        (False, r"p_drop must be a real number in \[0, 1\), got bool False"),
        ("0.1", r"p_drop must be a real number in \[0, 1\), got str '0.1'"),
        (None, r"p_drop must be a real number in \[0, 1\), got NoneType None"),
        (0.1 + 0j, r"p_drop must be a real number in \[0, 1\), got complex"),
        (torch.tensor(0.1), r"p_drop must be a real number in \[0, 1\), got Tensor"),
    ],
)
def test_check_probability_rejects_with_the_given_name(p, match):
    with pytest.raises(ValueError, match=match):
        check_probability(p, "p_drop")


def test_check_positive_int_returns_a_python_int():
    assert check_positive_int(1, "h") == 1 and type(check_positive_int(8, "h")) is int
    np = pytest.importorskip("numpy")
    got = check_positive_int(np.int64(6), "N")
    assert got == 6 and type(got) is int


@pytest.mark.parametrize(
    "value,match",
    [
        (0, r"N must be a positive integer, got 0"),
        (-2, r"N must be a positive integer, got -2"),
        # True is the int 1 to Python: it would build one layer
        (True, r"N must be a positive integer, got True"),
        (False, r"N must be a positive integer, got False"),
        (6.0, r"N must be a positive integer, got 6.0"),
        ("6", r"N must be a positive integer, got '6'"),
        (None, r"N must be a positive integer, got None"),
        (torch.tensor(6), r"N must be a positive integer, got tensor\(6\)"),
    ],
)
def test_check_positive_int_rejects_with_the_given_name(value, match):
    with pytest.raises(ValueError, match=match):
        check_positive_int(value, "N")


def test_check_positive_int_rejects_numpy_bool_and_zero():
    np = pytest.importorskip("numpy")
    for value in (np.bool_(True), np.int64(0), np.float64(3.0)):
        with pytest.raises(ValueError, match="h must be a positive integer"):
            check_positive_int(value, "h")


def test_check_probability_default_name_is_dropout():
    with pytest.raises(ValueError, match=r"^dropout must be a probability"):
        check_probability(2.0)


def test_masked_softmax_matches_softmax_of_minus_inf():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 3, 6, generator=g)
    mask = random_mask((4, 3, 6), seed=7)
    expected = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    torch.testing.assert_close(masked_softmax(scores, mask), expected)
    torch.testing.assert_close(masked_softmax(scores), scores.softmax(-1))


# ------------------------------------------------------------------ additive attention


def additive_reference(module, q, k, v, mask=None):
    """e_ij = vᵀ tanh(W q_i + U k_j) by explicit loops, then softmax and weighted sum."""
    W, U, v_a = module.W.weight, module.U.weight, module.v.weight[0]
    batch, q_len, k_len = q.size(0), q.size(1), k.size(1)
    e = torch.empty(batch, q_len, k_len, dtype=q.dtype)
    for b in range(batch):
        for i in range(q_len):
            for j in range(k_len):
                e[b, i, j] = v_a @ torch.tanh(W @ q[b, i] + U @ k[b, j])
    if mask is not None:
        e = e.masked_fill(~mask, float("-inf"))
    alpha = e.softmax(-1)
    return alpha @ v, alpha


def test_additive_shapes():
    module = AdditiveAttention(query_size=5, key_size=3, num_hiddens=7)
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 6, 3), torch.randn(2, 6, 9)
    out, w = module(q, k, v)
    assert out.shape == (2, 4, 9) and w.shape == (2, 4, 6)


def test_additive_matches_loop():
    torch.manual_seed(0)
    module = AdditiveAttention(query_size=5, key_size=3, num_hiddens=7).double()
    q, k, v = (torch.randn(2, n, d, dtype=torch.float64) for n, d in ((4, 5), (6, 3), (6, 2)))
    out, w = module(q, k, v)
    ref_out, ref_w = additive_reference(module, q, k, v)
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)


def test_additive_mask():
    torch.manual_seed(0)
    module = AdditiveAttention(query_size=5, key_size=3, num_hiddens=7).double()
    q, k, v = (torch.randn(2, n, d, dtype=torch.float64) for n, d in ((4, 5), (6, 3), (6, 2)))
    mask = random_mask((2, 1, 6), seed=8)
    out, w = module(q, k, v, mask=mask)
    ref_out, ref_w = additive_reference(module, q, k, v, mask.expand(2, 4, 6))
    torch.testing.assert_close(w, ref_w)
    torch.testing.assert_close(out, ref_out)
    assert (w[~mask.expand(2, 4, 6)] == 0).all()
    # fully masked rows: zero output, no NaN
    out0, w0 = module(q, k, v, mask=torch.zeros(2, 1, 6, dtype=torch.int64))
    assert (out0 == 0).all() and (w0 == 0).all()


def test_additive_dropout_only_in_training():
    torch.manual_seed(0)
    module = AdditiveAttention(4, 4, 8, dropout=0.5)
    q, k, v = make_qkv((3,), 6, 6, 4, 4)
    module.eval()
    _, w_eval = module(q, k, v)
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(3, 6))
    module.train()
    out, w = module(q, k, v)
    assert (w == 0).any()
    torch.testing.assert_close(w[w != 0], 2 * w_eval[w != 0])
    torch.testing.assert_close(out, w @ v)


def test_additive_errors():
    module = AdditiveAttention(query_size=5, key_size=3, num_hiddens=7)
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 6, 3), torch.randn(2, 6, 9)
    with pytest.raises(ValueError, match=r"query must have 5 features and key 3"):
        module(q[..., :4], k, v)
    with pytest.raises(ValueError, match=r"value must have as many positions as key"):
        module(q, k, v[:, :5])
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 5\)"):
        module(q, k, v, mask=torch.ones(2, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\), got 1.5"):
        AdditiveAttention(5, 3, 7, dropout=1.5)
    with pytest.raises(ValueError, match=r"dropout must be a real number .* got bool True"):
        AdditiveAttention(5, 3, 7, dropout=True)
    assert AdditiveAttention(5, 3, 7, dropout=0).dropout.p == 0.0
