# binlake: every target installs what it needs first (through `setup`, which is
# idempotent and fast once done).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.binlake-setup

.PHONY: setup test test-fast test-big demo up proto proto-check bench lint typecheck docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py include/binlake/lake/decoding/_imagec.c include/binlake/source/mysql/_rowsc.c include/binlake/source/mysql/_framec.c include/binlake/source/mysql/_snaprowc.c include/binlake/source/postgres/_pgoutc.c constraints.txt jars/pom.xml scripts/setup.sh
	PY=$(PY) bash scripts/setup.sh
	@touch $(STAMP)

# The headers every C extension includes (setup.py): a change to them rebuilds the extensions too.
$(STAMP): include/binlake/_native/binlake_native.h include/binlake/_native/binlake_tags.h

test: setup
	$(BIN)/pytest -q --durations=30 -m "not big" tests

# The suite without the tests marked slow: the quick loop while changing code.
test-fast: setup
	$(BIN)/pytest -q -m "not slow and not big" tests

# Every rebuild of a table three times the driver's heap (tests/restore/test_any_size.py):
# a quarter of an hour on two cores.
test-big: setup
	$(BIN)/pytest -q -m big tests

demo: setup
	$(BIN)/python scripts/demo.py

# The always-on stack on this machine (registry, three Pumps, Airflow with this
# project's dags/ and plugins/), in the foreground; Ctrl-C stops it. State in ./data.
up: setup
	$(BIN)/binlake up

proto: setup
	$(BIN)/python scripts/gen_proto.py

proto-check: setup
	$(BIN)/python scripts/gen_proto.py --check

bench: setup
	$(BIN)/binlake bench pump
	$(BIN)/binlake bench writer
	$(BIN)/binlake bench ingest
	$(BIN)/binlake bench apply
	$(BIN)/binlake bench restore

lint: setup
	$(BIN)/ruff check include tests dags plugins jobs scripts bench docs/hooks
	$(BIN)/lint-imports
	$(BIN)/python scripts/gen_proto.py --check

# mypy --strict on the packages [tool.mypy] files lists in pyproject.toml (the CI gate).
typecheck: setup
	$(BIN)/mypy

# The documentation site (mkdocs.yml, docs/) into site/, with the reference pages generated
# from the code (docs/hooks/reference.py); --strict: a broken link or a page missing fails.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) jars/lib .pytest_cache site
