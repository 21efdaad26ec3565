"""Greedy and beam-search decoding with a key/value cache (generated).

Written from chapters/07_decoding.ipynb (7. Decoding)
by tools/export.py: do not edit. Edit the chapter and run `make export`."""

__all__ = ["KVCache", "decode_step", "greedy_decode", "gnmt_length_penalty", "beam_search"]

import functools
import math
import operator
from collections.abc import Callable

import torch
from torch import Tensor, nn

from transformer_lib.masks import subsequent_mask


class KVCache:
    """The keys and values the decoder has computed, one entry per layer.

    Self-attention: ``self_kv[l] = (k, v)``, each (batch, h, t, d_k) for the t
    target positions decoded so far; every step appends one position. Source
    attention: ``src_kv[l]``, each (batch, h, src_len, d_k), is projected once
    from the encoder output and reused at every step. The decoder is the one
    of paper section 3.1, run one position at a time (the paper does not
    describe the cache).
    Defined in chapter 7.

    Args:
        model: an ``EncoderDecoder`` (chapter 5).
        memory: (batch, src_len, d_model) encoder output.
    """

    def __init__(self, model: nn.Module, memory: Tensor) -> None:
        layers = model.decoder.layers
        self.src_kv = [layer.src_attn.project_kv(memory, memory) for layer in layers]
        # one (k, v) per layer once the first target token is decoded
        self.self_kv: list[tuple[Tensor, Tensor] | None] = [None] * len(layers)
        self.length = 0  # target positions already in the cache

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append a step's k, v (batch, h, 1, d_k) to a layer; return all."""
        if self.self_kv[layer] is not None:
            k_past, v_past = self.self_kv[layer]
            k = torch.cat([k_past, k], dim=2)  # (batch, h, t+1, d_k)
            v = torch.cat([v_past, v], dim=2)  # (batch, h, t+1, d_k)
        self.self_kv[layer] = (k, v)
        return k, v

    def reorder(self, index: Tensor, sources: bool = False) -> None:
        """Keep the self-attention entries of batch rows ``index``, in order.

        Beam search calls it with each surviving hypothesis's parent row, a
        row of the same sentence, so the source entries can stay as they
        are. When sentences leave the batch (``sources=True``), ``index``
        has fewer rows, and the source entries are selected too.
        """
        self.self_kv = [
            None if kv is None else (kv[0].index_select(0, index), kv[1].index_select(0, index))
            for kv in self.self_kv
        ]
        if sources:
            self.src_kv = [
                (k.index_select(0, index), v.index_select(0, index)) for k, v in self.src_kv
            ]


def _decoder_layer_step(
    layer: nn.Module, x: Tensor, cache: KVCache, l: int, src_mask: Tensor
) -> Tensor:
    """``DecoderLayer.forward`` for the newest position, using ``cache``."""

    def self_attn(y: Tensor) -> Tensor:
        # y: (batch, 1, d_model), already normalized under pre-norm
        # 1) project only the new position's key and value, append them to
        # the cache: (batch, h, t+1, d_k) each
        k, v = cache.append(l, *layer.self_attn.project_kv(y, y))
        # 2) the new query attends over every position so far: nothing to mask
        return layer.self_attn.attend(y, k, v)

    src_k, src_v = cache.src_kv[l]  # projected once, from memory
    x = layer.sublayer[0](x, self_attn)
    x = layer.sublayer[1](x, lambda y: layer.src_attn.attend(y, src_k, src_v, src_mask))
    return layer.sublayer[2](x, layer.feed_forward)


def decode_step(model: nn.Module, cache: KVCache, tokens: Tensor, src_mask: Tensor) -> Tensor:
    """The decoder output at one new position per sentence, using ``cache``.

    Equals the last position of ``model.decode(memory, src_mask, prefix,
    subsequent_mask(t + 1))`` when the prefix's first t tokens are already
    in the cache, at the cost of one position instead of t+1. Incremental
    decoding of the decoder of Vaswani et al. (2017), section 3.1. Defined
    in chapter 7.

    Args:
        model: an ``EncoderDecoder`` (chapter 5), in eval mode.
        cache: the ``KVCache`` built from this batch's memory;
            ``cache.length`` is t.
        tokens: (batch, 1) the token at position t (the latest one generated).
        src_mask: (batch, 1, src_len) bool, True = may attend.

    Returns:
        (batch, 1, d_model) decoder output at position t (after the final
        norm, if any).
    """
    embed, positional = model.tgt_embed[0], model.tgt_embed[1]
    # (batch, 1, d_model): position t
    x = positional(embed(tokens), start=cache.length)
    for l, layer in enumerate(model.decoder.layers):
        # (batch, 1, d_model)
        x = _decoder_layer_step(layer, x, cache, l, src_mask)
    cache.length += 1
    return model.decoder.norm(x)


