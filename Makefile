# The two commands a new user runs:  `make book`  and  `make test`.
# Both create and use the local virtual environment .venv (Python 3.11 to 3.14: constraints.txt).
# Every target runs a task of tools/tasks.py, where each step is written once (the same steps
# run without make: `python tools/tasks.py test`, e.g. on Windows). The tasks set
# BOOK_FIGURES=offline and PYTHONHASHSEED=0 for every step.
PYTHON ?= python3
TASKS := $(PYTHON) tools/tasks.py

.PHONY: book test test-emulated test-emulated-quick install export export-check lint unit nbval book-check browser-deps execute envcheck pin clean

install:
	$(TASKS) install

## make book: execute every chapter and render the site into _build/html
book:
	$(TASKS) book

## make test: lint, package-vs-chapters check, unit tests, nbval over every chapter, site build
test:
	$(TASKS) test

# unit + nbval again on an imitated older CPU (CPU=avx2 or CPU=avx512, AVX-512 without bf16, for
# the other kinds): the stored outputs and the tests' thresholds must not depend on the machine
# that wrote them.
CPU ?= baseline
test-emulated:
	$(TASKS) test-emulated $(CPU)

# .ci/run's second step: test-emulated (no AVX) less the three chapters that train for minutes,
# so that .ci/run stays under 30 minutes on two cores (the full run is test-emulated's).
test-emulated-quick:
	$(TASKS) test-emulated-quick

lint:
	$(TASKS) lint

export-check:
	$(TASKS) export-check

unit:
	$(TASKS) unit

nbval:
	$(TASKS) nbval

# The site from the stored outputs (nbval has just checked them against a fresh run), then every
# page opened in headless Chromium with all other hosts blocked (tests/site; screenshots of every
# page go to _build/screenshots/).
book-check:
	$(TASKS) book-check

# Debian's chromium for the browser check (apt-get, once; never `playwright install`).
browser-deps:
	$(TASKS) browser-deps

## Developer helpers
export:
	$(TASKS) export

# Export, re-execute chapters in place to refresh their stored outputs, export again:
# make execute NB=chapters/01_attention.ipynb
execute:
	$(TASKS) execute $(NB)

# What to paste into a bug report: Python, torch, bf16, installed vs pinned versions, data, commit.
envcheck:
	$(TASKS) envcheck

pin:
	$(TASKS) pin

clean:
	$(TASKS) clean
