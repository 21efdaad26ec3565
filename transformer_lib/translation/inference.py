"""Load a trained translation model, translate with it, and score it (hand-written).

``load_model`` reads a checkpoint directory (the config checked and the model sized before
anything is built); ``translate_sentences`` decodes with chapter 7's greedy search or beam
search (an int8 copy from ``quantize`` too, opt-in); ``translate_and_score`` is the one place
that translates sentence pairs and scores them with sacreBLEU — the training loop's validation
BLEU, ``evaluate``, the command line and the tools all call it. ``validation_loss`` scores
with chapter 6's ``real_token_loss``.
"""

from __future__ import annotations

import os
import re
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.masks import subsequent_mask
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.positional import LearnedPositionalEmbedding
from transformer_lib.training import Batch, LabelSmoothing, real_token_loss
from transformer_lib.translation import fast_beam
from transformer_lib.translation._finite import not_finite as _not_finite
from transformer_lib.translation._finite import not_finite_since as _not_finite_since
from transformer_lib.translation.checkpoint import load_checkpoint
from transformer_lib.translation.config import (
    MAX_BEAM,
    MAX_LEN_A,
    MAX_LEN_B,
    MAX_LENGTH_PENALTY,
    MAX_PARAMS,
    Config,
    config_from_saved,
    parameter_count,
)
from transformer_lib.translation.data import (
    BOS,
    EOS,
    PAD,
    _file_names,
    collate,
    decode_ids,
    encode_text,
    id_pieces,
    load_multi30k,
    load_tokenizer,
    make_batches,
)
from transformer_lib.translation.distributed import checked_device, default_device
from transformer_lib.translation.precision import autocast, resolve_precision
from transformer_lib.translation.quantize import int8_precision, is_int8, quantize_int8
from transformer_lib.translation.scoring import bleu, bleu_signature

__all__ = [
    "load_model",
    "translate_sentences",
    "source_length_limit",
    "source_character_limit",
    "bleu",
    "bleu_signature",
    "translate_and_score",
    "evaluate",
    "translate",
    "validation_loss",
    "attention_maps",
]


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def load_model(
    path: str | Path,
    device: torch.device | None = None,
    *,
    max_params: int = MAX_PARAMS,
    verify: bool = True,
) -> tuple[nn.Module, Any, Config]:
    """Load a checkpoint directory: (model in eval mode, tokenizer, Config).

    The config is checked and the model's size computed from it before anything is built: a
    config describing more than `max_params` parameters and buffer elements (the sinusoidal
    position table) is refused (a checkpoint is input; raise the limit for a model you trust
    to be that large). Non-finite weights (a diverged
    run) are refused too. `verify`: check every file against the manifest's SHA-256.
    """
    device = default_device() if device is None else checked_device(device)
    path = Path(path)
    info = load_checkpoint(path, None, verify=verify)
    cfg = config_from_saved(info["config"], path)
    if info["tokenizer"] is None:
        raise ValueError(f"checkpoint {path} holds no tokenizer.json; it cannot translate")
    tok = load_tokenizer(info["tokenizer"])
    n = parameter_count(cfg, tok.get_vocab_size(), buffers=True)
    if n > max_params:
        raise ValueError(
            f"checkpoint {path}: its config describes a model of {n:,} parameters and buffer "
            f"elements, more than max_params={max_params:,}; pass a larger max_params if you "
            "trust it"
        )
    model = cfg.build_model(tok.get_vocab_size())
    load_checkpoint(path, model, map_location=device, verify=verify)
    bad = _not_finite(model)
    if bad:
        raise ValueError(f"checkpoint {path}: weights {bad[:3]} are not finite (NaN or inf); "
                         "the run that saved them diverged")
    return model.to(device).eval(), tok, cfg


# --------------------------------------------------------------------------- translating


def source_length_limit(model: nn.Module, max_input_len: int | None) -> int | None:
    """Most subwords a source may have: `max_input_len`, and what a learned table holds."""
    tables = [m.max_len for m in model.modules() if isinstance(m, LearnedPositionalEmbedding)]
    limits = [max_input_len] if max_input_len is not None else []
    limits += [t - 1 for t in tables]  # the source's end symbol takes a position too
    return min(limits) if limits else None


def _output_limit(model: nn.Module) -> int | None:
    tables = [m.max_len for m in model.modules() if isinstance(m, LearnedPositionalEmbedding)]
    return min(tables) if tables else None


