"""What would lift the fp32 training step's MFU? Two levers, measured on the package's step.

    python -m experiments.train_step_speed.sketch  # ~4 min → results.json beside it

Chapter 9 measures ours' fp32 MFU (useful FLOPs over the machine's fp32 matrix-product peak).
On the Intel Xeon it stays under its targets, and a profile of one small step shows why: the
products are not the whole step. About 11% of it draws dropout masks (``torch.rand`` makes one
32-bit draw per entry, serially) and about 18% makes passes over the vocabulary-wide
(tokens × 8,000) tensors of the generator's log-softmax and the loss, which do not fit in the
caches. This sketch measures two changes without touching the package:

* ``bit_dropout``: each dropout draws its mask from 16 random bits per entry (one 64-bit draw
  gives four entries) and keeps an entry when its bits, read as a signed 16-bit integer, are
  at least ``round(p * 2**16) - 2**15``: the drop probability is p rounded to a multiple of
  2**-16 (0.1 becomes 0.100006), the kept entries are scaled by 1 / (1 - p) as before.
  ``bit_dropout_attn`` also sends the attention weights through chapter 1's path, whose
  dropout then draws the same way (the fused kernel draws its own mask).
* ``fused_loss``: the generator's product, the log-softmax and chapter 6's label-smoothed KL
  computed together, 256 rows at a time, with the gradients written in the forward pass
  (d loss / d logits = softmax - p for a counted row), so no (tokens × vocabulary) tensor is
  stored or read again in the backward pass.
* ``all``: both.

Every variant starts from the same weights and runs the package's step
(``transformer_lib.training.train_step``, fused Adam, the trainer's clipping) on the
benchmark's batches, interleaved (``bench.common.interleaved_times``). Before timing, the
fused loss is checked against the package's (loss and every gradient) and the bit mask's
keep rate against 1 - p.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import types
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from bench.common import (
    git_commit,
    interleaved_times,
    machine_description,
    matmul_peak,
    now_iso,
    write_json,
)
from bench.flops import train_flops
from bench.train_models import CONFIGS, BenchConfig, random_batches
from bench.train_steps import TRAINER_CLIP_NORM, build_variant
from transformer_lib.layers import Dropout
from transformer_lib.training import Batch, LabelSmoothing, real_token_loss, train_step
from transformer_lib.translation.data import PAD

OUT = Path(__file__).with_name("results.json")
VARIANTS = ["package", "bit_dropout", "bit_dropout_attn", "fused_loss", "all"]
CHUNK = 256  # rows of the fused loss at a time: 256 x 8,000 fp32 logits are 8 MB


# --------------------------------------------------------------------------- bit dropout


def bit_dropout(self: nn.Dropout, x: Tensor) -> Tensor:
    """``Dropout.forward`` with a mask of 16 random bits per entry (CPU)."""
    if not self.training or self.p == 0:
        return x
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    r = bits.view(torch.int16)[:n].view(x.shape)  # four entries per 64-bit draw
    keep = r >= round(self.p * 2**16) - 2**15
    return torch.where(keep, x * (1.0 / (1.0 - self.p)), 0.0)


def use_bit_dropout(model: nn.Module, attention: bool) -> None:
    """Every dropout of ``model`` draws bit masks; with ``attention``, the attention weights
    go through chapter 1's path (``attn.dropout``) instead of the fused kernel."""
    for m in model.modules():
        if isinstance(m, Dropout) or (attention and isinstance(m, nn.Dropout)):
            m.forward = types.MethodType(bit_dropout, m)
        if attention and hasattr(m, "_explicit_is_faster"):  # training with dropout
            m._explicit_is_faster = lambda q, m=m: m.training and m.dropout.p > 0


# --------------------------------------------------------------------------- fused loss


class _FusedGeneratorKL(torch.autograd.Function):
    """Summed label-smoothed KL of log_softmax(h W^T + b); gradients made in forward."""

    @staticmethod
    def forward(
        ctx, h: Tensor, weight: Tensor, bias: Tensor, target: Tensor, ls: LabelSmoothing
    ) -> Tensor:
        pad, conf, spread, vocab = ls.padding_idx, ls.confidence, ls.spread, ls.size
        grads = torch.empty_like(h), torch.zeros_like(weight), torch.zeros_like(bias)
        total = h.new_zeros(())
        for r in range(0, h.size(0), CHUNK):
            hc, tc = h[r : r + CHUNK], target[r : r + CHUNK]  # (C, d), (C,)
            z = torch.addmm(bias, hc, weight.t())  # (C, V) logits
            lse = torch.logsumexp(z, 1)  # (C,)
            x_y = z.gather(1, tc[:, None]).squeeze(1) - lse  # log q(y)
            per_row = ls.row_entropy_term - conf * x_y
            if spread > 0:  # the sum of log q over the classes but padding
                non_pad = z.sum(1) - z[:, pad] - (vocab - 1) * lse
                per_row = per_row - spread * (non_pad - x_y)
            counted = (tc != pad)[:, None].to(z.dtype)  # (C, 1)
            total += (per_row * counted.squeeze(1)).sum()
            g = z.sub_(lse[:, None]).exp_().sub_(spread)  # q - spread: (C, V)
            g[:, pad] += spread  # padding's target probability is 0
            g.scatter_add_(1, tc[:, None], torch.full_like(x_y, spread - conf)[:, None])
            g.mul_(counted)  # d KL / d z = q - p, 0 on padding rows
            torch.mm(g, weight, out=grads[0][r : r + CHUNK])
            grads[1].addmm_(g.t(), hc)
            grads[2].add_(g.sum(0))
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        return (*(g * grad for g in ctx.saved_tensors), None, None)


