"""Drawings of chapters 6-7: teacher forcing against decoding, the key/value cache
(hand-written)."""

from __future__ import annotations

from .svg import (
    ANNOTATION,
    BLUE,
    DIVIDER,
    GREEN,
    GRID,
    INK,
    LINE,
    MONO,
    MUTED,
    ORANGE,
    PURPLE,
    VERMILLION,
    Svg,
    tint,
)

INPUTS = ["<s>", "a", "dog", "runs"]  # the target shifted right
OUTPUTS = ["a", "dog", "runs", "</s>"]  # the next words


def _token(s: Svg, cx: float, cy: float, t: str, color: str, w: float = 56) -> None:
    """A token in a small box centred on (cx, cy)."""
    s.box(
        cx - w / 2, cy - 12, w, 24, [t], fill=tint(color, 0.2), stroke=color, size=15, family=MONO
    )


# =========================================================================== teacher_forcing.svg

TEACHER_FORCING_DESC = (
    "Left, training with teacher forcing: the whole target shifted right, '<s> a dog "
    "runs', enters the decoder at once; under the causal mask each position predicts the "
    "next word, so 'a dog runs </s>' come out in parallel and are all compared with the "
    "true next words. Right, decoding at inference: one step per word. Step 1 reads <s> "
    "and outputs 'a'; each output is fed back and appended to the input, so step 2 reads "
    "'<s> a' and outputs 'dog', step 3 outputs 'runs' and step 4 outputs '</s>'."
)


def draw_teacher_forcing() -> Svg:
    """Chapters 6 and 7: training with teacher forcing (left), decoding (right)."""
    s = Svg(740, 356, "Teacher forcing versus autoregressive decoding", TEACHER_FORCING_DESC)
    _training(s)
    s.path("M372,14 V342", stroke=DIVIDER, sw=1, arrow=False)
    _decoding(s)
    return s


def _training(s: Svg) -> None:
    """One pass of the decoder over the whole shifted target, every output at once."""
    s.text(185, 24, "Training: teacher forcing", size=16, weight="bold")
    s.text(185, 44, "one pass, all positions at once", size=15, fill=MUTED)
    s.rect(20, 128, 330, 104, fill=tint(BLUE, 0.15), stroke=BLUE, sw=1.4)
    s.text(185, 150, "decoder (causal mask)", size=15, weight="bold")
    for i in range(4):  # a small causal-mask icon
        for j in range(4):
            fill = tint(BLUE, 0.6) if j <= i else "#ffffff"
            s.rect(163 + 11 * j, 158 + 11 * i, 11, 11, fill=fill, stroke=GRID, sw=0.5, rx=0)
    s.text(185, 222, "position i sees inputs 0 \u2026 i", size=15, fill=ANNOTATION)
    for x, a, b in zip([50 + 90 * i for i in range(4)], INPUTS, OUTPUTS):
        _token(s, x, 290, a, PURPLE)
        s.arrow(x, 278, x, 234, stroke=LINE)
        s.arrow(x, 128, x, 93, stroke=LINE)
        _token(s, x, 80, b, VERMILLION)
    s.text(185, 328, "input: the target shifted right;", size=15)
    s.text(185, 347, "outputs: scored against the next words", size=15)


def _decoding(s: Svg) -> None:
    """Four steps, each output fed back as the newest input of the next step."""
    s.text(556, 24, "Decoding: one token at a time", size=16, weight="bold")
    s.text(556, 44, "each output is fed back in", size=15, fill=MUTED)
    cols = [425 + 90 * i for i in range(4)]
    for t, x in enumerate(cols):
        s.text(x, 72, f"step {t + 1}", size=15, weight="bold")
        _token(s, x, 98, OUTPUTS[t], VERMILLION)
        s.arrow(x, 148, x, 111, stroke=LINE)
        s.box(x - 36, 148, 72, 40, ["decoder"], fill=tint(BLUE, 0.15), stroke=BLUE, size=15)
        for k in range(t + 1):
            _token(s, x, 214 + 28 * k, INPUTS[k], PURPLE)
        s.arrow(x, 202, x, 189, stroke=LINE)
        if t + 1 < len(cols):
            # the output goes back in: from this step's output to the next step's newest input
            nx, ny = cols[t + 1], 214 + 28 * (t + 1)
            s.path(f"M{x + 28},98 H{x + 45} V{ny} H{nx - 29}", stroke=VERMILLION, sw=1.6)
    s.text(556, 330, "tokens so far; the newest one", size=15, fill=ANNOTATION)
    s.text(556, 349, "is the last step's output", size=15, fill=ANNOTATION)


