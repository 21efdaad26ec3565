"""Run chapters the way Colab does: each alone in an empty folder, set up by its first cell.

    .venv/bin/python tools/colab_check.py                       # chapters 2 and 9
    .venv/bin/python tools/colab_check.py chapters/10_what_the_paper_found.ipynb

Not part of CI (it takes minutes and needs pip): run it after changing the setup cell
(tools/notebook_setup.py), the package's dependencies or the files a chapter reads.

What it does, with nothing from the repository on the kernel's path:

1. builds a wheel of the package from this working tree (`pip wheel --no-deps`);
2. creates (once, then reuses) a virtual environment like a new Colab runtime: Python, torch
   and a Jupyter kernel, nothing else (``--venv``, default under the system's temp folder);
3. serves the working tree and the Multi30k files on 127.0.0.1 (two local HTTP servers);
4. for each chapter: copies it alone into an empty folder, gives it the current setup cell
   (the chapter in the repository is not changed), uninstalls the package from the
   environment, and executes the notebook with nbclient in that environment, with
   ``BOOK_SETUP=1`` (the cell's "as in Colab" switch), ``BOOK_SETUP_REQUIREMENT`` = the wheel,
   ``BOOK_SETUP_FILES_URL`` and ``MULTI30K_URL`` = the local servers, and a new empty HOME (so
   the chapter's first ``load_multi30k`` downloads the data, as on a new machine).

It prints, per chapter, whether it ran to the end, how long it took and what the setup cell
printed; the exit status is 0 when every chapter ran.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import notebook_setup  # noqa: E402  (scripts beside this one, not a package)
import tasks  # noqa: E402

ROOT = notebook_setup.ROOT
DEFAULT_CHAPTERS = ["chapters/02_masks.ipynb", "chapters/09_performance.ipynb"]
KERNEL = "colab-check"
# A new Colab runtime has torch and a kernel. torch 2.13.0 is constraints.txt's pin; on these
# machines pip takes it from a local file (elsewhere, add PyTorch's CPU index).
BASE_PACKAGES = ["torch==2.13.0", "ipykernel"]


def _local_multi30k() -> Path:
    """The copy of Multi30k to serve: where the task runner reads it (tools/tasks.py)."""
    os.environ.update(tasks.multi30k_env())
    from transformer_lib.translation.data import default_data_dir

    return default_data_dir()


def run(argv: list[str], **kw: Any) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, **kw)


def build_wheel(out: Path) -> Path:
    """A wheel of the working tree (the package as the repository would install it).

    Built from a copy of the files git would commit: setuptools writes build/ and *.egg-info
    into the folder it builds, which must not be the working tree.
    """
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a file deleted but not yet committed is skipped
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    for old in out.glob("*.whl"):
        old.unlink()
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)])
    (wheel,) = out.glob("*.whl")
    return wheel


def make_venv(venv: Path) -> Path:
    """The environment of a new Colab runtime (created once, reused)."""
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "--quiet", *BASE_PACKAGES])
    return python


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve `directory` on 127.0.0.1 (a free port) while the block runs; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # one line per request would bury the report
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def kernel_spec(python: Path, where: Path) -> Path:
    """A kernelspec that starts the environment's Python; returns the folder for JUPYTER_PATH."""
    spec = where / "kernels" / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}),
        encoding="utf-8",
    )
    return where


def run_chapter(chapter: Path, python: Path, env: dict[str, str], work: Path) -> tuple[bool, str]:
    """Execute one chapter alone in an empty folder; (ran to the end, the setup cell's output)."""
    import nbclient
    import nbformat

    folder = work / chapter.stem
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    nb_path = folder / chapter.name
    nb = json.loads(chapter.read_text(encoding="utf-8"))
    notebook_setup.update(nb, notebook_setup.read_book())  # the cell the tool writes now
    notebook_setup.write_notebook(nb_path, nb)
    book = notebook_setup.read_book()
    run([str(python), "-m", "pip", "uninstall", "--quiet", "--yes", book.dist])
    nb = nbformat.read(nb_path, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name=KERNEL, timeout=1200, resources={"metadata": {"path": str(folder)}}
    )
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits the driver's environment
    try:
        client.execute()
        ok = True
    except Exception as err:  # report and go on with the next chapter
        print(f"{chapter.name}: {type(err).__name__}: {str(err)[-2000:]}")
        ok = False
    finally:
        os.environ.clear()
        os.environ.update(saved)
        nbformat.write(nb, nb_path)
    first = nb.cells[0]
    printed = "".join(o.get("text", "") for o in first.get("outputs", []))
    return ok, printed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", type=Path, default=None)
    work_default = Path(tempfile.gettempdir()) / "colab-check"
    parser.add_argument("--work", type=Path, default=work_default, help="scratch folder")
    parser.add_argument("--venv", type=Path, default=None, help="default: WORK/venv")
    parser.add_argument(
        "--data", type=Path, default=None,
        help="folder with the Multi30k files to serve (default: $MULTI30K_DIR, the task "
        "runner's local mirror, or transformer_lib's cache)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    chapters = [ROOT / c if not c.is_absolute() else c for c in args.chapters or []] or [
        ROOT / c for c in DEFAULT_CHAPTERS
    ]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = args.data or _local_multi30k()
    from transformer_lib.translation.data import SHA256

    missing = [n for n in SHA256 if not (data / n).is_file()]
    if missing:
        raise SystemExit(f"{data} lacks the Multi30k files {missing}: name a copy with --data")
    wheel = build_wheel(work / "dist")
    python = make_venv((args.venv or work / "venv").resolve())
    jupyter_path = kernel_spec(python, work / "jupyter")
    home = work / "home"
    results = []
    with serve(ROOT) as files_url, serve(data) as data_url:
        for chapter in chapters:
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            env = {
                "PATH": os.environ.get("PATH", ""),
                "HOME": str(home),
                "JUPYTER_PATH": str(jupyter_path),
                # pip's cache outlives the empty HOME: the packages are downloaded once.
                "PIP_CACHE_DIR": str(work / "pip-cache"),
                "BOOK_SETUP": "1",
                "BOOK_SETUP_REQUIREMENT": f"{wheel}[notebooks]",
                "BOOK_SETUP_FILES_URL": files_url,
                "MULTI30K_URL": data_url,
                **{k: v for k, v in os.environ.items() if k.startswith(("PIP_", "SSL_"))
                   and k != "PIP_CACHE_DIR"},
            }  # fmt: skip
            start = time.monotonic()
            ok, printed = run_chapter(chapter, python, env, work / "runs")
            seconds = time.monotonic() - start
            results.append((chapter.name, ok, seconds))
            print(f"--- {chapter.name}: {'ran to the end' if ok else 'FAILED'} in {seconds:.0f} s")
            print("    setup cell printed:", printed.strip().replace("\n", "\n    ") or "(nothing)")
    print()
    for name, ok, seconds in results:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {seconds:.0f} s")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
