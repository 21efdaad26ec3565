"""Write the first cell of every chapter: the setup that lets a chapter run alone in Colab.

    python tools/notebook_setup.py                  # insert or update it in chapters/*.ipynb
    python tools/notebook_setup.py --check          # exit 1 if a chapter's cell is missing/stale
    python tools/notebook_setup.py /tmp/copy/*.ipynb  # other notebooks (e.g. copies)

A chapter opened in Colab (its launch button, or a notebook downloaded alone) has neither the
package nor the repository's `results/` and `configs/` files. Its first cell, written here,
installs the package from the repository that `_config.yml` names (`repository.url` at
`repository.branch`, the one place the address is set) with the `notebooks` extra, fetches the
files the chapter's code reads from the same branch (found by scanning the chapter's code).
The Multi30k data need nothing here: `load_multi30k` downloads them on first use (from
``MULTI30K_URL`` when set). Outside Colab the cell does nothing and prints
nothing: nbval re-runs it in CI and compares its (empty) output, and Binder, a clone and the
book's build already have everything. Running this tool twice changes nothing.

In Colab the install keeps Colab's kernel as it is: pip adds what is missing, and the
``notebooks`` extra admits the versions Colab has (tests/test_colab.py checks it in a
Colab-like environment). A failed install or fetch stops the cell with one line (IPython shows
an exception's ``_render_traceback_`` instead of a traceback) naming what failed, the address
and what to do. From a clone's ``chapters/`` or ``notebooks/`` (the reader editions) the files
are read where they are, as ``../results/...``.

The cell's overrides, for testing it outside Colab:

* ``BOOK_SETUP=1``: run the setup anywhere, not only in Colab;
* ``BOOK_SETUP_REQUIREMENT``: the pip requirement to install instead of the repository's
  (e.g. ``/tmp/dist/annotated_transformer_book-0.1.0-py3-none-any.whl[notebooks]``);
* ``BOOK_SETUP_FILES_URL``: the base URL of the files instead of raw.githubusercontent.com.

Figures are not fetched: the chapters show them with MyST ``{figure}`` directives, which Colab
and JupyterLab display as text, not as images.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template

import yaml

try:
    import tomllib
except ImportError:  # Python 3.10: the package depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
# The folders of the repository whose files chapters read at run time (experiments/: one
# folder per series, e.g. experiments/time_to_quality/summary.json).
DATA_DIRS = ("results", "configs", "experiments")
MARKER = "Written by tools/notebook_setup.py"
CELL_ID = "colab-setup"
# Colab folds a cell with a `#@title` into its title (cellView "form"); JupyterLab folds the
# input with source_hidden; the site drops the cell, which does nothing there (remove-cell).
CELL_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}, "tags": ["remove-cell"]}

TEMPLATE = Template("""\
#@title Setup for Colab: installs the book's package (does nothing elsewhere)
# $marker from _config.yml and
# pyproject.toml: edit those, not this. In Google Colab (or with
# BOOK_SETUP=1) it installs the book's package and fetches the files this
# chapter reads. In a clone of the repository, in Binder and in the book's
# own build it does nothing: the package and the files are already there.
import os
import sys


