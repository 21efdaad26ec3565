"""Tests of transformer_lib.translation.checkpoint: round trips, resuming, atomicity, no pickle."""

from __future__ import annotations

import json
import math
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from torch import nn
from torch.testing import assert_close

from transformer_lib.translation import checkpoint as ckpt
from transformer_lib.translation.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

V, D = 11, 6


class TiedLM(nn.Module):
    """A tiny model with the paper's weight tying (section 3.4) and a buffer."""

    def __init__(self, vocab: int = V, d: int = D, dropout: float = 0.3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.drop = nn.Dropout(dropout)
        self.proj = nn.Linear(d, vocab)
        self.proj.weight = self.emb.weight  # one tensor under two names
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.proj(self.drop(self.norm(self.emb(x))))


def _training(model, steps=3):
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return opt, sched


def _step(model, opt, sched):
    x = torch.randint(0, V, (4, 5))  # data drawn from the global RNG, as a shuffle would
    loss = nn.functional.cross_entropy(model(x).reshape(-1, V), x.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    return loss.item()


def _assert_same_state(a: nn.Module, b: nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


def _dir_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ----------------------------------------------------------------------------- round trips


def test_weights_round_trip_with_tied_embeddings(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    model(torch.tensor([[1, 2]]))  # buffer becomes 1
    save_checkpoint(tmp_path / "c", model, {"d_model": D, "betas": (0.9, 0.98)})
    with safe_open(str(tmp_path / "c" / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
        aliases = json.loads(f.metadata()["aliases"])
    assert len(stored) == len(model.state_dict()) - 1  # the tied weight is stored once
    assert {k: v for k, v in aliases.items()} in (
        {"proj.weight": "emb.weight"},
        {"emb.weight": "proj.weight"},
    )
    torch.manual_seed(1)
    fresh = TiedLM()
    info = load_checkpoint(tmp_path / "c", fresh)
    _assert_same_state(model, fresh)
    assert fresh.proj.weight is fresh.emb.weight  # still tied after loading
    assert info["config"] == {"d_model": D, "betas": [0.9, 0.98]}  # JSON: tuples become lists
    assert info["tokenizer"] is None and info["path"] == tmp_path / "c"


def test_config_only_and_map_location(tmp_path):
    save_checkpoint(tmp_path / "c", TiedLM(), {"a": 1})
    info = load_checkpoint(tmp_path / "c", map_location=torch.device("cpu"))
    assert info["config"] == {"a": 1} and info["train_state"] is None


def test_training_resumes_exactly(tmp_path):
    """Save after 3 steps, continue 3 more; a restored run must produce identical weights."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = TiedLM()
    opt, sched = _training(model)
    for _ in range(3):
        _step(model, opt, sched)
    save_checkpoint(
        tmp_path / "c",
        model,
        {},
        optimizer=opt,
        scheduler=sched,
        train_state={"step": 3, "epoch": 0, "loss": 1.5},
    )
    losses = [_step(model, opt, sched) for _ in range(3)]
    draws = (random.random(), float(np.random.rand()))

    torch.manual_seed(123)  # a different process state: nothing carries over but the files
    random.seed(123)
    np.random.seed(123)
    resumed = TiedLM()
    r_opt, r_sched = _training(resumed)
    info = load_checkpoint(tmp_path / "c", resumed, r_opt, r_sched, restore_rng=True)
    assert info["train_state"] == {"step": 3, "epoch": 0, "loss": 1.5}
    assert r_sched.last_epoch == 3 and r_sched.get_last_lr() == pytest.approx([0.01 / 4])
    resumed_losses = [_step(resumed, r_opt, r_sched) for _ in range(3)]
    assert resumed_losses == losses  # same dropout masks, same data, same updates
    assert (random.random(), float(np.random.rand())) == draws
    _assert_same_state(model, resumed)
    for pa, pb in zip(opt.state.values(), r_opt.state.values()):
        for k in pa:
            assert_close(pa[k], pb[k], rtol=0, atol=0)


def test_rng_state_round_trip(tmp_path):
    torch.manual_seed(5)
    save_checkpoint(tmp_path / "c", TiedLM(), {})
    expected = (torch.rand(4), random.random(), np.random.rand(3))
    torch.manual_seed(9)
    random.seed(9)
    np.random.seed(9)
    info = load_checkpoint(tmp_path / "c", restore_rng=True)
    assert info["rng"][0]["torch"].dtype == torch.uint8
    assert isinstance(info["rng"][0]["python"], tuple)  # exactly what random.setstate wants
    got = (torch.rand(4), random.random(), np.random.rand(3))
    assert_close(got[0], expected[0], rtol=0, atol=0)
    assert got[1] == expected[1]
    np.testing.assert_array_equal(got[2], expected[2])
    save_checkpoint(tmp_path / "no_rng", TiedLM(), {}, rng=False)
    assert not (tmp_path / "no_rng" / "trainer.json").exists()
    with pytest.raises(ValueError, match="holds no RNG state"):
        load_checkpoint(tmp_path / "no_rng", restore_rng=True)


def test_rng_states_of_several_processes_and_the_old_single_state(tmp_path):
    """One slot holds the RNG: one state per process (rank order), or this process's alone.
    Checkpoints written when the slot held a bare state (not a list) still load and restore."""
    states = [ckpt.capture_rng_state(), ckpt.capture_rng_state()]
    info = load_checkpoint(save_checkpoint(tmp_path / "ddp", TiedLM(), {}, rng=states))
    assert len(info["rng"]) == 2 and info["extra"] is None
    torch.manual_seed(3)
    save_checkpoint(tmp_path / "old", TiedLM(), {})
    expected = torch.rand(2)
    tree_file = tmp_path / "old" / "trainer.json"
    tree = json.loads(tree_file.read_text())
    tree["rng"] = tree["rng"][0]  # the format before one state per process
    tree_file.write_text(json.dumps(tree))
    info = load_checkpoint(tmp_path / "old", restore_rng=True, verify=False)
    assert len(info["rng"]) == 1 and isinstance(info["rng"][0]["python"], tuple)
    assert_close(torch.rand(2), expected, rtol=0, atol=0)


def test_train_state_and_extra_keep_their_types(tmp_path):
    shared = torch.arange(6.0).reshape(2, 3)
    state = {
        "step": 7,
        "best": -math.inf,
        "nan": math.nan,
        "name": "ünïcode",
        "none": None,
        "pair": (1, (2.5, "x")),
        "by_id": {0: "zero", 3: [1, 2]},
        "__tensor__": "a user key that looks like a marker",
        "a/b": torch.tensor([1, 2]),
        "a": {"b": torch.tensor([3])},  # same path as "a/b": must not collide
        "t": shared,
        "t_again": shared,
        "view": shared[1],
        "array": np.arange(4, dtype=np.uint32),
        "np_scalar": np.float64(0.25),
        "history": [{"epoch": 1, "bleu": 12.5}],
    }
    save_checkpoint(tmp_path / "c", TiedLM(), {}, train_state=state, extra={"rng": [state["t"]]})
    info = load_checkpoint(tmp_path / "c")
    got = info["train_state"]
    assert got["step"] == 7 and got["best"] == -math.inf and math.isnan(got["nan"])
    assert got["name"] == "ünïcode" and got["none"] is None
    assert got["pair"] == (1, (2.5, "x"))
    assert got["by_id"] == {0: "zero", 3: [1, 2]}
    assert got["__tensor__"] == state["__tensor__"]
    assert got["a/b"].tolist() == [1, 2] and got["a"]["b"].tolist() == [3]
    assert_close(got["t"], shared)
    assert_close(got["t_again"], shared)
    assert_close(got["view"], shared[1])
    assert got["array"].dtype == np.uint32 and got["array"].tolist() == [0, 1, 2, 3]
    assert got["np_scalar"] == 0.25
    assert got["history"] == [{"epoch": 1, "bleu": 12.5}]
    assert_close(info["extra"]["rng"][0], shared)


def test_tokenizer_is_stored(tmp_path):
    from transformer_lib.translation.data import encode_text, load_tokenizer, train_tokenizer

    tok = train_tokenizer(["ein Hund", "a dog", "zwei Hunde", "two dogs"] * 3, vocab_size=280)
    info = load_checkpoint(save_checkpoint(tmp_path / "c", TiedLM(), {}, tokenizer=tok))
    assert info["tokenizer"] == tmp_path / "c" / "tokenizer.json"
    assert encode_text(load_tokenizer(info["tokenizer"]), "zwei dogs") == encode_text(
        tok, "zwei dogs")
    save_checkpoint(tmp_path / "d", TiedLM(), {}, tokenizer=info["tokenizer"])  # from a path
    assert (tmp_path / "d" / "tokenizer.json").read_bytes() == info["tokenizer"].read_bytes()


def test_unsupported_values_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError, match=r"cannot store object at 'extra/callback'"):
        save_checkpoint(tmp_path / "c", TiedLM(), {}, extra={"callback": object()})
    with pytest.raises(TypeError, match="config must be a JSON-serializable dict"):
        save_checkpoint(tmp_path / "c", TiedLM(), {"device": torch.device("cpu")})
    assert _dir_entries(tmp_path) == []


# ----------------------------------------------------------------------------- no pickle


def test_only_safetensors_and_json_are_written(tmp_path):
    model = TiedLM()
    opt, sched = _training(model)
    _step(model, opt, sched)
    save_checkpoint(tmp_path / "c", model, {"x": 1}, optimizer=opt, scheduler=sched)
    files = _dir_entries(tmp_path / "c")
    assert files == [
        "config.json",
        "manifest.json",
        "model.safetensors",
        "trainer.json",
        "trainer.safetensors",
    ]
    for name in files:  # each file parses as what its name says: JSON, or safetensors
        blob = (tmp_path / "c" / name).read_bytes()
        if name.endswith(".json"):
            json.loads(blob)
        else:  # 8-byte little-endian header size, a JSON header, then raw tensor bytes
            size = int.from_bytes(blob[:8], "little")
            header = json.loads(blob[8 : 8 + size])
            end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
            assert 8 + size + end == len(blob)


def test_loading_never_unpickles(tmp_path, monkeypatch):
    model = TiedLM()
    opt, sched = _training(model)
    _step(model, opt, sched)
    save_checkpoint(tmp_path / "c", model, {}, optimizer=opt, scheduler=sched, train_state={})

    def forbidden(*args, **kwargs):
        raise AssertionError("unpickling attempted")

    for mod, name in [(pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")]:
        monkeypatch.setattr(mod, name, forbidden)
    fresh = TiedLM()
    f_opt, f_sched = _training(fresh)
    load_checkpoint(tmp_path / "c", fresh, f_opt, f_sched, restore_rng=True)
    average_checkpoints([tmp_path / "c", tmp_path / "c"])
    _assert_same_state(model, fresh)


# ----------------------------------------------------------------------------- atomicity


def test_replacing_a_checkpoint_leaves_no_debris(tmp_path):
    a, b = TiedLM(), TiedLM()
    save_checkpoint(tmp_path / "c", a, {"v": 1})
    save_checkpoint(tmp_path / "c", b, {"v": 2})
    fresh = TiedLM()
    assert load_checkpoint(tmp_path / "c", fresh)["config"] == {"v": 2}
    _assert_same_state(b, fresh)
    assert _dir_entries(tmp_path) == ["c"]


@pytest.mark.parametrize("target", ["_write_json", "_write_tensors"])
def test_crash_while_writing_keeps_the_old_checkpoint(tmp_path, monkeypatch, target):
    old = TiedLM()
    save_checkpoint(tmp_path / "c", old, {"v": 1})
    real = getattr(ckpt, target)
    calls = []

    def crash_on_second_call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # some files are already written when it fails
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt, target, crash_on_second_call)
    model = TiedLM()
    opt, sched = _training(model)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path / "c", model, {"v": 2}, optimizer=opt, train_state={"s": 1})
    assert _dir_entries(tmp_path) == ["c"]  # no temporary directory leaked
    fresh = TiedLM()
    assert load_checkpoint(tmp_path / "c", fresh)["config"] == {"v": 1}  # verified intact
    _assert_same_state(old, fresh)
    with pytest.raises(OSError, match="disk full"):  # a first save fails cleanly too
        calls.clear()
        save_checkpoint(tmp_path / "new", model, {}, train_state={"s": 1})
    assert _dir_entries(tmp_path) == ["c"]


def test_failed_swap_puts_the_old_checkpoint_back(tmp_path, monkeypatch):
    old = TiedLM()
    save_checkpoint(tmp_path / "c", old, {"v": 1})
    real_rename = ckpt.os.rename

    def rename(src, dst):
        if Path(src).name.startswith(".c.tmp-"):
            raise OSError("rename failed")
        return real_rename(src, dst)

    monkeypatch.setattr(ckpt.os, "rename", rename)
    with pytest.raises(OSError, match="rename failed"):
        save_checkpoint(tmp_path / "c", TiedLM(), {"v": 2})
    monkeypatch.undo()
    assert _dir_entries(tmp_path) == ["c"]
    fresh = TiedLM()
    assert load_checkpoint(tmp_path / "c", fresh)["config"] == {"v": 1}
    _assert_same_state(old, fresh)


# ----------------------------------------------------------------------------- bad input


def test_missing_and_foreign_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory .*nope not found"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="plain is not a checkpoint: manifest.json is missing"):
        load_checkpoint(tmp_path / "plain")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="path must be a checkpoint directory"):
        save_checkpoint(tmp_path / "file", TiedLM(), {})


def test_tampered_files_are_detected(tmp_path):
    model = TiedLM()
    opt, sched = _training(model)
    _step(model, opt, sched)
    save_checkpoint(tmp_path / "c", model, {"v": 1}, optimizer=opt, train_state={"step": 1})
    trainer_json = tmp_path / "c" / "trainer.json"
    text = trainer_json.read_text()
    trainer_json.write_text(text.replace('"step": 1', '"step": 2'))
    with pytest.raises(ValueError, match=r"trainer\.json is corrupt: SHA-256 expected"):
        load_checkpoint(tmp_path / "c")
    trainer_json.write_text(text[: len(text) // 2])  # truncated
    with pytest.raises(ValueError, match=r"trainer\.json is not valid JSON"):
        load_checkpoint(tmp_path / "c", verify=False)
    trainer_json.write_text(text.replace('"__tensor__": "optimizer/', '"__tensor__": "gone/'))
    with pytest.raises(ValueError, match="refers to tensor 'gone/.*which is not stored"):
        load_checkpoint(tmp_path / "c", TiedLM(), _training(TiedLM())[0], verify=False)

    weights = tmp_path / "c" / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-3] ^= 0xFF  # one flipped bit pattern in the tensor data
    weights.write_bytes(bytes(blob))
    with pytest.raises(ValueError, match=r"model\.safetensors is corrupt"):
        load_checkpoint(tmp_path / "c", TiedLM())
    weights.write_bytes(bytes(blob[:20]))
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors"):
        load_checkpoint(tmp_path / "c", TiedLM(), verify=False)
    (tmp_path / "c" / "manifest.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="is not a transformer_lib.checkpoint manifest"):
        load_checkpoint(tmp_path / "c")


def test_mismatched_models_name_the_parameters(tmp_path):
    save_checkpoint(tmp_path / "c", TiedLM(), {})
    with pytest.raises(ValueError, match=r"shape mismatch: \['emb\.weight: checkpoint \(11, 6\) "):
        load_checkpoint(tmp_path / "c", TiedLM(vocab=12))
    bigger = TiedLM()
    bigger.extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"missing from the checkpoint: \['extra\.bias', 'extra"):
        load_checkpoint(tmp_path / "c", bigger)
    smaller = nn.Sequential()
    with pytest.raises(ValueError, match=r"not in the model: \['calls', 'emb\.weight'"):
        load_checkpoint(tmp_path / "c", smaller)
    opt = torch.optim.SGD(TiedLM().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_checkpoint(tmp_path / "c", optimizer=opt)


# ----------------------------------------------------------------------------- averaging


def test_average_equals_the_manual_mean(tmp_path):
    models = []
    for i in range(3):
        torch.manual_seed(i)
        m = TiedLM()
        m.calls.fill_(10 + i)
        models.append(m)
        save_checkpoint(tmp_path / f"epoch_{i}", m, {})
    avg = average_checkpoints([tmp_path / f"epoch_{i}" for i in range(3)])
    for name, t in avg.items():
        stacked = torch.stack([m.state_dict()[name] for m in models])
        if t.is_floating_point():
            assert_close(t, stacked.mean(0))
    assert avg["calls"].item() == 12  # integer buffers: the last checkpoint's value
    assert avg["proj.weight"] is avg["emb.weight"]
    fresh = TiedLM()
    fresh.load_state_dict(avg, strict=True)


def test_average_of_bf16_accumulates_in_float32(tmp_path):
    values = [1.0, 1.0 + 2**-7, 1.0 + 2**-7]  # bf16 has 8 significant bits
    paths = []
    for i, v in enumerate(values):
        m = TiedLM().to(torch.bfloat16)
        with torch.no_grad():
            m.norm.weight.fill_(v)
        paths.append(save_checkpoint(tmp_path / f"c{i}", m, {}))
    avg = average_checkpoints(paths)
    assert avg["norm.weight"].dtype == torch.bfloat16
    exact = torch.tensor(sum(values) / 3, dtype=torch.float32).to(torch.bfloat16)
    assert torch.equal(avg["norm.weight"], torch.full((D,), exact.item(), dtype=torch.bfloat16))


def test_average_holds_one_checkpoint_at_a_time_besides_the_first(tmp_path, monkeypatch):
    """Averaging read every checkpoint before summing: 20 copies of a model for
    average_last = 20 (the second probe). Now, when a checkpoint is read, at most the first
    and the one before it are alive, and the result is the exact mean still."""
    import gc
    import weakref

    from transformer_lib.translation import checkpoint

    paths, models = [], []
    for i in range(5):
        torch.manual_seed(i)
        models.append(TiedLM())
        paths.append(save_checkpoint(tmp_path / f"epoch_{i}", models[-1], {}))
    alive: list[weakref.ref] = []
    most = 0
    real = checkpoint._model_state

    def watched(*args, **kwargs):
        nonlocal most
        gc.collect()
        most = max(most, sum(r() is not None for r in alive))
        state = real(*args, **kwargs)
        alive.append(weakref.ref(state["norm.weight"]))
        return state

    monkeypatch.setattr(checkpoint, "_model_state", watched)
    avg = average_checkpoints(paths)
    assert most <= 2
    mean = torch.stack([m.state_dict()["emb.weight"] for m in models]).mean(0)
    assert_close(avg["emb.weight"], mean)


def test_average_errors(tmp_path):
    with pytest.raises(ValueError, match="paths must name at least one checkpoint"):
        average_checkpoints([])
    save_checkpoint(tmp_path / "a", TiedLM(), {})
    save_checkpoint(tmp_path / "b", TiedLM(vocab=12), {})
    with pytest.raises(ValueError, match=r"differs in shape from .*a for \['emb\.weight"):
        average_checkpoints([tmp_path / "a", tmp_path / "b"])
