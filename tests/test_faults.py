"""The faults of issue 14 and of our own adversarial pass: each test failed before its fix.

Kills, corrupt files, crafted configs, concurrent writers and bad input (servers that hang or
trickle: tests/test_download.py). The training runs are tiny (64 sentence pairs, one epoch,
d_model = 32): seconds each.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from _tools import TINY, checkpoint_with_config, tiny_config

from transformer_lib import translation
from transformer_lib.model import make_model
from transformer_lib.translation import _fileio, data
from transformer_lib.translation._fileio import FileLock, LockHeld, sha256_file
from transformer_lib.translation.checkpoint import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(
    not all((data.default_data_dir() / f).is_file() for f in data.SHA256),
    reason="the Multi30k files are not available (set MULTI30K_DIR or run data.download())",
)


def _holder(lock: Path, ready: Path) -> subprocess.Popen:
    """A process that takes `lock` and sleeps until killed."""
    code = (
        "import sys, time, pathlib; from transformer_lib.translation._fileio import FileLock\n"
        f"l = FileLock({str(lock)!r}, what='x').acquire()\n"
        f"pathlib.Path({str(ready)!r}).write_text('ok'); time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    for _ in range(600):
        if ready.exists():
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("lock holder did not start")


# ------------------------------------------------------------------ 1. locks and concurrent saves


def test_a_run_directory_in_use_is_refused_naming_the_owner(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = _holder(run / ".lock", tmp_path / "ready")
    try:
        with pytest.raises(LockHeld, match=rf"in use by process {holder.pid} on host .*delete"):
            translation.train(tiny_config(), run, progress=False)
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing else written
    finally:
        holder.kill()
        holder.wait()
    # The holder was killed: its lock is stale on this host and is taken over.
    out = translation.train(tiny_config(), run, progress=False)
    assert out["steps"] > 0 and not (run / ".lock").exists()


def test_file_lock_waits_then_names_the_holder_and_is_released(tmp_path):
    lock = tmp_path / "x.lock"
    with FileLock(lock, what="thing"):
        t0 = time.monotonic()
        with pytest.raises(LockHeld, match=rf"thing is in use by process {os.getpid()}"):
            FileLock(lock, what="thing", wait=0.2).acquire()
        assert time.monotonic() - t0 >= 0.2
    assert not lock.exists()
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "token": "t"}))
    with pytest.raises(LockHeld, match="host elsewhere.*delete the lock file"):
        FileLock(lock, what="thing").acquire()


def test_concurrent_saves_on_one_path_all_succeed(tmp_path):
    model = torch.nn.Linear(3, 3)
    errors: list[BaseException] = []

    def save(k: int) -> None:
        try:
            for _ in range(15):
                save_checkpoint(tmp_path / "c", model, {"k": k})
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=save, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert load_checkpoint(tmp_path / "c")["config"]["k"] in range(6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no debris, no lock


# ------------------------------------------------------------------ 2. crash inside the swap


def _crash_between_renames(path: Path) -> None:
    """What a kill between `rename(path, old)` and `rename(tmp, path)` leaves behind."""
    os.rename(path, path.parent / f".{path.name}.old-0123456789ab")
    # the new version, complete or not, written by a process that is gone (pid 99999999)
    (path.parent / (_fileio.tmp_prefix(path, 99999999) + "deadbeef")).mkdir()


def test_load_recovers_a_checkpoint_left_mid_swap(tmp_path):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path / "last", model, {"n": 1}, train_state={"step": 7})
    _crash_between_renames(tmp_path / "last")
    info = load_checkpoint(tmp_path / "last")
    assert info["train_state"] == {"step": 7}
    assert (tmp_path / "last" / "manifest.json").is_file()


def test_saving_removes_debris_of_crashed_saves(tmp_path):
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path / "last", model, {"n": 1})
    _crash_between_renames(tmp_path / "last")
    (tmp_path / (_fileio.tmp_prefix(tmp_path / "averaged", 99999999) + "0badf00d")).mkdir()
    (tmp_path / ".averaged.tmp-abcd1234").mkdir()  # an old-style name, two hours old
    os.utime(tmp_path / ".averaged.tmp-abcd1234", (time.time() - 7200,) * 2)
    save_checkpoint(tmp_path / "last", model, {"n": 2})
    save_checkpoint(tmp_path / "averaged", model, {"n": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["averaged", "last"]


def test_resume_after_a_crash_mid_swap_continues_from_the_saved_step(tmp_path):
    cfg = tiny_config(epochs=1)

    class Stop(Exception):
        pass

    def stop(step: int) -> None:
        if step == 3:
            raise Stop

    with pytest.raises(Stop):
        translation.train(cfg, tmp_path, progress=False, on_step=stop)
    _crash_between_renames(tmp_path / "last")
    seen: list[int] = []
    translation.train(cfg, tmp_path, resume=True, progress=False, on_step=seen.append)
    assert seen[0] == 3  # continued after step 2, not from step 0


# ------------------------------------------------------------------ 3. tokenizer verified


def test_an_edited_tokenizer_is_detected(checkpoint_dir, tmp_path):
    copy = shutil.copytree(checkpoint_dir, tmp_path / "c")
    tok_file = copy / "tokenizer.json"
    tok_file.write_text(tok_file.read_text().replace('"Hund"', '"Huhn"', 1) + " ")
    with pytest.raises(ValueError, match=r"tokenizer\.json is corrupt"):
        load_checkpoint(copy)
    with pytest.raises(ValueError, match=r"tokenizer\.json is corrupt"):
        translation.load_model(copy, torch.device("cpu"))


# ------------------------------------------------------------------ 4. divergence


def test_divergence_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    # A learning rate of ~1e29 overflows the weights within a few steps.
    cfg = tiny_config(lr_factor=1e30, warmup=1, clip_norm=None, save_every=1, epochs=2)
    with pytest.raises(FloatingPointError, match=r"diverged at step \d+.*last good checkpoint"):
        translation.train(cfg, tmp_path, progress=False)
    model, _, _ = translation.load_model(tmp_path / "last", torch.device("cpu"))
    assert all(torch.isfinite(p).all() for p in model.parameters())
    history = tmp_path / "history.json"
    assert not history.exists() or "NaN" not in history.read_text()


def test_a_checkpoint_with_nan_weights_is_refused(checkpoint_dir, tmp_path):
    model, tok, cfg = translation.load_model(checkpoint_dir, torch.device("cpu"))
    with torch.no_grad():
        next(model.parameters())[0, 0] = math.nan
    save_checkpoint(tmp_path / "nan", model, dataclasses.asdict(cfg), tokenizer=tok)
    with pytest.raises(ValueError, match="not finite"):
        translation.load_model(tmp_path / "nan", torch.device("cpu"))


# ------------------------------------------------------------------ 5, 10, 11. resuming


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """A run stopped by an exception at step 3 of epoch 1 (checkpoint at step 2)."""
    run = tmp_path_factory.mktemp("cut")

    def stop(step: int) -> None:
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        translation.train(tiny_config(), run, progress=False, on_step=stop)
    return run


def test_resume_with_a_changed_config_names_the_keys_and_writes_nothing(interrupted_run, tmp_path):
    run = shutil.copytree(interrupted_run, tmp_path / "run")
    before = (run / "config.json").read_text()
    changed = r"d_model: 32 in the run, 64 now; lr_factor: 1\.0 in the run, 2\.0 now"
    with pytest.raises(ValueError, match=changed):
        translation.train(tiny_config(lr_factor=2.0, d_model=64, h=2), run, resume=True,
                          progress=False)
    assert (run / "config.json").read_text() == before
    # epochs and the time limit may change: a longer run is a normal reason to resume
    out = translation.train(tiny_config(epochs=2, time_limit_min=30), run, resume=True,
                            progress=False)
    assert [r["epoch"] for r in out["history"]] == [1, 2]


def test_resume_of_a_missing_run_directory_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*without resume"):
        translation.train(tiny_config(), tmp_path / "nope", resume=True, progress=False)
    assert not (tmp_path / "nope").exists()


def test_a_new_run_into_an_existing_run_is_refused(interrupted_run, tmp_path):
    run = shutil.copytree(interrupted_run, tmp_path / "run")
    with pytest.raises(FileExistsError, match="already holds a run.*resume"):
        translation.train(tiny_config(), run, progress=False)


def test_resumed_epoch_loss_covers_the_whole_epoch(interrupted_run, tmp_path):
    full = translation.train(tiny_config(), tmp_path / "full", progress=False)
    run = shutil.copytree(interrupted_run, tmp_path / "run")
    resumed = translation.train(tiny_config(), run, resume=True, progress=False)
    assert resumed["history"][0]["train_loss"] == full["history"][0]["train_loss"]


# ------------------------------------------------------------------ 6. crafted config


def test_a_crafted_config_cannot_force_a_huge_allocation(checkpoint_dir, tmp_path, monkeypatch):
    copy = checkpoint_with_config(checkpoint_dir, tmp_path / "c", d_model=65536, d_ff=1 << 20,
                                  N=12, h=1)

    def no_build(**kw):
        raise AssertionError("the model was built")

    monkeypatch.setattr("transformer_lib.translation.config.make_model", no_build)
    with pytest.raises(ValueError, match=r"parameters.*max_params"):
        translation.load_model(copy, torch.device("cpu"))


def test_a_config_of_the_wrong_type_in_a_checkpoint_is_named(checkpoint_dir, tmp_path):
    copy = shutil.copytree(checkpoint_dir, tmp_path / "c")
    config = json.loads((copy / "config.json").read_text())
    config["N"] = "three"
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"N must be an integer"):
        translation.load_model(copy, torch.device("cpu"), verify=False)


# ------------------------------------------------------------------ 8, 9. numbers and config keys


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("save_every", 0, r"save_every must be an integer >= 1, got 0"),
        ("epochs", "two", r"epochs must be an integer >= 1, got 'two'"),
        ("epochs", True, r"epochs must be an integer >= 1, got True"),
        ("adam_betas", [0.9], r"adam_betas must be two numbers in \[0, 1\)"),
        ("lr_factor", -1.0, r"lr_factor must be a number > 0, got -1\.0"),
        ("dropout", 1.0, r"dropout must be a number in \[0, 1\)"),
        ("h", 3, r"h must divide d_model"),
        ("precision", "fp16", r"precision must be one of"),
        ("clip_norm", math.inf, r"clip_norm must be None or a number > 0"),
        ("vocab_size", 100, r"vocab_size must be an integer >= 260"),
        ("beam_size", 0, r"beam_size must be an integer >= 1"),
    ],
)
def test_every_config_key_is_checked_before_any_work(tmp_path, key, value, message):
    rendered = json.dumps(value) if not isinstance(value, bool) else str(value).lower()
    rendered = "inf" if isinstance(value, float) and math.isinf(value) else rendered
    lines = [line for line in TINY.read_text().splitlines() if not line.startswith(f"{key} ")]
    toml = tmp_path / "c.toml"
    toml.write_text("\n".join([*lines, f"{key} = {rendered}"]) + "\n")
    with pytest.raises(ValueError, match=message):
        translation.load_config(toml)
    # A Config built in code is checked as well, before train() creates anything.
    with pytest.raises(ValueError, match=message):
        translation.Config(**{**dataclasses.asdict(translation.load_config(TINY)), key: value})


def test_the_old_max_len_key_is_explained(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text(TINY.read_text() + "\nmax_len = 80\n")
    with pytest.raises(ValueError, match=r"max_len.*renamed.*drop_longer_than"):
        translation.load_config(toml)


def test_bad_beam_sizes_are_value_errors(checkpoint_dir):
    model, tok, _ = translation.load_model(checkpoint_dir, torch.device("cpu"))
    for beam in (0, -1, 1.5):
        with pytest.raises(ValueError, match="beam_size must be an integer >= 1"):
            translation.translate_sentences(model, tok, ["Ein Hund."], beam_size=beam)


# ------------------------------------------------------------------ 12. input length


def test_a_sentence_over_the_input_limit_is_refused_by_index(checkpoint_dir):
    model, tok, _ = translation.load_model(checkpoint_dir, torch.device("cpu"))
    long = "Hund " * 5000
    t0 = time.perf_counter()
    with pytest.raises(ValueError,  # refused by its characters, before tokenizing (issue 34)
                       match=r"sentences\[1\] has [\d,]+ (subwords|characters).*max_input_len=256"):
        translation.translate_sentences(model, tok, ["Ein Hund.", long], max_input_len=256)
    assert time.perf_counter() - t0 < 30


def test_output_length_stays_inside_a_learned_position_table(val_tokenizer):
    tok = val_tokenizer
    cfg = dataclasses.replace(translation.load_config(TINY), positional="learned", max_positions=24)
    model = make_model(**cfg.model_kwargs(tok.get_vocab_size())).eval()
    sentence = "ein Mann"
    while len(data.encode_text(tok, sentence + " ein Mann", add_special=False)) <= 22:
        sentence += " ein Mann"
    n = len(data.encode_text(tok, sentence, add_special=False))
    assert 16 <= n <= 22  # fits the table, but may produce 1.5 * n + 10 > 24 output tokens
    [out] = translation.translate_sentences(model, tok, [sentence], max_len_a=1.5, max_len_b=10)
    assert isinstance(out, str)


@pytest.mark.parametrize(
    "changes",
    [{}, {"share_embeddings": False}, {"positional": "learned", "max_positions": 64},
     {"norm_first": False, "N": 2, "d_ff": 48}],
)
def test_parameter_count_from_the_config_matches_the_built_model(changes):
    from transformer_lib.model import count_parameters

    cfg = dataclasses.replace(translation.load_config(TINY), **changes)
    built = make_model(**cfg.model_kwargs(300))
    assert translation.parameter_count(cfg, 300) == count_parameters(built)


def test_fast_works_on_a_config_made_in_code_and_beam_size_is_the_default_beam(checkpoint_dir):
    cfg = translation.Config(fast=True)
    assert (cfg.precision, cfg.attn_dropout, cfg.ffn_dropout) == ("auto", 0.0, 0.0)
    with pytest.raises(ValueError, match="fast = true means"):
        translation.Config(fast=True, attn_dropout=0.1)
    model, tok, cfg = translation.load_model(checkpoint_dir, torch.device("cpu"))
    sentences = ["Ein Hund rennt.", "Zwei Männer."]
    assert cfg.beam_size == 2  # configs/tiny.toml
    assert translation.translate(checkpoint_dir, sentences, device=torch.device("cpu")) == \
        translation.translate_sentences(model, tok, sentences, beam_size=2, **cfg.decode_kwargs())


def test_a_run_saved_before_the_new_keys_resumes(interrupted_run, tmp_path):
    """config.json of older runs says max_len and lacks max_positions: not a config change."""
    run = shutil.copytree(interrupted_run, tmp_path / "run")
    info = load_checkpoint(run / "last", None)
    config = info["config"]
    config["max_len"] = config.pop("drop_longer_than")
    del config["max_positions"]
    (run / "last" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="corrupt"):  # the manifest notices the edit ...
        translation.train(tiny_config(), run, resume=True, progress=False)
    manifest = json.loads((run / "last" / "manifest.json").read_text())
    manifest["files"]["config.json"]["sha256"] = sha256_file(run / "last" / "config.json")
    manifest["files"]["config.json"]["bytes"] = (run / "last" / "config.json").stat().st_size
    (run / "last" / "manifest.json").write_text(json.dumps(manifest))
    # ... once re-sealed, the resume does not
    out = translation.train(tiny_config(), run, resume=True, progress=False)
    assert out["history"][0]["epoch"] == 1
