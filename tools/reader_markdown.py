"""MyST Markdown of a chapter cell -> the plain Markdown of Colab, JupyterLab and nbconvert.

Used by tools/reader_edition.py, which documents the whole reader edition. This module knows the
Markdown: which MyST constructs the chapters use and what each becomes.

- ``{glue:text}`name`` and ``{glue:text}`name:.2f``: the stored value, formatted as myst-nb's
  role formats it and curled as Sphinx's SmartQuotes curls it on the site; ``{glue:md}`name``:
  the stored Markdown (``{glue}`name``, which pastes the output itself, is refused);
- ``{cite}`a,b`` (``{cite:p}``): "(A et al., 2017; B and C, 2014)"; ``{cite:t}``: "A et al. (2017)";
- ``{numref}`label`` (or ``{numref}`Figure %s <label>``): "Fig. N", linked to the site's page;
- ```` ```{admonition} Title ```` with ``:class: dropdown``: ``<details><summary>Title</summary>``
  (closed) ... ``</details>``; without it, and the named admonitions (``{note}``, ``{tip}``, ...):
  a bold title over the body;
- ```` ```{figure} path ```` (:alt:, :width:, :name:, :align:): the image embedded as a data: URI
  (the notebook must work alone: Colab opens one file from GitHub, a download is one file, and
  JupyterLab's attachment resolver refuses SVG) with its caption in italics below;
- links to chapters and book pages: the site's page; links to other files of the repository:
  the file on GitHub.

Anything else in braces followed by a backtick, or another directive, is an error: the tool
must be taught a new construct, never let one through as text. Math (``$...$``, ``$$...$$``),
code spans and code blocks are copied as they are: ``d_{\\text{model}}`` is LaTeX, not MyST.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROLE = re.compile(r"\{([a-z][\w:-]*)\}(`+)")
# [label](target) and ![alt](target); a label may hold one level of brackets
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^()\s]+)\)")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
DIRECTIVE_INFO = re.compile(r"^\{(?P<name>[\w-]+)\}\s*(?P<arg>.*)$")
OPTION = re.compile(r"^:(?P<key>[\w-]+):\s*(?P<value>.*)$")
# Admonitions with a fixed title (docutils' names), rendered as a bold title over the body.
NAMED_ADMONITIONS = {
    "note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important",
    "warning": "Warning", "caution": "Caution", "attention": "Attention", "danger": "Danger",
    "error": "Error", "seealso": "See also",
}  # fmt: skip
IMAGE_TYPES = {".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg",
               ".jpeg": "image/jpeg", ".gif": "image/gif"}  # fmt: skip
FIGURE_OPTIONS = {"alt", "width", "name", "align", "class"}
# Characters that would start Markdown syntax inside a pasted value (a "|" ends a table cell).
MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|$])")


class ReaderError(ValueError):
    """A chapter's Markdown that the reader edition cannot render faithfully."""


@dataclass
class Context:
    """What the rendering of one chapter's Markdown needs from the book and the notebook.

    `glue`: name -> the glued output's data (mimetype -> text); `cite_label`: bibliography key ->
    ("Vaswani et al.", "2017"); `figure_number`: figure label -> (number, site page URL);
    `link`: a relative link target of the chapter -> its URL for the reader; `folder`: the
    chapter's folder (images are read from it). `cited` collects the keys cited, in order.
    """

    glue: dict[str, dict[str, str]]
    cite_label: Callable[[str], tuple[str, str]]
    figure_number: dict[str, tuple[int, str]]
    link: Callable[[str], str]
    folder: Path
    cited: list[str] = field(default_factory=list)
    glued: list[tuple[str, str]] = field(default_factory=list)  # (name, text) in page order


# --------------------------------------------------------------------------- glue


def format_plain_text(text: str, fmt_spec: str) -> str:
    """The text myst-nb's ``{glue:text}`` pastes (myst_nb.core.variables.format_plain_text).

    The stored ``text/plain`` is read as a Python literal when it is one ('0.5' -> 0.5, "'a'" ->
    a), then formatted with `fmt_spec` according to its type character ("" or "s": str()).
    """
    from ast import literal_eval

    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if fmt_spec == "":
        return str(value)
    kind = fmt_spec[-1]
    if kind == "s":
        value = str(value)
    elif kind in "bcdoxX":
        value = int(value)
    elif kind in "eEfFgGn%":
        value = float(value)
    return format(value, fmt_spec)


