"""Chapter 11's lesson cells compute what the package's full versions compute.

The chapter shows a short version of each component (the math and the shapes) and folds the
package's version (checks, fast kernels, cache hooks) below it. These tests run the lesson
cells from the committed notebook (`tests/_lessons.py`), give both versions the same weights
(`load_state_dict`) and compare outputs and gradients; for generation, the tokens.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests._lessons import lesson
from transformer_lib import attention_variants as av
from transformer_lib import lm as lm_mod
from transformer_lib import modern
from transformer_lib.decoding import KVCache
from transformer_lib.layers import (
    Embeddings,
    Encoder,
    EncoderLayer,
    Generator,
    PositionwiseFeedForward,
)
from transformer_lib.masks import subsequent_mask
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.positional import PositionalEncoding


def _namespace() -> dict:
    """What the chapter has imported or defined before its lesson cells run."""
    return {
        "torch": torch,
        "nn": nn,
        "F": F,
        "Embeddings": Embeddings,
        "Encoder": Encoder,
        "EncoderLayer": EncoderLayer,
        "Generator": Generator,
        "PositionwiseFeedForward": PositionwiseFeedForward,
        "subsequent_mask": subsequent_mask,
        "MultiHeadedAttention": MultiHeadedAttention,
        "PositionalEncoding": PositionalEncoding,
        "KVCache": KVCache,
        "sample_next": lm_mod.sample_next,
        # the full version precedes the RoPE lesson in the chapter
        "GroupedQueryAttention": av.GroupedQueryAttention,
    }


def _same_grads(a: nn.Module, b: nn.Module, atol: float = 1e-5) -> None:
    ga = {n: p.grad for n, p in a.named_parameters()}
    gb = {n: p.grad for n, p in b.named_parameters()}
    assert ga.keys() == gb.keys()
    for name in ga:
        assert (ga[name] is None) == (gb[name] is None), name
        if ga[name] is None:  # unused by forward in both (the generator)
            continue
        torch.testing.assert_close(ga[name], gb[name], atol=atol, rtol=1e-4, msg=name)


def _compare(lesson_mod: nn.Module, full: nn.Module, *inputs, atol: float = 1e-5, **kw) -> None:
    lesson_mod.load_state_dict(full.state_dict())  # strict: the same parameters
    lesson_mod.eval(), full.eval()
    out_l, out_f = lesson_mod(*inputs, **kw), full(*inputs, **kw)
    torch.testing.assert_close(out_l, out_f, atol=atol, rtol=1e-4)
    w = torch.randn_like(out_f)
    (out_l * w).sum().backward()
    (out_f * w).sum().backward()
    _same_grads(lesson_mod, full, atol)


# ------------------------------------------------------------------------- TransformerLM


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("pad", [None, 0])
def test_transformer_lm_lesson_matches_package(causal, pad):
    Lesson = lesson("11", "lm-lesson", namespace=_namespace())["TransformerLM"]
    torch.manual_seed(0)
    full = lm_mod.TransformerLM(50, N=2, d_model=32, d_ff=64, h=4, causal=causal)
    small = Lesson(50, N=2, d_model=32, d_ff=64, h=4, causal=causal)
    tokens = torch.randint(1, 50, (3, 9))
    tokens[0, 6:] = 0  # padding at the end of one row
    tokens[1, 8:] = 0
    _compare(small, full, tokens, pad=pad)
    torch.testing.assert_close(small.mask(tokens, pad), full.mask(tokens, pad))


# ------------------------------------------------------------- LMCache, lm_step, generate


def _cache_lesson() -> dict:
    return lesson("11", "cache-lesson", namespace=_namespace())


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_lm_step_lesson_matches_package(kv_heads):
    ns = _cache_lesson()
    torch.manual_seed(1)
    attn = None if kv_heads is None else av.GroupedQueryAttention(4, 32, kv_heads)
    model = lm_mod.TransformerLM(40, N=2, d_model=32, d_ff=64, h=4, self_attn=attn).eval()
    tokens = torch.randint(0, 40, (2, 7))
    c_l, c_f = ns["LMCache"](model), lm_mod.LMCache(model)
    with torch.no_grad():
        for chunk in (tokens[:, :4], tokens[:, 4:5], tokens[:, 5:]):  # a prompt, 1, then 2
            torch.testing.assert_close(
                ns["lm_step"](model, c_l, chunk), lm_mod.lm_step(model, c_f, chunk)
            )
    assert c_l.length == c_f.length == 7
    for (kl, vl), (kf, vf) in zip(c_l.self_kv, c_f.self_kv, strict=True):
        torch.testing.assert_close(kl, kf)
        torch.testing.assert_close(vl, vf)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"temperature": 1.0},
        {"temperature": 0.8, "top_k": 5},
        {"top_p": 0.9, "temperature": 1.0},
    ],
)
def test_generate_lesson_gives_the_same_tokens(settings):
    ns = _cache_lesson()
    torch.manual_seed(2)
    model = lm_mod.TransformerLM(30, N=2, d_model=32, d_ff=64, h=4).eval()
    prompt = torch.randint(0, 30, (3, 4))
    ours = ns["generate"](model, prompt, 12, generator=torch.Generator().manual_seed(5), **settings)
    theirs = lm_mod.generate(
        model, prompt, 12, generator=torch.Generator().manual_seed(5), **settings
    )
    assert ours.shape == (3, 16)
    assert torch.equal(ours, theirs)


# ------------------------------------------------------------------ GroupedQueryAttention


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("bias", [True, False])
def test_gqa_lesson_matches_package(kv_heads, bias):
    Lesson = lesson("11", "gqa-lesson", namespace=_namespace())["GroupedQueryAttention"]
    torch.manual_seed(3)
    full = av.GroupedQueryAttention(4, 32, kv_heads, dropout=0.1, bias=bias)
    small = Lesson(4, 32, kv_heads, dropout=0.1, bias=bias)
    x, mem = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    causal = subsequent_mask(6)  # (1, 6, 6)
    _compare(small, full, x, x, x, causal)
    small.zero_grad(), full.zero_grad()
    pad = torch.ones(2, 1, 9, dtype=torch.bool)
    pad[1, 0, 5:] = False  # cross-attention over padded keys
    _compare(small, full, x, mem, mem, pad)
    small.zero_grad(), full.zero_grad()
    _compare(small, full, x, mem, mem)  # no mask


# ----------------------------------------------------------------------------------- RoPE


def test_rope_lesson_matches_package():
    ns = lesson("11", "rope-lesson", namespace=_namespace())
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 7, 16, generator=g)
    for start in (0, 5, 300):
        torch.testing.assert_close(
            ns["apply_rope"](x, start), av.apply_rope(x, start), atol=2e-4, rtol=1e-4
        )
    torch.manual_seed(4)
    full = av.RotaryAttention(4, 32, 2)
    small = ns["RotaryAttention"](4, 32, 2)
    x = torch.randn(2, 6, 32)
    _compare(small, full, x, x, x, subsequent_mask(6))
    # a step over a cache: the queries are the last positions of the keys
    q = x[:, -2:]
    torch.testing.assert_close(small(q, x, x), full(q, x, x), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------- RMSNorm and SwiGLU


def test_rmsnorm_and_swiglu_lessons_match_package():
    ns = lesson("11", "modern-lesson", namespace=_namespace())
    torch.manual_seed(5)
    x = torch.randn(2, 5, 16)
    full_norm = modern.RMSNorm(16)
    with torch.no_grad():
        full_norm.weight.uniform_(0.5, 1.5)  # not the ones it starts with
    _compare(ns["RMSNorm"](16), full_norm, x.clone().requires_grad_())
    _compare(ns["SwiGLU"](16, 24, dropout=0.1), modern.SwiGLU(16, 24, dropout=0.1), x)
