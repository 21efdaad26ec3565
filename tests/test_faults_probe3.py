"""Faults found by the third probe of the package: each test failed before its fix.

P1: a list of reference strings passed to ``bleu`` (a natural slip) raised an unpacking error,
or with two-character references scored 0 without a word. P2: ``translate(..., int8=True)``
with a device name torch does not know raised torch's RuntimeError. P3: a short sentence
padded with a long run of whitespace was refused as too long, although what is read of it
(``visible_text``) is short. P4 to P6 (chapter 11's parts): grouped-query and rotary
attention accepted a key and value of different lengths, and a query batch that broadcast
against the keys', and answered; RMSNorm in float16 returned zeros once a feature reached 256.
"""

from __future__ import annotations

import pytest
import torch

from transformer_lib import load_pretrained
from transformer_lib.translation import inference, scoring

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained(device="cpu")


# ------------------------------------------------------------------ P1: bleu's arguments


@pytest.mark.parametrize("refs", [
    ["A dog runs.", "Two men."],  # references without their sources
    ["ab", "cd"],  # two characters each: these unpacked into "pairs" and scored 0
])
def test_bleu_refuses_references_without_sources(refs):
    with pytest.raises(ValueError, match=r"pairs\[0\] must be a \(source, reference\) pair"):
        scoring.bleu(["A dog runs.", "Two men."], refs)


def test_bleu_refuses_one_string_as_the_hypotheses():
    with pytest.raises(ValueError, match="hypotheses must be a list of strings, got a str"):
        scoring.bleu("A dog.", [("Ein Hund.", "A dog.")] * 6)


def test_bleu_still_scores_pairs_and_is_the_one_the_package_exports():
    import transformer_lib.translation as translation

    pairs = [("Ein Hund rennt.", "A dog runs."), ("Zwei Männer.", "Two men.")]
    assert scoring.bleu(["A dog runs.", "Two men."], pairs).score == pytest.approx(100.0)
    assert translation.bleu is inference.bleu is scoring.bleu


# ------------------------------------------------------------------ P2: int8 on a bad device


def test_int8_translation_names_a_device_torch_does_not_know(checkpoint_dir):
    with pytest.raises(ValueError, match="device must be a torch.device or a name"):
        inference.translate(checkpoint_dir, ["Ein Hund."], device="gpu", int8=True)


# ------------------------------------------------------------------ P3: runs of whitespace


def test_a_short_sentence_in_much_whitespace_is_read_not_refused(shipped):
    model, tok, _ = shipped
    padded = "Ein Hund" + " " * 23_552 + "rennt.\t\u3000"
    assert len(padded) > inference.source_character_limit(tok, 256)
    alone = inference.translate_sentences(model, tok, ["Ein Hund rennt."], precision="fp32")
    assert inference.translate_sentences(model, tok, [padded], precision="fp32") == alone
    with pytest.raises(ValueError, match=r"sentences\[0\] has [\d,]+ characters"):
        inference.translate_sentences(model, tok, ["Hund " * 20_000], precision="fp32")


# ------------------------------------------------------------------ P4, P5: GQA and RoPE shapes


@pytest.fixture(params=["gqa", "rope"])
def variant(request):
    from transformer_lib.attention_variants import GroupedQueryAttention, RotaryAttention

    cls = GroupedQueryAttention if request.param == "gqa" else RotaryAttention
    torch.manual_seed(0)
    return cls(4, 16, 2).eval()


def test_key_and_value_of_different_lengths_are_refused(variant):
    q, k = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"value must share the first dimensions \(2, 5\) of "
                                         r"key, got value of shape \(2, 7, 16\)"):
        variant(q, k, torch.randn(2, 7, 16))
    with pytest.raises(ValueError, match=r"value must share the first dimensions \(2, 5\) of "
                                         r"key, got value of shape \(1, 5, 16\)"):
        variant(q, k, torch.randn(1, 5, 16))


def test_a_query_batch_that_would_broadcast_is_refused(variant):
    k = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"query must share the first dimensions \(2,\) of "
                                         r"k, got query of shape \(1, 5, 16\)"):
        variant(k[:1], k, k)


def test_a_mask_for_another_batch_is_named(variant):
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5, 5\) is not broadcastable"):
        variant(x, x, x, torch.ones(3, 5, 5, dtype=torch.bool))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()  # one mask for every sentence: fine
    per_head = causal.expand(2, 4, 5, 5)
    assert torch.equal(variant(x, x, x, causal), variant(x, x, x, per_head))


def test_rotary_attention_refuses_more_queries_than_keys():
    from transformer_lib.attention_variants import RotaryAttention

    rope = RotaryAttention(4, 16, 2).eval()
    q, k = torch.randn(1, 8, 16), torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match="query has 8 positions, more than the keys' 5"):
        rope(q, k, k)


# ------------------------------------------------------------------ P6: RMSNorm in float16


def test_rms_norm_in_float16_keeps_large_features():
    from transformer_lib.modern import RMSNorm

    x = torch.tensor([[300.0, -300.0, 10.0, 1.0]])
    norm = RMSNorm(4)
    expected = norm(x)
    half = norm.half()(x.half())
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), expected, atol=2e-3, rtol=2e-3)
    wide = torch.zeros(1, 128)
    wide[0, 0] = 260.0  # one outlier zeroed the whole vector
    assert RMSNorm(128).half()(wide.half())[0, 0] > 11
