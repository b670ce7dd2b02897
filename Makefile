# Two commands: `make run` serves the whole product on embedded SQLite; `make test` runs the
# suite on SQLite and, when TEST_DATABASE_URL or DATABASE_URL names one, again on PostgreSQL.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
# What running needs (the project's dependencies), and that plus the dev extra (test and lint
# tools: pytest, mypy, schemathesis, playwright, ...). `make run` installs the first only.
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev
# Bytecode is cached (in __pycache__, ignored by git) even where the environment says not to:
# otherwise every process the suite starts (servers, workers, commands: hundreds) compiles the
# project's modules again, and every pytest worker rewrites every test module's asserts again,
# about 0.4 s and 14 s of CPU each on a 2-CPU machine.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install install-runtime browser run test test-sqlite test-postgres test-hosted lint demo clean screenshots

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed: run make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(PIP) -e .
	touch $(RUNTIME)

# The dev install includes the runtime one: both stamps are fresh after it.
$(DEV): pyproject.toml | $(BIN)/python
	$(PIP) -e '.[dev]'
	touch $(RUNTIME) $(DEV)

install-runtime: $(RUNTIME)
install: $(DEV)

# The browser tests drive Debian's chromium (Playwright never downloads a browser). Installed
# here when missing: as root directly, else through sudo when it needs no password; otherwise
# tests/browser skip, saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "== chromium is missing and cannot be installed without root: browser tests will be skipped"; exit 0; fi; \
	  echo "== installing Debian's chromium for the browser tests"; \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	    || echo "== chromium could not be installed: browser tests will be skipped"; }

run: install-runtime
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py setup_demo
	$(BIN)/python manage.py serve

test: install test-sqlite test-postgres
# The browser tests (tests/browser, about a minute) serve a temporary SQLite file of their own
# whichever database the pass is given: `make test` runs them in its SQLite pass and not again
# in its PostgreSQL one. `make test-postgres` alone runs them.
test: PG_ARGS = --ignore=tests/browser

test-sqlite: install browser
	env -u DATABASE_URL $(BIN)/python -m pytest -n auto

test-postgres: install browser
	@url="$${TEST_DATABASE_URL:-$${DATABASE_URL:-}}"; \
	case "$$url" in \
	  postgres*) echo "== PostgreSQL: $$url"; DATABASE_URL="$$url" $(BIN)/python -m pytest -n auto -p no:cacheprovider $(PG_ARGS) ;; \
	  *) echo "== PostgreSQL run skipped: set TEST_DATABASE_URL=postgres://... to run the suite there too" ;; \
	esac

# Hosted mode alone (tests/test_hosted.py, ~1.5 min): two web processes and two workers in
# network namespaces (loopback without root), on PostgreSQL and Redis (127.0.0.1:6379, db 13,
# or TEST_REDIS_URL). `make test-postgres` runs it too, with the rest of the suite.
test-hosted: install
	@url="$${TEST_DATABASE_URL:-$${DATABASE_URL:-}}"; \
	case "$$url" in \
	  postgres*) DATABASE_URL="$$url" $(BIN)/python -m pytest -p no:cacheprovider -s -rs tests/test_hosted.py ;; \
	  *) echo "== the hosted test needs PostgreSQL: set TEST_DATABASE_URL=postgres://..."; exit 1 ;; \
	esac

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	env -u DATABASE_URL $(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/lint-imports  # the import contracts (pyproject.toml, tool.importlinter)
	$(BIN)/python tools/check_private.py  # no module reads another's _private names
	$(BIN)/python tools/check_single.py  # no rule written down in two modules

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The README shows the screenshots the browser tests wrote last (var/screenshots, git-ignored).
SHOTS := page-dashboard page-review-hygiene review-disputes page-review-automatic page-run page-entry
screenshots:
	mkdir -p tests/screenshots
	for s in $(SHOTS); do cp var/screenshots/$$s.png tests/screenshots/; done
