"""The paper's Table 3, re-run small: one change at a time from the chapter-8 model.

    python tools/ablations.py                      # every row not yet done, one after another
    python tools/ablations.py --shard 0/2 --threads 1 & \
    python tools/ablations.py --shard 1/2 --threads 1  # two rows at a time on two cores
    python tools/ablations.py --collect   # the rows into experiments/ablations/results.json

Every row trains the chapter-8 model (experiments/recipe_15_epochs.toml, the recipe the
package shipped until 2026-11-28) for the same number of optimizer steps (`--steps`; the
paper's Table 3 also fixes the steps, 100k), with the same data order and seed, changing one
setting. At the end it records the validation cross-entropy
without label smoothing and its perplexity (what the paper's table reports; rows that change
the label smoothing are compared on it), the validation loss as trained (with the row's label
smoothing), validation BLEU (greedy, sacreBLEU on the 1,014 validation sentences), the
parameter count, target tokens per second and minutes, with the command, the full config and
the provenance (commit, local changes, machine, torch: transformer_lib.translation.provenance,
the trainer's record of the run when it has one). Runs go to runs/ablations/ROW/; a row whose
result.json exists is skipped and an interrupted row resumes from its last checkpoint, so the
command can simply be run again (`--rescore` adds the cross-entropy to rows finished before it
was recorded). The book's chapter 10 reads experiments/ablations/results.json (the record:
experiments/ablations/README.md). `--collect` never writes a
table with fewer rows than the committed one (a fresh clone has no finished rows) unless told.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from transformer_lib.translation.provenance import provenance, read_provenance

ROOT = Path(__file__).resolve().parents[1]
BASE_CONFIG = ROOT / "experiments" / "recipe_15_epochs.toml"
RUNS = ROOT / "runs" / "ablations"
RESULTS = ROOT / "experiments" / "ablations" / "results.json"

# (name, group, what changes, config overrides). The base model: N=3, d_model=256, d_ff=1024,
# h=4 (d_k=64), dropout 0.1, label smoothing 0.1, sinusoidal positions, pre-norm, tied embeddings.
ROWS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("base", "base", "the chapter-8 model", {}),
    ("base_seed2", "base", "seed 2", {"seed": 2}),
    ("base_seed3", "base", "seed 3", {"seed": 3}),
    ("heads_1", "A", "h = 1 (d_k = 256)", {"h": 1}),
    ("heads_8", "A", "h = 8 (d_k = 32)", {"h": 8}),
    ("heads_16", "A", "h = 16 (d_k = 16)", {"h": 16}),
    ("dropout_0", "D", "dropout 0", {"dropout": 0.0}),
    ("dropout_0.3", "D", "dropout 0.3", {"dropout": 0.3}),
    ("smoothing_0", "D", "label smoothing 0", {"label_smoothing": 0.0}),
    ("learned_pos", "E", "learned positions", {"positional": "learned", "max_positions": 256}),
    ("post_norm", "norm", "post-norm (the paper's)", {"norm_first": False}),
    ("untied", "tied", "untied embeddings", {"share_embeddings": False}),
    ("layers_2", "C", "N = 2", {"N": 2}),
    ("layers_4", "C", "N = 4", {"N": 4}),
    ("ffn_512", "C", "d_ff = 512", {"d_ff": 512}),
]
# The step budget and its schedule: warm-up over half of it, so the learning rate peaks and
# then decays inside every run (the shipped model's 800 warm-up steps would never finish).
BUDGET = {"max_steps": 300, "warmup": 150, "epochs": 100, "bleu_every": 0, "keep_last": 1,
          "average_last": 0, "save_every": 50, "time_limit_min": None}


def _write_json(path: Path, obj: Any) -> None:
    """Write `obj` beside `path`, then rename it into place: a crash never leaves half a file
    (a half-written result.json would pass for a finished row)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _row_provenance(run_dir: Path) -> dict[str, Any]:
    """The trainer's record of the row's run (its commit and machine), else this process's."""
    record = read_provenance(run_dir)
    if record is None:  # a run trained before the trainer wrote one
        record = {**provenance(), "recorded_at": "after training (the run has no record)"}
    return record


