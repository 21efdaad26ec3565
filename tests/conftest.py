"""Shared test settings, and where the tests read Multi30k."""

from __future__ import annotations

import functools
import os

import pytest
from _tools import load_tool
from hypothesis import settings

# Property tests draw the same examples on every run: CI is reproducible, and a failure seen
# once is seen again. Explore new examples locally with `--hypothesis-profile=explore`.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile("ci")

# Multi30k is read where `python tools/tasks.py unit` reads it, for a plain `pytest` too: the
# task runner's rule (MULTI30K_DIR = the local mirror beside the repository, when there is one
# and MULTI30K_DIR is unset), applied before any test module asks
# transformer_lib.translation.data.default_data_dir(). Without a mirror the tests read the user
# cache, where transformer_lib downloads the files on first use.
os.environ.update(load_tool("tasks").multi30k_env())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "multi30k: needs all six Multi30k files (downloaded into the cache first when the tests "
        "read the cache); skipped when they cannot be had",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("multi30k") is not None:
        why = _multi30k_missing()
        if why is not None:
            pytest.skip(why)


@pytest.fixture(scope="session")
def val_tokenizer():
    """A 300-subword BPE of the first 200 validation pairs (seconds to learn)."""
    from transformer_lib.translation import data

    pairs = data.load_multi30k("val", limit=200)
    return data.train_tokenizer([s for p in pairs for s in p], vocab_size=300)


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory, val_tokenizer):
    """An untrained tiny model (configs/tiny.toml) saved as the trainer saves one: no training.

    Shared by every test that asks for it: copy it (shutil.copytree) before changing it.
    """
    import dataclasses
    from pathlib import Path

    import torch

    from transformer_lib.translation import load_config, save_checkpoint

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.toml")
    torch.manual_seed(0)
    model = cfg.build_model(val_tokenizer.get_vocab_size())
    path = tmp_path_factory.mktemp("ckpt") / "best"
    save_checkpoint(path, model, dataclasses.asdict(cfg), tokenizer=val_tokenizer)
    return path


@functools.cache
def _multi30k_missing() -> str | None:
    """None when the six files are where the tests read them, else why not (asked once)."""
    from transformer_lib.translation import data

    folder = data.default_data_dir()
    if all((folder / name).is_file() for name in data.SHA256):
        return None
    if os.environ.get("MULTI30K_DIR"):  # someone's own copy: never written to unasked
        return f"the Multi30k files are not all in MULTI30K_DIR={folder}"
    try:  # the cache, as on a fresh clone or in CI: the first use downloads the files
        data.download(folder, progress=False)
    except (OSError, ValueError) as e:
        return f"Multi30k is not in the cache {folder} and could not be downloaded: {e}"
    return None
