"""The shipped model's card (written by tools/ship_model.py) and the repository's licence."""

from __future__ import annotations

from pathlib import Path

from _tools import load_tool

from transformer_lib.translation.pretrained import pretrained_path

ROOT = Path(__file__).resolve().parents[1]


def test_card_states_the_licence_and_the_data_terms_as_the_tool_writes_them():
    """The tool's template and the shipped card carry the same licence section (the card was
    updated by hand, without retraining, so the two are compared here)."""
    ship_model = load_tool("ship_model")
    card = (pretrained_path() / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "\n".join(ship_model.LICENCE) in card
    assert "MIT" in card and "https://github.com/multi30k/dataset" in card
    assert "Elliott" in card and "non-commercial research" in card


def test_the_licence_file_matches_pyproject():
    import re

    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^license = "MIT"$', pyproject, re.M)
    assert re.search(r'^license-files = \["LICENSE"\]$', pyproject, re.M)
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n\nCopyright (c) 2026 The transformer_lib authors\n")
