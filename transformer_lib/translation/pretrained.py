"""The German→English model that ships with the book, ready to translate (hand-written).

Chapter 8 trained it. The files live inside the package
(``transformer_lib/pretrained/multi30k_de_en/``): the weights in bfloat16 safetensors, the
tokenizer, the training config, ``MODEL_CARD.md`` (how the model was trained and what it
scores) and a manifest of the SHA-256 sums of all of them that loading checks, as for every
checkpoint (a changed or truncated file is refused).

    >>> from transformer_lib import load_pretrained, translate_sentences
    >>> model, tok, cfg = load_pretrained()
    >>> translate_sentences(model, tok, ["Ein Hund rennt durch den Schnee."])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_lib.translation.checkpoint import _read_manifest, recover_checkpoint
from transformer_lib.translation.distributed import checked_device
from transformer_lib.translation.inference import load_model

__all__ = ["PRETRAINED", "pretrained_path", "load_pretrained"]

# name -> directory inside the package (transformer_lib/, where package data lives)
PRETRAINED = {"multi30k_de_en": "pretrained/multi30k_de_en"}
_PACKAGE = Path(__file__).resolve().parents[1]


def pretrained_path(name: str = "multi30k_de_en") -> Path:
    """The directory of a shipped model, checked to exist.

    Raises ValueError naming the known models for an unknown `name`, and FileNotFoundError
    if the package was installed without its model files.
    """
    if name not in PRETRAINED:
        raise ValueError(f"name must be one of {sorted(PRETRAINED)}, got {name!r}")
    path = _PACKAGE / PRETRAINED[name]
    try:  # tools/ship_model.py killed between its two renames: the previous model, put back
        recover_checkpoint(path)
    except OSError:  # a read-only installation: nothing can be renamed there anyway
        pass
    if not (path / "manifest.json").is_file():
        raise FileNotFoundError(
            f"the shipped model {name!r} is missing from {path} (the package was installed "
            "without its data files); reinstall transformer_lib, or train one with "
            "`python -m transformer_lib train`"
        )
    return path


def load_pretrained(
    name: str = "multi30k_de_en", device: torch.device | str | None = None
) -> tuple[nn.Module, Any, Any]:
    """Load a shipped model: (model in eval mode, tokenizer, training Config).

    The weights are stored in bfloat16 and loaded into a float32 model (chapter 8 measures
    that this does not move BLEU). Every file of the folder, ``MODEL_CARD.md`` too, is checked
    against the manifest first: a changed file, or one the manifest does not list, is refused
    (a file manager's ``.DS_Store`` or ``Thumbs.db`` is not counted).
    `device`: where the model goes (default: CUDA if available, else the CPU; a device this
    machine does not have is a ValueError naming it). The config's ``precision`` is the one it
    was trained in; ``translate_sentences`` runs "auto" (bf16 only where the device has it
    natively) unless given ``precision``.
    """
    device = None if device is None else checked_device(device)
    path = pretrained_path(name)
    listed = _read_manifest(path)["files"]  # checked: a mapping of file names
    unlisted = sorted(p.name for p in path.iterdir()
                      if p.name != "manifest.json" and p.name not in listed
                      and not _os_metadata(p.name))
    if unlisted:
        raise ValueError(f"the shipped model {path} holds files that are not in its manifest: "
                         f"{unlisted}; reinstall transformer_lib")
    return load_model(path, device)


def _os_metadata(name: str) -> bool:
    """A file a file manager leaves in folders it shows (macOS Finder's ``.DS_Store`` and
    ``._*``, Windows Explorer's ``Thumbs.db`` and ``desktop.ini``): nothing reads it, so it
    is no sign of a changed model."""
    return name.startswith(".") or name in ("Thumbs.db", "desktop.ini")
