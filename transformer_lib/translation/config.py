"""The settings of a translation run: `Config`, read from TOML and checked (hand-written).

Every field is checked (type and range) when a Config is made, so a bad value fails before any
work starts, with a message naming the key. A checkpoint's ``config.json`` is input like any
other file: ``config_from_saved`` reads it by the same rules, and ``parameter_count`` sizes the
model it describes before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from transformer_lib.gru import make_gru_model
from transformer_lib.model import make_model
from transformer_lib.translation.data import LANGS, MAX_VOCAB, PAD, SPECIAL_TOKENS

__all__ = [
    "Config",
    "RESUMABLE_CHANGES",
    "MAX_PARAMS",
    "MAX_BEAM",
    "MAX_LEN_A",
    "MAX_LEN_B",
    "MAX_LENGTH_PENALTY",
    "FAST",
    "load_config",
    "config_from_saved",
    "parameter_count",
]

# Keys that may differ when a run is resumed: how long to train, where the data is, how often
# to save and validate, how to decode. Everything else defines the run (the model, the data it
# sees, the optimization and its numerics) and must stay as it was.
RESUMABLE_CHANGES = frozenset({
    "epochs", "time_limit_min", "max_steps", "data_dir", "save_every", "keep_last", "average_last",
    "bleu_every", "beam_size", "length_penalty", "max_len_a", "max_len_b",
})
MAX_PARAMS = 10**9  # load_model refuses configs describing more parameters and buffer elements
# Bounds on decoding's work, checked here and by translate_sentences: the beam width, and the
# output length a * source length + b (at most 10 * 256 + 1000 subwords for a source of the
# command line's default --max-input-len). And on beam search's alpha: its length penalty
# ((5 + length) / 6) ** alpha overflows a float past alpha ~ 110 at such lengths.
MAX_BEAM = 64
MAX_LEN_A = 10.0
MAX_LEN_B = 1000
MAX_LENGTH_PENALTY = 10.0
# What `fast = true` (CLI --fast) stands for; the one place it is spelled out (see Config.fast).
FAST = {"precision": "auto", "attn_dropout": 0.0, "ffn_dropout": 0.0}


@dataclasses.dataclass
class Config:
    """Everything that defines a run; a TOML file sets any subset of these fields."""

    # data
    data_dir: str | None = None  # None: transformer_lib.translation.data.default_data_dir()
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
    # optimization
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
    # only), which lets attention use the fused kernel. True sets the fields of FAST. "auto",
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
    # validation BLEU every k epochs (greedy). RUN/best is the epoch of the best BLEU, so with
    # 0 or k > epochs (no BLEU: faster, e.g. bench/fast_setting_quality.py) a run writes no
    # best/ (it says so at its end): evaluate RUN/last or RUN/averaged instead
    bleu_every: int = 1
    beam_size: int = 4  # evaluate and translate: beam width (1 = greedy)
    length_penalty: float = 0.6  # beam search's GNMT length penalty alpha
    max_len_a: float = 1.5  # decode at most a * source length + b tokens
    max_len_b: int = 10
    time_limit_min: float | None = None  # stop training after this many minutes
    max_steps: int | None = None  # ... or after this many optimizer steps (a compute budget)

    def __post_init__(self) -> None:
        if isinstance(self.adam_betas, list):
            self.adam_betas = tuple(self.adam_betas)
        self.validate()
        if self.fast:
            for key, value in FAST.items():
                setattr(self, key, value)
        if self.schedule == "linear" and self.cooldown is None:  # falls over the whole budget
            self.cooldown = 1.0

    def validate(self) -> None:
        """Raise ValueError naming the first key whose value has the wrong type or range.

        Made Configs are checked already; the training loop checks again, since a
        dataclass's fields can be assigned after it was made.
        """
        for key, (ok, text) in _RULES.items():
            value = getattr(self, key)
            if not ok(value):
                raise ValueError(f"config: {key} must be {text}, got {value!r}")
        for bad, message in _problems(self):
            if bad:
                raise ValueError(f"config: {message}")
        if self.fast:  # precision "fp32" may be the default here; load_config sees what was set
            _check_fast({k: getattr(self, k) for k in ("attn_dropout", "ffn_dropout")})

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
        if length_penalty is not None and not (_is_num(length_penalty)
                                               and 0 <= length_penalty <= MAX_LENGTH_PENALTY):
            raise ValueError(f"length_penalty must be a number >= 0 and <= "
                             f"{MAX_LENGTH_PENALTY:g} (beam search's alpha), "
                             f"got {length_penalty!r}")
        alpha = self.length_penalty if length_penalty is None else length_penalty
        return dict(length_penalty=alpha, max_len_a=self.max_len_a, max_len_b=self.max_len_b)


# --------------------------------------------------------------------------- validation


def _is_int(v: Any, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(lo: int, optional: bool = False) -> tuple[Callable[[Any], bool], str]:
    text = f"an integer >= {lo}"
    return (lambda v: (optional and v is None) or _is_int(v, lo),
            f"None or {text}" if optional else text)


def _int_in(lo: int, hi: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _is_int(v, lo) and v <= hi), f"an integer >= {lo} and <= {hi}"


def _num(test: Callable[[float], bool], text: str, optional: bool = False):
    return (lambda v: (optional and v is None) or (_is_num(v) and test(v)),
            f"None or {text}" if optional else text)


def _choice(*options: str) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in options), f"one of {list(options)}"


_PROB = _num(lambda v: 0 <= v < 1, "a number in [0, 1)")
_VOCAB = ((lambda v: _is_int(v, len(SPECIAL_TOKENS) + 256) and v <= MAX_VOCAB),
          f"an integer >= {len(SPECIAL_TOKENS) + 256} and <= {MAX_VOCAB}")
_SEED = ((lambda v: _is_int(v, 0) and v < 2**64),  # torch.manual_seed takes no more
         "an integer in [0, 2**64 - 1]")
_BOOL = ((lambda v: isinstance(v, bool)), "true or false")
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "data_dir": ((lambda v: v is None or isinstance(v, str)), "None or a folder path"),
    "src_lang": _choice(*LANGS), "tgt_lang": _choice(*LANGS),
    "train_limit": _int(1, optional=True), "val_limit": _int(1, optional=True),
    "vocab_size": _VOCAB, "max_tokens": _int(16),
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
    "precision": _choice("fp32", "bf16", "auto"), "seed": _SEED, "save_every": _int(1),
    "keep_last": _int(1), "average_last": _int(0), "bleu_every": _int(0),
    "beam_size": _int_in(1, MAX_BEAM),
    "length_penalty": _num(lambda v: 0 <= v <= MAX_LENGTH_PENALTY,
                           f"a number >= 0 and <= {MAX_LENGTH_PENALTY:g}"),
    "max_len_a": _num(lambda v: 0 <= v <= MAX_LEN_A, f"a number >= 0 and <= {MAX_LEN_A:g}"),
    "max_len_b": _int_in(1, MAX_LEN_B),
    "time_limit_min": _num(lambda v: v > 0, "a number > 0", optional=True),
    "max_steps": _int(1, optional=True),
}


def _problems(cfg: Config) -> list[tuple[bool, str]]:
    """(is it so, message) for the rules that tie several keys together."""
    transformer = cfg.arch == "transformer"  # the GRU baseline has no heads or positions
    budget = cfg.time_limit_min or cfg.max_steps
    return [
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
        (cfg.schedule == "linear" and not budget,
         "schedule = 'linear' decays to 0 at the end of the budget: set time_limit_min or "
         "max_steps"),
        (cfg.cooldown is not None and not budget,
         f"cooldown ({cfg.cooldown}) falls to 0 at the end of the budget: set "
         f"time_limit_min or max_steps"),
        (cfg.average_last > cfg.keep_last, f"average_last ({cfg.average_last}) cannot exceed "
                                           f"keep_last ({cfg.keep_last}), the snapshots kept"),
    ]


def _check_fast(values: Mapping[str, Any]) -> None:
    """Raise if a value set beside ``fast = true`` contradicts it (None: not set)."""
    clash = {k: values[k] for k, want in FAST.items()
             if values.get(k) is not None and values[k] != want}
    if clash:
        raise ValueError(f"config: fast = true means precision 'auto' (bf16 where the machine "
                         f"has it natively, else fp32) and attn_dropout = ffn_dropout = 0, but "
                         f"{clash} is also set; drop one of them")


# --------------------------------------------------------------------------- reading


def load_config(path: str | Path | None, **overrides: Any) -> Config:
    """Read a TOML config (flat keys, or grouped in any tables) and apply overrides.

    ``fast = true`` (CLI ``--fast``) is shorthand for the settings of ``FAST``
    (``precision = "auto"``, ``attn_dropout = 0``, ``ffn_dropout = 0``); it replaces those keys
    of the file when given as an override, and a contradicting value set alongside it is an
    error. Every value is checked (see ``Config``); errors name the key. A file may name
    its parent, ``base = "parent.toml"`` (relative to the file): it then lists only the keys
    it changes (an experiment's record, ``experiments/*/configs``).
    """
    values: dict[str, Any] = _read_with_base(Path(path)) if path is not None else {}
    over = {k: v for k, v in overrides.items() if v is not None}
    if over.get("fast"):  # the override replaces what the file says about these keys
        values = {k: v for k, v in values.items() if k not in FAST}
    values.update(over)
    if values.get("fast"):
        _check_fast(values)
    values = _renamed_keys(values, saved=False)
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"config: unknown key(s) {unknown}; expected some of {sorted(fields)}")
    return Config(**values)


def config_from_saved(values: Any, where: str | Path) -> Config:
    """The Config a run saved (its ``config.json``), read by today's rules.

    Keys that no longer exist are dropped; a key that did not exist yet has its default (the
    behavior the run had); old names are read by their meaning then; ``fast`` means what it
    means now. Raises ValueError naming `where` for anything that is not a valid config.
    """
    if not isinstance(values, dict):
        raise ValueError(f"checkpoint {where}: config.json must hold a JSON object")
    values = _renamed_keys(values, saved=True)
    fields = {f.name for f in dataclasses.fields(Config)}
    try:
        return Config(**{k: v for k, v in values.items() if k in fields})
    except (ValueError, TypeError) as e:
        raise ValueError(f"checkpoint {where}: {e}") from e


def _renamed_keys(values: dict[str, Any], *, saved: bool) -> dict[str, Any]:
    """Keys that were renamed. `max_len` had three meanings; it is now three keys.

    A run saved with it meant ``drop_longer_than``; in a config written now it is an error
    that names the three, since the writer may mean any of them.
    """
    if "max_len" not in values:
        return values
    if not saved:
        raise ValueError(
            "config: max_len was renamed drop_longer_than (training pairs with more subwords "
            "are dropped); the position table is max_positions, and translations are at most "
            "max_len_a * source length + max_len_b tokens"
        )
    values = dict(values)
    old = values.pop("max_len")
    values.setdefault("drop_longer_than", old)
    return values


def _read_with_base(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The keys of a config file over those of its ``base``, the file it names as parent.

    As with an override, ``fast = true`` in the child replaces what the parent says about
    the keys of ``FAST``. A base that is missing, not a string, or part of a cycle is an
    error naming the files.
    """
    if path.is_file() or not path.exists():
        try:
            path = path.resolve()
        except (OSError, RuntimeError, ValueError) as e:  # a loop of links, a NUL in it
            raise ValueError(f"config {str(path)!r} cannot be read: {e}") from None
    # else a pipe (``--config <(...)``: /dev/fd/N) or a device: resolved, a pipe becomes
    # "pipe:[N]", a name that cannot be opened; read as given, its base is relative to the
    # working directory (a pipe has no folder)
    if path in chain:
        loop = " -> ".join(str(p) for p in (*chain, path))
        raise ValueError(f"config {chain[0]}: its bases form a cycle: {loop}")
    values = _read_toml(path)
    base = values.pop("base", None)
    if base is None:
        return values
    if not isinstance(base, str) or not base.strip():
        raise ValueError(f"config {path}: base must name a config file, got {base!r}")
    if len(chain) >= MAX_BASES:  # else a RecursionError after ~1,000 files
        raise ValueError(f"config {chain[0]}: its bases are chained more than {MAX_BASES} "
                         f"deep (at {path})")
    parent = (path.parent if path.is_file() else Path.cwd()) / base
    try:  # a name too long, a NUL, a loop of links: no traceback naming nothing
        os.stat(parent)
    except (OSError, ValueError) as e:
        if not isinstance(e, FileNotFoundError):
            raise ValueError(f"config {path}: its base {base!r} cannot be read: {e}") from None
    if parent.exists() and not parent.is_dir() and not parent.is_file():
        raise ValueError(f"config {path}: its base {base!r} ({parent}) is not a regular file")
    if parent.is_dir():
        raise ValueError(f"config {path}: its base {base!r} ({parent}) is a directory, not a "
                         "config file")
    if not parent.is_file():
        raise ValueError(f"config {path}: its base {base!r} ({parent}) does not exist")
    inherited = _read_with_base(parent, (*chain, path))
    if values.get("fast"):
        inherited = {k: v for k, v in inherited.items() if k not in FAST}
    return {**inherited, **values}


MAX_CONFIG_BYTES = 1 << 20  # a config is a page of text; /dev/zero would fill the memory
MAX_BASES = 32  # files in one chain of bases (configs/ has chains of two)


def _read_capped(path: Path) -> bytes:
    """The bytes of `path`, or a ValueError naming it past ``MAX_CONFIG_BYTES``."""
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"config {path} is larger than {MAX_CONFIG_BYTES} bytes: not a config "
                         "file (a TOML config is a few lines)")
    return data


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    data = _read_capped(path)
    try:
        # a byte order mark (Notepad's UTF-8) is no TOML statement: read past it
        raw = tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"config {path} is not valid TOML: {e}") from e
    except RecursionError:  # nesting like a = [[[[...: tomllib recurses per level
        raise ValueError(f"config {path} is not valid TOML: nested too deeply") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8; the codec's message names no file
        line = e.object[: e.start].count(b"\n") + 1
        raise ValueError(f"config {path} is not UTF-8 text (as TOML must be): byte "
                         f"0x{e.object[e.start]:02x} on line {line}") from None
    except ValueError as e:  # an integer of more than 4,300 digits: int() refuses it
        raise ValueError(f"config {path} is not a valid config: {e}") from None
    values: dict[str, Any] = {}
    where: dict[str, str] = {}  # key -> the table that set it
    for key, val in raw.items():
        # [data], [model], [train] … tables are only grouping: a key set in two is an error
        table = f"[{key}]" if isinstance(val, dict) else "the top level"
        for k, v in val.items() if isinstance(val, dict) else [(key, val)]:
            if k in values:
                raise ValueError(f"config {path} sets {k} twice (in {where[k]} and {table}); "
                                 "tables only group keys, so one of them would be ignored")
            values[k], where[k] = v, table
    return values


