"""The encoder-decoder model and make_model (generated).

Written from chapters/05_model.ipynb (5. Layers and the full model)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["EncoderDecoder", "make_model", "count_parameters"]

import copy

import torch
from torch import Tensor, nn

from transformer_lib.attention import check_positive_int, check_probability
from transformer_lib.layers import (
    Decoder,
    DecoderLayer,
    Embeddings,
    Encoder,
    EncoderLayer,
    Generator,
    PositionwiseFeedForward,
)
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
)


# Input checks for EncoderDecoder (the class is in the next cell).
def _check_tokens(name: str, tokens: Tensor) -> None:
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        dtype = getattr(tokens, "dtype", type(tokens).__name__)
        raise ValueError(f"{name} must be integer token ids (torch.long), got {dtype}")
    if tokens.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, len), got {tuple(tokens.shape)}")


def _check_ids(name: str, tokens: Tensor, embed: nn.Module) -> None:
    """An id outside [0, vocab) would fail deep inside ``nn.Embedding``."""
    sizes = [m.num_embeddings for m in embed.modules() if isinstance(m, nn.Embedding)]
    if not sizes or tokens.numel() == 0 or tokens.device.type == "meta":
        return
    if torch.compiler.is_compiling():  # the ids are data, unknown here
        return
    low, high = torch.stack(torch.aminmax(tokens)).tolist()  # one sync
    if low < 0 or high >= sizes[0]:
        raise ValueError(
            f"{name} must hold token ids in [0, {sizes[0]}) (the vocabulary "
            f"size), got ids from {low} to {high}"
        )


def _check_mask(name: str, mask: Tensor | None, batch: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype.is_floating_point or mask.dtype.is_complex:
        dtype = getattr(mask, "dtype", type(mask).__name__)
        raise ValueError(f"{name} must be a bool tensor (True = may attend), got {dtype}")
    if mask.dim() < 3 or mask.size(0) not in (1, batch):
        raise ValueError(
            f"{name} must have shape (batch={batch} or 1, q_len or 1, "
            f"k_len), got {tuple(mask.shape)}"
        )


class EncoderDecoder(nn.Module):
    """The Transformer: embeddings, encoder and decoder stacks, output layer.

    Args:
        encoder: an Encoder.
        decoder: a Decoder.
        src_embed: ``nn.Sequential(Embeddings, PositionalEncoding or
            LearnedPositionalEmbedding)``.
        tgt_embed: the same for the target.
        generator: a Generator (applied by the loss and by decoding, not by
            ``forward``).

    ``forward(src, tgt, src_mask, tgt_mask)``: src (batch, src_len) and tgt
    (batch, tgt_len) token ids; src_mask bool (batch, 1, src_len); tgt_mask
    bool (batch | 1, tgt_len, tgt_len) -> decoder output (batch, tgt_len,
    d_model). A mask of None means "attend everywhere" (never pass None as
    tgt_mask when training). Paper section 3, Figure 1. Defined in chapter 5.
    """

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        src_embed: nn.Module,
        tgt_embed: nn.Module,
        generator: nn.Module,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        _check_tokens("src", src)
        _check_tokens("tgt", tgt)
        if tgt.size(0) != src.size(0):
            raise ValueError(
                f"tgt must have the same batch size as src ({src.size(0)}), got {tgt.size(0)}"
            )
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """Source ids (batch, src_len) -> memory (batch, src_len, d_model)."""
        _check_tokens("src", src)
        _check_ids("src", src, self.src_embed)
        _check_mask("src_mask", src_mask, src.size(0))
        return self.encoder(self.src_embed(src), src_mask)

    def decode(
        self,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt: Tensor,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        """Target ids (batch, tgt_len) -> output (batch, tgt_len, d_model)."""
        _check_tokens("tgt", tgt)
        _check_ids("tgt", tgt, self.tgt_embed)
        if tgt.size(0) != memory.size(0):
            raise ValueError(
                f"tgt must have the same batch size as memory ({memory.size(0)}), got {tgt.size(0)}"
            )
        _check_mask("src_mask", src_mask, tgt.size(0))
        _check_mask("tgt_mask", tgt_mask, tgt.size(0))
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


def _check_model_args(
    *,
    src_vocab: int,
    tgt_vocab: int,
    N: int,
    d_model: int,
    d_ff: int,
    h: int,
    dropout: float,
    attn_dropout: float | None,
    ffn_dropout: float | None,
    positional: str,
    max_len: int,
    share_embeddings: bool,
    norm_first: bool,
    skip_padding: bool,
    pad_idx: int | None,
    **_: object,
) -> None:
    """ValueError naming the first bad argument of ``make_model``.

    The other arguments are checked by the modules they configure.
    """
    for name, value in (
        ("src_vocab", src_vocab),
        ("tgt_vocab", tgt_vocab),
        ("N", N),
        ("d_model", d_model),
        ("d_ff", d_ff),
        ("h", h),
        ("max_len", max_len),
    ):
        check_positive_int(value, name)
    for name, value in (
        ("norm_first", norm_first),
        ("share_embeddings", share_embeddings),
        ("skip_padding", skip_padding),
    ):  # "no" is truthy: it would switch the option on
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if d_model % h != 0:
        raise ValueError(f"d_model must be divisible by h, got d_model={d_model}, h={h}")
    for name, value in (
        ("dropout", dropout),
        ("attn_dropout", dropout if attn_dropout is None else attn_dropout),
        ("ffn_dropout", dropout if ffn_dropout is None else ffn_dropout),
    ):
        check_probability(value, name)
    if positional not in ("sinusoidal", "learned"):
        raise ValueError(f"positional must be 'sinusoidal' or 'learned', got {positional!r}")
    if share_embeddings and src_vocab != tgt_vocab:
        raise ValueError(
            "share_embeddings=True needs one shared vocabulary: src_vocab "
            f"must equal tgt_vocab, got src_vocab={src_vocab}, "
            f"tgt_vocab={tgt_vocab}"
        )
    if pad_idx is not None and (
        isinstance(pad_idx, bool)
        or not isinstance(pad_idx, int)
        or not 0 <= pad_idx < min(src_vocab, tgt_vocab)
    ):
        raise ValueError(
            f"pad_idx must be in [0, {min(src_vocab, tgt_vocab)}) (an "
            f"integer id valid in both vocabularies) or None, got {pad_idx!r}"
        )


def _init_weights(model: nn.Module, pad_idx: int | None) -> None:
    """Xavier-uniform init of every weight matrix; fused Q/K/V by block."""
    done: set[int] = set()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, MultiHeadedAttention):
                # W^Q, W^K, W^V: one fused matrix, three blocks
                for block in module.in_proj.weight.chunk(3, dim=0):
                    nn.init.xavier_uniform_(block)
                done.add(id(module.in_proj.weight))
        # unique tensors: a tied matrix is initialized once
        for p in model.parameters():
            if p.dim() > 1 and id(p) not in done:
                nn.init.xavier_uniform_(p)
        if pad_idx is not None:
            for embed in (model.src_embed[0], model.tgt_embed[0]):
                embed.lut.weight[pad_idx].zero_()


def _copy_sharing_buffers(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` that shares its buffers (not copies them).

    The sinusoidal table is a constant: one (max_len, d_model) table serves
    both stacks, instead of a copy for each (twice the memory). A learned
    table is a parameter, so each stack still gets its own.
    """
    return copy.deepcopy(module, {id(b): b for b in module.buffers()})


