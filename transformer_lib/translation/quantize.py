"""Dynamic int8 copies of a translation model for CPU inference (hand-written, opt-in).

``quantize_int8`` replaces the linear layers of a copy of a model by ones that multiply in
int8; ``translate --int8`` and ``inference.translate(..., int8=True)`` use it, and
``bench/translate.py`` measures its speed and BLEU against fp32 and CTranslate2.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from transformer_lib.multihead import MultiHeadedAttention

__all__ = ["quantize_int8", "is_int8", "int8_precision"]


class _Int8Linear(nn.Linear):
    """An ``nn.Linear`` whose forward runs PyTorch's dynamic int8 kernel.

    Still an ``nn.Linear`` with its float weight, so code that reads a layer's shape or
    device (``beam_search`` asks the generator for its vocabulary size) sees the same layer;
    only the product is int8: the weight quantized once, each input at each call.
    """

    def __init__(self, linear: nn.Linear) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        with warnings.catch_warnings():  # torch deprecates torch.ao.quantization for torchao
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            self.int8 = torch.ao.quantization.quantize_dynamic(
                nn.Sequential(linear), {nn.Linear}, dtype=torch.qint8)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.int8(x)


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` whose linear layers multiply in int8 (dynamic quantization), for CPUs.

    Each ``nn.Linear`` that is called as a module (attention's W^O, both feed-forward layers,
    the d_model→vocabulary output layer) gets int8 weights, one scale per matrix, and quantizes its
    input at each call (``torch.ao.quantization.quantize_dynamic``'s kernel). The fused
    W^Q/W^K/W^V stays fp32: attention slices its weight (chapter 3), so there is no module
    call to replace. Translate the copy in precision "fp32" (or "auto", which then means
    fp32). ``bench/translate.py`` measures its speed and BLEU against fp32 and CTranslate2.
    Raises ValueError unless the model is on the CPU, where these kernels are.
    """
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"int8 translation runs on the CPU only, and the model is on {device}; "
                         "load it with device='cpu'")
    model = copy.deepcopy(model).eval()
    attention_inputs = {id(m.in_proj) for m in model.modules()
                        if isinstance(m, MultiHeadedAttention)}
    names = [name for name, m in model.named_modules()
             if type(m) is nn.Linear and id(m) not in attention_inputs]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, _Int8Linear(getattr(owner, child)))
    return model


def is_int8(model: nn.Module) -> bool:
    """Whether `model` holds ``quantize_int8``'s layers."""
    return any(isinstance(m, _Int8Linear) for m in model.modules())


def int8_precision(precision: str) -> str:
    """The precision of an int8 model (``quantize_int8``): "fp32" for "auto"; no bf16 kernels."""
    if precision == "bf16":
        raise ValueError("precision 'bf16' does not apply to an int8 model (quantize_int8): "
                         "its products are int8; use 'fp32' or 'auto'")
    return "fp32" if precision == "auto" else precision
