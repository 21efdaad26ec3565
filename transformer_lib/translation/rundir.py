"""One run per directory: the lock, and the checks before a run starts or resumes (hand-written).

A run directory holds one run's checkpoints, tokenizer and metrics. Two processes training into
it at once, a new run started over an old one, or a resume with different settings would each
leave a directory mixing two runs, whose numbers belong to neither. ``start_run`` refuses them
all before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from transformer_lib.translation._fileio import FileLock
from transformer_lib.translation.checkpoint import load_checkpoint, recover_checkpoint
from transformer_lib.translation.config import RESUMABLE_CHANGES, Config, config_from_saved
from transformer_lib.translation.distributed import on_rank0_then_share
from transformer_lib.translation.provenance import write_provenance

__all__ = ["start_run", "check_run_dir", "check_same_config"]


def start_run(cfg: Config, run_dir: Path, resume: bool, rank: int, world: int) -> FileLock | None:
    """Rank 0 takes the run directory's lock and checks it; then config.json is written.

    Returns the lock (rank 0; None on the others), to release when the run ends.
    """

    def start() -> FileLock:
        if resume and not run_dir.is_dir():
            check_run_dir(cfg, run_dir, resume)  # raises: do not create what we refuse
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(run_dir / ".lock", what=f"run directory {run_dir}").acquire()
        try:
            check_run_dir(cfg, run_dir, resume)
            (run_dir / "config.json").write_text(
                json.dumps(dataclasses.asdict(cfg), indent=2), encoding="utf-8"
            )
            # which code on which machine made the numbers (tools/multi30k_report.py copies it)
            write_provenance(run_dir, resume=resume)
        except BaseException:
            lock.release()
            raise
        return lock

    return on_rank0_then_share(start, rank, world)


def check_run_dir(cfg: Config, run_dir: Path, resume: bool) -> None:
    """Refuse what would silently mix two runs in one directory (before anything is written)."""
    last = run_dir / "last"
    if resume and not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} does not exist, so there is nothing to resume; "
            "start a new run without resume (--resume)"
        )
    has_checkpoint = recover_checkpoint(last)
    if not resume and (has_checkpoint or (run_dir / "history.json").exists()):
        raise FileExistsError(
            f"{run_dir} already holds a run; continue it with resume (--resume), "
            "or choose another run directory"
        )
    if resume and has_checkpoint:
        check_same_config(cfg, load_checkpoint(last, None)["config"], last)


def check_same_config(cfg: Config, saved: dict[str, Any], where: Path) -> None:
    """Raise ValueError listing every key outside ``RESUMABLE_CHANGES`` that differs."""
    now = dataclasses.asdict(cfg)
    # Read by today's rules: a key missing from the saved config did not exist yet when the
    # run started, so the run had its default's behaviour.
    then = dataclasses.asdict(config_from_saved(saved, where))
    differ = [
        f"{k}: {then[k]!r} in the run, {now[k]!r} now"
        for k in now
        if k not in RESUMABLE_CHANGES and _jsonable(then[k]) != _jsonable(now[k])
    ]
    if differ:
        raise ValueError(
            f"cannot resume {where} with a different config ({'; '.join(differ)}); only "
            f"{sorted(RESUMABLE_CHANGES)} may change on resume: restore the other values, or "
            "start a new run in another directory"
        )


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v
