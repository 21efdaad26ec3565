"""What each chapter's "where we are" drawing highlights (hand-written).

The landing page's `architecture.svg` shows the whole model in colour; `where_NN.svg` shows it
with chapter NN's parts in colour and the rest grey, plus a note on what the chapter adds.
Part names are those of `model.py`: `enc_`/`dec_` + a sub-layer name, `src`, `tgt`, `memory`, ...
"""

from __future__ import annotations

from .model import Where, draw_model

# The three attention blocks, and every part of the model (chapter 8 lights them all).
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
# The <desc> of the overview; each chapter's drawing adds what it highlights (WHERE_TEXT).
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

# Chapter number -> what its drawing highlights, and the note beside it.
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
            "added to each token's embedding;",
            "besides the decoder's causal mask,",
            "nothing else in the model sees word order.",
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

# Chapter number -> the highlighted parts in words, for the drawing's <desc>.
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


def model_drawings() -> dict[str, str]:
    """File name -> SVG text for the overview and every chapter's "where we are" drawing."""
    overview = Where("The Transformer: the encoder (top) feeds the decoder (bottom)")
    out = {
        "architecture.svg": draw_model(
            overview, "The encoder-decoder Transformer", ARCH_DESC
        ).render()
    }
    for n, where in CHAPTERS.items():
        desc = (
            f"Where chapter {n} sits in the model. {ARCH_DESC} Highlighted in colour: "
            f"{WHERE_TEXT[n]}; the rest is grey."
        )
        out[f"where_{n:02d}.svg"] = draw_model(where, where.heading, desc).render()
    return out
