"""Command-line conventions (issue 52, item 5) and closed or odd standard streams (issue 54).

`--version`; usage naming the command as typed; `translate [FILE]`; help for every option;
UTF-16 input; `2>&-` and `>&-`.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib import translation
from transformer_lib.translation import cli
from transformer_lib.translation._lines import utf16_encoding

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["Ein Hund rennt.", "Zwei Männer."]


def _expected(checkpoint_dir) -> list[str]:
    model, tok, _ = translation.load_model(checkpoint_dir, torch.device("cpu"))
    return translation.translate_sentences(model, tok, SENTENCES)


def test_version_names_the_command_and_the_package_version(capsys, monkeypatch):
    # before: "error: the following arguments are required: command"
    from importlib.metadata import version

    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/transformer-lib"])
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"transformer-lib {version('annotated-transformer-book')}\n"


@pytest.mark.parametrize(("argv0", "prog"), [
    ("/venv/bin/transformer-lib", "transformer-lib"),  # before: python -m transformer_lib
    ("/repo/transformer_lib/__main__.py", "python -m transformer_lib"),
])
def test_usage_names_the_command_as_typed(capsys, monkeypatch, argv0, prog):
    monkeypatch.setattr(sys, "argv", [argv0])
    with pytest.raises(SystemExit):
        cli.main(["translate", "--help"])
    assert capsys.readouterr().out.startswith(f"usage: {prog} translate ")


def test_the_console_script_says_its_own_name():
    script = Path(sys.executable).with_name("transformer-lib")
    if not script.exists():
        pytest.skip("the package's console script is not installed next to this Python")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 and done.stdout.startswith("usage: transformer-lib ")


def test_every_option_of_every_command_has_help():
    # before: evaluate --split had none
    parser = cli._parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_translate_reads_a_file(checkpoint_dir, capsys, tmp_path):
    # before: "unrecognized arguments"; translate read only stdin
    source = tmp_path / "in.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    assert cli.main(["translate", "--checkpoint", str(checkpoint_dir), "--beam", "1",
                     str(source)]) == 0
    assert capsys.readouterr().out.splitlines() == _expected(checkpoint_dir)


def test_translate_names_a_missing_file_before_loading_the_model(capsys, tmp_path):
    assert cli.main(["translate", "--checkpoint", "nowhere", str(tmp_path / "no.txt")]) == 1
    assert capsys.readouterr().err == f"error: FILE {str(tmp_path / 'no.txt')!r} does not exist\n"
    assert cli.main(["translate", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_input_is_said_and_keeps_line_alignment(checkpoint_dir, capsys, monkeypatch,
                                                      encoding):
    # before: line 1 an error, later lines translated from NUL-interleaved bytes, and 3 output
    # lines for 2 input lines
    raw = "".join(s + "\n" for s in SENTENCES).encode(encoding)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    assert cli.main(["translate", "--checkpoint", str(checkpoint_dir), "--beam", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == _expected(checkpoint_dir)
    assert captured.err.startswith("note: input is UTF-16 (or not UTF-8)")


def test_utf8_with_a_nul_byte_is_not_taken_for_utf16():
    assert utf16_encoding(b"Ein Hund\0 rennt.\n") is None
    assert utf16_encoding(b"Ein Hund.\n") is None


def _shell(command: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, text=True,
                          cwd=ROOT, timeout=300, check=False)


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell closes the stream")
def test_errors_with_stderr_closed_do_not_land_in_stdout(tmp_path):
    # before: "error: ..." was printed into stdout, among the translations
    done = _shell(f"{sys.executable} -m transformer_lib translate --checkpoint "
                  f"{tmp_path / 'nowhere'} 2>&-", stdin="Hallo\n")
    assert done.returncode == 1 and done.stdout == ""


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell closes the stream")
def test_translate_with_stdout_closed_is_one_error_before_the_work(checkpoint_dir):
    # before: the lines were translated, then AttributeError ('NoneType' ... 'flush')
    done = _shell(f"{sys.executable} -m transformer_lib translate --checkpoint "
                  f"{checkpoint_dir} >&-", stdin="Hallo\n")
    assert done.returncode == 1
    assert done.stderr == ("error: standard output is closed: translate writes its result "
                           "there; redirect it to a file instead of closing it\n")
