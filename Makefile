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

.PHONY: test lint typecheck pytest test-kafka test-faults test-pydantic-ai-lowest test-core-lowest \
	services services-down bench clean demo

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

# The Kafka tests again, against the broker KAFKA_VERSION selects, of the parts that speak Kafka's
# protocol in ways of their own: the event log (idempotent and transactional produce, reads,
# topic administration), the projector and its consumer group, the workers' group and their
# requests topic, the log's compaction and retention (DeleteRecords, the log start moving), the
# SASL_SSL listener, and LangGraph's conformance suite on Kafka. The other Kafka tests reach the
# broker only through those parts, with the same calls; `make test` runs them all on the default
# broker, and KAFKA_AGAIN_ALL=1 runs every Kafka test here.
KAFKA_AGAIN := tests/eventlog tests/projections tests/security/test_secured_kafka.py \
	tests/runtime/test_fleet.py tests/runtime/test_fleet_requests_kafka.py \
	tests/runtime/test_requests_kafka_sends.py tests/runtime/test_worker_leaves_its_group.py \
	tests/runtime/test_worker_cut_off_from_kafka.py tests/runtime/test_app_kafka.py \
	tests/runtime/test_compaction_holders.py tests/runtime/test_compaction_crash.py \
	tests/runtime/test_gc.py tests/runtime/test_gc_refold.py tests/runtime/test_gc_tag_race.py \
	tests/integrations/langgraph/test_conformance.py
test-kafka: $(STAMP)
	set -euo pipefail; eval "$$(bash scripts/services.sh up)"; \
		$(PY) -m pytest -m kafka $(if $(KAFKA_AGAIN_ALL),,$(KAFKA_AGAIN)) $(PYTEST_ARGS)

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

# The core dependencies at the floors pyproject.toml gives (scripts/floors.py reads them from it),
# in a venv of their own: the suites that reach each dependency's API (msgspec's codec and
# schema, asyncpg and redis-py leases and error classes, zstandard transcripts,
# pydantic-settings, the typer CLI), against the real servers. About 2.5 minutes.
CORE_LOWEST_VENV := .cache/venv-core-lowest
CORE_LOWEST_STAMP := $(CORE_LOWEST_VENV)/.onward-installed
CORE_LOWEST_TESTS := tests/test_errors.py tests/eventlog/test_events.py \
	tests/eventlog/test_archive.py tests/projections/test_transcript_encoding.py \
	tests/leases/test_postgres_leases.py tests/leases/test_redis_leases.py \
	tests/runtime/test_settings.py tests/runtime/test_cli.py

$(CORE_LOWEST_STAMP): pyproject.toml scripts/floors.py
	test -x $(CORE_LOWEST_VENV)/bin/python || $(PYTHON) -m venv $(CORE_LOWEST_VENV)
	$(CORE_LOWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(CORE_LOWEST_VENV)/bin/python -m pip install -q --no-deps -e .
	pins="$$($(PYTHON) scripts/floors.py)" && $(CORE_LOWEST_VENV)/bin/python -m pip install -q \
		$$pins pytest pytest-asyncio pytest-timeout
	touch $@

test-core-lowest: $(CORE_LOWEST_STAMP)
	set -euo pipefail; eval "$$(bash scripts/services.sh up)"; \
		$(CORE_LOWEST_VENV)/bin/python -m pytest -p no:cacheprovider $(PYTEST_ARGS) \
		$(CORE_LOWEST_TESTS)

services:
	bash scripts/services.sh up

services-down:
	bash scripts/services.sh down

bench: $(STAMP)
	set -euo pipefail; eval "$$(bash scripts/services.sh up)"; \
		$(PY) bench/append.py; $(PY) bench/project.py

clean:
	rm -rf $(VENV) .venv-pydantic-ai-* $(CORE_LOWEST_VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache

# The main job: a booking run killed mid-way and resumed in another process, on embedded SQLite.
demo: $(STAMP)
	$(PY) -m onward demo
