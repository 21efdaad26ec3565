"""binder/: the environment Binder (repo2docker) builds for the launch buttons, kept in step with
constraints.txt and pyproject.toml.

repo2docker cannot run here (it needs a Docker engine), so its input is checked statically: the
Python is the one CI tests the pins with, torch is the pinned CPU build, the package is installed
with constraints.txt's exact versions, and everything the installed extra needs has a pin.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            pins[_norm(name)] = version
    return pins


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _requirement_lines() -> list[str]:
    text = (BINDER / "requirements.txt").read_text(encoding="utf-8")
    return [ln.split("#", 1)[0].strip() for ln in text.splitlines() if ln.split("#", 1)[0].strip()]


def _post_build() -> str:
    return (BINDER / "postBuild").read_text(encoding="utf-8")


def _installed_extra() -> str:
    """The extra postBuild installs: `pip install ... ".[EXTRA]"`."""
    m = re.search(r'pip install .*-c constraints\.txt "\.\[(\w+)\]"', _post_build())
    assert m, 'postBuild must run `pip install ... -c constraints.txt ".[EXTRA]"`'
    return m.group(1)


def test_python_is_the_one_ci_tests_the_pins_with():
    runtime = (BINDER / "runtime.txt").read_text(encoding="utf-8").strip()
    assert re.fullmatch(r"python-3\.\d+", runtime), runtime
    ci = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8"))
    image = ci["jobs"]["linux"]["container"]  # e.g. python:3.11-bookworm
    assert image.startswith(f"python:{runtime.removeprefix('python-')}-"), (runtime, image)


def test_torch_is_the_pinned_cpu_build():
    lines = _requirement_lines()
    assert f"--extra-index-url {CPU_INDEX}" in lines
    pinned = [ln for ln in lines if not ln.startswith("-")]
    assert pinned == [f"torch=={_pins()['torch']}"], pinned


def test_every_pin_in_requirements_is_constraints_pin():
    pins = _pins()
    for line in _requirement_lines():
        if line.startswith("-"):
            continue
        req = Requirement(line)
        assert str(req.specifier) == f"=={pins[_norm(req.name)]}", line


def test_post_build_installs_the_package_with_the_pins():
    text = _post_build()
    assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
    extra = _installed_extra()
    assert extra in _project()["optional-dependencies"]
    # The Multi30k files, for chapters 8, 10 and 11, are fetched while the image is built.
    assert "download()" in text
    if os.name == "posix":  # repo2docker runs it only if it is executable
        assert os.stat(BINDER / "postBuild").st_mode & 0o111


def test_what_binder_installs_is_pinned_and_the_pin_fits_the_range():
    """A dependency added to pyproject.toml without a pin would reach Binder unpinned."""
    project, pins = _project(), _pins()
    extras = project["optional-dependencies"]
    todo = [*project["dependencies"], *extras[_installed_extra()]]
    missing, outside = [], []
    while todo:
        req = Requirement(todo.pop())
        if req.marker and not req.marker.evaluate({"python_version": "3.11", "extra": ""}):
            continue
        if _norm(req.name) == _norm(project["name"]):  # the project's own extras
            todo += [r for extra in req.extras for r in extras[extra]]
            continue
        pin = pins.get(_norm(req.name))
        if pin is None:
            missing.append(str(req))
        elif pin not in req.specifier:
            outside.append(f"{req} (pinned {pin})")
    assert not missing, f"no pin in constraints.txt for: {missing}"
    assert not outside, f"pins outside pyproject.toml's ranges: {outside}"
