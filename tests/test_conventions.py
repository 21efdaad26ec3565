"""Packaging and tool conventions (issue 52, item 5): what `pip wheel .` leaves is ignored, the
shipped model is a declared package, and every tool answers --help without doing its work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


ROOT = Path(__file__).resolve().parents[1]


def test_the_build_tree_pip_wheel_leaves_is_ignored():
    # before: `pip wheel .` left build/ for `git status` to show and `git add -A` to commit
    done = subprocess.run(["git", "check-ignore", "-q", "build/lib/transformer_lib/x.py"],
                          cwd=ROOT, check=False)
    if done.returncode == 128:
        pytest.skip("not a git checkout")
    assert done.returncode == 0


def test_every_folder_of_the_package_that_ships_files_is_a_declared_package():
    """setuptools warns at each install about a folder of files inside the package that is not
    in `packages` ("... is absent from the `packages` configuration": before, the shipped
    model's folder). Checked statically: building a wheel in a test is slow."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = pyproject["tool"]["setuptools"]
    declared = set(setuptools["packages"])
    folders = {
        ".".join(p.relative_to(ROOT).parts)
        for p in (ROOT / "transformer_lib").rglob("*")
        if p.is_dir() and p.name != "__pycache__" and any(f.is_file() for f in p.iterdir())
    } | {"transformer_lib"}
    assert folders <= declared, folders - declared
    assert setuptools["package-data"]["transformer_lib.pretrained.multi30k_de_en"] == ["*"]


def test_fetch_assets_help_prints_help_and_fetches_nothing(tmp_path):
    # before: --help ran the fetch (npm, the Vega bundle) and printed "assets ready"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "fetch_assets.py"), "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: fetch_assets.py") and "assets ready" not in done.stdout
