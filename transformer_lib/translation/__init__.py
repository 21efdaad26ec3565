"""transformer_lib.translation: the Transformer trained and used on Multi30k (hand-written).

The chapter modules (``transformer_lib.attention`` …
``transformer_lib.decoding``) are the book's parts; this subpackage is the application built on
them, which they never import. One module per purpose:

    config       Config: a run's settings, read from TOML and checked
    data         Multi30k: verified download and loading, joint BPE, length-bucketed batches
    loop         train(): the training loop (gradient accumulation, DDP, budgets, resuming)
    rundir       one run per directory: the lock and the checks before a run starts
    distributed  several processes (torchrun) and the device of this one
    precision    fp32, bf16 autocast, or "auto" (bf16 where the machine has it natively)
    checkpoint   checkpoints as safetensors + JSON: atomic, verified, averaged
    inference    load_model, translate_sentences, translate_and_score (BLEU), evaluate
    scoring      corpus BLEU with sacreBLEU and its signature
    quantize     an int8 copy of a model for CPU inference (opt-in: translate --int8)
    pretrained   the German-English model that ships with the package
    cli          python -m transformer_lib {train,evaluate,translate}
    provenance   where a number came from: commit, machine, torch

The names below are the public ones of these modules, so ``translation.train(...)``,
``translation.load_model(...)`` and ``from transformer_lib.translation import Config`` work.
"""

from transformer_lib.translation.checkpoint import (
    average_checkpoints,
    capture_rng_state,
    load_checkpoint,
    recover_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from transformer_lib.translation.config import (
    FAST,
    MAX_PARAMS,
    RESUMABLE_CHANGES,
    Config,
    config_from_saved,
    load_config,
    parameter_count,
)
from transformer_lib.translation.data import (
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    UNK,
    collate,
    compare_padding,
    decode_ids,
    default_data_dir,
    download,
    encode_pairs,
    encode_text,
    example_length,
    id_pieces,
    load_multi30k,
    load_tokenizer,
    make_batches,
    padding_fraction,
    pieces,
    save_tokenizer,
    train_tokenizer,
)
from transformer_lib.translation.inference import (
    attention_maps,
    evaluate,
    load_model,
    source_length_limit,
    translate,
    translate_and_score,
    translate_sentences,
    validation_loss,
)
from transformer_lib.translation.loop import (
    RunState,
    budget_spent,
    lr_multiplier,
    make_optimizer,
    train,
)
from transformer_lib.translation.precision import precision_note, resolve_precision
from transformer_lib.translation.pretrained import PRETRAINED, load_pretrained, pretrained_path
from transformer_lib.translation.quantize import quantize_int8
from transformer_lib.translation.scoring import bleu, bleu_signature

__all__ = [
    # config
    "Config", "load_config", "config_from_saved", "parameter_count", "RESUMABLE_CHANGES",
    "MAX_PARAMS", "FAST",
    # data
    "PAD", "BOS", "EOS", "UNK", "SPECIAL_TOKENS", "default_data_dir", "load_multi30k",
    "download", "train_tokenizer", "save_tokenizer", "load_tokenizer", "encode_text",
    "decode_ids", "pieces", "id_pieces", "encode_pairs", "example_length", "make_batches",
    "collate", "padding_fraction", "compare_padding",
    # loop
    "train", "RunState", "make_optimizer", "lr_multiplier", "budget_spent",
    # precision
    "resolve_precision", "precision_note",
    # checkpoint
    "save_checkpoint", "load_checkpoint", "average_checkpoints", "capture_rng_state",
    "restore_rng_state", "recover_checkpoint",
    # inference
    "load_model", "translate_sentences", "translate", "translate_and_score", "evaluate",
    "bleu", "bleu_signature", "validation_loss", "attention_maps", "source_length_limit",
    # quantize
    "quantize_int8",
    # pretrained
    "PRETRAINED", "pretrained_path", "load_pretrained",
]
