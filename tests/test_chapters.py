"""What a reader sees of the stored chapter outputs: no progress bars, no sideways scrolling,
and a "where we are" picture at the top of every chapter of the main part.

These read the committed notebooks (nbval re-executes them and compares the outputs); they
run no code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

CHAPTERS = sorted((Path(__file__).resolve().parents[1] / "chapters").glob("*.ipynb"))
# A rendered code block shows about 78 characters at a 1280-pixel window.
WIDTH = 78
# Cells whose input the page does not show (Jupyter Book cell tags).
HIDDEN_INPUT = {"hide-input", "hide-cell", "remove-input", "remove-cell"}
HIDDEN_OUTPUT = {"hide-output", "hide-cell", "remove-output", "remove-cell"}
# What tqdm writes: "42%|####      | 5/12 [00:01<00:02, 3.1it/s]", block characters, or a
# carriage return that redraws the line.
PROGRESS = re.compile(r"\d+%\|| \d+/\d+ \[|it/s\]|s/it\]|[\u2588-\u258f]|\r")


def _text(x: str | list[str]) -> str:
    return "".join(x) if isinstance(x, list) else x


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _output_texts(cell: dict) -> list[str]:
    """Stored text a reader sees: streams and plain-text results (charts are HTML)."""
    texts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            texts.append(_text(out.get("text", "")))
        data = out.get("data", {})
        if "text/plain" in data and not ({"text/html", "image/png", "image/svg+xml"} & set(data)):
            texts.append(_text(data["text/plain"]))
    return texts


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_no_progress_bar_in_stored_outputs(path):
    """A progress bar's text depends on timing: stored, it makes nbval flaky."""
    bad = []
    for i, cell in enumerate(_cells(path)):
        for out in cell.get("outputs", []):
            text = _text(out.get("text", "")) + _text(out.get("data", {}).get("text/plain", ""))
            if out.get("name") == "stderr" and text.strip() or PROGRESS.search(text):
                bad.append(f"cell {i}: {text.strip()[:70]!r}")
    assert not bad, f"{path.name}: stored progress output / stderr:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_glued_values_are_python_values(path):
    """myst-nb renders a glued numpy scalar as its repr: 'np.float64(0.27)' in the prose."""
    bad = []
    for i, cell in enumerate(_cells(path)):
        for out in cell.get("outputs", []):
            shown = _text(out.get("data", {}).get("application/papermill.record/text/plain", ""))
            if shown.startswith(("np.", "tensor(")):
                bad.append(f"cell {i}: {shown}")
    assert not bad, f"{path.name}: glue a float(), int() or str():\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_shown_code_and_output_fit_the_page(path):
    """No reader scrolls sideways: shown code lines and printed lines fit the code block."""
    bad = []
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code":
            continue
        tags = set(cell.get("metadata", {}).get("tags", []))
        if not tags & HIDDEN_INPUT:
            for line in _text(cell["source"]).splitlines():
                if len(line) > WIDTH:
                    bad.append(f"cell {i} code ({len(line)}): {line.strip()[:60]}")
        if not tags & HIDDEN_OUTPUT:
            for text in _output_texts(cell):
                for line in text.splitlines():
                    if len(line) > WIDTH:
                        bad.append(f"cell {i} output ({len(line)}): {line.strip()[:60]}")
    assert not bad, f"{path.name}: lines over {WIDTH} characters:\n  " + "\n  ".join(bad)


MAIN = [p for p in CHAPTERS if p.name[:2] in {f"{n:02d}" for n in range(1, 9)}]


@pytest.mark.parametrize("path", MAIN, ids=_ids(MAIN))
def test_chapter_opens_with_where_we_are(path):
    """Chapters 1-8 open with the encoder-decoder drawing, their own part highlighted."""
    cells = _cells(path)
    first_md = [_text(c["source"]) for c in cells[:3] if c["cell_type"] == "markdown"]
    want = f"where_{path.name[:2]}.svg"
    assert any(want in md and ":alt:" in md for md in first_md), (
        f"{path.name}: the first markdown cells should hold the figure {want} with alt text"
    )


# A chapter is a lesson, not a lab log (issue 51). Words are counted as the notebook holds
# them: every markdown cell, exercises and solutions included, split on whitespace. A shown
# code cell is the lesson (the math and the shapes); the package's full versions are folded.
MAX_WORDS = 5000
MAX_SHOWN_LINES = 60


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_chapter_stays_a_lesson(path):
    """At most 5,000 words of markdown and no shown code cell over 60 lines."""
    cells = _cells(path)
    words = sum(len(_text(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    assert words <= MAX_WORDS, f"{path.name}: {words:,} words of markdown (at most 5,000)"
    long_cells = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        lines = len(_text(cell["source"]).splitlines())
        if not set(cell.get("metadata", {}).get("tags", [])) & HIDDEN_INPUT and (
            lines > MAX_SHOWN_LINES
        ):
            long_cells.append(f"cell {i} ({cell.get('id')}): {lines} lines shown")
    assert not long_cells, f"{path.name}:\n  " + "\n  ".join(long_cells)


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids(CHAPTERS))
def test_folded_cells_are_folded_in_jupyterlab_too(path):
    """A cell the site folds (hide-input) is folded where readers run the notebook as well:
    JupyterLab and the reader editions read `jupyter.source_hidden`, not the site's tags."""
    unfolded = [
        f"cell {i} ({c.get('id')})"
        for i, c in enumerate(_cells(path))
        if c["cell_type"] == "code"
        and {"hide-input", "hide-cell"} & set(c.get("metadata", {}).get("tags", []))
        and not c.get("metadata", {}).get("jupyter", {}).get("source_hidden")
    ]
    assert not unfolded, f"{path.name}: hide-input without source_hidden: {unfolded}"
