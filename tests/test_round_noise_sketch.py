"""The round-noise experiment times what it says, in the order it says.

``experiments/round_noise/sketch.py`` compares two ways of cutting interleaved rounds: each
system's units in one block (as ``bench.common.interleaved_times`` times a round) and unit by
unit, alternating. The orders and the ratios are checked on units that log their calls under
a fake clock; the whole run, on the smallest sizes.
"""

from __future__ import annotations

import json

import pytest
import torch

from bench.train_models import CONFIGS
from experiments.round_noise import sketch


class Clock:
    """A perf_counter that the units advance: A's units take 1 s, B's 3 s."""

    def __init__(self) -> None:
        self.now, self.log = 0.0, []

    def __call__(self) -> float:
        return self.now

    def unit(self, name: str, seconds: float):
        def run() -> None:
            self.log.append(name)
            self.now += seconds
        return run


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(sketch.time, "perf_counter", c)
    return c


def systems(clock: Clock, n: int = 3):
    return ([clock.unit(f"a{i}", 1.0) for i in range(n)],
            [clock.unit(f"b{i}", 3.0) for i in range(n)])


def test_blocks_round_times_each_system_in_one_block_the_first_rotating(clock):
    a, b = systems(clock)
    assert sketch.blocks_round(a, b, 0) == ([1.0] * 3, [3.0] * 3)
    assert clock.log == ["a0", "a1", "a2", "b0", "b1", "b2"]
    clock.log.clear()
    assert sketch.blocks_round(a, b, 1) == ([1.0] * 3, [3.0] * 3)  # B first, still (A, B)
    assert clock.log == ["b0", "b1", "b2", "a0", "a1", "a2"]


def test_units_round_alternates_unit_by_unit_the_first_rotating(clock):
    a, b = systems(clock)
    assert sketch.units_round(a, b, 0) == ([1.0] * 3, [3.0] * 3)
    assert clock.log == ["a0", "b0", "b1", "a1", "a2", "b2"]
    clock.log.clear()
    sketch.units_round(a, b, 1)
    assert clock.log == ["b0", "a0", "a1", "b1", "b2", "a2"]
    with pytest.raises(ValueError):  # unequal work is not a comparison
        sketch.units_round(a, b[:2], 0)


def test_compare_warms_up_then_alternates_the_schemes_round_by_round(clock):
    a, b = systems(clock, 2)
    out = sketch.compare(a, b, rounds=2, label="t")
    assert clock.log[:4] == ["a0", "a1", "b0", "b1"]  # the untimed pass
    timed = clock.log[4:]
    assert timed[:4] == ["a0", "a1", "b0", "b1"] and timed[4:8] == ["a0", "b0", "b1", "a1"]
    assert len(timed) == 2 * 2 * 4  # rounds x schemes x units of both
    for scheme in sketch.SCHEMES:
        row = out[scheme]
        assert row["a_seconds_all"] == [2.0, 2.0] and row["b_seconds_all"] == [6.0, 6.0]
        assert row["a_unit_seconds"] == [[1.0, 1.0]] * 2
        assert row["b_unit_seconds"] == [[3.0, 3.0]] * 2
        assert row["ratio_per_round"] == [pytest.approx(1 / 3, abs=1e-4)] * 2
        assert row["ratio_min"] == row["ratio_median"] == row["ratio_max"] == pytest.approx(1 / 3)
        assert row["a_round_max_over_min"] == 1.0


@pytest.mark.multi30k
def test_sketch_runs_small_and_writes_its_record(tmp_path, monkeypatch):
    for size in ("small", "base"):  # the plans' sizes, at the tests' size
        monkeypatch.setitem(sketch.CONFIGS, size, CONFIGS["tiny"])
    threads = torch.get_num_threads()
    out = tmp_path / "results.json"
    sketch.main(["--rounds", "2", "--limit", "4", "--out", str(out)])
    assert torch.get_num_threads() == threads
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["git_commit"] and data["machine"]["cpu_model"] and data["rounds"] == 2
    assert set(data["workloads"]) == {"translate_same_code", "train_small_same_code",
                                      "train_small_nn_over_ours", "train_base_nn_over_ours"}
    # 4 sentences: one batch
    assert data["workloads"]["translate_same_code"]["units_per_round"] == 1
    for run in data["workloads"].values():
        assert run["threads"] in (1, 2)
        for scheme in sketch.SCHEMES:
            assert len(run[scheme]["ratio_per_round"]) == 2
            assert [len(u) for u in run[scheme]["a_unit_seconds"]] == [run["units_per_round"]] * 2
            assert run[scheme]["ratio_min"] <= run[scheme]["ratio_median"] <= run[scheme][
                "ratio_max"]
