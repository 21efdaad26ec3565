"""Issue 34, "data lost or mixed": run directories, resuming, snapshots, reads during a save.

Each test failed before its fix. The training runs are tiny (64 sentence pairs, one epoch,
d_model = 32): seconds each; the other tests build their directories by hand.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from _tools import file_tree, tiny_config
from torch import nn

from transformer_lib import translation
from transformer_lib.translation import loop, rundir
from transformer_lib.translation.checkpoint import load_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A complete one-epoch run: last/, epoch_001/, history.json, config.json (no best/)."""
    run = tmp_path_factory.mktemp("done") / "run"
    translation.train(tiny_config(), run, progress=False)
    return run


# ------------------------------------------------------------------ 1. new runs need an empty dir


def test_a_new_run_into_a_checkpoint_directory_is_refused_and_leaves_it_intact(checkpoint_dir,
                                                                               tmp_path):
    copy = shutil.copytree(checkpoint_dir, tmp_path / "best")
    before = file_tree(copy)
    with pytest.raises(FileExistsError, match=r"checkpoint.*manifest\.json.*another"):
        translation.train(tiny_config(), copy, progress=False)
    assert file_tree(copy) == before
    load_checkpoint(copy)  # still passes its own manifest check


@pytest.mark.parametrize("files", [["config.json"], ["tokenizer.json", "notes.txt"], ["best"]])
def test_a_new_run_into_a_directory_holding_files_is_refused_naming_them(tmp_path, files):
    run = tmp_path / "run"
    run.mkdir()
    for name in files:
        (run / name).mkdir() if "." not in name else (run / name).write_text("mine")
    before = file_tree(run)
    with pytest.raises(FileExistsError, match="not empty.*" + ".*".join(sorted(files))):
        rundir.check_run_dir(tiny_config(), run, resume=False)
    assert file_tree(run) == before


def test_a_new_run_may_use_an_empty_or_missing_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    rundir.check_run_dir(tiny_config(), tmp_path / "empty", resume=False)
    rundir.check_run_dir(tiny_config(), tmp_path / "missing", resume=False)


# ------------------------------------------------------------------ 2. resume needs RUN/last


def test_resume_without_last_is_refused_and_writes_nothing(finished_run, tmp_path):
    run = shutil.copytree(finished_run, tmp_path / "run")
    shutil.rmtree(run / "last")
    before = file_tree(run)
    with pytest.raises(FileNotFoundError, match=r"last is missing.*another directory"):
        translation.train(tiny_config(), run, resume=True, progress=False)
    assert file_tree(run) == before
    # a changed config is not what the error is about: there is nothing to compare it with
    with pytest.raises(FileNotFoundError, match=r"last is missing"):
        translation.train(tiny_config(d_model=64), run, resume=True, progress=False)
    assert file_tree(run) == before


def test_resume_of_an_empty_directory_or_a_checkpoint_is_refused(checkpoint_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"nothing to resume.*without resume"):
        rundir.check_run_dir(tiny_config(), tmp_path / "empty", resume=True)
    with pytest.raises(FileNotFoundError, match=r"is a checkpoint, not a run directory"):
        rundir.check_run_dir(tiny_config(), checkpoint_dir, resume=True)


def test_resume_still_checks_the_config_of_last(finished_run, tmp_path):
    run = shutil.copytree(finished_run, tmp_path / "run")
    with pytest.raises(ValueError, match=r"d_model: 32 in the run, 64 now"):
        rundir.check_run_dir(tiny_config(d_model=64), run, resume=True)


