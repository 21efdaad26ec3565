"""Every command README.md and CONTRIBUTING.md show runs as written, in an environment without
make's variables (a `CPU=avx2` leaking from `make test-emulated CPU=avx2` hid a failure once).

Each shown command (a line of a ```bash block, or an inline code span that starts with a program)
gets one check below. Long ones run as a dry run: `make -n` and then the task runner's
`--dry-run` for each line of the recipe, the command line's options parsed by the program's own
parser, `--check`, `--collect-only` or `--help` where a tool has it. A few cannot run here at all
(Windows paths, publishing to GitHub, an install from the unpublished repository): they are
listed in NOT_RUN with the reason, and a shown command that no check knows fails the test.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _tools import load_tool, make_free_env

ROOT = Path(__file__).resolve().parents[1]
tasks = load_tool("tasks")
DOCS = ("README.md", "CONTRIBUTING.md")
PROGRAM = re.compile(r"(make |python |\.venv\S* |pip |jupytext |echo |([A-Z_]+=\S+ )+)")
# A chapter for the commands CONTRIBUTING writes with a placeholder (chapters/NN_x.ipynb).
EXAMPLE_CHAPTER = "02_masks"

NOT_RUN = {
    ".venv\\Scripts\\jupyter lab notebooks": "a Windows path",
    '.venv/bin/pip install ghp-import': "publishing: installs from the network",
    ".venv/bin/ghp-import -n -p -f _build/html": "publishing: pushes to GitHub",
    'pip install "annotated-transformer-book[notebooks] @ git+<repository.url>@main"':
        "the repository is not published yet (the README says so)",
}


def shown_commands() -> list[tuple[str, str]]:
    """(document, command) for every command the two documents show, in order, deduplicated."""
    found: list[tuple[str, str]] = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for block in re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line:
                    found.append((doc, " ".join(line.split())))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", prose):
            span = " ".join(span.split())
            if " " in span and PROGRAM.match(span):  # a program and its arguments
                found.append((doc, span))
    return list(dict.fromkeys(found))


def _venv_program(word: str) -> str:
    """`.venv/bin/X` and `python` as this test's interpreter runs them (the same .venv)."""
    if word in ("python", "python3"):
        return sys.executable
    if word.startswith(".venv/bin/"):
        name = word.removeprefix(".venv/bin/")
        return sys.executable if name == "python" else str(Path(sys.executable).parent / name)
    return word


