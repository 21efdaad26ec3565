"""Checks of the trainer state a resumed run loads from ``RUN/last`` (hand-written, private).

A checkpoint is input: its optimizer, scheduler and RNG states go into torch and Python
objects that trust them. Adam moments of another shape made the fused Adam write out of
bounds (SIGSEGV, the run's lock left behind); a scheduler state's unknown keys become the
scheduler's attributes; a crafted RNG state failed in ``random.setstate`` with a TypeError.
Each is checked against the objects it is loaded into, and refused by a ValueError naming
the checkpoint and the entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__: list[str] = []  # private: imported by name from loop.py


class CheckedState:
    """Loads a state into `target` only after ``check(state, target)`` found nothing wrong
    (a message, or None); passed to ``load_checkpoint`` in place of the optimizer or the
    scheduler."""

    def __init__(self, target: Any, check: Callable[[Any, Any], str | None], what: str,
                 where: Path) -> None:
        self.target, self.check, self.what, self.where = target, check, what, where

    def load_state_dict(self, state: Any) -> None:
        problem = self.check(state, self.target)
        if problem is None:
            try:
                self.target.load_state_dict(state)
                return
            except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as e:
                problem = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"checkpoint {self.where}: its {self.what} state is not one this run "
                         f"saved ({problem})")


def _like(saved: Any, current: Any) -> bool:
    """Whether `saved` has the type (and for tensors the shape) of `current`."""
    if current is None or isinstance(current, str):
        return saved is None or isinstance(saved, str)
    if isinstance(current, bool):
        return isinstance(saved, bool)
    if isinstance(current, (int, float)):
        return (not isinstance(saved, bool) and isinstance(saved, (int, float))
                and math.isfinite(saved))
    if isinstance(current, (list, tuple)):
        return (isinstance(saved, (list, tuple)) and len(saved) == len(current)
                and all(_like(s, c) for s, c in zip(saved, current)))
    if isinstance(current, torch.Tensor):
        return isinstance(saved, torch.Tensor) and saved.shape == current.shape
    if isinstance(current, Mapping):
        return isinstance(saved, Mapping) and all(
            k in current and _like(v, current[k]) for k, v in saved.items())
    return False


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def optimizer_problem(saved: Any, optimizer: torch.optim.Optimizer) -> str | None:
    """What is wrong with an optimizer state for `optimizer`, or None: its groups must hold
    as many parameters, their settings the same types, and every tensor of a parameter's
    state (Adam's moments) that parameter's shape; ``step`` a count."""
    if not (isinstance(saved, Mapping) and isinstance(saved.get("state"), Mapping)
            and isinstance(saved.get("param_groups"), list)):
        return "it must be an object with 'state' and 'param_groups'"
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        return f"{len(saved['param_groups'])} parameter groups, the optimizer has {len(groups)}"
    params: dict[Any, torch.Tensor] = {}
    for i, (s, g) in enumerate(zip(saved["param_groups"], groups)):
        if not isinstance(s, Mapping) or not isinstance(s.get("params"), list) \
                or len(s["params"]) != len(g["params"]):
            return f"param_groups[{i}] must list {len(g['params'])} parameters"
        for key, value in s.items():
            if key != "params" and not (_like(value, g[key]) if key in g else _scalar(value)):
                return f"param_groups[{i}].{key} = {value!r:.40}"
        for sid, p in zip(s["params"], g["params"]):
            if isinstance(sid, bool) or not isinstance(sid, int) or sid in params:
                return f"param_groups[{i}] lists parameter {sid!r:.20} (not a new integer id)"
            params[sid] = p
    for sid, entry in saved["state"].items():
        if sid not in params or not isinstance(entry, Mapping):
            return f"a state for parameter {sid!r:.20}, which no group lists"
        p = params[sid]
        for name, value in entry.items():
            if name == "step":
                number = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 \
                    else value
                if isinstance(number, bool) or not isinstance(number, (int, float)) \
                        or not 0 <= number < 2**53:
                    return f"parameter {sid}: step = {value!r:.40}"
            elif not (isinstance(value, torch.Tensor) and value.is_floating_point()
                      and value.shape == p.shape):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else \
                    type(value).__name__
                return (f"parameter {sid}: {name} is {shape}, the parameter "
                        f"{tuple(p.shape)} of floating point numbers")
    return None


def scheduler_problem(saved: Any, scheduler: Any) -> str | None:
    """What is wrong with a scheduler state, or None: every key one of the scheduler's, of
    its type (an unknown key would become an attribute: "step" would hide the method)."""
    current = scheduler.state_dict()
    if not isinstance(saved, Mapping):
        return "it must be an object"
    for key, value in saved.items():
        if key not in current:
            if hasattr(scheduler, key) or not _scalar(value):
                return f"unknown key {key!r:.40}"
        elif not _like(value, current[key]):
            return f"{key} = {value!r:.40}"
    return None


def rng_states(info: Mapping[str, Any], rank: int, where: Path) -> Mapping[str, Any]:
    """This rank's saved RNG state, checked to be one (restore_rng_state then sets it)."""
    saved = (info["extra"] or {}).get("rng") if isinstance(info["extra"], Mapping) else None
    saved = saved or info["rng"]
    if not saved or not isinstance(saved, list):
        raise ValueError(f"checkpoint {where} holds no RNG state, which a resumed run "
                         "continues from; resume from a checkpoint the run saved")
    state = saved[rank] if rank < len(saved) else saved[0]
    if not isinstance(state, Mapping):
        raise ValueError(f"checkpoint {where}: its RNG state must be an object, got "
                         f"{type(state).__name__}")
    return state


def restore_checked(restore: Callable[[Mapping[str, Any]], None], state: Mapping[str, Any],
                    where: Path) -> None:
    """``restore_rng_state(state)``, its errors (a crafted state) named after the checkpoint."""
    try:
        restore(state)
    except (TypeError, ValueError, RuntimeError, IndexError, KeyError, OverflowError) as e:
        raise ValueError(f"checkpoint {where}: its RNG state is not one a run saved "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
