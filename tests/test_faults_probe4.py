"""Faults found by the fourth probe of the package: each test failed before its fix.

D1: ``evaluate --output`` renamed its result over whatever was there: a symbolic link (its
target kept the old result), a FIFO, and as root ``/dev/null`` itself; as a normal user
``/dev/null`` was "cannot be written". D5: an output that could not be replaced (another
user's file in a sticky folder) was found only after the whole evaluation, and the score was
never printed.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
import torch

from transformer_lib.translation import _output, cli, inference

FAKE = {"device": "cpu", "score_line": "BLEU = 12.3 (fake)", "signature": "nrefs:1|fake",
        "bleu": 12.3}


@pytest.fixture
def evaluate(checkpoint_dir, tmp_path, monkeypatch):
    """`evaluate --src --ref --output OUT` of one pair, with a fixed score (no decoding)."""
    monkeypatch.setattr(inference, "translate_and_score", lambda *a, **k: dict(FAKE))
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\n")
    ref.write_text("A dog.\n")

    def run(output: str | Path) -> int:
        return cli.main(["evaluate", "--checkpoint", str(checkpoint_dir), "--src", str(src),
                         "--ref", str(ref), "--output", str(output)])

    return run


# ------------------------------------------------------------------ D1: links and special files


def test_output_through_a_symlink_writes_its_target_and_keeps_the_link(evaluate, tmp_path):
    target = tmp_path / "kept" / "result.json"
    target.parent.mkdir()
    target.write_text("the previous result")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert evaluate(link) == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert '"fake"' not in target.read_text() and '"bleu": 12.3' in target.read_text()
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_output_through_a_dangling_symlink_creates_its_target(evaluate, tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    assert evaluate(link) == 0
    assert link.is_symlink() and '"bleu": 12.3' in (tmp_path / "new.json").read_text()


def test_output_to_a_fifo_is_written_through_not_replaced(evaluate, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert evaluate(fifo) == 0
    reader.join(30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert b'"bleu": 12.3' in got[0]


def test_output_through_a_link_to_dev_null_leaves_both_alone(evaluate, tmp_path):
    link = tmp_path / "null.json"
    link.symlink_to(os.devnull)
    assert evaluate(link) == 0
    assert link.is_symlink() and stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.parametrize("name", ["/dev/null", "/dev/stdout", "/dev/fd/1"])
def test_dev_null_and_stdout_are_written_through_never_renamed_over(name):
    # decided, not done: as root the old way replaced the machine's /dev/null
    assert _output.output_target(name) == (_output.THROUGH, Path(name))


def test_dev_null_is_writable_for_the_check(capsys):
    # was "cannot be written" (a probe file made in /dev) as a normal user
    out = _output.writable(os.devnull)
    assert out.how == _output.THROUGH
    _output.write_whole(out, "{}")  # written through: /dev/null stays a device
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_a_socket_is_refused_by_name(tmp_path):
    import socket

    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        with pytest.raises(ValueError, match=r"--output .*'.* is a socket"):
            _output.writable(str(sock_path))


# ------------------------------------------------------------------ D5: found after the work


def test_another_users_file_in_a_sticky_folder_is_refused_before_the_work(tmp_path,
                                                                          monkeypatch):
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "out.json").write_text("theirs")
    mine = os.stat(sticky / "out.json").st_uid + 4242  # a user who owns neither
    monkeypatch.setattr(os, "geteuid", lambda: mine)
    monkeypatch.setattr(os, "access", lambda *a, **k: True)  # the file is writable (0666)
    with pytest.raises(ValueError, match="belongs to another user .* sticky folder"):
        _output.writable(str(sticky / "out.json"))


def test_the_score_is_printed_even_when_the_output_fails_at_the_end(evaluate, tmp_path,
                                                                    monkeypatch, capsys):
    def refused(*a, **k):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(_output.os, "replace", refused)
    assert evaluate(tmp_path / "out.json") == 1
    out, err = capsys.readouterr()
    assert "BLEU = 12.3 (fake)" in out and "was not written" in err


# ------------------------------------------------------------------ D2: killed while averaging


def test_a_run_killed_while_averaging_writes_averaged_on_resume(tmp_path, monkeypatch, capsys):
    from _tools import tiny_config

    from transformer_lib import translation
    from transformer_lib.translation import loop

    cfg = tiny_config(epochs=2, average_last=2, keep_last=2)
    real = loop._save

    def killed(run, path, *, resumable):
        if path.name == "averaged":
            raise KeyboardInterrupt  # the kill: after both epochs and last/ were saved
        real(run, path, resumable=resumable)

    monkeypatch.setattr(loop, "_save", killed)
    with pytest.raises(KeyboardInterrupt):
        translation.train(cfg, tmp_path / "run", progress=False)
    monkeypatch.setattr(loop, "_save", real)
    assert not (tmp_path / "run" / "averaged").exists()
    result = translation.train(cfg, tmp_path / "run", resume=True, progress=False)
    assert result["complete"]
    assert "averaged was missing" in capsys.readouterr().err
    info = translation.load_checkpoint(tmp_path / "run" / "averaged")
    assert info["train_state"]["step"] == result["steps"]
    # once written, a further resume leaves it alone
    before = (tmp_path / "run" / "averaged" / "manifest.json").read_bytes()
    translation.train(cfg, tmp_path / "run", resume=True, progress=False)
    assert (tmp_path / "run" / "averaged" / "manifest.json").read_bytes() == before


# ------------------------------------------------------------------ D3: a link into a checkpoint


def test_a_run_directory_linked_into_another_runs_checkpoint_is_refused(checkpoint_dir,
                                                                        tmp_path):
    import shutil

    from _tools import file_tree, tiny_config

    from transformer_lib import translation

    last = shutil.copytree(checkpoint_dir, tmp_path / "other" / "last")
    (last / "sub").mkdir()
    (tmp_path / "link").symlink_to(last / "sub")
    before = file_tree(last)
    with pytest.raises(FileExistsError, match=r"inside the checkpoint .*other/last"):
        translation.train(tiny_config(), tmp_path / "link", progress=False)
    assert file_tree(last) == before


# ------------------------------------------------------------------ D4: save through a link


def test_save_checkpoint_through_a_symlink_replaces_the_target(tmp_path):
    from torch import nn

    from transformer_lib.translation.checkpoint import load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path / "real", nn.Linear(2, 2), {"v": 1})
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    save_checkpoint(link, nn.Linear(2, 2), {"v": 2})
    assert link.is_symlink() and load_checkpoint(tmp_path / "real")["config"] == {"v": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # no debris
    (tmp_path / "dangling").symlink_to(tmp_path / "new")
    save_checkpoint(tmp_path / "dangling", nn.Linear(2, 2), {"v": 3})
    assert load_checkpoint(tmp_path / "dangling")["config"] == {"v": 3}
    assert (tmp_path / "dangling").is_symlink()


# ------------------------------------------------------------------ U1: a model too large to build


@pytest.mark.parametrize("change", [{"max_positions": 100_000_000, "positional": "learned"},
                                    {"max_positions": 100_000_000}, {"N": 1_000_000},
                                    {"d_model": 2**20}])
def test_training_refuses_a_model_too_large_before_building_it(tmp_path, change):
    import time

    from _tools import tiny_config

    from transformer_lib import translation

    cfg = tiny_config(**change)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"config: N = .*max_positions = .* describe a model "
                                         r"of [\d,]+ parameters .* more than MAX_PARAMS"):
        translation.train(cfg, tmp_path / "run", progress=False)
    assert time.perf_counter() - t0 < 10 and not (tmp_path / "run").exists()


# ------------------------------------------------------------------ U2: one enormous line


def test_evaluate_refuses_a_reference_line_longer_than_a_sentence(tmp_path, monkeypatch,
                                                                  capsys):
    def no_work(*a, **k):
        raise AssertionError("scored a 3 MB line")

    monkeypatch.setattr(inference, "translate_and_score", no_work)
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\nZwei.\n")
    ref.write_text("A dog.\n" + "word " * 600_000 + "\n")
    status = cli.main(["evaluate", "--src", str(src), "--ref", str(ref)])
    assert status == 1
    assert f"--ref '{ref}': line 2 is longer than 65,536 bytes" in capsys.readouterr().err


def test_a_line_of_the_longest_length_with_crlf_is_read(tmp_path):
    path = tmp_path / "ref.en"
    path.write_bytes(b"a" * cli.MAX_LINE_BYTES + b"\r\nb\n")
    lines, count = cli._read_lines(str(path), "--ref", None)
    assert count == 2 and lines[0] == "a" * cli.MAX_LINE_BYTES and lines[1] == "b"


# ------------------------------------------------------------------ U3: a crafted trainer state


@pytest.fixture(scope="module")
def resumable(tmp_path_factory):
    """A run stopped after its first checkpoint (tiny, seconds): RUN/last is resumable."""
    from _tools import tiny_config

    from transformer_lib import translation

    run = tmp_path_factory.mktemp("resumable") / "run"
    translation.train(tiny_config(), run, progress=False)
    return run


def _reseal(ckpt: Path) -> None:
    import hashlib
    import json

    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        data = (ckpt / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(),
                                   "bytes": len(data)}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _crafted(resumable: Path, dest: Path, tree=None, tensors=None) -> Path:
    """A copy of the run whose last/trainer.json (`tree(obj)`) or trainer.safetensors
    (`tensors(dict)`) was changed and re-sealed: what the loader sees is consistent."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    run = Path(shutil.copytree(resumable, dest))
    last = run / "last"
    if tree is not None:
        obj = json.loads((last / "trainer.json").read_text())
        (last / "trainer.json").write_text(json.dumps(tree(obj)))
    if tensors is not None:
        loaded = load_file(last / "trainer.safetensors")
        save_file(tensors(loaded), last / "trainer.safetensors", metadata={"format": "pt"})
    _reseal(last)
    return run


