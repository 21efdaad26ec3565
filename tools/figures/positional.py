"""The drawing of chapter 4: token embedding plus positional encoding (hand-written)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from .svg import BLUE, CELL, MONO, MUTED, ORANGE, Svg, tint

PE_D = 8  # d_model of the drawing: 8 cells per vector
PE_WORDS = ["ein", "Hund", "läuft", "schnell"]
PE_CW, PE_CH, PE_GAP = 26, 20, 22  # cell width and height, gap between a group's columns
PE_GROUP_W = 4 * PE_CW + 3 * PE_GAP  # width of one group of four columns
PE_STARTS = [110, 110 + PE_GROUP_W + 70, 110 + 2 * (PE_GROUP_W + 70)]  # left edge of each group
PE_TOP = 80  # top of the vectors
PE_DESC = (
    "Three groups of four small column vectors, one column per position of the source "
    "'ein Hund läuft schnell', with d_model = 8 cells each, coloured from blue (negative) "
    "through white to orange (positive). Left, the token embeddings multiplied by the "
    "square root of d_model; middle, the sinusoidal positional encodings, which alternate "
    "sine and cosine down the column and change slowly for the lower dimensions; right, "
    "their sum, which is what the first encoder layer receives. The embedding values are "
    "illustrative; the encodings are the real sinusoids for positions 0 to 3."
)


def _lcg(seed: int) -> Iterator[float]:
    """A tiny deterministic generator of floats in [-1, 1) (no `random`: stable everywhere)."""
    state = seed
    while True:
        state = (1103515245 * state + 12345) % 2**31
        yield state / 2**30 - 1


def _diverging(v: float, limit: float) -> str:
    """Blue for negative, white for 0, orange for positive; full colour at +-`limit`."""
    t = max(-1.0, min(1.0, v / limit))
    return tint(ORANGE if t > 0 else BLUE, abs(t) * 0.95)


def _vectors() -> list[list[list[float]]]:
    """The three groups: illustrative embeddings, the real sinusoids, and their sum."""
    d, gen = PE_D, _lcg(7)
    emb = [[round(1.2 * next(gen), 2) for _ in range(d)] for _ in PE_WORDS]  # ~ unit scale
    pe = [
        [
            math.sin(p / 10000 ** (i / d)) if i % 2 == 0 else math.cos(p / 10000 ** ((i - 1) / d))
            for i in range(d)
        ]
        for p in range(len(PE_WORDS))
    ]
    total = [[a + b for a, b in zip(e, q)] for e, q in zip(emb, pe)]
    return [emb, pe, total]


def draw_pe_add() -> Svg:
    """Chapter 4: embedding x sqrt(d_model) + positional encoding = encoder input, d_model = 8."""
    s = Svg(840, 350, "Token embedding plus positional encoding", PE_DESC)
    titles = [
        ["token embedding", "\u00d7 \u221ad_model"],
        ["positional", "encoding"],
        ["encoder input"],
    ]
    for x0, title, data in zip(PE_STARTS, titles, _vectors()):
        s.lines(x0 + PE_GROUP_W / 2, 40, title, size=13, weight="bold")
        for p, col in enumerate(data):
            _column(s, x0 + p * (PE_CW + PE_GAP), p, col)
    for i in range(PE_D):
        s.text(100, PE_TOP + i * PE_CH + 14, f"{i}", size=10, anchor="end", fill=MUTED)
    s.text(100, PE_TOP - 8, "dim", size=10, anchor="end", fill=MUTED)
    for x, op in zip([PE_STARTS[0] + PE_GROUP_W + 35, PE_STARTS[1] + PE_GROUP_W + 35], "+="):
        s.text(x, PE_TOP + PE_D * PE_CH / 2 + 10, op, size=30, weight="bold")
    _colour_scale(s, 312)
    s.text(
        10,
        294,
        "PE(pos, 2i) = sin(pos / 10000^{2i/d_model}),  "
        "PE(pos, 2i+1) = cos(pos / 10000^{2i/d_model})",
        size=12,
        anchor="start",
    )
    return s


def _column(s: Svg, x: float, p: int, values: list[float]) -> None:
    """The vector of position `p`: its label above, its cells, its word below."""
    s.text(x + PE_CW / 2, PE_TOP - 8, f"pos {p}", size=10, fill=MUTED)
    for i, v in enumerate(values):
        s.rect(
            x, PE_TOP + i * PE_CH, PE_CW, PE_CH, fill=_diverging(v, 2.0), stroke=CELL, sw=0.6, rx=0
        )
    s.text(x + PE_CW / 2, PE_TOP + PE_D * PE_CH + 16, PE_WORDS[p], size=11, family=MONO)


def _colour_scale(s: Svg, y: float) -> None:
    """A legend from -2 (blue) through 0 (white) to +2 (orange)."""
    for k in range(21):
        v = -2 + 0.2 * k
        s.rect(300 + k * 12, y, 12, 12, fill=_diverging(v, 2.0), stroke="none", sw=0, rx=0)
    s.rect(300, y, 252, 12, fill="none", stroke=CELL, sw=0.6, rx=0)
    s.text(300, y + 28, "\u22122", size=11)
    s.text(426, y + 28, "0", size=11)
    s.text(552, y + 28, "+2", size=11)
    s.text(290, y + 10, "value", size=11, anchor="end")
