"""Drawings of chapter 1's history: the RNN encoder-decoder and its one summary vector, and
Bahdanau's attention decoder, which builds a new context vector at every step (hand-written).

The symbols are the chapter's: source x_j, encoder states h_j, decoder states s_i, outputs y_i,
scores e_ij, weights alpha_ij, context c_i. Both drawings are 640 units wide with labels of 13
units or more, so that they show at 12 px or more in a 90% figure of the book's column.
"""

from __future__ import annotations

import math

from .svg import (
    BLUE,
    FOOTNOTE,
    GREEN,
    GREY_STROKE,
    INK,
    LINE,
    MONO,
    MUTED,
    ORANGE,
    PURPLE,
    VERMILLION,
    Svg,
    num,
    tint,
    vector_cells,
)

R = 19  # radius of a state circle
CELL = 15  # side of one cell of a small vector

# ================================================================================ seq2seq.svg

SEQ2SEQ_DESC = (
    "The recurrent encoder-decoder. Left, the encoder reads the source tokens x1 to x4 one at "
    "a time; each state h_j is computed from the previous state and the next token, so the "
    "states form a chain from h1 to h4. Its last state h4 is the summary: one vector of a "
    "fixed size, drawn as a short column of cells between the two networks. Right, the decoder "
    "starts from that summary and writes y1, y2, y3 one at a time; each decoder state s_i reads "
    "the previous state, the previous output token and the summary again. Everything the "
    "decoder knows about the source passes through that one vector, whatever the sentence's "
    "length: the bottleneck."
)
ENC_X = [48, 116, 184, 252]  # encoder positions, j = 1..4
DEC_X = [420, 500, 580]  # decoder positions, i = 1..3
SUMMARY_X = 326  # centre of the summary vector
Y_OUT, Y_STATE, Y_IN = 36, 118, 200  # rows: decoder outputs, states, input tokens


def _state(
    s: Svg, cx: float, cy: float, label: str, color: str, accent: bool = False, r: float = R
) -> None:
    """A recurrent state in a circle of radius r; `accent` outlines it in vermillion."""
    stroke, sw = (VERMILLION, 2.4) if accent else (color, 1.4)
    s.circle(cx, cy, r, tint(color, 0.22), stroke=stroke, sw=sw)
    s.text(cx, cy + 15 * 0.35, label, size=15, family=MONO)


def _token(s: Svg, cx: float, cy: float, label: str, color: str = PURPLE, w: float = 46) -> None:
    """A token in a small box centred on (cx, cy)."""
    s.box(
        cx - w / 2,
        cy - 14,
        w,
        28,
        [label],
        fill=tint(color, 0.2),
        stroke=color,
        size=15,
        family=MONO,
    )


def draw_seq2seq() -> Svg:
    """Chapter 1: the encoder's last state is the only thing the decoder learns of the source."""
    s = Svg(640, 306, "The RNN encoder-decoder and its bottleneck", SEQ2SEQ_DESC)
    _encoder(s)
    _summary(s)
    _decoder(s)
    s.text(150, 250, "encoder reads x_{1} \u2026 x_{n}", size=14, weight="bold", fill=GREEN)
    s.text(500, 250, "decoder writes y_{1} \u2026 y_{m}", size=14, weight="bold", fill=BLUE)
    s.text(
        320,
        290,
        "the same small vector for a 3-word or a 300-word sentence",
        size=14,
        italic=True,
        fill=VERMILLION,
    )
    return s


def _encoder(s: Svg) -> None:
    """Source tokens under a chain of states h_1 ... h_4."""
    for j, x in enumerate(ENC_X):
        _token(s, x, Y_IN, f"x_{{{j + 1}}}")
        s.arrow(x, Y_IN - 14, x, Y_STATE + R + 1, stroke=LINE)
        _state(s, x, Y_STATE, f"h_{{{j + 1}}}", GREEN, accent=j == len(ENC_X) - 1)
        if j + 1 < len(ENC_X):
            s.arrow(x + R, Y_STATE, ENC_X[j + 1] - R - 1, Y_STATE, stroke=LINE)


