"""The product-engine experiment runs end to end and records what chapter 9 reads.

``experiments/product_engine/sketch.py`` times the faster beam search with its products in MKL
and in oneDNN; its ratios mean something only if both settings translate alike, and it must
leave the process as it found it (threads, the environment variable).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from experiments.product_engine import sketch


@pytest.mark.multi30k
def test_sketch_runs_small_and_writes_its_record(tmp_path, monkeypatch):
    monkeypatch.setenv(sketch.VARIABLE, "1")
    threads = torch.get_num_threads()
    out = tmp_path / "results.json"
    sketch.main(["--limit", "4", "--repeats", "2", "--threads", "1", "--out", str(out)])
    assert torch.get_num_threads() == threads and os.environ[sketch.VARIABLE] == "1"
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["git_commit"] and data["machine"]["cpu_model"] and data["rule_picks"]
    assert data["sentences"] == 4 and set(data["by_threads"]) == {"1"}
    for kind in ("fp32", "int8"):
        row = data["by_threads"]["1"][kind]
        assert len(row["mkl_seconds_all"]) == len(row["onednn_seconds_all"]) == 2
        assert row["mkl_over_onednn"] > 0 and len(row["mkl_over_onednn_per_round"]) == 2
        assert row["identical_translations"] == 4