class _NextTokenLogProbs:
    """log P(next token | source, prefix) per row: KV cache or re-decoding."""

    def __init__(
        self,
        model: nn.Module,
        memory: Tensor,
        src_mask: Tensor,
        use_cache: bool,
    ):
        self.model, self.memory, self.src_mask = model, memory, src_mask
        # A model with its own incremental decoder (a recurrent model, say)
        # brings its own cache, with a step(tokens) method.
        start = getattr(model, "start_decoding", None)
        if not use_cache:
            self.cache = None
        elif start is not None:
            self.cache = start(memory, src_mask)
        else:
            self.cache = KVCache(model, memory)

    def __call__(self, ys: Tensor) -> Tensor:
        """ys: (rows, t) prefixes -> (rows, vocab) log-probabilities."""
        if self.cache is None:
            # The textbook way: decode the whole prefix again, every step.
            tgt_mask = subsequent_mask(ys.size(1), device=ys.device)
            out = self.model.decode(self.memory, self.src_mask, ys, tgt_mask)
        elif self.cache.length != ys.size(1) - 1:
            raise RuntimeError("the cache must hold every token of the prefix but the last")
        elif isinstance(self.cache, KVCache):
            # Only the newest token: the cache holds the others.
            newest = ys[:, -1:]
            out = decode_step(self.model, self.cache, newest, self.src_mask)
        else:
            out = self.cache.step(ys[:, -1:])
        # float32 even under autocast: the beams add these up.
        return self.model.generator(out[:, -1]).float()

    def reorder(self, index: Tensor, sources: bool = False) -> None:
        """Keep rows ``index``; ``sources``: rows of finished sentences go."""
        if sources:
            self.src_mask = self.src_mask.index_select(0, index)
            if self.cache is None:  # only re-decoding reads the memory
                self.memory = self.memory.index_select(0, index)
        if self.cache is not None:
            self.cache.reorder(index, sources)


@torch.no_grad()
def greedy_decode(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol: int | None = None,
    use_cache: bool = True,
) -> Tensor:
    """Greedy decoding: at every step append the most probable next token.

    The output starts with ``start_symbol`` and has at most ``max_len`` tokens
    *including* it, i.e. at most ``max_len - 1`` generated tokens. A sentence
    that emits ``end_symbol`` is finished: its later positions are filled
    with ``end_symbol``, and decoding stops as soon as every sentence is
    finished (so the output may be shorter than ``max_len``). Without an
    ``end_symbol`` exactly ``max_len`` tokens are returned. Call
    ``model.eval()`` first. Auto-regressive decoding, Vaswani et al. (2017),
    section 3. Defined in chapter 7.

    Args:
        model: an ``EncoderDecoder`` (chapter 5).
        src: (batch, src_len) integer token ids.
        src_mask: (batch, 1, src_len) bool, True = may attend (a real, non-pad
            token).
        max_len: maximum output length, counting the start symbol; >= 1.
        start_symbol: the token id the output starts with.
        end_symbol: the token id that finishes a sentence, or None to always
            decode ``max_len``.
        use_cache: decode incrementally with a ``KVCache``, or re-run the
            decoder over the whole prefix at every step (the textbook
            version); both give the same tokens.

    Returns:
        (batch, length) LongTensor, ``length <= max_len``; column 0 is
        ``start_symbol``.
    """
    _check_decode_args(model, src, src_mask, max_len, start_symbol, end_symbol)
    memory = model.encode(src, src_mask)  # (batch, src_len, d_model)
    next_log_probs = _NextTokenLogProbs(model, memory, src_mask, use_cache)
    ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len - 1):
        next_token = next_log_probs(ys).argmax(dim=-1)  # (batch,)
        if end_symbol is not None:
            # pad finished sentences
            next_token = next_token.masked_fill(finished, end_symbol)
            finished |= next_token == end_symbol
        ys = torch.cat([ys, next_token.unsqueeze(1)], dim=1)  # (batch, t+1)
        if finished.all():
            break
    return ys


