"""The training loop of a translation run (`python -m transformer_lib train`; hand-written).

The pieces it assembles — the model, `Batch`, `LabelSmoothing`, `rate`, `train_step`,
`TrainState` — are chapter 6's own. What it adds is what a real training run needs:
length-bucketed batches, gradient accumulation, `DistributedDataParallel`, per-epoch validation
loss and BLEU, atomic checkpoints that resume mid-epoch exactly, checkpoint averaging, a stop
with a clear error (keeping the last good checkpoint) when the loss diverges, and a time or
step budget. The run directory's lock and checks are ``rundir``'s.

The global batch of one optimizer step is ``accum * world_size`` micro-batches; each process takes
every ``world_size``-th one. The loss is normalized by the token count of the *global* batch, so
one process with ``accum=2`` and two processes with ``accum=1`` compute the same update.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from transformer_lib.training import Batch, LabelSmoothing, TrainState, rate, train_step
from transformer_lib.translation._fileio import replace_file
from transformer_lib.translation._resume import (
    CheckedState,
    optimizer_problem,
    restore_checked,
    rng_states,
    scheduler_problem,
)
from transformer_lib.translation.checkpoint import (
    average_checkpoints,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from transformer_lib.translation.config import Config, check_model_size
from transformer_lib.translation.data import (
    PAD,
    collate,
    encode_pairs,
    load_multi30k,
    load_tokenizer,
    make_batches,
    save_tokenizer,
    train_tokenizer,
)
from transformer_lib.translation.distributed import (
    all_gather,
    all_sum,
    barrier,
    checked_device,
    default_device,
    join_process_group,
    leave_process_group,
    rank_and_world,
)
from transformer_lib.translation.inference import translate_and_score, validation_loss
from transformer_lib.translation.precision import precision_note, resolve_precision
from transformer_lib.translation.rundir import epoch_snapshots, start_run

__all__ = ["RunState", "train", "make_optimizer", "lr_multiplier", "budget_spent"]


@dataclasses.dataclass
class RunState(TrainState):
    """Chapter 6's counters plus the resumable position of a run (every checkpoint's
    train_state). ``step``, ``accum_step``, ``samples`` and ``tokens`` count the global batch
    of all processes."""

    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0  # optimizer steps done in the current epoch
    train_seconds: float = 0.0
    best_bleu: float = -1.0
    history: list = dataclasses.field(default_factory=list)
    # The current epoch's summed training loss and target tokens over all processes, so a
    # resumed epoch reports the loss of the whole epoch, not of the steps after the resume.
    epoch_loss: float = 0.0
    epoch_tokens: int = 0


def _saved_state(saved: Any, where: Path) -> RunState:
    """The RunState a checkpoint saved, checked: a ValueError naming it, not a TypeError deep
    in the loop or a run that silently trains the wrong number of steps."""
    fields = {f.name: f for f in dataclasses.fields(RunState)}
    problem = None
    if not isinstance(saved, dict) or not {"step", "epoch"} <= saved.keys():
        problem = "it must be an object with at least step and epoch"
    elif unknown := sorted(set(saved) - set(fields)):
        problem = f"unknown key(s) {unknown}"
    else:
        for k, v in saved.items():
            kind = getattr(fields[k].type, "__name__", fields[k].type)  # a class, or its name
            if kind == "int" and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                problem = f"{k} must be an integer >= 0, got {v!r}"
            elif kind == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))
                                      or not math.isfinite(v) or v < -1):
                problem = f"{k} must be a finite number, got {v!r}"
            elif kind == "list" and not (isinstance(v, list)
                                         and all(isinstance(r, dict) for r in v)):
                problem = f"{k} must be a list of objects, got {v!r:.60}"
            if problem:
                break
        else:
            if saved.get("step_in_epoch", 0) > saved["step"]:
                problem = f"step_in_epoch {saved['step_in_epoch']} exceeds step {saved['step']}"
    if problem:
        raise ValueError(f"checkpoint {where}: its train_state is not one a run saved ({problem})")
    return RunState(**saved)


class _Data(NamedTuple):
    tok: Any  # the joint BPE tokenizer
    train: list  # training examples (ids), pairs longer than drop_longer_than dropped
    val: list  # validation examples, all of them
    val_pairs: list  # validation sentence pairs (text), for BLEU


@dataclasses.dataclass
class _Run:
    """What the steps of one training run share (so helpers take one argument, not ten)."""

    cfg: Config
    run_dir: Path
    device: torch.device
    rank: int
    world: int
    model: nn.Module
    forward: nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    scheduler: Any
    criterion: nn.Module
    data: _Data
    state: RunState
    saved_step: int | None = None  # step of the newest `last` checkpoint
    precision: str = "fp32"  # cfg.precision resolved on this machine ("auto": per machine)
    loss_sum: float = 0.0  # this process's share of the epoch's loss (see RunState.epoch_loss)
    tok_sum: int = 0


def train(
    cfg: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    device: torch.device | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train a model as `cfg` says, writing checkpoints and metrics into `run_dir`.

    Returns the history (per-epoch train loss, validation loss and BLEU; when the time limit
    stopped training inside an epoch, a last record with ``epoch_fraction``). `on_step(step)` is
    called after every optimizer step (tests use it to simulate an interruption). With
    `progress`, rank 0 first writes one line naming the precision (``precision_note``).
    Precision "auto" (and so ``fast``) resolves on the machine that runs, resumed runs too:
    every epoch's record names the precision it trained in. A resumed run whose step or time
    budget (or epochs) is already used up trains nothing and rewrites no checkpoint: the result's
    ``complete`` says so, and rank 0 a line on stderr.

    Raises before writing anything: ``LockHeld`` if another process trains in `run_dir`;
    ``FileExistsError`` if not `resume` and `run_dir` is not empty (a run, a checkpoint, any
    file); ``FileNotFoundError`` if `resume` and `run_dir` holds no ``last`` checkpoint (or
    does not exist); ``ValueError`` if `resume` and the config differs
    from the run's in a key outside ``RESUMABLE_CHANGES``. Raises ``FloatingPointError`` if
    the loss stops being finite: nothing after the last good checkpoint is saved.
    """
    cfg.validate()  # again: the fields of a dataclass can be assigned after it was made
    check_model_size(cfg)  # before the run directory is touched
    run_dir = Path(run_dir)
    device = default_device() if device is None else checked_device(device)
    joined = join_process_group(device)
    finished = False
    try:
        rank, world = rank_and_world()
        lock = start_run(cfg, run_dir, resume, rank, world)
        try:
            if progress and rank == 0:
                print(precision_note(cfg.precision, device, fast=cfg.fast), file=sys.stderr)
            run = _setup(cfg, run_dir, resume, device, rank, world)
            complete = _complete(run)
            partial = None if complete else _train_and_average(run, progress, on_step)
            if complete and rank == 0:  # an outcome, not progress: said even without it
                print(complete, file=sys.stderr)
                _finish_average(run)
        finally:
            if lock is not None:
                lock.release()
        finished = True
    finally:
        # Also after an error (a refused run directory, a bad value): a process that exits
        # still in its group can abort (SIGABRT) instead of reporting the error. After one,
        # no barrier: the other processes may have stopped elsewhere and would never come.
        if joined:
            leave_process_group(wait=finished)
    history = run.state.history + ([partial] if partial else [])
    return {"history": history, "steps": run.state.step, "minutes": run.state.train_seconds / 60,
            "precision": run.precision, "complete": bool(complete)}


