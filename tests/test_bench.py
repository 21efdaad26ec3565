"""Smoke and correctness tests of the benchmark scripts (bench/*.py) on tiny configurations.

Nothing here times anything or asserts a speed: the tests check that each script's functions run
and return well-formed results, that the quantities they derive (ratios, slopes, analytic FLOPs,
peak memory) are computed correctly against independent references, and that the two models
compared in the training benchmark compute the same function.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import attention_scaling  # noqa: E402
import common  # noqa: E402

CPU = torch.device("cpu")


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


def test_matmul_peak_is_positive():
    assert common.matmul_peak(torch.float32, n=64, repeats=2) > 0


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
    for key in ("machine", "git_commit", "date", "settings", "rows", "slopes", "command"):
        assert key in data
    assert data["settings"]["lengths"] == [32, 64]
    assert (
        data["machine"]["load_average_end"] is None or len(data["machine"]["load_average_end"]) == 3
    )


# --------------------------------------------------------------------------- training throughput

import train_throughput as tt  # noqa: E402
from torch import nn  # noqa: E402

from transformer_lib.layers import Generator, LayerNorm  # noqa: E402
from transformer_lib.multihead import MultiHeadedAttention  # noqa: E402
from transformer_lib.training import LabelSmoothing  # noqa: E402

TINY = tt.CONFIGS["tiny"]


def test_batches_are_seeded_padded_and_counted():
    a, b = tt.make_batches(TINY, CPU, seed=3), tt.make_batches(TINY, CPU, seed=3)
    assert len(a) == TINY.n_batches
    for x, y in zip(a, b):
        assert torch.equal(x.src, y.src) and torch.equal(x.tgt, y.tgt)
        src_len = (x.src != tt.PAD).sum(1)
        assert ((src_len >= TINY.min_len) & (src_len <= TINY.max_len)).all()
        # padding only at the end of each row
        positions = torch.arange(x.src.size(1))
        assert torch.equal(x.src != tt.PAD, positions < src_len[:, None])
        assert x.ntokens == int((x.tgt_y != tt.PAD).sum())
    c = tt.make_batches(TINY, CPU, seed=4)[0].src
    assert c.shape != a[0].src.shape or not torch.equal(c, a[0].src)  # the seed matters


def test_nn_transformer_computes_our_function():
    """With copied weights (and its extra final norms removed) nn.Transformer matches ours."""
    assert tt.same_math_check(TINY, CPU) < 1e-4


@pytest.mark.parametrize(
    "variant",
    ["ours_fp32", "ours_fp32_no_padding_skip", "nn_transformer_fp32", "textbook_fp32"],
)
def test_analytic_flops_equal_flop_counter(variant):
    """The analytic count (padded shapes) equals torch's FlopCounterMode for all the models."""
    _, step = tt.build_variant(variant, TINY, CPU)
    batch = tt.make_batches(TINY, CPU)[0]
    counted = tt.counted_flops(step, batch)
    v = tt.VARIANTS[variant]
    expected = tt.train_flops(
        TINY,
        batch,
        padded=True,
        real_token_generator=v.uses_trainer_step,  # the generator on non-padding positions only
        skip_padding=v.skips_padding,  # the feed-forward blocks on non-padding positions only
    )
    assert counted == pytest.approx(expected, rel=1e-9)


def test_unpadded_flops_without_padding_equal_padded():
    cfg = tt.dataclasses.replace(TINY, min_len=7, max_len=7)
    batch = tt.make_batches(cfg, CPU)[0]
    assert tt.train_flops(cfg, batch) == tt.train_flops(cfg, batch, padded=True)
    padded = tt.make_batches(TINY, CPU)[0]
    assert tt.train_flops(TINY, padded) < tt.train_flops(TINY, padded, padded=True)


def test_train_flops_by_hand():
    """One sentence pair, N = 1: the formula written out term by term."""
    cfg = tt.dataclasses.replace(TINY, d_model=8, d_ff=16, vocab=10, N=1)
    src = torch.tensor([[5, 6, 7]])  # S = 3
    tgt = torch.tensor([[1, 4, 9]])  # decoder input T = 2
    batch = tt.Batch(src, tgt, tt.PAD)
    d, f, V, S, T = 8, 16, 10, 3, 2
    enc = (4 * d * d + 2 * d * f) * S
    dec = (6 * d * d + 2 * d * f) * T + 2 * d * d * S
    attn = 4 * d * (S * S + T * T + T * S)
    assert tt.train_flops(cfg, batch) == 3 * (2 * (enc + dec + d * V * T) + attn)


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
    crit = LabelSmoothing(vocab, tt.PAD, smoothing)
    ref = tt.kl_by_definition(a, target, crit)
    got = crit(b, target)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    ref.backward()
    got.backward()
    torch.testing.assert_close(b.grad, a.grad)


