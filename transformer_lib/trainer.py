"""Train, evaluate and use a translation model on Multi30k (`python -m transformer_lib`).

Hand-written (chapter 8 uses it; the pieces it assembles — the model, `Batch`, `LabelSmoothing`,
`rate`, `greedy_decode`, `beam_search` — are the chapters' own). What it adds is what a real
training run needs: a config file, length-bucketed batches, bf16 autocast, gradient accumulation,
`DistributedDataParallel`, per-epoch validation loss and BLEU, atomic checkpoints that resume
mid-epoch exactly, and checkpoint averaging.

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
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from transformer_lib.checkpoint import (
    average_checkpoints,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from transformer_lib.data import (
    BOS,
    EOS,
    PAD,
    collate,
    decode,
    encode,
    encode_pairs,
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
from transformer_lib.training import Batch, LabelSmoothing, rate

__all__ = [
    "Config",
    "load_config",
    "train",
    "evaluate",
    "translate",
    "load_model",
    "bleu",
    "bleu_signature",
    "translate_sentences",
    "attention_maps",
]


@dataclasses.dataclass
class Config:
    """Everything that defines a run; a TOML file sets any subset of these fields."""

    # data
    data_dir: str | None = None  # None: transformer_lib.data.default_data_dir()
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_limit: int | None = None  # use the first n training pairs (CI and tests)
    val_limit: int | None = None
    vocab_size: int = 8000  # joint BPE over both languages
    max_tokens: int = 2500  # batch size x padded length (larger side) of one micro-batch
    max_len: int = 100  # training pairs longer than this (subwords, either side) are dropped
    # model (the paper's names)
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
    # optimisation
    epochs: int = 20
    accum: int = 1  # micro-batches per optimizer step and process
    lr_factor: float = 1.0  # the Noam schedule's scale
    warmup: int = 800
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float | None = 1.0
    precision: str = "fp32"  # "fp32" or "bf16" (autocast; weights and optimizer stay fp32)
    # The fastest setting, measured in bench/train_throughput.py and the performance appendix:
    # precision "bf16" and the paper's dropout placement (attn_dropout = ffn_dropout = 0:
    # residual and embedding dropout only), which lets attention use the fused kernel.
    fast: bool = False
    seed: int = 1
    # checkpoints and evaluation
    save_every: int = 200  # optimizer steps between resumable checkpoints
    keep_last: int = 5  # per-epoch weight snapshots kept for averaging
    average_last: int = 5  # average the last k epoch snapshots at the end (0: off)
    bleu_every: int = 1  # validation BLEU every k epochs (greedy)
    beam_size: int = 4
    length_penalty: float = 0.6
    max_len_a: float = 1.5  # decode at most a * src_len + b tokens
    max_len_b: int = 10
    time_limit_min: float | None = None  # stop training after this many minutes

    def model_kwargs(self, vocab: int) -> dict[str, Any]:
        return dict(
            src_vocab=vocab,
            tgt_vocab=vocab,
            N=self.N,
            d_model=self.d_model,
            d_ff=self.d_ff,
            h=self.h,
            dropout=self.dropout,
            attn_dropout=self.attn_dropout,
            ffn_dropout=self.ffn_dropout,
            norm_first=self.norm_first,
            share_embeddings=self.share_embeddings,
            positional=self.positional,
            pad_idx=PAD,
        )


def load_config(path: str | Path | None, **overrides: Any) -> Config:
    """Read a TOML config (flat keys, or grouped in any tables) and apply overrides.

    ``fast = true`` (CLI ``--fast``) is shorthand for ``precision = "bf16"``,
    ``attn_dropout = 0`` and ``ffn_dropout = 0``; it replaces those keys of the file when given
    as an override, and a contradicting value set alongside it is an error.
    """
    values: dict[str, Any] = {}
    if path is not None:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        for key, val in raw.items():
            if isinstance(val, dict):  # [data], [model], [train] … tables are only grouping
                values.update(val)
            else:
                values[key] = val
    over = {k: v for k, v in overrides.items() if v is not None}
    values.update(over)
    fields = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"config: unknown key(s) {unknown}; expected some of {sorted(fields)}")
    if "adam_betas" in values:
        values["adam_betas"] = tuple(values["adam_betas"])
    if values.get("fast"):
        fast_values = {"precision": "bf16", "attn_dropout": 0.0, "ffn_dropout": 0.0}
        same_place = over if over.get("fast") else values  # where `fast` was set, and after
        clash = {
            k: same_place[k]
            for k, want in fast_values.items()
            if same_place.get(k) is not None and same_place[k] != want
        }
        if clash:
            raise ValueError(
                f"config: fast = true means precision 'bf16' and attn_dropout = ffn_dropout = 0, "
                f"but {clash} is also set; drop one of them"
            )
        values.update(fast_values)
    cfg = Config(**values)
    if cfg.precision not in ("fp32", "bf16"):
        raise ValueError(f"config: precision must be 'fp32' or 'bf16', got {cfg.precision!r}")
    if cfg.accum < 1 or cfg.epochs < 1 or cfg.max_tokens < 16:
        raise ValueError("config: accum and epochs must be >= 1 and max_tokens >= 16")
    return cfg


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


def _autocast(cfg: Config, device: torch.device):
    if cfg.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


# --------------------------------------------------------------------------- data


def _prepare_data(cfg: Config, run_dir: Path, tokenizer_path: Path | None = None):
    train_pairs = load_multi30k("train", cfg.data_dir, cfg.src_lang, cfg.tgt_lang)
    val_pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang)
    if cfg.train_limit:
        train_pairs = train_pairs[: cfg.train_limit]
    if cfg.val_limit:
        val_pairs = val_pairs[: cfg.val_limit]
    tok_file = tokenizer_path or run_dir / "tokenizer.json"
    if tok_file.exists():
        tok = load_tokenizer(tok_file)
    else:
        texts = [s for pair in train_pairs for s in pair]
        tok = train_tokenizer(texts, vocab_size=cfg.vocab_size)
        rank, _ = _dist_info()
        if rank == 0:
            save_tokenizer(tok, tok_file)
    # Training drops the few pairs longer than max_len subwords; validation keeps every pair.
    train = encode_pairs(train_pairs, tok, max_len=cfg.max_len)
    return tok, train, encode_pairs(val_pairs, tok), val_pairs


def _epoch_steps(cfg: Config, train: Sequence, epoch: int, world: int) -> list[list[list[int]]]:
    """The epoch's optimizer steps: each a list of accum*world micro-batches of indices."""
    batches = make_batches(train, cfg.max_tokens, shuffle=True, seed=cfg.seed * 1000 + epoch)
    per_step = cfg.accum * world
    return [batches[i : i + per_step] for i in range(0, len(batches) - per_step + 1, per_step)]


