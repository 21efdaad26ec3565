"""Where a number came from: commit, local changes, machine, torch (hand-written, not generated).

One record, written by one function and read by everything that records results: the trainer
(``RUN/provenance.json`` when a run starts), the benchmarks (``bench/common.py``), the ablations
(``tools/ablations.py``), the report that scores a run (``tools/multi30k_report.py`` copies the
run's file, so the commit and machine are the trainer's, not the scorer's) and
``tools/envcheck.py``.

Standard library only at import time (torch is imported inside the function that needs it), so
that ``tools/envcheck.py`` can load this file when the install itself is what is broken. This
module is the one place in the repository's Python code that asks git for the commit.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["provenance", "write_provenance", "read_provenance", "PROVENANCE_FILE"]

ROOT = Path(__file__).resolve().parents[2]  # the repository (transformer_lib/translation/..)
PROVENANCE_FILE = "provenance.json"
# The CPU features that decide which matmul kernels run: x86 (AVX2/FMA; AVX-512, its bfloat16
# and VNNI instructions; AMX tiles) and Arm (NEON, SVE, bfloat16 and int8 matmul instructions).
CPU_FLAGS = frozenset({
    "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile",
    "asimd", "sve", "sve2", "bf16", "i8mm",
})  # fmt: skip


def _git(root: Path, *args: str) -> str | None:
    """`git ARGS` in `root`; None when git is missing, `root` is no repository, or git fails."""
    if not (root / ".git").exists():  # not our checkout (an installed copy inside another repo)
        return None
    try:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _commit(root: Path) -> tuple[str | None, bool | None]:
    head = _git(root, "rev-parse", "--verify", "HEAD")
    if not head:
        return None, None
    # Records are what the tools write, not code that runs: a benchmark run right after
    # another (whose new results are not committed yet) measures committed code.
    changed = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".",
                   ":!results", ":(exclude,glob)experiments/**/*.json")
    return head, None if changed is None else bool(changed)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none: macOS, Windows)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _cpu_model(info: dict[str, str]) -> str:
    if "model name" in info:
        return info["model name"]
    if sys.platform == "darwin":
        try:
            return subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True, text=True, timeout=10, check=True,
            ).stdout.strip()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _torch() -> tuple[dict[str, Any], bool | None]:
    """torch's version, threads and CPU kernel level; whether the CPU runs bfloat16 natively."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 (a broken install is recorded, not raised)
        return {"version": None, "threads": None, "error": f"{type(e).__name__}: {e}"}, None
    info = {
        "version": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    try:  # the rule precision "auto" follows: bf16 instructions, and oneDNN allowed to use them
        from transformer_lib.translation.precision import cpu_bf16_native

        native = cpu_bf16_native()
    except Exception:  # noqa: BLE001 (a broken package is recorded as unknown, not raised)
        native = None
    return info, native


def provenance(root: str | Path | None = None) -> dict[str, Any]:
    """Where a result comes from, as a JSON-able dict.

    Keys:
        commit: the full hash of the checked-out commit (``HEAD``), or None when git is
            missing or `root` is not a git checkout.
        dirty: whether tracked files differ from that commit (staged or not), not counting
            ``results/`` and the JSON records of ``experiments/`` (what the tools write, not
            code that runs) and not counting untracked files; None when the commit is unknown.
        machine: ``cpu_model``; ``cpu_flags``, the CPU features that decide the matmul kernels
            (see ``CPU_FLAGS``; empty where /proc/cpuinfo is missing); ``logical_cores``; ``os``;
            ``bf16_native``, whether the CPU computes bfloat16 in hardware: bf16 instructions
            (x86 AVX512_BF16 or AMX-BF16, Arm BF16) that ``ONEDNN_MAX_CPU_ISA`` does not switch
            off (elsewhere bf16 autocast is emulated and slower than fp32; precision "auto"
            picks bf16 exactly where this is true; None when torch or the package cannot be
            imported).
        torch: ``version``, ``threads`` (intra-op), ``cpu_capability`` (the kernels ATen
            dispatches to); with ``error`` instead when torch cannot be imported.
        python: the Python version.

    Args:
        root: the git checkout to describe (default: the repository holding this package).
    """
    commit, dirty = _commit(Path(root) if root is not None else ROOT)
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    torch_info, bf16_native = _torch()
    return {
        "commit": commit,
        "dirty": dirty,
        "machine": {
            "cpu_model": _cpu_model(info),
            "cpu_flags": sorted(CPU_FLAGS & flags),
            "logical_cores": os.cpu_count(),
            "os": platform.platform(),
            "bf16_native": bf16_native,
        },
        "torch": torch_info,
        "python": platform.python_version(),
    }


def read_provenance(run_dir: str | Path) -> dict[str, Any] | None:
    """The record :func:`write_provenance` left in `run_dir`; None when there is none.

    Raises ValueError naming the file when it exists but is not a JSON object with a
    ``commit`` (a damaged record must not pass for a run without one).
    """
    path = Path(run_dir) / PROVENANCE_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: also 5,000 digits
        raise ValueError(f"{path}: unreadable provenance record ({e})") from e
    if not isinstance(record, dict) or "commit" not in record:
        raise ValueError(f"{path}: not a provenance record (a JSON object with a commit)")
    return record


def write_provenance(run_dir: str | Path, *, resume: bool = False) -> Path:
    """Write ``RUN_DIR/provenance.json`` atomically; return its path.

    A new run: :func:`provenance` with the time (``date``, UTC) and ``recorded_at: "start"``.
    A resumed run keeps the record of its start and appends this process's record (with its
    date) to its ``resumes`` list, so a run continued on other code or another machine says
    so; a run started before these records existed gets one with ``recorded_at: "resume"``
    (where it started is unknown). The file is written beside its final name, flushed to disk
    and renamed into place: a crash leaves the old file or the new one, never half of one.
    """
    from ._fileio import fsync_dir, write_durably  # here: provenance() needs the stdlib alone

    run_dir = Path(run_dir)
    path = run_dir / PROVENANCE_FILE
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    record = {**provenance(), "date": now}
    try:
        started = read_provenance(run_dir) if resume else None
    except ValueError:  # a damaged record: start a new one rather than refuse to resume
        started = None
    if started is not None:
        earlier = started.get("resumes", [])  # "resumes": 5 was a TypeError at every resume
        earlier = earlier if isinstance(earlier, list) else [{"damaged": repr(earlier)[:200]}]
        record = {**started, "resumes": [*earlier, record]}
    else:
        record["recorded_at"] = "resume" if resume else "start"
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{PROVENANCE_FILE}.tmp-{os.getpid()}"
    try:
        write_durably(tmp, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(run_dir)
    return path
