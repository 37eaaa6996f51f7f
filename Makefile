# The two commands a fresh checkout needs:
#   make test   create .venv, install onward with its dev tools, start Kafka/PostgreSQL/Redis,
#               then ruff, mypy and pytest against the real servers
#   make demo   the booking demo: kill a run mid-way, resume it elsewhere, one booking (no servers)
#
# KAFKA_VERSION picks the broker scripts/services.sh starts: 3.9 by default, 4 for the newest 4.x.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.onward-installed
PYTEST_ARGS ?=

.PHONY: test lint typecheck pytest test-kafka test-faults test-pydantic-ai-lowest services \
	services-down bench clean demo

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Onward needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The fault suite (tests/faults) breaks servers of its own and runs in `make test-faults`.
test: $(STAMP) lint typecheck
	set -euo pipefail; eval "$$(bash scripts/services.sh up)"; \
		$(PY) -m pytest -m "not faults" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/shellcheck scripts/*.sh .ci/run
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy -p onward
	$(VENV)/bin/mypy tests bench

# The tests that talk to Kafka, against the broker KAFKA_VERSION selects, but those whose Kafka
# part is only the event log's reads and appends, which the log's conformance suite checks on
# that broker: the CLI's handling of silent or failing stores and of its options, the races of
# workers for one run's lease, the application API's waits, the projector process meeting
# records it cannot read, and the LangGraph and pydantic-ai integrations (LangGraph's own
# conformance suite stays). `make test` runs them all, on the default broker.
# KAFKA_AGAIN_ALL=1 runs every Kafka test.
KAFKA_AGAIN_LEFT_OUT := tests/runtime/test_cli_backend_timeout.py tests/runtime/test_cli_faults.py \
	tests/runtime/test_cli_numeric_options.py tests/runtime/test_one_worker.py \
	tests/runtime/test_waits_end.py tests/faults/test_poison_records.py \
	tests/integrations/langgraph/test_tools.py \
	tests/integrations/langgraph/test_cancel.py tests/integrations/langgraph/test_fencing.py \
	tests/integrations/langgraph/test_spend.py tests/integrations/langgraph/test_existing_ids.py \
	tests/integrations/pydantic_ai/test_crashes.py
test-kafka: $(STAMP)
	set -euo pipefail; eval "$$(bash scripts/services.sh up)"; \
		$(PY) -m pytest -m kafka $(if $(KAFKA_AGAIN_ALL),,$(addprefix --ignore=,$(KAFKA_AGAIN_LEFT_OUT))) \
		$(PYTEST_ARGS)

# Fault injection: private brokers from the Kafka 3.9 jars (fetched into .cache if missing, even
# when a broker is already answering; ONWARD_KAFKA_LIBS names another folder), private PostgreSQL
# and Redis; the shared servers are never touched. Prints the table in .cache/faults/results.json.
test-faults: $(STAMP)
	set -euo pipefail; eval "$$(KAFKA_VERSION=3.9 bash scripts/services.sh up)"; \
		export ONWARD_KAFKA_LIBS="$${ONWARD_KAFKA_LIBS:-$$(KAFKA_VERSION=3.9 bash scripts/services.sh jars)}"; \
		rm -f .cache/faults/results.json; \
		status=0; $(PY) -m pytest -m faults $(PYTEST_ARGS) || status=$$?; \
		PYTHONPATH=tests $(PY) -m support.fault_runs; exit $$status

# The pydantic-ai tests against the lowest pydantic-ai the `pydantic-ai` extra allows, in a venv
# of their own (`make test` runs them against the newest). The Kafka ones and the external-event
# waits (a later pydantic-ai) are left out: the embedded SQLite runs need no servers.
PYDANTIC_AI_LOWEST := $(shell sed -n 's/^pydantic-ai = \["pydantic-ai-slim>=\([0-9.]*\),.*/\1/p' pyproject.toml)
LOWEST_VENV := .venv-pydantic-ai-$(PYDANTIC_AI_LOWEST)
LOWEST_STAMP := $(LOWEST_VENV)/.onward-installed

$(LOWEST_STAMP): pyproject.toml
	test -x $(LOWEST_VENV)/bin/python || $(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOWEST_VENV)/bin/python -m pip install -q -e '.[pydantic-ai]' \
		'pydantic-ai-slim==$(PYDANTIC_AI_LOWEST)' pytest pytest-asyncio pytest-timeout
	touch $@

test-pydantic-ai-lowest: $(LOWEST_STAMP)
	$(LOWEST_VENV)/bin/python -c 'import importlib.metadata as m, sys; \
		v = m.version("pydantic-ai-slim"); print("pydantic-ai-slim", v); \
		sys.exit((v + ".0").split(".")[:3] != "$(PYDANTIC_AI_LOWEST).0.0".split(".")[:3])'
	$(LOWEST_VENV)/bin/python -m pytest -m "not kafka" $(PYTEST_ARGS) \
		tests/integrations/pydantic_ai --ignore=tests/integrations/pydantic_ai/test_waits.py

services:
	bash scripts/services.sh up

services-down:
	bash scripts/services.sh down

bench: $(STAMP)
	set -euo pipefail; eval "$$(bash scripts/services.sh up)"; \
		$(PY) bench/append.py; $(PY) bench/project.py

clean:
	rm -rf $(VENV) .venv-pydantic-ai-* build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache

# The main job: a booking run killed mid-way and resumed in another process, on embedded SQLite.
demo: $(STAMP)
	$(PY) -m onward demo