# --------------------------------------------------------------------------- training


@dataclasses.dataclass
class _State:
    epoch: int = 0  # epochs completed
    step_in_epoch: int = 0  # optimizer steps done in the current epoch
    step: int = 0  # optimizer steps in total
    tokens: int = 0  # target tokens trained on
    train_seconds: float = 0.0
    best_bleu: float = -1.0
    history: list = dataclasses.field(default_factory=list)


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
    called after every optimizer step (tests use it to simulate an interruption).
    """
    from tqdm import tqdm

    run_dir = Path(run_dir)
    device = device or _default_device()
    started_dist = _maybe_init_distributed(device)
    rank, world = _dist_info()
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    if world > 1:
        dist.barrier()
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tok, train_data, val_data, val_pairs = _prepare_data(cfg, run_dir)
    if world > 1:
        dist.barrier()
        tok = load_tokenizer(run_dir / "tokenizer.json")  # every rank uses rank 0's file
    vocab = tok.get_vocab_size()
    model = make_model(**cfg.model_kwargs(vocab)).to(device)
    # fused: one kernel updates every parameter (PyTorch's foreach Adam makes several passes)
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=cfg.adam_betas, eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay, fused=device.type in ("cpu", "cuda") or None,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: rate(s, cfg.d_model, cfg.lr_factor, cfg.warmup)
    )
    state = _State()
    last = run_dir / "last"
    if resume and (last / "config.json").exists():
        info = load_checkpoint(last, model, optimizer, scheduler, map_location=device)
        state = _State(**info["train_state"])
        # Every process continues from its own random state (dropout masks, shuffling).
        saved = info["extra"]["rng"]
        restore_rng_state(saved[rank] if rank < len(saved) else saved[0])
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    criterion = LabelSmoothing(vocab, PAD, cfg.label_smoothing)
    t0 = time.perf_counter() - state.train_seconds
    partial_record: dict[str, Any] | None = None  # a time-limited epoch's record (see below)
    for epoch in range(state.epoch, cfg.epochs):
        steps = _epoch_steps(cfg, train_data, epoch, world)
        model.train()
        bar = tqdm(
            total=len(steps), initial=state.step_in_epoch, desc=f"epoch {epoch + 1}",
            disable=not progress or rank != 0, file=sys.stderr, dynamic_ncols=True,
        )
        loss_sum, tok_sum, tick, tick_tokens = 0.0, 0, time.perf_counter(), 0
        for micro in steps[state.step_in_epoch :]:
            loss, ntok = _train_step(cfg, ddp, model, criterion, optimizer, train_data, micro,
                                     device, rank, world)
            scheduler.step()
            state.step += 1
            state.step_in_epoch += 1
            state.tokens += ntok
            loss_sum, tok_sum, tick_tokens = loss_sum + loss, tok_sum + ntok, tick_tokens + ntok
            elapsed = time.perf_counter() - tick
            bar.set_postfix(loss=f"{loss / max(ntok, 1):.3f}",
                            lr=f"{scheduler.get_last_lr()[0]:.2e}",
                            **{"tok/s": f"{tick_tokens / max(elapsed, 1e-9):.0f}"})
            bar.update()
            state.train_seconds = time.perf_counter() - t0
            if state.step % cfg.save_every == 0:
                _save(last, model, cfg, optimizer, scheduler, state, tok, rank, world)
            if on_step is not None:
                on_step(state.step)
            if cfg.time_limit_min and state.train_seconds > 60 * cfg.time_limit_min:
                break
        bar.close()
        out_of_time = bool(cfg.time_limit_min and state.train_seconds > 60 * cfg.time_limit_min)
        partial = out_of_time and state.step_in_epoch < len(steps)
        if not partial:
            state.epoch, state.step_in_epoch = epoch + 1, 0
        # Validate, snapshot, keep the best by validation BLEU. When the time limit stops
        # training inside an epoch, the partial epoch gets the same treatment (its record says
        # how much of the epoch it saw), so its training counts in `best` and `averaged`; it is
        # kept out of the resumable state, so `--resume` finishes the epoch and then replaces
        # the partial record and snapshot with the full ones.
        record = {"epoch": epoch + 1, "step": state.step, "tokens": state.tokens,
                  "train_loss": _all_sum(loss_sum, device) / max(_all_sum(tok_sum, device), 1),
                  "minutes": state.train_seconds / 60}
        if partial:
            record["epoch_fraction"] = round(state.step_in_epoch / len(steps), 4)
            partial_record = record
        if rank == 0:
            record["val_loss"] = validation_loss(model, val_data, cfg, device)
            if cfg.bleu_every and ((epoch + 1) % cfg.bleu_every == 0 or partial):
                record["val_bleu"] = bleu(
                    translate_pairs(model, tok, val_pairs, cfg, device, beam_size=1), val_pairs
                ).score
            if not partial:
                state.history.append(record)
            _save(run_dir / f"epoch_{epoch + 1:03d}", model, cfg, None, None, state, tok, 0, 1)
            _prune_snapshots(run_dir, cfg.keep_last)
            if record.get("val_bleu", -1.0) > state.best_bleu:
                state.best_bleu = record["val_bleu"]
                _save(run_dir / "best", model, cfg, None, None, state, tok, 0, 1)
            history = state.history + ([record] if partial else [])
            (run_dir / "history.json").write_text(json.dumps(history, indent=2))
        _save(last, model, cfg, optimizer, scheduler, state, tok, rank, world)
        if out_of_time:
            break
    if rank == 0 and cfg.average_last > 1:
        snaps = sorted(run_dir.glob("epoch_*"))[-cfg.average_last :]
        if len(snaps) > 1:
            model.load_state_dict(average_checkpoints(snaps), strict=False)
            _save(run_dir / "averaged", model, cfg, None, None, state, tok, 0, 1)
    if started_dist:
        dist.barrier()
        dist.destroy_process_group()
    history = state.history + ([partial_record] if partial_record else [])
    return {"history": history, "steps": state.step, "minutes": state.train_seconds / 60}


def _all_sum(x: float, device: torch.device) -> float:
    if _dist_info()[1] == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def _loss_on_real_tokens(cfg, device, model, criterion, out, tgt_y):
    """Summed loss of the generator's predictions at the non-padding target positions.

    Padding positions add exactly 0 to the loss, so the generator (the largest matrix product
    of a small model: d_model x vocab per token) and its log-softmax skip them; with the
    random batches of bench/train_throughput.py that is a third of the positions. The loss is
    computed in fp32 (under autocast the log-softmax already returns fp32).
    """
    keep = tgt_y != PAD  # (B, T)
    with _autocast(cfg, device):
        logp = model.generator(out[keep])  # (n_real, vocab)
    return criterion(logp.float(), tgt_y[keep])


def _train_step(cfg, ddp, model, criterion, optimizer, data, micro, device, rank, world):
    """One optimizer step over the global batch `micro` (this rank takes every world-th part)."""
    mine = micro[rank::world]
    batches = [Batch(*collate(data, idx, pad=PAD, device=device), pad=PAD) for idx in mine]
    local_tokens = sum(b.ntokens for b in batches)
    global_tokens = _all_sum(local_tokens, device)
    loss_total = 0.0
    for i, b in enumerate(batches):
        # DDP averages gradients over processes; scaling by world undoes that, so the update is
        # the sum of per-token losses over the global batch divided by its token count.
        sync = i == len(batches) - 1 or world == 1
        ctx = contextlib.nullcontext() if sync else ddp.no_sync()
        with ctx:
            with _autocast(cfg, device):
                out = ddp(b.src, b.tgt, b.src_mask, b.tgt_mask)  # (B, T, d_model)
            loss = _loss_on_real_tokens(cfg, device, model, criterion, out, b.tgt_y)
            (loss * world / global_tokens).backward()
        loss_total += loss.item()
    if cfg.clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_total, local_tokens


def _save(path, model, cfg, optimizer, scheduler, state, tok, rank, world) -> None:
    """Atomic checkpoint by rank 0, with every rank's RNG state (so resuming is exact)."""
    rng = [capture_rng_state()]
    if world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    if rank == 0:
        save_checkpoint(
            path, model, dataclasses.asdict(cfg), optimizer=optimizer, scheduler=scheduler,
            train_state=dataclasses.asdict(state), tokenizer=tok,
            extra={"rng": rng},
        )
    if world > 1:
        dist.barrier()


