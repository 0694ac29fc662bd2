# The two set-up commands: `make demo` and `make test`. Each creates .venv when absent.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench reliability clean

# glibc malloc settings of the deploy files (deploy/Dockerfile, docs/operations.md): demo, test and bench
# processes run as the daemon is deployed. glibc reads them when a process starts.
export MALLOC_ARENA_MAX := 1
export MALLOC_MMAP_THRESHOLD_ := 33554432
export MALLOC_TRIM_THRESHOLD_ := 131072

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall when the dependency list changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[postgres,dask,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tailwatch demo

# Test setup: Debian's chromium for the report's browser test, logrotate for the log-shipping test, prometheus
# and prometheus-alertmanager for the tests against the real binaries (installed when absent and allowed).
# Two pytest-xdist workers; --dist loadscope keeps each module on one worker, so a module's shared
# scenario runs are made once.
test: $(STAMP)
	sh tests/setup/debian.sh chromium chromium "the report's browser test"
	sh tests/setup/debian.sh logrotate logrotate "the log-shipping test"
	sh tests/setup/debian.sh prometheus prometheus "the Prometheus tests (tests/prometheus)"
	sh tests/setup/debian.sh prometheus-alertmanager amtool "the Alertmanager config test (tests/prometheus)"
	$(BIN)/python -m pytest -q -n 2 --dist loadscope

# The tests that need no database, server or subprocess (pure checks, aggregate sketches, config, verdict and
# alert tables, quality metrics, the import rules): under a minute on two workers, for the edit-test loop.
FAST := tests/test_imports.py \
	$(filter-out %/test_baselines.py %/test_anchors.py %/test_segment_verdict.py %/test_small_reference.py \
	  %/test_scenarios.py %/test_evidently_agreement.py %/test_no_false_alarms.py %/test_docs.py, \
	  $(wildcard tests/checks/test_*.py)) \
	tests/alerts/test_evidence_ranking.py tests/alerts/test_one_wording.py tests/alerts/test_rule_text.py \
	tests/alerts/test_rules.py tests/alerts/test_verdict.py \
	tests/monitor/test_config.py tests/monitor/test_sketch.py tests/monitor/test_classes.py \
	tests/monitor/test_payload_golden.py tests/monitor/test_signal_means.py tests/monitor/test_cardinality_caps.py \
	tests/monitor/test_tokens.py \
	tests/quality/test_metrics.py tests/quality/test_finding_intervals.py tests/quality/test_interval_coverage.py \
	tests/quality/test_rules_and_estimates.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider $(FAST)

# Fuzz, fault, crash and canary tests, with a summary table (rows lost and duplicates must be 0).
reliability: $(STAMP)
	sh tests/setup/debian.sh logrotate logrotate "the log-shipping test"
	$(BIN)/python -m pytest -q -m reliability -p no:cacheprovider -p no:warnings tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache tailwatch.db
