"""masks.svg draws chapter 2's rule: the decoder's queries are its inputs, `<s>` + the target.

The causal and combined panels label their rows with decoder inputs, so `</s>` (an expected
output, never an input) must not label a query there.
"""

from __future__ import annotations

import importlib

from _tools import load_tool

load_tool("draw_figures")  # puts tools/ on sys.path
attention_figures = importlib.import_module("figures.attention")


def _panel_labels(svg_text: str, x_min: float, x_max: float) -> list[str]:
    """The monospace labels (tokens) drawn between x_min and x_max."""
    import re

    return [
        label
        for x, label in re.findall(
            r'<text x="([\d.]+)" y="[\d.]+" font-size="\d+" font-family="monospace"'
            r'[^>]*>([^<]*)</text>',
            svg_text,
        )
        if x_min <= float(x) < x_max
    ]


def test_decoder_panels_start_with_the_start_symbol_and_hold_no_end_symbol():
    svg_text = attention_figures.draw_masks().render()
    for x_min, x_max in ((260, 512), (512, 760)):  # the causal and the combined panel
        labels = _panel_labels(svg_text, x_min, x_max)
        assert labels, "no token labels found in the panel"
        assert "&lt;/s&gt;" not in labels, labels
        assert labels[0] == "&lt;s&gt;", labels
