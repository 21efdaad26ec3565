# ruff: noqa: F811  (fixtures imported from test_tools_faults, used by name)
"""The result tools on truncated or partial files (fourth probe): each test failed before.

tools/ablations.py --collect and --rescore read every row's result.json, and
tools/multi30k_report.py a run's history.json and config.json: a file cut short or missing a
key was a traceback (KeyError, JSONDecodeError) or, for the report, found after the work.
"""

from __future__ import annotations

import json

import pytest
from test_tools_faults import (  # noqa: F401 (fixtures, used by name)
    ABL,
    _finish_row,
    _report,
    ablations,
    no_evaluation,
    shipped,
    tiny_run,
)


@pytest.mark.parametrize("record", [
    {"row": "base"},  # partial: no config (KeyError 'config' in --collect)
    {"row": "base", "config": {"warmup": 1}},  # no max_steps
    {"row": "other", "config": {"max_steps": 1, "warmup": 1, "lr_factor": 1.0}},
    [1, 2],
])
def test_collect_refuses_a_partial_row_by_name(ablations, capsys, record):
    (ABL.RUNS / "base").mkdir(parents=True)
    (ABL.RUNS / "base" / "result.json").write_text(json.dumps(record), encoding="utf-8")
    before = ablations.read_bytes()
    assert ABL.collect(allow_missing=True) == 1
    err = capsys.readouterr().err
    assert ablations.read_bytes() == before and "base/result.json is unreadable" in err


@pytest.mark.parametrize("text", ['{"row": "ba', '{"row": "other"}', "[1]"])
def test_rescore_refuses_a_truncated_or_partial_row_by_name(ablations, capsys, text,
                                                            monkeypatch):
    monkeypatch.setattr(ABL, "cross_entropy", lambda run: {"val_nll": 1.0})
    (ABL.RUNS / "base").mkdir(parents=True)
    (ABL.RUNS / "base" / "result.json").write_text(text, encoding="utf-8")
    assert ABL.rescore() == 1
    assert "ablations --rescore: " in capsys.readouterr().err
    _finish_row("heads_1")  # a whole row still reads
    assert ABL.read_row(ABL.RUNS / "heads_1" / "result.json", "heads_1")["row"] == "heads_1"


@pytest.mark.parametrize("name, text, message", [
    ("history.json", "[{\"epoch\": 1, \"st", "is unreadable"),
    ("history.json", "[{\"epoch\": 1}]", "is not a run's history"),
    ("history.json", "{}", "is not a run's history"),
    ("config.json", "{\"epochs\": 2}", "is not a run's config"),
    ("config.json", "[", "is unreadable"),
])
def test_report_refuses_a_truncated_or_partial_run_before_evaluating(
        tiny_run, tmp_path, monkeypatch, no_evaluation, capsys, name, text, message):
    import shutil

    run = shutil.copytree(tiny_run, tmp_path / "run")
    (run / name).write_text(text, encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        _report(monkeypatch, run, tmp_path / "r.json", "--limit", "2")
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["no score_line", "partial provenance", "no machine"])
def test_ship_model_refuses_partial_results_before_any_work(tiny_run, shipped, tmp_path,
                                                            monkeypatch, capsys, damage):
    from test_tools_faults import SHIP, _results_for, _ship, _snapshot

    results = _results_for(tiny_run)
    if damage == "no score_line":
        del results["scores"]["best_beam4"]["score_line"]
    elif damage == "partial provenance":
        results["provenance"] = {"commit": "abc", "machine": {"cpu_model": "x"}}
    else:  # an old file's fields, cut short
        results.pop("provenance")
        results.update(commit="abc", machine={})
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results), encoding="utf-8")
    monkeypatch.setattr(SHIP, "load_multi30k", lambda *a: pytest.fail("work started"))
    before = _snapshot(shipped)
    with pytest.raises(SystemExit) as e:
        _ship(monkeypatch, tiny_run, path)
    assert e.value.code == 2 and "the results lack what the model card shows" in \
        capsys.readouterr().err
    assert _snapshot(shipped) == before
