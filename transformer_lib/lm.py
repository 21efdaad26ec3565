"""A decoder-only language model, sampling, and masked-token corruption (generated).

Written from chapters/11_what_came_after.ipynb (11. What came after)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = [
    "TransformerLM",
    "filter_logits",
    "sample_next",
    "LMCache",
    "lm_step",
    "generate",
    "mask_tokens",
]

import torch
from torch import Tensor, nn

from transformer_lib.attention import check_positive_int, check_probability
from transformer_lib.decoding import KVCache
from transformer_lib.layers import (
    Embeddings,
    Encoder,
    EncoderLayer,
    Generator,
    PositionwiseFeedForward,
)
from transformer_lib.masks import subsequent_mask
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.positional import PositionalEncoding


class TransformerLM(nn.Module):
    """A language model made of one Transformer stack: GPT- or BERT-style.

    Token embeddings (+ positional encodings), N ``EncoderLayer`` blocks
    (self-attention and feed-forward; no cross-attention, since there is no
    source), a final norm (pre-norm) and the output ``Generator``. With
    ``causal=True`` each position attends to itself and earlier positions:
    the decoder of "Attention Is All You Need" (section 3.1) without its
    encoder-decoder attention, as in GPT (Radford et al., 2018). With
    ``causal=False`` every position sees the whole sequence: the encoder, as
    in BERT (Devlin et al., 2019).

    Args:
        vocab: vocabulary size.
        N: layers. d_model: model width. d_ff: feed-forward width.
        h: attention heads (when ``self_attn`` is None).
        dropout: residual, embedding, attention and feed-forward dropout,
            in [0, 1).
        causal: GPT-style (True) or BERT-style (False) attention.
        self_attn: the attention every layer gets a copy of (default
            ``MultiHeadedAttention(h, d_model, dropout)``, chapter 3); any
            module with its ``forward``/``project_kv``/``attend`` interface.
        positional: "sinusoidal" (chapter 4's encoding added to the
            embeddings) or "none" (the attention encodes positions itself,
            e.g. ``RotaryAttention``).
        max_len: rows of the sinusoidal table precomputed.
        norm_first: pre-norm blocks (GPT-2; the default) or post-norm.

    ``forward(tokens, pad=None)``: tokens (batch, len) ids -> hidden states
    (batch, len, d_model); ``generator`` maps them to log-probabilities
    (batch, len, vocab). Defined in chapter 11.
    """

    def __init__(
        self,
        vocab: int,
        N: int = 2,
        d_model: int = 128,
        d_ff: int = 512,
        h: int = 4,
        dropout: float = 0.1,
        *,
        causal: bool = True,
        self_attn: nn.Module | None = None,
        positional: str = "sinusoidal",
        max_len: int = 5000,
        norm_first: bool = True,
    ) -> None:
        super().__init__()
        _check_lm_args(vocab, N, d_model, d_ff, h, positional, self_attn)
        p = check_probability(dropout, "dropout")
        if self_attn is None:
            self_attn = MultiHeadedAttention(h, d_model, p)
        self.causal, self.d_model = bool(causal), d_model
        self.embed = Embeddings(vocab, d_model)  # scaled by sqrt(d_model)
        if positional == "sinusoidal":
            self.position: nn.Module = PositionalEncoding(d_model, p, max_len)
        else:  # positions enter inside the attention
            self.position = nn.Dropout(p)
        ff = PositionwiseFeedForward(d_model, d_ff, p)
        layer = EncoderLayer(d_model, self_attn, ff, p, norm_first)
        self.blocks = Encoder(layer, N)  # N copies, separate weights
        self.generator = Generator(d_model, vocab)
        for w in self.parameters():  # Xavier, as make_model (chapter 5)
            if w.dim() > 1:
                nn.init.xavier_uniform_(w)

    def embed_tokens(self, tokens: Tensor, start: int = 0) -> Tensor:
        """tokens (batch, len) at positions start, start + 1, ...
        -> (batch, len, d_model)."""
        _check_ids(tokens, self.embed.lut.num_embeddings)
        x = self.embed(tokens)
        if isinstance(self.position, PositionalEncoding):
            return self.position(x, start=start)
        return self.position(x)

    def mask(self, tokens: Tensor, pad: int | None = None) -> Tensor | None:
        """The self-attention mask, True = may attend: causal and/or
        padding, (batch | 1, len | 1, len), or None (attend everywhere)."""
        n = tokens.size(1)
        mask = subsequent_mask(n, tokens.device) if self.causal else None
        if pad is not None:
            keep = (tokens != pad).unsqueeze(-2)  # (batch, 1, len)
            mask = keep if mask is None else mask & keep
        return mask

    def forward(self, tokens: Tensor, pad: int | None = None) -> Tensor:
        _check_tokens(tokens)
        x = self.embed_tokens(tokens)  # (batch, len, d_model)
        return self.blocks(x, self.mask(tokens, pad))  # (batch, len, d_model)


def _check_lm_args(vocab, N, d_model, d_ff, h, positional, self_attn) -> None:
    for name, value in (
        ("vocab", vocab),
        ("N", N),
        ("d_model", d_model),
        ("d_ff", d_ff),
        ("h", h),
    ):
        check_positive_int(value, name)
    if positional not in ("sinusoidal", "none"):
        raise ValueError(f"positional must be 'sinusoidal' or 'none', got {positional!r}")
    width = getattr(self_attn, "d_model", d_model)
    if self_attn is not None and width != d_model:
        raise ValueError(f"self_attn must work on d_model={d_model}, got d_model={width}")
    if self_attn is None and d_model % h:
        raise ValueError(f"d_model must be divisible by h, got d_model={d_model}, h={h}")


def _check_tokens(tokens: object, name: str = "tokens") -> None:
    if (
        not isinstance(tokens, Tensor)
        or tokens.dim() != 2
        or tokens.dtype not in (torch.int64, torch.int32)
    ):
        got = (
            (tuple(tokens.shape), tokens.dtype)
            if isinstance(tokens, Tensor)
            else type(tokens).__name__
        )
        raise ValueError(f"{name} must be a (batch, len) tensor of integer ids, got {got}")


def _check_ids(tokens: Tensor, vocab: int, name: str = "tokens") -> None:
    # An id outside [0, vocab) would fail deep inside nn.Embedding.
    if tokens.numel() == 0 or tokens.device.type == "meta":
        return
    low, high = torch.stack(torch.aminmax(tokens)).tolist()  # one sync
    if low < 0 or high >= vocab:
        raise ValueError(
            f"{name} must hold token ids in [0, {vocab}) (the vocabulary "
            f"size), got ids from {low} to {high}"
        )


def _check_logits(logits: Tensor) -> None:
    # A row without a finite best score has no distribution to draw from.
    if not bool(torch.isfinite(logits.amax(dim=-1)).all()):
        raise ValueError(
            "logits must hold a finite largest value in every row (got a row of -inf, +inf or NaN)"
        )


def _check_filters(top_k: object, top_p: object) -> None:
    if top_k is not None:
        check_positive_int(top_k, "top_k")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
    ):
        raise ValueError(f"top_p must be a number in (0, 1] or None, got {top_p!r}")


def _check_temperature(temperature: object) -> None:
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not 0 <= temperature < float("inf")
    ):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")


def _check_generate_args(
    lm: object, prompt: object, max_new_tokens: object, end_symbol: object
) -> None:
    if not isinstance(lm, TransformerLM) or not lm.causal:
        raise ValueError("lm must be a causal TransformerLM")
    _check_tokens(prompt, "prompt")
    if prompt.size(1) < 1:
        raise ValueError("prompt must hold at least one token per row")
    vocab = lm.embed.lut.num_embeddings
    _check_ids(prompt, vocab, "prompt")
    if end_symbol is not None and (
        isinstance(end_symbol, bool)
        or not isinstance(end_symbol, int)
        or not 0 <= end_symbol < vocab
    ):
        raise ValueError(
            f"end_symbol must be a token id in [0, {vocab}) or None, got {end_symbol!r}"
        )
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 0
    ):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def _check_masking(tokens: object, mask_id: object, p: object, low: object, high: object) -> None:
    _check_tokens(tokens)
    if isinstance(mask_id, bool) or not isinstance(mask_id, int) or mask_id < 0:
        raise ValueError(f"mask_id must be a token id >= 0, got {mask_id!r}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
        raise ValueError(f"p must be a probability in (0, 1), got {p!r}")
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low < high):
        raise ValueError(
            f"low and high must be integers with 0 <= low < high, got low={low!r}, high={high!r}"
        )


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Keep the top-k tokens and/or the top-p nucleus; the others get -inf.

    Args:
        logits: (..., vocab) unnormalized scores.
        top_k: keep the k highest logits (exactly k: ``torch.topk`` picks
            which of the tokens tied at the k-th value stay), or None. Fan
            et al. (2018).
        top_p: keep the smallest set of most probable tokens whose
            probability sums to at least top_p, in (0, 1], or None. Nucleus
            sampling, Holtzman et al. (2020).

    Returns logits of the same shape, -inf where a token was removed.
    Defined in chapter 11.
    """
    _check_filters(top_k, top_p)
    if top_k is not None:
        k = min(top_k, logits.size(-1))
        index = logits.topk(k, dim=-1).indices  # (..., k)
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep.scatter_(-1, index, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)  # (..., vocab), best first
        before = probs.cumsum(dim=-1) - probs  # mass of the better tokens
        drop = before >= top_p  # the set had reached top_p without it
        drop = torch.zeros_like(drop).scatter_(-1, order, drop)  # unsort
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one token per row from softmax(logits / temperature), filtered.

    logits (batch, vocab) -> ids (batch,). ``temperature == 0`` is greedy
    (argmax); ``top_k``, ``top_p`` as in ``filter_logits``; ``generator``
    makes the draws reproducible. Defined in chapter 11.
    """
    _check_temperature(temperature)
    _check_logits(logits)
    if temperature == 0:
        return logits.argmax(dim=-1)  # (batch,)
    # Best score 0 first: divided by a tiny temperature, the others go to
    # -inf and the best stays 0, where raw scores would overflow to inf.
    logits = logits.float() - logits.float().amax(dim=-1, keepdim=True)
    logits = filter_logits(logits / temperature, top_k, top_p)
    probs = logits.softmax(dim=-1)  # (batch, vocab)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class LMCache(KVCache):
    """Chapter 7's key/value cache for a ``TransformerLM``: self-attention
    entries only (there is no source).

    ``self_kv[l] = (k, v)``, each (batch, key/value heads, t, d_k) for the t
    positions so far; ``append`` and ``reorder`` are ``KVCache``'s.
    Defined in chapter 11.
    """

    def __init__(self, lm: TransformerLM) -> None:
        self.src_kv = []
        self.self_kv = [None] * len(lm.blocks.layers)
        self.length = 0  # positions already in the cache


def _layer_step(
    layer: EncoderLayer,
    x: Tensor,
    cache: LMCache,
    i: int,
    mask: Tensor | None,
) -> Tensor:
    """``EncoderLayer.forward`` for the new positions x, using ``cache``."""
    attn = layer.self_attn

    def self_attention(y: Tensor) -> Tensor:  # y: (batch, s, d_model)
        # 1) project the new keys and values, append them to the cache
        k, v = cache.append(i, *attn.project_kv(y, y))  # (b, kv, t+s, d_k)
        # 2) the new queries attend over everything so far
        return attn.attend(y, k, v, mask)

    x = layer.sublayer[0](x, self_attention)
    return layer.sublayer[1](x, layer.feed_forward)


def lm_step(lm: TransformerLM, cache: LMCache, tokens: Tensor) -> Tensor:
    """Hidden states of new tokens, attending over the cached positions.

    tokens (batch, s) at positions ``cache.length``, ... -> (batch, s,
    d_model); appends their keys and values to ``cache``. Equals
    ``lm(prefix)[:, -s:]`` where the prefix's first ``cache.length`` tokens
    are the cached ones. Causal models only. Defined in chapter 11.
    """
    if not lm.causal:
        raise ValueError("lm must be causal (a cache needs past states final)")
    t, s = cache.length, tokens.size(1)
    x = lm.embed_tokens(tokens, start=t)  # (batch, s, d_model)
    # new token j sees the t cached positions and new tokens 0..j
    mask = torch.ones(s, t + s, dtype=torch.bool, device=tokens.device)
    mask = mask.tril(t) if s > 1 else None  # (s, t + s)
    for i, layer in enumerate(lm.blocks.layers):
        x = _layer_step(layer, x, cache, i, mask)  # (batch, s, d_model)
    cache.length += s
    return lm.blocks.norm(x)  # (batch, s, d_model)


@torch.no_grad()
def generate(
    lm: TransformerLM,
    prompt: Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    *,
    end_symbol: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Continue ``prompt`` by up to ``max_new_tokens`` sampled tokens.

    Args:
        lm: a causal ``TransformerLM``, in eval mode.
        prompt: (batch, len >= 1) token ids.
        max_new_tokens: tokens to add (>= 0).
        temperature, top_k, top_p, generator: as in ``sample_next``
            (temperature 0, the default, is greedy).
        end_symbol: a row that emits it is finished, later positions are
            filled with it; generation stops when every row has finished.
        use_cache: decode with an ``LMCache`` (one position per step) or
            re-run the whole sequence every step; the tokens are the same.

    Returns (batch, len + generated) ids, the prompt first. Defined in
    chapter 11.
    """
    _check_generate_args(lm, prompt, max_new_tokens, end_symbol)
    ys, cache = prompt, LMCache(lm) if use_cache else None
    finished = torch.zeros(len(prompt), dtype=torch.bool, device=prompt.device)
    for _ in range(max_new_tokens):
        if cache is None:  # the textbook way: the whole sequence again
            h = lm(ys)[:, -1]  # (batch, d_model)
        else:  # the uncached tokens only: the prompt, then the newest one
            h = lm_step(lm, cache, ys[:, cache.length :])[:, -1]
        logits = lm.generator.proj(h)  # (batch, vocab)
        nxt = sample_next(logits, temperature, top_k, top_p, generator)
        if end_symbol is not None:
            nxt = nxt.masked_fill(finished, end_symbol)
            finished |= nxt == end_symbol
        ys = torch.cat([ys, nxt.unsqueeze(1)], dim=1)  # (batch, t + 1)
        if end_symbol is not None and bool(finished.all()):
            break
    return ys