def make_optimizer(cfg: Config, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """Adam with the config's betas, eps and weight decay (AdamW if `decoupled_weight_decay`).

    The learning rate is 1: the schedule (`lr_multiplier`) sets it at every step.
    """
    # fused: one kernel updates every parameter (PyTorch's foreach Adam makes several passes)
    common = dict(lr=1.0, betas=cfg.adam_betas, eps=cfg.adam_eps,
                  fused=device.type in ("cpu", "cuda") or None)
    if not cfg.decoupled_weight_decay:
        return torch.optim.Adam(model.parameters(), weight_decay=cfg.weight_decay, **common)
    params = list(model.parameters())  # a tied embedding appears once
    return torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        **common,
    )


def budget_spent(cfg: Config, step: int, train_seconds: float) -> float:
    """The fraction in [0, 1] of the run's budget used: steps or minutes, whichever is ahead."""
    spent = 0.0
    if cfg.max_steps:
        spent = step / cfg.max_steps
    if cfg.time_limit_min:
        spent = max(spent, train_seconds / (60 * cfg.time_limit_min))
    return min(spent, 1.0)


def lr_multiplier(cfg: Config, state: RunState | None = None) -> Callable[[int], float]:
    """The learning rate of optimizer step s, for ``LambdaLR`` with base lr 1.

    "noam" is chapter 6's `rate`; "linear" warms up alike to the same peak and holds it:
    peak * min(1, s / warmup). A cool-down then multiplies either by
    min(1, (1 - spent) / cooldown), a line that falls to 0 over the last `cooldown` of the
    budget ("linear" alone: cooldown 1, the fall starts at once; "noam" alone: none). With
    cooldown 0.4 "linear" stays at its peak for the first 60% of the budget.
    A time budget is read from `state.train_seconds` as training goes, so the line ends when
    the minutes end on any machine (`state` None: no time spent, for plots). A closure, not
    an object, so that the scheduler's saved state holds no config.
    """
    peak = rate(cfg.warmup, cfg.d_model, cfg.lr_factor, cfg.warmup)

    def multiplier(s: int) -> float:
        if cfg.schedule == "noam":
            lr = rate(s, cfg.d_model, cfg.lr_factor, cfg.warmup)
        else:
            lr = peak * min(1.0, max(s, 1) / cfg.warmup)
        if cfg.cooldown is None:  # "noam" alone ("linear" has 1.0: Config.__post_init__)
            return lr
        spent = budget_spent(cfg, s, state.train_seconds if state is not None else 0.0)
        return lr * min(1.0, (1.0 - spent) / cfg.cooldown)

    return multiplier


