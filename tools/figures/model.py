"""The encoder-decoder drawn left to right, each part in its colour or greyed (hand-written).

`draw_model(Where(...), title, desc)` gives the landing page's overview (nothing greyed) and each
chapter's "where we are" picture (only that chapter's parts in colour); `where.py` says what
each chapter highlights. Top row the encoder, bottom row the decoder, residual connections as
green lines under the boxes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .svg import (
    BLACK,
    BLUE,
    GREEN,
    GREY_FILL,
    GREY_STROKE,
    GREY_TEXT,
    INK,
    LINE,
    ORANGE,
    PURPLE,
    SKY,
    VERMILLION,
    YELLOW,
    Svg,
    num,
    require_fit,
    tint,
)

# Component kinds and their colours (the same in every drawing of the model).
KIND_COLOR = {
    "attention": BLUE,
    "norm": YELLOW,
    "ffn": GREEN,
    "embedding": PURPLE,
    "pe": ORANGE,
    "output": VERMILLION,
    "stack": BLACK,
    "io": BLACK,
    "memory": SKY,
}

ENC_Y, DEC_Y = 116, 326  # centre lines of the encoder (top) and decoder (bottom) rows
HALF = 50  # half the height of a sub-layer box
BIG, THIN, GAP = 84, 48, 16  # widths of attention / feed-forward boxes, add & norm, gaps
STACK_X = 222  # left edge of both stack frames
FIRST = STACK_X + 14  # left edge of the first sub-layer box
PROBS_X = 849  # the vertical line from the softmax to the probabilities (and back, decoding)

# The sub-layers of one layer, left to right: (part name, kind).
SUBLAYERS = {
    "enc": [("attn", "attention"), ("an1", "norm"), ("ffn", "ffn"), ("an2", "norm")],
    "dec": [
        ("mattn", "attention"),
        ("an1", "norm"),
        ("cattn", "attention"),
        ("an2", "norm"),
        ("ffn", "ffn"),
        ("an3", "norm"),
    ],
}
SUBLAYER_LABELS = {
    "attn": ["Multi-head", "self-", "attention"],
    "mattn": ["Masked", "multi-head", "self-", "attention"],
    "cattn": ["Multi-head", "cross-", "attention"],
    "ffn": ["Feed-", "forward"],
    "an1": ["Add &", "Norm"],
    "an2": ["Add &", "Norm"],
    "an3": ["Add &", "Norm"],
}
DEFAULT_LABELS = {
    "src": ["Source", "tokens"],
    "tgt": ["Target", "tokens,", "shifted", "right"],
    "probs": ["next-token", "probabilities"],
}


@dataclass
class Where:
    """What a "where we are" drawing highlights; `None` colours everything (the overview)."""

    heading: str
    lit: set[str] | None = None
    note: list[str] = field(default_factory=list)
    stacked_attention: bool = False  # draw attention blocks as a pile of heads (chapter 3)
    feedback: bool = False  # the decoder's output fed back as its next input (chapters 7, 8)
    loss: bool = False  # the loss against shifted targets (chapter 6)
    labels: dict[str, list[str]] = field(default_factory=dict)  # replaces DEFAULT_LABELS


def draw_model(where: Where, title: str, desc: str) -> Svg:
    """The whole encoder-decoder, highlighted as `where` says."""
    svg = Svg(900, 452 if where.feedback else 414, title, desc)
    _Model(svg, where).draw()
    return svg


class _Model:
    """Draws the encoder-decoder once, with each part either in its colour or greyed."""

    def __init__(self, svg: Svg, where: Where) -> None:
        self.svg, self.where = svg, where
        self.labels = {**DEFAULT_LABELS, **where.labels}

    # ------------------------------------------------------------------ styles

    def lit(self, part: str) -> bool:
        return self.where.lit is None or part in self.where.lit

    def style(self, part: str, kind: str) -> dict[str, object]:
        """Keyword arguments of `Svg.box` for `part`: its kind's colour, or grey."""
        color = KIND_COLOR[kind]
        if not self.lit(part):
            return {"fill": GREY_FILL, "stroke": GREY_STROKE, "text_fill": GREY_TEXT, "sw": 1}
        strong = self.where.lit is not None  # a chapter's part: a bolder outline than overview
        stroke = "#8a7d00" if kind == "norm" else color  # yellow lines are too faint on white
        return {
            "fill": tint(color, 0.45 if kind == "norm" else 0.22),
            "stroke": stroke,
            "text_fill": INK,
            "sw": 2.4 if strong else 1.4,
        }

    def line_color(self, part: str, kind: str = "io") -> str:
        if not self.lit(part):
            return GREY_STROKE
        return LINE if kind == "io" else KIND_COLOR[kind]

    def text_color(self, part: str) -> str:
        return INK if self.lit(part) else GREY_TEXT

    def bold(self, part: str) -> str | None:
        """Bold for a chapter's own inputs and outputs (not in the overview)."""
        return "bold" if self.lit(part) and self.where.lit is not None else None

    # ------------------------------------------------------------------ the drawing

    def draw(self) -> None:
        """Heading and note; per row the inputs and the stack, then the memory (encoder) or the
        output layer (decoder); then the chapter's extras (loss, feedback)."""
        self.heading()
        for row, cy in (("enc", ENC_Y), ("dec", DEC_Y)):
            self.inputs(row, cy)
            last = self.stack(row, cy)
            if row == "enc":
                self.memory(last, cy)
            else:
                self.output_layer(last, cy)
        if self.where.loss:
            self.loss()
        if self.where.feedback:
            self.feedback()

    def heading(self) -> None:
        """The title line, and the chapter's note in a blue frame at the top right."""
        s, note = self.svg, self.where.note
        s.text(10, 24, self.where.heading, size=15, anchor="start", weight="bold")
        if note:
            s.rect(604, 40, 286, 18 + 16 * len(note), fill=tint(BLUE, 0.08), stroke=BLUE)
            for i, row in enumerate(note):
                require_fit(row, 12, 276, "the note")
                s.text(612, 58 + 16 * i, row, size=12, anchor="start")

    def inputs(self, row: str, cy: float) -> None:
        """Tokens -> embedding -> + positional encoding, up to the first sub-layer."""
        s, io, emb = self.svg, "src" if row == "enc" else "tgt", f"{row}_emb"
        s.lines(
            66,
            cy,
            self.labels[io],
            size=12,
            anchor="end",
            fill=self.text_color(io),
            weight=self.bold(io),
        )
        s.arrow(68, cy, 77, cy, stroke=self.line_color(io))
        name = "Input" if row == "enc" else "Output"
        s.box(78, cy - 30, 74, 60, [name, "embedding"], **self.style(emb, "embedding"))
        s.arrow(152, cy, 170, cy, stroke=self.line_color(emb))
        self.positional_encoding(f"{row}_pe", cy)
        s.arrow(193, cy, FIRST - 1, cy, stroke=self.line_color(f"{row}_pe"))

    def positional_encoding(self, pe: str, cy: float) -> None:
        """A "+" in a circle with a small sine wave under it: the encoding added there."""
        s, st = self.svg, self.style(pe, "pe")
        s.circle(182, cy, 11, fill=st["fill"], stroke=st["stroke"], sw=st["sw"])
        s.text(182, cy + 4.5, "+", size=15, fill=st["text_fill"], weight="bold")
        wave = " ".join(
            f"{'L' if i else 'M'}{num(170 + i)},{num(cy + 29 - 5 * math.sin(i * math.pi / 12))}"
            for i in range(0, 25, 2)
        )
        s.path(wave, stroke=st["stroke"], sw=1.4, arrow=False)
        s.arrow(182, cy + 22, 182, cy + 12, stroke=st["stroke"])
        s.lines(182, cy + 55, ["positional", "encoding"], size=11, fill=st["text_fill"])

    def stack(self, row: str, cy: float) -> float:
        """The dashed frame of N identical layers and the sub-layers in it; returns the right
        end of the last add & norm."""
        names = SUBLAYERS[row]
        xs, x = [], FIRST
        for _, kind in names:
            xs.append(x)
            x += (THIN if kind == "norm" else BIG) + GAP
        self.frame(row, cy, right=x - GAP + 14)
        for i, ((name, kind), bx) in enumerate(zip(names, xs)):
            bw = THIN if kind == "norm" else BIG
            self.sublayer(f"{row}_{name}", kind, bx, cy, bw, SUBLAYER_LABELS[name])
            if kind == "norm":  # the residual connection: from before the sub-layer to here
                start = xs[i - 1] - GAP / 2 - (6 if i == 1 else 0)
                mid = bx + bw / 2
                self.svg.path(
                    f"M{num(start)},{num(cy)} V{num(cy + HALF + 14)} H{num(mid)} "
                    f"V{num(cy + HALF + 1)}",
                    stroke=self.line_color(f"{row}_res", "ffn"),
                    sw=1.6,
                )
            if i + 1 < len(names):
                self.svg.arrow(bx + bw, cy, xs[i + 1] - 1, cy, stroke=LINE)
        return xs[-1] + THIN

    def frame(self, row: str, cy: float, right: float) -> None:
        """The dashed frame around one layer, labelled "Encoder/Decoder layer (x N)"."""
        st = self.style(f"{row}_stack", "stack")
        self.svg.rect(
            STACK_X,
            cy - HALF - 26,
            right - STACK_X,
            2 * HALF + 52,
            fill="none",
            stroke=st["stroke"],
            sw=st["sw"],
            dash="6 4",
        )
        name = "Encoder" if row == "enc" else "Decoder"
        self.svg.text(
            STACK_X + 10,
            cy - HALF - 10,
            name + " layer (\u00d7 N)",
            size=12,
            anchor="start",
            fill=st["text_fill"],
            weight="bold",
        )

    def sublayer(self, part: str, kind: str, x: float, cy: float, w: float, rows: list[str]):
        """One sub-layer's box (attention of chapter 3: in front of a pile of heads)."""
        st = self.style(part, kind)
        if kind == "attention" and self.where.stacked_attention and self.lit(part):
            # a pile of cards behind the box: one attention per head
            for k in (2, 1):
                self.svg.rect(
                    x + 4 * k,
                    cy - HALF - 4 * k,
                    w,
                    2 * HALF,
                    fill=st["fill"],
                    stroke=st["stroke"],
                    sw=1,
                )
        self.svg.box(x, cy - HALF, w, 2 * HALF, rows, **st)

    def memory(self, last: float, cy: float) -> None:
        """The encoder's output (memory) gives the keys and values of cross-attention."""
        cross_mid = FIRST + BIG + GAP + THIN + GAP + BIG / 2  # centre of "cattn"
        piled = self.where.stacked_attention and self.lit("dec_cattn")
        top = DEC_Y - HALF - (8 if piled else 0)
        self.svg.path(
            f"M{num(last)},{num(cy)} H{num(586)} V{num(222)} H{num(cross_mid)} V{num(top - 1)}",
            stroke=self.line_color("memory", "memory"),
            sw=2 if self.lit("memory") else 1.4,
        )
        self.svg.text(514, 216, "memory: keys, values", size=11, fill=self.text_color("memory"))

    def output_layer(self, last: float, cy: float) -> None:
        """Linear, softmax, and the next-token probabilities above them."""
        s = self.svg
        s.arrow(last, cy, 739, cy, stroke=LINE)
        s.box(740, cy - 30, 60, 60, ["Linear"], **self.style("linear", "output"))
        s.arrow(800, cy, 811, cy, stroke=LINE)
        s.box(812, cy - 30, 74, 60, ["Softmax"], **self.style("softmax", "output"))
        s.arrow(PROBS_X, cy - 30, PROBS_X, 262, stroke=self.line_color("probs"))
        s.lines(
            PROBS_X,
            240,
            self.labels["probs"],
            size=11,
            fill=self.text_color("probs"),
            weight=self.bold("probs"),
        )

    def loss(self) -> None:
        """Chapter 6: the loss box, fed by the probabilities."""
        st = self.style("loss", "output")
        rows = [
            "Loss: cross-entropy of the probabilities",
            "against the targets, shifted left:",
            "a dog runs </s>",
        ]
        self.svg.box(604, 132, 286, 58, rows, size=11, **st)
        self.svg.arrow(PROBS_X, 226, PROBS_X, 191, stroke=st["stroke"])

    def feedback(self) -> None:
        """Chapters 7 and 8: from the softmax back to the decoder's input."""
        self.svg.path(f"M{PROBS_X},{DEC_Y + 30} V428 H38 V{DEC_Y + 42}", stroke=VERMILLION, sw=2)
        self.svg.text(
            440,
            444,
            "decoding: the word chosen from the probabilities becomes the next input",
            size=12,
            fill=INK,
        )
