"""The configurations, seeded batches and models that the training benchmark times.

Imported by ``bench.train_throughput`` (run ``python -m bench.train_throughput``); measures
nothing by itself. Four models do one training step on the same seeded batches:

* ``ours``: ``transformer_lib.model.make_model`` as shipped (the padding skip of the
  feed-forward blocks, chapter 5's ``Dropout``; attention by ``MultiHeadedAttention``'s rule:
  chapter 1's explicit path when training with dropout on the weights on a CPU under bf16
  autocast, the fused kernel otherwise); :func:`fused_attention` puts it on the fused kernel
  everywhere (the previous default, kept as the rule's evidence);
* ``nn``: ``torch.nn.Transformer`` with the same sizes, dropout and norm placement (post-norm),
  fed by deep copies of our embedding and generator modules. Its encoder and decoder always
  end with an extra LayerNorm (two more LayerNorms than ours): a negligible cost;
* ``textbook``: ours with every piece computed the way its formula reads, the reference
  definitions the chapters test the package against: chapter 1's explicit attention, chapter
  5's LayerNorm written out, ``nn.Dropout`` and every position computed (the benchmark's
  reference step adds chapter 6's dense loss);
* ``explicit_attention``: ours with only the attention on chapter 1's explicit path, in every
  setting (``store_attention``: the weights are kept too).

:func:`same_math_check` copies our weights into ``nn.Transformer`` and checks that the two
compute the same function.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable

import torch
from torch import nn

from transformer_lib.layers import (
    DecoderLayer,
    Dropout,
    EncoderLayer,
    LayerNorm,
    layer_norm_by_hand,
)
from transformer_lib.model import make_model
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.training import Batch
from transformer_lib.translation.data import PAD


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Model size and batch shape of one benchmark configuration."""

    name: str
    d_model: int
    N: int  # encoder layers = decoder layers
    h: int
    d_ff: int
    vocab: int = 8000  # source and target vocabulary (separate embeddings, make_model's default)
    dropout: float = 0.1  # everywhere: embeddings, residuals, attention weights, FFN
    batch_size: int = 64  # sentence pairs per batch
    min_len: int = 16  # source and target lengths drawn uniformly from [min_len, max_len]
    max_len: int = 64
    n_batches: int = 4  # batches per timed round (one step each)
    warmup: int = 1  # untimed rounds
    repeats: int = 5  # timed rounds per model
    smoothing: float = 0.1


CONFIGS = {
    "small": BenchConfig("small", d_model=256, N=3, h=4, d_ff=1024, n_batches=2),
    "base": BenchConfig("base", d_model=512, N=6, h=8, d_ff=2048, batch_size=48, n_batches=1),
    # For tests and quick looks; not part of the committed results.
    "tiny": BenchConfig(
        "tiny",
        d_model=32,
        N=1,
        h=2,
        d_ff=64,
        vocab=50,
        batch_size=4,
        min_len=3,
        max_len=9,
        n_batches=2,
        warmup=1,
        repeats=2,
    ),
}


def random_batches(cfg: BenchConfig, device: torch.device, seed: int = 0) -> list[Batch]:
    """A fixed, seeded list of padded batches of random ids; each sentence has its own lengths.

    Token ids are drawn from [1, vocab) (0 is padding). ``Batch`` builds the masks, shifts the
    target and counts the non-pad target tokens.
    """
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(cfg.n_batches):
        s_lens = [rng.randint(cfg.min_len, cfg.max_len) for _ in range(cfg.batch_size)]
        t_lens = [rng.randint(cfg.min_len, cfg.max_len) for _ in range(cfg.batch_size)]
        src = torch.full((cfg.batch_size, max(s_lens)), PAD, dtype=torch.long)
        tgt = torch.full((cfg.batch_size, max(t_lens) + 1), PAD, dtype=torch.long)  # +1: shift
        for i, (s, t) in enumerate(zip(s_lens, t_lens)):
            src[i, :s] = torch.randint(1, cfg.vocab, (s,), generator=g)
            tgt[i, : t + 1] = torch.randint(1, cfg.vocab, (t + 1,), generator=g)
        batches.append(Batch(src.to(device), tgt.to(device), pad=PAD))
    return batches


# --------------------------------------------------------------------------- the models


