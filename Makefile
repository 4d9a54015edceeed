# kentino.gpufleet developer entry points. `make test` and `make demo` work from a fresh clone: they create .venv.
SHELL := /bin/bash
PYTHON ?= $(shell hack/find-python)
VENV := .venv
BIN := $(VENV)/bin
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_INJECT_FACT_VARS := false
export PATH := $(CURDIR)/$(BIN):$(PATH)
# Python keeps compiled modules in __pycache__ (gitignored; never in the built collection). A test run starts
# thousands of Python processes on the same sources: where the environment sets PYTHONDONTWRITEBYTECODE, every one of
# them would compile them again (the simulator's stand-ins, the collection's plugins, pytest's rewritten tests).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: system-deps venv torch-venv min-venv test test-setup fleet-cache test-min lint sanity unit integration test-fleet test-stress demo demo-loop bench \
  bench-audit clean

# CPU torch for the real torchrun/gloo dry-run tests. The 2.13.0 CPU wheel is built for Python 3.11 only.
TORCH_VENV := .venv-torch
# The lowest ansible-core that meta/runtime.yml claims; its unit and doc checks run there too.
MIN_VENV := .venv-min
MIN_ANSIBLE := ansible-core==2.17.*

# The Debian packages the tests need (listed in hack/system-deps): installed as root, or the command to run is printed
# and make stops before any test. A no-op when they are all installed.
system-deps:
	hack/system-deps

# pip --no-compile: pip would byte-compile every file it installs (ansible's bundled collections, torch: about 60 of
# the set-up's CPU seconds); Python compiles the modules the suites import on first use instead, into the same
# __pycache__ (PYTHONDONTWRITEBYTECODE is unexported above).
PIP_INSTALL := pip install -q --no-compile

# setuptools prints its "Editable installation" notice (class InformationOnly: information, not a warning) on every
# editable install; a filter on that message keeps a clean install quiet without hiding any other warning.
$(BIN)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "no Python >= 3.11 found"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/$(PIP_INSTALL) -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

$(TORCH_VENV)/bin/torchrun:
	$(shell hack/find-python 3.11) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/$(PIP_INSTALL) torch==2.13.0

torch-venv: $(TORCH_VENV)/bin/torchrun

$(MIN_VENV)/.installed:
	$(shell hack/find-python 3.11) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/$(PIP_INSTALL) '$(MIN_ANSIBLE)' 'pytest<9.2' pytest-timeout pytest-xdist hypothesis PyYAML Jinja2 jsonschema
	touch $@

min-venv: $(MIN_VENV)/.installed

# antsibull-docs loads the collection from its ansible_collections/ path (the repo root is not under one).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ansible-lint --offline -q
	$(BIN)/antsibull-docs lint-collection-docs --plugin-docs collections/ansible_collections/kentino/gpufleet
	$(BIN)/antsibull-changelog lint
	$(BIN)/python hack/gen_role_readmes.py --check

sanity: venv
	$(BIN)/pytest -q -n 2 tests/sanity

# Parallel workers (pytest-xdist): most tests wait on subprocesses, playbooks and timers rather than compute, so
# more workers than cores pays; files stay whole on one worker (their module fixtures run once).
UNIT_WORKERS ?= 4
INTEGRATION_WORKERS ?= 3
FLEET_WORKERS ?= 3

