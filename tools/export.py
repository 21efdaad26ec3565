"""Write the package from the chapters (the chapters are the single source of truth).

A chapter names its module once, in a code cell whose first line is ``#| default_exp NAME``.
Every code cell whose first line is ``#| export`` (or ``#| export OTHER`` to send it to another
module) is copied, in order, into ``transformer_lib/NAME.py``. The module's ``__all__`` lists its
public top-level names, and ``transformer_lib/__init__.py`` re-exports every module's ``__all__``
(chapter modules first, then the hand-written names of ``HANDWRITTEN``).

    python tools/export.py           # write the package
    python tools/export.py --check   # exit 1 and show a diff if the package is stale
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "transformer_lib"
# Hand-written modules re-exported from the package: module (relative to transformer_lib) ->
# the names to re-export, None for its whole ``__all__``. The translation subpackage's data,
# checkpoints and shipped model, and the partner of `load_pretrained`; the rest of
# `transformer_lib.translation` (and viz, which needs the `book` extra) by name only.
HANDWRITTEN: dict[str, list[str] | None] = {
    "translation.data": None,
    "translation.checkpoint": None,
    "translation.pretrained": None,
    "translation.inference": ["translate_sentences"],
}
# What each generated module holds: the first line of its docstring (a reader opening the file
# learns what it is before which chapter wrote it).
WHAT = {
    "attention": "Scaled dot-product attention, the masked softmax and the shared input checks",
    "masks": "Padding and causal (subsequent) masks",
    "multihead": "Multi-head attention, with the fused-kernel path",
    "positional": "Sinusoidal and learned positional encodings",
    "layers": "Embeddings, layer norm, residual sublayers, feed-forward, encoder and decoder",
    "model": "The encoder-decoder model and make_model",
    "training": "Batches, label smoothing, the Noam schedule and the training step",
    "fused_loss": "The generator, log-softmax and label-smoothed loss fused, for the training step",
    "decoding": "Greedy and beam-search decoding with a key/value cache",
    "gru": "The GRU encoder-decoder with additive attention: the baseline of chapter 8",
    "lm": "A decoder-only language model, sampling, and masked-token corruption",
    "attention_variants": "Grouped-query attention and rotary position embeddings (RoPE)",
    "modern": "Today's decoder block: RMSNorm, SwiGLU and a Llama-style language model",
}
HEADER = (
    '"""{what} (generated).\n\nWritten from {sources} ({doc})\nby tools/export.py: do not edit. '
    'Edit the chapter and run `make export`."""\n'
)


def _cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _directive(source: str) -> tuple[str, str] | None:
    """Return (directive, argument) for a cell starting with ``#| name arg``."""
    first = source.lstrip().split("\n", 1)[0].strip()
    if not first.startswith("#|"):
        return None
    parts = first[2:].split()
    return (parts[0], parts[1] if len(parts) > 1 else "") if parts else None


def _public_names(code: str) -> list[str]:
    names: list[str] = []
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_") and not n.isupper()]


def collect() -> dict[str, dict]:
    """Map module name -> {"cells": [...], "sources": [...], "doc": str}."""
    modules: dict[str, dict] = {}
    for nb_path in sorted(CHAPTERS.glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        default, title = None, nb_path.stem
        for cell in nb["cells"]:
            src = _cell_source(cell)
            if cell["cell_type"] == "markdown" and title == nb_path.stem:
                for line in src.splitlines():
                    if line.startswith("# "):
                        title = line[2:].strip()
                        break
            if cell["cell_type"] != "code":
                continue
            d = _directive(src)
            if d is None:
                continue
            name, arg = d
            if name == "default_exp":
                default = arg
            elif name == "export":
                target = arg or default
                if target is None:
                    raise SystemExit(f"{nb_path.name}: #| export before #| default_exp")
                body = src.lstrip().split("\n", 1)[1] if "\n" in src.lstrip() else ""
                mod = modules.setdefault(target, {"cells": [], "sources": [], "doc": title})
                mod["cells"].append(body.strip("\n"))
                rel = f"chapters/{nb_path.name}"
                if rel not in mod["sources"]:
                    mod["sources"].append(rel)
    return modules


def render(modules: dict[str, dict]) -> dict[Path, str]:
    files: dict[Path, str] = {}
    for name, mod in modules.items():
        code = "\n\n\n".join(mod["cells"]) + "\n"
        future = "from __future__ import annotations\n"
        has_future = future in code
        code = code.replace(future, "")
        names = _public_names(code)
        if name not in WHAT:
            raise SystemExit(f"tools/export.py: add a one-line description of {name!r} to WHAT")
        head = HEADER.format(what=WHAT[name], doc=mod["doc"], sources=", ".join(mod["sources"]))
        text = head + "\n" + (future + "\n" if has_future else "")
        text += f"__all__ = {names!r}\n\n" + code
        files[PACKAGE / f"{name}.py"] = text
    lines = [
        '"""transformer_lib: the Transformer of "Attention Is All You Need", chapter by chapter.',
        "",
        "Generated by tools/export.py: do not edit.",
        '"""',
        "",
    ]
    all_names: list[str] = []
    handwritten = [m for m in HANDWRITTEN if _module_path(m).exists()]
    for name in list(modules) + handwritten:
        if name in modules:
            names = _public_names("\n\n".join(modules[name]["cells"]))
        else:
            names = HANDWRITTEN[name] or _handwritten_all(_module_path(name))
        if names:
            lines.append(f"from .{name} import {', '.join(names)}")
            all_names += names
    lines += ["", f"__all__ = {all_names!r}", '__version__ = "0.1.0"', ""]
    files[PACKAGE / "__init__.py"] = "\n".join(lines)
    return files


def _module_path(name: str) -> Path:
    """The file of module `name`, dotted relative to the package ("translation.data")."""
    return PACKAGE.joinpath(*name.split(".")).with_suffix(".py")


def _handwritten_all(path: Path) -> list[str]:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def _format(files: dict[Path, str]) -> dict[Path, str]:
    """Run ruff's formatter so the generated files are stable and lint-clean."""
    import subprocess

    out = {}
    for path, text in files.items():
        res = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
            input=text, capture_output=True, text=True, cwd=ROOT,
        )
        if res.returncode != 0:
            raise SystemExit(f"ruff format failed on {path}:\n{res.stderr}")
        out[path] = res.stdout
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the package is stale")
    args = parser.parse_args()
    files = _format(render(collect()))
    stale = []
    for path, text in files.items():
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old == text:
            continue
        stale.append(path)
        if args.check:
            diff = difflib.unified_diff(
                old.splitlines(), text.splitlines(), str(path), "exported from chapters",
                lineterm="",
            )
            print("\n".join(list(diff)[:60]))
        else:
            path.write_text(text, encoding="utf-8")
    # A generated module whose chapter cells were all removed is stale too.
    generated = {p for p in PACKAGE.glob("*.py") if "Generated from chapters/" in p.read_text()}
    orphans = sorted(generated - set(files))
    for path in orphans:
        if args.check:
            print(f"{path.relative_to(ROOT)}: no chapter exports it any more")
        else:
            path.unlink()
    if args.check and (stale or orphans):
        print("transformer_lib is out of date with the chapters: run `make export`.")
        return 1
    if not args.check:
        print(f"wrote {len(stale)} file(s); removed {len(orphans)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
