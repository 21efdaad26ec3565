"""tools/tasks.py (the task runner the Makefile calls) and tools/envcheck.py.

The plans are checked with the runner's dry run: `test` runs every check the README lists over
the whole repository, each `make` command of the README prints the same plan as its
`python tools/tasks.py` twin, and paths and `--dry-run` mean what they say wherever they are given.
"""

from __future__ import annotations

import os
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
envcheck = load_tool("envcheck")

# What `make test` runs, in the README's order: "lint, package-vs-chapters check, unit tests,
# nbval on every chapter, site + browser check".
TEST_STEPS = ["lint", "export-check", "unit", "nbval", "book-check"]


def plan(task: str, *args: str, system: str = "Linux", installed: bool = True) -> list[str]:
    r = tasks.Runner(dry_run=True, system=system, installed=installed)
    tasks.TASKS[task](r, list(args))
    return r.log


@pytest.fixture
def no_browser(monkeypatch):
    monkeypatch.delenv("SITE_CHROMIUM", raising=False)
    monkeypatch.setattr(tasks, "_installed_chrome", lambda system: None)


@pytest.fixture
def x86(monkeypatch):
    """Plans of test-emulated, which refuses other machines, on any CI runner (macOS: arm64)."""
    monkeypatch.setattr(tasks.platform, "machine", lambda: "x86_64")


def test_test_task_runs_every_check_over_the_whole_repository(no_browser):
    """`test` is its five steps one after another, each over everything it checks."""
    assert plan("test") == [line for step in TEST_STEPS for line in plan(step)]
    lint, export_check, unit, nbval, book_check = (plan(step) for step in TEST_STEPS)
    assert lint[-1].split()[-2:] == ["check", "."]  # every file, chapters included
    # the package and the reader editions (notebooks/) against the chapters
    assert export_check[-2].endswith("tools/export.py --check")
    assert export_check[-1].endswith("tools/reader_edition.py --check")
    assert unit[-1].split()[-1] == "tests"
    # every chapter once, the chapters that train first (two workers: no long one last)
    given = [w for w in nbval[-1].split() if w.startswith("chapters/")]
    every = sorted(f"chapters/{p.name}" for p in (ROOT / "chapters").glob("*.ipynb"))
    assert sorted(given) == every and len(every) >= 11
    assert given[0] == "chapters/08_translation.ipynb" and "--no-loadscope-reorder" in nbval[-1]
    assert "OMP_NUM_THREADS=1" in nbval[-1]
    assert book_check[-1].split()[-2:] == ["-q", "tests/site"]  # with the browser, on Linux


def test_book_task_executes_every_chapter_and_book_check_builds_that_site(no_browser):
    book = plan("book")
    build = next(s for s in book if " build " in s)
    # No --config: _config.yml applies, and it executes every chapter on every build.
    assert "--config" not in build
    assert "execute_notebooks: force" in (ROOT / "_config.yml").read_text(encoding="utf-8")
    assert book.index("remove _build/html") < book.index(build)  # no pages of removed files
    # the site's download and launch buttons open the reader editions: written before the build
    assert book.index(".venv/bin/python tools/reader_edition.py") < book.index(build)
    assert book[-1] == "# Open _build/html/index.html"
    # book-check renders the same site from the stored outputs: the same build, plus the
    # config with execution off.
    check = next(s for s in plan("book-check") if " build " in s).split()
    at = check.index("--config")
    assert check[at + 1] == tasks.SITE_CONFIG
    assert check[:at] + check[at + 2 :] == build.split()


