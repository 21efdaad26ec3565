"""Chapters 2 and 8 run top to bottom in a Colab-like environment, set up by their own first cell.

tools/colab_check.py does the work, with no shortcut: what `git archive HEAD` holds (the wheel is
built from it, its files are served on 127.0.0.1), a new virtual environment with Colab's
preinstalled kernel, widgets, pandas and Altair, the notebook alone in an empty folder, executed
by a kernel of that environment with the setup cell's own pip line. Afterwards every version
installed before is unchanged and none of the book's build tools was installed. The kernel's
failure message for a dead address is checked in the same Colab-like kernel (IPython 7.34).

Minutes, not seconds (pip installs the environment; its download cache, the user's, is kept
between runs). It needs the network (PyPI) as `make install` does.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from _tools import load_tool

colab = load_tool("colab_check")
setup = load_tool("notebook_setup")

# Chapters 2 and 8 from the folder a reader opens in Colab (colab_check.NOTEBOOKS).
NOTEBOOKS = colab.DEFAULT_NOTEBOOKS
# Colab's kernel and widgets: the versions a reader's running kernel must keep.
KERNEL = ("ipython", "ipykernel", "ipywidgets", "jupyter-client", "pandas", "altair", "torch")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("ATEN_CPU_CAPABILITY")),
    reason="the Colab kernels' environment is built from scratch, without the imitated CPU's "
    "settings: the emulated run would repeat the same check",
)


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then released: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dead_address_output(
    report_venv: Path, work: Path, wheel: Path, data_url: str
) -> tuple[list, str]:
    """The setup cell alone, run in a Colab-like kernel with a files address nobody answers."""
    python = colab.venv_python(report_venv)
    folder = work / "dead-address" / "content"
    folder.mkdir(parents=True)
    book = setup.read_book()
    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    setup.update(nb, book)
    nb["cells"][0]["source"] = setup.setup_source(book, ["results/multi30k.json"])
    setup.write_notebook(folder / "setup.ipynb", nb)
    dead = f"http://127.0.0.1:{_closed_port()}"
    env = colab.kernel_env(python, work / "dead-address" / "home", wheel, dead, data_url)
    error = colab.execute(folder / "setup.ipynb", python, env, timeout=300)
    assert error, "the cell went on without its files"
    ran = json.loads((folder / "setup.ipynb").read_text(encoding="utf-8"))
    return ran["cells"][0]["outputs"], dead


@pytest.mark.multi30k
def test_chapters_run_in_colab_and_leave_its_kernel_alone(tmp_path):
    from transformer_lib.translation.data import default_data_dir

    start = time.monotonic()
    timings = {}
    with colab.colab_run(tmp_path, default_data_dir()) as (archive, base, wheel, urls):
        timings["environment"] = time.monotonic() - start
        reports = []
        for name in NOTEBOOKS:
            report = colab.check_notebook(name, archive, base, wheel, urls, tmp_path)
            print("\n".join(report.lines()))
            timings[name] = report.seconds
            reports.append(report)
        outputs, dead = _dead_address_output(tmp_path / "02_masks" / "venv", tmp_path, wheel,
                                             urls[1])  # fmt: skip
    print("seconds:", {k: round(v) for k, v in timings.items()})
    for report in reports:
        assert not report.error, f"{report.notebook}: {report.error}"
        assert "Ready: run the chapter's cells in order." in report.setup_output
        for name in KERNEL:
            assert report.before[name].startswith(colab.COLAB[name]), name  # torch: +cpu
        assert not report.changed, f"{report.notebook} changed Colab's packages: {report.changed}"
        assert not report.build_tools, f"{report.notebook} installed {report.build_tools}"
        assert report.after[colab.normalize(setup.read_book().dist)]  # the cell installed it
    # A dead address: one error output, one line naming the file's address and what to do.
    errors = [o for o in outputs if o["output_type"] == "error"]
    assert len(errors) == 1 and errors[0]["ename"] == "SetupFailed", outputs
    (line,) = errors[0]["traceback"]
    assert line.startswith(f"Setup failed: could not fetch {dead}/results/multi30k.json ("), line
    assert line.endswith("Check the network and the address, then run this cell again."), line
