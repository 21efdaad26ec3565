"""Tests for transformer_lib.training (chapter 6): batches, schedule, label smoothing, loop."""

from __future__ import annotations

import configparser
import copy
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from transformer_lib.masks import subsequent_mask
from transformer_lib.model import make_model
from transformer_lib.training import (
    Batch,
    LabelSmoothing,
    SimpleLossCompute,
    TrainState,
    copy_task_batches,
    rate,
    real_token_loss,
    run_epoch,
    train_step,
)

SANITIZE_CFG = Path(__file__).with_name("nbval_sanitize.cfg")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The models here are tiny: one thread is faster, and immune to a busy CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(vocab: int = 11, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return make_model(vocab, vocab, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def ragged_tokens(seed: int = 0, batch: int = 8, length: int = 7, vocab: int = 11):
    """(batch, length) ids with start symbol 1 and rows of different lengths padded with 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, vocab, (batch, length), generator=g)
    x[:, 0] = 1
    for i in range(batch):
        x[i, 2 + (i * 3) % (length - 2) :] = 0
    return x


# ----------------------------------------------------------------------------------- Batch
def test_batch_shapes_shift_and_masks():
    src = torch.tensor([[5, 6, 7, 0], [5, 0, 0, 0]])
    tgt = torch.tensor([[1, 4, 5, 6, 3], [1, 7, 3, 0, 0]])
    b = Batch(src, tgt, pad=0)
    assert b.src_mask.shape == (2, 1, 4) and b.src_mask.dtype == torch.bool
    assert b.src_mask[:, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert torch.equal(b.tgt, tgt[:, :-1]) and torch.equal(b.tgt_y, tgt[:, 1:])
    assert b.tgt_mask.shape == (2, 4, 4) and b.tgt_mask.dtype == torch.bool
    assert b.ntokens == 4 + 2 and isinstance(b.ntokens, int)
    # Row 1: keys 3 (pad) hidden from everyone; key j hidden from queries i < j.
    expected = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]], dtype=torch.bool
    )
    assert torch.equal(b.tgt_mask[1], expected)


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 4),
    src_len=st.integers(1, 6),
    tgt_len=st.integers(2, 7),
    pad=st.integers(0, 3),
    seed=st.integers(0, 10_000),
)
def test_batch_masks_property(batch, src_len, tgt_len, pad, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 5, (batch, src_len), generator=g)
    tgt = torch.randint(0, 5, (batch, tgt_len), generator=g)
    b = Batch(src, tgt, pad=pad)
    assert torch.equal(b.src_mask, (src != pad)[:, None, :])
    causal = subsequent_mask(tgt_len - 1)  # (1, T-1, T-1)
    reference = causal & (tgt[:, :-1] != pad)[:, None, :]
    assert torch.equal(b.tgt_mask, reference)
    for i in range(tgt_len - 1):  # explicit: key j visible to query i iff j <= i and not pad
        for j in range(tgt_len - 1):
            assert torch.equal(b.tgt_mask[:, i, j], (j <= i) & (tgt[:, j] != pad))
    assert b.ntokens == int((tgt[:, 1:] != pad).sum())


def test_batch_without_target_and_to_device():
    src = torch.tensor([[1, 2, 2]])
    b = Batch(src, pad=2)
    assert b.tgt is None and b.tgt_y is None and b.tgt_mask is None and b.ntokens == 0
    assert b.src_mask.tolist() == [[[True, False, False]]]
    full = Batch(src, torch.tensor([[1, 3, 2]]), pad=2)
    moved = full.to("meta")  # a device with no data: proves every tensor is moved
    for name in ("src", "src_mask", "tgt", "tgt_y", "tgt_mask"):
        assert getattr(moved, name).device.type == "meta", name
        assert getattr(full, name).device.type == "cpu", name  # the original is untouched
    assert moved.ntokens == full.ntokens == 1 and moved.pad == 2


@pytest.mark.parametrize(
    ("src", "tgt", "match"),
    [
        (torch.rand(2, 3), None, r"src must hold integer token ids"),
        (torch.ones(2, 3, dtype=torch.bool), None, r"src must hold integer token ids"),
        (torch.ones(3, dtype=torch.long), None, r"src must have shape \(batch, len\)"),
        ([[1, 2]], None, r"src must be a torch.Tensor"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(3, 4, dtype=torch.long), r"same batch"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 1, dtype=torch.long), r"length >= 2"),
        (torch.ones(2, 3, dtype=torch.long), torch.rand(2, 4), r"tgt must hold integer token ids"),
        (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 2, 2, dtype=torch.long), r"tgt must"),
    ],
)
def test_batch_errors(src, tgt, match):
    with pytest.raises(ValueError, match=match):
        Batch(src, tgt, pad=0)


# ------------------------------------------------------------------------------------ rate
def test_rate_paper_values_and_peak():
    peak = (512 * 4000) ** -0.5
    assert rate(4000, 512, 1.0, 4000) == pytest.approx(peak, rel=1e-12)
    assert peak == pytest.approx(6.988e-4, rel=1e-3)
    assert (
        rate(0, 512, 1.0, 4000) == rate(1, 512, 1.0, 4000) == pytest.approx(512**-0.5 * 4000**-1.5)
    )
    assert rate(16000, 512, 1.0, 4000) == pytest.approx(peak / 2)  # 1/sqrt decay
    assert rate(100, 512, 2.0, 4000) == pytest.approx(2 * rate(100, 512, 1.0, 4000))
    values = [rate(s, 512, 1.0, 4000) for s in range(1, 12001)]
    assert values.index(max(values)) + 1 == 4000


@settings(max_examples=50, deadline=None)
@given(d_model=st.integers(1, 2048), warmup=st.integers(1, 500), factor=st.floats(0.01, 10))
def test_rate_rises_then_falls(d_model, warmup, factor):
    r = [rate(s, d_model, factor, warmup) for s in range(1, 3 * warmup + 2)]
    assert all(a < b for a, b in zip(r[: warmup - 1], r[1:warmup]))  # linear warm-up
    assert all(a > b for a, b in zip(r[warmup - 1 :], r[warmup:]))  # decay after the peak
    assert max(r) == pytest.approx(factor * (d_model * warmup) ** -0.5, rel=1e-9)
    assert r[1] == pytest.approx(2 * r[0]) if warmup > 2 else True


def test_rate_with_lambda_lr():
    p = nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = LambdaLR(opt, lambda s: rate(s, 64, 0.5, 10))
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    assert lrs == pytest.approx([rate(s, 64, 0.5, 10) for s in range(30)])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup": 0}, r"warmup must be >= 1"),
        ({"model_size": 0}, r"model_size"),
        ({"step": -1}, r"step must be >= 0"),
        ({"factor": -1.0}, r"factor must be >= 0"),
    ],
)
def test_rate_errors(kwargs, match):
    args = {"step": 1, "model_size": 512, "factor": 1.0, "warmup": 4000} | kwargs
    with pytest.raises(ValueError, match=match):
        rate(**args)


# -------------------------------------------------------------------------- LabelSmoothing
def kl_double_loop(x: torch.Tensor, target: torch.Tensor, pad: int, eps: float) -> float:
    """sum_i sum_c p log(p / q) written out, in float64, from the definition."""
    n, v = x.shape
    total = 0.0
    for i in range(n):
        if int(target[i]) == pad:
            continue
        for c in range(v):
            if c == pad:
                continue
            p = 1 - eps if c == int(target[i]) else eps / (v - 2)
            if p > 0:
                total += p * (math.log(p) - float(x[i, c]))
    return total


def cross_entropy_reference(x: torch.Tensor, target: torch.Tensor, pad: int, eps: float):
    """Our loss from F.cross_entropy's label smoothing (see chapter 6 for the derivation)."""
    v = x.size(1)
    keep = torch.arange(v) != pad
    tgt = torch.where(target == pad, -100, target - (target > pad).long())
    eps_torch = eps * (v - 1) / (v - 2) if v > 2 else 0.0
    rows = F.cross_entropy(x[:, keep], tgt, label_smoothing=eps_torch, reduction="none")
    real = target != pad
    entropy = -(1 - eps) * math.log(1 - eps) - (eps * math.log(eps / (v - 2)) if eps else 0.0)
    # int(): an int64 tensor times a Python float is float32, which would cost 9 digits here.
    return (rows - torch.log1p(-x[:, pad].exp()))[real].sum() - int(real.sum()) * entropy


@settings(max_examples=60, deadline=None)
@given(
    v=st.integers(3, 12),
    n=st.integers(1, 10),
    eps=st.sampled_from([0.0, 0.05, 0.1, 0.3, 0.6]),
    pad_pos=st.integers(0, 11),
    seed=st.integers(0, 10_000),
)
def test_label_smoothing_matches_references(v, n, eps, pad_pos, seed):
    pad = pad_pos % v
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, v, generator=g, dtype=torch.float64).log_softmax(-1)
    target = torch.randint(0, v, (n,), generator=g)
    loss = LabelSmoothing(v, pad, eps)(x, target)
    ref = torch.tensor(kl_double_loop(x, target, pad, eps), dtype=torch.float64)
    torch.testing.assert_close(loss, ref)
    if eps * (v - 1) / (v - 2) <= 1:  # PyTorch accepts label_smoothing in [0, 1] only
        torch.testing.assert_close(loss, cross_entropy_reference(x, target, pad, eps))


def test_label_smoothing_true_dist_and_gradient():
    v, pad, eps = 6, 0, 0.2
    target = torch.tensor([2, 0, 5, 1])
    x = torch.randn(4, v).log_softmax(-1).requires_grad_(True)
    crit = LabelSmoothing(v, pad, eps)
    crit(x, target).backward()
    p = crit.true_dist
    expected = torch.tensor(
        [
            [0, 0.05, 0.8, 0.05, 0.05, 0.05],
            [0, 0, 0, 0, 0, 0],
            [0, 0.05, 0.05, 0.05, 0.05, 0.8],
            [0, 0.8, 0.05, 0.05, 0.05, 0.05],
        ]
    )
    torch.testing.assert_close(p, expected)
    # d/dx of sum p (log p - x) with x a free input is -p: zero on padding rows and column.
    torch.testing.assert_close(x.grad, -expected)


def test_label_smoothing_zero_smoothing_is_nll():
    x = torch.randn(9, 8).log_softmax(-1)
    target = torch.tensor([1, 2, 3, 0, 7, 0, 5, 6, 4])
    loss = LabelSmoothing(8, 0, 0.0)(x, target)
    torch.testing.assert_close(loss, F.nll_loss(x, target, ignore_index=0, reduction="sum"))
    logits = torch.randn(9, 8)
    torch.testing.assert_close(
        LabelSmoothing(8, 0)(logits.log_softmax(-1), target),
        F.cross_entropy(logits, target, ignore_index=0, reduction="sum"),
    )


def test_label_smoothing_no_padding_targets():
    x = torch.randn(5, 7, dtype=torch.float64).log_softmax(-1)
    target = torch.tensor([1, 2, 3, 4, 6])  # pad = 0 never occurs
    crit = LabelSmoothing(7, 0, 0.1)
    loss = crit(x, target)
    assert (crit.true_dist.sum(-1) - 1).abs().max() < 1e-12  # every row is a distribution
    torch.testing.assert_close(
        loss, torch.tensor(kl_double_loop(x, target, 0, 0.1), dtype=torch.float64)
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothing_all_padding(eps):
    x = torch.randn(4, 6).log_softmax(-1).requires_grad_(True)
    crit = LabelSmoothing(6, 3, eps)
    loss = crit(x, torch.full((4,), 3))
    loss.backward()
    assert loss.item() == 0.0 and not torch.isnan(loss)
    assert torch.equal(x.grad, torch.zeros_like(x))
    assert torch.equal(crit.true_dist, torch.zeros(4, 6))
    empty = crit(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long))  # no rows at all
    assert empty.item() == 0.0


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothing_exact_zeros(eps):
    # q = 0 exactly on padding (and, for eps = 0, on a wrong class): log q = -inf there.
    q = torch.tensor([[0.0, 0.7, 0.2, 0.1], [0.0, 0.0, 0.5, 0.5]], dtype=torch.float64)
    x = q.log().requires_grad_(True)
    target = torch.tensor([1, 3])
    if eps > 0:  # with smoothing, q = 0 on a real class gives an infinite (not NaN) KL
        x = q[:1].log().requires_grad_(True)
        target = target[:1]
    loss = LabelSmoothing(4, 0, eps)(x, target)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    torch.testing.assert_close(
        loss, torch.tensor(kl_double_loop(x.detach(), target, 0, eps), dtype=torch.float64)
    )
    # nn.KLDivLoss (the Annotated Transformer's criterion) gives NaN on the same input.
    assert torch.isnan(F.kl_div(x.detach(), F.one_hot(target, 4).double(), reduction="sum"))
    inf_loss = LabelSmoothing(4, 0, 0.1)(q[1:].log(), torch.tensor([3]))
    assert inf_loss.item() == math.inf  # target mass on a class the model rules out


def kl_by_definition(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Summed KL(p || exp(x)) built from the dense (N, V) target, 0 * log 0 := 0 (chapter 6)."""
    return (torch.xlogy(p, p) - p * x.masked_fill(p == 0, 0.0)).sum()


@settings(max_examples=80, deadline=None)
@given(
    v=st.integers(3, 9),
    n=st.integers(1, 8),
    eps=st.sampled_from([0.0, 0.1, 0.5]),
    pad_pos=st.integers(0, 8),
    zeros=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 8)), max_size=6),
    seed=st.integers(0, 10_000),
)
def test_label_smoothing_closed_form_equals_definition(v, n, eps, pad_pos, zeros, seed):
    # The module never builds the (N, V) target; its value and gradient must still be those of
    # the definition, also with exact zeros (log q = -inf) anywhere, the target included.
    pad = pad_pos % v
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(n, v, generator=g, dtype=torch.float64) + 0.01
    for i, c in zeros:
        q[i % n, c % v] = 0.0
    x = (q / q.sum(-1, keepdim=True)).log().requires_grad_(True)
    target = torch.randint(0, v, (n,), generator=g)
    crit = LabelSmoothing(v, pad, eps)
    loss = crit(x, target)
    x_ref = x.detach().clone().requires_grad_(True)
    ref = kl_by_definition(x_ref, crit.true_dist)
    assert not torch.isnan(loss)
    if torch.isinf(ref):
        assert loss.item() == math.inf
    else:
        torch.testing.assert_close(loss, ref)
    (3 * loss).backward()  # an incoming gradient other than 1
    (3 * ref).backward()
    # -p everywhere (also where log q = -inf), 0 on padding rows/column
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothing_gradcheck(eps):
    """The hand-written backward against finite differences (float64)."""
    torch.manual_seed(0)
    x = torch.randn(5, 6, dtype=torch.float64).log_softmax(-1).requires_grad_(True)
    target = torch.tensor([1, 0, 5, 2, 0])  # two padding rows
    crit = LabelSmoothing(6, 0, eps)
    assert torch.autograd.gradcheck(lambda t: crit(t, target), (x,))


def test_label_smoothing_gradient_keeps_the_input_dtype():
    x = torch.randn(3, 5).log_softmax(-1).bfloat16().requires_grad_(True)
    LabelSmoothing(5, 0, 0.1)(x, torch.tensor([1, 2, 0])).backward()
    assert x.grad.dtype == torch.bfloat16


def test_label_smoothing_size_two_without_smoothing():
    x = torch.tensor([[math.log(0.25), math.log(0.75)]])
    assert LabelSmoothing(2, 0, 0.0)(x, torch.tensor([1])).item() == pytest.approx(-math.log(0.75))


@pytest.mark.parametrize(
    ("ctor", "match"),
    [
        ({"smoothing": -0.1}, r"smoothing must be in \[0, 1\)"),
        ({"smoothing": 1.0}, r"smoothing must be in \[0, 1\)"),
        ({"size": 2, "smoothing": 0.1}, r"size must be >= 2, and >= 3 when smoothing > 0"),
        ({"size": 1}, r"size must be >= 2"),
        ({"padding_idx": 5}, r"padding_idx must be in \[0, size=5\)"),
        ({"padding_idx": -1}, r"padding_idx"),
    ],
)
def test_label_smoothing_constructor_errors(ctor, match):
    args = {"size": 5, "padding_idx": 0, "smoothing": 0.1} | ctor
    with pytest.raises(ValueError, match=match):
        LabelSmoothing(**args)


@pytest.mark.parametrize(
    ("x", "target", "match"),
    [
        (torch.zeros(3, 4), torch.tensor([1, 2, 3]), r"x must be \(N, size=5\)"),
        (torch.zeros(3), torch.tensor([1, 2, 3]), r"x must be \(N, size=5\)"),
        (torch.zeros(3, 5), torch.tensor([1, 2]), r"target must have shape \(N,\) = \(3,\)"),
        (torch.zeros(3, 5), torch.tensor([[1, 2, 3]]), r"target must have shape"),
        (torch.zeros(3, 5), torch.tensor([1.0, 2.0, 3.0]), r"integer class ids"),
        (torch.zeros(3, 5), torch.tensor([1, 5, 2]), r"target ids must be in \[0, size=5\)"),
        (torch.zeros(3, 5), torch.tensor([1, -1, 2]), r"target ids must be in"),
    ],
)
def test_label_smoothing_forward_errors(x, target, match):
    with pytest.raises(ValueError, match=match):
        LabelSmoothing(5, 0, 0.1)(x, target)


# ----------------------------------------------------------------------- SimpleLossCompute
def test_simple_loss_compute():
    model = tiny_model()
    crit = LabelSmoothing(11, 0, 0.1)
    b = Batch(ragged_tokens(), ragged_tokens(), pad=0)
    out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)
    summed, node = SimpleLossCompute(model.generator, crit)(out, b.tgt_y, b.ntokens)
    logp = model.generator(out)
    ref = crit(logp.reshape(-1, 11), b.tgt_y.reshape(-1))
    torch.testing.assert_close(summed, ref)
    torch.testing.assert_close(node, ref / b.ntokens)
    assert not summed.requires_grad and node.requires_grad
    # An all-padding batch: norm 0 gives loss 0, not NaN.
    zero, node0 = SimpleLossCompute(model.generator, crit)(out, torch.zeros_like(b.tgt_y), 0)
    assert zero.item() == 0.0 and node0.item() == 0.0
    with pytest.raises(ValueError, match=r"norm must be >= 0"):
        SimpleLossCompute(model.generator, crit)(out, b.tgt_y, -1)


# ------------------------------------------------------------------------------ run_epoch
def one_step(model, batches, accum=1, lr=0.5, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    crit = LabelSmoothing(11, 0, 0.1)
    return run_epoch(
        batches,
        model,
        SimpleLossCompute(model.generator, crit),
        opt,
        accum=accum,
        progress=False,
        **kw,
    )


def test_gradient_accumulation_equals_full_batch():
    tokens = ragged_tokens(seed=3)
    full = Batch(tokens, tokens, pad=0)
    halves = [Batch(tokens[:4], tokens[:4], pad=0), Batch(tokens[4:], tokens[4:], pad=0)]
    assert halves[0].ntokens != halves[1].ntokens  # per-half normalization would differ
    a, b, naive = tiny_model(), tiny_model(), tiny_model()
    one_step(a, [full])
    _, state = one_step(b, halves, accum=2)
    assert (state.step, state.accum_step, state.samples) == (1, 2, 8)
    assert state.tokens == full.ntokens
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb)
    # The test can fail: normalizing each half by its own token count gives another update.
    opt = torch.optim.SGD(naive.parameters(), lr=0.5)
    crit = LabelSmoothing(11, 0, 0.1)
    for h in halves:
        out = naive(h.src, h.tgt, h.src_mask, h.tgt_mask)
        SimpleLossCompute(naive.generator, crit)(out, h.tgt_y, h.ntokens)[1].backward()
    opt.step()
    diff = max((pa - pn).abs().max().item() for pa, pn in zip(a.parameters(), naive.parameters()))
    assert diff > 1e-4


def test_partial_last_group_and_scheduler_steps():
    tokens = [ragged_tokens(seed=s, batch=4) for s in range(3)]
    batches = [Batch(t, t, pad=0) for t in tokens]
    model, reference = tiny_model(), tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = LambdaLR(opt, lambda s: 0.5**s)
    crit = LabelSmoothing(11, 0, 0.1)
    loss, state = run_epoch(
        batches,
        model,
        SimpleLossCompute(model.generator, crit),
        opt,
        sched,
        accum=2,
        progress=False,
    )
    assert (state.step, state.accum_step, state.samples) == (2, 3, 12)
    assert sched.last_epoch == 2  # one scheduler step per optimizer update
    # Reference: one update on batches 0+1 concatenated (lr 1), then on batch 2 alone (lr 0.5).
    merged = torch.cat(tokens[:2])
    one_step(reference, [Batch(merged, merged, pad=0)], lr=1.0)
    one_step(reference, [batches[2]], lr=0.5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
    assert math.isfinite(loss) and loss > 0


def test_clipping_caps_the_update():
    tokens = ragged_tokens(seed=5)
    batch = Batch(tokens, tokens, pad=0)
    # float64, so that parameter differences of ~1e-5 are exact enough to compare directions
    clipped, free, reference = (tiny_model().double() for _ in range(3))
    before = params_of(clipped)
    one_step(clipped, [batch], lr=1.0, clip_norm=1e-3)
    one_step(free, [batch], lr=1.0)
    step = torch.cat([(p - b).flatten() for p, b in zip(clipped.parameters(), before)])
    free_step = torch.cat([(p - b).flatten() for p, b in zip(free.parameters(), before)])
    assert step.norm().item() == pytest.approx(1e-3, rel=1e-3)  # SGD lr 1: step = -grad
    assert free_step.norm().item() > 1e-2  # the raw gradient was larger: clipping acted
    # Same direction as the unclipped gradient, computed independently.
    out = reference(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    crit = LabelSmoothing(11, 0, 0.1)
    SimpleLossCompute(reference.generator, crit)(out, batch.tgt_y, batch.ntokens)[1].backward()
    grad = torch.cat([p.grad.flatten() for p in reference.parameters()])
    torch.testing.assert_close(step, -grad * (1e-3 / grad.norm()), rtol=1e-6, atol=1e-12)


def test_eval_mode_leaves_parameters_unchanged():
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.3)
    tokens = ragged_tokens(seed=1)
    batch = Batch(tokens, tokens, pad=0)
    before = params_of(model)
    crit = LabelSmoothing(11, 0, 0.1)
    loss, state = run_epoch(
        [batch, batch],
        model,
        SimpleLossCompute(model.generator, crit),
        mode="eval",
        progress=False,
    )
    assert not model.training  # dropout off
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    assert state == TrainState()  # counters only move in training
    with torch.no_grad():  # the same loss by hand, deterministic because dropout is off
        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
        ref = crit(model.generator(out).reshape(-1, 11), batch.tgt_y.reshape(-1)) / batch.ntokens
    assert loss == pytest.approx(ref.item(), rel=1e-6)


def test_real_token_loss_is_the_loss_over_every_position_without_the_padding():
    """The one loss of training, evaluation and the translation package: the generator on the
    real target tokens only gives the loss of the generator on every position (padding rows
    count 0), with gradients, in bf16 too; train_step reports exactly it."""
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    tokens = ragged_tokens(seed=3)
    batch = Batch(tokens, tokens, pad=0)
    crit = LabelSmoothing(11, 0, 0.1)
    assert (batch.tgt_y == 0).any()  # the batch has padding to skip
    loss = real_token_loss(model, batch, crit)
    out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    ref = SimpleLossCompute(model.generator, crit)(out, batch.tgt_y, batch.ntokens)[0]
    torch.testing.assert_close(loss, ref)
    loss.backward()
    assert all(p.grad is not None for p in model.generator.parameters())
    bf16 = real_token_loss(model, batch, crit, precision="bf16")
    assert bf16.dtype == torch.float32 and bf16.item() == pytest.approx(ref.item(), rel=0.05)
    model.zero_grad()
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    total, ntokens = train_step(model, [batch], crit, sgd)
    assert (total, ntokens) == (pytest.approx(loss.item()), batch.ntokens)


def test_train_state_counts_an_update_in_one_place():
    state = TrainState()
    state.count_update(batches=2, samples=8, tokens=40)
    state.count_update(batches=1, samples=3, tokens=9)
    assert state == TrainState(step=2, accum_step=3, samples=11, tokens=49)


def test_train_loss_is_per_token_before_update_and_state_continues():
    tokens = ragged_tokens(seed=2)
    batch = Batch(tokens, tokens, pad=0)
    model = tiny_model()
    crit = LabelSmoothing(11, 0, 0.1)
    with torch.no_grad():
        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
        ref = crit(model.generator(out).reshape(-1, 11), batch.tgt_y.reshape(-1)) / batch.ntokens
    loss, state = one_step(model, [batch])
    assert model.training
    assert loss == pytest.approx(ref.item(), rel=1e-6)
    _, state2 = one_step(model, [batch, batch], train_state=state)
    assert state2 is state and state.step == 3 and state.tokens == 3 * batch.ntokens


def test_no_nan_with_all_padding_rows():
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.1)
    tokens = ragged_tokens(seed=4)
    src, tgt = tokens.clone(), tokens.clone()
    src[2] = 0  # a source that is all padding: its attention row is fully masked
    tgt[5] = 0  # a target that is all padding: no tokens, fully masked queries
    batch = Batch(src, tgt, pad=0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    crit = LabelSmoothing(11, 0, 0.1)
    loss, _ = run_epoch(
        [batch], model, SimpleLossCompute(model.generator, crit), opt, progress=False
    )
    assert math.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # A batch with no target tokens at all (ntokens == 0): loss 0, weights stay finite.
    empty = Batch(src, torch.zeros_like(tgt), pad=0)
    assert empty.ntokens == 0
    loss, _ = run_epoch(
        [empty], model, SimpleLossCompute(model.generator, crit), opt, progress=False
    )
    assert loss == 0.0 and all(torch.isfinite(p).all() for p in model.parameters())


def _sanitize(text: str) -> str:
    """What nbval compares: carriage-return overwrites resolved, then the repo's sanitizers."""
    text = re.sub(r"^.*\r(?=[^\n])", "", text, flags=re.MULTILINE)
    cfg = configparser.ConfigParser()
    cfg.read(SANITIZE_CFG)
    for section in cfg.sections():
        text = re.sub(cfg[section]["regex"], cfg[section]["replace"], text)
    return text


def test_progress_bar_is_deterministic_after_sanitizing(capsys):
    tokens = ragged_tokens(seed=6)
    outputs = []
    for _ in range(2):
        model = tiny_model()
        opt = torch.optim.Adam(model.parameters(), lr=1.0)
        sched = LambdaLR(opt, lambda s: rate(s, 16, 1.0, 4))
        crit = LabelSmoothing(11, 0, 0.1)
        batches = [Batch(tokens, tokens, pad=0)] * 5
        run_epoch(
            batches, model, SimpleLossCompute(model.generator, crit), opt, sched, desc="epoch 0"
        )
        outputs.append(_sanitize(capsys.readouterr().err))
    assert outputs[0] == outputs[1]
    line = outputs[0].strip()
    assert line.startswith("epoch 0: 100%") and "5/5" in line
    assert "loss=" in line and "<RATE>" in line and "lr=" in line and "<ELAPSED>" in line
    assert "tok/s=" not in line  # the throughput value was masked


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "training"}, r'mode must be "train" or "eval"'),
        ({"accum": 0}, r"accum must be an int >= 1"),
        ({"accum": 1.5}, r"accum must be an int >= 1"),
        ({"clip_norm": 0.0}, r"clip_norm must be > 0"),
        ({"optimizer": None}, r"optimizer is required"),
    ],
)
def test_run_epoch_errors(kwargs, match):
    model = tiny_model()
    args = {"optimizer": torch.optim.SGD(model.parameters(), lr=0.1)} | kwargs
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(11, 0))
    with pytest.raises(ValueError, match=match):
        run_epoch([], model, loss_compute, progress=False, **args)


