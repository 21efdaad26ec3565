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
QKV_TOP, QKV_STEP = 130, 44  # y of the first word's row, distance between rows
QKV_DESC = (
    "One query, from the word 'sat', is scored against the key of every word of 'the cat "
    "sat down': the score is the dot product q dot k_i divided by the square root of d_k. "
    "A softmax turns the four scores into weights that are positive and sum to 1. The "
    "output is the weighted sum of the four value vectors, so the word with the largest "
    "weight, 'cat', contributes most. The numbers are illustrative."
)


def _vector(s: Svg, x: float, y: float, values: list[float], color: str, alpha: float = 1.0):
    """A row of cells, each tinted by the size of its value."""
    c = QKV_CELL
    for j, v in enumerate(values):
        fill = tint(color, alpha * (0.25 + 0.6 * abs(v)))
        s.rect(x + j * c, y, c, c, fill=fill, stroke=tint(INK, 0.6), sw=0.8, rx=1)


def draw_attention_qkv() -> Svg:
    """Chapter 1: one query scored against four keys, softmax, weighted sum of the values."""
    z = [math.exp(v) for v in QKV_SCORES]
    weights = [v / sum(z) for v in z]  # the softmax of the scores shown, so the two agree
    s = Svg(860, 330, "Attention for one query", QKV_DESC)
    heads = [
        (48, "word"),
        (125, "key k_{i}"),
        (258, "score q\u00b7k_{i} / \u221ad_{k}"),
        (430, "softmax: weight a_{i}"),
        (617, "a_{i} \u00d7 value v_{i}"),
        (780, "output"),
    ]
    for x, h in heads:
        s.text(x, 110, h, size=12, weight="bold")
    # the query, above the score column
    s.text(170, 34, "query q (from \u201csat\u201d)", size=12, anchor="end", weight="bold")
    _vector(s, 180, 22, QKV_QUERY, ORANGE)
    s.path("M210,38 V60 H258 V92", stroke=ORANGE, sw=1.6)
    s.text(266, 80, "compared with every key", size=11, anchor="start", fill=INK)
    acc_y = QKV_TOP + 1.5 * QKV_STEP + 7  # where the weighted values meet
    for i in range(len(QKV_WORDS)):
        _qkv_row(s, i, weights, acc_y)
    out = [sum(a * v[j] for a, v in zip(weights, QKV_VALUES)) for j in range(4)]
    _vector(s, 750, acc_y - QKV_CELL / 2, out, GREEN)
    s.text(780, acc_y + 30, "\u03a3 a_{i} v_{i}", size=12)
    s.text(
        430,
        QKV_TOP + 4 * QKV_STEP - 4,
        "the weights are positive and add up to 1",
        size=11,
        italic=True,
    )
    s.text(
        10,
        322,
        "Numbers are illustrative; d_{k} is the length of q and k.",
        size=11,
        anchor="start",
        fill=FOOTNOTE,
    )
    return s


def _qkv_row(s: Svg, i: int, weights: list[float], acc_y: float) -> None:
    """Word i: its key, its score, its softmax weight as a bar, its weighted value."""
    y, a, top = QKV_TOP + i * QKV_STEP, weights[i], max(weights)
    s.text(48, y + 11, f"\u201c{QKV_WORDS[i]}\u201d", size=13, family=SANS)
    _vector(s, 95, y, QKV_VALUES[i], BLUE)
    s.arrow(160, y + 7, 220, y + 7, stroke=LINE)
    s.text(258, y + 12, f"{QKV_SCORES[i]:+.1f}", size=13, family=MONO)
    s.arrow(292, y + 7, 350, y + 7, stroke=LINE)
    s.rect(360, y, 120, QKV_CELL, fill="#ffffff", stroke=GREY_STROKE, sw=0.8, rx=1)
    s.rect(360, y, 120 * a, QKV_CELL, fill=BLUE, stroke="none", sw=0, rx=1)
    s.text(490, y + 12, f"{a:.2f}", size=13, family=MONO, anchor="start")
    s.arrow(528, y + 7, 584, y + 7, stroke=LINE)
    scaled = [v * a / top for v in QKV_VALUES[i]]
    _vector(s, 587, y, scaled, GREEN, alpha=0.35 + 0.65 * a / top)
    s.path(
        f"M650,{y + 7} C690,{y + 7} 700,{num(acc_y)} 738,{num(acc_y)}",
        stroke=tint(LINE, 0.6),
        sw=1.2,
        arrow=i == 1,
    )