# --------------------------------------------------------------------------- starting


def _prepare_data(cfg: Config, run_dir: Path, tokenizer_file: Path | None, rank: int,
                  world: int) -> _Data:
    """A resumed run reads the tokenizer of its checkpoint (`tokenizer_file`, verified); a new
    run trains one (deterministic) and rank 0 saves it into the run directory."""
    train_pairs = load_multi30k("train", cfg.data_dir, cfg.src_lang, cfg.tgt_lang,
                                limit=cfg.train_limit)
    val_pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang,
                              limit=cfg.val_limit)
    if tokenizer_file is not None:
        tok = load_tokenizer(tokenizer_file)
    else:
        tok = train_tokenizer([s for pair in train_pairs for s in pair], vocab_size=cfg.vocab_size)
        if rank == 0:
            save_tokenizer(tok, run_dir / "tokenizer.json")
        if world > 1:
            barrier()
            tok = load_tokenizer(run_dir / "tokenizer.json")  # every rank uses rank 0's file
    # Training drops the few pairs longer than drop_longer_than subwords; validation keeps all.
    train = encode_pairs(train_pairs, tok, cfg.drop_longer_than)
    if not train:  # an epoch of no steps would save an untrained model as the run's best
        limit = f" (train_limit = {cfg.train_limit})" if cfg.train_limit else ""
        raise ValueError(f"config: drop_longer_than = {cfg.drop_longer_than} drops every one of "
                         f"the {len(train_pairs)} training pairs{limit}: each has more "
                         "subwords on one side; raise drop_longer_than")
    val = encode_pairs(val_pairs, tok)
    _check_positions(cfg, train, val)
    return _Data(tok, train, val, val_pairs)


def _check_positions(cfg: Config, train: list, val: list) -> None:
    """A learned position table has no row past max_positions: refuse data that needs more
    now, not after an epoch of training, in the validation loss (sinusoids extend)."""
    if cfg.arch != "transformer" or cfg.positional != "learned":
        return
    for split, examples in (("training", train), ("validation", val)):
        # the encoder reads ids + EOS, the decoder BOS + ids (``Batch`` drops the last EOS)
        need = max((max(len(s), len(t)) + 1 for s, t in examples), default=0)
        if need > cfg.max_positions:
            fix = (f", or lower drop_longer_than to {cfg.max_positions - 1}"
                   if split == "training" else " (validation keeps every pair)")
            raise ValueError(
                f"config: max_positions = {cfg.max_positions} is too small for the {split} "
                f"data: its longest pair needs {need} positions (subwords + EOS or BOS), and "
                f"positional = 'learned' has none past max_positions; raise max_positions to "
                f"{need} or more{fix}")


