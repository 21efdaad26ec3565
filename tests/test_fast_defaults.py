"""The fastest-measured defaults against their references (issue 53).

* ``MultiHeadedAttention`` attends with chapter 1's explicit ``attention`` when training with
  dropout on the weights on a CPU in bf16 (autocast), and with
  ``F.scaled_dot_product_attention`` otherwise: the rule's path must compute what the fused
  kernel computes (the same function without dropout; with dropout, the same output and
  gradients for the same random draws, exactly in fp32 with the branch forced, up to bf16
  rounding under autocast).
* The trainer builds Adam with ``fused=True``: after a few steps the parameters must match
  PyTorch's plain (for-loop) Adam.
"""

import copy

import pytest
import torch
from torch import nn

from transformer_lib import multihead
from transformer_lib.masks import subsequent_mask
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.translation import Config
from transformer_lib.translation.loop import make_optimizer


def _layer(p: float, seed: int = 0) -> MultiHeadedAttention:
    torch.manual_seed(seed)
    layer = MultiHeadedAttention(4, 32, dropout=p)
    with torch.no_grad():
        for w in layer.parameters():
            w.normal_(0, 0.3)  # non-zero biases too
    return layer


def _masks() -> dict[str, torch.Tensor | None]:
    pad = torch.ones(2, 1, 6, dtype=torch.bool)
    pad[1, :, 4:] = False  # the second sequence has 4 real tokens
    both = pad & pad.transpose(1, 2)  # its padded queries see no key at all
    return {"none": None, "padding": pad, "causal": subsequent_mask(6), "fully_masked": both}