def _prune_snapshots(run_dir: Path, keep: int) -> None:
    import shutil

    for old in sorted(run_dir.glob("epoch_*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old)


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def validation_loss(model: nn.Module, data: Sequence, cfg: Config, device: torch.device) -> float:
    """Label-smoothed loss per target token on `data` (eval mode, no dropout)."""
    was_training = model.training
    model.eval()
    criterion = LabelSmoothing(model.generator.proj.out_features, PAD, cfg.label_smoothing)
    total, ntok = 0.0, 0
    for idx in make_batches(data, cfg.max_tokens, shuffle=False, seed=0):
        b = Batch(*collate(data, idx, pad=PAD, device=device), pad=PAD)
        with _autocast(cfg, device):
            out = model(b.src, b.tgt, b.src_mask, b.tgt_mask)  # (B, T, d_model)
        total += _loss_on_real_tokens(cfg, device, model, criterion, out, b.tgt_y).item()
        ntok += b.ntokens
    model.train(was_training)
    return total / max(ntok, 1)


def _batched(items: Sequence, size: int) -> Iterator[list[int]]:
    order = sorted(range(len(items)), key=lambda i: len(items[i]))  # similar lengths together
    for i in range(0, len(order), size):
        yield order[i : i + size]


@torch.no_grad()
def translate_sentences(
    model: nn.Module,
    tok: Any,
    sentences: Sequence[str],
    cfg: Config,
    device: torch.device,
    beam_size: int = 1,
    batch_size: int = 64,
) -> list[str]:
    """Translate untokenized sentences; greedy (KV cache) when beam_size == 1, else beam search."""
    was_training = model.training
    model.eval()
    encoded = [encode(tok, s) for s in sentences]
    out: list[str] = [""] * len(sentences)
    for idx in _batched(encoded, batch_size if beam_size == 1 else max(1, batch_size // beam_size)):
        width = max(len(encoded[i]) for i in idx)
        src = torch.full((len(idx), width), PAD, dtype=torch.long)
        for row, i in enumerate(idx):
            src[row, : len(encoded[i])] = torch.tensor(encoded[i])
        src = src.to(device)
        src_mask = (src != PAD).unsqueeze(-2)
        max_len = int(cfg.max_len_a * width + cfg.max_len_b)
        with _autocast(cfg, device):
            if beam_size == 1:
                hyps = greedy_decode(model, src, src_mask, max_len, BOS, EOS).tolist()
            else:
                results = beam_search(model, src, src_mask, max_len, BOS, EOS, beam_size=beam_size,
                                      length_penalty=cfg.length_penalty)
                hyps = [r[0][0].tolist() for r in results]
        for row, i in enumerate(idx):
            out[i] = decode(tok, _cut(hyps[row]))
    model.train(was_training)
    return out


def _cut(ids: list[int]) -> list[int]:
    """Tokens between the start symbol and the first end symbol."""
    ids = ids[1:] if ids and ids[0] == BOS else ids
    return ids[: ids.index(EOS)] if EOS in ids else ids


def translate_pairs(model, tok, pairs, cfg, device, beam_size=1) -> list[str]:
    return translate_sentences(model, tok, [s for s, _ in pairs], cfg, device, beam_size)


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


def load_model(path: str | Path, device: torch.device | None = None):
    """Load a checkpoint directory: (model in eval mode, tokenizer, Config)."""
    device = device or _default_device()
    path = Path(path)
    info = load_checkpoint(path, None)
    fields = {f.name for f in dataclasses.fields(Config)}
    cfg = Config(**{k: v for k, v in info["config"].items() if k in fields})
    cfg.adam_betas = tuple(cfg.adam_betas)
    tok = load_tokenizer(path / "tokenizer.json")
    model = make_model(**cfg.model_kwargs(tok.get_vocab_size()))
    load_checkpoint(path, model, map_location=device)
    return model.to(device).eval(), tok, cfg


def _rounded(x: Any, digits: int = 4) -> Any:
    """Round every float of a nested list (attention maps stored as JSON stay small)."""
    return [_rounded(v, digits) for v in x] if isinstance(x, list) else round(x, digits)


@torch.no_grad()
def attention_maps(model: nn.Module, tok: Any, sentence: str, cfg: Config) -> dict[str, Any]:
    """Translate `sentence` greedily, then record every attention map of a teacher-forced pass.

    Returns ``source``, ``translation``, the token labels ``source_tokens`` (ids + ``</s>``) and
    ``target_tokens`` (``<s>`` + output), and ``maps``: for ``"encoder"`` (source x source),
    ``"decoder"`` (target x target) and ``"cross"`` (target x source) a nested list
    ``[layer][head][query][key]`` of weights rounded to 4 decimals. Used by chapter 8's figures.
    """
    device = next(model.parameters()).device
    src_ids = encode(tok, sentence)  # ids + EOS
    src = torch.tensor([src_ids], device=device)
    src_mask = (src != PAD).unsqueeze(-2)
    max_len = int(cfg.max_len_a * len(src_ids) + cfg.max_len_b)
    out = greedy_decode(model, src, src_mask, max_len, BOS, EOS)[0].tolist()
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
    beam_size: int = 4,
    data_dir: str | None = None,
    limit: int | None = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """sacreBLEU of a checkpoint on a Multi30k split, with the hypotheses and the signature."""
    device = device or _default_device()
    model, tok, cfg = load_model(checkpoint, device)
    pairs = load_multi30k(split, data_dir or cfg.data_dir, cfg.src_lang, cfg.tgt_lang)
    pairs = pairs[:limit] if limit else pairs
    start = time.perf_counter()
    hyps = translate_pairs(model, tok, pairs, cfg, device, beam_size=beam_size)
    score = bleu(hyps, pairs)
    return {
        "split": split,
        "beam_size": beam_size,
        "bleu": round(score.score, 2),
        "signature": bleu_signature(),
        "score_line": str(score),
        "sentences": len(pairs),
        "seconds": round(time.perf_counter() - start, 1),
        "hypotheses": hyps,
    }


def translate(
    checkpoint: str | Path, sentences: Sequence[str], beam_size: int = 4,
    device: torch.device | None = None,
) -> list[str]:
    """Translate sentences with a saved model."""
    device = device or _default_device()
    model, tok, cfg = load_model(checkpoint, device)
    return translate_sentences(model, tok, sentences, cfg, device, beam_size=beam_size)


def count_tokens_per_second(history: list[dict]) -> float:
    """Average training throughput (target tokens per second) of a run's history."""
    if not history:
        return math.nan
    last = history[-1]
    return last["tokens"] / max(last["minutes"] * 60, 1e-9)
