"""Chapters 5-7 show short lesson versions; the package's full versions must compute the same.

Each lesson is run from the committed notebook (`_lessons.lesson`), so the code compared is the
code a reader reads. Compared: outputs and the gradients of every weight (same weights through
load_state_dict, dropout off), with padding in the masks; for training, the weights after the
updates; for decoding, the same tokens (and scores).
"""

from __future__ import annotations

import copy
import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from _lessons import PlainRoute, lesson
from torch import nn

from transformer_lib import decoding, layers, model, training
from transformer_lib.masks import padding_mask, subsequent_mask
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.positional import PositionalEncoding


def _base_namespace() -> dict:
    """What the chapters' lesson cells find in the notebook when they run."""
    ns = {"copy": copy, "math": math, "functools": functools, "itertools": itertools}
    ns |= {"torch": torch, "nn": nn, "F": F}
    ns |= {"padding_mask": padding_mask, "subsequent_mask": subsequent_mask}
    ns |= {"MultiHeadedAttention": MultiHeadedAttention, "PositionalEncoding": PositionalEncoding}
    for name in ("SublayerConnection", "LayerNorm", "PositionwiseFeedForward", "Embeddings",
                 "Generator", "Encoder"):
        ns[name] = getattr(layers, name)
    return ns


def _ch5_lessons() -> dict:
    """Chapter 5's lessons, each built from the lessons before it (as in the notebook)."""
    return lesson(
        "05", "encoder-layer-lesson", "decoder-lesson", "encdec-lesson", "make-model-lesson",
        namespace=_base_namespace(),
    )