def _vocab_size(model: nn.Module) -> int:
    """Output vocabulary size: out_features of the generator's last Linear."""
    linears = [m for m in model.generator.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("model.generator must contain an nn.Linear projection to the vocabulary")
    return linears[-1].out_features


def _check_symbol(name: str, symbol: object, vocab: int) -> None:
    try:
        index = operator.index(symbol)
    except TypeError:
        index = None
    if index is None or not 0 <= index < vocab:
        raise ValueError(
            f"{name} must be a token id in [0, {vocab}) (the generator's "
            f"output size), got {symbol!r}"
        )


def _check_decode_args(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol,
) -> None:
    """Raise ValueError naming the argument for input the decoders reject."""
    if (
        not isinstance(src, Tensor)
        or src.is_floating_point()
        or src.is_complex()
        or (src.dtype == torch.bool)
    ):
        kind = src.dtype if isinstance(src, Tensor) else type(src).__name__
        raise ValueError(f"src must be an integer tensor of token ids, got {kind}")
    if src.dim() != 2:
        raise ValueError(f"src must have shape (batch, src_len), got shape {tuple(src.shape)}")
    if not isinstance(src_mask, Tensor) or src_mask.dtype != torch.bool:
        kind = src_mask.dtype if isinstance(src_mask, Tensor) else type(src_mask).__name__
        raise ValueError(f"src_mask must be a bool tensor (True = may attend), got {kind}")
    if src_mask.dim() < 2 or src_mask.size(0) != src.size(0):
        raise ValueError(
            f"src_mask must have the batch size of src ({src.size(0)}) in "
            f"dim 0, got shape {tuple(src_mask.shape)}"
        )
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(
            f"max_len must be an int >= 1 (it counts the start symbol), got {max_len!r}"
        )
    vocab = _vocab_size(model)
    _check_symbol("start_symbol", start_symbol, vocab)
    if end_symbol is not None:
        _check_symbol("end_symbol", end_symbol, vocab)


def gnmt_length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """The length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016).

    A hypothesis scores log P(Y | X) / lp(Y): alpha = 0 gives plain
    log-probabilities, larger alpha favors longer outputs. Vaswani et al.
    (2017), section 6.1, use alpha = 0.6. Defined in chapter 7.

    Args:
        length: |Y|, the number of generated tokens (see ``beam_search`` for
            what counts).
        alpha: the exponent, >= 0 in practice.
    """
    return ((5 + length) / 6) ** alpha


def _check_beam_args(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    max_len: int | list[int] | Tensor,
    start_symbol: object,
    end_symbol: object,
    beam_size: int,
    n_best: int,
    length_penalty: float,
) -> list:
    """Raise ValueError naming a bad argument; return max_len per sentence."""
    _check_decode_args(model, src, src_mask, 1, start_symbol, end_symbol)
    _check_symbol("end_symbol", end_symbol, _vocab_size(model))  # required
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}")
    if isinstance(n_best, bool) or not isinstance(n_best, int) or not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be an int in [1, beam_size={beam_size}], got {n_best!r}")
    if not isinstance(length_penalty, (int, float)) or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number (alpha), got {length_penalty!r}")
    limits = _sentence_limits(max_len, src.size(0))
    _check_penalty_range(length_penalty, max(limits, default=0) + 1)
    return limits


def _check_penalty_range(alpha: float, longest: int) -> None:
    """Refuse an alpha whose penalty overflows or vanishes (1e6 raised
    OverflowError deep in the search): lp must stay a positive float."""
    for n in (0, longest):
        try:
            lp = gnmt_length_penalty(n, alpha)
        except OverflowError:
            lp = math.inf
        if not 0 < lp < math.inf:
            raise ValueError(
                f"length_penalty {alpha!r} is too large in size: the "
                f"penalty ((5 + {n}) / 6) ** alpha is {lp} (use an alpha "
                "between 0 and a few)"
            )


def _finish(
    finished: list,
    done: list,
    ys: Tensor,
    top: Tensor,
    origin: Tensor,
    is_eos: Tensor,
    end_symbol: int,
    lp: float,
) -> None:
    """Move EOS extensions among a sentence's best k to its finished list.

    ys (batch*k, t): the prefixes. top, origin, is_eos (batch, >= k): the
    ranked extensions' log P, parent beam and whether they end in EOS.
    """
    k = ys.size(0) // len(done)
    eos = (is_eos & top.isfinite())[:, :k].tolist()
    for b in range(len(done)):
        for j in range(k):
            if eos[b][j] and not done[b]:
                tokens = torch.cat([ys[b * k + origin[b, j]], ys.new_tensor([end_symbol])])
                finished[b].append((top[b, j].item() / lp, tokens))


