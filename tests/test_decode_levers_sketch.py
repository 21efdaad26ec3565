"""The decode-levers experiment computes what it says and records what its README reads.

``experiments/decode_levers/sketch.py`` replaces the fused attention kernel for the decoder's
one new position with chapter 1's formula, two ways; both must equal the kernel, be used
exactly there (not for the masked source attention or the encoder), and leave ``fast_beam``
as it was. The run end to end must translate validation sentences, never test ones.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from _tools import splits_read

from experiments.decode_levers import sketch
from transformer_lib.translation import fast_beam


@pytest.mark.parametrize("attend", [sketch.explicit, sketch.summed])
def test_one_query_attention_equals_the_fused_kernel(attend):
    g = torch.Generator().manual_seed(0)
    # the cache's layout in fast_beam: time-major buffers seen as (rows, h, t, d_k)
    k, v = (torch.randn(7, 6, 3, 16, generator=g).permute(1, 2, 0, 3) for _ in range(2))
    q = torch.randn(6, 3, 1, 16, generator=g)
    want = F.scaled_dot_product_attention(q, k, v)
    got = attend(q, k, v)
    assert got.shape == want.shape == (6, 3, 1, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_only_the_unmasked_one_query_call_is_replaced():
    calls = []
    functional = sketch.OneQueryAttention(lambda q, k, v: calls.append(q.shape) or q)
    g = torch.Generator().manual_seed(1)
    q1, qs = torch.randn(2, 2, 1, 4, generator=g), torch.randn(2, 2, 5, 4, generator=g)
    kv = torch.randn(2, 2, 5, 4, generator=g)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    for q, m in ((q1, mask), (qs, None), (qs, mask)):  # the kernel's cases
        torch.testing.assert_close(functional.scaled_dot_product_attention(q, kv, kv, m),
                                   F.scaled_dot_product_attention(q, kv, kv, attn_mask=m))
    assert calls == [] and functional.calls == 0 and functional.softmax is F.softmax
    functional.scaled_dot_product_attention(q1, kv, kv)
    assert calls == [q1.shape] and functional.calls == 1


@pytest.mark.multi30k
def test_sketch_runs_small_and_writes_its_record(tmp_path, monkeypatch):
    splits = splits_read(monkeypatch, sketch)
    threads = torch.get_num_threads()
    out = tmp_path / "results.json"
    sketch.main(["--limit", "6", "--repeats", "2", "--threads", "1", "--out", str(out)])
    assert torch.get_num_threads() == threads and splits == ["val"]
    assert fast_beam.F is F  # the package's kernel is back
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["git_commit"] and data["machine"]["cpu_model"]
    assert data["split"] == "val" and data["sentences"] == 6
    assert set(data["variants"]) == set(sketch.VARIANTS) and set(data["by_threads"]) == {"1"}
    # each replacement ran: once per decoder layer and step, over the warm-up and two rounds
    assert data["replaced_attention_calls"]["explicit"] > 0
    assert data["replaced_attention_calls"]["summed"] > 0
    row = data["by_threads"]["1"]
    assert row["package"]["speedup_per_round"] == [1.0, 1.0]
    for name, r in row.items():
        assert len(r["seconds_all"]) == len(r["speedup_per_round"]) == 2
        assert r["same_as_package"] == 6, name  # the same search in fp32
        assert r["bleu"] == row["package"]["bleu"]
        assert r["verdict"] in ("the reference", "gain", "loss", "noise")


def test_verdict_is_chapter_9s_rule():
    assert sketch.verdict([1.01, 1.2]) == "gain"
    assert sketch.verdict([0.8, 0.99]) == "loss"
    assert sketch.verdict([0.99, 1.2]) == "noise" and sketch.verdict([1.0, 1.1]) == "noise"