def source_character_limit(tok: Any, max_subwords: int) -> int:
    """Most characters a source of at most `max_subwords` subwords can have with `tok`.

    Checked before tokenizing, whose time and memory grow with the text (20 M characters: 91 s
    and 2.7 GB), so that an over-long line is refused at once, and never refusing a line the
    tokenizer would have let through: a subword spells at most as many bytes as the longest
    vocabulary entry (byte-level: one symbol per byte), and a character is at least one byte
    after NFC normalization, which merges at most 4 characters into one (Greek "ᾂ" typed as
    its NFD). So a text of more characters than this has more than `max_subwords` subwords.
    """
    longest = max(len(entry) for entry in tok.get_vocab())
    return max_subwords * longest * 4


def _check_int(name: str, value: Any, *, optional: bool = False, most: int | None = None) -> None:
    ok = (isinstance(value, int) and not isinstance(value, bool)
          and 1 <= value <= (value if most is None else most))
    if not (ok or (optional and value is None)):
        bound = "" if most is None else f" and <= {most}"
        raise ValueError(f"{name} must be {'None or ' if optional else ''}an integer >= 1{bound}, "
                         f"got {value!r}")


def _check_number(name: str, value: Any, most: float) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0 <= value <= most):  # NaN fails too
        raise ValueError(f"{name} must be a number >= 0 and <= {most:g}, got {value!r}")


def _check_decoding(beam_size: Any, alpha: Any, max_len_a: Any, max_len_b: Any,
                    vocab: int) -> None:
    """ValueError unless decoding's work is bounded (the beam, the output length) and its
    length penalty alpha cannot overflow."""
    _check_int("beam_size", beam_size, most=MAX_BEAM)
    if beam_size > vocab:
        raise ValueError(f"beam_size ({beam_size}) cannot exceed the vocabulary of {vocab} "
                         "subwords")
    _check_number("length_penalty", alpha, MAX_LENGTH_PENALTY)
    _check_number("max_len_a", max_len_a, MAX_LEN_A)
    _check_int("max_len_b", max_len_b, most=MAX_LEN_B)


def _check_penalty_applies(beam_size: int, length_penalty: float | None) -> None:
    """ValueError for a length penalty given with beam size 1: greedy would ignore it."""
    if beam_size == 1 and length_penalty is not None:
        raise ValueError(f"length_penalty {length_penalty} applies to beam search, but the beam "
                         "size is 1 (greedy decoding): give a beam size of 2 or more")


def visible_text(sentence: str) -> str:
    """`sentence` as the training text was written: without the characters a reader cannot
    see (zero-width spaces, soft hyphens, byte order marks, control characters) and with one
    space for each run of whitespace (tabs, no-break and ideographic spaces, line breaks).

    The tokenizer works on bytes, so an invisible character would otherwise become subwords
    the model has never seen beside a sentence: "\u200bA man." would translate differently
    from "A man.", and an invisible sentence into invented text instead of "".
    """
    if not sentence.isprintable():  # only Cc, Cf, Z* other than " " and unassigned fail
        sentence = "".join(ch for ch in sentence if ch.isspace()
                           or unicodedata.category(ch) not in ("Cc", "Cf"))
    return " ".join(sentence.split())


def _encode_sources(
    tok: Any, sentences: Sequence[str], limit: int | None,
    on_too_long: Callable[[int, str, int], None] | None,
) -> tuple[list[list[int]], list[int]]:
    """Each sentence's ids + EOS ([] when refused), and the indices of those within `limit`
    that hold something to translate (a sentence of nothing visible translates to "")."""
    chars = None if limit is None else source_character_limit(tok, limit)
    encoded: list[list[int]] = []
    keep: list[int] = []
    for i, s in enumerate(sentences):
        if chars is not None and len(s) > chars:  # a run of whitespace reads as one space
            s = re.sub(r"\s+", " ", s).strip()  # (and visible_text gives the same text)
        ids = encode_text(tok, visible_text(s)) if chars is None or len(s) <= chars else None
        if ids is not None and (limit is None or len(ids) - 1 <= limit):
            encoded.append(ids)
            if len(ids) > 1:  # more than EOS
                keep.append(i)
            continue
        encoded.append([])
        length = f"{len(s):,} characters" if ids is None else f"{len(ids) - 1} subwords"
        if on_too_long is None:
            raise ValueError(f"sentences[{i}] has {length}, too many for max_input_len={limit}")
        on_too_long(i, length, limit)
    return encoded, keep