def make_model(
    src_vocab: int,
    tgt_vocab: int,
    N: int = 6,
    d_model: int = 512,
    d_ff: int = 2048,
    h: int = 8,
    dropout: float = 0.1,
    *,
    norm_first: bool = False,
    share_embeddings: bool = False,
    positional: str = "sinusoidal",
    max_len: int = 5000,
    pad_idx: int | None = None,
    activation: str = "relu",
    attn_dropout: float | None = None,
    ffn_dropout: float | None = None,
    skip_padding: bool = True,
) -> EncoderDecoder:
    """Build an encoder-decoder Transformer with Xavier-initialized weights.

    Args:
        src_vocab, tgt_vocab: vocabulary sizes.
        N: layers per stack (6). d_model: model width (512). d_ff: FFN width
            (2048).
        h: attention heads (8); must divide d_model. dropout: in [0, 1) (0.1).
        norm_first: pre-norm residual blocks (a deviation; default post-norm,
            the paper).
        share_embeddings: tie source embedding, target embedding and output
            projection (one tensor; needs src_vocab == tgt_vocab), paper
            section 3.4.
        positional: "sinusoidal" (paper) or "learned". max_len: longest
            position table.
        pad_idx: padding id (its embedding row starts at zero), or None.
        activation: "relu" (paper) or "gelu".
        attn_dropout, ffn_dropout: dropout on the attention weights and on the
            FFN's hidden activations; None (default) uses ``dropout``, as the
            Annotated Transformer and ``nn.Transformer`` do. 0 for both is the
            paper's placement (paper section 5.4), and faster on a CPU,
            where the fused attention kernel has no dropout.
        skip_padding: the layers run their feed-forward blocks on the
            positions the masks leave visible only (the same outputs at real
            positions up to rounding, in distribution when dropout is on;
            see ``visible_positions``).

    Returns an EncoderDecoder; ``model.generator`` maps its output to
    log-probabilities. Paper section 3, Table 3 (base model). Defined in
    chapter 5.
    """
    _check_model_args(**locals())  # every argument, by name (folded above)
    c = copy.deepcopy  # every layer gets its own copy of a prototype
    attn_p = dropout if attn_dropout is None else attn_dropout
    ffn_p = dropout if ffn_dropout is None else ffn_dropout
    attn = MultiHeadedAttention(h, d_model, attn_p)
    ff = PositionwiseFeedForward(d_model, d_ff, ffn_p, activation)
    if positional == "sinusoidal":
        position: nn.Module = PositionalEncoding(d_model, dropout, max_len)
    else:
        position = LearnedPositionalEmbedding(d_model, dropout, max_len)
    encoder_layer = EncoderLayer(d_model, c(attn), c(ff), dropout, norm_first, skip_padding)
    decoder_layer = DecoderLayer(
        d_model, c(attn), c(attn), c(ff), dropout, norm_first, skip_padding
    )
    # one sinusoid table serves both stacks; a learned table is copied
    src_pos, tgt_pos = (_copy_sharing_buffers(position) for _ in range(2))
    model = EncoderDecoder(
        Encoder(encoder_layer, N),  # N copies of each layer
        Decoder(decoder_layer, N),
        nn.Sequential(Embeddings(src_vocab, d_model, pad_idx), src_pos),
        nn.Sequential(Embeddings(tgt_vocab, d_model, pad_idx), tgt_pos),
        Generator(d_model, tgt_vocab),
    )
    if share_embeddings:  # one (vocab, d_model) tensor in three places
        shared = model.tgt_embed[0].lut.weight
        model.src_embed[0].lut.weight = shared
        model.generator.proj.weight = shared
    _init_weights(model, pad_idx)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of parameters, each tensor counted once (a tied matrix too).

    ``model.parameters()`` already yields a shared tensor only once; buffers
    (such as the sinusoidal position table) are not parameters. Defined in
    chapter 5.
    """
    return sum(p.numel() for p in model.parameters())
