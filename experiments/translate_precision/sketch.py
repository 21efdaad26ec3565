"""Does translating in bf16, what precision "auto" picks on a CPU with bf16, pay on this CPU?

    python -m experiments.translate_precision.sketch --out FILE  # ~4 min

``FILE``: ``experiments/translate_precision/results_<cpu>.json`` (``results_epyc.json``, ...).

``translate_sentences(precision="auto")`` decodes under bf16 autocast where the CPU has bf16
instructions (``resolve_precision``), and there beam search runs chapter 7's ``beam_search``:
``fast_beam``, the faster search, decodes in fp32 only (its products skip autocast). So on
such a CPU the default trades fp32's faster search for bf16's cheaper products. This sketch
measures the trade: the shipped model translates the first ``--limit`` *validation* sentences
(a choice of default is made on validation, never on the test set) with beam search in
"fp32" and in "bf16", interleaved rounds (``bench.common.interleaved_times``) on one and on
two threads. It records every round, the medians, the BLEU of each on those sentences, how
many translations are identical, and what "auto" resolves to here.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from bench.common import git_commit, interleaved_times, machine_description, now_iso, write_json
from transformer_lib.translation import inference
from transformer_lib.translation.data import load_multi30k
from transformer_lib.translation.precision import resolve_precision
from transformer_lib.translation.pretrained import load_pretrained

PRECISIONS = ("fp32", "bf16")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=300, help="validation sentences (default 300)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    args = p.parse_args(argv)
    model, tok, cfg = load_pretrained(device="cpu")
    val = load_multi30k("val", cfg.data_dir, cfg.src_lang, cfg.tgt_lang, limit=args.limit)
    sources, references = [s for s, _ in val], [t for _, t in val]

    def translator(precision: str):
        return lambda: inference.translate_sentences(
            model, tok, sources, beam_size=cfg.beam_size, precision=precision,
            **cfg.decode_kwargs())

    result: dict[str, Any] = {
        "experiment": "translate_precision",
        "date": now_iso(),
        "git_commit": git_commit(),
        "machine": machine_description(),
        "auto_resolves_to": resolve_precision("auto", "cpu"),
        "split": "val",
        "sentences": len(sources),
        "beam_size": cfg.beam_size,
        "by_threads": {},
    }
    before = torch.get_num_threads()
    try:
        for threads in args.threads:
            torch.set_num_threads(threads)
            fns = {name: translator(name) for name in PRECISIONS}
            outputs = {name: fn() for name, fn in fns.items()}  # also the warm-up
            times = interleaved_times(fns, 0, args.repeats, progress=f"{threads} thread(s)")
            rounds = [b / f for f, b in zip(times["fp32"], times["bf16"])]  # bf16's / fp32's
            run = {
                f"{name}_seconds_all": [round(t, 4) for t in times[name]] for name in PRECISIONS
            }
            run.update(
                bf16_over_fp32=statistics.median(times["bf16"]) / statistics.median(times["fp32"]),
                bf16_over_fp32_per_round=rounds,
                bleu={name: round(sacrebleu.corpus_bleu(outputs[name], [references]).score, 2)
                      for name in PRECISIONS},
                identical_translations=sum(a == b for a, b in zip(*outputs.values())),
            )
            print(f"{threads} thread(s): bf16 / fp32 time {run['bf16_over_fp32']:.2f} "
                  f"({min(rounds):.2f}-{max(rounds):.2f}); BLEU {run['bleu']}; identical "
                  f"{run['identical_translations']}/{len(sources)}")
            result["by_threads"][str(threads)] = run
    finally:
        torch.set_num_threads(before)
    write_json(args.out, result)
    print(f"wrote {args.out}; precision 'auto' is {result['auto_resolves_to']} here")
    return result


if __name__ == "__main__":
    main()