@torch.no_grad()
def translate_sentences(
    model: nn.Module,
    tok: Any,
    sentences: Sequence[str],
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    precision: str = "auto",
    max_input_len: int | None = 256,
    batch_size: int = 256,
    on_too_long: Callable[[int, str, int], None] | None = None,
) -> list[str]:
    """Translate untokenized sentences; greedy (KV cache) when beam_size == 1, else beam search.

    Args:
        model, tok: from ``load_model`` (the model's device is used).
        sentences: untokenized source sentences (a list, not one str), read as
            ``visible_text`` reads them; one with nothing visible translates to "".
        beam_size: 1 for greedy decoding, at most ``MAX_BEAM`` (64) and the vocabulary size.
            length_penalty: beam search's alpha, at most ``MAX_LENGTH_PENALTY`` (10).
        max_len_a, max_len_b: a translation has at most ``a * source length + b`` subwords
            (and never more than a learned position table holds); ``a <= MAX_LEN_A`` (10),
            ``b <= MAX_LEN_B`` (1000).
        precision: "fp32", "bf16" autocast, or "auto": bf16 where the model's device has it
            natively, else fp32 (``resolve_precision``), whatever the model was trained in.
            An int8 model (``quantize_int8``) runs in fp32 under "auto"; "bf16" is an error.
            In fp32 a sentence's translation does not depend on the sentences batched with
            it; in bf16 it can, rarely: bf16 rounds coarsely, and how a matrix product
            rounds depends on the shapes of the batch.
        max_input_len: refuse a source of more subwords: decoding time grows with the square
            of the length, and a model trained on short sentences has nothing useful to say
            about one of thousands. None: no limit but a learned position table's. A source
            of more characters than ``source_character_limit`` is refused untokenized.
        batch_size: sentences decoded together (divided by beam_size for beam search): rows
            of one batch share every matrix product, so a larger batch pays Python's and
            PyTorch's fixed cost per operation fewer times, per sentence.
        on_too_long: called as ``on_too_long(index, length, limit)`` for each refused
            sentence, whose translation is then "" (`length`: "300 subwords", or
            "20,000,000 characters" when refused untokenized); None: raise ``ValueError``.
    """
    precision = int8_precision(precision) if is_int8(model) else precision
    precision = resolve_precision(precision, _device_of(model))
    _check_decoding(beam_size, length_penalty, max_len_a, max_len_b, tok.get_vocab_size())
    _check_int("batch_size", batch_size)
    _check_int("max_input_len", max_input_len, optional=True)
    # a list first: a generator checked by iterating it would then translate nothing
    sentences = _check_sentences(sentences)
    bad = _not_finite_since(model)  # as load_model: a NaN weight translated to "" silently
    if bad:
        raise ValueError(f"model: weights {bad[:3]} are not finite (NaN or inf); it cannot "
                         "translate (a diverged run, or a weight changed since loading)")
    limit = source_length_limit(model, max_input_len)
    encoded, keep = _encode_sources(tok, sentences, limit, on_too_long)  # ids + EOS
    was_training = model.training
    model.eval()
    out: list[str] = [""] * len(sentences)
    per_batch = batch_size if beam_size == 1 else max(1, batch_size // beam_size)
    for idx in _batched(encoded, keep, per_batch):
        hyps = _decode_batch(model, [encoded[i] for i in idx], beam_size=beam_size,
                             length_penalty=length_penalty, max_len_a=max_len_a,
                             max_len_b=max_len_b, precision=precision)
        for row, i in enumerate(idx):
            out[i] = decode_ids(tok, _cut(hyps[row]))
    model.train(was_training)
    return out


def _check_sentences(sentences: Any) -> list[str]:
    """`sentences` as a list, checked: each a string."""
    if isinstance(sentences, (str, bytes)):  # iterating it would translate each character
        raise ValueError(f"sentences must be a list of strings, got a "
                         f"{type(sentences).__name__}; pass [text] for one sentence")
    sentences = list(sentences)
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise ValueError(f"sentences[{i}] must be a string, got {s!r}")
        try:  # the tokenizer takes only text that UTF-8 can hold: no lone surrogates
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"sentences[{i}] is not valid Unicode text: character "
                             f"{e.start} is a lone surrogate ({s[e.start]!a})") from None
    return sentences