# --------------------------------------------------------------------------- copy task
def test_copy_task_batches():
    g = torch.Generator().manual_seed(0)
    batches = list(copy_task_batches(7, 5, 3, seq_len=6, generator=g))
    assert len(batches) == 3
    for b in batches:
        assert isinstance(b, Batch) and b.src.shape == (5, 6) and b.src.dtype == torch.long
        assert (b.src[:, 0] == 1).all() and ((b.src[:, 1:] >= 2) & (b.src[:, 1:] < 7)).all()
        assert torch.equal(b.tgt, b.src[:, :-1]) and torch.equal(b.tgt_y, b.src[:, 1:])
        assert b.ntokens == 5 * 5 and b.src_mask.all()
    assert not torch.equal(batches[0].src, batches[1].src)
    again = list(copy_task_batches(7, 5, 3, seq_len=6, generator=torch.Generator().manual_seed(0)))
    assert all(torch.equal(a.src, b.src) for a, b in zip(batches, again))
    on_meta = next(copy_task_batches(7, 2, 1, device="meta"))
    assert on_meta.src.device.type == "meta" and on_meta.tgt_mask.device.type == "meta"


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((2, 4, 1), r"vocab must be >= 3"),
        ((7, 0, 1), r"batch_size must be >= 1"),
        ((7, 4, -1), r"n_batches >= 0"),
        ((7, 4, 1, 1), r"seq_len must be >= 2"),
    ],
)
def test_copy_task_batches_errors(args, match):
    with pytest.raises(ValueError, match=match):
        next(copy_task_batches(*args))


def test_training_fits_a_fixed_batch():
    """run_epoch moves the weights downhill: 40 updates on one batch cut its loss sharply."""
    model = tiny_model()
    batch = next(
        copy_task_batches(11, 16, 1, seq_len=6, generator=torch.Generator().manual_seed(0))
    )
    compute = SimpleLossCompute(model.generator, LabelSmoothing(11, 0, 0.0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    before, _ = run_epoch([batch], model, compute, mode="eval", progress=False)
    _, state = run_epoch([batch] * 40, model, compute, opt, progress=False)
    after, _ = run_epoch([batch], model, compute, mode="eval", progress=False)
    assert (state.step, state.samples, state.tokens) == (40, 40 * 16, 40 * 16 * 5)
    assert before > 2.0 and after < 0.25 * before  # ln(9) ~ 2.2 is chance level
    assert TrainState() == TrainState(0, 0, 0, 0) and copy.deepcopy(state) == state
