"""Tests for transformer_lib.model (chapter 5): the assembled Transformer."""

from __future__ import annotations

import math
from functools import cache

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_lib.layers import LayerNorm
from transformer_lib.model import EncoderDecoder, count_parameters, make_model
from transformer_lib.multihead import MultiHeadedAttention

PAD = 0
SMALL = dict(N=2, d_model=16, d_ff=32, h=4)


def causal(n: int) -> torch.Tensor:
    """(1, n, n) bool, True where attending is allowed (independent of chapter 2's code)."""
    return torch.ones(n, n, dtype=torch.bool).tril().unsqueeze(0)


def pad_mask(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens != PAD).unsqueeze(1)  # (batch, 1, len)


@cache
def tiny(norm_first: bool, positional: str = "sinusoidal") -> EncoderDecoder:
    torch.manual_seed(0)
    model = make_model(
        11,
        13,
        **SMALL,
        dropout=0.1,
        norm_first=norm_first,
        positional=positional,
        max_len=64,
        pad_idx=PAD,
    )
    return model.eval()


def hand_count(N, d, d_ff, src_vocab, tgt_vocab, tied, norm_first=False, learned_len=0):
    """Parameter count written out from the paper's shapes."""
    attn = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder = N * (attn + ffn + 2 * norm) + (norm if norm_first else 0)
    decoder = N * (2 * attn + ffn + 3 * norm) + (norm if norm_first else 0)
    embeddings = tgt_vocab * d if tied else (src_vocab + tgt_vocab) * d
    generator = tgt_vocab if tied else tgt_vocab * d + tgt_vocab
    return encoder + decoder + embeddings + generator + 2 * learned_len * d


# ---------------------------------------------------------------- shapes and structure
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_forward_shapes_and_encode_decode(norm_first, positional):
    model = tiny(norm_first, positional)
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, PAD, PAD]])
    tgt = torch.tensor([[1, 2, 3], [1, 12, PAD]])
    src_mask, tgt_mask = pad_mask(src), pad_mask(tgt) & causal(3)
    out = model(src, tgt, src_mask, tgt_mask)
    assert out.shape == (2, 3, SMALL["d_model"])
    memory = model.encode(src, src_mask)
    assert memory.shape == (2, 5, SMALL["d_model"])
    torch.testing.assert_close(model.decode(memory, src_mask, tgt, tgt_mask), out)
    logp = model.generator(out)
    assert logp.shape == (2, 3, 13)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(2, 3))
    # chapter 7 embeds one step at a time: tgt_embed[0] then tgt_embed[1](x, start=t)
    step = model.tgt_embed[1](model.tgt_embed[0](tgt[:, 2:3]), start=2)
    torch.testing.assert_close(step, model.tgt_embed(tgt)[:, 2:3])


def test_structure_follows_the_paper():
    model = make_model(7, 9, N=3, d_model=16, d_ff=64, h=2, dropout=0.0)
    assert len(model.encoder.layers) == 3 and len(model.decoder.layers) == 3
    attns = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    assert len(attns) == 3 + 2 * 3 and len({id(a.in_proj.weight) for a in attns}) == 9
    w = [layer.feed_forward.w_1.weight for layer in model.encoder.layers]
    assert not torch.equal(w[0], w[1])  # separately initialized, not shared
    assert model.encoder.layers[0].feed_forward.w_1.out_features == 64
    assert isinstance(model.encoder.norm, nn.Identity) and isinstance(
        model.decoder.norm, nn.Identity
    )
    pre = make_model(7, 9, N=1, d_model=16, d_ff=64, h=2, norm_first=True)
    assert isinstance(pre.encoder.norm, LayerNorm) and isinstance(pre.decoder.norm, LayerNorm)
    assert model.generator.proj.out_features == 9 and model.src_embed[0].lut.num_embeddings == 7


