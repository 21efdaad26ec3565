"""Helpers shared by test files: a script of tools/ (not a package) loaded as a module, the
tiny training run of the fault tests, and an environment without make's variables."""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
TINY = ROOT / "configs" / "tiny.toml"
# a run of seconds: few pairs, one epoch, frequent saves, no BLEU, no averaging
FAST = dict(train_limit=64, val_limit=8, epochs=1, save_every=2, max_tokens=256, bleu_every=0,
            average_last=0, keep_last=1)


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py as the module NAME, registered in sys.modules before it runs (dataclasses
    defined in it look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def tiny_config(**changes: Any):
    """configs/tiny.toml with FAST and then `changes` applied (a translation.Config)."""
    from transformer_lib import translation  # imports torch: only for the tests that train

    return translation.load_config(TINY, **{**FAST, **changes})


def file_tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative name -> SHA-256): to show nothing was written."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def checkpoint_with_config(checkpoint: Path, dest: Path, **changes: Any) -> Path:
    """A copy of `checkpoint` whose config.json says `changes`, its manifest entry re-sealed
    (size and SHA-256) to match: a config the trainer could have written."""
    copy = shutil.copytree(checkpoint, dest)
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps(config))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["config.json"] = {
        **manifest["files"]["config.json"],
        "sha256": hashlib.sha256((copy / "config.json").read_bytes()).hexdigest(),
        "bytes": (copy / "config.json").stat().st_size,
    }
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def make_free_env() -> dict[str, str]:
    """This environment without what a running make puts into it: its own variables
    (MAKEFLAGS, MAKELEVEL, ...: a sub-make prints "make[1]: Entering directory" lines) and the
    Makefile's variables given on its command line (`make test-emulated CPU=avx2` exports
    CPU=avx2, which a fresh `make -n test-emulated` would otherwise take for its own)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    makefile_vars = set(re.findall(r"^([A-Za-z_]\w*)\s*[?:+]?=", text, re.M))  # assigned
    makefile_vars |= set(re.findall(r"\$\(([A-Za-z_]\w*)\)", text))  # read (NB)
    drop = makefile_vars | {"MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES", "MAKE_TERMOUT",
                            "MAKE_TERMERR", "GNUMAKEFLAGS"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def splits_read(monkeypatch: Any, module: ModuleType) -> list[str]:
    """The Multi30k splits `module` loads from now on, in order (``module.load_multi30k``
    still loads them): an experiment that chooses on validation must never read the test set."""
    from transformer_lib.translation.data import load_multi30k  # imports torch

    splits: list[str] = []

    def load(split: str, *args: Any, **kwargs: Any) -> Any:
        splits.append(split)
        return load_multi30k(split, *args, **kwargs)

    monkeypatch.setattr(module, "load_multi30k", load)
    return splits
