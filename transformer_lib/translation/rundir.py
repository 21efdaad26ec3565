"""One run per directory: the lock, and the checks before a run starts or resumes (hand-written).

A run directory holds one run's checkpoints, tokenizer and metrics. Two processes training into
it at once, a new run started over an old one, or a resume with different settings would each
leave a directory mixing two runs, whose numbers belong to neither. ``start_run`` refuses them
all before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from transformer_lib.translation._fileio import FileLock, replace_file
from transformer_lib.translation.checkpoint import load_checkpoint, recover_checkpoint
from transformer_lib.translation.config import RESUMABLE_CHANGES, Config, config_from_saved
from transformer_lib.translation.distributed import on_rank0_then_share
from transformer_lib.translation.provenance import (
    PROVENANCE_FILE,
    read_provenance,
    write_provenance,
)

__all__ = ["start_run", "check_run_dir", "check_same_config", "epoch_snapshots"]


def start_run(cfg: Config, run_dir: Path, resume: bool, rank: int, world: int) -> FileLock | None:
    """Rank 0 takes the run directory's lock and checks it; then config.json is written.

    Returns the lock (rank 0; None on the others), to release when the run ends.
    """

    def start() -> FileLock:
        if resume and not run_dir.is_dir():
            check_run_dir(cfg, run_dir, resume)  # raises: do not create what we refuse
        _check_not_inside_checkpoint(run_dir)  # before mkdir adds a directory to it
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(run_dir / ".lock", what=f"run directory {run_dir}").acquire()
        try:
            check_run_dir(cfg, run_dir, resume)
            # which code on which machine made the numbers (tools/multi30k_report.py copies it);
            # first: a start that failed after it is recognized by it (_only_a_start)
            write_provenance(run_dir, resume=resume)
            config = json.dumps(dataclasses.asdict(cfg), indent=2)
            replace_file(run_dir / "config.json", config.encode("utf-8"))
        except BaseException:
            lock.release()
            raise
        return lock

    return on_rank0_then_share(start, rank, world)


def check_run_dir(cfg: Config, run_dir: Path, resume: bool) -> None:
    """Refuse what would silently mix two runs in one directory (before anything is written).

    A new run needs an empty or missing directory: it writes config.json, tokenizer.json,
    last/, best/ and more, over whatever has those names (a checkpoint's own files, another
    run's). A resume needs the run's ``last`` checkpoint: without it a "resumed" run would be
    a new one, written over the old run's files, and the config check would have nothing to
    compare with.
    """
    _check_not_inside_checkpoint(run_dir)
    held = _contents(run_dir)
    if not resume:
        if held and not _only_a_start(run_dir, held):
            raise FileExistsError(_occupied(run_dir, held))
        return
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} does not exist, so there is nothing to resume; "
            "start a new run without resume (--resume)"
        )
    last = run_dir / "last"
    if not recover_checkpoint(last):
        raise FileNotFoundError(_nothing_to_resume(run_dir, held))
    check_same_config(cfg, load_checkpoint(last, None)["config"], last)


def _check_not_inside_checkpoint(run_dir: Path) -> None:
    """Refuse a run directory inside a checkpoint (``RUN/last/nested``): the next save of that
    checkpoint replaces the whole directory, and this run with it. Links are followed: a
    link into another run's ``last/`` is inside it all the same."""
    try:
        real = run_dir.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a loop of links (Python < 3.13)
        raise ValueError(f"run directory {run_dir} cannot be resolved: {e}") from None
    for parent in real.parents:
        if (parent / "manifest.json").is_file():
            raise FileExistsError(
                f"run directory {run_dir} is inside the checkpoint {parent} (it holds "
                "manifest.json); the next save of that checkpoint would delete it: choose a "
                "run directory outside every checkpoint"
            )


# What the start of a run writes before it trains (start_run, then the tokenizer): a run that
# failed after writing them (data not found, a bad value found late) left nothing else.
_START_FILES = frozenset({"config.json", PROVENANCE_FILE, "tokenizer.json"})


def _only_a_start(run_dir: Path, held: list[str]) -> bool:
    """Whether `run_dir` holds only what the start of a run that failed before its first
    checkpoint wrote: a new run may write over those files, nothing of value is lost.

    Checked by content, not only by name: a config.json or tokenizer.json of the user's own
    is not the debris of a run. provenance.json, written first, must be a run's record, and
    config.json, if the start got that far, a run's config.
    """
    if not set(held) <= _START_FILES or PROVENANCE_FILE not in held:
        return False
    try:
        if "config.json" in held:
            saved = json.loads((run_dir / "config.json").read_text("utf-8"))
            # every key, as start_run writes it: {"mine": true} would pass as defaults
            if not isinstance(saved, dict) or set(saved) != set(dataclasses.asdict(Config())):
                return False
            config_from_saved(saved, run_dir)
        return read_provenance(run_dir) is not None
    except (OSError, ValueError, RecursionError):
        return False


def _contents(run_dir: Path) -> list[str]:
    """What `run_dir` holds, but for the run's own lock (taken before the check) and the
    temporary files of writes that a kill interrupted (``.config.json.tmp-*``): never data,
    they would otherwise make a directory that a run was killed in a moment after it started
    refuse both a new run and a resume."""
    if not run_dir.is_dir():
        return []
    # .NAME.tmp-PID-... (replace_file, replace_dir) and .NAME.XXXXXXXX.tmp (mkstemp's, of
    # save_tokenizer): a kill inside save_tokenizer left one that blocked every later start
    return sorted(p.name for p in run_dir.iterdir()
                  if p.name != ".lock" and not re.fullmatch(r"\.[^/]+\.(tmp-.+|\w+\.tmp)",
                                                            p.name))


def _listed(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def _occupied(run_dir: Path, held: list[str]) -> str:
    if "manifest.json" in held:
        return (f"{run_dir} is a checkpoint directory (it holds {_listed(held)}); a new run "
                "would overwrite it: choose another run directory")
    if "last" in held or "history.json" in held:
        return (f"{run_dir} already holds a run ({_listed(held)}); continue it with resume "
                "(--resume), or choose another run directory")
    return (f"{run_dir} is not empty (it holds {_listed(held)}); a new run would write over or "
            "beside these: choose another run directory, or an empty one")


def _nothing_to_resume(run_dir: Path, held: list[str]) -> str:
    last = run_dir / "last"
    if last.exists() and not last.is_dir():
        return (f"cannot resume {run_dir}: {last} is a file, not the checkpoint directory a "
                "run saves there; move it away, then resume (or start a new run elsewhere)")
    if not held:
        return (f"run directory {run_dir} is empty, so there is nothing to resume; start a new "
                "run without resume (--resume)")
    if "manifest.json" in held:
        return (f"{run_dir} is a checkpoint, not a run directory, so there is nothing to "
                "resume; resume the run directory that holds last/, or start a new run in "
                "another directory")
    if _only_a_start(run_dir, held):
        return (f"cannot resume {run_dir}: a run started there but stopped before its first "
                f"checkpoint ({run_dir / 'last'} is missing; it holds only {_listed(held)}), so "
                "there is no saved state to continue from; start a new run there without resume "
                "(--resume): it writes over these files")
    return (f"cannot resume {run_dir}: {run_dir / 'last'} is missing, so there is no saved state "
            f"to continue from (the directory holds {_listed(held)}); start a new run in "
            "another directory, or delete these files first")


def check_same_config(cfg: Config, saved: dict[str, Any], where: Path) -> None:
    """Raise ValueError listing every key outside ``RESUMABLE_CHANGES`` that differs."""
    now = dataclasses.asdict(cfg)
    # Read by today's rules: a key missing from the saved config did not exist yet when the
    # run started, so the run had its default's behavior.
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


def epoch_snapshots(run_dir: Path) -> list[Path]:
    """The run's per-epoch snapshots ``epoch_<n>``, oldest first.

    Sorted by the number, not the name: after ``epoch_999`` comes ``epoch_1000``, which sorts
    first as text, and keeping or averaging "the last k" would take the old ones. Other names
    (``epoch_3.bak``) are not snapshots of this run.
    """
    numbered = []
    for path in run_dir.glob("epoch_*"):
        if m := re.fullmatch(r"epoch_([0-9]+)", path.name):
            numbered.append((int(m[1]), path))
    return [path for _, path in sorted(numbered)]


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v
