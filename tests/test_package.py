"""The shape of the code base: modules of one purpose, an import graph without back-edges.

The chapters generate the core modules (one per chapter); the hand-written translation half
lives in ``transformer_lib/translation/`` and builds on the core, never the reverse.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_lib"
CODE_DIRS = ("transformer_lib", "bench", "tools")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _python_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def _imported_modules(path: Path) -> set[str]:
    """Every ``transformer_lib...`` module a file imports (absolute or relative)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("transformer_lib")}


def _core_modules() -> list[Path]:
    """The generated chapter modules (they say so on their docstring's third line)."""
    return [p for p in PACKAGE.glob("*.py")
            if "by tools/export.py: do not edit" in p.read_text(encoding="utf-8")[:600]
            and p.name != "__init__.py"]


def test_the_core_never_imports_the_translation_half():
    core = _core_modules()
    assert len(core) >= 10, [p.name for p in core]
    for path in core:
        back = {m for m in _imported_modules(path) if m.startswith("transformer_lib.translation")}
        assert not back, f"{path.name} imports {sorted(back)}"


# The one module allowed chapter 7's private beam bookkeeping: translation's faster beam
# search finishes, ranks and stops its hypotheses with chapter 7's own helpers, so that the two
# searches cannot drift apart (a copy could; tests/test_fast_beam.py compares their results).
SHARES_PRIVATE = {
    ("transformer_lib/translation/fast_beam.py", "transformer_lib.decoding"): {
        "_add_live", "_check_beam_args", "_finish", "_keep_live", "_mark_done"},
}


def test_no_private_name_crosses_from_the_core():
    """Modules use a chapter module's public API only (``from x import _name`` couples
    internals); inside the translation subpackage, siblings may share private helpers, and
    ``SHARES_PRIVATE`` names the one exception, with its reason."""
    for path in _python_files("transformer_lib", "bench", "tools"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and not node.level):
                continue
            parts = (node.module or "").split(".")
            if parts[0] != "transformer_lib" or len(parts) != 2:
                continue  # not a core module (translation.* may share private helpers)
            private = {a.name for a in node.names if a.name.startswith("_")}
            allowed = SHARES_PRIVATE.get((path.relative_to(ROOT).as_posix(), node.module), set())
            assert private <= allowed, f"{path.relative_to(ROOT)}: {node.module} {sorted(private)}"


@pytest.mark.parametrize("path", _python_files("transformer_lib"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_short_and_says_what_it_is(path):
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    doc = ast.get_docstring(ast.parse(text))
    assert doc and doc.strip(), f"{path} has no module docstring"


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in _python_files(*CODE_DIRS):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {n}")
    assert not long, long


def test_git_is_asked_for_the_commit_in_one_place():
    callers = [str(p.relative_to(ROOT)) for p in _python_files(*CODE_DIRS)
               if re.search(r"rev-parse", p.read_text(encoding="utf-8"))]
    assert len(callers) == 1, callers
