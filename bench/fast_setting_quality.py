"""Does the fast setting learn as well? Validation loss after the same steps on Multi30k.

    python bench/fast_setting_quality.py            # writes results/bench_quality.json

Trains chapter 8's model (configs/multi30k_small.toml) twice from the same seed, on the same
batches in the same order, for the same number of optimizer steps: once in fp32 with the
config's dropout everywhere (the "same math" setting of bench/train_throughput.py), once with
the trainer's ``fast = true`` (bf16 autocast, no dropout on attention weights or FFN hidden
activations). It reports the label-smoothed validation loss per token after those steps and
their relative difference (the performance issue asks for at most 1%).

The two runs go one after the other by default. ``--parallel`` runs them side by side with one
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
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
}


def run_setting(name: str, config: str, epochs: int, run_dir: str, threads: int | None) -> dict:
    """Train one setting and return its history and final validation loss."""
    import torch

    from transformer_lib import trainer

    if threads:
        torch.set_num_threads(threads)
    overrides: dict[str, Any] = dict(
        epochs=epochs, average_last=0, bleu_every=10_000, time_limit_min=None, **SETTINGS[name]
    )
    if name == "fp32":
        overrides.update(precision="fp32")
    cfg = trainer.load_config(config, **overrides)
    t0 = time.perf_counter()
    result = trainer.train(cfg, run_dir, progress=False)
    last = result["history"][-1]
    return {
        "setting": name,
        "config_overrides": {k: v for k, v in overrides.items() if k != "time_limit_min"},
        "resolved": {
            "precision": cfg.precision,
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
    }


def _worker(args):
    return run_setting(*args)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "multi30k_small.toml"))
    p.add_argument("--epochs", type=int, default=1, help="epochs of training (200 steps each)")
    p.add_argument("--parallel", action="store_true", help="both runs at once, 1 thread each")
    p.add_argument("--run-root", default=None, help="where the two run directories go")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_quality.json")
    args = p.parse_args(argv)
    machine = machine_description()
    commit = git_commit()  # at the start: the code that runs (files may change meanwhile)
    root = Path(args.run_root or tempfile.mkdtemp(prefix="quality_"))
    jobs = [
        (n, args.config, args.epochs, str(root / n), 1 if args.parallel else None) for n in SETTINGS
    ]
    t0 = time.perf_counter()
    if args.parallel:
        with mp.get_context("spawn").Pool(len(jobs)) as pool:
            runs = pool.map(_worker, jobs)
    else:
        runs = [_worker(j) for j in jobs]
    by_name = {r["setting"]: r for r in runs}
    fp32, fast = by_name["fp32"]["val_loss"], by_name["fast"]["val_loss"]
    rel = (fast - fp32) / fp32
    machine["load_average_end"] = load_average()
    out = {
        "benchmark": "fast_setting_quality",
        "description": __doc__.strip().split("\n\n", 2)[1],
        "command": " ".join(["python", "bench/fast_setting_quality.py", *(argv or sys.argv[1:])]),
        "date": now_iso(),
        "git_commit": commit,
        "machine": machine,
        "config": str(Path(args.config).resolve().relative_to(ROOT)),
        "runs": by_name,
        "val_loss_fp32": fp32,
        "val_loss_fast": fast,
        "val_loss_fast_vs_fp32_relative_difference": rel,
        "target": {"max_abs_relative_difference": 0.01, "met": abs(rel) <= 0.01},
        "wall_time_s": round(time.perf_counter() - t0, 1),
    }
    write_json(args.out, out)
    print(
        f"validation loss after {by_name['fp32']['steps']} steps: fp32 {fp32:.4f}, "
        f"fast {fast:.4f} ({rel:+.2%}); wrote {args.out}"
    )
    return out


if __name__ == "__main__":
    main()
