"""Faults of the tools that write committed results (issue 34): each test failed before its fix.

tools/ship_model.py must check everything before it replaces the shipped model (#4);
tools/ablations.py --collect must not overwrite its results file with fewer rows (#5),
and a bad --shard is an argparse error; tools/multi30k_report.py checks its inputs before the
evaluation and copies the run's provenance instead of asking for --commit.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import pytest
from _tools import load_tool

from transformer_lib import translation
from transformer_lib.model import count_parameters
from transformer_lib.translation.provenance import provenance, read_provenance, write_provenance

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"

ABL = load_tool("ablations")
SHIP = load_tool("ship_model")
REPORT = load_tool("multi30k_report")


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished tiny run with best/, averaged/ and last/, and the trainer's provenance."""
    run = tmp_path_factory.mktemp("tiny") / "run"
    cfg = translation.load_config(TINY, train_limit=128, val_limit=8, epochs=2, save_every=2,
                                  max_tokens=256)
    translation.train(cfg, run, progress=False)
    if read_provenance(run) is None:  # until the trainer writes it itself
        write_provenance(run)
    return run


# ----------------------------------------------------------------------------- ablations (#5)


@pytest.fixture
def ablations(tmp_path, monkeypatch):
    """ablations.py pointed at an empty runs folder and a copy of the committed results."""
    results = tmp_path / "ablations.json"
    shutil.copyfile(ROOT / "experiments" / "ablations" / "results.json", results)
    monkeypatch.setattr(ABL, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(ABL, "RESULTS", results)
    return results


def _finish_row(name: str, **config) -> None:
    """A result.json under RUNS, copied from the committed row."""
    path = ROOT / "experiments" / "ablations" / "results.json"
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    row = next(r for r in rows if r["row"] == name)
    row["config"].update(config)
    (ABL.RUNS / name).mkdir(parents=True)
    (ABL.RUNS / name / "result.json").write_text(json.dumps(row), encoding="utf-8")


def test_collect_on_a_fresh_clone_refuses_and_keeps_the_results(ablations, capsys):
    before = ablations.read_bytes()
    assert ABL.collect() == 1
    assert ablations.read_bytes() == before
    assert "no finished rows" in capsys.readouterr().err


def test_collect_does_not_drop_committed_rows_unless_told(ablations, capsys):
    before = ablations.read_bytes()
    _finish_row("base")
    assert ABL.collect() == 1
    assert ablations.read_bytes() == before
    err = capsys.readouterr().err
    assert "heads_1" in err and "--allow-missing" in err and "left as it is" in err
    assert ABL.collect(allow_missing=True) == 0
    out = json.loads(ablations.read_text(encoding="utf-8"))
    assert [r["row"] for r in out["rows"]] == ["base"] and len(out["missing"]) == len(ABL.ROWS) - 1


def test_collect_refuses_rows_of_different_budgets(ablations, capsys):
    _finish_row("base")
    _finish_row("base_seed2", max_steps=500)
    assert ABL.collect(allow_missing=True) == 1
    assert "different (steps, warmup)" in capsys.readouterr().err


def test_collect_refuses_an_unreadable_row(ablations, capsys):
    (ABL.RUNS / "base").mkdir(parents=True)
    (ABL.RUNS / "base" / "result.json").write_text('{"row": "ba', encoding="utf-8")
    before = ablations.read_bytes()
    assert ABL.collect(allow_missing=True) == 1
    assert ablations.read_bytes() == before and "unreadable" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["1/0", "5/2", "2/2", "-1/2", "x", "1/2/3", "0/-1"])
def test_a_bad_shard_is_an_argparse_error(bad, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["ablations.py", f"--shard={bad}"])
    with pytest.raises(SystemExit) as e:
        ABL.main()
    assert e.value.code == 2 and "--shard" in capsys.readouterr().err


def test_shard_parses_i_of_n():
    assert ABL.shard("0/1") == (0, 1) and ABL.shard("1/2") == (1, 2)


# ----------------------------------------------------------------------------- ship_model (#4)


def _results_for(run: Path, checkpoint: str = "best") -> dict:
    """A results file of multi30k_report's shape that describes `run`'s checkpoint."""
    model, _, cfg = translation.load_model(run / checkpoint)
    score = {"checkpoint": checkpoint, "beam_size": 4, "bleu": 1.0,
             "score_line": "BLEU = 1.00 1.0/1.0/1.0/1.0", "signature": "nrefs:1", "seconds": 1}
    return {
        "system": f"{checkpoint}_beam4", "scores": {f"{checkpoint}_beam4": score},
        "signature": "nrefs:1", "parameters": count_parameters(model),
        "config": json.loads(json.dumps(dataclasses.asdict(cfg))), "command": "tiny",
        "epochs": 2, "steps": 4, "train_minutes": 0.1, "wall_minutes_total": 0.2,
        "provenance": read_provenance(run), "note": "",
    }


@pytest.fixture
def shipped(tiny_run, tmp_path, monkeypatch):
    """A stand-in for the shipped model (a checkpoint with its card), in place of the real one."""
    out = tmp_path / "pretrained" / "multi30k_de_en"
    shutil.copytree(tiny_run / "last", out)
    (out / "MODEL_CARD.md").write_text("# the card of the model shipped now\n", encoding="utf-8")
    monkeypatch.setattr(SHIP, "OUT", out)
    return out


def _ship(monkeypatch, run: Path, results: Path, *extra: str) -> None:
    monkeypatch.setattr(sys, "argv", ["ship_model.py", "--run", str(run), "--checkpoint", "best",
                                      "--results", str(results), *extra])
    SHIP.main()


