"""A small SVG drawing library for the book's figures (hand-written; standard library only).

`Svg` collects elements (rectangles, circles, paths, arrows, text with _{sub}/^{sup} markup,
labelled boxes) and renders a self-contained document: a <title> and <desc> for screen readers,
one arrowhead marker per colour, generic font families only. Coordinates are written with two
decimals at most, so the same calls always give the same bytes.

A box refuses a label that would not fit: `text_width` estimates a string's width in DejaVu Sans
(the widest common sans-serif), so an overflowing label fails when drawing, not on the page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

# Okabe-Ito palette, copied from transformer_lib.viz.COLORS (tests/test_figures.py checks that
# the two agree) so that drawings and plots use the same colours.
BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, BLACK = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
)
PALETTE = [BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, BLACK]

INK = "#1a1a1a"  # text and outlines
LINE = "#4d4d4d"  # arrows between parts
GREY_FILL, GREY_STROKE, GREY_TEXT = "#f2f2f2", "#b8b8b8", "#808080"  # "not this chapter"
# Greys for secondary text and fine lines, darkest first.
ANNOTATION = "#333333"  # a remark next to what it explains
MUTED = "#444444"  # subtitles, axis and row labels
FOOTNOTE = "#555555"  # a closing note, a box's third line
GRID = "#777777"  # outlines of grid cells
CELL = "#888888"  # outlines of small coloured vector cells
DIVIDER = "#cccccc"  # a rule between two panels
SANS, MONO = "sans-serif", "monospace"
# Average advance of a character, in em, for DejaVu Sans / DejaVu Sans Mono (what Chromium on
# Linux picks for the generic families; Arial and Helvetica are narrower, so this is safe).
EM_SANS, EM_MONO = 0.62, 0.61


def tint(color: str, amount: float) -> str:
    """`color` mixed with white: amount 1 is the colour itself, 0 is white."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(255 - (255 - c) * amount) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def num(v: float) -> str:
    """A coordinate as short, stable text (two decimals at most)."""
    out = f"{round(v, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if out in ("-0", "") else out


MARKUP = re.compile(r"([_^])\{([^}]*)\}")


def plain(s: str) -> str:
    """The text a reader sees, without the _{sub} / ^{sup} markup."""
    return MARKUP.sub(r"\2", s)


def text_width(s: str, size: float, family: str = SANS) -> float:
    """Estimated width of `s` (sub- and superscripts count at 70% size)."""
    em = EM_MONO if family == MONO else EM_SANS
    small = sum(len(m.group(2)) for m in MARKUP.finditer(s))
    return em * size * (len(plain(s)) - small + 0.7 * small)


def require_fit(s: str, size: float, room: float, where: str, family: str = SANS) -> None:
    """Raise ValueError if `s` at `size` is estimated wider than `room` units (`where` names the
    space in the message: "'multi-head' is too wide for a 40-unit box")."""
    if text_width(s, size, family) > room:
        raise ValueError(f"{s!r} is too wide for {where}")


def rich(s: str, size: float) -> str:
    """Escape `s` and turn _{...} and ^{...} into shifted, smaller tspans."""
    out, pos, shift = [], 0, 0.0
    small = num(size * 0.7)
    for m in MARKUP.finditer(s):
        if m.start() > pos:
            chunk = escape(s[pos : m.start()])
            out.append(f'<tspan dy="{num(-shift)}">{chunk}</tspan>' if shift else chunk)
            shift = 0.0
        dy = size * 0.3 if m.group(1) == "_" else -size * 0.4
        out.append(
            f'<tspan dy="{num(dy - shift)}" font-size="{small}">{escape(m.group(2))}</tspan>'
        )
        shift = dy
        pos = m.end()
    if pos < len(s):
        chunk = escape(s[pos:])
        out.append(f'<tspan dy="{num(-shift)}">{chunk}</tspan>' if shift else chunk)
    return "".join(out)


def _marker_id(color: str) -> str:
    return "arrow-" + color.lstrip("#").lower()


