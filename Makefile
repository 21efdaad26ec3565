# The two commands a new user runs:  `make book`  and  `make test`.
# Both create and use the local virtual environment .venv (Python 3.10+ is all you need).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export BOOK_FIGURES := offline
# Chapters run on CPU threads; two cores here.
export PYTHONHASHSEED := 0

.PHONY: book test install export export-check lint unit nbval book-check browser-deps execute pin clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch 2.13.0 is pinned in constraints.txt: a CPU build on these machines.
	$(PY) -m pip install --quiet -c constraints.txt -e ".[book,dev]"
	touch $(STAMP)

install: $(STAMP)

## make book: execute every chapter and render the site into _build/html
book: $(STAMP)
	$(PY) tools/fetch_assets.py
	rm -rf _build/html  # --all re-renders every page but keeps pages of files since removed
	$(VENV)/bin/jupyter-book build --all -W -n --keep-going .
	@echo "Open _build/html/index.html"

## make test: lint, package-vs-chapters check, unit tests, nbval over every chapter, site build
test: lint export-check unit nbval book-check

lint: $(STAMP)
	$(VENV)/bin/ruff check .

export-check: $(STAMP)
	$(PY) tools/export.py --check

unit: $(STAMP)
	$(VENV)/bin/pytest -n 2 -q tests

nbval: $(STAMP)
	$(VENV)/bin/pytest -q -p no:randomly --nbval chapters --nbval-sanitize-with tests/nbval_sanitize.cfg -n 2 --dist loadfile

# The site from the stored outputs (nbval has just checked them against a fresh run), then every
# page opened in headless Chromium with all other hosts blocked (tests/site; screenshots of every
# page go to _build/screenshots/).
book-check: $(STAMP) browser-deps
	$(PY) tools/fetch_assets.py
	$(PY) tools/ci_config.py > _build_ci_config.yml
	rm -rf _build/html
	$(VENV)/bin/jupyter-book build --all -W -n --keep-going --config _build_ci_config.yml . ; \
	  status=$$?; rm -f _build_ci_config.yml; exit $$status
	$(VENV)/bin/pytest -q tests/site

# Debian's chromium for the browser check (apt-get, once; never `playwright install`).
browser-deps:
	bash tools/browser_deps.sh

## Developer helpers
export: $(STAMP)
	$(PY) tools/export.py

# Re-execute chapters in place to refresh their stored outputs: make execute NB=chapters/01_attention.ipynb
execute: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=1800 $(or $(NB),chapters/*.ipynb)
	$(PY) tools/export.py

pin: $(STAMP)
	@echo "# Exact versions CI installs (make install uses \`pip install -c constraints.txt\`)." > constraints.txt
	@echo "# Upgrade deliberately, in a commit of its own: \`make pin\` rewrites this file from the venv." >> constraints.txt
	$(PY) -m pip freeze --exclude-editable | sed 's/+cpu$$//' >> constraints.txt

clean:
	rm -rf _build