def _setup_for_colab(files: list[str]) -> None:
    import subprocess
    import urllib.request
    from importlib import invalidate_caches, metadata
    from pathlib import Path

    class SetupFailed(Exception):
        def _render_traceback_(self):  # IPython shows this line only
            return [f"Setup failed: {self}"]

    repo = "$repo"
    ref = "$ref"
    # GitHub serves the repository's files from another host
    raw = repo.replace("//github.com/", "//raw.githubusercontent.com/")
    dist, version = "$dist", "$version"
    try:
        installed = metadata.version(dist) == version
    except metadata.PackageNotFoundError:
        installed = False
    if not installed:
        # BOOK_SETUP_REQUIREMENT: another requirement, e.g. a wheel you built
        requirement = os.environ.get(
            "BOOK_SETUP_REQUIREMENT", f"{dist}[notebooks] @ git+{repo}@{ref}"
        )
        print(f"Installing {requirement} (a minute or two)")
        # pip adds what is missing and keeps what Colab has (its kernel,
        # widgets, pandas, Altair) where the book accepts the version.
        pip = [sys.executable, "-m", "pip", "install", "--quiet", requirement]
        # keep the torch that is installed (Colab's): pip must not replace it
        try:
            pip.append(f"torch=={metadata.version('torch')}")
        except metadata.PackageNotFoundError:  # the CPU build, not CUDA's
            cpu = "https://download.pytorch.org/whl/cpu"
            pip += ["--extra-index-url", cpu]
        done = subprocess.run(pip, capture_output=True, text=True)
        if done.returncode != 0:
            said = done.stderr.strip().splitlines() or ["no message"]
            why = [line for line in said if line.startswith("ERROR")] or said
            raise SetupFailed(
                f"pip could not install {requirement}: {why[-1]} Check "
                "the address and the network, then run this cell again."
            )
        invalidate_caches()
    # The chapter reads ../results/... as in the repository: from chapters/
    # or notebooks/ of a clone, else from a folder the files are fetched to.
    here = Path.cwd()
    if here.name in ("chapters", "notebooks"):
        root, work = here.parent, here
    else:
        root = here / "$folder"
        work = root / "chapters"
    url = os.environ.get("BOOK_SETUP_FILES_URL", f"{raw}/{ref}")
    missing = [name for name in files if not (root / name).is_file()]
    if missing:
        print(f"Fetching {len(missing)} file(s) of results/, configs/ and "
              f"experiments/ into {root}")
    for name in missing:
        try:
            with urllib.request.urlopen(f"{url}/{name}", timeout=60) as got:
                data = got.read()
        except OSError as err:  # no network, a wrong address, a timeout
            why = getattr(err, "reason", err)
            raise SetupFailed(
                f"could not fetch {url}/{name} ({why}). Check the "
                "network and the address, then run this cell again."
            ) from None
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    if files:
        work.mkdir(parents=True, exist_ok=True)
        os.chdir(work)
    print("Ready: run the chapter's cells in order.")


if "google.colab" in sys.modules or os.environ.get("BOOK_SETUP") == "1":
    _setup_for_colab(files=[$files])
del _setup_for_colab""")
# The chapters' code is read at 78 columns (chapters/ruff.toml); a file name too long
# for one line of the list is written as two string literals, which Python joins.
WIDTH = 78


@dataclass(frozen=True)
class Book:
    """What the cell installs and where from: read from _config.yml and pyproject.toml."""

    repo: str  # https://github.com/OWNER/NAME
    ref: str  # the branch the launch buttons open
    dist: str  # the distribution name (it imports as transformer_lib)
    version: str

    @property
    def folder(self) -> str:
        """The folder the files go to in Colab (the repository's name)."""
        return self.repo.rsplit("/", 1)[1]


def read_book(root: Path = ROOT) -> Book:
    """The repository address (one place: `_config.yml`) and the package's name and version."""
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    repository = config.get("repository") or {}
    repo = str(repository.get("url", "")).rstrip("/")
    # Colab, Binder and raw.githubusercontent.com all need a repository on GitHub.
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repo):
        raise ValueError(
            f"_config.yml: repository.url must be https://github.com/OWNER/NAME, got {repo!r}"
        )
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return Book(repo, str(repository.get("branch", "main")), project["name"], project["version"])


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def is_setup_cell(cell: dict) -> bool:
    return cell.get("cell_type") == "code" and MARKER in _source(cell)


# A string literal on one line, f-strings included (the chapters build paths such as
# ROOT / "results" / f"baseline_{name}.json").
STRING = re.compile(r"""[rRbBfF]{0,2}(["'])([^"'\n]*)\1""")


def _patterns(code: str) -> list[str]:
    """The string literals of `code` as file-name patterns: `{...}` becomes `*`."""
    return [re.sub(r"\{[^}]*\}", "*", m.group(2)) for m in STRING.finditer(code)]


def chapter_files(nb: dict, root: Path = ROOT) -> list[str]:
    """The repository files (results/, configs/, experiments/) the chapter's code may read.

    A file counts when a string literal in a code cell names it, as a path
    ("../results/bench_decode.json") or by name in a chapter that refers to its folder
    (ROOT / "results" / name, with name = "ablations.json" elsewhere); an f-string counts as a
    pattern (f"baseline_{k}.json" -> results/baseline_*.json). An extra file costs a small
    download; a missing one stops the chapter, so the rule errs on the side of fetching.
    """
    code = "\n".join(
        _source(c) for c in nb["cells"] if c["cell_type"] == "code" and not is_setup_cell(c)
    )
    patterns = _patterns(code)
    found: set[str] = set()
    for folder in DATA_DIRS:
        present = sorted(p.relative_to(root / folder).as_posix()
                         for p in (root / folder).rglob("*") if p.is_file())
        named = any(p.strip("./") == folder or f"{folder}/" in p for p in patterns)
        for pattern in patterns:
            if f"{folder}/" in pattern:
                name = pattern.split(f"{folder}/", 1)[1]
            elif named and "/" not in pattern:
                name = pattern
            else:
                continue
            if not name.replace("*", ""):  # f"{x}" alone would match every file
                continue
            found.update(f"{folder}/{n}" for n in fnmatch.filter(present, name))
    return sorted(found)


