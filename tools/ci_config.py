"""Print _config.yml with notebook execution off: `make test` renders the stored outputs,
which nbval has just compared against a fresh execution, instead of running every chapter twice."""

from pathlib import Path

text = (Path(__file__).resolve().parents[1] / "_config.yml").read_text(encoding="utf-8")
assert "execute_notebooks: force" in text, (
    "_config.yml no longer forces execution; update tools/ci_config.py"
)
print(text.replace("execute_notebooks: force", "execute_notebooks: 'off'"))
