"""transformer_lib.modern (chapter 11.6): RMSNorm, SwiGLU and the Llama-style language model.

Independent references: PyTorch's ``F.rms_norm``; the SwiGLU formula written out with the
layers' weight matrices; the language model's own uncached forward pass (the cache must not
change what it computes).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.attention_variants import RotaryAttention
from transformer_lib.layers import LayerNorm, PositionwiseFeedForward
from transformer_lib.lm import TransformerLM, generate
from transformer_lib.modern import RMSNorm, SwiGLU, make_modern_lm


@pytest.mark.parametrize("shape", [(5,), (2, 7, 16), (3, 1, 4, 8)])
def test_rms_norm_matches_pytorch(shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = 3 * torch.randn(*shape, generator=g, dtype=torch.float64) + 1
    norm = RMSNorm(shape[-1], eps=1e-5).double()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(shape[-1], generator=g, dtype=torch.float64) + 0.5)
    want = F.rms_norm(x, (shape[-1],), norm.weight, eps=1e-5)
    torch.testing.assert_close(norm(x), want)
    # unlike layer norm, the mean is kept: a constant vector keeps its sign
    ones = RMSNorm(4).double()(torch.full((4,), -2.0, dtype=torch.float64))
    torch.testing.assert_close(ones, torch.full((4,), -1.0, dtype=torch.float64), atol=1e-6,
                               rtol=0)


def test_rms_norm_gradients():
    norm = RMSNorm(6).double()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))


def test_rms_norm_rejects_bad_input():
    with pytest.raises(ValueError, match="features"):
        RMSNorm(0)
    with pytest.raises(ValueError, match="eps must be positive"):
        RMSNorm(4, eps=0.0)
    with pytest.raises(ValueError, match="x must have 4 features"):
        RMSNorm(4)(torch.ones(2, 5))
    # a last dimension of 1 would broadcast against the gain silently
    with pytest.raises(ValueError, match="x must have 4 features"):
        RMSNorm(4)(torch.ones(2, 1))
    with pytest.raises(ValueError, match="eps must be positive, got nan"):
        RMSNorm(4, eps=float("nan"))


def test_swiglu_is_the_gated_formula_without_biases():
    torch.manual_seed(0)
    ffn = SwiGLU(8, 12, dropout=0.0).double().eval()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    w1, w2, w3 = ffn.w_1.weight, ffn.w_2.weight, ffn.w_3.weight  # (out, in)
    gate = x @ w1.T
    want = (gate * torch.sigmoid(gate) * (x @ w3.T)) @ w2.T
    torch.testing.assert_close(ffn(x), want)
    assert all(m.bias is None for m in (ffn.w_1, ffn.w_2, ffn.w_3))
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 8 * 12


def test_swiglu_at_two_thirds_width_has_the_relu_blocks_size():
    relu = sum(p.numel() for p in PositionwiseFeedForward(128, 512).parameters())
    gated = sum(p.numel() for p in SwiGLU(128, 344).parameters())
    assert abs(gated - relu) / relu < 0.01


def test_swiglu_dropout_only_in_training():
    ffn = SwiGLU(8, 16, dropout=0.5)
    x = torch.randn(4, 8)
    ffn.eval()
    torch.testing.assert_close(ffn(x), ffn(x))
    with pytest.raises(ValueError, match="dropout"):
        SwiGLU(8, 16, dropout=1.5)
    with pytest.raises(ValueError, match="d_ff"):
        SwiGLU(8, 0)


def test_modern_lm_has_todays_parts_and_no_biases():
    model = make_modern_lm(50, N=3, d_model=32, d_ff=88, h=4, kv_heads=2, dropout=0.0)
    kinds = [type(m) for m in model.modules()]
    assert kinds.count(RMSNorm) == 2 * 3 + 1  # two per block and the final one
    assert kinds.count(SwiGLU) == 3 and kinds.count(RotaryAttention) == 3
    assert LayerNorm not in kinds and PositionwiseFeedForward not in kinds
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear))
    assert all(m.kv_heads == 2 for m in model.modules() if isinstance(m, RotaryAttention))
    classic = TransformerLM(50, N=3, d_model=32, d_ff=128, h=4, dropout=0.0)
    assert sum(p.numel() for p in model.parameters()) < sum(
        p.numel() for p in classic.parameters())


def test_modern_lm_is_causal_and_its_cache_changes_nothing():
    torch.manual_seed(0)
    model = make_modern_lm(40, N=2, d_model=32, d_ff=88, h=4, kv_heads=1, dropout=0.0).eval()
    x = torch.randint(3, 40, (2, 9))
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % 40
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :6], model(y)[:, :6])  # future unseen
        assert not torch.allclose(model(x)[:, 6:], model(y)[:, 6:])
    prompt = torch.randint(3, 40, (3, 4))
    cached = generate(model, prompt, 12, use_cache=True)
    uncached = generate(model, prompt, 12, use_cache=False)
    assert torch.equal(cached, uncached)


def test_modern_lm_trains_every_parameter():
    torch.manual_seed(0)
    model = make_modern_lm(30, N=2, d_model=16, d_ff=40, h=4, kv_heads=2, dropout=0.1)
    x = torch.randint(3, 30, (4, 10))
    logp = model.generator(model(x[:, :-1]))
    F.nll_loss(logp.flatten(0, 1), x[:, 1:].flatten()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_modern_lm_rejects_bad_heads():
    with pytest.raises(ValueError, match="kv_heads must divide h"):
        make_modern_lm(30, d_model=32, h=4, kv_heads=3)
    with pytest.raises(ValueError, match="d_ff"):
        make_modern_lm(30, d_ff=0)
