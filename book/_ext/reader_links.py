"""Sphinx extension: a chapter's launch and download buttons open its reader edition.

The chapters in `chapters/` are the book's MyST sources, which Colab, Binder's JupyterLab and a
downloaded file show as raw build syntax; `tools/reader_edition.py` writes each chapter's reader
edition to `notebooks/` (same file name). Here, after sphinx-book-theme has made a chapter
page's header buttons (its `html-page-context` handlers run at priority 501):

- the Colab and Binder buttons open `notebooks/NN_x.ipynb` of the repository instead of
  `chapters/NN_x.ipynb`;
- the download menu's ".ipynb" gives the reader edition, copied into the site as
  `notebooks/NN_x.ipynb` when the build finishes.

A chapter without its reader edition is a warning (the build runs with -W: an error).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
SOURCES, EDITIONS = "chapters", "notebooks"


def _edition(app: Sphinx, pagename: str) -> Path | None:
    """notebooks/NN_x.ipynb for the page chapters/NN_x, or None for another page."""
    if not pagename.startswith(f"{SOURCES}/") or pagename.count("/") != 1:
        return None
    return Path(app.srcdir) / EDITIONS / f"{pagename.split('/', 1)[1]}.ipynb"


def point_buttons_at_reader_edition(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    edition = _edition(app, pagename)
    if edition is None or not context.get("header_buttons"):
        return
    if not edition.is_file():
        LOGGER.warning(
            f"{pagename}: no reader edition {EDITIONS}/{edition.name} for its launch and "
            "download buttons: run `python tools/reader_edition.py`"
        )
        return
    source_path = f"{pagename}.ipynb"
    edition_path = f"{EDITIONS}/{edition.name}"
    for group in context["header_buttons"]:
        for button in group.get("buttons", []):
            url = button.get("url", "")
            if group.get("label") == "launch-buttons" and url.endswith(f"/{source_path}"):
                button["url"] = url[: -len(source_path)] + edition_path
            elif button.get("label") == "download-source-button" and url.endswith(".ipynb"):
                button["url"] = context["pathto"](edition_path, 1)
                button["tooltip"] = "Download the notebook"


def copy_reader_editions(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    out = Path(app.outdir) / EDITIONS
    out.mkdir(parents=True, exist_ok=True)
    for docname in sorted(app.env.found_docs):
        edition = _edition(app, docname)
        if edition is not None and edition.is_file():
            shutil.copyfile(edition, out / edition.name)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", point_buttons_at_reader_edition, priority=900)
    app.connect("build-finished", copy_reader_editions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
