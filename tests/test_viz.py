"""transformer_lib.viz: the offline Altair renderer and show_explorer's book/live switch."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import altair as alt
import pandas as pd
import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from transformer_lib import viz


@pytest.fixture
def shell():
    """An IPython shell, so display() publishes rich outputs that capture_output records."""
    return InteractiveShell.instance()


@pytest.fixture
def book(monkeypatch):
    monkeypatch.setenv("BOOK_FIGURES", "offline")
    viz.setup_altair()
    yield
    alt.renderers.enable("default")


@pytest.fixture
def live(monkeypatch):
    monkeypatch.delenv("BOOK_FIGURES", raising=False)
    viz.setup_altair()
    yield
    alt.renderers.enable("default")


def _chart(title: str = "squares") -> alt.Chart:
    df = pd.DataFrame({"x": [0, 1, 2], "y": [0, 1, 4]})
    return (
        alt.Chart(df, title=title)
        .mark_line()
        .encode(x=alt.X("x:Q", title="x"), y=alt.Y("y:Q", title="x squared"))
        .properties(description="y = x squared at three points.")
    )


def _bundles(captured) -> list[dict]:
    return [o.data for o in captured.outputs]


class _Recorder:
    """A callable that remembers whether it was called and returns a fixed object."""

    def __init__(self, result):
        self.calls = 0
        self.result = result

    def __call__(self):
        self.calls += 1
        return self.result


# --------------------------------------------------------------------------- show_explorer


def test_book_build_shows_fallback_and_note_not_widget(shell, book):
    widget = _Recorder(object())
    fallback = _Recorder(_chart("fallback figure"))
    with capture_output() as cap:
        viz.show_explorer(widget, fallback, "Drag the slider to change the temperature.")
    assert widget.calls == 0, "the widget must not even be built in the book"
    assert fallback.calls == 1
    figure, note = _bundles(cap)
    # The fallback chart went through the offline renderer: a book-figure div, no CDN.
    assert 'class="book-figure"' in figure["text/html"]
    assert "cdn.jsdelivr" not in figure["text/html"]
    assert 'aria-label="y = x squared at three points."' in figure["text/html"]
    assert 'class="book-explorer-note"' in note["text/html"]
    assert "Drag the slider to change the temperature." in note["text/html"]
    assert "Run this notebook" in note["text/html"]
    assert "Drag the slider" in note["text/plain"]
    assert not any("application/vnd.jupyter.widget-view+json" in b for b in _bundles(cap))


def test_book_build_output_is_deterministic(shell, book):
    def run() -> list[dict]:
        viz._seen.clear()
        with capture_output() as cap:
            viz.show_explorer(lambda: None, lambda: _chart(), "Explore it.")
        return _bundles(cap)

    assert run() == run()


def test_note_is_escaped(shell, book):
    with capture_output() as cap:
        viz.show_explorer(lambda: None, lambda: "static", "a <script>alert(1)</script> & more")
    note = _bundles(cap)[-1]["text/html"]
    assert "<script>" not in note
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in note


def test_live_kernel_shows_widget_not_fallback(shell, live):
    ipywidgets = pytest.importorskip("ipywidgets")
    slider = ipywidgets.IntSlider(value=2, min=0, max=5, description="head")
    fallback = _Recorder(_chart())
    with capture_output() as cap:
        viz.show_explorer(lambda: slider, fallback, "Choose a head.")
    assert fallback.calls == 0
    (bundle,) = _bundles(cap)
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == slider.model_id
    slider.close()


def test_live_kernel_without_ipywidgets_falls_back(shell, live):
    def build():
        raise ImportError("No module named 'ipywidgets'")

    with capture_output() as cap:
        viz.show_explorer(build, lambda: "the static view", "Choose a head.")
    first, second = _bundles(cap)
    assert first["text/plain"] == "'the static view'"
    assert "ipywidgets" in second["text/plain"] and "Choose a head." in second["text/plain"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"build_widget": "not callable"}, r"build_widget must be a callable"),
        ({"fallback": 3}, r"fallback must be a callable"),
        ({"note": ""}, r"note must be a non-empty string"),
        ({"note": "   "}, r"note must be a non-empty string"),
        ({"note": None}, r"note must be a non-empty string"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    args = {"build_widget": lambda: None, "fallback": lambda: None, "note": "Explore."}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        viz.show_explorer(**args)


# --------------------------------------------------------------------------- the renderer


def test_renderer_ids_are_stable_and_unique_per_repeat(book):
    viz._seen.clear()
    first = viz._book_renderer(_chart().to_dict())["text/html"]
    second = viz._book_renderer(_chart().to_dict())["text/html"]
    other = viz._book_renderer(_chart("another").to_dict())["text/html"]
    id1, id2, id3 = (
        re.search(r'id="(vega-[0-9a-f]{12}-\d+)"', h).group(1) for h in (first, second, other)
    )
    assert id1.endswith("-1") and id2.endswith("-2") and id1[:-2] == id2[:-2]
    assert id3[:-2] != id1[:-2]
    viz._seen.clear()
    assert viz._book_renderer(_chart().to_dict())["text/html"] == first


def test_renderer_embeds_the_spec_safely(book):
    df = pd.DataFrame({"label": ["</script><b>x</b>"], "v": [1]})
    chart = alt.Chart(df, title="t").mark_bar().encode(x="label:N", y="v:Q")
    html = viz._book_renderer(chart.to_dict())["text/html"]
    body = html.split("var spec = ", 1)[1].split(";\n", 1)[0]
    assert "</script>" not in body  # would end the <script> element early
    assert json.loads(body.replace("<\\/", "</"))["title"] == "t"
    assert "vegaEmbed" in html and "http" not in html.replace(alt.SCHEMA_URL, "")


# ------------------------------------------------------------------ without Altair


def test_without_altair_the_module_imports_and_drawing_names_the_extra(monkeypatch):
    """Altair is the `notebooks` extra's: the package imports without it, and the error names
    what to install."""
    monkeypatch.setitem(sys.modules, "altair", None)  # `import altair` now raises ImportError
    with pytest.raises(ImportError, match=re.escape('"annotated-transformer-book[notebooks]"')):
        viz.setup_altair()
    with pytest.raises(ImportError, match="Altair, which is not installed"):
        viz.attention_heatmap([[1.0]])
    assert viz.COLORS[0] == "#0072B2" and viz.in_book_build() in (True, False)


def test_importing_viz_does_not_import_altair():
    code = (
        "import sys; sys.modules['altair'] = None\n"
        "import transformer_lib.viz as viz\n"
        "print(viz.COLORS[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "#0072B2"


# --------------------------------------------------------------------------- stable figures


def _book_html(values: list[float], shell) -> str:
    df = pd.DataFrame({"x": list(range(len(values))), "y": values})
    chart = alt.Chart(df).mark_line().encode(x="x:Q", y="y:Q")
    from IPython.display import display

    with capture_output() as cap:
        display(chart)
    return _bundles(cap)[-1]["text/html"]


def test_book_figures_embed_three_significant_digits(shell, book):
    html_out = _book_html([0.123456789, 2.0, 1234.5678, -0.000987654], shell)
    assert '"y":0.123' in html_out and "0.1234" not in html_out
    assert '"y":1230.0' in html_out
    assert '"y":-0.000988' in html_out
    assert '"y":2.0' in html_out


def test_book_figures_do_not_change_with_the_last_bits(shell, book):
    # Two CPUs that disagree in the 7th digit draw the same page: same data, same ids.
    a = _book_html([0.1234561, 0.5, 0.7777771], shell)
    b = _book_html([0.1234569, 0.5, 0.7777779], shell)
    strip = re.compile(r'id="vega-[0-9a-f]+-\d+"|getElementById\("vega-[0-9a-f]+-\d+"\)')
    assert strip.sub("", a) == strip.sub("", b)
    digest = re.compile(r"vega-([0-9a-f]+)-")
    assert digest.search(a).group(1) == digest.search(b).group(1)
    assert "data-" in a  # the dataset was renamed after the rounded rows, in both


def test_round_floats_leaves_other_values_alone():
    spec = {"a": [1, True, "0.123456", None, float("nan")], "b": {"c": 1 / 3}, "d": (0.0, -2.5)}
    out = viz.round_floats(spec)
    assert out["a"][:4] == [1, True, "0.123456", None] and out["a"][4] != out["a"][4]
    assert out["b"]["c"] == 0.333 and out["d"] == [0.0, -2.5]
    assert isinstance(out["a"][0], int) and out["a"][1] is True
