"""The paper's Table 3, re-run small: one change at a time from the chapter-8 model.

    python tools/ablations.py                      # every row not yet done, one after another
    python tools/ablations.py --shard 0/2 --threads 1 & \
    python tools/ablations.py --shard 1/2 --threads 1  # two rows at a time on two cores
    python tools/ablations.py --collect            # merge the rows into results/ablations.json

Every row trains the chapter-8 model (configs/multi30k_shipped.toml) for the same number of
optimizer steps (`--steps`; the paper's Table 3 also fixes the steps, 100k), with the same data
order and seed, changing one setting. At the end it records the validation cross-entropy
without label smoothing and its perplexity (what the paper's table reports; rows that change
the label smoothing are compared on it), the validation loss as trained (with the row's label
smoothing), validation BLEU (greedy, sacreBLEU on the 1,014 validation sentences), the
parameter count, target tokens per second and minutes, with the command, the full config, the
commit and the machine. Runs go to runs/ablations/ROW/; a row whose result.json exists is
skipped and an interrupted row resumes from its last checkpoint, so the command can simply be
run again (`--rescore` adds the cross-entropy to rows finished before it was recorded). The
book's chapter 10 reads results/ablations.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
BASE_CONFIG = ROOT / "configs" / "multi30k_shipped.toml"
RUNS = ROOT / "runs" / "ablations"
RESULTS = ROOT / "results" / "ablations.json"

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


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.strip()


def _machine() -> dict[str, Any]:
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def row_config(overrides: dict[str, Any], steps: int, warmup: int):
    """The chapter-8 config with the budget and one row's changes applied."""
    from transformer_lib import trainer

    budget = dict(BUDGET, max_steps=steps, warmup=warmup)
    return trainer.load_config(BASE_CONFIG, **budget, **overrides)


def cross_entropy(run_dir: Path) -> dict[str, float]:
    """Validation cross-entropy per target token of RUN/last, without label smoothing.

    The training loss of a row depends on its label smoothing, so it cannot compare rows that
    change it; the plain cross-entropy (and its exponential, the perplexity the paper's
    Table 3 reports) can.
    """
    import math

    from transformer_lib import trainer
    from transformer_lib.data import encode_pairs, load_multi30k

    model, tok, cfg = trainer.load_model(run_dir / "last", torch.device("cpu"))
    pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang)
    nll = trainer.validation_loss(model, encode_pairs(pairs, tok), max_tokens=cfg.max_tokens,
                                  label_smoothing=0.0, precision=cfg.precision)
    return {"val_nll": round(nll, 4), "val_ppl": round(math.exp(nll), 2)}


def run_row(name: str, overrides: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Train one row (or finish it) and return its record."""
    from transformer_lib import trainer
    from transformer_lib.data import load_multi30k
    from transformer_lib.model import count_parameters

    cfg = row_config(overrides, args.steps, args.warmup)
    run_dir = RUNS / name
    resume = (run_dir / "last").is_dir()
    t0 = time.perf_counter()
    record: dict[str, Any] = {}
    try:
        out = trainer.train(cfg, run_dir, resume=resume, progress=args.progress)
    except FloatingPointError as e:  # a row may diverge; that is a result too
        return {"diverged": str(e)}
    wall = time.perf_counter() - t0
    last = out["history"][-1]
    model, tok, _ = trainer.load_model(run_dir / "last", torch.device("cpu"))
    pairs = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang)
    hyps = trainer.translate_sentences(model, tok, [s for s, _ in pairs], beam_size=1,
                                       max_input_len=None, **cfg.decode_kwargs())
    record.update(
        **cross_entropy(run_dir),
        val_loss=round(last["val_loss"], 4),
        val_bleu=round(trainer.bleu(hyps, pairs).score, 2),
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
    ap.add_argument("--shard", default="0/1", help="i/n: run rows i, i+n, i+2n, ...")
    ap.add_argument("--threads", type=int, help="torch threads per process")
    ap.add_argument("--progress", action="store_true", help="show a progress bar per row")
    ap.add_argument("--collect", action="store_true", help="merge finished rows into the results")
    ap.add_argument("--rescore", action="store_true",
                    help="add the validation cross-entropy to finished rows that lack it")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.collect:
        return collect()
    if args.rescore:
        return rescore()
    i, n = (int(x) for x in args.shard.split("/"))
    names = {r[0] for r in ROWS}
    unknown = set(args.rows or []) - names
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; rows are {sorted(names)}")
    todo = [r for k, r in enumerate(ROWS) if k % n == i and (not args.rows or r[0] in args.rows)]
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
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
            "commit": commit + ("-dirty" if dirty else ""),
            "machine": _machine(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        out_file.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {json.dumps({k: record.get(k) for k in ('val_loss', 'val_bleu')})}",
              flush=True)
    return 0


def rescore() -> int:
    commit = _git("rev-parse", "--short", "HEAD")
    for name, *_ in ROWS:
        f = RUNS / name / "result.json"
        if not f.exists():
            continue
        record = json.loads(f.read_text(encoding="utf-8"))
        if "val_nll" in record or "diverged" in record:
            continue
        record.update(cross_entropy(RUNS / name), val_nll_commit=commit)
        f.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: val_nll {record['val_nll']}", flush=True)
    return 0


def collect() -> int:
    rows, missing = [], []
    for name, *_ in ROWS:
        f = RUNS / name / "result.json"
        if f.exists():
            rows.append(json.loads(f.read_text(encoding="utf-8")))
        else:
            missing.append(name)
    out = {
        "what": "Table 3 of Vaswani et al. (2017), re-run small on Multi30k de->en: one change "
                "at a time from the chapter-8 model, a fixed budget of optimizer steps per row",
        "regenerate": "python tools/ablations.py --shard 0/2 --threads 1 & "
                      "python tools/ablations.py --shard 1/2 --threads 1; "
                      "python tools/ablations.py --collect",
        "base_config": "configs/multi30k_shipped.toml",
        "budget": {k: BUDGET[k] for k in ("max_steps", "warmup")},
        "rows": rows,
        "missing": missing,
    }
    RESULTS.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}: {len(rows)} rows" + (f", missing {missing}" if missing else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