def _mark_done(
    finished: list,
    done: list,
    limits: list,
    scores: Tensor,
    ys: Tensor,
    n_best: int,
    lp: Callable[[int], float],
) -> None:
    """A sentence is done once no live hypothesis can beat its n_best-th,
    or once its hypotheses (ys, (batch*k, t+1)) reach its limit.

    A live hypothesis's log P (``scores``, (batch, k)) only falls as it grows,
    so its final score is at most log P over the largest length penalty it
    can still reach, at t+1 tokens or at the limit.
    """
    t = ys.size(1) - 1  # tokens generated so far
    best_alive = scores.max(dim=1).values.tolist()  # (batch,)
    for b in range(len(done)):
        if not done[b] and len(finished[b]) >= n_best:
            # the n_best-th best score among the finished hypotheses
            nth = sorted((s for s, _ in finished[b]), reverse=True)[n_best - 1]
            best_lp = max(lp(t + 1), lp(limits[b] - 1))
            done[b] = nth >= best_alive[b] / best_lp
    _add_live(finished, done, limits, scores, ys, lp(t))


def _start_beams(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    k: int,
    start_symbol: int,
    use_cache: bool,
) -> tuple[_NextTokenLogProbs, Tensor, Tensor]:
    """The k beams of each sentence before the first step.

    Sentence b's beam j is row b*k + j. Returns the next-token scorer, the
    prefixes ys (batch*k, 1) and log P(prefix) per beam (batch, k).
    """
    batch, device = src.size(0), src.device
    # (batch*k, src_len, d_model) and (batch*k, 1, src_len)
    memory = model.encode(src, src_mask).repeat_interleave(k, dim=0)
    src_mask = src_mask.repeat_interleave(k, dim=0)
    next_log_probs = _NextTokenLogProbs(model, memory, src_mask, use_cache)
    ys = torch.full((batch * k, 1), start_symbol, dtype=torch.long, device=device)
    # all k beams start identical, so only beam 0 lives
    scores = torch.full((batch, k), -math.inf, device=device)
    scores[:, 0] = 0.0
    return next_log_probs, ys, scores


def _keep_live(
    done: list,
    finished: list,
    limits: list,
    scores: Tensor,
    parents: Tensor,
    ys: Tensor,
) -> tuple[list, list, Tensor, Tensor, Tensor]:
    """Drop the sentences that are done: their finished lists, their limits,
    their scores (batch, k) and their rows of parents and ys (batch*k, ...).
    """
    k = scores.size(1)
    live = [b for b, is_done in enumerate(done) if not is_done]
    finished, limits = [finished[b] for b in live], [limits[b] for b in live]
    live = torch.tensor(live, dtype=torch.long, device=scores.device)
    rows = (k * live[:, None] + torch.arange(k, device=live.device)).flatten()
    scores = scores.flatten()[rows].view(len(finished), k)
    return finished, limits, scores, parents[rows], ys[rows]


def _add_live(
    finished: list,
    done: list,
    limits: list,
    scores: Tensor,
    ys: Tensor,
    lp: float,
) -> None:
    """A sentence whose hypotheses have reached its limit is done: its live
    hypotheses join the finished ones as they are (without EOS). scores
    (batch, k) are their log P, ys (batch*k, t) their tokens."""
    k, t = scores.size(1), ys.size(1)
    for b in range(len(done)):
        if done[b] or limits[b] > t:
            continue
        for j in range(k):
            if math.isfinite(scores[b, j].item()):
                finished[b].append((scores[b, j].item() / lp, ys[b * k + j]))
        done[b] = True


