"""Chapter 8's recurrent baseline: GRUTranslator, its cache, and the trainer's arch = "gru"."""

import dataclasses

import pytest
import torch

from transformer_lib import translation
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.gru import GRUTranslator, make_gru_model
from transformer_lib.training import Batch, LabelSmoothing, train_step
from transformer_lib.translation.data import BOS, EOS, PAD


def _model(vocab=40, d=16, n=2, tied=True):
    torch.manual_seed(0)
    return make_gru_model(vocab, d, n, dropout=0.0, pad_idx=PAD, share_embeddings=tied).eval()


def _src():
    src = torch.tensor([[5, 6, 7, 8, 9, EOS], [10, 11, 12, EOS, PAD, PAD]])
    return src, (src != PAD).unsqueeze(1)


@pytest.mark.parametrize("n", [2, 3])
def test_shapes_and_padding_invariance(n):
    model = _model(n=n)
    src, mask = _src()
    tgt = torch.tensor([[BOS, 5, 6, 7], [BOS, 8, 9, 10]])
    out = model(src, tgt, mask)
    assert out.shape == (2, 4, 16)
    # The short sentence alone (no padding) gives the same states and outputs: packing keeps
    # the backward direction from reading the padding, attention masks it.
    alone = model(src[1:, :4], tgt[1:], mask[1:, :, :4])
    torch.testing.assert_close(alone, out[1:], atol=1e-6, rtol=1e-5)
    memory = model.encode(src, mask)
    assert memory.shape == (2, 6, 16) and memory[1, 4:].abs().max() == 0


def test_incremental_cache_equals_whole_prefix():
    model = _model(n=3)
    src, mask = _src()
    tgt = torch.randint(3, 40, (2, 7))
    whole = model(src, tgt, mask)
    cache = model.start_decoding(model.encode(src, mask), mask)
    steps = torch.cat([cache.step(tgt[:, i : i + 1]) for i in range(7)], dim=1)
    torch.testing.assert_close(steps, whole, atol=1e-6, rtol=1e-5)
    assert cache.length == 7


def test_decoders_agree_with_and_without_the_cache():
    model = _model()
    src, mask = _src()
    a = greedy_decode(model, src, mask, 9, BOS, EOS, use_cache=True)
    b = greedy_decode(model, src, mask, 9, BOS, EOS, use_cache=False)
    assert torch.equal(a, b)
    ra = beam_search(model, src, mask, 9, BOS, EOS, beam_size=3, n_best=2)
    rb = beam_search(model, src, mask, 9, BOS, EOS, beam_size=3, n_best=2, use_cache=False)
    for x, y in zip(ra, rb):
        assert [t.tolist() for t, _ in x] == [t.tolist() for t, _ in y]
        for (_, sx), (_, sy) in zip(x, y):
            assert sx == pytest.approx(sy, abs=1e-5)


def test_beam_of_one_is_greedy():
    model = _model()
    src, mask = _src()
    greedy = greedy_decode(model, src, mask, 9, BOS, EOS)
    beams = beam_search(model, src, mask, 9, BOS, EOS, beam_size=1, length_penalty=0.0)
    for row, result in zip(greedy, beams):
        tokens = result[0][0].tolist()
        assert row[: len(tokens)].tolist() == tokens



def test_ids_outside_the_vocabulary_are_a_value_error_naming_the_argument():
    model = _model()  # vocabulary of 40
    src, mask = _src()
    tgt = torch.tensor([[BOS, 5], [BOS, 6]])
    with pytest.raises(ValueError, match=r"src must hold token ids in \[0, 40\)"):
        greedy_decode(model, src + 40, mask, 4, BOS, EOS)
    with pytest.raises(ValueError, match=r"src must hold token ids"):
        beam_search(model, src - 50, mask, 4, BOS, EOS, beam_size=2)
    with pytest.raises(ValueError, match=r"tgt must hold token ids in \[0, 40\)"):
        model(src, tgt + 40, mask)


def test_an_empty_batch_or_an_empty_source_decodes_as_the_transformer_does():
    model = _model()
    src, mask = _src()
    assert beam_search(model, src[:0], mask[:0], 4, BOS, EOS, beam_size=2) == []
    assert greedy_decode(model, src[:0], mask[:0], 4, BOS, EOS).shape[0] == 0
    # no source words: the decoder still starts (from a zero mean state)
    out = greedy_decode(model, src[:, :0], mask[:, :, :0], 4, BOS, EOS)
    assert out.shape[0] == 2 and (out[:, 0] == BOS).all()
    beams = beam_search(model, src[:, :0], mask[:, :, :0], 4, BOS, EOS, beam_size=2)
    assert len(beams) == 2 and all(b[0][0][0] == BOS for b in beams)