class NNTransformerSeq2Seq(nn.Module):
    """torch.nn.Transformer between our embeddings and our generator (nn masks: True = masked)."""

    def __init__(
        self, core: nn.Transformer, src_embed: nn.Module, tgt_embed: nn.Module, generator: nn.Module
    ) -> None:
        super().__init__()
        self.core = core
        self.src_embed, self.tgt_embed, self.generator = src_embed, tgt_embed, generator

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decoder states (B, T, d_model). Called as our ``EncoderDecoder`` is, so that one
        training step serves both; our masks are ignored: nn.Transformer's own are built from
        the padding (the same masks, in its convention)."""
        src_pad = src == PAD  # (B, S) True = padding
        tgt_pad = tgt == PAD  # (B, T)
        T = tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)  # True = future
        return self.core(
            self.src_embed(src),
            self.tgt_embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )  # (B, T, d_model)


def build_ours(
    cfg: BenchConfig, device: torch.device, seed: int = 0, paper_dropout: bool = False
) -> nn.Module:
    """``make_model`` at cfg's size; ``paper_dropout`` sets attention and FFN dropout to 0."""
    torch.manual_seed(seed)
    extra = {"attn_dropout": 0.0, "ffn_dropout": 0.0} if paper_dropout else {}
    return make_model(
        cfg.vocab,
        cfg.vocab,
        N=cfg.N,
        d_model=cfg.d_model,
        d_ff=cfg.d_ff,
        h=cfg.h,
        dropout=cfg.dropout,
        **extra,
    ).to(device)


def build_nn(
    cfg: BenchConfig, device: torch.device, seed: int = 0, paper_dropout: bool = False
) -> NNTransformerSeq2Seq:
    """nn.Transformer with cfg's sizes, post-norm, ReLU; embeddings/generator copied from ours."""
    ours = build_ours(cfg, torch.device("cpu"), seed)
    core = nn.Transformer(
        d_model=cfg.d_model,
        nhead=cfg.h,
        num_encoder_layers=cfg.N,
        num_decoder_layers=cfg.N,
        dim_feedforward=cfg.d_ff,
        dropout=cfg.dropout,
        activation="relu",
        layer_norm_eps=1e-6,  # transformer_lib.layers.LayerNorm's eps
        batch_first=True,
        norm_first=False,
    )
    if paper_dropout:  # the same placement as make_model(attn_dropout=0, ffn_dropout=0)
        for layer in [*core.encoder.layers, *core.decoder.layers]:
            layer.dropout.p = 0.0  # the FFN's hidden activations (dropout1/2/3 stay)
            for mha in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if mha is not None:
                    mha.dropout = 0.0  # the attention weights
    model = NNTransformerSeq2Seq(
        core,
        copy.deepcopy(ours.src_embed),
        copy.deepcopy(ours.tgt_embed),
        copy.deepcopy(ours.generator),
    )
    return model.to(device)


class LayerNormByHand(nn.Module):
    """A module around chapter 5's ``layer_norm_by_hand``, with an existing LayerNorm's parameters.

    mean, biased variance, subtract, add eps, square root, divide, scale, shift: eight
    elementwise/reduction operations, each a pass over the tensor, and as many in the backward.
    """

    def __init__(self, norm: LayerNorm) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_by_hand(x, self.weight, self.bias, self.eps)