def glue_text(role: str, content: str, ctx: Context) -> str:
    """The text a glue role shows on the site, for Markdown (special characters escaped)."""
    if role == "glue:md":
        key = content.rsplit(":", 1)[0]
        data = _glued(key, ctx)
        if "text/markdown" not in data:
            raise ReaderError(f"{{glue:md}}`{content}`: no text/markdown stored under {key!r}")
        ctx.glued.append((key, data["text/markdown"]))
        return data["text/markdown"]
    if role != "glue:text":
        # {glue}`name` pastes the output itself (a repr in a code style, a chart): not text
        raise ReaderError(f"{{{role}}}`{content}`: use {{glue:text}} for a value in the prose")
    key, _, fmt = content.rpartition(":") if ":" in content else (content, "", "s")
    data = _glued(key, ctx)
    if "text/plain" not in data:
        raise ReaderError(f"{{glue:text}}`{content}`: no text/plain stored under {key!r}")
    try:
        text = smartquotes(format_plain_text(data["text/plain"], fmt))
    except (TypeError, ValueError) as e:
        raise ReaderError(f"{{glue:text}}`{content}`: cannot format the stored value: {e}") from e
    ctx.glued.append((key, text))
    return MARKDOWN_SPECIAL.sub(r"\\\1", text)


def smartquotes(text: str) -> str:
    """`text` as Sphinx's SmartQuotes transform shows it on the site (smartquotes_action "qDe":
    quotes curled, -- and --- as dashes, ... as an ellipsis)."""
    from docutils.utils.smartquotes import smartyPants

    return smartyPants(text, "qDe", "en")


def _glued(key: str, ctx: Context) -> dict[str, str]:
    if "::" in key:
        raise ReaderError(f"glue from another document ({key!r}) is not supported")
    if key not in ctx.glue:
        raise ReaderError(f"no glued value named {key!r} in the chapter's stored outputs "
                          "(execute the chapter, or fix the name)")
    return ctx.glue[key]


# --------------------------------------------------------------------------- roles


def cite_text(role: str, content: str, ctx: Context) -> str:
    keys = [k.strip() for k in content.split(",") if k.strip()]
    if not keys:
        raise ReaderError(f"{{{role}}} with no key")
    labels = []
    for key in keys:
        authors, year = ctx.cite_label(key)
        if key not in ctx.cited:
            ctx.cited.append(key)
        labels.append((authors, year))
    if role == "cite:t":
        return "; ".join(f"{a} ({y})" for a, y in labels)
    return "(" + "; ".join(f"{a}, {y}" for a, y in labels) + ")"


def numref_text(content: str, ctx: Context) -> str:
    m = re.fullmatch(r"(?s)(.*?)\s*<([^<>]+)>", content)
    title, label = (m.group(1), m.group(2)) if m else ("Fig. %s", content.strip())
    if label not in ctx.figure_number:
        raise ReaderError(f"{{numref}}`{content}`: no figure named {label!r} in the book")
    number, url = ctx.figure_number[label]
    text = title.replace("%s", str(number)).replace("{number}", str(number))
    return f"[{text}]({url}#{label})"


def render_role(role: str, content: str, ctx: Context) -> str:
    if role.startswith("glue"):
        return glue_text(role, content, ctx)
    if role in ("cite", "cite:p", "cite:t"):
        return cite_text(role, content, ctx)
    if role == "numref":
        return numref_text(content, ctx)
    raise ReaderError(f"the MyST role {{{role}}} (in {{{role}}}`{content}`) has no reader "
                      "rendering: teach tools/reader_markdown.py")


def _math_end(text: str, i: int) -> int:
    """The index after the math span opening at text[i] ('$' or '$$'), or -1 if none closes."""
    if text.startswith("$$", i):
        end = text.find("$$", i + 2)
        return -1 if end < 0 else end + 2
    j = i + 1
    if j >= len(text) or text[j].isspace():
        return -1
    while True:
        j = text.find("$", j)
        if j < 0:
            return -1
        if text[j - 1] != "\\":
            return j + 1
        j += 1


