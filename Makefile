# Two commands: `make run` serves the whole product on embedded SQLite; `make test` runs the
# suite on SQLite and, when TEST_DATABASE_URL or DATABASE_URL names one, again on PostgreSQL.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install browser run test test-sqlite test-postgres lint demo clean screenshots

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is needed: run make PYTHON=python3.11 ...")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

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

run: install
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py setup_demo
	$(BIN)/python manage.py serve

test: install test-sqlite test-postgres

test-sqlite: install browser
	env -u DATABASE_URL $(BIN)/python -m pytest -n auto

test-postgres: install browser
	@url="$${TEST_DATABASE_URL:-$${DATABASE_URL:-}}"; \
	case "$$url" in \
	  postgres*) echo "== PostgreSQL: $$url"; DATABASE_URL="$$url" $(BIN)/python -m pytest -n auto -p no:cacheprovider ;; \
	  *) echo "== PostgreSQL run skipped: set TEST_DATABASE_URL=postgres://... to run the suite there too" ;; \
	esac

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	env -u DATABASE_URL $(BIN)/python manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The README shows the screenshots the browser tests wrote last (var/screenshots, git-ignored).
SHOTS := page-dashboard page-review-hygiene review-disputes page-review-automatic page-run page-entry
screenshots:
	mkdir -p tests/screenshots
	for s in $(SHOTS); do cp var/screenshots/$$s.png tests/screenshots/; done
