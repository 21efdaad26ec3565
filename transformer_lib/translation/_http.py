"""Fetch a URL into a file: verified, atomic, bounded in time and size (hand-written, private).

``transformer_lib.translation.data.download`` fetches the Multi30k files with it. The file is
streamed into a temporary file next to its target while being hashed; only when the hash
matches is it fsync'ed and renamed into place (``os.replace`` is atomic), so an interrupted or
corrupted download never leaves a partial file under the real name. A response larger than
the file can be is cut off: a wrong or hostile server could otherwise fill the disk before
the hash is checked.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from transformer_lib.translation._fileio import fsync_dir

__all__: list[str] = []  # private: imported by name from transformer_lib.translation.data


class _TooLarge(Exception):
    """The response has more bytes than allowed; the message says how it was found."""


class Deadline:
    """Seconds left until the download's deadline, or a TimeoutError naming the URL."""

    def __init__(self, at: float, url: str, timeout: float) -> None:
        self.at, self.url, self.timeout = at, url, timeout

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise self.error()
        return left

    def error(self) -> TimeoutError:
        return TimeoutError(
            f"downloading {self.url} did not finish within timeout={self.timeout:g} s; "
            "nothing was written"
        )


def fetch(url: str, target: Path, expected: str, deadline: Deadline, progress: bool, *,
          max_bytes: int) -> None:
    """Download `url` to `target` if its SHA-256 is `expected`; else raise, writing nothing.

    Raises ``OSError`` naming the URL when the server cannot be reached or answers with an
    HTTP error, ``TimeoutError`` when `deadline` passes and ``ValueError`` on a wrong hash or
    a response of more than `max_bytes` (refused by its Content-Length, or cut off there).
    `progress`: a tqdm bar in bytes on stderr.
    """
    request = urllib.request.Request(url, headers={"User-Agent": "transformer_lib"})
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            try:
                _stream(request, deadline, h, out, target.name if progress else None,
                        max_bytes)
            except _TooLarge as e:
                raise ValueError(
                    f"downloading {target.name} from {url}: the response has more than "
                    f"{max_bytes / 2**20:g} MiB ({e}), more than the file can be; nothing was "
                    "written"
                ) from None
            except urllib.error.HTTPError as e:
                raise OSError(f"downloading {url} failed: HTTP {e.code} {e.reason}") from e
            except TimeoutError as e:
                raise deadline.error() from e
            except urllib.error.URLError as e:
                if isinstance(e.reason, TimeoutError):
                    raise deadline.error() from e
                raise OSError(f"downloading {url} failed: {e}") from e
            except (http.client.HTTPException, OSError) as e:
                raise OSError(f"downloading {url} failed: {e}") from e
            if h.hexdigest() != expected:
                raise ValueError(
                    f"downloaded {target.name} from {url} is corrupt: SHA-256 expected "
                    f"{expected}, got {h.hexdigest()}; nothing was written"
                )
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    finally:
        tmp.unlink(missing_ok=True)  # gone already after a successful os.replace


def _stream(
    request: urllib.request.Request, deadline: Deadline, h: Any, out: Any, bar_name: str | None,
    max_bytes: int,
) -> None:
    """Copy the response body to `out`, hashing it, within the deadline and `max_bytes`.

    A socket timeout alone bounds each read, not the download: a server sending one byte a
    second never trips it. So every read is a single ``read1`` (one receive, not "fill the
    buffer"), the socket's timeout is cut to the time left before each, and the deadline is
    checked after each. With `bar_name`, a tqdm bar of that name shows the bytes on stderr.
    """
    with urllib.request.urlopen(request, timeout=deadline.left()) as response:
        sock = getattr(getattr(response.fp, "raw", None), "_sock", None)  # CPython's SocketIO
        length = response.headers.get("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            raise _TooLarge(f"Content-Length {int(length):,}")
        size = 0
        with _progress_bar(bar_name, length) as bar:
            while True:
                left = deadline.left()
                if sock is not None:
                    sock.settimeout(left)
                chunk = response.read1(1 << 16)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:  # no Content-Length, or a false one
                    raise _TooLarge(f"{size:,} bytes read")
                h.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
    deadline.left()


def _progress_bar(name: str | None, length: str | None) -> Any:
    """A tqdm bar in bytes on stderr, or a disabled one (no output) when `name` is None.

    `length` is the response's Content-Length, when the server sent one.
    """
    from tqdm import tqdm

    total = int(length) if length and length.isdigit() else None
    return tqdm(total=total, desc=name, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, disable=name is None)
