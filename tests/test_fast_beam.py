"""translation.fast_beam's beam search against chapter 7's (decoding.beam_search), and the
int8 copy of quantize_int8 that it also decodes."""

from __future__ import annotations

import pytest
import torch

from transformer_lib import decoding
from transformer_lib.model import make_model
from transformer_lib.translation import fast_beam, inference
from transformer_lib.translation.quantize import _Int8Attention, is_int8, quantize_int8

VOCAB, PAD, BOS, EOS = 40, 0, 1, 2


def _model(norm_first: bool, activation: str = "relu", skip_padding: bool = True,
           seed: int = 0) -> torch.nn.Module:
    """A small random model; weights x4 so that the search has choices to make."""
    torch.manual_seed(seed)
    model = make_model(VOCAB, VOCAB, N=2, d_model=32, d_ff=64, h=4, norm_first=norm_first,
                       activation=activation, skip_padding=skip_padding).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    return model


def _sources(batch: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, width) ids padded at the end, of lengths 1..width, and their mask."""
    g = torch.Generator().manual_seed(seed)
    width = 9
    src = torch.randint(3, VOCAB, (batch, width), generator=g)
    lengths = torch.randint(1, width + 1, (batch,), generator=g)
    lengths[0] = width
    src[torch.arange(width)[None, :] >= lengths[:, None]] = PAD
    return src, (src != PAD).unsqueeze(-2)


def _search(fn, model, src, mask, limits, **kwargs):
    out = fn(model, src, mask, limits, BOS, EOS, **kwargs)
    return [[(t.tolist(), s) for t, s in hyps] for hyps in out]


def _assert_same(fast, ours, abs_tol=1e-5):
    """The same hypotheses in the same order; scores equal up to float rounding.

    Relative to the score too: the two searches sum in other orders, and on an imitated CPU
    without AVX a score of -4.1 came out 1.5e-5 apart (fp32 keeps about 7 digits).
    """
    assert [[t for t, _ in h] for h in fast] == [[t for t, _ in h] for h in ours]
    for h_fast, h_ours in zip(fast, ours):
        for (_, a), (_, b) in zip(h_fast, h_ours):
            assert a == pytest.approx(b, rel=1e-5, abs=abs_tol)


@pytest.mark.parametrize("norm_first,activation,skip_padding",
                         [(True, "relu", True), (False, "gelu", True), (True, "relu", False)])
@pytest.mark.parametrize("beam_size,n_best,alpha", [(4, 1, 1.2), (3, 3, 0.0), (1, 1, 0.6)])
def test_same_hypotheses_and_scores_as_chapter_7(norm_first, activation, skip_padding,
                                                 beam_size, n_best, alpha):
    """With PyTorch's products (onednn=False) the same hypotheses, scores equal up to the
    last bits (the beams attend to the source together, a different summation order in
    the attention kernel): sentences of different lengths and limits leave the batch at
    different steps, so the cache's reordering and shrinking are exercised."""
    model = _model(norm_first, activation, skip_padding)
    src, mask = _sources(7)
    limits = [1, 2, 5, 9, 12, 16, 20]
    kwargs = dict(beam_size=beam_size, n_best=n_best, length_penalty=alpha)
    ours = _search(decoding.beam_search, model, src, mask, limits, **kwargs)
    fast = _search(fast_beam.beam_search, model, src, mask, limits, onednn=False, **kwargs)
    _assert_same(fast, ours)
    assert any(len(h[0][0]) > 3 for h in ours)  # not all stopped at once


def test_onednn_products_same_tokens_close_scores():
    """oneDNN's products round differently in the last bits: the same hypotheses here, and
    scores within float rounding."""
    model = _model(True)
    src, mask = _sources(8, seed=3)
    kwargs = dict(beam_size=4, n_best=2, length_penalty=0.6)
    ours = _search(decoding.beam_search, model, src, mask, 14, **kwargs)
    fast = _search(fast_beam.beam_search, model, src, mask, 14, onednn=True, **kwargs)
    _assert_same(fast, ours, abs_tol=1e-4)