def test_adam_moments_of_the_wrong_shape_are_refused_not_a_crash(resumable, tmp_path):
    import subprocess
    import sys

    def shrink(t):
        name = next(k for k in t if k.endswith("exp_avg") and t[k].dim() == 2)
        t[name] = t[name][:1].contiguous()
        return t

    run = _crafted(resumable, tmp_path / "run", tensors=shrink)
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "from _tools import tiny_config\nfrom transformer_lib import translation\n"
            f"translation.train(tiny_config(epochs=2), {str(run)!r}, resume=True, "
            "progress=False)\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, timeout=300)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])  # was -11 (SIGSEGV)
    assert "ValueError: checkpoint" in proc.stderr and "its optimizer state" in proc.stderr
    assert "exp_avg is (1," in proc.stderr
    assert not (run / ".lock").exists()


def _resume(run: Path):
    from _tools import tiny_config

    from transformer_lib import translation

    return translation.train(tiny_config(epochs=2), run, resume=True, progress=False)


def _set(path: list, value):
    def change(obj):
        node = obj
        for key in path[:-1]:
            node = node[key]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return obj
    return change


@pytest.mark.parametrize("path, value, message", [
    (["rng"], KeyError, "holds no RNG state"),
    (["rng"], [{"python": [3, [1, 2], None]}], "its RNG state is not one a run saved"),
    (["rng"], ["x"], "its RNG state must be an object"),
    (["scheduler", "last_epoch"], "x", "its scheduler state .*last_epoch = 'x'"),
    (["scheduler", "step"], 5, "its scheduler state .*unknown key 'step'"),
    (["scheduler", "base_lrs"], [1.0, 2.0], "its scheduler state .*base_lrs"),
    (["optimizer", "param_groups", 0, "lr"], "fast", "its optimizer state .*lr = 'fast'"),
    (["optimizer", "param_groups", 0, "params"], [0], "must list"),
])
def test_a_crafted_trainer_state_is_refused_by_name(resumable, tmp_path, path, value, message):
    run = _crafted(resumable, tmp_path / "run", tree=_set(path, value))
    with pytest.raises(ValueError, match=f"checkpoint .*last.*{message}"):
        _resume(run)


