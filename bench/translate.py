"""Translation speed: the shipped model, ours against CTranslate2 on the same weights.

    python -m bench.translate                       # ~25 min → results/bench_translate.json
    python -m bench.translate --limit 100 --threads 1 --out /tmp/bench_translate.json  # a look

The shipped German→English model translates the 1,000 sentences of Multi30k's
test_2016_flickr with beam search (the shipped config's beam size and GNMT length penalty
alpha), on one and on two CPU threads (``--threads 1 2``, each measured on its own), in six
ways:

* ``ours_fp32``: ``translate_sentences`` as ``translate`` runs it, in fp32. It already sorts
  the sentences by length into batches (``inference._batched``): 256 beam rows per batch.
* ``ours_int8``: the same on ``quantize_int8``'s copy (``translate --int8``): the linear
  layers called as modules in int8, PyTorch's dynamic quantization.
* ``ct2_fp32``, ``ct2_int8``: CTranslate2 (``bench/ct2_convert.py``) on the same weights,
  ``compute_type`` float32 and int8, the same sentences per batch, text in and text out
  through our tokenizer (its time counted, as in ours), at the patience chosen on validation;
* ``ct2_fp32_patience1``, ``ct2_int8_patience1``: the same at CTranslate2's default patience
  (1), which stops its search sooner (left out when the chosen patience is 1).

CTranslate2 ranks hypotheses by log P / |Y|^beta, not by our GNMT penalty; beta is chosen
like our alpha was, by BLEU on the validation set (``--betas``), unless ``--beta`` fixes it.
Its search also stops sooner: a sentence ends when ``patience`` x beam hypotheses have
finished (patience 1 by default), where ours goes on until no live hypothesis can beat the
best finished one. The patience is chosen next, at the chosen beta, on the same validation
set (``--patiences``; ``--patience`` fixes it), so that both systems search as well as their
settings allow before their times are compared.
Before timing, a token-for-token check: greedy (beam 1) output ids of CTranslate2 fp32 and
of ours fp32 on every sentence must be equal (the conversion is exact up to float rounding).
The systems are timed interleaved (A B C D, B C D A, ...; ``bench/common.py``) after a
short warm-up; ``seconds`` is the median of ``--repeats`` rounds (5), every round is recorded.
``goals`` gives each ratio of ours over the engine as the median and the min–max of the
per-round ratios; a goal is met only when the whole range is on its side. Each thread count
gets its own ``results``, ``goals`` and ``where_time_goes`` under ``by_threads``; the top-level
ones repeat the last thread count's (two by default).
Target tokens are the output's subwords under our tokenizer, the same count for every system.
After the timed rounds, ``--profile-runs`` (3) more runs of each of ours, alternating, under
PyTorch's profiler split its time into kinds of operations, each kind's median over the runs
(``bench/op_profile.py``): ``where_time_goes`` in the JSON file.
Exit status 1 if the greedy check found a difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import (
    RESULTS,
    format_table,
    git_commit,
    interleaved_times,
    load_average,
    machine_description,
    now_iso,
    write_json,
)
from bench.ct2_convert import convert, translate_ids
from bench.op_profile import median_by_kind, time_by_kind
from transformer_lib.translation import inference
from transformer_lib.translation.data import decode_ids, encode_text, load_multi30k
from transformer_lib.translation.fast_beam import onednn_default
from transformer_lib.translation.pretrained import load_pretrained
from transformer_lib.translation.quantize import quantize_int8

SYSTEMS = {
    "ours_fp32": "translate_sentences, precision fp32, length-sorted batches",
    "ours_int8": "translate_sentences on quantize_int8(model) (translate --int8)",
    "ct2_fp32": "CTranslate2 Translator, compute_type float32",
    "ct2_int8": "CTranslate2 Translator, compute_type int8 (the same fp32 model file)",
    "ct2_fp32_patience1": "CTranslate2, compute_type float32, at its default patience 1",
    "ct2_int8_patience1": "CTranslate2, compute_type int8, at its default patience 1",
}
GOALS = {"fp32": 1.2, "int8": 1.5}  # ours at most this many times CTranslate2's time
INT8_BLEU = 0.3  # ours int8 within this much BLEU of ours fp32
BETAS = [round(0.1 * i, 1) for i in range(11)]  # 0.0 … 1.0
PATIENCES = [1.0, 2.0, 3.0, 4.0]
BATCH_ROWS = 256  # translate_sentences' default batch_size: beam rows per batch


def ct2_translator(model_dir: Path, compute_type: str, threads: int) -> Any:
    import ctranslate2

    return ctranslate2.Translator(str(model_dir), device="cpu", compute_type=compute_type,
                                  inter_threads=1, intra_threads=threads)


def ct2_sentences(translator: Any, tok: Any, sentences: Sequence[str], *, beam_size: int,
                  beta: float, decoding: dict[str, Any], patience: float = 1.0) -> list[str]:
    """Text to text with CTranslate2: our tokenizer's ids in, its output ids decoded by ours."""
    sources = [encode_text(tok, s) for s in sentences]
    longest = max(inference._out_len(len(ids), decoding["max_len_a"], decoding["max_len_b"], None)
                  for ids in sources)
    ids = translate_ids(translator, tok, sources, beam_size=beam_size, length_penalty=beta,
                        patience=patience, max_decoding_length=longest - 1,  # ours counts <s>
                        max_batch_size=max(1, BATCH_ROWS // beam_size))
    return [decode_ids(tok, row) for row in ids]


def greedy_check(model: Any, tok: Any, translator: Any, sentences: Sequence[str],
                 decoding: dict[str, Any]) -> dict[str, Any]:
    """Greedy output ids of ours and CTranslate2, sentence by sentence, each cut to its own
    length limit (greedy's first n tokens do not depend on the rest)."""
    sources = [encode_text(tok, s) for s in sentences]
    a, b = decoding["max_len_a"], decoding["max_len_b"]
    limits = [inference._out_len(len(ids), a, b, None) - 1 for ids in sources]  # without <s>
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    ours: dict[int, list[int]] = {}
    for start in range(0, len(order), BATCH_ROWS):  # the path translate_sentences takes
        idx = order[start : start + BATCH_ROWS]
        rows = inference._decode_batch(model, [sources[i] for i in idx], beam_size=1,
                                       length_penalty=0.0, max_len_a=a, max_len_b=b,
                                       precision="fp32")
        ours.update({i: inference._cut(row) for i, row in zip(idx, rows)})
    theirs = translate_ids(translator, tok, sources, beam_size=1,
                           max_decoding_length=max(limits), max_batch_size=BATCH_ROWS)
    differ = [i for i in range(len(sources)) if ours[i] != theirs[i][: limits[i]]]
    return {"sentences": len(sources), "identical": len(sources) - len(differ),
            "differing_indices": differ[:20], "beam_size": 1, "precision": "fp32",
            "compute_type": "float32"}


def choose_on_validation(translator: Any, tok: Any, pairs: Sequence[tuple[str, str]],
                         name: str, values: list[float], beam_size: int,
                         decoding: dict[str, Any], **fixed: float) -> dict[str, Any]:
    """The value of CTranslate2's setting `name` (``beta`` or ``patience``) with the best
    validation BLEU, the settings in `fixed` held; among equals the smallest (for the
    patience, also the fastest)."""
    sources = [s for s, _ in pairs]
    bleus = {}
    for value in values:
        hyps = ct2_sentences(translator, tok, sources, beam_size=beam_size, decoding=decoding,
                             **{**fixed, name: value})
        bleus[value] = inference.bleu(hyps, pairs).score
    best = max(values, key=lambda v: (round(bleus[v], 2), -v))
    held = "".join(f" at {k} {v}" for k, v in fixed.items())
    return {"chosen": best, "by": f"validation BLEU{held}, {len(pairs)} sentences",
            "validation_bleu": {str(v): round(b, 2) for v, b in bleus.items()}}


def systems(model: Any, tok: Any, ct2_dir: Path, *, threads: int, beam_size: int,
            beta: float, patience: float, decoding: dict[str, Any]
            ) -> dict[str, Callable[[list[str]], list[str]]]:
    """Per system, a function translating a list of sentences to a list of texts."""
    int8 = quantize_int8(model)

    def ours(m: Any) -> Callable[[list[str]], list[str]]:
        return lambda sentences: inference.translate_sentences(
            m, tok, sentences, beam_size=beam_size, precision="fp32", **decoding)

    def theirs(compute_type: str) -> Callable[[list[str]], list[str]]:
        t = ct2_translator(ct2_dir, compute_type, threads)
        return lambda sentences: ct2_sentences(t, tok, sentences, beam_size=beam_size,
                                               beta=beta, decoding=decoding, patience=patience)

    def theirs_at_1(compute_type: str) -> Callable[[list[str]], list[str]]:
        t = ct2_translator(ct2_dir, compute_type, threads)
        return lambda sentences: ct2_sentences(t, tok, sentences, beam_size=beam_size,
                                               beta=beta, decoding=decoding, patience=1.0)

    fns = {"ours_fp32": ours(model), "ours_int8": ours(int8),
           "ct2_fp32": theirs("float32"), "ct2_int8": theirs("int8")}
    if patience != 1.0:
        fns.update(ct2_fp32_patience1=theirs_at_1("float32"),
                   ct2_int8_patience1=theirs_at_1("int8"))
    return fns


def measure(fns: dict[str, Callable[[list[str]], list[str]]], sentences: list[str],
            repeats: int) -> tuple[dict[str, list[float]], dict[str, list[list[str]]]]:
    """Interleaved wall-clock seconds of each system on `sentences` after a warm-up on 32 of
    them, and each system's outputs, round by round."""
    outputs: dict[str, list[list[str]]] = {name: [] for name in fns}

    def keeping(name: str) -> Callable[[], None]:
        return lambda: outputs[name].append(fns[name](sentences))

    for fn in fns.values():  # kernels chosen, memory allocated: not in the first timed round
        fn(sentences[:32])
    times = interleaved_times({n: keeping(n) for n in fns}, warmup=0, repeats=repeats,
                              progress="translate")
    return times, outputs


def row(name: str, seconds: list[float], outputs: list[list[str]], tok: Any,
        pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    hyps = outputs[0]
    score = inference.bleu(hyps, pairs)
    tokens = sum(len(encode_text(tok, h, add_special=False)) for h in hyps)
    s = statistics.median(seconds)
    return {
        "system": name, "how": SYSTEMS[name], "seconds": round(s, 3),
        "seconds_all": [round(t, 3) for t in seconds],
        "sentences_per_s": round(len(pairs) / s, 1), "target_tokens": tokens,
        "target_tokens_per_s": round(tokens / s, 1), "bleu": round(score.score, 2),
        "bleu_unrounded": score.score, "score_line": str(score),
        "same_output_every_round": all(o == hyps for o in outputs),
    }


def ratio(rows: dict[str, dict[str, Any]], a: str, b: str, goal: float | None = None
          ) -> dict[str, Any]:
    """System a's time over system b's: the median of the ratios of interleaved rounds and
    their min–max; with a goal, whether the whole range is at most the goal."""
    per_round = [x / y for x, y in zip(rows[a]["seconds_all"], rows[b]["seconds_all"])]
    out = {"median": round(statistics.median(per_round), 3), "min": round(min(per_round), 3),
           "max": round(max(per_round), 3), "rounds": len(per_round)}
    if goal is not None:
        out.update(goal=goal, met=max(per_round) <= goal)
    return out


def goals(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 53's goals: ours fp32 at most 1.2x CTranslate2 fp32's time, ours int8 at most
    1.5x CTranslate2 int8's, ours int8 within 0.3 BLEU of ours fp32; each ratio over the
    interleaved rounds, met only when its whole range is; also at CTranslate2's patience 1."""
    q, o = rows["ours_int8"], rows["ours_fp32"]
    out = {
        "ours_fp32_over_ct2_fp32": ratio(rows, "ours_fp32", "ct2_fp32", GOALS["fp32"]),
        "ours_int8_over_ct2_int8": ratio(rows, "ours_int8", "ct2_int8", GOALS["int8"]),
        "ours_int8_over_ct2_fp32": ratio(rows, "ours_int8", "ct2_fp32"),
        "bleu_ours_fp32_minus_ct2_fp32": round(o["bleu"] - rows["ct2_fp32"]["bleu"], 2),
        "bleu_ours_int8_minus_ours_fp32": round(q["bleu"] - o["bleu"], 2),
        f"ours_int8_within_{INT8_BLEU}_bleu": abs(q["bleu"] - o["bleu"]) <= INT8_BLEU,
    }
    for kind in ("fp32", "int8"):
        if f"ct2_{kind}_patience1" in rows:
            out[f"ours_{kind}_over_ct2_{kind}_patience1"] = ratio(
                rows, f"ours_{kind}", f"ct2_{kind}_patience1", GOALS[kind])
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=None,
                   help="only the first n test sentences (and n validation ones)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                   help="CPU threads of every system; each count measured on its own")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed rounds")
    p.add_argument("--beam", type=int, default=None,
                   help="beam size (default: the shipped config's)")
    p.add_argument("--beta", type=float, default=None,
                   help="CTranslate2's length penalty beta (default: chosen on validation)")
    p.add_argument("--betas", type=float, nargs="+", default=BETAS,
                   help="the betas tried on the validation set")
    p.add_argument("--patience", type=float, default=None,
                   help="CTranslate2's beam search patience (default: chosen on validation)")
    p.add_argument("--patiences", type=float, nargs="+", default=PATIENCES,
                   help="the patiences tried on the validation set, at the chosen beta")
    p.add_argument("--profile-runs", type=int, default=3,
                   help="profiled runs of each of ours (each kind's median is kept)")
    p.add_argument("--out", type=Path, default=RESULTS / "bench_translate.json")
    args = p.parse_args(argv)
    if args.profile_runs < 1 or args.repeats < 1 or min(args.threads) < 1:
        p.error("--profile-runs, --repeats and --threads must be at least 1")
    return args


def at_threads(threads: int, model: Any, tok: Any, ct2_dir: Path, test: Sequence[Any],
               args: argparse.Namespace, beam: int, beta: float, patience: float,
               decoding: dict[str, Any]) -> dict[str, Any]:
    """Timed rounds, rows, goals and the profile of every system at one thread count."""
    torch.set_num_threads(threads)
    sentences = [s for s, _ in test]
    fns = systems(model, tok, ct2_dir, threads=threads, beam_size=beam, beta=beta,
                  patience=patience, decoding=decoding)
    times, outputs = measure(fns, sentences, args.repeats)
    # profiled runs of each of ours, after the timed ones (the profiler slows them),
    # alternating, so that a slow spell of the machine is not one system's alone
    profiled: dict[str, list[dict[str, Any]]] = {"ours_fp32": [], "ours_int8": []}
    for _ in range(args.profile_runs):
        for n, runs in profiled.items():
            runs.append(time_by_kind(lambda n=n: fns[n](sentences)))
    rows = {n: row(n, times[n], outputs[n], tok, test) for n in fns}
    print(f"{threads} thread(s):", file=sys.stderr)
    print(format_table(list(rows.values()), ["system", "seconds", "sentences_per_s",
                                             "target_tokens_per_s", "bleu"]))
    return {"threads": threads, "results": list(rows.values()), "goals": goals(rows),
            "where_time_goes": {n: median_by_kind(runs) for n, runs in profiled.items()}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, write the JSON file (``--out``) and return its content."""
    args = parse_args(argv)
    commit = git_commit()  # now: the code that runs, even if files change later
    torch.set_num_threads(args.threads[-1])
    machine = machine_description()
    start = time.perf_counter()
    model, tok, cfg = load_pretrained(device="cpu")
    beam = cfg.beam_size if args.beam is None else args.beam
    decoding = cfg.decode_kwargs()  # the shipped alpha (length_penalty) and length limits
    lang = (cfg.src_lang, cfg.tgt_lang)
    test = load_multi30k("test", cfg.data_dir, *lang, limit=args.limit)
    sentences = [s for s, _ in test]
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = convert(model, tok, Path(tmp) / "ct2")
        threads = args.threads[-1]
        check = greedy_check(model, tok, ct2_translator(ct2_dir, "float32", threads),
                             sentences, decoding)
        print(f"greedy check: {check['identical']}/{check['sentences']} identical",
              file=sys.stderr)
        val = load_multi30k("val", cfg.data_dir, *lang, limit=args.limit)
        ct2 = ct2_translator(ct2_dir, "float32", threads)
        if args.beta is None:
            beta = choose_on_validation(ct2, tok, val, "beta", args.betas, beam, decoding)
        else:
            beta = {"chosen": args.beta, "by": "fixed (--beta)"}
        if args.patience is None:
            patience = choose_on_validation(ct2, tok, val, "patience", args.patiences, beam,
                                            decoding, beta=beta["chosen"])
        else:
            patience = {"chosen": args.patience, "by": "fixed (--patience)"}
        by_threads = {str(n): at_threads(n, model, tok, ct2_dir, test, args, beam,
                                         beta["chosen"], patience["chosen"], decoding)
                      for n in args.threads}
    last = by_threads[str(args.threads[-1])]
    out = {
        "benchmark": "translate",
        "description": __doc__.split("\n\n")[0],
        "command": " ".join(["python -m bench.translate",
                             *(sys.argv[1:] if argv is None else argv)]),
        "date": now_iso(),
        "git_commit": commit,
        "machine": {**machine, "load_average_end": load_average()},
        "wall_time_s": round(time.perf_counter() - start, 1),
        "config": {
            "model": "shipped (transformer_lib.load_pretrained()), fp32 weights on the CPU",
            "split": "test (test_2016_flickr)", "sentences": len(test),
            "threads": args.threads[-1], "threads_measured": args.threads,
            "beam_size": beam, "ours_length_penalty_alpha": decoding["length_penalty"],
            "ct2_length_penalty_beta": beta, "ct2_patience": patience,
            "max_len_a": decoding["max_len_a"], "max_len_b": decoding["max_len_b"],
            "sentences_per_batch": BATCH_ROWS // beam,
            "ours_batches": "already sorted by length (translate_sentences)",
            "ours_products": "oneDNN" if onednn_default() else "MKL (PyTorch's default)",
            "repeats": args.repeats, "statistic": "median of interleaved rounds",
            "ratio_statistic": "median and min-max of per-round ratios; a goal is met "
                               "only when the whole range is",
            "ctranslate2_version": _ct2_version(),
            "signature": inference.bleu_signature(),
        },
        "greedy_check": check,
        "results": last["results"],
        "goals": last["goals"],
        "where_time_goes": last["where_time_goes"],
        "by_threads": by_threads,
    }
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


def _ct2_version() -> str:
    import ctranslate2

    return ctranslate2.__version__


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["greedy_check"]["identical"] == result["greedy_check"]["sentences"]
             else 1)
