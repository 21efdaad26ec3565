"""Fixtures for the built-site checks (`make book-check`: build, then `pytest -q tests/site`).

The suite reads the site Jupyter Book wrote to `_build/html`, serves it from 127.0.0.1 and opens
every page in Debian's headless Chromium (driven by Playwright; `tools/browser_deps.sh` installs
the browser) with every request to another host blocked and recorded. See sitecheck.py for the
environment variables that point it at a site built elsewhere.

It is collected only when named on the command line (`pytest tests/site`), or with
BOOK_SITE_TESTS=1: the unit-test run (`pytest tests`) happens before the site is built.
"""

from __future__ import annotations

import functools
import http.server
import os
import threading
from pathlib import Path

import pytest
from sitecheck import (
    CHROMIUM,
    CHROMIUM_ARGS,
    HERE,
    SITE,
    PageReport,
    page_name,
    site_pages,
    visit_page,
)

# --------------------------------------------------------------------------- collection


def _site_suite_requested(config: pytest.Config) -> bool:
    if os.environ.get("BOOK_SITE_TESTS") == "1":
        return True
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if HERE in collection_path.parents and not _site_suite_requested(config):
        return True
    return None


def pytest_report_header(config: pytest.Config) -> str:
    if _site_suite_requested(config):
        return f"site checks: {SITE} (browser {CHROMIUM})"
    return "site checks (tests/site): not collected here; they run in `make book-check`"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "page" in metafunc.fixturenames:
        pages = site_pages() if (SITE / "index.html").exists() else ["<site not built>"]
        metafunc.parametrize("page", pages, ids=[page_name(p) for p in pages])


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def site() -> Path:
    if not (SITE / "index.html").exists():
        pytest.fail(
            f"no built site at {SITE}: run `make book-check` (or jupyter-book build) first",
            pytrace=False,
        )
    return SITE


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="session")
def server(site: Path):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run tools/browser_deps.sh (installs Debian's chromium)",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def visits(browser, server):
    cache: dict[str, PageReport] = {}

    def get(page: str) -> PageReport:
        if page not in cache:
            cache[page] = visit_page(browser, server, page)
        return cache[page]

    return get
