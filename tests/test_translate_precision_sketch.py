"""The translation-precision experiment runs end to end and records what its README reads.

``experiments/translate_precision/sketch.py`` times beam search in fp32 (the faster search)
and in bf16 autocast (what precision "auto" picks on a CPU with bf16); it must translate
validation sentences, not test ones (a default is chosen on validation), and leave the
process's thread count as it found it.
"""

from __future__ import annotations

import json

import pytest
import torch
from _tools import splits_read

from experiments.translate_precision import sketch


@pytest.mark.multi30k
def test_sketch_runs_small_and_writes_its_record(tmp_path, monkeypatch):
    splits = splits_read(monkeypatch, sketch)
    threads = torch.get_num_threads()
    out = tmp_path / "results.json"
    sketch.main(["--limit", "4", "--repeats", "2", "--threads", "1", "--out", str(out)])
    assert torch.get_num_threads() == threads and splits == ["val"]
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["git_commit"] and data["machine"]["cpu_model"]
    assert data["split"] == "val" and data["sentences"] == 4
    assert data["auto_resolves_to"] in sketch.PRECISIONS and set(data["by_threads"]) == {"1"}
    row = data["by_threads"]["1"]
    assert len(row["fp32_seconds_all"]) == len(row["bf16_seconds_all"]) == 2
    assert row["bf16_over_fp32"] > 0 and len(row["bf16_over_fp32_per_round"]) == 2
    assert set(row["bleu"]) == {"fp32", "bf16"} and 0 <= row["identical_translations"] <= 4
