"""Checkpoints as directories of safetensors + JSON: atomic, verified, no pickle (hand-written).

The training loop and the command line use it. The tensor codec is ``_codec``; the atomic
directory swap, ``_fileio.replace_dir``, and reading one version during swaps,
``_fileio.read_one_version``.

A checkpoint is a directory::

    model.safetensors    the weights (tied tensors stored once; see "aliases" in its metadata)
    config.json          the caller's config dict, human-readable
    tokenizer.json       the tokenizer, if one was given
    trainer.safetensors  tensors of the optimizer, scheduler, RNG, train state and extra
                         (the RNG: one state per process of the run that saved it)
    trainer.json         everything else about them, tensors replaced by references
    manifest.json        format version and the SHA-256 and size of every other file

`torch.save` would pickle, and unpickling a file runs whatever code it names: loading a
downloaded checkpoint would mean trusting its author. Here nothing is ever unpickled: tensors go
through safetensors, everything else through JSON. The paper averages the last 5 (base) or 20
(big) checkpoints (section 6.1); ``average_checkpoints`` does that.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_lib.translation._codec import (
    decode_tree,
    dedupe_tensors,
    encode_tree,
    redirect_refs,
    tensor_refs,
)
from transformer_lib.translation._fileio import (
    fsync_dir,
    new_tmp_dir,
    read_one_version,
    recover_dir,
    replace_dir,
    sha256_file,
    write_durably,
)
from transformer_lib.translation.distributed import checked_device
from transformer_lib.translation.rng import capture_rng_state, restore_rng_state

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "average_checkpoints",
    "capture_rng_state",
    "restore_rng_state",
    "recover_checkpoint",
]

_FORMAT = "transformer_lib.checkpoint"  # the manifests' format name (the module's old path)
_VERSION = 1
_MODEL, _CONFIG, _TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
_TRAINER_T, _TRAINER_J, _MANIFEST = "trainer.safetensors", "trainer.json", "manifest.json"
_OWN_FILES = (_MODEL, _CONFIG, _TOKENIZER, _TRAINER_T, _TRAINER_J, _MANIFEST)


# ---------------------------------------------------------------------------------- writing


def _write_json(path: Path, obj: Any) -> None:
    write_durably(path, (json.dumps(obj, indent=2, allow_nan=True) + "\n").encode("utf-8"))


def _write_tensors(path: Path, tensors: Mapping[str, torch.Tensor], meta: dict[str, str]) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import save

    try:  # bytes, written as open() would (save_file creates its file 0600 whatever the umask)
        blob = save(dict(tensors), metadata=meta)
    except SafetensorError as e:
        code = re.search(r"os error (\d+)", str(e))
        if code is None:
            raise OSError(errno.EIO, f"could not write it: {e}", str(path)) from e
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from e
    write_durably(path, blob)


def _fill(
    tmp: Path,
    model: nn.Module,
    config: Mapping[str, Any],
    trainer: dict[str, Any],
    tokenizer: Any,
    documents: Mapping[str, str],
) -> None:
    """Write every file of a checkpoint into the (temporary) directory `tmp`."""
    try:
        config_text = json.dumps(dict(config), indent=2, allow_nan=True) + "\n"
    except TypeError as e:
        raise TypeError(f"config must be a JSON-serializable dict: {e}") from e
    weights, aliases = dedupe_tensors(model.state_dict())
    _write_tensors(tmp / _MODEL, weights, {"format": "pt", "aliases": json.dumps(aliases)})
    write_durably(tmp / _CONFIG, config_text.encode("utf-8"))
    if tokenizer is not None:
        if hasattr(tokenizer, "to_str"):  # a tokenizers.Tokenizer
            write_durably(tmp / _TOKENIZER, tokenizer.to_str(pretty=True).encode("utf-8"))
        else:  # a path to a tokenizer.json
            write_durably(tmp / _TOKENIZER, Path(tokenizer).read_bytes())
    if trainer:
        raw: dict[str, torch.Tensor] = {}
        tree = {k: encode_tree(v, k, raw) for k, v in trainer.items()}
        unique, aliases = dedupe_tensors(raw)
        tree = redirect_refs(tree, aliases)
        _write_tensors(tmp / _TRAINER_T, unique, {"format": "pt"})
        _write_json(tmp / _TRAINER_J, tree)
    for name, text in documents.items():  # a model card: covered by the manifest too
        write_durably(tmp / name, text.encode("utf-8"))
    files = sorted(p.name for p in tmp.iterdir())
    _write_json(
        tmp / _MANIFEST,
        {
            "format": _FORMAT,
            "version": _VERSION,
            "files": {
                n: {"sha256": sha256_file(tmp / n), "bytes": (tmp / n).stat().st_size}
                for n in files
            },
        },
    )
    fsync_dir(tmp)


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    config: Mapping[str, Any],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    train_state: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    extra: Mapping[str, Any] | None = None,
    rng: bool | Sequence[Mapping[str, Any]] = True,
    documents: Mapping[str, str] | None = None,
) -> Path:
    """Write a checkpoint directory at `path`, atomically replacing any older one.

    Everything is written into a temporary directory next to `path` and fsync'ed; then the old
    checkpoint (if any) is renamed away, the new one renamed into place, and the old one
    deleted. A crash while writing leaves the old checkpoint untouched; a failure during the
    swap puts it back; a kill between the two renames is repaired by the next load
    (``recover_checkpoint``). Saves of one path by several threads or processes take turns
    (a lock file next to it), and each save deletes what killed saves of that path left.

    Args:
        path: the checkpoint directory.
        model: its ``state_dict()`` is saved (parameters and persistent buffers).
        config: JSON-serializable settings to rebuild the model (tuples come back as lists).
        optimizer, scheduler: their ``state_dict()``s, for resuming training.
        train_state: counters such as epoch and step (JSON values, tuples, tensors, arrays).
        tokenizer: a ``tokenizers.Tokenizer`` or the path of a ``tokenizer.json`` to copy.
        extra: anything else of the same kinds as `train_state`.
        rng: also record the random generators' state, so a resumed run draws the same
            numbers: True, this process's (``capture_rng_state()``); a sequence, one state per
            process of a distributed run, in rank order; False, none.
        documents: text files to store beside the weights, name -> UTF-8 text (a model
            card); the manifest lists them like every file, so a load checks them too.

    Returns `path`. A write that fails (disk full, a file-size limit) raises an ``OSError``
    naming `path`; the previous checkpoint there, if any, is left as it was.
    """
    path = _save_path(path)
    _check_replaceable(path)  # before the work: a refusal costs nothing
    documents = dict(documents or {})
    _check_documents(documents)
    trainer: dict[str, Any] = {}
    for key, value in (
        ("optimizer", optimizer.state_dict() if optimizer is not None else None),
        ("scheduler", scheduler.state_dict() if scheduler is not None else None),
        ("train_state", train_state),
        ("extra", extra),
        ("rng", _rng_states(rng)),
    ):
        if value is not None:
            trainer[key] = value
    tmp = new_tmp_dir(path)
    try:
        try:
            _fill(tmp, model, config, trainer, tokenizer, documents)
        except OSError as e:  # named after the checkpoint, not the temporary directory
            file = f" (writing {Path(e.filename).name})" if e.filename else ""
            raise OSError(e.errno, f"checkpoint {path} not saved: {e.strerror or e}{file}; "
                          "the previous version there, if any, is unchanged") from e
        # again under the swap's lock: the directory may have changed while the files were
        # written, and the swap deletes what it replaces
        replace_dir(tmp, path, what=f"checkpoint {path}", check=_check_replaceable)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _save_path(path: str | Path) -> Path:
    """The directory to replace. A link is followed, as writing a file through it would (the
    swap renames directories: it replaced the link, leaving its target at the old version).
    "." and ".." are named absolutely (the swap's lock and temporary directory go beside the
    directory, not inside it); the working directory and its parents are refused."""
    if isinstance(path, str) and not path.strip():
        raise ValueError("path '' is empty: name the checkpoint directory to write")
    p = Path(path)
    try:
        real = p.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a loop of links (Python < 3.13)
        raise ValueError(f"path {str(path)!r} cannot be resolved: {e}") from None
    if p.is_symlink() or p.name in ("", ".."):
        p = real
    if real.parent.exists() and not real.parent.is_dir():  # else "[Errno 17] File exists"
        raise ValueError(f"path {str(path)!r}: its folder {str(real.parent)!r} is a file")
    try:
        here = Path.cwd().resolve()
    except OSError:
        return p
    if real == here or real in here.parents:
        raise ValueError(f"path {str(path)!r} is the working directory or holds it: the save "
                         "replaces the whole directory; name it from outside it")
    return p


def _check_replaceable(path: Path) -> None:
    """Raise unless `path` is missing, an empty directory or a checkpoint (a manifest).

    The swap deletes the directory it replaces: a directory of anything else (a run
    directory, a dataset, a home directory given by mistake) would be lost with it.
    """
    # one stat: exists() then is_dir() raced a concurrent save's swap ("is a file")
    if path.is_file():
        raise ValueError(f"path must be a checkpoint directory, but {path} is a file")
    try:
        held = sorted(p.name for p in path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return  # missing (or replaced by a concurrent swap's rename): nothing to lose
    if held and _MANIFEST not in held:
        listed = ", ".join(held[:6]) + (f" and {len(held) - 6} more" if len(held) > 6 else "")
        raise FileExistsError(
            f"path {path} is a directory that is not a checkpoint (it holds {listed}, and no "
            f"{_MANIFEST}); saving there would delete these: choose another path, or an empty "
            "directory"
        )


def _check_documents(documents: dict[str, Any]) -> None:
    for name, text in documents.items():
        if not isinstance(name, str) or Path(name).name != name or name in (*_OWN_FILES, "", ".."):
            raise ValueError(f"documents: {name!r} must be a plain file name other than the "
                             f"checkpoint's own files {list(_OWN_FILES)}")
        if not isinstance(text, str):
            raise ValueError(f"documents: {name!r} must be text (str), got "
                             f"{type(text).__name__}")


def _rng_states(rng: bool | Sequence[Mapping[str, Any]]) -> list[Any] | None:
    if rng is True:
        return [capture_rng_state()]
    return list(rng) if rng else None


def recover_checkpoint(path: str | Path) -> bool:
    """Finish a swap that a crash interrupted; return whether `path` is now a directory.

    A save killed between its two renames leaves no `path`, only the previous version as
    ``.<name>.old-*`` (complete: it was a checkpoint until the first rename). It is renamed
    back. ``load_checkpoint`` calls this, so loading and resuming find it.
    """
    path = Path(path)
    return recover_dir(path, _MANIFEST, what=f"checkpoint {path}")


# ---------------------------------------------------------------------------------- reading


def _read_manifest(path: Path) -> dict[str, Any]:
    if not recover_checkpoint(path):
        raise FileNotFoundError(f"checkpoint directory {path} not found")
    manifest_path = path / _MANIFEST
    if not manifest_path.is_file():
        raise ValueError(f"{path} is not a checkpoint: {_MANIFEST} is missing")
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT:
        raise ValueError(f"{manifest_path} is not a {_FORMAT} manifest")
    if manifest.get("version") != _VERSION:
        raise ValueError(
            f"{manifest_path}: checkpoint format version {manifest.get('version')!r} is not "
            f"supported (expected {_VERSION})"
        )
    _check_manifest_files(manifest.get("files"), manifest_path)
    return manifest


def _check_manifest_files(files: Any, where: Path) -> None:
    """ValueError naming the manifest unless `files` maps names in it to their checksums."""
    if not isinstance(files, dict):
        raise ValueError(f"{where}: 'files' must map each file name to its sha256 and bytes, "
                         f"got {type(files).__name__}")
    for name, entry in files.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise ValueError(f"{where}: 'files' may list only files of the checkpoint "
                             f"directory, got {name!r}")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise ValueError(f"{where}: 'files' entry {name!r} must be an object with a "
                             f"'sha256' string, got {entry!r}")


def _check_file(path: Path, manifest: Mapping[str, Any], verify: bool) -> Path:
    entry = manifest.get("files", {}).get(path.name)
    if entry is None or not path.is_file():
        raise ValueError(f"checkpoint {path.parent} is incomplete: {path.name} is missing")
    if verify:
        # the size first: a crafted entry for a huge (sparse) file would be hashed for hours
        size, listed = path.stat().st_size, entry.get("bytes")
        if isinstance(listed, int) and not isinstance(listed, bool) and size != listed:
            raise ValueError(f"{path} is corrupt: {listed} bytes expected, got {size}")
        actual = sha256_file(path)
        if actual != entry.get("sha256"):
            raise ValueError(
                f"{path} is corrupt: SHA-256 expected {entry.get('sha256')}, got {actual}"
            )
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not UTF-8, not JSON, an integer of more than 4,300 digits
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    except RecursionError:  # "[[[[..." deeper than the interpreter's stack: a crafted file
        raise ValueError(f"{path} is corrupt: its JSON is nested too deeply to read") from None


def _read_tensors(
    path: Path, device: str, names: Sequence[str] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (all, or only `names`) and the metadata of a safetensors file."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            keys = list(f.keys()) if names is None else [n for n in names if n in f.keys()]
            return {k: f.get_tensor(k) for k in keys}, dict(f.metadata() or {})
    except SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file: {e}") from e


def _device(map_location: str | torch.device) -> str:
    return str(checked_device(map_location))  # "cuda" without a GPU: an error naming it


def _model_state(path: Path, manifest: Mapping[str, Any], verify: bool, device: str):
    """The full state dict stored in a checkpoint, tied names restored."""
    file = _check_file(path / _MODEL, manifest, verify)
    tensors, meta = _read_tensors(file, device)
    try:
        aliases = json.loads(meta.get("aliases", "{}"))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{file}: the 'aliases' metadata is not valid JSON: {e}") from e
    if not isinstance(aliases, dict) or not all(isinstance(v, str) for v in aliases.values()):
        raise ValueError(f"{file}: the 'aliases' metadata must map tensor names to tensor "
                         f"names, got {str(aliases)[:60]}")
    for alias, name in aliases.items():
        if name not in tensors:
            raise ValueError(f"{file}: alias {alias!r} refers to missing tensor {name!r}")
        tensors[alias] = tensors[name]
    return tensors


def _load_into(model: nn.Module, state: Mapping[str, torch.Tensor], where: Path) -> None:
    """``model.load_state_dict`` after a check that lists every name and shape that differs."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    # load_state_dict would cast them: integer "weights" loaded and translated to ""
    shapes += [f"{k}: stored as {state[k].dtype}, the model's weights are floating point"
               for k in sorted(set(state) & set(expected))
               if expected[k].is_floating_point() and not state[k].is_floating_point()]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing from the checkpoint: {missing}")
        if unexpected:
            parts.append(f"not in the model: {unexpected}")
        if shapes:
            parts.append(f"shape mismatch: {shapes}")
        raise ValueError(f"checkpoint {where} does not fit the model; " + "; ".join(parts))
    model.load_state_dict(state, strict=True)