def shard(text: str) -> tuple[int, int]:
    """``i/n`` (an argparse type): run rows i, i+n, i+2n, ... with 0 <= i < n."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not i/n (two integers, e.g. 0/2)") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r}: need n >= 1 and 0 <= i < n (e.g. 0/2, 1/2)")
    return i, n


def row_config(overrides: dict[str, Any], steps: int, warmup: int):
    """The chapter-8 config with the budget and one row's changes applied."""
    from transformer_lib import translation

    budget = dict(BUDGET, max_steps=steps, warmup=warmup)
    return translation.load_config(BASE_CONFIG, **budget, **overrides)


def cross_entropy(run_dir: Path) -> dict[str, float]:
    """Validation cross-entropy per target token of RUN/last, without label smoothing.

    The training loss of a row depends on its label smoothing, so it cannot compare rows that
    change it; the plain cross-entropy (and its exponential, the perplexity the paper's
    Table 3 reports) can.
    """
    import math

    from transformer_lib import translation
    from transformer_lib.translation.data import encode_pairs, load_multi30k

    model, tok, cfg = translation.load_model(run_dir / "last", torch.device("cpu"))
    pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang)
    nll = translation.validation_loss(model, encode_pairs(pairs, tok), max_tokens=cfg.max_tokens,
                                      label_smoothing=0.0, precision=cfg.precision)
    return {"val_nll": round(nll, 4), "val_ppl": round(math.exp(nll), 2)}


