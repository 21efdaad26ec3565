"""The Colab setup cell that opens every chapter (tools/notebook_setup.py writes it).

Every chapter must start with the cell the tool would write now: a chapter added, a file newly
read from results/ or configs/, a new repository address in _config.yml or a new version in
pyproject.toml all change the cell, and this test fails until `python tools/notebook_setup.py`
is run. Outside Colab the cell must do nothing, print nothing and take no time (nbval runs it).

The cell's Colab branch is checked here with pip and the network replaced by fakes; the real
thing (a chapter alone in an empty folder, a fresh virtual environment with Colab's packages, a
wheel and a local HTTP server of `git archive HEAD`) is tests/test_colab.py
(tools/colab_check.py), which takes minutes.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from _tools import load_tool

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
setup = load_tool("notebook_setup")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _notebook(*code: str) -> dict:
    """A minimal nbformat 4.5 notebook: a title, then one code cell per argument."""
    cells = [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": ["# A chapter"]}]
    cells += [
        {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
         "outputs": [], "source": src.splitlines(keepends=True)}
        for i, src in enumerate(code)
    ]  # fmt: skip
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture(scope="module")
def book():
    return setup.read_book()


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_starts_with_the_current_setup_cell(path, book):
    found = setup.problems(_load(path), book)
    assert not found, (
        f"{path.name}: " + "; ".join(found) + " (run `python tools/notebook_setup.py`)"
    )


def test_the_address_is_the_one_in_config(book):
    """One place: the cell installs from, and fetches from, _config.yml's repository."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert book.repo == config["repository"]["url"].rstrip("/")
    source = setup.setup_source(book, ["results/x.json"])
    assert f'repo = "{book.repo}"\n    ref = "{config["repository"]["branch"]}"\n' in source
    assert '[notebooks] @ git+{repo}@{ref}"' in source
    assert book.repo.count("github.com") == 1  # the cell's raw address replaces it


def test_the_cell_fits_the_chapters_width(book):
    """The chapters' code is read at 78 columns; a long file name is split in two literals."""
    long = "experiments/time_to_quality/results/60min_quarter_batch_low_dropout.json"
    source = setup.setup_source(book, ["results/x.json", long])
    assert max(map(len, source.splitlines())) <= 78
    listed = re.search(r"files=\[(.*?)\]", source, re.S).group(1)
    assert eval(f"[{listed}]") == ["results/x.json", long]


# ------------------------------------------------------------------ the tool


def test_tool_inserts_once_and_is_idempotent(tmp_path, book):
    shutil.copy(ROOT / "chapters" / "02_masks.ipynb", tmp_path / "02_masks.ipynb")
    nb_path = tmp_path / "02_masks.ipynb"
    before = _load(nb_path)
    assert setup.main([str(nb_path)]) == 0
    once = nb_path.read_bytes()
    after = _load(nb_path)
    assert setup.is_setup_cell(after["cells"][0]) and after["cells"][0]["id"] == setup.CELL_ID
    without = [c for c in after["cells"] if not setup.is_setup_cell(c)]
    assert without == [c for c in before["cells"] if not setup.is_setup_cell(c)]
    assert setup.main([str(nb_path)]) == 0
    assert nb_path.read_bytes() == once  # a second run changes nothing
    assert setup.main(["--check", str(nb_path)]) == 0


def test_check_fails_on_a_missing_or_stale_cell(tmp_path, book, capsys):
    nb = _notebook("x = 1")
    path = tmp_path / "nb.ipynb"
    setup.write_notebook(path, nb)
    assert setup.main(["--check", str(path)]) == 1
    assert "not the Colab setup cell" in capsys.readouterr().out
    assert setup.update(nb, book) and nb["cells"][0]["execution_count"] is None
    nb["cells"][0]["execution_count"] = 1  # the chapter was executed
    # The chapter now reads a result: the cell's file list is out of date.
    nb["cells"].append(_notebook('open("../results/bench_rnn.json")')["cells"][1])
    assert setup.problems(nb, book) == ["the setup cell's code is out of date"]
    assert setup.update(nb, book) and "results/bench_rnn.json" in "".join(nb["cells"][0]["source"])
    # It did nothing before and does nothing now: it keeps its place among executed cells.
    assert nb["cells"][0]["execution_count"] == 1
    # A cell moved down (a cell inserted above it) is not the first cell any more.
    nb["cells"].insert(0, nb["cells"].pop())
    assert "the first cell is not the Colab setup cell" in setup.problems(nb, book)
    assert setup.update(nb, book) and not setup.problems(nb, book)
    assert sum(setup.is_setup_cell(c) for c in nb["cells"]) == 1