def test_tied_and_untied_embeddings_and_gradients():
    tied, untied = _model(tied=True), _model(tied=False)
    assert tied.generator.proj.weight is tied.src_embed.weight
    assert tied.tgt_embed is tied.src_embed
    assert untied.tgt_embed is not untied.src_embed
    model = _model().train()
    src, mask = _src()
    tgt = torch.tensor([[BOS, 5, 6, 7, EOS], [BOS, 8, 9, EOS, PAD]])
    batch = Batch(src, tgt, pad=PAD)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss, ntok = train_step(model, [batch], LabelSmoothing(40, PAD, 0.1), opt, clip_norm=1.0)
    assert ntok == 7 and loss > 0
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []  # every parameter got a gradient and moved


def test_bf16_autocast_runs_and_stays_close():
    model = _model()
    src, mask = _src()
    tgt = torch.tensor([[BOS, 5, 6], [BOS, 8, 9]])
    ref = model(src, tgt, mask)
    with torch.autocast("cpu", torch.bfloat16):
        out = model(src, tgt, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(vocab=0), "vocab must be an integer >= 1"),
        (dict(vocab=10, d_model=15), "d_model must be even"),
        (dict(vocab=10, N=1), "N must be an integer >= 2"),
        (dict(vocab=10, N=True), "N must be an integer"),
        (dict(vocab=10, dropout=1.0), "dropout"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRUTranslator(**kwargs)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("n", [2, 4])
def test_parameter_count_from_the_config(tied, n):
    cfg = translation.Config(arch="gru", N=n, d_model=24, share_embeddings=tied)
    model = cfg.build_model(300)
    assert isinstance(model, GRUTranslator)
    assert translation.parameter_count(cfg, 300) == sum(p.numel() for p in model.parameters())


def test_config_refuses_an_unknown_arch():
    with pytest.raises(ValueError, match="config: arch must be one of"):
        translation.Config(arch="lstm")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(N=1), r"N must be >= 2 for arch = 'gru'"),
        (dict(d_model=255, h=5), r"d_model must be even for arch = 'gru'"),
    ],
)
def test_config_checks_the_gru_before_any_work(kwargs, match):
    with pytest.raises(ValueError, match=match):
        translation.Config(arch="gru", **kwargs)


def test_config_does_not_ask_the_gru_for_heads():
    cfg = translation.Config(arch="gru", d_model=250, h=4)  # 4 does not divide 250: no heads here
    assert cfg.build_model(300).d_model == 250


def test_trainer_trains_resumes_and_translates_with_the_gru(tmp_path):
    cfg = translation.Config(arch="gru", N=2, d_model=32, train_limit=64, val_limit=8,
                             vocab_size=300, max_tokens=400, epochs=1, max_steps=3, warmup=2,
                             save_every=1, keep_last=1, average_last=0, bleu_every=1, seed=0)
    out = translation.train(cfg, tmp_path / "run", progress=False)
    assert out["steps"] == 3 and "val_bleu" in out["history"][-1]
    model, tok, loaded = translation.load_model(tmp_path / "run" / "last")
    assert isinstance(model, GRUTranslator) and loaded.arch == "gru"
    hyp = translation.translate_sentences(model, tok, ["Ein Hund rennt."], beam_size=2,
                                          max_input_len=None, **loaded.decode_kwargs())
    assert isinstance(hyp[0], str)
    more = translation.train(dataclasses.replace(cfg, max_steps=5), tmp_path / "run", resume=True,
                             progress=False)
    assert more["steps"] == 5


def test_the_race_results_are_committed_and_comparable():
    """results/baseline_*.json (chapter 8's race): same data, budget, scorer and system."""
    import json
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "results"
    runs = {name: json.loads((results / f"baseline_{name}.json").read_text(encoding="utf-8"))
            for name in ("transformer", "gru")}
    assert runs["transformer"]["config"]["arch"] == "transformer"
    assert runs["gru"]["config"]["arch"] == "gru"
    for r in runs.values():
        assert r["system"] == "best_beam4" and r["time_limit_minutes"] == 30
        assert {"best_greedy", "best_beam4"} <= set(r["scores"])
        assert r["bleu"] == r["scores"]["best_beam4"]["bleu"]
        assert all("minutes" in h and "val_bleu" in h for h in r["history"])
        assert "OMP_NUM_THREADS=1" in r["command"]
    same = ("src_lang", "tgt_lang", "vocab_size", "max_tokens", "label_smoothing", "seed",
            "precision", "time_limit_min")
    assert {k: runs["gru"]["config"][k] for k in same} == {
        k: runs["transformer"]["config"][k] for k in same
    }
    assert runs["gru"]["signature"] == runs["transformer"]["signature"]
