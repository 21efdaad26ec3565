"""The command line: one line `error: ...` per user error, exit 2 (usage) or 1 (runtime).

Most tests call `cli.main` in-process; one runs `python -m transformer_lib` to check what a
shell sees (exit status, nothing on stdout, a single line on stderr, --debug's traceback).
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib import translation
from transformer_lib.translation import cli

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["translate", "--checkpoint", "x", "--beam", "0"], "--beam: must be an integer >= 1"),
        (["evaluate", "--checkpoint", "x", "--beam", "-2"], "--beam: must be an integer >= 1"),
        (["evaluate", "--checkpoint", "x", "--limit", "0"], "--limit: must be an integer >= 1"),
        (["evaluate", "--length-penalty", "-0.5"], "--length-penalty: must be a number >= 0"),
        (["translate", "--length-penalty", "nan"], "--length-penalty: must be a number >= 0"),
        (["translate", "--length-penalty", "long"], "--length-penalty: must be a number >= 0"),
        (["translate", "--beam", "1", "--length-penalty", "1"], "applies to beam search"),
        (["evaluate", "--beam", "1", "--length-penalty", "0"], "applies to beam search"),
        (["train", "--config", "c", "--run-dir", "r", "--epochs", "two"], "--epochs"),
        (["train", "--config", "c"], "--run-dir"),
        (["fly"], "invalid choice"),
        ([], "command"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, argv, needle):
    assert cli.main(argv) == 2
    assert needle in _one_error_line(capsys)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["train", "--config", "missing.toml", "--run-dir", "r"], "missing.toml"),
        (["evaluate", "--checkpoint", "nowhere"], "nowhere"),
        (["translate", "--checkpoint", "nowhere"], "nowhere"),
    ],
)
def test_runtime_errors_exit_1_with_one_line(capsys, monkeypatch, tmp_path, argv, needle):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hallo\n"))
    assert cli.main(argv) == 1
    assert needle in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_a_bad_config_value_is_one_line_naming_the_key(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY.read_text().replace("save_every = 4", "save_every = 0"))
    assert cli.main(["train", "--config", str(bad), "--run-dir", str(tmp_path / "r")]) == 1
    assert "save_every must be an integer >= 1" in _one_error_line(capsys)
    bad.write_text("epochs = [1\n")
    assert cli.main(["train", "--config", str(bad), "--run-dir", str(tmp_path / "r")]) == 1
    assert str(bad) in _one_error_line(capsys)
    assert not (tmp_path / "r").exists()


def _stdin_bytes(monkeypatch, raw: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))


def test_translate_reports_a_bad_line_and_translates_the_others(checkpoint_dir, capsys,
                                                                monkeypatch):
    _stdin_bytes(monkeypatch, b"Ein Hund.\r\nZwei \xff\xfe M\xe4nner.\nEine Frau.\n")
    assert cli.main(["translate", "--checkpoint", str(checkpoint_dir), "--beam", "1"]) == 1
    captured = capsys.readouterr()
    out = captured.out.split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""  # one output line per input line
    model, tok, _ = translation.load_model(checkpoint_dir, torch.device("cpu"))
    want = translation.translate_sentences(model, tok, ["Ein Hund.", "Eine Frau."])
    assert [out[0], out[2]] == want
    assert captured.err.strip() == "error: line 2: not valid UTF-8 (byte 0xff at position 5)"


def test_translate_refuses_an_over_long_line_by_number(checkpoint_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n" + "Hund " * 5000 + "\n"))
    assert cli.main(["translate", "--checkpoint", str(checkpoint_dir), "--beam", "1",
                     "--max-input-len", "100"]) == 1
    captured = capsys.readouterr()
    assert len(captured.out.split("\n")) == 3
    assert captured.err.startswith("error: line 2: ") and "max-input-len 100" in captured.err


def test_the_shell_sees_one_line_and_debug_shows_the_traceback(tmp_path):
    cmd = [sys.executable, "-m", "transformer_lib", "evaluate", "--checkpoint", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    proc = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 1 and "Traceback" in proc.stderr
