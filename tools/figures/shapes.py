"""The drawing of chapter 5: every shape from tokens to logits (hand-written)."""

from __future__ import annotations

from .svg import (
    ANNOTATION,
    BLUE,
    FOOTNOTE,
    GREEN,
    LINE,
    MONO,
    MUTED,
    PURPLE,
    SANS,
    VERMILLION,
    Svg,
    require_fit,
    tint,
)

# (name, shape in symbols, shape in the base model's numbers) of each stage, and its colour.
STAGES = [
    ("tokens", "(n)", "n word ids", PURPLE),
    ("embeddings X", "(n, d_model)", "(n, 512)", PURPLE),
    ("Q, K, V per head", "(n, d_k)", "(n, 64), 8 heads", BLUE),
    ("scores per head", "(n, n)", "(n, n), 8 heads", BLUE),
    ("heads concatenated", "(n, d_model)", "(n, 512)", BLUE),
    ("feed-forward hidden", "(n, d_ff)", "(n, 2048)", GREEN),
    ("layer output", "(n, d_model)", "(n, 512)", GREEN),
    ("logits", "(n, V)", "(n, V)", VERMILLION),
]
# What turns stage k into stage k + 1, written on the arrow between them.
OPS = [
    ["embed,", "\u00d7\u221ad_model,", "+ PE"],
    ["W^{Q}, W^{K}, W^{V}", "split in h"],
    ["Q K^{T} / \u221ad_{k}"],
    None,  # drawn on the link between the rows
    ["W_{1}, ReLU"],
    ["W_{2}, add", "& norm"],
    ["\u00d7N layers,", "Linear"],
]
BW, BH, GAP = 158, 74, 72  # box width and height, gap between boxes
X0, ROWS_Y = 13, [60, 200]  # left edge of the first box, top of each row of four
SHAPES_DESC = (
    "The shapes of one sentence of n tokens through the Transformer, in two rows. Tokens "
    "(n) are embedded to X, (n, d_model); projected and split into Q, K and V per head, "
    "each (n, d_k); the scores of one head are (n, n); the heads' outputs concatenated are "
    "(n, d_model); the feed-forward hidden layer is (n, d_ff); the layer's output is "
    "(n, d_model) again; the final linear layer gives logits (n, V), one score per "
    "vocabulary word. With the base model's numbers: (n, 512), (n, 64) per head for 8 "
    "heads, (n, n), (n, 512), (n, 2048), (n, 512), (n, V)."
)


def draw_shapes() -> Svg:
    """Chapter 5: the symbols on the first line of each box, the base model's numbers below."""
    s = Svg(900, 320, "Every shape from tokens to logits", SHAPES_DESC)
    boxes = []
    for k, (name, sym, base, color) in enumerate(STAGES):
        r, c = divmod(k, 4)
        boxes.append((X0 + c * (BW + GAP), ROWS_Y[r]))
        _stage(s, *boxes[-1], name, sym, base, color)
    for k, op in enumerate(OPS):
        if op is not None:
            _operation(s, boxes[k], boxes[k + 1], op)
    _row_link(s, boxes[3], boxes[4])
    s.text(
        10,
        22,
        "One sentence of n tokens (a batch adds a leading dimension B).",
        size=12,
        anchor="start",
        weight="bold",
    )
    s.text(
        10,
        304,
        "Base model: d_model = 512, h = 8, d_k = d_model / h = 64, d_ff = 2048; "
        "V = vocabulary size.",
        size=12,
        anchor="start",
        fill=MUTED,
    )
    return s


def _stage(s: Svg, x: float, y: float, name: str, sym: str, base: str, color: str) -> None:
    """One box: the stage's name, its shape in symbols, its shape in the base model."""
    s.rect(x, y, BW, BH, fill=tint(color, 0.2), stroke=color, sw=1.4)
    for row, size, family in ((name, 12, SANS), (sym, 13, MONO), (base, 11, MONO)):
        require_fit(row, size, BW - 8, "its box", family)
    s.text(x + BW / 2, y + 22, name, size=12, weight="bold")
    s.text(x + BW / 2, y + 44, sym, size=13, family=MONO)
    s.text(x + BW / 2, y + 63, base, size=11, family=MONO, fill=FOOTNOTE)


def _operation(s: Svg, a: tuple[float, float], b: tuple[float, float], op: list[str]) -> None:
    """The arrow from box `a` to box `b` in the same row, the operation written above it."""
    (xa, ya), (xb, _) = a, b
    cy = ya + BH / 2
    s.arrow(xa + BW, cy, xb - 1, cy, stroke=LINE)
    for row in op:
        require_fit(row, 11, GAP + 2, "the gap")
    s.lines((xa + BW + xb) / 2, cy - 10 - 7 * (len(op) - 1), op, size=11, fill=ANNOTATION)


def _row_link(s: Svg, a: tuple[float, float], b: tuple[float, float]) -> None:
    """From the scores (end of row 1) down to the concatenation (start of row 2)."""
    (xa, ya), (xb, yb) = a, b
    mid = (ya + BH + yb) / 2
    s.path(f"M{xa + BW / 2},{ya + BH} V{mid} H{xb + BW / 2} V{yb - 1}", stroke=LINE)
    s.text(
        (xa + xb + BW) / 2,
        mid - 6,
        "softmax, weights \u00d7 V: (n, d_k) per head; concatenate the h heads",
        size=11,
        fill=ANNOTATION,
    )