def _decode_batch(model: nn.Module, sources: list[list[int]], *, beam_size: int,
                  length_penalty: float, max_len_a: float, max_len_b: int,
                  precision: str) -> list[list[int]]:
    """Token ids of the best hypothesis for each source (ids + EOS), decoded together."""
    device, cap = _device_of(model), _output_limit(model)
    width = max(len(ids) for ids in sources)
    src = torch.full((len(sources), width), PAD, dtype=torch.long)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids)
    src = src.to(device)  # (B, S)
    src_mask = (src != PAD).unsqueeze(-2)  # (B, 1, S)
    # Each sentence's own output limit: its translation must not depend on the sentences
    # decoded beside it (in fp32; bf16's rounding can change with the batch's shapes).
    # Greedy decodes to the longest and cuts each row to its own (greedy's first n tokens
    # do not depend on the rest); beam search stops each at its own.
    limits = [_out_len(len(ids), max_len_a, max_len_b, cap) for ids in sources]
    with autocast(precision, device):
        if beam_size == 1:
            rows = greedy_decode(model, src, src_mask, max(limits), BOS, EOS).tolist()
            return [row[:limit] for row, limit in zip(rows, limits)]
        # the same hypotheses as chapter 7's beam_search, with less work around the products
        search = fast_beam.beam_search if fast_beam.supports(model, src) else beam_search
        results = search(model, src, src_mask, limits, BOS, EOS,
                         beam_size=beam_size, length_penalty=length_penalty)
    return [r[0][0].tolist() for r in results]


def _out_len(width: int, max_len_a: float, max_len_b: int, cap: int | None) -> int:
    """Output tokens (``<s>`` counts) allowed for a source of `width` ids + EOS."""
    out_len = max(2, int(max_len_a * width + max_len_b))
    return min(out_len, cap) if cap is not None else out_len


def _batched(items: Sequence, keep: list[int], size: int) -> Iterator[list[int]]:
    """Batches of at most `size` indices of similar length (little padding)."""
    order = sorted(keep, key=lambda i: len(items[i]))  # similar lengths together
    batch: list[int] = []
    for i in order:
        if len(batch) == size:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def _cut(ids: list[int]) -> list[int]:
    """Tokens between the start symbol and the first end symbol."""
    ids = ids[1:] if ids and ids[0] == BOS else ids
    return ids[: ids.index(EOS)] if EOS in ids else ids


def translate(
    checkpoint: str | Path,
    sentences: Sequence[str],
    beam_size: int | None = None,
    device: torch.device | None = None,
    max_input_len: int | None = 256,
    precision: str = "auto",
    *,
    length_penalty: float | None = None,
    on_too_long: Callable[[int, str, int], None] | None = None,
    int8: bool = False,
) -> list[str]:
    """Translate sentences with a saved model and the decoding settings of its config.

    `beam_size`, `length_penalty` None: the config's ``beam_size`` and ``length_penalty``.
    `precision`, `max_input_len`, `on_too_long`: as in ``translate_sentences``; precision
    "auto" whatever the checkpoint trained in. `int8`: translate with ``quantize_int8``'s
    copy of the model, on the CPU (the default device then; another is a ValueError). The
    command line's ``translate`` does the same, batch by batch as stdin's lines arrive.
    """
    if int8:
        device = torch.device("cpu") if device is None else checked_device(device)
        if device.type != "cpu":
            raise ValueError(f"int8 translation runs on the CPU only, got device {device}")
        precision = int8_precision(precision)  # bf16 is refused before the model loads
    device = device or default_device()
    resolve_precision(precision, device)  # a bad value fails before the model loads
    model, tok, cfg = load_model(checkpoint, device)
    model = quantize_int8(model) if int8 else model
    beam_size = cfg.beam_size if beam_size is None else beam_size
    _check_penalty_applies(beam_size, length_penalty)
    return translate_sentences(model, tok, sentences, beam_size=beam_size,
                               max_input_len=max_input_len, precision=precision,
                               on_too_long=on_too_long, **cfg.decode_kwargs(length_penalty))


# --------------------------------------------------------------------------- scoring