# =========================================================================== kv_cache.svg

KV_DESC = (
    "Four decoding steps, one per row. At step t only the newest token is run through the "
    "layer: its query q_t, key and value are computed (highlighted). The keys and values "
    "of the earlier tokens are read from the cache, which grows by one column per step: "
    "one column at step 1, four at step 4. The query is scored against all t keys, and "
    "the softmax weights mix the t values into one output vector for the new token."
)
KV_CELL, KV_CELLS = 14, 4  # side of a cell, cells per vector
KV_TOP, KV_STEP = 76, 72  # top of the first step's row, distance between rows
KV_KEYS, KV_VALUES, KV_OUT = 200, 390, 666  # left edges of the keys, values, output columns


def _kv_column(s: Svg, x: float, y: float, color: str, new: bool) -> None:
    """A vector standing up: strong if computed at this step, pale if read from the cache."""
    for j in range(KV_CELLS):
        s.rect(
            x,
            y + j * KV_CELL,
            KV_CELL,
            KV_CELL,
            fill=tint(color, 0.75 if new else 0.22),
            stroke=color if new else tint(color, 0.6),
            sw=1.2 if new else 0.8,
            rx=0,
        )


def draw_kv_cache() -> Svg:
    """Chapter 7: four decoding steps, the cache of keys and values growing one column each."""
    s = Svg(740, 440, "The key/value cache during decoding", KV_DESC)
    heads = [
        (48, ["step:", "new token"]),
        (140, ["new", "query"]),
        (KV_KEYS + 70, ["keys K"]),
        (KV_VALUES + 70, ["values V"]),
        (KV_OUT + 7, ["output"]),
    ]
    for x, rows in heads:
        for k, row in enumerate(reversed(rows)):
            s.text(x, 40 - 18 * k, row, size=15, weight="bold")
    s.text(345, 62, "cache: one column per token so far", size=15, fill=MUTED)
    for t in range(4):
        _kv_step(s, t, KV_TOP + t * KV_STEP)
    y = KV_TOP + 4 * KV_STEP + 4
    s.rect(160, y, 13, 13, fill=tint(BLUE, 0.75), stroke=BLUE, sw=1.2, rx=0)
    s.text(180, y + 12, "computed at this step", size=15, anchor="start")
    s.rect(420, y, 13, 13, fill=tint(BLUE, 0.22), stroke=tint(BLUE, 0.6), sw=0.8, rx=0)
    s.text(440, y + 12, "read from the cache", size=15, anchor="start")
    for k, line in enumerate(
        [
            "Per step, every layer computes one new key and value instead of t;",
            "only attending over the t cached keys still grows with t.",
        ]
    ):
        s.text(10, y + 44 + 19 * k, line, size=15, anchor="start", fill=ANNOTATION)
    return s


def _kv_step(s: Svg, t: int, y: float) -> None:
    """Step t + 1: the new token, its query, the t + 1 keys and values, the output."""
    s.text(8, y + 33, f"{t + 1}:", size=15, anchor="start", weight="bold")
    s.text(30, y + 33, INPUTS[t], size=15, family=MONO, anchor="start")
    s.arrow(80, y + 28, 118, y + 28, stroke=LINE)
    _kv_column(s, 121, y, ORANGE, True)
    s.text(141, y + 33, f"q_{{{t + 1}}}", size=15, anchor="start")
    for x0, color in ((KV_KEYS, BLUE), (KV_VALUES, GREEN)):
        for j in range(t + 1):
            _kv_column(s, x0 + j * (KV_CELL + 8), y, color, j == t)
        new = "new" if t == 0 else "+1 new"
        s.text(x0 + (t + 1) * (KV_CELL + 8) + 2, y + 33, new, size=15, anchor="start", fill=INK)
    s.arrow(552, y + 28, KV_OUT - 4, y + 28, stroke=LINE)
    s.text(607, y + 20, "attend", size=15)
    _kv_column(s, KV_OUT, y, GREEN, True)