def test_layernorms_by_hand_keep_the_function():
    torch.manual_seed(0)
    model = tt.build_ours(TINY, CPU).eval()
    batch = tt.make_batches(TINY, CPU)[0]
    before = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    assert tt.layernorms_by_hand(model) == 5 * TINY.N  # 2 per encoder layer, 3 per decoder layer
    assert not any(isinstance(m, LayerNorm) for m in model.modules())
    after = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    torch.testing.assert_close(after, before)


def test_paper_dropout_only_touches_attention_and_ffn_dropout():
    ours = tt.build_ours(TINY, CPU, paper_dropout=True)
    attn = [m for m in ours.modules() if isinstance(m, MultiHeadedAttention)]
    assert len(attn) == 3 * TINY.N and all(m.dropout.p == 0.0 for m in attn)
    theirs = tt.build_nn(TINY, CPU, paper_dropout=True)
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
    model = tt.build_textbook(TINY, CPU)
    batch = tt.make_batches(TINY, CPU)[0]
    model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    attn = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    assert all(m.store_attention and m.attn is not None for m in attn)
    assert any(isinstance(m, tt.LayerNormByHand) for m in model.modules())


@pytest.mark.parametrize("kind", ["ours_fp32", "nn_transformer_fp32"])
def test_trainer_step_gives_the_same_step(kind):
    """Skipping padding positions in the generator, and fused Adam, change nothing but speed."""
    batch = tt.make_batches(TINY, CPU)[0]
    losses, params = [], []
    for real in (False, True):
        model = tt.BUILDERS[tt.VARIANTS[kind].builder](TINY, CPU)
        torch.manual_seed(1)  # the same dropout masks in both steps
        step = tt.make_step(tt.VARIANTS[kind].kind, model, TINY, CPU, trainer_step=real)
        losses.append(step(batch))
        params.append({n: p.detach().clone() for n, p in model.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    d = TINY.d_model
    for name, a in params[0].items():
        b = params[1][name]
        if name.endswith(("in_proj.bias", "in_proj_bias")):  # ours, nn.MultiheadAttention
            # The key bias's true gradient is 0 (it adds the same q.b_k to every logit of a
            # row, which softmax ignores); the two steps round it to different tiny values and
            # Adam's first step turns any nonzero value into +-lr. Compare W^Q's and W^V's.
            a, b = torch.cat([a[:d], a[2 * d :]]), torch.cat([b[:d], b[2 * d :]])
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_run_config_is_well_formed():
    names = ["ours_fp32", "nn_transformer_fp32", "textbook_fp32", "ours_bf16_paper_dropout"]
    cfg = tt.dataclasses.replace(TINY, repeats=1)
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
    qkv = tt.fused_qkv_micro(16, 64, CPU, repeats=1)
    ln = tt.layernorm_micro(16, 64, CPU, repeats=1)
    loss = tt.loss_micro(30, 64, CPU, repeats=1)
    assert qkv["separate_vs_fused_time"] > 0 and ln["by_hand_vs_fused_time"] > 0
    assert loss["definition_vs_closed_form_time"] > 0
    att = tt.attention_dtype_micro(TINY, CPU, repeats=1)
    assert att["fused_bf16_vs_fused_fp32_time"] == pytest.approx(
        att["fused_bf16_ms"] / att["fused_fp32_ms"]
    )


def test_bucketing_experiment_on_a_slice_of_multi30k():
    res = tt.bucketing_experiment(
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
    out = tmp_path / "train.json"
    tt.main(
        ["--configs", "tiny", "--variants", "ours_fp32", "nn_transformer_fp32", "textbook_fp32"]
        + ["--repeats", "1", "--no-memory", "--no-extras", "--peak-n", "64", "--out", str(out)]
    )
    data = json.loads(out.read_text())
    for key in ("machine", "git_commit", "date", "configs", "targets", "matmul_peak_flops"):
        assert key in data
    assert data["same_math_max_abs_diff"] < 1e-4
    assert "ours_fp32_vs_nn_transformer_fp32" in data["configs"]["tiny"]["ratios"]


# --------------------------------------------------------------------------- fast-setting quality

import fast_setting_quality as fq  # noqa: E402


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
        "precision": "bf16", "dropout": 0.0, "attn_dropout": 0.0, "ffn_dropout": 0.0
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
    again = fq.main([*args, "--resume", "--out", str(tmp_path / "q2.json")])
    assert all(r["resumed_from_existing_run"] for r in again["runs"].values())
    assert {k: r["val_loss"] for k, r in again["runs"].items()} == {
        k: r["val_loss"] for k, r in runs.items()
    }
    assert json.loads((tmp_path / "q2.json").read_text())["git_commit"] == out["git_commit"]


# --------------------------------------------------------------------------- chunked output loss
# (an experiment of the benchmark, not adopted by the trainer)
def _plain_and_chunked(gen, crit, h, y, chunk, amp=False):
    """(loss, grads of h/weight/bias) of criterion(generator(h)) and of the chunked loss."""
    out = []
    wide = torch.promote_types(h.dtype, torch.float32)
    for f in (
        # the generator's log-softmax in fp32 at least (CPU autocast would leave it in bf16)
        lambda: crit(gen.proj(h).to(wide).log_softmax(-1), y),
        lambda: tt.chunked_output_loss(gen, crit, h, y, chunk=chunk),
    ):
        for t in (h, gen.proj.weight, gen.proj.bias):
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = f()
        loss.backward()
        out.append([loss.detach()] + [t.grad.clone() for t in (h, gen.proj.weight, gen.proj.bias)])
    return out


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 40),
    chunk=st.integers(1, 50),
    eps=st.sampled_from([0.0, 0.1]),
    seed=st.integers(0, 10_000),
)
def test_chunked_output_loss_equals_generator_then_criterion(n, chunk, eps, seed):
    torch.manual_seed(seed)
    gen, crit = Generator(8, 13), LabelSmoothing(13, 0, eps)
    h = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    gen.double()
    y = torch.randint(0, 13, (n,))  # padding rows (0) included
    plain, chunked = _plain_and_chunked(gen, crit, h, y, chunk)
    for a, b in zip(plain, chunked, strict=True):
        torch.testing.assert_close(b, a)


def test_chunked_output_loss_under_bf16_autocast_is_close_to_plain():
    torch.manual_seed(0)
    gen, crit = Generator(32, 300), LabelSmoothing(300, 0, 0.1)
    h = torch.randn(100, 32, requires_grad=True)
    y = torch.randint(0, 300, (100,))
    plain, chunked = _plain_and_chunked(gen, crit, h, y, chunk=16, amp=True)
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-3, atol=0)  # the loss
    for a, b in zip(plain[1:], chunked[1:], strict=True):  # bf16 products: bf16 tolerance
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a, rtol=0.02, atol=0.02 * a.abs().max().item())


