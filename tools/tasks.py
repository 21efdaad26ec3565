"""The project's tasks in plain Python, for every operating system: `python tools/tasks.py TASK`.

The Makefile's targets call this file (`make test` runs `python3 tools/tasks.py test`), so each
step is defined once, here; readers without `make` (Windows, often macOS) run the same steps:

    python tools/tasks.py book        # execute every chapter and render the site into _build/html
    python tools/tasks.py test        # lint, export-check, unit, nbval, book-check
    python tools/tasks.py execute chapters/02_masks.ipynb   # refresh stored outputs
    python tools/tasks.py --dry-run test                    # print the steps, run nothing
    python tools/tasks.py --list

Paths given to a task are read from the directory the command is typed in (`cd chapters;
python ../tools/tasks.py nbval 02_masks.ipynb`); the steps then run in the repository.
`--dry-run` (`-n`) may stand anywhere on the line.

Standard library only, no shell: every command is an argument list run with `subprocess`, paths
are built with `pathlib`, and the virtual environment's programs are looked up in `.venv/bin/`
(POSIX) or `.venv\\Scripts\\` (Windows).

Environment: `PIP_EXTRA_INDEX_URL` (read by pip itself) selects e.g. PyTorch's CPU wheel index
in CI; `TASKS_CONSTRAINTS` names another constraints file, or `none` to install from the ranges
in pyproject.toml (for a Python that the exact pins do not support); `SITE_CHROMIUM` names the
browser for the site check on macOS and Windows. Every step gets `MULTI30K_DIR` set to
`../shared/data/multi30k` (beside the repository) when that folder exists and the variable is
unset; elsewhere transformer_lib downloads Multi30k into the user cache on first use.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(".venv")
STAMP = VENV / ".installed"
# Every step runs with these (they used to be exported by the Makefile): figures drawn by the
# site's own Vega with stable ids, and one hash seed so nbval sees the same outputs every run.
ENV = {"BOOK_FIGURES": "offline", "PYTHONHASHSEED": "0"}
CONSTRAINTS = "constraints.txt"
SITE_CONFIG = "_build_ci_config.yml"
LINUX_CHROMIUM = "/usr/lib/chromium/chromium"  # what tools/browser_deps.sh installs
# A local mirror of Multi30k beside the repository (the machines this book is written on have
# one): steps read it instead of downloading the data into the user cache on first use.
LOCAL_MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def multi30k_env() -> dict[str, str]:
    """{"MULTI30K_DIR": the local mirror} when that folder exists and MULTI30K_DIR is unset."""
    if os.environ.get("MULTI30K_DIR") or not LOCAL_MULTI30K.is_dir():
        return {}
    return {"MULTI30K_DIR": str(LOCAL_MULTI30K.resolve())}


class TaskError(RuntimeError):
    """A step failed: the message names it (the runner prints it and exits non-zero)."""


class Runner:
    """Runs (or, with dry_run, only records) the steps of the tasks.

    `system` is `platform.system()` ("Linux", "Darwin", "Windows") and `machine`
    `platform.machine()` ("x86_64", "AMD64", "arm64"); tests pass other values to see another
    platform's plan. `installed` forces the answer of "is .venv up to date?" (None: look at the
    stamp file, as make did).
    """

    def __init__(
        self,
        *,
        dry_run: bool = False,
        system: str | None = None,
        machine: str | None = None,
        installed: bool | None = None,
    ) -> None:
        self.dry_run = dry_run
        self.system = system or platform.system()
        self.machine = machine or platform.machine()
        self.installed = installed
        self.env = {**os.environ, **ENV, **multi30k_env()}
        self.log: list[str] = []
        self._done: set[str] = set()

    # ------------------------------------------------------------------ paths
    @property
    def windows(self) -> bool:
        return self.system == "Windows"

    def tool(self, name: str) -> str:
        """A program installed in the virtual environment, e.g. `.venv/bin/pytest`."""
        if self.windows:
            return str(VENV / "Scripts" / f"{name}.exe").replace("/", "\\")
        return (VENV / "bin" / name).as_posix()

    @property
    def python(self) -> str:
        return self.tool("python")

    # ------------------------------------------------------------------ actions
    def _record(self, line: str) -> None:
        self.log.append(line)
        print(f"+ {line}", flush=True)

    def run(
        self, *argv: str, stdout_to: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """Run one command (no shell; `env` adds variables for it alone); stop if it fails."""
        shown = " ".join([*(f"{k}={v}" for k, v in (env or {}).items()), *argv])
        shown += f" > {stdout_to}" if stdout_to else ""
        self._record(shown)
        if self.dry_run:
            return
        full_env = {**self.env, **(env or {})}
        try:
            if stdout_to is None:
                code = subprocess.run(list(argv), env=full_env).returncode
            else:
                with open(stdout_to, "w", encoding="utf-8") as out:
                    code = subprocess.run(list(argv), env=full_env, stdout=out).returncode
        except FileNotFoundError as e:
            raise TaskError(f"{argv[0]} not found ({e.strerror}): run the install task") from e
        if code != 0:
            raise TaskError(f"`{shown}` exited with status {code}")

    def remove(self, path: str) -> None:
        """`rm -rf path`: a missing path is fine."""
        self._record(f"remove {path}")
        if self.dry_run:
            return
        p = Path(path)
        if p.is_dir() and sys.version_info >= (3, 12):
            shutil.rmtree(p, onexc=_make_writable_and_retry)
        elif p.is_dir():
            shutil.rmtree(p, onerror=_make_writable_and_retry)  # onexc is 3.12+
        elif p.exists():
            p.unlink()

    def say(self, text: str) -> None:
        self.log.append(f"# {text}")
        print(text, flush=True)

    def once(self, name: str) -> bool:
        """True the first time a prerequisite is met in this invocation (make's behavior)."""
        if name in self._done:
            return False
        self._done.add(name)
        return True


def _make_writable_and_retry(func: Callable[[str], object], path: str, _exc: object) -> None:
    # Windows refuses to delete read-only files (git objects, some wheels' data); rm -rf does not.
    os.chmod(path, 0o700)
    func(path)


# ---------------------------------------------------------------------------------- tasks


def _constraints() -> list[str]:
    """`-c constraints.txt`, or another file / none through TASKS_CONSTRAINTS."""
    chosen = os.environ.get("TASKS_CONSTRAINTS", CONSTRAINTS)
    return [] if chosen.lower() in ("", "none") else ["-c", chosen]


def _stamp_is_fresh() -> bool:
    """As make decided: the stamp exists and neither pyproject.toml nor constraints.txt is newer."""
    if not STAMP.exists():
        return False
    built = STAMP.stat().st_mtime
    deps = [Path("pyproject.toml"), Path(CONSTRAINTS)]
    return all(d.stat().st_mtime <= built for d in deps if d.exists())


def install(r: Runner, args: list[str]) -> None:
    """Create .venv with the exact versions in constraints.txt (again when either file changed)."""
    if not r.once("install"):
        return
    fresh = _stamp_is_fresh() if r.installed is None else r.installed
    if fresh:
        return
    r.run(sys.executable, "-m", "venv", str(VENV))
    r.run(r.python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    # torch 2.13.0 is pinned in constraints.txt: a CPU build on these machines (CI on GitHub picks
    # the CPU wheel through PIP_EXTRA_INDEX_URL, which pip reads itself).
    r.run(r.python, "-m", "pip", "install", "--quiet", *_constraints(), "-e", ".[book,dev]")
    r._record(f"touch {STAMP.as_posix()}")
    if not r.dry_run:
        STAMP.touch()


def book(r: Runner, args: list[str]) -> None:
    """Execute every chapter and render the site into _build/html."""
    install(r, [])
    r.run(r.python, "tools/fetch_assets.py")
    # The reader editions (notebooks/) first: the site's download and launch buttons open them.
    r.run(r.python, "tools/reader_edition.py")
    r.remove("_build/html")  # --all re-renders every page but keeps pages of files since removed
    r.run(r.tool("jupyter-book"), "build", "--all", "-W", "-n", "--keep-going", ".")
    r.say("Open _build/html/index.html")


def lint(r: Runner, args: list[str]) -> None:
    """ruff over the whole repository (chapters included)."""
    install(r, [])
    r.run(r.tool("ruff"), "check", *(args or ["."]))


def export_check(r: Runner, args: list[str]) -> None:
    """Fail when the package or the reader editions differ from what the chapters give."""
    install(r, [])
    r.run(r.python, "tools/export.py", "--check")
    r.run(r.python, "tools/reader_edition.py", "--check")


def unit(r: Runner, args: list[str]) -> None:
    """Unit tests (arguments replace the default `tests`, e.g. one test file)."""
    install(r, [])
    # Two workers of one torch thread each fill two cores. With torch's default (a thread per
    # core) each worker would use both, and when another program keeps a core busy the four
    # threads wait for each other: the tests took 14 minutes instead of 2 (an EPYC, 2 cores).
    r.run(r.tool("pytest"), "-n", "2", "-q", *(args or ["tests"]), env={"OMP_NUM_THREADS": "1"})


def nbval(r: Runner, args: list[str]) -> None:
    """Re-execute chapters and compare with their stored outputs (arguments: notebooks)."""
    install(r, [])
    # One torch thread per kernel, as in `unit`: two chapters run at once, and a kernel of two
    # threads beside another kernel waits on its own threads (chapter 8 took 13 minutes on
    # an imitated CPU beside chapter 6, 1 minute alone). Outputs do not depend on it.
    # The chapters that train start first (in the order given, not xdist's most-cells-first),
    # so that no long chapter starts last while the other worker has nothing left to do.
    r.run(
        r.tool("pytest"), "-q", "-p", "no:randomly", "--nbval",
        *(args or _chapters_longest_first()),
        "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-n", "2", "--dist", "loadfile",
        "--no-loadscope-reorder", env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip


# The chapters whose cells train or translate, longest first (as timed on an imitated CPU;
# chapter 8's reader trains a translator for four minutes of the wall clock).
LONGEST_FIRST = ["08_translation", "06_training", "11_what_came_after", "10_what_the_paper_found",
                 "07_decoding", "05_model"]


def _chapters_longest_first() -> list[str]:
    """Every chapter notebook, LONGEST_FIRST's first and the others in book order."""
    names = sorted(p.stem for p in (ROOT / "chapters").glob("*.ipynb"))
    first = [n for n in LONGEST_FIRST if n in names]
    return [f"chapters/{n}.ipynb" for n in first + [n for n in names if n not in first]]


def _installed_chrome(system: str) -> str | None:
    """A Chrome or Chromium binary at its usual place on macOS or Windows, if there is one."""
    if system == "Darwin":
        candidates = [
            "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
            "/Applications/Chromium.app/Contents/MacOS/Chromium",
        ]
    elif system == "Windows":
        bases = [os.environ.get(v) for v in ("PROGRAMFILES", "PROGRAMFILES(X86)", "LOCALAPPDATA")]
        candidates = [
            str(Path(b) / "Google" / "Chrome" / "Application" / "chrome.exe") for b in bases if b
        ]
    else:
        candidates = []
    return next((c for c in candidates if Path(c).is_file()), None)


def browser_deps(r: Runner, args: list[str]) -> str | None:
    """Linux: Debian's chromium via tools/browser_deps.sh (apt-get, once).

    A browser named by SITE_CHROMIUM is used instead when it exists (Ubuntu's chromium is a
    snap, other distributions have no apt-get). macOS / Windows: SITE_CHROMIUM or an installed
    Chrome. Returns the browser for the site tests, or None when the browser check is skipped.
    """
    chosen = os.environ.get("SITE_CHROMIUM")
    if r.system == "Linux" and not (chosen and Path(chosen).is_file()):
        if r.once("browser-deps"):
            r.run("bash", "tools/browser_deps.sh")
        return LINUX_CHROMIUM
    found = chosen or _installed_chrome(r.system)
    if found:
        r.say(f"browser check: using {found} (SITE_CHROMIUM)")
        r.env["SITE_CHROMIUM"] = found
    else:
        r.say(
            f"browser check skipped on {r.system}: it needs Chromium, which tools/browser_deps.sh "
            "installs with apt-get on Debian/Ubuntu only, and no Chrome was found in its usual "
            "place. Set SITE_CHROMIUM to a Chrome or Chromium binary to run it. The site's static "
            "checks (tests/site/test_static.py) still run."
        )
    return found


def book_check(r: Runner, args: list[str]) -> None:
    """Build the site from the stored outputs, then check every page (headless Chromium)."""
    install(r, [])
    browser = browser_deps(r, [])
    r.run(r.python, "tools/fetch_assets.py")
    # Notebook execution off: nbval has just compared the stored outputs with a fresh run.
    r.run(r.python, "tools/ci_config.py", stdout_to=SITE_CONFIG)
    r.remove("_build/html")
    try:
        r.run(
            r.tool("jupyter-book"), "build", "--all", "-W", "-n", "--keep-going",
            "--config", SITE_CONFIG, ".",
        )  # fmt: skip
    finally:
        r.remove(SITE_CONFIG)
    site_tests = "tests/site" if browser else "tests/site/test_static.py"
    r.run(r.tool("pytest"), "-q", site_tests)


def test(r: Runner, args: list[str]) -> None:
    """lint, export-check, unit, nbval, book-check: the README's test command."""
    for step in (lint, export_check, unit, nbval, book_check):
        step(r, [])


# CPUs to imitate. PyTorch, MKL and oneDNN each pick vector kernels for the CPU they run on, so
# the last bits of a result differ between machines; these variables only lower the instruction
# set, so any x86 machine can play an older one. "baseline" has no AVX at all (an old laptop,
# a differently built BLAS); "avx2" is the other kind of machine this book is written on;
# "avx512" is AVX-512 without bf16 instructions (Skylake-SP to Ice Lake, most cloud machines),
# where precision "auto" must pick fp32 although oneDNN runs AVX-512 kernels (oneDNN's
# AVX512_CORE is AVX-512 F/BW/VL/DQ, below AVX512_CORE_BF16; MKL's AVX512 is Skylake-SP's set).
EMULATED_CPUS = {
    "baseline": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
    },
}


X86 = {"x86_64", "amd64", "i386", "i686", "x86"}  # platform.machine() of x86 CPUs
# An imitated CPU's instruction set that not every x86 CPU has (the variables only lower).
NEEDS_FLAG = {"avx512": "avx512f"}


def cpu_flags() -> set[str] | None:
    """The CPU's flags from /proc/cpuinfo (Linux), or None where the OS does not list them."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    line = next((x for x in text.splitlines() if x.startswith("flags")), None)
    return set(line.split(":", 1)[1].split()) if line else None


# Unit tests that check files, documents and tools, not arithmetic: the imitated CPUs cannot
# change their result, and they cost minutes (a Colab-like environment, every shown command,
# actionlint), so test-emulated leaves them to `test`.
FILES_AND_DOCUMENTS = [
    "tests/test_colab.py", "tests/test_doc_commands.py", "tests/test_workflows.py",
    "tests/test_stands_alone.py", "tests/test_reader_edition.py", "tests/test_notebook_setup.py",
    "tests/test_chapters.py", "tests/test_tasks.py", "tests/test_bench_freshness.py",
]


def test_emulated(r: Runner, args: list[str]) -> None:
    """unit and nbval on an imitated CPU (argument: baseline, the default, avx2 or avx512).

    The stored outputs were written on one machine; this checks that they, and every assertion
    of the unit tests, hold where the arithmetic rounds differently.
    """
    names = args or ["baseline"]
    unknown = [n for n in names if n not in EMULATED_CPUS]
    if unknown:
        raise TaskError(f"unknown emulated CPU {unknown}: choose from {sorted(EMULATED_CPUS)}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # each name is a full unit + nbval run: twice is an hour for nothing
        raise TaskError(f"emulated CPU {repeated} named more than once: name each CPU once")
    _check_can_imitate(r, names)
    for name in names:
        _emulated(r, name, [])


# The chapters whose cells train for minutes: on the imitated CPU they take about 14 of the
# chapters' 18 minutes of kernel time (chapter 8's reader trains for four minutes of the wall
# clock). test-emulated-quick leaves them to test-emulated, which the project's workflow runs
# on every push and CONTRIBUTING asks of every change to a chapter.
LONG_CHAPTERS = ["06_training", "08_translation", "11_what_came_after"]


def test_emulated_quick(r: Runner, args: list[str]) -> None:
    """test-emulated baseline less the three chapters that train for minutes (.ci/run's).

    .ci/run must finish in 30 minutes on two cores: `make test` takes about 19 of them, the
    full test-emulated 12 more. This keeps every unit test and eight of the eleven chapters on
    the imitated CPU, in about 5 minutes.
    """
    _check_can_imitate(r, ["baseline"])
    chapters = [p for p in _chapters_longest_first() if Path(p).stem not in LONG_CHAPTERS]
    r.say("chapters left to test-emulated: " + ", ".join(LONG_CHAPTERS))
    _emulated(r, "baseline", chapters)


def _check_can_imitate(r: Runner, names: list[str]) -> None:
    """Refuse imitated CPUs this machine cannot imitate (they would test its own kernels)."""
    if r.machine.lower() not in X86:
        # Not a silent pass: the run would check this machine's own kernels only.
        raise TaskError(
            "the imitated CPUs are x86 ones (the variables lower the x86 instruction sets "
            f"PyTorch, MKL and oneDNN use), and on this {r.machine} machine they change "
            "nothing: run it on an x86 machine"
        )
    flags = cpu_flags()
    missing = [n for n in names if n in NEEDS_FLAG and flags is not None
               and NEEDS_FLAG[n] not in flags]  # fmt: skip
    if missing:  # ATen and oneDNN would quietly run this CPU's own, lower kernels
        raise TaskError(f"emulated CPU {missing} needs {[NEEDS_FLAG[n] for n in missing]}, "
                        "which this CPU lacks: the variables only lower the instruction set")


def _emulated(r: Runner, name: str, chapters: list[str]) -> None:
    """unit (less FILES_AND_DOCUMENTS) and nbval (`chapters`, default all) on CPU `name`."""
    settings = " ".join(f"{k}={v}" for k, v in EMULATED_CPUS[name].items())
    r.say(f"emulated CPU: {name} ({settings})")
    saved = r.env
    r.env = {**saved, **EMULATED_CPUS[name]}
    try:
        unit(r, ["tests", *(f"--ignore={t}" for t in FILES_AND_DOCUMENTS)])
        nbval(r, chapters)
    finally:
        r.env = saved


def export(r: Runner, args: list[str]) -> None:
    """Write transformer_lib/ from the chapters."""
    install(r, [])
    r.run(r.python, "tools/export.py")


def execute(r: Runner, args: list[str]) -> None:
    """Re-execute chapters in place (arguments: notebooks; default all), then export.

    The package is exported first, so the chapters run against the code they define now (a
    chapter imports earlier chapters' code from the package), and again afterwards; then the
    reader editions (notebooks/) are written from the new outputs.
    """
    install(r, [])
    notebooks = args or sorted(p.as_posix() for p in Path("chapters").glob("*.ipynb"))
    r.run(r.python, "tools/export.py")
    r.run(
        r.tool("jupyter"), "nbconvert", "--to", "notebook", "--execute", "--inplace",
        "--ExecutePreprocessor.timeout=1800", *notebooks,
    )  # fmt: skip
    r.run(r.python, "tools/export.py")
    r.run(r.python, "tools/reader_edition.py")


def envcheck(r: Runner, args: list[str]) -> None:
    """Print the environment report to paste into a bug report (needs no working install)."""
    python = r.python if Path(r.python).exists() else sys.executable
    r.run(python, "tools/envcheck.py")


def pin(r: Runner, args: list[str]) -> None:
    """Rewrite constraints.txt from the venv (upgrade deliberately, in a commit of its own)."""
    install(r, [])
    r._record(f"{r.python} -m pip freeze --exclude-editable > {CONSTRAINTS}")
    if r.dry_run:
        return
    frozen = subprocess.run(
        [r.python, "-m", "pip", "freeze", "--exclude-editable"],
        env=r.env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # The local label of PyTorch's CPU wheels ("+cpu") is dropped: `torch==2.13.0` then matches
    # the CPU wheel and the default one alike, whichever index the installer uses.
    lines = [line.removesuffix("+cpu") for line in frozen.splitlines()]
    header = [
        "# Exact versions CI installs (make install uses `pip install -c constraints.txt`).",
        "# Upgrade deliberately, in a commit of its own: "
        "`make pin` rewrites this file from the venv.",
    ]
    Path(CONSTRAINTS).write_text("\n".join(header + lines) + "\n", encoding="utf-8")


def clean(r: Runner, args: list[str]) -> None:
    """Remove _build."""
    r.remove("_build")


TASKS: dict[str, Callable[[Runner, list[str]], object]] = {
    "install": install,
    "book": book,
    "test": test,
    "test-emulated": test_emulated,
    "test-emulated-quick": test_emulated_quick,
    "lint": lint,
    "export-check": export_check,
    "unit": unit,
    "nbval": nbval,
    "book-check": book_check,
    "browser-deps": browser_deps,
    "export": export,
    "execute": execute,
    "envcheck": envcheck,
    "pin": pin,
    "clean": clean,
}
# Tasks whose arguments are paths (read from the caller's directory), and the one whose
# arguments are names (of emulated CPUs); the others take none.
TAKES_PATHS = {"lint", "unit", "nbval", "execute"}
TAKES_ARGS = TAKES_PATHS | {"test-emulated"}


def user_paths(task: str, args: list[str], cwd: Path) -> list[str]:
    """The paths a user typed, read from `cwd` (where they typed them), as the steps see them.

    The steps run in the repository, so a path inside it is given relative to it (as in the
    Makefile); one outside it, absolute. A pytest node id keeps its test name
    (`tests/test_masks.py::test_x`). Raises ValueError for a missing path or an option.
    """
    out = []
    for arg in args:
        if arg.startswith("-"):
            raise ValueError(
                f"{task} takes paths, not options (got {arg!r}); for a tool's own options run "
                "it from .venv directly, e.g. .venv/bin/pytest -k NAME"
            )
        name, sep, node = arg.partition("::")
        if not name.strip():  # `unit ''` (an unset variable) is cwd: the whole repository
            raise ValueError(f"{task} got an empty path ({arg!r}; an unset variable?): name a "
                             "file or directory, or give none for the default")
        path = (cwd / name).resolve()
        if not path.exists():
            raise ValueError(f"no such file or directory: {name!r} (in {cwd})")
        if task == "execute" and path.suffix != ".ipynb":
            raise ValueError(f"execute takes notebooks (.ipynb), got {arg!r}")
        try:
            shown = path.relative_to(ROOT).as_posix()
        except ValueError:
            shown = str(path)
        out.append(shown + sep + node)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/tasks.py",
        description="The project's tasks (the Makefile's targets call these).",
    )
    parser.add_argument("task", nargs="?", choices=sorted(TASKS), metavar="TASK")
    parser.add_argument("args", nargs="*", help="paths for " + ", ".join(sorted(TAKES_PATHS))
                        + "; CPU names for test-emulated")  # fmt: skip
    parser.add_argument("-n", "--dry-run", action="store_true", help="print the steps only")
    parser.add_argument("--list", action="store_true", help="list the tasks")
    # Options anywhere on the line: `tasks.py unit tests/x.py --dry-run` is a dry run too
    # (with REMAINDER, `--dry-run` after the task went to the task as a path, and it ran).
    ns = parser.parse_intermixed_args(argv)
    if ns.list or ns.task is None:
        for name, func in TASKS.items():
            print(f"{name:13} {(func.__doc__ or '').splitlines()[0]}")
        return 0
    if ns.args and ns.task not in TAKES_ARGS:
        parser.error(f"task {ns.task!r} takes no arguments, got {ns.args}")
    args = ns.args
    if ns.task in TAKES_PATHS:
        try:
            args = user_paths(ns.task, args, Path.cwd())
        except ValueError as e:
            parser.error(str(e))
    os.chdir(ROOT)  # relative paths (and Windows' lookup of relative programs) start here
    runner = Runner(dry_run=ns.dry_run)
    try:
        TASKS[ns.task](runner, args)
    except TaskError as e:
        print(f"tasks.py {ns.task}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
