"""Evaluate a finished Multi30k run and write the results file chapter 8 reads.

    python tools/multi30k_report.py --run runs/multi30k_shipped --out results/multi30k.json \
        --system validation --length-penalties 0.6 0.8 1.0 1.2 1.4 1.6 1.8 2.0 \
        --command "python -m transformer_lib train --config configs/multi30k_shipped.toml ..."

For the best (by validation BLEU), the averaged and the last checkpoint it computes sacreBLEU on
test_2016_flickr with greedy decoding and with beam search; the reported result is the one
system named by --system: fixed in advance (averaged + beam), or `validation`, the checkpoint
whose beam-search BLEU on the validation set is highest (chosen before any test score is
looked at; the validation scores are stored beside the test scores). With --length-penalties,
validation chooses beam search's alpha together with the checkpoint, and the test scores at the
config's alpha are kept beside those at the chosen one. It stores: the scores and the
signature, the per-epoch history, the config, the parameter count, the wall time, ten test
translations beside their references, the worst-scored short sentences (for the chapter's
discussion of failures), the run's provenance (commit, local changes, machine, torch: the
record the trainer wrote into the run directory, RUN/provenance.json, copied as it is) and the
scoring machine's (where the `seconds` were measured).

Every input is checked before the first sentence is translated: a mistake in the arguments
must not cost the whole evaluation. A run trained before the trainer wrote provenance.json
needs `--commit`, the commit typed by hand, and the result says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from transformer_lib import translation
from transformer_lib.model import count_parameters
from transformer_lib.translation.config import MAX_BEAM, MAX_LENGTH_PENALTY
from transformer_lib.translation.data import load_multi30k
from transformer_lib.translation.provenance import PROVENANCE_FILE, provenance, read_provenance

ROOT = Path(__file__).resolve().parents[1]


def run_provenance(run: Path, commit: str | None) -> dict[str, Any]:
    """The trainer's record of `run`; for a run without one, `commit` as typed by hand.

    Raises ValueError with what to do when neither is there, when both are (the record wins
    over a hand-typed commit, which would silently disagree with it), or when the record is
    damaged.
    """
    record = read_provenance(run)
    if record is not None and commit is not None:
        raise ValueError(f"--commit is only for runs without {PROVENANCE_FILE}; {run} has one "
                         f"(commit {record['commit']}): drop --commit")
    if record is not None:
        return record
    if commit is None:
        raise ValueError(f"{run} has no {PROVENANCE_FILE} (the trainer writes it when a run "
                         "starts; runs trained before it did have none): pass --commit with "
                         "the commit the run was trained from")
    return {"commit": commit, "dirty": None, "machine": None, "torch": None, "python": None,
            "recorded_at": f"typed by hand (--commit): the run has no {PROVENANCE_FILE}"}


def check_inputs(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, checked before any translation; None when nothing."""
    for name in ("history.json", "config.json"):
        if not (args.run / name).is_file():
            return f"{args.run / name} not found: --run must be a training run directory"
    try:  # cut short by a copy, or edited: a traceback here, or a KeyError after the work
        history = json.loads((args.run / "history.json").read_text(encoding="utf-8"))
        config = json.loads((args.run / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        return f"{args.run}: its history.json or config.json is unreadable ({e})"
    if not isinstance(config, dict) or isinstance(config.get("length_penalty"), bool) \
            or not isinstance(config.get("length_penalty"), (int, float)):
        return f"{args.run / 'config.json'} is not a run's config (no length_penalty)"
    if not isinstance(history, list) or not all(
            isinstance(r, dict) and all(isinstance(r.get(k), (int, float))
                                        for k in ("step", "tokens", "minutes"))
            for r in history):
        return (f"{args.run / 'history.json'} is not a run's history (a list of epochs, each "
                "with step, tokens and minutes)")
    if not any("epoch_fraction" not in r for r in history):
        return f"{args.run / 'history.json'} holds no complete epoch: nothing to report"
    present = [c for c in args.checkpoints if (args.run / c).is_dir()]
    if not present:
        return f"none of the checkpoints {args.checkpoints} is in {args.run}"
    if args.system != "validation" and args.system not in present:
        return (f"--system {args.system}: {args.run / args.system} is not among the "
                f"checkpoints scored ({present})")
    if args.limit is not None and args.limit < 1:
        return f"--limit {args.limit}: must be at least 1"
    if not 2 <= args.beam <= MAX_BEAM:  # greedy is scored anyway; --beam is the beam search's
        return f"--beam {args.beam}: must be from 2 to {MAX_BEAM} (greedy is always scored too)"
    bad = [a for a in args.length_penalties or [] if not 0 <= a <= MAX_LENGTH_PENALTY]
    if bad:  # nan fails the test too
        return f"--length-penalties {bad}: each must be from 0 to {MAX_LENGTH_PENALTY:g}"
    if args.wall_minutes is not None and not 0 <= args.wall_minutes < math.inf:
        return f"--wall-minutes {args.wall_minutes}: must be a number of minutes >= 0"
    if args.length_penalties and args.system != "validation":
        return "--length-penalties needs --system validation (alpha is chosen on validation)"
    out = args.out.resolve()
    if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        return f"--out {args.out}: not a file in a writable directory"
    if args.limit is not None and out.is_relative_to(ROOT / "results"):
        return ("--limit scores a subset: its result must not replace a committed one in "
                "results/; write it elsewhere")
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked (with the run's provenance as ``args.provenance``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--command", required=True, help="the exact training command")
    ap.add_argument("--commit", help=f"only for a run without {PROVENANCE_FILE} (trained "
                    "before the trainer wrote one): the commit it was trained from, typed by "
                    "hand and recorded as such")
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
    args = ap.parse_args(argv)
    problem = check_inputs(args)
    if problem:
        ap.error(problem)
    try:
        args.provenance = run_provenance(args.run, args.commit)
    except ValueError as e:
        ap.error(str(e))
    return args


@dataclasses.dataclass
class Choice:
    """The system whose test score is THE result, and how it was chosen."""

    checkpoint: str
    alpha: float  # beam search's length penalty
    selection: dict[str, float] | None = None  # validation BLEU per checkpoint (config's alpha)
    alpha_choice: dict[str, Any] | None = None  # with several alphas: the grid and the pick


def choose(args: argparse.Namespace, present: list[str], config_alpha: float) -> Choice:
    """--system as given, or chosen on the validation set before any test sentence is read."""
    if args.system != "validation":
        return Choice(args.system, config_alpha)
    alphas = sorted({config_alpha, *(args.length_penalties or [])})
    grid = {c: {a: translation.evaluate(args.run / c, "val", beam_size=args.beam,
                                        limit=args.limit, length_penalty=a)["bleu"]
                for a in alphas}
            for c in present}
    print("validation BLEU (beam) per checkpoint and alpha:", grid, flush=True)
    # at the config's alpha, as for runs scored before alphas were chosen
    selection = {c: grid[c][config_alpha] for c in present}
    at_config = max(selection, key=selection.get)
    if len(alphas) == 1:
        return Choice(at_config, config_alpha, selection)
    # the checkpoint and alpha together (ties: the config's alpha)
    pick, alpha = max(((c, a) for c in present for a in alphas),
                      key=lambda ca: (grid[ca[0]][ca[1]], ca[1] == config_alpha))
    print(f"-> {pick}, alpha {alpha} (at alpha {config_alpha}: {at_config})", flush=True)
    return Choice(pick if alpha != config_alpha else at_config, alpha, selection,
                  {"config": config_alpha, "chosen": alpha, "checkpoint": pick, "grid": grid})


def score_on_test(args: argparse.Namespace, present: list[str], alpha: float,
                  config_alpha: float) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """Greedy and beam-search test BLEU of every checkpoint (and at the chosen alpha)."""
    scores, hyps_by = {}, {}
    # best: best validation BLEU; averaged: mean of the last epoch snapshots; last: the weights
    # when training stopped (with a time limit, part of an epoch after the last snapshot).
    settings = [(1, None), (args.beam, None)]  # greedy and beam search at the config's alpha
    if alpha != config_alpha:  # and beam search at the alpha chosen on validation
        settings.append((args.beam, alpha))
    for ckpt in present:
        for beam, a in settings:
            # the run's alpha, given explicitly: a checkpoint saved before a resume that changed
            # length_penalty holds the old one, and its score would be filed under the new one
            alpha_used = a if a is not None else config_alpha if beam > 1 else None
            res = translation.evaluate(
                args.run / ckpt, "test", beam_size=beam, limit=args.limit,
                **({} if alpha_used is None else {"length_penalty": alpha_used}))
            if a is None:
                key = f"{ckpt}_{'greedy' if beam == 1 else f'beam{beam}'}"
                entry = {"checkpoint": ckpt, "beam_size": beam}
            else:
                key = f"{ckpt}_beam{beam}_alpha{a:g}"
                entry = {"checkpoint": ckpt, "beam_size": beam, "length_penalty": a}
            scores[key] = {**entry, "bleu": res["bleu"], "score_line": res["score_line"],
                           "signature": res["signature"], "seconds": res["seconds"]}
            hyps_by[key] = res["hypotheses"]
            print(key, res["score_line"], flush=True)
    return scores, hyps_by


def examples_and_failures(pairs: list, hyps: list[str], greedy: list[str]) -> tuple[list, list]:
    """Ten test translations beside their references, and the worst-scored short sentences."""
    import sacrebleu

    examples = [
        {"source": s, "reference": r, "hypothesis": hyps[i], "greedy": greedy[i]}
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
    return examples, failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    history = json.loads((args.run / "history.json").read_text())
    # A run stopped by its time limit ends with a record of the partial epoch.
    full = [r for r in history if "epoch_fraction" not in r]
    pairs = load_multi30k("test")[: args.limit]
    present = [c for c in args.checkpoints if (args.run / c).is_dir()]
    config_alpha = json.loads((args.run / "config.json").read_text())["length_penalty"]
    choice = choose(args, present, config_alpha)  # decided before any test sentence is read
    scores, hyps_by = score_on_test(args, present, choice.alpha, config_alpha)
    chosen = f"{choice.checkpoint}_beam{args.beam}"
    if choice.alpha != config_alpha:
        chosen += f"_alpha{choice.alpha:g}"
    model, _, cfg = translation.load_model(args.run / choice.checkpoint)
    hyps = hyps_by[chosen]
    examples, failures = examples_and_failures(
        pairs, hyps, hyps_by[f"{choice.checkpoint}_greedy"])
    result = {
        "task": "Multi30k task 1, German -> English, test_2016_flickr (1,000 sentences)",
        "bleu": scores[chosen]["bleu"],
        # before the rounding to two decimals that sacreBLEU prints: a score that lands on
        # a target to the printed digit may still be below it
        "bleu_unrounded": translation.bleu(hyps, pairs).score,
        "system": chosen,
        # with --system validation: each checkpoint's validation BLEU (beam) that chose it
        "selection": {"on": "val", "beam_size": args.beam, "bleu": choice.selection}
        if choice.selection else {"on": "fixed in advance"},
        # with --length-penalties: the validation BLEU of every checkpoint at every alpha, and
        # the pair chosen there ("selection" above is the choice at the config's alpha alone)
        **({"length_penalty": choice.alpha_choice} if choice.alpha_choice else {}),
        "signature": scores[chosen]["signature"],
        "scores": scores,
        "command": args.command,
        # the trainer's commit, local changes and machine (RUN/provenance.json)
        "provenance": args.provenance,
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
        # where this report ran: the machine the scores' `seconds` were measured on
        "scoring_provenance": provenance(),
        "note": args.note,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {chosen} BLEU {result['bleu']}  ({time.process_time():.0f}s CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
