"""The training command end to end on a tiny slice of Multi30k: resume, DDP, evaluate, translate.

Each run trains a 1-layer, d_model=32 model on 192 sentence pairs for a few dozen steps (seconds).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from transformer_lib import translation
from transformer_lib.model import make_model
from transformer_lib.training import rate
from transformer_lib.translation import cli, loop, rundir
from transformer_lib.translation.checkpoint import load_checkpoint
from transformer_lib.translation.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.toml"
# Small enough for seconds, large enough that an epoch has several optimizer steps.
OVERRIDES = dict(train_limit=192, val_limit=16, epochs=2, save_every=3, max_tokens=256)


def _weights(run: Path, name: str = "last") -> dict[str, torch.Tensor]:
    model, _, _ = translation.load_model(run / name)
    return model.state_dict()


def _write_toml(cfg: translation.Config, path: Path) -> Path:
    lines = []
    for key, value in dataclasses.asdict(cfg).items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (str, tuple, list)):
            value = json.dumps(list(value) if isinstance(value, tuple) else value)
        lines.append(f"{key} = {value}")
    path.write_text("\n".join(lines) + "\n")
    return path


class Interrupt(Exception):
    pass


@pytest.mark.parametrize("decay", [{}, {"weight_decay": 0.01, "decoupled_weight_decay": True}],
                         ids=["adam", "adamw"])
def test_resume_after_an_interruption_gives_the_same_weights(tmp_path, decay):
    # dropout: the RNG state matters; AdamW: two parameter groups to save and restore
    cfg = translation.load_config(TINY, **OVERRIDES, dropout=0.1, **decay)
    full = translation.train(cfg, tmp_path / "full", progress=False)
    assert full["steps"] >= 8, "the run is too short to interrupt mid-epoch"

    def stop_at(step: int) -> None:
        # Step 5 is mid-epoch and two steps after the checkpoint at step 3: those two steps are
        # lost with the "crash" and must be redone identically.
        if step == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        translation.train(cfg, tmp_path / "cut", progress=False, on_step=stop_at)
    state = load_checkpoint(tmp_path / "cut" / "last")["train_state"]
    assert state["step"] == 3 and state["epoch"] == 0
    resumed = translation.train(cfg, tmp_path / "cut", resume=True, progress=False)
    assert resumed["steps"] == full["steps"]
    assert [r["val_loss"] for r in resumed["history"]] == [r["val_loss"] for r in full["history"]]
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    for k in a:
        assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_time_limit_inside_an_epoch_keeps_the_partial_epoch_and_resumes(tmp_path):
    cfg = translation.load_config(TINY, **OVERRIDES, dropout=0.1)
    full = translation.train(cfg, tmp_path / "full", progress=False)
    # A limit of ~0 s stops training after the first optimizer step, inside epoch 1.
    cut = translation.train(dataclasses.replace(cfg, time_limit_min=1e-9), tmp_path / "cut",
                            progress=False)
    assert cut["steps"] == 1
    [record] = json.loads((tmp_path / "cut" / "history.json").read_text())
    assert record["epoch"] == 1 and 0 < record["epoch_fraction"] < 1
    assert {"val_loss", "val_bleu"} <= set(record) and cut["history"] == [record]
    assert (tmp_path / "cut" / "epoch_001").is_dir() and (tmp_path / "cut" / "best").is_dir()
    state = load_checkpoint(tmp_path / "cut" / "last")["train_state"]
    assert (state["epoch"], state["step_in_epoch"], state["history"]) == (0, 1, [])
    resumed = translation.train(cfg, tmp_path / "cut", resume=True, progress=False)
    history = json.loads((tmp_path / "cut" / "history.json").read_text())
    assert history == resumed["history"] and [r["epoch"] for r in history] == [1, 2]
    assert resumed["steps"] == full["steps"]
    assert all("epoch_fraction" not in r for r in history)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    for k in a:
        assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_resume_without_a_checkpoint_is_refused(tmp_path):
    # Issue 34: it used to start a new run, passed off as the old one (tests/test_faults_runs.py)
    cfg = translation.load_config(TINY, **OVERRIDES)
    with pytest.raises(FileNotFoundError, match="is empty, so there is nothing to resume"):
        translation.train(dataclasses.replace(cfg, epochs=1), tmp_path, resume=True,
                          progress=False)
    assert list(tmp_path.iterdir()) == []


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path):
    """torchrun --nproc_per_node=2 (each rank one micro-batch) == 1 process with accum=2."""
    cfg = translation.load_config(TINY, **OVERRIDES, average_last=0)
    config = _write_toml(cfg, tmp_path / "ddp.toml")
    assert translation.load_config(config) == cfg and cfg.accum == 1 and cfg.dropout == 0
    single = translation.train(translation.load_config(config, accum=2), tmp_path / "single",
                               progress=False)
    # One thread per process (2 cores); gloo talks over the loopback interface only.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "transformer_lib", "train", "--config", str(config),
         "--run-dir", str(tmp_path / "ddp"), "--no-progress"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp_history = json.loads((tmp_path / "ddp" / "history.json").read_text())
    assert [r["step"] for r in ddp_history] == [r["step"] for r in single["history"]]
    a, b = _weights(tmp_path / "single"), _weights(tmp_path / "ddp")
    for k in a:
        # Same updates; only the order of floating-point sums differs (all-reduce vs one process).
        x, y = a[k], b[k]
        if k.endswith("in_proj.bias"):
            # The key bias adds the same amount to every score of a query, which the softmax
            # cancels: its true gradient is 0, and what autograd returns is rounding noise that
            # Adam (eps 1e-9) scales up to full-size steps. Compare the query and value parts.
            d = x.numel() // 3
            x, y = torch.cat([x[:d], x[2 * d :]]), torch.cat([y[:d], y[2 * d :]])
        # Adam divides by sqrt(v), so an element with a tiny gradient moves by about the
        # learning rate whatever its size, and rounding differences in such gradients show up
        # as single elements off by 1e-5..3e-4 after a few dozen steps (1.3e-4 in 3 of 2,048
        # on an AVX-512 CPU). So: every element within 5e-4, and the tensor as a whole close
        # (ranks that did not share their gradients differ in every element, by far more).
        assert_close(x, y, rtol=1e-4, atol=5e-4, msg=lambda m, k=k: f"{k}: {m}")
        diff = (x - y).abs()
        assert diff.mean() < 1e-5 and (diff > 1e-4).float().mean() < 0.01, k
    for r_single, r_ddp in zip(single["history"], ddp_history):
        assert r_ddp["train_loss"] == pytest.approx(r_single["train_loss"], rel=1e-4)
        assert r_ddp["val_loss"] == pytest.approx(r_single["val_loss"], rel=1e-4)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("tiny")
    translation.train(translation.load_config(TINY, **OVERRIDES), run, progress=False)
    return run


def test_run_directory_holds_what_a_user_needs(tiny_run):
    for name in ("best", "averaged", "last", "epoch_001", "epoch_002"):
        assert (tiny_run / name / "model.safetensors").is_file(), name
        assert (tiny_run / name / "tokenizer.json").is_file(), name
    history = json.loads((tiny_run / "history.json").read_text())
    assert [r["epoch"] for r in history] == [1, 2]
    for r in history:
        assert set(r) >= {"train_loss", "val_loss", "val_bleu", "tokens", "minutes", "step"}
        assert torch.isfinite(torch.tensor([r["train_loss"], r["val_loss"]])).all()
    assert history[1]["train_loss"] < history[0]["train_loss"]


def test_a_run_records_which_code_on_which_machine_made_it(tiny_run):
    record = json.loads((tiny_run / "provenance.json").read_text())
    assert record["recorded_at"] == "start"
    assert record["commit"] == provenance()["commit"]  # this checkout's commit (or None)
    assert record["machine"]["bf16_native"] == provenance()["machine"]["bf16_native"]


def test_a_checkpoint_holds_the_rng_once_and_chapter_6s_counters(tiny_run):
    info = load_checkpoint(tiny_run / "last")
    assert info["extra"] is None and len(info["rng"]) == 1  # one process: one state, once
    state = info["train_state"]
    last = json.loads((tiny_run / "history.json").read_text())[-1]
    assert (state["step"], state["tokens"]) == (last["step"], last["tokens"])
    assert state["accum_step"] == state["step"] and state["samples"] > state["step"]  # accum 1


def test_evaluate_is_translate_and_score_on_a_split(tiny_run):
    model, tok, cfg = translation.load_model(tiny_run / "best")
    pairs = translation.load_multi30k("val", limit=4)
    scored = translation.translate_and_score(model, tok, cfg, pairs, beam_size=2)
    result = translation.evaluate(tiny_run / "best", "val", beam_size=2, limit=4)
    assert result["hypotheses"] == scored["hypotheses"] and result["split"] == "val"
    assert result["bleu"] == round(result["bleu_unrounded"], 2) == scored["bleu"]
    assert result["length_penalty"] == cfg.length_penalty


def test_averaged_checkpoint_is_the_mean_of_the_snapshots(tiny_run):
    a, b = _weights(tiny_run, "epoch_001"), _weights(tiny_run, "epoch_002")
    avg = _weights(tiny_run, "averaged")
    for k in a:
        if a[k].is_floating_point():
            assert_close(avg[k], (a[k] + b[k]) / 2, msg=k)


def test_evaluate_and_translate_commands(tiny_run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "eval.json"
    rc = cli.main(["evaluate", "--checkpoint", str(tiny_run / "best"), "--split", "val",
                   "--limit", "8", "--beam", "2", "--output", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("BLEU = ") and printed[1].startswith("nrefs:1|")
    result = json.loads(out.read_text())
    assert result["sentences"] == 8 and len(result["hypotheses"]) == 8
    assert result["signature"] == printed[1] and "tok:13a" in result["signature"]

    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund rennt.\nZwei Männer spielen.\n"))
    assert cli.main(["translate", "--checkpoint", str(tiny_run / "best"), "--beam", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    model, tok, cfg = translation.load_model(tiny_run / "best")
    assert lines == translation.translate_sentences(
        model, tok, ["Ein Hund rennt.", "Zwei Männer spielen."], beam_size=1,
        **cfg.decode_kwargs()
    )


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("d_model = 32\nlearning_rate = 3\n")
    with pytest.raises(ValueError, match="unknown key.*learning_rate"):
        translation.load_config(bad)
    with pytest.raises(ValueError, match="precision"):
        translation.load_config(TINY, precision="fp16")


def test_decoupled_weight_decay_shrinks_weight_matrices_only():
    cfg = translation.load_config(TINY, weight_decay=0.1, decoupled_weight_decay=True)
    model = cfg.build_model(50)
    cpu = torch.device("cpu")
    opt = translation.make_optimizer(cfg, model, cpu)
    assert isinstance(opt, torch.optim.AdamW)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert any(p.dim() < 2 for p in before.values())  # biases and LayerNorm gains
    # With zero gradients Adam's own step is 0, so what moves is the decay alone:
    # w <- w * (1 - lr * weight_decay) for matrices, nothing for the rest.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    for group in opt.param_groups:
        group["lr"] = 0.5
    opt.step()
    for n, p in model.named_parameters():
        shrink = 1 - 0.5 * 0.1 if p.dim() >= 2 else 1.0
        assert_close(p.detach(), before[n] * shrink, msg=n)
    # the default: Adam's coupled L2, one group of every parameter
    plain = translation.make_optimizer(translation.load_config(TINY, weight_decay=0.1), model, cpu)
    assert type(plain) is torch.optim.Adam and len(plain.param_groups) == 1
    assert plain.param_groups[0]["weight_decay"] == 0.1
    with pytest.raises(ValueError, match="decoupled_weight_decay must be true or false"):
        translation.load_config(TINY, decoupled_weight_decay="yes")


def test_linear_schedule_warms_up_like_noam_then_falls_to_zero_with_the_budget():
    state = translation.RunState()
    steps = translation.load_config(TINY, schedule="linear", max_steps=100, warmup=10)
    lr = translation.lr_multiplier(steps, state)
    peak = rate(10, steps.d_model, steps.lr_factor, 10)
    noam = translation.lr_multiplier(
        dataclasses.replace(steps, schedule="noam", cooldown=None), state)
    assert [lr(s) for s in (0, 1, 5)] == pytest.approx(
        [peak * 0.1, peak * 0.1 * 0.99, peak * 0.5 * 0.95])  # step 0 warms as 1
    assert lr(10) == pytest.approx(peak * 0.9) and lr(10) < noam(10) == pytest.approx(peak)
    assert [lr(s) for s in (55, 100, 130)] == pytest.approx([peak * 0.45, 0.0, 0.0])
    assert noam(40) == rate(40, steps.d_model, steps.lr_factor, 10)
    # a time budget: the spent fraction is read from the state as training goes
    minutes = dataclasses.replace(steps, max_steps=None, time_limit_min=2.0)
    lr = translation.lr_multiplier(minutes, state)
    assert lr(50) == pytest.approx(peak)
    state.train_seconds = 90.0  # 3/4 of two minutes
    assert lr(50) == pytest.approx(peak / 4)
    # steps and minutes together: whichever is further spent
    both = translation.lr_multiplier(dataclasses.replace(minutes, max_steps=100), state)
    assert both(10) == pytest.approx(peak / 4) and both(80) == pytest.approx(peak / 5)
    # cooldown: hold the peak, then fall over the last 40% of the budget
    hold = translation.lr_multiplier(dataclasses.replace(steps, cooldown=0.4), state)
    assert [hold(s) for s in (10, 60, 80, 100)] == pytest.approx([peak, peak, peak / 2, 0.0])
    # on "noam": the paper's decay until the last 40%, then scaled by the same falling line
    noam_cool = translation.lr_multiplier(
        dataclasses.replace(steps, schedule="noam", cooldown=0.4), state)
    assert [noam_cool(s) for s in (5, 40, 60, 80, 100)] == pytest.approx(
        [noam(5), noam(40), noam(60), noam(80) / 2, 0.0])
    assert translation.load_config(TINY).cooldown is None  # the default: no cool-down on noam
    with pytest.raises(ValueError, match=r"cooldown \(0.5\) falls to 0.*time_limit_min"):
        translation.load_config(TINY, cooldown=0.5)
    with pytest.raises(ValueError, match=r"cooldown must be None or a number in \(0, 1\]"):
        translation.load_config(TINY, schedule="linear", max_steps=5, cooldown=0)
    with pytest.raises(ValueError, match="schedule = 'linear'.*time_limit_min or max_steps"):
        translation.load_config(TINY, schedule="linear")
    with pytest.raises(ValueError, match="schedule must be one of"):
        translation.load_config(TINY, schedule="cosine", max_steps=5)


def test_linear_schedule_resumes_from_the_time_already_spent(tmp_path):
    cfg = translation.load_config(TINY, **OVERRIDES, schedule="linear", time_limit_min=30.0)
    translation.train(dataclasses.replace(cfg, epochs=1), tmp_path, progress=False)
    run = loop._setup(cfg, tmp_path, True, torch.device("cpu"), 0, 1)
    spent = run.state.train_seconds / (60 * 30.0)
    assert run.state.step > 0 and spent > 0
    peak = rate(cfg.warmup, cfg.d_model, cfg.lr_factor, cfg.warmup)
    step = run.state.step
    expected = peak * min(1.0, step / cfg.warmup) * (1 - spent)
    assert run.scheduler.lr_lambdas[0](step) == pytest.approx(expected)
    assert run.scheduler.get_last_lr()[0] == pytest.approx(expected, rel=1e-3)


def test_fast_setting_is_auto_precision_with_the_papers_dropout(tmp_path):
    cfg = translation.load_config(TINY, fast=True)  # tiny.toml says precision = "fp32": replaced
    # "auto": bf16 where the machine has it natively, else fp32 (tests below pin the machine)
    assert (cfg.fast, cfg.precision, cfg.attn_dropout, cfg.ffn_dropout) == (True, "auto", 0, 0)
    model = make_model(**dataclasses.replace(cfg, dropout=0.2).model_kwargs(50))
    layer = model.decoder.layers[0]
    assert layer.self_attn.dropout.p == layer.src_attn.dropout.p == 0.0  # attention weights
    assert layer.feed_forward.dropout.p == 0.0  # FFN hidden activations
    assert layer.sublayer[0].dropout.p == 0.2  # residual dropout stays (paper, section 5.4)
    assert model.src_embed[1].dropout.p == 0.2  # and so does the embedding dropout
    plain = translation.load_config(TINY)
    assert (plain.fast, plain.attn_dropout, plain.ffn_dropout) == (False, None, None)
    # a contradicting value next to `fast` is an error, naming both
    for precision in ("fp32", "bf16"):
        with pytest.raises(ValueError, match="fast = true means precision 'auto'"):
            translation.load_config(TINY, fast=True, precision=precision)
    in_file = tmp_path / "fast.toml"
    in_file.write_text(TINY.read_text().replace('precision = "fp32"', "fast = true"))
    assert translation.load_config(in_file).precision == "auto"
    with pytest.raises(ValueError, match="attn_dropout"):
        translation.load_config(in_file, attn_dropout=0.1)
    args = cli._parser().parse_args(["train", "--config", str(TINY), "--run", "r", "--fast"])
    assert args.fast is True


def _pin_bf16(monkeypatch, native: bool) -> None:
    """Make the CPU report native bf16 (AVX512-BF16, AMX) or not (an AVX-512 or AVX2 CPU)."""
    caps = {"architecture": "x86_64", "avx2": True, "avx512_f": True,
            "avx512_bf16": native, "amx_bf16": native}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):  # test-emulated sets it
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("native", [False, True], ids=["avx2", "bf16_native"])
def test_auto_precision_is_bf16_only_where_the_cpu_has_it(monkeypatch, native):
    _pin_bf16(monkeypatch, native)
    auto = "bf16" if native else "fp32"
    assert translation.resolve_precision("auto", "cpu") == auto
    assert translation.resolve_precision("auto", torch.device("cpu")) == auto
    assert [translation.resolve_precision(p, "cpu") for p in ("fp32", "bf16")] == ["fp32", "bf16"]
    assert translation.resolve_precision("auto", "meta") == "fp32"  # no native bf16 known there
    has = "has" if native else "has no"
    assert translation.precision_note("auto", "cpu") == \
        f"precision: {auto} (auto: this CPU {has} native bfloat16)"
    forced = translation.precision_note("bf16", "cpu")  # an explicit bf16 runs, emulated or not
    assert (forced == "precision: bf16") if native else ("so it is emulated" in forced)
    assert translation.load_config(TINY, precision="auto").precision == "auto"
    for bad in ("fp16", None, "BF16"):
        with pytest.raises(ValueError, match="precision must be 'fp32', 'bf16' or 'auto', got"):
            translation.resolve_precision(bad, "cpu")
    with pytest.raises(ValueError, match="precision must be 'fp32', 'bf16' or 'auto'"):
        translation.translate_sentences(nn.Linear(1, 1), None, ["x"], precision="half")


@pytest.mark.parametrize("native", [False, True], ids=["avx2", "bf16_native"])
def test_fast_trains_in_bf16_only_where_native_and_says_so(monkeypatch, tmp_path, capsys,
                                                           native):
    _pin_bf16(monkeypatch, native)
    used = []
    step = loop.train_step

    def spy(*args, **kwargs):
        used.append(kwargs["precision"])
        return step(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", spy)
    cfg = translation.load_config(TINY, **{**OVERRIDES, "epochs": 1}, fast=True)
    result = translation.train(cfg, tmp_path / "run", progress=True)
    want = "bf16" if native else "fp32"
    assert set(used) == {want} and result["precision"] == want
    assert [r["precision"] for r in result["history"]] == [want]
    # the config records the order; what it resolved to is in the history
    assert json.loads((tmp_path / "run" / "config.json").read_text())["precision"] == "auto"
    notes = [line for line in capsys.readouterr().err.splitlines()
             if line.startswith("precision: ")]
    if native:
        assert notes == ["precision: bf16 (auto: this CPU has native bfloat16)"]
    else:
        assert len(notes) == 1 and notes[0].startswith("precision: fp32 (fast: this CPU has no "
                                                       "native bfloat16")
        assert "paper's dropout placement" in notes[0]


def test_a_run_resumed_on_the_other_kind_of_cpu_resolves_auto_again(monkeypatch, tmp_path):
    """"auto" (and fast) is an order for the machine that runs: a run started where bf16 is
    native continues in fp32 on an AVX2 CPU (weights and Adam state are fp32 either way), and
    the other way round; each epoch's record names its precision."""
    cfg = translation.load_config(TINY, **{**OVERRIDES, "epochs": 1}, fast=True)
    _pin_bf16(monkeypatch, True)
    translation.train(cfg, tmp_path, progress=False)
    _pin_bf16(monkeypatch, False)
    out = translation.train(dataclasses.replace(cfg, epochs=2), tmp_path, resume=True,
                            progress=False)
    assert [r["precision"] for r in out["history"]] == ["bf16", "fp32"]
    _pin_bf16(monkeypatch, True)
    out = translation.train(dataclasses.replace(cfg, epochs=3), tmp_path, resume=True,
                            progress=False)
    assert [r["precision"] for r in out["history"]] == ["bf16", "fp32", "bf16"]
    # A fast run saved while fast meant "bf16" resumes as "auto" (what fast means now) ...
    old = {**dataclasses.asdict(cfg), "precision": "bf16"}
    rundir.check_same_config(cfg, old, tmp_path)
    # ... but an explicit precision stays part of the run's definition.
    plain = translation.load_config(TINY, precision="auto")
    with pytest.raises(ValueError, match="precision: 'bf16' in the run, 'auto' now"):
        rundir.check_same_config(plain, {**dataclasses.asdict(plain), "precision": "bf16"},
                                       tmp_path)


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_committed_config_loads(path):
    """Every key the file sets reaches the Config with the file's value ([data], [model] …
    only group keys, so a key set in two tables would silently keep the last one), and the
    command line in the file's comments trains this very file."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    text = path.read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    written: dict = {}
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    for table in (top, *(v for v in raw.values() if isinstance(v, dict))):
        assert not written.keys() & table.keys(), f"set twice: {written.keys() & table.keys()}"
        written.update(table)
    assert written, "an empty config"
    cfg = dataclasses.asdict(translation.load_config(path))
    assert json.loads(json.dumps({k: cfg[k] for k in written})) == written  # tuples as lists
    words = text.split()
    named = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--config"]
    assert all(ROOT / name == path for name in named), named


TTQ = ROOT / "experiments" / "time_to_quality"
TTQ_CONFIGS = sorted((TTQ / "configs").glob("*.toml"))


def _listed(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", TTQ_CONFIGS, ids=lambda p: p.stem)
def test_an_experiment_config_differs_from_its_parent_in_what_it_lists(path):
    """experiments/*/configs: `base` resolves, and the run changes exactly the keys it lists
    (``fast`` also sets the keys of FAST)."""
    raw = _listed(path)
    parent = (path.parent / raw.pop("base")).resolve()
    assert parent.is_file() and raw, "a parent, and at least one change"
    child = dataclasses.asdict(translation.load_config(path))
    base = dataclasses.asdict(translation.load_config(parent))
    changed = {k for k in child if child[k] != base[k]}
    implied = set(translation.FAST) if "fast" in raw else set()
    if raw.get("schedule") == "linear":  # with no cooldown, "linear" falls over the budget
        implied.add("cooldown")
    assert set(raw) <= changed <= set(raw) | implied
    assert all(child[k] == v for k, v in raw.items() if not isinstance(v, list))


def test_a_missing_or_circular_base_is_a_clear_error(tmp_path):
    (tmp_path / "a.toml").write_text('base = "b.toml"\nseed = 2\n')
    (tmp_path / "b.toml").write_text('base = "a.toml"\nseed = 3\n')
    with pytest.raises(ValueError, match="cycle"):
        translation.load_config(tmp_path / "a.toml")
    (tmp_path / "c.toml").write_text('base = "nowhere.toml"\n')
    with pytest.raises(ValueError, match="nowhere.toml.*does not exist"):
        translation.load_config(tmp_path / "c.toml")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "d.toml").write_text('base = "../tiny.toml"\nfast = true\n')
    (tmp_path / "tiny.toml").write_text(TINY.read_text(encoding="utf-8"))
    cfg = translation.load_config(tmp_path / "runs" / "d.toml")  # relative to the file;
    # and fast replaces the parent's precision, as an override would
    assert cfg.fast and cfg.precision == "auto" and cfg.N == 1


def test_the_time_to_quality_summary_is_fresh_and_has_a_row_per_run():
    summarize = _tool(TTQ / "summarize.py")
    assert summarize.main(["--check"]) == 0, "run experiments/time_to_quality/summarize.py"
    rows = json.loads((TTQ / "summary.json").read_text(encoding="utf-8"))["rows"]
    assert sorted(r["run"] for r in rows) == sorted(p.stem for p in TTQ_CONFIGS)
    assert sorted(p.stem for p in (TTQ / "results").glob("*.json")) == sorted(
        p.stem for p in TTQ_CONFIGS)


def _tool(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", TTQ_CONFIGS, ids=lambda p: p.stem)
def test_time_to_quality_results_are_chosen_on_validation_and_match_their_configs(path):
    """experiments/time_to_quality/results: the config, its commit, the system it reports."""
    name = path.stem
    r = json.loads((TTQ / "results" / f"{name}.json").read_text(encoding="utf-8"))
    minutes, schedule = r["time_limit_minutes"], r["config"]["schedule"]
    # the command recorded names the config where it was then
    assert f"configs/multi30k_{name}.toml" in r["command"]
    expected = json.loads(json.dumps(dataclasses.asdict(translation.load_config(path))))
    default = json.loads(json.dumps(dataclasses.asdict(translation.Config(
        schedule=schedule, time_limit_min=minutes))))
    recorded = dict(r["config"])
    if recorded.get("fast"):  # saved when fast meant "bf16" (what "auto" is there); now "auto"
        recorded["precision"] = "auto"
    # keys added to Config after the run have their defaults in the config file
    assert {k: expected[k] for k in recorded} == recorded
    assert all(expected[k] == default[k] for k in expected.keys() - r["config"].keys())
    assert expected["time_limit_min"] == minutes and schedule in ("linear", "noam")
    # the reported system won on validation (beam search), not on test
    sel = r["selection"]
    assert sel["on"] == "val" and set(sel["bleu"]) == {"best", "averaged", "last"}
    at_config_alpha = f"{max(sel['bleu'], key=sel['bleu'].get)}_beam{sel['beam_size']}"
    system, n_scores = at_config_alpha, 6
    if "length_penalty" in r:  # alpha chosen with the checkpoint, on validation too
        lp = r["length_penalty"]
        grid = lp["grid"]  # checkpoint -> alpha (a JSON key) -> validation BLEU
        assert lp["config"] == r["config"]["length_penalty"]
        assert {c: g[str(float(lp["config"]))] for c, g in grid.items()} == sel["bleu"]
        assert grid[lp["checkpoint"]][str(float(lp["chosen"]))] == max(
            v for g in grid.values() for v in g.values())
        if lp["chosen"] != lp["config"]:
            system = f"{lp['checkpoint']}_beam{sel['beam_size']}_alpha{lp['chosen']:g}"
            n_scores = 9
    assert r["system"] == system and at_config_alpha in r["scores"]
    assert r["bleu"] == r["scores"][r["system"]]["bleu"]
    if "bleu_unrounded" in r:  # recorded since the fifth hour
        assert round(r["bleu_unrounded"], 2) == r["bleu"]
    assert len(r["scores"]) == n_scores and r["signature"].startswith("nrefs:1|case:mixed")
    # training stopped at its limit; the whole command's wall time (data, BPE, the last
    # validation, averaging) is recorded beside it, as the chapter's table shows
    assert r["history"][-1]["minutes"] <= minutes + 0.5
    assert minutes <= r["wall_minutes_total"] <= minutes + 2
    assert len(r["commit"]) >= 7 and r["commit"] in r["note"]
    assert all({"minutes", "val_loss", "val_bleu"} <= set(h) for h in r["history"])
