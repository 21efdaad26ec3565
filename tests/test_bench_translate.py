"""The CTranslate2 converter (bench/ct2_convert.py), the translation benchmark (bench/translate.py)
and int8 translation (quantize_int8, ``translate --int8``)."""

from __future__ import annotations

import io
import json

import ctranslate2  # the bench extra (pyproject.toml), which the dev extra includes
import pytest
import sacrebleu
import torch

from bench import ct2_convert
from bench import translate as bench_translate
from transformer_lib.masks import subsequent_mask
from transformer_lib.model import make_model
from transformer_lib.translation import cli, inference
from transformer_lib.translation.data import BOS, EOS, encode_text, load_tokenizer
from transformer_lib.translation.pretrained import load_pretrained, pretrained_path
from transformer_lib.translation.quantize import quantize_int8

GERMAN = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer spielen auf einer Wiese Fußball.",
    "Eine Frau mit einem roten Hut liest ein Buch im Park.",
    "Kinder.",
    "Ein älterer Mann sitzt auf einer Bank und füttert Tauben, während ein Mädchen zusieht.",
]


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained(device="cpu")


def _random_model(tok, norm_first: bool, activation: str) -> torch.nn.Module:
    """A small random model with the shipped kind of architecture (shared embeddings,
    sinusoids, our vocabulary); weights x6 so that greedy outputs vary from token to token."""
    torch.manual_seed(0)
    model = make_model(tok.get_vocab_size(), tok.get_vocab_size(), N=2, d_model=32, d_ff=64,
                       h=4, norm_first=norm_first, share_embeddings=True, pad_idx=0,
                       activation=activation, max_len=64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)
    return model


def _translator(model, tok, folder):
    return ctranslate2.Translator(str(ct2_convert.convert(model, tok, folder)), device="cpu",
                                  intra_threads=1)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(pretrained_path() / "tokenizer.json")


