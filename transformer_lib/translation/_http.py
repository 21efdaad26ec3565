"""Fetch a URL into a file: verified, atomic, bounded in time and size (hand-written, private).

``transformer_lib.translation.data.download`` fetches the Multi30k files with it. The file is
streamed into a temporary file next to its target while being hashed; only when the hash
matches is it fsync'ed and renamed into place (``os.replace`` is atomic), so an interrupted or
corrupted download never leaves a partial file under the real name. A response larger than
the file can be is cut off: a wrong or hostile server could otherwise fill the disk before
the hash is checked. The file is created 0666 less the umask (0644 usually), as ``open()``
would, not 0600 as ``tempfile.mkstemp`` makes it.

Why not ``pooch`` (which does hashes, progress, atomic files and retries): it fetches with
``requests``, whose ``timeout`` bounds each socket operation, not the download. Measured against
a local server that sends its status line and headers one byte every 0.2 s, ``requests.get(url,
timeout=2, stream=True)`` waited 22 s, as long as the server kept trickling, without a
timeout; with this module ``download(..., timeout=2)`` stops after 2 s. pooch also has no
``file://`` downloader (a ``MULTI30K_URL`` mirror on disk) and no cap on the response's size.
So every receive here gets the time left before the whole download's deadline (headers
included: ``_DeadlineSocketReader``), and a ``file://`` URL is read only when it names a regular
file (a FIFO would block the open forever; it is opened without blocking and refused).
"""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import secrets
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from transformer_lib.translation._fileio import fsync_dir

__all__: list[str] = []  # private: imported by name from transformer_lib.translation.data


class _TooLarge(Exception):
    """The response has more bytes than allowed; the message says how it was found."""