# =========================================================================== masks.svg

MASKS_DESC = (
    "Three 5 by 5 grids, rows are query positions and columns key positions; a filled cell "
    "means the query may attend to that key, a crossed cell that it may not. Left, the "
    "padding mask for the source 'ein Hund läuft <pad> <pad>': the two padding columns are "
    "blocked for every row. Middle, the causal mask for the target '<s> a dog runs </s>': "
    "the lower triangle including the diagonal is allowed, so each position sees itself "
    "and earlier positions only. Right, the decoder's mask for a padded target '<s> a dog "
    "<pad> <pad>': the causal mask and the padding mask combined with a logical and."
)
MASK_CELL = 40  # side of one cell of a mask grid


def draw_masks() -> Svg:
    """Chapter 2: padding mask, causal mask and both combined, as 5 x 5 grids."""
    svg = Svg(880, 360, "Padding mask and causal mask", MASKS_DESC)
    src = ["ein", "Hund", "läuft", "<pad>", "<pad>"]
    tgt = ["<s>", "a", "dog", "runs", "</s>"]
    tgt_pad = ["<s>", "a", "dog", "<pad>", "<pad>"]
    _grid(svg, 60, 110, src, lambda i, j: j < 3, "Padding mask", "source: keys that are padding")
    _grid(svg, 360, 110, tgt, lambda i, j: j <= i, "Causal mask", "target: no later position")
    causal_and_pad = "causal AND padding"
    _grid(svg, 660, 110, tgt_pad, lambda i, j: j <= i and j < 3, "Both (decoder)", causal_and_pad)
    _masks_legend(svg, 340)
    return svg


def _grid(
    s: Svg,
    x: float,
    y: float,
    tokens: list[str],
    allowed: Callable[[int, int], bool],
    title: str,
    subtitle: str,
) -> None:
    """One mask: query rows against key columns, allowed cells filled, blocked ones crossed."""
    c, n = MASK_CELL, len(tokens)
    s.text(x + n * c / 2, y - 62, title, size=13, weight="bold")
    s.text(x + n * c / 2, y - 46, subtitle, size=11, fill=MUTED)
    for j, t in enumerate(tokens):  # keys across the top
        s.text(x + j * c + c / 2, y - 8, t, size=11, family=MONO)
    s.text(x + n * c / 2, y - 26, "key position \u2192", size=11, fill=MUTED)
    for i, t in enumerate(tokens):
        s.text(x - 6, y + i * c + c / 2 + 4, t, size=11, family=MONO, anchor="end")
        for j in range(n):
            _mask_cell(s, x + j * c, y + i * c, allowed(i, j))
    s.text(x - 22, y - 8, "query \u2193", size=11, fill=MUTED, anchor="middle")


def _mask_cell(s: Svg, cx: float, cy: float, ok: bool) -> None:
    c = MASK_CELL
    fill = tint(BLUE, 0.55) if ok else "#ffffff"
    s.rect(cx, cy, c, c, fill=fill, stroke=GRID, sw=0.8, rx=0)
    if not ok:  # blocked cells carry a mark, not only a colour
        s.path(
            f"M{cx + 11},{cy + 11} L{cx + c - 11},{cy + c - 11} M{cx + c - 11},{cy + 11} "
            f"L{cx + 11},{cy + c - 11}",
            stroke=VERMILLION,
            sw=1.6,
            arrow=False,
        )


