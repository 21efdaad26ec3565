"""Tracebacks and misleading errors found by the fourth probe: each test failed before its fix.

Every case is now one error naming the file or the key: config bases (a directory, "",
chains of 1,200), integers of 5,001 digits, crafted aliases and trainer trees, `last` as a
file, a damaged provenance record, save_checkpoint("") and ("."), lock files left empty, and
a start that failed half-way refusing the next one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from torch import nn

from transformer_lib.translation import _fileio, config, provenance
from transformer_lib.translation.checkpoint import load_checkpoint, save_checkpoint

# ------------------------------------------------------------------ E1: config bases


@pytest.mark.parametrize("base, message", [
    ('""', r"base must name a config file, got ''"),
    ('"sub"', r"its base 'sub' \(.*sub\) is a directory, not a config file"),
])
def test_a_base_that_is_no_file_is_named(tmp_path, base, message):
    (tmp_path / "sub").mkdir()
    (tmp_path / "c.toml").write_text(f"base = {base}\n")
    with pytest.raises(ValueError, match=message):
        config.load_config(tmp_path / "c.toml")


def test_a_chain_of_1200_bases_is_an_error_not_a_recursion_error(tmp_path):
    for i in range(1200):
        (tmp_path / f"c{i}.toml").write_text(f'base = "c{i + 1}.toml"\n')
    (tmp_path / "c1200.toml").write_text("epochs = 1\n")
    with pytest.raises(ValueError, match=r"c0.toml: its bases are chained more than 32 deep"):
        config.load_config(tmp_path / "c0.toml")
    (tmp_path / "c3.toml").write_text("epochs = 1\n")  # a short chain still reads
    assert config.load_config(tmp_path / "c0.toml").epochs == 1


def test_an_integer_of_5001_digits_names_the_file(tmp_path, checkpoint_dir):
    (tmp_path / "c.toml").write_text("epochs = " + "1" * 5001 + "\n")
    with pytest.raises(ValueError, match=r"config .*c.toml is not a valid config: Exceeds"):
        config.load_config(tmp_path / "c.toml")
    from _tools import checkpoint_with_config

    copy = checkpoint_with_config(checkpoint_dir, tmp_path / "ckpt")
    (copy / "config.json").write_text('{"epochs": ' + "1" * 5001 + "}")
    from test_faults_probe4 import _reseal

    _reseal(copy)
    with pytest.raises(ValueError, match=r"config.json is not valid JSON: Exceeds"):
        load_checkpoint(copy)


# ------------------------------------------------------------------ E2: crafted checkpoints


@pytest.mark.parametrize("aliases", ['["a"]', '"a"', '{"a": {"b": "c"}}'])
def test_crafted_aliases_metadata_is_named(tmp_path, aliases):
    from safetensors.torch import load_file, save_file
    from test_faults_probe4 import _reseal

    save_checkpoint(tmp_path / "c", nn.Linear(2, 2), {})
    weights = load_file(tmp_path / "c" / "model.safetensors")
    save_file(weights, tmp_path / "c" / "model.safetensors",
              metadata={"format": "pt", "aliases": aliases})
    _reseal(tmp_path / "c")
    with pytest.raises(ValueError, match="'aliases' metadata must map tensor names"):
        load_checkpoint(tmp_path / "c", nn.Linear(2, 2))


def _crafted_trainer(tmp_path: Path, tree) -> Path:
    from test_faults_probe4 import _reseal

    save_checkpoint(tmp_path / "c", nn.Linear(2, 2), {}, train_state={"step": 1})
    (tmp_path / "c" / "trainer.json").write_text(json.dumps(tree) if not isinstance(tree, str)
                                                 else tree)
    _reseal(tmp_path / "c")
    return tmp_path / "c"


def test_a_trainer_json_900_deep_is_named(tmp_path):
    path = _crafted_trainer(tmp_path, '{"extra": ' + "[" * 900 + "]" * 900 + "}")
    with pytest.raises(ValueError, match=r"trainer.json is corrupt: nested too deeply"):
        load_checkpoint(path)


@pytest.mark.parametrize("items", [5, "ab", [[1]], [[[1], 2]], [1, 2]])
def test_crafted_items_are_named(tmp_path, items):
    path = _crafted_trainer(tmp_path, {"extra": {"__items__": items}})
    with pytest.raises(ValueError, match=r"trainer.json: (an )?__items__"):
        load_checkpoint(path)


# ------------------------------------------------------------------ E3: save_checkpoint's path


def test_save_checkpoint_of_an_empty_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"path '' is empty"):
        save_checkpoint("", nn.Linear(2, 2), {})
    assert list(tmp_path.iterdir()) == []


def test_save_checkpoint_of_the_working_directory_is_refused(tmp_path, monkeypatch):
    save_checkpoint(tmp_path / "c", nn.Linear(2, 2), {"v": 1})
    monkeypatch.chdir(tmp_path / "c")
    for name in (".", str(tmp_path / "c"), ".."):
        with pytest.raises(ValueError, match="is the working directory or holds it"):
            save_checkpoint(name, nn.Linear(2, 2), {"v": 2})
    assert load_checkpoint(tmp_path / "c")["config"] == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


def test_save_checkpoint_of_dot_dot_elsewhere_names_it_absolutely(tmp_path, monkeypatch):
    (tmp_path / "c").mkdir()
    monkeypatch.chdir(tmp_path / "c")
    with pytest.raises(ValueError, match="working directory"):  # c itself
        save_checkpoint("missing/..", nn.Linear(2, 2), {"v": 3})
    monkeypatch.chdir(tmp_path)
    save_checkpoint("c/missing/..", nn.Linear(2, 2), {"v": 3})
    assert load_checkpoint(tmp_path / "c")["config"] == {"v": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


# ------------------------------------------------------------------ E4: run directories


def test_last_as_a_file_is_named_as_a_file(tmp_path):
    from _tools import tiny_config

    from transformer_lib import translation

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "last").write_text("not a checkpoint")
    with pytest.raises(FileNotFoundError, match=r"last is a file, not the checkpoint directory"):
        translation.train(tiny_config(), tmp_path / "run", resume=True, progress=False)


def test_a_damaged_resumes_list_is_started_over(tmp_path):
    provenance.write_provenance(tmp_path)
    record = json.loads((tmp_path / "provenance.json").read_text())
    (tmp_path / "provenance.json").write_text(json.dumps({**record, "resumes": 5}))
    provenance.write_provenance(tmp_path, resume=True)  # was TypeError: 'int' not iterable
    resumes = json.loads((tmp_path / "provenance.json").read_text())["resumes"]
    assert resumes[0] == {"damaged": "5"} and "commit" in resumes[1]


def test_a_provenance_record_of_5001_digits_is_named(tmp_path):
    (tmp_path / "provenance.json").write_text('{"commit": ' + "1" * 5001 + "}")
    with pytest.raises(ValueError, match="unreadable provenance record"):
        provenance.read_provenance(tmp_path)


def test_a_start_that_failed_writing_provenance_does_not_block_the_next(tmp_path,
                                                                        monkeypatch):
    from _tools import tiny_config

    from transformer_lib import translation
    from transformer_lib.translation import rundir

    real = rundir.write_provenance

    def full_disk(run_dir, **kw):
        raise OSError(28, "No space left on device", str(run_dir / "provenance.json"))

    monkeypatch.setattr(rundir, "write_provenance", full_disk)
    with pytest.raises(OSError):
        translation.train(tiny_config(), tmp_path / "run", progress=False)
    monkeypatch.setattr(rundir, "write_provenance", real)
    # a start that failed after provenance (config.json next) is recognized too
    monkeypatch.setattr(rundir, "replace_file", lambda *a: (_ for _ in ()).throw(OSError(28, "x")))
    with pytest.raises(OSError):
        translation.train(tiny_config(), tmp_path / "run", progress=False)
    monkeypatch.undo()
    translation.train(tiny_config(max_steps=1), tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "last").is_dir()


def test_a_tokenizer_temp_file_left_by_a_kill_does_not_block_the_next_start(tmp_path):
    from _tools import tiny_config

    from transformer_lib import translation

    run = tmp_path / "run"
    run.mkdir()
    provenance.write_provenance(run)
    (run / ".tokenizer.json.k3b_9xq2.tmp").write_text("half a tokenizer")  # mkstemp's name
    translation.train(tiny_config(max_steps=1), run, progress=False)
    assert (run / "last").is_dir()


# ------------------------------------------------------------------ E5: lock files left empty


def test_an_empty_lock_file_left_by_a_kill_is_stale_after_a_while(tmp_path):
    lock = tmp_path / ".last.lock"
    lock.write_text("")
    with pytest.raises(_fileio.LockHeld, match="unreadable"):  # fresh: maybe being written
        _fileio.FileLock(lock, what="checkpoint last").acquire()
    old = time.time() - 2 * _fileio.UNWRITTEN_STALE
    os.utime(lock, (old, old))
    with _fileio.FileLock(lock, what="checkpoint last"):  # was: waited, then LockHeld
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()
    shutil.rmtree(tmp_path, ignore_errors=True)


# ------------------------------------------------------------------ E6: scoring and decoding


def test_bleu_of_nothing_is_an_error_naming_pairs():
    from transformer_lib.translation import scoring

    with pytest.raises(ValueError, match="pairs is empty"):  # was IndexError in sacreBLEU
        scoring.bleu([], [])


@pytest.mark.parametrize("alpha", [1e6, -1e6, 1000.0])
def test_beam_search_refuses_a_length_penalty_that_overflows(alpha):
    import torch

    from transformer_lib.decoding import beam_search
    from transformer_lib.model import make_model

    torch.manual_seed(0)
    model = make_model(13, 13, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).eval()
    src = torch.tensor([[5, 6, 7, 2]])
    with pytest.raises(ValueError, match=r"length_penalty .* is too large in size"):
        beam_search(model, src, (src != 0).unsqueeze(-2), 20, 1, 2, beam_size=2,
                    length_penalty=alpha)
    beam_search(model, src, (src != 0).unsqueeze(-2), 20, 1, 2, beam_size=2,
                length_penalty=10.0)  # the largest translate_sentences allows: fine


def test_a_full_disk_while_saving_the_tokenizer_names_the_file(checkpoint_dir, tmp_path):
    import subprocess
    import sys

    code = (  # the file-size limit makes any write of more than 64 bytes fail (EFBIG)
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "from transformer_lib.translation import data\n"
        f"tok = data.load_tokenizer({str(checkpoint_dir / 'tokenizer.json')!r})\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        f"data.save_tokenizer(tok, {str(tmp_path / 'run' / 'tokenizer.json')!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("OSError: [Errno 27]") and str(tmp_path / "run") in last, last
    assert list((tmp_path / "run").iterdir()) == []


# ------------------------------------------------------------------ E7: ship_model interrupted


def test_a_shipped_model_left_between_the_two_renames_is_recovered(checkpoint_dir, tmp_path,
                                                                   monkeypatch):
    from transformer_lib.translation import pretrained

    folder = tmp_path / "pretrained"
    folder.mkdir()
    shutil.copytree(checkpoint_dir, folder / ".multi30k_de_en.old-0123456789ab")
    monkeypatch.setattr(pretrained, "_PACKAGE", tmp_path)
    # was FileNotFoundError "...reinstall transformer_lib"
    assert pretrained.pretrained_path() == folder / "multi30k_de_en"
    assert (folder / "multi30k_de_en" / "manifest.json").is_file()


# ------------------------------------------------------------------ beyond the list: paths


def test_loops_of_links_and_odd_names_are_named(tmp_path, monkeypatch):
    from _tools import tiny_config

    from transformer_lib import translation

    monkeypatch.chdir(tmp_path)
    os.symlink("loop1", "loop2")
    os.symlink("loop2", "loop1")  # was RuntimeError "Symlink loop" (resolve) in each
    with pytest.raises(ValueError, match="config 'loop1' cannot be read: Symlink loop"):
        config.load_config("loop1")
    with pytest.raises(ValueError, match="path 'loop1' cannot be resolved"):
        save_checkpoint("loop1", nn.Linear(2, 2), {})
    with pytest.raises(ValueError, match="run directory loop1/x cannot be resolved"):
        translation.train(tiny_config(), "loop1/x", progress=False)
    with pytest.raises(ValueError, match=r"config 'a\\x00b' cannot be read"):
        config.load_config("a\x00b")  # was "embedded null byte", naming nothing


@pytest.mark.parametrize("base, message", [
    ("/dev/zero", "is not a regular file"),  # was "does not exist"
    ("a" * 5000, "cannot be read: .*File name too long"),  # was OSError, a traceback
    ("\\u0000x", "cannot be read: embedded null byte"),
])
def test_a_base_that_cannot_be_a_config_is_named(tmp_path, base, message):
    (tmp_path / "c.toml").write_text(f'base = "{base}"\n')
    with pytest.raises(ValueError, match=f"c.toml: its base .*{message}"):
        config.load_config(tmp_path / "c.toml")


def test_save_checkpoint_under_a_file_names_the_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"its folder '.*afile' is a file"):  # was Errno 17
        save_checkpoint(tmp_path / "afile" / "ck", nn.Linear(2, 2), {})
    assert (tmp_path / "afile").read_text() == "x"