def _run(layer: MultiHeadedAttention, x: torch.Tensor, mask, seed: int):
    """Output and the gradients of input and every parameter, dropout drawn from ``seed``."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_(True)
    torch.manual_seed(seed)
    out = layer(x, x, x, mask)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad, [w.grad for w in layer.parameters()]


def test_the_rule_picks_the_explicit_path_only_to_train_with_dropout_on_a_cpu_in_bf16():
    x = torch.randn(2, 6, 32, dtype=torch.bfloat16)
    layer = _layer(0.1)
    layer.train()
    assert layer._explicit_is_faster(x)
    assert layer._explicit_is_faster(x.half())
    assert not layer._explicit_is_faster(x.float())  # fp32: the fused kernel
    layer.always_fused = True
    assert not layer._explicit_is_faster(x)  # the benchmark's knob
    layer.always_fused = False
    layer.eval()
    assert not layer._explicit_is_faster(x)  # evaluation: the fused kernel
    assert not _layer(0.0).train()._explicit_is_faster(x)  # no dropout: the fused kernel
    assert not layer.train()._explicit_is_faster(x.to("meta"))  # another device


def test_training_under_bf16_autocast_takes_the_explicit_path(monkeypatch):
    layer, x = _layer(0.1).train(), torch.randn(2, 6, 32)

    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel was called")

    monkeypatch.setattr(multihead, "_fast_attention", refuse)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x, x, x, subsequent_mask(6))
    assert layer.attn is None  # not kept unless store_attention is set
    with pytest.raises(AssertionError, match="fused kernel"):
        layer(x, x, x, subsequent_mask(6))  # fp32: the fused kernel


@pytest.mark.parametrize("mask_name", list(_masks()))
def test_the_rule_s_path_equals_the_fused_kernel_for_the_same_draws(mask_name, monkeypatch):
    """PyTorch's math kernel draws its dropout mask as ``nn.Dropout`` does, so the same seed
    gives the same weights dropped: output and gradients agree (in fp32, the branch forced)."""
    mask, x = _masks()[mask_name], torch.randn(2, 6, 32)
    layer = _layer(0.3).train()
    monkeypatch.setattr(layer, "_explicit_is_faster", lambda q: not layer.always_fused)
    explicit = _run(layer, x, mask, seed=5)
    assert layer.attn is None  # not kept unless store_attention is set
    layer.always_fused = True
    fused = _run(layer, x, mask, seed=5)
    torch.testing.assert_close(explicit, fused)
    layer.eval()  # and dropout did act: without it the output differs
    assert not torch.allclose(layer(x, x, x, mask), explicit[0])


def test_the_rule_s_path_equals_chapter_1_attention_with_a_fixed_dropout_mask(monkeypatch):
    """With a fixed mask on the weights (an independent reference, not PyTorch's sampler)."""
    layer, x = _layer(0.5).train(), torch.randn(2, 6, 32)
    monkeypatch.setattr(layer, "_explicit_is_faster", lambda q: True)
    keep = torch.rand(2, 4, 6, 6, generator=torch.Generator().manual_seed(3)) >= 0.5

    class FixedDropout(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return torch.where(keep, w * 2.0, 0.0)

    layer.dropout = FixedDropout()
    layer.dropout.p = 0.5  # the rule reads p
    out = layer(x, x, x, subsequent_mask(6))
    q, k, v = (layer._split(t) for t in layer._project(x, slice(None)).chunk(3, dim=-1))
    # by hand: scores, -inf above the diagonal, softmax, the fixed mask, the values
    scores = (q @ k.transpose(-2, -1) / 8**0.5).masked_fill(~subsequent_mask(6), float("-inf"))
    heads = torch.where(keep, scores.softmax(-1) * 2.0, 0.0) @ v
    torch.testing.assert_close(out, layer.out_proj(layer._merge(heads)))


@pytest.mark.parametrize("mask_name", list(_masks()))
def test_evaluation_default_is_the_fused_kernel_and_equals_the_explicit_path(mask_name):
    mask, x = _masks()[mask_name], torch.randn(2, 6, 32)
    layer = _layer(0.3).eval()
    fast = layer(x, x, x, mask)
    layer.store_attention = True
    torch.testing.assert_close(fast, layer(x, x, x, mask))


def test_bf16_autocast_training_default_is_close_to_the_fused_kernel():
    mask, x = subsequent_mask(6), torch.randn(2, 6, 32)
    layer = _layer(0.3).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explicit = _run(layer, x, mask, seed=2)
        layer.always_fused = True
        fused = _run(layer, x, mask, seed=2)
    torch.testing.assert_close(explicit, fused, atol=0.1, rtol=0.05)  # bf16 rounding


@pytest.mark.parametrize("decoupled", [False, True])
def test_trainer_fused_adam_equals_plain_adam(decoupled):
    """The trainer's optimizer (fused=True on a CPU) against PyTorch's for-loop Adam."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.LayerNorm(16), nn.Linear(16, 4))
    plain_model = copy.deepcopy(model)
    cfg = Config(weight_decay=0.01, decoupled_weight_decay=decoupled)
    fused = make_optimizer(cfg, model, torch.device("cpu"))
    assert all(g.get("fused") for g in fused.param_groups)
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "fused": None,
            "foreach": False,
            "params": [
                dict(plain_model.named_parameters())[n]
                for n, p in model.named_parameters()
                if any(p is q for q in g["params"])
            ],
        }
        for g in fused.param_groups
    ]
    plain = kind(groups)
    for step in range(5):
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(step))
        for m, opt in ((model, fused), (plain_model, plain)):
            for g in opt.param_groups:
                g["lr"] = 1e-2  # the schedule sets it every step; any value does here
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.step()
    for a, b in zip(model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_benchmark_variant_of_the_fused_kernel_makes_the_default_step_s_update():
    """The benchmark's evidence for the rule (``*_fused_attention``) times the same training
    step as the default: same seed, same loss and parameters after one step."""
    from bench import train_models as tm
    from bench import train_steps as ts

    batch = tm.random_batches(tm.CONFIGS["tiny"], torch.device("cpu"))[0]
    losses, params = [], []
    for name in ("ours_fp32", "ours_fp32_fused_attention"):
        model, step = ts.build_variant(name, tm.CONFIGS["tiny"], torch.device("cpu"))
        fused = [m.always_fused for m in model.modules() if isinstance(m, MultiHeadedAttention)]
        assert fused == [name.endswith("fused_attention")] * 3  # N = 1: three attention layers
        torch.manual_seed(1)
        losses.append(step(batch))
        params.append([p.detach().clone() for p in model.parameters()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    torch.testing.assert_close(params[0], params[1])
