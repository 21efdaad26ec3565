"""11. What came after

Generated from chapters/11_what_came_after.ipynb by tools/export.py: do not edit.
Edit the chapter and run `make export`."""

__all__ = [
    "TransformerLM",
    "filter_logits",
    "sample_next",
    "LMCache",
    "lm_step",
    "generate",
    "mask_tokens",
    "GroupedQueryAttention",
    "gqa_from_multihead",
    "kv_cache_bytes",
    "apply_rope",
    "RotaryAttention",
]

import operator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lib.attention import check_mask, check_probability
from transformer_lib.decoding import KVCache
from transformer_lib.layers import (
    Embeddings,
    Encoder,
    EncoderLayer,
    Generator,
    PositionwiseFeedForward,
)
from transformer_lib.masks import subsequent_mask
from transformer_lib.multihead import MultiHeadedAttention, _fused_attention
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
        dropout: residual, embedding and attention dropout, in [0, 1).
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


def _check_positive(value: object, name: str) -> None:
    """ValueError naming ``name`` unless ``value`` is a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_lm_args(vocab, N, d_model, d_ff, h, positional, self_attn) -> None:
    for name, value in (
        ("vocab", vocab),
        ("N", N),
        ("d_model", d_model),
        ("d_ff", d_ff),
        ("h", h),
    ):
        _check_positive(value, name)
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


def _check_filters(top_k: object, top_p: object) -> None:
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
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


def _check_generate_args(lm: object, prompt: object, max_new_tokens: object) -> None:
    if not isinstance(lm, TransformerLM) or not lm.causal:
        raise ValueError("lm must be a causal TransformerLM")
    _check_tokens(prompt, "prompt")
    if prompt.size(1) < 1:
        raise ValueError("prompt must hold at least one token per row")
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 0
    ):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def _check_masking(tokens: object, p: object, low: object, high: object) -> None:
    _check_tokens(tokens)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
        raise ValueError(f"p must be a probability in (0, 1), got {p!r}")
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low < high):
        raise ValueError(
            f"low and high must be integers with 0 <= low < high, got low={low!r}, high={high!r}"
        )


def _check_heads(h: object, d_model: object, kv_heads: object) -> None:
    for name, n in (("h", h), ("d_model", d_model), ("kv_heads", kv_heads)):
        _check_positive(n, name)
    if d_model % h:
        raise ValueError(f"d_model must be divisible by h, got d_model={d_model}, h={h}")
    if h % kv_heads:
        raise ValueError(
            "kv_heads must divide h (each group has h / kv_heads query "
            f"heads), got h={h}, kv_heads={kv_heads}"
        )


def _check_input(x: object, name: str, d_model: int) -> None:
    if (
        not isinstance(x, Tensor)
        or x.dim() != 3
        or x.size(-1) != d_model
        or not x.is_floating_point()
    ):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(
            f"{name} must be a floating-point tensor of shape "
            f"(batch, len, d_model={d_model}), got {got}"
        )


def _check_rope_args(x: object, start: object, base: object) -> int:
    if not isinstance(x, Tensor) or x.dim() < 2 or x.size(-1) % 2:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a (..., len, d) tensor with d even, got {got}")
    if isinstance(start, bool):
        raise ValueError(f"start must be an integer position >= 0, got {start!r}")
    try:
        start = operator.index(start)
    except TypeError:
        raise ValueError(f"start must be an integer position >= 0, got {start!r}") from None
    if start < 0:
        raise ValueError(f"start must be an integer position >= 0, got {start}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 0 < base < float("inf"):
        raise ValueError(f"base must be a finite number > 0, got {base!r}")
    return start


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Keep the top-k tokens and/or the top-p nucleus; the others get -inf.

    Args:
        logits: (..., vocab) unnormalised scores.
        top_k: keep the k highest logits (exactly k: ties at the k-th value
            are broken by index), or None. Fan et al. (2018).
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
    if temperature == 0:
        return logits.argmax(dim=-1)  # (batch,)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
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
    _check_generate_args(lm, prompt, max_new_tokens)
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
    _check_masking(tokens, p, low, high)
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


class GroupedQueryAttention(nn.Module):
    """Multi-head attention whose h query heads share kv_heads key/value
    heads.

    The query heads are split into kv_heads groups of h / kv_heads heads;
    each group attends with one shared key head and value head (Ainslie et
    al., 2023, GQA). kv_heads = h is multi-head attention ("Attention Is All
    You Need", section 3.2.2); kv_heads = 1 is multi-query attention
    (Shazeer, 2019). A key/value cache stores kv_heads heads instead of h.

    Args:
        h: query heads.
        d_model: model width; each head has d_k = d_model // h dimensions.
        kv_heads: key/value heads; must divide h.
        dropout: dropout on the attention weights, in [0, 1).
        bias: whether the projections have biases.

    Parameters: ``q_proj`` (W^Q, d_model -> d_model), ``kv_proj`` ([W^K;
    W^V], d_model -> 2 * kv_heads * d_k), ``out_proj`` (W^O). The interface
    is ``MultiHeadedAttention``'s: ``forward(query, key, value, mask)``,
    ``project_kv`` (what a cache stores) and ``attend``.
    Defined in chapter 11.
    """

    def __init__(
        self,
        h: int,
        d_model: int,
        kv_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        _check_heads(h, d_model, kv_heads)
        self.h, self.kv_heads, self.d_model = h, kv_heads, d_model
        self.d_k = d_model // h
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q
        # [W^K; W^V]: kv_heads heads each
        self.kv_proj = nn.Linear(d_model, 2 * kv_heads * self.d_k, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O
        self.p = check_probability(dropout, "dropout")

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
    ) -> Tensor:
        """query (batch, q_len, d_model), key and value (batch, k_len,
        d_model), mask bool broadcastable to (batch, q_len, k_len)
        -> (batch, q_len, d_model)."""
        return self.attend(query, *self.project_kv(key, value), mask)

    def project_kv(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """key, value (batch, k_len, d_model) -> k, v, each (batch,
        kv_heads, k_len, d_k)."""
        _check_input(key, "key", self.d_model)
        _check_input(value, "value", self.d_model)
        n = self.kv_heads * self.d_k
        w, b = self.kv_proj.weight, self.kv_proj.bias
        k = F.linear(key, w[:n], None if b is None else b[:n])
        v = F.linear(value, w[n:], None if b is None else b[n:])
        return self._split(k), self._split(v)  # (batch, kv_heads, k_len, d_k)

    def attend(self, query: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """query (batch, q_len, d_model) over projected k, v (batch,
        kv_heads, k_len, d_k) -> (batch, q_len, d_model). The queries are
        the last q_len of the k_len positions (self-attention, or a step
        over a cache)."""
        _check_input(query, "query", self.d_model)
        q = self._split(self.q_proj(query))  # (batch, h, q_len, d_k)
        q, k = self.rotate(q, k)
        # 1) each key/value head serves the h / kv_heads queries of its group
        group = self.h // self.kv_heads
        k = k.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k)
        v = v.repeat_interleave(group, dim=1)  # (batch, h, k_len, d_k)
        if mask is not None:  # (…, q_len, k_len) -> (…, 1, q_len, k_len)
            mask = check_mask(mask, q.size(2), k.size(2))
            mask = mask.unsqueeze(-3) if mask.dim() == 3 else mask
        # 2) attend in every head, with chapter 3's fused kernel
        p = self.p if self.training else 0.0
        x = _fused_attention(q, k, v, mask, p)  # (batch, h, q_len, d_k)
        # 3) concatenate the heads and apply W^O
        return self.out_proj(x.transpose(1, 2).flatten(-2))

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """A position-dependent change of q (batch, h, q_len, d_k) and k
        (batch, kv_heads, k_len, d_k) before scoring: none here (positions
        come with the embeddings); see ``RotaryAttention``."""
        return q, k

    def _split(self, x: Tensor) -> Tensor:
        """(batch, len, heads * d_k) -> (batch, heads, len, d_k)."""
        return x.unflatten(-1, (-1, self.d_k)).transpose(1, 2)


def gqa_from_multihead(mha: MultiHeadedAttention) -> GroupedQueryAttention:
    """A ``GroupedQueryAttention`` with kv_heads = h and ``mha``'s weights:
    the same function as ``mha``. Defined in chapter 11."""
    if not isinstance(mha, MultiHeadedAttention):
        raise ValueError(f"mha must be a MultiHeadedAttention, got {type(mha).__name__}")
    d, has_bias = mha.d_model, mha.in_proj.bias is not None
    gqa = GroupedQueryAttention(mha.h, d, mha.h, mha.dropout.p, has_bias)
    with torch.no_grad():  # in_proj rows: [W^Q; W^K; W^V]
        gqa.q_proj.weight.copy_(mha.in_proj.weight[:d])
        gqa.kv_proj.weight.copy_(mha.in_proj.weight[d:])
        gqa.out_proj.weight.copy_(mha.out_proj.weight)
        if has_bias:
            gqa.q_proj.bias.copy_(mha.in_proj.bias[:d])
            gqa.kv_proj.bias.copy_(mha.in_proj.bias[d:])
            gqa.out_proj.bias.copy_(mha.out_proj.bias)
    return gqa


def kv_cache_bytes(
    layers: int,
    kv_heads: int,
    d_head: int,
    context: int,
    batch: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """Bytes of a key/value cache holding ``context`` positions.

    2 (keys and values) * layers * kv_heads * d_head * context * batch *
    bytes_per_value; e.g. 2 bytes for fp16/bf16, 4 for fp32. Defined in
    chapter 11.
    """
    for name, n in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("d_head", d_head),
        ("context", context),
        ("batch", batch),
        ("bytes_per_value", bytes_per_value),
    ):
        _check_positive(n, name)
    return 2 * layers * kv_heads * d_head * context * batch * bytes_per_value


def apply_rope(x: Tensor, start: int = 0, base: float = 10000.0) -> Tensor:
    """Rotary position embedding: rotate feature pairs by position angles.

    Pair i (features 2i and 2i + 1, the interleaved layout of chapter 4's
    table) of the row at position m is rotated by the angle
    m * base^(-2i/d): the frequencies of the sinusoidal encoding. For a
    query at position m and a key at n, the rotated q . k then depends on
    m - n only (Su et al., 2021, RoFormer).

    Args:
        x: (..., len, d) with d even; its rows are positions start, start +
            1, ... (e.g. queries or keys, (batch, heads, len, d_k)).
        start: the position of the first row, >= 0.
        base: the base of the frequencies (10000, as in chapter 4).

    Returns a tensor of x's shape and dtype. Defined in chapter 11.
    """
    start = _check_rope_args(x, start, base)
    d, n = x.size(-1), x.size(-2)
    omega = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pos = torch.arange(start, start + n, dtype=torch.float64)
    angle = (pos[:, None] * omega).to(x.device)  # (len, d/2), exact in fp64
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., len, d/2): each pair
    # (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos) in every plane
    rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.flatten(-2)  # (..., len, d), pairs interleaved again


class RotaryAttention(GroupedQueryAttention):
    """Grouped-query attention with rotary position embeddings (RoPE).

    Queries and keys are rotated by ``apply_rope`` after their projection,
    so the scores depend on positions through their offset only, and no
    positional encoding is added to the embeddings (Su et al., 2021). Keys
    are rotated when read, so a cache holds them unrotated (simple, and the
    interface stays ``MultiHeadedAttention``'s; production code caches
    rotated keys). Arguments as ``GroupedQueryAttention``, plus ``base``.
    Defined in chapter 11.
    """

    def __init__(
        self,
        h: int,
        d_model: int,
        kv_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        base: float = 10000.0,
    ) -> None:
        super().__init__(h, d_model, kv_heads, dropout, bias)
        if self.d_k % 2:
            raise ValueError(f"d_model / h must be even, got {self.d_k}")
        self.base = float(base)

    def rotate(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        k_len, q_len = k.size(2), q.size(2)
        k = apply_rope(k, 0, self.base)  # positions 0 .. k_len - 1
        q = apply_rope(q, k_len - q_len, self.base)  # the last q_len of them
        return q, k
