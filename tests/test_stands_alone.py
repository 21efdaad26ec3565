"""The repository stands alone: nothing in it points at files beside it.

The one exception is the task runner's optional local copy of Multi30k (``tools/tasks.py``,
``LOCAL_MULTI30K``), which the README explains and which is used only when it exists.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "_build", "node_modules", "__pycache__", "build", "runs"}
TEXT = {".py", ".md", ".ipynb", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".json", ".sh", ".ini",
        ".bib", ".html", ".js", ".css", ""}

# Paths out of the repository: "../shared", a Path(...).parent / "shared", an absolute /work/.
# Built from pieces so that this file does not match itself.
SIBLING = "sha" + "red"
OUTSIDE = re.compile(
    rf"\.\./{SIBLING}\b|[\"']{SIBLING}[\"']\)?\s*/|\.parent\s*/\s*[\"']{SIBLING}|/work/{SIBLING}"
)
# file -> what may appear there: the mirror's definition, its explanation and its test.
MIRROR = (f"../{SIBLING}/data/multi30k", f'"{SIBLING}" / "data" / "multi30k"')
ALLOWED = {"tools/tasks.py": MIRROR, "README.md": MIRROR[:1], "tests/test_tasks.py": MIRROR[1:]}


def _files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True, timeout=60).stdout.decode().split("\0")
        return [ROOT / f for f in listed if f and (ROOT / f).is_file()]
    except (OSError, subprocess.SubprocessError):  # an unpacked archive: walk it
        return [p for p in ROOT.rglob("*")
                if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def outside_references(root: Path, files: list[Path]) -> list[str]:
    """'path:line: text' for every reference out of the repository not in ALLOWED."""
    found = []
    for path in files:
        if path.suffix not in TEXT:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line) and not any(a in line for a in ALLOWED.get(rel, ())):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_nothing_points_outside_the_repository():
    files = [p for p in _files() if p != Path(__file__).resolve()]  # its examples are on purpose
    assert any(p.name == "README.md" for p in files)
    assert outside_references(ROOT, files) == []


@pytest.mark.parametrize("line", [
    "House style: `../shared/style.md`.",
    'mirror = ROOT.parent / "shared" / "data"',
    "see /work/shared/data/multi30k",
    "x = Path('shared') / 'style.md'",
])
def test_the_check_finds_a_reference_outside(tmp_path, line):
    (tmp_path / "CONTRIBUTING.md").write_text(f"intro\n{line}\n", encoding="utf-8")
    assert outside_references(tmp_path, [tmp_path / "CONTRIBUTING.md"]) == \
        [f"CONTRIBUTING.md:2: {line}"]


def test_the_house_style_is_in_the_repository():
    assert (ROOT / "STYLE.md").is_file()
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "`STYLE.md`" in contributing
