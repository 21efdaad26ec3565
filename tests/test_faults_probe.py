"""Faults found by the probe after issue 34's fixes: each test failed before its fix.

Odd but valid input that gave a silently wrong answer (a byte order mark translated as text,
a translation that depended on the sentences batched beside it, an empty --checkpoint that
meant the shipped model, an --output that overwrote the file it scored), and input that gave a
traceback or "internal error" where a user error was due (a generator of sentences, a lone
surrogate, a crafted train_state, multi30k_report's --beam 1). The tiny untrained checkpoint of
conftest: seconds each.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from _tools import checkpoint_with_config, load_tool

from transformer_lib.translation import cli, inference

BOM = "\ufeff"


def test_a_byte_order_mark_is_not_translated(checkpoint_dir):
    # Notepad and friends start UTF-8 files with U+FEFF: it is not part of the first sentence
    model, tok, _ = inference.load_model(checkpoint_dir)
    plain = inference.translate_sentences(model, tok, ["Ein Hund rennt.", ""])
    marked = inference.translate_sentences(model, tok, [BOM + "Ein Hund rennt.", BOM])
    assert marked == plain


@pytest.mark.parametrize("zipped", [False, True])
def test_evaluate_files_drop_the_byte_order_mark(tmp_path: Path, zipped: bool):
    # in --ref it would make the first reference's first word a different word for BLEU
    path = tmp_path / ("ref.txt.gz" if zipped else "ref.txt")
    data = (BOM + "A dog runs.\r\nTwo cats.\n").encode("utf-8")
    path.write_bytes(gzip.compress(data) if zipped else data)
    lines, count = cli._read_lines(str(path), "--ref", None)
    assert (lines, count) == (["A dog runs.", "Two cats."], 2)


def test_sentences_may_be_any_iterable(checkpoint_dir):
    # a generator was a TypeError (no len()) after the check had iterated it
    model, tok, _ = inference.load_model(checkpoint_dir)
    sentences = ["Ein Hund.", "Zwei Katzen."]
    listed = inference.translate_sentences(model, tok, sentences)
    generated = inference.translate_sentences(model, tok, (s for s in sentences))
    assert generated == listed and len(listed) == 2


def test_average_checkpoints_of_one_path_string_says_so(checkpoint_dir):
    from transformer_lib.translation.checkpoint import average_checkpoints

    with pytest.raises(ValueError, match="list of checkpoint directories"):
        average_checkpoints(str(checkpoint_dir))


# ------------------------------------------------------------------------------ multi30k_report
REPORT = load_tool("multi30k_report")


@pytest.mark.parametrize("extra, message", [
    (["--beam", "1"], "--beam 1: must be from 2"),  # was a KeyError after all the scoring
    (["--beam", "0"], "--beam 0: must be from 2"),  # was a traceback
    (["--beam", "100"], "--beam 100: must be from 2"),
    (["--system", "validation", "--length-penalties", "nan"], "--length-penalties [nan]"),
    (["--system", "validation", "--length-penalties", "-1"], "--length-penalties [-1.0]"),
    (["--wall-minutes", "nan"], "--wall-minutes nan"),  # was written into the results
])
def test_report_refuses_bad_decoding_arguments_first(extra, message, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "last").mkdir(parents=True)
    (run / "history.json").write_text('[{"epoch": 1, "step": 1, "tokens": 9, "minutes": 1}]')
    (run / "config.json").write_text('{"length_penalty": 0.6}')
    with pytest.raises(SystemExit) as e:
        REPORT.parse_args(["--run", str(run), "--out", str(tmp_path / "r.json"), "--command",
                           "x", "--checkpoints", "last", "--system", "last", *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err


# ------------------------------------------------------------------------------ command line
def test_an_empty_checkpoint_is_not_the_shipped_model(capsys):
    # `--checkpoint "$CKPT"` with CKPT unset translated with the shipped model, silently
    assert cli.main(["translate", "--checkpoint", ""]) == 2
    assert "--checkpoint is empty" in capsys.readouterr().err


def test_an_empty_output_is_an_error_not_a_result_left_unwritten(tmp_path, capsys):
    src = tmp_path / "src.txt"
    src.write_text("Ein Hund.\n")
    assert cli.main(["evaluate", "--src", str(src), "--ref", str(src), "--output", ""]) == 1
    assert "--output ''" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["--src", "--ref"])
def test_the_output_cannot_overwrite_the_files_it_scores(which, tmp_path, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("Ein Hund.\n")
    ref.write_text("A dog.\n")
    target = src if which == "--src" else ref
    status = cli.main(["evaluate", "--src", str(src), "--ref", str(ref), "--output",
                       str(tmp_path / "." / target.name)])
    assert status == 1 and f"is the {which} file" in capsys.readouterr().err
    assert src.read_text() == "Ein Hund.\n" and ref.read_text() == "A dog.\n"


def test_a_config_saved_with_a_byte_order_mark_reads(tmp_path):
    # was "not valid TOML: Invalid statement (at line 1, column 1)"
    from transformer_lib.translation.config import load_config

    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbfepochs = 3\r\nd_model = 32\r\n")
    cfg = load_config(path)
    assert (cfg.epochs, cfg.d_model) == (3, 32)
    path.write_bytes(b"epochs = 3\n\xfc = 1\n")
    with pytest.raises(ValueError, match="not UTF-8 text .* line 2"):
        load_config(path)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_translation_does_not_depend_on_the_sentences_beside_it(checkpoint_dir, beam):
    # the output limit a * length + b was the longest source's in the batch: an untrained
    # model (that never stops) gave a short sentence a longer translation when batched
    model, tok, _ = inference.load_model(checkpoint_dir)
    sentences = ["Ein Hund.", "Zwei Katzen laufen im Park und spielen mit einem roten Ball.",
                 "Kinder.", "Ein Mann sitzt auf einer Bank."] * 2
    kwargs = dict(beam_size=beam, max_len_a=1.0, max_len_b=2, precision="fp32")
    alone = [inference.translate_sentences(model, tok, [s], **kwargs)[0] for s in sentences]
    assert inference.translate_sentences(model, tok, sentences, **kwargs) == alone
    assert inference.translate_sentences(model, tok, sentences, batch_size=2, **kwargs) == alone


def test_a_lone_surrogate_is_a_value_error_naming_the_sentence(checkpoint_dir):
    # text decoded with errors="surrogateescape" was a TypeError from inside the tokenizer
    model, tok, _ = inference.load_model(checkpoint_dir)
    with pytest.raises(ValueError, match=r"sentences\[1\] is not valid Unicode"):
        inference.translate_sentences(model, tok, ["Ein Hund.", "Gr\udcfc\u00dfe"])


# ------------------------------------------------------------------------------ resume
@pytest.mark.parametrize("change, message", [
    ({"epoch": "2"}, "epoch must be an integer"),  # was a TypeError (internal error)
    ({"epoch": 2.5}, "epoch must be an integer"),
    ({"epoch": -5}, "epoch must be an integer >= 0"),  # trained 8 epochs instead of 1
    ({"history": "x"}, "history must be a list"),  # was an AttributeError
    ({"train_seconds": float("nan")}, "train_seconds must be a finite number"),
    ({"step_in_epoch": 10**6}, "step_in_epoch 1000000 exceeds step"),  # an empty epoch 3
    ({"step": None}, "step must be an integer"),
    ({"nope": 1}, "unknown key(s) ['nope']"),  # was a TypeError
])
def test_a_crafted_train_state_is_refused_naming_the_checkpoint(change, message):
    from transformer_lib.translation.loop import _saved_state

    saved = {"step": 20, "accum_step": 20, "samples": 128, "tokens": 3726, "epoch": 2,
             "step_in_epoch": 0, "train_seconds": 19.6, "best_bleu": -1.0, "history": [{}],
             "epoch_loss": 0.0, "epoch_tokens": 0}
    assert _saved_state(saved, Path("run/last")).epoch == 2
    with pytest.raises(ValueError, match="checkpoint run/last: its train_state") as e:
        _saved_state({**saved, **change}, Path("run/last"))
    assert message in str(e.value)
    with pytest.raises(ValueError, match="at least step and epoch"):
        _saved_state({k: v for k, v in saved.items() if k != "step"}, Path("run/last"))


def test_a_length_penalty_is_not_ignored_when_the_config_decodes_greedily(
        checkpoint_dir, tmp_path, capsys, monkeypatch):
    # --beam 1 --length-penalty was refused, but a config's beam_size 1 ignored it silently
    import io
    import sys

    greedy = checkpoint_with_config(checkpoint_dir, tmp_path / "greedy", beam_size=1)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n"))
    assert cli.main(["translate", "--checkpoint", str(greedy), "--length-penalty", "1.5"]) == 2
    assert "--length-penalty applies to beam search" in capsys.readouterr().err
    model, tok, cfg = inference.load_model(greedy)
    with pytest.raises(ValueError, match="applies to beam search"):
        inference.translate_and_score(model, tok, cfg, [("Ein Hund.", "A dog.")],
                                      length_penalty=1.5)
    assert inference.translate_and_score(model, tok, cfg, [("Ein Hund.", "A dog.")],
                                         length_penalty=1.5, beam_size=2)["beam_size"] == 2


def test_a_run_killed_while_writing_its_config_can_start_again(tmp_path):
    # SIGKILL during the first write left only .config.json.tmp-*: a new run said "not empty"
    # and a resume "last is missing", so neither could use the directory
    from transformer_lib.translation.config import Config
    from transformer_lib.translation.rundir import check_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / ".config.json.tmp-123-0a1b2c3d").write_text("{")
    (run / ".last.tmp-123-0a1b2c3d-xyz").mkdir()
    check_run_dir(Config(), run, resume=False)
    (run / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes.txt"):
        check_run_dir(Config(), run, resume=False)


def test_report_scores_beam_search_at_the_alpha_it_files_it_under(tmp_path, monkeypatch):
    # a resume may change length_penalty: RUN/config.json then holds the new alpha, checkpoints
    # saved before it the old one, which evaluate() used while the score was filed as the new
    import argparse

    calls = []

    def evaluate(path, split, **kwargs):
        calls.append(kwargs)
        return {"bleu": 1.0, "score_line": "BLEU = 1.0", "signature": "s", "seconds": 0,
                "hypotheses": []}

    monkeypatch.setattr(REPORT.translation, "evaluate", evaluate)
    args = argparse.Namespace(run=tmp_path, beam=4, limit=2)
    REPORT.score_on_test(args, ["best"], 0.6, 0.6)
    assert calls == [{"beam_size": 1, "limit": 2},
                     {"beam_size": 4, "limit": 2, "length_penalty": 0.6}]
