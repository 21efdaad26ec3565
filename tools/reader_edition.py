"""Write the reader edition of every chapter: `notebooks/NN_x.ipynb`, the chapter as a notebook
viewer shows it (Colab, JupyterLab, Binder, VS Code, a notebook downloaded from the site).

    python tools/reader_edition.py            # write notebooks/*.ipynb from chapters/*.ipynb
    python tools/reader_edition.py --check    # exit 1 if an edition is missing, stale or extra
    python tools/reader_edition.py chapters/08_translation.ipynb   # some chapters only

The chapters in `chapters/` are written in MyST Markdown for the site: glued numbers
(``{glue:text}``), citations, figure directives and dropdown solutions, which Jupyter's Markdown
renderer shows as raw text. The reader edition is generated from the stored chapter, nothing is
executed: every code cell, with its outputs, metadata and id, is the chapter's own; every
markdown cell keeps its id and its text is rendered to plain Markdown (tools/reader_markdown.py
says what becomes what: glued values as the site pastes them, citations "(Vaswani et al., 2017)",
figures embedded with their captions, solutions in closed ``<details>``, links to the site's
pages). Two cells are added, with fixed ids: a note above the title (the numbers in the text come
from the book's run; a reader's run may differ in the last digits) and, when the chapter cites
anything, its references at the end.

Another language later (the hook): `render_notebook(chapter, book, texts)` takes `texts`, a
mapping from cell id to that cell's MyST Markdown in the other language (the ids `reader-note`
and `reader-references` give the added note and the references' heading). A cell missing from
`texts` keeps the chapter's text. Code cells and outputs are the chapter's whatever the language,
so an edition in another language differs only in the markdown cells, cell by cell.

The site's address is derived from `repository.url` in _config.yml (`site_url`), the one place it
is set. `make book` runs this tool before the build (the site's download button and the Colab and
Binder buttons open these files, book/_ext/reader_links.py) and `make test` runs `--check`.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import urlsplit

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reader_markdown import (  # noqa: E402  (the module beside this script, not installed)
    MARKDOWN_SPECIAL,
    Context,
    ReaderError,
    render_markdown,
)

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
OUT = ROOT / "notebooks"
GLUE_PREFIX = "application/papermill.record/"  # myst-nb's prefix of a glue with display=False
NOTE_ID, REFERENCES_ID = "reader-note", "reader-references"
NOTE = (
    "*This notebook is the reader edition of the book's chapter: the numbers in the text come "
    "from the book's own run of it, and when you run it yourself they may differ in the last "
    "digits (other CPUs round differently). The book's site is at <{site}>.*"
)
REFERENCES_HEADING = "## References"
FIGURE = re.compile(r"^ {0,3}(`{3,}|:{3,})\{figure\}.*\n((?:[ \t]*:[\w-]+:.*\n)*)", re.M)
# MyST that must not survive into a reader edition (checked after rendering, and by the tests).
LEFTOVER_MYST = re.compile(r"\{glue|\{cite\}|\{numref\}|```\{|:::\{|\{[a-z][\w:-]*\}`")


def site_url(repository_url: str) -> str:
    """The book's site for its repository: GitHub Pages, https://OWNER.github.io/NAME/."""
    parts = urlsplit(repository_url.rstrip("/"))
    owner_name = parts.path.strip("/").removesuffix(".git").split("/")
    if parts.netloc.lower() != "github.com" or len(owner_name) != 2:
        raise ValueError(f"repository.url {repository_url!r} is not https://github.com/OWNER/NAME")
    owner, name = owner_name
    return f"https://{owner.lower()}.github.io/{name}/"


def _toc_files(toc: dict) -> list[str]:
    out = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                out.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key) or []:
                    walk(child)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(f).with_suffix("")) for f in out]


