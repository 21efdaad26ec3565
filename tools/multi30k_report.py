"""Evaluate a finished Multi30k run and write the results file chapter 8 reads.

    python tools/multi30k_report.py --run runs/multi30k_small --out results/multi30k.json \
        --command "python -m transformer_lib train --config configs/multi30k_small.toml ..." \
        --commit <the commit the run was trained from>

For the best (by validation BLEU), the averaged and the last checkpoint it computes sacreBLEU on
test_2016_flickr with greedy decoding and with beam search; the reported result is the one
system named by --system: fixed in advance (averaged + beam), or `validation`, the checkpoint
whose beam-search BLEU on the validation set is highest (chosen before any test score is
looked at; the validation scores are stored beside the test scores). With --length-penalties,
validation chooses beam search's alpha together with the checkpoint, and the test scores at the
config's alpha are kept beside those at the chosen one. It stores: the scores and the
signature, the per-epoch history, the config, the parameter count, the wall time, ten test
translations beside their references, the worst-scored short sentences (for the chapter's
discussion of failures), and every attention map (all layers and heads of encoder
self-attention, decoder self-attention and decoder-source attention) for a few test sentences.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import time
from pathlib import Path

import torch

from transformer_lib import trainer
from transformer_lib.data import encode_text, load_multi30k
from transformer_lib.model import count_parameters

# Attention maps are stored for the first test sentences of 7-11 subwords: long enough to show
# reordering, short enough that every layer's and head's map stays readable in the book.
ATTENTION_SENTENCES = 3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--command", required=True, help="the exact training command")
    ap.add_argument("--commit", required=True, help="the commit the run was trained from")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument(
        "--system", default="averaged",
        choices=["best", "averaged", "last", "validation"],
        help="the checkpoint whose beam-search score is THE result, fixed before looking at test "
        "scores (choosing the best test score would tune on the test set); 'validation': the "
        "checkpoint with the highest beam-search BLEU on the validation set",
    )
    ap.add_argument(
        "--wall-minutes", type=float,
        help="wall time of the whole training command (data, tokenizer, training, averaging)",
    )
    ap.add_argument("--limit", type=int,
                    help="only the first n test (and validation) sentences (smoke tests)")
    ap.add_argument(
        "--checkpoints", nargs="+", default=["best", "averaged", "last"],
        choices=["best", "averaged", "last"], help="the checkpoints to score (default: all)",
    )
    ap.add_argument(
        "--length-penalties", nargs="+", type=float, metavar="ALPHA",
        help="with --system validation: choose beam search's length penalty on the validation "
        "set too, with the checkpoint, among these alphas (default: the config's alone); the "
        "test scores at the config's alpha are kept beside the chosen system's",
    )
    ap.add_argument("--note", default="", help="anything a reader of the numbers must know")
    args = ap.parse_args()

    history = json.loads((args.run / "history.json").read_text())
    # A run stopped by its time limit ends with a record of the partial epoch.
    full = [r for r in history if "epoch_fraction" not in r]
    import sacrebleu

    pairs = load_multi30k("test")[: args.limit]
    present = [c for c in args.checkpoints if (args.run / c).is_dir()]
    config_alpha = json.loads((args.run / "config.json").read_text())["length_penalty"]
    if args.length_penalties and args.system != "validation":
        ap.error("--length-penalties needs --system validation (alpha is chosen on validation)")
    alphas = sorted({config_alpha, *(args.length_penalties or [])})
    selection, alpha = None, config_alpha
    if args.system == "validation":  # decided here, before any test sentence is translated
        grid = {c: {a: trainer.evaluate(args.run / c, "val", beam_size=args.beam,
                                        limit=args.limit, length_penalty=a)["bleu"]
                    for a in alphas}
                for c in present}
        print("validation BLEU (beam) per checkpoint and alpha:", grid, flush=True)
        # at the config's alpha, as for runs scored before alphas were chosen
        selection = {c: grid[c][config_alpha] for c in present}
        args.system = max(selection, key=selection.get)
        if len(alphas) > 1:  # the checkpoint and alpha together (ties: the config's alpha)
            pick, alpha = max(((c, a) for c in present for a in alphas),
                              key=lambda ca: (grid[ca[0]][ca[1]], ca[1] == config_alpha))
            alpha_choice = {"config": config_alpha, "chosen": alpha,
                            "checkpoint": pick, "grid": grid}
            print(f"-> {pick}, alpha {alpha} (at alpha {config_alpha}: {args.system})",
                  flush=True)
    scores, hyps_by = {}, {}
    # best: best validation BLEU; averaged: mean of the last epoch snapshots; last: the weights
    # when training stopped (with a time limit, part of an epoch after the last snapshot).
    for ckpt in present:
        for beam in (1, args.beam):
            res = trainer.evaluate(args.run / ckpt, "test", beam_size=beam, limit=args.limit)
            key = f"{ckpt}_{'greedy' if beam == 1 else f'beam{beam}'}"
            scores[key] = {
                "checkpoint": ckpt, "beam_size": beam, "bleu": res["bleu"],
                "score_line": res["score_line"], "signature": res["signature"],
                "seconds": res["seconds"],
            }
            hyps_by[key] = res["hypotheses"]
            print(key, res["score_line"], flush=True)
        if alpha != config_alpha:  # beam search at the alpha chosen on validation
            res = trainer.evaluate(args.run / ckpt, "test", beam_size=args.beam,
                                   limit=args.limit, length_penalty=alpha)
            key = f"{ckpt}_beam{args.beam}_alpha{alpha:g}"
            scores[key] = {
                "checkpoint": ckpt, "beam_size": args.beam, "length_penalty": alpha,
                "bleu": res["bleu"], "score_line": res["score_line"],
                "signature": res["signature"], "seconds": res["seconds"],
            }
            hyps_by[key] = res["hypotheses"]
            print(key, res["score_line"], flush=True)
    chosen = f"{args.system}_beam{args.beam}"
    if alpha != config_alpha:
        chosen = f"{pick}_beam{args.beam}_alpha{alpha:g}"
    model, tok, cfg = trainer.load_model(args.run / scores[chosen]["checkpoint"])
    hyps = hyps_by[chosen]
    examples = [
        {"source": s, "reference": r, "hypothesis": hyps[i],
         "greedy": hyps_by[f"{scores[chosen]['checkpoint']}_greedy"][i]}
        for i, (s, r) in enumerate(pairs[:10])
    ]
    # Failures: the lowest sentence-level BLEU among sentences of 6-14 reference words.
    sent = [
        (sacrebleu.sentence_bleu(h, [r]).score, i)
        for i, (h, (_, r)) in enumerate(zip(hyps, pairs))
        if 6 <= len(r.split()) <= 14
    ]
    failures = [
        {"index": i, "source": pairs[i][0], "reference": pairs[i][1], "hypothesis": hyps[i],
         "sentence_bleu": round(b, 1)}
        for b, i in sorted(sent)[:8]
    ]
    short = [i for i, (s, _) in enumerate(pairs) if 7 <= len(encode_text(tok, s)) - 1 <= 11]
    # Attention maps are the Transformer's; the recurrent baseline has one additive attention.
    attention = [
        trainer.attention_maps(model, tok, pairs[i][0]) for i in short[:ATTENTION_SENTENCES]
    ] if cfg.arch == "transformer" else []
    result = {
        "task": "Multi30k task 1, German -> English, test_2016_flickr (1,000 sentences)",
        "bleu": scores[chosen]["bleu"],
        # before the rounding to two decimals that sacreBLEU prints: a score that lands on
        # a target to the printed digit may still be below it
        "bleu_unrounded": trainer.bleu(hyps, pairs).score,
        "system": chosen,
        # with --system validation: each checkpoint's validation BLEU (beam) that chose it
        "selection": {"on": "val", "beam_size": args.beam, "bleu": selection}
        if selection else {"on": "fixed in advance"},
        # with --length-penalties: the validation BLEU of every checkpoint at every alpha, and
        # the pair chosen there ("selection" above is the choice at the config's alpha alone)
        **({"length_penalty": alpha_choice} if len(alphas) > 1 else {}),
        "signature": scores[chosen]["signature"],
        "scores": scores,
        "command": args.command,
        "commit": args.commit,
        "config": dataclasses.asdict(cfg),
        "parameters": count_parameters(model),
        # Training time to the end of the last complete epoch (validation included); a time
        # limit may stop training later, inside an epoch whose progress only `last` holds.
        "train_minutes": round(full[-1]["minutes"], 1),
        "time_limit_minutes": cfg.time_limit_min,
        "wall_minutes_total": args.wall_minutes,
        "epochs": len(full),
        "steps": history[-1]["step"],
        "target_tokens": history[-1]["tokens"],
        "tokens_per_second": round(history[-1]["tokens"] / (history[-1]["minutes"] * 60)),
        "history": history,
        "examples": examples,
        "failures": failures,
        "attention": attention,
        "machine": {
            "cpu_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "note": args.note,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {chosen} BLEU {result['bleu']}  ({time.process_time():.0f}s CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