# ---------------------------------------------------------------- masking properties
@settings(max_examples=20, deadline=None)
@given(
    norm_first=st.booleans(),
    tgt=st.lists(st.integers(1, 12), min_size=2, max_size=7),
    data=st.data(),
)
def test_decoder_output_is_causal_in_the_target_tokens(norm_first, tgt, data):
    model = tiny(norm_first)
    i = data.draw(st.integers(0, len(tgt) - 2), label="last unchanged position")
    new_tail = data.draw(
        st.lists(st.integers(1, 12), min_size=len(tgt) - i - 1, max_size=len(tgt) - i - 1)
    )
    src = torch.tensor([[3, 4, 5, 6]])
    a = torch.tensor([tgt])
    b = torch.tensor([tgt[: i + 1] + new_tail])
    mask = causal(len(tgt))
    with torch.no_grad():
        out_a, out_b = model(src, a, None, mask), model(src, b, None, mask)
    torch.testing.assert_close(out_b[:, : i + 1], out_a[:, : i + 1])


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_causal_mask_is_what_makes_it_causal(norm_first):
    model = tiny(norm_first)
    src, a = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[1, 2, 3, 4]])
    b = torch.tensor([[1, 2, 3, 9]])
    with torch.no_grad():  # without the mask, earlier positions see the last token
        assert not torch.allclose(model(src, a, None, None)[:, 0], model(src, b, None, None)[:, 0])


@settings(max_examples=20, deadline=None)
@given(
    norm_first=st.booleans(),
    length=st.integers(1, 5),
    garbage=st.lists(st.integers(0, 10), min_size=6, max_size=6),
)
def test_padded_source_tokens_do_not_matter(norm_first, length, garbage):
    model = tiny(norm_first)
    real = [3, 4, 5, 6, 7, 8][:length]
    src_a = torch.tensor([real + [PAD] * (6 - length)])
    src_b = torch.tensor([real + garbage[length:]])  # other tokens where the mask says "padding"
    src_mask = pad_mask(src_a)
    tgt = torch.tensor([[1, 5, 7]])
    with torch.no_grad():
        out_a = model(src_a, tgt, src_mask, causal(3))
        out_b = model(src_b, tgt, src_mask, causal(3))
    torch.testing.assert_close(out_b, out_a)


# ---------------------------------------------------------------- tied embeddings
def test_share_embeddings_ties_one_tensor_in_three_places():
    torch.manual_seed(0)
    model = make_model(20, 20, **SMALL, share_embeddings=True, pad_idx=PAD)
    src_w, tgt_w = model.src_embed[0].lut.weight, model.tgt_embed[0].lut.weight
    gen_w = model.generator.proj.weight
    assert src_w is tgt_w is gen_w
    assert src_w.data_ptr() == tgt_w.data_ptr() == gen_w.data_ptr()
    with torch.no_grad():
        model.src_embed[0].lut.weight[5].fill_(3.0)  # a change through one name shows in all
    assert torch.all(model.generator.proj.weight[5] == 3.0)
    untied = make_model(20, 20, **SMALL, pad_idx=PAD)
    assert count_parameters(untied) - count_parameters(model) == 2 * 20 * SMALL["d_model"]
    # one gradient accumulates the three uses
    src, tgt = torch.tensor([[2, 3, 4]]), torch.tensor([[1, 5, 6]])
    out = model.generator(model(src, tgt, None, causal(3)))
    out.sum().backward()
    assert model.generator.proj.weight.grad is model.src_embed[0].lut.weight.grad


def test_share_embeddings_needs_one_vocabulary():
    with pytest.raises(ValueError, match="src_vocab must equal tgt_vocab"):
        make_model(10, 12, **SMALL, share_embeddings=True)


