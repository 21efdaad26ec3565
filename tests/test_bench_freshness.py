"""The committed benchmark results were measured on the code they describe.

Each file in ``results/bench_*.json`` records the commit it was measured at. A result is
stale when the code it measures (the model code, the decoder, the shipped weights, the
benchmark itself) is no longer the code of that commit: the appendix would then show numbers
of code that no longer exists. Only what runs counts: a Python file is compared by its syntax
tree without docstrings (comments never reach the tree), so correcting a sentence in a
docstring does not call for an hour of benchmarks, while any change to a statement, a
default or a type hint does. Other files (the shipped weights and their card) are compared
byte for byte. The fix for a stale result is to re-run the benchmark (``bench/README.md``),
not to edit the commit in the file.

Needs the git history (a shallow clone cannot say which commit is older: the CI workflows
check out with ``fetch-depth: 0``); without git or outside a checkout the test is skipped.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# what one step of training computes: chapters 1 to 6's modules (training.py holds the step
# with its gradient clipping; it imports the masks of chapter 2)
# The model's forward pass (what translating and decoding run), and with the training step
# (chapter 6) what the training benchmarks run.
FORWARD = [f"transformer_lib/{name}.py"
           for name in ("attention", "masks", "multihead", "positional", "layers", "model")]
MODEL = FORWARD + ["transformer_lib/training.py", "transformer_lib/fused_loss.py"]
# the training benchmark's own modules, its timing (common.py) included. Not compared: the
# trainer's modules it also imports (translation/config.py for the clip norm's value,
# translation/data.py for the bucketing experiment's batches, translation/precision.py for
# the machine description); chapter 9 and bench/README.md say so.
TRAIN_BENCH = [f"bench/{name}.py"
               for name in ("train_throughput", "train_models", "train_steps", "micro", "flops",
                            "common")]
SHIPPED = ["transformer_lib/pretrained", "transformer_lib/decoding.py",
           "transformer_lib/translation/inference.py", "transformer_lib/translation/quantize.py",
           "transformer_lib/translation/pretrained.py", "transformer_lib/translation/scoring.py",
           "transformer_lib/translation/_finite.py", "transformer_lib/translation/fast_beam.py"]
TRANSLATE_BENCH = ["bench/translate.py", "bench/ct2_convert.py", "bench/op_profile.py"]
TRAINER = ["transformer_lib/translation/loop.py", "transformer_lib/translation/config.py",
           "transformer_lib/translation/precision.py", "transformer_lib/translation/data.py"]

MEASURED = {
    "bench_train.json": MODEL + TRAIN_BENCH,
    "bench_train_avx2.json": MODEL + TRAIN_BENCH,
    "bench_train_epyc.json": MODEL + TRAIN_BENCH,  # the other CPU kind
    "bench_quality.json": MODEL + TRAINER + ["bench/fast_setting_quality.py"],
    "bench_attention.json": ["transformer_lib/attention.py", "bench/attention_scaling.py"],
    "bench_decode.json": FORWARD + ["transformer_lib/decoding.py", "bench/decode.py"],
    "bench_translate.json": FORWARD + SHIPPED + TRANSLATE_BENCH,
    "bench_translate_xeon.json": FORWARD + SHIPPED + TRANSLATE_BENCH,
    "bench_rnn.json": MODEL + ["transformer_lib/gru.py", "bench/rnn_speed.py"],
}
# Changes made after a result was measured and read, line by line, as not changing what its
# benchmark times: code moved between cells (chapters 1 and 3 now show a short lesson and fold
# the package's version), argument checks run once per call before the timed work. They are
# not measurements, so they are few, named here and in chapter 9 beside the results, each
# needed by a result older than REVIEWED_AT (tested below), and the benchmarks owe a re-run
# (bench/README.md), which makes these entries unnecessary. Each names
# the commit holding the reviewed code: a file is compared with that commit's version instead
# of the measured one, so any later change to it makes the results stale again.
REVIEWED_AT = "27d177f6e62fbcc00c6f6efc98e56b128f2a84fe"
REVIEWED: dict[str, str] = {}  # none now: the results older than REVIEWED_AT were re-run
# Changes read, line by line, as code a benchmark never runs, for the results named: chapter
# 5's Dropout draws its training masks from random bits since NOT_RUN_AT, and the translation
# and decoding benchmarks run every model in evaluation mode, where Dropout returns its input
# before reaching that code. The file is compared with NOT_RUN_AT's version for those results
# only (any later change to it makes them stale again); the training results, which run it,
# were re-measured.
NOT_RUN_AT = "6b5ca901c53651d486a89d888e73bfa7c4a6a9c0"
NOT_RUN = {
    "transformer_lib/layers.py": (
        "Dropout's training-mode mask (16 random bits per entry); evaluation returns x first",
        {"bench_decode.json", "bench_translate.json", "bench_translate_xeon.json",
         "experiments/decode_speed/results.json", "experiments/product_engine/results.json"},
    ),
}
# records outside results/ whose times a chapter shows (chapter 9), by path
EXPERIMENTS = {
    "experiments/decode_speed/results.json": FORWARD + SHIPPED + [
        "experiments/decode_speed/sketch.py"],
    "experiments/train_step_speed/results.json": MODEL + TRAIN_BENCH + [
        "experiments/train_step_speed/sketch.py"],
    "experiments/product_engine/results.json": FORWARD + SHIPPED + [
        "experiments/product_engine/sketch.py"],
    "experiments/product_engine/results_epyc.json": FORWARD + SHIPPED + [
        "experiments/product_engine/sketch.py"],  # the other CPU kind
    # chapter 7's search under bf16 autocast against fast_beam, through translate_sentences
    "experiments/translate_precision/results_epyc.json": FORWARD + SHIPPED + [
        "transformer_lib/translation/precision.py", "experiments/translate_precision/sketch.py"],
    # the same code timed against itself, and the model alone, in blocks and unit by unit
    "experiments/round_noise/results_epyc.json": MODEL + SHIPPED + TRAIN_BENCH + [
        "experiments/round_noise/sketch.py"],
    # translation with chapter 1's attention for the new position, and with larger batches
    "experiments/decode_levers/results_epyc.json": FORWARD + SHIPPED + [
        "experiments/decode_levers/sketch.py"],
}


def git(*args: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=text,
                          check=False)


def code_of(data: bytes, path: str) -> bytes | str:
    """What runs: a Python file's syntax tree without its docstrings; other files as they are."""
    if not path.endswith(".py"):
        return data
    tree = ast.parse(data.decode("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def code_changes(commit: str, paths: list[str], result: str = "") -> list[str]:
    """The measured files whose code differs between ``commit`` and the working tree (a file
    in REVIEWED: between REVIEWED_AT and the working tree, when the measurement is older; a
    file NOT_RUN by `result`: between NOT_RUN_AT and the working tree, likewise)."""
    names = git("diff", "--name-only", commit, "--", *paths).stdout.split()
    reviewed_later = git("merge-base", "--is-ancestor", commit, REVIEWED_AT).returncode == 0
    not_run_later = git("merge-base", "--is-ancestor", commit, NOT_RUN_AT).returncode == 0
    changed = []
    for name in names:
        now = ROOT / name
        if not now.exists():
            changed.append(name)  # deleted since
            continue
        base = REVIEWED_AT if name in REVIEWED and reviewed_later else commit
        if not_run_later and result in NOT_RUN.get(name, ("", set()))[1]:
            base = NOT_RUN_AT
        then = git("show", f"{base}:{name}", text=False)  # fails: added since
        if then.returncode != 0 or code_of(then.stdout, name) != code_of(now.read_bytes(), name):
            changed.append(name)
    return changed


def test_code_of_ignores_docstrings_and_comments_not_code():
    base = b'"""Module."""\ndef f(x):\n    """Doubles."""\n    return 2 * x\n'
    reworded = b'"""Module, reworded."""\ndef f(x):  # why\n    """Twice x."""\n    return 2 * x\n'
    changed = b'"""Module."""\ndef f(x):\n    """Doubles."""\n    return x + x\n'
    only_doc = b'def f(x):\n    """Nothing."""\n'
    assert code_of(base, "m.py") == code_of(reworded, "m.py")
    assert code_of(base, "m.py") != code_of(changed, "m.py")
    assert code_of(only_doc, "m.py") == code_of(b"def f(x):\n    pass\n", "m.py")
    assert code_of(base, "card.md") != code_of(reworded, "card.md")  # bytes, as they are


@pytest.fixture(scope="module")
def history() -> None:
    if shutil.which("git") is None or git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: no history to compare the results' commits with")
    shallow = git("rev-parse", "--is-shallow-repository").stdout.strip()
    assert shallow == "false", (
        "a shallow clone cannot tell which commit is older; fetch the whole history "
        "(git fetch --unshallow, or actions/checkout with fetch-depth: 0)")


def test_every_committed_benchmark_has_its_measured_files():
    """A new results file needs an entry above (else nothing checks its freshness), and every
    listed source exists (a renamed module would silently check nothing)."""
    committed = {p.name for p in (ROOT / "results").glob("bench_*.json")}
    assert committed <= set(MEASURED), committed - set(MEASURED)
    for name, paths in {**MEASURED, **EXPERIMENTS}.items():
        missing = [p for p in paths if not (ROOT / p).exists()]
        assert not missing, (name, missing)
    measured = {p for paths in {**MEASURED, **EXPERIMENTS}.values() for p in paths}
    # a reviewed file is one a result measures (or inside a measured folder)
    unmeasured = [r for r in REVIEWED if not any(r == m or r.startswith(m + "/")
                                                 for m in measured)]
    assert not unmeasured, unmeasured


def measured_before(name: str, commit: str) -> bool:
    """Whether the committed result `name` was measured at `commit` or an ancestor of it
    (False when it is not committed)."""
    path = ROOT / name if name in EXPERIMENTS else ROOT / "results" / name
    if not path.exists():
        return False
    measured = json.loads(path.read_text(encoding="utf-8"))["git_commit"]
    return git("merge-base", "--is-ancestor", measured, commit).returncode == 0


def test_every_reviewed_file_is_needed_by_an_older_result(history):
    """A REVIEWED entry stands in for a measurement only where a result predates it: once
    every result measuring a file is newer than REVIEWED_AT, the entry must go (else the list
    names readings nothing relies on)."""
    older = [paths for name, paths in {**MEASURED, **EXPERIMENTS}.items()
             if measured_before(name, REVIEWED_AT)]
    unneeded = [r for r in REVIEWED
                if not any(r == m or r.startswith(m + "/") for ps in older for m in ps)]
    assert not unneeded, f"no result older than REVIEWED_AT measures {unneeded}: drop them"


def test_every_not_run_reading_is_needed_and_names_real_results(history):
    """A NOT_RUN entry stands in for a measurement only for results that measure the file and
    predate NOT_RUN_AT; once none does, it must go."""
    assert git("cat-file", "-e", f"{NOT_RUN_AT}^{{commit}}").returncode == 0, NOT_RUN_AT
    for path, (_, results) in NOT_RUN.items():
        for name in results:
            paths = EXPERIMENTS.get(name) or MEASURED[name]  # a KeyError names a typo
            assert path in paths, (name, path)
        needed = [name for name in results if measured_before(name, NOT_RUN_AT)]
        assert needed, f"no result older than NOT_RUN_AT relies on {path}: drop it"


@pytest.mark.parametrize("name", sorted(MEASURED) + sorted(EXPERIMENTS))
def test_committed_result_is_newer_than_the_code_it_measures(history, name):
    path = ROOT / name if name in EXPERIMENTS else ROOT / "results" / name
    measured = EXPERIMENTS.get(name) or MEASURED[name]
    name = str(path.relative_to(ROOT))
    if not path.exists():
        pytest.skip(f"{name} is not committed")
    commit = json.loads(path.read_text(encoding="utf-8"))["git_commit"]
    assert not commit.endswith("-dirty"), (
        f"{name} was measured on uncommitted code ({commit}); re-run it on a clean "
        "checkout")
    assert git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0, (
        f"{name} names commit {commit}, which is not in this history")
    changed = code_changes(commit, measured, path.name if name.startswith("results/") else name)
    diff = git("diff", "--stat", commit, "--", *changed).stdout if changed else ""
    assert not changed, (
        f"{name} was measured at {commit[:12]}; the code it measures has changed since "
        f"in {changed}; re-run the benchmark (bench/README.md) or the experiment:\n{diff}")