def setup_source(book: Book, files: list[str]) -> str:
    """The cell's code for a chapter that reads `files`."""
    listed = "".join(_listed(f) for f in files) + ("\n    " if files else "")
    return TEMPLATE.substitute(
        marker=MARKER, repo=book.repo, ref=book.ref, dist=book.dist, version=book.version,
        folder=book.folder, files=listed,
    )  # fmt: skip


def _listed(name: str) -> str:
    """One entry of the cell's list of files, split after a "/" where it is too wide."""
    line = f'\n        "{name}",'
    if len(line) - 1 <= WIDTH or "/" not in name:
        return line
    head, tail = name.rsplit("/", 1)
    return f'\n        "{head}/"\n        "{tail}",'


def expected_cell(nb: dict, book: Book, root: Path = ROOT) -> dict:
    """The setup cell this notebook should start with."""
    source = setup_source(book, chapter_files(nb, root))
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": CELL_ID,
        "metadata": json.loads(json.dumps(CELL_METADATA)),
        "outputs": [],
        "source": source.splitlines(keepends=True),
    }


def problems(nb: dict, book: Book, root: Path = ROOT) -> list[str]:
    """Why the notebook's first cell is not the setup cell it should be (empty: it is)."""
    want = expected_cell(nb, book, root)
    cells = nb.get("cells", [])
    if not cells or not is_setup_cell(cells[0]):
        return ["the first cell is not the Colab setup cell"]
    first, found = cells[0], []
    if _source(first) != _source(want):
        found.append("the setup cell's code is out of date")
    meta = first.get("metadata", {})
    for key, value in CELL_METADATA.items():
        if meta.get(key) != value:
            found.append(f"the setup cell's metadata {key!r} is {meta.get(key)!r}, not {value!r}")
    if first.get("outputs"):
        found.append("the setup cell has stored outputs (outside Colab it must print nothing)")
    if sum(is_setup_cell(c) for c in cells) > 1:
        found.append("more than one setup cell")
    return found


def update(nb: dict, book: Book, root: Path = ROOT) -> bool:
    """Make the setup cell the notebook's first cell; True when the notebook changed."""
    if not problems(nb, book, root):
        return False
    old = [c for c in nb["cells"] if is_setup_cell(c)]
    cells = [c for c in nb["cells"] if not is_setup_cell(c)]
    cell = expected_cell(nb, book, root)
    if old:
        # Outside Colab the cell does nothing, so its new code runs as the old one did: keep
        # its execution count (the site's test wants every cell executed) until the chapter is
        # executed again. A new cell has none until then.
        cell["execution_count"] = old[0].get("execution_count")
    taken = {c.get("id") for c in cells}
    if CELL_ID in taken:  # nbformat requires unique ids; ours is fixed so diffs stay small
        raise ValueError(f"a cell other than the setup cell already has the id {CELL_ID!r}")
    nb["cells"] = [cell, *cells]
    return True


def write_notebook(path: Path, nb: dict) -> None:
    """Write as nbformat does (sorted keys, indent 1), so an unchanged cell diffs as unchanged."""
    text = json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: chapters/*.ipynb")
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    args = parser.parse_args(argv)
    book = read_book()
    paths = args.notebooks or sorted(CHAPTERS.glob("*.ipynb"))
    stale = 0
    for path in paths:
        nb = json.loads(path.read_text(encoding="utf-8"))
        if args.check:
            found = problems(nb, book)
            stale += bool(found)
            for problem in found:
                print(f"{path}: {problem}")
        elif update(nb, book):
            write_notebook(path, nb)
            stale += 1
            print(f"{path}: setup cell written ({len(chapter_files(nb))} files)")
    if args.check and stale:
        print("run `python tools/notebook_setup.py` to write the setup cells")
        return 1
    if not args.check:
        print(f"{stale} of {len(paths)} notebook(s) changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