def _summary(s: Svg) -> None:
    """The last encoder state copied into one fixed-size vector: the bottleneck."""
    top = Y_STATE - 2 * CELL
    for k, v in enumerate([0.8, 0.3, 0.6, 0.45]):
        s.rect(
            SUMMARY_X - CELL / 2,
            top + k * CELL,
            CELL,
            CELL,
            fill=tint(VERMILLION, v),
            stroke=tint(INK, 0.6),
            sw=0.8,
            rx=1,
        )
    s.arrow(ENC_X[-1] + R, Y_STATE, SUMMARY_X - CELL / 2 - 2, Y_STATE, stroke=VERMILLION, sw=2)
    s.text(SUMMARY_X, top - 26, "summary", size=14, weight="bold", fill=VERMILLION)
    s.text(SUMMARY_X, top - 9, "fixed size", size=13, fill=VERMILLION)
    s.arrow(SUMMARY_X + CELL / 2, Y_STATE, DEC_X[0] - R - 1, Y_STATE, stroke=VERMILLION, sw=2)
    # Cho et al.: the summary is also an input of every later decoder step
    bus = Y_STATE + 2 * CELL + 12
    s.path(
        f"M{SUMMARY_X},{Y_STATE + 2 * CELL} V{bus} H{DEC_X[-1] - 13}",
        stroke=VERMILLION,
        sw=1.4,
        arrow=False,
        dash="5 3",
    )
    for x in DEC_X[1:]:
        s.arrow(x - 13, bus, x - 13, Y_STATE + 14.5, stroke=VERMILLION, sw=1.4, dash="5 3")


def _decoder(s: Svg) -> None:
    """A chain of decoder states s_1 ... s_3, each reading the previous output."""
    inputs = ["<s>", "y_{1}", "y_{2}"]
    for i, x in enumerate(DEC_X):
        _token(s, x, Y_IN, inputs[i], w=50)
        s.arrow(x + 6, Y_IN - 14, x + 6, Y_STATE + R - 1, stroke=LINE)
        _state(s, x, Y_STATE, f"s_{{{i + 1}}}", BLUE)
        s.arrow(x, Y_STATE - R, x, Y_OUT + 15, stroke=LINE)
        _token(s, x, Y_OUT, f"y_{{{i + 1}}}", color=VERMILLION)
        if i + 1 < len(DEC_X):
            s.arrow(x + R, Y_STATE, DEC_X[i + 1] - R - 1, Y_STATE, stroke=LINE)
            # each output is the next step's input
            s.path(
                f"M{x + 23},{Y_OUT} C{x + 50},{Y_OUT} {x + 40},{Y_IN} {DEC_X[i + 1] - 26},{Y_IN}",
                stroke=GREY_STROKE,
                sw=1.2,
                dash="3 3",
            )


# =============================================================================== bahdanau.svg

BAHDANAU_DESC = (
    "One step i of Bahdanau's attention decoder. At the top, the previous decoder state "
    "s_(i-1) is compared with each of the four encoder states h1 to h4, one row each: a small "
    "network gives a score e_ij for every row. A softmax turns the four scores into weights "
    "alpha_ij, drawn as bars, that are positive and add up to 1; the largest is on h2. The "
    "context c_i is the sum of the encoder states weighted by them, and it goes up into the "
    "new decoder state s_i together with s_(i-1) and the previous output y_(i-1); s_i gives "
    "the output y_i. The whole computation is repeated at every output step with new weights. "
    "The numbers are illustrative."
)
STATES = [  # one encoder state per source position (illustrative)
    [0.6, -0.4, 0.2, 0.9],
    [0.9, 0.5, -0.7, 0.3],
    [-0.2, 0.8, 0.4, -0.6],
    [0.3, -0.8, -0.3, 0.5],
]
SCORES = [0.2, 1.9, 0.6, -0.5]  # illustrative e_ij for this step
TOP, STEP = 140, 40  # y of the first row's cells, distance between rows
SCORE_X, BAR_X, BAR_W, CTX_X = 228, 300, 120, 560  # column positions


def _vector(s: Svg, x: float, y: float, values: list[float], color: str, alpha: float = 1.0):
    vector_cells(s, x, y, values, color, alpha, cell=CELL)


