"""Print what a bug report needs to know about this machine, in one block to paste.

    python tools/tasks.py envcheck        (or: make envcheck, or .venv/bin/python tools/envcheck.py)

Sections: system, python, torch (build, CUDA/MPS, threads, bfloat16 on the CPU), packages (every
pin in constraints.txt against what is installed; mismatches marked), data (where Multi30k is
looked for and whether its files are there), repository (commit, local changes), provenance
(the record results carry: transformer_lib.translation.provenance.provenance(), as JSON).

Standard library only at the top: it must run when the install itself is what failed. Each
section catches its own errors and prints them, so one broken package never hides the rest; the
exit status is 0 whenever the report could be printed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import platform
import re
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
# The six files transformer_lib.translation.data verifies (its SHA256 table); repeated so that
# the data section still answers when the package cannot be imported.
MULTI30K_FILES = [
    f"{stem}.{lang}.gz" for stem in ("train", "val", "test_2016_flickr") for lang in ("de", "en")
]


def system() -> list[str]:
    return [
        f"os: {platform.platform()}",
        f"machine: {platform.machine()} ({os.cpu_count()} logical CPUs)",
    ]


def python() -> list[str]:
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    return [
        f"version: {platform.python_implementation()} {platform.python_version()}",
        f"executable: {sys.executable} ({'virtual environment' if in_venv else 'no venv'})",
    ]


def _bf16_checks(torch) -> list[str]:  # noqa: ANN001 (torch is imported lazily)
    lines = []
    try:
        # 2 x 2 ones times ones is exactly 2 in every entry, representable in bfloat16.
        a = torch.ones(2, 2, dtype=torch.bfloat16)
        ok = bool(((a @ a) == 2).all())
        lines.append(f"bf16 matmul (CPU): {'works' if ok else 'WRONG RESULT'}")
    except Exception as e:  # noqa: BLE001 (the report shows any failure)
        lines.append(f"bf16 matmul (CPU): FAILS ({type(e).__name__}: {e})")
    try:
        # What precision "bf16" uses: autocast runs linear layers in bfloat16 on the CPU.
        x, w = torch.ones(2, 4), torch.ones(3, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.nn.functional.linear(x, w)
        ok = y.dtype == torch.bfloat16 and bool((y.float() == 4).all())
        lines.append(f"bf16 autocast (CPU): {'works' if ok else f'not applied ({y.dtype})'}")
    except Exception as e:  # noqa: BLE001
        lines.append(f"bf16 autocast (CPU): FAILS ({type(e).__name__}: {e})")
    return lines + [_bf16_native_line()]


def _bf16_native_line() -> str:
    """Native bf16 or emulated (slower than fp32), why, and what precision "auto" picks.

    Native means bf16 instructions (x86 AVX512_BF16 or AMX-BF16, Arm BF16) that
    ONEDNN_MAX_CPU_ISA does not switch off: transformer_lib.translation.precision's rule.
    """
    try:
        import torch

        from transformer_lib.translation import precision

        auto = precision.resolve_precision("auto", "cpu")  # bf16 exactly where it is native
        caps = torch.cpu.get_capabilities()
    except Exception as e:  # noqa: BLE001 (the package may be what is broken)
        return f"bf16 native (CPU): unknown (transformer_lib: {type(e).__name__}: {e})"
    flags = [f for f in precision.BF16_FLAGS if caps.get(f) is True]
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if auto == "bf16":
        return (f'bf16 native (CPU): yes ({", ".join(flags)}); precision "auto" and --fast '
                "use bf16")
    if not flags:
        why = "no AVX512_BF16, AMX-BF16 or Arm BF16 instructions"
    elif isa and isa.strip().upper() in precision.ISA_WITHOUT_BF16:
        why = (f"the CPU has {', '.join(flags)}, but ONEDNN_MAX_CPU_ISA={isa} holds oneDNN "
               "below them")
    else:
        why = "torch has no oneDNN"
    return (f"bf16 native (CPU): no ({why}: bf16 is emulated, slower than fp32); "
            'precision "auto" and --fast use fp32')


def torch_section() -> list[str]:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 (a broken torch install is what the report is for)
        return [f"NOT IMPORTABLE: {type(e).__name__}: {e}"]
    mps = getattr(torch.backends, "mps", None)
    cpu = getattr(torch.backends, "cpu", None)
    lines = [
        f"version: {torch.__version__} (git {torch.version.git_version[:12]})",
        f"cuda: build {torch.version.cuda or 'none (CPU build)'}, "
        f"available {torch.cuda.is_available()}",
        f"mps available: {bool(mps and mps.is_available())}",
        f"cpu capability: {cpu.get_cpu_capability() if cpu else 'unknown'}",
        f"threads: {torch.get_num_threads()} intra-op, {torch.get_num_interop_threads()} "
        f"inter-op (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})",
    ]
    return lines + _bf16_checks(torch)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a constraints file, by normalized name."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_normalize(name)] = version.strip()
    return pins


def packages() -> list[str]:
    path = ROOT / "constraints.txt"
    if not path.exists():
        return [f"{path} not found"]
    pins = read_pins(path)
    rows, bad = [], []
    for name, pinned in sorted(pins.items()):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "missing"
        # "2.13.0+cpu" is the pinned 2.13.0 (constraints.txt drops PyTorch's local label).
        same = installed.split("+", 1)[0] == pinned
        if not same:
            bad.append(name)
        rows.append(f"{'  ' if same else '!!'} {name:32} {installed:16} pin {pinned}")
    summary = f"{len(pins) - len(bad)} of {len(pins)} match constraints.txt"
    if bad:
        listed = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        summary += f"; mismatched or missing (!!): {listed}"
    return [summary, *rows]


def data() -> list[str]:
    env, url = os.environ.get("MULTI30K_DIR"), os.environ.get("MULTI30K_URL")
    try:
        from transformer_lib.translation.data import default_data_dir

        where, how = default_data_dir(), "transformer_lib.translation.data.default_data_dir()"
    except Exception as e:  # noqa: BLE001 (torch may be what is broken)
        # The package's own rule, restated: $MULTI30K_DIR, else the user cache (XDG's rule).
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
        where = Path(env).expanduser() if env else base / "transformer_lib" / "multi30k"
        how = f"package not importable ({type(e).__name__}), looked where it would"
    present = [f for f in MULTI30K_FILES if (where / f).is_file()]
    if len(present) == len(MULTI30K_FILES):
        missing = ""
    elif env:  # an existing copy is never downloaded into
        missing = " (MULTI30K_DIR must hold all six: chapter 8 and training need them)"
    else:
        missing = f" (missing ones are downloaded on first use from {url or 'upstream'})"
    kind = "MULTI30K_DIR, an existing copy" if env else "the download cache"
    lines = [
        f"MULTI30K_DIR: {env or 'unset'}",
        f"MULTI30K_URL: {url or 'unset (downloads come from the upstream repository)'}",
        f"multi30k folder: {where} ({kind}; {how})",
        f"multi30k files found: {len(present)} of {len(MULTI30K_FILES)}{missing}",
    ]
    # The task runner's optional local mirror (tools/tasks.py, LOCAL_MULTI30K): it points
    # MULTI30K_DIR at it, so a report printed through the task runner reads it.
    mirror = _tasks_module().LOCAL_MULTI30K
    if mirror.is_dir() and not env:
        lines.append(f"local mirror: {mirror} (tools/tasks.py sets MULTI30K_DIR to it)")
    return lines


@functools.cache
def _tasks_module() -> ModuleType:
    """tools/tasks.py (standard library only), loaded from its file: the one place that names
    the local Multi30k mirror."""
    spec = importlib.util.spec_from_file_location("_envcheck_tasks", ROOT / "tools" / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _provenance_module() -> ModuleType:
    """transformer_lib/translation/provenance.py, loaded from its file: it needs only the
    standard library, so it answers even when importing the package (and torch) fails."""
    path = ROOT / "transformer_lib" / "translation" / "provenance.py"
    spec = importlib.util.spec_from_file_location("_envcheck_provenance", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def repository() -> list[str]:
    p = _provenance_module().provenance()
    if p["commit"] is None:
        return ["commit: unknown (no git, or not a git checkout)"]
    state = "tracked files changed" if p["dirty"] else "no tracked file changed"
    state += " outside results/"
    return [f"commit: {p['commit']} ({state})"]


def provenance() -> list[str]:
    """What every result records about where it came from, as the tools write it."""
    return json.dumps(_provenance_module().provenance(), indent=2).splitlines()


SECTIONS: list[tuple[str, Callable[[], list[str]]]] = [
    ("system", system),
    ("python", python),
    ("torch", torch_section),
    ("packages", packages),
    ("data", data),
    ("repository", repository),
    ("provenance", provenance),
]


def report() -> str:
    out = ["```text", "transformer_lib environment check (tools/envcheck.py)"]
    for title, section in SECTIONS:
        try:
            lines = section()
        except Exception as e:  # noqa: BLE001 (one failing section must not hide the others)
            lines = [f"SECTION FAILED: {type(e).__name__}: {e}"]
        out += [f"[{title}]", *(f"  {line}" for line in lines)]
    return "\n".join([*out, "```"])


def main() -> int:
    print("Paste everything below, including the ``` lines, into the bug report:\n")
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
