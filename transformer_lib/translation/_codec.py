"""Values with tensors as JSON plus named tensors, without pickle (hand-written, private).

``torch.save`` would pickle, and unpickling a file runs whatever code it names. A checkpoint's
optimizer and scheduler states, RNG states and counters are nested dicts, lists and tuples of
numbers, strings, tensors and NumPy arrays: ``encode_tree`` turns such a value into JSON,
each tensor replaced by a reference ``{"__tensor__": name}`` into a dict of tensors that
safetensors stores; ``decode_tree`` is its inverse. ``dedupe_tensors`` stores tensors that share
memory once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__: list[str] = []  # private: imported by name from transformer_lib.translation.checkpoint

# A JSON object with one of these keys stands for a value JSON has no type for.
_MARKERS = ("__tensor__", "__ndarray__", "__tuple__", "__items__")
_REFS = ("__tensor__", "__ndarray__")


def dedupe_tensors(
    named: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Split tensors into unique ones and aliases ``{alias: canonical name}``.

    safetensors refuses tensors that share memory. Tied weights (the same tensor under two
    names, e.g. the embedding and the output projection, paper section 3.4) are stored once
    and recorded as an alias. Tensors that overlap without being the same view are copied.
    """
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    storages: set[int] = set()
    for name, t in named.items():
        t = t.detach()
        if t.numel() == 0:
            unique[name] = t.cpu().contiguous()
            continue
        ptr = t.untyped_storage().data_ptr()
        view = (t.device, ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if view in seen:
            aliases[name] = seen[view]
            continue
        seen[view] = name
        shared = ptr in storages
        storages.add(ptr)
        # .contiguous() copies only non-contiguous tensors; clone() breaks partial overlaps.
        t = t.contiguous() if not shared else t.clone(memory_format=torch.contiguous_format)
        unique[name] = t.cpu()
    return unique, aliases


def encode_tree(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """`obj` as JSON, each tensor/array replaced by a reference to `tensors[path]`."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        if isinstance(obj, np.ndarray) and obj.dtype == object:
            raise TypeError(f"cannot store the object array at {path!r} without pickle")
        key = path
        while key in tensors:  # "a/b" can arise twice, from {"a/b": ..} and {"a": {"b": ..}}
            key += "'"
        if isinstance(obj, torch.Tensor):
            tensors[key] = obj
            return {"__tensor__": key}
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj))
        return {"__ndarray__": key}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_tree(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_tree(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj) and not any(k in _MARKERS for k in obj):
            return {k: encode_tree(v, f"{path}/{k}", tensors) for k, v in obj.items()}
        # Non-string keys (the optimizer's parameter ids) keep their type as explicit items.
        return {
            "__items__": [
                [encode_tree(k, f"{path}/{i}k", tensors), encode_tree(v, f"{path}/{k}", tensors)]
                for i, (k, v) in enumerate(obj.items())
            ]
        }
    raise TypeError(
        f"cannot store {type(obj).__name__} at {path!r} in a checkpoint: only JSON values, "
        "tuples, dicts, tensors and NumPy arrays are supported (nothing is pickled)"
    )


def decode_tree(obj: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    """Inverse of ``encode_tree``; `where` names the file for error messages."""
    if isinstance(obj, list):
        return [decode_tree(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1 and next(iter(obj)) in _MARKERS:
        kind, value = next(iter(obj.items()))
        if kind in ("__tuple__", "__items__") and not isinstance(value, list):
            raise ValueError(f"{where}: {kind} must hold a list, got {str(value)[:40]}")
        if kind == "__tuple__":
            return tuple(decode_tree(v, tensors, where) for v in value)
        if kind == "__items__":
            return dict(_item(pair, tensors, where) for pair in value)
        if not isinstance(value, str) or value not in tensors:
            raise ValueError(f"{where} refers to tensor {value!r}, which is not stored")
        return tensors[value] if kind == "__tensor__" else tensors[value].numpy()
    return {k: decode_tree(v, tensors, where) for k, v in obj.items()}


def _item(pair: Any, tensors: Mapping[str, torch.Tensor], where: str) -> tuple[Any, Any]:
    """One [key, value] of an ``__items__`` list, decoded; the key must be hashable."""
    if not isinstance(pair, list) or len(pair) != 2:
        raise ValueError(f"{where}: __items__ must hold [key, value] pairs, got "
                         f"{str(pair)[:40]}")
    key = decode_tree(pair[0], tensors, where)
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"{where}: an __items__ key must be a number or a string, got "
                         f"{str(key)[:40]}") from None
    return key, decode_tree(pair[1], tensors, where)


def redirect_refs(tree: Any, aliases: Mapping[str, str]) -> Any:
    """Point references to aliased tensors (``dedupe_tensors``) at the stored copy."""
    if isinstance(tree, list):
        return [redirect_refs(v, aliases) for v in tree]
    if isinstance(tree, dict):
        if len(tree) == 1 and next(iter(tree)) in _REFS:
            kind, ref = next(iter(tree.items()))
            return {kind: aliases.get(ref, ref)}
        return {k: redirect_refs(v, aliases) for k, v in tree.items()}
    return tree


def tensor_refs(tree: Any) -> list[str]:
    """Names of the tensors a JSON tree refers to."""
    out: list[str] = []
    if isinstance(tree, list):
        for v in tree:
            out += tensor_refs(v)
    elif isinstance(tree, dict):
        if len(tree) == 1 and next(iter(tree)) in _REFS:
            return [str(next(iter(tree.values())))]
        for v in tree.values():
            out += tensor_refs(v)
    return out
