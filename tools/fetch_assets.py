"""Put the JavaScript the built book needs on the site itself, so it renders offline.

- Vega + Vega-Lite + vega-embed: taken from the installed `vl-convert-python` (pinned in
  constraints.txt), written to book/_static/vega-bundle.js, which Jupyter Book adds to every page.
- MathJax 3: the pinned npm tarball, unpacked into book/assets/mathjax (copied to the site root
  through `html_extra_path`; not under _static, whose every .js file would be put on every page).

Both outputs are generated, not committed (.gitignore). Run by `make book` and `make test`.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATHJAX = "mathjax@3.2.2"


def vega_bundle() -> None:
    import vl_convert

    out = ROOT / "book" / "_static" / "vega-bundle.js"
    out.parent.mkdir(parents=True, exist_ok=True)
    # A function scope keeps the bundle's top-level `const`s from clashing with Sphinx's scripts;
    # the bundle itself publishes window.vegaEmbed, window.vega and window.vegaLite.
    text = "/* vega, vega-lite, vega-embed via vl-convert-python */\n(function () {\n"
    text += vl_convert.javascript_bundle() + "\n})();\n"
    if not out.exists() or out.read_text(encoding="utf-8") != text:
        out.write_text(text, encoding="utf-8")


def mathjax() -> None:
    dest = ROOT / "book" / "assets" / "mathjax"
    if (dest / "tex-mml-chtml.js").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("npm is needed once to fetch MathJax 3 (apt-get install npm, or install Node.js)")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([npm, "pack", MATHJAX, "--silent", "--pack-destination", tmp], check=True,
                       stdout=subprocess.DEVNULL)
        (tgz,) = Path(tmp).glob("mathjax-*.tgz")
        with tarfile.open(tgz) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith("package/es5/")]
            tar.extractall(tmp, members=members, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(Path(tmp) / "package" / "es5", dest)


def main(argv: list[str] | None = None) -> None:
    # no options: the parser is there so that --help prints this instead of fetching
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            epilog="Run by `make book` and `make test`; takes no options.",
                            ).parse_args(argv)
    vega_bundle()
    mathjax()
    digest = hashlib.sha256((ROOT / "book/_static/vega-bundle.js").read_bytes()).hexdigest()[:12]
    print(f"assets ready: vega-bundle.js ({digest}), mathjax ({MATHJAX})")


if __name__ == "__main__":
    main()
