"""The drawing of chapter 5's section on residual blocks: post-norm (the paper) beside pre-norm
(`norm_first=True`), drawn bottom to top like the paper's Figure 1 (hand-written).

The names are transformer_lib.layers': `SublayerConnection`, `LayerNorm`, `Dropout`, and the
final `LayerNorm` that `Encoder`/`Decoder` add only to a pre-norm stack. The residual path is
the thick green line: in post-norm it runs through every LayerNorm, in pre-norm it is a chain
of additions only. 640 units wide, labels of 13 units or more (12 px or more in a 90% figure).
"""

from __future__ import annotations

from .svg import GREEN, GREY_STROKE, INK, LINE, MONO, MUTED, SKY, YELLOW, Svg, tint

NORM_DESC = (
    "Two residual blocks side by side, read from bottom to top; a thick green line is the "
    "residual path. Left, post-norm, the paper's arrangement and our default: the input x "
    "goes through the sublayer (attention or feed-forward) and dropout, the result is added "
    "to x, and the sum goes through LayerNorm; the green residual path runs through that "
    "LayerNorm in every one of the N layers, and the stack needs no final norm. Right, "
    "pre-norm, norm_first=True: the branch first normalizes x with LayerNorm, then applies "
    "the sublayer and dropout, and the result is added to x; the green residual path from the "
    "bottom to the top is only additions, untouched by any norm, and one final LayerNorm "
    "after the N-th layer normalizes the stack's output."
)
BOX_W = 148
TRUNK_DX, BRANCH_DX = -70, 64  # the residual path and the branch, relative to a panel's centre
Y_X, Y_SPLIT, Y_ADD, Y_TOP = 452, 420, 222, 88  # input label, branch start, addition, output
BLOCK_TOP, BLOCK_BOTTOM = 150, 434  # the dashed "x N" frame around one layer's block


def draw_norm_placement() -> Svg:
    """Chapter 5: post-norm beside pre-norm, where LayerNorm sits relative to the residual."""
    s = Svg(640, 478, "Post-norm and pre-norm residual blocks", NORM_DESC)
    s.path("M320,14 V466", stroke="#cccccc", sw=1, arrow=False)
    _panel(s, 160, pre=False)
    _panel(s, 480, pre=True)
    return s


def _box(s: Svg, cx: float, y: float, h: float, rows: list[str], color: str) -> None:
    s.box(cx - BOX_W / 2, y, BOX_W, h, rows, fill=tint(color, 0.3), stroke=color, size=14)


def _note(s: Svg, x: float, cy: float, rows: list[str], color: str) -> None:
    """Two or so lines of a remark, left-aligned at x and centred on cy."""
    s.lines(x, cy, rows, size=13, anchor="start", fill=color, gap=1.2)


def _panel(s: Svg, cx: float, pre: bool) -> None:
    """One arrangement: heading, the dashed N-layer frame, trunk, branch, norm(s)."""
    trunk, branch = cx + TRUNK_DX, cx + BRANCH_DX
    heading = "pre-norm" if pre else "post-norm (the paper)"
    s.text(cx, 28, heading, size=15, weight="bold")
    s.text(cx, 48, "norm_first=True" if pre else "default", size=14, family=MONO, fill=MUTED)
    s.rect(cx - 150, BLOCK_TOP, 300, BLOCK_BOTTOM - BLOCK_TOP, stroke=GREY_STROKE, dash="6 4")
    s.text(cx + 146, BLOCK_BOTTOM - 8, "\u00d7 N", size=15, anchor="end", weight="bold", fill=MUTED)
    s.text(trunk, Y_X + 14, "x", size=15, family=MONO)
    # the branch: split off the residual path, through its boxes, back to the addition
    s.path(f"M{trunk},{Y_SPLIT} H{branch} V398", stroke=LINE, sw=1.4)
    if pre:
        _box(s, branch, 364, 32, ["LayerNorm"], YELLOW)
        s.arrow(branch, 364, branch, 348, stroke=LINE)
        top = 296
    else:
        top = 348
    _box(s, branch, top, 48, ["Sublayer", "attention or FFN"], SKY)
    s.arrow(branch, top, branch, top - 14, stroke=LINE)
    _box(s, branch, top - 46, 32, ["Dropout"], GREY_STROKE)
    s.path(f"M{branch},{top - 46} V{Y_ADD} H{trunk + 13}", stroke=LINE, sw=1.4)
    # the residual path, thick green; the addition where the branch comes back
    s.arrow(trunk, Y_X - 4, trunk, Y_ADD + 14, stroke=GREEN, sw=3.2)
    s.circle(trunk, Y_ADD, 12, "#ffffff", stroke=INK, sw=1.4)
    s.text(trunk, Y_ADD + 6, "+", size=17, weight="bold")
    if pre:
        s.arrow(trunk, Y_ADD - 12, trunk, 138, stroke=GREEN, sw=3.2)
        _box(s, trunk, 106, 32, ["LayerNorm"], YELLOW)
        _note(s, cx + 16, 122, ["final norm,", "once per stack"], MUTED)
        s.arrow(trunk, 106, trunk, Y_TOP, stroke=LINE)
        _note(s, cx + 8, 180, ["residual path:", "additions only"], GREEN)
    else:
        s.arrow(trunk, Y_ADD - 12, trunk, 196, stroke=GREEN, sw=3.2)
        _box(s, trunk, 164, 32, ["LayerNorm"], YELLOW)
        s.arrow(trunk, 164, trunk, Y_TOP, stroke=GREEN, sw=3.2)
        _note(s, cx - 42, 122, ["no final norm:", "each layer ends in one"], MUTED)
        _note(s, cx + 8, 180, ["residual path", "through the norm"], GREEN)
    s.text(trunk, Y_TOP - 6, "output", size=14, fill=MUTED)
