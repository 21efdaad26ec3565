"""The paper's Table 3, re-run small: one change at a time from the chapter-8 model.

    python tools/ablations.py                      # every row not yet done, one after another
    python tools/ablations.py --shard 0/2 --threads 1 & \
    python tools/ablations.py --shard 1/2 --threads 1  # two rows at a time on two cores
    python tools/ablations.py --collect   # the rows into experiments/ablations/results.json
    python tools/ablations.py --budget long ...  # the same for the longer budget (below)

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
was recorded).

Two budgets. `short` (the default): 300 steps of the recipe's 2,500-token batches, about one
and a half passes over the data, where the base model scores 2 to 4 BLEU: it measures how
fast a variant starts to learn. `long`: the rows that matter (LONG_ROWS) again, with the
shipped recipe's batches (625 tokens), its peak learning rate and its schedule (a linear
warm-up, the peak held, then a straight fall to 0 over the last 40%), for 1,600 steps. The
deadline series' quarter-batch run reached 19.9 validation BLEU after 1,612 steps with its rate
still rising, so the base model should translate here (20+ validation BLEU, where BLEU can
separate rows), and it does: its three seeds scored 25.6 to 26.0, a row took 9.5 to 16
minutes of training on one thread of a 2-core Xeon (most beside another row). Its runs go to
runs/ablations_long/ and its table to experiments/ablations/results_long.json. Chapter 10
reads both files (the record: experiments/ablations/README.md). `--collect` never writes a
table with fewer rows than the committed one (a fresh clone has no finished rows) unless
told.
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

from transformer_lib.translation.cli import positive_int
from transformer_lib.translation.provenance import provenance, read_provenance

ROOT = Path(__file__).resolve().parents[1]
BASE_CONFIG = ROOT / "experiments" / "recipe_15_epochs.toml"
RUNS = ROOT / "runs" / "ablations"
RESULTS = ROOT / "experiments" / "ablations" / "results.json"
RUNS_LONG = ROOT / "runs" / "ablations_long"
RESULTS_LONG = ROOT / "experiments" / "ablations" / "results_long.json"

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
# then decays inside every run (the 15-epoch recipe's 800 warm-up steps would never finish).
BUDGET = {"max_steps": 300, "warmup": 150, "epochs": 100, "bleu_every": 0, "keep_last": 1,
          "average_last": 0, "save_every": 50, "time_limit_min": None}
# The long budget: what configs/multi30k_shipped.toml changes from the 15-epoch recipe (its
# batches and schedule), on 1,600 steps. The warm-up is shorter than the shipped 3,200 steps,
# so lr_factor (set in row_config) keeps the shipped peak rate, rate(3200) at factor 1.
LONG_BUDGET = {**BUDGET, "max_steps": 1600, "warmup": 400, "max_tokens": 625,
               "schedule": "linear", "cooldown": 0.4, "save_every": 200}
SHIPPED_WARMUP = 3200
# Some rows whose short-budget verdict disagrees with the paper (no dropout, learned positions,
# two layers), the one the schedule confounds (post-norm), the paper's clearest finding (one
# head), and three seeds for the noise.
LONG_ROWS = ("base", "base_seed2", "base_seed3", "heads_1", "dropout_0", "learned_pos",
             "post_norm", "layers_2")


def _budget(name: str) -> tuple[dict[str, Any], Path, Path, list]:
    """A budget's shared settings, its runs folder, its results file and its rows."""
    if name == "short":
        return BUDGET, RUNS, RESULTS, ROWS
    if name == "long":
        return LONG_BUDGET, RUNS_LONG, RESULTS_LONG, [r for r in ROWS if r[0] in LONG_ROWS]
    raise ValueError(f"budget: {name!r} is not 'short' or 'long'")


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


def row_config(overrides: dict[str, Any], steps: int | None = None, warmup: int | None = None,
               budget: str = "short"):
    """The chapter-8 config with the budget and one row's changes applied (None: the budget's
    steps and warm-up; 0 is a value, refused by the config, never "unset")."""
    import math

    from transformer_lib import translation

    shared = _budget(budget)[0]
    settings = dict(shared, max_steps=shared["max_steps"] if steps is None else steps,
                    warmup=shared["warmup"] if warmup is None else warmup)
    if budget == "long":  # the shipped peak rate, whatever the warm-up
        settings["lr_factor"] = round(math.sqrt(settings["warmup"] / SHIPPED_WARMUP), 4)
    return translation.load_config(BASE_CONFIG, **settings, **overrides)


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