def test_empty_batch_and_one_token_limit():
    model = _model(True)
    src, mask = _sources(3)
    for fn in (decoding.beam_search, fast_beam.beam_search):
        assert fn(model, src[:0], mask[:0], 5, BOS, EOS) == []
    one = _search(fast_beam.beam_search, model, src, mask, 1, onednn=False)
    assert one == _search(decoding.beam_search, model, src, mask, 1)
    assert one == [[([BOS], 0.0)]] * 3


def test_falls_back_to_chapter_7_where_it_does_not_apply():
    """Training mode, autocast (chapter 3 attends in fp32 under bf16) and models of other
    layers go to decoding.beam_search: the same result as calling it."""
    model = _model(True)
    src, mask = _sources(4)
    assert fast_beam.supports(model, src)
    model.train()
    assert not fast_beam.supports(model, src)
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fast_beam.supports(model, src)
        fast = _search(fast_beam.beam_search, model, src, mask, 8)
        ours = _search(decoding.beam_search, model, src, mask, 8)
    assert fast == ours
    assert not fast_beam.supports(torch.nn.Linear(2, 2), src)


def test_bad_arguments_raise_like_chapter_7():
    model = _model(True)
    src, mask = _sources(2)
    with pytest.raises(ValueError, match="beam_size"):
        fast_beam.beam_search(model, src, mask, 5, BOS, EOS, beam_size=0)
    with pytest.raises(ValueError, match="max_len"):
        fast_beam.beam_search(model, src, mask, [5], BOS, EOS)


def test_onednn_default_follows_the_environment(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_ONEDNN", "0")
    assert not fast_beam.onednn_default()
    monkeypatch.setenv("TRANSFORMER_LIB_ONEDNN", "1")
    assert fast_beam.onednn_default()


def test_int8_copy_quantizes_attention_inputs_and_decodes():
    """quantize_int8 turns W^Q/W^K/W^V into int8 too (per slice attention asks for); the
    copy decodes on both paths to close hypotheses, and the original model is untouched."""
    model = _model(True)
    q = quantize_int8(model)
    assert is_int8(q) and not is_int8(model)
    attns = [m for m in q.modules() if isinstance(m, _Int8Attention)]
    assert len(attns) == 6  # 2 encoder self, 2 decoder self, 2 source attentions
    x = torch.randn(3, 5, 32)
    a, ref = attns[0], model.encoder.layers[0].self_attn
    with torch.no_grad():
        got, want = a(x, x, x), ref(x, x, x)
    assert ((got - want).norm() / want.norm()).item() < 0.1  # int8 rounding, not a bug
    src, mask = _sources(6)
    fast = _search(fast_beam.beam_search, q, src, mask, 10, beam_size=4)
    ours = _search(decoding.beam_search, q, src, mask, 10, beam_size=4)
    same = sum(f[0][0] == o[0][0] for f, o in zip(fast, ours))
    assert same >= 4


@pytest.mark.multi30k
def test_shipped_model_translates_as_chapter_7_on_validation(monkeypatch):
    """translate_sentences (fast_beam, oneDNN where it is the default) against chapter 7's
    beam search on 200 validation sentences, beam as shipped: the same text."""
    from transformer_lib.translation.data import load_multi30k
    from transformer_lib.translation.pretrained import load_pretrained

    model, tok, cfg = load_pretrained(device="cpu")
    sentences = [s for s, _ in load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang,
                                             limit=200)]
    kwargs = dict(beam_size=cfg.beam_size, precision="fp32", **cfg.decode_kwargs())
    fast = inference.translate_sentences(model, tok, sentences, **kwargs)
    monkeypatch.setattr(fast_beam, "supports", lambda *a: False)
    ours = inference.translate_sentences(model, tok, sentences, **kwargs)
    assert fast == ours
