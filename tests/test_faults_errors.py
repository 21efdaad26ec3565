"""Issue 34, "clear errors where a user error is expected", and unusual but valid input that
got a silently wrong answer: each test failed before its fix.

A user's mistake gets an error that names the argument, the file or the device and says what
was expected, never an ``IndexError`` or ``AttributeError`` from deep inside a library.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib import translation
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.masks import subsequent_mask
from transformer_lib.model import make_model
from transformer_lib.translation import inference, pretrained
from transformer_lib.translation._fileio import FileLock, LockHeld, this_host, tmp_prefix
from transformer_lib.translation.checkpoint import load_checkpoint, save_checkpoint
from transformer_lib.translation.config import Config, config_from_saved, load_config
from transformer_lib.translation.pretrained import load_pretrained, pretrained_path

ROOT = Path(__file__).resolve().parents[1]
V = 11  # the tiny models' vocabulary


def _tiny(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    return make_model(V, V, N=1, d_model=16, d_ff=32, h=2, dropout=0.0, **kw).eval()


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained(device="cpu")


# ------------------------------------------------------------------ the model (chapter 5)


@pytest.mark.parametrize("where, bad", [("src", V), ("src", -1), ("tgt", V), ("tgt", -3)])
@pytest.mark.parametrize("call", ["forward", "encode_or_decode"])
def test_token_ids_outside_the_vocabulary_name_the_argument_and_the_size(where, bad, call):
    model = _tiny()
    src, tgt = torch.tensor([[1, 2, 3]]), torch.tensor([[1, 4]])
    if where == "src":
        src[0, 1] = bad
    else:
        tgt[0, 1] = bad
    with pytest.raises(ValueError, match=rf"{where} must hold token ids in \[0, {V}\).*{bad}"):
        if call == "forward":
            model(src, tgt, None, subsequent_mask(2))
        elif where == "src":
            model.encode(src, None)
        else:
            model.decode(model.encode(src, None), None, tgt, subsequent_mask(2))


def test_out_of_range_source_ids_are_named_by_the_decoders_too():
    src = torch.tensor([[1, 2, V + 5]])
    mask = torch.ones(1, 1, 3, dtype=torch.bool)
    for decode in (greedy_decode, beam_search):
        with pytest.raises(ValueError, match=rf"src must hold token ids in \[0, {V}\)"):
            decode(_tiny(), src, mask, 5, 1, 2)


def test_the_range_check_leaves_valid_and_empty_input_alone():
    model = _tiny()
    src = torch.tensor([[0, V - 1], [3, 4]])
    out = model(src, src, None, subsequent_mask(2))
    assert out.shape == (2, 2, 16)
    assert model.encode(torch.zeros(0, 3, dtype=torch.long), None).shape == (0, 3, 16)


@pytest.mark.parametrize("arg", ["src_vocab", "tgt_vocab", "N", "d_model", "d_ff", "h",
                                 "max_len", "pad_idx"])
@pytest.mark.parametrize("value", [True, False])
def test_make_model_refuses_bools_for_integer_arguments(arg, value):
    kw = dict(src_vocab=V, tgt_vocab=V, N=1, d_model=16, d_ff=32, h=2)
    kw[arg] = value
    with pytest.raises(ValueError, match=rf"{arg} must be .*integer.*got {value}"):
        make_model(**kw)


@pytest.mark.parametrize("arg", ["norm_first", "share_embeddings", "skip_padding"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_make_model_refuses_non_bools_for_flags(arg, value):
    """``norm_first="no"`` is truthy: it built a pre-norm model, silently."""
    with pytest.raises(ValueError, match=rf"{arg} must be True or False, got {value!r}"):
        make_model(V, V, N=1, d_model=16, d_ff=32, h=2, **{arg: value})


# ------------------------------------------------------------------ decoding (chapter 7)


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_search_on_an_empty_batch_returns_an_empty_result(use_cache):
    src = torch.zeros(0, 3, dtype=torch.long)
    mask = torch.ones(0, 1, 3, dtype=torch.bool)
    assert greedy_decode(_tiny(), src, mask, 5, 1, 2, use_cache=use_cache).shape[0] == 0
    assert beam_search(_tiny(), src, mask, 5, 1, 2, use_cache=use_cache) == []


# ------------------------------------------------------------------ checkpoints and files

_FSIZE = """
import resource, signal, sys
from pathlib import Path
from transformer_lib.model import make_model
from transformer_lib.translation.checkpoint import save_checkpoint
path = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
big = sys.argv[3] == "weights"  # else a long JSON file (a long history, say)
model = make_model(50, 50, N=2 if big else 1, d_model=32 if big else 8, d_ff=64, h=2)
try:
    save_checkpoint(path, model, {"n": 2}, extra=None if big else {"log": "x" * 100_000})
