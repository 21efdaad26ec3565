"""Train, evaluate and use a translation model on Multi30k (`python -m transformer_lib`).

Hand-written (chapter 8 uses it; the pieces it assembles — the model, `Batch`, `LabelSmoothing`,
`rate`, `train_step`, `greedy_decode`, `beam_search` — are the chapters' own). What it adds is
what a real training run needs: a checked config file, length-bucketed batches, gradient
accumulation, `DistributedDataParallel`, per-epoch validation loss and BLEU, atomic checkpoints
that resume mid-epoch exactly, checkpoint averaging, and the guards a long unattended run needs:
one run per directory (a lock), no silent change of settings on resume, and a stop with a clear
error, keeping the last good checkpoint, when the loss diverges.

The global batch of one optimizer step is ``accum * world_size`` micro-batches; each process takes
every ``world_size``-th one. The loss is normalised by the token count of the *global* batch, so
one process with ``accum=2`` and two processes with ``accum=1`` compute the same update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from transformer_lib._fileio import FileLock
from transformer_lib.checkpoint import (
    average_checkpoints,
    capture_rng_state,
    load_checkpoint,
    recover_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from transformer_lib.data import (
    BOS,
    EOS,
    LANGS,
    PAD,
    SPECIAL_TOKENS,
    collate,
    decode_ids,
    encode_pairs,
    encode_text,
    id_pieces,
    load_multi30k,
    load_tokenizer,
    make_batches,
    save_tokenizer,
    train_tokenizer,
)
from transformer_lib.decoding import beam_search, greedy_decode
from transformer_lib.masks import subsequent_mask
from transformer_lib.model import make_model
from transformer_lib.multihead import MultiHeadedAttention
from transformer_lib.positional import LearnedPositionalEmbedding
from transformer_lib.rnn import make_gru_model
from transformer_lib.training import Batch, LabelSmoothing, rate, train_step

__all__ = [
    "Config",
    "RESUMABLE_CHANGES",
    "load_config",
    "resolve_precision",
    "precision_note",
    "make_optimizer",
    "parameter_count",
    "train",
    "evaluate",
    "translate",
    "load_model",
    "bleu",
    "bleu_signature",
    "translate_sentences",
    "source_length_limit",
    "validation_loss",
    "attention_maps",
]

# Keys that may differ when a run is resumed: how long to train, where the data is, how often
# to save and validate, how to decode. Everything else defines the run (the model, the data it
# sees, the optimisation and its numerics) and must stay as it was.
RESUMABLE_CHANGES = frozenset({
    "epochs", "time_limit_min", "max_steps", "data_dir", "save_every", "keep_last", "average_last",
    "bleu_every", "beam_size", "length_penalty", "max_len_a", "max_len_b",
})
MAX_PARAMS = 10**9  # load_model refuses configs describing more parameters unless told otherwise


@dataclasses.dataclass
class Config:
    """Everything that defines a run; a TOML file sets any subset of these fields.

    Every field is checked (type and range) when a Config is made, so a bad value fails before
    any work starts, with a message naming the key.
    """

    # data
    data_dir: str | None = None  # None: transformer_lib.data.default_data_dir()
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_limit: int | None = None  # use the first n training pairs (CI and tests)
    val_limit: int | None = None
    vocab_size: int = 8000  # joint BPE over both languages
    max_tokens: int = 2500  # batch size x padded length (larger side) of one micro-batch
    drop_longer_than: int = 100  # training pairs with more subwords (either side) are dropped
    # model (the paper's names)
    arch: str = "transformer"  # or "gru": chapter 8's recurrent baseline (N, d_model, dropout)
    N: int = 3
    d_model: int = 256
    d_ff: int = 1024
    h: int = 4
    dropout: float = 0.1
    attn_dropout: float | None = None  # on attention weights; None = dropout
    ffn_dropout: float | None = None  # on the FFN's hidden activations; None = dropout
    norm_first: bool = True
    share_embeddings: bool = True
    positional: str = "sinusoidal"
    max_positions: int = 5000  # rows of the position table (a hard limit when "learned")
    # optimisation
    epochs: int = 20
    accum: int = 1  # micro-batches per optimizer step and process
    lr_factor: float = 1.0  # the Noam schedule's scale
    warmup: int = 800
    # "noam": the paper's warm-up then 1/sqrt(step). "linear": the same warm-up, then straight
    # down to 0 as the budget (time_limit_min or max_steps) runs out, so the last updates are
    # small however fast the machine is (chapter 8, time to quality). cooldown c in (0, 1]
    # scales either schedule by a line that falls from 1 to 0 over the last fraction c of the
    # budget: "linear" then holds its peak until then, "noam" decays as usual until then.
    # None: "linear" falls over the whole budget (c = 1), "noam" has no cool-down.
    schedule: str = "noam"
    cooldown: float | None = None
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    # False: Adam's weight decay, an L2 term added to every parameter's gradient, which Adam
    # then rescales per coordinate like the rest of the gradient. True: AdamW's decoupled
    # decay (Loshchilov & Hutter), w -= lr * weight_decay * w beside the Adam step, on the
    # weight matrices and embeddings only: biases and LayerNorm gains are not pulled to 0.
    decoupled_weight_decay: bool = False
    label_smoothing: float = 0.1
    clip_norm: float | None = 1.0
    # "fp32", "bf16" (autocast; weights and optimizer stay fp32) or "auto": bf16 where the
    # device has it natively, else fp32 (resolve_precision; a run records what it resolved to)
    precision: str = "fp32"
    # The fastest setting, measured in the performance appendix: precision "auto" and the
    # paper's dropout placement (attn_dropout = ffn_dropout = 0: residual and embedding dropout
    # only), which lets attention use the fused kernel. True sets those three fields. "auto",
    # not "bf16": on a CPU without native bf16 (AVX2) bf16 autocast is emulated and trains ~19x
    # slower than fp32 (94 vs 1,789 tokens/s, emulated AVX2, 2 threads, bench/train_steps.py's
    # "small" model; a real AVX2 machine: 48.9 vs 1,121). There the paper's placement in fp32
    # was still 1.19-1.23x faster than the default placement (2,159-2,309 vs 1,820-1,913
    # tokens/s, interleaved, emulated), so `fast` keeps it and only falls back to fp32.
    fast: bool = False
    seed: int = 1
    # checkpoints and evaluation
    save_every: int = 200  # optimizer steps between resumable checkpoints
    keep_last: int = 5  # per-epoch weight snapshots kept for averaging
    average_last: int = 5  # average the last k epoch snapshots at the end (0 or 1: off)
    bleu_every: int = 1  # validation BLEU every k epochs (greedy; 0: never)
    beam_size: int = 4  # evaluate and translate: beam width (1 = greedy)
    length_penalty: float = 0.6  # beam search's GNMT length penalty alpha
    max_len_a: float = 1.5  # decode at most a * source length + b tokens
    max_len_b: int = 10
    time_limit_min: float | None = None  # stop training after this many minutes
    max_steps: int | None = None  # ... or after this many optimizer steps (a compute budget)

    def __post_init__(self) -> None:
        if isinstance(self.adam_betas, list):
            self.adam_betas = tuple(self.adam_betas)
        _validate(self)
        if self.fast:
            self.precision, self.attn_dropout, self.ffn_dropout = "auto", 0.0, 0.0
        if self.schedule == "linear" and self.cooldown is None:  # falls over the whole budget
            self.cooldown = 1.0

    def build_model(self, vocab: int) -> nn.Module:
        """The model this config describes, for a joint vocabulary of `vocab` subwords."""
        if self.arch == "gru":
            return make_gru_model(vocab, self.d_model, self.N, self.dropout, PAD,
                                  self.share_embeddings)
        return make_model(**self.model_kwargs(vocab))

    def model_kwargs(self, vocab: int) -> dict[str, Any]:
        """Arguments of ``make_model`` for a joint vocabulary of `vocab` subwords."""
        return dict(
            src_vocab=vocab, tgt_vocab=vocab, N=self.N, d_model=self.d_model, d_ff=self.d_ff,
            h=self.h, dropout=self.dropout, attn_dropout=self.attn_dropout,
            ffn_dropout=self.ffn_dropout, norm_first=self.norm_first,
            share_embeddings=self.share_embeddings, positional=self.positional,
            max_len=self.max_positions, pad_idx=PAD,
        )

    def decode_kwargs(self, length_penalty: float | None = None) -> dict[str, Any]:
        """The settings of ``translate_sentences`` this config holds (beam width aside).

        Not the precision: the one a model was trained in is no order for translating it
        (``translate_sentences`` defaults to "auto", what this machine runs fastest).

        `length_penalty`: replaces the config's alpha (None: keep it), e.g. one chosen on the
        validation set after training (``tools/multi30k_report.py --length-penalties``).
        """
        if length_penalty is not None and not (_is_num(length_penalty) and length_penalty >= 0):
            raise ValueError(f"length_penalty must be a number >= 0 (beam search's alpha), "
                             f"got {length_penalty!r}")
        alpha = self.length_penalty if length_penalty is None else length_penalty
        return dict(length_penalty=alpha, max_len_a=self.max_len_a, max_len_b=self.max_len_b)


def _is_int(v: Any, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(lo: int, optional: bool = False) -> tuple[Callable[[Any], bool], str]:
    text = f"an integer >= {lo}"
    return (lambda v: (optional and v is None) or _is_int(v, lo),
            f"None or {text}" if optional else text)


def _num(test: Callable[[float], bool], text: str, optional: bool = False):
    return (lambda v: (optional and v is None) or (_is_num(v) and test(v)),
            f"None or {text}" if optional else text)


def _choice(*options: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in options), f"one of {list(options)}"


_PROB = _num(lambda v: 0 <= v < 1, "a number in [0, 1)")
_BOOL = ((lambda v: isinstance(v, bool)), "true or false")
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "data_dir": ((lambda v: v is None or isinstance(v, str)), "None or a folder path"),
    "src_lang": _choice(*LANGS), "tgt_lang": _choice(*LANGS),
    "train_limit": _int(1, optional=True), "val_limit": _int(1, optional=True),
    "vocab_size": _int(len(SPECIAL_TOKENS) + 256), "max_tokens": _int(16),
    "drop_longer_than": _int(1),
    "N": _int(1), "d_model": _int(1), "d_ff": _int(1), "h": _int(1), "dropout": _PROB,
    "attn_dropout": _num(lambda v: 0 <= v < 1, "a number in [0, 1)", optional=True),
    "ffn_dropout": _num(lambda v: 0 <= v < 1, "a number in [0, 1)", optional=True),
    "norm_first": _BOOL, "share_embeddings": _BOOL, "fast": _BOOL,
    "positional": _choice("sinusoidal", "learned"), "max_positions": _int(1),
    "arch": _choice("transformer", "gru"),
    "epochs": _int(1), "accum": _int(1), "lr_factor": _num(lambda v: v > 0, "a number > 0"),
    "warmup": _int(1), "schedule": _choice("noam", "linear"),
    "cooldown": _num(lambda v: 0 < v <= 1, "a number in (0, 1]", optional=True),
    "adam_betas": ((lambda v: isinstance(v, (tuple, list)) and len(v) == 2
                    and all(_is_num(b) and 0 <= b < 1 for b in v)),
                   "two numbers in [0, 1), e.g. [0.9, 0.98]"),
    "adam_eps": _num(lambda v: v > 0, "a number > 0"),
    "weight_decay": _num(lambda v: v >= 0, "a number >= 0"), "label_smoothing": _PROB,
    "decoupled_weight_decay": _BOOL,
    "clip_norm": _num(lambda v: v > 0, "a number > 0", optional=True),
    "precision": _choice("fp32", "bf16", "auto"), "seed": _int(0), "save_every": _int(1),
    "keep_last": _int(1), "average_last": _int(0), "bleu_every": _int(0), "beam_size": _int(1),
    "length_penalty": _num(lambda v: v >= 0, "a number >= 0"),
    "max_len_a": _num(lambda v: v >= 0, "a number >= 0"), "max_len_b": _int(1),
    "time_limit_min": _num(lambda v: v > 0, "a number > 0", optional=True),
    "max_steps": _int(1, optional=True),
}


def _validate(cfg: Config) -> None:
    """Raise ValueError naming the first key whose value has the wrong type or range."""
    for key, (ok, text) in _RULES.items():
        value = getattr(cfg, key)
        if not ok(value):
            raise ValueError(f"config: {key} must be {text}, got {value!r}")
    transformer = cfg.arch == "transformer"  # the GRU baseline has no heads or positions
    problems = [
        (transformer and cfg.d_model % cfg.h != 0, f"h must divide d_model, got h = {cfg.h}, "
                                                   f"d_model = {cfg.d_model}"),
        (transformer and cfg.positional == "sinusoidal" and cfg.d_model % 2 == 1,
         f"d_model must be even for sinusoidal positions, got {cfg.d_model}"),
        (not transformer and cfg.N < 2, f"N must be >= 2 for arch = 'gru' (a decoder layer "
                                        f"asks attention, the others read it), got {cfg.N}"),
        (not transformer and cfg.d_model % 2 == 1,
         f"d_model must be even for arch = 'gru' (two encoder directions), got {cfg.d_model}"),
        (cfg.src_lang == cfg.tgt_lang, f"src_lang and tgt_lang must differ, both are "
                                       f"{cfg.src_lang!r}"),
        (cfg.schedule == "linear" and not (cfg.time_limit_min or cfg.max_steps),
         "schedule = 'linear' decays to 0 at the end of the budget: set time_limit_min or "
         "max_steps"),
        (cfg.cooldown is not None and not (cfg.time_limit_min or cfg.max_steps),
         f"cooldown ({cfg.cooldown}) falls to 0 at the end of the budget: set "
         f"time_limit_min or max_steps"),
        (cfg.average_last > cfg.keep_last, f"average_last ({cfg.average_last}) cannot exceed "
                                           f"keep_last ({cfg.keep_last}), the snapshots kept"),
    ]
    if cfg.fast:  # precision "fp32" may be the default here; load_config sees what was set
        clash = {k: getattr(cfg, k) for k in ("attn_dropout", "ffn_dropout")
                 if getattr(cfg, k) not in (None, 0)}
        problems.append((bool(clash), f"fast = true means attn_dropout = ffn_dropout = 0, "
                                      f"but {clash} is also set; drop one"))
    for bad, message in problems:
        if bad:
            raise ValueError(f"config: {message}")


def load_config(path: str | Path | None, **overrides: Any) -> Config:
    """Read a TOML config (flat keys, or grouped in any tables) and apply overrides.

    ``fast = true`` (CLI ``--fast``) is shorthand for ``precision = "auto"``,
    ``attn_dropout = 0`` and ``ffn_dropout = 0``; it replaces those keys of the file when given
    as an override, and a contradicting value set alongside it is an error. Every value is
    checked (see ``Config``); errors name the key.
    """
    values: dict[str, Any] = _read_toml(Path(path)) if path is not None else {}
    over = {k: v for k, v in overrides.items() if v is not None}
    fast_values = {"precision": "auto", "attn_dropout": 0.0, "ffn_dropout": 0.0}
    if over.get("fast"):  # the override replaces what the file says about these keys
        values = {k: v for k, v in values.items() if k not in fast_values}
    values.update(over)
    if values.get("fast"):
        clash = {k: values[k] for k, want in fast_values.items()
                 if values.get(k) is not None and values[k] != want}
        if clash:
            raise ValueError(f"config: fast = true means precision 'auto' (bf16 where the "
                             f"machine has it natively, else fp32) and attn_dropout = "
                             f"ffn_dropout = 0, but {clash} is also set; drop one of them")
    if "max_len" in values:
        raise ValueError(
            "config: max_len was renamed drop_longer_than (training pairs with more subwords "
            "are dropped); the position table is max_positions, and translations are at most "
            "max_len_a * source length + max_len_b tokens"
        )
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"config: unknown key(s) {unknown}; expected some of {sorted(fields)}")
    return Config(**values)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config {path} is not valid TOML: {e}") from e
    values: dict[str, Any] = {}
    for key, val in raw.items():
        if isinstance(val, dict):  # [data], [model], [train] … tables are only grouping
            values.update(val)
        else:
            values[key] = val
    return values


def parameter_count(cfg: Config, vocab: int) -> int:
    """Parameters of ``cfg.build_model(vocab)``, computed without building it.

    Used to refuse a config that would allocate more memory than intended before any
    allocation happens (a checkpoint's config.json is input like any other file).
    """
    if cfg.arch == "gru":
        d, n = cfg.d_model, cfg.N

        def gru(inp: int, hidden: int) -> int:  # three gates, two biases each
            return 3 * (inp * hidden + hidden * hidden + 2 * hidden)

        encoder = n * 2 * gru(d, d // 2)  # both directions; every layer reads d features
        decoder = gru(d, d) + gru(2 * d, d) + (n - 2) * gru(d, d)
        start = d * n * d + n * d
        attention = 2 * d * d + d  # W, U and v, no biases
        out = 2 * d * d + d
        embeddings = vocab * d * (1 if cfg.share_embeddings else 3) + vocab  # + generator bias
        return encoder + decoder + start + attention + out + embeddings
    d, f, n = cfg.d_model, cfg.d_ff, cfg.N
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    ffn = d * f + f + f * d + d
    norm = 2 * d
    final = norm if cfg.norm_first else 0  # pre-norm stacks end with a LayerNorm
    encoder = n * (attention + ffn + 2 * norm) + final
    decoder = n * (2 * attention + ffn + 3 * norm) + final
    embeddings = vocab * d * (1 if cfg.share_embeddings else 3) + vocab  # + generator bias
    positions = 2 * cfg.max_positions * d if cfg.positional == "learned" else 0
    return encoder + decoder + embeddings + positions


# --------------------------------------------------------------------------- distributed


def _dist_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _maybe_init_distributed(device: torch.device) -> bool:
    """Join the process group when started by torchrun (WORLD_SIZE > 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    return True


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _all_sum(x: float, device: torch.device) -> float:
    if _dist_info()[1] == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def _on_rank0_then_share(work: Callable[[], Any], rank: int, world: int) -> Any:
    """Run `work` on rank 0; every rank raises if it failed (so none waits at a barrier)."""
    result, error = None, None
    if rank == 0:
        try:
            result = work()
        except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
            error = e
    if world > 1:
        box = [None if error is None else f"{type(error).__name__}: {error}"]
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None and error is None:
            raise RuntimeError(f"rank 0 could not start the run: {box[0]}")
    if error is not None:
        raise error
    return result


def _bf16_native(device: torch.device) -> bool:
    """Whether `device` computes in bfloat16 in hardware (elsewhere autocast emulates it)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu":
        return False
    try:  # oneDNN's answer: AVX512-BF16 or AMX on x86 (not AVX2), bf16 instructions on Arm
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """The precision that runs on `device`: "fp32" or "bf16" as given; "auto" picks bf16 where
    `device` has it natively, else fp32.

    Where bf16 is emulated (a CPU with AVX2 but no AVX512-BF16/AMX), bf16 autocast is slower
    than fp32: translating with beam 4 1.9x, training ~20x. Raises ValueError naming
    `precision` for any other value.
    """
    if precision not in ("fp32", "bf16", "auto"):
        raise ValueError(f"precision must be 'fp32', 'bf16' or 'auto', got {precision!r}")
    if precision != "auto":
        return precision
    return "bf16" if _bf16_native(torch.device(device)) else "fp32"


def precision_note(precision: str, device: torch.device | str, *, fast: bool = False) -> str:
    """One line for a log: the precision `precision` resolves to on `device`, and why."""
    device = torch.device(device)
    used, native = resolve_precision(precision, device), _bf16_native(device)
    here = f"this {'GPU' if device.type == 'cuda' else device.type.upper()}"
    if fast and not native:
        return (f"precision: fp32 (fast: {here} has no native bfloat16, where bf16 autocast is "
                "emulated and ~20x slower; fast trains in fp32 with the paper's dropout "
                "placement)")
    if precision == "auto":
        return f"precision: {used} (auto: {here} has {'' if native else 'no '}native bfloat16)"
    if used == "bf16" and not native:
        return (f"precision: bf16 (as asked; {here} has no native bfloat16, so it is emulated "
                "and slower than fp32, which precision 'auto' would pick)")
    return f"precision: {used}"


def _autocast(precision: str, device: torch.device):
    """bfloat16 autocast where `precision` resolves to "bf16" (weights stay fp32), else nothing."""
    if resolve_precision(precision, device) == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# --------------------------------------------------------------------------- starting a run


def _check_run_dir(cfg: Config, run_dir: Path, resume: bool) -> None:
    """Refuse what would silently mix two runs in one directory (before anything is written)."""
    last = run_dir / "last"
    if resume and not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {run_dir} does not exist, so there is nothing to resume; "
            "start a new run without resume (--resume)"
        )
    has_checkpoint = recover_checkpoint(last)
    if not resume and (has_checkpoint or (run_dir / "history.json").exists()):
        raise FileExistsError(
            f"{run_dir} already holds a run; continue it with resume (--resume), "
            "or choose another run directory"
        )
    if resume and has_checkpoint:
        saved = load_checkpoint(last, None)["config"]
        _check_same_config(cfg, saved, last)


def _check_same_config(cfg: Config, saved: dict[str, Any], where: Path) -> None:
    if "max_len" in saved:  # written before drop_longer_than had its own name
        saved = {**saved, "drop_longer_than": saved["max_len"]}
    now = dataclasses.asdict(cfg)
    # A key missing from the saved config did not exist yet when the run started: it had
    # the behaviour of its default.
    saved = {**dataclasses.asdict(Config()), **saved}
    if saved["fast"]:  # saved when fast meant precision "bf16"; it now means "auto"
        saved["precision"] = "auto"
    differ = [
        f"{k}: {saved[k]!r} in the run, {now[k]!r} now"
        for k in now
        if k not in RESUMABLE_CHANGES and _jsonable(saved[k]) != _jsonable(now[k])
    ]
    if differ:
        raise ValueError(
            f"cannot resume {where} with a different config ({'; '.join(differ)}); only "
            f"{sorted(RESUMABLE_CHANGES)} may change on resume: restore the other values, or "
            "start a new run in another directory"
        )


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _start_run(cfg: Config, run_dir: Path, resume: bool, rank: int, world: int) -> FileLock | None:
    """Rank 0 takes the run directory's lock and checks it; then config.json is written."""

    def start() -> FileLock:
        if resume and not run_dir.is_dir():
            _check_run_dir(cfg, run_dir, resume)  # raises: do not create what we refuse
        run_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(run_dir / ".lock", what=f"run directory {run_dir}").acquire()
        try:
            _check_run_dir(cfg, run_dir, resume)
            (run_dir / "config.json").write_text(
                json.dumps(dataclasses.asdict(cfg), indent=2), encoding="utf-8"
            )
        except BaseException:
            lock.release()
            raise
        return lock

    return _on_rank0_then_share(start, rank, world)


# --------------------------------------------------------------------------- data


def _prepare_data(cfg: Config, run_dir: Path, tokenizer_file: Path | None, rank: int, world: int):
    """(tokenizer, training examples, validation examples, validation pairs).

    A resumed run reads the tokenizer of its checkpoint (`tokenizer_file`, verified); a new
    run trains one (deterministic) and rank 0 saves it into the run directory.
    """
    train_pairs = load_multi30k("train", cfg.data_dir, cfg.src_lang, cfg.tgt_lang,
                                limit=cfg.train_limit)
    val_pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang,
                              limit=cfg.val_limit)
    if tokenizer_file is not None:
        tok = load_tokenizer(tokenizer_file)
    else:
        tok = train_tokenizer([s for pair in train_pairs for s in pair], vocab_size=cfg.vocab_size)
        if rank == 0:
            save_tokenizer(tok, run_dir / "tokenizer.json")
        if world > 1:
            dist.barrier()
            tok = load_tokenizer(run_dir / "tokenizer.json")  # every rank uses rank 0's file
    # Training drops the few pairs longer than drop_longer_than subwords; validation keeps all.
    train = encode_pairs(train_pairs, tok, cfg.drop_longer_than)
    return tok, train, encode_pairs(val_pairs, tok), val_pairs


def _epoch_steps(cfg: Config, train: Sequence, epoch: int, world: int) -> list[list[list[int]]]:
    """The epoch's optimizer steps: each a list of accum*world micro-batches of indices."""
    batches = make_batches(train, cfg.max_tokens, shuffle=True, seed=cfg.seed * 1000 + epoch)
    per_step = cfg.accum * world
    return [batches[i : i + per_step] for i in range(0, len(batches) - per_step + 1, per_step)]


# --------------------------------------------------------------------------- training


@dataclasses.dataclass
class _State:
    """The resumable position of a run (saved in every checkpoint's train_state)."""

    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0  # optimizer steps done in the current epoch
    step: int = 0  # optimizer steps in total
    tokens: int = 0  # target tokens trained on
    train_seconds: float = 0.0
    best_bleu: float = -1.0
    history: list = dataclasses.field(default_factory=list)
    # The current epoch's summed training loss and target tokens over all processes, so a
    # resumed epoch reports the loss of the whole epoch, not of the steps after the resume.
    epoch_loss: float = 0.0
    epoch_tokens: int = 0


@dataclasses.dataclass
class _Run:
    """What the steps of one training run share (so helpers take one argument, not ten)."""

    cfg: Config
    run_dir: Path
    device: torch.device
    rank: int
    world: int
    model: nn.Module
    forward: nn.Module  # the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    scheduler: Any
    criterion: nn.Module
    tok: Any
    train_data: list
    val_data: list
    val_pairs: list
    state: _State
    saved_step: int | None = None  # step of the newest `last` checkpoint
    precision: str = "fp32"  # cfg.precision resolved on this machine ("auto": per machine)
    loss_sum: float = 0.0  # this process's share of the epoch's loss (see _State.epoch_loss)
    tok_sum: int = 0


def train(
    cfg: Config,
    run_dir: str | Path,
    *,
    resume: bool = False,
    device: torch.device | None = None,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train a model as `cfg` says, writing checkpoints and metrics into `run_dir`.

    Returns the history (per-epoch train loss, validation loss and BLEU; when the time limit
    stopped training inside an epoch, a last record with ``epoch_fraction``). `on_step(step)` is
    called after every optimizer step (tests use it to simulate an interruption). With
    `progress`, rank 0 first writes one line naming the precision (``precision_note``).
    Precision "auto" (and so ``fast``) resolves on the machine that runs, resumed runs too:
    every epoch's record names the precision it trained in.

    Raises before writing anything: ``LockHeld`` if another process trains in `run_dir`;
    ``FileExistsError`` if `run_dir` holds a run and not `resume`; ``FileNotFoundError`` if
    `resume` and `run_dir` does not exist; ``ValueError`` if `resume` and the config differs
    from the run's in a key outside ``RESUMABLE_CHANGES``. Raises ``FloatingPointError`` if
    the loss stops being finite: nothing after the last good checkpoint is saved.
    """
    _validate(cfg)  # again: the fields of a dataclass can be assigned after it was made
    run_dir = Path(run_dir)
    device = device or _default_device()
    started_dist = _maybe_init_distributed(device)
    rank, world = _dist_info()
    lock = _start_run(cfg, run_dir, resume, rank, world)
    try:
        if progress and rank == 0:
            print(precision_note(cfg.precision, device, fast=cfg.fast), file=sys.stderr)
        run = _setup(cfg, run_dir, resume, device, rank, world)
        partial = _train_epochs(run, progress, on_step)
        if rank == 0 and cfg.average_last > 1:
            snaps = sorted(run_dir.glob("epoch_*"))[-cfg.average_last :]
            if len(snaps) > 1:
                run.model.load_state_dict(average_checkpoints(snaps), strict=False)
                _save(run, run_dir / "averaged", resumable=False)
    finally:
        if lock is not None:
            lock.release()
    if started_dist:
        dist.barrier()
        dist.destroy_process_group()
    history = run.state.history + ([partial] if partial else [])
    return {"history": history, "steps": run.state.step, "minutes": run.state.train_seconds / 60,
            "precision": run.precision}


def make_optimizer(cfg: Config, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """Adam with the config's betas, eps and weight decay (AdamW if `decoupled_weight_decay`).

    The learning rate is 1: the schedule (`lr_multiplier`) sets it at every step.
    """
    # fused: one kernel updates every parameter (PyTorch's foreach Adam makes several passes)
    common = dict(lr=1.0, betas=cfg.adam_betas, eps=cfg.adam_eps,
                  fused=device.type in ("cpu", "cuda") or None)
    if not cfg.decoupled_weight_decay:
        return torch.optim.Adam(model.parameters(), weight_decay=cfg.weight_decay, **common)
    params = list(model.parameters())  # a tied embedding appears once
    return torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        **common,
    )


def _setup(cfg: Config, run_dir: Path, resume: bool, device: torch.device, rank: int,
           world: int) -> _Run:
    """Data, model, optimizer and schedule; with `resume`, their state from RUN/last."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    last = run_dir / "last"
    info = load_checkpoint(last, None) if resume and last.is_dir() else None
    tok, train_data, val_data, val_pairs = _prepare_data(
        cfg, run_dir, info["tokenizer"] if info else None, rank, world
    )
    vocab = tok.get_vocab_size()
    model = cfg.build_model(vocab).to(device)
    optimizer = make_optimizer(cfg, model, device)
    state, saved_step = _State(), None
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(cfg, state))
    if info is not None:
        info = load_checkpoint(last, model, optimizer, scheduler, map_location=device)
        # in place: the schedule reads this object's progress
        vars(state).update(vars(_State(**info["train_state"])))
        saved_step = state.step
        # Every process continues from its own random state (dropout masks, shuffling).
        saved = info["extra"]["rng"]
        restore_rng_state(saved[rank] if rank < len(saved) else saved[0])
    forward = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    criterion = LabelSmoothing(vocab, PAD, cfg.label_smoothing)
    run = _Run(cfg, run_dir, device, rank, world, model, forward, optimizer, scheduler,
               criterion, tok, train_data, val_data, val_pairs, state, saved_step,
               precision=resolve_precision(cfg.precision, device))
    if rank == 0:  # the epoch's loss so far counts once, on rank 0
        run.loss_sum, run.tok_sum = state.epoch_loss, state.epoch_tokens
    return run


def budget_spent(cfg: Config, step: int, train_seconds: float) -> float:
    """The fraction in [0, 1] of the run's budget used: steps or minutes, whichever is ahead."""
    spent = 0.0
    if cfg.max_steps:
        spent = step / cfg.max_steps
    if cfg.time_limit_min:
        spent = max(spent, train_seconds / (60 * cfg.time_limit_min))
    return min(spent, 1.0)


def lr_multiplier(cfg: Config, state: _State | None = None) -> Callable[[int], float]:
    """The learning rate of optimizer step s, for ``LambdaLR`` with base lr 1.

    "noam" is chapter 6's `rate`; "linear" warms up alike to the same peak and holds it:
    peak * min(1, s / warmup). A cool-down then multiplies either by
    min(1, (1 - spent) / cooldown), a line that falls to 0 over the last `cooldown` of the
    budget ("linear" alone: cooldown 1, the fall starts at once; "noam" alone: none). With
    cooldown 0.4 "linear" stays at its peak for the first 60% of the budget.
    A time budget is read from `state.train_seconds` as training goes, so the line ends when
    the minutes end on any machine (`state` None: no time spent, for plots). A closure, not
    an object, so that the scheduler's saved state holds no config.
    """
    peak = rate(cfg.warmup, cfg.d_model, cfg.lr_factor, cfg.warmup)

    def multiplier(s: int) -> float:
        if cfg.schedule == "noam":
            lr = rate(s, cfg.d_model, cfg.lr_factor, cfg.warmup)
        else:
            lr = peak * min(1.0, max(s, 1) / cfg.warmup)
        if cfg.cooldown is None:  # "noam" alone ("linear" has 1.0: Config.__post_init__)
            return lr
        spent = budget_spent(cfg, s, state.train_seconds if state is not None else 0.0)
        return lr * min(1.0, (1.0 - spent) / cfg.cooldown)

    return multiplier


def _train_epochs(run: _Run, progress: bool, on_step: Callable[[int], None] | None):
    """Train the remaining epochs; return the record of a time-limited partial epoch or None."""
    cfg, state = run.cfg, run.state
    t0 = time.perf_counter() - state.train_seconds
    for epoch in range(state.epoch, cfg.epochs):
        steps = _epoch_steps(cfg, run.train_data, epoch, run.world)
        run.model.train()
        _train_steps(run, epoch, steps, t0, progress, on_step)
        out_of_time = _out_of_budget(cfg, state)
        partial = out_of_time and state.step_in_epoch < len(steps)
        record = _end_of_epoch(run, epoch, partial, len(steps))
        if out_of_time:
            return record if partial else None
    return None


def _train_steps(run: _Run, epoch: int, steps: list, t0: float, progress: bool,
                 on_step: Callable[[int], None] | None) -> None:
    """The optimizer steps of one epoch from where the state says, until done or out of time."""
    from tqdm import tqdm

    cfg, state = run.cfg, run.state
    bar = tqdm(
        total=len(steps), initial=state.step_in_epoch, desc=f"epoch {epoch + 1}",
        disable=not progress or run.rank != 0, file=sys.stderr, dynamic_ncols=True,
    )
    tick, tick_tokens = time.perf_counter(), 0
    for micro in steps[state.step_in_epoch :]:
        loss, ntok = _step(run, micro)
        state.step += 1
        state.step_in_epoch += 1
        state.tokens += ntok
        run.loss_sum, run.tok_sum, tick_tokens = run.loss_sum + loss, run.tok_sum + ntok, \
            tick_tokens + ntok
        elapsed = time.perf_counter() - tick
        bar.set_postfix(loss=f"{loss / max(ntok, 1):.3f}",
                        lr=f"{run.scheduler.get_last_lr()[0]:.2e}",
                        **{"tok/s": f"{tick_tokens / max(elapsed, 1e-9):.0f}"})
        bar.update()
        state.train_seconds = time.perf_counter() - t0
        if state.step % cfg.save_every == 0:
            _save(run, run.run_dir / "last", resumable=True)
        if on_step is not None:
            on_step(state.step)
        if _out_of_budget(cfg, state):
            break
    bar.close()


def _out_of_budget(cfg: Config, state: _State) -> bool:
    """True once the run's time limit or step budget is used up."""
    return budget_spent(cfg, state.step, state.train_seconds) >= 1.0


def _step(run: _Run, micro: list[list[int]]) -> tuple[float, int]:
    """One optimizer step over the global batch `micro` (this rank takes every world-th part)."""
    batches = [Batch(*collate(run.train_data, idx, pad=PAD, device=run.device), pad=PAD)
               for idx in micro[run.rank :: run.world]]
    local_tokens = sum(b.ntokens for b in batches)
    # DDP averages gradients over processes; scaling by world undoes that, so the update is
    # the sum of per-token losses over the global batch divided by its token count.
    scale = run.world / _all_sum(local_tokens, run.device)
    try:
        return train_step(
            run.model, batches, run.criterion, run.optimizer, precision=run.precision,
            clip_norm=run.cfg.clip_norm, scheduler=run.scheduler, forward=run.forward,
            loss_scale=scale,
        )
    except FloatingPointError as e:
        raise _diverged(run, str(e)) from e


def _diverged(run: _Run, why: str) -> FloatingPointError:
    last = run.run_dir / "last"
    kept = (f"the last good checkpoint is {last} (step {run.saved_step})"
            if run.saved_step is not None else "no checkpoint was saved yet")
    return FloatingPointError(
        f"training diverged at step {run.state.step + 1} ({why}); nothing later was saved, "
        f"{kept}; lower lr_factor, raise warmup or set clip_norm, then resume or start again"
    )


def _end_of_epoch(run: _Run, epoch: int, partial: bool, n_steps: int) -> dict[str, Any]:
    """Validate, snapshot, keep the best by validation BLEU; return the epoch's record.

    When the time limit stops training inside an epoch, the partial epoch gets the same
    treatment (its record says how much of the epoch it saw), so its training counts in
    `best` and `averaged`; it is kept out of the resumable state, so resuming finishes the
    epoch and then replaces the partial record and snapshot with the full ones.
    """
    cfg, state = run.cfg, run.state
    loss_sum, tok_sum = _all_sum(run.loss_sum, run.device), _all_sum(run.tok_sum, run.device)
    record = {"epoch": epoch + 1, "step": state.step, "tokens": state.tokens,
              "train_loss": loss_sum / max(tok_sum, 1), "minutes": state.train_seconds / 60,
              "precision": run.precision}
    if not partial:
        state.epoch, state.step_in_epoch = epoch + 1, 0
        run.loss_sum, run.tok_sum = 0.0, 0
    else:
        record["epoch_fraction"] = round(state.step_in_epoch / n_steps, 4)
    if run.rank == 0:
        record["val_loss"] = validation_loss(
            run.model, run.val_data, max_tokens=cfg.max_tokens,
            label_smoothing=cfg.label_smoothing, precision=run.precision,
        )
        if cfg.bleu_every and ((epoch + 1) % cfg.bleu_every == 0 or partial):
            hyps = translate_sentences(run.model, run.tok, [s for s, _ in run.val_pairs],
                                       beam_size=1, max_input_len=None, precision=run.precision,
                                       **cfg.decode_kwargs())
            record["val_bleu"] = bleu(hyps, run.val_pairs).score
        if not partial:
            state.history.append(record)
        _save(run, run.run_dir / f"epoch_{epoch + 1:03d}", resumable=False)
        for old in sorted(run.run_dir.glob("epoch_*"))[: -cfg.keep_last]:
            shutil.rmtree(old)
        if record.get("val_bleu", -1.0) > state.best_bleu:
            state.best_bleu = record["val_bleu"]
            _save(run, run.run_dir / "best", resumable=False)
        history = state.history + ([record] if partial else [])
        (run.run_dir / "history.json").write_text(
            json.dumps(history, indent=2), encoding="utf-8"
        )
    _save(run, run.run_dir / "last", resumable=True)
    return record


def _save(run: _Run, path: Path, *, resumable: bool) -> None:
    """Atomic checkpoint by rank 0 of finite weights.

    `resumable` (RUN/last; every rank calls it): with the optimizer, the schedule, every
    rank's RNG state and the epoch's loss so far, so resuming is exact. Otherwise (snapshots,
    best, averaged; rank 0 alone): the weights, config, tokenizer and train state.
    """
    bad = [n for n, p in run.model.named_parameters() if not torch.isfinite(p).all()]
    if bad:  # e.g. an infinite gradient norm under clipping: the loss is still finite
        raise _diverged(run, f"weights {bad[:3]} are not finite")
    state = run.state
    rng = [capture_rng_state()]
    if resumable:
        state = dataclasses.replace(state, epoch_loss=_all_sum(run.loss_sum, run.device),
                                    epoch_tokens=int(_all_sum(run.tok_sum, run.device)))
        if run.world > 1:
            gathered: list[Any] = [None] * run.world
            dist.all_gather_object(gathered, rng[0])
            rng = gathered
    if run.rank == 0:
        save_checkpoint(
            path, run.model, dataclasses.asdict(run.cfg),
            optimizer=run.optimizer if resumable else None,
            scheduler=run.scheduler if resumable else None,
            train_state=dataclasses.asdict(state), tokenizer=run.tok, extra={"rng": rng},
        )
    if resumable:
        run.saved_step = state.step
        if run.world > 1:
            dist.barrier()


# --------------------------------------------------------------------------- evaluation


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_tokens: int,
    label_smoothing: float,
    precision: str = "fp32",
) -> float:
    """Label-smoothed loss per target token on `examples` (eval mode, no dropout).

    Args:
        model: an ``EncoderDecoder``; the batches go to its device.
        examples: ``(source ids, target ids)`` pairs from ``encode_pairs``.
        max_tokens: padded tokens per batch (``make_batches``).
        label_smoothing: epsilon of ``LabelSmoothing`` (the training loss is the reference).
        precision: "fp32", "bf16" autocast, or "auto" (``resolve_precision``).
    """
    device = _device_of(model)
    precision = resolve_precision(precision, device)
    was_training = model.training
    model.eval()
    criterion = LabelSmoothing(model.generator.proj.out_features, PAD, label_smoothing)
    total, ntok = 0.0, 0
    for idx in make_batches(examples, max_tokens, shuffle=False, seed=0):
        b = Batch(*collate(examples, idx, pad=PAD, device=device), pad=PAD)
        with _autocast(precision, device):
            out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)  # (B, T, d_model)
            real = b.tgt_y != PAD  # (B, T)
            logp = model.generator(out[real])  # (n_real, vocab)
        total += criterion(logp.float(), b.tgt_y[real]).item()
        ntok += b.ntokens
    model.train(was_training)
    return total / max(ntok, 1)


