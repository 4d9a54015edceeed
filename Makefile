# kentino.gpufleet developer entry points. `make test` and `make demo` work from a fresh clone: they create .venv.
SHELL := /bin/bash
PYTHON ?= $(shell hack/find-python)
VENV := .venv
BIN := $(VENV)/bin
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_INJECT_FACT_VARS := false
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: venv test lint sanity unit integration test-fleet demo bench clean

$(BIN)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "no Python >= 3.11 found"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ansible-lint --offline -q

sanity: venv
	$(BIN)/pytest -q tests/sanity

unit: venv
	$(BIN)/pytest -q tests/unit

integration: venv
	$(BIN)/pytest -q tests/integration

# The real test fleet (systemd-nspawn nodes over SSH): needs root, debootstrap, systemd-container, openssh-server.
test-fleet: venv
	$(BIN)/pytest -q -m fleet tests/fleet

test: lint sanity unit integration

demo: venv
	@echo "The burn-in demo on the simulated fleet arrives with the burn-in issue."

bench: venv
	$(BIN)/python bench/xid_scan.py

clean:
	rm -rf $(VENV) reports tests/output bench/output .pytest_cache .ruff_cache
