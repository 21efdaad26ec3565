"""Faults of the command line and the tools found by the second probe: each test failed before
its fix.

C1: the shipped model's files keep their bytes in a clone with core.autocrlf=true (Windows).
C8: `translate` with stdin closed or a reader that leaves early; --config DIR, --checkpoint FILE
and blank path arguments. U1/C3: tools/ablations.py's arguments, and a row killed in its first
steps. U2: tools/tasks.py's empty paths and repeated CPU names. C12: tools/ship_model.py's
tracebacks for a missing checkpoint and null results.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _tools import load_tool

from transformer_lib.translation import cli

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "transformer_lib" / "pretrained" / "multi30k_de_en"

ABL = load_tool("ablations")
TASKS = load_tool("tasks")
SHIP = load_tool("ship_model")


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ------------------------------------------------------------------- C1: .gitattributes


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def git_files():
    """The shipped model's files as git tracks them (skipped without git or a repository)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    listed = _git("ls-files", "--", str(SHIPPED.relative_to(ROOT)))
    if listed.returncode != 0 or not listed.stdout.split():
        pytest.skip("not a git checkout with the shipped model")
    return listed.stdout.split()


def test_gitattributes_keeps_every_file_of_the_shipped_model_byte_exact(git_files):
    out = _git("check-attr", "text", "--", *git_files).stdout.splitlines()
    assert out == [f"{name}: text: unset" for name in git_files]


def test_a_crlf_checkout_of_the_shipped_model_matches_its_manifest(git_files, tmp_path):
    # What a clone on Windows writes: checkout-index applies core.autocrlf and the attributes
    # of this working tree's .gitattributes (committed or not) to the files in the index.
    done = _git("-c", "core.autocrlf=true", "checkout-index", f"--prefix={tmp_path}/", "--",
                *git_files)
    assert done.returncode == 0, done.stderr
    folder = tmp_path / SHIPPED.relative_to(ROOT)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    for name, entry in manifest["files"].items():
        digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
        assert digest == entry["sha256"], name


# ------------------------------------------------------------------- C8: the command line


