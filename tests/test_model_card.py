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


def test_card_training_line_when_the_step_budget_ends_inside_an_epoch():
    """The report's minutes run to the end of the last full epoch; the steps to the budget.
    The card must not put 16,000 steps and the minutes of 15,314 side by side."""
    ship_model = load_tool("ship_model")
    r = {"epochs": 19, "steps": 16000, "train_minutes": 118.2, "wall_minutes_total": None,
         "history": [{"epoch": 19, "step": 15314, "minutes": 118.2},
                     {"epoch": 20, "epoch_fraction": 0.851, "step": 16000, "minutes": 123.0}]}
    line = ship_model._training_line(r)
    assert line.startswith("- 16,000 steps: 19 full epochs and 85% of epoch 20; 118.2 minutes")
    assert "to the end of epoch 19, 123.0 to the last step" in line
    card = (pretrained_path() / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert line in card  # the shipped run is such a run
    whole = {**r, "history": r["history"][:1], "steps": 15314, "wall_minutes_total": 120.0}
    assert ship_model._training_line(whole) == (
        "- 19 epochs, 15,314 steps, 118.2 minutes of training (120.0 minutes for the whole "
        "command)")


def test_the_shipped_card_is_what_the_tool_writes_from_the_results():
    """Every line of the card but the two bf16 scores (measured while shipping) comes from
    results/multi30k.json through the tool: the recipe's step budget, the precision the test
    scores were decoded in, the default input limit."""
    import json
    import re

    ship_model = load_tool("ship_model")
    card = (pretrained_path() / "MODEL_CARD.md").read_text(encoding="utf-8")
    beam, fp32 = re.search(r"^- float32 weights, (\d+)-beam: (.*)$", card, re.M).groups()
    bf16 = re.search(r"^- bfloat16 weights, same decoding: (.*)$", card, re.M).group(1)
    files = re.search(r"^- files: (.*)$", card, re.M).group(1).split(", ")
    results = json.loads((ROOT / "results" / "multi30k.json").read_text(encoding="utf-8"))
    assert card == ship_model._card(results, {"beam": int(beam), "fp32": fp32, "bf16": bf16},
                                    files)
    assert "max_steps = 16000" in card and "which was bf16 autocast there" in card


def test_the_note_quotes_the_hour_it_comes_from_as_that_run_recorded_it():
    """The note's "made N steps in M minutes" of the hour the recipe comes from is that run's
    own record: step N at minute M (57.5 minutes is where its epoch 19 ended, at step 15,314;
    step 15,970 came at its 60-minute limit)."""
    import json
    import re

    results = json.loads((ROOT / "results" / "multi30k.json").read_text(encoding="utf-8"))
    hour_file = "experiments/time_to_quality/results/60min_quarter_batch_low_dropout.json"
    hour = json.loads((ROOT / hour_file).read_text(encoding="utf-8"))
    found = re.search(r"made ([\d,]+) steps in ([\d.]+) minutes", results["note"])
    assert found, results["note"]
    steps, minutes = int(found[1].replace(",", "")), float(found[2])
    at = {h["step"]: h["minutes"] for h in hour["history"]}
    assert steps == hour["steps"] and round(at[steps], 1) == minutes