@pytest.mark.multi30k
@pytest.mark.parametrize("damage", ["not json", "no scores", "other checkpoint",
                                    "other model", "missing file"])
def test_ship_model_with_bad_results_leaves_the_shipped_model(
        damage, tiny_run, shipped, tmp_path, monkeypatch):
    before = _snapshot(shipped)
    results = _results_for(tiny_run)
    if damage == "no scores":
        del results["scores"]
    elif damage == "other checkpoint":
        results["scores"]["best_beam4"]["checkpoint"] = "averaged"
    elif damage == "other model":
        results["parameters"] += 1
    path = tmp_path / "results.json"
    if damage != "missing file":
        path.write_text("{" if damage == "not json" else json.dumps(results), encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        _ship(monkeypatch, tiny_run, path)
    assert e.value.code == 2
    assert _snapshot(shipped) == before
    assert sorted(p.name for p in shipped.parent.iterdir()) == ["multi30k_de_en"]


@pytest.mark.multi30k
def test_ship_model_over_the_size_limit_leaves_the_shipped_model(
        tiny_run, shipped, tmp_path, monkeypatch):
    before = _snapshot(shipped)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results_for(tiny_run)), encoding="utf-8")
    monkeypatch.setattr(SHIP, "SIZE_LIMIT", 1000)
    with pytest.raises(SystemExit, match="more than 1,000"):
        _ship(monkeypatch, tiny_run, path)
    assert _snapshot(shipped) == before
    assert sorted(p.name for p in shipped.parent.iterdir()) == ["multi30k_de_en"]


@pytest.mark.multi30k
def test_ship_model_replaces_the_model_and_its_card_together(
        tiny_run, shipped, tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results_for(tiny_run)), encoding="utf-8")
    _ship(monkeypatch, tiny_run, path)
    card = (shipped / "MODEL_CARD.md").read_text(encoding="utf-8")
    p = read_provenance(tiny_run)
    assert f"- commit: {p['commit'] or 'unknown'}" in card
    assert p["machine"]["cpu_model"] in card and "\n".join(SHIP.LICENCE) in card
    model, _, _ = translation.load_model(shipped)  # the manifest checks every file
    best, _, _ = translation.load_model(tiny_run / "best")
    assert count_parameters(model) == count_parameters(best)
    assert sorted(p.name for p in shipped.parent.iterdir()) == ["multi30k_de_en"]


# ------------------------------------------------------------------------------ multi30k_report


def _report(monkeypatch, run: Path, out: Path, *extra: str) -> None:
    monkeypatch.setattr(sys, "argv", ["multi30k_report.py", "--run", str(run), "--out", str(out),
                                      "--command", "tiny", "--beam", "2", *extra])
    REPORT.main()


@pytest.fixture
def no_evaluation(monkeypatch):
    """Fail loudly if the report starts translating: input errors must come before."""

    def evaluate(*args, **kwargs):
        raise AssertionError("evaluation started before the inputs were checked")

    monkeypatch.setattr(REPORT.translation, "evaluate", evaluate)


@pytest.mark.parametrize("case, message", [
    ("system not scored", "--system averaged"),
    ("no such out dir", "not a file in a writable directory"),
    ("limit into results", "must not replace a committed one"),
    ("commit and record", "--commit is only for runs without provenance.json"),
    ("no record", "has no provenance.json"), ("not a run", "history.json not found"),
    ("limit 0", "--limit 0"),
])
def test_report_checks_its_inputs_before_evaluating(
        case, message, tiny_run, tmp_path, monkeypatch, no_evaluation, capsys):
    run, out, extra = tiny_run, tmp_path / "r.json", ["--limit", "2"]
    if case == "system not scored":
        extra += ["--checkpoints", "best", "--system", "averaged"]
    elif case == "no such out dir":
        out = tmp_path / "missing" / "r.json"
    elif case == "limit into results":
        monkeypatch.setattr(REPORT, "ROOT", tmp_path)
        (tmp_path / "results").mkdir()
        out = tmp_path / "results" / "multi30k.json"
    elif case == "commit and record":
        extra += ["--commit", "abc1234"]
    elif case == "no record":
        run = tmp_path / "old_run"
        shutil.copytree(tiny_run, run)
        (run / "provenance.json").unlink()
    elif case == "not a run":
        run = tmp_path
    elif case == "limit 0":
        extra = ["--limit", "0"]
    with pytest.raises(SystemExit) as e:
        _report(monkeypatch, run, out, *extra)
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.multi30k
def test_report_copies_the_runs_provenance_and_stores_no_attention_maps(
        tiny_run, tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    _report(monkeypatch, tiny_run, out, "--limit", "3", "--checkpoints", "best", "--system",
            "best")
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["provenance"] == read_provenance(tiny_run)  # the trainer's, as written
    assert result["scoring_provenance"]["machine"] == provenance()["machine"]
    assert "attention" not in result and "commit" not in result and "machine" not in result
    assert result["system"] == "best_beam2"


@pytest.mark.multi30k
def test_report_of_an_old_run_records_the_typed_commit_as_typed(tiny_run, tmp_path, monkeypatch):
    run = tmp_path / "old_run"
    shutil.copytree(tiny_run, run)
    (run / "provenance.json").unlink()
    out = tmp_path / "r.json"
    _report(monkeypatch, run, out, "--limit", "2", "--checkpoints", "best", "--system", "best",
            "--commit", "abc1234")
    p = json.loads(out.read_text(encoding="utf-8"))["provenance"]
    assert p["commit"] == "abc1234" and p["machine"] is None
    assert p["recorded_at"].startswith("typed by hand (--commit)")
