"""transformer_lib.translation.provenance: the one record of where a result came from, and the
tools that record it (bench/common.py, tools/envcheck.py)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _tools import load_tool

from transformer_lib import translation
from transformer_lib.translation import provenance as prov

ROOT = Path(__file__).resolve().parents[1]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_the_record_has_every_field_and_is_json():
    p = prov.provenance()
    assert set(p) == {"commit", "dirty", "machine", "torch", "python"}
    assert set(p["machine"]) == {"cpu_model", "cpu_flags", "logical_cores", "os", "bf16_native"}
    assert json.loads(json.dumps(p)) == p
    if p["commit"] is not None:  # a git checkout (CI, a clone); None in an unpacked archive
        assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["dirty"], bool)
    m = p["machine"]
    assert m["cpu_model"] and m["logical_cores"] == os.cpu_count()
    assert m["cpu_flags"] == sorted(m["cpu_flags"]) and set(m["cpu_flags"]) <= prov.CPU_FLAGS
    assert m["bf16_native"] == (translation.resolve_precision("auto", "cpu") == "bf16")
    assert p["torch"]["version"] == torch.__version__
    assert p["torch"]["threads"] == torch.get_num_threads()
    assert p["python"] == ".".join(map(str, sys.version_info[:3]))


def test_no_git_or_no_repository_gives_commit_none(monkeypatch, tmp_path):
    assert prov.provenance(tmp_path)["commit"] is None  # not a checkout
    (tmp_path / ".git").mkdir()  # looks like one, but git says no
    assert prov.provenance(tmp_path)["commit"] is None

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(prov.subprocess, "run", no_git)
    p = prov.provenance()
    assert p["commit"] is None and p["dirty"] is None
    assert p["machine"]["cpu_model"]  # the rest is still recorded


def test_no_proc_cpuinfo_as_on_macos_and_windows(monkeypatch):
    real = pathlib.Path.read_text

    def read_text(self, *args, **kwargs):
        if str(self) == "/proc/cpuinfo":
            raise FileNotFoundError(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(prov.sys, "platform", "win32")
    m = prov.provenance()["machine"]
    assert m["cpu_flags"] == [] and isinstance(m["cpu_model"], str) and m["cpu_model"]


@needs_git
def test_commit_and_what_counts_as_dirty(tmp_path):
    def git(*args: str) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "experiments" / "e" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "r.json").write_text("{}\n")
    records = [tmp_path / "experiments" / "a.json", tmp_path / "experiments" / "e" / "r.json",
               tmp_path / "experiments" / "e" / "results" / "r.json"]
    config = tmp_path / "experiments" / "e" / "config.toml"
    for path in [*records, config]:
        path.write_text("{}\n")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    p = prov.provenance(tmp_path)
    assert p["commit"] == git("log", "-1", "--format=%H") and p["dirty"] is False
    (tmp_path / "results" / "r.json").write_text('{"new": 1}\n')  # what the tools write
    for path in records:  # another experiment's record, not committed yet
        path.write_text('{"new": 1}\n')
    (tmp_path / "untracked.py").write_text("y = 2\n")
    assert prov.provenance(tmp_path)["dirty"] is False
    config.write_text("lr = 2\n")  # an experiment's config is what runs
    assert prov.provenance(tmp_path)["dirty"] is True
    git("checkout", "-q", "--", str(config))
    (tmp_path / "code.py").write_text("x = 2\n")  # code that runs
    assert prov.provenance(tmp_path)["dirty"] is True


def test_git_rev_parse_is_called_in_one_place():
    hits = [p.relative_to(ROOT).as_posix()
            for d in ("bench", "tools", "transformer_lib") for p in (ROOT / d).rglob("*.py")
            if "rev-parse" in p.read_text(encoding="utf-8")]
    assert hits == ["transformer_lib/translation/provenance.py"]


def test_write_provenance_at_start_and_on_resume(tmp_path):
    run = tmp_path / "run"
    path = prov.write_provenance(run)
    start = json.loads(path.read_text(encoding="utf-8"))
    assert path == run / "provenance.json" and start["recorded_at"] == "start"
    assert {k: start[k] for k in ("commit", "machine")} == {
        k: prov.provenance()[k] for k in ("commit", "machine")}
    assert prov.read_provenance(run) == start
    prov.write_provenance(run, resume=True)
    prov.write_provenance(run, resume=True)
    resumed = prov.read_provenance(run)
    assert {k: resumed[k] for k in start} == start  # the start's record is kept
    assert len(resumed["resumes"]) == 2 and "date" in resumed["resumes"][0]
    assert sorted(p.name for p in run.iterdir()) == ["provenance.json"]  # no temporary left
    prov.write_provenance(run)  # a new run in the directory: a new record
    assert "resumes" not in prov.read_provenance(run)


def test_resume_without_a_record_and_damaged_records(tmp_path):
    assert prov.read_provenance(tmp_path) is None
    prov.write_provenance(tmp_path, resume=True)
    assert prov.read_provenance(tmp_path)["recorded_at"] == "resume"  # the start is unknown
    for text in ("{not json", "[1, 2]", '{"date": "x"}'):
        (tmp_path / "provenance.json").write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match="provenance.json"):
            prov.read_provenance(tmp_path)
    prov.write_provenance(tmp_path, resume=True)  # a damaged record does not stop a resume
    assert prov.read_provenance(tmp_path)["recorded_at"] == "resume"


def test_the_benchmarks_record_the_same_provenance():
    from bench import common

    p, m = prov.provenance(), common.machine_description()
    assert {k: m[k] for k in ("cpu_model", "cpu_flags", "logical_cores", "bf16_native")} == {
        k: p["machine"][k] for k in ("cpu_model", "cpu_flags", "logical_cores", "bf16_native")}
    assert (m["torch_version"], m["torch_threads"]) == (p["torch"]["version"],
                                                         p["torch"]["threads"])
    commit = common.git_commit()
    expected = "unknown" if p["commit"] is None else p["commit"] + "-dirty" * bool(p["dirty"])
    assert commit == expected


def test_envcheck_prints_the_record():
    envcheck = load_tool("envcheck")
    printed = json.loads("\n".join(envcheck.provenance()))
    assert printed.keys() == prov.provenance().keys()
    assert printed["commit"] == prov.provenance()["commit"]
    assert "[provenance]" in envcheck.report()


def test_envcheck_records_provenance_when_torch_is_broken():
    """The record is read from its file, standard library only: a broken install still
    gets its commit and machine reported."""
    code = (
        "import sys; sys.modules['torch'] = None\n"  # `import torch` now fails
        "sys.path.insert(0, 'tests'); from _tools import load_tool\n"
        "e = load_tool('envcheck'); print(e.repository()); print('\\n'.join(e.provenance()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "commit: " in done.stdout
    record = json.loads(done.stdout.split("\n", 1)[1])
    assert record["torch"]["version"] is None and "error" in record["torch"]
    assert record["machine"]["bf16_native"] is None and record["machine"]["cpu_model"]
