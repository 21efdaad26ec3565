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


def _token(s: Svg, cx: float, cy: float, t: str, color: str, w: float = 54) -> None:
    """A token in a small box centred on (cx, cy)."""
    s.box(
        cx - w / 2, cy - 11, w, 22, [t], fill=tint(color, 0.2), stroke=color, size=12, family=MONO
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
    s = Svg(900, 360, "Teacher forcing versus autoregressive decoding", TEACHER_FORCING_DESC)
    _training(s)
    s.path("M430,20 V340", stroke=DIVIDER, sw=1, arrow=False)
    _decoding(s)
    return s


def _training(s: Svg) -> None:
    """One pass of the decoder over the whole shifted target, every output at once."""
    s.text(200, 24, "Training: teacher forcing", size=14, weight="bold")
    s.text(200, 42, "one pass: every position predicts its next word", size=12, fill=MUTED)
    s.rect(40, 130, 320, 96, fill=tint(BLUE, 0.15), stroke=BLUE, sw=1.4)
    s.text(200, 150, "decoder (causal mask)", size=12, weight="bold")
    for i in range(4):  # a small causal-mask icon
        for j in range(4):
            fill = tint(BLUE, 0.6) if j <= i else "#ffffff"
            s.rect(178 + 11 * j, 158 + 11 * i, 11, 11, fill=fill, stroke=GRID, sw=0.5, rx=0)
    s.text(200, 218, "position i sees inputs 1 \u2026 i", size=11, fill=ANNOTATION)
    for x, a, b in zip([70 + 86 * i for i in range(4)], INPUTS, OUTPUTS):
        _token(s, x, 290, a, PURPLE)
        s.arrow(x, 278, x, 228, stroke=LINE)
        s.arrow(x, 130, x, 88, stroke=LINE)
        _token(s, x, 76, b, VERMILLION)
    s.text(200, 324, "input: the target shifted right;", size=12)
    s.text(200, 341, "outputs: scored against the next words", size=12)


def _decoding(s: Svg) -> None:
    """Four steps, each output fed back as the newest input of the next step."""
    s.text(672, 24, "Decoding: one token at a time", size=14, weight="bold")
    s.text(672, 42, "each output is fed back as the next input", size=12, fill=MUTED)
    cols = [478 + 120 * i for i in range(4)]
    for t, x in enumerate(cols):
        s.text(x, 66, f"step {t + 1}", size=12, weight="bold")
        _token(s, x, 94, OUTPUTS[t], VERMILLION)
        s.arrow(x, 148, x, 106, stroke=LINE)
        s.box(x - 42, 148, 84, 40, ["decoder"], fill=tint(BLUE, 0.15), stroke=BLUE)
        for k in range(t + 1):
            _token(s, x, 214 + 26 * k, INPUTS[k], PURPLE, w=48)
        s.arrow(x, 203, x, 189, stroke=LINE)
        if t + 1 < len(cols):
            # the output goes back in: from this step's output to the next step's newest input
            nx, ny = cols[t + 1], 214 + 26 * (t + 1)
            s.path(f"M{x + 27},94 H{x + 61} V{ny} H{nx - 25}", stroke=VERMILLION, sw=1.6)
    note = "tokens so far (the newest one was the last step's output)"
    s.text(672, 336, note, size=11, fill=ANNOTATION)


# =========================================================================== kv_cache.svg

KV_DESC = (
    "Four decoding steps, one per row. At step t only the newest token is run through the "
    "layer: its query q_t, key and value are computed (highlighted). The keys and values "
    "of the earlier tokens are read from the cache, which grows by one column per step: "
    "one column at step 1, four at step 4. The query is scored against all t keys, and "
    "the softmax weights mix the t values into one output vector for the new token."
)
KV_CELL, KV_CELLS = 14, 4  # side of a cell, cells per vector
KV_TOP, KV_STEP = 66, 72  # top of the first step's row, distance between rows


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
    s = Svg(880, 400, "The key/value cache during decoding", KV_DESC)
    heads = [
        (70, "step: new token"),
        (190, "new query"),
        (360, "keys K"),
        (560, "values V"),
        (760, "output"),
    ]
    for x, h in heads:
        s.text(x, 30, h, size=12, weight="bold")
    s.text(460, 48, "cache: one column per token so far", size=11, fill=MUTED)
    for t in range(4):
        _kv_step(s, t, KV_TOP + t * KV_STEP)
    y = KV_TOP + 4 * KV_STEP - 4
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
        fill=ANNOTATION,
    )
    return s


def _kv_step(s: Svg, t: int, y: float) -> None:
    """Step t + 1: the new token, its query, the t + 1 keys and values, the output."""
    s.text(20, y + 26, f"{t + 1}:", size=12, anchor="start", weight="bold")
    s.text(44, y + 33, INPUTS[t], size=13, family=MONO, anchor="start")
    s.arrow(100, y + 28, 180, y + 28, stroke=LINE)
    _kv_column(s, 183, y, ORANGE, True)
    s.text(205, y + 33, f"q_{{{t + 1}}}", size=12, anchor="start")
    for x0, color in ((300, BLUE), (500, GREEN)):
        for j in range(t + 1):
            _kv_column(s, x0 + j * (KV_CELL + 8), y, color, j == t)
        new = "new" if t == 0 else "+1 new"
        s.text(x0 + (t + 1) * (KV_CELL + 8) + 4, y + 33, new, size=11, anchor="start", fill=INK)
    s.arrow(640, y + 28, 748, y + 28, stroke=LINE)
    s.text(694, y + 20, f"attend over {t + 1}", size=11)
    _kv_column(s, 753, y, GREEN, True)
