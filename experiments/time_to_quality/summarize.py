"""Write summary.json, the one file chapter 8 reads, from this series' configs and results.

    python experiments/time_to_quality/summarize.py          # write summary.json
    python experiments/time_to_quality/summarize.py --check  # exit 1 if it is stale

One row per run (in the order the runs finished), plus the curves and the validation table
that the chapter plots. The runs are the files of configs/ (each names its parent with
``base``) and results/ (what the run recorded); LABELS gives each its short name.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
SUMMARY = HERE / "summary.json"
TARGETS = {30: 40.0, 60: 42.5}  # test BLEU we aimed for, by budget in minutes
LABELS = {  # run (file stem) -> the name the chapter and the README use
    "30min_fast": "30 min, linear, fast",
    "30min": "30 min, linear",
    "30min_cooldown": "30 min, Noam",
    "60min": "60 min, hold",
    "60min_cooldown": "60 min, Noam",
    "60min_fast": "60 min, fast",
    "60min_half_batch": "60 min, half batch",
    "60min_quarter_batch": "60 min, quarter batch",
    "60min_half_batch_high_lr": "60 min, high rate",
    "60min_quarter_batch_seed2": "60 min, seed 2",
    "60min_quarter_batch_dropout": "60 min, dropout",
    "60min_half_batch_low_lr": "60 min, low rate",
    "60min_quarter_batch_low_dropout": "60 min, less dropout",
}
# The runs whose per-epoch history the chapter plots.
CURVES = ("30min_cooldown", "60min", "60min_fast", "60min_quarter_batch_low_dropout")


def listed_keys(path: Path) -> dict:
    """The keys a config lists (its parent aside): what the run changes."""
    with open(path, "rb") as f:
        raw = tomllib.load(f)
    return {k: v for k, v in raw.items() if k != "base"}


def parent_name(path: Path) -> str:
    with open(path, "rb") as f:
        base = tomllib.load(f)["base"]
    stem = Path(base).stem
    # The series' root, the shipped recipe when the runs were made, is "shipped" in the table
    return "shipped" if stem == "recipe_15_epochs" else stem


def epochs_done(history: list) -> float:
    last = history[-1]  # a time limit may stop inside an epoch
    return round(last["epoch"] - 1 + last.get("epoch_fraction", 1), 2)


def row(name: str) -> dict:
    """One run's line of the table."""
    config = HERE / "configs" / f"{name}.toml"
    r = json.loads((HERE / "results" / f"{name}.json").read_text(encoding="utf-8"))
    system = r["scores"][r["system"]]
    lp = r.get("length_penalty")
    alpha = lp["chosen"] if lp else r["config"]["length_penalty"]
    at_06 = f"{max(r['selection']['bleu'], key=r['selection']['bleu'].get)}_beam4"
    return {
        "run": name,
        "label": LABELS[name],
        "parent": parent_name(config),
        "changes": listed_keys(config),
        "minutes": r["time_limit_minutes"],
        "target": TARGETS[r["time_limit_minutes"]],
        "tokens_per_second": r["tokens_per_second"],
        "epochs": epochs_done(r["history"]),
        "steps": r["steps"],
        "lowest_val_loss": round(min(h["val_loss"] for h in r["history"]), 4),
        "checkpoint": system["checkpoint"],
        "alpha": alpha,
        "val_bleu": lp["grid"][lp["checkpoint"]][str(float(alpha))] if lp
        else max(r["selection"]["bleu"].values()),
        "test_bleu": r["bleu"],
        "test_bleu_alpha_06": r["scores"][at_06]["bleu"],
        "commit": r["commit"][:7],
        "machine": f"{r['machine']['cpu_threads']} threads, torch {r['machine']['torch']}",
        "date": r["date"],
    }


def summary() -> dict:
    rows = sorted((row(name) for name in LABELS), key=lambda x: x["date"])
    best = max((x for x in rows if x["minutes"] == 60), key=lambda x: x["val_bleu"])
    best_r = json.loads((HERE / "results" / f"{best['run']}.json").read_text(encoding="utf-8"))
    keep = ("epoch", "minutes", "train_loss", "val_loss", "val_bleu", "epoch_fraction")
    curves = {}
    for name in CURVES:
        r = json.loads((HERE / "results" / f"{name}.json").read_text(encoding="utf-8"))
        curves[name] = [{k: round(h[k], 4) for k in keep if k in h} for h in r["history"]]
    return {
        "series": "time_to_quality",
        "test_set": "test_2016_flickr",
        "rows": rows,
        "curves": curves,
        "alpha_grid": {"run": best["run"], "beam_size": 4,
                       "grid": best_r["length_penalty"]["grid"]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if summary.json is stale")
    args = parser.parse_args(argv)
    text = json.dumps(summary(), indent=1, ensure_ascii=False) + "\n"
    if args.check:
        if not SUMMARY.is_file() or SUMMARY.read_text(encoding="utf-8") != text:
            print(f"{SUMMARY} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    SUMMARY.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