def run_row(cfg: Any, run_dir: Path, progress: bool = False) -> dict[str, Any]:
    """Train one row's config `cfg` in `run_dir` (or finish it) and return its record."""
    from transformer_lib import translation
    from transformer_lib.model import count_parameters
    from transformer_lib.translation.checkpoint import recover_checkpoint
    from transformer_lib.translation.data import load_multi30k

    # Resume only from a saved state. A row killed in its first steps left config.json,
    # provenance.json and tokenizer.json but no last/: it starts afresh (the trainer accepts a
    # directory holding only those), since "resuming" it would find nothing to continue.
    resume = recover_checkpoint(run_dir / "last")
    t0 = time.perf_counter()
    record: dict[str, Any] = {}
    try:
        out = translation.train(cfg, run_dir, resume=resume, progress=progress)
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
    ap.add_argument("--budget", choices=("short", "long"), default="short",
                    help="short: 300 steps, every row; long: 1,600 steps, LONG_ROWS")
    # counts >= 1: 0 means nothing to do, and a negative count would fail deep in the trainer
    ap.add_argument("--steps", type=positive_int,
                    help="optimizer steps per row (default: the budget's)")
    ap.add_argument("--warmup", type=positive_int, help="warm-up steps (default: the budget's)")
    # nargs="+": `--rows $ROWS` with ROWS unset must not mean "every row" (hours of training)
    ap.add_argument("--rows", nargs="+", metavar="ROW", help="only these rows (default: all)")
    ap.add_argument("--shard", default=(0, 1), type=shard,
                    help="i/n: run rows i, i+n, i+2n, ... (0 <= i < n)")
    ap.add_argument("--threads", type=positive_int, help="torch threads per process")
    ap.add_argument("--progress", action="store_true", help="show a progress bar per row")
    ap.add_argument("--collect", action="store_true", help="merge finished rows into the results")
    ap.add_argument("--allow-missing", action="store_true",
                    help="with --collect: write the results even if rows they hold now have no "
                    "finished run here (those rows are dropped)")
    ap.add_argument("--rescore", action="store_true",
                    help="add the validation cross-entropy to finished rows that lack it")
    args = ap.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.collect:
        return collect(allow_missing=args.allow_missing, budget=args.budget)
    if args.rescore:
        return rescore(args.budget)
    _, runs, _, rows = _budget(args.budget)
    i, n = args.shard
    names = {r[0] for r in rows}
    unknown = set(args.rows or []) - names  # None: no --rows, every row
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; rows of the {args.budget} budget are "
                 f"{sorted(names)}")
    todo = [r for k, r in enumerate(rows) if k % n == i and (not args.rows or r[0] in args.rows)]
    for name, group, change, overrides in todo:
        out_file = runs / name / "result.json"
        if out_file.exists():
            print(f"{name}: done already ({out_file})")
            continue
        print(f"{name}: training ({change})", flush=True)
        # The one place the budget's defaults meet the command line's --steps and --warmup.
        try:
            cfg = row_config(overrides, args.steps, args.warmup, args.budget)
            record = run_row(cfg, runs / name, args.progress)
        except (OSError, ValueError) as e:  # a run directory the trainer refuses, a bad value
            print(f"ablations.py: row {name}: {' '.join(str(e).split())}", file=sys.stderr)
            return 1
        record = {
            "row": name, "group": group, "change": change, "overrides": overrides, **record,
            "command": " ".join(["python", "tools/ablations.py", "--rows", name,
                                 "--steps", str(cfg.max_steps), "--warmup", str(cfg.warmup)]
                                + (["--budget", args.budget] if args.budget != "short" else [])
                                + ([] if args.threads is None
                                   else ["--threads", str(args.threads)])),
            "config": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "data_dir"},
            "provenance": _row_provenance(runs / name),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        _write_json(out_file, record)
        print(f"{name}: {json.dumps({k: record.get(k) for k in ('val_loss', 'val_bleu')})}",
              flush=True)
    return 0