class Hidden(nn.Module):
    """Stands in for the generator: hands the hidden states to the fused loss, keeping the
    projection registered (so the optimizer and the clipping still see it)."""

    def __init__(self, proj: nn.Linear) -> None:
        super().__init__()
        self.proj = proj

    def forward(self, x: Tensor) -> Tensor:
        return x


def use_fused_loss(model: nn.Module, ls: LabelSmoothing):
    """Swap the generator for ``Hidden`` and return the criterion computing the rest."""
    model.generator = Hidden(model.generator.proj)
    proj = model.generator.proj

    def criterion(h: Tensor, target: Tensor) -> Tensor:
        return _FusedGeneratorKL.apply(h, proj.weight, proj.bias, target, ls)

    return criterion


# --------------------------------------------------------------------------- the variants


def build(name: str, cfg: BenchConfig, device: torch.device):
    """(model, step) of a variant: ``bench.train_steps``' ours_fp32 with its changes."""
    model, _ = build_variant("ours_fp32", cfg, device)
    criterion = LabelSmoothing(cfg.vocab, PAD, cfg.smoothing).to(device)
    if name in ("bit_dropout", "bit_dropout_attn", "all"):
        use_bit_dropout(model, attention=name != "bit_dropout")
    if name in ("fused_loss", "all"):
        criterion = use_fused_loss(model, criterion)
    opt = torch.optim.Adam(
        model.parameters(),
        lr=1e-4,
        betas=(0.9, 0.98),
        eps=1e-9,
        fused=device.type in ("cpu", "cuda") or None,
    )

    def step(b: Batch) -> float:
        loss, n = train_step(model, [b], criterion, opt, clip_norm=TRAINER_CLIP_NORM)
        return loss / n

    model.train()
    return model, step, criterion


def check_fused_loss(cfg: BenchConfig, batch: Batch, device: torch.device) -> dict[str, float]:
    """The fused loss against the package's: the loss and every gradient (no dropout)."""
    out = {}
    grads = []
    for name in ("package", "fused_loss"):
        model, _, criterion = build(name, cfg, device)
        model.eval()  # no dropout: the two must compute the same function
        loss = real_token_loss(model, batch, criterion)
        loss.backward()
        out[name] = loss.item()
        grads.append([p.grad for p in model.parameters()])
    diff = max((a - b).abs().max().item() for a, b in zip(*grads))
    scale = max(a.abs().max().item() for a in grads[0])
    assert abs(out["package"] - out["fused_loss"]) <= 1e-4 * abs(out["package"]), out
    assert diff <= 1e-4 * scale, (diff, scale)
    return {
        "loss_package": out["package"],
        "loss_fused": out["fused_loss"],
        "max_abs_grad_diff": diff,
        "max_abs_grad": scale,
    }


def check_bit_dropout(p: float = 0.1, n: int = 4_000_000) -> dict[str, float]:
    """The share of entries a bit mask keeps, and the kept entries' value."""
    d = Dropout(p).train()
    y = bit_dropout(d, torch.ones(n))
    kept = (y != 0).double().mean().item()
    assert abs(kept - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5 + 2**-16, kept
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - p)))
    return {"p": p, "entries": n, "kept_share": kept}


def run_config(cfg: BenchConfig, device: torch.device, fp32_peak: float) -> dict[str, Any]:
    batches = random_batches(cfg, device)
    steps = {name: build(name, cfg, device)[1] for name in VARIANTS}
    rounds = {k: (lambda s=s: [s(b) for b in batches]) for k, s in steps.items()}
    times = interleaved_times(rounds, cfg.warmup, cfg.repeats, progress=cfg.name)
    flops = sum(train_flops(cfg, b) for b in batches)
    ref = times["package"]
    rows = {}
    for name, ts in times.items():
        per_round = [r / t for r, t in zip(ref, ts)]  # package's time / this one's
        rows[name] = {
            "seconds_all": [round(t, 4) for t in ts],
            "seconds_median": statistics.median(ts),
            "mfu_fp32": flops / statistics.median(ts) / fp32_peak,
            "mfu_fp32_rounds": [flops / t / fp32_peak for t in ts],
            "speedup_vs_package": statistics.median(ref) / statistics.median(ts),
            "speedup_per_round": per_round,
        }
        print(
            f"  {cfg.name} {name:17s} {rows[name]['seconds_median']:.3f} s/round, "
            f"MFU {rows[name]['mfu_fp32']:.0%}, x{rows[name]['speedup_vs_package']:.2f} "
            f"({min(per_round):.2f}-{max(per_round):.2f}) the package"
        )
    return {
        "config": cfg.name,
        "repeats": cfg.repeats,
        "model_flops_per_round": flops,
        "variants": rows,
        "fused_loss_check": check_fused_loss(cfg, batches[0], device),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["small", "base"], choices=list(CONFIGS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device("cpu")
    fp32_peak = matmul_peak(torch.float32)
    result: dict[str, Any] = {
        "experiment": "train_step_speed",
        "date": now_iso(),
        "git_commit": git_commit(),
        "machine": machine_description(),
        "matmul_peak_fp32": fp32_peak,
        "bit_dropout_check": check_bit_dropout(),
        "configs": {},
    }
    for name in args.configs:
        cfg = CONFIGS[name]
        cfg = dataclasses.replace(cfg, repeats=args.repeats)
        result["configs"][name] = run_config(cfg, device, fp32_peak)
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
