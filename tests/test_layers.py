"""Tests for transformer_lib.layers (chapter 5): each block against an independent computation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_lib.layers import (
    Decoder,
    DecoderLayer,
    Dropout,
    Embeddings,
    Encoder,
    EncoderLayer,
    Generator,
    LayerNorm,
    PositionwiseFeedForward,
    SublayerConnection,
    clones,
    on_positions,
    visible_positions,
)
from transformer_lib.multihead import MultiHeadedAttention

D_MODEL, H, D_FF = 16, 4, 32


def causal(n: int) -> torch.Tensor:
    """(1, n, n) bool, True where attending is allowed (written here, independent of chapter 2)."""
    return torch.ones(n, n, dtype=torch.bool).tril().unsqueeze(0)


def key_padding(lengths: list[int], n: int) -> torch.Tensor:
    """(batch, 1, n) bool, True for the first `length` positions of each row."""
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]).unsqueeze(1)


def encoder(norm_first: bool, N: int = 2, dropout: float = 0.0) -> Encoder:
    attn = MultiHeadedAttention(H, D_MODEL, dropout)
    ff = PositionwiseFeedForward(D_MODEL, D_FF, dropout)
    return Encoder(EncoderLayer(D_MODEL, attn, ff, dropout, norm_first), N)


def decoder(norm_first: bool, N: int = 2, dropout: float = 0.0) -> Decoder:
    attn = MultiHeadedAttention(H, D_MODEL, dropout)
    ff = PositionwiseFeedForward(D_MODEL, D_FF, dropout)
    layer = DecoderLayer(D_MODEL, copy.deepcopy(attn), copy.deepcopy(attn), ff, dropout, norm_first)
    return Decoder(layer, N)


def randomize_norms(module: nn.Module) -> None:
    """Give every LayerNorm a random gain and bias, so tests do not rely on (1, 0)."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)


# ---------------------------------------------------------------- Embeddings
def test_embeddings_scale_by_sqrt_d_model_and_pad_row_is_zero():
    torch.manual_seed(0)
    emb = Embeddings(vocab=10, d_model=D_MODEL, padding_idx=0)
    tokens = torch.tensor([[3, 7, 0], [1, 0, 0]])
    out = emb(tokens)
    assert out.shape == (2, 3, D_MODEL)
    torch.testing.assert_close(out, F.embedding(tokens, emb.lut.weight) * math.sqrt(D_MODEL))
    assert torch.count_nonzero(out[tokens == 0]) == 0
    out.sum().backward()
    assert torch.count_nonzero(emb.lut.weight.grad[0]) == 0  # padding row gets no gradient
    assert torch.count_nonzero(emb.lut.weight.grad[3]) > 0


def test_embeddings_accept_int32():
    emb = Embeddings(10, D_MODEL)
    tokens = torch.tensor([[1, 2]])
    torch.testing.assert_close(emb(tokens.int()), emb(tokens))


@pytest.mark.parametrize("bad", [torch.tensor([[1.0, 2.0]]), torch.tensor([[True, False]])])
def test_embeddings_reject_non_integer_ids(bad):
    with pytest.raises(ValueError, match="x must be a tensor of integer token ids"):
        Embeddings(10, D_MODEL)(bad)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(vocab=0, d_model=8), "vocab must be a positive"),
        (dict(vocab=5, d_model=0), "d_model must be a positive integer"),
        (dict(vocab=5.0, d_model=8), "vocab must be a positive integer"),
        (dict(vocab=5, d_model=8, padding_idx=5), r"padding_idx must be in \[0, vocab=5\)"),
    ],
)
def test_embeddings_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Embeddings(**kwargs)


# ---------------------------------------------------------------- LayerNorm
@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    features=st.integers(1, 24),
    scale=st.floats(1e-2, 1e3),
    shift=st.floats(-100, 100),
    eps=st.sampled_from([1e-6, 1e-5, 1e-3]),
    seed=st.integers(0, 2**16),
)
def test_layer_norm_matches_torch(shape, features, scale, shift, eps, seed):
    torch.manual_seed(seed)
    x = (torch.randn(*shape, features, dtype=torch.float64) * scale + shift).requires_grad_()
    ours, ref = LayerNorm(features, eps=eps).double(), nn.LayerNorm(features, eps=eps).double()
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())  # same parameter names: weight and bias
    x_ref = x.detach().clone().requires_grad_()
    torch.testing.assert_close(ours(x), ref(x_ref))
    grad = torch.randn(*shape, features, dtype=torch.float64)
    ours(x).backward(grad)
    ref(x_ref).backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad)
    torch.testing.assert_close(ours.bias.grad, ref.bias.grad)