def read_row(f: Path, name: str, *, collected: bool = True) -> dict[str, Any]:
    """Row `name`'s result.json, or a ValueError saying what is wrong with it: a copy cut
    short, or a file edited by hand, left JSON that fails to parse or a record without what
    --collect (`collected`: its config's budget) and --rescore read (a traceback then)."""
    try:
        record = json.loads(f.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError("its JSON is nested too deeply") from None
    if not isinstance(record, dict) or record.get("row") != name:
        raise ValueError(f"not the record of row {name!r} (an object with its row)")
    if not collected:
        return record
    config = record.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"the record of row {name!r} has no config")
    bad = [k for k in ("max_steps", "warmup", "lr_factor")
           if isinstance(config.get(k), bool) or not isinstance(config.get(k), (int, float))]
    if bad:
        raise ValueError(f"its config has no number for {bad}")
    return record


def rescore(budget: str = "short") -> int:
    """Add the validation cross-entropy to the budget's finished rows that lack it."""
    _, runs, _, rows = _budget(budget)
    scorer = provenance()  # the code that computes the cross-entropy
    for name, *_ in rows:
        f = runs / name / "result.json"
        if not f.exists():
            continue
        try:
            record = read_row(f, name, collected=False)
        except (OSError, ValueError) as e:
            print(f"ablations --rescore: {f} is unreadable ({e}); delete it to train the row "
                  "again", file=sys.stderr)
            return 1
        if "val_nll" in record or "diverged" in record:
            continue
        record.update(cross_entropy(runs / name), val_nll_provenance=scorer)
        _write_json(f, record)
        print(f"{name}: val_nll {record['val_nll']}", flush=True)
    return 0


def _committed_rows(results: Path) -> list[str]:
    """The row names the results file holds now (none if it is missing or unreadable)."""
    try:
        return [r["row"] for r in json.loads(results.read_text(encoding="utf-8"))["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _refuse(message: str, results: Path) -> int:
    print(f"ablations --collect: {message}; {results} left as it is", file=sys.stderr)
    return 1


def collect(allow_missing: bool = False, budget: str = "short") -> int:
    """Write experiments/ablations/results.json from the finished rows under runs/ablations/.

    Refuses (exit 1, the file untouched) when no row has finished here (a fresh clone: the
    committed file is the only copy of hours of training), when rows the file holds now have
    no finished run here (unless `allow_missing`), when a result.json is unreadable, and
    when the rows were trained with different step budgets (one table needs one budget).
    """
    shared, runs, results, budget_rows = _budget(budget)
    rows, missing = [], []
    for name, *_ in budget_rows:
        f = runs / name / "result.json"
        if not f.exists():
            missing.append(name)
            continue
        try:
            rows.append(read_row(f, name))
        except (OSError, ValueError) as e:
            return _refuse(f"{f} is unreadable ({e}); delete it to train the row again", results)
    if not rows:
        return _refuse(f"no finished rows under {runs} (train them first: python "
                       f"tools/ablations.py --budget {budget})", results)
    dropped = [r for r in _committed_rows(results) if r in missing]
    if dropped and not allow_missing:
        return _refuse(f"rows {dropped} are in the results but have no finished run here; "
                       "train them, or pass --allow-missing to drop them", results)
    budgets = {(r["config"]["max_steps"], r["config"]["warmup"]) for r in rows}
    if len(budgets) > 1:
        return _refuse(f"the rows were trained with different (steps, warmup): {sorted(budgets)}",
                       results)
    (steps, warmup), = budgets
    flag = "" if budget == "short" else f" --budget {budget}"
    shared_keys = {k: v for k, v in shared.items() if k not in ("max_steps", "warmup")}
    out = {
        "what": "Table 3 of Vaswani et al. (2017), re-run small on Multi30k de->en: one change "
                "at a time from the chapter-8 model, a fixed budget of optimizer steps per row",
        "regenerate": f"python tools/ablations.py{flag} --shard 0/2 --threads 1 & "
                      f"python tools/ablations.py{flag} --shard 1/2 --threads 1; "
                      f"python tools/ablations.py{flag} --collect",
        "base_config": "experiments/recipe_15_epochs.toml",
        "budget": {"name": budget, "max_steps": steps, "warmup": warmup,
                   "lr_factor": rows[0]["config"]["lr_factor"], "shared": shared_keys},
        "rows": rows,
        "missing": missing,
    }
    _write_json(results, out)
    print(f"wrote {results}: {len(rows)} rows" + (f", missing {missing}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