def test_chunked_output_loss_without_gradients_and_with_tied_weights():
    torch.manual_seed(0)
    gen, crit = Generator(8, 20), LabelSmoothing(20, 0, 0.1)
    h, y = torch.randn(9, 8), torch.randint(0, 20, (9,))
    with torch.no_grad():
        chunked = tt.chunked_output_loss(gen, crit, h, y, chunk=4)
        torch.testing.assert_close(chunked, crit(gen(h), y))
    # the generator's weight shared with an embedding: the two gradients add up
    emb = torch.nn.Embedding(20, 8)
    gen.proj.weight = emb.weight
    tokens = torch.randint(0, 20, (9,))
    grads = []
    for f in (
        lambda x: crit(gen(x), y),
        lambda x: tt.chunked_output_loss(gen, crit, x, y, chunk=4),
    ):
        emb.weight.grad = None
        f(emb(tokens) * 2).backward()
        grads.append(emb.weight.grad.clone())
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"chunk": 0}, "chunk must be a positive integer"),
        ({"chunk": True}, "chunk must be a positive integer"),
        ({"crit": torch.nn.NLLLoss()}, "criterion must be a LabelSmoothing"),
        ({"h": torch.randn(2, 3, 8)}, r"x must be \(N, d_model\)"),
        ({"y": torch.tensor([1, 2, 99])}, r"target ids must be in \[0, size=20\)"),
    ],
)
def test_chunked_output_loss_errors(kwargs, match):
    gen = Generator(8, 20)
    args = {"crit": LabelSmoothing(20, 0, 0.1), "h": torch.randn(3, 8)}
    args["y"] = torch.tensor([1, 2, 3])
    chunk = kwargs.pop("chunk", 4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tt.chunked_output_loss(gen, args["crit"], args["h"], args["y"], chunk=chunk)


def test_nn_dropout_variants_use_pytorchs_dropout_only():
    from transformer_lib.layers import Dropout

    for name in ("ours_fp32_nn_dropout", "textbook_fp32"):
        model, _ = tt.build_variant(name, TINY, CPU)
        assert not any(isinstance(m, Dropout) for m in model.modules())
        assert any(type(m) is nn.Dropout and m.p == TINY.dropout for m in model.modules())
    model, _ = tt.build_variant("ours_fp32", TINY, CPU)
    # per encoder layer 2 residual + 1 FFN dropout, per decoder layer 3 + 1
    assert sum(isinstance(m, Dropout) for m in model.modules()) == 7 * TINY.N
