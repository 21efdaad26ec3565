"""Faults of the training side found by the second probe: each test failed before its fix.

Runs are tiny (configs/tiny.toml on 64-192 sentence pairs, d_model = 32): seconds each; the
other tests build their files by hand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from _tools import file_tree, tiny_config
from torch import nn

from transformer_lib import translation
from transformer_lib.translation import _fileio, checkpoint, distributed, loop, rundir
from transformer_lib.translation.checkpoint import load_checkpoint, save_checkpoint
from transformer_lib.translation.data import make_batches

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ D1: save over a directory


def test_save_checkpoint_refuses_a_directory_that_is_not_a_checkpoint(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match=r"mine is a directory that is not a checkpoint.*"
                                              r"thesis\.tex"):
        save_checkpoint(mine, nn.Linear(2, 2), {"a": 1})
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no temporary directory left


def test_save_checkpoint_still_writes_missing_empty_and_replaces_checkpoints(tmp_path):
    model = nn.Linear(2, 2)
    (tmp_path / "empty").mkdir()
    for name in ("missing", "empty"):
        save_checkpoint(tmp_path / name, model, {"v": 1})
        save_checkpoint(tmp_path / name, model, {"v": 2})  # over a checkpoint: replaced
        assert load_checkpoint(tmp_path / name)["config"] == {"v": 2}


def test_save_checkpoint_refuses_what_appeared_while_it_was_writing(tmp_path, monkeypatch):
    # The check runs again under the swap's lock, just before the old directory is deleted.
    target = tmp_path / "ckpt"
    real = _fileio.replace_dir

    def late(tmp: Path, path: Path, **kw) -> None:
        path.mkdir()
        (path / "data.csv").write_text("1,2")
        real(tmp, path, **kw)

    monkeypatch.setattr("transformer_lib.translation.checkpoint.replace_dir", late)
    with pytest.raises(FileExistsError, match="data.csv"):
        save_checkpoint(target, nn.Linear(2, 2), {})
    assert (target / "data.csv").read_text() == "1,2"


# ------------------------------------------------------------------ D2: a run inside a checkpoint


def test_a_run_directory_inside_a_checkpoint_is_refused(checkpoint_dir, tmp_path):
    copy = shutil.copytree(checkpoint_dir, tmp_path / "last")
    before = file_tree(copy)
    for resume in (False, True):
        with pytest.raises(FileExistsError, match=r"inside the checkpoint .*last.*manifest"):
            translation.train(tiny_config(), copy / "nested" / "deeper", resume=resume,
                              progress=False)
    assert file_tree(copy) == before and not (copy / "nested").exists()


# ------------------------------------------------------------------ S1: resuming a spent budget


@pytest.mark.parametrize("budget", [{"max_steps": 3}, {"time_limit_min": 1e-9}],
                         ids=["max_steps", "time_limit"])
def test_resuming_a_run_whose_budget_is_spent_trains_nothing(tmp_path, budget, capsys):
    cfg = tiny_config(train_limit=192, epochs=3, bleu_every=1, keep_last=2, average_last=2,
                      **budget)
    first = translation.train(cfg, tmp_path / "run", progress=False)
    assert not first["complete"]
    assert {"last", "best"} <= {p.name for p in (tmp_path / "run").iterdir()}

    def saved() -> dict[str, str]:  # provenance.json records each resume: not the run's data
        return {k: v for k, v in file_tree(tmp_path / "run").items() if k != "provenance.json"}

    before = saved()
    for _ in range(2):
        again = translation.train(cfg, tmp_path / "run", resume=True, progress=True)
        assert again["complete"] and again["steps"] == first["steps"]
        assert saved() == before
    assert "is complete: its budget" in capsys.readouterr().err


# ------------------------------------------------------------------ S2: no optimizer step at all


@pytest.mark.parametrize(("change", "named"), [({"drop_longer_than": 1}, "drop_longer_than"),
                                               ({"accum": 1000}, "accum = 1000")])
def test_a_run_that_can_make_no_optimizer_step_is_an_error(tmp_path, change, named):
    with pytest.raises(ValueError, match=named):
        translation.train(tiny_config(**change), tmp_path / "run", progress=False)
    assert not {"last", "best", "averaged", "history.json"} & {
        p.name for p in (tmp_path / "run").iterdir()}


# ------------------------------------------------------------------ C2: learned positions


def test_learned_positions_too_few_for_the_training_data_fail_before_training(tmp_path):
    cfg = tiny_config(positional="learned", max_positions=16, drop_longer_than=50)
    with pytest.raises(ValueError, match=r"max_positions = 16 .* training data.*"
                                         r"drop_longer_than to 15"):
        translation.train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "last").exists()


def test_learned_positions_too_few_for_the_validation_data_fail_before_training(tmp_path):
    # training pairs are cut to 15 subwords (16 positions), validation keeps its long ones
    cfg = tiny_config(positional="learned", max_positions=16, drop_longer_than=15)
    with pytest.raises(ValueError, match=r"max_positions = 16 .* validation data"):
        translation.train(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "last").exists()


# ------------------------------------------------------------------ C3: a run that failed early


def test_a_directory_left_by_a_run_that_failed_at_its_start_takes_a_new_run(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="Multi30k"):
        translation.train(tiny_config(data_dir=str(tmp_path / "nonexistent")), run, progress=False)
    # later failures leave the tokenizer too
    with pytest.raises(ValueError, match="max_positions"):
        translation.train(tiny_config(positional="learned", max_positions=8), run, progress=False)
    assert {p.name for p in run.iterdir()} >= {"config.json", "provenance.json", "tokenizer.json"}
    # resume stays refused (there is no state to continue), saying what to do instead
    with pytest.raises(FileNotFoundError, match=r"stopped before its first checkpoint.*"
                                                r"new run there without resume"):
        rundir.check_run_dir(tiny_config(), run, resume=True)
    translation.train(tiny_config(), run, progress=False)
    assert json.loads((run / "config.json").read_text())["max_positions"] == 5000
    assert (run / "last" / "manifest.json").is_file()


def test_a_users_own_config_json_is_still_not_taken_for_a_failed_start(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    mine = {**dataclasses.asdict(tiny_config()), "mine": True}  # a run's keys, and one more
    for config in ({"mine": True}, mine):
        (run / "config.json").write_text(json.dumps(config))
        (run / "provenance.json").write_text('{"commit": "abc"}')
        with pytest.raises(FileExistsError, match="not empty"):
            rundir.check_run_dir(tiny_config(), run, resume=False)
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(tiny_config())))  # a run's own
    (run / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        rundir.check_run_dir(tiny_config(), run, resume=False)


# ------------------------------------------------------------------ U3: config files


def test_a_config_file_larger_than_a_config_is_refused_naming_it(tmp_path):
    big = tmp_path / "big.toml"
    big.write_text(("#" * 1023 + "\n") * 1100)  # 1.1 MiB of comments: valid TOML
    with pytest.raises(ValueError, match=r"big\.toml is larger than 1048576 bytes"):
        translation.load_config(big)


@pytest.mark.skipif(sys.platform == "win32", reason="/dev/fd (what <(...) passes) is POSIX")
def test_a_config_read_from_a_pipe_resolves_its_base_from_the_working_directory(monkeypatch):
    monkeypatch.chdir(ROOT)
    r, w = os.pipe()
    os.write(w, b'base = "configs/tiny.toml"\nd_model = 64\n')
    os.close(w)
    try:
        cfg = translation.load_config(f"/dev/fd/{r}")
    finally:
        os.close(r)
    assert (cfg.d_model, cfg.vocab_size) == (64, 500)


# ------------------------------------------------------------------ C10: deeply nested JSON


@pytest.mark.parametrize("name", ["config.json", "trainer.json"])
def test_a_checkpoint_with_deeply_nested_json_is_called_corrupt(checkpoint_dir, tmp_path, name):
    copy = shutil.copytree(checkpoint_dir, tmp_path / "ckpt")
    (copy / name).write_text("[" * 100_000)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(b"[" * 100_000).hexdigest(),
                               "bytes": 100_000}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"{name} is corrupt.*nested too deeply"):
        load_checkpoint(copy)


# ------------------------------------------------------------------ C13: leaving the group


def test_a_refused_run_still_leaves_the_process_group(tmp_path, monkeypatch):
    # A process that exits still in its gloo group can abort (SIGABRT) instead of reporting.
    left = []
    monkeypatch.setattr(loop, "join_process_group", lambda device: True)
    monkeypatch.setattr(loop, "leave_process_group", lambda wait=True: left.append(wait))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "history.json").write_text("[]")
    with pytest.raises(FileExistsError, match="already holds a run"):
        translation.train(tiny_config(), tmp_path / "run", progress=False)
    assert left == [False]  # no barrier: the other processes may have stopped elsewhere


# ------------------------------------------------------------------ C14: small messages


def test_a_run_that_computes_no_bleu_says_it_wrote_no_best(tmp_path, capsys):
    # bleu_every = 0 or > epochs is a deliberate "no BLEU" (bench/fast_setting_quality.py uses
    # 10_000): allowed, but `evaluate --checkpoint RUN/best` would later say only "not found"
    translation.train(tiny_config(bleu_every=5), tmp_path / "run", progress=False)
    err = capsys.readouterr().err
    assert "bleu_every = 5, epochs = 1" in err and "best was not written" in err
    assert not (tmp_path / "run" / "best").exists()


def test_a_lock_file_without_a_date_does_not_say_since_none(tmp_path):
    lock = tmp_path / ".lock"
    lock.write_text(json.dumps({"pid": 1, "host": "another-host"}))
    with pytest.raises(_fileio.LockHeld) as e:
        _fileio.FileLock(lock, what="run directory x").acquire()
    assert "since" not in str(e.value) and "process 1 on host another-host" in str(e.value)


def test_a_world_size_that_is_no_number_is_named(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match=r"WORLD_SIZE must be an integer.*'abc'"):
        distributed.join_process_group(torch.device("cpu"))


def test_the_max_tokens_error_names_the_config_key_drop_longer_than():
    with pytest.raises(ValueError, match="config key drop_longer_than"):
        make_batches([([5] * 40, [6] * 40)], 16, shuffle=False, seed=0)


def test_a_file_of_another_size_than_the_manifest_says_is_corrupt_before_hashing(
    checkpoint_dir, tmp_path, monkeypatch
):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint_dir, ckpt)
    with open(ckpt / "model.safetensors", "r+b") as f:  # a sparse tail: a huge file, no data
        f.truncate(1 << 40)
    hashed, real = [], checkpoint.sha256_file
    monkeypatch.setattr(checkpoint, "sha256_file", lambda p: hashed.append(p) or real(p))
    with pytest.raises(ValueError, match=r"model\.safetensors is corrupt: \d+ bytes expected"):
        translation.load_model(ckpt, torch.device("cpu"))
    assert all(p.name != "model.safetensors" for p in hashed)