def _readme_pairs() -> list[tuple[str, str]]:
    """(make command, tasks.py arguments) that the README gives as the same step."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    pairs = re.findall(r"^\| `(make [^`]+)` \| `python tools/tasks.py ([^`]+)` \|$", text, re.M)
    pairs += re.findall(r"`(make [^`]+)`, or `python tools/tasks.py ([^`]+)`", text)
    pairs += [(m, t) for t, m in re.findall(r"^python tools/tasks.py (.+?) +# or: (make .+)$",
                                            text, re.M)]  # fmt: skip
    return pairs


def test_the_make_free_environment_drops_make_and_makefile_variables(monkeypatch):
    for name, value in (("CPU", "avx2"), ("NB", "chapters/02_masks.ipynb"), ("MAKELEVEL", "1"),
                        ("MAKEFLAGS", " -- CPU=avx2"), ("PYTHON", "python3.11")):
        monkeypatch.setenv(name, value)
    env = make_free_env()
    assert not {"CPU", "NB", "MAKELEVEL", "MAKEFLAGS", "PYTHON", "TASKS"} & set(env)
    assert env["PATH"] == os.environ["PATH"]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_each_make_command_of_the_readme_runs_its_tasks_py_twin(monkeypatch, capsys, x86):
    """`make X` and the README's `python tools/tasks.py X` print the same plan (dry run)."""
    monkeypatch.chdir(ROOT)  # main() changes into the repository; keep the test's cwd
    pairs = _readme_pairs()
    assert {"make book", "make test", "make install", "make envcheck"} <= {m for m, _ in pairs}

    def dry_run(argv: list[str]) -> str:
        assert tasks.main(["--dry-run", *argv]) == 0
        return capsys.readouterr().out

    for make, twin in pairs:
        recipe = subprocess.run(
            ["make", "-n", "--no-print-directory", *shlex.split(make)[1:]], cwd=ROOT,
            capture_output=True, text=True, check=True, env=make_free_env(),
        ).stdout.splitlines()  # fmt: skip
        assert recipe, f"`{make}` runs nothing"
        via_make = ""
        for line in recipe:
            argv = shlex.split(line)
            assert argv[1] == "tools/tasks.py", f"`{make}` runs {line}, not a task"
            via_make += dry_run(argv[2:])
        assert via_make == dry_run(shlex.split(twin)), make


