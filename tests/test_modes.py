"""Files and folders the package writes get the mode ``open()`` and ``mkdir`` would give them.

Before (issue 54): checkpoints, runs and the shipped folder were 0700 and their tokenizer 0600,
whatever the umask (``tempfile.mkdtemp`` and ``mkstemp``), so another user got "Permission
denied" on ``manifest.json``. Downloaded files: tests/test_download.py.
"""

from __future__ import annotations

import os
import stat

import pytest
import torch

from transformer_lib.translation import data
from transformer_lib.translation.checkpoint import save_checkpoint

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX modes")


def _modes(folder):
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_a_checkpoint_honours_the_umask(tmp_path, umask):
    path = save_checkpoint(tmp_path / "ckpt", torch.nn.Linear(2, 2), {"n": 1}) or tmp_path / "ckpt"
    modes = _modes(path)
    assert modes.pop("ckpt") == 0o777 & ~umask
    assert modes and set(modes.values()) == {0o666 & ~umask}, modes


def test_a_tokenizer_file_honours_the_umask(tmp_path, umask):
    tok = data.train_tokenizer(["ein Hund", "a dog"] * 5, vocab_size=300, min_frequency=1)
    path = data.save_tokenizer(tok, tmp_path / "tokenizer.json")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]