@dataclass
class Svg:
    """An SVG document built element by element; `render()` gives its text."""

    width: int
    height: int
    title: str
    desc: str
    parts: list[str] = field(default_factory=list)
    markers: set[str] = field(default_factory=set)  # colours of the arrowheads in use

    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        fill: str = "none",
        stroke: str = INK,
        sw: float = 1.2,
        rx: float = 5,
        dash: str | None = None,
    ) -> None:
        """A rectangle, corners rounded by `rx`; `sw` is the stroke width."""
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" '
            f'rx="{num(rx)}" fill="{fill}" stroke="{stroke}" stroke-width="{num(sw)}"{extra}/>'
        )

    def circle(
        self, cx: float, cy: float, r: float, fill: str, stroke: str = INK, sw: float = 1.2
    ) -> None:
        """A circle of radius `r` centred on (cx, cy)."""
        self.parts.append(
            f'<circle cx="{num(cx)}" cy="{num(cy)}" r="{num(r)}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{num(sw)}"/>'
        )

    def text(
        self,
        x: float,
        y: float,
        s: str,
        size: float = 12,
        anchor: str = "middle",
        fill: str = INK,
        weight: str | None = None,
        family: str = SANS,
        italic: bool = False,
    ) -> None:
        """One line of text with its baseline at `y`; _{sub} and ^{sup} become tspans."""
        attrs = f'x="{num(x)}" y="{num(y)}" font-size="{num(size)}" font-family="{family}"'
        if anchor != "start":
            attrs += f' text-anchor="{anchor}"'
        if fill != INK:
            attrs += f' fill="{fill}"'
        if weight:
            attrs += f' font-weight="{weight}"'
        if italic:
            attrs += ' font-style="italic"'
        self.parts.append(f"<text {attrs}>{rich(s, size)}</text>")

    def lines(
        self,
        x: float,
        cy: float,
        rows: list[str],
        size: float = 12,
        gap: float = 1.25,
        **kw,
    ) -> None:
        """Several lines of text, the block centred vertically on `cy`."""
        step = size * gap
        top = cy - step * (len(rows) - 1) / 2 + size * 0.35
        for i, row in enumerate(rows):
            self.text(x, top + i * step, row, size=size, **kw)

    def path(
        self,
        d: str,
        stroke: str = LINE,
        sw: float = 1.4,
        arrow: bool = True,
        dash: str | None = None,
        fill: str = "none",
    ) -> None:
        """An SVG path `d`, with an arrowhead of the stroke's colour at its end by default."""
        extra = ""
        if arrow:
            self.markers.add(stroke)
            extra += f' marker-end="url(#{_marker_id(stroke)})"'
        if dash:
            extra += f' stroke-dasharray="{dash}"'
        self.parts.append(
            f'<path d="{d}" fill="{fill}" stroke="{stroke}" stroke-width="{num(sw)}"{extra}/>'
        )

    def arrow(self, x1: float, y1: float, x2: float, y2: float, **kw) -> None:
        """A straight arrow from (x1, y1) to (x2, y2) (`arrow=False`: a plain line)."""
        self.path(f"M{num(x1)},{num(y1)} L{num(x2)},{num(y2)}", **kw)

    def box(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        rows: list[str],
        fill: str,
        stroke: str = INK,
        size: float = 12,
        text_fill: str = INK,
        sw: float = 1.2,
        family: str = SANS,
        weight: str | None = None,
    ) -> None:
        """A rounded box with centred lines of text; fails if a line would not fit."""
        for row in rows:
            require_fit(row, size, w - 6, f"a {w}-unit box", family)
        if len(rows) * size * 1.25 > h:
            raise ValueError(f"labels {rows!r} are too tall for a {h}-unit box")
        self.rect(x, y, w, h, fill=fill, stroke=stroke, sw=sw)
        self.lines(
            x + w / 2, y + h / 2, rows, size=size, fill=text_fill, family=family, weight=weight
        )

    def render(self) -> str:
        """The whole document: title, description, arrowhead markers, white background, parts."""
        defs = "".join(
            f'<marker id="{_marker_id(c)}" viewBox="0 0 10 10" refX="9" refY="5" '
            f'markerWidth="8" markerHeight="8" markerUnits="userSpaceOnUse" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>'
            for c in sorted(self.markers)
        )
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
            f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" role="img" '
            f'aria-labelledby="title desc">\n'
            f'<title id="title">{escape(self.title)}</title>\n'
            f'<desc id="desc">{escape(self.desc)}</desc>\n'
            f"<defs>{defs}</defs>\n"
            f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def vector_cells(s: Svg, x: float, y: float, values: list[float], color: str,
                 alpha: float = 1.0, cell: float = 15) -> None:
    """A row of square cells from (x, y), each tinted by the size of its value."""
    for k, v in enumerate(values):
        fill = tint(color, alpha * (0.25 + 0.6 * abs(v)))
        s.rect(x + k * cell, y, cell, cell, fill=fill, stroke=tint(INK, 0.6), sw=0.8, rx=1)
