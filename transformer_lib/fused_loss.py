"""The generator, log-softmax and label-smoothed loss fused, for the training step (generated).

Written from chapters/06_training.ipynb (6. Training)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["generator_kl"]

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:  # only for the type hint: training imports this module
    from transformer_lib.training import LabelSmoothing

CHUNK = 256  # rows at a time: 256 x 8,000 fp32 logits are 8 MB


def generator_kl(h: Tensor, proj: nn.Linear, target: Tensor, ls: "LabelSmoothing") -> Tensor:
    """``ls(log_softmax(proj(h)), target)``, never storing (N, vocab) tensors.

    The generator's product, the log-softmax and the label-smoothed KL are
    computed CHUNK rows at a time, and so is the gradient, in the forward
    pass: d loss / d logits = softmax - p on a counted row (p the smoothed
    target), 0 on a padding row. No (N, vocab) tensor is kept for the
    backward pass, which only scales the stored gradients.

    Args:
        h: (N, d_model) hidden states, float32. proj: the generator's
            ``nn.Linear(d_model, vocab)`` (with a bias). target: (N,) ids,
            already checked. ls: a ``LabelSmoothing`` of size vocab.

    Returns the summed KL, a scalar (no second derivative). The same
    loss and gradients as the generator and ``ls`` up to rounding
    (tests/test_fused_loss.py). Defined in chapter 6.
    """
    return _GeneratorKL.apply(h, proj.weight, proj.bias, target, ls)


class _GeneratorKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, target, ls):
        pad, conf, spread = ls.padding_idx, ls.confidence, ls.spread
        grads = (torch.empty_like(h), torch.zeros_like(weight), torch.zeros_like(bias))
        total = h.new_zeros(())
        for r in range(0, h.size(0), CHUNK):
            hc, tc = h[r : r + CHUNK], target[r : r + CHUNK]  # (C, d), (C,)
            z = torch.addmm(bias, hc, weight.t())  # (C, V) logits
            lse = torch.logsumexp(z, 1)  # (C,)
            x_y = z.gather(1, tc[:, None]).squeeze(1) - lse  # log q(y)
            per_row = ls.row_entropy_term - conf * x_y
            if spread > 0:  # sum of log q over every class but padding
                non_pad = z.sum(1) - z[:, pad] - (ls.size - 1) * lse
                per_row = per_row - spread * (non_pad - x_y)
            counted = (tc != pad).to(z.dtype)  # (C,): padding rows add 0
            total += (per_row * counted).sum()
            g = z.sub_(lse[:, None]).exp_().sub_(spread)  # q - s: (C, V)
            g[:, pad] += spread  # padding's target probability is 0
            step = x_y.new_full((len(tc), 1), spread - conf)
            g.scatter_add_(1, tc[:, None], step)  # minus p on the true class
            g.mul_(counted[:, None])  # d KL / d z = q - p
            torch.mm(g, weight, out=grads[0][r : r + CHUNK])  # d / d h
            grads[1].addmm_(g.t(), hc)  # d / d weight
            grads[2].add_(g.sum(0))  # d / d bias
        ctx.save_for_backward(*grads)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        return (*(g * grad for g in ctx.saved_tensors), None, None)