def test_a_new_repository_address_makes_the_cells_stale(tmp_path, book):
    for name in ("_config.yml", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    config = tmp_path / "_config.yml"
    config.write_text(
        config.read_text(encoding="utf-8").replace(book.repo, "https://github.com/a-fork/book"),
        encoding="utf-8",
    )
    fork = setup.read_book(tmp_path)
    assert fork.repo == "https://github.com/a-fork/book" and fork.folder == "book"
    nb = _notebook("x = 1")
    setup.update(nb, book)
    assert setup.problems(nb, fork) == ["the setup cell's code is out of date"]


def test_a_repository_that_is_not_on_github_is_refused(tmp_path):
    for name in ("_config.yml", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    config = tmp_path / "_config.yml"
    text = config.read_text(encoding="utf-8")
    url = setup.read_book().repo
    config.write_text(text.replace(url, "https://gitlab.com/x/y"), encoding="utf-8")
    with pytest.raises(ValueError, match="repository.url must be https://github.com/OWNER/NAME"):
        setup.read_book(tmp_path)


def test_files_are_found_by_path_by_name_and_by_pattern():
    nb = _notebook(
        'bench = json.loads(Path("../results/bench_decode.json").read_text())',
        'ROOT = Path.cwd().parent\nrun = read_result("multi30k.json")\n'
        'path = ROOT / "results" / name\n'
        'runs = [ROOT / "results" / f"baseline_{k}.json" for k in KEYS]',
        'cfg = load_config(ROOT / "configs" / "tiny.toml")\nname = f"{x}"',
        'ttq = ROOT / "experiments/time_to_quality/summary.json"',
    )
    files = setup.chapter_files(nb)
    runs = sorted(f"results/{p.name}" for p in (ROOT / "results").glob("baseline_*.json"))
    assert runs
    # f"{x}" alone names no file; results/ files named only in prose are not fetched.
    assert set(files) == {"results/bench_decode.json", "results/multi30k.json",
                          "configs/tiny.toml", "experiments/time_to_quality/summary.json",
                          *runs}  # fmt: skip
    assert setup.chapter_files(_notebook("x = 'results'  # no file named")) == []


# ------------------------------------------------------------------ the cell itself


def _cell_code(files: list[str]) -> str:
    return setup.setup_source(setup.read_book(), files)


def test_outside_colab_the_cell_does_nothing(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("BOOK_SETUP", raising=False)
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
    code = compile(_cell_code(["results/multi30k.json"]), "<setup cell>", "exec")
    namespace: dict = {}
    start = time.perf_counter()
    exec(code, namespace)
    elapsed = time.perf_counter() - start
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert not calls and list(tmp_path.iterdir()) == [] and Path.cwd() == tmp_path
    assert "_setup_for_colab" not in namespace  # it leaves no helper behind
    assert elapsed < 0.05


class _Response(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_in_colab_it_installs_fetches_and_moves_into_chapters(monkeypatch, tmp_path, capsys):
    """The Colab branch with pip and the network replaced by fakes."""
    import importlib.metadata
    import urllib.request

    book = setup.read_book()
    monkeypatch.setenv("BOOK_SETUP", "1")
    for var in ("BOOK_SETUP_REQUIREMENT", "BOOK_SETUP_FILES_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == book.dist:  # as in a new Colab runtime: the book's package is not there
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    pip_calls, urls = [], []
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(
        subprocess, "run",
        lambda argv, **kw: pip_calls.append(argv) or subprocess.CompletedProcess(argv, 0, "", ""),
    )  # fmt: skip
    monkeypatch.setattr(
        urllib.request, "urlopen",
        lambda url, timeout: urls.append(url) or _Response(f"from {url}".encode()),
    )  # fmt: skip
    files = ["results/multi30k.json", "configs/tiny.toml"]
    exec(compile(_cell_code(files), "<setup cell>", "exec"), {})

    (pip,) = pip_calls
    assert pip[1:5] == ["-m", "pip", "install", "--quiet"]
    assert pip[5] == f"{book.dist}[notebooks] @ git+{book.repo}@{book.ref}"
    assert pip[6] == f"torch=={real_version('torch')}"  # Colab's torch stays
    owner_name = book.repo.removeprefix("https://github.com/")
    raw = f"https://raw.githubusercontent.com/{owner_name}/{book.ref}"
    assert urls == [f"{raw}/{f}" for f in files]
    root = tmp_path / book.folder
    assert (root / "configs" / "tiny.toml").read_text() == f"from {raw}/configs/tiny.toml"
    assert Path.cwd() == root / "chapters"  # ../results/... resolves as in the repository
    assert capsys.readouterr().out.rstrip().endswith("Ready: run the chapter's cells in order.")

    # Run again (the reader re-runs the cell): nothing is fetched twice, the overrides apply.
    monkeypatch.setenv("BOOK_SETUP_REQUIREMENT", "/tmp/x.whl[notebooks]")
    exec(compile(_cell_code(files), "<setup cell>", "exec"), {})
    assert pip_calls[1][5] == "/tmp/x.whl[notebooks]"
    assert len(urls) == 2 and Path.cwd() == root / "chapters"


def test_the_cell_is_folded_everywhere_and_hidden_on_the_site(book):
    cell = setup.expected_cell(_notebook("x = 1"), book)
    assert cell["metadata"]["cellView"] == "form"  # Colab: only the #@title line shows
    assert cell["source"][0].startswith("#@title ")
    assert cell["metadata"]["jupyter"]["source_hidden"] is True  # JupyterLab folds the input
    assert "remove-cell" in cell["metadata"]["tags"]  # the site: it does nothing there


# ------------------------------------------------------------------ Colab's kernel, failures


def _requirements(extra: str) -> list:
    """The requirements an extra brings, the project's own extras it names expanded."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    todo, found = list(extras[extra]), []
    while todo:
        req = Requirement(todo.pop())
        if req.name == project["name"]:
            todo += [r for name in req.extras for r in extras[name]]
        else:
            found.append(req)
    return found + [Requirement(r) for r in project["dependencies"]]


def test_the_notebooks_extra_admits_what_colab_has_and_no_build_tool():
    """pip keeps an installed version the requirement admits: Colab's kernel stays as it is."""
    colab = load_tool("colab_check")
    reqs = _requirements("notebooks")
    names = {colab.normalize(r.name) for r in reqs}
    assert {"altair", "pandas", "ipywidgets"} <= names
    refused = [f"{r} (Colab: {colab.COLAB[colab.normalize(r.name)]})" for r in reqs
               if colab.normalize(r.name) in colab.COLAB
               and colab.COLAB[colab.normalize(r.name)] not in r.specifier]  # fmt: skip
    assert not refused, f"would upgrade what Colab has installed: {refused}"
    assert not names & set(colab.BUILD_TOOLS), "the book's build tools belong in the book extra"
    assert "myst-nb" in {colab.normalize(r.name) for r in _requirements("book")}


def test_nothing_a_reader_runs_imports_myst_nb():
    """glue comes from transformer_lib.viz: a reader's kernel needs no myst-nb."""
    importing = re.compile(r"^\s*(?:import|from)\s+myst_nb\b", re.M)
    found = [p.name for p in CHAPTERS if any(
        importing.search(setup._source(c)) for c in _load(p)["cells"] if c["cell_type"] == "code"
    )]  # fmt: skip
    found += [str(p.relative_to(ROOT)) for p in (ROOT / "transformer_lib").rglob("*.py")
              if importing.search(p.read_text(encoding="utf-8"))]  # fmt: skip
    assert not found


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # bound, then released: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_if_installed(monkeypatch, book) -> None:
    """The book's package counts as installed (the cell skips pip)."""
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda n: book.version if n == book.dist else real(n)
    )


def test_a_failed_fetch_is_one_line_naming_the_address(monkeypatch, tmp_path, book):
    monkeypatch.setenv("BOOK_SETUP", "1")
    url = f"http://127.0.0.1:{_closed_port()}/raw"
    monkeypatch.setenv("BOOK_SETUP_FILES_URL", url)
    monkeypatch.chdir(tmp_path)
    _as_if_installed(monkeypatch, book)
    with pytest.raises(Exception) as caught:
        exec(compile(_cell_code(["results/multi30k.json"]), "<setup cell>", "exec"), {})
    err = caught.value
    assert type(err).__name__ == "SetupFailed" and err.__cause__ is None
    assert err.__suppress_context__  # no URLError chained under it
    (line,) = err._render_traceback_()  # what IPython shows: this line, no traceback
    assert line.startswith(f"Setup failed: could not fetch {url}/results/multi30k.json (")
    assert line.endswith("then run this cell again.") and "\n" not in line
    assert Path.cwd() == tmp_path  # it stopped before moving anywhere


def test_a_failed_install_is_one_line_with_pips_reason(monkeypatch, tmp_path, book):
    import importlib.metadata

    monkeypatch.setenv("BOOK_SETUP", "1")
    monkeypatch.setenv("BOOK_SETUP_REQUIREMENT", "/nowhere/book.whl[notebooks]")
    monkeypatch.chdir(tmp_path)
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == book.dist:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    said = "WARNING: a note\nERROR: Could not install /nowhere/book.whl\nsome hint after it\n"
    monkeypatch.setattr(
        subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", said)
    )
    with pytest.raises(Exception) as caught:
        exec(compile(_cell_code([]), "<setup cell>", "exec"), {})
    (line,) = caught.value._render_traceback_()
    assert line == (
        "Setup failed: pip could not install /nowhere/book.whl[notebooks]: ERROR: Could not "
        "install /nowhere/book.whl Check the address and the network, then run this cell again."
    )


@pytest.mark.parametrize("folder", ["chapters", "notebooks"])
def test_in_a_clone_the_cell_uses_the_files_beside_it(monkeypatch, tmp_path, book, folder):
    """The reader editions (notebooks/) read ../results like the chapters: nothing is fetched."""
    import urllib.request

    monkeypatch.setenv("BOOK_SETUP", "1")
    _as_if_installed(monkeypatch, book)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "x.json").write_text("{}")
    (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / folder)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("fetched"))
    exec(compile(_cell_code(["results/x.json"]), "<setup cell>", "exec"), {})
    assert Path.cwd() == tmp_path / folder and sorted(os.listdir(tmp_path)) == [folder, "results"]


def test_myst_leftovers_are_counted_by_kind():
    colab = load_tool("colab_check")
    md = ("(sec-x)=\n# T\nA {glue:text}`a` and {glue}`b`, {cite}`v` and {numref}`f`.\n"
          "```{figure} x.png\nCap\n```\n:::{admonition} Solution\n:class: dropdown\n:::\n"
          "```python\nx = {1}\n```\n")  # fmt: skip
    nb = {"cells": [{"cell_type": "markdown", "source": md},
                    {"cell_type": "code", "source": "glue('{cite}`x`')"}]}  # fmt: skip
    assert colab.myst_leftovers(nb) == {
        "{glue:text}": 1, "{glue}": 1, "{cite}": 1, "{numref}": 1, "{figure} directive": 1,
        "{admonition} directive": 1, "(label)= target": 1,
    }  # fmt: skip