def _markdown_of(doc: Path) -> list[str]:
    if doc.suffix == ".md":
        return [doc.read_text(encoding="utf-8")]
    cells = json.loads(doc.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


@dataclass
class Book:
    """What every chapter's edition shares: the site's address, figure numbers, bibliography."""

    root: Path = ROOT

    @cached_property
    def config(self) -> dict:
        return yaml.safe_load((self.root / "_config.yml").read_text(encoding="utf-8"))

    @cached_property
    def repository(self) -> tuple[str, str]:
        repo = self.config["repository"]
        return repo["url"].rstrip("/"), repo.get("branch", "main")

    @cached_property
    def site(self) -> str:
        return site_url(self.repository[0])

    @cached_property
    def pages(self) -> dict[str, Path]:
        """Each document of _toc.yml (`chapters/01_attention`) -> its source file."""
        toc = yaml.safe_load((self.root / "_toc.yml").read_text(encoding="utf-8"))
        out = {}
        for name in _toc_files(toc):
            found = [p for p in (self.root / f"{name}.ipynb", self.root / f"{name}.md") if
                     p.is_file()]  # fmt: skip
            if not found:
                raise ReaderError(f"_toc.yml names {name}, which has no .ipynb or .md")
            out[name] = found[0]
        return out

    @cached_property
    def figure_numbers(self) -> dict[str, tuple[int, str]]:
        """Figure label -> (its number on the site, its page's URL).

        Sphinx numbers the figures that have a name through the whole book, in the order of
        _toc.yml (the site shows "Fig. 15" in chapter 5): counted the same way here.
        """
        out, n = {}, 0
        for page, doc in self.pages.items():
            for text in _markdown_of(doc):
                for m in FIGURE.finditer(text + "\n"):
                    name = re.search(r"^[ \t]*:name:[ \t]*(\S+)", m.group(2), re.M)
                    if name:
                        n += 1
                        out[name.group(1)] = (n, f"{self.site}{page}.html")
        return out

    @cached_property
    def bibliography(self):
        from pybtex.database import parse_file

        return parse_file(str(self.root / "book" / "references.bib"))

    @cached_property
    def _labels(self) -> dict[str, tuple[str, str]]:
        from pybtex.backends.plaintext import Backend
        from pybtex.richtext import Text

        plain, out = Backend(), {}
        for key, entry in self.bibliography.entries.items():
            people = entry.persons.get("author") or entry.persons.get("editor") or []
            last = [Text.from_latex(" ".join(p.prelast_names + p.last_names)).render(plain)
                    for p in people]  # fmt: skip
            if not last:
                raise ReaderError(f"book/references.bib: {key} has no author")
            authors = (last[0] if len(last) == 1 else f"{last[0]} and {last[1]}"
                       if len(last) == 2 else f"{last[0]} et al.")  # fmt: skip
            out[key] = (authors, entry.fields.get("year", "n.d."))
        return out

    def cite_label(self, key: str) -> tuple[str, str]:
        """("Vaswani et al.", "2017"): the author-year label of a bibliography key."""
        if key not in self._labels:
            raise ReaderError(f"{{cite}}`{key}`: no such key in book/references.bib")
        return self._labels[key]

    def reference_list(self, keys: list[str]) -> str:
        """The cited entries as a Markdown list (pybtex's plain style), by author and year."""
        from pybtex.backends.plaintext import Backend
        from pybtex.style.formatting.plain import Style

        plain, style, lines = Backend(), Style(), []
        for key in sorted(keys, key=lambda k: (self.cite_label(k), k)):
            authors, year = self.cite_label(key)
            text = style.format_entry(key, self.bibliography.entries[key]).text.render(plain)
            text = MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(text.split()))
            lines.append(f"- {authors} ({year}). {text}")
        return "\n".join(lines)

    def link(self, target: str, folder: Path) -> str:
        """A relative link of a chapter -> the site's page, or the file on GitHub."""
        path, _, anchor = target.partition("#")
        file = (folder / path).resolve()
        try:
            rel = file.relative_to(self.root).as_posix()
        except ValueError:
            raise ReaderError(f"the link {target!r} leaves the repository") from None
        page = str(Path(rel).with_suffix(""))
        if page in self.pages and Path(rel).suffix in (".ipynb", ".md"):
            return f"{self.site}{page}.html" + (f"#{anchor}" if anchor else "")
        if not file.exists():
            raise ReaderError(f"the link {target!r} points to nothing ({rel})")
        repo, branch = self.repository
        kind = "tree" if file.is_dir() else "blob"
        return f"{repo}/{kind}/{branch}/{rel}" + (f"#{anchor}" if anchor else "")


def glue_data(nb: dict) -> dict[str, dict[str, str]]:
    """Glue name -> its stored data (mimetype -> text), as myst-nb reads it: the mimetype prefix
    of a `display=False` glue removed, and a name glued twice taking its last value."""
    out = {}
    for cell in nb["cells"]:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            meta = output.get("metadata", {}).get("scrapbook")
            if not meta:
                continue
            prefix = len(meta.get("mime_prefix", ""))
            out[meta["name"]] = {
                k[prefix:]: "".join(v) if isinstance(v, list) else v
                for k, v in output.get("data", {}).items()
            }
    return out


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _markdown_cell(cell_id: str, text: str) -> dict:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": _lines(text)}


