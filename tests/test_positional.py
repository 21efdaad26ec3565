"""Tests for chapter 4: sinusoidal and learned positional encodings (transformer_lib.positional)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    sinusoidal_positions,
)


def loop_formula(seq_len: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The paper's formula written out entry by entry with Python's math module (float64)."""
    out = torch.empty(seq_len, d_model, dtype=torch.float64)
    for pos in range(seq_len):
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            out[pos, 2 * i] = math.sin(angle)
            out[pos, 2 * i + 1] = math.cos(angle)
    return out


def shift_matrix(k: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """Block-diagonal rotation M_k with PE[pos + k] = M_k @ PE[pos], built with math only."""
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        a = k / base ** (2 * i / d_model)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = math.cos(a), math.sin(a)
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -math.sin(a), math.cos(a)
    return m


# --- sinusoidal_positions -------------------------------------------------------------------


@pytest.mark.parametrize("seq_len,d_model,base", [(7, 4, 100.0), (50, 32, 10000.0), (3, 2, 1.5)])
def test_values_match_loop_formula(seq_len, d_model, base):
    got = sinusoidal_positions(seq_len, d_model, base, dtype=torch.float64)
    torch.testing.assert_close(got, loop_formula(seq_len, d_model, base), rtol=0, atol=1e-12)


def test_worked_example_d4_base100():
    pe = sinusoidal_positions(3, 4, base=100.0, dtype=torch.float64)
    expected = torch.tensor(
        [[math.sin(p), math.cos(p), math.sin(p / 10), math.cos(p / 10)] for p in range(3)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(pe, expected)


def test_default_dtype_and_empty_table():
    assert sinusoidal_positions(5, 8).dtype == torch.float32
    assert sinusoidal_positions(0, 8).shape == (0, 8)


def test_large_positions_are_computed_in_float64():
    # A float32 computation of the angles is off by ~1e-2 at position 100000 in the fast
    # columns; the table must instead equal the float64 formula rounded to float32.
    positions = torch.arange(100_000, 100_010, dtype=torch.float64)
    omega = 10000.0 ** (-torch.arange(0, 512, 2, dtype=torch.float64) / 512)
    angles = positions[:, None] * omega
    expected = torch.stack([angles.sin(), angles.cos()], -1).flatten(-2).float()
    got = sinusoidal_positions(100_010, 512)[100_000:]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_shift_by_k_is_one_rotation_for_all_positions(dtype, atol):
    d_model, n_pos = 64, 1000
    pe = sinusoidal_positions(n_pos + 60, d_model, dtype=dtype)
    for k in (1, 7, 60):
        m_k = shift_matrix(k, d_model).to(dtype)
        torch.testing.assert_close(pe[:n_pos] @ m_k.T, pe[k : n_pos + k], rtol=0, atol=atol)


def test_shift_matrices_compose_and_are_orthogonal():
    m3, m4, m7 = (shift_matrix(k, 16) for k in (3, 4, 7))
    torch.testing.assert_close(m3 @ m4, m7)
    torch.testing.assert_close(m7.T @ m7, torch.eye(16, dtype=torch.float64))


def test_dot_product_depends_on_distance_only():
    pe = sinusoidal_positions(120, 32, dtype=torch.float64)
    sim = pe @ pe.T
    omega = 10000.0 ** (-torch.arange(0, 32, 2, dtype=torch.float64) / 32)
    for k in (0, 1, 5, 40):
        expected = torch.cos(k * omega).sum()
        diag = torch.diagonal(sim, offset=k)
        torch.testing.assert_close(diag, expected.expand_as(diag))
        torch.testing.assert_close(torch.diagonal(sim, offset=-k), diag)  # symmetric in ±k


@settings(max_examples=40, deadline=None)
@given(
    seq_len=st.integers(1, 300),
    half=st.integers(1, 64),
    base=st.floats(2.0, 1e5),
)
def test_rows_have_norm_sqrt_half_d_and_values_in_range(seq_len, half, base):
    d_model = 2 * half
    pe = sinusoidal_positions(seq_len, d_model, base, dtype=torch.float64)
    norms = pe.norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(d_model / 2)))
    assert pe.abs().max() <= 1.0
    # Position 0 is (0, 1, 0, 1, ...).
    torch.testing.assert_close(pe[0], torch.tensor([0.0, 1.0] * half, dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(seq_len=st.integers(0, 200), cut=st.integers(0, 200), half=st.integers(1, 16))
def test_prefix_of_longer_table(seq_len, cut, half):
    cut = min(cut, seq_len)
    long = sinusoidal_positions(seq_len, 2 * half)
    torch.testing.assert_close(sinusoidal_positions(cut, 2 * half), long[:cut], rtol=0, atol=0)


def test_device_and_dtype_are_honoured():
    pe = sinusoidal_positions(4, 6, device="meta", dtype=torch.float16)
    assert pe.device.type == "meta" and pe.dtype == torch.float16 and pe.shape == (4, 6)
    bf = sinusoidal_positions(4, 6, dtype=torch.bfloat16)
    torch.testing.assert_close(bf, loop_formula(4, 6).to(torch.bfloat16))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(seq_len=4, d_model=5), "d_model must be even"),
        (dict(seq_len=4, d_model=0), "d_model must be a positive integer"),
        (dict(seq_len=4, d_model=True), "d_model must be a positive integer"),
        (dict(seq_len=-1, d_model=4), "seq_len must be an integer >= 0"),
        (dict(seq_len=2.5, d_model=4), "seq_len must be an integer"),
        (dict(seq_len=4, d_model=4, base=0.0), "base must be a finite number > 0"),
        (dict(seq_len=4, d_model=4, base=-3.0), "base must be"),
        (dict(seq_len=4, d_model=4, base=float("inf")), "base must be"),
        (dict(seq_len=4, d_model=4, dtype=torch.int64), "dtype must be a floating-point"),
    ],
)
def test_sinusoidal_positions_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        sinusoidal_positions(**kwargs)


