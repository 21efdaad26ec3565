"""The drawing of chapter 10: maximum path length, recurrent layer against self-attention
(the paper's Table 1; hand-written)."""

from __future__ import annotations

import math

from .svg import BLUE, DIVIDER, GREEN, LINE, MONO, MUTED, PURPLE, VERMILLION, Svg, tint

ACCENT, FAINT = VERMILLION, "#d4d4d4"  # the path from x1 to the last position; other lines
XS = [170 + 104 * i for i in range(6)]  # centres of the n = 6 positions
R, BW, BH = 20, 56, 34  # circle radius, token box width and height
PATH_DESC = (
    "Two panels for a sequence of n = 6 tokens x1 to x6. Top, a recurrent layer: each "
    "input x_i enters a state h_i, and the states are chained left to right, h1 to h2 to "
    "h6; information from x1 reaches h6 only along the highlighted chain of 5 sequential "
    "steps, so the path length is n - 1 and the steps cannot run in parallel. Bottom, a "
    "self-attention layer: faint lines join every input to every output y1 to y6, and the "
    "highlighted line goes straight from x1 to y6: y6 attends to x1 directly, a path of "
    "length 1. All n outputs are computed at once from n squared scores, with no "
    "sequential steps."
)


def _edge(x0: float, y0: float, cx: float, cy: float, r: float) -> tuple[float, float]:
    """The point where the line from (x0, y0) to the centre (cx, cy) meets a circle of radius r."""
    dx, dy = cx - x0, cy - y0
    d = math.hypot(dx, dy)
    return cx - dx * r / d, cy - dy * r / d


def _tokens(s: Svg, cy: float) -> None:
    """The inputs x1 ... x6 in boxes, x1 outlined in the accent colour."""
    for i, x in enumerate(XS):
        first = i == 0
        s.box(
            x - BW / 2,
            cy - BH / 2,
            BW,
            BH,
            [f"x_{{{i + 1}}}"],
            fill=tint(PURPLE, 0.2),
            stroke=ACCENT if first else PURPLE,
            sw=2.4 if first else 1.2,
            size=18,
            family=MONO,
        )


def _nodes(s: Svg, cy: float, sym: str, color: str) -> None:
    """States or outputs in circles, the last one outlined in the accent colour."""
    for i, x in enumerate(XS):
        stroke, sw = (ACCENT, 2.4) if i == len(XS) - 1 else (color, 1.2)
        s.circle(x, cy, R, tint(color, 0.22), stroke=stroke, sw=sw)
        s.text(x, cy + 18 * 0.35, f"{sym}_{{{i + 1}}}", size=18, family=MONO)


def _row_labels(s: Svg, top: float, top_label: str, bottom: float) -> None:
    s.text(30, top + 5, top_label, size=17, anchor="start", fill=MUTED)
    s.text(30, bottom + 5, "inputs", size=17, anchor="start", fill=MUTED)


def draw_path_length() -> Svg:
    """Chapter 10: for n = 6, n - 1 steps through a recurrence, one through self-attention."""
    s = Svg(860, 580, "Maximum path length: recurrent layer versus self-attention", PATH_DESC)
    _recurrent(s)
    s.path("M20,264 H840", stroke=DIVIDER, sw=1, arrow=False)
    _self_attention(s)
    return s


def _recurrent(s: Svg) -> None:
    """Top panel: a chain of states, 5 sequential steps from x1 to h6."""
    s.text(430, 30, "Recurrent layer: path length n \u2212 1", size=18, weight="bold")
    hy, xy = 118, 190
    s.text(430, 70, "5 sequential steps from x1 to h6", size=17, weight="bold", fill=ACCENT)
    _row_labels(s, hy, "states", xy)
    _nodes(s, hy, "h", GREEN)
    _tokens(s, xy)
    for i, x in enumerate(XS):
        s.arrow(x, xy - BH / 2, x, hy + R + 1, stroke=LINE)
        if i + 1 < len(XS):
            s.arrow(x + R, hy, XS[i + 1] - R - 1, hy, stroke=ACCENT, sw=2.4)
            s.text((x + XS[i + 1]) / 2, hy - 9, f"{i + 1}", size=17, weight="bold", fill=ACCENT)
    s.text(
        430,
        240,
        "each state needs the one before it: the steps run one after another",
        size=17,
        fill=MUTED,
        italic=True,
    )


def _self_attention(s: Svg) -> None:
    """Bottom panel: every input to every output, and y6 reading x1 in one step."""
    s.text(430, 294, "Self-attention layer: path length 1", size=18, weight="bold")
    yy, xy = 370, 500
    s.text(
        XS[-1] + R,
        334,
        "1 step: y6 attends to x1 directly",
        size=17,
        anchor="end",
        weight="bold",
        fill=ACCENT,
    )
    _row_labels(s, yy, "outputs", xy)
    for x0 in XS:  # every input to every output, faint
        for cx in XS:
            ex, ey = _edge(x0, xy - BH / 2, cx, yy, R)
            s.arrow(x0, xy - BH / 2, ex, ey, stroke=FAINT, sw=0.9, arrow=False)
    ex, ey = _edge(XS[0], xy - BH / 2, XS[-1], yy, R + 1)
    s.arrow(XS[0], xy - BH / 2, ex, ey, stroke=ACCENT, sw=2.4)
    _nodes(s, yy, "y", BLUE)
    _tokens(s, xy)
    s.text(
        430,
        552,
        "all n outputs at once: n\u00b2 scores, no sequential steps",
        size=17,
        fill=MUTED,
        italic=True,
    )
