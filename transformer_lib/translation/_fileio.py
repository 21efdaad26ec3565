"""Durable files, lock files and the atomic directory swap (hand-written, private).

Three kinds of failure shape this module. A crash (power cut, SIGKILL) between writing a file
and renaming it into place must never leave a half-written file under the real name: hence
``write_durably``, ``replace_file`` and ``fsync_dir``, and for a whole directory (a checkpoint)
``replace_dir``; a reader of that directory must not mix two versions: ``read_one_version``.
Two processes writing the same place at once must not interleave their files: hence
``FileLock``, a lock file created with ``O_CREAT | O_EXCL`` (one atomic operation on every
operating system and on network file systems), holding the pid and host of its owner so that a
lock left behind by a dead process can be recognized.

Why not the ``filelock`` package (installed with torch): measured with filelock 4.2.11 on
Linux, its lock (``flock``) leaves the lock file behind after every release, by design (so a
finished run directory would hold a ``.lock`` forever), its ``Timeout`` says only "The file
lock '…' could not be acquired." where ours names the owning process, its host and since when,
and it records nothing that tells a lock left by a process on another host of a shared file
system. What it does better, releasing a killed owner's lock in the kernel, ours gets on the
same host by checking the owner's pid.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__: list[str] = []  # private: imported by name from the translation modules


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a no-op where directories cannot be opened)."""
    if not hasattr(os, "O_DIRECTORY"):  # Windows: renames are durable once they return
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Write `data` to `path` and fsync it (the caller renames it into place)."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.filename is not None:
            raise
        # a failed write (disk full, file too large) names no file
        raise OSError(e.errno, e.strerror, str(path)) from e