def _batch(vocab: int, seed: int) -> tuple[torch.Tensor, ...]:
    """A padded batch: sources and targets of different lengths, and their masks."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, vocab, (3, 7), generator=g)
    tgt = torch.randint(2, vocab, (3, 6), generator=g)
    src[1, 4:], src[2, 2:] = 0, 0
    tgt[1, 3:], tgt[2, 5:] = 0, 0
    src_mask = padding_mask(src, 0)
    tgt_mask = padding_mask(tgt, 0) & subsequent_mask(6)
    return src, tgt, src_mask, tgt_mask


def _same_outputs_and_grads(a: nn.Module, b: nn.Module, run) -> None:
    """run(module) -> (output, real positions); compare outputs and all gradients."""
    out_a, real = run(a)
    out_b, _ = run(b)
    torch.testing.assert_close(out_a[real], out_b[real])
    (out_a[real] ** 2).sum().backward()
    (out_b[real] ** 2).sum().backward()
    grads_b = dict(b.named_parameters())
    for name, p in a.named_parameters():
        # float32 rounding, relative to the tensor's scale: the two models sum in other
        # orders, and on an AVX2 CPU an entry near 0 of a gradient of size 100 differs by
        # some 3e-5
        scale = grads_b[name].grad.abs().max().item()
        torch.testing.assert_close(p.grad, grads_b[name].grad, msg=name,
                                   rtol=1.3e-6, atol=1e-5 + 1e-6 * scale)


# ------------------------------------------------------------------ chapter 5
@pytest.mark.parametrize("norm_first", [False, True])
def test_ch5_layers_match_package(norm_first: bool) -> None:
    ns = _ch5_lessons()
    torch.manual_seed(0)
    d, h, d_ff = 32, 4, 64
    attn = MultiHeadedAttention(h, d, dropout=0.0)
    ff = layers.PositionwiseFeedForward(d, d_ff, dropout=0.0)
    enc_l = layers.Encoder(ns["EncoderLayer"](d, copy.deepcopy(attn), copy.deepcopy(ff), 0.0,
                                               norm_first), 2)
    # the package's skip of padding on: it must change nothing at real positions
    enc_p = layers.Encoder(layers.EncoderLayer(d, copy.deepcopy(attn), copy.deepcopy(ff), 0.0,
                                               norm_first, skip_padding=True), 2)
    enc_p.load_state_dict(enc_l.state_dict())
    src, tgt, src_mask, tgt_mask = _batch(11, 0)
    x = torch.randn(3, 7, d)
    real_src = src != 0
    _same_outputs_and_grads(enc_l, enc_p, lambda m: (m(x, src_mask), real_src))

    dec_l = ns["Decoder"](ns["DecoderLayer"](d, copy.deepcopy(attn), copy.deepcopy(attn),
                                             copy.deepcopy(ff), 0.0, norm_first), 2)
    dec_p = layers.Decoder(layers.DecoderLayer(d, copy.deepcopy(attn), copy.deepcopy(attn),
                                               copy.deepcopy(ff), 0.0, norm_first), 2)
    assert dec_l.state_dict().keys() == dec_p.state_dict().keys()
    dec_p.load_state_dict(dec_l.state_dict())
    y, memory = torch.randn(3, 6, d), torch.randn(3, 7, d)
    real_tgt = tgt != 0
    _same_outputs_and_grads(
        dec_l, dec_p, lambda m: (m(y, memory, src_mask, tgt_mask), real_tgt)
    )


@pytest.mark.parametrize(("norm_first", "share"), [(False, False), (True, True)])
def test_ch5_make_model_matches_package(norm_first: bool, share: bool) -> None:
    ns = _ch5_lessons()
    torch.manual_seed(0)
    kw = dict(N=2, d_model=32, d_ff=64, h=4, dropout=0.0, norm_first=norm_first,
              share_embeddings=share)
    ours = ns["make_model"](13, 13, **kw)
    theirs = model.make_model(13, 13, **kw)
    # the same parameters, names and shapes; tied weights tied alike
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in theirs.state_dict().items()
    }
    assert model.count_parameters(ours) == model.count_parameters(theirs)
    if share:
        assert ours.generator.proj.weight is ours.src_embed[0].lut.weight
    # the same initialization scale: Xavier on every matrix, W^Q, W^K, W^V by block
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        if p.dim() > 1 and "lut" not in name and p.numel() > 500:
            assert abs(p.std() / q.std() - 1) < 0.15, name
    theirs.load_state_dict(ours.state_dict())
    src, tgt, src_mask, tgt_mask = _batch(13, 1)
    real_tgt = tgt != 0

    def run(m):
        return m.generator(m(src, tgt, src_mask, tgt_mask)), real_tgt

    _same_outputs_and_grads(ours, theirs, run)


def test_ch5_lesson_classes_are_the_lessons() -> None:
    """The lesson cells define their own classes (not the package's), short ones."""
    ns = _ch5_lessons()
    for name in ("EncoderLayer", "DecoderLayer", "Decoder", "EncoderDecoder"):
        assert ns[name] is not getattr(layers, name, None)
        assert ns[name] is not getattr(model, name, None)
    assert ns["make_model"] is not model.make_model


# ------------------------------------------------------------------ chapter 6
def _ch6_lessons() -> dict:
    ns = _base_namespace()
    ns |= {"TrainState": training.TrainState}
    return lesson("06", "batch-lesson", "train-step-lesson", "run-epoch-lesson", namespace=ns)


def test_ch6_batch_matches_package() -> None:
    ns = _ch6_lessons()
    src, tgt, _, _ = _batch(11, 2)
    tgt[:, 0] = 1
    ours, theirs = ns["Batch"](src, tgt, pad=0), training.Batch(src, tgt, pad=0)
    for name in ("src", "src_mask", "tgt", "tgt_y", "tgt_mask"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert ours.ntokens == theirs.ntokens == int((tgt[:, 1:] != 0).sum())
    assert torch.equal(ns["Batch"](src).src_mask, training.Batch(src).src_mask)


def _copy_setup(ns: dict, seed: int):
    torch.manual_seed(seed)
    m = model.make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    twin = copy.deepcopy(m)
    g = torch.Generator().manual_seed(seed)
    data = list(training.copy_task_batches(11, 8, 5, generator=g))
    data[1] = training.Batch(data[1].src[:, :6], data[1].src[:, :6].clone(), pad=0)
    return m, twin, data


@pytest.mark.parametrize(("accum", "clip"), [(1, None), (2, 0.5)])
def test_ch6_run_epoch_and_train_step_match_package(accum: int, clip: float | None) -> None:
    """The lesson's loop and the package's: the same losses, history, counters, weights."""
    ns = _ch6_lessons()
    # the lesson's route in both: Adam at lr 1 amplifies the fused route's rounding over an
    # epoch (the gradient test below compares the lesson with the fused route)
    crit = PlainRoute(11, 0, 0.1)
    ours, theirs, data = _copy_setup(ns, 3)
    results = []
    for m, run_epoch in ((ours, ns["run_epoch"]), (theirs, training.run_epoch)):
        opt = torch.optim.Adam(m.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: training.rate(s, 16, factor=1.0, warmup=3)
        )
        compute = training.SimpleLossCompute(m.generator, crit)
        history: list[float] = []
        kw = {"accum": accum, "clip_norm": clip, "history": history}
        if run_epoch is training.run_epoch:
            kw["progress"] = False
        loss, state = run_epoch(data, m, compute, opt, sched, **kw)
        eval_loss, _ = run_epoch(data, m, compute, mode="eval",
                                 **({"progress": False} if "progress" in kw else {}))
        results.append((loss, state, history, eval_loss))
    (l1, s1, h1, e1), (l2, s2, h2, e2) = results
    assert s1 == s2
    torch.testing.assert_close(torch.tensor(h1), torch.tensor(h2))
    assert math.isclose(l1, l2, rel_tol=1e-5) and math.isclose(e1, e2, rel_tol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)


def test_ch6_train_step_gradients_match_package() -> None:
    """One group's gradients, before the update: the lesson's and the package's step."""
    ns = _ch6_lessons()
    crit = training.LabelSmoothing(11, 0, 0.0)
    ours, theirs, data = _copy_setup(ns, 4)
    grads = []
    for m, step in ((ours, ns["train_step"]), (theirs, training.train_step)):
        sgd = torch.optim.SGD(m.parameters(), lr=0.0)  # lr 0: the step keeps the weights
        seen = {}
        hook = sgd.register_step_pre_hook(
            lambda o, a, k, seen=seen, m=m: seen.update(
                {n: p.grad.clone() for n, p in m.named_parameters()}
            )
        )
        total, ntokens = step(m, data[:3], crit, sgd)
        hook.remove()
        grads.append((total, ntokens, seen))
    (t1, n1, g1), (t2, n2, g2) = grads
    assert n1 == n2 and math.isclose(t1, t2, rel_tol=1e-6)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], msg=name)


