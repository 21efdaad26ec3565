"""Write the model that ships with the package from a finished training run.

    python tools/ship_model.py --run runs/multi30k_shipped --checkpoint best \
        --results results/multi30k.json

Loads the run's checkpoint (checked against its manifest), stores its weights in bfloat16
(half the bytes; `--check-bleu` measures that this moves test BLEU by at most 0.1), and writes
``transformer_lib/pretrained/multi30k_de_en/``: weights, tokenizer, config, ``MODEL_CARD.md``
(written from the results file: data and checksums, command, commit, wall time, machine, scores
and signature) and a manifest of all of them, in the ordinary checkpoint format (so loading
verifies every file, the card too).

Everything is checked before the shipped model is touched: the results file must describe the
checkpoint (its reported system is this checkpoint, the same parameter count and model
settings), the weights must fit the size limit, the card must render. The new folder is built
beside the old one and swapped in with two renames (the checkpoint format's swap, which a load
repairs if a crash falls between them): a failure at any step leaves the shipped model as it was.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from transformer_lib import translation
from transformer_lib.model import count_parameters
from transformer_lib.translation._fileio import replace_dir
from transformer_lib.translation.checkpoint import save_checkpoint
from transformer_lib.translation.data import load_multi30k

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "transformer_lib" / "pretrained" / "multi30k_de_en"
SIZE_LIMIT = 20 * 2**20  # the repository ships at most 20 MB of weights
CARD = "MODEL_CARD.md"  # stored with the checkpoint's files and listed in its manifest
MODEL_KEYS = ("N", "d_model", "d_ff", "h", "dropout", "norm_first", "share_embeddings",
              "positional", "vocab_size", "label_smoothing", "precision")
# The recipe's budget and schedule: without max_steps, "epochs = 100" would read as the run.
RECIPE_KEYS = ("max_tokens", "lr_factor", "warmup", "schedule", "cooldown", "clip_norm",
               "max_steps", "epochs", "average_last")
# The card's licence section: the weights are the code's licence, the training data has its own
# terms (quoted from the dataset's README, which is all its repository says; no licence file).
LICENCE = [
    "## Licence and data terms",
    "- The weights, tokenizer and configuration in this folder are released under the MIT",
    "  licence, like the code (the repository's `LICENSE`: Copyright (c) 2026 The",
    "  transformer_lib authors).",
    "- They were trained on Multi30k, which has its own terms, not the MIT licence. Its",
    "  repository (https://github.com/multi30k/dataset) has no licence file; its README says",
    "  that the dataset is partially derived from Flickr30K, whose images come from Flickr and",
    "  must be used under Flickr's Terms of Use, that the dataset's authors do not own the",
    "  copyright of the images, and that the data is provided for researchers and educators",
    "  for non-commercial research and/or educational purposes. Flickr30K, the source of the",
    "  images and of the English captions, has terms of its own.",
    "- The MIT licence of the weights does not settle whether those terms reach a model",
    "  trained on the data: for a use beyond research and teaching, check them first.",
    "- Cite the data as Elliott, Frank, Sima'an and Specia (2016), \"Multi30K: Multilingual",
    "  English-German Image Descriptions\", Proceedings of the 5th Workshop on Vision and",
    "  Language, pages 70-74 (doi:10.18653/v1/W16-3210).",
]


def _training_line(r: dict) -> str:
    """Steps, epochs and minutes, true also when the step budget ended inside an epoch (the
    report's minutes run to the end of the last full epoch)."""
    last = (r.get("history") or [{}])[-1]
    if "epoch_fraction" in last:
        done = (f"- {r['steps']:,} steps: {r['epochs']} full epochs and "
                f"{last['epoch_fraction']:.0%} of epoch {last['epoch']}; {r['train_minutes']} "
                f"minutes of training to the end of epoch {r['epochs']}, "
                f"{last['minutes']:.1f} to the last step")
    else:
        done = (f"- {r['epochs']} epochs, {r['steps']:,} steps, {r['train_minutes']} minutes "
                "of training")
    if r["wall_minutes_total"] is None:
        return done + " (the whole command's time not recorded)"
    return done + f" ({r['wall_minutes_total']} minutes for the whole command)"


def check_results(results: Any, checkpoint: str, config: dict, parameters: int) -> None:
    """Raise ValueError unless `results` (a multi30k_report file) describes this checkpoint."""
    if not isinstance(results, dict):
        raise ValueError("not a results file of tools/multi30k_report.py (a JSON object)")
    needed = ("scores", "system", "signature", "parameters", "config", "command", "epochs",
              "steps", "train_minutes", "wall_minutes_total")
    missing = [k for k in needed if k not in results]
    if results.get("provenance") is None and not {"commit", "machine"} <= results.keys():
        missing.append("provenance")
    if missing:
        raise ValueError(f"not a results file of tools/multi30k_report.py: no {missing}")
    # Present but null (or of another kind) is as unusable as missing: the checks below and
    # the card would fail on it with a traceback ("'NoneType' object has no attribute 'get'").
    # Only the whole command's time may be unrecorded (the card says so).
    kinds = {"scores": dict, "config": dict, "system": str, "signature": str, "command": str,
             "parameters": int, "epochs": int, "steps": int, "train_minutes": (int, float),
             "wall_minutes_total": (int, float, type(None)), "provenance": (dict, type(None))}
    wrong = [k for k, kind in kinds.items() if k in results and not isinstance(results[k], kind)]
    if wrong:
        raise ValueError(f"not a results file of tools/multi30k_report.py: {wrong} null or not "
                         "of the kind it writes")
    unscored = [k for k, v in results["scores"].items()
                if not isinstance(v, dict) or "bleu" not in v]
    if unscored:
        raise ValueError(f"the results' scores {unscored} have no BLEU score")
    reported = results["scores"].get(results["system"], {}).get("checkpoint")
    if reported != checkpoint:
        raise ValueError(f"the results report the {reported!r} checkpoint ({results['system']}),"
                         f" not {checkpoint!r}: the card would describe another model")
    if results["parameters"] != parameters:
        raise ValueError(f"the results describe a model of {results['parameters']:,} parameters,"
                         f" the checkpoint has {parameters:,}")
    differ = {k: (results["config"].get(k), config.get(k)) for k in MODEL_KEYS + RECIPE_KEYS
              if results["config"].get(k) != config.get(k)}
    if differ:
        raise ValueError(f"the results' config differs from the checkpoint's (results, "
                         f"checkpoint): {differ}")


def check_card(results: dict) -> None:
    """Raise ValueError unless the card renders from `results`: a partial file (a score
    without its score_line, a provenance without its machine's fields) failed with a KeyError
    after the BLEU checks, in the middle of the work."""
    try:
        _card(results, {"beam": 4, "fp32": "", "bf16": ""}, [])
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        raise ValueError(f"the results lack what the model card shows ({type(e).__name__}: "
                         f"{e})") from None


def _training_lines(r: dict) -> list[str]:
    """The card's commit and machine: the trainer's record, or an older file's fields."""
    p = r.get("provenance")
    if p is None:  # a results file written before the trainer recorded its provenance
        return [f"- commit: {r['commit']}",
                "- machine: 2 CPU cores (AMD EPYC, AVX-512 with bf16 instructions), "
                f"torch {r['machine']['torch']}, Python {r['machine']['python']}"]
    commit = p["commit"] or "unknown"
    if p.get("dirty"):
        commit += " with local changes"
    if p.get("recorded_at", "start") != "start":
        commit += f" ({p['recorded_at']})"
    m, t = p.get("machine"), p.get("torch") or {}
    if m is None:
        return [f"- commit: {commit}", "- machine: not recorded"]
    flags = ", ".join(m["cpu_flags"]) or "none recorded"
    return [f"- commit: {commit}",
            f"- machine: {m['cpu_model']}, {m['logical_cores']} logical cores (CPU flags: "
            f"{flags}), torch {t.get('version')} on {t.get('threads')} threads, "
            f"Python {p.get('python')}"]


def _chosen_how(r: dict) -> str:
    """How the results file chose its reported system, for the card."""
    sel = r.get("selection") or {}
    if sel.get("on") != "val":
        return "before looking at test scores"
    what = "checkpoint and length penalty" if "length_penalty" in r else "checkpoint"
    return (f"on the validation set ({what}, beam {sel.get('beam_size')}) before the test "
            f"set was decoded")


def _scored_in(r: dict) -> str:
    """What precision "auto" meant where the test scores were decoded."""
    native = ((r.get("scoring_provenance") or {}).get("machine") or {}).get("bf16_native")
    if native is None:
        return "on a machine the results do not describe"
    return "which was bf16 autocast there" if native else "which was float32 there"


def _card(results: dict, bf16_scores: dict, files: list[str]) -> str:
    r = results
    score = r["scores"][r["system"]]
    commit_line, machine_line = _training_lines(r)
    sums = (Path(r.get("data_dir", "")) / "SHA256SUMS") if r.get("data_dir") else None
    lines = [
        "# Model card: transformer_lib multi30k_de_en",
        "",
        "A Transformer (encoder-decoder, the book's `make_model`) that translates German image",
        "captions into English. Trained in chapter 8 of the book; loaded by",
        "`transformer_lib.load_pretrained()` and by `python -m transformer_lib translate` when no",
        "`--checkpoint` is given.",
        "",
        "## Model",
        f"- parameters: {r['parameters']:,} (weights stored in bfloat16, loaded into float32)",
        "- configuration: " + ", ".join(f"{k} = {r['config'][k]}" for k in MODEL_KEYS),
        "- recipe: " + ", ".join(f"{k} = {r['config'].get(k)}" for k in RECIPE_KEYS)
        + " (the run ends at max_steps or after epochs, whichever comes first)",
        "- tokenizer: joint byte-level BPE over German and English, trained on the training split",
        "",
        "## Data",
        "- Multi30k (Elliott et al., 2016), task 1, raw files of multi30k/dataset: train (29,000",
        "  pairs), val (1,014), test_2016_flickr (1,000); each file checked against its SHA-256",
        "  (`transformer_lib.translation.data.SHA256`) before it is read.",
        "",
        *LICENCE,
        "",
        "## Training",
        f"- command: `{r['command']}`",
        commit_line,
        _training_line(r),
        machine_line,
        f"- note: {r.get('note', '')}",
        "",
        "## Scores (sacreBLEU on test_2016_flickr, 1,000 sentences)",
        f"- signature: `{r['signature']}`",
        f"- reported system, chosen {_chosen_how(r)}: {r['system']} -> {score['score_line']}",
    ]
    lines += [f"- {k}: {v['bleu']}" for k, v in r["scores"].items()]
    lines += [
        "",
        "## The shipped bfloat16 weights",
        f"- float32 weights, {bf16_scores['beam']}-beam: {bf16_scores['fp32']}",
        f"- bfloat16 weights, same decoding: {bf16_scores['bf16']}",
        "- both decoded in float32 at the reported system's length penalty, so only the "
        "weights' storage differs; the scores above were decoded under precision auto, "
        f"{_scored_in(r)}",
        f"- files: {', '.join(files)}",
        "",
        "## Limits",
        "- Trained on short, concrete image captions: other text (news, dialogue, long",
        "  sentences) is out of its domain and is translated badly or hallucinated.",
        "- Inputs longer than 256 subwords are refused by default (`max_input_len`,",
        "  `--max-input-len`).",
    ]
    if sums:
        lines.append(f"- data checksums: {sums}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--checkpoint", default="averaged")
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("--check-bleu", action="store_true",
                    help="score fp32 and bf16 weights on the test set (beam 4)")
    args = ap.parse_args()
    device = torch.device("cpu")
    try:  # a missing or damaged checkpoint is the user's to fix: one line, not a traceback
        model, tok, cfg = translation.load_model(args.run / args.checkpoint, device)
    except (OSError, ValueError) as e:
        ap.error(f"--run {args.run} --checkpoint {args.checkpoint}: {e}; {OUT} left as it was")
    try:
        results = json.loads(args.results.read_text(encoding="utf-8"))
        check_results(results, args.checkpoint, dataclasses.asdict(cfg), count_parameters(model))
        check_card(results)
    except (OSError, ValueError) as e:
        ap.error(f"--results {args.results}: {e}; {OUT} left as it was")
    chosen = (results.get("length_penalty") or {}).get("chosen")
    if chosen is not None:  # translate with the alpha validation chose, not the config's
        cfg = dataclasses.replace(cfg, length_penalty=chosen)
    scores = {"beam": 4, "fp32": "not measured", "bf16": "not measured"}
    pairs = load_multi30k("test")
    if args.check_bleu:
        # fp32 compute on both sides: what differs is the weights' storage alone
        scores["fp32"] = translation.translate_and_score(
            model, tok, cfg, pairs, beam_size=4, precision="fp32")["score_line"]
    half = model.to(torch.bfloat16)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the shipped folder (the same file system, so the swap is two renames).
    with tempfile.TemporaryDirectory(dir=OUT.parent, prefix=f".{OUT.name}.ship-") as tmp:
        stage = Path(tmp) / OUT.name
        save = functools.partial(save_checkpoint, stage, half, dataclasses.asdict(cfg),
                                 tokenizer=tok, rng=False)
        save()
        size = sum(p.stat().st_size for p in stage.iterdir())
        if size > SIZE_LIMIT:
            raise SystemExit(f"the new model holds {size:,} bytes, more than {SIZE_LIMIT:,}; "
                             f"{OUT} left as it was")
        if args.check_bleu:
            shipped, tok2, _ = translation.load_model(stage, device)
            scores["bf16"] = translation.translate_and_score(
                shipped, tok2, cfg, pairs, beam_size=4, precision="fp32")["score_line"]
        # Saved again with the card, which the manifest then lists: load_pretrained checks it.
        files = sorted([CARD, *(p.name for p in stage.iterdir())])
        save(documents={CARD: _card(results, scores, files)})
        replace_dir(stage, OUT, what=f"shipped model {OUT}")  # the one step that touches it
    print(f"wrote {OUT} ({size / 2**20:.1f} MiB)")
    print("fp32:", scores["fp32"])
    print("bf16:", scores["bf16"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
