"""Tests for chapter 2: the causal and padding masks, and their effect through `attention`.

The mask properties are checked through what they are for: causality (an output never depends
on later inputs) and padding invariance (padded content never changes real outputs).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.attention import attention
from transformer_lib.masks import padding_mask, subsequent_mask

SETTINGS = settings(max_examples=25, deadline=None)
PAD = 0


def projections(d, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(d, d, generator=g, dtype=dtype) / d**0.5 for _ in range(3)]


def self_attention(x, mask, seed=0):
    w_q, w_k, w_v = projections(x.size(-1), seed, x.dtype)
    return attention(x @ w_q, x @ w_k, x @ w_v, mask=mask)


def padded_batch(lengths, max_len, vocab=20, seed=0, left=False):
    """Random token ids (never PAD) padded with PAD to max_len, on the right or on the left."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (len(lengths), max_len), generator=g)
    for b, n in enumerate(lengths):
        if left:
            tokens[b, : max_len - n] = PAD
        else:
            tokens[b, n:] = PAD
    return tokens


# ----------------------------------------------------------------------- subsequent_mask


@pytest.mark.parametrize("size", [1, 2, 5, 17])
def test_subsequent_mask_values(size):
    m = subsequent_mask(size)
    assert m.shape == (1, size, size) and m.dtype == torch.bool
    i = torch.arange(size)[:, None]
    j = torch.arange(size)[None, :]
    assert torch.equal(m[0], j <= i)  # position i sees keys 0..i
    assert m[0].diagonal().all()


def test_subsequent_mask_matches_pytorch_causal_convention():
    # nn.Transformer's float mask has -inf strictly above the diagonal
    ref = torch.nn.Transformer.generate_square_subsequent_mask(6)
    assert torch.equal(subsequent_mask(6)[0], ref == 0)


def test_subsequent_mask_device():
    assert subsequent_mask(4, device="meta").device.type == "meta"
    assert subsequent_mask(4, device=torch.device("cpu")).device.type == "cpu"


def test_subsequent_mask_accepts_integer_like_sizes():
    assert subsequent_mask(np.int64(3)).shape == (1, 3, 3)
    assert subsequent_mask(torch.tensor(3)).shape == (1, 3, 3)


@pytest.mark.parametrize("size", [0, -2, 2.5, "3", None, True])
def test_subsequent_mask_errors(size):
    with pytest.raises(ValueError, match=r"size must be an integer >= 1, got"):
        subsequent_mask(size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_causal_mask_matches_sdpa_is_causal(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=dtype) for _ in range(3))
    out, _ = attention(q, k, v, mask=subsequent_mask(6))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


# -------------------------------------------------------------------------- padding_mask


