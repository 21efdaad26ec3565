"""The state of every random generator a training run draws from (hand-written).

A checkpoint stores it (``save_checkpoint(..., rng=True)``) so that a resumed run draws the
same dropout masks and shuffles as one that never stopped; ``checkpoint`` re-exports both
functions.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """The state of every random generator a training run draws from.

    torch's CPU generator (a uint8 tensor), every CUDA device's generator when CUDA is
    available, Python's ``random`` and NumPy's global generator. Restoring it with
    ``restore_rng_state`` makes the next random numbers (dropout masks, shuffles) the same.
    """
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set the generators from ``capture_rng_state()`` output (missing entries are left alone).

    CUDA states are restored only when the same number of CUDA devices is available: a
    checkpoint written on a GPU machine can still be resumed on a CPU one.
    """
    if "torch" in state:
        torch.set_rng_state(torch.as_tensor(state["torch"], dtype=torch.uint8).cpu())
    if "python" in state:
        random.setstate(_as_tuples(state["python"]))
    if "numpy" in state:
        np.random.set_state(_as_tuples(state["numpy"]))
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([t.cpu() for t in cuda])


def _as_tuples(x: Any) -> Any:
    """Lists back to tuples (for states that went through plain JSON elsewhere)."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, list) else x
