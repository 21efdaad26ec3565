"""Micro-benchmarks of single optimizations, and the length-bucketing experiment.

Imported by ``bench.train_throughput``, which runs them after the training steps and writes
them under ``"extras"`` in ``results/bench_train.json`` (``python -m bench.train_throughput``;
``--no-extras`` skips them). Each micro-benchmark times the forward and backward pass of one
operation in two forms that compute the same function (checked with ``assert_close`` where
the two are not trivially equal), interleaved (``bench.common.interleaved_times``):

* :func:`fused_qkv_micro`: one stacked Q/K/V projection against three (chapter 3);
* :func:`layernorm_micro`: LayerNorm written out against ``F.layer_norm`` (chapter 5);
* :func:`loss_micro`: label smoothing by its definition against the closed form (chapter 6);
* :func:`dropout_micro`: ``nn.Dropout`` against chapter 5's ``Dropout``;
* :func:`attention_dtype_micro`: the fused CPU attention kernel in bf16 against fp32
  (chapter 3's bf16 path);
* :func:`bucketing_experiment`: length-bucketed against randomly packed Multi30k batches
  (chapter 8's batching), in our training step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.common import interleaved_times, median
from bench.train_models import BenchConfig, LayerNormByHand, build_ours
from bench.train_steps import kl_by_definition, package_step
from transformer_lib.layers import Dropout, LayerNorm
from transformer_lib.training import Batch, LabelSmoothing
from transformer_lib.translation import data
from transformer_lib.translation.data import PAD


def fused_qkv_micro(
    d_model: int, tokens: int, device: torch.device, repeats: int = 10
) -> dict[str, float]:
    """Forward+backward of one (3·d_model × d_model) projection vs three (d_model × d_model) ones.

    Self-attention projects the same input three times; one matmul with the three weight
    matrices stacked reads the input once and gives the matmul kernel a wider problem.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, d_model, generator=g).to(device).requires_grad_(True)
    fused = nn.Linear(d_model, 3 * d_model).to(device)
    separate = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(3)).to(device)

    def run_fused():
        q, k, v = fused(x).chunk(3, dim=-1)
        (q.sum() + k.sum() + v.sum()).backward()

    def run_separate():
        q, k, v = (lin(x) for lin in separate)
        (q.sum() + k.sum() + v.sum()).backward()

    times = interleaved_times({"fused": run_fused, "separate": run_separate}, 2, repeats)
    f, s = median(times["fused"]), median(times["separate"])
    return {
        "d_model": d_model,
        "tokens": tokens,
        "fused_ms": 1e3 * f,
        "separate_ms": 1e3 * s,
        "separate_vs_fused_time": s / f,
    }


def layernorm_micro(
    d_model: int, tokens: int, device: torch.device, repeats: int = 10
) -> dict[str, float]:
    """Forward+backward of the LayerNorm formula written out vs the package's ``LayerNorm``.

    Both compute the same function (checked here with ``assert_close``); the package calls
    ``F.layer_norm`` (one fused kernel), the formula is seven operations that autograd records
    one by one.
    """
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, d_model, generator=g).to(device).requires_grad_(True)
    fused = LayerNorm(d_model).to(device)
    by_hand = LayerNormByHand(fused)
    torch.testing.assert_close(by_hand(x), fused(x))

    def run(mod):
        def call():
            x.grad = None
            mod(x).sum().backward()

        return call

    times = interleaved_times({"by_hand": run(by_hand), "fused": run(fused)}, 2, repeats)
    o, f = median(times["by_hand"]), median(times["fused"])
    return {
        "d_model": d_model,
        "tokens": tokens,
        "by_hand_ms": 1e3 * o,
        "fused_ms": 1e3 * f,
        "by_hand_vs_fused_time": o / f,
    }


def loss_micro(
    vocab: int, tokens: int, device: torch.device, smoothing: float = 0.1, repeats: int = 5
) -> dict[str, float]:
    """Forward+backward of the label-smoothed KL by its definition vs ``LabelSmoothing``.

    Same value and gradient (checked with ``assert_close``); the definition builds the (N, V)
    target distribution and makes about eight passes over N × V numbers, the package's closed
    form one gather and one row sum.
    """
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(tokens, vocab, generator=g).to(device)
    target = torch.randint(1, vocab, (tokens,), generator=g).to(device)
    target[::9] = PAD  # some padding rows
    a = logits.log_softmax(-1).requires_grad_(True)
    b = a.detach().clone().requires_grad_(True)
    crit = LabelSmoothing(vocab, PAD, smoothing).to(device)
    la, lb = kl_by_definition(a, target, crit), crit(b, target)
    la.backward()
    lb.backward()
    torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(b.grad, a.grad)

    def run_definition():
        a.grad = None
        kl_by_definition(a, target, crit).backward()

    def run_closed():
        b.grad = None
        crit(b, target).backward()

    times = interleaved_times({"definition": run_definition, "closed": run_closed}, 1, repeats)
    c, f = median(times["definition"]), median(times["closed"])
    return {
        "vocab": vocab,
        "tokens": tokens,
        "definition_ms": 1e3 * c,
        "closed_form_ms": 1e3 * f,
        "definition_vs_closed_form_time": c / f,
    }