class _Incomplete(Exception):
    """The server closed the connection before the whole file was sent."""


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

    Raises ``OSError`` naming the URL when the server cannot be reached, answers with an HTTP
    error or closes the connection early, ``TimeoutError`` when `deadline` passes and
    ``ValueError`` on a wrong hash or a response of more than `max_bytes` (refused by its
    Content-Length, or cut off there). `progress`: a tqdm bar in bytes on stderr.
    """
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.part"
    try:
        h = hashlib.sha256()
        # 0o666 less the umask, as open() creates a file (mkstemp's would stay 0600)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as out:
            try:
                _stream(url, deadline, h, out, target.name if progress else None, max_bytes)
            except _TooLarge as e:
                raise ValueError(
                    f"downloading {target.name} from {url}: the response has more than "
                    f"{max_bytes / 2**20:g} MiB ({e}), more than the file can be; nothing was "
                    "written"
                ) from None
            except _Incomplete as e:
                raise OSError(f"downloading {url} was interrupted: the server closed the "
                              f"connection after {e}; nothing was written, try again") from None
            except urllib.error.HTTPError as e:
                raise OSError(f"downloading {url} failed: HTTP {e.code} {e.reason}") from e
            except TimeoutError as e:
                raise deadline.error() from e
            except urllib.error.URLError as e:
                if isinstance(e.reason, TimeoutError):
                    raise deadline.error() from e
                raise OSError(f"downloading {url} failed: {e}") from e
            except http.client.IncompleteRead as e:  # a chunked response cut short
                raise OSError(f"downloading {url} was interrupted: the server closed the "
                              "connection before the end of the file; nothing was written, "
                              "try again") from e
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


def _stream(url: str, deadline: Deadline, h: Any, out: Any, bar_name: str | None,
            max_bytes: int) -> None:
    """Copy the body of `url` to `out`, hashing it, within the deadline and `max_bytes`.

    Every read is a single receive (``read1``: not "fill the buffer") that gets the time left
    before the deadline; the deadline is checked after each. With `bar_name`, a tqdm bar of
    that name shows the bytes on stderr.
    """
    with _open(url, deadline) as (response, length):
        if length is not None and length > max_bytes:
            raise _TooLarge(f"Content-Length {length:,}")
        size = 0
        with _progress_bar(bar_name, length) as bar:
            while chunk := response.read1(1 << 16):
                size += len(chunk)
                if size > max_bytes:  # no Content-Length, or a false one
                    raise _TooLarge(f"{size:,} bytes read")
                h.update(chunk)
                out.write(chunk)
                bar.update(len(chunk))
                deadline.left()
    if length is not None and size < length:  # http.client ends such a body quietly
        raise _Incomplete(f"{size:,} of {length:,} bytes")
    deadline.left()


class _Opened:
    """``with _open(...) as (response, length)``: the body to read1 from and its length."""

    def __init__(self, response: Any, length: int | None) -> None:
        self.response, self.length = response, length

    def __enter__(self) -> tuple[Any, int | None]:
        return self.response, self.length

    def __exit__(self, *exc: object) -> None:
        self.response.close()


def _open(url: str, deadline: Deadline) -> _Opened:
    """The response of `url` (http, https or file), every receive bounded by `deadline`."""
    if urllib.parse.urlsplit(url).scheme == "file":
        return _open_file(url)
    request = urllib.request.Request(url, headers={"User-Agent": "transformer_lib"})
    opener = urllib.request.build_opener(_handler(urllib.request.HTTPHandler, deadline),
                                         _handler(urllib.request.HTTPSHandler, deadline))
    response = opener.open(request, timeout=deadline.left())
    length = response.headers.get("Content-Length")
    return _Opened(response, int(length) if length and length.isdigit() else None)


def _open_file(url: str) -> _Opened:
    """A ``file://`` URL's file, opened only if it is a regular file.

    Opening a FIFO for reading waits for a writer, forever if none comes, and a device may
    never end: the file is opened without blocking and refused unless it is a regular file.
    """
    path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return _Opened(os.fdopen(fd, "rb"), st.st_size)
    except BaseException:
        os.close(fd)
        raise


class _DeadlineSocketReader(io.RawIOBase):
    """A socket's receives, each with the time left before the deadline as its timeout.

    A socket timeout alone bounds each receive, not the download: a server sending one byte a
    second, in its headers or its body, never trips it.
    """

    def __init__(self, sock: Any, deadline: Deadline, keep: Any) -> None:
        # `keep`: the socket's own file object, unused but open: while it is, closing the
        # socket (urllib does so at once, leaving the response to read) leaves it open
        self.sock, self.deadline, self.keep = sock, deadline, keep

    def close(self) -> None:
        self.keep.close()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        self.sock.settimeout(self.deadline.left())
        return self.sock.recv_into(b)


def _handler(base: type, deadline: Deadline) -> Any:
    """An HTTP(S) handler of urllib whose responses read through ``_DeadlineSocketReader``."""

    class Response(http.client.HTTPResponse):
        def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            # in place of the socket's own file object, whose receives have no deadline
            self.fp = io.BufferedReader(_DeadlineSocketReader(sock, deadline, self.fp))

    def connection(base_class: type) -> type:
        return type(base_class.__name__, (base_class,), {"response_class": Response})

    if base is urllib.request.HTTPSHandler:
        class Handler(base):  # type: ignore[misc, valid-type]
            def https_open(self, req: Any) -> Any:
                return self.do_open(connection(http.client.HTTPSConnection), req,
                                    context=self._context)
    else:
        class Handler(base):  # type: ignore[misc, valid-type, no-redef]
            def http_open(self, req: Any) -> Any:
                return self.do_open(connection(http.client.HTTPConnection), req)
    return Handler()


def _progress_bar(name: str | None, length: int | None) -> Any:
    """A tqdm bar in bytes on stderr, or a disabled one (no output) when `name` is None.

    `length` is the response's Content-Length, when the server sent one.
    """
    from tqdm import tqdm

    return tqdm(total=length, desc=name, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, disable=name is None)