def test_translate_with_stdin_closed_is_one_clear_line(checkpoint_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # what Python sets for `<&-`
    assert cli.main(["translate", "--checkpoint", str(checkpoint_dir), "--beam", "1"]) == 1
    assert "standard input is closed" in _one_error_line(capsys)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGPIPE and its exit status 141 are POSIX")
def test_translate_stops_quietly_when_its_reader_leaves(checkpoint_dir):
    cmd = [sys.executable, "-m", "transformer_lib", "translate", "--checkpoint",
           str(checkpoint_dir), "--beam", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # `| head -0`: the reader is gone before the first line is written
    _, err = proc.communicate(b"Ein Hund.\nEine Katze.\n", timeout=300)
    assert err == b"" and proc.returncode == 141  # 128 + SIGPIPE, as a killed filter reports


def test_config_that_is_a_directory_is_named(capsys, tmp_path):
    assert cli.main(["train", "--config", str(tmp_path), "--run-dir", str(tmp_path / "r")]) == 1
    line = _one_error_line(capsys)
    assert "--config" in line and "is a directory" in line and "Errno" not in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_checkpoint_that_is_a_file_is_called_a_file(command, capsys, tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("not a checkpoint\n", encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund.\n"))
    assert cli.main([command, "--checkpoint", str(readme)]) == 1
    assert "is a file, not a checkpoint directory" in _one_error_line(capsys)


@pytest.mark.parametrize("argv,needle", [
    (["train", "--config", "configs/tiny.toml", "--run-dir", " "], "--run-dir"),
    (["train", "--config", "configs/tiny.toml", "--run", ""], "--run-dir"),
    (["train", "--config", "configs/tiny.toml", "--run-dir", "r", "--data-dir", ""],
     "--data-dir"),
    (["train", "--config", " ", "--run-dir", "r"], "--config"),
    (["evaluate", "--data-dir", " "], "--data-dir"),
])
def test_blank_path_arguments_are_usage_errors(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    line = _one_error_line(capsys)
    assert needle in line and "empty" in line
    assert list(tmp_path.iterdir()) == []  # no run written into the current directory


# ------------------------------------------------------------------- U1, C3: ablations.py


@pytest.mark.parametrize("argv,needle", [
    (["--rows"], "--rows"),
    (["--steps", "0"], "--steps"),
    (["--warmup", "0"], "--warmup"),
    (["--steps", "-3"], "--steps"),
    (["--threads", "-1"], "--threads"),
    (["--threads", "0"], "--threads"),
])
def test_ablations_refuses_empty_rows_and_non_positive_counts(argv, needle, capsys,
                                                              monkeypatch, tmp_path):
    monkeypatch.setattr(ABL, "RUNS", tmp_path)
    monkeypatch.setattr(ABL, "run_row", lambda *a: pytest.fail("a row was trained"))
    monkeypatch.setattr(sys, "argv", ["ablations.py", *argv])
    with pytest.raises(SystemExit) as e:
        ABL.main()
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_row_config_takes_zero_as_a_value_not_as_unset():
    cfg = ABL.row_config({}, steps=7, warmup=3)
    assert (cfg.max_steps, cfg.warmup) == (7, 3)
    default = ABL.row_config({})
    assert (default.max_steps, default.warmup) == (300, 150)
    with pytest.raises(ValueError, match="max_steps"):
        ABL.row_config({}, steps=0)
    with pytest.raises(ValueError, match="warmup"):
        ABL.row_config({}, warmup=0)


def _killed_row(run_dir: Path) -> None:
    """What a row killed in its first steps leaves: the start files, no checkpoint."""
    from transformer_lib.translation.provenance import write_provenance

    run_dir.mkdir(parents=True)
    cfg = ABL.row_config({}, steps=5, warmup=2)
    (run_dir / "config.json").write_text(json.dumps(ABL.dataclasses.asdict(cfg)), "utf-8")
    (run_dir / "tokenizer.json").write_text("{}", encoding="utf-8")
    write_provenance(run_dir)


def test_a_row_killed_before_its_first_checkpoint_starts_afresh(tmp_path, monkeypatch):
    run_dir = tmp_path / "base"
    _killed_row(run_dir)
    seen = []

    def train(cfg, run_dir, resume, progress):  # stops where the real trainer starts training
        seen.append(resume)
        raise RuntimeError("stop here")

    monkeypatch.setattr("transformer_lib.translation.train", train)
    with pytest.raises(RuntimeError, match="stop here"):
        ABL.run_row(ABL.row_config({}, steps=5, warmup=2), run_dir)
    assert seen == [False]  # a new run, not a resume of nothing


def test_the_trainer_accepts_a_killed_rows_directory_for_a_new_run(tmp_path):
    # The other half of C3 (transformer_lib.translation.rundir): a directory holding only the
    # start files is taken by a new run instead of refused with FileExistsError.
    from transformer_lib.translation.rundir import check_run_dir

    _killed_row(tmp_path / "base")
    check_run_dir(ABL.row_config({}, steps=5, warmup=2), tmp_path / "base", resume=False)


def test_a_row_the_trainer_refuses_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ABL, "RUNS", tmp_path)

    def train(cfg, run_dir, resume, progress):
        raise FileExistsError(f"{run_dir} is not empty (it holds notes.txt);\nchoose another")

    monkeypatch.setattr("transformer_lib.translation.train", train)
    monkeypatch.setattr(sys, "argv", ["ablations.py", "--rows", "base", "--steps", "5"])
    assert ABL.main() == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "base" in err[0] and "not empty" in err[0], err


# ------------------------------------------------------------------- U2: tasks.py


@pytest.mark.parametrize("task", ["unit", "lint", "nbval", "execute"])
@pytest.mark.parametrize("arg", ["", " ", "::test_x"])
def test_tasks_refuses_an_empty_path(task, arg, capsys, monkeypatch):
    monkeypatch.setattr(TASKS, "Runner", lambda **kw: pytest.fail("a step ran"))
    with pytest.raises(SystemExit) as e:
        TASKS.main(["--dry-run", task, arg])
    assert e.value.code == 2 and "empty path" in capsys.readouterr().err


def test_tasks_refuses_a_cpu_named_twice(capsys):
    runner = TASKS.Runner(dry_run=True, system="Linux", machine="x86_64", installed=True)
    with pytest.raises(TASKS.TaskError, match="more than once"):
        TASKS.test_emulated(runner, ["avx2", "baseline", "avx2"])
    assert runner.log == []  # refused before any step


# ------------------------------------------------------------------- C12: ship_model.py


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A stand-in for the shipped model's folder, in place of the real one."""
    out = tmp_path / "pretrained" / "multi30k_de_en"
    out.mkdir(parents=True)
    (out / "MODEL_CARD.md").write_text("# the card of the model shipped now\n", encoding="utf-8")
    monkeypatch.setattr(SHIP, "OUT", out)
    return out


def _ship(monkeypatch, *argv: str) -> SystemExit:
    monkeypatch.setattr(sys, "argv", ["ship_model.py", *argv])
    with pytest.raises(SystemExit) as e:
        SHIP.main()
    return e.value


def test_ship_model_with_a_missing_checkpoint_is_one_line(shipped, tmp_path, monkeypatch,
                                                          capsys):
    results = tmp_path / "results.json"
    results.write_text("{}", encoding="utf-8")
    e = _ship(monkeypatch, "--run", str(tmp_path), "--checkpoint", "nope",
              "--results", str(results))
    err = capsys.readouterr().err
    assert e.code == 2 and "nope" in err and "Traceback" not in err
    assert [p.name for p in shipped.iterdir()] == ["MODEL_CARD.md"]


@pytest.mark.parametrize("key", ["scores", "system", "config", "parameters", "steps"])
def test_ship_model_with_null_results_is_one_line(key, checkpoint_dir, shipped, tmp_path,
                                                  monkeypatch, capsys):
    results = {k: None for k in ("scores", "system", "signature", "parameters", "config",
                                 "command", "epochs", "steps", "train_minutes",
                                 "wall_minutes_total", "provenance")}
    good = {"scores": {"best_beam4": {"checkpoint": "best", "bleu": 1.0}},
            "system": "best_beam4", "signature": "nrefs:1", "parameters": 1, "config": {},
            "command": "c", "epochs": 1, "steps": 1, "train_minutes": 0.1,
            "provenance": {"commit": "abc"}}
    results.update({k: v for k, v in good.items() if k != key})
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results), encoding="utf-8")
    e = _ship(monkeypatch, "--run", str(checkpoint_dir.parent), "--checkpoint",
              checkpoint_dir.name, "--results", str(path))
    err = capsys.readouterr().err
    assert e.code == 2 and key in err and "left as it was" in err
    assert [p.name for p in shipped.iterdir()] == ["MODEL_CARD.md"]
