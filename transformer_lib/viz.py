"""Figures for the book: an Altair renderer that works offline, and shared chart helpers.

Hand-written (not exported from a chapter): it is plumbing for the book, not part of the model.

Altair's default renderer writes a random element id and loads Vega from a CDN. The book's
renderer instead rounds every float of the chart to three significant digits, writes a
stable id (a hash of the rounded chart) and calls the page-global ``vegaEmbed``, which the
built site serves from its own ``_static/`` folder. So figures draw with no network access, and
re-executing a chapter gives byte-identical output (which nbval compares), on any CPU: the
digits that differ between machines' vector kernels are not embedded. In a live Jupyter kernel
without ``BOOK_FIGURES=offline`` the usual Altair renderer is kept, so figures also draw in
JupyterLab.

Altair is imported on first use: it comes with the ``notebooks`` extra
(``pip install "annotated-transformer-book[notebooks]"``), and without it this module still
imports (``COLORS``, ``in_book_build``) while drawing raises an ImportError that says so.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import altair as alt

__all__ = [
    "setup_altair", "in_book_build", "attention_heatmap", "show_explorer", "glue", "COLORS",
]

# Okabe–Ito palette: distinguishable with the common forms of colour blindness.
COLORS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]

_seen: dict[str, int] = {}

# myst-nb's glue store: the site's `{glue:text}` roles read outputs of this form.
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, variable: Any, display: bool = True) -> None:
    """Store `variable`'s displayed form under `name` for the book's text (myst-nb's ``glue``).

    The chapters' prose quotes numbers computed in their cells: the site's build pastes each
    stored value where the text names it, and the reader editions of the notebooks
    (tools/reader_edition.py) do the same from the same outputs. The output is exactly what
    ``myst_nb.glue`` writes, so the book builds as before, while a reader's kernel (Colab,
    Binder) needs only IPython, not myst-nb and the Sphinx it brings.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipy_display

    mimebundle, metadata = format_display_data(variable)
    mime_prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": mime_prefix}
    ipy_display({mime_prefix + k: v for k, v in mimebundle.items()}, raw=True, metadata=metadata)


def in_book_build() -> bool:
    """True while the book is built or tested (``BOOK_FIGURES=offline``): no live reader."""
    return os.environ.get("BOOK_FIGURES", "") == "offline"


# Significant digits kept of every float a figure embeds. A chart is a few hundred pixels wide,
# so three digits are all a reader can see; the digits after them are where different CPUs
# (vector kernels, BLAS builds) disagree, and the page must be the same on every machine.
FIGURE_DIGITS = 3