def _masks_legend(svg: Svg, y: float) -> None:
    svg.rect(200, y - 11, 14, 14, fill=tint(BLUE, 0.55), stroke=GRID, sw=0.8, rx=0)
    svg.text(220, y, "may attend (True)", size=12, anchor="start")
    svg.rect(400, y - 11, 14, 14, fill="#ffffff", stroke=GRID, sw=0.8, rx=0)
    svg.path(
        f"M403,{y - 8} L411,{y}  M411,{y - 8} L403,{y}", stroke=VERMILLION, sw=1.4, arrow=False
    )
    blocked = "blocked (False): score set to \u2212\u221e before the softmax"
    svg.text(420, y, blocked, size=12, anchor="start")


# =========================================================================== multihead.svg

MULTIHEAD_DESC = (
    "Multi-head attention, left to right. The query, key and value inputs, each of shape "
    "(n, d_model), are projected by the learned matrices W^Q, W^K and W^V, and each result "
    "is split into h heads of width d_k = d_model / h, shape (h, n, d_k). Every head runs "
    "scaled dot-product attention on its own slice: its scores have shape (h, n, n) and its "
    "output (h, n, d_k). The heads are concatenated back to (n, d_model) and a last "
    "projection W^O gives the output, of shape (n, d_model)."
)


def draw_multihead() -> Svg:
    """Chapter 3: project, split into heads, attend per head, concatenate, W^O; shapes on
    the arrows."""
    s = Svg(900, 360, "Multi-head attention", MULTIHEAD_DESC)
    for sym, name, cy in [("Q", "query", 90), ("K", "key", 180), ("V", "value", 270)]:
        _projection(s, sym, name, cy)
    s.text(284, 30, "split into h heads", size=12, weight="bold")
    s.text(284, 45, "of width d_{k} = d_model / h", size=11)
    # one attention per head
    rows = ["scaled dot-product", "attention,", "one per head", "", "softmax(QK^{T}/\u221ad_{k})V"]
    _stack(s, 400, 120, 150, 120, BLUE, rows, size=12)
    s.text(475, 272, "scores: (h, n, n)", size=11, family=MONO)
    s.text(475, 288, "each head has its own n \u00d7 n weights", size=11, italic=True)
    s.arrow(562, 180, 641, 180, stroke=LINE)
    s.text(602, 172, "(h, n, d_k)", size=11, family=MONO)
    s.box(642, 140, 66, 80, ["concat", "heads"], fill=tint(GREEN, 0.22), stroke=GREEN)
    s.arrow(708, 180, 767, 180, stroke=LINE)
    s.text(738, 130, "(n, d_model)", size=11, family=MONO)
    s.path("M738,134 V176", stroke=tint(LINE, 0.5), sw=0.8, arrow=False)
    s.box(768, 160, 52, 40, ["W^{O}"], fill=tint(BLUE, 0.25), stroke=BLUE, size=14)
    s.arrow(820, 180, 888, 180, stroke=LINE)
    s.text(854, 204, "output", size=12, weight="bold")
    s.text(854, 220, "(n, d_model)", size=11, family=MONO)
    base = "Base model: d_model = 512, h = 8 heads, d_k = 64.  n = number of tokens."
    s.text(10, 345, base, size=12, anchor="start", fill=MUTED)
    return s


def _projection(s: Svg, sym: str, name: str, cy: float) -> None:
    """One input (Q, K or V): its W, its split into heads, its arrow to the attention."""
    s.text(10, cy - 6, f"{name} {sym}", size=13, anchor="start", weight="bold")
    s.text(10, cy + 12, "(n, d_model)", size=11, anchor="start", family=MONO)
    s.arrow(96, cy, 111, cy, stroke=LINE)
    s.box(112, cy - 20, 46, 40, [f"W^{{{sym}}}"], fill=tint(BLUE, 0.25), stroke=BLUE, size=14)
    s.arrow(158, cy, 253, cy, stroke=LINE)
    s.text(206, cy - 7, "(n, d_model)", size=11, family=MONO)
    _stack(s, 254, cy - 20, 60, 40, SKY, [f"{sym} heads"], size=12)
    s.text(284, cy + 35, "(h, n, d_k)", size=11, family=MONO)
    s.path(f"M328,{cy - 8} L{400 - 1},{num(180 + (cy - 180) * 0.45)}", stroke=LINE)


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
