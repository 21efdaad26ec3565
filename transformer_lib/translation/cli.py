"""Command line: `python -m transformer_lib {train,evaluate,translate}` (hand-written).

    python -m transformer_lib train --config configs/multi30k_shipped.toml --run-dir runs/shipped
    python -m transformer_lib train --config configs/multi30k_shipped.toml --run-dir runs/shipped \
        --resume
    torchrun --nproc_per_node=2 -m transformer_lib train --config configs/tiny.toml \
        --run-dir runs/ddp
    python -m transformer_lib evaluate --checkpoint runs/shipped/averaged --split val --beam 4
    python -m transformer_lib evaluate --src news.de.gz --ref news.en.gz   # any file pair
    python -m transformer_lib evaluate --split val --beam 4 --length-penalty 1.2
    python -m transformer_lib evaluate --precision fp32   # default auto: bf16 where native
    echo "Ein Hund rennt im Schnee." | \
        python -m transformer_lib translate --checkpoint runs/shipped/best
    python -m transformer_lib translate sentences.de.txt > sentences.en.txt

The console script ``transformer-lib`` is the same command (``transformer-lib --version``).

Without ``--checkpoint``, ``evaluate`` and ``translate`` use the model that ships with the
package (``transformer_lib.load_pretrained``). Each command is one call into the package:
``loop.train``, ``inference.evaluate`` (a Multi30k split) or ``inference.translate_and_score``
(``--src``/``--ref``), and ``inference.translate_sentences`` for each batch of lines of FILE
or stdin as they arrive (``translate`` writes each line's translation as soon as its batch is
done). Both refuse a source line of more than ``--max-input-len`` subwords, before decoding
anything.

A user error prints one line ``error: ...`` on stderr and exits with status 2 (bad arguments)
or 1 (anything that fails while running); ``--debug`` prints the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from transformer_lib.translation._lines import as_utf8, chunks, line_batches
from transformer_lib.translation._output import writable as _writable
from transformer_lib.translation._output import write_whole as _write_whole

__all__ = ["main", "positive_int"]

# evaluate --src/--ref: the most text (after gunzip) a file may hold. The files are held in
# memory while their lines are translated, and a 10 MB gzip file can unpack to 10 GB.
MAX_TEXT_BYTES = 256 << 20
# ... and the longest line: a line is one sentence, and sacreBLEU spent 43 s and 5.6 GB on
# one line of 48 MB (the total above alone would allow one of 256 MiB)
MAX_LINE_BYTES = 64 << 10


class _UsageError(Exception):
    """Bad command-line arguments (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise _UsageError(message)  # one line from main(), not argparse's usage block


def positive_int(text: str) -> int:
    """An integer >= 1, as an argparse type (the CLI's counts and tools/ablations.py's)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _named_path(text: str) -> str:
    """A path argument: blank (an unset shell variable, `--run-dir $RUN`) names no directory.

    Left as it is, "" or " " would be a path relative to the current directory: a run
    written into it, or Multi30k looked for there.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError(f"is empty ({text!r}): name a path")
    return text


def _beam(text: str) -> int:
    from transformer_lib.translation.config import MAX_BEAM  # imports torch: only when asked

    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= MAX_BEAM:  # each extra beam is more decoding work
        shown = text if value is None else value
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 and <= {MAX_BEAM}, "
                                         f"got {shown!r}")
    return value


def _alpha(text: str) -> float:
    from transformer_lib.translation.config import MAX_LENGTH_PENALTY  # imports torch

    most = f"must be a number >= 0 and <= {MAX_LENGTH_PENALTY:g}"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{most}, got {text!r}") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_LENGTH_PENALTY):  # larger overflows
        raise argparse.ArgumentTypeError(f"{most}, got {text}")
    return value


# "auto": bf16 where this machine has it natively, else fp32 (precision.resolve_precision).
_PRECISIONS = ["auto", "fp32", "bf16"]
_INFER_PRECISION = ("autocast precision (default auto: bf16 where this machine has it natively, "
                    "else fp32, whatever the checkpoint was trained in); in fp32 a line's "
                    "translation never depends on the lines decoded with it; in bf16 it rarely can")