def _run(argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None,
         timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=ROOT, env={**make_free_env(), **(env or {})}, input=stdin,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def _split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


# ------------------------------------------------------------------------------ the checks


def _skip_an_imitation_this_machine_cannot_run(words: list[str]) -> None:
    """test-emulated imitates x86 CPUs, and avx512 only on a CPU with AVX-512 (tools/tasks.py
    refuses the rest, as the README says); macOS and Windows CI run this file too."""
    if "test-emulated" not in words:
        return
    if platform.machine().lower() not in tasks.X86:
        pytest.skip(f"test-emulated imitates x86 CPUs; this one is {platform.machine()}")
    flags = tasks.cpu_flags()
    if any(w.endswith("avx512") for w in words) and flags is not None and "avx512f" not in flags:
        pytest.skip("the avx512 kind needs a CPU with AVX-512")


def check_make(words: list[str], env: dict[str, str]) -> None:
    """`make X`: make's plan, then each of its task runner lines as a dry run."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    _skip_an_imitation_this_machine_cannot_run(words)
    recipe = _run(["make", "-n", "--no-print-directory", *words[1:]], env=env).stdout
    lines = recipe.splitlines()
    assert lines, f"make {words[1:]} runs nothing"
    for line in lines:
        argv = shlex.split(line)
        assert argv[1] == "tools/tasks.py", line
        check_tasks(["python", *argv[1:]], env)


def check_tasks(words: list[str], env: dict[str, str]) -> None:
    """`python tools/tasks.py ...`: the same arguments with --dry-run (--list runs as is)."""
    _skip_an_imitation_this_machine_cannot_run(words)
    args = words[2:]
    if "--list" not in args and "--dry-run" not in args:
        args = ["--dry-run", *args]
    _run([sys.executable, "tools/tasks.py", *args], env=env)


def check_tool(words: list[str], env: dict[str, str]) -> None:
    """`python tools/X.py ...`: export and notebook_setup with --check; the long-running ones
    parse the shown options (--help lists each) and their paths exist."""
    name = Path(words[1]).stem
    if name in ("export", "notebook_setup"):
        _run([sys.executable, words[1], *words[2:], "--check"], env=env)
        return
    usage = _run([sys.executable, words[1], "--help"], env=env).stdout
    for word in words[2:]:
        if word.startswith("--"):
            assert word.split("=")[0] in usage, f"{words[1]} has no option {word}"
        else:
            assert (ROOT / word).exists(), word


def check_module(words: list[str], env: dict[str, str]) -> None:
    """`python -m bench.X`: the module runs its --help."""
    _run([sys.executable, "-m", words[2], "--help"], env=env)


def check_cli(command: str, words: list[str], env: dict[str, str]) -> None:
    """`python -m transformer_lib ...` (or the script, or torchrun): the package's parser takes
    the arguments, the repository files they name exist, and a translation with the shipped
    model (the README's example sentence) really runs."""
    from transformer_lib.translation import cli

    at = next(i for i, w in enumerate(words) if w in ("transformer_lib", "transformer-lib")
              or w.endswith("/transformer-lib"))
    args = words[at + 1:]
    if not args or args[0].startswith("{"):  # the synopsis: each subcommand exists
        subs = args[0].strip("{}").split(",") if args else ["train", "evaluate", "translate"]
        for sub in subs:
            with pytest.raises(SystemExit) as done:
                cli._parser().parse_args([sub, "--help"])
            assert done.value.code == 0, sub
        return
    cli._parser().parse_args(args)
    for word in args:
        if word.startswith(("configs/", "tests/", "chapters/")):
            assert (ROOT / word).exists(), word
    if "|" in command and args == ["translate"]:
        sentence = shlex.split(command.split("|")[0])[1]
        argv = [_venv_program(words[0]), *words[1:]]
        if shutil.which(argv[0]) is None:
            pytest.skip(f"{words[0]} is not installed here")
        out = _run(argv, env=env, stdin=sentence + "\n").stdout
        assert out.strip() and out.count("\n") == 1, out


def check_pip(words: list[str], env: dict[str, str]) -> None:
    """`pip install .[extras]`: the extras exist in pyproject.toml (installing is make install's
    job, which the CI runs)."""
    target = words[-1]
    assert target.startswith("."), target
    extras = re.findall(r"\w+", target[target.find("[") + 1 : target.find("]")]) \
        if "[" in target else []
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")  # tomllib: Python 3.11+
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    known = set(re.findall(r"^([\w-]+)\s*=\s*\[", section, re.M))
    assert {"notebooks", "book", "dev"} <= known, known
    assert set(extras) <= known, f"{target}: no extra {sorted(set(extras) - known)}"


def check_jupyter_lab(words: list[str], env: dict[str, str]) -> None:
    """`.venv/bin/jupyter lab PATH`: JupyterLab is installed and PATH exists (not started)."""
    assert importlib.util.find_spec("jupyterlab"), "JupyterLab is not installed (make install)"
    assert (ROOT / words[2]).exists(), words[2]


def check_jupytext(words: list[str], env: dict[str, str], tmp_path: Path) -> None:
    """`jupytext --to ...`: the round trip of one chapter, written into a scratch folder."""
    jupytext = shutil.which("jupytext", path=str(Path(sys.executable).parent))
    if jupytext is None:
        pytest.skip("jupytext is not installed")
    script = tmp_path / f"{EXAMPLE_CHAPTER}.py"
    _run([jupytext, "--to", "py:percent", f"chapters/{EXAMPLE_CHAPTER}.ipynb", "-o", str(script)])
    if words[2] == "ipynb":  # the way back, into the scratch folder instead of chapters/
        _run([jupytext, "--to", "ipynb", str(script), "-o", str(tmp_path / "back.ipynb")])
        assert (tmp_path / "back.ipynb").is_file()


def check_nbconvert(words: list[str], env: dict[str, str]) -> None:
    """Executing a chapter in place takes minutes and rewrites it: nbconvert takes the options."""
    usage = _run([_venv_program(words[0]), "nbconvert", "--help-all"], env=env).stdout
    for word in words:
        if word.startswith("--"):
            assert word in usage, word


def check_pytest_nbval(words: list[str], env: dict[str, str]) -> None:
    """nbval over a chapter: collected with the shown options (running it is `make test`'s)."""
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
            "-p", "no:cacheprovider", *[w.replace("NN_x", EXAMPLE_CHAPTER) for w in words[1:]]]
    out = _run(argv, env=env).stdout
    assert f"{EXAMPLE_CHAPTER}.ipynb::Cell" in out, out[-2000:]


def check_ruff(words: list[str], env: dict[str, str]) -> None:
    _run([_venv_program(words[0]), *words[1:]], env=env)


def check(command: str, tmp_path: Path) -> None:
    """Run the check that fits `command`; fail if none does."""
    if command in NOT_RUN:
        pytest.skip(f"not run: {NOT_RUN[command]}")
    env, words = _split_env(shlex.split(command.split("|")[-1]))
    words = [w.replace("NN_x", EXAMPLE_CHAPTER) if "jupytext" not in command else w
             for w in words]
    head, *rest = words
    if head == "make":
        check_make(words, env)
    elif head in ("python", ".venv/bin/python") and rest[:1] == ["tools/tasks.py"]:
        check_tasks(words, env)
    elif head in ("python", ".venv/bin/python") and rest[0].startswith("tools/"):
        check_tool(words, env)
    elif "-m" in words and "transformer_lib" in words or head.endswith("transformer-lib"):
        check_cli(command, words, env)
    elif head in ("python", ".venv/bin/python") and rest[:1] == ["-m"]:
        check_module(words, env)
    elif head.endswith("pip") and rest[:1] == ["install"]:
        check_pip(words, env)
    elif head.endswith("jupyter") and rest[:1] == ["lab"]:
        check_jupyter_lab(words, env)
    elif head.endswith("jupyter") and rest[:1] == ["nbconvert"]:
        check_nbconvert(words, env)
    elif head == "jupytext":
        check_jupytext(words, env, tmp_path)
    elif head.endswith("pytest") and "--nbval" in rest:
        check_pytest_nbval(words, env)
    elif head.endswith("ruff"):
        check_ruff(words, env)
    else:
        raise AssertionError(f"no check for the shown command {command!r}: add one")


COMMANDS = shown_commands()


def test_the_documents_show_the_commands_this_test_knows():
    shown = {c for _, c in COMMANDS}
    assert {"make book", "make test", "make test-emulated CPU=avx2",
            "make test-emulated CPU=avx512"} <= shown
    assert set(NOT_RUN) <= shown, "NOT_RUN names a command no document shows any more"
    assert len(shown) >= 40


@pytest.mark.parametrize("command", sorted({c for _, c in COMMANDS}))
def test_each_shown_command_runs_as_written(command, tmp_path):
    check(command, tmp_path)


def test_a_leaking_make_variable_does_not_change_the_plan(monkeypatch):
    """The failure this file guards against: with CPU=avx2 in the environment, `make -n
    test-emulated` plans avx2; in the cleaned environment it plans the README's baseline."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    monkeypatch.setenv("CPU", "avx2")
    monkeypatch.setenv("MAKEFLAGS", " -- CPU=avx2")
    leaked = subprocess.run(["make", "-n", "--no-print-directory", "test-emulated"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    clean = _run(["make", "-n", "--no-print-directory", "test-emulated"]).stdout
    assert leaked.split()[-1] == "avx2" and clean.split()[-1] == "baseline"