def render_notebook(
    chapter: dict, book: Book, texts: Mapping[str, str] | None = None, folder: Path = CHAPTERS
) -> tuple[dict, Context]:
    """The reader edition of a chapter notebook (and the rendering's context: glued values
    shown, keys cited). `texts`: cell id -> MyST Markdown replacing the chapter's (a
    translation); see the module's docstring."""
    texts = texts or {}
    ctx = Context(
        glue=glue_data(chapter), cite_label=book.cite_label, figure_number=book.figure_numbers,
        link=lambda target: book.link(target, folder), folder=folder,
    )  # fmt: skip
    cells, title_seen = [], False
    for cell in chapter["cells"]:
        if cell["cell_type"] != "markdown":
            cells.append(copy.deepcopy(cell))
            continue
        source = texts.get(cell["id"], "".join(cell["source"]))
        if not title_seen and re.match(r"#\s", source.lstrip()):
            # the note on top, above the title (the setup cell before it is folded)
            title_seen = True
            note = texts.get(NOTE_ID, NOTE.format(site=book.site))
            cells.append(_markdown_cell(NOTE_ID, render_markdown(note, ctx)))
        try:
            text = render_markdown(source, ctx)
        except ReaderError as e:
            raise ReaderError(f"cell {cell['id']}: {e}") from None
        cells.append({**copy.deepcopy(cell), "source": _lines(text)})
    if not title_seen:
        raise ReaderError("the chapter has no title cell (# N. Title)")
    if ctx.cited:
        heading = texts.get(REFERENCES_ID, REFERENCES_HEADING)
        cells.append(_markdown_cell(REFERENCES_ID,
                                    f"{heading}\n\n{book.reference_list(ctx.cited)}"))  # fmt: skip
    leftover = [c["id"] for c in cells if c["cell_type"] == "markdown"
                and LEFTOVER_MYST.search(_outside_code("".join(c["source"])))]  # fmt: skip
    if leftover:
        raise ReaderError(f"MyST syntax left in cells {leftover}")
    return {**{k: v for k, v in chapter.items() if k != "cells"}, "cells": cells}, ctx


def _outside_code(text: str) -> str:
    """`text` without its code blocks, code spans and data: URIs (which may hold anything)."""
    text = re.sub(r"(?ms)^ {0,3}(`{3,}|~{3,})[^{\n]*\n.*?^ {0,3}\1\s*$", "", text)
    text = re.sub(r"(`+).*?\1", "", text, flags=re.S)
    return re.sub(r'data:[^")\s]+', "", text)


def dumps(nb: dict) -> str:
    """A notebook as nbformat writes it (sorted keys, one-space indent, a final newline)."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def edition_text(chapter_path: Path, book: Book) -> str:
    chapter = json.loads(chapter_path.read_text(encoding="utf-8"))
    try:
        return dumps(render_notebook(chapter, book, folder=chapter_path.parent)[0])
    except ReaderError as e:
        raise ReaderError(f"{chapter_path.name}: {e}") from None


def _shown(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, help="default: chapters/*.ipynb")
    parser.add_argument("--check", action="store_true", help="exit 1 if an edition is stale")
    args = parser.parse_args(argv)
    everything = not args.chapters
    chapters = sorted(CHAPTERS.glob("*.ipynb")) if everything else args.chapters
    book, stale = Book(), []
    try:
        for path in chapters:
            target = OUT / path.name
            text = edition_text(path.resolve(), book)
            current = target.read_text(encoding="utf-8") if target.exists() else None
            if args.check:
                if current != text:
                    stale.append(_shown(target))
            elif current != text:
                OUT.mkdir(exist_ok=True)
                target.write_text(text, encoding="utf-8")
                print(f"wrote {_shown(target)}")
    except ReaderError as e:
        print(f"reader_edition: {e}", file=sys.stderr)
        return 1
    extra = sorted({p.name for p in OUT.glob("*.ipynb")} - {p.name for p in chapters})
    if everything and extra:
        if args.check:
            stale += [f"{_shown(OUT / name)} (no chapter of that name)" for name in extra]
        else:
            for name in extra:
                (OUT / name).unlink()
                print(f"removed {_shown(OUT / name)} (no chapter of that name)")
    if stale:
        print("reader editions out of date (run `python tools/reader_edition.py`):\n  "
              + "\n  ".join(stale), file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
