"""Drawings of chapters 1-3: attention for one query, the masks, multi-head attention
(hand-written)."""

from __future__ import annotations

import math
from collections.abc import Callable

from .svg import (
    BLUE,
    FOOTNOTE,
    GREEN,
    GREY_STROKE,
    GRID,
    INK,
    LINE,
    MONO,
    MUTED,
    ORANGE,
    SANS,
    SKY,
    VERMILLION,
    Svg,
    num,
    tint,
    vector_cells,
)

# =========================================================================== attention_qkv.svg

QKV_WORDS = ["the", "cat", "sat", "down"]
QKV_QUERY = [0.7, 0.5, -0.6, 0.4]  # the query of "sat"
QKV_SCORES = [0.4, 2.2, 1.2, -0.3]  # illustrative q.k/sqrt(d_k) for the query of "sat"
QKV_VALUES = [  # one value vector per word (the key column shows the same cells)
    [0.6, -0.4, 0.2, 0.9],
    [0.9, 0.5, -0.7, 0.3],
    [-0.2, 0.8, 0.4, -0.6],
    [0.3, -0.8, -0.3, 0.5],
]
QKV_CELL = 15  # side of one vector cell
QKV_TOP, QKV_STEP = 136, 44  # y of the first word's row, distance between rows
QKV_DESC = (
    "One query, from the word 'sat', is scored against the key of every word of 'the cat "
    "sat down': the score is the dot product q dot k_i divided by the square root of d_k. "
    "A softmax turns the four scores into weights that are positive and sum to 1. The "
    "output is the weighted sum of the four value vectors, so the word with the largest "
    "weight, 'cat', contributes most. The numbers are illustrative."
)


def _vector(s: Svg, x: float, y: float, values: list[float], color: str, alpha: float = 1.0):
    vector_cells(s, x, y, values, color, alpha, cell=QKV_CELL)


def draw_attention_qkv() -> Svg:
    """Chapter 1: one query scored against four keys, softmax, weighted sum of the values."""
    z = [math.exp(v) for v in QKV_SCORES]
    weights = [v / sum(z) for v in z]  # the softmax of the scores shown, so the two agree
    s = Svg(680, 350, "Attention for one query", QKV_DESC)
    heads = [
        (40, ["word"]),
        (110, ["key k_{i}"]),
        (212, ["score", "q\u00b7k_{i} / \u221ad_{k}"]),
        (330, ["softmax", "weight a_{i}"]),
        (476, ["a_{i} \u00d7 v_{i}"]),
        (626, ["output"]),
    ]
    for x, rows in heads:
        for k, row in enumerate(reversed(rows)):
            s.text(x, QKV_TOP - 16 - 19 * k, row, size=14, weight="bold")
    # the query, above the score column
    s.text(172, 24, "query q", size=14, anchor="end", weight="bold")
    s.text(172, 42, "(from \u201csat\u201d)", size=14, anchor="end", weight="bold")
    _vector(s, 182, 18, QKV_QUERY, ORANGE)
    s.arrow(212, 34, 212, 76, stroke=ORANGE, sw=1.6)
    s.text(222, 62, "compared with every key", size=14, anchor="start", fill=INK)
    acc_y = QKV_TOP + 1.5 * QKV_STEP + 7  # where the weighted values meet
    for i in range(len(QKV_WORDS)):
        _qkv_row(s, i, weights, acc_y)
    out = [sum(a * v[j] for a, v in zip(weights, QKV_VALUES)) for j in range(4)]
    _vector(s, 596, acc_y - QKV_CELL / 2, out, GREEN)
    s.text(626, acc_y + 32, "\u03a3 a_{i} v_{i}", size=14)
    s.text(
        330,
        QKV_TOP + 4 * QKV_STEP - 2,
        "the weights are positive and add up to 1",
        size=14,
        italic=True,
    )
    s.text(
        10,
        340,
        "Numbers are illustrative; d_{k} is the length of q and k.",
        size=14,
        anchor="start",
        fill=FOOTNOTE,
    )
    return s


