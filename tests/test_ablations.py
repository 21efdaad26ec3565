"""tools/ablations.py (the paper's Table 3, re-run small) and the results file chapter 10 reads."""

import dataclasses
import json
from pathlib import Path

import pytest
from _tools import load_tool

from transformer_lib import translation

ROOT = Path(__file__).resolve().parents[1]


ABL = load_tool("ablations")


def test_rows_have_unique_names_and_cover_the_papers_groups():
    names = [r[0] for r in ABL.ROWS]
    assert len(names) == len(set(names))
    groups = {r[1] for r in ABL.ROWS}
    assert {"base", "A", "C", "D", "E", "norm", "tied"} <= groups
    assert sum(r[1] == "base" for r in ABL.ROWS) == 3  # the noise band: three seeds


@pytest.mark.parametrize("row", ABL.ROWS, ids=[r[0] for r in ABL.ROWS])
def test_each_row_changes_only_what_it_says(row):
    name, _, _, overrides = row
    base = ABL.row_config({}, 300, 150)
    cfg = ABL.row_config(overrides, 300, 150)
    changed = {
        k for k, v in dataclasses.asdict(cfg).items() if dataclasses.asdict(base)[k] != v
    }
    assert changed == set(overrides)
    assert cfg.max_steps == 300 and cfg.warmup == 150 and cfg.time_limit_min is None
    # the parameter count is known before anything is built
    assert translation.parameter_count(cfg, 8000) > 0


def test_the_long_budget_is_the_shipped_recipes_batches_peak_and_schedule():
    from transformer_lib.training import rate

    assert set(ABL.LONG_ROWS) <= {r[0] for r in ABL.ROWS}
    assert sum(ABL.ROWS[[r[0] for r in ABL.ROWS].index(n)][1] == "base"
               for n in ABL.LONG_ROWS) == 3  # three seeds for the noise here too
    cfg = ABL.row_config({}, budget="long")
    shipped = translation.load_config(ROOT / "configs" / "multi30k_shipped.toml")
    for key in ("max_tokens", "schedule", "cooldown"):
        assert getattr(cfg, key) == getattr(shipped, key), key
    peak = rate(cfg.warmup, cfg.d_model, cfg.lr_factor, cfg.warmup)
    shipped_peak = rate(shipped.warmup, shipped.d_model, shipped.lr_factor, shipped.warmup)
    assert peak == pytest.approx(shipped_peak, rel=1e-3)
    assert cfg.max_steps == 1600 and cfg.warmup == 400
    # a row changes only what it names here too, on the recipe's model
    for name, _, _, overrides in ABL.ROWS:
        if name in ABL.LONG_ROWS:
            row = dataclasses.asdict(ABL.row_config(overrides, budget="long"))
            base = dataclasses.asdict(cfg)
            assert {k for k, v in row.items() if base[k] != v} == set(overrides)
    with pytest.raises(ValueError, match="budget"):
        ABL.row_config({}, budget="medium")


@pytest.mark.parametrize("budget", ["short", "long"])
def test_the_committed_results_hold_every_row_with_its_provenance(budget):
    shared, _, path, budget_rows = ABL._budget(budget)
    results = json.loads(path.read_text(encoding="utf-8"))
    assert results["missing"] == [] and results["budget"]["max_steps"] == shared["max_steps"]
    assert results["budget"]["warmup"] == shared["warmup"]
    assert [r["row"] for r in results["rows"]] == [r[0] for r in budget_rows]
    for r in results["rows"]:
        for key in ("command", "config", "val_loss", "val_bleu", "tokens_per_second",
                    "parameters", "steps"):
            assert key in r, (r["row"], key)
        assert r["command"].startswith("python tools/ablations.py --rows " + r["row"])
        assert r["steps"] == results["budget"]["max_steps"] == r["config"]["max_steps"]
        overrides = {k: r["config"][k] for k in r["overrides"]}
        assert overrides == r["overrides"]
        # the row was trained on what its budget says, and only its overrides differ
        expected = json.loads(json.dumps(  # as JSON stores it: tuples are lists
            dataclasses.asdict(ABL.row_config(r["overrides"], budget=budget)), default=str))
        differ = {k for k, v in r["config"].items() if expected[k] != v}
        assert not differ, (r["row"], differ)
        if "provenance" in r:  # transformer_lib.translation.provenance's record
            p = r["provenance"]
            assert p["commit"] and p["machine"]["cpu_model"] and p["torch"]["version"]
        else:  # rows trained before it: a short commit and the machine, under their own keys
            assert r["commit"] and r["machine"]["cpu"] and r["machine"]["torch"]


def test_rescore_reads_the_runs_of_the_budget_it_is_given(tmp_path, monkeypatch):
    short, long_ = tmp_path / "short", tmp_path / "long"
    monkeypatch.setattr(ABL, "RUNS", short)
    monkeypatch.setattr(ABL, "RUNS_LONG", long_)
    monkeypatch.setattr(ABL, "provenance", lambda: {"commit": "abc"})
    scored = []
    monkeypatch.setattr(ABL, "cross_entropy",
                        lambda run_dir: scored.append(run_dir) or {"val_nll": 2.5})
    (long_ / "heads_1").mkdir(parents=True)
    (long_ / "heads_1" / "result.json").write_text('{"row": "heads_1"}')
    (long_ / "heads_8").mkdir()  # a row of the short budget only: not the long one's
    (long_ / "heads_8" / "result.json").write_text('{"row": "heads_8"}')
    assert ABL.rescore("short") == 0 and scored == []
    assert ABL.rescore("long") == 0 and scored == [long_ / "heads_1"]
    record = json.loads((long_ / "heads_1" / "result.json").read_text())
    assert record["val_nll"] == 2.5 and record["val_nll_provenance"] == {"commit": "abc"}
    assert json.loads((long_ / "heads_8" / "result.json").read_text()) == {"row": "heads_8"}


def test_a_row_records_the_budget_it_was_trained_on(tmp_path, monkeypatch):
    monkeypatch.setattr(ABL, "RUNS_LONG", tmp_path)
    monkeypatch.setattr(ABL, "_row_provenance", lambda run_dir: {"commit": "abc"})
    trained = []

    def run_row(cfg, run_dir, progress):  # the trainer makes the run directory
        run_dir.mkdir()
        trained.append((cfg.max_steps, cfg.warmup, run_dir))
        return {"val_bleu": 1.0}

    monkeypatch.setattr(ABL, "run_row", run_row)
    monkeypatch.setattr("sys.argv", ["ablations.py", "--budget", "long", "--rows", "heads_1"])
    assert ABL.main() == 0
    assert trained == [(1600, 400, tmp_path / "heads_1")]
    record = json.loads((tmp_path / "heads_1" / "result.json").read_text())
    assert record["command"] == ("python tools/ablations.py --rows heads_1 --steps 1600 "
                                 "--warmup 400 --budget long")
    assert record["config"]["max_steps"] == 1600 and record["val_bleu"] == 1.0
    # done rows are skipped; --steps overrides the budget's default
    monkeypatch.setattr("sys.argv", ["ablations.py", "--budget", "long", "--rows", "heads_1",
                                     "dropout_0", "--steps", "800"])
    assert ABL.main() == 0
    assert trained[1:] == [(800, 400, tmp_path / "dropout_0")]
