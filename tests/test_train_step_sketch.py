"""The training-step experiment takes out what it says, and its reference is chapter 9's step.

``experiments/train_step_speed/sketch.py`` times the package's fp32 step against the same step
with a lever taken out (float dropout masks; the plain route of the loss). Its ratios mean
something only if each variant trains the same function: the float mask keeps 1 - p of the
entries, the plain route gives the fused loss and its gradients (tests/test_fused_loss.py holds
the package's fused loss itself), and the "package" variant is the benchmark's step.
"""

from __future__ import annotations

import json

import pytest
import torch

import transformer_lib.training as training
from experiments.train_step_speed import sketch
from transformer_lib.layers import Dropout


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_float_dropout_keeps_one_minus_p_scaled(p):
    torch.manual_seed(0)
    d = Dropout(p).train()
    x = torch.randn(1000, 1000)
    y = sketch.float_dropout(d, x)
    kept = y != 0
    assert abs(kept.double().mean().item() - (1 - p)) < 0.003
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    assert sketch.float_dropout(d.eval(), x) is x  # evaluation: the identity
    assert sketch.float_dropout(Dropout(0.0).train(), x) is x


def test_variants_take_out_their_lever(monkeypatch):
    """float_dropout replaces every one of chapter 5's dropouts; unfused_loss keeps the step
    off the fused route; package keeps both levers."""
    from bench.train_models import CONFIGS, random_batches

    cfg = CONFIGS["tiny"]
    batch = random_batches(cfg, torch.device("cpu"))[0]
    calls = []
    real = sketch.Dropout.forward
    monkeypatch.setattr(sketch.Dropout, "forward", lambda s, x: calls.append(1) or real(s, x))
    fused = []
    real_kl = training.generator_kl
    monkeypatch.setattr(training, "generator_kl", lambda *a: fused.append(1) or real_kl(*a))
    seen = {}
    for name in sketch.VARIANTS:
        calls.clear()
        fused.clear()
        _, step, _ = sketch.build(name, cfg, torch.device("cpu"))
        step(batch)
        seen[name] = (bool(calls), bool(fused))
    assert seen == {"package": (True, True), "float_dropout": (False, True),
                    "unfused_loss": (True, False), "neither": (False, False)}


def test_sketch_runs_tiny_and_writes_its_record(tmp_path):
    out = tmp_path / "results.json"
    sketch.main(["--configs", "tiny", "--repeats", "1", "--out", str(out)])
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["git_commit"] and data["machine"]["cpu_model"]
    rows = data["configs"]["tiny"]["variants"]
    assert set(rows) == set(sketch.VARIANTS)
    for row in rows.values():
        assert len(row["seconds_all"]) == 1 and row["seconds_median"] > 0
        assert 0 < row["mfu_fp32"] and row["package_speedup"] > 0
    check = data["configs"]["tiny"]["fused_loss_check"]
    assert check["max_abs_grad_diff"] <= 1e-4 * check["max_abs_grad"]


def test_the_sketch_reference_is_the_step_chapter_9_times():
    """The sketch builds its own optimizer (a variant may wrap the criterion); its
    "package" variant must still be the benchmark's ours_fp32 step: from the same weights and
    random draws, one step gives the same loss and the same updated weights."""
    from bench.train_models import CONFIGS, random_batches
    from bench.train_steps import build_variant

    cfg = CONFIGS["tiny"]
    batch = random_batches(cfg, torch.device("cpu"))[0]
    results = []
    for build in (lambda: build_variant("ours_fp32", cfg, torch.device("cpu"))[:2],
                  lambda: sketch.build("package", cfg, torch.device("cpu"))[:2]):
        model, step = build()
        torch.manual_seed(1)  # the same dropout masks
        loss = step(batch)
        results.append((loss, [p.detach().clone() for p in model.parameters()]))
    (loss_a, params_a), (loss_b, params_b) = results
    assert loss_a == loss_b
    assert len(params_a) == len(params_b)
    for a, b in zip(params_a, params_b):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
