"""Several processes training one model (`torchrun`), and the device of this one (hand-written).

Started by ``torchrun --nproc_per_node=P``, every process runs the same training loop on every
P-th micro-batch; ``DistributedDataParallel`` averages their gradients. Started plainly, the
helpers below see one process of rank 0 and do nothing extra.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["default_device", "checked_device", "rank_and_world", "join_process_group",
           "leave_process_group", "barrier", "all_sum", "all_gather", "on_rank0_then_share"]


def default_device() -> torch.device:
    """This process's GPU (``LOCAL_RANK`` under torchrun) when there is one, else the CPU."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def checked_device(device: Any) -> torch.device:
    """`device` as a ``torch.device``, or a ValueError naming it if this machine has none such.

    Without it, ``"cuda"`` on a machine without a GPU fails inside a library with a message
    about pinned memory or accelerators, and ``"meta"`` (shapes, no data) as a corrupt file.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch.device or a name such as 'cpu' or 'cuda:0', "
                         f"got {device!r}") from None
    if dev.type == "meta":
        raise ValueError(f"device '{dev}' holds shapes but no data: load onto 'cpu' or a GPU")
    try:
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError) as e:  # AssertionError: torch built without CUDA
        why = str(e).strip().split("\n")[0].split(". ")[0]
        raise ValueError(f"device '{dev}' is not available on this machine ({why}); "
                         "use 'cpu' or a device it has") from None
    return dev


def rank_and_world() -> tuple[int, int]:
    """(this process's rank, number of processes); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def join_process_group(device: torch.device) -> bool:
    """Join the process group when started by torchrun (WORLD_SIZE > 1); True if joined here."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        world = int(raw)
    except ValueError:  # int()'s own message names neither the variable nor its origin
        raise ValueError(f"environment variable WORLD_SIZE must be an integer (the number of "
                         f"processes torchrun starts), got {raw!r}") from None
    if world <= 1 or dist.is_initialized():
        return False
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return True


def leave_process_group(wait: bool = True) -> None:
    """Wait for every process (`wait`), then leave the group ``join_process_group`` joined.

    Without `wait` (after an error), leave at once: the others may never reach a barrier.
    """
    if wait:
        dist.barrier()
    dist.destroy_process_group()


def barrier() -> None:
    """Wait until every process gets here (nothing to wait for outside a process group)."""
    if rank_and_world()[1] > 1:
        dist.barrier()


def all_sum(x: float, device: torch.device) -> float:
    """The sum of `x` over all processes (float64, so token counts stay exact)."""
    if rank_and_world()[1] == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def all_gather(obj: Any) -> list[Any]:
    """Every process's `obj`, in rank order (a one-element list outside a process group)."""
    world = rank_and_world()[1]
    if world == 1:
        return [obj]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj)
    return gathered


def on_rank0_then_share(work: Callable[[], Any], rank: int, world: int) -> Any:
    """Run `work` on rank 0; every rank raises if it failed (so none waits at a barrier)."""
    result, error = None, None
    if rank == 0:
        try:
            result = work()
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            error = e
    if world > 1:
        box = [None if error is None else f"{type(error).__name__}: {error}"]
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None and error is None:
            raise RuntimeError(f"rank 0 could not start the run: {box[0]}")
    if error is not None:
        raise error
    return result
