"""The drawing of chapter 4: token embedding plus positional encoding (hand-written)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from .svg import BLUE, CELL, MONO, MUTED, ORANGE, Svg, tint

PE_D = 8  # d_model of the drawing: 8 cells per vector
PE_WORDS = ["ein", "Hund", "läuft", "schnell"]
PE_CW, PE_CH, PE_GAP = 26, 20, 32  # cell width and height, gap between a group's columns
PE_GROUP_W = 4 * PE_CW + 3 * PE_GAP  # width of one group of four columns
PE_STARTS = [52, 52 + PE_GROUP_W + 46, 52 + 2 * (PE_GROUP_W + 46)]  # left edge of each group
PE_TOP = 84  # top of the vectors
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
    s = Svg(768, 372, "Token embedding plus positional encoding", PE_DESC)
    titles = [
        ["token embedding", "\u00d7 \u221ad_model"],
        ["positional", "encoding"],
        ["encoder input"],
    ]
    for x0, title, data in zip(PE_STARTS, titles, _vectors()):
        s.lines(x0 + PE_GROUP_W / 2, 34, title, size=15, weight="bold")
        for p, col in enumerate(data):
            _column(s, x0 + p * (PE_CW + PE_GAP), p, col)
    for i in range(PE_D):
        s.text(36, PE_TOP + i * PE_CH + 15, f"{i}", size=15, anchor="end", fill=MUTED)
    s.text(36, PE_TOP - 8, "dim", size=15, anchor="end", fill=MUTED)
    for x, op in zip([PE_STARTS[0] + PE_GROUP_W + 23, PE_STARTS[1] + PE_GROUP_W + 23], "+="):
        s.text(x, PE_TOP + PE_D * PE_CH / 2 + 10, op, size=30, weight="bold")
    s.text(10, 314, "PE(pos, 2i) = sin(pos / 10000^{2i/d_model})", size=15, anchor="start")
    s.text(10, 338, "PE(pos, 2i+1) = cos(pos / 10000^{2i/d_model})", size=15, anchor="start")
    _colour_scale(s, 326)
    return s


def _column(s: Svg, x: float, p: int, values: list[float]) -> None:
    """The vector of position `p`: its label above, its cells, its word below."""
    s.text(x + PE_CW / 2, PE_TOP - 8, f"pos {p}", size=15, fill=MUTED)
    for i, v in enumerate(values):
        s.rect(
            x, PE_TOP + i * PE_CH, PE_CW, PE_CH, fill=_diverging(v, 2.0), stroke=CELL, sw=0.6, rx=0
        )
    below = PE_TOP + PE_D * PE_CH + (20 if p % 2 == 0 else 40)  # staggered: words are wide
    s.text(x + PE_CW / 2, below, PE_WORDS[p], size=15, family=MONO)


def _colour_scale(s: Svg, y: float) -> None:
    """A legend from -2 (blue) through 0 (white) to +2 (orange)."""
    x0 = 470
    for k in range(21):
        v = -2 + 0.2 * k
        s.rect(x0 + k * 12, y, 12, 12, fill=_diverging(v, 2.0), stroke="none", sw=0, rx=0)
    s.rect(x0, y, 252, 12, fill="none", stroke=CELL, sw=0.6, rx=0)
    s.text(x0, y + 32, "\u22122", size=15)
    s.text(x0 + 126, y + 32, "0", size=15)
    s.text(x0 + 252, y + 32, "+2", size=15)
    s.text(x0 - 10, y + 12, "value", size=15, anchor="end")
