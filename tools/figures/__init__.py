"""The book's explanatory drawings, as SVG text (hand-written; standard library only).

`svg` is the small drawing library; every other module draws the figures of one chapter or
topic. `drawings()` lists them all; `tools/draw_figures.py` writes them to book/figures/.
"""

from __future__ import annotations

from .attention import draw_attention_qkv, draw_masks, draw_multihead
from .decoding import draw_kv_cache, draw_teacher_forcing
from .history import draw_bahdanau, draw_seq2seq
from .path_length import draw_path_length
from .positional import draw_pe_add
from .residual import draw_norm_placement
from .shapes import draw_shapes
from .where import model_drawings

# File name -> the function that draws it, in the chapters' order (after the model drawings).
CHAPTER_DRAWINGS = {
    "seq2seq.svg": draw_seq2seq,  # chapter 1
    "bahdanau.svg": draw_bahdanau,  # chapter 1
    "attention_qkv.svg": draw_attention_qkv,  # chapter 1
    "masks.svg": draw_masks,  # chapter 2
    "multihead.svg": draw_multihead,  # chapter 3
    "pe_add.svg": draw_pe_add,  # chapter 4
    "norm_placement.svg": draw_norm_placement,  # chapter 5
    "shapes.svg": draw_shapes,  # chapter 5
    "teacher_forcing.svg": draw_teacher_forcing,  # chapters 6 and 7
    "kv_cache.svg": draw_kv_cache,  # chapter 7
    "path_length.svg": draw_path_length,  # chapter 10
}


def drawings() -> dict[str, str]:
    """File name -> SVG text, for every drawing of the book."""
    out = model_drawings()  # architecture.svg and where_01.svg ... where_08.svg
    for name, draw in CHAPTER_DRAWINGS.items():
        out[name] = draw().render()
    return out
