"""Command line: `python -m transformer_lib {train,evaluate,translate}` (hand-written).

    python -m transformer_lib train --config configs/multi30k_small.toml --run-dir runs/small
    python -m transformer_lib train --config configs/multi30k_small.toml --run-dir runs/small \
        --resume
    torchrun --nproc_per_node=2 -m transformer_lib train --config configs/tiny.toml \
        --run-dir runs/ddp
    python -m transformer_lib evaluate --checkpoint runs/small/averaged --split test --beam 4
    python -m transformer_lib evaluate --src news.de.gz --ref news.en.gz   # any file pair
    python -m transformer_lib evaluate --split val --beam 4 --length-penalty 1.2
    python -m transformer_lib evaluate --precision fp32   # default auto: bf16 where native
    echo "Ein Hund rennt im Schnee." | \
        python -m transformer_lib translate --checkpoint runs/small/best

Without ``--checkpoint``, ``evaluate`` and ``translate`` use the model that ships with the
package (``transformer_lib.load_pretrained``). Each command is one call into the package:
``loop.train``, ``inference.evaluate`` (a Multi30k split) or ``inference.translate_and_score``
(``--src``/``--ref``), ``inference.translate``.

A user error prints one line ``error: ...`` on stderr and exits with status 2 (bad arguments)
or 1 (anything that fails while running); ``--debug`` prints the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
from pathlib import Path

__all__ = ["main"]


class _UsageError(Exception):
    """Bad command-line arguments (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise _UsageError(message)  # one line from main(), not argparse's usage block


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


# "auto": bf16 where this machine has it natively, else fp32 (precision.resolve_precision).
_PRECISIONS = ["auto", "fp32", "bf16"]
_INFER_PRECISION = ("autocast precision (default auto: bf16 where this machine has it natively, "
                    "else fp32, whatever the checkpoint was trained in)")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="on an error, print the traceback instead of one line")
    p = _Parser(prog="python -m transformer_lib", description=__doc__.splitlines()[0],
                parents=[common])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train a translation model on Multi30k", parents=[common])
    t.add_argument("--config", required=True, help="TOML file (see configs/)")
    # --run is a short alias; under torchrun write --run-dir (torchrun's own parser would read
    # --run as an ambiguous abbreviation of its --run-path option).
    t.add_argument(
        "--run-dir", "--run", dest="run", required=True,
        help="directory for checkpoints, tokenizer and metrics (one run at a time: locked)",
    )
    t.add_argument("--resume", action="store_true",
                   help="continue from RUN/last (only epochs, time limit, data dir, checkpoint "
                        "and decoding settings may change)")
    t.add_argument("--data-dir",
                   help="Multi30k directory (default: see transformer_lib.translation.data)")
    t.add_argument("--epochs", type=_positive_int, help="override the config's epochs")
    t.add_argument("--precision", choices=_PRECISIONS,
                   help="override the config's precision (auto: bf16 where this machine has it "
                        "natively, else fp32)")
    t.add_argument(
        "--fast", action="store_true", default=None,
        help="the fastest setting: precision auto (bf16 autocast where native; emulated bf16 "
        "is ~20x slower) and the paper's dropout placement (no dropout on attention weights "
        "or FFN activations); see the performance appendix",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    # evaluate and translate decode alike
    decoding = argparse.ArgumentParser(add_help=False, parents=[common])
    decoding.add_argument("--checkpoint",
                          help="a checkpoint directory (default: the shipped model)")
    decoding.add_argument("--beam", type=_positive_int, help="beam size (1 = greedy; default: "
                                                             "the checkpoint config's beam_size)")
    decoding.add_argument("--length-penalty", type=_alpha,
                          help="beam search's length penalty alpha (default: the checkpoint "
                               "config's length_penalty; larger favours longer translations)")
    decoding.add_argument("--precision", choices=_PRECISIONS, default="auto",
                          help=_INFER_PRECISION)

    e = sub.add_parser("evaluate", help="sacreBLEU of a checkpoint on a split or a file pair",
                       parents=[decoding])
    e.add_argument("--split", default="test", choices=["train", "val", "test"])
    e.add_argument("--src", help="score this file of source sentences (one per line; plain or "
                                 ".gz) instead of a Multi30k split; needs --ref")
    e.add_argument("--ref", help="the reference translations of --src, line by line")
    e.add_argument("--data-dir")
    e.add_argument("--limit", type=_positive_int, help="only the first n sentences")
    e.add_argument("--output", help="write the JSON result (with hypotheses) here")

    r = sub.add_parser("translate", help="translate stdin lines to stdout", parents=[decoding])
    r.add_argument("--max-input-len", type=_positive_int, default=256,
                   help="refuse lines of more subwords (default 256)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a command; return the exit status (0 ok, 1 runtime error, 2 usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(argv)
    except _UsageError as e:
        return _fail(f"{e} (see --help)", 2, debug=False)
    try:
        return _run(args)
    except _UsageError as e:  # arguments that only make sense together
        return _fail(f"{e} (see --help)", 2, debug=False)
    except KeyboardInterrupt:
        return _fail("interrupted", 130, debug=getattr(args, "debug", False))
    except Exception as e:  # noqa: BLE001 - every failure becomes one line (or --debug)
        return _fail(_describe(e), 1, debug=getattr(args, "debug", False))


def _describe(e: BaseException) -> str:
    # The exceptions a user can cause carry a message written for them; anything else is a
    # bug, named by its type so that it can be reported.
    user = (ValueError, OSError, RuntimeError, FloatingPointError, ImportError)
    text = str(e) if isinstance(e, user) and str(e) else f"{type(e).__name__}: {e}"
    if not isinstance(e, user):
        text += " (an internal error: please report it with the output of --debug)"
    return " ".join(text.split())  # one line


def _fail(message: str, status: int, *, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    else:
        print(f"error: {message}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace) -> int:
    from transformer_lib.translation import config, inference, loop
    from transformer_lib.translation.precision import precision_note

    if args.command == "train":
        cfg = config.load_config(
            args.config, data_dir=args.data_dir, epochs=args.epochs, precision=args.precision,
            fast=args.fast,
        )
        result = loop.train(cfg, args.run, resume=args.resume, progress=not args.no_progress)
        if result["history"]:
            last = result["history"][-1]
            print(json.dumps({k: last[k] for k in last if not isinstance(last[k], list)}))
        return 0
    if args.beam == 1 and args.length_penalty is not None:  # greedy has no length penalty
        raise _UsageError("--length-penalty applies to beam search: use it with --beam 2 or more")
    if args.command == "evaluate":
        if (args.src is None) != (args.ref is None):
            raise _UsageError("--src and --ref go together")
        if args.src is not None:
            result = _evaluate_files(args)
        else:
            result = inference.evaluate(
                _checkpoint(args), args.split, args.beam, data_dir=args.data_dir,
                limit=args.limit, length_penalty=args.length_penalty, precision=args.precision,
            )
        # the log's one line on stderr: stdout stays the score and the signature
        print(precision_note(args.precision, result["device"]), file=sys.stderr)
        if args.output:
            Path(args.output).write_text(
                json.dumps(result, indent=2, ensure_ascii=False), encoding="utf-8"
            )
        print(result["score_line"])
        print(result["signature"])
        return 0
    return _translate(args)


def _translate(args: argparse.Namespace) -> int:
    """stdin to stdout, one output line per input line; a bad line gets an empty output line
    and an error on stderr (exit status 1), and the other lines are still translated."""
    from transformer_lib.translation.data import split_lines
    from transformer_lib.translation.inference import translate

    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    lines = split_lines(raw)
    numbers: list[int] = []  # the line number of each sentence translated
    sentences: list[str] = []
    errors: dict[int, str] = {}
    for number, line in enumerate(lines, start=1):
        try:
            sentences.append(line.rstrip(b"\r").decode("utf-8"))
            numbers.append(number)
        except UnicodeDecodeError as e:
            errors[number] = (f"line {number}: not valid UTF-8 (byte 0x{line[e.start]:02x} at "
                              f"position {e.start})")

    def too_long(i: int, subwords: int, limit: int) -> None:
        errors[numbers[i]] = (f"line {numbers[i]}: {subwords} subwords, more than "
                              f"--max-input-len {limit}")

    done = translate(_checkpoint(args), sentences, args.beam, max_input_len=args.max_input_len,
                     precision=args.precision, length_penalty=args.length_penalty,
                     on_too_long=too_long)
    translated = dict(zip(numbers, done))
    for number in range(1, len(lines) + 1):
        print("" if number in errors else translated[number])
    for number in sorted(errors):
        print(f"error: {errors[number]}", file=sys.stderr)
    return 1 if errors else 0


def _checkpoint(args: argparse.Namespace) -> Path:
    """--checkpoint, or the directory of the model that ships with the package."""
    from transformer_lib.translation.pretrained import pretrained_path

    return Path(args.checkpoint) if args.checkpoint else pretrained_path()


def _read_lines(path: str, name: str) -> list[str]:
    """The lines of a UTF-8 text file, gzipped or not; a clear error for anything else."""
    import gzip

    from transformer_lib.translation.data import split_lines

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{name} {path!r} is not a file")
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":  # gzip's magic number, whatever the file is called
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise ValueError(f"{name} {path!r} is not a valid gzip file: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(f"{name} {path!r}: line {line} is not valid UTF-8") from None
    return [line.rstrip("\r") for line in split_lines(text)]


def _evaluate_files(args: argparse.Namespace) -> dict:
    """sacreBLEU of --src translated against --ref (the same settings as `evaluate`)."""
    from transformer_lib.translation.inference import load_model, translate_and_score

    sources, refs = _read_lines(args.src, "--src"), _read_lines(args.ref, "--ref")
    if len(sources) != len(refs):
        raise ValueError(f"--src has {len(sources)} lines but --ref has {len(refs)}: the files "
                         "must be aligned line by line")
    if not sources:
        raise ValueError(f"--src {args.src!r} is empty")
    pairs = list(zip(sources, refs))[: args.limit]
    model, tok, cfg = load_model(_checkpoint(args))
    scored = translate_and_score(model, tok, cfg, pairs, beam_size=args.beam,
                                 length_penalty=args.length_penalty, precision=args.precision)
    return {"src": args.src, "ref": args.ref, **scored}
