"""Batches, label smoothing, the Noam schedule and the training step (generated).

Written from chapters/06_training.ipynb (6. Training)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = [
    "Batch",
    "smoothed_kl_by_definition",
    "LabelSmoothing",
    "rate",
    "SimpleLossCompute",
    "TrainState",
    "real_token_loss",
    "train_step",
    "run_epoch",
    "copy_task_batches",
]

import contextlib
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm import tqdm

from transformer_lib.fused_loss import generator_kl
from transformer_lib.layers import Generator
from transformer_lib.masks import padding_mask, subsequent_mask


def _check_tokens(name: str, tokens: Tensor) -> None:
    """Raise ValueError unless `tokens` is a (batch, len) id tensor."""
    if not isinstance(tokens, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of token ids, got {type(tokens).__name__}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(
            f"{name} must hold integer token ids (e.g. torch.long), got {tokens.dtype}"
        )
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, len), got shape {tuple(tokens.shape)}")


class Batch:
    """A batch of token ids with its masks, ready for teacher-forced training.

    Args:
        src: (batch, S) source token ids.
        tgt: (batch, T) target ids, from the start symbol; None to infer.
        pad: the padding id (keyword-only; 0 is ``translation.data.PAD``).

    Attributes:
        src_mask: (batch, 1, S) bool, True at non-padding source tokens.
        tgt: (batch, T-1) decoder input: the target without its last token
            (shifted right).
        tgt_y: (batch, T-1) what the decoder must predict: the target without
            its first token.
        tgt_mask: (batch, T-1, T-1) bool, True where query i may attend to key
            j: j <= i and token j is not padding.
        ntokens: non-padding tokens in ``tgt_y`` (the loss's average).

    Paper sections 5.1 (batching) and 3.1 (teacher forcing). Chapter 6.
    """

    def __init__(self, src: Tensor, tgt: Tensor | None = None, *, pad: int = 0) -> None:
        _check_tokens("src", src)
        self.pad = pad
        self.src = src  # (batch, S)
        self.src_mask = padding_mask(src, pad)  # (batch, 1, S)
        self.tgt: Tensor | None = None
        self.tgt_y: Tensor | None = None
        self.tgt_mask: Tensor | None = None
        self.ntokens = 0
        if tgt is None:
            return
        _check_tokens("tgt", tgt)
        if tgt.size(0) != src.size(0):
            raise ValueError(
                f"tgt must have the same batch size as src ({src.size(0)}), got {tgt.size(0)}"
            )
        if tgt.size(1) < 2:
            raise ValueError(
                "tgt must have length >= 2 (a start symbol and at least one "
                f"token to predict), got length {tgt.size(1)}"
            )
        self.tgt = tgt[:, :-1]  # (batch, T-1) input: <s> y1 ... y_{T-2}
        self.tgt_y = tgt[:, 1:]  # (batch, T-1) expected: y1 ... y_{T-1}
        self.tgt_mask = self.make_std_mask(self.tgt, pad)  # (batch, T-1, T-1)
        self.ntokens = int((self.tgt_y != pad).sum())

    @staticmethod
    def make_std_mask(tgt: Tensor, pad: int) -> Tensor:
        """(batch, T, T) bool mask: each query sees the non-padding keys
        at or before its position."""
        keep = padding_mask(tgt, pad)  # (batch, 1, T): key is not padding
        # (batch, T, T): and the key is not in the query's future
        return keep & subsequent_mask(tgt.size(-1), device=tgt.device)

    def to(self, device: torch.device | str) -> "Batch":
        """Return a copy of the batch with every tensor moved to `device`."""
        out = Batch.__new__(Batch)
        for name, value in vars(self).items():
            moved = value.to(device) if isinstance(value, Tensor) else value
            setattr(out, name, moved)
        return out

    def __repr__(self) -> str:
        tgt = None if self.tgt is None else tuple(self.tgt.shape)
        src = tuple(self.src.shape)
        return f"Batch(src={src}, tgt={tgt}, ntokens={self.ntokens})"


def smoothed_kl_by_definition(x: Tensor, p: Tensor) -> Tensor:
    """Summed KL(p || exp(x)), p (N, V) targets, x (N, V) log-probabilities.

    The definition ``LabelSmoothing`` is checked against (and the benchmarks'
    textbook model uses); terms with p = 0 count 0, also where x = -inf.
    Chapter 6.
    """
    log_q = x.masked_fill(p == 0, 0.0)  # 0 * log q := 0, even if log q = -inf
    return (torch.xlogy(p, p) - p * log_q).sum()  # sum p log p - sum p log q


class LabelSmoothing(nn.Module):
    """KL divergence between a label-smoothed target and the prediction.

    The target puts 1 - smoothing on the true class, smoothing / (size - 2)
    on the others but padding, 0 on padding; padding rows do not count.
    Terms of target probability 0 add 0, even where log q = -inf: no NaN.

    Args:
        size: vocabulary size V. padding_idx: the padding id, never a class.
        smoothing: epsilon_ls in [0, 1) (0.1 in the paper; 0 is the NLL).

    ``forward(x, target)``: x (N, size) log-probabilities, target (N,) ids
    -> the summed KL in closed form, without the (N, size) target (built by
    ``self.true_dist`` for the last call). Paper section 5.4 (Szegedy et
    al., 2016). Defined in chapter 6.
    """

    def __init__(self, size: int, padding_idx: int, smoothing: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        if size < 2 or (smoothing > 0 and size < 3):
            raise ValueError(
                "size must be >= 2, and >= 3 when smoothing > 0 (padding, "
                "the true class and at least one class to spread the "
                f"smoothing mass over), got {size}"
            )
        if not 0 <= padding_idx < size:
            raise ValueError(f"padding_idx must be in [0, size={size}), got {padding_idx}")
        self.size = size
        self.padding_idx = padding_idx
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing
        # s, on each other class
        self.spread = smoothing / (size - 2) if smoothing > 0 else 0.0
        # sum of p log p over one counted row: c log c + (V - 2) s log s
        c, s = self.confidence, self.spread
        self.row_entropy_term = c * math.log(c) + ((size - 2) * s * math.log(s) if s > 0 else 0.0)
        # the target and dtype of the last call
        self._last: tuple[Tensor, torch.dtype] | None = None

    @property
    def true_dist(self) -> Tensor | None:
        """(N, size) target distribution of the last call (None before)."""
        return None if self._last is None else self.target_distribution(*self._last)

    def target_distribution(self, target: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """(N, size) smoothed target distribution for (N,) class ids."""
        shape = (target.size(0), self.size)
        dist = torch.full(shape, self.spread, dtype=dtype, device=target.device)
        # 1 - eps on the true class
        dist.scatter_(1, target.unsqueeze(1), self.confidence)
        dist[:, self.padding_idx] = 0  # padding is never a right answer
        # padding rows do not count (this writes those rows only)
        dist[target == self.padding_idx] = 0
        return dist

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        """Summed KL(true_dist || exp(x)) over all rows (a scalar)."""
        self._check(x.shape, target)
        self._last = (target.detach(), x.dtype)
        return _SmoothedKL.apply(x, target, self)

    def with_generator(self, h: Tensor, proj: nn.Linear, target: Tensor) -> Tensor:
        """``self(log_softmax(proj(h)), target)`` by ``generator_kl``: the
        same loss without storing (N, size) tensors (float32, a CPU)."""
        self._check((h.size(0), proj.out_features), target)
        self._last = (target.detach(), h.dtype)
        return generator_kl(h, proj, target, self)

    def _check(self, shape: tuple[int, ...], target: Tensor) -> None:
        """Name the bad argument: x of `shape`, or `target`."""
        if len(shape) != 2 or shape[1] != self.size:
            raise ValueError(
                f"x must be (N, size={self.size}) log-probabilities, got shape {tuple(shape)}"
            )
        if target.dim() != 1 or target.size(0) != shape[0]:
            raise ValueError(
                f"target must have shape (N,) = ({shape[0]},) to match x, "
                f"got shape {tuple(target.shape)}"
            )
        if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
            raise ValueError(f"target must hold integer class ids, got {target.dtype}")
        if target.numel() and not 0 <= int(target.min()) <= int(target.max()) < self.size:
            raise ValueError(
                f"target ids must be in [0, size={self.size}), got values in "
                f"[{int(target.min())}, {int(target.max())}]"
            )

    def closed_form(self, x: Tensor, target: Tensor) -> Tensor:
        """The summed KL by the closed form above, without input checks
        (the forward pass of ``_SmoothedKL``)."""
        pad = self.padding_idx
        x_y = x.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,) log q(y)
        per_row = self.row_entropy_term - self.confidence * x_y  # (N,)
        if self.spread > 0:
            # sum of log q over the classes but padding, slicing around its
            # column (it may be -inf: never subtract it); minus the true class
            non_pad = x[:, :pad].sum(1) + x[:, pad + 1 :].sum(1)  # (N,)
            per_row = per_row - self.spread * (non_pad - x_y)
            # q(y) = 0 makes the row's loss +inf, where the subtraction
            # above would give (-inf) - (-inf) = NaN
            per_row = per_row.masked_fill(x_y == float("-inf"), float("inf"))
        return per_row.masked_fill(target == pad, 0.0).sum()  # pad rows: 0


class _SmoothedKL(torch.autograd.Function):
    """Forward: ``LabelSmoothing.closed_form``. Backward: the gradient -p.

    Left to autograd, the closed form's gather, slice sums and masks would
    each send back an (N, V) gradient to add up; written directly, one pass
    suffices, since d KL(p || q) / d log q = -p.
    """

    @staticmethod
    def forward(ctx, x: Tensor, target: Tensor, ls: LabelSmoothing) -> Tensor:
        ctx.save_for_backward(target)
        ctx.ls, ctx.dtype = ls, x.dtype
        return ls.closed_form(x, target)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (target,) = ctx.saved_tensors
        p = ctx.ls.target_distribution(target, ctx.dtype)  # (N, V)
        # d loss / d x = -p, times the incoming gradient
        return p.mul_(-grad), None, None


def rate(step: int, model_size: int, factor: float, warmup: int) -> float:
    """The paper's learning rate: linear warm-up, then 1/sqrt(step) decay.

    lrate = factor * model_size^-0.5 * min(step^-0.5, step * warmup^-1.5).
    Step 0 counts as step 1 (``LambdaLR`` asks for it before any update).

    Args:
        step: number of optimizer updates done so far (>= 0).
        model_size: d_model (>= 1).
        factor: overall scale (>= 0; 1.0 in the paper).
        warmup: warm-up steps (>= 1; 4000 in the paper), where it peaks.

    Use as ``LambdaLR(optimizer, lambda s: rate(s, d_model, factor, warmup))``
    with base lr 1.0. Equation (3) of paper section 5.3. Chapter 6.
    """
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 step, got {warmup}")
    if model_size < 1:
        raise ValueError(f"model_size (d_model) must be >= 1, got {model_size}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0, got {factor}")
    step = max(step, 1)
    return factor * model_size**-0.5 * min(step**-0.5, step * warmup**-1.5)


class SimpleLossCompute:
    """Apply the generator to decoder states and score them with `criterion`.

    Args:
        generator: maps (batch, T, d_model) decoder states to (batch, T,
            vocab) log-probabilities.
        criterion: maps ((N, vocab) log-probabilities, (N,) targets) to a
            summed loss.

    ``__call__(x, y, norm)``: x (batch, T, d_model) decoder states, y (batch,
    T) target ids, norm the number of tokens to average over. Returns (summed
    loss, detached, for logging; loss / norm, to back-propagate). An
    all-padding batch (norm 0, loss 0) is divided by 1: a zero loss and
    gradient, not NaN. Paper section 5. Defined in chapter 6.
    """

    def __init__(self, generator: Callable[[Tensor], Tensor], criterion: nn.Module) -> None:
        self.generator = generator
        self.criterion = criterion

    def __call__(self, x: Tensor, y: Tensor, norm: float) -> tuple[Tensor, Tensor]:
        if norm < 0:
            raise ValueError(f"norm must be >= 0 (a token count), got {norm}")
        logp = self.generator(x)  # (batch, T, vocab)
        loss = self.criterion(logp.reshape(-1, logp.size(-1)), y.reshape(-1))
        return loss.detach(), loss / max(norm, 1)


@dataclass
class TrainState:
    """Counters of a training run, carried from epoch to epoch.

    Attributes:
        step: optimizer updates (what the learning-rate schedule counts).
        accum_step: batches back-propagated (step * accum, or fewer).
        samples: sequences (sentence pairs) trained on.
        tokens: non-padding target tokens trained on. Defined in chapter 6.
    """

    step: int = 0
    accum_step: int = 0
    samples: int = 0
    tokens: int = 0

    def count_update(self, batches: int, samples: int, tokens: int) -> None:
        """Count one optimizer update over `batches` batches holding
        `samples` sequences and `tokens` non-padding target tokens."""
        self.step += 1
        self.accum_step += batches
        self.samples += samples
        self.tokens += tokens


def real_token_loss(
    model: nn.Module,
    batch: Batch,
    criterion: Callable[[Tensor, Tensor], Tensor],
    *,
    precision: str = "fp32",
    forward: nn.Module | None = None,
) -> Tensor:
    """`criterion` summed over the real (non-padding) target tokens.

    The generator runs on those positions only (a padding one would cost a
    (d_model x vocab) product, then count 0). With our ``Generator`` and
    ``LabelSmoothing``, in fp32 on a CPU with gradients, it scores by
    ``LabelSmoothing.with_generator``: the same loss, no (N, vocab) tensor.

    Args:
        model: an ``EncoderDecoder``; batch: a `Batch` with targets.
        criterion: ((N, vocab) log-probabilities, (N,) targets) -> summed
            loss, computed in float32.
        precision: "fp32", or "bf16" (forward and generator under bfloat16
            autocast). forward: the module called (default `model`).

    Returns a scalar tensor (differentiable when gradients are enabled).
    Defined in chapter 6.
    """
    call = model if forward is None else forward
    device_type = batch.src.device.type
    bf16 = precision == "bf16"
    with torch.autocast(device_type, torch.bfloat16, enabled=bf16):
        # (batch, T, d_model)
        out = call(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
        real = batch.tgt_y != batch.pad  # (batch, T)
        if _fuses(model.generator, criterion, out):
            # the same loss without the (n_real, vocab) log-probabilities
            return criterion.with_generator(out[real], model.generator.proj, batch.tgt_y[real])
        logp = model.generator(out[real])  # (n_real, vocab)
    return criterion(logp.float(), batch.tgt_y[real])


def _fuses(generator: nn.Module, criterion: object, out: Tensor) -> bool:
    """Whether `LabelSmoothing.with_generator` takes over (faster: chapter 9;
    equal: tests): ours, float32 on a CPU, gradients wanted."""
    return (
        type(generator) is Generator
        and type(criterion) is LabelSmoothing
        and generator.proj.bias is not None
        and out.dtype == torch.float32
        and out.device.type == "cpu"
        and out.requires_grad
        # LayerNorm's output is float32 even under bf16 autocast
        and not torch.is_autocast_enabled("cpu")
    )


def train_step(
    model: nn.Module,
    batches: Sequence["Batch"],
    criterion: Callable[[Tensor, Tensor], Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    precision: str = "fp32",
    clip_norm: float | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    forward: nn.Module | None = None,
    loss_scale: float | None = None,
) -> tuple[float, int]:
    """One optimizer update over `batches`, whose gradients add up.

    Args:
        model, criterion, precision: as in `real_token_loss`, which scores
            each batch (e.g. ``LabelSmoothing`` as the criterion).
        batches: `Batch` objects with targets, on the model's device.
        optimizer: updated once, after every batch has been back-propagated.
        clip_norm: clip the global L2 norm of the gradients to this (None:
            no clipping). scheduler: stepped once after the update.
        forward: the module called (default `model`; e.g. its
            ``DistributedDataParallel`` wrapper, synced on the last batch).
        loss_scale: back-propagate ``loss * loss_scale`` (default: 1 / the
            real target tokens of all the batches: one big batch's update).

    Returns (summed loss over the real target tokens, their number); raises
    FloatingPointError, before updating, if the loss is not finite. The
    training step of paper section 5. Defined in chapter 6.
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f'precision must be "fp32" or "bf16", got {precision!r}')
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")
    if not batches:
        raise ValueError("batches must hold at least one Batch")
    if any(b.tgt_y is None for b in batches):
        raise ValueError("every batch must have targets (Batch(src, tgt, pad=...))")
    ntokens = sum(b.ntokens for b in batches)
    scale = 1.0 / max(ntokens, 1) if loss_scale is None else loss_scale
    call = model if forward is None else forward
    total = 0.0
    for i, b in enumerate(batches):
        # DDP averages gradients across processes at every backward; the
        # micro-batches before the last one need only add up locally
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not hasattr(call, "no_sync") else call.no_sync()
        with sync:
            # summed over the real tokens
            loss = real_token_loss(model, b, criterion, precision=precision, forward=call)
            (loss * scale).backward()
        total += loss.item()
    if not math.isfinite(total):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(
            f"the training loss is {total} (not finite): the run diverged; "
            "lower the learning rate or clip the gradients (clip_norm)"
        )
    if clip_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return total, ntokens


def run_epoch(
    data_iter: Iterable[Batch],
    model: nn.Module,
    loss_compute: SimpleLossCompute,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    mode: str = "train",
    accum: int = 1,
    train_state: TrainState | None = None,
    clip_norm: float | None = None,
    progress: bool = True,
    desc: str | None = None,
    history: list[float] | None = None,
) -> tuple[float, TrainState]:
    """Run the model over every batch once; in "train" mode also update it.

    Args:
        data_iter: `Batch` objects with targets, on the model's device.
        model: an ``EncoderDecoder``.
        loss_compute: ``SimpleLossCompute(model.generator, criterion)``;
            both modes score with its criterion (`real_token_loss`).
        optimizer: required to train. scheduler: stepped after each update.
        mode: "train" (dropout, gradients, updates) or "eval" (neither).
        accum: batches per optimizer update. Each group's losses are divided
            by the group's total token count, so an update equals one step
            on the concatenated batches; a shorter last group is applied too.
        train_state: counters to continue (None: a new `TrainState`).
        clip_norm: clip the global L2 norm of the gradients to this before
            each update (None: no clipping, as in the paper).
        progress: show a tqdm bar on stderr with the running loss, tok/s and
            learning rate. desc: its label (default: the mode).
        history: if given, the loss per token of every update is appended.

    Returns (loss per non-padding target token, the train state).
    The training procedure of paper section 5. Defined in chapter 6.
    """
    _check_epoch_args(mode, accum, clip_norm, optimizer)
    train = mode == "train"
    state = train_state if train_state is not None else TrainState()
    model.train(train)  # dropout on for training, off for evaluation
    total = len(data_iter) if hasattr(data_iter, "__len__") else None
    bar = tqdm(data_iter, total=total, desc=desc or mode, file=sys.stderr, disable=not progress)
    criterion = loss_compute.criterion
    total_loss, total_tokens, start = 0.0, 0, time.perf_counter()
    with torch.set_grad_enabled(train):
        for group in _groups(bar, accum if train else 1):
            if train:
                loss, ntokens = train_step(
                    model, group, criterion, optimizer, clip_norm=clip_norm, scheduler=scheduler
                )
                samples = sum(b.src.size(0) for b in group)
                state.count_update(len(group), samples, ntokens)
            else:
                (b,) = group
                loss = real_token_loss(model, b, criterion).item()
                ntokens = b.ntokens
            if history is not None:
                history.append(loss / max(ntokens, 1))
            total_loss += loss
            total_tokens += ntokens
            if progress:
                lr_of = optimizer if train else None
                _show(bar, total_loss, total_tokens, start, lr_of)
    bar.close()
    return total_loss / max(total_tokens, 1), state


def _check_epoch_args(
    mode: str,
    accum: int,
    clip_norm: float | None,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """Raise ValueError naming the first wrong argument of run_epoch."""
    if mode not in ("train", "eval"):
        raise ValueError(f'mode must be "train" or "eval", got {mode!r}')
    if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
        raise ValueError(f"accum must be an int >= 1, got {accum!r}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")
    if mode == "train" and optimizer is None:
        raise ValueError('optimizer is required when mode="train"')


def _groups(batches: Iterable[Batch], size: int) -> Iterator[list[Batch]]:
    """Consecutive lists of `size` batches (the last list may be shorter)."""
    it = iter(batches)
    while group := list(itertools.islice(it, size)):
        yield group


def _show(
    bar: tqdm,
    total_loss: float,
    total_tokens: int,
    start: float,
    optimizer: torch.optim.Optimizer | None,
) -> None:
    """Show the running loss per token, tokens/s and learning rate."""
    info = {"loss": f"{total_loss / max(total_tokens, 1):.3f}"}
    info["tok/s"] = f"{total_tokens / max(time.perf_counter() - start, 1e-9):.0f}"
    if optimizer is not None:
        info["lr"] = f"{optimizer.param_groups[0]['lr']:.1e}"
    bar.set_postfix(info, refresh=False)


def copy_task_batches(
    vocab: int,
    batch_size: int,
    n_batches: int,
    seq_len: int = 10,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Iterator[Batch]:
    """Random batches for the copy task, whose target is its source.

    Each sequence is the start symbol 1 followed by seq_len - 1 tokens drawn
    uniformly from {2, ..., vocab - 1}; id 0 is padding (never produced).

    Args:
        vocab: vocabulary size (>= 3). batch_size: sequences per batch (>= 1).
        n_batches: number of batches (>= 0).
        seq_len: length of each sequence including the start symbol (>= 2).
        generator: a seeded CPU ``torch.Generator`` for reproducible data.
        device: where the batches are put (default: the CPU).

    Yields ``Batch(src, src, pad=0)`` with src (batch_size, seq_len): the
    toy task of the Annotated Transformer (Rush, 2018). Defined in chapter 6.
    """
    if vocab < 3:
        raise ValueError(f"vocab must be >= 3 (padding 0, start 1, a token), got {vocab}")
    if batch_size < 1 or n_batches < 0:
        raise ValueError(
            f"batch_size must be >= 1 and n_batches >= 0, got {batch_size} and {n_batches}"
        )
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2 (start symbol + one token), got {seq_len}")
    for _ in range(n_batches):
        data = torch.randint(2, vocab, (batch_size, seq_len), generator=generator)
        data[:, 0] = 1  # start symbol
        batch = Batch(data, data.clone(), pad=0)  # masks on the CPU
        yield batch if device is None else batch.to(device)