@pytest.mark.parametrize("norm_first,activation", [(True, "relu"), (False, "gelu")])
def test_converted_model_scores_like_ours(tmp_path, tok, norm_first, activation):
    """CTranslate2's log-probabilities of given targets equal ours (teacher forcing): weights,
    positions, norms, the fused projections and the vocabulary all land where they belong."""
    model = _random_model(tok, norm_first, activation)
    translator = _translator(model, tok, tmp_path / "ct2")
    g = torch.Generator().manual_seed(1)
    for text in GERMAN:
        src = encode_text(tok, text)  # ids + EOS
        y = torch.randint(4, tok.get_vocab_size(), (len(src) + 2,), generator=g).tolist()
        theirs = translator.score_batch([[tok.id_to_token(i) for i in src[:-1]]],
                                        [[tok.id_to_token(i) for i in y]])[0].log_probs
        src_t, tgt_in = torch.tensor([src]), torch.tensor([[BOS, *y]])
        with torch.no_grad():
            out = model(src_t, tgt_in, None, subsequent_mask(tgt_in.size(1)))
            log_probs = model.generator(out)[0]  # (len(y) + 1, vocab)
        ours = log_probs.gather(1, torch.tensor([*y, EOS])[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(theirs), ours, atol=2e-4, rtol=1e-4)


def test_converted_model_decodes_token_for_token(tmp_path, tok):
    """Greedy output ids of CTranslate2 equal ours, each cut to our length limit; and a model
    whose first choice is </s> gives "" in both (CTranslate2's min_decoding_length is 0)."""
    model = _random_model(tok, True, "relu")
    sources = [encode_text(tok, s) for s in GERMAN]
    limits = [inference._out_len(len(ids), 1.5, 10, None) - 1 for ids in sources]
    for eos_bias in (0.0, 50.0):
        with torch.no_grad():
            model.generator.proj.bias[EOS] = eos_bias
        ours = [inference._cut(r) for r in inference._decode_batch(
            model, sources, beam_size=1, length_penalty=0.0, max_len_a=1.5, max_len_b=10,
            precision="fp32")]
        translator = _translator(model, tok, tmp_path / f"ct2_{eos_bias}")
        theirs = ct2_convert.translate_ids(translator, tok, sources, beam_size=1,
                                           max_decoding_length=max(limits))
        assert [t[:n] for t, n in zip(theirs, limits)] == ours
        if eos_bias == 0:  # outputs that vary from token to token
            assert len({t for o in ours for t in o}) > 5
        else:  # </s> first: "" in both
            assert ours == [[]] * len(sources)


@pytest.mark.multi30k
def test_bench_limit_run_writes_json_with_provenance(tmp_path):
    out = tmp_path / "bench_translate.json"
    bench_translate.main(["--limit", "10", "--repeats", "2", "--threads", "1", "2",
                          "--betas", "0.6", "--patiences", "1", "2", "--patience", "2",
                          "--profile-runs", "2", "--out", str(out)])
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["git_commit"] and data["machine"]["cpu_model"] and data["date"]
    assert "bf16_native" in data["machine"] and "torch_version" in data["machine"]
    assert data["greedy_check"] == {**data["greedy_check"], "sentences": 10, "identical": 10}
    assert data["config"]["ours_length_penalty_alpha"] == load_pretrained()[2].length_penalty
    assert data["config"]["ct2_length_penalty_beta"]["chosen"] == 0.6
    assert data["config"]["ct2_patience"] == {"chosen": 2.0, "by": "fixed (--patience)"}
    assert data["config"]["threads_measured"] == [1, 2] and data["config"]["threads"] == 2
    assert set(data["by_threads"]) == {"1", "2"}
    assert data["results"] == data["by_threads"]["2"]["results"]
    for run in data["by_threads"].values():
        rows = {r["system"]: r for r in run["results"]}
        assert set(rows) == set(bench_translate.SYSTEMS)  # patience 2: also patience 1
        for r in rows.values():
            assert r["seconds"] > 0 and r["sentences_per_s"] > 0 and r["target_tokens"] > 0
            assert 0 < r["bleu"] <= 100 and r["same_output_every_round"]
            assert len(r["seconds_all"]) == 2
        goals = run["goals"]
        for name in ("ours_fp32_over_ct2_fp32", "ours_int8_over_ct2_int8",
                     "ours_fp32_over_ct2_fp32_patience1", "ours_int8_over_ct2_int8_patience1"):
            g = goals[name]
            assert g["min"] <= g["median"] <= g["max"] and g["rounds"] == 2
            assert g["met"] == (g["max"] <= g["goal"])
        assert "ours_int8_within_0.3_bleu" in goals
        assert set(run["where_time_goes"]) == {"ours_fp32", "ours_int8"}
        for where in run["where_time_goes"].values():
            assert where["runs"] == 2 and len(where["wall_s_runs"]) == 2
            kinds = {k["kind"]: k for k in where["kinds"]}
            assert kinds["matrix products"]["seconds"] > 0 and where["op_calls"] > 0
            assert sum(k["share"] for k in kinds.values()) == pytest.approx(1, abs=0.01)


def test_ratio_is_met_only_when_the_whole_range_is():
    rows = {"a": {"seconds_all": [1.1, 1.3, 1.0]}, "b": {"seconds_all": [1.0, 1.0, 1.0]}}
    r = bench_translate.ratio(rows, "a", "b", 1.2)
    assert (r["median"], r["min"], r["max"], r["met"]) == (1.1, 1.0, 1.3, False)
    assert bench_translate.ratio(rows, "a", "b", 1.3)["met"]
    assert "met" not in bench_translate.ratio(rows, "a", "b")


def test_bench_options_default_to_one_and_two_threads_and_five_rounds():
    args = bench_translate.parse_args([])
    assert args.threads == [1, 2] and args.repeats >= 5
    with pytest.raises(SystemExit):
        bench_translate.parse_args(["--threads", "0"])


@pytest.mark.multi30k
def test_int8_translation_mostly_matches_fp32(shipped):
    """int8 against fp32 outputs on 30 test sentences, beam as shipped: BLEU 92.5 (25 of 30
    identical) measured with AVX-512 kernels and with ATEN_CPU_CAPABILITY=default or avx2."""
    from transformer_lib.translation.data import load_multi30k

    model, tok, cfg = shipped
    int8 = quantize_int8(model)
    sentences = [s for s, _ in load_multi30k("test", limit=30)]
    kwargs = {"beam_size": cfg.beam_size, **cfg.decode_kwargs()}
    fp32 = inference.translate_sentences(model, tok, sentences, precision="fp32", **kwargs)
    quantized = inference.translate_sentences(int8, tok, sentences, **kwargs)
    assert sacrebleu.corpus_bleu(quantized, [fp32]).score >= 80
    assert sum(a == b for a, b in zip(fp32, quantized)) >= 20
    # and it is int8 that ran: the output layer's logits moved, the original model did not
    x = torch.randn(1, 3, model.generator.proj.in_features)
    assert not torch.equal(int8.generator(x), model.generator(x))
    assert all(type(m) is torch.nn.Linear for m in model.modules()
               if isinstance(m, torch.nn.Linear))


def test_int8_refuses_another_device_and_bf16(shipped):
    model, tok, _ = shipped
    with pytest.raises(ValueError, match="CPU only"):
        quantize_int8(make_model(20, 20, N=1, d_model=8, d_ff=8, h=2).to("meta"))
    # a device without data (or one this machine lacks) is named before the CPU rule
    with pytest.raises(ValueError, match="device 'meta' holds shapes but no data"):
        inference.translate(pretrained_path(), ["Hallo."], device=torch.device("meta"),
                            int8=True)
    with pytest.raises(ValueError, match="bf16"):
        inference.translate_sentences(quantize_int8(model), tok, ["Hallo."],
                                      precision="bf16")


def test_cli_translate_int8(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("Ein Hund rennt durch den Schnee.\n"))
    assert cli.main(["translate", "--int8", "--beam", "1"]) == 0
    assert capsys.readouterr().out.strip() == "A dog runs through the snow."
    assert cli.main(["translate", "--int8", "--precision", "bf16"]) == 2
    assert "--int8" in capsys.readouterr().err
