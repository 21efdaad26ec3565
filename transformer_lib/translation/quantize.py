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

PER_CHANNEL = True  # one scale per output row of each weight, as CTranslate2 does


class _Int8Linear(nn.Linear):
    """An ``nn.Linear`` whose forward runs PyTorch's dynamic int8 kernel.

    Still an ``nn.Linear`` with its float weight, so code that reads a layer's shape or
    device (``beam_search`` asks the generator for its vocabulary size) sees the same layer;
    only the product is int8: the weight quantized once, each input at each call.
    """

    def __init__(self, linear: nn.Linear, engine: str | None = None) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.int8 = _quantized(linear, engine)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.int8(x)


def _quantized(linear: nn.Linear, engine: str | None) -> nn.Module:
    """``quantize_dynamic``'s int8 copy of `linear`, its weight packed for `engine`'s kernel
    (None: PyTorch's default engine); the kernel follows the packing, whatever the engine is
    when the layer runs."""
    previous = torch.backends.quantized.engine
    if engine not in torch.backends.quantized.supported_engines:
        engine = previous
    try:
        torch.backends.quantized.engine = engine
        with warnings.catch_warnings():  # torch deprecates torch.ao.quantization for torchao
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            qconfig = torch.ao.quantization.per_channel_dynamic_qconfig if PER_CHANNEL \
                else torch.ao.quantization.default_dynamic_qconfig
            return torch.ao.quantization.quantize_dynamic(
                nn.Sequential(linear), {nn.Linear: qconfig}, dtype=torch.qint8)[0]
    finally:
        torch.backends.quantized.engine = previous


class _Int8Attention(MultiHeadedAttention):
    """``MultiHeadedAttention`` whose fused W^Q/W^K/W^V products run in int8 too.

    Attention slices ``in_proj``'s weight by rows (``_project``, chapter 3): each slice it
    asks for (all three, W^Q alone, W^K and W^V together, each alone) gets its own int8 layer.
    """

    def _project(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        key = (rows.start, rows.stop)
        if key not in self.int8_in:
            return super()._project(x, rows)
        return self.int8_in[key](x)


def _quantize_attention(m: MultiHeadedAttention) -> None:
    """Turn `m` into an ``_Int8Attention`` with int8 layers for the slices of in_proj."""
    d, w, b = m.d_model, m.in_proj.weight, m.in_proj.bias
    int8_in = {}
    for start, stop in ((None, None), (0, d), (d, 3 * d), (d, 2 * d), (2 * d, 3 * d)):
        rows = slice(start, stop)
        part = nn.Linear(d, w[rows].size(0), bias=b is not None)
        with torch.no_grad():
            part.weight.copy_(w[rows])
            if b is not None:
                part.bias.copy_(b[rows])
        int8_in[(start, stop)] = _quantized(part, None)
    m.__class__ = _Int8Attention
    m.int8_in = int8_in  # a plain dict: not parameters, not in state_dict()


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` whose linear layers multiply in int8 (dynamic quantization), for CPUs.

    Every product of the model gets int8 weights, one scale per matrix, and quantizes its
    input at each call (``torch.ao.quantization.quantize_dynamic``'s kernel): each
    ``nn.Linear`` called as a module (attention's W^O, both feed-forward layers, the
    d_model→vocabulary output layer), and the fused W^Q/W^K/W^V, which attention slices by
    rows (chapter 3; ``_Int8Attention``). The vocabulary-wide output layer's weight is packed
    for the oneDNN engine, the others for PyTorch's default (x86/fbgemm): on an AMD EPYC,
    one thread, oneDNN's kernel measured about 1.4x faster for the wide 256→8000 product at
    64 to 256 rows (a beam search's batches; slower at 16), fbgemm's as fast or faster for
    the narrow ones. Translate the copy in precision "fp32" (or "auto", which then
    means fp32). ``bench/translate.py`` measures its speed and BLEU against fp32 and
    CTranslate2.
    Raises ValueError unless the model is on the CPU, where these kernels are.
    """
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"int8 translation runs on the CPU only, and the model is on {device}; "
                         "load it with device='cpu'")
    model = copy.deepcopy(model).eval()
    attentions = [m for m in model.modules() if type(m) is MultiHeadedAttention]
    attention_inputs = {id(m.in_proj) for m in attentions}
    output_layers = {id(m) for m in model.generator.modules()} if hasattr(model, "generator") \
        else set()
    names = [name for name, m in model.named_modules()
             if type(m) is nn.Linear and id(m) not in attention_inputs]
    for name in names:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        linear = getattr(owner, child)
        engine = "onednn" if id(linear) in output_layers else None
        setattr(owner, child, _Int8Linear(linear, engine))
    for m in attentions:
        _quantize_attention(m)
    return model


def is_int8(model: nn.Module) -> bool:
    """Whether `model` holds ``quantize_int8``'s layers."""
    return any(isinstance(m, (_Int8Linear, _Int8Attention)) for m in model.modules())


def int8_precision(precision: str) -> str:
    """The precision of an int8 model (``quantize_int8``): "fp32" for "auto"; no bf16 kernels."""
    if precision == "bf16":
        raise ValueError("precision 'bf16' does not apply to an int8 model (quantize_int8): "
                         "its products are int8; use 'fp32' or 'auto'")
    return "fp32" if precision == "auto" else precision