def test_layer_norm_is_per_position_and_differs_from_unbiased_variant():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 8)
    y = LayerNorm(8)(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(3, 4), atol=1e-6, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(3, 4), atol=1e-4, rtol=0)
    # A position's output does not depend on any other position or batch element.
    x2 = x.clone()
    x2[1:, :] = torch.randn(2, 4, 8)
    x2[0, 1:] = torch.randn(3, 8)
    torch.testing.assert_close(LayerNorm(8)(x2)[0, 0], y[0, 0])
    annotated = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6)
    assert not torch.allclose(annotated, y, atol=1e-3)


def test_layer_norm_errors():
    with pytest.raises(ValueError, match="features must be a positive integer"):
        LayerNorm(0)
    with pytest.raises(ValueError, match="eps must be positive"):
        LayerNorm(4, eps=0.0)
    with pytest.raises(ValueError, match="x must have 4 features"):
        LayerNorm(4)(torch.randn(2, 5))


# ---------------------------------------------------------------- SublayerConnection
@pytest.mark.parametrize("norm_first", [False, True])
def test_sublayer_connection_formula(norm_first):
    torch.manual_seed(0)
    block = SublayerConnection(D_MODEL, dropout=0.0, norm_first=norm_first)
    randomize_norms(block)
    sub = nn.Sequential(nn.Linear(D_MODEL, D_MODEL), nn.Tanh())
    x = torch.randn(2, 5, D_MODEL)
    ln = nn.LayerNorm(D_MODEL, eps=1e-6)
    ln.load_state_dict(block.norm.state_dict())
    expected = x + sub(ln(x)) if norm_first else ln(x + sub(x))
    torch.testing.assert_close(block(x, sub), expected)
    assert block.norm_first is norm_first and isinstance(block.dropout, nn.Dropout)


@pytest.mark.parametrize("norm_first", [False, True])
def test_sublayer_connection_dropout_acts_on_the_sublayer_output_only(norm_first):
    torch.manual_seed(0)
    block = SublayerConnection(D_MODEL, dropout=0.5, norm_first=norm_first).train()
    sub = nn.Linear(D_MODEL, D_MODEL)
    x = torch.randn(2, 5, D_MODEL)
    ln = nn.LayerNorm(D_MODEL, eps=1e-6)
    torch.manual_seed(1)
    out = block(x, sub)
    torch.manual_seed(1)  # same random stream: dropout is the only random operation
    drop = Dropout(0.5)  # tested on its own below
    if norm_first:
        expected = x + drop(sub(ln(x)))
    else:
        expected = ln(x + drop(sub(x)))
    torch.testing.assert_close(out, expected)
    block.eval()
    expected_eval = x + sub(ln(x)) if norm_first else ln(x + sub(x))
    torch.testing.assert_close(block(x, sub), expected_eval)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.3333])
