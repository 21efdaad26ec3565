"""The encoder-decoder drawn left to right, each part in its colour or greyed (hand-written).

`draw_model(Where(...), title, desc)` gives the landing page's overview (nothing greyed) and each
chapter's "where we are" picture (only that chapter's parts in colour); `where.py` says what
each chapter highlights. Top row the encoder, bottom row the decoder, residual connections as
green lines under the boxes; under the decoder, Linear and Softmax in a row that runs right to
left, and the chapter's note in a blue frame at the bottom. Every label is at least 16 units in a
780-unit drawing, so at least 12 px where the chapters show it (90% of a 688 px column).
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
    text_width,
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

W = 780  # the drawing's width: labels of 16 units show at 12.7 px in a 90% figure (619 px)
FONT, SMALL = 16, 16  # box labels; remarks, shapes and other small text (never below 16)
ENC_Y, DEC_Y = 130, 330  # centre lines of the encoder (top) and decoder (bottom) rows
HALF = 46  # half the height of a sub-layer box
WIDTH = {"attention": 106, "ffn": 78, "norm": 56}  # sub-layer box widths by kind
GAP = 12  # between two sub-layer boxes
STACK_X = 216  # left edge of both stack frames
FIRST = STACK_X + 14  # left edge of the first sub-layer box
OUT_Y = 448  # centre line of the output row (Linear and Softmax, drawn right to left)
LINEAR_X, SOFTMAX_X = 672, 572  # left edges of the Linear (72 wide) and Softmax (80) boxes
PROBS_X = 534  # right end of the probabilities' label

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
    svg = Svg(W, 0, title, desc)
    svg.height = _Model(svg, where).draw()
    return svg


def wrap(text: str, size: float, room: float) -> list[str]:
    """`text` broken into lines (at spaces) that fit `room` units at `size`."""
    lines: list[str] = []
    for word in text.split():
        if lines and text_width(f"{lines[-1]} {word}", size) <= room:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    for line in lines:
        require_fit(line, size, room, "the note")
    return lines


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

    def draw(self) -> float:
        """Heading; per row the inputs and the stack, then the memory (encoder) or the output
        layer (decoder); the chapter's extras (loss, feedback); the note at the bottom. Returns
        the drawing's height."""
        self.svg.text(10, 26, self.where.heading, size=17, anchor="start", weight="bold")
        for row, cy in (("enc", ENC_Y), ("dec", DEC_Y)):
            self.inputs(row, cy)
            last = self.stack(row, cy)
            if row == "enc":
                self.memory(last, cy)
            else:
                self.output_layer(last, cy)
        bottom = OUT_Y + 24
        if self.where.loss:
            bottom = self.loss()
        if self.where.feedback:
            bottom = self.feedback()
        return self.note(bottom + 14)

    def note(self, top: float) -> float:
        """The chapter's note in a blue frame across the bottom; returns the drawing's height."""
        if not self.where.note:
            return top
        s, lines = self.svg, wrap(" ".join(self.where.note), SMALL, W - 40)
        h = 14 + 21 * len(lines)
        s.rect(10, top, W - 20, h, fill=tint(BLUE, 0.08), stroke=BLUE)
        for i, row in enumerate(lines):
            s.text(20, top + 23 + 21 * i, row, size=SMALL, anchor="start")
        return top + h + 10

    def inputs(self, row: str, cy: float) -> None:
        """Tokens -> embedding -> + positional encoding, up to the first sub-layer."""
        s, io, emb = self.svg, "src" if row == "enc" else "tgt", f"{row}_emb"
        s.lines(
            72,
            cy,
            self.labels[io],
            size=FONT,
            anchor="end",
            fill=self.text_color(io),
            weight=self.bold(io),
        )
        s.arrow(74, cy, 81, cy, stroke=self.line_color(io))
        name = "Input" if row == "enc" else "Output"
        s.box(82, cy - 30, 98, 60, [name, "embedding"], size=FONT, **self.style(emb, "embedding"))
        s.arrow(180, cy, 188, cy, stroke=self.line_color(emb))
        self.positional_encoding(f"{row}_pe", cy)
        s.arrow(211, cy, FIRST - 1, cy, stroke=self.line_color(f"{row}_pe"))

    def positional_encoding(self, pe: str, cy: float) -> None:
        """A "+" in a circle with a small sine wave under it: the encoding added there."""
        s, st = self.svg, self.style(pe, "pe")
        s.circle(200, cy, 11, fill=st["fill"], stroke=st["stroke"], sw=st["sw"])
        s.text(200, cy + 5.5, "+", size=17, fill=st["text_fill"], weight="bold")
        wave = " ".join(
            f"{'L' if i else 'M'}{num(188 + i)},{num(cy + 29 - 5 * math.sin(i * math.pi / 12))}"
            for i in range(0, 25, 2)
        )
        s.path(wave, stroke=st["stroke"], sw=1.4, arrow=False)
        s.arrow(200, cy + 22, 200, cy + 12, stroke=st["stroke"])
        # under the embedding box: the stack's frame leaves no room under the "+"
        s.lines(150, cy + 58, ["positional", "encoding"], size=SMALL, fill=st["text_fill"])

    def stack(self, row: str, cy: float) -> float:
        """The dashed frame of N identical layers and the sub-layers in it; returns the right
        end of the last add & norm."""
        names = SUBLAYERS[row]
        xs, x = [], FIRST
        for _, kind in names:
            xs.append(x)
            x += WIDTH[kind] + GAP
        self.frame(row, cy, right=x - GAP + 14)
        for i, ((name, kind), bx) in enumerate(zip(names, xs)):
            bw = WIDTH[kind]
            self.sublayer(f"{row}_{name}", kind, bx, cy, bw, SUBLAYER_LABELS[name])
            if kind == "norm":  # the residual connection: from before the sub-layer to here
                start = xs[i - 1] - GAP / 2 - (2 if i == 1 else 0)
                mid = bx + bw / 2
                self.svg.path(
                    f"M{num(start)},{num(cy)} V{num(cy + HALF + 14)} H{num(mid)} "
                    f"V{num(cy + HALF + 1)}",
                    stroke=self.line_color(f"{row}_res", "ffn"),
                    sw=1.6,
                )
            if i + 1 < len(names):
                self.svg.arrow(bx + bw, cy, xs[i + 1] - 1, cy, stroke=LINE)
        return xs[-1] + WIDTH["norm"]

    def frame(self, row: str, cy: float, right: float) -> None:
        """The dashed frame around one layer, labelled "Encoder/Decoder layer (x N)"."""
        st = self.style(f"{row}_stack", "stack")
        self.svg.rect(
            STACK_X,
            cy - HALF - 28,
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
            cy - HALF - 13,
            name + " layer (\u00d7 N)",
            size=FONT,
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
        self.svg.box(x, cy - HALF, w, 2 * HALF, rows, size=FONT, **st)

    def memory(self, last: float, cy: float) -> None:
        """The encoder's output (memory) gives the keys and values of cross-attention."""
        cross_mid = FIRST + 2 * GAP + WIDTH["attention"] * 1.5 + WIDTH["norm"]  # "cattn"
        piled = self.where.stacked_attention and self.lit("dec_cattn")
        top = DEC_Y - HALF - (8 if piled else 0)
        self.svg.path(
            f"M{num(last)},{num(cy)} H{num(594)} V{num(224)} H{num(cross_mid)} V{num(top - 1)}",
            stroke=self.line_color("memory", "memory"),
            sw=2 if self.lit("memory") else 1.4,
        )
        self.svg.text(
            cross_mid + 8,
            217,
            "memory: keys, values",
            size=SMALL,
            anchor="start",
            fill=self.text_color("memory"),
        )

    def output_layer(self, last: float, cy: float) -> None:
        """Linear, softmax and the next-token probabilities, in a row under the decoder that
        runs right to left."""
        s = self.svg
        s.path(f"M{num(last)},{num(cy)} H{W - 10} V{OUT_Y} H{LINEAR_X + 73}", stroke=LINE, sw=1.4)
        s.box(LINEAR_X, OUT_Y - 20, 72, 40, ["Linear"], size=FONT, **self.style("linear", "output"))
        s.arrow(LINEAR_X, OUT_Y, SOFTMAX_X + 81, OUT_Y, stroke=LINE)
        st = self.style("softmax", "output")
        s.box(SOFTMAX_X, OUT_Y - 20, 80, 40, ["Softmax"], size=FONT, **st)
        s.arrow(SOFTMAX_X, OUT_Y, PROBS_X + 5, OUT_Y, stroke=self.line_color("probs"))
        s.lines(
            PROBS_X,
            OUT_Y,
            self.labels["probs"],
            size=SMALL,
            anchor="end",
            fill=self.text_color("probs"),
            weight=self.bold("probs"),
        )

    def loss(self) -> float:
        """Chapter 6: the loss box, fed by the probabilities; returns its bottom edge."""
        st = self.style("loss", "output")
        rows = ["Loss: cross-entropy", "against the targets", "shifted left:", "a dog runs </s>"]
        left = PROBS_X - 140 - 16 - 204
        self.svg.box(left, OUT_Y - 28, 204, 92, rows, size=SMALL, **st)
        self.svg.arrow(PROBS_X - 140, OUT_Y, left + 205, OUT_Y, stroke=st["stroke"])
        return OUT_Y + 64

    def feedback(self) -> float:
        """Chapters 7 and 8: from the softmax back to the decoder's input; returns the bottom
        of the remark under the arrow."""
        y = OUT_Y + 36
        self.svg.path(
            f"M{SOFTMAX_X + 40},{OUT_Y + 20} V{y} H36 V{DEC_Y + 46}", stroke=VERMILLION, sw=2
        )
        self.svg.text(
            W / 2,
            y + 22,
            "decoding: the word chosen from the probabilities becomes the next input",
            size=SMALL,
            fill=INK,
        )
        return y + 28