def test_padding_mask_values_and_shape():
    tokens = torch.tensor([[5, 6, 0, 0], [7, 0, 3, 0], [1, 2, 3, 4]])
    m = padding_mask(tokens, pad=0)
    assert m.shape == (3, 1, 4) and m.dtype == torch.bool
    assert m[:, 0].tolist() == [
        [True, True, False, False],
        [True, False, True, False],
        [True, True, True, True],
    ]
    assert torch.equal(padding_mask(tokens, pad=3)[:, 0], tokens != 3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_padding_mask_integer_dtypes_and_device(dtype):
    tokens = torch.tensor([[5, 6, 0]], dtype=dtype)
    assert padding_mask(tokens, 0)[0, 0].tolist() == [True, True, False]
    assert padding_mask(tokens.to("meta"), 0).device.type == "meta"
    assert padding_mask(tokens, np.int64(0))[0, 0].tolist() == [True, True, False]


@pytest.mark.parametrize(
    "tokens", [torch.tensor([1, 2, 0]), torch.ones(2, 3, 4, dtype=torch.long), [[1, 2, 0]]]
)
def test_padding_mask_wrong_shape(tokens):
    with pytest.raises(ValueError, match=r"tokens must be a \(batch, len\) tensor of token ids"):
        padding_mask(tokens, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_padding_mask_wrong_dtype(dtype):
    with pytest.raises(ValueError, match=r"tokens must hold integer token ids, got dtype"):
        padding_mask(torch.ones(2, 3, dtype=dtype), 0)


@pytest.mark.parametrize("pad", [0.0, None, "0", True])
def test_padding_mask_wrong_pad(pad):
    with pytest.raises(ValueError, match=r"pad must be the integer id of the padding token"):
        padding_mask(torch.ones(2, 3, dtype=torch.long), pad)


# ---------------------------------------------------------------- causality (property)


@SETTINGS
@given(
    n=st.integers(2, 8),
    i=st.integers(0, 6),
    batch=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_property_causal_output_ignores_the_future(n, i, batch, seed):
    i = min(i, n - 2)  # a position with a future
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, 6, generator=g, dtype=torch.float64)
    x_changed = x.clone()
    x_changed[:, i + 1 :] = 10 * torch.randn(batch, n - i - 1, 6, generator=g, dtype=torch.float64)
    out, w = self_attention(x, subsequent_mask(n), seed)
    out_changed, _ = self_attention(x_changed, subsequent_mask(n), seed)
    torch.testing.assert_close(out_changed[:, : i + 1], out[:, : i + 1])
    assert (w.triu(diagonal=1) == 0).all()  # no weight on any future key


def test_without_causal_mask_the_past_sees_the_future():
    # the property above is not vacuous: with no mask, position 0 depends on the last input
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 5, 6, generator=g, dtype=torch.float64)
    x_changed = x.clone()
    x_changed[:, -1] = torch.randn(6, generator=g, dtype=torch.float64)
    assert not torch.allclose(
        self_attention(x_changed, None)[0][:, 0], self_attention(x, None)[0][:, 0]
    )


@SETTINGS
@given(n=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_property_parallel_pass_equals_step_by_step_generation(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, 6, generator=g, dtype=torch.float64)
    w_q, w_k, w_v = projections(6, seed)
    parallel, _ = attention(x @ w_q, x @ w_k, x @ w_v, mask=subsequent_mask(n))
    for t in range(n):  # at generation step t only tokens 0..t exist
        step, _ = attention(x[:, t : t + 1] @ w_q, x[:, : t + 1] @ w_k, x[:, : t + 1] @ w_v)
        torch.testing.assert_close(parallel[:, t : t + 1], step)


# ------------------------------------------------------------ padding invariance (property)


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 7), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    left=st.booleans(),
)
def test_property_padded_content_does_not_change_real_outputs(lengths, seed, left):
    max_len = 7
    tokens = padded_batch(lengths, max_len, seed=seed, left=left)
    mask = padding_mask(tokens, PAD)  # (batch, 1, len)
    real = mask[:, 0]  # (batch, len)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max_len, 6, generator=g, dtype=torch.float64)
    x_junk = x.clone()
    x_junk[~real] = 100 * torch.randn(int((~real).sum()), 6, generator=g, dtype=torch.float64)
    out, w = self_attention(x, mask, seed)
    out_junk, _ = self_attention(x_junk, mask, seed)
    torch.testing.assert_close(out_junk[real], out[real])
    assert (w.transpose(1, 2)[~real] == 0).all()  # no query puts weight on a padded key


@SETTINGS
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_property_padding_equals_attention_over_the_unpadded_sentence(lengths, seed):
    max_len = 6
    tokens = padded_batch(lengths, max_len, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), max_len, 6, generator=g, dtype=torch.float64)
    out, _ = self_attention(x, padding_mask(tokens, PAD), seed)
    for b, n in enumerate(lengths):
        alone, _ = self_attention(x[b : b + 1, :n], None, seed)
        torch.testing.assert_close(out[b : b + 1, :n], alone)