def translate_and_score(
    model: nn.Module,
    tok: Any,
    cfg: Config,
    pairs: Sequence[tuple[str, str]],
    *,
    beam_size: int | None = None,
    length_penalty: float | None = None,
    precision: str = "auto",
    max_input_len: int | None = None,
    on_too_long: Callable[[int, str, int], None] | None = None,
) -> dict[str, Any]:
    """Translate the pairs' sources with `cfg`'s decoding settings; sacreBLEU against targets.

    `max_input_len`: a source of more subwords is an error (ValueError, or `on_too_long`, as in
    ``translate_sentences``), found before anything is decoded: a score over fewer sentences
    than the test set would be no score of it, so `on_too_long` should raise (the command line
    names the file's line); a source it lets pass is scored as an empty translation. None (the
    default): every source is translated, however long. `beam_size`, `length_penalty` None:
    the config's. `precision`: as in ``translate_sentences``. Returns ``beam_size``,
    ``length_penalty``, ``precision`` (the one that ran), ``device``, ``bleu`` (rounded to
    two decimals, as sacreBLEU prints it), ``bleu_unrounded``, ``signature``, ``score_line``
    (sacreBLEU's line), ``sentences``, ``seconds`` and the ``hypotheses``.
    """
    if len(pairs) == 0:
        raise ValueError("pairs is empty: there is nothing to score")
    beam_size = cfg.beam_size if beam_size is None else beam_size
    _check_penalty_applies(beam_size, length_penalty)
    kwargs = cfg.decode_kwargs(length_penalty)
    device = _device_of(model)
    used = resolve_precision(precision, device)
    start = time.perf_counter()
    hyps = translate_sentences(model, tok, [s for s, _ in pairs], beam_size=beam_size,
                               max_input_len=max_input_len, on_too_long=on_too_long,
                               precision=used, **kwargs)
    score = bleu(hyps, pairs)
    return {
        "beam_size": beam_size,
        "length_penalty": kwargs["length_penalty"],
        "precision": used,
        "device": str(device),
        "bleu": round(score.score, 2),
        "bleu_unrounded": score.score,
        "signature": bleu_signature(),
        "score_line": str(score),
        "sentences": len(pairs),
        "seconds": round(time.perf_counter() - start, 1),
        "hypotheses": hyps,
    }


def evaluate(
    checkpoint: str | Path,
    split: str = "test",
    beam_size: int | None = None,
    data_dir: str | None = None,
    limit: int | None = None,
    device: torch.device | None = None,
    length_penalty: float | None = None,
    precision: str = "auto",
    *,
    max_input_len: int | None = 256,
) -> dict[str, Any]:
    """sacreBLEU of a checkpoint on a Multi30k split: ``translate_and_score``'s result + split.

    `beam_size`, `length_penalty` None: the checkpoint config's ``beam_size`` and
    ``length_penalty`` (beam search's alpha). `limit`: the first n pairs. `precision`: as in
    ``translate_sentences`` (not the checkpoint's); the result names the one that ran.
    `max_input_len`: a source of more subwords is an error, as in ``translate`` (Multi30k's
    longest has far fewer); None: no limit. `data_dir` None: ``$MULTI30K_DIR``, else the
    folder the checkpoint trained from if it holds the split, else the cache.
    """
    if beam_size is not None:  # the config's was checked when it was read
        _check_int("beam_size", beam_size, most=MAX_BEAM)
    _check_int("limit", limit, optional=True)
    _check_int("max_input_len", max_input_len, optional=True)
    device = device or default_device()
    resolve_precision(precision, device)  # a bad value fails before the model loads
    model, tok, cfg = load_model(checkpoint, device)
    folder = _evaluation_data_dir(data_dir, cfg, split)
    pairs = load_multi30k(split, folder, cfg.src_lang, cfg.tgt_lang, limit=limit)

    def too_long(i: int, length: str, most: int) -> None:  # a score without it is no score
        raise ValueError(f"the {split} split's sentence {i + 1} has {length}, too many for "
                         f"max_input_len={most}")

    scored = translate_and_score(model, tok, cfg, pairs, beam_size=beam_size,
                                 length_penalty=length_penalty, precision=precision,
                                 max_input_len=max_input_len, on_too_long=too_long)
    return {"split": split, **scored}