def replace_modules(model: nn.Module, cls: type, make: Callable[[nn.Module], nn.Module]) -> int:
    """Replace every submodule of type ``cls`` by ``make(it)``; returns how many were replaced."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, cls):
                setattr(parent, name, make(child))
                n += 1
    return n


def nn_dropouts(model: nn.Module) -> int:
    """Replace every chapter-5 ``Dropout`` by an ``nn.Dropout`` of the same p (the same
    distribution, PyTorch's mask sampler). Returns the number of modules replaced."""
    return replace_modules(model, Dropout, lambda m: nn.Dropout(m.p))


def layernorms_by_hand(model: nn.Module) -> int:
    """Replace every ``transformer_lib.layers.LayerNorm`` by :class:`LayerNormByHand` (same
    parameters, same function). Returns the number of modules replaced."""
    return replace_modules(model, LayerNorm, LayerNormByHand)


def every_position(model: nn.Module) -> nn.Module:
    """Switch the padding skip of every encoder and decoder layer off (``skip_padding=False``):
    the feed-forward blocks then run on padding positions too."""
    for m in model.modules():
        if isinstance(m, (EncoderLayer, DecoderLayer)):
            m.skip_padding = False
    return model


def explicit_attention(model: nn.Module, n_expected: int) -> nn.Module:
    """Route every ``MultiHeadedAttention`` through chapter 1's explicit path."""
    n = 0
    for m in model.modules():
        if isinstance(m, MultiHeadedAttention):
            m.store_attention = True
            n += 1
    if n != n_expected:
        raise RuntimeError(f"expected {n_expected} attention layers, found {n}")
    return model


def fused_attention(model: nn.Module, n_expected: int) -> nn.Module:
    """Put every ``MultiHeadedAttention`` on PyTorch's fused kernel, dropout included
    (``always_fused``): the default before the rule, whose timing is the rule's evidence."""
    n = 0
    for m in model.modules():
        if isinstance(m, MultiHeadedAttention):
            m.always_fused = True
            n += 1
    if n != n_expected:
        raise RuntimeError(f"expected {n_expected} attention layers, found {n}")
    return model


def build_explicit_attention(
    cfg: BenchConfig, device: torch.device, seed: int = 0, paper_dropout: bool = False
) -> nn.Module:
    """Ours with every attention layer on chapter 1's explicit path (``store_attention``)."""
    return explicit_attention(build_ours(cfg, device, seed, paper_dropout), 3 * cfg.N)


def build_textbook(
    cfg: BenchConfig, device: torch.device, seed: int = 0, paper_dropout: bool = False
) -> nn.Module:
    """Ours with explicit attention, LayerNorm by hand, ``nn.Dropout`` and every position
    computed, as the Annotated Transformer does (the reference step adds the dense loss)."""
    model = every_position(build_explicit_attention(cfg, device, seed, paper_dropout))
    layernorms_by_hand(model)
    nn_dropouts(model)
    return model


BUILDERS = {
    "ours": build_ours,
    "nn": build_nn,
    "textbook": build_textbook,
    "explicit_attention": build_explicit_attention,
}


# --------------------------------------------------------------------------- same math check


def copy_ours_to_nn(ours: nn.Module, theirs: NNTransformerSeq2Seq) -> None:
    """Copy every weight of our model into the nn.Transformer wrapper (same math afterwards)."""
    theirs.src_embed.load_state_dict(ours.src_embed.state_dict())
    theirs.tgt_embed.load_state_dict(ours.tgt_embed.state_dict())
    theirs.generator.load_state_dict(ours.generator.state_dict())
    _copy_stack(ours.encoder.layers, theirs.core.encoder.layers, decoder=False)
    _copy_stack(ours.decoder.layers, theirs.core.decoder.layers, decoder=True)


def _copy_mha(src: MultiHeadedAttention, dst: nn.MultiheadAttention) -> None:
    dst.in_proj_weight.copy_(src.in_proj.weight)
    dst.in_proj_bias.copy_(src.in_proj.bias)
    dst.out_proj.weight.copy_(src.out_proj.weight)
    dst.out_proj.bias.copy_(src.out_proj.bias)


def _copy_norm(src: nn.Module, dst: nn.LayerNorm) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


@torch.no_grad()
def _copy_stack(ours_layers: nn.ModuleList, nn_layers: nn.ModuleList, decoder: bool) -> None:
    for o, t in zip(ours_layers, nn_layers):
        _copy_mha(o.self_attn, t.self_attn)
        if decoder:
            _copy_mha(o.src_attn, t.multihead_attn)
        ff = o.feed_forward
        t.linear1.load_state_dict(ff.w_1.state_dict())
        t.linear2.load_state_dict(ff.w_2.state_dict())
        norms = [s.norm for s in o.sublayer]
        dsts = [t.norm1, t.norm2] + ([t.norm3] if decoder else [])
        for a, b in zip(norms, dsts):
            _copy_norm(a, b)


@torch.no_grad()
def same_math_check(cfg: BenchConfig, device: torch.device) -> float:
    """Max |log-prob difference| between ours and nn.Transformer with copied weights (eval mode).

    nn.Transformer's extra final LayerNorms are removed for this check (``norm = None``): with
    them the two would differ by exactly those two layers. Compared at non-pad target positions.
    """
    ours = build_ours(cfg, device).eval()
    theirs = build_nn(cfg, device).eval()
    theirs.core.encoder.enable_nested_tensor = False  # keep the check on the dense path
    theirs.core.encoder.use_nested_tensor = False
    theirs.core.encoder.norm = None
    theirs.core.decoder.norm = None
    copy_ours_to_nn(ours, theirs)
    b = random_batches(cfg, device, seed=123)[0]
    a = ours.generator(ours(b.src, b.tgt, b.src_mask, b.tgt_mask))
    c = theirs.generator(theirs(b.src, b.tgt))
    keep = b.tgt != PAD
    torch.testing.assert_close(a[keep], c[keep], atol=1e-4, rtol=1e-4)
    return float((a[keep] - c[keep]).abs().max())