# ---------------------------------------------------------------- parameter counts
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(share_embeddings=False),
        dict(share_embeddings=True),
        dict(norm_first=True),
        dict(positional="learned", max_len=40),
        dict(share_embeddings=True, norm_first=True, positional="learned", max_len=40),
    ],
)
def test_parameter_count_matches_hand_formula(kwargs):
    vocab = 30 if kwargs.get("share_embeddings") else 25
    model = make_model(30, vocab, N=3, d_model=24, d_ff=40, h=3, **kwargs)
    expected = hand_count(
        3,
        24,
        40,
        30,
        vocab,
        kwargs.get("share_embeddings", False),
        kwargs.get("norm_first", False),
        kwargs.get("max_len", 0) * (kwargs.get("positional") == "learned"),
    )
    assert count_parameters(model) == expected
    assert count_parameters(model) == sum(p.numel() for p in set(model.parameters()))


@pytest.mark.parametrize(
    ("config", "tied", "paper"),
    [
        (dict(N=6, d_model=512, d_ff=2048, h=8), True, 65e6),
        (dict(N=6, d_model=1024, d_ff=4096, h=16), True, 213e6),
    ],
)
def test_paper_sizes_on_the_meta_device(config, tied, paper):
    with torch.device("meta"):
        model = make_model(37000, 37000, **config, share_embeddings=tied)
    n = count_parameters(model)
    assert n == hand_count(config["N"], config["d_model"], config["d_ff"], 37000, 37000, tied)
    assert abs(n - paper) / paper < 0.04  # within the paper's rounding and "about 37000"
    assert all(p.is_meta for p in model.parameters())


# ---------------------------------------------------------------- gradients and init
@pytest.mark.parametrize("norm_first", [False, True])
def test_gradients_reach_every_parameter(norm_first):
    torch.manual_seed(0)
    model = make_model(11, 13, **SMALL, dropout=0.1, norm_first=norm_first, pad_idx=PAD)
    model.train()
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, PAD, PAD]])
    tgt = torch.tensor([[1, 2, 3, 4], [1, 12, 11, PAD]])
    inp, gold = tgt[:, :-1], tgt[:, 1:]
    out = model(src, inp, pad_mask(src), pad_mask(inp) & causal(3))
    loss = F.nll_loss(model.generator(out).flatten(0, 1), gold.flatten(), ignore_index=PAD)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.count_nonzero(p.grad) > 0, name
    for embed in (model.src_embed[0], model.tgt_embed[0]):
        assert torch.count_nonzero(embed.lut.weight.grad[PAD]) == 0  # padding row: no gradient
        assert torch.count_nonzero(embed.lut.weight[PAD]) == 0


def test_xavier_initialization():
    torch.manual_seed(0)
    d, d_ff, vocab = 256, 1024, 3000
    model = make_model(vocab, vocab, N=1, d_model=d, d_ff=d_ff, h=4, pad_idx=PAD)

    def check(w, fan_in, fan_out):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        assert w.abs().max() <= bound
        assert w.abs().max() > 0.98 * bound  # uniform over the whole interval
        assert abs(w.std().item() - bound / math.sqrt(3)) < 0.03 * bound / math.sqrt(3)

    for attn in (m for m in model.modules() if isinstance(m, MultiHeadedAttention)):
        for block in attn.in_proj.weight.chunk(3, dim=0):  # W^Q, W^K, W^V each d x d
            check(block, d, d)
        check(attn.out_proj.weight, d, d)
    for ff in (model.encoder.layers[0].feed_forward, model.decoder.layers[0].feed_forward):
        check(ff.w_1.weight, d, d_ff)
        check(ff.w_2.weight, d_ff, d)
    check(model.src_embed[0].lut.weight[1:], d, vocab)
    check(model.generator.proj.weight, d, vocab)
    assert torch.count_nonzero(model.src_embed[0].lut.weight[PAD]) == 0
    norm = model.encoder.layers[0].sublayer[0].norm
    assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)


# ---------------------------------------------------------------- modes, devices
def test_eval_mode_is_deterministic_and_train_mode_uses_dropout():
    torch.manual_seed(0)
    model = make_model(11, 13, **SMALL, dropout=0.3)
    src, tgt = torch.tensor([[2, 3, 4, 5]]), torch.tensor([[1, 6, 7]])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            model(src, tgt, None, causal(3)), model(src, tgt, None, causal(3))
        )
        model.train()
        assert not torch.allclose(
            model(src, tgt, None, causal(3)), model(src, tgt, None, causal(3))
        )


