"""Convert our Transformer to CTranslate2, and translate with it on our tokenizer's subwords.

    python -m bench.ct2_convert --out runs/ct2_shipped            # the shipped model
    python -m bench.ct2_convert --checkpoint runs/small/averaged --out runs/ct2_small

CTranslate2 (``pip install ctranslate2``; in the ``bench`` extra, not a dependency of
``transformer_lib``) is an inference engine for Transformer translation models on CPUs. It
runs *our* weights once they are laid out as its ``TransformerSpec``: this module fills the
spec from an ``EncoderDecoder`` and saves it (fp32; int8 is a ``compute_type`` chosen when
the model is loaded, quantizing the same weights). Where the two implementations differ and
the spec must say what ours does:

* positions: CTranslate2's built-in sinusoids start at position 1 and put all sines before
  all cosines; ours start at 0 and interleave them (chapter 4). The spec gets our table.
* layer norm: our epsilon (1e-6) goes into the model's config.
* attention: our ``in_proj`` is [W^Q; W^K; W^V]; self-attention takes it fused, as is;
  cross-attention takes W^Q and the fused [W^K; W^V] as two layers.
* embeddings: ours are multiplied by sqrt(d_model), as CTranslate2's ``scale_embeddings``
  does; with shared embeddings one matrix fills the source and target tables and the output
  layer.
* the source: our encoder input is the subwords + ``</s>``; the converted model adds the
  ``</s>`` itself (``add_source_eos``), so it takes the tokenizer's pieces alone.

The vocabulary is our tokenizer's, by id; ``translate_ids`` gives CTranslate2 token strings
and maps its output back to our ids, which ``decode_ids`` turns into text as for our model.
``tests/test_bench_translate.py`` checks the conversion token for token (greedy) on a small
random model; ``bench/translate.py`` on the shipped one.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_lib.layers import LayerNorm
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.positional import PositionalEncoding
from transformer_lib.translation.data import EOS, SPECIAL_TOKENS

__all__ = ["transformer_spec", "convert", "translate_ids"]


def _np(t: torch.Tensor) -> Any:
    return t.detach().to("cpu", torch.float32).numpy()


def _linear(spec: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _norm(spec: Any, norm: LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _attention(spec: Any, attn: MultiHeadedAttention, *, self_attention: bool) -> None:
    """Self-attention: [W^Q; W^K; W^V] fused. Cross-attention: W^Q, then [W^K; W^V]."""
    w, b, d = attn.in_proj.weight, attn.in_proj.bias, attn.d_model
    if self_attention:
        _linear(spec.linear[0], w, b)
    else:
        _linear(spec.linear[0], w[:d], None if b is None else b[:d])
        _linear(spec.linear[1], w[d:], None if b is None else b[d:])
    _linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)


def _ffn(spec: Any, sublayer: nn.Module, ff: nn.Module) -> None:
    _norm(spec.layer_norm, sublayer.norm)
    _linear(spec.linear_0, ff.w_1.weight, ff.w_1.bias)
    _linear(spec.linear_1, ff.w_2.weight, ff.w_2.bias)


def _inputs(spec: Any, embed: nn.Sequential) -> None:
    """Token table (scaled by sqrt(d_model) in both) and our position table, row 0 = position 0."""
    embeddings, position = embed[0], embed[1]
    if not isinstance(position, PositionalEncoding):
        raise ValueError("only sinusoidal positions convert (a learned table: not written yet)")
    table = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    table.weight = _np(embeddings.lut.weight)
    spec.scale_embeddings = True  # x sqrt(d_model), as our Embeddings
    spec.position_encodings.encodings = _np(position.pe)  # (max_len, d_model)


def transformer_spec(model: nn.Module, tokens: Sequence[str]) -> Any:
    """CTranslate2's ``TransformerSpec`` of an ``EncoderDecoder`` (chapter 5), weights set.

    Args:
        model: pre-norm or post-norm, sinusoidal positions, ReLU or GELU; shared embeddings
            or not (one vocabulary either way: the tokenizer's).
        tokens: the vocabulary, token string by id (``SPECIAL_TOKENS`` first).
    """
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec as ts

    enc, dec = model.encoder.layers, model.decoder.layers
    if list(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
        raise ValueError(f"the vocabulary must start with {SPECIAL_TOKENS}")
    first = enc[0]
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    spec = ts.TransformerSpec.from_config(
        (len(enc), len(dec)), first.self_attn.h, pre_norm=first.norm_first,
        activation=activation[first.feed_forward.activation],
    )
    spec.config.layer_norm_epsilon = model.encoder.layers[0].sublayer[0].norm.eps
    spec.config.add_source_eos = True  # our encoder reads ids + </s>
    _inputs(spec.encoder, model.src_embed)
    _inputs(spec.decoder, model.tgt_embed)
    for s, layer in zip(spec.encoder.layer, enc):
        _attention(s.self_attention, layer.self_attn, self_attention=True)
        _norm(s.self_attention.layer_norm, layer.sublayer[0].norm)
        _ffn(s.ffn, layer.sublayer[1], layer.feed_forward)
    for s, layer in zip(spec.decoder.layer, dec):
        _attention(s.self_attention, layer.self_attn, self_attention=True)
        _norm(s.self_attention.layer_norm, layer.sublayer[0].norm)
        _attention(s.attention, layer.src_attn, self_attention=False)
        _norm(s.attention.layer_norm, layer.sublayer[1].norm)
        _ffn(s.ffn, layer.sublayer[2], layer.feed_forward)
    if first.norm_first:  # a pre-norm stack ends with a LayerNorm
        _norm(spec.encoder.layer_norm, model.encoder.norm)
        _norm(spec.decoder.layer_norm, model.decoder.norm)
    _linear(spec.decoder.projection, model.generator.proj.weight, model.generator.proj.bias)
    spec.register_source_vocabulary(list(tokens))
    spec.register_target_vocabulary(list(tokens))
    return spec


def vocabulary(tok: Any) -> list[str]:
    """The tokenizer's token strings, by id."""
    return [tok.id_to_token(i) for i in range(tok.get_vocab_size())]


def convert(model: nn.Module, tok: Any, out_dir: str | Path) -> Path:
    """Write the CTranslate2 model of `model` (fp32 weights) to `out_dir` (replaced)."""
    from ctranslate2.converters.converter import Converter

    spec = transformer_spec(model, vocabulary(tok))

    class _Spec(Converter):
        def _load(self) -> Any:
            return spec

    return Path(_Spec().convert(str(out_dir), force=True))


def translate_ids(
    translator: Any,
    tok: Any,
    sources: Sequence[Sequence[int]],
    *,
    beam_size: int,
    length_penalty: float = 1.0,
    patience: float = 1.0,
    max_decoding_length: int = 256,
    max_batch_size: int = 0,
) -> list[list[int]]:
    """CTranslate2's best output ids (no ``<s>``, no ``</s>``) for sources of our ids + EOS.

    `length_penalty`: CTranslate2's beta, scoring log P / |Y|^beta (not our GNMT alpha).
    `patience`: CTranslate2 ends a sentence's search when patience x beam_size hypotheses
    have finished (1, its default: beam_size of them).
    `max_batch_size`: sentences per batch, CTranslate2 sorting them by length (0: one batch).
    """
    tokens = [[tok.id_to_token(i) for i in (ids[:-1] if ids[-1:] == [EOS] else ids)]
              for ids in sources]
    results = translator.translate_batch(
        tokens, beam_size=beam_size, length_penalty=length_penalty, patience=patience,
        max_decoding_length=max_decoding_length, max_batch_size=max_batch_size,
        min_decoding_length=0,  # CTranslate2's default 1 forbids </s> first; ours allows it
    )
    return [[tok.token_to_id(t) for t in r.hypotheses[0]] for r in results]


def main(argv: list[str] | None = None) -> Path:
    from transformer_lib.translation.inference import load_model
    from transformer_lib.translation.pretrained import pretrained_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="a checkpoint directory (default: the shipped model)")
    p.add_argument("--out", type=Path, required=True, help="the CTranslate2 model directory")
    args = p.parse_args(argv)
    model, tok, _ = load_model(args.checkpoint or pretrained_path(), torch.device("cpu"))
    out = convert(model, tok, args.out)
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