def draw_bahdanau() -> Svg:
    """Chapter 1: at each output step, score every encoder state, softmax, weighted sum."""
    z = [math.exp(e) for e in SCORES]
    alpha = [v / sum(z) for v in z]  # the softmax of the scores shown, so the two agree
    s = Svg(640, 380, "Bahdanau's attention decoder, one output step", BAHDANAU_DESC)
    for x, head in [(96, "encoder states"), (SCORE_X, "score e_{ij}"), (375, "weight \u03b1_{ij}")]:
        s.text(x, TOP - 16, head, size=14, weight="bold")
    acc_y = TOP + 1.5 * STEP + CELL / 2  # where the weighted states meet
    for j in range(len(STATES)):
        _row(s, j, alpha, acc_y)
    ctx = [sum(a * h[k] for a, h in zip(alpha, STATES)) for k in range(4)]
    _vector(s, CTX_X - 2 * CELL, acc_y - CELL / 2, ctx, GREEN)
    s.text(CTX_X, acc_y + 32, "context c_{i}", size=14, weight="bold")
    s.text(CTX_X, acc_y + 50, "\u03a3 \u03b1_{ij} h_{j}", size=14)
    s.text(375, TOP + 4 * STEP + 6, "positive, add up to 1", size=13, italic=True, fill=MUTED)
    _decoder_step(s, acc_y)
    s.text(
        320,
        348,
        "e_{ij} = v^{\u22a4} tanh(W s_{i\u22121} + U h_{j}),  \u03b1_{ij} = softmax_{j}(e_{ij})",
        size=14,
    )
    s.text(
        320,
        370,
        "repeated at every output step i, with new weights",
        size=13,
        fill=FOOTNOTE,
        italic=True,
    )
    return s


def _row(s: Svg, j: int, alpha: list[float], acc_y: float) -> None:
    """Encoder state j: its vector, its score, its weight as a bar, its share of the sum."""
    y, a, top = TOP + j * STEP, alpha[j], max(alpha)
    s.text(30, y + 12, f"h_{{{j + 1}}}", size=15, family=MONO)
    _vector(s, 58, y, STATES[j], GREEN)
    s.arrow(124, y + 7, SCORE_X - 28, y + 7, stroke=LINE)
    s.text(SCORE_X, y + 12, f"{SCORES[j]:+.1f}", size=15, family=MONO)
    s.arrow(SCORE_X + 26, y + 7, BAR_X - 6, y + 7, stroke=LINE)
    s.rect(BAR_X, y, BAR_W, CELL, fill="#ffffff", stroke=GREY_STROKE, sw=0.8, rx=1)
    s.rect(BAR_X, y, BAR_W * a, CELL, fill=ORANGE, stroke="none", sw=0, rx=1)
    s.text(BAR_X + BAR_W + 6, y + 12, f"{a:.2f}", size=15, family=MONO, anchor="start")
    s.path(
        f"M{BAR_X + BAR_W + 48},{y + 7} C{BAR_X + BAR_W + 80},{y + 7} "
        f"{BAR_X + BAR_W + 76},{num(acc_y)} {CTX_X - 2 * CELL - 6},{num(acc_y)}",
        stroke=tint(LINE, 0.35 + 0.65 * a / top),
        sw=1.2 + 2 * a,
        arrow=j == 1,
    )


def _decoder_step(s: Svg, acc_y: float) -> None:
    """s_(i-1) asks the question (scores); s_i takes the answer (the context) and outputs y_i."""
    sy, r = 52, 23
    _state(s, SCORE_X, sy, "s_{i\u22121}", BLUE, r=r)
    s.text(SCORE_X - r - 8, sy + 5, "decoder state", size=14, anchor="end", fill=MUTED)
    s.arrow(SCORE_X, sy + r, SCORE_X, TOP - 34, stroke=BLUE, sw=1.6)
    s.text(SCORE_X + 8, TOP - 40, "compared with every h_{j}", size=13, anchor="start", fill=BLUE)
    _state(s, CTX_X, sy, "s_{i}", BLUE, r=r)
    s.arrow(SCORE_X + r, sy, CTX_X - r - 1, sy, stroke=LINE)
    s.text((SCORE_X + CTX_X) / 2, sy - 8, "+ y_{i\u22121}", size=14, family=MONO)
    s.arrow(CTX_X, acc_y - CELL / 2 - 2, CTX_X, sy + r + 1, stroke=GREEN, sw=2)
    s.arrow(CTX_X + r, sy, CTX_X + 48, sy, stroke=LINE)
    s.text(CTX_X + 52, sy + 5, "y_{i}", size=15, family=MONO, anchor="start")