def mask_tokens(
    tokens: Tensor,
    mask_id: int,
    low: int,
    high: int,
    *,
    p: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masked-LM corruption: choose a fraction p of tokens to predict.

    Of the chosen tokens, 80% become ``mask_id``, 10% a random token, 10%
    stay unchanged (Devlin et al., 2019, section 3.1).

    Args:
        tokens: (batch, len) token ids; ids below ``low`` (padding and other
            special tokens) are never chosen.
        mask_id: the id of the ``[MASK]`` token.
        low, high: random replacements are drawn uniformly from [low, high).
        p: the probability that a (non-special) token is chosen, in (0, 1).
        generator: a seeded CPU ``torch.Generator`` for reproducible masks.

    Returns (inputs, labels), both (batch, len): labels hold the original
    token where chosen and -100 (``F.nll_loss``'s ignore_index) elsewhere.
    Defined in chapter 11.
    """
    _check_masking(tokens, mask_id, p, low, high)
    shape, device = tokens.shape, tokens.device
    u = torch.rand(shape, generator=generator).to(device)
    chosen = (u < p) & (tokens >= low)  # 1) the tokens to predict
    r = torch.rand(shape, generator=generator).to(device)  # 2) their fate
    to_mask = chosen & (r < 0.8)
    to_random = chosen & (r >= 0.8) & (r < 0.9)  # r >= 0.9: unchanged
    random_ids = torch.randint(low, high, shape, generator=generator)
    inputs = tokens.masked_fill(to_mask, mask_id)
    inputs = torch.where(to_random, random_ids.to(device), inputs)
    labels = tokens.masked_fill(~chosen, -100)
    return inputs, labels
