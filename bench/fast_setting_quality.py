"""Does the fast setting learn as well? Validation loss after the same steps on Multi30k.

    python -m bench.fast_setting_quality            # writes results/bench_quality.json

Trains chapter 8's model (configs/multi30k_small.toml) from the same seed, on the same
batches in the same order, for the same number of optimizer steps: in fp32 with the
config's dropout everywhere (the "same math" setting of bench/train_throughput.py), and with
the trainer's ``fast = true`` (bf16 autocast, no dropout on attention weights or FFN hidden
activations). It reports the label-smoothed validation loss per token after those steps and
their relative difference (the performance issue asks for at most 1%). A third run, fp32 with
the fast setting's dropout placement, separates the two changes: fast vs it is the effect of
bf16 alone, it vs fp32 the effect of the dropout placement.

The runs go one after the other by default. ``--parallel`` runs them side by side with one
thread each, which gives the same losses (the training is deterministic) in less wall time, but
then the minutes each run took are not a throughput measurement: use train_throughput.py.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    RESULTS,
    ROOT,
    git_commit,
    load_average,
    machine_description,
    now_iso,
    write_json,
)

SETTINGS = {
    "fp32": {"precision": "fp32"},
    "fast": {"fast": True},
    "fp32_paper_dropout": {"precision": "fp32", "attn_dropout": 0.0, "ffn_dropout": 0.0},
}


def run_setting(
    name: str, config: str, epochs: int, run_dir: str, threads: int | None, resume: bool
) -> dict:
    """Train one setting and return its history and final validation loss."""
    import torch

    from transformer_lib import translation

    if threads:
        torch.set_num_threads(threads)
    overrides: dict[str, Any] = dict(
        epochs=epochs, average_last=0, bleu_every=10_000, time_limit_min=None, **SETTINGS[name]
    )
    cfg = translation.load_config(config, **overrides)
    t0 = time.perf_counter()
    reused = resume and (Path(run_dir) / "history.json").exists()
    result = translation.train(cfg, run_dir, resume=resume, progress=False)
    last = result["history"][-1]
    return {
        "setting": name,
        "config_overrides": {k: v for k, v in overrides.items() if k != "time_limit_min"},
        "resolved": {
            "precision": result["precision"],  # "auto" (fast) as this machine resolved it
            "dropout": cfg.dropout,
            "attn_dropout": cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout,
            "ffn_dropout": cfg.dropout if cfg.ffn_dropout is None else cfg.ffn_dropout,
        },
        "steps": last["step"],
        "target_tokens": last["tokens"],
        "val_loss": last["val_loss"],
        "train_loss": last["train_loss"],
        "history": [
            {k: r[k] for k in ("epoch", "step", "train_loss", "val_loss") if k in r}
            for r in result["history"]
        ],
        "wall_minutes": (time.perf_counter() - t0) / 60,
        "resumed_from_existing_run": reused,  # then wall_minutes is not the training time
        "threads": threads,
    }


def _worker(args):
    return run_setting(*args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "multi30k_small.toml"))
    p.add_argument("--epochs", type=int, default=1, help="epochs of training (200 steps each)")
    p.add_argument("--parallel", action="store_true", help="all runs at once, 1 thread each")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue (or just read) runs already in --run-root (training is deterministic)",
    )
    p.add_argument("--run-root", default=None, help="where the run directories go")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_quality.json")
    args = p.parse_args(argv)
    machine = machine_description()
    commit = git_commit()  # at the start: the code that runs (files may change meanwhile)
    root = Path(args.run_root or tempfile.mkdtemp(prefix="quality_"))
    jobs = [
        (n, args.config, args.epochs, str(root / n), 1 if args.parallel else None, args.resume)
        for n in args.settings
    ]
    t0 = time.perf_counter()
    if args.parallel:
        with mp.get_context("spawn").Pool(len(jobs)) as pool:
            runs = pool.map(_worker, jobs)
    else:
        runs = [_worker(j) for j in jobs]
    by_name = {r["setting"]: r for r in runs}
    loss = {k: r["val_loss"] for k, r in by_name.items()}
    fp32, fast = loss.get("fp32"), loss.get("fast")
    rel = (fast - fp32) / fp32 if fast is not None and fp32 is not None else None
    split = {}
    if "fp32_paper_dropout" in loss:
        pd_loss = loss["fp32_paper_dropout"]
        split = {
            "bf16_alone_fast_vs_fp32_paper_dropout": (fast - pd_loss) / pd_loss if fast else None,
            "dropout_alone_fp32_paper_dropout_vs_fp32": (pd_loss - fp32) / fp32 if fp32 else None,
        }
    machine["load_average_end"] = load_average()
    out = {
        "benchmark": "fast_setting_quality",
        "description": __doc__.strip().split("\n\n", 2)[1],
        "command": " ".join(["python -m bench.fast_setting_quality", *(argv or sys.argv[1:])]),
        "date": now_iso(),
        "git_commit": commit,
        "machine": machine,
        "config": str(Path(args.config).resolve().relative_to(ROOT)),
        "runs": by_name,
        "val_loss_fp32": fp32,
        "val_loss_fast": fast,
        "val_loss_fast_vs_fp32_relative_difference": rel,
        "relative_differences_by_change": split,
        "target": {
            "max_abs_relative_difference": 0.01,
            # against the fp32 run with the default dropout (everywhere): precision and dropout
            # placement changed together
            "met": None if rel is None else abs(rel) <= 0.01,
            # against the fp32 run with the fast setting's dropout placement: precision alone
            "met_against_fp32_with_the_same_dropout": (
                None
                if split.get("bf16_alone_fast_vs_fp32_paper_dropout") is None
                else abs(split["bf16_alone_fast_vs_fp32_paper_dropout"]) <= 0.01
            ),
        },
        "wall_time_s": round(time.perf_counter() - t0, 1),
    }
    write_json(args.out, out)
    for name, r in by_name.items():
        print(f"{name}: validation loss {r['val_loss']:.4f} after {r['steps']} steps")
    if rel is not None:
        print(f"fast vs fp32: {rel:+.2%}")
    for k, v in split.items():
        if v is not None:
            print(f"{k}: {v:+.2%}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
