#!/usr/bin/env bash
# The browser for `make book-check`: Debian's chromium, driven by the Python `playwright` package
# (already in the venv through the `dev` extra). Idempotent: returns at once when it is installed.
# Playwright's own browser download (`playwright install`) is never used.
set -euo pipefail

CHROMIUM=/usr/lib/chromium/chromium   # the real binary; /usr/bin/chromium is a shell wrapper

if [[ -x "$CHROMIUM" ]]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "browser_deps.sh: $CHROMIUM is missing and apt-get is unavailable;" \
         "install Debian/Ubuntu's chromium package (or set SITE_CHROMIUM to a Chromium binary)." >&2
    exit 1
fi

SUDO=""
if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "browser_deps.sh: run as root (or with sudo) to install chromium" >&2
        exit 1
    fi
fi

echo "browser_deps.sh: installing chromium with apt-get"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null

if [[ ! -x "$CHROMIUM" ]]; then
    echo "browser_deps.sh: chromium installed but $CHROMIUM not found" >&2
    exit 1
fi
"$CHROMIUM" --version