except OSError as e:
    print("OSError", e.errno, e)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
@pytest.mark.parametrize("what", ["weights", "json"])  # the file that hits the limit
def test_a_save_over_the_file_size_limit_names_the_checkpoint_and_keeps_the_old_one(
        tmp_path, what):
    path = tmp_path / "last"
    save_checkpoint(path, make_model(50, 50, N=1, d_model=32, d_ff=64, h=2), {"n": 1},
                    optimizer=None, rng=False)
    out = subprocess.run([sys.executable, "-c", _FSIZE, str(path), "50000", what], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OSError 27 "), out.stdout + out.stderr
    assert str(path) in out.stdout and "File too large" in out.stdout
    assert ("model.safetensors" if what == "weights" else "trainer.json") in out.stdout
    assert "internal" not in out.stdout and "Safetensor" not in out.stdout
    assert load_checkpoint(path)["config"] == {"n": 1}  # the previous checkpoint, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last"]


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("N = 2\n# Größe\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"config .*{path.name} is not UTF-8 text.*line 2"):
        load_config(path)


def _small_checkpoint(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", torch.nn.Linear(2, 2), {"n": 1},
                           train_state={"step": 1})


@pytest.mark.parametrize("files", [
    ["model.safetensors", "config.json"],  # a list, not a mapping
    {"config.json": "abc"},  # an entry that is not an object
    {"config.json": {"bytes": 3}},  # no sha256
    {"../config.json": {"sha256": "0" * 64, "bytes": 1}},  # not a file of the directory
    "everything",
])
def test_a_malformed_manifest_is_named(tmp_path, files):
    path = _small_checkpoint(tmp_path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"] = files
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"{path / 'manifest.json'}: .*files"):
        load_checkpoint(path)


@pytest.mark.parametrize("pid", ["abc", 10**20, 1e300, None, [1], True, -5, 0])
def test_a_lock_file_with_a_malformed_pid_on_this_host_is_stale(tmp_path, pid):
    """No process can own it: it is taken over like a dead process's lock."""
    lock = tmp_path / "x.lock"
    lock.write_text(json.dumps({"pid": pid, "host": this_host(), "token": "t"}))
    with FileLock(lock, what="thing"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()


def test_a_lock_file_with_a_malformed_pid_elsewhere_is_named(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text(json.dumps({"pid": 10**20, "host": "elsewhere"}))
    with pytest.raises(LockHeld, match=rf"host elsewhere.*delete the lock file {lock}"):
        FileLock(lock, what="thing").acquire()


def test_debris_named_with_an_impossible_pid_does_not_break_a_save(tmp_path):
    path = _small_checkpoint(tmp_path)
    (tmp_path / (tmp_prefix(path, 10**20) + "x")).mkdir()  # no such process
    save_checkpoint(path, torch.nn.Linear(2, 2), {"n": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# ------------------------------------------------------------------ config validation


def test_a_seed_torch_cannot_take_is_refused_when_the_config_is_made():
    with pytest.raises(ValueError, match=r"config: seed must be an integer in \[0, 2\*\*64 - 1\]"):
        load_config(None, seed=2**64)
    with pytest.raises(ValueError, match="seed"):
        config_from_saved({"seed": 2**64}, "somewhere")
    assert load_config(None, seed=2**64 - 1).seed == 2**64 - 1
    torch.manual_seed(2**64 - 1)  # the bound is torch's


_FLOATS = [f.name for f in dataclasses.fields(Config)
           if "float" in str(f.type) and f.name != "adam_betas"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("key", _FLOATS)
def test_non_finite_numbers_are_refused_for_every_number_key(key, value):
    """A regression guard (these were refused already); max_len_a is among them."""
    assert "max_len_a" in _FLOATS and len(_FLOATS) >= 10
    with pytest.raises(ValueError, match=rf"config: {key} must be"):
        load_config(None, **{key: value})
    with pytest.raises(ValueError, match=rf"{key} must be"):
        config_from_saved({key: value}, "somewhere")


# ------------------------------------------------------------------ devices, limits


_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@_NO_CUDA
@pytest.mark.parametrize("device", ["cuda", torch.device("cuda", 1), "meta"])
def test_loaders_name_a_device_this_machine_does_not_have(device):
    name = str(torch.device(device))
    with pytest.raises(ValueError, match=rf"device '?{name}'?"):
        load_pretrained(device=device)
    with pytest.raises(ValueError, match=rf"device '?{name}'?"):
        translation.load_model(pretrained_path(), torch.device(device))
    with pytest.raises(ValueError, match=rf"device '?{name}'?"):
        load_checkpoint(pretrained_path(), map_location=device)
    with pytest.raises(ValueError, match=rf"device '?{name}'?"):
        inference.translate(pretrained_path(), ["Ein Hund."], device=torch.device(device))


@_NO_CUDA
def test_training_on_a_device_this_machine_does_not_have_is_named_before_work(tmp_path):
    cfg = load_config(Path(__file__).parents[1] / "configs" / "tiny.toml")
    with pytest.raises(ValueError, match=r"device 'cuda'"):
        translation.train(cfg, tmp_path / "run", device="cuda", progress=False)
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


def test_a_device_that_is_no_device_is_named():
    with pytest.raises(ValueError, match=r"device must be .*got 'gpu'"):
        load_pretrained(device="gpu")


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_evaluate_names_a_bad_limit(limit):
    with pytest.raises(ValueError, match=rf"limit must be None or an integer >= 1, got {limit}"):
        inference.evaluate(pretrained_path(), limit=limit, device=torch.device("cpu"))


# ------------------------------------------------------------------ the shipped model's card


def test_every_shipped_file_is_in_the_manifest():
    folder = pretrained_path()
    listed = json.loads((folder / "manifest.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in folder.iterdir() if p.name != "manifest.json")
    assert "MODEL_CARD.md" in listed


def test_an_edited_model_card_is_refused(tmp_path, monkeypatch):
    copy = shutil.copytree(pretrained_path(), tmp_path / "m")
    card = copy / "MODEL_CARD.md"
    text = card.read_text(encoding="utf-8")
    assert "BLEU = " in text
    card.write_text(text.replace("BLEU = ", "BLEU = 9", 1), "utf-8")  # a better score
    monkeypatch.setitem(pretrained.PRETRAINED, "multi30k_de_en", str(copy))
    with pytest.raises(ValueError, match=r"MODEL_CARD\.md is corrupt"):
        load_pretrained(device="cpu")


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path, monkeypatch):
    copy = shutil.copytree(pretrained_path(), tmp_path / "m")
    (copy / "notes.txt").write_text("not from the trainer\n")
    monkeypatch.setitem(pretrained.PRETRAINED, "multi30k_de_en", str(copy))
    with pytest.raises(ValueError, match=r"not in its manifest: \['notes\.txt'\]"):
        load_pretrained(device="cpu")


# ------------------------------------------------------------------ unusual but valid input


@pytest.mark.parametrize("beam", [1, 4])
def test_an_empty_or_blank_source_translates_to_an_empty_line(shipped, beam):
    """It was "A man." / "A violin is about to be playing.": a translation of nothing."""
    model, tok, _ = shipped
    out = inference.translate_sentences(model, tok, ["", "Ein Hund.", "  \t "], beam_size=beam)
    assert out[0] == "" and out[2] == "" and "dog" in out[1].lower()


def test_a_single_string_is_not_translated_letter_by_letter(shipped):
    model, tok, _ = shipped
    with pytest.raises(ValueError, match="sentences must be a list of strings, got a str"):
        inference.translate_sentences(model, tok, "Ein Hund.")
    with pytest.raises(ValueError, match=r"sentences\[1\] must be a string, got None"):
        inference.translate_sentences(model, tok, ["Ein Hund.", None])


@pytest.mark.parametrize("kw, name", [
    (dict(max_len_a=math.nan), "max_len_a"), (dict(max_len_a=-1.0), "max_len_a"),
    (dict(max_len_a=math.inf), "max_len_a"), (dict(max_len_b=-5), "max_len_b"),
    (dict(max_len_b=2.5), "max_len_b"),
])
def test_translate_sentences_names_a_bad_output_length(shipped, kw, name):
    model, tok, _ = shipped
    with pytest.raises(ValueError, match=rf"{name} must be"):
        inference.translate_sentences(model, tok, ["Ein Hund."], **kw)


def test_bleu_refuses_hypotheses_and_pairs_that_do_not_line_up():
    """sacreBLEU scored the shorter list silently (100.0 for one of two sentences)."""
    with pytest.raises(ValueError, match="1 hypotheses for 2 sentence pairs"):
        inference.bleu(["a b c"], [("x", "a b c"), ("y", "d e f")])


def test_scoring_no_pairs_is_a_clear_error(shipped):
    model, tok, cfg = shipped
    with pytest.raises(ValueError, match="pairs is empty"):
        inference.translate_and_score(model, tok, cfg, [])


def test_documents_saved_with_a_checkpoint_are_in_its_manifest_and_checked(tmp_path):
    path = save_checkpoint(tmp_path / "c", torch.nn.Linear(2, 2), {"n": 1}, rng=False,
                           documents={"CARD.md": "# a card\n"})
    listed = json.loads((path / "manifest.json").read_text())["files"]
    assert "CARD.md" in listed and (path / "CARD.md").read_text() == "# a card\n"
    assert load_checkpoint(path)["config"] == {"n": 1}
    (path / "CARD.md").write_text("# another card\n")
    with pytest.raises(ValueError, match=r"CARD\.md is corrupt"):
        load_checkpoint(path)
    with pytest.raises(ValueError, match="documents"):
        save_checkpoint(tmp_path / "d", torch.nn.Linear(2, 2), {}, documents={"config.json": ""})


@pytest.mark.multi30k
def test_the_shipping_tool_puts_the_card_in_the_manifest(tmp_path, monkeypatch):
    from _tools import load_tool

    from transformer_lib.model import count_parameters
    from transformer_lib.translation.provenance import read_provenance, write_provenance

    ship = load_tool("ship_model")
    run = tmp_path / "run"
    cfg = load_config(ROOT / "configs" / "tiny.toml", train_limit=64, val_limit=8, epochs=1,
                      max_tokens=256, average_last=1, keep_last=1)
    translation.train(cfg, run, progress=False)
    if read_provenance(run) is None:
        write_provenance(run)
    model, _, cfg = translation.load_model(run / "best")
    score = {"checkpoint": "best", "bleu": 1.0, "score_line": "BLEU = 1.00"}
    results = {"system": "best_beam4", "scores": {"best_beam4": score}, "signature": "s",
               "parameters": count_parameters(model), "command": "tiny", "epochs": 1,
               "config": json.loads(json.dumps(dataclasses.asdict(cfg))), "steps": 1,
               "train_minutes": 0.1, "wall_minutes_total": 0.1,
               "provenance": read_provenance(run)}
    (tmp_path / "results.json").write_text(json.dumps(results))
    out = tmp_path / "pretrained" / "multi30k_de_en"
    monkeypatch.setattr(ship, "OUT", out)
    monkeypatch.setattr(sys, "argv", ["ship_model.py", "--run", str(run), "--checkpoint",
                                      "best", "--results", str(tmp_path / "results.json")])
    assert ship.main() == 0
    listed = json.loads((out / "manifest.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
    card = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "- files: MODEL_CARD.md, config.json, manifest.json, model.safetensors," in card


def test_a_vocabulary_too_large_to_allocate_is_refused_not_an_abort():
    """The tokenizer library reserved memory for every entry at once: vocab_size = 2**40
    aborted the whole process ("memory allocation of 72567767433232 bytes failed")."""
    code = ("from transformer_lib.translation import data\n"
            "try:\n    data.train_tokenizer(['a b c'], vocab_size=2**40)\n"
            "except ValueError as e:\n    print('ValueError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.startswith("ValueError vocab_size must be") and "1048576" in out.stdout
    with pytest.raises(ValueError, match=r"config: vocab_size must be an integer >= 260 and <= "):
        load_config(None, vocab_size=2**40)


def test_a_key_set_in_two_tables_of_a_config_file_is_an_error(tmp_path):
    """Tables only group keys, so `N = 6` at the top and `N = 2` under [model] are one key set
    twice: the last one won, silently."""
    path = tmp_path / "twice.toml"
    path.write_text("N = 6\n[model]\nN = 2\n[train]\nepochs = 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"twice\.toml sets N twice"):
        load_config(path)
    path.write_text("[data]\nvocab_size = 600\n[model]\nvocab_size = 900\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"sets vocab_size twice \(in \[data\] and \[model\]\)"):
        load_config(path)
