"""data.download against servers and mirrors that misbehave (issues 52 and 54).

A server that trickles its headers or its body, a ``file://`` mirror whose file is a FIFO, a
server that closes the connection early, and the mode of the files written. Each server is a
local one on 127.0.0.1.
"""

from __future__ import annotations

import http.server
import os
import stat
import threading
import time

import pytest

from transformer_lib.translation import data

DATA = data.default_data_dir()
needs_data = pytest.mark.skipif(
    not all((DATA / f).is_file() for f in data.SHA256),
    reason="the Multi30k files are not available (set MULTI30K_DIR or run data.download())",
)


def _serve(handler: type) -> tuple[http.server.ThreadingHTTPServer, str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def _stop(srv: http.server.ThreadingHTTPServer) -> None:
    srv.shutdown()
    srv.server_close()


class _Trickle(http.server.BaseHTTPRequestHandler):
    """Sends ``slow_bytes()`` one byte every 0.2 s."""

    def slow_bytes(self) -> bytes:
        raise NotImplementedError

    def do_GET(self):  # noqa: N802 (http.server's naming)
        try:
            for byte in self.slow_bytes():
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def log_message(self, *args):
        pass


class _TrickleHeaders(_Trickle):
    """The status line and headers, byte by byte (about 20 s for all of them)."""

    def slow_bytes(self) -> bytes:
        return b"HTTP/1.1 200 OK\r\n" + b"X-Padding: " + b"x" * 80 + b"\r\n\r\n"


class _TrickleBody(_Trickle):
    """Announces 1,000,000 bytes at once, then sends 100 of them byte by byte (about 20 s)."""

    def slow_bytes(self) -> bytes:
        self.send_response(200)
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        return b"x" * 100


@pytest.mark.parametrize("handler", [_TrickleHeaders, _TrickleBody], ids=["headers", "body"])
def test_the_deadline_covers_a_download_that_trickles_in(tmp_path, handler):
    # before: 20 s, the time the server took to send its headers or body (each byte came
    # within the socket's timeout); now: the timeout is a deadline for the whole download
    srv, url = _serve(handler)
    try:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match=r"val\.de\.gz did not finish within timeout=2 s"):
            data.download(tmp_path, base_url=url, files=["val.de.gz"], timeout=2)
        assert time.perf_counter() - t0 < 4
        assert list(tmp_path.iterdir()) == []
    finally:
        _stop(srv)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_a_file_mirror_whose_file_is_a_fifo_is_refused_not_waited_on(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    os.mkfifo(mirror / "val.de.gz")  # before: open() waited for a writer, forever
    dest = tmp_path / "d"
    t0 = time.perf_counter()
    with pytest.raises(OSError, match=r"val\.de\.gz is not a regular file"):
        data.download(dest, base_url=mirror.as_uri(), files=["val.de.gz"], timeout=5)
    assert time.perf_counter() - t0 < 4
    assert list(dest.iterdir()) == []


@needs_data
def test_a_file_mirror_holding_the_files_works(tmp_path):
    dest = data.download(tmp_path, base_url=DATA.as_uri(), files=["val.en.gz"], timeout=30)
    assert (dest / "val.en.gz").read_bytes() == (DATA / "val.en.gz").read_bytes()


class _ClosesEarly(http.server.BaseHTTPRequestHandler):
    """Announces 1,000 bytes, sends 100, closes the connection."""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "1000")
        self.end_headers()
        self.wfile.write(b"x" * 100)
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_a_download_the_server_cut_short_says_so_not_corrupt(tmp_path):
    srv, url = _serve(_ClosesEarly)
    try:  # before: "downloaded val.de.gz ... is corrupt: SHA-256 expected ..."
        with pytest.raises(OSError, match=r"interrupted: the server closed the connection "
                                          r"after 100 of 1,000 bytes.*try again") as e:
            data.download(tmp_path, base_url=url, files=["val.de.gz"], timeout=10)
        assert "corrupt" not in str(e.value)
        assert list(tmp_path.iterdir()) == []
    finally:
        _stop(srv)


@needs_data
@pytest.mark.skipif(os.name != "posix", reason="POSIX modes")
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_downloaded_files_get_the_mode_open_would_give(tmp_path, umask):
    old = os.umask(umask)
    try:  # before: 0600 whatever the umask (tempfile.mkstemp's mode)
        dest = data.download(tmp_path, base_url=DATA.as_uri(), files=["val.de.gz"])
    finally:
        os.umask(old)
    assert stat.S_IMODE((dest / "val.de.gz").stat().st_mode) == 0o666 & ~umask