def _qkv_row(s: Svg, i: int, weights: list[float], acc_y: float) -> None:
    """Word i: its key, its score, its softmax weight as a bar, its weighted value."""
    y, a, top = QKV_TOP + i * QKV_STEP, weights[i], max(weights)
    s.text(40, y + 12, f"\u201c{QKV_WORDS[i]}\u201d", size=15, family=SANS)
    _vector(s, 80, y, QKV_VALUES[i], BLUE)
    s.arrow(146, y + 7, 180, y + 7, stroke=LINE)
    s.text(212, y + 12, f"{QKV_SCORES[i]:+.1f}", size=15, family=MONO)
    s.arrow(244, y + 7, 270, y + 7, stroke=LINE)
    s.rect(276, y, 100, QKV_CELL, fill="#ffffff", stroke=GREY_STROKE, sw=0.8, rx=1)
    s.rect(276, y, 100 * a, QKV_CELL, fill=BLUE, stroke="none", sw=0, rx=1)
    s.text(382, y + 12, f"{a:.2f}", size=15, family=MONO, anchor="start")
    s.arrow(422, y + 7, 440, y + 7, stroke=LINE)
    scaled = [v * a / top for v in QKV_VALUES[i]]
    _vector(s, 446, y, scaled, GREEN, alpha=0.35 + 0.65 * a / top)
    s.path(
        f"M510,{y + 7} C546,{y + 7} 550,{num(acc_y)} 584,{num(acc_y)}",
        stroke=tint(LINE, 0.6),
        sw=1.2,
        arrow=i == 1,
    )


# =========================================================================== masks.svg

MASKS_DESC = (
    "Three 5 by 5 grids, rows are query positions and columns key positions; a filled cell "
    "means the query may attend to that key, a crossed cell that it may not. Left, the "
    "padding mask for the source 'ein Hund läuft <pad> <pad>': the two padding columns are "
    "blocked for every row. Middle, the causal mask for the decoder input '<s> a dog runs "
    "fast' (the target 'a dog runs fast' behind the start symbol): the lower triangle "
    "including the diagonal is allowed, so each position sees itself and earlier positions "
    "only. Right, the decoder's mask for a padded decoder input '<s> a dog <pad> <pad>': the "
    "causal mask and the padding mask combined with a logical and."
)
MASK_CELL = 36  # side of one cell of a mask grid
MASK_TOP = 120  # y of the grids' top edge


def draw_masks() -> Svg:
    """Chapter 2: padding mask, causal mask and both combined, as 5 x 5 grids."""
    svg = Svg(760, 356, "Padding mask and causal mask", MASKS_DESC)
    src = ["ein", "Hund", "läuft", "<pad>", "<pad>"]
    # decoder inputs: <s> + the target (chapter 2), never </s>
    tgt = ["<s>", "a", "dog", "runs", "fast"]
    tgt_pad = ["<s>", "a", "dog", "<pad>", "<pad>"]
    _grid(svg, 66, src, lambda i, j: j < 3, "Padding mask", "keys that are padding")
    _grid(svg, 318, tgt, lambda i, j: j <= i, "Causal mask", "no later position")
    _grid(svg, 570, tgt_pad, lambda i, j: j <= i and j < 3, "Both (decoder)", "causal AND padding")
    _masks_legend(svg, 338)
    return svg


def _grid(
    s: Svg,
    x: float,
    tokens: list[str],
    allowed: Callable[[int, int], bool],
    title: str,
    subtitle: str,
) -> None:
    """One mask: query rows against key columns, allowed cells filled, blocked ones crossed."""
    c, n, y = MASK_CELL, len(tokens), MASK_TOP
    s.text(x + n * c / 2, 26, title, size=16, weight="bold")
    s.text(x + n * c / 2, 47, subtitle, size=15, fill=MUTED)
    s.text(x + n * c / 2, 70, "key position \u2192", size=15, fill=MUTED)
    for j, t in enumerate(tokens):  # keys across the top, on two staggered lines
        s.text(x + j * c + c / 2, y - (26 if j % 2 == 0 else 8), t, size=15, family=MONO)
    for i, t in enumerate(tokens):
        s.text(x - 6, y + i * c + c / 2 + 5, t, size=15, family=MONO, anchor="end")
        for j in range(n):
            _mask_cell(s, x + j * c, y + i * c, allowed(i, j))
    s.text(x - 30, y - 8, "query \u2193", size=15, fill=MUTED, anchor="middle")


def _mask_cell(s: Svg, cx: float, cy: float, ok: bool) -> None:
    c = MASK_CELL
    fill = tint(BLUE, 0.55) if ok else "#ffffff"
    s.rect(cx, cy, c, c, fill=fill, stroke=GRID, sw=0.8, rx=0)
    if not ok:  # blocked cells carry a mark, not only a colour
        s.path(
            f"M{cx + 10},{cy + 10} L{cx + c - 10},{cy + c - 10} M{cx + c - 10},{cy + 10} "
            f"L{cx + 10},{cy + c - 10}",
            stroke=VERMILLION,
            sw=1.6,
            arrow=False,
        )


def _masks_legend(svg: Svg, y: float) -> None:
    svg.rect(20, y - 12, 15, 15, fill=tint(BLUE, 0.55), stroke=GRID, sw=0.8, rx=0)
    svg.text(42, y, "may attend (True)", size=15, anchor="start")
    svg.rect(226, y - 12, 15, 15, fill="#ffffff", stroke=GRID, sw=0.8, rx=0)
    svg.path(
        f"M229,{y - 9} L238,{y}  M238,{y - 9} L229,{y}", stroke=VERMILLION, sw=1.4, arrow=False
    )
    blocked = "blocked (False): zero weight after the softmax"
    svg.text(248, y, blocked, size=15, anchor="start")


