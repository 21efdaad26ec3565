"""The lesson versions of chapters 1 and 3 compute what the package computes.

Chapter 1 shows a short `AdditiveAttention` and chapter 3 a short `MultiHeadedAttention` (the
math and the shapes) and fold the package's full versions below them. These tests run the
lessons' cells from the committed notebooks (tests/_lessons.py), give both versions the same
weights with `load_state_dict`, and compare outputs and gradients, with and without masks,
including a query that may see no key at all.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests._lessons import lesson
from transformer_lib.attention import AdditiveAttention, attention, masked_softmax
from transformer_lib.masks import subsequent_mask
from transformer_lib.multihead import MultiHeadedAttention


def _namespace() -> dict:
    """What a chapter's earlier cells define that the lesson cells use."""
    return {
        "torch": torch,
        "nn": nn,
        "F": F,
        "attention": attention,
        "masked_softmax": masked_softmax,
    }


@pytest.fixture(scope="module")
def LessonMHA():
    return lesson("03", "mha-lesson", namespace=_namespace())["MultiHeadedAttention"]


@pytest.fixture(scope="module")
def LessonAdditive():
    return lesson("01", "additive-lesson", namespace=_namespace())["AdditiveAttention"]


def _grads(module: nn.Module, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    named = {f"input{i}": t.grad for i, t in enumerate(inputs)}
    named.update({n: p.grad for n, p in module.named_parameters()})
    return named


def _compare(lesson_mod, package_mod, make_inputs, mask, call) -> None:
    """Same inputs, same weights: outputs and every gradient must agree."""
    results = []
    for module in (lesson_mod, package_mod):
        inputs = [t.clone().requires_grad_(True) for t in make_inputs]
        out = call(module, inputs, mask)
        out = out[0] if isinstance(out, tuple) else out
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append((out.detach(), _grads(module, inputs)))
    (out_a, grads_a), (out_b, grads_b) = results
    torch.testing.assert_close(out_a, out_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], msg=name)


def _mha_pair(LessonMHA, h=4, d_model=32, dropout=0.0):
    torch.manual_seed(0)
    package = MultiHeadedAttention(h, d_model, dropout)
    taught = LessonMHA(h, d_model, dropout)
    # random biases too, so that a bias in the wrong place shows
    with torch.no_grad():
        package.in_proj.bias.normal_()
        package.out_proj.bias.normal_()
    taught.load_state_dict(package.state_dict())
    return taught.eval(), package.eval()


def _masks(batch: int, q_len: int, k_len: int) -> dict[str, torch.Tensor | None]:
    keep = torch.ones(batch, k_len, dtype=torch.bool)
    keep[-1, k_len - 2 :] = False  # the last sequence ends in two pads
    masks = {"none": None, "padding": keep[:, None, :]}
    if q_len == k_len:
        masks["padding & causal"] = keep[:, None, :] & subsequent_mask(q_len)
        # a query that may see no key: padded queries of a padded sequence
        masks["fully masked rows"] = keep[:, None, :] & keep[:, :, None]
    return masks


@pytest.mark.parametrize("store_attention", [False, True])
@pytest.mark.parametrize("mask_name", ["none", "padding", "padding & causal", "fully masked rows"])
def test_multihead_lesson_equals_package_in_self_attention(LessonMHA, store_attention, mask_name):
    taught, package = _mha_pair(LessonMHA)
    package.store_attention = store_attention
    x = torch.randn(3, 6, 32)
    mask = _masks(3, 6, 6)[mask_name]

    def call(module, inputs, mask):
        (t,) = inputs
        return module(t, t, t, mask)  # one tensor: the package's one-product branch

    _compare(taught, package, [x], mask, call)
    if store_attention:
        torch.testing.assert_close(taught.attn, package.attn)


@pytest.mark.parametrize("mask_name", ["none", "padding"])
def test_multihead_lesson_equals_package_in_cross_attention(LessonMHA, mask_name):
    taught, package = _mha_pair(LessonMHA)
    query, memory = torch.randn(3, 4, 32), torch.randn(3, 7, 32)
    mask = _masks(3, 4, 7)[mask_name]

    def call(module, inputs, mask):
        q, m = inputs
        return module(q, m, m, mask)

    _compare(taught, package, [query, memory], mask, call)
    # three different tensors: the package's separate projections
    value = torch.randn(3, 7, 32)

    def call3(module, inputs, mask):
        return module(*inputs, mask)

    _compare(taught, package, [query, memory, value], mask, call3)


def test_multihead_lesson_equals_package_project_kv_then_attend(LessonMHA):
    taught, package = _mha_pair(LessonMHA)
    query, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)
    k, v = package.project_kv(memory, memory)
    torch.testing.assert_close(package.attend(query, k, v), taught(query, memory, memory))


def test_multihead_lesson_equals_package_with_dropout_and_the_same_seed(LessonMHA):
    taught, package = _mha_pair(LessonMHA, dropout=0.3)
    taught.train(), package.train()
    package.store_attention = True  # the path that draws dropout as the lesson does
    x = torch.randn(2, 5, 32)
    torch.manual_seed(7)
    a = taught(x, x, x, subsequent_mask(5))
    torch.manual_seed(7)
    b = package(x, x, x, subsequent_mask(5))
    torch.testing.assert_close(a, b)
    assert (taught.attn == 0).any()  # dropout did act


def test_multihead_lesson_has_the_package_parameter_names(LessonMHA):
    taught = LessonMHA(8, 64, 0.1)
    package = MultiHeadedAttention(8, 64, 0.1)
    assert taught.state_dict().keys() == package.state_dict().keys()
    for name, t in taught.state_dict().items():
        assert t.shape == package.state_dict()[name].shape, name


@pytest.mark.parametrize("masked", [False, True])
def test_additive_lesson_equals_package(LessonAdditive, masked):
    torch.manual_seed(0)
    package = AdditiveAttention(query_size=5, key_size=3, num_hiddens=4).eval()
    taught = LessonAdditive(5, 3, 4).eval()
    taught.load_state_dict(package.state_dict())
    query, key, value = torch.randn(2, 3, 5), torch.randn(2, 4, 3), torch.randn(2, 4, 6)
    mask = None
    if masked:
        mask = torch.tensor([[True, True, False, False]]).expand(3, 4).clone()
        mask[1] = False  # the second query may see no key
        mask = mask.unsqueeze(0)  # (1, q_len, k_len)

    def call(module, inputs, mask):
        return module(*inputs, mask)

    _compare(taught, package, [query, key, value], mask, call)
    weights = package(query, key, value, mask)[1]
    if masked:
        assert (weights[:, 1] == 0).all() and (weights[..., 2:] == 0).all()


def test_additive_lesson_equals_package_with_dropout_and_the_same_seed(LessonAdditive):
    package = AdditiveAttention(5, 3, 8, dropout=0.5).train()
    taught = LessonAdditive(5, 3, 8, dropout=0.5).train()
    taught.load_state_dict(package.state_dict())
    query, key, value = torch.randn(2, 3, 5), torch.randn(2, 6, 3), torch.randn(2, 6, 4)
    torch.manual_seed(3)
    a = taught(query, key, value)
    torch.manual_seed(3)
    b = package(query, key, value)
    torch.testing.assert_close(a, b)