def test_padding_mask_broadcasts_over_heads_and_missing_unsqueeze_is_caught():
    batch = h = 3  # equal sizes: the shapes fit even without the head dimension
    tokens = padded_batch([2, 5, 3], 5, seed=1)
    mask = padding_mask(tokens, PAD)  # (batch, 1, len)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, h, 5, 4, generator=g, dtype=torch.float64)
    out, w = attention(x, x, x, mask=mask.unsqueeze(1))  # (batch, 1, 1, len)
    assert w.shape == (batch, h, 5, 5)
    for head in range(h):  # the same as one head at a time with the (batch, 1, len) mask
        ref, _ = attention(x[:, head], x[:, head], x[:, head], mask=mask)
        torch.testing.assert_close(out[:, head], ref)
    # without the unsqueeze, head i of every sentence uses sentence i's padding: weights land
    # on padded keys, which the invariance check above is designed to catch
    _, w_wrong = attention(x, x, x, mask=mask)
    padded_key = ~mask[:, 0]  # (batch, len)
    assert (w_wrong.permute(0, 1, 3, 2)[padded_key[:, None].expand(batch, h, 5)] != 0).any()


def test_missing_head_dimension_raises_when_batch_differs_from_h():
    tokens = padded_batch([2, 4], 4)
    x = torch.randn(2, 3, 4, 8)  # (batch=2, h=3, len, d_k)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 4\) is not broadcastable"):
        attention(x, x, x, mask=padding_mask(tokens, PAD))


# ------------------------------------------------------------------------ combined masks


def test_combined_decoder_mask():
    tokens = torch.tensor([[1, 5, 6, 0, 0], [1, 7, 8, 9, 2]])
    m = padding_mask(tokens, PAD) & subsequent_mask(5)
    assert m.shape == (2, 5, 5) and m.dtype == torch.bool
    for b in range(2):
        for i in range(5):
            for j in range(5):
                assert bool(m[b, i, j]) == (j <= i and tokens[b, j].item() != PAD)


@SETTINGS
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_property_combined_mask_hides_future_and_padding(lengths, seed):
    n = 6
    tokens = padded_batch(lengths, n, seed=seed)
    mask = padding_mask(tokens, PAD) & subsequent_mask(n)  # (batch, n, n)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), n, 6, generator=g, dtype=torch.float64)
    out, w = self_attention(x, mask, seed)
    assert (w[~mask] == 0).all()
    for b, length in enumerate(lengths):
        for t in range(length):  # real position t: the same as generation over tokens 0..t
            step, _ = self_attention(x[b : b + 1, : t + 1], None, seed)
            torch.testing.assert_close(out[b, t], step[0, t])


def test_combined_mask_with_heads():
    tokens = padded_batch([3, 5], 5, seed=2)
    mask = (padding_mask(tokens, PAD) & subsequent_mask(5)).unsqueeze(1)  # (batch, 1, L, L)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=g) for _ in range(3))
    out, w = attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert (w[~mask.expand_as(w)] == 0).all()


def test_encoder_decoder_mask_broadcasts_to_cross_attention_scores():
    src = padded_batch([2, 4], 4, seed=3)
    g = torch.Generator().manual_seed(0)
    queries = torch.randn(2, 6, 8, generator=g)  # 6 target positions
    memory = torch.randn(2, 4, 8, generator=g)  # 4 source positions
    out, w = attention(queries, memory, memory, mask=padding_mask(src, PAD))
    assert w.shape == (2, 6, 4)
    assert (w[0, :, 2:] == 0).all() and (w[1] > 0).all()


def test_left_padding_with_causal_mask_gives_zero_rows_not_nan():
    tokens = padded_batch([2, 4], 4, left=True)  # sentence 0: two pads, then two tokens
    mask = padding_mask(tokens, PAD) & subsequent_mask(4)
    assert not mask[0, :2].any()  # queries 0 and 1 of sentence 0 see nothing
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 6, generator=g, requires_grad=True)
    out, w = attention(x, x, x, mask=mask)
    assert torch.isfinite(out).all()
    assert (out[0, :2] == 0).all() and (w[0, :2] == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(x, x, x, attn_mask=mask))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