# =========================================================================== multihead.svg

MULTIHEAD_DESC = (
    "Multi-head attention, top to bottom. The query, key and value inputs, each of shape "
    "(n, d_model), are projected by the learned matrices W^Q, W^K and W^V, and each result "
    "is split into h heads of width d_k = d_model / h, shape (h, n, d_k). Every head runs "
    "scaled dot-product attention on its own slice: its scores have shape (h, n, n) and its "
    "output (h, n, d_k). The heads are concatenated back to (n, d_model) and a last "
    "projection W^O gives the output, of shape (n, d_model)."
)


MH_COLS = [100, 310, 520]  # x of the query, key and value columns
MH_ATTN = (170, 250, 360, 110)  # the attention pile: x, y, width, height


def draw_multihead() -> Svg:
    """Chapter 3: project, split into heads, attend per head, concatenate, W^O; drawn top to
    bottom with the shapes beside the arrows."""
    s = Svg(700, 590, "Multi-head attention", MULTIHEAD_DESC)
    for sym, name, cx in zip("QKV", ["query", "key", "value"], MH_COLS):
        _projection(s, sym, name, cx)
    s.lines(600, 150, ["split into", "h heads of", "width d_{k}"], size=14, anchor="start")
    s.text(600, 200, "(h, n, d_k)", size=14, family=MONO, anchor="start")
    # one attention per head
    x, y, w, h = MH_ATTN
    rows = ["scaled dot-product attention,", "one per head", "softmax(QK^{T}/\u221ad_{k})V"]
    _stack(s, x, y, w, h, BLUE, rows, size=15)
    s.text(10, y + 42, "scores", size=14, anchor="start", weight="bold")
    s.text(10, y + 60, "(h, n, n)", size=14, anchor="start", family=MONO)
    s.lines(10, y + 96, ["one n \u00d7 n", "per head"], size=14, anchor="start", italic=True)
    mid = x + w / 2
    s.arrow(mid, y + h, mid, 409, stroke=LINE)
    s.text(mid + 10, 392, "(h, n, d_k)", size=14, family=MONO, anchor="start")
    s.box(mid - 80, 410, 160, 40, ["concat heads"], fill=tint(GREEN, 0.22), stroke=GREEN, size=15)
    s.arrow(mid, 450, mid, 489, stroke=LINE)
    s.text(mid + 10, 474, "(n, d_model)", size=14, family=MONO, anchor="start")
    s.box(mid - 28, 490, 56, 40, ["W^{O}"], fill=tint(BLUE, 0.25), stroke=BLUE, size=16)
    s.arrow(mid + 28, 510, mid + 70, 510, stroke=LINE)
    s.text(mid + 78, 506, "output", size=15, anchor="start", weight="bold")
    s.text(mid + 78, 524, "(n, d_model)", size=14, family=MONO, anchor="start")
    base = "Base model: d_model = 512, h = 8 heads, d_k = 64; n = number of tokens."
    s.text(10, 578, base, size=14, anchor="start", fill=MUTED)
    return s


def _projection(s: Svg, sym: str, name: str, cx: float) -> None:
    """One input (Q, K or V): its W, its split into heads, its arrow to the attention."""
    s.text(cx, 24, f"{name} {sym}", size=15, weight="bold")
    s.text(cx, 44, "(n, d_model)", size=14, family=MONO)
    s.arrow(cx, 52, cx, 71, stroke=LINE)
    s.box(cx - 28, 72, 56, 40, [f"W^{{{sym}}}"], fill=tint(BLUE, 0.25), stroke=BLUE, size=16)
    s.arrow(cx, 112, cx, 147, stroke=LINE)  # to the top card of the pile
    _stack(s, cx - 55, 160, 110, 40, SKY, [f"{sym} heads"], size=15)
    x, y, w, _ = MH_ATTN
    end = x + w / 2 + (cx - MH_COLS[1]) * 0.6
    s.arrow(cx, 200, end, y - 13, stroke=LINE)


def _stack(
    s: Svg,
    x: float,
    y: float,
    w: float,
    h: float,
    color: str,
    rows: list[str],
    size: float = 12,
    cards: int = 3,
) -> None:
    """A pile of `cards` boxes, offset up-right; the label goes on the front one."""
    for k in range(cards - 1, 0, -1):
        s.rect(x + 6 * k, y - 6 * k, w, h, fill=tint(color, 0.18), stroke=color, sw=1)
    s.box(x, y, w, h, rows, fill=tint(color, 0.25), stroke=color, size=size)
