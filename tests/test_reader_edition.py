"""tools/reader_edition.py: the chapters as a notebook viewer shows them (notebooks/).

The committed reader editions are checked against the chapters (up to date, no MyST left, code
cells and outputs identical, ids kept, every glued value shown), and the conversion is checked
on small hand-written cells against what myst-nb and the site do. The browser check of a
rendered reader notebook is tests/test_reader_browser.py; the site's buttons, tests/site.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest
from _tools import load_tool

ROOT = Path(__file__).resolve().parents[1]
reader = load_tool("reader_edition")
markdown = sys.modules["reader_markdown"]  # the module reader_edition imported (one ReaderError)
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
NAMES = [p.name for p in CHAPTERS]
# The MyST the issue named (the text a notebook viewer showed as raw syntax), plus any role.
MYST = re.compile(r"\{glue|\{cite\}|\{numref\}|```\{|:::\{|\{[a-z][\w:-]*\}`")


@pytest.fixture(scope="module")
def book():
    return reader.Book()


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _edition(name: str) -> dict:
    path = ROOT / "notebooks" / name
    assert path.is_file(), f"no reader edition notebooks/{name}: run python tools/reader_edition.py"
    return _load(path)


def _ctx(book, glue=None, folder=ROOT / "chapters"):
    return markdown.Context(
        glue=glue or {}, cite_label=book.cite_label, figure_number=book.figure_numbers,
        link=lambda t: book.link(t, folder), folder=folder,
    )  # fmt: skip


# --------------------------------------------------------------------------- committed editions


def test_every_chapter_has_an_up_to_date_reader_edition(capsys):
    assert len(NAMES) >= 11
    assert reader.main(["--check"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_no_myst_syntax_is_left(name):
    for cell in _edition(name)["cells"]:
        if cell["cell_type"] == "markdown":
            text = reader._outside_code("".join(cell["source"]))
            assert not MYST.search(text), (cell["id"], MYST.search(text).group(0))


@pytest.mark.parametrize("name", NAMES)
def test_code_cells_and_outputs_are_the_chapters_and_ids_are_kept(name):
    chapter, edition = _load(ROOT / "chapters" / name), _edition(name)
    assert edition["metadata"] == chapter["metadata"]
    added = {reader.NOTE_ID, reader.REFERENCES_ID}
    kept = [c for c in edition["cells"] if c["id"] not in added]
    assert [c["id"] for c in kept] == [c["id"] for c in chapter["cells"]]
    for ours, theirs in zip(kept, chapter["cells"]):
        assert ours["cell_type"] == theirs["cell_type"]
        if theirs["cell_type"] == "code":
            assert ours == theirs  # source, outputs, metadata, execution count
        else:
            assert ours["metadata"] == theirs["metadata"]
    ids = [c["id"] for c in edition["cells"]]
    assert len(ids) == len(set(ids)) and reader.NOTE_ID in ids
    # the note sits on top: right above the title, below the (folded) setup cell only
    note = ids.index(reader.NOTE_ID)
    assert "".join(edition["cells"][note + 1]["source"]).lstrip().startswith("# ")
    assert all(c["cell_type"] == "code" for c in edition["cells"][:note])


@pytest.mark.parametrize("name", NAMES)
def test_every_glued_value_is_shown(name, book):
    """Each glue reference of the chapter shows its stored value, formatted as on the site."""
    chapter = _load(ROOT / "chapters" / name)
    _, ctx = reader.render_notebook(chapter, book)
    refs = re.findall(r"\{glue(?::\w+)?\}`([^`]+)`",
                      "".join("".join(c["source"]) for c in chapter["cells"]
                              if c["cell_type"] == "markdown"))  # fmt: skip
    assert len(ctx.glued) == len(refs)
    text = "".join("".join(c["source"]) for c in _edition(name)["cells"]
                   if c["cell_type"] == "markdown").replace("\\", "")  # fmt: skip
    for key, shown in ctx.glued:
        assert shown in text, (key, shown)


@pytest.mark.parametrize("name", NAMES)
def test_a_notebook_with_valid_nbformat(name):
    import nbformat

    nbformat.validate(nbformat.reads(json.dumps(_edition(name)), as_version=4))


def test_chapter_8s_recipe_table_reads_with_its_numbers():
    """The issue's example: 'to a peak of {glue:text}`ch8_peak_lr`' in chapter 8."""
    cells = _edition("08_translation.ipynb")["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "ch8_peak_lr" not in text
    assert "to a peak of 1.10·10⁻³, held" in text


def test_solutions_are_closed_details_and_figures_are_embedded():
    edition = _edition("01_attention.ipynb")
    text = "\n".join("".join(c["source"]) for c in edition["cells"] if c["cell_type"] == "markdown")
    assert text.count("<details>\n<summary>Solution</summary>\n\n") >= 3
    assert "<details open" not in text
    assert text.count('<img src="data:image/svg+xml;base64,') == 4  # chapter 1's drawings
    assert "*Fig. 2. Where this chapter sits" in text  # intro.md's drawing is Fig. 1
    assert "(Vaswani et al., 2017)" in text
    assert re.search(r"^## References\n\n- .*Vaswani et al. \(2017\)", text, re.M | re.S)


# --------------------------------------------------------------------------- the conversion


@pytest.mark.parametrize(
    ("text", "fmt"),
    [("0.123456", ""), ("0.123456", ".2f"), ("'1.10·10⁻³'", ""), ("12", ".1f"), ("3", "d"),
     ("0.25", ".1%"), ("np.float64(0.5)", ""), ("'a b'", "s"), ("1e-05", "")],
)  # fmt: skip
def test_glue_text_is_formatted_as_myst_nb_formats_it(text, fmt):
    variables = pytest.importorskip("myst_nb.core.variables")
    assert markdown.format_plain_text(text, fmt) == variables.format_plain_text(text, fmt or "s")


def test_glue_roles_missing_values_and_unknown_roles_are_errors(book):
    glue = {"x": {"text/plain": "0.5"}, "t": {"text/plain": "'a|b_c'"}}
    ctx = _ctx(book, glue)
    assert markdown.render_markdown("x is {glue:text}`x:.2f`, {glue:text}`t`.", ctx) == (
        "x is 0.50, a\\|b\\_c."
    )
    with pytest.raises(markdown.ReaderError, match="no glued value named 'y'"):
        markdown.render_markdown("{glue:text}`y`", ctx)
    with pytest.raises(markdown.ReaderError, match=r"\{eq\}"):
        markdown.render_markdown("see {eq}`my-eq`", ctx)
    with pytest.raises(markdown.ReaderError, match=r"\{glossary\}"):
        markdown.render_markdown("```{glossary}\nterm\n```", ctx)


def test_a_value_starting_a_line_does_not_become_a_list(book):
    ctx = _ctx(book, {"n": {"text/plain": "3"}})
    assert markdown.render_markdown("Rows\n{glue:text}`n`. Then", ctx) == "Rows\n3\\. Then"


def test_math_code_and_escapes_are_left_alone(book):
    ctx = _ctx(book)
    text = ("$d_{\\text{model}}$ and $$\\sum_{i}`x`$$, `{cite}`x``, \\{cite}`x`\n\n"
            "```python\nprint('{glue:text}`a`')\n```")  # fmt: skip
    assert markdown.render_markdown(text, ctx) == text


def test_admonitions_citations_numrefs_and_links(book):
    ctx = _ctx(book)
    text = (
        "````{admonition} Solution\n:class: dropdown\n\nUse {cite}`vaswani2017attention`.\n\n"
        "```python\nx = 1\n```\n````\n\n```{note}\nA {cite:t}`rush2018annotated` note.\n```\n\n"
        "{numref}`fig-ch5-shapes` and [chapter 2](02_masks.ipynb#padding), "
        "[a result](../results/multi30k.json)."
    )
    site = book.site
    assert markdown.render_markdown(text, ctx) == (
        "<details>\n<summary>Solution</summary>\n\nUse (Vaswani et al., 2017).\n\n"
        "```python\nx = 1\n```\n\n</details>\n\n**Note**\n\nA Rush (2018) note.\n\n"
        f"[Fig. 15]({site}chapters/05_model.html#fig-ch5-shapes) and "
        f"[chapter 2]({site}chapters/02_masks.html#padding), "
        f"[a result]({book.repository[0]}/blob/main/results/multi30k.json)."
    )
    assert ctx.cited == ["vaswani2017attention", "rush2018annotated"]
    with pytest.raises(markdown.ReaderError, match="no such key"):
        markdown.render_markdown("{cite}`nobody2099`", ctx)
    with pytest.raises(markdown.ReaderError, match="no figure named"):
        markdown.render_markdown("{numref}`fig-none`", ctx)
    with pytest.raises(markdown.ReaderError, match="points to nothing"):
        markdown.render_markdown("[x](../no_such_file.txt)", ctx)


def test_a_figure_is_an_embedded_image_with_its_caption(book):
    ctx = _ctx(book)
    text = ("```{figure} ../book/figures/shapes.svg\n:alt: Shapes \"n\" & d\n:width: 90%\n"
            ":name: fig-ch5-shapes\n\nEvery shape, $n$ tokens.\n```")  # fmt: skip
    out = markdown.render_markdown(text, ctx)
    svg = (ROOT / "book" / "figures" / "shapes.svg").read_bytes()
    import base64

    assert out == (
        f'<img src="data:image/svg+xml;base64,{base64.b64encode(svg).decode()}" '
        'alt="Shapes &quot;n&quot; &amp; d" width="90%">\n\n*Fig. 15. Every shape, $n$ tokens.*'
    )
    with pytest.raises(markdown.ReaderError, match="no :alt:"):
        markdown.render_markdown("```{figure} ../book/figures/shapes.svg\n```", ctx)


def test_site_url_is_derived_from_the_repository():
    assert reader.site_url("https://github.com/Owner/my-book") == "https://owner.github.io/my-book/"
    with pytest.raises(ValueError, match="repository.url"):
        reader.site_url("https://gitlab.com/owner/book")


def test_a_translation_replaces_markdown_by_cell_id_and_nothing_else(book):
    """The hook for another language: texts keyed by cell id; code and outputs unchanged."""
    chapter = _load(ROOT / "chapters" / "02_masks.ipynb")
    first_md = next(c for c in chapter["cells"] if c["cell_type"] == "markdown"
                    and not c["source"][0].startswith("# "))  # fmt: skip
    texts = {first_md["id"]: "Ein Absatz mit {cite}`vaswani2017attention`.",
             reader.NOTE_ID: "*Eine Notiz.*", reader.REFERENCES_ID: "## Literatur"}  # fmt: skip
    english, _ = reader.render_notebook(copy.deepcopy(chapter), book)
    german, _ = reader.render_notebook(chapter, book, texts)
    assert len(german["cells"]) == len(english["cells"])
    for de, en in zip(german["cells"], english["cells"]):
        assert de["id"] == en["id"]
        if de["id"] == first_md["id"]:
            assert "".join(de["source"]) == "Ein Absatz mit (Vaswani et al., 2017)."
        elif de["id"] == reader.NOTE_ID:
            assert de["source"] == ["*Eine Notiz.*"]
        elif de["id"] == reader.REFERENCES_ID:
            assert de["source"][0] == "## Literatur\n"
        else:
            assert de == en


def test_check_fails_on_a_stale_edition(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reader, "OUT", tmp_path)
    one = ROOT / "chapters" / "02_masks.ipynb"
    assert reader.main([str(one)]) == 0
    assert reader.main(["--check", str(one)]) == 0
    stale = tmp_path / "02_masks.ipynb"
    stale.write_text(stale.read_text(encoding="utf-8").replace("Masks", "Mask"), encoding="utf-8")
    assert reader.main(["--check", str(one)]) == 1
    assert "02_masks.ipynb" in capsys.readouterr().err