def test_float64_and_meta_device_forward():
    src, tgt = torch.tensor([[2, 3, 4, 5]]), torch.tensor([[1, 6, 7]])
    model = make_model(11, 13, **SMALL, dropout=0.0).double()
    assert model(src, tgt, pad_mask(src), causal(3)).dtype == torch.float64
    with torch.device("meta"):  # nothing in forward may create tensors on a fixed device
        meta = make_model(11, 13, **SMALL, dropout=0.0)
        out = meta(src.to("meta"), tgt.to("meta"), pad_mask(src).to("meta"), causal(3).to("meta"))
    assert out.is_meta and out.shape == (1, 3, SMALL["d_model"])


# ---------------------------------------------------------------- against torch.nn.Transformer
def _copy_attn(ours: MultiHeadedAttention, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(ours.in_proj.weight)
    theirs.in_proj_bias.copy_(ours.in_proj.bias)
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_ffn(ours, theirs) -> None:
    theirs.linear1.load_state_dict(ours.feed_forward.w_1.state_dict())
    theirs.linear2.load_state_dict(ours.feed_forward.w_2.state_dict())


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_match_torch_nn_transformer(norm_first):
    torch.manual_seed(0)
    N, d, h, d_ff = 3, 32, 4, 64
    model = make_model(50, 50, N=N, d_model=d, d_ff=d_ff, h=h, dropout=0.0, norm_first=norm_first)
    with torch.no_grad():  # random LayerNorm and bias parameters, so nothing is left at (1, 0)
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.2)
    ref = nn.Transformer(
        d, h, N, N, d_ff, dropout=0.0, batch_first=True, norm_first=norm_first, layer_norm_eps=1e-6
    )
    with torch.no_grad():
        for ours, theirs in zip(model.encoder.layers, ref.encoder.layers):
            _copy_attn(ours.self_attn, theirs.self_attn)
            _copy_ffn(ours, theirs)
            theirs.norm1.load_state_dict(ours.sublayer[0].norm.state_dict())
            theirs.norm2.load_state_dict(ours.sublayer[1].norm.state_dict())
        for ours, theirs in zip(model.decoder.layers, ref.decoder.layers):
            _copy_attn(ours.self_attn, theirs.self_attn)
            _copy_attn(ours.src_attn, theirs.multihead_attn)
            _copy_ffn(ours, theirs)
            for k, norm in enumerate((theirs.norm1, theirs.norm2, theirs.norm3)):
                norm.load_state_dict(ours.sublayer[k].norm.state_dict())
        if norm_first:  # both end pre-norm stacks with a LayerNorm
            ref.encoder.norm.load_state_dict(model.encoder.norm.state_dict())
            ref.decoder.norm.load_state_dict(model.decoder.norm.state_dict())
        else:  # nn.Transformer adds a final norm even to post-norm stacks; the paper has none
            ref.encoder.norm = None
            ref.decoder.norm = None
    model, ref = model.double(), ref.double().train()  # train(): no fast path; dropout is 0
    src = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 0, 0]])
    tgt = torch.tensor([[1, 13, 14, 15, 16], [1, 17, 18, 19, 20]])
    x_src, x_tgt = model.src_embed(src), model.tgt_embed(tgt)  # the same embeddings for both
    src_mask = src != 0  # (batch, src_len)
    ours_memory = model.encoder(x_src, src_mask.unsqueeze(1))
    ours_out = model.decoder(x_tgt, ours_memory, src_mask.unsqueeze(1), causal(5))
    ref_memory = ref.encoder(x_src, src_key_padding_mask=~src_mask)  # True = padding there
    ref_out = ref.decoder(
        x_tgt, ref_memory, tgt_mask=~causal(5)[0], memory_key_padding_mask=~src_mask
    )
    real = src_mask.unsqueeze(-1)
    torch.testing.assert_close(ours_memory * real, ref_memory * real)
    torch.testing.assert_close(ours_out, ref_out)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(d_model=30, h=4), "d_model must be divisible by h"),
        (dict(N=0), "N must be a positive integer"),
        (dict(src_vocab=0), "src_vocab must be a positive integer"),
        (dict(tgt_vocab=0), "tgt_vocab must be a positive integer"),
        (dict(d_ff=0), "d_ff must be a positive integer"),
        (dict(dropout=1.0), r"dropout must be a probability in \[0, 1\)"),
        (dict(dropout=-0.1), r"dropout must be a probability in \[0, 1\)"),
        (dict(dropout=True), r"dropout must be a real number in \[0, 1\)"),
        (dict(attn_dropout=float("nan")), r"attn_dropout must be a probability in \[0, 1\)"),
        (dict(ffn_dropout="0.1"), r"ffn_dropout must be a real number in \[0, 1\)"),
        (dict(positional="rotary"), "positional must be 'sinusoidal' or 'learned'"),
        (dict(pad_idx=10), r"pad_idx must be in \[0, 10\)"),
        (dict(activation="tanh"), "activation must be 'relu' or 'gelu'"),
    ],
)
def test_make_model_errors(kwargs, match):
    args = dict(src_vocab=10, tgt_vocab=12, N=1, d_model=16, d_ff=32, h=4) | kwargs
    with pytest.raises(ValueError, match=match):
        make_model(**args)