def _setup(cfg: Config, run_dir: Path, resume: bool, device: torch.device, rank: int,
           world: int) -> _Run:
    """Data, model, optimizer and schedule; with `resume`, their state from RUN/last."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    last = run_dir / "last"
    info = load_checkpoint(last, None) if resume else None  # rundir checked it is there
    data = _prepare_data(cfg, run_dir, info["tokenizer"] if info else None, rank, world)
    vocab = data.tok.get_vocab_size()
    check_model_size(cfg, vocab)
    model = cfg.build_model(vocab).to(device)
    optimizer = make_optimizer(cfg, model, device)
    state, saved_step = RunState(), None
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg, state))
    if info is not None:
        # checked before torch trusts them: wrong Adam moments crashed the fused Adam
        info = load_checkpoint(
            last, model, CheckedState(optimizer, optimizer_problem, "optimizer", last),
            CheckedState(scheduler, scheduler_problem, "scheduler", last), map_location=device)
        # in place: the schedule reads this object's progress
        vars(state).update(vars(_saved_state(info["train_state"], last)))
        saved_step = state.step
        # Every process continues from its own random state (dropout masks, shuffling).
        # Checkpoints written before the states had their own slot kept them in `extra`.
        restore_checked(restore_rng_state, rng_states(info, rank, last), last)
    forward = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    criterion = LabelSmoothing(vocab, PAD, cfg.label_smoothing)
    run = _Run(cfg=cfg, run_dir=run_dir, device=device, rank=rank, world=world, model=model,
               forward=forward, optimizer=optimizer, scheduler=scheduler, criterion=criterion,
               data=data, state=state, saved_step=saved_step,
               precision=resolve_precision(cfg.precision, device))
    if rank == 0:  # the epoch's loss so far counts once, on rank 0
        run.loss_sum, run.tok_sum = state.epoch_loss, state.epoch_tokens
    return run


# --------------------------------------------------------------------------- training


def _epoch_steps(cfg: Config, train: Sequence, epoch: int, world: int) -> list[list[list[int]]]:
    """The epoch's optimizer steps: each a list of accum*world micro-batches of indices."""
    batches = make_batches(train, cfg.max_tokens, shuffle=True, seed=cfg.seed * 1000 + epoch)
    per_step = cfg.accum * world
    return [batches[i : i + per_step] for i in range(0, len(batches) - per_step + 1, per_step)]


def _complete(run: _Run) -> str | None:
    """Why the run has nothing left to train (its budget or its epochs are used up), or None.

    Checked before any step: the budget is otherwise checked only after a step, and every
    resume of a finished run would train one more step and rewrite its checkpoints.
    """
    cfg, state = run.cfg, run.state
    if _out_of_budget(cfg, state):
        used = (f"max_steps = {cfg.max_steps}" if cfg.max_steps and state.step >= cfg.max_steps
                else f"time_limit_min = {cfg.time_limit_min}")
        return (f"run {run.run_dir} is complete: its budget ({used}) is used up at step "
                f"{state.step}; nothing was trained or saved (raise max_steps or "
                "time_limit_min to train further)")
    if state.epoch >= cfg.epochs:
        return (f"run {run.run_dir} is complete: it has trained all {cfg.epochs} epochs; "
                "nothing was trained or saved (raise epochs to train further)")
    return None


def _train_and_average(run: _Run, progress: bool, on_step: Callable[[int], None] | None):
    """Train the remaining epochs, then save the average of the last snapshots (rank 0)."""
    partial = _train_epochs(run, progress, on_step)
    averaged = _average_snapshots(run.run_dir, run.cfg.average_last) if run.rank == 0 else None
    if averaged is not None:
        run.model.load_state_dict(averaged, strict=False)
        _save(run, run.run_dir / "averaged", resumable=False)
    if run.rank == 0 and not (run.run_dir / "best").is_dir():  # else found missing much later
        print(f"no BLEU was computed (bleu_every = {run.cfg.bleu_every}, epochs = "
              f"{run.cfg.epochs}), so {run.run_dir / 'best'} was not written: evaluate "
              f"{run.run_dir / 'last'} or {run.run_dir / 'averaged'} instead", file=sys.stderr)
    return partial


def _finish_average(run: _Run) -> None:
    """Write `averaged` when a complete run lacks it, or holds one of an earlier end (a kill
    while averaging, after the last epoch): the end of the run is finished, not skipped."""
    snaps = epoch_snapshots(run.run_dir)[-run.cfg.average_last:]
    if run.cfg.average_last < 2 or len(snaps) < 2:
        return
    path = run.run_dir / "averaged"
    try:
        saved = load_checkpoint(path, None)["train_state"]
        if isinstance(saved, dict) and saved.get("step") == run.state.step:
            return
    except (OSError, ValueError):
        pass  # missing or damaged: written again
    averaged = _average_snapshots(run.run_dir, run.cfg.average_last)
    if averaged is not None:
        run.model.load_state_dict(averaged, strict=False)
        _save(run, path, resumable=False)
        print(f"{path} was missing or out of date (the run stopped while averaging): "
              "written now", file=sys.stderr)


