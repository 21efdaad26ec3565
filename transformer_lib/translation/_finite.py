"""Are a model's weights finite? The check `load_model` and `translate_sentences` share.

A NaN or infinite weight (a diverged run, or a weight changed after loading) makes every
translation empty without an error, so both refuse such a model by name. Reading every weight
costs about 0.1 s for the shipped model: `translate_sentences` pays it once per model, and again
only after a weight changed in place (which bumps the tensor's version counter).
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

# model -> its weights' (storage, version) when last found finite
_FOUND_FINITE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def not_finite(model: nn.Module) -> list[str]:
    """Names of the model's floating-point weights and buffers holding a NaN or an infinity
    (tensors only: an int8 model's state also holds its packed weights' dtype)."""
    return [n for n, t in model.state_dict().items() if isinstance(t, torch.Tensor)
            and t.is_floating_point() and not torch.isfinite(t).all()]


def not_finite_since(model: nn.Module) -> list[str]:
    """``not_finite(model)``, skipped when no weight changed since it found none."""
    versions = tuple((id(t.untyped_storage()), t._version)
                     for t in model.state_dict().values() if isinstance(t, torch.Tensor))
    if _FOUND_FINITE.get(model) == versions:
        return []
    bad = not_finite(model)
    if not bad:
        _FOUND_FINITE[model] = versions
    return bad
