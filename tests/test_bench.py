"""Smoke and correctness tests of the benchmarks (the ``bench`` package) on tiny configurations.

Nothing here times anything or asserts a speed: the tests check that each script's functions run
and return well-formed results, that the quantities they derive (ratios, slopes, analytic FLOPs,
peak memory) are computed correctly against independent references, and that the two models
compared in the training benchmark compute the same function.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from bench import attention_scaling, common, decode, flops, micro
from bench import fast_setting_quality as fq
from bench import train_models as tm
from bench import train_steps as ts
from bench import train_throughput as tt
from transformer_lib.layers import Dropout, LayerNorm
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.training import Batch, LabelSmoothing
from transformer_lib.translation import resolve_precision
from transformer_lib.translation.data import PAD

CPU = torch.device("cpu")
TINY = tm.CONFIGS["tiny"]


def assert_paths(data: dict, paths: list[str]) -> None:
    """Every ``a/b/c`` path exists in ``data``; ``*`` stands for every key (or list item)."""
    for path in paths:
        level = [data]
        for part in path.split("/"):
            nxt = []
            for node in level:
                if part == "*":
                    items = node.values() if isinstance(node, dict) else node
                    assert items, f"{path}: nothing under *"
                    nxt.extend(items)
                else:
                    assert part in node, f"{path}: no key {part!r}"
                    nxt.append(node[part])
            level = nxt


# What the performance appendix (chapters/09_performance.ipynb) reads from each result file:
# the benchmarks' main functions must keep writing these keys.
COMMON_KEYS = ["date", "git_commit", "machine/cpu_model", "machine/logical_cores"]
COMMON_KEYS += ["machine/torch_version", "machine/load_average_start", "command"]
TRAIN_KEYS = COMMON_KEYS + [
    "wall_time_s",
    "machine/cpu_flags",
    "machine/load_average_end",
    "matmul_peak_flops/used_for_mfu/fp32",
    "matmul_peak_flops/used_for_mfu/bf16",
    "matmul_peak_flops/n",
    "same_math_max_abs_diff",
    *(f"configs/*/config/{k}" for k in ("d_model", "N", "batch_size", "repeats", "n_batches")),
    *(
        f"configs/*/variants/*/{k}"
        for k in ("model", "tokens_per_s", "vs_nn_transformer_fp32", "mfu", "round_s_all")
    ),
    "configs/*/variants/*/peak_step_memory_bytes",
    "configs/*/ratios",
    *(f"targets/*/{k}" for k in ("config", "target", "ratio", "value", "threshold", "met")),
]
EXTRAS_KEYS = [
    *(f"extras/layernorm/*/{k}" for k in ("d_model", "tokens", "by_hand_ms", "fused_ms")),
    "extras/layernorm/*/by_hand_vs_fused_time",
    *(f"extras/loss/{k}" for k in ("vocab", "tokens", "definition_ms", "closed_form_ms")),
    "extras/loss/definition_vs_closed_form_time",
    *(f"extras/dropout/*/{k}" for k in ("p", "d_model", "tokens", "nn_dropout_ms", "ours_ms")),
    "extras/dropout/*/nn_dropout_vs_ours_time",
    *(f"extras/fused_qkv/*/{k}" for k in ("d_model", "separate_ms", "fused_ms")),
    "extras/fused_qkv/*/separate_vs_fused_time",
    *(f"extras/attention_dtype/{k}" for k in ("shape", "fused_bf16_ms", "fused_fp32_ms")),
    "extras/attention_dtype/fused_bf16_vs_fused_fp32_time",
    "extras/attention_dtype/math_bf16_ms",
    "extras/bucketing",
]
BUCKETING_KEYS = [
    f"extras/bucketing/{k}"
    for k in ("random_padding", "bucketed_padding", "bucketed_vs_random_tokens_per_s")
]
ATTENTION_KEYS = COMMON_KEYS + [
    "wall_time_s",
    "machine/load_average_end",
    *(f"rows/*/{k}" for k in ("impl", "mode", "n", "time_ms", "peak_bytes", "nxn_matrix_bytes")),
    *(f"slopes/*/{k}" for k in ("from_n", "to_n", "time_slope")),
]
DECODE_KEYS = COMMON_KEYS + [
    "wall_time_s",
    "load_average_end",
    "config/batch",
    "config/repeats",
    "config/model/d_model",
    "config/model/N",
    *(
        f"results/*/{k}"
        for k in ("output_length", "greedy_no_cache_s", "greedy_cache_s", "beam4_cache_s")
    ),
    "results/*/greedy_cache_ratio",
    "results/*/tokens_identical",
    "results/*/greedy_no_cache_all_s",  # the rounds: the ratios' ranges
    "results/*/greedy_cache_all_s",
]
QUALITY_KEYS = COMMON_KEYS + [
    "wall_time_s",
    "machine/load_average_end",
    "runs/*/steps",
    "runs/*/history",
    "runs/*/resumed_from_existing_run",
    "val_loss_fp32",
    "val_loss_fast",
    "val_loss_fast_vs_fp32_relative_difference",
    "relative_differences_by_change/bf16_alone_fast_vs_fp32_paper_dropout",
    "relative_differences_by_change/dropout_alone_fp32_paper_dropout_vs_fp32",
    "target/met",
    "target/met_against_fp32_with_the_same_dropout",
]

TRANSLATE_KEYS = COMMON_KEYS + [
    "wall_time_s",
    "machine/load_average_end",
    *(f"config/{k}" for k in ("sentences", "beam_size", "threads", "repeats")),
    "config/ct2_length_penalty_beta/chosen",
    "greedy_check/identical",
    "greedy_check/sentences",
    *(f"results/*/{k}" for k in ("system", "seconds", "sentences_per_s",
                                 "target_tokens_per_s", "bleu", "seconds_all")),
]


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("bench_translate.json", TRANSLATE_KEYS),
        ("bench_translate_xeon.json", TRANSLATE_KEYS),  # the other CPU kind
        ("bench_train.json", TRAIN_KEYS + EXTRAS_KEYS + BUCKETING_KEYS),
        ("bench_train_epyc.json", TRAIN_KEYS + EXTRAS_KEYS + BUCKETING_KEYS),
        ("bench_attention.json", ATTENTION_KEYS),
        ("bench_decode.json", DECODE_KEYS),
        ("bench_quality.json", QUALITY_KEYS),
    ],
)
def test_committed_results_have_what_the_appendix_reads(name, keys):
    """The key lists above are the appendix's: the committed files (which it renders) hold
    them, so a key list that drifted from the chapter fails here or in the chapter."""
    path = Path(__file__).resolve().parents[1] / "results" / name
    assert_paths(json.loads(path.read_text()), keys)


# --------------------------------------------------------------------------- common


def test_interleaved_times_rotates_and_counts():
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "ABC"}
    times = common.interleaved_times(fns, warmup=1, repeats=3)
    assert calls[:3] == ["A", "B", "C"]  # warm-up round
    assert calls[3:] == ["A", "B", "C", "B", "C", "A", "C", "A", "B"]  # rotated rounds
    assert {k: len(v) for k, v in times.items()} == {"A": 3, "B": 3, "C": 3}
    assert all(t >= 0 for v in times.values() for t in v)


def test_interleaved_times_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats >= 1"):
        common.interleaved_times({"A": lambda: None}, warmup=0, repeats=0)
    with pytest.raises(ValueError, match="warmup >= 0"):
        common.interleaved_times({"A": lambda: None}, warmup=-1, repeats=1)


def test_peak_step_memory_sees_a_temporary_tensor():
    """A 4 MiB temporary freed before the call returns still sets the peak."""
    n = 1 << 20  # floats

    def fn():
        x = torch.ones(n)
        y = x * 2  # two live 4 MiB tensors at once
        return float(y[0])

    peak = common.peak_step_memory(fn)
    if peak is None:
        pytest.skip("this torch has no profiler memory timeline")
    assert 2 * 4 * n <= peak < 3 * 4 * n


def test_machine_description_and_commit():
    m = common.machine_description()
    assert m["logical_cores"] >= 1 and m["torch_threads"] >= 1
    assert m["torch_version"] == torch.__version__
    assert isinstance(m["cpu_model"], str) and m["cpu_model"]
    commit = common.git_commit()
    assert commit == "unknown" or len(commit.removesuffix("-dirty")) == 40


def test_matmul_peak_is_2n3_flops_over_the_fastest_timed_product(monkeypatch):
    """The peak is 2·n³ FLOPs over the best (not the mean or median) of `repeats` timed
    products; the warm-up product is not timed. A fake clock gives the products 0.5, 0.25 and
    0.4 s: any other reading of them, or a clock read for the warm-up, gives another number."""
    clock = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.4])
    monkeypatch.setattr(common, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    n = 64
    assert common.matmul_peak(torch.float32, n=n, repeats=3) == pytest.approx(2 * n**3 / 0.25)
    assert next(clock, "used up") == "used up"  # two readings per timed product, no more
    monkeypatch.undo()
    peak = common.matmul_peak(torch.bfloat16, n=n, repeats=2)  # the real clock: a rate
    assert math.isfinite(peak) and peak > 0


@pytest.mark.parametrize("name", ["bench_train.json", "bench_train_epyc.json"])
def test_committed_train_results_are_ratios_of_the_same_run(name):
    """results/bench_train.json and the EPYC's (the appendix's speed-ups, MFU and targets):
    every ratio is computed from the tokens/s of the same run, every MFU from the larger of
    the two matmul peaks of that run in the variant's own precision, and every target's
    verdict from its ratio."""
    path = Path(__file__).resolve().parents[1] / "results" / name
    data = json.loads(path.read_text(encoding="utf-8"))
    peaks = data["matmul_peak_flops"]
    for kind in ("fp32", "bf16"):
        assert peaks["used_for_mfu"][kind] == max(peaks["start"][kind], peaks["end"][kind])
    for name, res in data["configs"].items():
        rows = res["variants"]
        speed = {variant: row["tokens_per_s"] for variant, row in rows.items()}
        for variant, row in rows.items():
            kind = "bf16" if row["precision"].startswith("bf16") else "fp32"
            assert row["peak_reference"] == kind, (name, variant)
            mfu = row["model_tflops_per_s"] * 1e12 / peaks["used_for_mfu"][kind]
            assert row["mfu"] == pytest.approx(mfu), (name, variant)
            vs_ref = speed[variant] / speed["nn_transformer_fp32"]
            assert row["vs_nn_transformer_fp32"] == pytest.approx(vs_ref), (name, variant)
        assert len(res["ratios"]) >= len(rows) - 1  # every variant against nn.Transformer
        for key, value in res["ratios"].items():
            a, b = key.split("_vs_")
            assert value == pytest.approx(speed[a] / speed[b]), (name, key)
    assert data["targets"]
    for target in data["targets"]:
        value = data["configs"][target["config"]]["ratios"][target["ratio"]]
        assert target["value"] == value
        assert target["met"] == (value >= target["threshold"])


# --------------------------------------------------------------------------- attention scaling


@pytest.fixture(scope="module")
def attn_result():
    return attention_scaling.benchmark(
        [128, 256],
        batch=1,
        h=2,
        d_k=8,
        min_repeats=1,
        max_repeats=2,
        budget_s=0.0,
        verbose=False,
    )


def test_attention_rows_are_complete(attn_result):
    rows = attn_result["rows"]
    got = sorted((r["impl"], r["mode"], r["n"]) for r in rows)
    want = sorted(
        (i, m, n)
        for n in (128, 256)
        for m in attention_scaling.MODES
        for i in attention_scaling.IMPLS
        if not (i == "sdpa_dropout" and m == "forward")
    )
    assert got == want
    for r in rows:
        assert math.isfinite(r["time_ms"]) and r["time_ms"] > 0
        assert len(r["time_ms_all"]) == r["repeats"]
        assert r["nxn_matrix_bytes"] == r["batch"] * r["h"] * r["n"] ** 2 * 4
    assert attn_result["skipped"] == []


def test_attention_ratios_per_doubling(attn_result):
    index = {(r["impl"], r["mode"], r["n"]): r for r in attn_result["rows"]}
    for (impl, mode, n), r in index.items():
        if n == 128:
            assert r["time_ratio_per_doubling"] is None
        else:
            prev = index[(impl, mode, n // 2)]
            assert r["time_ratio_per_doubling"] == pytest.approx(r["time_ms"] / prev["time_ms"])


def test_explicit_path_materialises_the_weights_and_sdpa_does_not(attn_result):
    """The measured peaks show the (n × n) matrix: at least one for explicit, less for SDPA."""
    rows = [r for r in attn_result["rows"] if r["n"] == 256 and r["mode"] == "forward"]
    if rows[0]["peak_bytes"] is None:
        pytest.skip("this torch has no profiler memory timeline")
    peak = {r["impl"]: r["peak_bytes"] for r in rows}
    nxn = rows[0]["nxn_matrix_bytes"]
    assert peak["explicit"] >= nxn
    assert peak["sdpa"] < nxn


def test_attention_implementations_agree():
    q, k, v = attention_scaling.make_qkv(2, 3, 40, 16, device=CPU)
    ref = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v
    torch.testing.assert_close(attention_scaling.attend("explicit", q, k, v), ref)
    torch.testing.assert_close(attention_scaling.attend("sdpa", q, k, v), ref)
    assert attention_scaling.check_same_output(CPU, n=32) < 1e-5


def test_attention_rejects_bad_arguments():
    with pytest.raises(ValueError, match="lengths must be a non-empty increasing list"):
        attention_scaling.benchmark([256, 128])
    with pytest.raises(ValueError, match="impl must be one of"):
        attention_scaling.attend("flash", *attention_scaling.make_qkv(1, 1, 4, 4, device=CPU))
    with pytest.raises(ValueError, match="mode must be one of"):
        attention_scaling.make_call("sdpa", "backward", None, CPU)


@settings(max_examples=25, deadline=None)
@given(
    exponent=st.floats(0.5, 3.0),
    scale=st.floats(1e-3, 1e3),
    lengths=st.lists(st.sampled_from([512, 1024, 2048, 4096]), min_size=2, unique=True),
)
def test_fit_slopes_recovers_a_power_law(exponent, scale, lengths):
    rows = [
        {
            "impl": "sdpa",
            "mode": "forward",
            "n": n,
            "time_ms": scale * n**exponent,
            "peak_bytes": int(1000 * n),
        }
        for n in sorted(lengths)
    ]
    s = attention_scaling.fit_slopes(rows)["sdpa/forward"]
    assert s["time_slope"] == pytest.approx(exponent, rel=1e-9)
    assert s["memory_slope"] == pytest.approx(1.0, abs=1e-3)


def test_attention_main_writes_json(tmp_path):
    out = tmp_path / "attn.json"
    attention_scaling.main(
        ["--lengths", "32", "64", "--batch", "1", "--heads", "2", "--d-k", "8"]
        + ["--budget", "0", "--no-memory", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    assert_paths(data, ATTENTION_KEYS)
    assert data["command"].startswith("python -m bench.attention_scaling --lengths 32 64")
    assert data["settings"]["lengths"] == [32, 64]
    assert (
        data["machine"]["load_average_end"] is None or len(data["machine"]["load_average_end"]) == 3
    )


# --------------------------------------------------------------------------- training throughput


def test_batches_are_seeded_padded_and_counted():
    a, b = tm.random_batches(TINY, CPU, seed=3), tm.random_batches(TINY, CPU, seed=3)
    assert len(a) == TINY.n_batches
    for x, y in zip(a, b):
        assert torch.equal(x.src, y.src) and torch.equal(x.tgt, y.tgt)
        src_len = (x.src != PAD).sum(1)
        assert ((src_len >= TINY.min_len) & (src_len <= TINY.max_len)).all()
        # padding only at the end of each row
        positions = torch.arange(x.src.size(1))
        assert torch.equal(x.src != PAD, positions < src_len[:, None])
        assert x.ntokens == int((x.tgt_y != PAD).sum())
    c = tm.random_batches(TINY, CPU, seed=4)[0].src
    assert c.shape != a[0].src.shape or not torch.equal(c, a[0].src)  # the seed matters


def test_nn_transformer_computes_our_function():
    """With copied weights (and its extra final norms removed) nn.Transformer matches ours."""
    assert tm.same_math_check(TINY, CPU) < 1e-4


@pytest.fixture
def count_inplace_addmm(monkeypatch):
    """FlopCounterMode counts ``aten.addmm`` but not its in-place form, with which chapter 6's
    fused loss adds up the generator's weight gradient: give it the same formula. (The
    committed training results' ``flop_counter_check`` predates this and reads one
    (tokens x d_model x vocab) product short per batch; their MFU uses the analytic count.)"""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    monkeypatch.setitem(flop_counter.flop_registry, aten.addmm_,
                        flop_counter.flop_registry[aten.addmm])


@pytest.mark.parametrize(
    "variant",
    ["ours_fp32", "ours_fp32_no_padding_skip", "nn_transformer_fp32", "textbook_fp32"],
)
def test_analytic_flops_equal_flop_counter(variant, count_inplace_addmm):
    """The analytic count (padded shapes) equals torch's FlopCounterMode for all the models."""
    _, step = ts.build_variant(variant, TINY, CPU)
    batch = tm.random_batches(TINY, CPU)[0]
    counted = flops.counted_flops(step, batch)
    v = ts.VARIANTS[variant]
    expected = flops.train_flops(
        TINY,
        batch,
        padded=True,
        real_token_generator=v.uses_trainer_step,  # the generator on non-padding positions only
        skip_padding=v.skips_padding,  # the feed-forward blocks on non-padding positions only
    )
    assert counted == pytest.approx(expected, rel=1e-9)