def _evaluation_data_dir(data_dir: str | None, cfg: Config, split: str) -> str | None:
    """Where ``evaluate`` reads Multi30k: the caller's `data_dir`; else ``$MULTI30K_DIR``
    (None: ``load_multi30k`` reads it); else the training config's folder if it holds the
    split (a checkpoint may come from another machine); else None, the cache. Every copy is
    checked against the same SHA-256 sums, so the folder cannot change the score."""
    if data_dir is not None or os.environ.get("MULTI30K_DIR") or cfg.data_dir is None:
        return data_dir
    folder = Path(cfg.data_dir).expanduser()
    names = [_file_names(split, lang) for lang in (cfg.src_lang, cfg.tgt_lang)]
    return cfg.data_dir if all((folder / n).is_file() for n in names) else None


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_tokens: int,
    label_smoothing: float,
    precision: str = "fp32",
) -> float:
    """Label-smoothed loss per target token on `examples` (eval mode, no dropout).

    Args:
        model: an ``EncoderDecoder``; the batches go to its device.
        examples: ``(source ids, target ids)`` pairs from ``encode_pairs``.
        max_tokens: padded tokens per batch (``make_batches``).
        label_smoothing: epsilon of ``LabelSmoothing`` (the training loss is the reference).
        precision: "fp32", "bf16" autocast, or "auto" (``resolve_precision``).
    """
    device = _device_of(model)
    precision = resolve_precision(precision, device)
    was_training = model.training
    model.eval()
    criterion = LabelSmoothing(model.generator.proj.out_features, PAD, label_smoothing)
    total, ntok = 0.0, 0
    for idx in make_batches(examples, max_tokens, shuffle=False, seed=0):
        b = Batch(*collate(examples, idx, pad=PAD, device=device), pad=PAD)
        total += real_token_loss(model, b, criterion, precision=precision).item()
        ntok += b.ntokens
    model.train(was_training)
    return total / max(ntok, 1)


# --------------------------------------------------------------------------- attention


def _rounded(x: Any, digits: int = 4) -> Any:
    """Round every float of a nested list (attention maps stored as JSON stay small)."""
    return [_rounded(v, digits) for v in x] if isinstance(x, list) else round(x, digits)


@torch.no_grad()
def attention_maps(
    model: nn.Module, tok: Any, sentence: str, *, max_len_a: float = 1.5, max_len_b: int = 10
) -> dict[str, Any]:
    """Translate `sentence` greedily, then record every attention map of a teacher-forced pass.

    Returns ``source``, ``translation``, the token labels ``source_tokens`` (ids + ``</s>``) and
    ``target_tokens`` (``<s>`` + output), and ``maps``: for ``"encoder"`` (source x source),
    ``"decoder"`` (target x target) and ``"cross"`` (target x source) a nested list
    ``[layer][head][query][key]`` of weights rounded to 4 decimals. `max_len_a`, `max_len_b`:
    as in ``translate_sentences``. Used by chapter 8's figures.
    """
    _check_decoding(1, 0.0, max_len_a, max_len_b, tok.get_vocab_size())
    device = _device_of(model)
    src_ids = encode_text(tok, visible_text(sentence))  # ids + EOS
    src = torch.tensor([src_ids], device=device)
    src_mask = (src != PAD).unsqueeze(-2)
    out_len = _out_len(len(src_ids), max_len_a, max_len_b, _output_limit(model))
    out = greedy_decode(model, src, src_mask, out_len, BOS, EOS)[0].tolist()
    if EOS in out:
        out = out[: out.index(EOS) + 1]
    tgt = torch.tensor([out[:-1] if out[-1] == EOS else out], device=device)  # decoder input
    mhas = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    for m in mhas:
        m.store_attention = True
    try:
        model(src, tgt, src_mask, subsequent_mask(tgt.size(1), device=device))
        maps = {
            "encoder": [layer.self_attn.attn[0].tolist() for layer in model.encoder.layers],
            "decoder": [layer.self_attn.attn[0].tolist() for layer in model.decoder.layers],
            "cross": [layer.src_attn.attn[0].tolist() for layer in model.decoder.layers],
        }
    finally:
        for m in mhas:
            m.store_attention, m.attn = False, None
    return {
        "source": sentence,
        "source_tokens": id_pieces(tok, src_ids),
        "target_tokens": id_pieces(tok, tgt[0].tolist()),
        "translation": tok.decode(out, skip_special_tokens=True),
        "maps": {k: _rounded(v) for k, v in maps.items()},  # [layer][head][query][key]
    }