def test_ch6_train_step_refuses_a_diverged_loss() -> None:
    ns = _ch6_lessons()
    m, _, data = _copy_setup(ns, 5)
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    before = [p.clone() for p in m.parameters()]
    with pytest.raises(FloatingPointError):
        ns["train_step"](m, data[:1], lambda logp, y: logp.sum() * math.nan, sgd)
    assert all(torch.equal(p, q) for p, q in zip(before, m.parameters(), strict=True))


# ------------------------------------------------------------------ chapter 7
def _ch7_lesson() -> dict:
    ns = _base_namespace() | {"gnmt_length_penalty": decoding.gnmt_length_penalty}
    return lesson("07", "beam-lesson", namespace=ns)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_ch7_beam_lesson_matches_package(seed: int, k: int, alpha: float) -> None:
    """The same best hypothesis, token for token, and the same score, for every sentence."""
    lesson_search = _ch7_lesson()["beam_search"]
    torch.manual_seed(seed)
    m = model.make_model(20, 20, N=2, d_model=32, d_ff=64, h=4).eval()
    src, _, src_mask, _ = _batch(20, seed)
    src[:, 0] = 1
    ours = lesson_search(m, src, src_mask, 10, 1, 2, beam_size=k, length_penalty=alpha)
    theirs = decoding.beam_search(m, src, src_mask, 10, 1, 2, beam_size=k, length_penalty=alpha)
    for [(tokens, score)], [(ref_tokens, ref_score)] in zip(ours, theirs, strict=True):
        assert tokens == ref_tokens.tolist()
        assert math.isclose(score, ref_score, rel_tol=1e-5, abs_tol=1e-6)


def test_ch7_beam_lesson_finds_eos_hypotheses() -> None:
    """Hypotheses ending in EOS after a few tokens: the same tokens and penalized scores."""
    lesson_search = _ch7_lesson()["beam_search"]
    torch.manual_seed(1)  # a random model whose best hypotheses end in EOS after 3 tokens
    m = model.make_model(12, 12, N=1, d_model=16, d_ff=32, h=2).eval()
    src = torch.randint(3, 12, (4, 5), generator=torch.Generator().manual_seed(1))
    src_mask = padding_mask(src, 0)
    ours = lesson_search(m, src, src_mask, 10, 1, 2, beam_size=3, length_penalty=1.0)
    theirs = decoding.beam_search(m, src, src_mask, 10, 1, 2, beam_size=3, length_penalty=1.0)
    lengths = []
    for [(tokens, score)], [(ref_tokens, ref_score)] in zip(ours, theirs, strict=True):
        assert tokens == ref_tokens.tolist()
        assert math.isclose(score, ref_score, rel_tol=1e-5)
        lengths.append(len(tokens) if tokens[-1] == 2 else 0)
    assert max(lengths) > 2  # an EOS after real tokens, where the length penalty is not 1