def test_forward_errors_name_the_argument():
    model = tiny(False)
    src, tgt = torch.tensor([[3, 4, 5]]), torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="src must be integer token ids"):
        model(src.float(), tgt, None, causal(2))
    with pytest.raises(ValueError, match="tgt must be integer token ids"):
        model(src, tgt.float(), None, causal(2))
    with pytest.raises(ValueError, match=r"src must have shape \(batch, len\)"):
        model.encode(torch.tensor([3, 4, 5]), None)
    with pytest.raises(ValueError, match="tgt must have the same batch size as src"):
        model(src, tgt.expand(2, 2), None, causal(2))
    with pytest.raises(ValueError, match="src_mask must have shape"):
        model(src, tgt, torch.ones(3, 1, 3, dtype=torch.bool), causal(2))
    with pytest.raises(ValueError, match="src_mask must be a bool tensor"):
        model.encode(src, torch.ones(1, 1, 3))
    with pytest.raises(ValueError, match="tgt_mask must be a bool tensor"):
        model(src, tgt, None, causal(2).float())
    memory = model.encode(src, None)
    with pytest.raises(ValueError, match="tgt must have the same batch size as memory"):
        model.decode(memory, None, tgt.expand(2, 2), causal(2))


def test_make_model_dropout_placement():
    default = make_model(20, 20, N=1, d_model=16, d_ff=32, h=2, dropout=0.3)
    paper = make_model(
        20, 20, N=1, d_model=16, d_ff=32, h=2, dropout=0.3, attn_dropout=0.0, ffn_dropout=0.0
    )
    for model, inner in ((default, 0.3), (paper, 0.0)):
        enc, dec = model.encoder.layers[0], model.decoder.layers[0]
        assert enc.self_attn.dropout.p == dec.src_attn.dropout.p == inner
        assert enc.feed_forward.dropout.p == dec.feed_forward.dropout.p == inner
        assert all(s.dropout.p == 0.3 for s in [*enc.sublayer, *dec.sublayer])  # residual
    # in eval mode dropout does nothing: the two placements compute the same function
    paper.load_state_dict(default.state_dict())
    src, tgt = torch.randint(1, 20, (2, 5)), torch.randint(1, 20, (2, 4))
    default.eval(), paper.eval()
    torch.testing.assert_close(default(src, tgt, None, None), paper(src, tgt, None, None))
    for bad in ({"attn_dropout": 1.0}, {"ffn_dropout": -0.1}, {"attn_dropout": "0.1"}):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"{name} must be a (probability|real number)"):
            make_model(20, 20, N=1, d_model=16, d_ff=32, h=2, **bad)
