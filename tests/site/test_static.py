"""Checks over the built site's files, no browser: nothing is fetched from another host, every
internal link resolves, every chapter was built, executed and has its launch/download buttons."""

from __future__ import annotations

import functools
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from sitecheck import (
    CONFIG,
    NON_PAGE_DIRS,
    READER_EDITIONS,
    ROOT,
    TOC,
    chapter_number,
    drawing_names,
    drawing_of,
    notebook_outputs,
    notebook_source,
    real_alt_text,
    site_pages,
    toc_files,
)

# URLs that appear in inline scripts but are never fetched: Vega-Lite's "$schema" and the SVG/XML
# namespaces. Anything else with a scheme inside an inline <script> is treated as a load.
NEVER_FETCHED = re.compile(r"https?://(vega\.github\.io/schema/|www\.w3\.org/)")
URL_IN_TEXT = re.compile(r"""(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s"'`)<>]*""")
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)""")
CSS_IMPORT = re.compile(r"""@import\s+(?:url\()?\s*['"]?([^'")\s;]+)""")
CSS_COMMENT = re.compile(r"/\*.*?\*/", re.S)
# Tags whose attribute makes the browser fetch something when the page loads.
LOADING_ATTRS = {
    "script": ["src"],
    "link": ["href"],
    "img": ["src", "srcset"],
    "iframe": ["src"],
    "source": ["src", "srcset"],
    "video": ["src", "poster"],
    "audio": ["src"],
    "embed": ["src"],
    "object": ["data"],
    "input": ["src"],
}
# <link rel=...> values that only name a URL, without fetching it.
NON_LOADING_RELS = {"canonical", "alternate", "author", "license", "me"}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.ids: set[str] = set()
        self.inline_scripts: list[str] = []
        self.styles: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        if a.get("style"):
            self.styles.append(a["style"])
        if tag in ("script", "style"):
            self._in = tag if not a.get("src") else None
            if tag == "script" and not a.get("src"):
                self.inline_scripts.append("")
            if tag == "style":
                self.styles.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            self.inline_scripts[-1] += data
        elif self._in == "style":
            self.styles[-1] += data


@functools.cache
def parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    p.close()
    return p


def html_files(site: Path) -> list[Path]:
    """Every html file a reader can reach (the theme's Jinja templates in _static are not pages)."""
    return [
        p for p in sorted(site.rglob("*.html")) if p.relative_to(site).parts[0] not in NON_PAGE_DIRS
    ]


def css_files(site: Path) -> list[Path]:
    return sorted(site.rglob("*.css"))


def _is_external(url: str) -> bool:
    parts = urlsplit(url.strip())
    if parts.scheme in ("http", "https") or url.strip().startswith("//"):
        return parts.hostname not in ("127.0.0.1", "localhost")
    return False


def _srcset_urls(value: str) -> list[str]:
    return [c.strip().split()[0] for c in value.split(",") if c.strip()]


def _css_refs(text: str) -> list[str]:
    text = CSS_COMMENT.sub("", text)
    return CSS_URL.findall(text) + CSS_IMPORT.findall(text)


# --------------------------------------------------------------------------- nothing from elsewhere


def test_no_page_loads_assets_from_another_host(site):
    problems = []
    for path in html_files(site):
        rel = path.relative_to(site)
        page = parse(path)
        for tag, attrs in page.tags:
            if tag == "link" and set(attrs.get("rel", "").split()) & NON_LOADING_RELS:
                continue
            for attr in LOADING_ATTRS.get(tag, []):
                if attr not in attrs:
                    continue
                urls = _srcset_urls(attrs[attr]) if attr == "srcset" else [attrs[attr]]
                problems += [f"{rel}: <{tag} {attr}={u!r}>" for u in urls if _is_external(u)]
        for script in page.inline_scripts:
            for url in URL_IN_TEXT.findall(script):
                if not NEVER_FETCHED.match(url) and _is_external(url):
                    problems.append(f"{rel}: inline <script> names {url!r}")
        for style in page.styles:
            problems += [
                f"{rel}: inline style loads {u!r}" for u in _css_refs(style) if _is_external(u)
            ]
    for path in css_files(site):
        rel = path.relative_to(site)
        text = path.read_text(encoding="utf-8", errors="replace")
        problems += [f"{rel}: loads {u!r}" for u in _css_refs(text) if _is_external(u)]
    assert not problems, "assets from other hosts:\n  " + "\n  ".join(sorted(set(problems)))


# --------------------------------------------------------------------------- internal links


def _resolve(base: Path, ref: str, site: Path) -> tuple[Path, str] | None:
    """(file, fragment) a relative reference points to, or None for references not to check."""
    ref = ref.strip()
    parts = urlsplit(ref)
    if parts.scheme or ref.startswith("//") or not ref:
        return None
    if not parts.path:
        return base, unquote(parts.fragment)
    target = (
        site / parts.path.lstrip("/") if parts.path.startswith("/") else base.parent / parts.path
    )
    target = Path(unquote(str(target)))
    if parts.path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target.resolve(), unquote(parts.fragment)


def test_internal_links_resolve(site):
    problems = []
    for path in html_files(site):
        rel = path.relative_to(site)
        for tag, attrs in parse(path).tags:
            for attr in ("href", "src", "srcset", "poster", "data"):
                if attr not in attrs or (attr == "data" and tag != "object"):
                    continue
                refs = _srcset_urls(attrs[attr]) if attr == "srcset" else [attrs[attr]]
                for ref in refs:
                    resolved = _resolve(path, ref, site)
                    if resolved is None:
                        continue
                    target, fragment = resolved
                    if site.resolve() not in target.parents:
                        problems.append(f"{rel}: <{tag} {attr}={ref!r}> leaves the site")
                    elif not target.is_file():
                        problems.append(f"{rel}: <{tag} {attr}={ref!r}> -> missing file")
                    elif (
                        fragment and target.suffix == ".html" and fragment not in parse(target).ids
                    ):
                        where = "this page" if target == path else target.relative_to(site)
                        problems.append(
                            f"{rel}: <{tag} {attr}={ref!r}> -> no id {fragment!r} in {where}"
                        )
    for path in css_files(site):
        rel = path.relative_to(site)
        text = path.read_text(encoding="utf-8", errors="replace")
        for ref in _css_refs(text):
            if ref.startswith("data:"):
                continue
            resolved = _resolve(path, ref, site)
            if resolved is not None and not resolved[0].is_file():
                problems.append(f"{rel}: url({ref!r}) -> missing file")
    assert not problems, "broken internal links:\n  " + "\n  ".join(sorted(set(problems)))


# --------------------------------------------------------------------------- chapters


def test_every_toc_entry_was_built(site):
    missing = [f for f in toc_files() if not (site / f"{f}.html").is_file()]
    assert not missing, f"documents in {TOC.name} with no page in the site: {missing}"
    pages = {p.removesuffix(".html") for p in site_pages(site)}
    orphans = sorted(pages - set(toc_files()))
    assert not orphans, f"pages in the site that {TOC.name} does not list: {orphans}"


def _notebook_pages(site: Path) -> list[str]:
    return [p for p in site_pages(site) if notebook_source(p, site) is not None]


def test_notebooks_were_executed_with_book_figures(site):
    """The site shows stored outputs: every code cell must have run, and figures must be the
    offline renderer's (an Altair chart rendered without BOOK_FIGURES=offline loads Vega from a
    CDN; ipywidgets need their JavaScript from a CDN and a kernel: use viz.show_explorer)."""
    problems = []
    for page in _notebook_pages(site):
        nb = notebook_source(page, site)
        code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None]
        if unrun:
            problems.append(f"{page}: code cells {unrun} have not been executed (no stored output)")
        if nb.get("metadata", {}).get("widgets"):
            problems.append(
                f"{page}: saved ipywidgets state (use transformer_lib.viz.show_explorer)"
            )
        for out in notebook_outputs(nb):
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                problems.append(f"{page}: an ipywidgets output (use viz.show_explorer)")
            if any(m.startswith("application/vnd.vegalite") for m in data):
                problems.append(
                    f"{page}: a vega-lite mimetype output (run with BOOK_FIGURES=offline)"
                )
            html = data.get("text/html", "")
            html = "".join(html) if isinstance(html, list) else html
            if "altair-viz-" in html or "cdn.jsdelivr.net" in html:
                problems.append(
                    f"{page}: Altair output from the default renderer "
                    "(execute the chapter with BOOK_FIGURES=offline)"
                )
    assert not problems, "\n  ".join(["notebook outputs the site cannot show offline:", *problems])