def test_history_and_config_are_replaced_whole_never_rewritten_in_place(finished_run, tmp_path):
    # Rewritten in place, a reader (or a kill) between the truncation and the write sees an
    # empty or half file; replaced, a reader that opened the old file reads all of it.
    run = shutil.copytree(finished_run, tmp_path / "run")
    old = {name: (run / name).read_text() for name in ("history.json", "config.json")}
    opened = {name: open(run / name, encoding="utf-8") for name in old}  # noqa: SIM115
    try:
        translation.train(tiny_config(epochs=2), run, resume=True, progress=False)
        assert {name: f.read() for name, f in opened.items()} == old
    finally:
        for f in opened.values():
            f.close()
    assert len(json.loads((run / "history.json").read_text())) == 2
    assert json.loads((run / "config.json").read_text())["epochs"] == 2
    assert [p.name for p in run.iterdir() if ".tmp" in p.name] == []


# ------------------------------------------------------------------ 3. snapshots past epoch 999


def _snapshot(path: Path, value: float) -> None:
    model = nn.Linear(2, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    save_checkpoint(path, model, {"value": value}, rng=False)


def test_epoch_snapshots_sort_by_their_number(tmp_path):
    for name in ["epoch_1000", "epoch_998", "epoch_999", "epoch_12.bak", "epoch_x", "epochs"]:
        (tmp_path / name).mkdir()
    assert [p.name for p in rundir.epoch_snapshots(tmp_path)] == [
        "epoch_998", "epoch_999", "epoch_1000"]


def test_keep_last_and_average_last_take_the_newest_epochs_past_999(tmp_path):
    for epoch in (998, 999, 1000):
        _snapshot(tmp_path / f"epoch_{epoch:03d}", float(epoch))
    averaged = loop._average_snapshots(tmp_path, 2)
    assert torch.all(averaged["weight"] == 999.5)
    loop._prune_snapshots(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "epoch_1000", "epoch_999"]


# ------------------------------------------------------------------ 6. reading while a save swaps


class _Saver(threading.Thread):
    """Saves `path` over and over; version k has weights k, config k and train state k."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.stop, self.error, self.saves = path, threading.Event(), None, 0

    def run(self) -> None:
        model = nn.Linear(32, 32)
        try:
            while not self.stop.is_set():
                k = self.saves + 1
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(k)
                save_checkpoint(self.path, model, {"k": k}, rng=False,
                                train_state={"k": k, "t": torch.full((256,), float(k))})
                self.saves = k
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def test_loading_while_a_save_replaces_the_checkpoint_sees_one_version(tmp_path):
    path = tmp_path / "last"
    saver = _Saver(path)
    saver.start()
    while saver.saves == 0 and saver.is_alive():
        time.sleep(0.01)
    errors, mixed, loads = [], [], 0
    model = nn.Linear(32, 32)
    deadline = time.monotonic() + 4.0
    try:
        while time.monotonic() < deadline:
            verify = loads % 2 == 0  # with checksums (errors) and without (silent mixes)
            try:
                info = load_checkpoint(path, model, verify=verify)
            except (ValueError, OSError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                continue
            finally:
                loads += 1
            seen = {info["config"]["k"], info["train_state"]["k"],
                    float(info["train_state"]["t"][0]), float(model.weight.detach()[0, 0])}
            if len(seen) > 1:
                mixed.append(sorted(seen))
    finally:
        saver.stop.set()
        saver.join()
    assert saver.error is None and saver.saves > 10, saver.error
    assert errors == [] and mixed == [], (loads, errors[:3], mixed[:3])


def test_a_checkpoint_replaced_on_every_read_gives_a_clear_error(tmp_path):
    from transformer_lib.translation._fileio import READ_ATTEMPTS, read_one_version

    versions = iter(range(1000))

    def read(manifest):
        raise ValueError("a file of another version")

    with pytest.raises(ValueError, match=rf"replaced {READ_ATTEMPTS} times while it was being "
                                         r"read.*load it again"):
        read_one_version(tmp_path, lambda _: next(versions), read, what="checkpoint x")
    # a fault that no replacement explains is raised at once, as it is
    with pytest.raises(ValueError, match="a file of another version"):
        read_one_version(tmp_path, lambda _: 1, read, what="checkpoint x")