# --------------------------------------------------------------------------- size


def parameter_count(cfg: Config, vocab: int, *, buffers: bool = False) -> int:
    """Parameters of ``cfg.build_model(vocab)``, computed without building it.

    Used to refuse a config that would allocate more memory than intended before any
    allocation happens (a checkpoint's config.json is input like any other file).
    `buffers`: count the elements of the model's buffers too, which take memory as parameters
    do though nothing trains them: the sinusoidal position table, (max_positions, d_model),
    one table shared by both stacks (``max_positions = 10**8`` would be a 100 GB table).
    """
    if cfg.arch == "gru":  # no buffers
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
    table = cfg.max_positions * d if buffers and cfg.positional == "sinusoidal" else 0
    return encoder + decoder + embeddings + positions + table


def check_model_size(cfg: Config, vocab: int | None = None) -> None:
    """Refuse a config whose model would be larger than ``MAX_PARAMS`` before it is built.

    Training builds what the config says: ``max_positions = 10**8`` allocated a 12.8 GB
    table, ``N = 10**6`` built layers for minutes, ``d_model = 2**20`` failed in the allocator
    naming no key. `vocab`: the tokenizer's size (default: the config's vocab_size).
    """
    n = parameter_count(cfg, cfg.vocab_size if vocab is None else vocab, buffers=True)
    if n > MAX_PARAMS:
        keys = ("N", "d_model", "d_ff", "max_positions", "vocab_size")
        sizes = ", ".join(f"{k} = {getattr(cfg, k)}" for k in keys)
        raise ValueError(f"config: {sizes} describe a model of {n:,} parameters and buffer "
                         f"elements, more than MAX_PARAMS = {MAX_PARAMS:,}: make it smaller")