DIRECTIVE_OPEN = re.compile(r"^\s*(`{3,}|:{3,})\{(\w[\w-]*)\}", re.M)
LITERAL_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{\w[\w-]*\}|^:class:", re.M)
PRE_BLOCK = re.compile(r"<pre[^>]*>(.*?)</pre>", re.S)
TAG = re.compile(r"<[^>]+>")


def test_markdown_directives_render(site):
    """Every `{admonition}` (etc.) in a chapter's markdown becomes an element, none shows as text.

    A code fence nested in a directive with the same number of backticks closes the directive
    early: the rest of the solution, and the exercises after it, then render as literal code.
    Nest with a longer outer fence (````{admonition} around ```python) or `:::{admonition}`.
    """
    import html as html_lib

    problems = []
    for page in _notebook_pages(site):
        nb = notebook_source(page, site)
        markdown = "\n".join(
            "".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"
        )
        opened = [m.group(2) for m in DIRECTIVE_OPEN.finditer(markdown)]
        text = (site / page).read_text(encoding="utf-8")
        n_admonitions = len(re.findall(r'<div class="[^"]*\badmonition\b', text))
        n_expected = sum(d in ("admonition", "note", "tip", "warning", "hint") for d in opened)
        if n_admonitions < n_expected:
            problems.append(
                f"{page}: {n_expected} admonition directives in the notebook, "
                f"{n_admonitions} rendered"
            )
        for block in PRE_BLOCK.findall(text):
            code = html_lib.unescape(TAG.sub("", block))
            for m in LITERAL_DIRECTIVE.finditer(code):
                line = code[m.start() :].splitlines()[0]
                problems.append(f"{page}: directive shown as literal code: {line!r}")
    assert not problems, "\n  ".join(
        ["markdown directives that did not render (nested fences?):", *problems]
    )