def _prog() -> str:
    """The command as typed: ``transformer-lib`` (the console script) or ``python -m
    transformer_lib`` (argparse would say ``__main__.py`` before Python 3.12)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m transformer_lib" if name in ("", "-c", "__main__.py") else name


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:  # the distribution's name (pyproject.toml), not the import name
        return version("annotated-transformer-book")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        return "(not installed)"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="on an error, print the traceback instead of one line")
    p = _Parser(prog=_prog(), description=__doc__.splitlines()[0], parents=[common])
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train a translation model on Multi30k", parents=[common])
    t.add_argument("--config", required=True, type=_named_path, help="TOML file (see configs/)")
    # --run is a short alias; under torchrun write --run-dir (torchrun's own parser would read
    # --run as an ambiguous abbreviation of its --run-path option).
    t.add_argument(
        "--run-dir", "--run", dest="run", required=True, type=_named_path,
        help="directory for checkpoints, tokenizer and metrics (one run at a time: locked)",
    )
    t.add_argument("--resume", action="store_true",
                   help="continue from RUN/last (only epochs, time limit, data dir, checkpoint "
                        "and decoding settings may change)")
    t.add_argument("--data-dir", type=_named_path,
                   help="Multi30k directory (default: see transformer_lib.translation.data)")
    t.add_argument("--epochs", type=positive_int, help="override the config's epochs")
    t.add_argument("--precision", choices=_PRECISIONS,
                   help="override the config's precision (auto: bf16 where this machine has it "
                        "natively, else fp32)")
    t.add_argument(
        "--fast", action="store_true", default=None,
        help="the fastest setting: precision auto (bf16 autocast where native; emulated bf16 "
        "trains 20 to 40 times slower) and the paper's dropout placement (no dropout on "
        "attention weights or FFN activations); see the performance appendix",
    )
    t.add_argument("--no-progress", action="store_true", help="no progress bar")

    # evaluate and translate decode alike
    decoding = argparse.ArgumentParser(add_help=False, parents=[common])
    decoding.add_argument("--checkpoint",
                          help="a checkpoint directory (default: the shipped model)")
    decoding.add_argument("--beam", type=_beam, help="beam size, 1 to 64 (1 = greedy; default: "
                                                      "the checkpoint config's beam_size)")
    decoding.add_argument("--length-penalty", type=_alpha,
                          help="beam search's length penalty alpha (default: the checkpoint "
                               "config's length_penalty; larger favors longer translations)")
    decoding.add_argument("--precision", choices=_PRECISIONS, default="auto",
                          help=_INFER_PRECISION)
    decoding.add_argument("--max-input-len", type=positive_int, default=256,
                          help="refuse source lines of more subwords (default 256): translate "
                               "reports the line, evaluate stops before decoding anything")

    e = sub.add_parser("evaluate", help="sacreBLEU of a checkpoint on a split or a file pair",
                       parents=[decoding])
    e.add_argument("--split", default="test", choices=["train", "val", "test"],
                   help="the Multi30k split to score (default test: the 2016 Flickr test set, "
                        "1,000 sentences)")
    e.add_argument("--src", help="score this file of source sentences (one per line; plain or "
                                 ".gz) instead of a Multi30k split; needs --ref")
    e.add_argument("--ref", help="the reference translations of --src, line by line")
    e.add_argument("--data-dir", type=_named_path,
                   help="Multi30k directory (default: see transformer_lib.translation.data)")
    e.add_argument("--limit", type=positive_int, help="only the first n sentences")
    e.add_argument("--output", help="write the JSON result (with hypotheses) here")

    tr = sub.add_parser("translate", help="translate the lines of FILE (or stdin) to stdout",
                        parents=[decoding])
    tr.add_argument("file", nargs="?", metavar="FILE", type=_named_path,
                    help="UTF-8 text, one sentence per line (default, or -: standard input)")
    tr.add_argument("--int8", action="store_true",
                    help="on the CPU, with int8 linear layers (dynamic quantization): faster, "
                         "BLEU within a few tenths of fp32 (bench/translate.py measures both)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run a command; return the exit status (0 ok, 1 runtime error, 2 usage error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if sys.stderr is None:  # `2>&-`: print(file=None) would write errors among the output
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - for the process
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
    except BrokenPipeError:  # the reader left (`| head`): a filter stops quietly, as `cat` does
        return _reader_gone()
    except Exception as e:  # noqa: BLE001 - every failure becomes one line (or --debug)
        return _fail(_describe(e), 1, debug=getattr(args, "debug", False))


def _reader_gone() -> int:
    """Exit status 141 (128 + SIGPIPE, what a filter killed by SIGPIPE reports), no message.

    As Python's documentation of SIGPIPE advises, stdout is pointed at devnull first: the
    interpreter flushes stdout at exit, and the text still buffered for the closed pipe would
    raise BrokenPipeError a second time, printed as "Exception ignored ...".
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's capture): nothing to do
        return 141
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return 141


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

    if sys.stdout is None and args.command != "train" and getattr(args, "output", None) is None:
        # `>&-`: the work would be done and its result dropped (translate: an AttributeError)
        raise ValueError(f"standard output is closed: {args.command} writes its result there; "
                         "redirect it to a file instead of closing it")
    if args.command == "train":
        if Path(args.config).is_dir():  # else open() says only "[Errno 21] Is a directory"
            raise ValueError(f"--config {args.config!r} is a directory: name a TOML file "
                             "(see configs/)")
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
        # before the work it keeps; "" (an unset shell variable) is no name to skip writing
        output = _writable(args.output, args.src, args.ref) if args.output is not None else None
        if args.src is not None:
            result = _evaluate_files(args)
        else:
            result = inference.evaluate(
                _checkpoint(args), args.split, args.beam, data_dir=args.data_dir,
                limit=args.limit, length_penalty=args.length_penalty, precision=args.precision,
                max_input_len=args.max_input_len,
            )
        # the log's one line on stderr: stdout stays the score and the signature
        print(precision_note(args.precision, result["device"]), file=sys.stderr)
        print(result["score_line"])  # first: an output that fails keeps the score
        print(result["signature"], flush=True)
        if output is not None:
            _write_whole(output, json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    return _translate(args)


def _translate(args: argparse.Namespace) -> int:
    """FILE (or stdin) to stdout, one output line per input line, written as soon as its batch
    is translated: lines are read and translated as they arrive. A bad line gets an empty
    output line and an error on stderr (exit status 1), and the other lines are still
    translated."""
    if args.int8 and args.precision == "bf16":
        raise _UsageError("--int8 computes in int8 and fp32: it does not go with --precision bf16")
    if args.file is None or args.file == "-":
        if sys.stdin is None:  # `<&-` (or a service with no stdin): before the model is loaded
            raise ValueError("no input: standard input is closed; pipe or type the sentences "
                             "in, one per line, or name a file")
        return _translate_stream(args, getattr(sys.stdin, "buffer", None))
    path = Path(args.file)
    if path.is_dir():
        raise ValueError(f"FILE {args.file!r} is a directory: name a text file")
    try:  # opened before the model is loaded: a wrong name fails at once
        with open(path, "rb") as f:
            return _translate_stream(args, f)
    except FileNotFoundError:
        raise ValueError(f"FILE {args.file!r} does not exist") from None


def _translate_stream(args: argparse.Namespace, stream: BinaryIO | None) -> int:
    """``translate`` of the lines of `stream` (None: ``sys.stdin``, a text stream)."""
    import functools

    import torch

    from transformer_lib.translation import inference, quantize

    if args.int8:  # int8 kernels are the CPU's, even where there is a GPU
        model, tok, cfg = inference.load_model(_checkpoint(args), torch.device("cpu"))
        model = quantize.quantize_int8(model)
    else:
        model, tok, cfg = inference.load_model(_checkpoint(args))
    beam = cfg.beam_size if args.beam is None else args.beam
    if beam == 1 and args.length_penalty is not None:  # greedy would ignore it, silently
        raise _UsageError("--length-penalty applies to beam search, and the checkpoint's "
                          "beam_size is 1: add --beam 2 or more")
    translate = functools.partial(
        inference.translate_sentences, model, tok, beam_size=beam,
        max_input_len=args.max_input_len, precision=args.precision,
        **cfg.decode_kwargs(args.length_penalty),
    )
    translate([])  # settings the model cannot take (a beam wider than its vocabulary) fail now
    limit = inference.source_length_limit(model, args.max_input_len)  # an int: there is one
    # UTF-8 spends at most 4 bytes on a character: a longer line is refused as it streams past
    most = 4 * inference.source_character_limit(tok, limit)
    failed = False
    for batch in line_batches(as_utf8(chunks(stream)), most):
        failed |= _translate_lines(batch, translate, f"more than {most:,} bytes", limit)
    return 1 if failed else 0


def _translate_lines(batch: list[tuple[int, bytes | None]], translate: Callable,
                     over: str, limit: int | None) -> bool:
    """Translate a batch of (line number, bytes or None: `over` the limit); write one output
    line per line, then the errors. True when a line failed."""
    errors: dict[int, str] = {}
    sentences: dict[int, str] = {}
    for number, raw in batch:
        if raw is None:
            errors[number] = f"line {number}: {over}, too many for --max-input-len {limit}"
            continue
        try:
            sentences[number] = raw.rstrip(b"\r").decode("utf-8")
        except UnicodeDecodeError as e:
            errors[number] = (f"line {number}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                              f"position {e.start})")
    numbers = list(sentences)

    def too_long(i: int, length: str, limit: int) -> None:
        errors[numbers[i]] = f"line {numbers[i]}: {length}, too many for --max-input-len {limit}"

    done = dict(zip(numbers, translate(list(sentences.values()), on_too_long=too_long)))
    for number, _ in batch:
        print("" if number in errors else done[number])
    sys.stdout.flush()  # a pipe is block-buffered: the reader would wait for the whole input
    for number in sorted(errors):
        print(f"error: {errors[number]}", file=sys.stderr)
    return bool(errors)


def _checkpoint(args: argparse.Namespace) -> Path:
    """--checkpoint, or the directory of the model that ships with the package."""
    from transformer_lib.translation.pretrained import pretrained_path

    if args.checkpoint is None:
        return pretrained_path()
    if not args.checkpoint.strip():  # an unset shell variable: not a wish for the shipped model
        raise _UsageError("--checkpoint is empty: name a checkpoint directory, or leave "
                          "--checkpoint out for the shipped model")
    path = Path(args.checkpoint)
    if path.exists() and not path.is_dir():  # the loader would say the directory is not found
        raise ValueError(f"--checkpoint {args.checkpoint!r} is a file, not a checkpoint "
                         "directory (a folder holding manifest.json)")
    return path


def _read_lines(path: str, name: str, limit: int | None) -> tuple[list[str], int]:
    """The first `limit` lines (None: all) of a UTF-8 text file, gzipped or not, and how many
    lines it has; a clear error for anything else.

    Read as a stream of at most ``MAX_TEXT_BYTES``: ``gzip.decompress`` of the whole file
    would hold all of a small file that unpacks to gigabytes. Lines split as in
    ``data.split_lines``; a "\\r" before the newline is dropped, and a byte order mark.
    """
    import gzip
    import zlib

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{name} {path!r} is not a file")
    with open(p, "rb") as f:
        zipped = f.read(2) == b"\x1f\x8b"  # gzip's magic number, whatever the file is called
    lines: list[str] = []
    count = size = 0
    try:
        with (gzip.open(p, "rb") if zipped else open(p, "rb")) as f:
            # one line (and its "\r\n"), or what is left
            while raw := f.readline(min(MAX_TEXT_BYTES - size, MAX_LINE_BYTES + 1) + 1):
                size += len(raw)
                if size > MAX_TEXT_BYTES:
                    raise ValueError(f"{name} {path!r} holds more than "
                                     f"{MAX_TEXT_BYTES / 2**20:g} MiB of text; split it")
                count += 1
                if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
                    raise ValueError(f"{name} {path!r}: line {count} is longer than "
                                     f"{MAX_LINE_BYTES:,} bytes (a line is one sentence)")
                try:
                    text = raw.removesuffix(b"\n").decode("utf-8").rstrip("\r")
                    text = text.removeprefix("\ufeff") if count == 1 else text  # a BOM
                except UnicodeDecodeError:
                    raise ValueError(f"{name} {path!r}: line {count} is not valid UTF-8") from None
                if limit is None or count <= limit:
                    lines.append(text)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ValueError(f"{name} {path!r} is not a valid gzip file: {e}") from None
    return lines, count


def _evaluate_files(args: argparse.Namespace) -> dict:
    """sacreBLEU of --src translated against --ref (the same settings as `evaluate`)."""
    from transformer_lib.translation import inference

    (sources, n_src), (refs, n_ref) = (_read_lines(args.src, "--src", args.limit),
                                       _read_lines(args.ref, "--ref", args.limit))
    if n_src != n_ref:
        raise ValueError(f"--src has {n_src} lines but --ref has {n_ref}: the files "
                         "must be aligned line by line")
    if not sources:
        raise ValueError(f"--src {args.src!r} is empty")

    def too_long(i: int, length: str, limit: int) -> None:  # a score without it is no score
        raise ValueError(f"--src line {i + 1}: {length}, too many for --max-input-len {limit}")

    model, tok, cfg = inference.load_model(_checkpoint(args))
    scored = inference.translate_and_score(
        model, tok, cfg, list(zip(sources, refs)), beam_size=args.beam,
        length_penalty=args.length_penalty, precision=args.precision,
        max_input_len=args.max_input_len, on_too_long=too_long,
    )
    return {"src": args.src, "ref": args.ref, **scored}
