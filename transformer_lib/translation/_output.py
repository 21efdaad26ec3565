"""Where ``evaluate --output`` writes, and how (hand-written, private).

A regular file is replaced atomically (a temporary file beside it, then a rename): a full
disk leaves the previous file as it was. Nothing else may be renamed over. A symbolic link is
followed, as a shell's ``>`` follows it: the file it names is replaced and the link stays a
link. A character device (``/dev/null``, a terminal), a FIFO or ``/dev/stdout`` is written
through, as ``>`` would write it: renaming a file over ``/dev/null`` (as root, in a
container) replaced the machine's ``/dev/null``. A block device or a socket is refused.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import NamedTuple

__all__: list[str] = []  # private: imported by name from cli.py

REPLACE, THROUGH = "replace", "write through"


class Output(NamedTuple):
    """A checked --output: how to write it, the path to write, and the name as given."""

    how: str
    target: Path
    name: str


def output_target(path: str) -> tuple[str, Path]:
    """How to write `path` (``REPLACE`` or ``THROUGH``) and the path to write.

    ``REPLACE``: a regular file or a name that does not exist yet, reached through any
    symbolic links (the path returned is the final one). ``THROUGH``: a character device or a
    FIFO, and ``/dev/stdout``, ``/dev/fd/N``, ``/proc/...`` (a process's open file, which may
    itself be a regular file the shell opened). ValueError for anything else.
    """
    p = Path(path)
    if os.path.abspath(p).startswith(("/dev/std", "/dev/fd/", "/proc/")):
        return THROUGH, p
    real = Path(os.path.realpath(p))  # every link followed, a dangling one to its target
    if str(real).startswith("/proc/"):  # a link to /dev/stdout: pipe:[123] is no path
        return THROUGH, p
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return REPLACE, real  # a new file (a dangling link creates its target, as `>` does)
    except OSError as e:
        raise ValueError(f"--output {path!r} cannot be examined: {e.strerror or e}") from None
    if stat.S_ISREG(mode):
        return REPLACE, real
    if stat.S_ISDIR(mode):
        raise ValueError(f"--output {path!r} is a directory")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return THROUGH, p
    kind = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) \
        else "not a file"
    raise ValueError(f"--output {path!r} is {kind}: name a file to write the JSON result to")


def writable(path: str, *inputs: str | None) -> Output:
    """--output, checked before any work: a bad path found after decoding loses the evaluation.

    A file to replace: its folder must exist and take a new file (one is made and removed
    beside it, as ``write_whole`` will), and a rename over it must be allowed. It must not be
    one of the `inputs` (--src, --ref): the result would replace the text it scores.
    """
    if not path.strip():
        raise ValueError("--output '' is empty: name the JSON file to write")
    how, target = output_target(path)
    for name, other in zip(("--src", "--ref"), inputs):
        try:
            same = bool(other) and target.exists() and os.path.samefile(target, other)
        except OSError:
            same = False
        if same:
            raise ValueError(f"--output {path!r} is the {name} file: it would be overwritten")
    if how == THROUGH:
        _check_through(path, target)
        return Output(how, target, path)
    if not target.parent.is_dir():
        what = "is not a folder" if target.parent.exists() else "does not exist"
        raise ValueError(f"--output {path!r}: its folder {str(target.parent)!r} {what}")
    if (target.parent / "manifest.json").is_file():  # its manifest would no longer match
        raise ValueError(f"--output {path!r} is inside the checkpoint {str(target.parent)!r}: "
                         "writing there would break it; choose a file outside it")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"--output {path!r} is read-only")
    refusal = _sticky_refusal(path, target)
    if refusal:
        raise ValueError(refusal)
    probe = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--output {path!r} cannot be written: {e.strerror or e}") from None
    return Output(how, target, path)


def _check_through(path: str, target: Path) -> None:
    """Refuse a special file that cannot be opened for writing, checked without blocking: a
    FIFO without a reader yet is fine (its reader may come later), so it is not opened."""
    try:
        mode = os.stat(target).st_mode
    except OSError as e:
        raise ValueError(f"--output {path!r} cannot be written: {e.strerror or e}") from None
    if stat.S_ISFIFO(mode):
        if not os.access(target, os.W_OK):
            raise ValueError(f"--output {path!r} is a FIFO this user may not write to")
        return
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK | _NOCTTY))
    except OSError as e:
        raise ValueError(f"--output {path!r} cannot be written: {e.strerror or e}") from None


def _sticky_refusal(path: str, target: Path) -> str | None:
    """Why a rename over `target` would be refused, or None: in a sticky folder (``/tmp``)
    only a file's owner, the folder's or root may, and the evaluation would run in full and
    then fail to save its result."""
    try:
        folder, st = os.stat(target.parent), os.stat(target)
    except OSError:
        return None
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    if folder.st_mode & stat.S_ISVTX and uid not in (0, st.st_uid, folder.st_uid):
        return (f"--output {path!r} belongs to another user in a folder where only its owner "
                "may replace it (a sticky folder such as /tmp): choose another file")
    return None


_NOCTTY = getattr(os, "O_NOCTTY", 0)


def write_whole(out: Output, text: str) -> None:
    """Write `text` to the checked output: a file whole or not at all (a temporary file beside
    it, then a rename: a disk that fills, or a file-size limit, leaves the previous file as it
    was); a special file written through as ``>>`` would (no truncation: ``/dev/stdout`` may
    be a file that already holds the score)."""
    from transformer_lib.translation._fileio import fsync_dir

    data = text.encode("utf-8")
    if out.how == THROUGH:
        try:
            with os.fdopen(os.open(out.target, os.O_WRONLY | os.O_APPEND | _NOCTTY), "wb") as f:
                f.write(data)
        except OSError as e:
            raise OSError(f"--output {out.name!r} was not written ({e.strerror or e})") from None
        return
    path = out.target
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:  # mode 0o666 less the umask, as for any new file
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        raise OSError(f"--output {out.name!r} was not written ({e.strerror or e}); a file "
                      "that was there is unchanged") from None
    finally:
        tmp.unlink(missing_ok=True)
