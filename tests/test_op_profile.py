"""bench/op_profile.py: a call's profiled time, grouped by kind of operation."""

from __future__ import annotations

import pytest
import torch

from bench import op_profile


def test_kind_of_names_the_kinds_and_the_rest():
    assert op_profile.kind_of("aten::addmm") == "matrix products"
    assert op_profile.kind_of("quantized::linear_dynamic") == "matrix products"
    assert op_profile.kind_of("mkldnn::_linear_pointwise") == "matrix products"
    assert op_profile.kind_of("aten::topk") == "log-softmax and top-k over the vocabulary"
    assert op_profile.kind_of("aten::index_select") == "cache copies (cat, index_select)"
    assert op_profile.kind_of("aten::relu") == op_profile.OTHER


def test_time_by_kind_splits_a_call_whose_time_is_mostly_products():
    a = torch.randn(384, 384)

    def work():
        x = a
        for _ in range(20):
            x = torch.tanh(x @ a)  # one product, one element-wise op per round
        return x

    work()  # warm-up
    r = op_profile.time_by_kind(work)
    kinds = {k["kind"]: k for k in r["kinds"]}
    assert list(kinds) == [*op_profile.KINDS, op_profile.OTHER, op_profile.OUTSIDE]
    # calls count nested operators too: aten::matmul and the aten::mm inside it
    assert kinds["matrix products"]["calls"] >= 20 and kinds[op_profile.OTHER]["calls"] >= 20
    assert kinds["matrix products"]["seconds"] > 0
    assert kinds["attention kernel"]["seconds"] == 0 and kinds["layer norm"]["calls"] == 0
    # The parts add up to the measured wall time (the rest is outside the operations).
    assert sum(k["seconds"] for k in kinds.values()) == pytest.approx(r["wall_s"], abs=2e-3)
    assert r["op_calls"] == sum(k["calls"] for k in kinds.values() if k["calls"] is not None)


def test_median_by_kind_takes_each_kinds_median_and_keeps_the_runs():
    def run(products: float, other: float) -> dict:
        return {"wall_s": products + other, "op_calls": 10, "kinds": [
            {"kind": "matrix products", "seconds": products, "share": 0.0, "calls": 4},
            {"kind": op_profile.OTHER, "seconds": other, "share": 0.0, "calls": 6}]}

    # the second run fell into a slow spell: its numbers do not move the medians
    r = op_profile.median_by_kind([run(2.0, 1.0), run(5.0, 4.0), run(2.2, 0.8)])
    kinds = {k["kind"]: k for k in r["kinds"]}
    assert kinds["matrix products"]["seconds"] == 2.2 and kinds[op_profile.OTHER]["seconds"] == 1.0
    assert r["wall_s"] == 3.2 and r["runs"] == 3 and r["wall_s_runs"] == [3.0, 9.0, 3.0]
    assert sum(k["share"] for k in kinds.values()) == pytest.approx(1, abs=1e-3)
    with pytest.raises(ValueError, match="at least one"):
        op_profile.median_by_kind([])
    other = run(1.0, 1.0)
    other["kinds"].reverse()
    with pytest.raises(ValueError, match="same kinds"):
        op_profile.median_by_kind([run(1.0, 1.0), other])
