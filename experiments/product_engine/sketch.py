"""MKL or oneDNN for the faster beam search's products on this CPU? Measured, not assumed.

    python -m experiments.product_engine.sketch  # ~3 min → results.json beside it

``transformer_lib/translation/fast_beam.py`` runs the products of a float32 beam search in
oneDNN on CPUs not made by Intel and in MKL (PyTorch's default for ``nn.Linear``) on Intel's,
``onednn_default()``'s rule, because MKL measured slower on an AMD EPYC. This sketch checks
the rule on the machine it runs on: the shipped model translates the first ``--limit`` test
sentences with the shipped beam search, the products in each library
(``TRANSFORMER_LIB_ONEDNN=0`` or ``1``), in interleaved rounds
(``bench.common.interleaved_times``) on one and on two threads. ``quantize_int8``'s copy runs
the same way under both settings (its layers are quantized and choose their own kernels), so
its two rows are the same code timed twice: their ratio shows the noise. It records every
round, the medians, whether the two settings translate every sentence alike, and which
library the rule picks here.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.common import git_commit, interleaved_times, machine_description, now_iso, write_json
from transformer_lib.translation import inference
from transformer_lib.translation.data import load_multi30k
from transformer_lib.translation.fast_beam import onednn_default
from transformer_lib.translation.pretrained import load_pretrained
from transformer_lib.translation.quantize import quantize_int8

OUT = Path(__file__).with_name("results.json")
VARIABLE = "TRANSFORMER_LIB_ONEDNN"


def translator(
    model: Any, tok: Any, cfg: Any, sentences: list[str], onednn: bool
) -> Callable[[], list[str]]:
    """Translates ``sentences`` with the products in oneDNN (or MKL)."""

    def run() -> list[str]:
        os.environ[VARIABLE] = "1" if onednn else "0"
        return inference.translate_sentences(
            model, tok, sentences, beam_size=cfg.beam_size, precision="fp32", **cfg.decode_kwargs()
        )

    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=300, help="test sentences (default 300)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    forced = os.environ.pop(VARIABLE, None)  # the rule's own answer, recorded below
    picks = "oneDNN" if onednn_default() else "MKL"
    model, tok, cfg = load_pretrained(device="cpu")
    test = load_multi30k("test", cfg.data_dir, cfg.src_lang, cfg.tgt_lang, limit=args.limit)
    sentences = [s for s, _ in test]
    int8 = quantize_int8(model)
    result: dict[str, Any] = {
        "experiment": "product_engine",
        "date": now_iso(),
        "git_commit": git_commit(),
        "machine": machine_description(),
        "rule_picks": picks,
        "sentences": len(sentences),
        "beam_size": cfg.beam_size,
        "by_threads": {},
    }
    before = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            fns = {
                f"{kind}_{lib}": translator(m, tok, cfg, sentences, lib == "onednn")
                for kind, m in (("fp32", model), ("int8", int8))
                for lib in ("mkl", "onednn")
            }
            outputs = {name: fn() for name, fn in fns.items()}  # also the warm-up
            times = interleaved_times(fns, 0, args.repeats, progress=f"{threads} thread(s)")
            run: dict[str, Any] = {}
            for kind in ("fp32", "int8"):
                mkl, dnn = times[f"{kind}_mkl"], times[f"{kind}_onednn"]
                rounds = [a / b for a, b in zip(mkl, dnn)]  # MKL's time / oneDNN's
                same = sum(
                    a == b for a, b in zip(outputs[f"{kind}_mkl"], outputs[f"{kind}_onednn"])
                )
                run[kind] = {
                    "mkl_seconds_all": [round(t, 4) for t in mkl],
                    "onednn_seconds_all": [round(t, 4) for t in dnn],
                    "mkl_over_onednn": statistics.median(mkl) / statistics.median(dnn),
                    "mkl_over_onednn_per_round": rounds,
                    "identical_translations": same,
                }
                print(
                    f"{threads} thread(s), {kind}: MKL / oneDNN time "
                    f"{run[kind]['mkl_over_onednn']:.2f} ({min(rounds):.2f}-"
                    f"{max(rounds):.2f}); identical {same}/{len(sentences)}"
                )
            result["by_threads"][str(threads)] = run
    finally:
        torch.set_num_threads(before)
        os.environ.pop(VARIABLE, None)
        if forced is not None:
            os.environ[VARIABLE] = forced
    write_json(args.out, result)
    print(f"wrote {args.out}; the rule picks {picks} here")
    return result


if __name__ == "__main__":
    main()