def round_floats(value: Any, digits: int = FIGURE_DIGITS) -> Any:
    """`value` with every float (in nested dicts and lists) rounded to `digits` significant digits.

    Integers, booleans and strings are unchanged; NaN and infinities too (Vega-Lite drops them).
    """
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")) or value == 0.0:
            return value
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: round_floats(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [round_floats(v, digits) for v in value]
    return value


def _stable_spec(spec: dict) -> dict:
    """The spec with its floats rounded and its datasets renamed after the rounded data.

    Altair names each inline dataset after a hash of the unrounded values ("data-<hash>"), so
    a difference in the last bit would rename it; the name follows the rounded data instead.
    """
    spec = round_floats(spec)
    datasets = spec.get("datasets")
    if not isinstance(datasets, dict):
        return spec
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    for old in sorted(datasets, key=len, reverse=True):
        rows = json.dumps(datasets[old], sort_keys=True, separators=(",", ":"))
        new = "data-" + hashlib.sha1(rows.encode()).hexdigest()[:16]
        text = text.replace(f'"{old}"', f'"{new}"')
    return json.loads(text)


def _book_renderer(spec: dict, **_: Any) -> dict[str, str]:
    spec = _stable_spec(spec)
    payload = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha1(payload.encode()).hexdigest()[:12]
    _seen[digest] = _seen.get(digest, 0) + 1
    div_id = f"vega-{digest}-{_seen[digest]}"
    label = spec.get("description") or _title(spec) or "Altair figure"
    # `</` inside a JSON string would close the <script> element early.
    payload = payload.replace("</", "<\\/")
    out = (
        f'<div id="{div_id}" class="book-figure" role="figure" '
        f'aria-label="{html.escape(str(label), quote=True)}"></div>\n'
        '<script type="text/javascript">\n'
        "(function () {\n"
        f'  var el = document.getElementById("{div_id}");\n'
        f"  var spec = {payload};\n"
        "  if (window.vegaEmbed) {\n"
        '    window.vegaEmbed(el, spec, {actions: false, renderer: "svg"})\n'
        "      .catch(function (err) { el.textContent = String(err); console.error(err); });\n"
        "  } else {\n"
        '    el.textContent = "[Interactive Vega figure: it draws in the built book; '
        're-run this cell to draw it here.]";\n'
        "  }\n"
        "})();\n"
        "</script>"
    )
    return {"text/html": out}


def _title(spec: dict) -> str:
    t = spec.get("title")
    if isinstance(t, dict):
        t = t.get("text")
    if isinstance(t, list):
        t = " ".join(map(str, t))
    return str(t) if t else ""


# Altair comes with the package's `notebooks` extra, not with the package: the model, the
# training loop and the command line must import without it.
MISSING_ALTAIR = (
    "transformer_lib.viz draws the book's figures with Altair, which is not installed. "
    'Install the extra that brings it: pip install "annotated-transformer-book[notebooks]" '
    '(or "[book]", which includes it; in a clone: pip install -e ".[notebooks]").'
)


def _altair() -> Any:
    """Altair, imported on first use, with the book's renderer registered."""
    try:
        import altair
    except ImportError as err:
        raise ImportError(MISSING_ALTAIR) from err
    if "book" not in altair.renderers.names():
        altair.renderers.register("book", _book_renderer)
    return altair


def setup_altair() -> None:
    """Choose the renderer: offline and deterministic for the book, Altair's default otherwise."""
    alt = _altair()
    alt.data_transformers.disable_max_rows()
    if in_book_build():
        alt.renderers.enable("book")
    else:
        alt.renderers.enable("default")


def attention_heatmap(
    weights: Any,
    row_labels: list[str] | None = None,
    col_labels: list[str] | None = None,
    title: str = "Attention weights",
    width: int = 220,
    height: int = 220,
    description: str | None = None,
) -> alt.Chart:
    """Heatmap of a (q_len, k_len) attention matrix: rows are queries, columns keys.

    `description` is the figure's alt text; by default it says what the axes and colours are.
    """
    alt = _altair()
    import pandas as pd

    w = weights.detach().cpu().float() if hasattr(weights, "detach") else weights
    n_q, n_k = len(w), len(w[0])
    rows = row_labels or [f"q{i}" for i in range(n_q)]
    cols = col_labels or [f"k{j}" for j in range(n_k)]
    # Duplicate tokens would merge cells on a nominal axis: make every label unique.
    rows = [f"{i}:{t}" for i, t in enumerate(rows)]
    cols = [f"{j}:{t}" for j, t in enumerate(cols)]
    df = pd.DataFrame(
        [(rows[i], cols[j], float(w[i][j])) for i in range(n_q) for j in range(n_k)],
        columns=["query", "key", "weight"],
    )
    return (
        alt.Chart(
            df, title=title, width=width, height=height,
            description=description or (
                f"{title}: a heatmap with one row per query position and one column per key "
                "position, coloured by attention weight from 0 (dark) to 1 (yellow)."
            ),
        )
        .mark_rect()
        .encode(
            x=alt.X("key:N", sort=cols, title="key position"),
            y=alt.Y("query:N", sort=rows, title="query position"),
            color=alt.Color("weight:Q", scale=alt.Scale(scheme="viridis", domain=[0, 1])),
            tooltip=["query", "key", alt.Tooltip("weight:Q", format=".3f")],
        )
    )


def _explorer_note_html(note: str) -> str:
    return (
        '<div class="book-explorer-note" role="note">'
        "<p><strong>Interactive explorer.</strong> "
        f"{html.escape(note)} "
        "Run this notebook (launch buttons at the top of the page, or JupyterLab) "
        "to use the interactive explorer; the figure above is its static view.</p></div>"
    )


def show_explorer(
    build_widget: Callable[[], Any],
    fallback: Callable[[], Any],
    note: str,
) -> None:
    """Show an ipywidgets explorer to a live reader, and a static figure in the built book.

    The built site has no kernel, so a widget there would need saved widget state and extra
    JavaScript, and its controls would not recompute anything. Instead, while the book is being
    built or tested (:func:`in_book_build`), this displays ``fallback()`` (typically an Altair
    chart, which may have its own kernel-free sliders) followed by a short note; otherwise it
    displays ``build_widget()``. Only the callable that is needed is called, so the book never
    imports ipywidgets. If ipywidgets is missing in a live session, the fallback is shown.

    Args:
        build_widget: called with no arguments in a live kernel; returns the widget to display
            (e.g. an ``ipywidgets.VBox`` or the result of ``ipywidgets.interactive``).
        fallback: called with no arguments in the book build; returns what to display instead
            (an ``alt.Chart`` or any object IPython can display).
        note: one or two sentences saying what the explorer lets the reader do.

    Not part of the paper: plumbing for the book.
    """
    if not callable(build_widget):
        raise ValueError(
            f"build_widget must be a callable returning a widget, got {build_widget!r}"
        )
    if not callable(fallback):
        raise ValueError(f"fallback must be a callable returning a displayable, got {fallback!r}")
    if not isinstance(note, str) or not note.strip():
        raise ValueError(f"note must be a non-empty string describing the explorer, got {note!r}")
    from IPython.display import display

    if not in_book_build():
        try:
            widget = build_widget()
        except ImportError as err:  # ipywidgets not installed: degrade like the book does
            display(fallback())
            display(
                {"text/plain": f"(interactive explorer unavailable: {err}) {note}"},
                raw=True,
            )
            return
        display(widget)
        return
    display(fallback())
    display(
        {
            "text/html": _explorer_note_html(note.strip()),
            "text/plain": f"Interactive explorer (run this notebook to use it): {note.strip()}",
        },
        raw=True,
    )
