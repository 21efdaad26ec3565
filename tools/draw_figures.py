"""Draw the book's explanatory pictures as SVG files in ``book/figures/``.

The drawings are ours, written as plain SVG XML by this script (standard library only), so that
a picture can be changed here and regenerated, and building the book needs no drawing tool.

    python tools/draw_figures.py           # (re)write every file in book/figures/
    python tools/draw_figures.py --check   # exit 1 if a committed drawing differs from this script

Every drawing has a <title> and a <desc>, a viewBox about 700-900 units wide (one page column),
generic font families only, and no external reference. Each box's label is checked against an
estimate of its width in DejaVu Sans (the widest common sans-serif), so a label that would
overflow its box fails here instead of on the page. Output is deterministic: the same script
always writes the same bytes (numbers are rounded, nothing random, no dates).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "figures"

# Okabe-Ito palette, copied from transformer_lib.viz.COLORS (tests/test_figures.py checks that
# the two agree) so that drawings and plots use the same colours.
BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, BLACK = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
)
PALETTE = [BLUE, ORANGE, GREEN, VERMILLION, PURPLE, SKY, YELLOW, BLACK]

INK = "#1a1a1a"  # text and outlines
LINE = "#4d4d4d"  # arrows between parts
GREY_FILL, GREY_STROKE, GREY_TEXT = "#f2f2f2", "#b8b8b8", "#808080"  # "not this chapter"
SANS, MONO = "sans-serif", "monospace"
# Average advance of a character, in em, for DejaVu Sans / DejaVu Sans Mono (what Chromium on
# Linux picks for the generic families; Arial and Helvetica are narrower, so this is safe).
EM_SANS, EM_MONO = 0.62, 0.61


def tint(color: str, amount: float) -> str:
    """`color` mixed with white: amount 1 is the colour itself, 0 is white."""
    rgb = [int(color[i : i + 2], 16) for i in (1, 3, 5)]
    mixed = [round(255 - (255 - c) * amount) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in mixed)


def num(v: float) -> str:
    """A coordinate as short, stable text (two decimals at most)."""
    out = f"{round(v, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if out in ("-0", "") else out


MARKUP = re.compile(r"([_^])\{([^}]*)\}")


def plain(s: str) -> str:
    """The text a reader sees, without the _{sub} / ^{sup} markup."""
    return MARKUP.sub(r"\2", s)


def text_width(s: str, size: float, family: str = SANS) -> float:
    """Estimated width of `s` (sub- and superscripts count at 70% size)."""
    em = EM_MONO if family == MONO else EM_SANS
    small = sum(len(m.group(2)) for m in MARKUP.finditer(s))
    return em * size * (len(plain(s)) - small + 0.7 * small)


def rich(s: str, size: float) -> str:
    """Escape `s` and turn _{...} and ^{...} into shifted, smaller tspans."""
    out, pos, shift = [], 0, 0.0
    small = num(size * 0.7)
    for m in MARKUP.finditer(s):
        if m.start() > pos:
            chunk = escape(s[pos : m.start()])
            out.append(f'<tspan dy="{num(-shift)}">{chunk}</tspan>' if shift else chunk)
            shift = 0.0
        dy = size * 0.3 if m.group(1) == "_" else -size * 0.4
        out.append(
            f'<tspan dy="{num(dy - shift)}" font-size="{small}">{escape(m.group(2))}</tspan>'
        )
        shift = dy
        pos = m.end()
    if pos < len(s):
        chunk = escape(s[pos:])
        out.append(f'<tspan dy="{num(-shift)}">{chunk}</tspan>' if shift else chunk)
    return "".join(out)


@dataclass
class Svg:
    """An SVG document built element by element; `render()` gives its text."""

    width: int
    height: int
    title: str
    desc: str
    parts: list[str] = field(default_factory=list)
    markers: set[str] = field(default_factory=set)

    def rect(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        fill: str = "none",
        stroke: str = INK,
        sw: float = 1.2,
        rx: float = 5,
        dash: str | None = None,
    ) -> None:
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(
            f'<rect x="{num(x)}" y="{num(y)}" width="{num(w)}" height="{num(h)}" '
            f'rx="{num(rx)}" fill="{fill}" stroke="{stroke}" stroke-width="{num(sw)}"{extra}/>'
        )

    def circle(
        self, cx: float, cy: float, r: float, fill: str, stroke: str = INK, sw: float = 1.2
    ) -> None:
        self.parts.append(
            f'<circle cx="{num(cx)}" cy="{num(cy)}" r="{num(r)}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="{num(sw)}"/>'
        )

    def text(
        self,
        x: float,
        y: float,
        s: str,
        size: float = 12,
        anchor: str = "middle",
        fill: str = INK,
        weight: str | None = None,
        family: str = SANS,
        italic: bool = False,
    ) -> None:
        attrs = f'x="{num(x)}" y="{num(y)}" font-size="{num(size)}" font-family="{family}"'
        if anchor != "start":
            attrs += f' text-anchor="{anchor}"'
        if fill != INK:
            attrs += f' fill="{fill}"'
        if weight:
            attrs += f' font-weight="{weight}"'
        if italic:
            attrs += ' font-style="italic"'
        self.parts.append(f"<text {attrs}>{rich(s, size)}</text>")

    def lines(
        self,
        x: float,
        cy: float,
        rows: list[str],
        size: float = 12,
        gap: float = 1.25,
        **kw,
    ) -> None:
        """Several lines of text, the block centred vertically on `cy`."""
        step = size * gap
        top = cy - step * (len(rows) - 1) / 2 + size * 0.35
        for i, row in enumerate(rows):
            self.text(x, top + i * step, row, size=size, **kw)

    def path(
        self,
        d: str,
        stroke: str = LINE,
        sw: float = 1.4,
        arrow: bool = True,
        dash: str | None = None,
        fill: str = "none",
    ) -> None:
        extra = ""
        if arrow:
            self.markers.add(stroke)
            extra += f' marker-end="url(#{_marker_id(stroke)})"'
        if dash:
            extra += f' stroke-dasharray="{dash}"'
        self.parts.append(
            f'<path d="{d}" fill="{fill}" stroke="{stroke}" stroke-width="{num(sw)}"{extra}/>'
        )

    def arrow(self, x1: float, y1: float, x2: float, y2: float, **kw) -> None:
        self.path(f"M{num(x1)},{num(y1)} L{num(x2)},{num(y2)}", **kw)

    def box(
        self,
        x: float,
        y: float,
        w: float,
        h: float,
        rows: list[str],
        fill: str,
        stroke: str = INK,
        size: float = 12,
        text_fill: str = INK,
        sw: float = 1.2,
        family: str = SANS,
        weight: str | None = None,
    ) -> None:
        """A rounded box with centred lines of text; fails if a line would not fit."""
        for row in rows:
            if text_width(row, size, family) > w - 6:
                raise ValueError(f"label {row!r} is too wide for a {w}-unit box")
        if len(rows) * size * 1.25 > h:
            raise ValueError(f"labels {rows!r} are too tall for a {h}-unit box")
        self.rect(x, y, w, h, fill=fill, stroke=stroke, sw=sw)
        self.lines(
            x + w / 2, y + h / 2, rows, size=size, fill=text_fill, family=family, weight=weight
        )

    def render(self) -> str:
        defs = "".join(
            f'<marker id="{_marker_id(c)}" viewBox="0 0 10 10" refX="9" refY="5" '
            f'markerWidth="8" markerHeight="8" markerUnits="userSpaceOnUse" '
            f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>'
            for c in sorted(self.markers)
        )
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
            f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" role="img" '
            f'aria-labelledby="title desc">\n'
            f'<title id="title">{escape(self.title)}</title>\n'
            f'<desc id="desc">{escape(self.desc)}</desc>\n'
            f"<defs>{defs}</defs>\n"
            f'<rect width="{self.width}" height="{self.height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def _marker_id(color: str) -> str:
    return "arrow-" + color.lstrip("#").lower()


# =========================================================================== the architecture

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


@dataclass
class Where:
    """What a "where we are" drawing highlights; `None` colours everything (the overview)."""

    heading: str
    lit: set[str] | None = None
    note: list[str] = field(default_factory=list)
    stacked_attention: bool = False  # draw attention blocks as a pile of heads (chapter 3)
    feedback: bool = False  # the decoder's output fed back as its next input (chapters 7, 8)
    loss: bool = False  # the loss against shifted targets (chapter 6)
    labels: dict[str, list[str]] = field(default_factory=dict)


class _Model:
    """Draws the encoder-decoder once, with each part either in its colour or greyed."""

    def __init__(self, svg: Svg, where: Where) -> None:
        self.svg, self.where = svg, where

    def lit(self, part: str) -> bool:
        return self.where.lit is None or part in self.where.lit

    def style(self, part: str, kind: str) -> dict[str, object]:
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

    def sublayer(self, part: str, kind: str, x: float, cy: float, w: float, rows: list[str]):
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

    def draw(self) -> None:
        s, w = self.svg, self.where
        lab = {
            "src": ["Source", "tokens"],
            "tgt": ["Target", "tokens,", "shifted", "right"],
            "probs": ["next-token", "probabilities"],
            **w.labels,
        }
        s.text(10, 24, w.heading, size=15, anchor="start", weight="bold")
        if w.note:
            color = BLUE
            s.rect(604, 40, 286, 18 + 16 * len(w.note), fill=tint(color, 0.08), stroke=color)
            for i, row in enumerate(w.note):
                if text_width(row, 12) > 276:
                    raise ValueError(f"note line {row!r} is too wide")
                s.text(612, 58 + 16 * i, row, size=12, anchor="start")

        for row, cy in (("enc", ENC_Y), ("dec", DEC_Y)):
            io = "src" if row == "enc" else "tgt"
            # tokens -> embedding -> + positional encoding
            c = GREY_TEXT if not self.lit(io) else INK
            s.lines(
                66,
                cy,
                lab[io],
                size=12,
                anchor="end",
                fill=c,
                weight="bold" if self.lit(io) and w.lit is not None else None,
            )
            s.arrow(68, cy, 77, cy, stroke=self.line_color(io))
            emb = f"{row}_emb"
            s.box(
                78,
                cy - 30,
                74,
                60,
                ["Input" if row == "enc" else "Output", "embedding"],
                **self.style(emb, "embedding"),
            )
            s.arrow(152, cy, 170, cy, stroke=self.line_color(emb))
            pe = f"{row}_pe"
            st = self.style(pe, "pe")
            s.circle(182, cy, 11, fill=st["fill"], stroke=st["stroke"], sw=st["sw"])
            s.text(182, cy + 4.5, "+", size=15, fill=st["text_fill"], weight="bold")
            # a small sine wave under the "+": the encoding added there
            wave = " ".join(
                f"{'L' if i else 'M'}{num(170 + i)},{num(cy + 29 - 5 * math.sin(i * math.pi / 12))}"
                for i in range(0, 25, 2)
            )
            s.path(wave, stroke=st["stroke"], sw=1.4, arrow=False)
            s.arrow(182, cy + 22, 182, cy + 12, stroke=st["stroke"])
            s.lines(182, cy + 55, ["positional", "encoding"], size=11, fill=st["text_fill"])
            s.arrow(193, cy, FIRST - 1, cy, stroke=self.line_color(pe))

            # the stack of N identical layers
            names = (
                [("attn", "attention"), ("an1", "norm"), ("ffn", "ffn"), ("an2", "norm")]
                if row == "enc"
                else [
                    ("mattn", "attention"),
                    ("an1", "norm"),
                    ("cattn", "attention"),
                    ("an2", "norm"),
                    ("ffn", "ffn"),
                    ("an3", "norm"),
                ]
            )
            xs, x = [], FIRST
            for _, kind in names:
                xs.append(x)
                x += (THIN if kind == "norm" else BIG) + GAP
            right = x - GAP + 14
            frame = f"{row}_stack"
            st = self.style(frame, "stack")
            s.rect(
                STACK_X,
                cy - HALF - 26,
                right - STACK_X,
                2 * HALF + 52,
                fill="none",
                stroke=st["stroke"],
                sw=st["sw"],
                dash="6 4",
            )
            s.text(
                STACK_X + 10,
                cy - HALF - 10,
                ("Encoder" if row == "enc" else "Decoder") + " layer (\u00d7 N)",
                size=12,
                anchor="start",
                fill=st["text_fill"],
                weight="bold",
            )
            labels = {
                "attn": ["Multi-head", "self-", "attention"],
                "mattn": ["Masked", "multi-head", "self-", "attention"],
                "cattn": ["Multi-head", "cross-", "attention"],
                "ffn": ["Feed-", "forward"],
            }
            res = f"{row}_res"
            for i, ((name, kind), bx) in enumerate(zip(names, xs)):
                bw = THIN if kind == "norm" else BIG
                part = f"{row}_{name}"
                if kind == "norm":
                    self.sublayer(part, kind, bx, cy, bw, ["Add &", "Norm"])
                    # the residual connection: from before the sub-layer to this add & norm
                    start = xs[i - 1] - GAP / 2 - (6 if i == 1 else 0)
                    mid = bx + bw / 2
                    s.path(
                        f"M{num(start)},{num(cy)} V{num(cy + HALF + 14)} H{num(mid)} "
                        f"V{num(cy + HALF + 1)}",
                        stroke=self.line_color(res, "ffn"),
                        sw=1.6,
                    )
                else:
                    self.sublayer(part, kind, bx, cy, bw, labels[name])
                if i + 1 < len(names):
                    s.arrow(bx + bw, cy, xs[i + 1] - 1, cy, stroke=LINE)
            last = xs[-1] + THIN
            if row == "enc":
                # the encoder's output (memory) gives the keys and values of cross-attention
                cross_mid = FIRST + BIG + GAP + THIN + GAP + BIG / 2  # centre of "cattn"
                mc = self.line_color("memory", "memory")
                top = DEC_Y - HALF - (8 if w.stacked_attention and self.lit("dec_cattn") else 0)
                s.path(
                    f"M{num(last)},{num(cy)} H{num(586)} V{num(222)} H{num(cross_mid)} "
                    f"V{num(top - 1)}",
                    stroke=mc,
                    sw=2 if self.lit("memory") else 1.4,
                )
                s.text(
                    514,
                    216,
                    "memory: keys, values",
                    size=11,
                    fill=INK if self.lit("memory") else GREY_TEXT,
                )
            else:
                s.arrow(last, cy, 739, cy, stroke=LINE)
                s.box(740, cy - 30, 60, 60, ["Linear"], **self.style("linear", "output"))
                s.arrow(800, cy, 811, cy, stroke=LINE)
                s.box(812, cy - 30, 74, 60, ["Softmax"], **self.style("softmax", "output"))
                pc = self.line_color("probs")
                s.arrow(849, cy - 30, 849, 262, stroke=pc)
                s.lines(
                    849,
                    240,
                    lab["probs"],
                    size=11,
                    fill=INK if self.lit("probs") else GREY_TEXT,
                    weight="bold" if self.lit("probs") and w.lit is not None else None,
                )

        if w.loss:
            st = self.style("loss", "output")
            s.box(
                604,
                132,
                286,
                58,
                [
                    "Loss: cross-entropy of the probabilities",
                    "against the targets, shifted left:",
                    "a dog runs </s>",
                ],
                size=11,
                **st,
            )
            s.arrow(849, 226, 849, 191, stroke=st["stroke"])
        if w.feedback:
            fc = VERMILLION
            s.path(f"M849,{DEC_Y + 30} V428 H38 V{DEC_Y + 42}", stroke=fc, sw=2)
            s.text(
                440,
                444,
                "decoding: the word chosen from the probabilities becomes the next input",
                size=12,
                fill=INK,
            )


def draw_model(where: Where, title: str, desc: str) -> Svg:
    svg = Svg(900, 452 if where.feedback else 414, title, desc)
    _Model(svg, where).draw()
    return svg


ATTN = {"enc_attn", "dec_mattn", "dec_cattn"}
ALL = {
    "src",
    "tgt",
    "probs",
    "enc_emb",
    "dec_emb",
    "enc_pe",
    "dec_pe",
    "enc_stack",
    "dec_stack",
    "enc_res",
    "dec_res",
    "memory",
    "linear",
    "softmax",
    "enc_an1",
    "enc_an2",
    "enc_ffn",
    "dec_an1",
    "dec_an2",
    "dec_an3",
    "dec_ffn",
    *ATTN,
}
ARCH_DESC = (
    "The encoder-decoder Transformer, drawn left to right. Top row, the encoder: source tokens, "
    "input embedding, plus positional encoding, then an encoder layer repeated N times: "
    "multi-head self-attention, add & norm, feed-forward, add & norm, each sub-layer with a "
    "residual connection around it into its add & norm. Bottom row, the decoder: target tokens "
    "shifted right, output embedding, plus positional encoding, then a decoder layer repeated N "
    "times: masked multi-head self-attention, add & norm, multi-head cross-attention whose keys "
    "and values come from the encoder's output (the memory), add & norm, feed-forward, add & "
    "norm, again with residual connections; then a linear layer and a softmax give the "
    "next-token probabilities."
)

CHAPTERS = {
    1: Where(
        "Chapter 1: attention",
        ATTN | {"memory"},
        [
            "Every attention block computes",
            "softmax(QK^{T} / \u221ad_{k}) V: encoder",
            "self-attention, masked decoder",
            "self-attention, cross-attention.",
        ],
    ),
    2: Where(
        "Chapter 2: masks",
        ATTN,
        [
            "Causal mask: masked self-attention",
            "sees no later target word.",
            "Padding mask: no attention block",
            "looks at padding tokens.",
        ],
    ),
    3: Where(
        "Chapter 3: multi-head attention",
        ATTN | {"memory"},
        [
            "Each attention block runs h heads",
            "in parallel, each in a d_{k}-wide",
            "subspace, then concatenates them.",
        ],
        stacked_attention=True,
    ),
    4: Where(
        "Chapter 4: positional encoding",
        {"enc_pe", "dec_pe"},
        [
            "A sinusoid vector per position is",
            "added to each token's embedding:",
            "the only place word order enters.",
        ],
    ),
    5: Where(
        "Chapter 5: the layers and the whole model",
        {
            "enc_emb",
            "dec_emb",
            "enc_stack",
            "dec_stack",
            "enc_res",
            "dec_res",
            "enc_an1",
            "enc_an2",
            "enc_ffn",
            "dec_an1",
            "dec_an2",
            "dec_an3",
            "dec_ffn",
            "memory",
        },
        [
            "Embeddings, add & norm around every",
            "sub-layer (residual connections),",
            "feed-forward, N layers per stack.",
        ],
    ),
    6: Where(
        "Chapter 6: training",
        {"linear", "softmax", "probs", "tgt", "loss"},
        [
            "Linear + softmax give probabilities;",
            "training scores them against the",
            "next word (teacher forcing).",
        ],
        loss=True,
    ),
    7: Where(
        "Chapter 7: decoding",
        {"probs", "tgt", "softmax"},
        [
            "At inference the decoder runs once",
            "per word: its chosen output is",
            "appended to its input.",
        ],
        feedback=True,
    ),
    8: Where(
        "Chapter 8: translating German to English",
        ALL,
        ["The whole model, trained on German", "to English sentence pairs."],
        feedback=True,
        labels={
            "src": ["German", "tokens"],
            "tgt": ["English", "so far,", "shifted", "right"],
            "probs": ["next English", "word"],
        },
    ),
}

WHERE_TEXT = {
    1: "the three attention blocks (encoder self-attention, masked decoder self-attention and "
    "cross-attention) and the memory that feeds cross-attention",
    2: "the three attention blocks, which take masks: the causal mask in the decoder's masked "
    "self-attention and the padding mask wherever padded tokens could be attended to",
    3: "the three attention blocks, drawn as piles of cards because each runs several heads",
    4: "the two positional encodings added to the embeddings",
    5: "the embeddings, every add & norm with its residual connection, the feed-forward blocks "
    "and the two stacks of N layers",
    6: "the final linear layer and softmax, the target tokens, and a loss box comparing the "
    "probabilities with the targets shifted left",
    7: "an extra arrow from the softmax back to the decoder's input: at inference the chosen "
    "word becomes the next input",
    8: "everything, with German source tokens, English target tokens and the feedback arrow of "
    "decoding",
}


# =========================================================================== chapter pictures


def draw_attention_qkv() -> Svg:
    words = ["the", "cat", "sat", "down"]
    scores = [0.4, 2.2, 1.2, -0.3]  # illustrative q.k/sqrt(d_k) for the query of "sat"
    z = [math.exp(v) for v in scores]
    weights = [v / sum(z) for v in z]
    svg = Svg(
        860,
        330,
        "Attention for one query",
        "One query, from the word 'sat', is scored against the key of every word of 'the cat "
        "sat down': the score is the dot product q dot k_i divided by the square root of d_k. "
        "A softmax turns the four scores into weights that are positive and sum to 1. The "
        "output is the weighted sum of the four value vectors, so the word with the largest "
        "weight, 'cat', contributes most. The numbers are illustrative.",
    )
    s = svg
    cell = 15
    vals = [
        [0.6, -0.4, 0.2, 0.9],
        [0.9, 0.5, -0.7, 0.3],
        [-0.2, 0.8, 0.4, -0.6],
        [0.3, -0.8, -0.3, 0.5],
    ]

    def vector(x: float, y: float, values: list[float], color: str, alpha: float = 1.0) -> None:
        for j, v in enumerate(values):
            s.rect(
                x + j * cell,
                y,
                cell,
                cell,
                fill=tint(color, alpha * (0.25 + 0.6 * abs(v))),
                stroke=tint(INK, 0.6),
                sw=0.8,
                rx=1,
            )

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
    vector(180, 22, [0.7, 0.5, -0.6, 0.4], ORANGE)
    s.path("M210,38 V60 H258 V92", stroke=ORANGE, sw=1.6)
    s.text(266, 80, "compared with every key", size=11, anchor="start", fill=INK)
    top, step = 130, 44
    acc_y = top + 1.5 * step + 7
    for i, (wd, sc, a) in enumerate(zip(words, scores, weights)):
        y = top + i * step
        s.text(48, y + 11, f"\u201c{wd}\u201d", size=13, family=SANS)
        vector(95, y, vals[i], BLUE)
        s.arrow(160, y + 7, 220, y + 7, stroke=LINE)
        s.text(258, y + 12, f"{sc:+.1f}", size=13, family=MONO)
        s.arrow(292, y + 7, 350, y + 7, stroke=LINE)
        s.rect(360, y, 120, cell, fill="#ffffff", stroke=GREY_STROKE, sw=0.8, rx=1)
        s.rect(360, y, 120 * a, cell, fill=BLUE, stroke="none", sw=0, rx=1)
        s.text(490, y + 12, f"{a:.2f}", size=13, family=MONO, anchor="start")
        s.arrow(528, y + 7, 584, y + 7, stroke=LINE)
        vector(
            587,
            y,
            [v * a / max(weights) for v in vals[i]],
            GREEN,
            alpha=0.35 + 0.65 * a / max(weights),
        )
        s.path(
            f"M650,{y + 7} C690,{y + 7} 700,{num(acc_y)} 738,{num(acc_y)}",
            stroke=tint(LINE, 0.6),
            sw=1.2,
            arrow=i == 1,
        )
    out = [sum(a * v[j] for a, v in zip(weights, vals)) for j in range(4)]
    vector(750, acc_y - cell / 2, out, GREEN)
    s.text(780, acc_y + 30, "\u03a3 a_{i} v_{i}", size=12)
    s.text(
        430, top + 4 * step - 4, "the weights are positive and add up to 1", size=11, italic=True
    )
    s.text(
        10,
        322,
        "Numbers are illustrative; d_{k} is the length of q and k.",
        size=11,
        anchor="start",
        fill="#555555",
    )
    return svg


def _grid(
    s: Svg, x: float, y: float, tokens: list[str], allowed, title: str, subtitle: str
) -> None:
    c = 40
    n = len(tokens)
    s.text(x + n * c / 2, y - 62, title, size=13, weight="bold")
    s.text(x + n * c / 2, y - 46, subtitle, size=11, fill="#444444")
    for j, t in enumerate(tokens):  # keys across the top
        s.text(x + j * c + c / 2, y - 8, t, size=11, family=MONO)
    s.text(x + n * c / 2, y - 26, "key position \u2192", size=11, fill="#444444")
    for i, t in enumerate(tokens):
        s.text(x - 6, y + i * c + c / 2 + 4, t, size=11, family=MONO, anchor="end")
        for j in range(n):
            ok = allowed(i, j)
            cx, cy = x + j * c, y + i * c
            s.rect(
                cx,
                cy,
                c,
                c,
                fill=tint(BLUE, 0.55) if ok else "#ffffff",
                stroke="#777777",
                sw=0.8,
                rx=0,
            )
            if not ok:  # blocked cells carry a mark, not only a colour
                s.path(
                    f"M{cx + 11},{cy + 11} L{cx + c - 11},{cy + c - 11} M{cx + c - 11},{cy + 11} "
                    f"L{cx + 11},{cy + c - 11}",
                    stroke=VERMILLION,
                    sw=1.6,
                    arrow=False,
                )
    s.text(x - 22, y - 8, "query \u2193", size=11, fill="#444444", anchor="middle")


def draw_masks() -> Svg:
    svg = Svg(
        880,
        360,
        "Padding mask and causal mask",
        "Three 5 by 5 grids, rows are query positions and columns key positions; a filled cell "
        "means the query may attend to that key, a crossed cell that it may not. Left, the "
        "padding mask for the source 'ein Hund läuft <pad> <pad>': the two padding columns are "
        "blocked for every row. Middle, the causal mask for the target '<s> a dog runs </s>': "
        "the lower triangle including the diagonal is allowed, so each position sees itself "
        "and earlier positions only. Right, the decoder's mask for a padded target '<s> a dog "
        "<pad> <pad>': the causal mask and the padding mask combined with a logical and.",
    )
    src = ["ein", "Hund", "läuft", "<pad>", "<pad>"]
    tgt = ["<s>", "a", "dog", "runs", "</s>"]
    tgt_pad = ["<s>", "a", "dog", "<pad>", "<pad>"]
    _grid(svg, 60, 110, src, lambda i, j: j < 3, "Padding mask", "source: keys that are padding")
    _grid(svg, 360, 110, tgt, lambda i, j: j <= i, "Causal mask", "target: no later position")
    _grid(
        svg,
        660,
        110,
        tgt_pad,
        lambda i, j: j <= i and j < 3,
        "Both (decoder)",
        "causal AND padding",
    )
    y = 340
    svg.rect(200, y - 11, 14, 14, fill=tint(BLUE, 0.55), stroke="#777777", sw=0.8, rx=0)
    svg.text(220, y, "may attend (True)", size=12, anchor="start")
    svg.rect(400, y - 11, 14, 14, fill="#ffffff", stroke="#777777", sw=0.8, rx=0)
    svg.path(
        f"M403,{y - 8} L411,{y}  M411,{y - 8} L403,{y}", stroke=VERMILLION, sw=1.4, arrow=False
    )
    svg.text(
        420,
        y,
        "blocked (False): score set to \u2212\u221e before the softmax",
        size=12,
        anchor="start",
    )
    return svg


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


def draw_multihead() -> Svg:
    svg = Svg(
        900,
        360,
        "Multi-head attention",
        "Multi-head attention, left to right. The query, key and value inputs, each of shape "
        "(n, d_model), are projected by the learned matrices W^Q, W^K and W^V, and each result "
        "is split into h heads of width d_k = d_model / h, shape (h, n, d_k). Every head runs "
        "scaled dot-product attention on its own slice: its scores have shape (h, n, n) and its "
        "output (h, n, d_k). The heads are concatenated back to (n, d_model) and a last "
        "projection W^O gives the output, of shape (n, d_model).",
    )
    s = svg
    rows = [("Q", "query", 90), ("K", "key", 180), ("V", "value", 270)]
    for sym, name, cy in rows:
        s.text(10, cy - 6, f"{name} {sym}", size=13, anchor="start", weight="bold")
        s.text(10, cy + 12, "(n, d_model)", size=11, anchor="start", family=MONO)
        s.arrow(96, cy, 111, cy, stroke=LINE)
        s.box(112, cy - 20, 46, 40, [f"W^{{{sym}}}"], fill=tint(BLUE, 0.25), stroke=BLUE, size=14)
        s.arrow(158, cy, 253, cy, stroke=LINE)
        s.text(206, cy - 7, "(n, d_model)", size=11, family=MONO)
        _stack(s, 254, cy - 20, 60, 40, SKY, [f"{sym} heads"], size=12)
        s.text(284, cy + 35, "(h, n, d_k)", size=11, family=MONO)
        s.path(f"M328,{cy - 8} L{400 - 1},{num(180 + (cy - 180) * 0.45)}", stroke=LINE)
    s.text(284, 30, "split into h heads", size=12, weight="bold")
    s.text(284, 45, "of width d_{k} = d_model / h", size=11)
    # one attention per head
    _stack(
        s,
        400,
        120,
        150,
        120,
        BLUE,
        ["scaled dot-product", "attention,", "one per head", "", "softmax(QK^{T}/\u221ad_{k})V"],
        size=12,
    )
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
    s.text(
        10,
        345,
        "Base model: d_model = 512, h = 8 heads, d_k = 64.  n = number of tokens.",
        size=12,
        anchor="start",
        fill="#444444",
    )
    return svg


def _lcg(seed: int):
    """A tiny deterministic generator of floats in [-1, 1) (no `random`: stable everywhere)."""
    state = seed
    while True:
        state = (1103515245 * state + 12345) % 2**31
        yield state / 2**30 - 1


def _diverging(v: float, limit: float) -> str:
    t = max(-1.0, min(1.0, v / limit))
    return tint(ORANGE if t > 0 else BLUE, abs(t) * 0.95)


def draw_pe_add() -> Svg:
    d, words = 8, ["ein", "Hund", "läuft", "schnell"]
    gen = _lcg(7)
    emb = [[round(1.2 * next(gen), 2) for _ in range(d)] for _ in words]  # ~ unit scale
    pe = [
        [
            math.sin(p / 10000 ** (i / d)) if i % 2 == 0 else math.cos(p / 10000 ** ((i - 1) / d))
            for i in range(d)
        ]
        for p in range(len(words))
    ]
    total = [[a + b for a, b in zip(e, q)] for e, q in zip(emb, pe)]
    svg = Svg(
        840,
        350,
        "Token embedding plus positional encoding",
        "Three groups of four small column vectors, one column per position of the source "
        "'ein Hund läuft schnell', with d_model = 8 cells each, coloured from blue (negative) "
        "through white to orange (positive). Left, the token embeddings multiplied by the "
        "square root of d_model; middle, the sinusoidal positional encodings, which alternate "
        "sine and cosine down the column and change slowly for the lower dimensions; right, "
        "their sum, which is what the first encoder layer receives. The embedding values are "
        "illustrative; the encodings are the real sinusoids for positions 0 to 3.",
    )
    s = svg
    cw, ch, gap = 26, 20, 22
    group_w = 4 * cw + 3 * gap
    starts = [110, 110 + group_w + 70, 110 + 2 * (group_w + 70)]
    titles = [
        ["token embedding", "\u00d7 \u221ad_model"],
        ["positional", "encoding"],
        ["encoder input", ""],
    ]
    top = 80
    for g, (x0, data) in enumerate(zip(starts, (emb, pe, total))):
        s.lines(x0 + group_w / 2, 40, [t for t in titles[g] if t], size=13, weight="bold")
        for p, col in enumerate(data):
            x = x0 + p * (cw + gap)
            s.text(x + cw / 2, top - 8, f"pos {p}", size=10, fill="#444444")
            for i, v in enumerate(col):
                s.rect(
                    x, top + i * ch, cw, ch, fill=_diverging(v, 2.0), stroke="#888888", sw=0.6, rx=0
                )
            s.text(x + cw / 2, top + d * ch + 16, words[p], size=11, family=MONO)
    for i in range(d):
        s.text(100, top + i * ch + 14, f"{i}", size=10, anchor="end", fill="#444444")
    s.text(100, top - 8, "dim", size=10, anchor="end", fill="#444444")
    opx = [starts[0] + group_w + 35, starts[1] + group_w + 35]
    for x, op in zip(opx, ["+", "="]):
        s.text(x, top + d * ch / 2 + 10, op, size=30, weight="bold")
    # colour scale
    y = 312
    for k in range(21):
        v = -2 + 0.2 * k
        s.rect(300 + k * 12, y, 12, 12, fill=_diverging(v, 2.0), stroke="none", sw=0, rx=0)
    s.rect(300, y, 252, 12, fill="none", stroke="#888888", sw=0.6, rx=0)
    s.text(300, y + 28, "\u22122", size=11)
    s.text(426, y + 28, "0", size=11)
    s.text(552, y + 28, "+2", size=11)
    s.text(290, y + 10, "value", size=11, anchor="end")
    s.text(
        10,
        294,
        "PE(pos, 2i) = sin(pos / 10000^{2i/d_model}),  "
        "PE(pos, 2i+1) = cos(pos / 10000^{2i/d_model})",
        size=12,
        anchor="start",
    )
    return svg


def draw_shapes() -> Svg:
    svg = Svg(
        900,
        320,
        "Every shape from tokens to logits",
        "The shapes of one sentence of n tokens through the Transformer, in two rows. Tokens "
        "(n) are embedded to X, (n, d_model); projected and split into Q, K and V per head, "
        "each (n, d_k); the scores of one head are (n, n); the heads' outputs concatenated are "
        "(n, d_model); the feed-forward hidden layer is (n, d_ff); the layer's output is "
        "(n, d_model) again; the final linear layer gives logits (n, V), one score per "
        "vocabulary word. With the base model's numbers: (n, 512), (n, 64) per head for 8 "
        "heads, (n, n), (n, 512), (n, 2048), (n, 512), (n, V).",
    )
    s = svg
    stages = [
        ("tokens", "(n)", "n word ids"),
        ("embeddings X", "(n, d_model)", "(n, 512)"),
        ("Q, K, V per head", "(n, d_k)", "(n, 64), 8 heads"),
        ("scores per head", "(n, n)", "(n, n), 8 heads"),
        ("heads concatenated", "(n, d_model)", "(n, 512)"),
        ("feed-forward hidden", "(n, d_ff)", "(n, 2048)"),
        ("layer output", "(n, d_model)", "(n, 512)"),
        ("logits", "(n, V)", "(n, V)"),
    ]
    ops = [
        ["embed,", "\u00d7\u221ad_model,", "+ PE"],
        ["W^{Q}, W^{K}, W^{V}", "split in h"],
        ["Q K^{T} / \u221ad_{k}"],
        None,  # drawn on the link between the rows
        ["W_{1}, ReLU"],
        ["W_{2}, add", "& norm"],
        ["\u00d7N layers,", "Linear"],
    ]
    bw, bh, gap = 158, 74, 72
    x0 = 13
    rows_y = [60, 200]
    boxes = []
    for k, (name, sym, base) in enumerate(stages):
        r, c = divmod(k, 4)
        x, y = x0 + c * (bw + gap), rows_y[r]
        color = [PURPLE, PURPLE, BLUE, BLUE, BLUE, GREEN, GREEN, VERMILLION][k]
        s.rect(x, y, bw, bh, fill=tint(color, 0.2), stroke=color, sw=1.4)
        for row, size in ((name, 12), (sym, 13), (base, 11)):
            if text_width(row, size, MONO if row is not name else SANS) > bw - 8:
                raise ValueError(f"{row!r} is too wide for its box")
        s.text(x + bw / 2, y + 22, name, size=12, weight="bold")
        s.text(x + bw / 2, y + 44, sym, size=13, family=MONO)
        s.text(x + bw / 2, y + 63, base, size=11, family=MONO, fill="#555555")
        boxes.append((x, y))
    for k, op in enumerate(ops):
        if op is None:
            continue
        (xa, ya), (xb, _) = boxes[k], boxes[k + 1]
        cy = ya + bh / 2
        s.arrow(xa + bw, cy, xb - 1, cy, stroke=LINE)
        for row in op:
            if text_width(row, 11) > gap + 2:
                raise ValueError(f"{row!r} is too wide for the gap")
        s.lines((xa + bw + xb) / 2, cy - 10 - 7 * (len(op) - 1), op, size=11, fill="#333333")
    # from the scores (end of row 1) to the concatenation (start of row 2)
    (xa, ya), (xb, yb) = boxes[3], boxes[4]
    mid = (ya + bh + yb) / 2
    s.path(f"M{xa + bw / 2},{ya + bh} V{mid} H{xb + bw / 2} V{yb - 1}", stroke=LINE)
    s.text(
        (xa + xb + bw) / 2,
        mid - 6,
        "softmax, weights \u00d7 V: (n, d_k) per head; concatenate the h heads",
        size=11,
        fill="#333333",
    )
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
        fill="#444444",
    )
    return svg


def _token(s: Svg, cx: float, cy: float, t: str, color: str, w: float = 54) -> None:
    s.box(
        cx - w / 2, cy - 11, w, 22, [t], fill=tint(color, 0.2), stroke=color, size=12, family=MONO
    )


def draw_teacher_forcing() -> Svg:
    svg = Svg(
        900,
        360,
        "Teacher forcing versus autoregressive decoding",
        "Left, training with teacher forcing: the whole target shifted right, '<s> a dog "
        "runs', enters the decoder at once; under the causal mask each position predicts the "
        "next word, so 'a dog runs </s>' come out in parallel and are all compared with the "
        "true next words. Right, decoding at inference: one step per word. Step 1 reads <s> "
        "and outputs 'a'; each output is fed back and appended to the input, so step 2 reads "
        "'<s> a' and outputs 'dog', step 3 outputs 'runs' and step 4 outputs '</s>'.",
    )
    s = svg
    ins = ["<s>", "a", "dog", "runs"]
    outs = ["a", "dog", "runs", "</s>"]
    # --- left: training
    s.text(200, 24, "Training: teacher forcing", size=14, weight="bold")
    s.text(200, 42, "one pass: every position predicts its next word", size=12, fill="#444444")
    xs = [70 + 86 * i for i in range(4)]
    s.rect(40, 130, 320, 96, fill=tint(BLUE, 0.15), stroke=BLUE, sw=1.4)
    s.text(200, 150, "decoder (causal mask)", size=12, weight="bold")
    # a small causal-mask icon
    for i in range(4):
        for j in range(4):
            s.rect(
                178 + 11 * j,
                158 + 11 * i,
                11,
                11,
                fill=tint(BLUE, 0.6) if j <= i else "#ffffff",
                stroke="#777777",
                sw=0.5,
                rx=0,
            )
    s.text(200, 218, "position i sees inputs 1 \u2026 i", size=11, fill="#333333")
    for x, a, b in zip(xs, ins, outs):
        _token(s, x, 290, a, PURPLE)
        s.arrow(x, 278, x, 228, stroke=LINE)
        s.arrow(x, 130, x, 88, stroke=LINE)
        _token(s, x, 76, b, VERMILLION)
    s.text(200, 324, "input: the target shifted right;", size=12)
    s.text(200, 341, "outputs: scored against the next words", size=12)
    # --- right: decoding
    s.path("M430,20 V340", stroke="#cccccc", sw=1, arrow=False)
    s.text(672, 24, "Decoding: one token at a time", size=14, weight="bold")
    s.text(672, 42, "each output is fed back as the next input", size=12, fill="#444444")
    cols = [478 + 120 * i for i in range(4)]
    for t, x in enumerate(cols):
        s.text(x, 66, f"step {t + 1}", size=12, weight="bold")
        _token(s, x, 94, outs[t], VERMILLION)
        s.arrow(x, 148, x, 106, stroke=LINE)
        s.box(x - 42, 148, 84, 40, ["decoder"], fill=tint(BLUE, 0.15), stroke=BLUE)
        ys = [214 + 26 * k for k in range(t + 1)]
        for k, y in enumerate(ys):
            _token(s, x, y, ins[k], PURPLE, w=48)
        s.arrow(x, 203, x, 189, stroke=LINE)
        if t + 1 < len(cols):
            # the output goes back in: from this step's output to the next step's newest input
            nx, ny = cols[t + 1], 214 + 26 * (t + 1)
            s.path(f"M{x + 27},94 H{x + 61} V{ny} H{nx - 25}", stroke=VERMILLION, sw=1.6)
    s.text(
        672,
        336,
        "tokens so far (the newest one was the last step's output)",
        size=11,
        fill="#333333",
    )
    return svg


def draw_kv_cache() -> Svg:
    svg = Svg(
        880,
        400,
        "The key/value cache during decoding",
        "Four decoding steps, one per row. At step t only the newest token is run through the "
        "layer: its query q_t, key and value are computed (highlighted). The keys and values "
        "of the earlier tokens are read from the cache, which grows by one column per step: "
        "one column at step 1, four at step 4. The query is scored against all t keys, and "
        "the softmax weights mix the t values into one output vector for the new token.",
    )
    s = svg
    words = ["<s>", "a", "dog", "runs"]
    cell, n_cells = 14, 4

    def column(x: float, y: float, color: str, new: bool) -> None:
        for j in range(n_cells):
            s.rect(
                x,
                y + j * cell,
                cell,
                cell,
                fill=tint(color, 0.75 if new else 0.22),
                stroke=color if new else tint(color, 0.6),
                sw=1.2 if new else 0.8,
                rx=0,
            )

    heads = [
        (70, "step: new token"),
        (190, "new query"),
        (360, "keys K"),
        (560, "values V"),
        (760, "output"),
    ]
    for x, h in heads:
        s.text(x, 30, h, size=12, weight="bold")
    s.text(460, 48, "cache: one column per token so far", size=11, fill="#444444")
    top, step = 66, 72
    for t in range(4):
        y = top + t * step
        s.text(20, y + 26, f"{t + 1}:", size=12, anchor="start", weight="bold")
        s.text(44, y + 33, words[t], size=13, family=MONO, anchor="start")
        s.arrow(100, y + 28, 180, y + 28, stroke=LINE)
        column(183, y, ORANGE, True)
        s.text(205, y + 33, f"q_{{{t + 1}}}", size=12, anchor="start")
        for x0, color in ((300, BLUE), (500, GREEN)):
            for j in range(t + 1):
                column(x0 + j * (cell + 8), y, color, j == t)
            s.text(
                x0 + (t + 1) * (cell + 8) + 4,
                y + 33,
                "new" if t == 0 else "+1 new",
                size=11,
                anchor="start",
                fill=INK,
            )
        s.arrow(640, y + 28, 748, y + 28, stroke=LINE)
        s.text(694, y + 20, f"attend over {t + 1}", size=11)
        column(753, y, GREEN, True)
    y = top + 4 * step - 4
    s.rect(300, y, 12, 12, fill=tint(BLUE, 0.75), stroke=BLUE, sw=1.2, rx=0)
    s.text(318, y + 10, "computed at this step", size=12, anchor="start")
    s.rect(500, y, 12, 12, fill=tint(BLUE, 0.22), stroke=tint(BLUE, 0.6), sw=0.8, rx=0)
    s.text(518, y + 10, "read from the cache", size=12, anchor="start")
    s.text(
        10,
        y + 38,
        "Per step, every layer computes one new key and value instead of t: "
        "the work per step no longer grows with t.",
        size=12,
        anchor="start",
        fill="#333333",
    )
    return svg


def _edge(x0: float, y0: float, cx: float, cy: float, r: float) -> tuple[float, float]:
    """The point where the line from (x0, y0) to the centre (cx, cy) meets a circle of radius r."""
    dx, dy = cx - x0, cy - y0
    d = math.hypot(dx, dy)
    return cx - dx * r / d, cy - dy * r / d


def draw_path_length() -> Svg:
    svg = Svg(
        860,
        580,
        "Maximum path length: recurrent layer versus self-attention",
        "Two panels for a sequence of n = 6 tokens x1 to x6. Top, a recurrent layer: each "
        "input x_i enters a state h_i, and the states are chained left to right, h1 to h2 to "
        "h6; information from x1 reaches h6 only along the highlighted chain of 5 sequential "
        "steps, so the path length is n - 1 and the steps cannot run in parallel. Bottom, a "
        "self-attention layer: faint lines join every input to every output y1 to y6, and the "
        "highlighted line goes straight from x1 to y6: y6 attends to x1 directly, a path of "
        "length 1. All n outputs are computed at once from n squared scores, with no "
        "sequential steps.",
    )
    s = svg
    accent, faint = VERMILLION, "#d4d4d4"
    xs = [170 + 104 * i for i in range(6)]
    r, bw, bh = 20, 56, 34  # circle radius, token box width and height

    def tokens(cy: float) -> None:
        for i, x in enumerate(xs):
            s.box(
                x - bw / 2,
                cy - bh / 2,
                bw,
                bh,
                [f"x_{{{i + 1}}}"],
                fill=tint(PURPLE, 0.2),
                stroke=accent if i == 0 else PURPLE,
                sw=2.4 if i == 0 else 1.2,
                size=18,
                family=MONO,
            )

    def nodes(cy: float, sym: str, color: str) -> None:
        for i, x in enumerate(xs):
            last = i == len(xs) - 1
            stroke, sw = (accent, 2.4) if last else (color, 1.2)
            s.circle(x, cy, r, tint(color, 0.22), stroke=stroke, sw=sw)
            s.text(x, cy + 18 * 0.35, f"{sym}_{{{i + 1}}}", size=18, family=MONO)

    def row_labels(top: float, top_label: str, bottom: float) -> None:
        s.text(30, top + 5, top_label, size=13, anchor="start", fill="#444444")
        s.text(30, bottom + 5, "inputs", size=13, anchor="start", fill="#444444")

    # --- top: a recurrent layer
    s.text(430, 30, "Recurrent layer: path length n \u2212 1", size=15, weight="bold")
    hy, xy = 118, 190
    s.text(430, 70, "5 sequential steps from x1 to h6", size=14, weight="bold", fill=accent)
    row_labels(hy, "states", xy)
    nodes(hy, "h", GREEN)
    tokens(xy)
    for i, x in enumerate(xs):
        s.arrow(x, xy - bh / 2, x, hy + r + 1, stroke=LINE)
        if i + 1 < len(xs):
            s.arrow(x + r, hy, xs[i + 1] - r - 1, hy, stroke=accent, sw=2.4)
            s.text((x + xs[i + 1]) / 2, hy - 9, f"{i + 1}", size=13, weight="bold", fill=accent)
    s.text(
        430,
        240,
        "each state needs the one before it: the steps run one after another",
        size=13,
        fill="#444444",
        italic=True,
    )
    s.path("M20,264 H840", stroke="#cccccc", sw=1, arrow=False)

    # --- bottom: a self-attention layer
    s.text(430, 294, "Self-attention layer: path length 1", size=15, weight="bold")
    yy, xy = 370, 500
    s.text(
        xs[-1] + r,
        334,
        "1 step: y6 attends to x1 directly",
        size=14,
        anchor="end",
        weight="bold",
        fill=accent,
    )
    row_labels(yy, "outputs", xy)
    for x0 in xs:  # every input to every output, faint
        for cx in xs:
            ex, ey = _edge(x0, xy - bh / 2, cx, yy, r)
            s.arrow(x0, xy - bh / 2, ex, ey, stroke=faint, sw=0.9, arrow=False)
    ex, ey = _edge(xs[0], xy - bh / 2, xs[-1], yy, r + 1)
    s.arrow(xs[0], xy - bh / 2, ex, ey, stroke=accent, sw=2.4)
    nodes(yy, "y", BLUE)
    tokens(xy)
    s.text(
        430,
        552,
        "all n outputs at once: n\u00b2 scores, no sequential steps",
        size=13,
        fill="#444444",
        italic=True,
    )
    return svg


# =========================================================================== all files


def drawings() -> dict[str, str]:
    """File name -> SVG text, for every drawing of the book."""
    out = {
        "architecture.svg": draw_model(
            Where("The Transformer: the encoder (top) feeds the decoder (bottom)"),
            "The encoder-decoder Transformer",
            ARCH_DESC,
        ).render()
    }
    for n, where in CHAPTERS.items():
        desc = (
            f"Where chapter {n} sits in the model. {ARCH_DESC} Highlighted in colour: "
            f"{WHERE_TEXT[n]}; the rest is grey."
        )
        out[f"where_{n:02d}.svg"] = draw_model(where, where.heading, desc).render()
    out["attention_qkv.svg"] = draw_attention_qkv().render()
    out["masks.svg"] = draw_masks().render()
    out["multihead.svg"] = draw_multihead().render()
    out["pe_add.svg"] = draw_pe_add().render()
    out["shapes.svg"] = draw_shapes().render()
    out["teacher_forcing.svg"] = draw_teacher_forcing().render()
    out["kv_cache.svg"] = draw_kv_cache().render()
    out["path_length.svg"] = draw_path_length().render()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a drawing is stale")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the SVG files")
    args = parser.parse_args(argv)
    stale = []
    for name, text in drawings().items():
        path = args.out / name
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(
            f"stale drawings in {args.out} (run python tools/draw_figures.py): " + ", ".join(stale)
        )
        return 1
    if not args.check:
        print(f"wrote {len(stale)} drawing(s) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