def _train_epochs(run: _Run, progress: bool, on_step: Callable[[int], None] | None):
    """Train the remaining epochs; return the record of a time-limited partial epoch or None."""
    cfg, state = run.cfg, run.state
    t0 = time.perf_counter() - state.train_seconds
    for epoch in range(state.epoch, cfg.epochs):
        steps = _epoch_steps(cfg, run.data.train, epoch, run.world)
        if not steps:  # before any step: no checkpoint of an untrained model as "best"
            raise _no_steps(run, epoch)
        run.model.train()
        _train_steps(run, epoch, steps, t0, progress, on_step)
        out_of_time = _out_of_budget(cfg, state)
        partial = out_of_time and state.step_in_epoch < len(steps)
        record = _end_of_epoch(run, epoch, partial, len(steps))
        if out_of_time:
            return record if partial else None
    return None


def _no_steps(run: _Run, epoch: int) -> ValueError:
    cfg, per_step = run.cfg, run.cfg.accum * run.world
    n = len(make_batches(run.data.train, cfg.max_tokens, shuffle=True,
                         seed=cfg.seed * 1000 + epoch))
    pairs = f"{len(run.data.train)} training pairs" + (
        f" (train_limit = {cfg.train_limit})" if cfg.train_limit else "")
    return ValueError(
        f"config: epoch {epoch + 1} has no optimizer step: its {pairs} make {n} micro-batches "
        f"of max_tokens = {cfg.max_tokens}, fewer than the {per_step} one step needs "
        f"(accum = {cfg.accum} x {run.world} process(es)); lower accum or max_tokens, or "
        "raise train_limit"
    )


def _train_steps(run: _Run, epoch: int, steps: list, t0: float, progress: bool,
                 on_step: Callable[[int], None] | None) -> None:
    """The optimizer steps of one epoch from where the state says, until done or out of time."""
    from tqdm import tqdm

    cfg, state = run.cfg, run.state
    bar = tqdm(
        total=len(steps), initial=state.step_in_epoch, desc=f"epoch {epoch + 1}",
        disable=not progress or run.rank != 0, file=sys.stderr, dynamic_ncols=True,
    )
    tick, tick_tokens = time.perf_counter(), 0
    for micro in steps[state.step_in_epoch :]:
        loss, ntok, global_tokens = _step(run, micro)
        state.count_update(len(micro), sum(len(idx) for idx in micro), global_tokens)
        state.step_in_epoch += 1
        run.loss_sum, run.tok_sum = run.loss_sum + loss, run.tok_sum + ntok
        tick_tokens += ntok
        elapsed = time.perf_counter() - tick
        bar.set_postfix(loss=f"{loss / max(ntok, 1):.3f}",
                        lr=f"{run.scheduler.get_last_lr()[0]:.2e}",
                        **{"tok/s": f"{tick_tokens / max(elapsed, 1e-9):.0f}"})
        bar.update()
        state.train_seconds = time.perf_counter() - t0
        if state.step % cfg.save_every == 0:
            _save(run, run.run_dir / "last", resumable=True)
        if on_step is not None:
            on_step(state.step)
        if _out_of_budget(cfg, state):
            break
    bar.close()


def _out_of_budget(cfg: Config, state: RunState) -> bool:
    """True once the run's time limit or step budget is used up."""
    return budget_spent(cfg, state.step, state.train_seconds) >= 1.0


def _step(run: _Run, micro: list[list[int]]) -> tuple[float, int, int]:
    """One optimizer step over the global batch `micro` (this rank takes every world-th part).

    Returns this process's summed loss and target tokens, and the global batch's tokens.
    """
    batches = [Batch(*collate(run.data.train, idx, pad=PAD, device=run.device), pad=PAD)
               for idx in micro[run.rank :: run.world]]
    global_tokens = int(all_sum(sum(b.ntokens for b in batches), run.device))
    # DDP averages gradients over processes; scaling by world undoes that, so the update is
    # the sum of per-token losses over the global batch divided by its token count.
    scale = run.world / global_tokens if global_tokens else 1.0
    try:
        loss, ntok = train_step(
            run.model, batches, run.criterion, run.optimizer, precision=run.precision,
            clip_norm=run.cfg.clip_norm, scheduler=run.scheduler, forward=run.forward,
            loss_scale=scale,
        )
    except FloatingPointError as e:
        raise _diverged(run, str(e)) from e
    return loss, ntok, global_tokens