def dropout_micro(
    d_model: int, tokens: int, device: torch.device, p: float = 0.1, repeats: int = 5
) -> dict[str, Any]:
    """Forward+backward of ``nn.Dropout`` vs chapter 5's ``Dropout`` (mask: uniform >= p) on a
    (tokens, d_model) input; ``d_model`` is the width (also the FFN's hidden width)."""
    x = torch.randn(tokens, d_model, device=device, requires_grad=True)
    grad = torch.randn(tokens, d_model, device=device)  # a dense incoming gradient, as in a step
    mods = {"nn_dropout": nn.Dropout(p), "ours": Dropout(p)}

    def run(mod):
        def go():
            x.grad = None
            mod(x).backward(grad)

        return go

    times = interleaved_times({k: run(m) for k, m in mods.items()}, 1, repeats)
    a, b = median(times["nn_dropout"]), median(times["ours"])
    return {
        "d_model": d_model,
        "tokens": tokens,
        "p": p,
        "nn_dropout_ms": 1e3 * a,
        "ours_ms": 1e3 * b,
        "nn_dropout_vs_ours_time": a / b,
    }


def attention_dtype_micro(
    cfg: BenchConfig, device: torch.device, repeats: int = 10
) -> dict[str, float]:
    """Forward+backward of causal SDPA at cfg's shapes: fused kernel in fp32 and in bf16, and
    the unfused "math" kernel in bf16 (which upcasts to fp32 inside).

    Why the package attends in fp32 under bf16 autocast on a CPU (chapter 3): on CPUs without
    AMX, PyTorch's fused CPU kernel is slower in bf16 than in fp32.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(0)
    B, h, n, d_k = cfg.batch_size, cfg.h, cfg.max_len, cfg.d_model // cfg.h
    base = [torch.randn(B, h, n, d_k, generator=g).to(device) for _ in range(3)]
    mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()

    def run(dtype, backend):
        q, k, v = (t.to(dtype).requires_grad_(True) for t in base)

        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()

        return call

    fns = {
        "fused_fp32": run(torch.float32, SDPBackend.FLASH_ATTENTION),
        "fused_bf16": run(torch.bfloat16, SDPBackend.FLASH_ATTENTION),
        "math_bf16": run(torch.bfloat16, SDPBackend.MATH),
    }
    times = interleaved_times(fns, 2, repeats)
    ms = {k: 1e3 * median(v) for k, v in times.items()}
    return {
        "shape": [B, h, n, d_k],
        **{f"{k}_ms": v for k, v in ms.items()},
        "fused_bf16_vs_fused_fp32_time": ms["fused_bf16"] / ms["fused_fp32"],
        "math_bf16_vs_fused_fp32_time": ms["math_bf16"] / ms["fused_fp32"],
    }


def _multi30k_batches(
    device: torch.device, max_tokens: int, n_batches: int, max_pairs: int | None, vocab_size: int
) -> tuple[dict[str, list[Batch]], dict[str, Any], int] | None:
    """The first ``n_batches`` bucketed and random batches of Multi30k (joint BPE), the padding
    shares of both schemes (``data.compare_padding``) and the vocabulary size; None without
    the data."""
    try:
        pairs = data.load_multi30k("train")[:max_pairs]
    except Exception as err:  # noqa: BLE001 - no data here: report and skip
        print(f"  bucketing experiment skipped: {err}")
        return None
    tok = data.train_tokenizer((s for p in pairs for s in p), vocab_size=vocab_size)
    examples = data.encode_pairs(pairs, tok)
    padding = data.compare_padding(examples, max_tokens, seed=0)
    schemes = {}
    for name, bucket in (("bucketed", True), ("random", False)):
        idx = data.make_batches(examples, max_tokens, shuffle=True, seed=0, bucket=bucket)
        schemes[name] = [
            Batch(*data.collate(examples, i, pad=data.PAD, device=device), pad=data.PAD)
            for i in idx[:n_batches]
        ]
    return schemes, padding, tok.get_vocab_size()


def bucketing_experiment(
    cfg: BenchConfig,
    device: torch.device,
    max_tokens: int = 3000,
    n_batches: int = 3,
    repeats: int = 2,
    max_pairs: int | None = None,
    vocab_size: int = 8000,
) -> dict[str, Any] | None:
    """Padding and real-token throughput of length-bucketed vs randomly packed Multi30k batches.

    Uses ``transformer_lib.translation.data`` (joint BPE over the Multi30k training set, both
    batching schemes with the same token budget) and our fp32 model at ``cfg``'s size in the
    trainer's step. Returns None when the data is not available. ``max_pairs`` keeps only the
    first pairs (for quick runs).
    """
    found = _multi30k_batches(device, max_tokens, n_batches, max_pairs, vocab_size)
    if found is None:
        return None
    schemes, padding, vocab = found
    cfg_v = dataclasses.replace(cfg, vocab=vocab)
    steps = {name: package_step(build_ours(cfg_v, device), cfg_v, device) for name in schemes}
    fns = {name: (lambda name=name: [steps[name](b) for b in schemes[name]]) for name in schemes}
    times = interleaved_times(fns, 1, repeats)
    out: dict[str, Any] = {
        "max_tokens": max_tokens,
        "batches_timed": n_batches,
        "vocab": vocab,
        "model": cfg.name,
        **padding,
    }
    for name in fns:
        toks = sum(float(b.ntokens) for b in schemes[name])
        sents = sum(int(b.src.size(0)) for b in schemes[name])
        t = median(times[name])
        out[f"{name}_tokens_per_s"] = toks / t
        out[f"{name}_sentences_per_batch"] = sents / n_batches
    out["bucketed_vs_random_tokens_per_s"] = (
        out["bucketed_tokens_per_s"] / out["random_tokens_per_s"]
    )
    return out