def test_every_make_command_the_docs_name_is_a_target():
    targets = _make_targets()
    for doc in ("README.md", "CONTRIBUTING.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        named = set(re.findall(r"(?:`|^)make ([a-z][\w-]*)", text, re.M))
        assert named, doc
        assert named <= set(targets), f"{doc} names make {sorted(named - set(targets))}"


def test_steps_run_with_the_makefiles_environment():
    r = tasks.Runner(dry_run=True)
    assert r.env["BOOK_FIGURES"] == "offline"
    assert r.env["PYTHONHASHSEED"] == "0"


def test_steps_read_the_local_multi30k_mirror_when_there_is_one(monkeypatch, tmp_path):
    assert tasks.LOCAL_MULTI30K == ROOT.parent / "shared" / "data" / "multi30k"
    mirror = tmp_path / "shared" / "data" / "multi30k"
    monkeypatch.setattr(tasks, "LOCAL_MULTI30K", mirror)
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    # No mirror: MULTI30K_DIR stays unset, so transformer_lib downloads into the user cache.
    assert "MULTI30K_DIR" not in tasks.Runner(dry_run=True).env
    mirror.mkdir(parents=True)
    found = tasks.Runner(dry_run=True).env["MULTI30K_DIR"]
    assert found == str(mirror.resolve()) and Path(found).is_absolute()
    # A MULTI30K_DIR of the user's own is kept.
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "mine"))
    assert tasks.Runner(dry_run=True).env["MULTI30K_DIR"] == str(tmp_path / "mine")


def test_install_uses_the_constraints_and_rebuilds_a_stale_venv(monkeypatch):
    monkeypatch.delenv("TASKS_CONSTRAINTS", raising=False)
    steps = plan("install", installed=False)
    assert steps[1:] == [
        ".venv/bin/python -m pip install --quiet --upgrade pip",
        ".venv/bin/python -m pip install --quiet -c constraints.txt -e .[book,dev]",
        "touch .venv/.installed",
    ]
    assert steps[0].endswith("-m venv .venv")
    assert plan("install", installed=True) == []
    monkeypatch.setenv("TASKS_CONSTRAINTS", "none")
    assert "-c" not in plan("install", installed=False)[2].split()


def test_install_runs_once_per_invocation(no_browser):
    # `make test` checked its stamp once per target; one `venv` step for the whole test task.
    steps = plan("test", installed=False)
    assert sum(s.endswith("-m venv .venv") for s in steps) == 1
    assert steps.index("touch .venv/.installed") < steps.index(".venv/bin/ruff check .")


def test_stamp_is_stale_when_pyproject_or_constraints_is_newer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("pyproject.toml", "constraints.txt"):
        (tmp_path / name).write_text("x")
    assert not tasks._stamp_is_fresh()  # no stamp: install
    (tmp_path / ".venv").mkdir()
    stamp = tmp_path / ".venv" / ".installed"
    stamp.touch()
    os.utime(stamp, (1_000, 1_000))
    for name in ("pyproject.toml", "constraints.txt"):
        os.utime(tmp_path / name, (900, 900))
    assert tasks._stamp_is_fresh()
    os.utime(tmp_path / "constraints.txt", (1_100, 1_100))
    assert not tasks._stamp_is_fresh()


def test_execute_exports_before_and_after_running_the_notebooks():
    steps = plan("execute", "chapters/02_masks.ipynb")
    export = ".venv/bin/python tools/export.py"
    nbconvert = (
        ".venv/bin/jupyter nbconvert --to notebook --execute --inplace "
        "--ExecutePreprocessor.timeout=1800 chapters/02_masks.ipynb"
    )
    reader = ".venv/bin/python tools/reader_edition.py"  # the reader editions of the new outputs
    assert steps == [export, nbconvert, export, reader]


def test_execute_defaults_to_every_chapter_in_order(monkeypatch):
    monkeypatch.chdir(ROOT)
    nbconvert = plan("execute")[1].split()
    chapters = sorted(p.as_posix() for p in (Path("chapters")).glob("*.ipynb"))
    assert chapters and nbconvert[-len(chapters) :] == chapters


def test_arguments_replace_the_default_paths():
    assert plan("unit", "tests/test_masks.py") == [
        "OMP_NUM_THREADS=1 .venv/bin/pytest -n 2 -q tests/test_masks.py"]
    assert (
        "--nbval chapters/02_masks.ipynb --nbval-sanitize-with"
        in plan("nbval", "chapters/02_masks.ipynb")[0]
    )


def test_windows_plan_uses_scripts_and_no_shell(no_browser, capsys):
    steps = plan("test", system="Windows")
    assert steps[0] == r".venv\Scripts\ruff.exe check ."
    assert not any(s.startswith("bash") for s in steps)
    # Without a browser the browser check is skipped, saying why; the static checks still run.
    assert any(s.startswith("# browser check skipped on Windows") for s in steps)
    assert steps[-1] == r".venv\Scripts\pytest.exe -q tests/site/test_static.py"


def test_macos_uses_an_installed_chrome(monkeypatch):
    chrome = "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome"
    monkeypatch.delenv("SITE_CHROMIUM", raising=False)
    monkeypatch.setattr(tasks, "_installed_chrome", lambda system: chrome)
    r = tasks.Runner(dry_run=True, system="Darwin", installed=True)
    tasks.book_check(r, [])
    assert r.env["SITE_CHROMIUM"] == chrome
    assert r.log[-1] == ".venv/bin/pytest -q tests/site"


def test_linux_uses_site_chromium_instead_of_apt(monkeypatch, tmp_path):
    browser = tmp_path / "chrome"
    browser.write_text("")
    monkeypatch.setenv("SITE_CHROMIUM", str(browser))
    steps = plan("book-check")
    assert "bash tools/browser_deps.sh" not in steps
    assert steps[-1] == ".venv/bin/pytest -q tests/site"


def test_a_failing_step_stops_the_task_with_its_status():
    r = tasks.Runner()
    with pytest.raises(tasks.TaskError, match="status 3"):
        r.run(sys.executable, "-c", "raise SystemExit(3)")
    with pytest.raises(tasks.TaskError, match="not found"):
        r.run(str(ROOT / "no-such-program"))


def test_remove_deletes_trees_and_ignores_missing_paths(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.txt").write_text("x")
    r = tasks.Runner()
    r.remove(str(tmp_path / "a"))
    r.remove(str(tmp_path / "missing"))
    assert not (tmp_path / "a").exists()


def test_cli_dry_run_and_argument_errors(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # main() changes into the repository; keep the test's cwd
    assert tasks.main(["--dry-run", "lint"]) == 0
    assert "+ " in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        tasks.main(["book", "chapters/01_attention.ipynb"])
    assert exc.value.code == 2
    assert "takes no arguments" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        tasks.main(["tset"])
    assert exc.value.code == 2
    assert "invalid choice: 'tset'" in capsys.readouterr().err


@pytest.fixture
def nothing_runs(monkeypatch):
    """main() with every command refused: a test that reaches one fails, naming it."""

    def refuse(argv, *args, **kwargs):
        raise AssertionError(f"ran {argv}")

    monkeypatch.setattr(tasks.subprocess, "run", refuse)
    monkeypatch.setattr(tasks.Path, "touch", refuse)


@pytest.mark.parametrize("argv", [
    ["unit", "tests/test_masks.py", "--dry-run"],
    ["unit", "--dry-run", "tests/test_masks.py"],
    ["unit", "tests/test_masks.py", "-n"],
    ["test", "--dry-run"],
    ["test-emulated", "avx2", "--dry-run"],
])  # fmt: skip
def test_dry_run_is_honoured_wherever_it_is_given(argv, nothing_runs, monkeypatch, capsys, x86):
    """`tasks.py unit tests/test_masks.py --dry-run` passed `--dry-run` on to pytest and ran the
    steps (install included); `tasks.py test --dry-run` was refused."""
    monkeypatch.chdir(ROOT)
    assert tasks.main(argv) == 0
    out = capsys.readouterr().out
    assert "+ " in out and "--dry-run" not in out
    want = tasks.main(["--dry-run", *[a for a in argv if a not in ("--dry-run", "-n")]])
    assert want == 0 and capsys.readouterr().out == out  # the same plan as with it first


def test_paths_are_resolved_against_the_callers_directory(monkeypatch, capsys, tmp_path):
    """`cd chapters; python ../tools/tasks.py nbval 02_masks.ipynb` checked ROOT/02_masks.ipynb."""

    def planned(cwd: Path, *argv: str) -> str:
        monkeypatch.chdir(cwd)  # main() changes into the repository
        assert tasks.main(["--dry-run", *argv]) == 0
        return capsys.readouterr().out

    chapters, tests = ROOT / "chapters", ROOT / "tests"
    assert " --nbval chapters/02_masks.ipynb --nbval-sanitize-with" in planned(
        chapters, "nbval", "02_masks.ipynb")
    execute = planned(chapters, "execute", "02_masks.ipynb", "../chapters/01_attention.ipynb")
    assert " chapters/02_masks.ipynb chapters/01_attention.ipynb\n" in execute
    # pytest's node ids keep their test name; "." is the folder the caller is in
    assert planned(tests, "unit", "test_masks.py::test_x", ".").endswith(
        " -q tests/test_masks.py::test_x tests\n")
    assert planned(tests, "lint", "..").endswith("ruff check .\n")
    # outside the repository: the absolute path
    (tmp_path / "test_mine.py").write_text("")
    mine = (tmp_path / "test_mine.py").resolve()
    assert planned(tmp_path, "unit", "test_mine.py").endswith(f" -q {mine}\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["nbval", "02_masks.ipynb"], "no such file or directory: '02_masks.ipynb' (in "),
    (["unit", "--", "-k", "masks"], "takes paths, not options"),
    (["unit", "-k", "masks"], "unrecognized arguments: -k"),
    (["execute", "chapters"], "execute takes notebooks (.ipynb)"),
    (["envcheck", "--all"], "unrecognized arguments: --all"),
    (["envcheck", "all"], "takes no arguments"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_anything_runs(argv, message, nothing_runs, capsys,
                                                        monkeypatch):  # fmt: skip
    """A path that is not there, an option the runner would have passed on as a path, or an
    argument a task ignores (envcheck took any and ran anyway): a usage error, nothing run."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exc:
        tasks.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_test_emulated_refuses_a_cpu_it_cannot_imitate(nothing_runs):
    """The variables only lower x86 instruction sets: on an ARM machine the run would check
    the machine's own CPU while saying "emulated CPU: baseline"."""
    for machine in ("arm64", "aarch64"):
        r = tasks.Runner(dry_run=True, installed=True, machine=machine)
        with pytest.raises(tasks.TaskError, match=f"x86 .* this {machine} machine"):
            tasks.test_emulated(r, [])
        assert r.log == []
    r = tasks.Runner(dry_run=True, installed=True, machine="AMD64")  # Windows says so
    tasks.test_emulated(r, ["avx2"])
    assert sum("--nbval" in line for line in r.log) == 1


def test_test_emulated_refuses_avx512_on_a_cpu_without_it(nothing_runs, monkeypatch):
    """The variables only lower: on an AVX2 CPU "avx512" would run the AVX2 kernels."""
    monkeypatch.setattr(tasks, "cpu_flags", lambda: {"avx2", "fma"})
    r = tasks.Runner(dry_run=True, installed=True, machine="x86_64")
    with pytest.raises(tasks.TaskError, match=r"\['avx512'\] needs \['avx512f'\]"):
        tasks.test_emulated(r, ["baseline", "avx512"])
    assert r.log == []
    tasks.test_emulated(r, ["avx2"])  # what it can imitate still runs
    monkeypatch.setattr(tasks, "cpu_flags", lambda: None)  # no /proc/cpuinfo: cannot tell
    tasks.test_emulated(r, ["avx512"])
    assert sum("--nbval" in line for line in r.log) == 2


# ------------------------------------------------------------------------------ Makefile


def _make_targets() -> dict[str, list[str]]:
    """target -> recipe lines of the Makefile."""
    targets: dict[str, list[str]] = {}
    current = None
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z][\w.-]*)\s*:(?!=)", line)
        if m and not line.startswith(".PHONY"):
            current = m.group(1)
            targets[current] = []
        elif line.startswith("\t") and current:
            targets[current].append(line.strip())
    return targets


def test_every_make_target_delegates_to_its_task():
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^TASKS := \$\(PYTHON\) tools/tasks.py$", text, re.M)
    targets = _make_targets()
    assert set(targets) == set(tasks.TASKS)
    for name, recipe in targets.items():
        arguments = {"execute": " $(NB)", "test-emulated": " $(CPU)"}.get(name, "")
        expected = f"$(TASKS) {name}{arguments}"
        assert recipe == [expected], f"make {name} runs {recipe}, not the task"
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
    assert set(phony) == set(targets)


def test_ci_run_calls_make_test():
    lines = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # The README's test command, then the same checks on an imitated older CPU (less the
    # chapters that train for minutes: under 30 minutes on two cores).
    assert lines[-2:] == ["make test", "make test-emulated-quick"]


def test_test_emulated_quick_leaves_out_only_the_long_chapters(capsys, monkeypatch):
    monkeypatch.setattr(tasks, "cpu_flags", lambda: {"avx2"})
    r = tasks.Runner(dry_run=True, installed=True, machine="x86_64")
    tasks.test_emulated_quick(r, [])
    log = "\n".join(r.log)
    assert "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2" in log
    nbval = [line for line in r.log if "--nbval" in line]
    assert len(nbval) == 1
    every = {p.stem for p in (ROOT / "chapters").glob("*.ipynb")}
    ran = {name for name in every if f"chapters/{name}.ipynb" in nbval[0]}
    assert every - ran == set(tasks.LONG_CHAPTERS)
    assert sum("pytest -n 2" in line for line in r.log) == 1  # every unit test, once
    r = tasks.Runner(dry_run=True, installed=True, machine="arm64")
    with pytest.raises(tasks.TaskError, match="x86"):
        tasks.test_emulated_quick(r, [])


def test_test_emulated_runs_unit_and_nbval_under_each_imitated_cpu(capsys, monkeypatch):
    monkeypatch.setattr(tasks, "cpu_flags", lambda: {"avx2", "avx512f"})
    r = tasks.Runner(dry_run=True, installed=True, machine="x86_64")
    tasks.test_emulated(r, ["avx2", "baseline", "avx512"])
    said = [line.split(" (")[0] for line in r.log if line.startswith("# emulated CPU")]
    assert said == ["# emulated CPU: avx2", "# emulated CPU: baseline", "# emulated CPU: avx512"]
    assert "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2" in "".join(r.log)
    # AVX-512 without bf16: oneDNN stops at AVX512_CORE, below AVX512_CORE_BF16
    assert ("ATEN_CPU_CAPABILITY=avx512 MKL_ENABLE_INSTRUCTIONS=AVX512 "
            "ONEDNN_MAX_CPU_ISA=AVX512_CORE") in "".join(r.log)
    assert sum("pytest -n 2" in line for line in r.log) == 3  # unit, once per CPU
    # less the tests of files and documents, which no CPU changes (and which exist)
    assert all(f"--ignore={t}" in line for t in tasks.FILES_AND_DOCUMENTS
               for line in r.log if "pytest -n 2" in line)
    assert all((tasks.ROOT / t).is_file() for t in tasks.FILES_AND_DOCUMENTS)
    assert sum("--nbval" in line for line in r.log) == 3
    assert r.env.get("ATEN_CPU_CAPABILITY") == os.environ.get("ATEN_CPU_CAPABILITY")  # restored
    with pytest.raises(tasks.TaskError, match="unknown emulated CPU"):
        tasks.test_emulated(r, ["arm"])
    for env in tasks.EMULATED_CPUS.values():
        assert set(env) == {"ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"}


# ------------------------------------------------------------------------------ envcheck


def test_envcheck_prints_every_section_and_exits_0():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "envcheck.py")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for section in ("[system]", "[python]", "[torch]", "[packages]", "[data]", "[repository]"):
        assert section in out
    for line in ("os: ", "version: CPython", "threads: ", "bf16 matmul (CPU): ",
                 "bf16 autocast (CPU): ", "bf16 native (CPU): ", "multi30k files found: ",
                 "commit: "):  # fmt: skip
        assert f"\n  {line}" in out, line
    import torch

    assert f"version: {torch.__version__}" in out
    assert re.search(r"^ {2}\d+ of \d+ match constraints\.txt", out, re.M)
    assert re.search(r"^ {2}.. torch +\S+ +pin 2\.13\.0$", out, re.M)
    assert out.rstrip().endswith("```")


def test_envcheck_marks_a_mismatched_pin(monkeypatch):
    # Every other package "installed" at its pin, whatever this environment holds.
    pins = envcheck.read_pins(ROOT / "constraints.txt")

    def fake(name: str) -> str:
        if name == "torch":
            return "1.0.0"
        if name == "ruff":
            raise envcheck.metadata.PackageNotFoundError(name)
        return pins[name] + ("+cpu" if name == "numpy" else "")

    monkeypatch.setattr(envcheck.metadata, "version", fake)
    lines = envcheck.packages()
    assert "mismatched or missing (!!): ruff, torch" in lines[0]
    torch_line = next(line for line in lines if line.split()[1:2] == ["torch"])
    assert torch_line.startswith("!!") and "1.0.0" in torch_line
    assert next(line for line in lines if " ruff " in line).split()[2] == "missing"
    assert lines[0].startswith(f"{len(pins) - 2} of {len(pins)} match")


def test_envcheck_accepts_the_cpu_local_label_and_reads_pins(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("# header\nTorch==2.13.0\nsphinx_book_theme==1.3.0  # why\n\n")
    assert envcheck.read_pins(path) == {"torch": "2.13.0", "sphinx-book-theme": "1.3.0"}


def test_envcheck_reports_a_failing_section_and_goes_on(monkeypatch):
    def broken() -> list[str]:
        raise RuntimeError("boom")

    monkeypatch.setattr(envcheck, "SECTIONS", [("torch", broken), ("system", envcheck.system)])
    text = envcheck.report()
    assert "SECTION FAILED: RuntimeError: boom" in text
    assert "[system]" in text