def _diverged(run: _Run, why: str) -> FloatingPointError:
    last = run.run_dir / "last"
    kept = (f"the last good checkpoint is {last} (step {run.saved_step})"
            if run.saved_step is not None else "no checkpoint was saved yet")
    return FloatingPointError(
        f"training diverged at step {run.state.step + 1} ({why}); nothing later was saved, "
        f"{kept}; lower lr_factor, raise warmup or set clip_norm, then resume or start again"
    )


# --------------------------------------------------------------------------- epochs' ends


def _end_of_epoch(run: _Run, epoch: int, partial: bool, n_steps: int) -> dict[str, Any]:
    """Validate, snapshot, keep the best by validation BLEU; return the epoch's record.

    When the time limit stops training inside an epoch, the partial epoch gets the same
    treatment (its record says how much of the epoch it saw), so its training counts in
    `best` and `averaged`; it is kept out of the resumable state, so resuming finishes the
    epoch and then replaces the partial record and snapshot with the full ones.
    """
    cfg, state = run.cfg, run.state
    loss_sum, tok_sum = all_sum(run.loss_sum, run.device), all_sum(run.tok_sum, run.device)
    record = {"epoch": epoch + 1, "step": state.step, "tokens": state.tokens,
              "train_loss": loss_sum / max(tok_sum, 1), "minutes": state.train_seconds / 60,
              "precision": run.precision}
    if not partial:
        state.epoch, state.step_in_epoch = epoch + 1, 0
        run.loss_sum, run.tok_sum = 0.0, 0
    else:
        record["epoch_fraction"] = round(state.step_in_epoch / n_steps, 4)
    if run.rank == 0:
        record["val_loss"] = validation_loss(
            run.model, run.data.val, max_tokens=cfg.max_tokens,
            label_smoothing=cfg.label_smoothing, precision=run.precision,
        )
        if cfg.bleu_every and ((epoch + 1) % cfg.bleu_every == 0 or partial):
            scored = translate_and_score(run.model, run.data.tok, cfg, run.data.val_pairs,
                                         beam_size=1, precision=run.precision)
            record["val_bleu"] = scored["bleu_unrounded"]
        if not partial:
            state.history.append(record)
        _save(run, run.run_dir / f"epoch_{epoch + 1:03d}", resumable=False)
        _prune_snapshots(run.run_dir, cfg.keep_last)
        if record.get("val_bleu", -1.0) > state.best_bleu:
            state.best_bleu = record["val_bleu"]
            _save(run, run.run_dir / "best", resumable=False)
        history = state.history + ([record] if partial else [])
        replace_file(run.run_dir / "history.json", json.dumps(history, indent=2).encode("utf-8"))
    _save(run, run.run_dir / "last", resumable=True)
    return record


def _prune_snapshots(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` epoch snapshots."""
    for old in epoch_snapshots(run_dir)[:-keep]:
        shutil.rmtree(old)


def _average_snapshots(run_dir: Path, n: int) -> dict[str, torch.Tensor] | None:
    """The mean weights of the newest `n` epoch snapshots; None when fewer than two."""
    snaps = epoch_snapshots(run_dir)[-n:] if n > 1 else []
    return average_checkpoints(snaps) if len(snaps) > 1 else None


def _save(run: _Run, path: Path, *, resumable: bool) -> None:
    """Atomic checkpoint by rank 0 of finite weights.

    `resumable` (RUN/last; every rank calls it): with the optimizer, the schedule, every
    rank's RNG state and the epoch's loss so far, so resuming is exact. Otherwise (snapshots,
    best, averaged; rank 0 alone): the weights, config, tokenizer, train state and RNG state.
    """
    bad = [n for n, p in run.model.named_parameters() if not torch.isfinite(p).all()]
    if bad:  # e.g. an infinite gradient norm under clipping: the loss is still finite
        raise _diverged(run, f"weights {bad[:3]} are not finite")
    state, rng = run.state, [capture_rng_state()]
    if resumable:
        state = dataclasses.replace(state, epoch_loss=all_sum(run.loss_sum, run.device),
                                    epoch_tokens=int(all_sum(run.tok_sum, run.device)))
        rng = all_gather(rng[0])
    if run.rank == 0:
        save_checkpoint(
            path, run.model, dataclasses.asdict(run.cfg),
            optimizer=run.optimizer if resumable else None,
            scheduler=run.scheduler if resumable else None,
            train_state=dataclasses.asdict(state), tokenizer=run.data.tok, rng=rng,
        )
    if resumable:
        run.saved_step = state.step
        barrier()