def run_row(name: str, overrides: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Train one row (or finish it) and return its record."""
    from transformer_lib import translation
    from transformer_lib.model import count_parameters
    from transformer_lib.translation.data import load_multi30k

    cfg = row_config(overrides, args.steps, args.warmup)
    run_dir = RUNS / name
    resume = (run_dir / "last").is_dir()
    t0 = time.perf_counter()
    record: dict[str, Any] = {}
    try:
        out = translation.train(cfg, run_dir, resume=resume, progress=args.progress)
    except FloatingPointError as e:  # a row may diverge; that is a result too
        return {"diverged": str(e)}
    wall = time.perf_counter() - t0
    last = out["history"][-1]
    model, tok, _ = translation.load_model(run_dir / "last", torch.device("cpu"))
    pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang)
    scored = translation.translate_and_score(model, tok, cfg, pairs, beam_size=1)
    record.update(
        **cross_entropy(run_dir),
        val_loss=round(last["val_loss"], 4),
        val_bleu=scored["bleu"],
        train_loss=round(last["train_loss"], 4),
        parameters=count_parameters(model),
        steps=out["steps"],
        target_tokens=last["tokens"],
        # Training only: the clock of the trainer, minus nothing (validation loss once per
        # epoch is inside it, about 1% of a row).
        minutes=round(out["minutes"], 2),
        tokens_per_second=round(last["tokens"] / (out["minutes"] * 60)),
        wall_minutes_this_call=round(wall / 60, 2),
        resumed=resume,
    )
    return record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=BUDGET["max_steps"])
    ap.add_argument("--warmup", type=int, default=BUDGET["warmup"])
    ap.add_argument("--rows", nargs="*", help="only these rows (default: all)")
    ap.add_argument("--shard", default=(0, 1), type=shard,
                    help="i/n: run rows i, i+n, i+2n, ... (0 <= i < n)")
    ap.add_argument("--threads", type=int, help="torch threads per process")
    ap.add_argument("--progress", action="store_true", help="show a progress bar per row")
    ap.add_argument("--collect", action="store_true", help="merge finished rows into the results")
    ap.add_argument("--allow-missing", action="store_true",
                    help="with --collect: write the results even if rows they hold now have no "
                    "finished run here (those rows are dropped)")
    ap.add_argument("--rescore", action="store_true",
                    help="add the validation cross-entropy to finished rows that lack it")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.collect:
        return collect(allow_missing=args.allow_missing)
    if args.rescore:
        return rescore()
    i, n = args.shard
    names = {r[0] for r in ROWS}
    unknown = set(args.rows or []) - names
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; rows are {sorted(names)}")
    todo = [r for k, r in enumerate(ROWS) if k % n == i and (not args.rows or r[0] in args.rows)]
    for name, group, change, overrides in todo:
        out_file = RUNS / name / "result.json"
        if out_file.exists():
            print(f"{name}: done already ({out_file})")
            continue
        print(f"{name}: training ({change})", flush=True)
        record = run_row(name, overrides, args)
        cfg = row_config(overrides, args.steps, args.warmup)
        record = {
            "row": name, "group": group, "change": change, "overrides": overrides, **record,
            "command": " ".join(["python", "tools/ablations.py", "--rows", name,
                                 "--steps", str(args.steps), "--warmup", str(args.warmup)]
                                + (["--threads", str(args.threads)] if args.threads else [])),
            "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "data_dir"},
            "provenance": _row_provenance(RUNS / name),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        _write_json(out_file, record)
        print(f"{name}: {json.dumps({k: record.get(k) for k in ('val_loss', 'val_bleu')})}",
              flush=True)
    return 0


def rescore() -> int:
    scorer = provenance()  # the code that computes the cross-entropy
    for name, *_ in ROWS:
        f = RUNS / name / "result.json"
        if not f.exists():
            continue
        record = json.loads(f.read_text(encoding="utf-8"))
        if "val_nll" in record or "diverged" in record:
            continue
        record.update(cross_entropy(RUNS / name), val_nll_provenance=scorer)
        _write_json(f, record)
        print(f"{name}: val_nll {record['val_nll']}", flush=True)
    return 0


def _committed_rows() -> list[str]:
    """The row names the results file holds now (none if it is missing or unreadable)."""
    try:
        return [r["row"] for r in json.loads(RESULTS.read_text(encoding="utf-8"))["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _refuse(message: str) -> int:
    print(f"ablations --collect: {message}; {RESULTS} left as it is", file=sys.stderr)
    return 1


def collect(allow_missing: bool = False) -> int:
    """Write experiments/ablations/results.json from the finished rows under runs/ablations/.

    Refuses (exit 1, the file untouched) when no row has finished here (a fresh clone: the
    committed file is the only copy of hours of training), when rows the file holds now have
    no finished run here (unless `allow_missing`), when a result.json is unreadable, and
    when the rows were trained with different step budgets (one table needs one budget).
    """
    rows, missing = [], []
    for name, *_ in ROWS:
        f = RUNS / name / "result.json"
        if not f.exists():
            missing.append(name)
            continue
        try:
            rows.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, ValueError) as e:
            return _refuse(f"{f} is unreadable ({e}); delete it to train the row again")
    if not rows:
        return _refuse(f"no finished rows under {RUNS} (train them first: python "
                       "tools/ablations.py)")
    dropped = [r for r in _committed_rows() if r in missing]
    if dropped and not allow_missing:
        return _refuse(f"rows {dropped} are in the results but have no finished run here; "
                       "train them, or pass --allow-missing to drop them")
    budgets = {(r["config"]["max_steps"], r["config"]["warmup"]) for r in rows}
    if len(budgets) > 1:
        return _refuse(f"the rows were trained with different (steps, warmup): {sorted(budgets)}")
    (steps, warmup), = budgets
    out = {
        "what": "Table 3 of Vaswani et al. (2017), re-run small on Multi30k de->en: one change "
                "at a time from the chapter-8 model, a fixed budget of optimizer steps per row",
        "regenerate": "python tools/ablations.py --shard 0/2 --threads 1 & "
                      "python tools/ablations.py --shard 1/2 --threads 1; "
                      "python tools/ablations.py --collect",
        "base_config": "experiments/recipe_15_epochs.toml",
        "budget": {"max_steps": steps, "warmup": warmup},
        "rows": rows,
        "missing": missing,
    }
    _write_json(RESULTS, out)
    print(f"wrote {RESULTS}: {len(rows)} rows" + (f", missing {missing}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