# --- PositionalEncoding ---------------------------------------------------------------------


def test_positional_encoding_adds_the_table():
    torch.manual_seed(0)
    enc = PositionalEncoding(d_model=16, dropout=0.1, max_len=40).eval()
    x = torch.randn(3, 25, 16)
    torch.testing.assert_close(enc(x), x + loop_formula(25, 16).float())
    assert enc.pe.shape == (40, 16)


def test_pe_buffer_is_not_persistent_but_moves_with_the_module():
    enc = PositionalEncoding(d_model=8, dropout=0.0, max_len=10)
    assert "pe" not in enc.state_dict()
    assert "pe" in dict(enc.named_buffers())
    enc = enc.double()
    assert enc.pe.dtype == torch.float64


@settings(max_examples=30, deadline=None)
@given(start=st.integers(0, 90), seq=st.integers(1, 30))
def test_start_offset_equals_slicing_a_longer_sequence(start, seq):
    # max_len=64 so that some examples are inside the table, some straddle it, some are past it.
    enc = PositionalEncoding(d_model=8, dropout=0.0, max_len=64)
    x = torch.randn(2, start + seq, 8, generator=torch.Generator().manual_seed(start * 31 + seq))
    full = enc(x)
    torch.testing.assert_close(enc(x[:, start:], start=start), full[:, start:])


def test_extension_past_max_len_equals_the_formula():
    enc = PositionalEncoding(d_model=12, dropout=0.0, max_len=20, base=500.0)
    zeros = torch.zeros(1, 75, 12)
    torch.testing.assert_close(
        enc(zeros)[0], sinusoidal_positions(75, 12, 500.0), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(enc(zeros)[0], loop_formula(75, 12, 500.0).float())
    # Decoding one token far past the table, at position 1000.
    one = enc(torch.zeros(1, 1, 12), start=1000)[0, 0]
    torch.testing.assert_close(one, sinusoidal_positions(1001, 12, 500.0)[1000])
    assert enc.pe.shape == (20, 12)  # the buffer itself is not grown


def test_start_accepts_integer_tensors():
    enc = PositionalEncoding(d_model=4, dropout=0.0, max_len=10)
    x = torch.randn(1, 2, 4)
    torch.testing.assert_close(enc(x, start=torch.tensor(3)), enc(x, start=3))


def test_dropout_only_in_training():
    torch.manual_seed(0)
    enc = PositionalEncoding(d_model=32, dropout=0.5, max_len=64)
    x = torch.randn(4, 64, 32)
    clean = x + sinusoidal_positions(64, 32)
    enc.eval()
    torch.testing.assert_close(enc(x), clean)
    enc.train()
    out = enc(x)
    dropped = out == 0
    assert 0.3 < dropped.float().mean() < 0.7
    torch.testing.assert_close(out[~dropped], 2 * clean[~dropped])  # inverted dropout: 1/(1-p)


def test_float64_input_keeps_dtype():
    enc = PositionalEncoding(d_model=8, dropout=0.0, max_len=10).double()
    x = torch.randn(2, 15, 8, dtype=torch.float64)  # also crosses max_len
    out = enc(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, x + loop_formula(15, 8), rtol=0, atol=1e-6)


def test_output_keeps_input_dtype_for_half_precision():
    enc = PositionalEncoding(d_model=8, dropout=0.0, max_len=10)
    x = torch.randn(2, 5, 8).to(torch.bfloat16)
    assert enc(x).dtype == torch.bfloat16


def test_gradient_flows_to_input():
    enc = PositionalEncoding(d_model=8, dropout=0.0, max_len=10)
    x = torch.randn(2, 5, 8, requires_grad=True)
    enc(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: PositionalEncoding(7, 0.1), "d_model must be even"),
        (lambda: PositionalEncoding(8, 1.0), "dropout must be a probability in"),
        (lambda: PositionalEncoding(8, -0.1), "dropout"),
        (lambda: PositionalEncoding(8, 0.1, max_len=0), "max_len must be a positive integer"),
        (lambda: PositionalEncoding(8, 0.1, base=0.0), "base must be"),
    ],
)
def test_positional_encoding_constructor_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("module_cls", [PositionalEncoding, LearnedPositionalEmbedding])
def test_forward_errors(module_cls):
    enc = module_cls(8, 0.0, max_len=10)
    with pytest.raises(ValueError, match=r"x's last dimension must be d_model=8"):
        enc(torch.randn(2, 3, 6))
    with pytest.raises(ValueError, match=r"start must be an integer position >= 0"):
        enc(torch.randn(2, 3, 8), start=-1)
    with pytest.raises(ValueError, match=r"start must be an integer"):
        enc(torch.randn(2, 3, 8), start=1.5)
    with pytest.raises(ValueError, match=r"x must be a floating-point tensor"):
        enc(torch.ones(2, 3, 8, dtype=torch.long))