def test_unpadded_flops_without_padding_equal_padded():
    cfg = dataclasses.replace(TINY, min_len=7, max_len=7)
    batch = tm.random_batches(cfg, CPU)[0]
    assert flops.train_flops(cfg, batch) == flops.train_flops(cfg, batch, padded=True)
    padded = tm.random_batches(TINY, CPU)[0]
    assert flops.train_flops(TINY, padded) < flops.train_flops(TINY, padded, padded=True)


def test_train_flops_by_hand():
    """One sentence pair, N = 1: the formula written out term by term."""
    cfg = dataclasses.replace(TINY, d_model=8, d_ff=16, vocab=10, N=1)
    src = torch.tensor([[5, 6, 7]])  # S = 3
    tgt = torch.tensor([[1, 4, 9]])  # decoder input T = 2
    batch = Batch(src, tgt, pad=PAD)
    d, f, V, S, T = 8, 16, 10, 3, 2
    enc = (4 * d * d + 2 * d * f) * S
    dec = (6 * d * d + 2 * d * f) * T + 2 * d * d * S
    attn = 4 * d * (S * S + T * T + T * S)
    assert flops.train_flops(cfg, batch) == 3 * (2 * (enc + dec + d * V * T) + attn)


@settings(max_examples=30, deadline=None)
@given(
    vocab=st.integers(3, 40),
    rows=st.integers(1, 12),
    smoothing=st.sampled_from([0.0, 0.05, 0.1, 0.3]),
    seed=st.integers(0, 2**16),
)
def test_kl_by_definition_matches_label_smoothing(vocab, rows, smoothing, seed):
    """The textbook path's dense loss and the package's closed form: same value and gradient."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(rows, vocab, generator=g).log_softmax(-1)
    target = torch.randint(0, vocab, (rows,), generator=g)  # includes padding rows (id 0)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    crit = LabelSmoothing(vocab, PAD, smoothing)
    ref = ts.kl_by_definition(a, target, crit)
    got = crit(b, target)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    ref.backward()
    got.backward()
    torch.testing.assert_close(b.grad, a.grad)


def test_layernorms_by_hand_keep_the_function():
    torch.manual_seed(0)
    model = tm.build_ours(TINY, CPU).eval()
    batch = tm.random_batches(TINY, CPU)[0]
    before = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    assert tm.layernorms_by_hand(model) == 5 * TINY.N  # 2 per encoder layer, 3 per decoder layer
    assert not any(isinstance(m, LayerNorm) for m in model.modules())
    after = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    torch.testing.assert_close(after, before)


def test_paper_dropout_only_touches_attention_and_ffn_dropout():
    ours = tm.build_ours(TINY, CPU, paper_dropout=True)
    attn = [m for m in ours.modules() if isinstance(m, MultiHeadedAttention)]
    assert len(attn) == 3 * TINY.N and all(m.dropout.p == 0.0 for m in attn)
    theirs = tm.build_nn(TINY, CPU, paper_dropout=True)
    mha = [m for m in theirs.modules() if isinstance(m, nn.MultiheadAttention)]
    assert len(mha) == 3 * TINY.N and all(m.dropout == 0.0 for m in mha)
    # the same number of live dropout modules (residual + embedding), all at cfg.dropout
    for model in (ours, theirs):
        live = [m for m in model.modules() if isinstance(m, nn.Dropout) and m.p > 0]
        assert all(m.p == TINY.dropout for m in live)
    n_ours = sum(isinstance(m, nn.Dropout) and m.p > 0 for m in ours.modules())
    n_theirs = sum(isinstance(m, nn.Dropout) and m.p > 0 for m in theirs.modules())
    assert n_ours == n_theirs == 2 + 2 * TINY.N + 3 * TINY.N  # embeddings + residuals


def test_textbook_variant_uses_the_explicit_path():
    model = tm.build_textbook(TINY, CPU)
    batch = tm.random_batches(TINY, CPU)[0]
    model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    attn = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    assert all(m.store_attention and m.attn is not None for m in attn)
    assert any(isinstance(m, tm.LayerNormByHand) for m in model.modules())


@pytest.mark.parametrize("name", ["ours_fp32", "nn_transformer_fp32"])
def test_trainer_step_gives_the_reference_step(name):
    """The trainer's step (generator on real tokens only, fused Adam; clipping off here) and
    the reference step (generator on every position) make the same update."""
    batch = tm.random_batches(TINY, CPU)[0]
    losses, params = [], []
    for trainer in (False, True):
        model = tm.BUILDERS[ts.VARIANTS[name].builder](TINY, CPU)
        torch.manual_seed(1)  # the same dropout masks in both steps
        if trainer:
            step = ts.package_step(model, TINY, CPU, clip_norm=None)
        else:
            step = ts.reference_step(model, TINY, CPU)
        losses.append(step(batch))
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    d = TINY.d_model
    for key, a in params[0].items():
        b = params[1][key]
        if key.endswith(("in_proj.bias", "in_proj_bias")):  # ours, nn.MultiheadAttention
            # The key bias's true gradient is 0 (it adds the same q.b_k to every logit of a
            # row, which softmax ignores); the two steps round it to different tiny values and
            # Adam's first step turns any nonzero value into +-lr. Compare W^Q's and W^V's.
            a, b = torch.cat([a[:d], a[2 * d :]]), torch.cat([b[:d], b[2 * d :]])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=key)


def test_trainer_step_clips_at_the_trainers_norm():
    """The benchmark's trainer step clips the gradient norm as the trainer does: with a
    tiny clip norm the first Adam update is unchanged (Adam is scale-free) but a second
    one differs, as the moments then mix clipped and unclipped gradients."""
    assert ts.TRAINER_CLIP_NORM == 1.0
    batches = tm.random_batches(TINY, CPU)
    finals = []
    for clip in (None, 1e-6):
        model = tm.build_ours(TINY, CPU)
        torch.manual_seed(1)
        step = ts.package_step(model, TINY, CPU, clip_norm=clip)
        for b in batches:
            step(b)
        finals.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert not torch.allclose(finals[0], finals[1])


def test_run_config_is_well_formed(count_inplace_addmm):
    names = ["ours_fp32", "nn_transformer_fp32", "textbook_fp32", "ours_bf16_paper_dropout"]
    cfg = dataclasses.replace(TINY, repeats=1)
    res = tt.run_config(cfg, names, CPU, measure_memory=False, verbose=False)
    assert set(res["variants"]) == set(names)
    for row in res["variants"].values():
        assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] > 0
        assert len(row["round_s_all"]) == cfg.repeats
    v = res["variants"]
    assert res["ratios"]["ours_fp32_vs_textbook_fp32"] == pytest.approx(
        v["ours_fp32"]["tokens_per_s"] / v["textbook_fp32"]["tokens_per_s"]
    )
    assert v["nn_transformer_fp32"]["vs_nn_transformer_fp32"] == 1.0
    assert v["ours_bf16_paper_dropout"]["paper_dropout"] is True
    assert v["ours_bf16_paper_dropout"]["precision"] == "bf16-autocast"
    assert v["ours_fp32"]["trainer_step"] is True
    assert v["nn_transformer_fp32"]["trainer_step"] is False
    assert v["textbook_fp32"]["trainer_step"] is False
    best = max(("ours_fp32", "ours_bf16_paper_dropout"), key=lambda k: v[k]["tokens_per_s"])
    assert res["fastest"]["variant"] == best
    check = res["flop_counter_check"]
    assert check["counted_padded_flops_batch0"] == pytest.approx(
        check["analytic_padded_flops_batch0"]
    )
    assert res["target_tokens_per_round"] == sum(b["tgt_tokens"] for b in res["batches"])
    tt.add_mfu({"tiny": res}, {"fp32": 1e12, "bf16": 2e12})
    row = v["ours_fp32"]
    assert row["mfu"] == pytest.approx(row["model_tflops_per_s"])  # peak = 1 TFLOP/s
    assert row["hfu_padded"] >= row["mfu"]


def test_check_targets_reads_the_right_ratios():
    results = {
        "small": {
            "ratios": {
                "ours_fp32_vs_nn_transformer_fp32": 1.2,
                "ours_fp32_vs_textbook_fp32": 1.4,
                "ours_bf16_paper_dropout_vs_nn_transformer_fp32": 2.6,
            },
        }
    }
    got = {(t["config"], t["ratio"]): t["met"] for t in tt.check_targets(results)}
    assert got[("small", "ours_fp32_vs_nn_transformer_fp32")] is True
    assert got[("small", "ours_fp32_vs_textbook_fp32")] is False
    assert got[("small", "ours_bf16_paper_dropout_vs_nn_transformer_fp32")] is True
    assert got[("base", "ours_fp32_vs_nn_transformer_fp32")] is None  # not measured


def test_micro_benchmarks_run():
    qkv = micro.fused_qkv_micro(16, 64, CPU, repeats=1)
    ln = micro.layernorm_micro(16, 64, CPU, repeats=1)
    loss = micro.loss_micro(30, 64, CPU, repeats=1)
    assert qkv["separate_vs_fused_time"] > 0 and ln["by_hand_vs_fused_time"] > 0
    assert loss["definition_vs_closed_form_time"] > 0
    drop = micro.dropout_micro(16, 64, CPU, repeats=1)
    assert drop["nn_dropout_vs_ours_time"] == pytest.approx(drop["nn_dropout_ms"] / drop["ours_ms"])
    att = micro.attention_dtype_micro(TINY, CPU, repeats=1)
    assert att["fused_bf16_vs_fused_fp32_time"] == pytest.approx(
        att["fused_bf16_ms"] / att["fused_fp32_ms"]
    )


def test_bucketing_experiment_on_a_slice_of_multi30k():
    res = micro.bucketing_experiment(
        TINY, CPU, max_tokens=400, n_batches=2, repeats=1, max_pairs=400, vocab_size=300
    )
    if res is None:
        pytest.skip("Multi30k is not available here")
    for key in ("bucketed_padding", "random_padding"):
        assert 0.0 <= res[key] < 1.0
    assert res["bucketed_padding"] < res["random_padding"]
    assert res["bucketed_vs_random_tokens_per_s"] == pytest.approx(
        res["bucketed_tokens_per_s"] / res["random_tokens_per_s"]
    )


def test_train_main_writes_json(tmp_path):
    """The whole benchmark, extras included, on the tiny config: the appendix's keys."""
    out = tmp_path / "train.json"
    variants = ["ours_fp32", "nn_transformer_fp32", "textbook_fp32", "ours_bf16_paper_dropout"]
    tt.main(
        ["--configs", "tiny", "--variants", *variants, "--repeats", "1", "--no-memory"]
        + ["--bucketing-pairs", "300", "--bucketing-vocab", "300", "--bucketing-max-tokens", "200"]
        + ["--peak-n", "64", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    keys = TRAIN_KEYS + EXTRAS_KEYS
    if data["extras"]["bucketing"] is not None:  # None without Multi30k
        keys += BUCKETING_KEYS
    assert_paths(data, keys)
    assert data["command"].startswith("python -m bench.train_throughput --configs tiny")
    assert data["same_math_max_abs_diff"] < 1e-4
    assert set(data["configs"]["tiny"]["variants"]) == set(variants)
    assert "ours_fp32_vs_nn_transformer_fp32" in data["configs"]["tiny"]["ratios"]
    assert [t["value"] for t in data["targets"]] == [None] * len(tt.TARGETS)  # tiny: none


# --------------------------------------------------------------------------- decoding


def test_decode_main_writes_json(tmp_path):
    out = tmp_path / "decode.json"
    data = decode.main(
        ["--lengths", "2", "4", "--repeats", "1", "--d-model", "16", "--layers", "1"]
        + ["--heads", "2", "--vocab", "20", "--batch", "2", "--src-len", "5", "--out", str(out)]
    )
    assert json.loads(out.read_text()) == data
    assert_paths(data, DECODE_KEYS)
    assert [r["output_length"] for r in data["results"]] == [2, 4]
    assert all(r["tokens_identical"] for r in data["results"])  # the cache changes nothing
    assert all(r["greedy_no_cache_ratio"] == 1.0 for r in data["results"])


# --------------------------------------------------------------------------- fast-setting quality


def test_quality_benchmark_on_the_tiny_config(tmp_path):
    """Three short runs from one seed; --resume reads them back without training again."""
    tiny = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.toml")
    args = ["--config", tiny, "--epochs", "1", "--run-root", str(tmp_path / "runs")]
    try:
        out = fq.main([*args, "--out", str(tmp_path / "q.json")])
    except FileNotFoundError as err:  # no Multi30k here
        pytest.skip(f"Multi30k is not available: {err}")
    runs = out["runs"]
    assert set(runs) == {"fp32", "fast", "fp32_paper_dropout"}
    assert runs["fast"]["resolved"] == {
        "precision": resolve_precision("auto", "cpu"),  # bf16 only where the CPU has it
        "dropout": 0.0,
        "attn_dropout": 0.0,
        "ffn_dropout": 0.0,
    }
    assert runs["fp32"]["resolved"]["precision"] == "fp32"
    assert len({r["steps"] for r in runs.values()}) == 1  # the same number of steps
    fp32, fast = runs["fp32"]["val_loss"], runs["fast"]["val_loss"]
    assert out["val_loss_fast_vs_fp32_relative_difference"] == pytest.approx((fast - fp32) / fp32)
    assert out["target"]["met"] == (abs((fast - fp32) / fp32) <= 0.01)
    same = runs["fp32_paper_dropout"]["val_loss"]
    assert out["target"]["met_against_fp32_with_the_same_dropout"] == (
        abs((fast - same) / same) <= 0.01
    )
    assert_paths(out, QUALITY_KEYS)
    again = fq.main([*args, "--resume", "--out", str(tmp_path / "q2.json")])
    assert all(r["resumed_from_existing_run"] for r in again["runs"].values())
    assert {k: r["val_loss"] for k, r in again["runs"].items()} == {
        k: r["val_loss"] for k, r in runs.items()
    }
    assert json.loads((tmp_path / "q2.json").read_text()) == again  # what was written


def test_nn_dropout_variants_use_pytorchs_dropout_only():
    for name in ("ours_fp32_nn_dropout", "textbook_fp32"):
        model, _ = ts.build_variant(name, TINY, CPU)
        assert not any(isinstance(m, Dropout) for m in model.modules())
        assert any(type(m) is nn.Dropout and m.p == TINY.dropout for m in model.modules())
    model, _ = ts.build_variant("ours_fp32", TINY, CPU)
    # per encoder layer 2 residual + 1 FFN dropout, per decoder layer 3 + 1
    assert sum(isinstance(m, Dropout) for m in model.modules()) == 7 * TINY.N


# --------------------------------------------------------------------------- rnn_speed


def test_rnn_speed_main_writes_json(tmp_path, monkeypatch):
    """Chapter 8's race benchmark: both models step on the same batches, ratios recorded."""
    from bench import rnn_speed

    out = tmp_path / "rnn.json"
    argv = ["rnn_speed", "--steps", "1", "--threads", "1", "--out", str(out)]
    monkeypatch.setattr("sys.argv", argv)
    assert rnn_speed.main() == 0
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert row["threads"] == 1 and row["transformer_tokens_per_s"] > 0
    ratio = row["transformer_tokens_per_s"] / row["gru_tokens_per_s"]
    assert row["transformer_over_gru"] == pytest.approx(ratio)
    assert set(data["parameters"]) == {"transformer", "gru"}
    assert data["command"] == "python -m bench.rnn_speed --steps 1"
    # bf16 only where it is native: emulated, it took 5 minutes for this one step
    from transformer_lib.translation import resolve_precision

    assert data["precision"] == resolve_precision("auto", "cpu")
