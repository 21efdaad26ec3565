"""What does each of the fp32 training step's two levers buy? Each one taken out of the package.

    python -m experiments.train_step_speed.sketch  # ~4 min → results.json beside it

Chapter 9 measures ours' fp32 MFU (useful FLOPs over the machine's fp32 matrix-product peak).
A profile of one small step on the Intel Xeon showed why it stayed under its targets: about 11%
of the step drew dropout masks (``torch.rand``, one 32-bit draw per entry) and about 18% made
passes over the vocabulary-wide (tokens × 8,000) tensors of the log-softmax and the loss, which
no cache holds. This sketch measured two levers against them (at ``d3f56b1``), and the package
adopted both: chapter 5's ``Dropout`` draws 16 random bits per entry (one 64-bit draw gives
four entries), and chapter 6's step computes the generator, log-softmax and label-smoothed KL
256 rows at a time with the gradients made in the forward pass (``generator_kl``). It now
measures what each is worth in today's code, by taking it out:

* ``float_dropout``: chapter 5's dropouts draw one float per entry again (``rand >= p``);
* ``unfused_loss``: the step scores through the generator's log-probabilities (the criterion
  is wrapped, so the step does not recognise it and takes the plain route);
* ``neither``: both taken out, the step as it was before.

Every variant starts from the same weights and runs the package's step
(``transformer_lib.training.train_step``, fused Adam, the trainer's clipping) on the
benchmark's batches, interleaved (``bench.common.interleaved_times``). Before timing, the two
routes of the loss are checked against each other (loss and every gradient) and the bit
mask's keep rate against 1 - p.
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
VARIANTS = ["package", "float_dropout", "unfused_loss", "neither"]


def float_dropout(self: nn.Dropout, x: Tensor) -> Tensor:
    """``Dropout.forward`` before the package adopted bit masks: one float per entry (CPU)."""
    if not self.training or self.p == 0:
        return x
    keep = torch.rand(x.shape, device=x.device) >= self.p
    return torch.where(keep, x * (1.0 / (1.0 - self.p)), 0.0)


class Plain(nn.Module):
    """A criterion the step does not recognise as ``LabelSmoothing``: it scores the
    generator's (tokens × vocabulary) log-probabilities, the plain route."""

    def __init__(self, ls: LabelSmoothing) -> None:
        super().__init__()
        self.ls = ls

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        return self.ls(x, target)


def build(name: str, cfg: BenchConfig, device: torch.device):
    """(model, step, criterion) of a variant: ``bench.train_steps``' ours_fp32 with a lever
    taken out."""
    model, _ = build_variant("ours_fp32", cfg, device)
    criterion: nn.Module = LabelSmoothing(cfg.vocab, PAD, cfg.smoothing).to(device)
    if name in ("float_dropout", "neither"):
        for m in model.modules():
            if isinstance(m, Dropout):
                m.forward = types.MethodType(float_dropout, m)
    if name in ("unfused_loss", "neither"):
        criterion = Plain(criterion)
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
    """The fused loss against the plain route: the loss and every gradient (no dropout)."""
    out = {}
    grads = []
    for name in ("unfused_loss", "package"):
        model, _, criterion = build(name, cfg, device)
        model.eval()  # no dropout: the two must compute the same function
        loss = real_token_loss(model, batch, criterion)
        loss.backward()
        out[name] = loss.item()
        grads.append([p.grad for p in model.parameters()])
    diff = max((a - b).abs().max().item() for a, b in zip(*grads))
    scale = max(a.abs().max().item() for a in grads[0])
    assert abs(out["package"] - out["unfused_loss"]) <= 1e-4 * abs(out["package"]), out
    assert diff <= 1e-4 * scale, (diff, scale)
    return {
        "loss_plain": out["unfused_loss"],
        "loss_fused": out["package"],
        "max_abs_grad_diff": diff,
        "max_abs_grad": scale,
    }


def check_bit_dropout(p: float = 0.1, n: int = 4_000_000) -> dict[str, float]:
    """The share of entries the package's bit mask keeps, and the kept entries' value."""
    d = Dropout(p).train()
    y = d(torch.ones(n))
    kept = (y != 0).double().mean().item()
    assert abs(kept - (1 - p)) < 5 * (p * (1 - p) / n) ** 0.5 + 2**-16, kept
    scale = 2**16 / (2**16 - round(p * 2**16))  # one over the kept probability
    assert torch.allclose(y[y != 0], torch.tensor(scale))
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
        per_round = [t / r for r, t in zip(ref, ts)]  # this one's time / the package's
        rows[name] = {
            "seconds_all": [round(t, 4) for t in ts],
            "seconds_median": statistics.median(ts),
            "mfu_fp32": flops / statistics.median(ts) / fp32_peak,
            "mfu_fp32_rounds": [flops / t / fp32_peak for t in ts],
            "package_speedup": statistics.median(ts) / statistics.median(ref),
            "package_speedup_per_round": per_round,
        }
        print(
            f"  {cfg.name} {name:17s} {rows[name]['seconds_median']:.3f} s/round, "
            f"MFU {rows[name]['mfu_fp32']:.0%}, the package x{rows[name]['package_speedup']:.2f} "
            f"({min(per_round):.2f}-{max(per_round):.2f}) as fast"
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