def replace_file(path: Path, data: bytes) -> None:
    """Replace the file `path` with `data`: readers and crashes see the old file or the new.

    Rewriting a file in place truncates it first: a reader (or a kill) in between sees an
    empty or half-written file. The data goes to a file beside it, which is renamed over it.
    """
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        write_durably(tmp, data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def this_host() -> str:
    return socket.gethostname()


def process_alive(pid: Any) -> bool:
    """Whether a process with this id runs on this machine (True when unsure).

    An id no process can have (not an integer, not positive, too large for the system call)
    is not running: a lock file or a directory name that holds one is left-over garbage.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 2**31:
        return False
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate the process on Windows
        import ctypes

        # use_last_error: ctypes keeps GetLastError's value for get_last_error() to read
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return ctypes.get_last_error() == 5  # access denied: it exists
        code = ctypes.c_ulong()
        try:
            kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        finally:
            kernel32.CloseHandle(handle)
        return code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by someone else
        return True
    return True


UNWRITTEN_STALE = 30.0  # seconds after which an empty or garbled lock file is debris


def _left_unwritten(path: Path) -> bool:
    """Remove a lock file left empty or garbled for ``UNWRITTEN_STALE`` seconds (its owner
    writes its record at once after creating it: one killed in between left it so, and
    every later taker waited for it, then failed); return whether it was removed."""
    try:
        if time.time() - path.stat().st_mtime < UNWRITTEN_STALE:
            return False
        path.unlink()
    except OSError:
        return False
    return True


class LockHeld(RuntimeError):
    """Another process holds the lock (the message names it and how to remove a stale lock)."""


class FileLock:
    """An exclusive lock: the file `path`, created atomically, holding its owner's pid and host.

    ``with FileLock(path, what="run directory runs/x"):`` takes the lock or raises ``LockHeld``
    naming the owner. With ``wait`` > 0 it retries for that many seconds first. A lock whose
    owner was on this host and is no longer running (killed, crashed) is stale: it is removed
    and taken over. A stale lock from another host cannot be checked from here; the error says
    how to remove it. Not re-entrant.
    """

    def __init__(self, path: str | Path, *, what: str, wait: float = 0.0) -> None:
        self.path = Path(path)
        self.what = what
        self.wait = wait
        self._token: str | None = None

    def _owner(self) -> dict[str, Any] | None:
        try:
            owner = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}  # released meanwhile: try again
        except (OSError, ValueError, RecursionError):
            return None  # being written right now, or garbage
        return owner if isinstance(owner, dict) else None

    def _try_once(self) -> tuple[bool, dict[str, Any] | None]:
        """(True, None) when the lock is taken, else (False, its owner: {} to retry at once)."""
        token = uuid.uuid4().hex
        record = {"pid": os.getpid(), "host": this_host(), "token": token,
                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = self._owner()
            if owner and owner.get("host") == this_host() and not process_alive(
                owner.get("pid")  # a malformed pid ("abc", 10**20) is no process: stale
            ):
                # Stale: remove it if it is still the same file (another process may have
                # removed and re-taken it since we read it), then try again.
                if self._owner() == owner:
                    self.path.unlink(missing_ok=True)
                return False, {}
            if owner is None and _left_unwritten(self.path):  # killed before writing it
                return False, {}
            return False, owner
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        self._token = token
        return True, None

    def acquire(self) -> FileLock:
        deadline = time.monotonic() + self.wait
        delay = 0.005
        while True:
            taken, owner = self._try_once()
            if taken:
                return self
            if owner == {}:
                continue  # released or stale-and-removed: retry at once
            if time.monotonic() >= deadline:
                raise LockHeld(self._message(owner))
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _message(self, owner: dict[str, Any] | None) -> str:
        since = f" (since {owner['since']})" if owner and owner.get("since") else ""
        who = (
            f"process {owner.get('pid')} on host {owner.get('host')}{since}"
            if owner else "another process (its lock file is unreadable)"
        )
        return (
            f"{self.what} is in use by {who}; if that process is no longer running, "
            f"delete the lock file {self.path}"
        )

    def release(self) -> None:
        if self._token is None:
            return
        owner = self._owner()
        if owner and owner.get("token") == self._token:
            self.path.unlink(missing_ok=True)
        self._token = None

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- directory swap
# Next to a directory `<name>` replaced by replace_dir, only while a swap runs (or after a
# crash during one):
#   .<name>.tmp-<pid>-<host>-<random>   being written by process <pid> on host <host>
#   .<name>.old-<random>                the previous version, between the two renames of a swap
#   .<name>.lock                        held during the swap, so concurrent writers take turns
SWAP_WAIT = 120.0  # seconds to wait for another process's swap of the same directory


def _host_tag() -> str:
    return hashlib.sha256(this_host().encode("utf-8")).hexdigest()[:8]


def tmp_prefix(path: Path, pid: int) -> str:
    """Name prefix of the temporary directories that process `pid` fills to replace `path`."""
    return f".{path.name}.tmp-{pid}-{_host_tag()}-"


def new_tmp_dir(path: Path) -> Path:
    """An empty directory next to `path`, to fill and then ``replace_dir`` into place.

    Made 0777 less the umask, as ``mkdir`` makes any directory (``tempfile.mkdtemp`` makes it
    0700: a checkpoint no one else could read, whatever the umask said).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f"{tmp_prefix(path, os.getpid())}{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir(0o777)
            return tmp
        except FileExistsError:  # as mkdtemp does: another name
            continue


def _swap_lock(path: Path, what: str) -> FileLock:
    return FileLock(path.parent / f".{path.name}.lock", what=what, wait=SWAP_WAIT)


def replace_dir(tmp: Path, path: Path, *, what: str,
                check: Callable[[Path], None] | None = None) -> None:
    """Rename the filled directory `tmp` to `path`, atomically replacing any older `path`.

    The old version is renamed away first, the new one renamed into place, and the old one
    deleted. A failure between the two renames puts the old one back; a kill there is repaired
    by ``recover_dir``. Replacements of one path take turns (a lock file next to it, `what`
    names it in errors), and each deletes what killed replacements of that path left.
    `check(path)`, called holding the lock, raises to refuse replacing what is there now.
    """
    with _swap_lock(path, what):
        if check is not None:
            check(path)
        old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
        had_old = path.exists()
        if had_old:
            os.rename(path, old)
        try:
            os.rename(tmp, path)
        except BaseException:
            if had_old:
                os.rename(old, path)  # put the previous version back
            raise
        fsync_dir(path.parent)
        if had_old:
            shutil.rmtree(old, ignore_errors=True)
        _remove_debris(path)


def _remove_debris(path: Path) -> None:
    """Delete what killed replacements of `path` left behind (called holding the swap lock).

    Any ``.old-*`` is a replaced version (`path` exists again). A ``.tmp-*`` is deleted only
    when its writer ran on this host and has exited, since another process may be filling
    its own right now; one named without a pid (older versions) when untouched for an hour.
    """
    for old in path.parent.glob(f".{path.name}.old-*"):
        shutil.rmtree(old, ignore_errors=True)
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        parts = tmp.name[len(f".{path.name}.tmp-") :].split("-")
        if len(parts) == 3 and parts[0].isdigit():
            abandoned = parts[1] == _host_tag() and not process_alive(int(parts[0]))
        else:
            abandoned = time.time() - tmp.stat().st_mtime > 3600
        if abandoned:
            shutil.rmtree(tmp, ignore_errors=True)


def recover_dir(path: Path, complete: str, *, what: str) -> bool:
    """Finish a swap that a crash interrupted; return whether `path` is now a directory.

    A replacement killed between its two renames leaves no `path`, only the previous version
    as ``.<name>.old-*`` (complete, with its file `complete`: it was the real one until the
    first rename). The newest such is renamed back.
    """
    if path.is_dir() or not path.parent.is_dir():
        return path.is_dir()
    if not any(path.parent.glob(f".{path.name}.old-*")):
        return False
    with _swap_lock(path, what):
        olds = [p for p in path.parent.glob(f".{path.name}.old-*") if (p / complete).is_file()]
        if not path.exists() and olds:
            newest = max(olds, key=lambda p: (p / complete).stat().st_mtime_ns)
            os.rename(newest, path)
            fsync_dir(path.parent)
    return path.is_dir()


READ_ATTEMPTS = 10  # versions one read may try while a writer keeps replacing the directory


def read_one_version(path: Path, read_manifest: Callable[[Path], Any],
                     read: Callable[[Any], Any], *, what: str) -> Any:
    """``read(manifest)`` of one version of a directory that ``replace_dir`` keeps replacing.

    A reader can see one version's manifest and the next one's files: false "corrupt" and
    "missing" errors with checksums, silently mixed versions without. So the manifest is read
    again after the files. The same: every file came from its version (each version has its
    own checksums). Changed: a swap came in between, and the read starts over on the new
    version. An error is raised only when no swap explains it (the manifest did not change).
    """

    def manifest_now() -> Any:
        try:
            return read_manifest(path)
        except (ValueError, OSError):
            return None

    error: Exception | None = None
    for _ in range(READ_ATTEMPTS):
        manifest = None
        try:
            manifest = read_manifest(path)
            result = read(manifest)
        except Exception as e:  # re-raised unless a swap explains it
            if manifest_now() == manifest:
                raise
            error = e
            continue
        if manifest_now() == manifest:
            return result
    raise ValueError(
        f"{what} was replaced {READ_ATTEMPTS} times while it was being read (a run saves it "
        "faster than it can be read); load it again, or load one that no run is writing"
    ) from error
