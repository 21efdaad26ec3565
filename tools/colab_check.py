"""Run notebooks the way Colab does, and count the MyST syntax a Colab reader would see.

    .venv/bin/python tools/colab_check.py                        # chapters 2 and 8
    .venv/bin/python tools/colab_check.py chapters/10_what_the_paper_found.ipynb

tests/test_colab.py runs chapters 2 and 8 through this module in `make test`; run it for
another chapter after changing the setup cell (tools/notebook_setup.py), the package's
dependencies or the files a chapter reads. It checks what is committed: commit first.

No shortcut is taken where Colab would differ:

1. The repository is what `git archive HEAD` holds (not the working tree: uncommitted and
   ignored files are not in it). The package's wheel is built from that copy, and a local HTTP
   server on 127.0.0.1 serves its files in place of the repository's raw files.
2. Each notebook gets a new virtual environment holding what a new Colab runtime has
   installed (``COLAB``: its IPython, ipykernel, ipywidgets, pandas, Altair, and a torch),
   made once per run and copied for each notebook, so that no notebook finds another one's
   installs.
3. The notebook, taken from the archive, is copied alone into an empty folder and executed
   with nbclient by a kernel of that environment, with a new empty HOME (so chapter 8
   downloads Multi30k, from a second local server) and ``BOOK_SETUP=1`` (the setup cell's
   "as in Colab" switch); the cell's own pip line installs the package
   (``BOOK_SETUP_REQUIREMENT`` = the wheel) and fetches the files
   (``BOOK_SETUP_FILES_URL`` = the local server). pip's download cache is the user's own
   (``PIP_CACHE_DIR``), the one thing kept between runs.
4. Afterwards every distribution installed before must have the same version (the kernel's
   IPython, ipykernel, ipywidgets, pandas, Altair, torch: the setup must leave Colab's kernel
   alone), and none of the book's build tools (``BUILD_TOOLS``) may have been installed.
5. The notebook's Markdown is searched for MyST syntax (roles, directives, targets), which
   Colab's renderer shows as raw text.

It prints one report per notebook; the exit status is 0 when each ran to the end and kept the
environment as it was.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The folder of the notebooks a reader opens in Colab (the launch buttons' target): the
# chapters themselves until the reader editions (notebooks/) are committed.
NOTEBOOKS = "notebooks"
DEFAULT_NOTEBOOKS = [f"{NOTEBOOKS}/02_masks.ipynb", f"{NOTEBOOKS}/08_translation.ipynb"]
KERNEL = "colab-check"
# What a new Colab runtime has installed, of what the chapters use: its kernel and widgets
# (IPython 7.34, ipykernel 5.5.6, ipywidgets 7.7.1), pandas 2.2 and Altair 5.5, and what it
# has of the package's own requirements (Colab ships transformers, hence tokenizers,
# huggingface-hub and safetensors; versions of Colab's 2025 package lists). jupyter-client and
# notebook are Colab's too, pinned because pip would otherwise pick today's, which need an
# ipykernel newer than Colab's. torch 2.13.0 is constraints.txt's pin: pip takes it from its
# configured local wheels or index (Colab's own torch is a CUDA build of its choosing).
COLAB = {
    "torch": "2.13.0",
    "ipython": "7.34.0",
    "ipykernel": "5.5.6",
    "ipywidgets": "7.7.1",
    "pandas": "2.2.2",
    "altair": "5.5.0",
    "numpy": "2.0.2",
    "tokenizers": "0.22.0",
    "huggingface-hub": "0.34.4",
    "safetensors": "0.6.2",
    "tqdm": "4.67.1",
    "jupyter-client": "6.1.12",
    "notebook": "6.5.5",
}
# The book's build tools: a reader's notebook needs none of them.
BUILD_TOOLS = ("sphinx", "myst-parser", "myst-nb", "jupyter-book")
# MyST syntax that Jupyter's Markdown renderer (Colab, JupyterLab, nbconvert) prints as text.
ROLE = re.compile(r"\{([a-zA-Z][\w:+-]*)\}`")  # {glue:text}`name`, {cite}`key`, {numref}`x`
DIRECTIVE = re.compile(r"^[ \t]*(?:`{3,}|~{3,}|:{3,})[ \t]*\{([\w:-]+)\}", re.M)  # ```{figure}
TARGET = re.compile(r"^\([\w.:-]+\)=[ \t]*$", re.M)  # (label)= before a heading


def normalize(name: str) -> str:
    """A distribution's name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def myst_leftovers(nb: dict) -> Counter:
    """How often each kind of MyST syntax occurs in the notebook's Markdown cells.

    Keys: ``{name}`` for a role (``{glue:text}``, ``{cite}``), ``{name} directive`` for a
    directive (``{admonition} directive``) and ``(label)= target``. Empty: none left.
    """
    found: Counter = Counter()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        text = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        found.update(f"{{{m}}} directive" for m in DIRECTIVE.findall(text))
        found.update(f"{{{m}}}" for m in ROLE.findall(text))
        found.update("(label)= target" for _ in TARGET.findall(text))
    return found


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
    """Run a command; on failure raise with its output (pip's reasons), not just its status."""
    done = subprocess.run(argv, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` exited with status {done.returncode}:\n{done.stdout}{done.stderr}"
        )
    return done


def archive_head(dest: Path, root: Path = ROOT) -> Path:
    """Unpack what `git archive HEAD` holds (the committed files, nothing else) into `dest`."""
    data = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD"], cwd=root, capture_output=True, check=True
    ).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def build_wheel(src: Path, out: Path) -> Path:
    """A wheel of the package in `src` (the archive: its build/ and egg-info stay there)."""
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)])
    (wheel,) = out.glob("*.whl")
    return wheel


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def make_colab_venv(venv: Path, env: dict[str, str]) -> Path:
    """A new virtual environment with what a new Colab runtime has installed (``COLAB``).

    ``--no-compile``: byte-compiling torch's files would double the time, and changes nothing
    pip decides later.
    """
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv_python(venv)
    pins = [f"{name}=={version}" for name, version in COLAB.items()]
    run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", *pins], env=env)
    return python


def copy_venv(base: Path, dest: Path) -> Path:
    """A copy of the environment `base` (its interpreter is a link to the same base Python)."""
    shutil.copytree(base, dest, symlinks=True)
    return venv_python(dest)


def installed_versions(python: Path) -> dict[str, str]:
    """{normalized name: version} of every distribution in the environment of `python`."""
    code = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    # -I: the environment's own packages, not the caller's PYTHONPATH or working directory
    out = run([str(python), "-I", "-c", code]).stdout
    return {normalize(k): v for k, v in json.loads(out).items()}


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


def kernel_manager(python: Path, where: Path) -> Any:
    """A kernel manager that starts `python`'s ipykernel (a kernelspec of its own in `where`)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = where / KERNEL
    spec.mkdir(parents=True, exist_ok=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}),
        encoding="utf-8",
    )
    specs = KernelSpecManager(kernel_dirs=[str(where)], ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def execute(nb_path: Path, python: Path, env: dict[str, str], timeout: int = 1200) -> str:
    """Execute the notebook in its folder with a kernel of `python`; write it back with its
    outputs. Returns "" when it ran to the end, else what went wrong."""
    import nbclient
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    km = kernel_manager(python, nb_path.parent.parent / "kernels")
    client = nbclient.NotebookClient(
        nb, km=km, timeout=timeout, resources={"metadata": {"path": str(nb_path.parent)}}
    )
    try:
        client.execute(env=env)  # the kernel's environment is `env` alone
        error = ""
    except Exception as err:  # the report says which cell failed and how
        plain = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # IPython's colours
        error = f"{type(err).__name__}: {plain[-3000:]}"
    finally:
        nbformat.write(nb, nb_path)
        if km.has_kernel:  # nbclient leaves a kernel manager it was given running
            km.shutdown_kernel(now=True)
    return error


def pip_cache() -> str:
    """The user's pip cache (pip's own default), kept when a kernel gets an empty HOME."""
    if os.environ.get("PIP_CACHE_DIR"):
        return os.environ["PIP_CACHE_DIR"]
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(cache) / "pip")


def base_env() -> dict[str, str]:
    """The environment of pip and the kernels: this one's pip settings and nothing else."""
    keep = {k: v for k, v in os.environ.items() if k.startswith(("PIP_", "SSL_", "OMP_"))}
    return {"PATH": os.environ.get("PATH", ""), **keep, "PIP_CACHE_DIR": pip_cache()}


def kernel_env(python: Path, home: Path, wheel: Path, files_url: str, data_url: str) -> dict:
    """A Colab kernel's environment, with the setup cell's switches pointed at this run."""
    home.mkdir(parents=True, exist_ok=True)
    env = base_env()
    env.update(
        PATH=f"{python.parent}{os.pathsep}{env['PATH']}",
        HOME=str(home),
        BOOK_SETUP="1",
        BOOK_SETUP_REQUIREMENT=f"{wheel}[notebooks]",
        BOOK_SETUP_FILES_URL=files_url,
        MULTI30K_URL=data_url,
    )
    return env


@dataclass
class Report:
    """What one notebook's Colab-like run found."""

    notebook: str
    error: str = ""  # "" when every cell ran
    seconds: float = 0.0  # the notebook's run, its setup cell's install included
    setup_output: str = ""
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    leftovers: Counter = field(default_factory=Counter)

    @property
    def changed(self) -> dict[str, tuple[str, str | None]]:
        """The distributions installed before whose version changed (None: removed)."""
        return {k: (v, self.after.get(k)) for k, v in self.before.items() if self.after.get(k) != v}

    @property
    def build_tools(self) -> list[str]:
        return [name for name in BUILD_TOOLS if name in self.after]

    @property
    def ok(self) -> bool:
        return not self.error and not self.changed and not self.build_tools

    def lines(self) -> list[str]:
        added = sorted(set(self.after) - set(self.before))
        kept = ", ".join(f"{n} {self.after.get(n)}" for n in COLAB)
        left = ", ".join(f"{k} x{n}" for k, n in self.leftovers.most_common()) or "none"
        return [
            f"{'PASS' if self.ok else 'FAIL'}  {self.notebook}: "
            f"{self.error or 'ran to the end'} ({self.seconds:.0f} s)",
            "  setup cell printed: " + (self.setup_output.strip().replace("\n", " | ") or "-"),
            f"  Colab's packages afterwards: {kept}",
            f"  changed: {self.changed or 'nothing'}; build tools installed: "
            f"{self.build_tools or 'none'}",
            f"  added by the setup cell ({len(added)}): {', '.join(added)}",
            f"  MyST syntax left in the Markdown ({sum(self.leftovers.values())}): {left}",
        ]


def check_notebook(
    name: str, archive: Path, base_venv: Path, wheel: Path, urls: tuple[str, str], work: Path
) -> Report:
    """Run `name` (a path inside the archive, e.g. chapters/02_masks.ipynb) as in Colab."""
    source = archive / name
    if not source.is_file():
        raise FileNotFoundError(f"{name} is not in `git archive HEAD`: commit it first")
    folder = work / Path(name).stem
    shutil.rmtree(folder, ignore_errors=True)
    python = copy_venv(base_venv, folder / "venv")
    alone = folder / "content" / Path(name).name  # Colab's /content: the notebook, nothing else
    alone.parent.mkdir(parents=True)
    shutil.copy2(source, alone)
    report = Report(name, before=installed_versions(python))
    env = kernel_env(python, folder / "home", wheel, *urls)
    start = time.monotonic()
    report.error = execute(alone, python, env)
    report.seconds = time.monotonic() - start
    report.after = installed_versions(python)
    ran = json.loads(alone.read_text(encoding="utf-8"))
    first = ran["cells"][0] if ran["cells"] else {}
    report.setup_output = "".join(
        "".join(o.get("text", "")) + "".join(o.get("traceback", []))
        for o in first.get("outputs", [])
    )  # fmt: skip
    report.leftovers = myst_leftovers(ran)
    return report


def local_multi30k() -> Path:
    """The copy of Multi30k to serve: where the task runner and the tests read it."""
    sys.path.insert(0, str(ROOT / "tools"))
    import tasks

    os.environ.update(tasks.multi30k_env())
    from transformer_lib.translation.data import SHA256, default_data_dir

    data = default_data_dir()
    missing = [n for n in SHA256 if not (data / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{data} lacks the Multi30k files {missing}: name a copy with "
                                "--data, or run transformer_lib.translation.data.download()")
    return data


@contextmanager
def colab_run(work: Path, data: Path) -> Iterator[tuple[Path, Path, Path, tuple[str, str]]]:
    """The run's shared parts: (archive, base venv, wheel, (files URL, Multi30k URL)).

    The servers stop when the block ends.
    """
    archive = archive_head(work / "archive")
    wheel = build_wheel(archive, work / "dist")
    base = work / "colab-venv"
    make_colab_venv(base, base_env())
    with serve(archive) as files_url, serve(data) as data_url:
        yield archive, base, wheel, (files_url, data_url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help=f"paths in the repository (default: {' '.join(DEFAULT_NOTEBOOKS)})")
    parser.add_argument("--work", type=Path, default=None,
                        help="scratch folder (default: a new temporary one, removed afterwards)")
    parser.add_argument("--data", type=Path, default=None,
                        help="a folder with the Multi30k files to serve (default: where the "
                        "tests read them)")  # fmt: skip
    args = parser.parse_args(argv)
    names = []
    for path in args.notebooks or [Path(n) for n in DEFAULT_NOTEBOOKS]:
        full = (Path.cwd() / path).resolve() if not path.is_absolute() else path
        try:
            names.append(full.relative_to(ROOT).as_posix())
        except ValueError:
            parser.error(f"{path} is not inside the repository {ROOT}")
    data = args.data or local_multi30k()
    reports = []
    with tempfile.TemporaryDirectory(prefix="colab-check-") as scratch:
        work = (args.work or Path(scratch)).resolve()
        start = time.monotonic()
        with colab_run(work, data) as (archive, base, wheel, urls):
            print(f"Colab-like environment ready in {time.monotonic() - start:.0f} s", flush=True)
            for name in names:
                reports.append(check_notebook(name, archive, base, wheel, urls, work))
                print("\n".join(reports[-1].lines()), flush=True)
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