def _read_files(path: Path, manifest: Mapping[str, Any], device: str, verify: bool, *,
                with_model: bool, with_optimizer: bool):
    """Config, weights (`with_model`), trainer state and tokenizer path of a checkpoint."""
    config = _read_json(_check_file(path / _CONFIG, manifest, verify))
    state = _model_state(path, manifest, verify, device) if with_model else None
    trainer: dict[str, Any] = {}
    if _TRAINER_J in manifest.get("files", {}):
        tree = _read_json(_check_file(path / _TRAINER_J, manifest, verify))
        if not isinstance(tree, dict):
            raise ValueError(f"{path / _TRAINER_J} must hold a JSON object")
        # The optimizer's tensors (twice the model's size for Adam) are read only when needed.
        wanted = [k for k in tree if k != "optimizer" or with_optimizer]
        try:  # a crafted tree: "[[[[" 900 deep reads as JSON, then decoding recursed
            refs = tensor_refs({k: tree[k] for k in wanted})
            tensors_file = _check_file(path / _TRAINER_T, manifest, verify)
            tensors, _ = _read_tensors(tensors_file, device, refs)
            trainer = {k: decode_tree(tree[k], tensors, str(path / _TRAINER_J)) for k in wanted}
        except RecursionError:
            raise ValueError(f"{path / _TRAINER_J} is corrupt: nested too deeply") from None
    tokenizer = None
    if _TOKENIZER in manifest.get("files", {}):
        tokenizer = _check_file(path / _TOKENIZER, manifest, verify)
    for name in set(manifest["files"]) - set(_OWN_FILES):  # documents, e.g. a model card
        _check_file(path / name, manifest, verify)
    return config, state, trainer, tokenizer


