"""Chapter 6's fused loss computes what the generator and ``LabelSmoothing`` compute.

On a CPU in fp32 the training step scores a batch by ``LabelSmoothing.with_generator``
(``transformer_lib.fused_loss.generator_kl``): the generator's product, the log-softmax and the
smoothed KL 256 rows at a time, gradients made in the forward pass. It must give the plain
route's loss and every gradient, check its input as the plain route does, and be taken only
where it applies (our generator and criterion, fp32, a CPU, gradients wanted).
"""

from __future__ import annotations

import pytest
import torch
from _lessons import PlainRoute
from torch import nn

from transformer_lib import fused_loss, make_model
from transformer_lib.layers import Generator
from transformer_lib.training import Batch, LabelSmoothing, real_token_loss, train_step


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk", [7, 256])
@pytest.mark.parametrize("pad", [0, 3, 39])
def test_generator_kl_equals_generator_and_label_smoothing(monkeypatch, smoothing, chunk, pad):
    monkeypatch.setattr(fused_loss, "CHUNK", chunk)  # several chunks, a short last one
    torch.manual_seed(0)
    gen = Generator(16, 40).double()
    ls = LabelSmoothing(40, pad, smoothing)
    h = torch.randn(50, 16, dtype=torch.double, requires_grad=True)
    target = torch.randint(0, 40, (50,))
    target[::9] = pad  # rows that count 0
    want = ls(gen(h), target)
    want.backward(torch.tensor(0.7, dtype=torch.double))
    grads = [h.grad, gen.proj.weight.grad, gen.proj.bias.grad]
    for p in (h, gen.proj.weight, gen.proj.bias):
        p.grad = None
    got = ls.with_generator(h, gen.proj, target)
    got.backward(torch.tensor(0.7, dtype=torch.double))
    torch.testing.assert_close(got, want)
    for a, b in zip([h.grad, gen.proj.weight.grad, gen.proj.bias.grad], grads):
        torch.testing.assert_close(a, b)
    assert torch.equal(ls.true_dist, ls.target_distribution(target, torch.double))


def test_generator_kl_with_large_logits_stays_finite():
    """The log-softmax goes through logsumexp: logits of ±1,000 give a finite loss, equal to
    the plain route's."""
    torch.manual_seed(0)
    gen = Generator(8, 30)
    with torch.no_grad():
        gen.proj.weight.mul_(500)
    ls = LabelSmoothing(30, 0, 0.1)
    h = torch.randn(20, 8, requires_grad=True)
    target = torch.randint(1, 30, (20,))
    got = ls.with_generator(h, gen.proj, target)
    assert torch.isfinite(got)
    torch.testing.assert_close(got, ls(gen(h), target), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize(
    "target, match",
    [
        (torch.tensor([1, 2, 40]), r"target ids must be in \[0, size=40\)"),
        (torch.tensor([1.0, 2.0, 3.0]), r"target must hold integer class ids"),
        (torch.tensor([1, 2]), r"target must have shape \(N,\) = \(3,\)"),
    ],
)
def test_with_generator_checks_its_input_as_the_plain_route(target, match):
    ls = LabelSmoothing(40, 0, 0.1)
    with pytest.raises(ValueError, match=match):
        ls.with_generator(torch.randn(3, 16), Generator(16, 40).proj, target)
    with pytest.raises(ValueError, match=r"x must be \(N, size=40\)"):
        ls.with_generator(torch.randn(3, 16), Generator(16, 41).proj, torch.tensor([1, 2, 3]))


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = make_model(30, 30, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    src = torch.randint(1, 30, (3, 6))
    tgt = torch.randint(1, 30, (3, 300))  # over 256 real targets: two chunks
    tgt[0, 250:] = 0  # padding
    return model, Batch(src, tgt, pad=0), LabelSmoothing(30, 0, 0.1)


def test_real_token_loss_takes_the_fused_route_only_where_it_applies(monkeypatch):
    calls = []
    real = fused_loss.generator_kl
    monkeypatch.setattr(
        "transformer_lib.training.generator_kl",
        lambda *a: calls.append(1) or real(*a),
    )
    model, batch, ls = _setup()
    real_token_loss(model, batch, ls)
    assert len(calls) == 1  # fp32, a CPU, gradients: fused
    real_token_loss(model, batch, PlainRoute(30, 0, 0.1))  # not LabelSmoothing itself
    with torch.no_grad():  # evaluation: no gradients to make
        real_token_loss(model, batch, ls)
    real_token_loss(model, batch, ls, precision="bf16")  # autocast
    model.generator = nn.Sequential(model.generator.proj, nn.LogSoftmax(-1))  # not ours
    real_token_loss(model, batch, ls)
    assert len(calls) == 1


def test_train_step_fused_and_plain_give_the_same_update():
    """One step (SGD, clipping) on each route from the same weights: the same loss and,
    up to rounding, the same weights."""
    results = []
    for criterion in (LabelSmoothing, PlainRoute):
        model, batch, _ = _setup()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # linear in the gradients
        loss, n = train_step(model, [batch], criterion(30, 0, 0.1), opt, clip_norm=1.0)
        results.append((loss, n, [p.detach().clone() for p in model.parameters()]))
    (loss_a, n_a, params_a), (loss_b, n_b, params_b) = results
    assert n_a == n_b == batch.ntokens
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for a, b in zip(params_a, params_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