# ------------------------------------------------------------------ W1, W2: wrong without an error


def test_a_checkpoint_of_integer_weights_is_refused(checkpoint_dir, tmp_path):
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    copy = Path(shutil.copytree(checkpoint_dir, tmp_path / "ckpt"))
    weights = load_file(copy / "model.safetensors")
    with safe_open(str(copy / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    save_file({k: v.round().to(torch.int64) if v.is_floating_point() else v
               for k, v in weights.items()}, copy / "model.safetensors", metadata=meta)
    _reseal(copy)
    with pytest.raises(ValueError, match=r"does not fit the model.*stored as torch.int64, the "
                                         r"model's weights are floating point"):
        inference.load_model(copy, device="cpu")


@pytest.mark.parametrize("beam", [1, 3])
def test_translating_with_a_nan_weight_in_memory_is_refused(checkpoint_dir, beam):
    model, tok, _ = inference.load_model(checkpoint_dir, device="cpu")
    inference.translate_sentences(model, tok, ["Ein Hund."], max_len_b=2, precision="fp32")
    with torch.no_grad():  # after a call that found every weight finite
        next(model.parameters()).view(-1)[0] = float("nan")
    with pytest.raises(ValueError, match=r"model: weights \[.*\] are not finite"):
        inference.translate_sentences(model, tok, ["Ein Hund.", "Zwei."], beam_size=beam,
                                      precision="fp32")


# ------------------------------------------------------------------ beyond the list


@pytest.mark.parametrize("name", ["manifest.json", "result.json"])
def test_output_inside_a_checkpoint_is_refused(checkpoint_dir, tmp_path, name):
    import shutil

    copy = Path(shutil.copytree(checkpoint_dir, tmp_path / "ckpt"))
    before = (copy / "manifest.json").read_bytes()
    with pytest.raises(ValueError, match="is inside the checkpoint"):
        _output.writable(str(copy / name))
    assert (copy / "manifest.json").read_bytes() == before
