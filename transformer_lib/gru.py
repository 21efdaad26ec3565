"""The GRU encoder-decoder with additive attention: the baseline of chapter 8 (generated).

Written from chapters/08_translation.ipynb (8. Translating German to English)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["GRUEncoder", "GRUDecoder", "GRUTranslator", "GRUDecoderCache", "make_gru_model"]

import torch
from torch import Tensor, nn

from transformer_lib.attention import AdditiveAttention, check_probability
from transformer_lib.layers import Generator


class GRUEncoder(nn.Module):
    """Bidirectional GRUs over the embedded source: one state per token.

    Each direction is d_model/2 wide, so the two halves side by side make
    one d_model-wide state. Defined in chapter 8.
    """

    def __init__(self, d_model: int, N: int, dropout: float) -> None:
        super().__init__()
        self.d_model = d_model
        self.gru = nn.GRU(
            d_model, d_model // 2, N, batch_first=True, bidirectional=True, dropout=dropout
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """x (batch, S, d) embedded -> states (batch, S, d), zero at pads."""
        batch, S = x.shape[:2]
        if batch == 0 or S == 0:  # nothing to read (and nothing to pack)
            return x.new_zeros(batch, S, self.d_model)
        # (batch,) real tokens per sentence
        lengths = src_mask.reshape(batch, S).sum(-1).clamp(min=1)
        # Packing keeps the backward direction from reading padding first.
        packed = nn.utils.rnn.pack_padded_sequence(
            self.dropout(x),
            lengths.cpu(),
            batch_first=True,
            enforce_sorted=False,
        )
        out, _ = self.gru(packed)
        memory, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=S)
        return memory  # (batch, S, d)


class GRUDecoder(nn.Module):
    """A bottom GRU, chapter 1's additive attention, ``N - 1`` top GRUs.

    The query comes from the bottom GRU (as in GNMT), so in training each
    GRU runs over the whole prefix in one call. Defined in chapter 8.
    """

    def __init__(self, d_model: int, N: int, dropout: float) -> None:
        super().__init__()
        d = self.d_model = d_model
        self.init_state = nn.Linear(d, N * d)  # a start state per layer
        self.bottom = nn.GRU(d, d, 1, batch_first=True)
        self.attention = AdditiveAttention(d, d, d)  # chapter 1
        top_dropout = dropout if N > 2 else 0.0  # between top layers only
        self.top = nn.GRU(2 * d, d, N - 1, batch_first=True, dropout=top_dropout)
        self.out = nn.Linear(2 * d, d)
        self.dropout = nn.Dropout(dropout)

    def start(self, memory: Tensor, src_mask: Tensor) -> tuple[Tensor, ...]:
        """Start states, tanh(W · mean of the encoder states): bottom
        (1, batch, d) and top (N-1, batch, d)."""
        # (batch, S, 1): 1 at real tokens
        real = src_mask.reshape(*memory.shape[:2], 1).to(memory.dtype)
        mean = (memory * real).sum(1) / real.sum(1).clamp(min=1)  # (b, d)
        h0 = torch.tanh(self.init_state(mean)).to(memory.dtype)  # (b, N*d)
        # (N, batch, d)
        h0 = h0.unflatten(-1, (-1, self.d_model)).transpose(0, 1)
        return h0[:1].contiguous(), h0[1:].contiguous()

    def forward(
        self,
        y: Tensor,
        state: tuple[Tensor, ...],
        memory: Tensor,
        src_mask: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """y (batch, t, d) embedded, from `state` -> (batch, t, d), state."""
        dtype = self.bottom.weight_hh_l0.dtype  # inputs match the weights
        y = self.dropout(y).to(dtype)
        s, hb = self.bottom(y, state[0].to(dtype))  # (batch, t, d)
        # (batch, 1, S)
        mask = src_mask.reshape(memory.size(0), 1, memory.size(1))
        c, _ = self.attention(s, memory, memory, mask)  # (batch, t, d)
        sc = torch.cat([s, c.to(dtype)], dim=-1)  # (batch, t, 2d)
        h, ht = self.top(self.dropout(sc), state[1].to(dtype))  # (b, t, d)
        hc = torch.cat([h, c.to(dtype)], dim=-1)  # (batch, t, 2d)
        out = self.dropout(torch.tanh(self.out(hc)))  # (batch, t, d)
        return out, (hb, ht)


class GRUTranslator(nn.Module):
    """The recurrent baseline behind the Transformer's interface.

    Embeddings, a ``GRUEncoder``, a ``GRUDecoder`` and a generator, with
    ``forward(src, tgt, src_mask, tgt_mask)``, ``encode`` and ``decode``,
    so the same trainer, loss and decoders run it. ``tgt_mask`` is
    accepted and ignored: a recurrent decoder only ever sees the past.
    Defined in chapter 8.

    Args:
        vocab: joint vocabulary size (source and target).
        d_model: width of embeddings, states and output; even.
        N: GRU layers of the encoder and of the decoder; >= 2.
        dropout: on embeddings, between layers and on the output.
        pad_idx: the padding id (its embedding stays zero).
        share_embeddings: one embedding for source, target and generator.
    """

    def __init__(
        self,
        vocab: int,
        d_model: int = 256,
        N: int = 2,
        dropout: float = 0.1,
        pad_idx: int = 0,
        share_embeddings: bool = True,
    ) -> None:
        super().__init__()
        p = _check_gru_args(vocab, d_model, N, dropout)
        self.d_model = d_model
        self.src_embed = nn.Embedding(vocab, d_model, padding_idx=pad_idx)
        self.tgt_embed = self.src_embed
        if not share_embeddings:
            self.tgt_embed = nn.Embedding(vocab, d_model, padding_idx=pad_idx)
        self.encoder = GRUEncoder(d_model, N, p)
        self.decoder = GRUDecoder(d_model, N, p)
        self.generator = Generator(d_model, vocab)  # chapter 5
        if share_embeddings:
            self.generator.proj.weight = self.src_embed.weight

    def forward(
        self, src: Tensor, tgt: Tensor, src_mask: Tensor, tgt_mask: Tensor | None = None
    ) -> Tensor:
        """src (batch, S), tgt (batch, T), src_mask (batch, 1, S)
        -> (batch, T, d_model)."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """src (batch, S) -> states (batch, S, d_model)."""
        _check_ids("src", src, self.src_embed.num_embeddings)
        return self.encoder(self.src_embed(src), src_mask)

    def decode(
        self, memory: Tensor, src_mask: Tensor, tgt: Tensor, tgt_mask: Tensor | None = None
    ) -> Tensor:
        """The whole prefix at once: tgt (batch, T) -> (batch, T, d)."""
        _check_ids("tgt", tgt, self.tgt_embed.num_embeddings)
        start = self.decoder.start(memory, src_mask)
        out, _ = self.decoder(self.tgt_embed(tgt), start, memory, src_mask)
        return out

    def start_decoding(self, memory: Tensor, src_mask: Tensor):
        """The incremental decoder ``greedy_decode`` and ``beam_search`` use:
        the GRU states are this model's cache (chapter 7's KV cache)."""
        return GRUDecoderCache(self, memory, src_mask)


def _check_gru_args(vocab: int, d_model: int, N: int, dropout: float) -> float:
    for name, n, lo in (("vocab", vocab, 1), ("d_model", d_model, 2), ("N", N, 2)):
        if isinstance(n, bool) or not isinstance(n, int) or n < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {n!r}")
    if d_model % 2:
        raise ValueError(f"d_model must be even (two directions), got {d_model}")
    return check_probability(dropout, "dropout")


def _check_ids(name: str, tokens: Tensor, vocab: int) -> None:
    # An id outside [0, vocab) would fail deep inside nn.Embedding.
    if tokens.numel() == 0 or tokens.device.type == "meta":
        return
    low, high = torch.stack(torch.aminmax(tokens)).tolist()  # one sync
    if low < 0 or high >= vocab:
        raise ValueError(
            f"{name} must hold token ids in [0, {vocab}) (the vocabulary "
            f"size), got ids from {low} to {high}"
        )


class GRUDecoderCache:
    """``GRUTranslator``'s incremental decoder state: one step per token.

    ``step(tokens (rows, 1)) -> (rows, 1, d_model)``; ``reorder(index,
    sources)`` keeps the rows a beam search continues, as chapter 7's
    ``KVCache.reorder`` does. Defined in chapter 8.
    """

    def __init__(self, model: GRUTranslator, memory: Tensor, src_mask: Tensor) -> None:
        self.model, self.memory, self.src_mask = model, memory, src_mask
        self.state = model.decoder.start(memory, src_mask)
        self.length = 0  # tokens decoded so far

    def step(self, tokens: Tensor) -> Tensor:
        model = self.model
        out, self.state = model.decoder(
            model.tgt_embed(tokens), self.state, self.memory, self.src_mask
        )
        self.length += tokens.size(1)
        return out  # (rows, 1, d)

    def reorder(self, index: Tensor, sources: bool = False) -> None:
        self.state = tuple(h.index_select(1, index) for h in self.state)
        # A beam's parent is a row of the same sentence, with the same
        # source: the source rows change only when sentences leave.
        if sources:
            self.memory = self.memory.index_select(0, index)
            self.src_mask = self.src_mask.index_select(0, index)


def make_gru_model(
    vocab: int,
    d_model: int = 256,
    N: int = 2,
    dropout: float = 0.1,
    pad_idx: int = 0,
    share_embeddings: bool = True,
) -> GRUTranslator:
    """A ``GRUTranslator`` with uniform(-0.1, 0.1) weights (common practice
    for recurrent translators; Sutskever et al., 2014, used (-0.08, 0.08)
    for their LSTMs) and zero biases. Defined in chapter 8."""
    model = GRUTranslator(vocab, d_model, N, dropout, pad_idx, share_embeddings)
    for name, w in model.named_parameters():
        if "bias" in name:
            nn.init.zeros_(w)
        else:
            nn.init.uniform_(w, -0.1, 0.1)
    with torch.no_grad():
        model.src_embed.weight[pad_idx].zero_()
        model.tgt_embed.weight[pad_idx].zero_()
    return model
