"""translate's input: bytes as they arrive, UTF-16 recognized, lines in batches (private).

``cli.translate`` reads a file or stdin through these, as a filter must: a line is translated as
soon as it has arrived, a line too long for the model is dropped as it streams past, and every
input line gets exactly one output line.
"""

from __future__ import annotations

import codecs
import itertools
import sys
from collections.abc import Iterable, Iterator
from typing import BinaryIO

__all__: list[str] = []  # private: imported by name from transformer_lib.translation.cli


def chunks(stream: BinaryIO | None) -> Iterator[bytes]:
    """The bytes of `stream` (None: ``sys.stdin``) as they arrive: a read returns what is there
    (up to 64 KiB) and waits only when nothing is, so a line typed or piped in is translated
    without waiting for more."""
    while True:
        if stream is not None:
            chunk = stream.read1(1 << 16)
        else:  # a text stream with no bytes underneath (io.StringIO)
            chunk = sys.stdin.read(1 << 16).encode("utf-8", "surrogatepass")
        if not chunk:
            return
        yield chunk


def as_utf8(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """The byte stream `pieces` as UTF-8: UTF-16 (Windows' "Unicode" text) is decoded.

    Split on b"\\n" as it stands, UTF-16 puts the NUL byte of each newline on the next line:
    one line more than the input has, each but the first read as NUL-interleaved bytes. It is
    recognized by its byte order mark, or without one by NUL bytes at every other position of
    the first chunk, which UTF-8 text does not have; stderr says so.
    """
    rest = iter(pieces)
    first = next(rest, b"")
    encoding = utf16_encoding(first)
    if encoding is None:
        if first:
            yield first
        yield from rest
        return
    print(f"note: input is UTF-16 (or not UTF-8): read as {encoding.upper()}; save it as UTF-8 "
          "to skip this guess", file=sys.stderr)
    decoder = codecs.getincrementaldecoder(encoding)()
    try:
        for chunk in itertools.chain([first], rest):
            yield decoder.decode(chunk).encode("utf-8", "surrogatepass")
        yield decoder.decode(b"", final=True).encode("utf-8", "surrogatepass")
    except UnicodeDecodeError as e:
        raise ValueError(f"input is not valid {encoding.upper()} (nor UTF-8): {e.reason} "
                         "after the lines written") from None


def utf16_encoding(head: bytes) -> str | None:
    """The codec of UTF-16 text starting with `head`, or None when it does not look like it."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"  # the decoder reads the mark and drops it
    pairs = len(head) // 2
    if pairs < 2 or b"\0" not in head:
        return None
    odd = sum(1 for i in range(1, 2 * pairs, 2) if head[i] == 0)  # "a\0" little-endian
    even = sum(1 for i in range(0, 2 * pairs, 2) if head[i] == 0)
    if odd >= pairs * 3 // 4 and even == 0:
        return "utf-16-le"
    if even >= pairs * 3 // 4 and odd == 0:
        return "utf-16-be"
    return None


def line_batches(
    chunks: Iterable[bytes], most: int | None, size: int = 64
) -> Iterator[list[tuple[int, bytes | None]]]:
    """(line number, bytes) of the lines of a byte stream, in batches of those one read ended.

    A line of more than `most` bytes is None: it is dropped as it streams past rather than held,
    so a 20 MB line without a newline costs no memory. As in ``data.split_lines``, only "\\n"
    ends a line, and the newline that ends the last line starts no empty one.
    """
    number, pending, skipping = 0, bytearray(), False
    for chunk in chunks:
        batch: list[tuple[int, bytes | None]] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if not skipping:
                pending += chunk[start:] if end < 0 else chunk[start:end]
                if most is not None and len(pending) > most:
                    skipping, pending = True, bytearray()
            if end < 0:
                break
            number += 1
            batch.append((number, None if skipping else bytes(pending)))
            pending, skipping, start = bytearray(), False, end + 1
        for i in range(0, len(batch), size):
            yield batch[i : i + size]
    if pending or skipping:
        yield [(number + 1, None if skipping else bytes(pending))]