def source_length_limit(model: nn.Module, max_input_len: int | None) -> int | None:
    """Most subwords a source may have: `max_input_len`, and what a learned table holds."""
    tables = [m.max_len for m in model.modules() if isinstance(m, LearnedPositionalEmbedding)]
    limits = [max_input_len] if max_input_len is not None else []
    limits += [t - 1 for t in tables]  # the source's end symbol takes a position too
    return min(limits) if limits else None


def _output_limit(model: nn.Module) -> int | None:
    tables = [m.max_len for m in model.modules() if isinstance(m, LearnedPositionalEmbedding)]
    return min(tables) if tables else None


def _check_translate_args(beam_size: Any, batch_size: Any, max_input_len: Any) -> None:
    for name, value, optional in (("beam_size", beam_size, False),
                                  ("batch_size", batch_size, False),
                                  ("max_input_len", max_input_len, True)):
        if not ((optional and value is None) or _is_int(value, 1)):
            raise ValueError(f"{name} must be {'None or ' if optional else ''}an integer >= 1, "
                             f"got {value!r}")


@torch.no_grad()
def translate_sentences(
    model: nn.Module,
    tok: Any,
    sentences: Sequence[str],
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    precision: str = "auto",
    max_input_len: int | None = 256,
    batch_size: int = 64,
) -> list[str]:
    """Translate untokenized sentences; greedy (KV cache) when beam_size == 1, else beam search.

    Args:
        model, tok: from ``load_model`` (the model's device is used).
        sentences: untokenized source sentences.
        beam_size: 1 for greedy decoding. length_penalty: beam search's alpha.
        max_len_a, max_len_b: a translation has at most ``a * source length + b`` subwords
            (and never more than a learned position table holds).
        precision: "fp32", "bf16" autocast, or "auto": bf16 where the model's device has it
            natively, else fp32 (``resolve_precision``), whatever the model was trained in.
        max_input_len: refuse (``ValueError`` naming the sentence) a source of more subwords:
            decoding time grows with the square of the length, and a model trained on short
            sentences has nothing useful to say about one of thousands. None: no limit but a
            learned position table's.
        batch_size: sentences decoded together (divided by beam_size for beam search).
    """
    _check_translate_args(beam_size, batch_size, max_input_len)
    precision = resolve_precision(precision, _device_of(model))
    encoded = [encode_text(tok, s) for s in sentences]  # ids + EOS
    limit = source_length_limit(model, max_input_len)
    for i, ids in enumerate(encoded):
        if limit is not None and len(ids) - 1 > limit:
            raise ValueError(f"sentences[{i}] has {len(ids) - 1} subwords, more than "
                             f"max_input_len={limit}")
    was_training = model.training
    model.eval()
    device, cap = _device_of(model), _output_limit(model)
    out: list[str] = [""] * len(sentences)
    per_batch = batch_size if beam_size == 1 else max(1, batch_size // beam_size)
    for idx in _batched(encoded, per_batch):
        width = max(len(encoded[i]) for i in idx)
        src = torch.full((len(idx), width), PAD, dtype=torch.long)
        for row, i in enumerate(idx):
            src[row, : len(encoded[i])] = torch.tensor(encoded[i])
        src = src.to(device)  # (B, S)
        src_mask = (src != PAD).unsqueeze(-2)  # (B, 1, S)
        out_len = max(2, int(max_len_a * width + max_len_b))  # <s> counts towards it
        out_len = min(out_len, cap) if cap is not None else out_len
        with _autocast(precision, device):
            if beam_size == 1:
                hyps = greedy_decode(model, src, src_mask, out_len, BOS, EOS).tolist()
            else:
                results = beam_search(model, src, src_mask, out_len, BOS, EOS,
                                      beam_size=beam_size, length_penalty=length_penalty)
                hyps = [r[0][0].tolist() for r in results]
        for row, i in enumerate(idx):
            out[i] = decode_ids(tok, _cut(hyps[row]))
    model.train(was_training)
    return out


def _batched(items: Sequence, size: int) -> Iterator[list[int]]:
    order = sorted(range(len(items)), key=lambda i: len(items[i]))  # similar lengths together
    for i in range(0, len(order), size):
        yield order[i : i + size]


def _cut(ids: list[int]) -> list[int]:
    """Tokens between the start symbol and the first end symbol."""
    ids = ids[1:] if ids and ids[0] == BOS else ids
    return ids[: ids.index(EOS)] if EOS in ids else ids


def bleu(hypotheses: Sequence[str], pairs: Sequence[tuple[str, str]]):
    """Corpus sacreBLEU (13a tokenization, cased) of hypotheses against the pairs' targets.

    Returns sacrebleu's ``BLEUScore``; ``bleu_signature()`` names the settings it used.
    """
    import sacrebleu

    return sacrebleu.BLEU().corpus_score(list(hypotheses), [[t for _, t in pairs]])


def bleu_signature() -> str:
    """sacreBLEU's signature of ``bleu()``'s settings (one reference, 13a, cased, exp smoothing).

    sacrebleu only knows the number of references after scoring, so the signature is read off
    a metric with the same settings that has scored one sentence.
    """
    import sacrebleu

    metric = sacrebleu.BLEU()
    metric.corpus_score(["a"], [["a"]])
    return str(metric.get_signature())


def _config_of_checkpoint(values: Any, path: Path) -> Config:
    """The Config stored in a checkpoint, checked like a config file."""
    if not isinstance(values, dict):
        raise ValueError(f"checkpoint {path}: config.json must hold a JSON object")
    if "max_len" in values:  # written before drop_longer_than had its own name
        values = {"drop_longer_than": values["max_len"], **values}
    fields = {f.name for f in dataclasses.fields(Config)}
    try:
        return Config(**{k: v for k, v in values.items() if k in fields})
    except ValueError as e:
        raise ValueError(f"checkpoint {path}: {e}") from e


def load_model(
    path: str | Path,
    device: torch.device | None = None,
    *,
    max_params: int = MAX_PARAMS,
    verify: bool = True,
):
    """Load a checkpoint directory: (model in eval mode, tokenizer, Config).

    The config is checked and the model's size computed from it before anything is built: a
    config describing more than `max_params` parameters is refused (a checkpoint is input;
    raise the limit for a model you trust to be that large). Non-finite weights (a diverged
    run) are refused too. `verify`: check every file against the manifest's SHA-256.
    """
    device = device or _default_device()
    path = Path(path)
    info = load_checkpoint(path, None, verify=verify)
    cfg = _config_of_checkpoint(info["config"], path)
    if info["tokenizer"] is None:
        raise ValueError(f"checkpoint {path} holds no tokenizer.json; it cannot translate")
    tok = load_tokenizer(info["tokenizer"])
    n = parameter_count(cfg, tok.get_vocab_size())
    if n > max_params:
        raise ValueError(
            f"checkpoint {path}: its config describes a model of {n:,} parameters, more than "
            f"max_params={max_params:,}; pass a larger max_params if you trust it"
        )
    model = cfg.build_model(tok.get_vocab_size())
    load_checkpoint(path, model, map_location=device, verify=verify)
    bad = [n for n, t in model.state_dict().items()
           if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ValueError(f"checkpoint {path}: weights {bad[:3]} are not finite (NaN or inf); "
                         "the run that saved them diverged")
    return model.to(device).eval(), tok, cfg


def _rounded(x: Any, digits: int = 4) -> Any:
    """Round every float of a nested list (attention maps stored as JSON stay small)."""
    return [_rounded(v, digits) for v in x] if isinstance(x, list) else round(x, digits)


@torch.no_grad()
def attention_maps(
    model: nn.Module, tok: Any, sentence: str, *, max_len_a: float = 1.5, max_len_b: int = 10
) -> dict[str, Any]:
    """Translate `sentence` greedily, then record every attention map of a teacher-forced pass.

    Returns ``source``, ``translation``, the token labels ``source_tokens`` (ids + ``</s>``) and
    ``target_tokens`` (``<s>`` + output), and ``maps``: for ``"encoder"`` (source x source),
    ``"decoder"`` (target x target) and ``"cross"`` (target x source) a nested list
    ``[layer][head][query][key]`` of weights rounded to 4 decimals. `max_len_a`, `max_len_b`:
    as in ``translate_sentences``. Used by chapter 8's figures.
    """
    device = _device_of(model)
    src_ids = encode_text(tok, sentence)  # ids + EOS
    src = torch.tensor([src_ids], device=device)
    src_mask = (src != PAD).unsqueeze(-2)
    out_len = max(2, int(max_len_a * len(src_ids) + max_len_b))
    cap = _output_limit(model)
    out = greedy_decode(model, src, src_mask, min(out_len, cap) if cap else out_len, BOS, EOS)
    out = out[0].tolist()
    if EOS in out:
        out = out[: out.index(EOS) + 1]
    tgt = torch.tensor([out[:-1] if out[-1] == EOS else out], device=device)  # decoder input
    mhas = [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]
    for m in mhas:
        m.store_attention = True
    try:
        model(src, tgt, src_mask, subsequent_mask(tgt.size(1), device=device))
        maps = {
            "encoder": [layer.self_attn.attn[0].tolist() for layer in model.encoder.layers],
            "decoder": [layer.self_attn.attn[0].tolist() for layer in model.decoder.layers],
            "cross": [layer.src_attn.attn[0].tolist() for layer in model.decoder.layers],
        }
    finally:
        for m in mhas:
            m.store_attention, m.attn = False, None
    return {
        "source": sentence,
        "source_tokens": id_pieces(tok, src_ids),
        "target_tokens": id_pieces(tok, tgt[0].tolist()),
        "translation": tok.decode(out, skip_special_tokens=True),
        "maps": {k: _rounded(v) for k, v in maps.items()},  # [layer][head][query][key]
    }


def evaluate(
    checkpoint: str | Path,
    split: str = "test",
    beam_size: int | None = None,
    data_dir: str | None = None,
    limit: int | None = None,
    device: torch.device | None = None,
    length_penalty: float | None = None,
    precision: str = "auto",
) -> dict[str, Any]:
    """sacreBLEU of a checkpoint on a Multi30k split, with the hypotheses and the signature.

    `beam_size`, `length_penalty` None: the checkpoint config's ``beam_size`` and
    ``length_penalty`` (beam search's alpha). `limit`: the first n pairs. `precision`: as in
    ``translate_sentences`` (not the checkpoint's); the result names the one that ran.
    """
    _check_translate_args(1 if beam_size is None else beam_size, 1, limit)
    device = device or _default_device()
    used = resolve_precision(precision, device)
    model, tok, cfg = load_model(checkpoint, device)
    beam_size = cfg.beam_size if beam_size is None else beam_size
    kwargs = cfg.decode_kwargs(length_penalty)
    pairs = load_multi30k(split, data_dir or cfg.data_dir, cfg.src_lang, cfg.tgt_lang,
                          limit=limit)
    start = time.perf_counter()
    hyps = translate_sentences(model, tok, [s for s, _ in pairs], beam_size=beam_size,
                               max_input_len=None, precision=used, **kwargs)
    score = bleu(hyps, pairs)
    return {
        "split": split,
        "beam_size": beam_size,
        "length_penalty": kwargs["length_penalty"],
        "precision": used,
        "device": str(device),
        "bleu": round(score.score, 2),
        "signature": bleu_signature(),
        "score_line": str(score),
        "sentences": len(pairs),
        "seconds": round(time.perf_counter() - start, 1),
        "hypotheses": hyps,
    }


def translate(
    checkpoint: str | Path,
    sentences: Sequence[str],
    beam_size: int | None = None,
    device: torch.device | None = None,
    max_input_len: int | None = 256,
    precision: str = "auto",
) -> list[str]:
    """Translate sentences with a saved model (`beam_size` None: the config's ``beam_size``).

    `precision`: as in ``translate_sentences``; "auto" whatever the checkpoint trained in.
    """
    device = device or _default_device()
    resolve_precision(precision, device)  # a bad value fails before the model loads
    model, tok, cfg = load_model(checkpoint, device)
    beam_size = cfg.beam_size if beam_size is None else beam_size
    return translate_sentences(model, tok, sentences, beam_size=beam_size,
                               max_input_len=max_input_len, precision=precision,
                               **cfg.decode_kwargs())
