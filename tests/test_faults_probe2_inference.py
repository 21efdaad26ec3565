"""Faults of translation and evaluation found by the second probe: each test failed before its fix.

S3: ``translate(beam_size=1, length_penalty=...)`` dropped the penalty without a word.
S4: invisible characters (a zero-width space, NUL) were translated into invented text, and one
before a sentence changed its translation. C4: ``evaluate`` read the checkpoint's old data
folder before ``$MULTI30K_DIR`` and then advised leaving out a data_dir nobody gave. C11: a
file manager's ``.DS_Store`` made ``load_pretrained`` refuse the shipped model. C14: a source
of ``evaluate``'s split too long for ``max_input_len`` was named "sentences[0]".
"""

from __future__ import annotations

import gzip
import shutil

import pytest
import torch
from _tools import checkpoint_with_config

from transformer_lib import load_pretrained
from transformer_lib.translation import data, inference, pretrained
from transformer_lib.translation.pretrained import pretrained_path

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def shipped():
    return load_pretrained(device="cpu")


# ------------------------------------------------------------------ S3: the length penalty


def test_translate_refuses_a_length_penalty_it_would_ignore(checkpoint_dir, tmp_path):
    with pytest.raises(ValueError, match="applies to beam search, but the beam size is 1"):
        inference.translate(checkpoint_dir, ["Ein Hund."], beam_size=1, length_penalty=1.0,
                            device=CPU)
    greedy = checkpoint_with_config(checkpoint_dir, tmp_path / "greedy", beam_size=1)
    with pytest.raises(ValueError, match="applies to beam search"):  # the config's beam
        inference.translate(greedy, ["Ein Hund."], length_penalty=1.0, device=CPU)
    assert len(inference.translate(greedy, ["Ein Hund."], device=CPU)) == 1
    assert len(inference.translate(greedy, ["Ein Hund."], beam_size=2, length_penalty=1.0,
                                   device=CPU)) == 1


# ------------------------------------------------------------------ S4: invisible characters


@pytest.mark.parametrize("text, expected", [
    ("A man.", "A man."),
    ("\u200bA\u00ad man.\x00", "A man."),  # zero-width space, soft hyphen, NUL: dropped
    ("\ufeffA\tman.\r\n", "A man."),  # a byte order mark; tab and line end: spaces
    ("A\u00a0\u3000 man.", "A man."),  # no-break, ideographic and plain: one space
    ("\u200b\x00\u2028 ", ""),
    ("Ä café, 東京 😀.", "Ä café, 東京 😀."),  # visible text is left as it is
])
def test_visible_text(text, expected):
    assert inference.visible_text(text) == expected


def test_invisible_characters_do_not_change_a_translation(shipped):
    model, tok, _ = shipped
    plain = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee."]
    marked = ["\u200bEin Mann fährt\u00a0Fahrrad.\x00", "Zwei  Hunde\tspielen im Schnee.\ufeff"]
    for beam in (1, 4):
        expected = inference.translate_sentences(model, tok, plain, beam_size=beam)
        assert inference.translate_sentences(model, tok, marked, beam_size=beam) == expected
        assert all(expected)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_of_nothing_visible_translates_to_an_empty_line(shipped, beam):
    """It was "Darks at the Burning.": a translation of a zero-width space."""
    model, tok, _ = shipped
    sources = ["\u200b", "\x00", "Ein Hund.", "\u00ad\u200b\x7f", "\u2028\u3000"]
    out = inference.translate_sentences(model, tok, sources, beam_size=beam)
    assert out[:2] == ["", ""] and out[3:] == ["", ""] and "dog" in out[2].lower()


def test_the_validation_and_test_sets_read_the_same(shipped):
    """The text the scores in the book come from has nothing for visible_text to change but one
    no-break space of the validation set."""
    changed = {split: [s for s, _ in data.load_multi30k(split)
                       if inference.visible_text(s) != s] for split in ("val", "test")}
    assert changed["test"] == [] and len(changed["val"]) == 1
    assert "\u00a0" in changed["val"][0]


# ------------------------------------------------------------------ C4: evaluate's data folder


def _val_copy(folder, source=None):
    """`folder` with the validation files of `source` (default: where the tests read
    Multi30k, the cache or $MULTI30K_DIR) copied in."""
    folder.mkdir(parents=True)
    for name in ("val.de.gz", "val.en.gz"):
        shutil.copyfile((source or data.default_data_dir()) / name, folder / name)
    return folder


def test_evaluate_reads_multi30k_dir_before_the_checkpoints_old_folder(
        checkpoint_dir, tmp_path, monkeypatch):
    copy = _val_copy(tmp_path / "mine")
    moved = checkpoint_with_config(checkpoint_dir, tmp_path / "c",
                                   data_dir=str(tmp_path / "gone"))
    monkeypatch.setenv("MULTI30K_DIR", str(copy))
    result = inference.evaluate(moved, "val", limit=2, device=CPU, max_input_len=None)
    assert result["sentences"] == 2


def test_evaluate_reads_the_checkpoints_folder_while_it_holds_the_split(
        checkpoint_dir, tmp_path, monkeypatch):
    folder = _val_copy(tmp_path / "theirs")
    with gzip.open(folder / "val.de.gz", "rt", encoding="utf-8") as f:
        first = f.readline().strip()
    trained = checkpoint_with_config(checkpoint_dir, tmp_path / "c", data_dir=str(folder))
    source = data.default_data_dir()
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("MULTI30K_URL", "http://127.0.0.1:9/")  # a download would fail
    result = inference.evaluate(trained, "val", limit=1, device=CPU, max_input_len=None)
    assert result["sentences"] == 1 and first
    # once the folder is gone, the cache is read (and here, offline, would be downloaded)
    shutil.rmtree(folder)
    _val_copy(tmp_path / "empty_cache" / "transformer_lib" / "multi30k", source)
    result = inference.evaluate(trained, "val", limit=1, device=CPU, max_input_len=None)
    assert result["sentences"] == 1


def test_evaluate_names_the_split_sentence_that_is_too_long(checkpoint_dir):
    with pytest.raises(ValueError, match=r"^the val split's sentence 1 has .*max_input_len=1$"):
        inference.evaluate(checkpoint_dir, "val", limit=2, device=CPU, max_input_len=1)


# ------------------------------------------------------------------ C11: file managers' files


@pytest.mark.parametrize("name", [".DS_Store", "._model.safetensors", "Thumbs.db",
                                  "desktop.ini"])
def test_a_file_managers_file_does_not_make_the_shipped_model_refused(
        name, tmp_path, monkeypatch):
    copy = shutil.copytree(pretrained_path(), tmp_path / "m")
    (copy / name).write_bytes(b"\x00\x01 Finder or Explorer")
    monkeypatch.setitem(pretrained.PRETRAINED, "multi30k_de_en", str(copy))
    model, tok, _ = load_pretrained(device="cpu")
    assert inference.translate_sentences(model, tok, ["Ein Hund."]) != [""]
    (copy / "notes.txt").write_text("anything else is still refused\n")
    with pytest.raises(ValueError, match=r"not in its manifest: \['notes\.txt'\]"):
        load_pretrained(device="cpu")