def load_checkpoint(
    path: str | Path,
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    map_location: str | torch.device = "cpu",
    *,
    restore_rng: bool = False,
    verify: bool = True,
) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint``, loading state into the given objects.

    Only safetensors and JSON are read: nothing is unpickled, so a checkpoint from anywhere is
    safe to open. With `verify`, every file read is checked against the manifest's SHA-256.

    Args:
        path: the checkpoint directory.
        model: if given, receives the weights (names and shapes must match exactly).
        optimizer, scheduler: if given, receive their saved states (an error if none was saved).
        map_location: device for the returned tensors (the model keeps its own device).
        restore_rng: set the random generators to their state at saving time (of rank 0,
            when several processes saved theirs).
        verify: check file checksums.

    Returns a dict with ``config``, ``train_state``, ``extra``, ``rng`` (a list of states,
    one per process that saved, rank 0 first; ``None`` when not saved), ``tokenizer`` (path
    of ``tokenizer.json``, checked like every other file, or ``None``) and ``path``.

    A checkpoint that a running training replaces while it is read is read again: everything
    returned and loaded comes from one version (``_fileio.read_one_version``).
    """
    path = Path(path)
    device = _device(map_location)
    read = partial(_read_files, path, device=device, verify=verify,
                   with_model=model is not None, with_optimizer=optimizer is not None)
    config, state, trainer, tokenizer = read_one_version(path, _read_manifest, read,
                                                         what=f"checkpoint {path}")
    if model is not None:
        _load_into(model, state, path)
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler)):
        if obj is None:
            continue
        if name not in trainer:
            raise ValueError(f"checkpoint {path} holds no {name} state to load")
        obj.load_state_dict(trainer[name])
    rng = trainer.get("rng")
    if isinstance(rng, dict):  # saved before one state per process: this process's alone
        rng = [rng]
    if restore_rng:
        if not rng:
            raise ValueError(f"checkpoint {path} holds no RNG state (saved with rng=False)")
        restore_rng_state(rng[0])
    return {
        "config": config,
        "train_state": trainer.get("train_state"),
        "extra": trainer.get("extra"),
        "rng": rng,
        "tokenizer": tokenizer,
        "path": path,
    }


def average_checkpoints(
    paths: Sequence[str | Path], *, verify: bool = True
) -> dict[str, torch.Tensor]:
    """The element-wise mean of several checkpoints' weights (paper section 6.1).

    "For the base models, we used a single model obtained by averaging the last 5 checkpoints."
    Sums are accumulated in float32 (float64 for float64 weights) and cast back to each
    tensor's dtype; integer buffers are taken from the last checkpoint. Tied names share one
    tensor in the result, which loads with ``model.load_state_dict(..., strict=True)``. The
    checkpoints are read one after another: memory holds about three models' weights (the
    first, the sums and the one being added), however many paths are given.
    """
    if isinstance(paths, (str, Path)):  # a str's characters would be read as paths
        raise ValueError(f"paths must be a list of checkpoint directories, got {str(paths)!r}; "
                         "pass [path] for one")
    if len(paths) == 0:
        raise ValueError("paths must name at least one checkpoint, got none")
    paths = [Path(p) for p in paths]

    def read(p: Path) -> dict[str, torch.Tensor]:  # one version, though a run may replace it
        one = partial(_model_state, p, verify=verify, device="cpu")
        return read_one_version(p, _read_manifest, one, what=f"checkpoint {p}")

    # One checkpoint in memory at a time besides the first and the sums: averaging the
    # last 20 of a large model must not hold 20 copies of it.
    first = read(paths[0])
    names = {}  # id of a tensor in `first` -> its first name (tied names share one tensor)
    for name, t in first.items():
        names.setdefault(id(t), name)
    sums = {name: first[name].to(_sum_dtype(first[name]), copy=True)
            for name in names.values() if first[name].is_floating_point()}
    last = first
    for p in paths[1:]:
        s = read(p)
        if set(s) != set(first):
            diff = sorted(set(s) ^ set(first))
            raise ValueError(f"checkpoint {p} has different tensor names than {paths[0]}: {diff}")
        bad = [k for k in first if s[k].shape != first[k].shape]
        if bad:
            raise ValueError(f"checkpoint {p} differs in shape from {paths[0]} for {bad}")
        for name, acc in sums.items():
            acc += s[name].to(acc.dtype)
        last = s
    mean = {key: (sums[key] / len(paths)).to(first[key].dtype) if key in sums
            else last[key].clone() for key in names.values()}
    return {name: mean[names[id(t)]] for name, t in first.items()}  # tied names: one tensor


def _sum_dtype(t: torch.Tensor) -> torch.dtype:
    """float64 sums for float64 weights, float32 for the rest (bf16 sums would round)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32
