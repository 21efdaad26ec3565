"""The training-step experiment's levers compute what the package computes.

``experiments/train_step_speed/sketch.py`` times two changes to the fp32 training step (dropout
masks from random bits, the generator and the loss fused in row chunks); its ratios mean
something only if the changed step trains the same function: the fused loss gives chapter 6's
loss and the same gradients, the bit mask keeps 1 - p of the entries, scaled as before.
"""

from __future__ import annotations

import json

import pytest
import torch

from experiments.train_step_speed import sketch
from transformer_lib.layers import Dropout, Generator
from transformer_lib.training import LabelSmoothing


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk", [7, 256])
def test_fused_loss_equals_generator_and_label_smoothing(monkeypatch, smoothing, chunk):
    monkeypatch.setattr(sketch, "CHUNK", chunk)  # several chunks, a short last one
    torch.manual_seed(0)
    gen, pad = Generator(16, 40).double(), 3
    ls = LabelSmoothing(40, pad, smoothing)
    h = torch.randn(50, 16, dtype=torch.double, requires_grad=True)
    target = torch.randint(0, 40, (50,))
    target[::9] = pad  # rows that count 0
    want = ls(gen(h), target)
    want.backward(torch.tensor(0.7, dtype=torch.double))
    grads = [h.grad, gen.proj.weight.grad, gen.proj.bias.grad]
    for p in (h, gen.proj.weight, gen.proj.bias):
        p.grad = None
    model = torch.nn.Module()
    model.generator = gen
    criterion = sketch.use_fused_loss(model, ls)
    got = criterion(model.generator(h), target)
    got.backward(torch.tensor(0.7, dtype=torch.double))
    torch.testing.assert_close(got, want)
    for a, b in zip([h.grad, gen.proj.weight.grad, gen.proj.bias.grad], grads):
        torch.testing.assert_close(a, b)
    # the projection stays registered under the generator's name
    assert {n for n, _ in model.named_parameters()} == {
        "generator.proj.weight",
        "generator.proj.bias",
    }


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_bit_dropout_keeps_one_minus_p_scaled(p):
    torch.manual_seed(0)
    d = Dropout(p).train()
    x = torch.randn(1000, 1000)
    y = sketch.bit_dropout(d, x)
    kept = y != 0
    assert abs(kept.double().mean().item() - (1 - p)) < 0.003
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    assert sketch.bit_dropout(d.eval(), x) is x  # evaluation: the identity
    assert sketch.bit_dropout(Dropout(0.0).train(), x) is x


def test_bit_dropout_draws_a_new_mask_each_call():
    d = Dropout(0.5).train()
    x = torch.ones(64, 64)
    assert not torch.equal(sketch.bit_dropout(d, x), sketch.bit_dropout(d, x))


def test_sketch_runs_tiny_and_writes_its_record(tmp_path):
    out = tmp_path / "results.json"
    sketch.main(["--configs", "tiny", "--repeats", "1", "--out", str(out)])
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["git_commit"] and data["machine"]["cpu_model"]
    rows = data["configs"]["tiny"]["variants"]
    assert set(rows) == set(sketch.VARIANTS)
    for row in rows.values():
        assert len(row["seconds_all"]) == 1 and row["seconds_median"] > 0
        assert 0 < row["mfu_fp32"] and row["speedup_vs_package"] > 0
    check = data["configs"]["tiny"]["fused_loss_check"]
    assert check["max_abs_grad_diff"] <= 1e-4 * check["max_abs_grad"]


def test_the_sketch_reference_is_the_step_chapter_9_times():
    """The sketch builds its own optimizer (its fused loss needs its own criterion); its
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