def render_inline(text: str, ctx: Context) -> str:
    """Roles replaced; code spans, math and escapes copied as they are."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n:
            out.append(text[i : i + 2])
            i += 2
            continue
        m = ROLE.match(text, i) if ch == "{" else None
        if m:
            ticks = m.group(2)
            end = text.find(ticks, m.end())
            if end < 0:
                raise ReaderError(f"unterminated role {text[i:i + 60]!r}")
            replacement = render_role(m.group(1), text[m.end() : end], ctx)
            line_start = text.rfind("\n", 0, i) + 1
            after = text[end + len(ticks) : end + len(ticks) + 2]
            # "3. of them" at the start of a line would become an ordered list
            if not text[line_start:i].strip() and replacement.isdigit() and re.match(
                    r"[.)](\s|$)", after):  # fmt: skip
                replacement += "\\"
            out.append(replacement)
            i = end + len(ticks)
            continue
        link = LINK.match(text, i) if ch in "[!" else None
        if link:
            out.append(render_link(*link.groups(), ctx))
            i = link.end()
            continue
        if ch == "`":
            run = re.match(r"`+", text[i:]).group(0)
            end = text.find(run, i + len(run))
            stop = n if end < 0 else end + len(run)
            out.append(text[i:stop])
            i = stop
            continue
        if ch == "$":
            end = _math_end(text, i)
            if end > 0:
                out.append(text[i:end])
                i = end
                continue
        out.append(ch)
        i += 1
    return "".join(out)


# --------------------------------------------------------------------------- blocks


def _closing(line: str, fence: str) -> bool:
    stripped = line.strip()
    return (
        len(line) - len(line.lstrip(" ")) <= 3
        and len(stripped) >= len(fence)
        and set(stripped) == {fence[0]}
    )


def render_markdown(text: str, ctx: Context) -> str:
    """A cell's (or a directive body's) MyST Markdown as plain Markdown."""
    lines = text.split("\n")
    out: list[str] = []
    para: list[str] = []

    def flush() -> None:
        if para:
            out.append(render_inline("\n".join(para), ctx))
            para.clear()

    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            para.append(lines[i])
            i += 1
            continue
        flush()
        fence, j = m.group("fence"), i + 1
        while j < len(lines) and not _closing(lines[j], fence):
            j += 1
        if j == len(lines):
            raise ReaderError(f"the fence {lines[i]!r} is never closed")
        body = lines[i + 1 : j]
        info = m.group("info").strip()
        d = DIRECTIVE_INFO.match(info)
        if d:
            out.append(render_directive(d.group("name"), d.group("arg"), body, m.group("indent"),
                                        ctx))  # fmt: skip
        elif fence.startswith(":"):
            raise ReaderError(f"a ::: fence without a directive: {lines[i]!r}")
        else:
            out.append("\n".join(lines[i : j + 1]))  # a code block, as it is
        i = j + 1
    flush()
    return "\n".join(out)


def _options(body: list[str]) -> tuple[dict[str, str], list[str]]:
    if body and body[0].strip() == "---":
        raise ReaderError("directive options in a YAML block (---) are not supported: use :key:")
    options, k = {}, 0
    while k < len(body):
        m = OPTION.match(body[k].strip())
        if not m or not body[k].strip():
            break
        options[m.group("key")] = m.group("value").strip()
        k += 1
    rest = body[k:]
    while rest and not rest[0].strip():
        rest = rest[1:]
    return options, rest


def render_directive(name: str, arg: str, body: list[str], indent: str, ctx: Context) -> str:
    options, content = _options([line.removeprefix(indent) for line in body])
    inner = render_markdown("\n".join(content), ctx).strip("\n")
    if name == "figure":
        text = render_figure(arg, options, inner, ctx)
    elif name == "admonition" or name in NAMED_ADMONITIONS:
        title = render_inline(arg, ctx) if name == "admonition" else NAMED_ADMONITIONS[name]
        if name == "admonition" and not title:
            raise ReaderError("an {admonition} without a title")
        unknown = set(options) - {"class", "name"}
        if unknown:
            raise ReaderError(f"{{{name}}} option(s) {sorted(unknown)} not supported")
        if "dropdown" in options.get("class", "").split():
            text = f"<details>\n<summary>{title}</summary>\n\n{inner}\n\n</details>"
        else:
            text = f"**{title}**\n\n{inner}"
    else:
        raise ReaderError(f"the MyST directive {{{name}}} has no reader rendering: teach "
                          "tools/reader_markdown.py")
    return "\n".join(indent + line if line else line for line in text.split("\n"))


def render_figure(path: str, options: dict[str, str], caption: str, ctx: Context) -> str:
    unknown = set(options) - FIGURE_OPTIONS
    if unknown:
        raise ReaderError(f"{{figure}} {path}: option(s) {sorted(unknown)} not supported")
    if not options.get("alt"):
        raise ReaderError(f"{{figure}} {path} has no :alt: text")
    attrs = f'src="{data_uri(path, ctx.folder)}" alt="{_attribute(options["alt"])}"'
    if "width" in options:
        attrs += f' width="{_attribute(options["width"])}"'
    number = ctx.figure_number.get(options.get("name", ""), (None, ""))[0]
    prefix = f"Fig. {number}. " if number is not None else ""
    paragraphs = [p.strip() for p in caption.split("\n\n") if p.strip()]
    shown = "\n\n".join(f"*{prefix if k == 0 else ''}{p}*" for k, p in enumerate(paragraphs))
    return f"<img {attrs}>\n\n{shown}" if shown else f"<img {attrs}>"


def _attribute(value: str) -> str:
    return html.escape(value, quote=False).replace('"', "&quot;")


def data_uri(path: str, folder: Path) -> str:
    """The image at `path` (relative to the chapter's folder) as a data: URI."""
    file = (folder / path).resolve()
    kind = IMAGE_TYPES.get(file.suffix.lower())
    if kind is None:
        raise ReaderError(f"image {path}: unsupported type (use {sorted(IMAGE_TYPES)})")
    if not file.is_file():
        raise ReaderError(f"image {path}: no such file ({file})")
    return f"data:{kind};base64,{base64.b64encode(file.read_bytes()).decode('ascii')}"


def render_link(bang: str, label: str, target: str, ctx: Context) -> str:
    """A link or image that works without the repository around the notebook."""
    label = render_inline(label, ctx)
    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
        return f"{bang}[{label}]({target})"  # absolute (https:, data:) or within the notebook
    if bang:
        return f"![{label}]({data_uri(target, ctx.folder)})"
    return f"[{label}]({ctx.link(target)})"