def test_dropout_distribution_scale_and_gradient(p):
    torch.manual_seed(0)
    drop = Dropout(p)
    assert isinstance(drop, nn.Dropout) and drop.p == p  # model.eval() etc. treat it as one
    n = 1_000_000
    x = torch.full((n,), 2.0, requires_grad=True)
    y = drop(x)
    kept = (y != 0).double().mean().item()
    # the mask's 16 bits drop with p rounded to a multiple of 2^-16
    p16 = round(p * 2**16) / 2**16
    assert abs(p16 - p) <= 2**-17
    # a Binomial(n, 1 - p16) fraction: within 5 standard deviations
    assert abs(kept - (1 - p16)) < 5 * math.sqrt(p16 * (1 - p16) / n)
    survivors = y[y != 0]  # scaled by one over the kept probability: unbiased
    torch.testing.assert_close(survivors, torch.full_like(survivors, 2.0 / (1 - p16)))
    y.backward(torch.ones(n))
    torch.testing.assert_close(x.grad, (y != 0).float() / (1 - p16))
    # independent masks call after call, and the same mask for the same seed
    assert not torch.equal(drop(x) != 0, y != 0)
    torch.manual_seed(0)
    assert torch.equal(drop(x), y)
    # bf16 stays bf16; evaluation and p = 0 are the identity
    assert drop(torch.ones(3, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert drop.eval()(x) is x and Dropout(0.0)(x) is x


def test_dropout_masks_are_uniform_over_positions_and_shapes():
    """Four entries share a 64-bit draw: each of the four lanes keeps 1 - p, independently,
    for any size (a last draw only partly used) and for non-contiguous inputs."""
    torch.manual_seed(0)
    drop = Dropout(0.25)
    y = drop(torch.ones(250_001, 4).t())  # (4, 250_001), non-contiguous
    assert y.shape == (4, 250_001)
    kept = (y != 0).double()
    for lane in range(4):  # entries 4k + lane of the flat order
        share = kept.flatten()[lane::4].mean().item()
        assert abs(share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / 250_000)
    # neighbours in a draw are independent: both kept with probability 0.75^2
    flat = kept.flatten()[: 4 * 250_000].view(-1, 4)
    both = (flat[:, 0] * flat[:, 1]).mean().item()
    assert abs(both - 0.5625) < 5 * math.sqrt(0.5625 * 0.4375 / 250_000)
    assert drop(torch.ones(3)).shape == (3,) and drop(torch.ones(0, 5)).shape == (0, 5)


@pytest.mark.parametrize("p", [0.99999, 1e-6])
def test_dropout_at_the_ends_of_the_grid(p):
    """p near 1 drops at most 1 - 2^-16 (a finite scale, never a division by 0); a p under
    2^-17 rounds to 0: nothing dropped, and nothing scaled."""
    torch.manual_seed(0)
    y = Dropout(p)(torch.ones(2_000_000))
    assert torch.isfinite(y).all()
    if p > 0.5:  # some 31 survivors expected
        assert 5 < (y != 0).sum() < 80 and y.max().item() == 2.0**16
    else:
        assert torch.equal(y, torch.ones(2_000_000))


@pytest.mark.parametrize("p", [1.0, -0.1, float("nan"), True, "0.1", None])
def test_dropout_errors(p):
    # the shared check of chapter 1: bool, non-numbers and NaN are rejected too
    with pytest.raises(ValueError, match=r"p must be a (probability|real number) in \[0, 1\)"):
        Dropout(p)


@pytest.mark.parametrize("p", [1.0, -0.1, float("nan"), True, "0.1"])
def test_sublayer_connection_and_ffn_dropout_errors(p):
    match = r"dropout must be a (probability|real number) in \[0, 1\)"
    with pytest.raises(ValueError, match=match):
        SublayerConnection(8, dropout=p)
    with pytest.raises(ValueError, match=match):
        PositionwiseFeedForward(8, 32, dropout=p)


# ---------------------------------------------------------------- feed-forward
def test_ffn_formula_and_shape():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(D_MODEL, D_FF, dropout=0.0)
    x = torch.randn(3, 6, D_MODEL)
    w1, b1, w2, b2 = ffn.w_1.weight, ffn.w_1.bias, ffn.w_2.weight, ffn.w_2.bias
    expected = torch.clamp(x @ w1.T + b1, min=0) @ w2.T + b2  # max(0, xW1 + b1)W2 + b2
    torch.testing.assert_close(ffn(x), expected)
    assert ffn.w_1.weight.shape == (D_FF, D_MODEL) and ffn.w_2.weight.shape == (D_MODEL, D_FF)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_ffn_equals_two_1x1_convolutions(activation):
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(D_MODEL, D_FF, dropout=0.0, activation=activation)
    conv1, conv2 = nn.Conv1d(D_MODEL, D_FF, 1), nn.Conv1d(D_FF, D_MODEL, 1)
    with torch.no_grad():
        conv1.weight.copy_(ffn.w_1.weight.unsqueeze(-1))
        conv1.bias.copy_(ffn.w_1.bias)
        conv2.weight.copy_(ffn.w_2.weight.unsqueeze(-1))
        conv2.bias.copy_(ffn.w_2.bias)
    act = F.relu if activation == "relu" else F.gelu
    x = torch.randn(2, 9, D_MODEL)
    expected = conv2(act(conv1(x.transpose(1, 2)))).transpose(1, 2)
    torch.testing.assert_close(ffn(x), expected)


@settings(max_examples=20, deadline=None)
@given(seq=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_ffn_is_position_wise(seq, seed):
    torch.manual_seed(seed)
    ffn = PositionwiseFeedForward(D_MODEL, D_FF, dropout=0.0)
    x = torch.randn(2, seq, D_MODEL)
    perm = torch.randperm(seq)
    torch.testing.assert_close(ffn(x[:, perm]), ffn(x)[:, perm])


def test_ffn_errors():
    with pytest.raises(ValueError, match="activation must be 'relu' or 'gelu'"):
        PositionwiseFeedForward(8, 32, activation="tanh")
    with pytest.raises(ValueError, match="d_ff must be a positive integer, got 0"):
        PositionwiseFeedForward(8, 0)
    with pytest.raises(ValueError, match="d_model must be a positive integer"):
        PositionwiseFeedForward(True, 32)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\)"):
        PositionwiseFeedForward(8, 32, dropout=-0.1)


# ---------------------------------------------------------------- clones
def test_clones_are_independent_deep_copies():
    layer = nn.Linear(3, 3)
    stack = clones(layer, 3)
    assert isinstance(stack, nn.ModuleList) and len(stack) == 3
    assert len({id(m.weight) for m in stack} | {id(layer.weight)}) == 4
    with torch.no_grad():
        stack[0].weight.add_(1.0)
    assert not torch.equal(stack[0].weight, stack[1].weight)
    with pytest.raises(ValueError, match="N must be a positive integer"):
        clones(layer, 0)
    with pytest.raises(ValueError, match="N must be a positive integer, got True"):
        clones(layer, True)


# ---------------------------------------------------------------- encoder
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_explicit_composition(norm_first):
    torch.manual_seed(0)
    layer = encoder(norm_first, N=1).layers[0]
    randomize_norms(layer)
    x, mask = torch.randn(2, 5, D_MODEL), key_padding([5, 3], 5)
    n0, n1 = (nn.LayerNorm(D_MODEL, eps=1e-6) for _ in range(2))
    n0.load_state_dict(layer.sublayer[0].norm.state_dict())
    n1.load_state_dict(layer.sublayer[1].norm.state_dict())
    attn, ff = layer.self_attn, layer.feed_forward
    if norm_first:
        y = x + attn(n0(x), n0(x), n0(x), mask)
        expected = y + ff(n1(y))
    else:
        y = n0(x + attn(x, x, x, mask))
        expected = n1(y + ff(y))
    out, real = layer(x, mask), mask[:, 0, :]  # (batch, len)
    torch.testing.assert_close(out[real], expected[real])
    # padding positions skip the feed-forward block: they leave it as they entered it
    torch.testing.assert_close(out[~real], y[~real])
    layer.skip_padding = False
    torch.testing.assert_close(layer(x, mask), expected)
    assert len(layer.sublayer) == 2 and layer.size == D_MODEL and layer.norm_first is norm_first


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_final_norm_rule_and_independent_layers(norm_first):
    enc = encoder(norm_first, N=3)
    assert isinstance(enc.norm, LayerNorm if norm_first else nn.Identity)
    assert len(enc.layers) == 3
    weights = [layer.self_attn.in_proj.weight for layer in enc.layers]
    assert len({id(w) for w in weights}) == 3  # no weight sharing between layers
    x, mask = torch.randn(2, 4, D_MODEL), key_padding([4, 2], 4)
    expected = x
    for layer in enc.layers:
        expected = layer(expected, mask)
    torch.testing.assert_close(enc(x, mask), enc.norm(expected))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_ignores_padding(norm_first):
    torch.manual_seed(0)
    enc = encoder(norm_first).eval()
    x, mask = torch.randn(2, 6, D_MODEL), key_padding([6, 3], 6)
    x2 = x.clone()
    x2[1, 3:] = 100 * torch.randn(3, D_MODEL)
    torch.testing.assert_close(enc(x2, mask)[1, :3], enc(x, mask)[1, :3])
    torch.testing.assert_close(enc(x2, mask)[0], enc(x, mask)[0])


@settings(max_examples=15, deadline=None)
@given(seq=st.integers(2, 7), seed=st.integers(0, 2**16), norm_first=st.booleans())
def test_encoder_is_permutation_equivariant_without_positions(seq, seed, norm_first):
    torch.manual_seed(seed)
    enc = encoder(norm_first).eval()
    x = torch.randn(2, seq, D_MODEL)
    perm = torch.randperm(seq)
    torch.testing.assert_close(enc(x[:, perm], None), enc(x, None)[:, perm])


# ---------------------------------------------------------------- decoder
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_explicit_composition(norm_first):
    torch.manual_seed(0)
    layer = decoder(norm_first, N=1).layers[0]
    randomize_norms(layer)
    x, memory = torch.randn(2, 4, D_MODEL), torch.randn(2, 6, D_MODEL)
    src_mask, tgt_mask = key_padding([6, 2], 6), causal(4)
    norms = [nn.LayerNorm(D_MODEL, eps=1e-6) for _ in range(3)]
    for n, sub in zip(norms, layer.sublayer):
        n.load_state_dict(sub.norm.state_dict())
    sa, ca, ff = layer.self_attn, layer.src_attn, layer.feed_forward
    if norm_first:
        y = x + sa(norms[0](x), norms[0](x), norms[0](x), tgt_mask)
        y = y + ca(norms[1](y), memory, memory, src_mask)
        expected = y + ff(norms[2](y))
    else:
        y = norms[0](x + sa(x, x, x, tgt_mask))
        y = norms[1](y + ca(y, memory, memory, src_mask))
        expected = norms[2](y + ff(y))
    torch.testing.assert_close(layer(x, memory, src_mask, tgt_mask), expected)
    assert len(layer.sublayer) == 3 and layer.size == D_MODEL
    assert layer.self_attn is not layer.src_attn


@settings(max_examples=20, deadline=None)
@given(tgt_len=st.integers(2, 7), data=st.data(), norm_first=st.booleans())
def test_decoder_is_causal(tgt_len, data, norm_first):
    i = data.draw(st.integers(0, tgt_len - 2), label="last unchanged position")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    torch.manual_seed(seed)
    dec = decoder(norm_first).eval()
    x, memory = torch.randn(2, tgt_len, D_MODEL), torch.randn(2, 5, D_MODEL)
    x2 = x.clone()
    x2[:, i + 1 :] = torch.randn(2, tgt_len - i - 1, D_MODEL)
    src_mask, tgt_mask = key_padding([5, 3], 5), causal(tgt_len)
    out, out2 = dec(x, memory, src_mask, tgt_mask), dec(x2, memory, src_mask, tgt_mask)
    torch.testing.assert_close(out2[:, : i + 1], out[:, : i + 1])
    assert not torch.allclose(out2[:, i + 1 :], out[:, i + 1 :])  # the mask is not too strict


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_ignores_padded_memory_and_every_layer_reads_memory(norm_first):
    torch.manual_seed(0)
    dec = decoder(norm_first, N=3).eval()
    x, memory = torch.randn(2, 4, D_MODEL), torch.randn(2, 6, D_MODEL)
    src_mask, tgt_mask = key_padding([6, 2], 6), causal(4)
    memory2 = memory.clone()
    memory2[1, 2:] = 50 * torch.randn(4, D_MODEL)  # padded source positions
    out = dec(x, memory, src_mask, tgt_mask)
    torch.testing.assert_close(dec(x, memory2, src_mask, tgt_mask), out)
    seen = []
    hooks = [
        layer.src_attn.register_forward_pre_hook(lambda m, args: seen.append(args[1]))
        for layer in dec.layers
    ]
    dec(x, memory, src_mask, tgt_mask)
    for hook in hooks:
        hook.remove()
    assert len(seen) == 3 and all(m is memory for m in seen)  # the same memory, every layer
    assert isinstance(dec.norm, LayerNorm if norm_first else nn.Identity)


def test_stack_errors():
    layer = encoder(False, N=1).layers[0]
    with pytest.raises(ValueError, match="N must be a positive integer"):
        Encoder(layer, 0)
    with pytest.raises(ValueError, match="N must be a positive integer"):
        Decoder(decoder(False, N=1).layers[0], -1)


# ---------------------------------------------------------------- skipping padding
def test_visible_positions_reads_the_columns_of_the_mask():
    x = torch.zeros(2, 4, D_MODEL)
    assert visible_positions(None, x) is None
    assert visible_positions(key_padding([4, 4], 4), x) is None  # nothing to skip
    assert visible_positions(causal(4), x) is None  # every key is seen by a later query
    rows = visible_positions(key_padding([4, 2], 4), x)
    assert rows.tolist() == [0, 1, 2, 3, 4, 5]  # flat (batch·len) indices
    # decoder: causal & key padding, (batch, len, len); the padding columns are all False
    tgt_mask = key_padding([3, 1], 4) & causal(4)
    assert visible_positions(tgt_mask, x).tolist() == [0, 1, 2, 4]
    # a column hidden from every other query but not from its own stays visible
    own_only = torch.eye(4, dtype=torch.bool).unsqueeze(0)
    assert visible_positions(own_only, x) is None
    # per-head (4-d) masks and cross-attention masks (other key length) are not read
    assert visible_positions(key_padding([4, 2], 4).unsqueeze(1), x) is None
    assert visible_positions(key_padding([6, 2], 6), x) is None
    meta = visible_positions(key_padding([4, 2], 4).to("meta"), x.to("meta"))
    assert meta is None  # shapes only: nothing to count


def test_on_positions_applies_f_to_the_given_rows_only():
    x = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    rows = torch.tensor([0, 1, 3])
    out = on_positions(lambda y: -y, x, rows)
    flat_in, flat_out = x.flatten(0, 1), out.flatten(0, 1)
    torch.testing.assert_close(flat_out[rows], -flat_in[rows])
    torch.testing.assert_close(flat_out[[2, 4, 5]], flat_in[[2, 4, 5]])
    torch.testing.assert_close(on_positions(lambda y: -y, x, None), -x)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("which", ["encoder", "decoder"])
def test_skipping_padding_changes_nothing_at_real_positions(which, norm_first):
    """Outputs at real positions and every gradient are those of the full computation."""
    torch.manual_seed(0)
    stack = encoder(norm_first, N=2) if which == "encoder" else decoder(norm_first, N=2)
    randomize_norms(stack)
    full = copy.deepcopy(stack)
    for layer in full.layers:
        layer.skip_padding = False
    x = torch.randn(3, 6, D_MODEL)
    memory, src_mask = torch.randn(3, 5, D_MODEL), key_padding([5, 2, 4], 5)
    if which == "encoder":
        mask = key_padding([6, 3, 1], 6)
        real = mask[:, 0, :]
    else:
        mask = key_padding([6, 3, 1], 6) & causal(6)
        real = key_padding([6, 3, 1], 6)[:, 0, :]
    outs = []
    for model in (stack, full):
        xi, mi = x.clone().requires_grad_(), memory.clone().requires_grad_()
        args = (xi, mask) if which == "encoder" else (xi, mi, src_mask, mask)
        out = model(*args)
        (out[real] * torch.linspace(-1, 1, D_MODEL)).sum().backward()  # reads real positions
        outs.append((out[real], xi.grad, mi.grad))
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b)
    for (name, p), q in zip(stack.named_parameters(), full.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_skipped_positions_never_become_nan():
    """A sentence of padding only, big values at padding: the skip keeps everything finite."""
    torch.manual_seed(0)
    enc = encoder(False, N=2)
    x = torch.randn(2, 4, D_MODEL)
    x[1] = 1e4
    out = enc(x, key_padding([4, 0], 4))
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------- generator
def test_generator_is_log_softmax_of_a_linear_map():
    torch.manual_seed(0)
    gen = Generator(D_MODEL, 11)
    x = torch.randn(2, 3, D_MODEL)
    out = gen(x)
    assert out.shape == (2, 3, 11)
    torch.testing.assert_close(out, F.log_softmax(x @ gen.proj.weight.T + gen.proj.bias, dim=-1))
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 3))
    with pytest.raises(ValueError, match="vocab must be a positive"):
        Generator(D_MODEL, 0)
