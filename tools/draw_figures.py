"""Draw the book's explanatory pictures as SVG files in ``book/figures/``.

The drawings are ours, written as plain SVG XML by the package ``tools/figures/`` (standard
library only: ``svg.py`` is the drawing library, the other modules draw one chapter or topic
each), so that a picture can be changed there and regenerated, and building the book needs no
drawing tool.

    python tools/draw_figures.py           # (re)write every file in book/figures/
    python tools/draw_figures.py --check   # exit 1 if a committed drawing differs from this script

Every drawing has a <title> and a <desc>, a viewBox about 640-900 units wide (one page column),
generic font families only, and no external reference. Each box's label is checked against an
estimate of its width in DejaVu Sans (the widest common sans-serif), so a label that would
overflow its box fails here instead of on the page. Output is deterministic: the same script
always writes the same bytes (numbers are rounded, nothing random, no dates).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import drawings  # noqa: E402  (the package beside this script, not installed)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "figures"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a drawing is stale")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the SVG files")
    args = parser.parse_args(argv)
    stale = []
    for name, text in drawings().items():
        path, data = args.out / name, text.encode("utf-8")
        # bytes, not text: a copy with other line endings is stale too
        if path.exists() and path.read_bytes() == data:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if args.check and stale:
        print(
            f"stale drawings in {args.out} (run python tools/draw_figures.py): " + ", ".join(stale)
        )
        return 1
    if not args.check:
        print(f"wrote {len(stale)} drawing(s) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