def _config() -> dict:
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def _links(path: Path) -> list[tuple[str, dict[str, str]]]:
    return [(t, a) for t, a in parse(path).tags if t == "a" and a.get("href")]


def test_chapter_pages_have_launch_and_download_buttons(site):
    """Colab, Binder and the download open the chapter's reader edition (notebooks/, written by
    tools/reader_edition.py; book/_ext/reader_links.py points the buttons at it), not the MyST
    source in chapters/, which a notebook viewer shows as build syntax."""
    cfg = _config()
    repo = cfg["repository"]["url"].rstrip("/")
    branch = cfg["repository"].get("branch", "main")
    owner_repo = urlsplit(repo).path.strip("/")
    binder = cfg["launch_buttons"]["binderhub_url"].rstrip("/")
    colab = cfg["launch_buttons"]["colab_url"].rstrip("/")
    pages = _notebook_pages(site)
    if not pages:
        pytest.fail("the site has no notebook pages: nothing to launch or download", pytrace=False)
    problems = []
    for page in pages:
        path = site / page
        hrefs = {a["href"] for _, a in _links(path)}
        edition = READER_EDITIONS / Path(page).with_suffix(".ipynb").name
        nb_path = edition.relative_to(ROOT).as_posix()
        expected = {
            "Colab": f"{colab}/github/{owner_repo}/blob/{branch}/{nb_path}",
            "Binder": f"{binder}/v2/gh/{owner_repo}/{branch}?urlpath=lab/tree/{nb_path}",
            "repository": repo,
        }
        problems += [
            f"{page}: no {name} link {url!r}" for name, url in expected.items() if url not in hrefs
        ]
        problems += [f"{page}: a link opens the source {h!r}" for h in hrefs
                     if "colab" in h or "binder" in h if "/chapters/" in h]  # fmt: skip
        downloads = [
            a["href"]
            for _, a in _links(path)
            if "btn-download-source-button" in a.get("class", "") and a["href"].endswith(".ipynb")
        ]
        if not downloads:
            problems.append(f"{page}: the download menu offers no .ipynb")
        for href in downloads:
            target = (path.parent / href).resolve()
            if not target.is_file():
                problems.append(f"{page}: download {href!r} is missing from the site")
            elif not edition.is_file() or target.read_bytes() != edition.read_bytes():
                problems.append(f"{page}: download {href!r} is not the reader edition {nb_path}")
    assert not problems, "\n  ".join(["launch / download buttons:", *problems])


def test_no_thebe_or_analytics(site):
    """Thebe (remote kernels from unpkg.com) and analytics stay off: no calls home."""
    problems = []
    for path in html_files(site):
        text = path.read_text(encoding="utf-8", errors="replace")
        for needle in ("thebe", "googletagmanager", "google-analytics", "plausible.io"):
            if needle in text.lower():
                problems.append(f"{path.relative_to(site)}: mentions {needle!r}")
    assert not problems, "\n  ".join(problems)


# --------------------------------------------------------------------------- drawings

# Chapters 1-8 build the model; each opens with its "where we are" map (where_NN.svg) and
# explains with at least one more drawing of book/figures (plots are evidence, not pictures).
MAPPED_CHAPTERS = range(1, 9)


def chapter_drawing_problems(page: str, tags: list[tuple[str, dict[str, str]]]) -> list[str]:
    """What is missing from chapter `page`'s drawings, given the page's parsed tags."""
    names = drawing_names()
    where = f"where_{chapter_number(page):02d}.svg"
    shown = [
        (name, real_alt_text(attrs.get("alt"), attrs.get("src", "")))
        for tag, attrs in tags
        if tag == "img" and (name := drawing_of(attrs.get("src", ""), names))
    ]
    problems = [f"{page}: {name} has no alt text" for name, has_alt in shown if not has_alt]
    if not shown or shown[0][0] != where:
        problems.append(
            f"{page}: the first drawing is not {where} (drawings: {[n for n, _ in shown]})"
        )
    if not [name for name, _ in shown if not name.startswith("where_")]:
        problems.append(f"{page}: no drawing besides a where_NN.svg map")
    return problems


def test_chapters_open_with_their_map_and_have_a_drawing(site):
    chapters = [f"{f}.html" for f in toc_files() if chapter_number(f"{f}.html") in MAPPED_CHAPTERS]
    assert chapters, f"{TOC.name} lists none of chapters {list(MAPPED_CHAPTERS)}"
    problems = []
    for page in chapters:
        path = site / page
        if path.is_file():  # a missing page fails test_every_toc_entry_was_built
            problems += chapter_drawing_problems(page, parse(path).tags)
    assert not problems, "\n  ".join(["chapter drawings:", *problems])
