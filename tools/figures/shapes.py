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
# What turns stage k into stage k + 1, written beside the arrow between them.
OPS = [
    "embed, \u00d7\u221ad_model, + PE",
    "W^{Q}, W^{K}, W^{V}; split into h heads",
    "Q K^{T} / \u221ad_{k}",
    "softmax, \u00d7 V per head; concatenate the h heads",
    "W_{1}, ReLU",
    "W_{2}, add & norm",
    "\u00d7 N layers, then Linear",
]
W, BOX_X, BW, BH, STEP, TOP = 640, 20, 600, 34, 64, 58  # one box per stage, top to bottom
NAME_X, SYM_X, BASE_X, ARROW_X = 32, 380, 530, 110  # columns inside a box; the arrows' x
SHAPES_DESC = (
    "The shapes of one sentence of n tokens through the Transformer, top to bottom, each "
    "stage with its shape in symbols and in the base model's numbers. Tokens (n) are embedded "
    "to X, (n, d_model); projected and split into Q, K and V per head, each (n, d_k); the "
    "scores of one head are (n, n); the heads' outputs concatenated are (n, d_model); the "
    "feed-forward hidden layer is (n, d_ff); the layer's output is (n, d_model) again; the "
    "final linear layer gives logits (n, V), one score per vocabulary word. With the base "
    "model's numbers: (n, 512), (n, 64) per head for 8 heads, (n, n), (n, 512), (n, 2048), "
    "(n, 512), (n, V)."
)


def draw_shapes() -> Svg:
    """Chapter 5: one row per stage, its shape in symbols and in the base model's numbers."""
    s = Svg(W, 600, "Every shape from tokens to logits", SHAPES_DESC)
    s.text(
        10,
        22,
        "One sentence of n tokens (a batch adds a leading dimension B).",
        size=14,
        anchor="start",
        weight="bold",
    )
    for x, head, anchor in ((NAME_X, "stage", "start"), (SYM_X, "shape", "middle")):
        s.text(x, TOP - 10, head, size=14, anchor=anchor, weight="bold", fill=MUTED)
    s.text(BASE_X, TOP - 10, "base model", size=14, weight="bold", fill=MUTED)
    for k, (name, sym, base, color) in enumerate(STAGES):
        _stage(s, TOP + k * STEP, name, sym, base, color)
        if k < len(OPS):
            _operation(s, TOP + k * STEP + BH, OPS[k])
    s.text(
        10,
        570,
        "Base model: d_model = 512, h = 8, d_k = d_model / h = 64, d_ff = 2048;",
        size=14,
        anchor="start",
        fill=MUTED,
    )
    s.text(10, 590, "V = vocabulary size.", size=14, anchor="start", fill=MUTED)
    return s


def _stage(s: Svg, y: float, name: str, sym: str, base: str, color: str) -> None:
    """One box: the stage's name, its shape in symbols, its shape in the base model."""
    s.rect(BOX_X, y, BW, BH, fill=tint(color, 0.2), stroke=color, sw=1.4)
    require_fit(name, 15, SYM_X - 60 - NAME_X, "the name column", SANS)
    require_fit(sym, 15, 2 * (BASE_X - SYM_X) - 150, "the shape column", MONO)
    require_fit(base, 14, 2 * (BOX_X + BW - BASE_X) - 8, "the base-model column", MONO)
    s.text(NAME_X, y + 22, name, size=15, anchor="start", weight="bold")
    s.text(SYM_X, y + 22, sym, size=15, family=MONO)
    s.text(BASE_X, y + 22, base, size=14, family=MONO, fill=FOOTNOTE)


def _operation(s: Svg, y: float, op: str) -> None:
    """The arrow from one box down to the next, the operation written beside it."""
    s.arrow(ARROW_X, y, ARROW_X, y + STEP - BH - 1, stroke=LINE)
    require_fit(op, 14, BOX_X + BW - ARROW_X - 12, "the space beside the arrow")
    s.text(ARROW_X + 12, y + (STEP - BH) / 2 + 5, op, size=14, anchor="start", fill=ANNOTATION)
