"""The chapters' lesson versions of the package's components, read from the notebooks.

A chapter shows the short version of a component (the math and the shapes) and folds the
package's full version (input checks, fast kernels, cache hooks) below it. The tests that
prove the two compute the same run the lesson's cells from the committed notebook, found by
their cell ids, so the code compared is the code a reader reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformer_lib.training import LabelSmoothing

CHAPTERS = Path(__file__).resolve().parents[1] / "chapters"


def lesson(chapter: str, *cell_ids: str, namespace: dict[str, Any] | None = None) -> dict:
    """Run the code cells `cell_ids` of `chapters/<chapter>` (in that order) in `namespace`.

    `chapter` is the notebook's file name or its two-digit prefix ("03"). Returns the
    namespace, so `lesson("03", "mha-lesson")["MultiHeadedAttention"]` is the lesson's class.
    """
    (path,) = [p for p in sorted(CHAPTERS.glob("*.ipynb")) if p.name.startswith(chapter)]
    cells = {c.get("id"): c for c in json.loads(path.read_text(encoding="utf-8"))["cells"]}
    ns: dict[str, Any] = {} if namespace is None else namespace
    for cell_id in cell_ids:
        cell = cells.get(cell_id)
        if cell is None or cell["cell_type"] != "code":
            raise KeyError(f"{path.name} has no code cell with id {cell_id!r}")
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        exec(compile(source, f"{path.name}#{cell_id}", "exec"), ns)  # noqa: S102
    return ns


class PlainRoute(LabelSmoothing):
    """``LabelSmoothing`` that chapter 6's step scores the way the lesson does: through the
    generator's (N, vocab) log-probabilities. The step takes its fused route for
    ``LabelSmoothing`` itself only, so a subclass keeps it on the plain one (the two routes
    agree to rounding: tests/test_fused_loss.py)."""
