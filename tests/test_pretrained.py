"""The model that ships with the package: it loads, verifies, translates, and refuses a
tampered copy."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors import safe_open

from transformer_lib import pretrained
from transformer_lib.pretrained import load_pretrained, pretrained_path
from transformer_lib.trainer import load_model, translate_sentences

SENTENCE = "Ein Hund rennt durch den Schnee."


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained(device="cpu")


def test_loads_in_eval_mode_in_float32(shipped):
    model, tok, cfg = shipped
    assert not model.training
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert tok.get_vocab_size() == cfg.vocab_size
    # tied embeddings survive the round trip: one tensor in three places
    assert model.src_embed[0].lut.weight is model.generator.proj.weight


def test_weights_are_stored_in_bfloat16():
    path = pretrained_path() / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {"BF16"}
    assert path.stat().st_size < 20 * 2**20  # the repository's limit for shipped weights


def test_translates_the_readme_sentence(shipped):
    model, tok, _ = shipped
    greedy, beam = (
        translate_sentences(model, tok, [SENTENCE], beam_size=b)[0] for b in (1, 4)
    )
    for out in (greedy, beam):
        assert "dog" in out.lower() and "snow" in out.lower(), out


def test_a_tampered_copy_is_refused(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(pretrained_path(), copy)
    load_model(copy, torch.device("cpu"))  # the untouched copy loads
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte in the last weight
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors"):
        load_model(copy, torch.device("cpu"))


def test_an_edited_tokenizer_is_refused(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(pretrained_path(), copy)
    tok = copy / "tokenizer.json"
    tok.write_text(tok.read_text(encoding="utf-8").replace("Hund", "Katze", 1), "utf-8")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_model(copy, torch.device("cpu"))


def test_unknown_name_and_missing_files(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="name must be one of"):
        pretrained_path("gpt-5")
    monkeypatch.setitem(pretrained.PRETRAINED, "multi30k_de_en", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="missing"):
        load_pretrained()


# ------------------------------------------------------------------ the command line


def _cli(argv, stdin=b"", monkeypatch=None, capsys=None):
    import io
    import sys

    from transformer_lib.cli import main

    class _Stdin(io.TextIOWrapper):
        pass

    monkeypatch.setattr(sys, "stdin", _Stdin(io.BytesIO(stdin), encoding="utf-8"))
    status = main(argv)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_translate_without_a_checkpoint_uses_the_shipped_model(monkeypatch, capsys):
    status, out, err = _cli(["translate", "--beam", "1"], (SENTENCE + "\n").encode(),
                            monkeypatch, capsys)
    assert status == 0, err
    assert "dog" in out.lower() and out.count("\n") == 1


def test_evaluate_scores_any_file_pair_plain_or_gzipped(tmp_path, monkeypatch, capsys):
    import gzip

    src = ["Ein Hund rennt durch den Schnee.", "Zwei Männer spielen Fußball."]
    ref = ["A dog runs through the snow.", "Two men are playing soccer."]
    (tmp_path / "a.de").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "a.en.gz").write_bytes(gzip.compress(("\n".join(ref) + "\n").encode()))
    out_json = tmp_path / "result.json"
    status, out, err = _cli(
        ["evaluate", "--src", str(tmp_path / "a.de"), "--ref", str(tmp_path / "a.en.gz"),
         "--beam", "1", "--output", str(out_json)], b"", monkeypatch, capsys,
    )
    assert status == 0, err
    assert out.startswith("BLEU = ") and "nrefs:1" in out
    import json

    result = json.loads(out_json.read_text(encoding="utf-8"))
    assert result["sentences"] == 2 and len(result["hypotheses"]) == 2
    assert 0 < result["bleu"] <= 100


def test_evaluate_and_translate_take_the_length_penalty(shipped, tmp_path, monkeypatch,
                                                        capsys):
    import json

    # alpha 0 ranks beams by plain log-probability (short outputs), 3 strongly favours long ones
    src = ["Ein Hund rennt durch den Schnee.", "Zwei Männer spielen Fußball im Park."]
    ref = ["A dog runs through the snow.", "Two men are playing soccer in the park."]
    (tmp_path / "a.de").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("\n".join(ref) + "\n", encoding="utf-8")
    model, tok, cfg = shipped
    wants = []
    for alpha in (0.0, 3.0):
        want = translate_sentences(model, tok, src, beam_size=3, **cfg.decode_kwargs(alpha))
        wants.append(want)
        out_json = tmp_path / f"result_{alpha}.json"
        status, _, err = _cli(
            ["evaluate", "--src", str(tmp_path / "a.de"), "--ref", str(tmp_path / "a.en"),
             "--beam", "3", "--length-penalty", str(alpha), "--output", str(out_json)],
            b"", monkeypatch, capsys,
        )
        assert status == 0, err
        result = json.loads(out_json.read_text(encoding="utf-8"))
        assert result["length_penalty"] == alpha and result["hypotheses"] == want
        status, out, err = _cli(["translate", "--beam", "3", "--length-penalty", str(alpha)],
                                ("\n".join(src) + "\n").encode(), monkeypatch, capsys)
        assert status == 0, err
        assert out.splitlines() == want
    assert wants[0] != wants[1]  # "Two men playing soccer" (alpha 0) gains its "are" (alpha 3)
    assert cfg.decode_kwargs()["length_penalty"] == cfg.length_penalty  # None keeps the config's
    with pytest.raises(ValueError, match="length_penalty must be a number >= 0"):
        cfg.decode_kwargs(-1.0)


@pytest.mark.parametrize(
    "files, argv_extra, match, status",
    [
        ({"a.de": "x\ny\n", "a.en": "x\n"}, [], "2 lines but --ref has 1", 1),
        ({"a.de": "x\n"}, ["--ref", "missing.en"], "is not a file", 1),
        ({"a.de": b"\xff\xfe\n", "a.en": "x\n"}, [], "line 1 is not valid UTF-8", 1),
        ({"a.de": "x\n"}, ["--ref-less"], "unrecognized arguments", 2),
    ],
)
def test_evaluate_file_errors(tmp_path, monkeypatch, capsys, files, argv_extra, match, status):
    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.encode()
        (tmp_path / name).write_bytes(data)
    argv = ["evaluate", "--src", str(tmp_path / "a.de")]
    if "a.en" in files:
        argv += ["--ref", str(tmp_path / "a.en")]
    argv += [str(tmp_path / a) if a.endswith(".en") else a for a in argv_extra]
    code, _, err = _cli(argv, b"", monkeypatch, capsys)
    assert code == status and match in err and err.count("\n") == 1, err


def test_src_without_ref_is_a_usage_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "a.de").write_text("x\n", encoding="utf-8")
    code, _, err = _cli(["evaluate", "--src", str(tmp_path / "a.de")], b"", monkeypatch, capsys)
    assert code == 2 and "--src and --ref go together" in err
