"""Command line: `python -m transformer_lib {train,evaluate,translate}`.

    python -m transformer_lib train --config configs/multi30k_small.toml --run-dir runs/small
    python -m transformer_lib train --config configs/multi30k_small.toml --run-dir runs/small \
        --resume
    torchrun --nproc_per_node=2 -m transformer_lib train --config configs/tiny.toml \
        --run-dir runs/ddp
    python -m transformer_lib evaluate --checkpoint runs/small/averaged --split test --beam 4
    echo "Ein Hund rennt im Schnee." | \
        python -m transformer_lib translate --checkpoint runs/small/best
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m transformer_lib", description=__doc__.splitlines()[0]
    )
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a translation model on Multi30k")
    t.add_argument("--config", required=True, help="TOML file (see configs/)")
    # --run is a short alias; under torchrun write --run-dir (torchrun's own parser would read
    # --run as an ambiguous abbreviation of its --run-path option).
    t.add_argument(
        "--run-dir", "--run", dest="run", required=True,
        help="directory for checkpoints, tokenizer and metrics",
    )
    t.add_argument("--resume", action="store_true", help="continue from RUN/last")
    t.add_argument("--data-dir", help="Multi30k directory (default: see transformer_lib.data)")
    t.add_argument("--epochs", type=int, help="override the config's epochs")
    t.add_argument("--precision", choices=["fp32", "bf16"], help="override the config's precision")
    t.add_argument(
        "--fast",
        action="store_true",
        default=None,
        help="the fastest setting: bf16 autocast and the paper's dropout placement "
        "(no dropout on attention weights or FFN activations); see the performance appendix",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    e = sub.add_parser("evaluate", help="sacreBLEU of a checkpoint on a split")
    e.add_argument("--checkpoint", required=True, help="a checkpoint directory")
    e.add_argument("--split", default="test", choices=["train", "val", "test"])
    e.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    e.add_argument("--data-dir")
    e.add_argument("--limit", type=int, help="only the first n sentences")
    e.add_argument("--output", help="write the JSON result (with hypotheses) here")

    r = sub.add_parser("translate", help="translate stdin lines to stdout")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from transformer_lib import trainer

    if args.command == "train":
        cfg = trainer.load_config(
            args.config,
            data_dir=args.data_dir,
            epochs=args.epochs,
            precision=args.precision,
            fast=args.fast,
        )
        result = trainer.train(cfg, args.run, resume=args.resume, progress=not args.no_progress)
        if result["history"]:
            last = result["history"][-1]
            print(json.dumps({k: last[k] for k in last if not isinstance(last[k], list)}))
        return 0
    if args.command == "evaluate":
        result = trainer.evaluate(
            args.checkpoint, args.split, args.beam, data_dir=args.data_dir, limit=args.limit
        )
        if args.output:
            Path(args.output).write_text(json.dumps(result, indent=2, ensure_ascii=False))
        print(result["score_line"])
        print(result["signature"])
        return 0
    if args.command == "translate":
        lines = [line.rstrip("\n") for line in sys.stdin]
        for out in trainer.translate(args.checkpoint, lines, beam_size=args.beam):
            print(out)
        return 0
    return 2