unit: venv torch-venv
	$(BIN)/pytest -q -n $(UNIT_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15 tests/unit

# Node-side code and docs on the oldest supported ansible-core (its module runner is what nodes execute).
test-min: min-venv
	PATH=$(CURDIR)/$(MIN_VENV)/bin:$$PATH $(MIN_VENV)/bin/pytest -q -n 2 -p no:cacheprovider tests/sanity \
	  tests/unit/xid tests/unit/nvidia_smi tests/unit/checks tests/unit/storage tests/unit/tool_runner -m "not slow"

integration: venv
	$(BIN)/pytest -q -n $(INTEGRATION_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15 tests/integration

# The real test fleet (systemd-nspawn nodes over SSH): needs root, debootstrap, systemd-container, openssh-server.
test-fleet: system-deps venv
	$(BIN)/pytest -q -n $(FLEET_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=15 -m fleet tests/fleet

# Sanity first (seconds: a broken tree shows at once); then the unit and integration suites beside the fleet's
# (which mostly waits on its nodes), whose stream ends earlier and then runs the minimum-version suite and lint, so
# that their three minutes no longer wait in front of everything else. Every suite runs; the table of their times is
# printed at the end (tests/output/suite-times.txt, each suite's output in tests/output/<suite>.log).
test:
	$(MAKE) --no-print-directory -j4 -Otarget test-setup
	hack/run-suites "sanity" "unit integration" "test-fleet test-min lint"

# What the suites need, prepared at once (pip runs on one core): the virtualenvs, and the test fleet's debootstrap base
# and packages (a few minutes on a machine that never built them, else a no-op), so no fleet test waits for them. The
# fleet cache failing (no mirror reachable, not root) stops nothing here: the fleet tests then fail with the reason.
test-setup: system-deps venv torch-venv min-venv fleet-cache

fleet-cache: system-deps
	@if [ "$$(id -u)" != 0 ]; then echo "fleet-cache: not root; the test fleet's tests will say what they need"; \
	elif ! $(PYTHON) hack/testfleet cache; then echo "fleet-cache: FAILED (above); the fleet tests will retry it"; fi

# The timing-sensitive suites with a CPU hog beside them (stress-ng, 2 workers per core): no verdict may depend on the
# machine's load. Elastic restarts, the post-mortem on real jobs, the CLI's live view, the XID watcher and the
# simulator's journal follower; then the test fleet's kill tests, under the fleet lock as every fleet run (the hog
# runs only while tests run, not while the lock is awaited).
STRESS_CPUS ?= $(shell echo $$(( 2 * $$(nproc) )))
STRESS_SUITES := tests/unit/elastic tests/unit/postmortem tests/unit/cli/test_cli_live.py tests/unit/monitoring \
  tests/unit/sim/test_journal_follow.py
STRESS_FLEET := tests/fleet/test_fleet_failures.py tests/fleet/test_fleet_burn_in.py -k kill
test-stress: system-deps venv torch-venv
	hack/with-cpu-hog $(STRESS_CPUS) $(BIN)/pytest -q --durations=10 $(STRESS_SUITES)
	flock /tmp/gpufleet-fleet.lock hack/with-cpu-hog $(STRESS_CPUS) $(BIN)/pytest -q --durations=10 -m fleet \
	  $(STRESS_FLEET)

# The burn-in on the simulated 9-node fleet (inventories/sim, the default inventory in ansible.cfg). Planted faults
# make nodes fail: that is the demo, so the gate is off here (gpufleet_fail_on=never); real runs keep it on.
demo: venv
	sim/reset --root reports/sim-state
	$(BIN)/ansible-playbook playbooks/burn_in.yml -e gpufleet_fail_on=never
	@echo "Open reports/latest/report.html (also report.md, report.json, junit.xml)."

# The lifecycle loop on the simulated fleet (docs/lifecycle.md): one node through fault, quarantine, a power cycle
# through its Redfish BMC (sushy-tools' emulator), validation and return; one lemon out for RMA with its bundle.
demo-loop: venv
	$(BIN)/python hack/demo_loop.py

bench: venv
	$(BIN)/python bench/xid_scan.py

# The audit's cost against a naive one-task-per-signal audit (64 simulated nodes), and the history at a year's scale.
bench-audit: venv
	$(BIN)/python bench/audit_cost.py --nodes 64
	$(BIN)/python bench/history_scale.py

clean:
	rm -rf $(VENV) reports tests/output bench/output .pytest_cache .ruff_cache