# --- LearnedPositionalEmbedding -------------------------------------------------------------


def test_learned_adds_its_rows():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(d_model=8, dropout=0.0, max_len=12)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(emb(x), x + emb.embedding.weight[:5])
    torch.testing.assert_close(emb(x, start=7), x + emb.embedding.weight[7:12])
    assert emb.embedding.weight.shape == (12, 8)


def test_learned_start_offset_equals_slicing():
    emb = LearnedPositionalEmbedding(d_model=8, dropout=0.0, max_len=12)
    x = torch.randn(2, 12, 8)
    torch.testing.assert_close(emb(x[:, 4:9], start=4), emb(x)[:, 4:9])


def test_learned_cannot_extrapolate():
    emb = LearnedPositionalEmbedding(d_model=8, dropout=0.0, max_len=12)
    emb(torch.zeros(1, 12, 8))  # exactly max_len positions is fine
    with pytest.raises(ValueError, match=r"positions 0\.\.12 do not fit max_len=12"):
        emb(torch.zeros(1, 13, 8))
    with pytest.raises(ValueError, match=r"max_len=12"):
        emb(torch.zeros(1, 1, 8), start=12)


def test_learned_gets_gradients_only_for_used_rows():
    emb = LearnedPositionalEmbedding(d_model=4, dropout=0.0, max_len=10)
    emb(torch.zeros(1, 3, 4), start=2).sum().backward()
    grad = emb.embedding.weight.grad
    assert torch.all(grad[2:5] == 1) and torch.all(grad[:2] == 0) and torch.all(grad[5:] == 0)


def test_learned_dropout_only_in_training():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(d_model=16, dropout=0.5, max_len=64)
    x = torch.randn(4, 64, 16)
    emb.eval()
    clean = emb(x)
    torch.testing.assert_close(clean, x + emb.embedding.weight)
    emb.train()
    out = emb(x)
    dropped = out == 0
    assert 0.3 < dropped.float().mean() < 0.7
    torch.testing.assert_close(out[~dropped], 2 * clean[~dropped])


def test_learned_float64():
    emb = LearnedPositionalEmbedding(d_model=4, dropout=0.0, max_len=6).double()
    x = torch.randn(1, 6, 4, dtype=torch.float64)
    out = emb(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, x + emb.embedding.weight)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(d_model=8, dropout=0.1, max_len=0), "max_len must be a positive integer"),
        (dict(d_model=0, dropout=0.1, max_len=5), "d_model must be a positive integer"),
        (dict(d_model=8, dropout=1.5, max_len=5), "dropout must be a probability"),
    ],
)
def test_learned_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LearnedPositionalEmbedding(**kwargs)


@pytest.mark.parametrize("module_cls", [PositionalEncoding, LearnedPositionalEmbedding])
@pytest.mark.parametrize(
    "dropout,match",
    [
        (True, r"dropout must be a real number in \[0, 1\), got bool True"),
        (False, r"dropout must be a real number.*bool False"),
        (float("nan"), r"dropout must be a probability in \[0, 1\), got nan"),
        (1.0, r"dropout must be a probability in \[0, 1\), got 1.0"),
        (-0.1, r"dropout must be a probability in \[0, 1\), got -0.1"),
        ("0.1", r"dropout must be a real number.*str"),
    ],
)
def test_dropout_rate_checked_by_check_probability(module_cls, dropout, match):
    # chapter 1's check_probability: bool (even False), NaN, out of range and
    # non-numbers are rejected with the argument's name
    with pytest.raises(ValueError, match=match):
        module_cls(8, dropout, max_len=10)


@pytest.mark.parametrize("module_cls", [PositionalEncoding, LearnedPositionalEmbedding])
def test_integer_dropout_rate_becomes_a_float(module_cls):
    p = module_cls(8, 0, max_len=10).dropout.p
    assert p == 0.0 and isinstance(p, float)