def _sentence_limits(max_len: int | list[int] | Tensor, batch: int) -> list:
    """``beam_search``'s max_len, one int per sentence, checked."""
    if isinstance(max_len, Tensor):
        if max_len.dim() != 1 or max_len.is_floating_point():
            raise ValueError(
                "max_len must be an int, or a 1-D integer tensor (one per "
                f"sentence), got a {max_len.dtype} of shape "
                f"{tuple(max_len.shape)}"
            )
        max_len = max_len.tolist()
    if isinstance(max_len, (list, tuple)):
        if len(max_len) != batch:
            raise ValueError(
                f"max_len must hold one limit per sentence ({batch}), got {len(max_len)}"
            )
        limits = list(max_len)
    else:
        limits = [max_len] * batch
    for m in limits:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(
                "max_len must be an int >= 1 (it counts the start symbol), "
                f"or a list of them, got {m!r}"
            )
    return limits


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: Tensor,
    src_mask: Tensor,
    max_len: int | list[int] | Tensor,
    start_symbol: int,
    end_symbol: int,
    beam_size: int = 4,
    length_penalty: float = 0.6,
    n_best: int = 1,
    use_cache: bool = True,
) -> list[list[tuple[Tensor, float]]]:
    """Beam search: keep the ``beam_size`` most probable partial outputs.

    A hypothesis Y scores log P(Y | X) / lp(|Y|) (``gnmt_length_penalty``;
    |Y| counts the generated tokens and the final EOS). A sentence stops
    when no live hypothesis can beat its n_best-th finished one, or at its
    ``max_len``. Call ``model.eval()`` first. Vaswani et al. (2017),
    section 6.1 (beam size 4, alpha 0.6). Defined in chapter 7.

    Args:
        model: an ``EncoderDecoder`` (chapter 5).
        src: (batch, src_len) integer token ids.
        src_mask: (batch, 1, src_len) bool, True = may attend.
        max_len: longest hypothesis, with the start symbol and EOS; >= 1;
            one int, or one per sentence (a list or 1-D tensor), so that
            sentences of different lengths share a batch unaffected.
        start_symbol, end_symbol: the ids that start and finish a hypothesis.
        beam_size: live hypotheses per sentence (k); >= 1.
        length_penalty: alpha of the length penalty; 0 ranks by log P.
        n_best: hypotheses returned per sentence, 1 <= n_best <= beam_size.
        use_cache: decode with a ``KVCache``, or re-decode every prefix.

    Returns:
        Per sentence, up to n_best ``(tokens, score)`` pairs, best first
        (fewer if fewer exist, e.g. at max_len 1); ``tokens`` (1-D) starts
        with ``start_symbol``, and ends with ``end_symbol`` if finished.
    """
    limits = _check_beam_args(  # max_len, one per sentence
        model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, n_best, length_penalty
    )
    lp = functools.partial(gnmt_length_penalty, alpha=length_penalty)
    batch, k, device = src.size(0), beam_size, src.device
    next_log_probs, ys, scores = _start_beams(model, src, src_mask, k, start_symbol, use_cache)
    results = finished = [[] for _ in range(batch)]  # (score, tokens) pairs
    done = [False] * batch  # per sentence in the batch (finished shrinks too)
    _add_live(finished, done, limits, scores, ys, lp(0))  # max_len 1: <s>
    for t in range(1, max(limits, default=1)):  # t tokens generated
        if all(done):  # every sentence (at once for an empty batch)
            break
        log_probs = next_log_probs(ys).view(batch, k, -1)  # (batch, k, vocab)
        vocab = log_probs.size(-1)
        # 1) extend every beam by every token: (batch, k*vocab) candidates;
        # the 2k best include k that do not end in EOS
        candidates = (scores.unsqueeze(-1) + log_probs).flatten(1)
        top, index = candidates.topk(min(2 * k, candidates.size(1)), dim=-1)
        origin, token = index // vocab, index % vocab  # parent beam, token
        is_eos = token == end_symbol  # (batch, 2k)
        # 2) EOS among the best k: that hypothesis finishes, leaves the beam
        _finish(finished, done, ys, top, origin, is_eos, end_symbol, lp(t))
        # 3) the best k without EOS are the new beam; prefixes follow parents
        rank = torch.arange(top.size(1), device=device) + is_eos * top.size(1)
        keep = rank.argsort(dim=-1)[:, :k]  # (batch, k)
        scores = top.gather(1, keep)
        first_row = k * torch.arange(batch, device=device)[:, None]
        parents = (first_row + origin.gather(1, keep)).flatten()  # (batch*k,)
        new = token.gather(1, keep).view(-1, 1)  # (batch*k, 1)
        ys = torch.cat([ys.index_select(0, parents), new], dim=1)
        # 4) done: no live hypothesis can beat the n_best-th, or at max_len
        _mark_done(finished, done, limits, scores, ys, n_best, lp)
        # 5) done sentences leave the batch; the cache follows the parents
        shrink = any(done)
        if shrink:
            finished, limits, scores, parents, ys = _keep_live(
                done, finished, limits, scores, parents, ys
            )
            batch, done = len(finished), [False] * len(finished)
        next_log_probs.reorder(parents, sources=shrink)
    ranked = [sorted(f, key=lambda e: -e[0])[:n_best] for f in results]
    return [[(tokens, score) for score, tokens in r] for r in ranked]
