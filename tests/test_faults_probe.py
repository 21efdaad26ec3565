"""Faults found by the probe after issue 34's fixes: each test failed before its fix.

Odd but valid input that gave a silently wrong answer. The tiny untrained checkpoint of
conftest: seconds each.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from _tools import load_tool

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
    # a generator was iterated by the check, then translated as nothing: [] for two sentences
    model, tok, _ = inference.load_model(checkpoint_dir)
    listed = inference.translate_sentences(model, tok, ["Ein Hund.", "Zwei Katzen."])
    generated = inference.translate_sentences(model, tok, (s for s in ["Ein Hund.", "Zwei Katzen."]))
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
    (run / "history.json").write_text('[{"epoch": 1, "step": 1}]')
    (run / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        REPORT.parse_args(["--run", str(run), "--out", str(tmp_path / "r.json"), "--command",
                           "x", "--checkpoints", "last", "--system", "last", *extra])
    assert e.value.code == 2 and message in capsys.readouterr().err
