# moefleet: `make demo` deploys on the simulated lab; `make test` runs the whole suite.
# Every target installs what it needs from nothing (make setup).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
LAB := $(CURDIR)/.lab
LOGS := $(LAB)/logs
HOSTS ?= 1
PROFILE ?= tp2ep4
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

SETUP_STAMP := $(VENV)/.setup-done
# The toolchain (pyproject.toml's dev extra, ~80 packages) goes in with uv: 5 s where pip took 47 s wall and 44
# CPU-s on a fresh clone, seconds every CI run waited for before its first test. uv reads neither pip.conf nor
# pip's constraints: the extra pins what it needs from PyPI itself. pip installs it when uv cannot.
# --compile-bytecode writes the .pyc files pip writes by default and uv does not: where PYTHONDONTWRITEBYTECODE is
# set (as it is on this machine), Python never writes them itself, and every ansible-playbook, molecule and pytest
# process compiled Ansible's and the other packages' sources again (a validate run 2.9 -> 2.1 CPU-s, the unit tests
# 345 -> 278 CPU-s with them compiled). About 25 CPU-s, once per fresh venv.
UV_VERSION := 0.13.9
# The clone is the collection moefleet.serving: Ansible finds it through this link (ansible.cfg's
# collections_path), Python through a .pth file in the venv naming the directory above ansible_collections.
COLLECTIONS := $(CURDIR)/.ansible/collections
COLLECTION_LINK := $(COLLECTIONS)/ansible_collections/moefleet/serving

.PHONY: help setup lint sanity ee-context test test-upgrade check unit oracle-env oracle integration molecule demo sim-image sim-mirrors sim-up sim-down bench clean

help:
	@echo "make demo       set up, start the simulated lab, deploy profile $(PROFILE) on it"
	@echo "make test       set up, lint, unit + integration tests, every molecule scenario (tests/suite.py)"
	@echo "make check      lint, unit and oracle tests and one lab deploy: the edit-test loop"
	@echo "make setup | lint | sanity | ee-context | unit | oracle | integration | molecule | sim-image | sim-up HOSTS=N [ROUTER=1] [MONITORING=1] | sim-down | bench"

setup: $(SETUP_STAMP)
	@if [ -e $(COLLECTION_LINK) ] && [ ! -L $(COLLECTION_LINK) ]; then rm -rf $(COLLECTION_LINK); fi
	@mkdir -p $(dir $(COLLECTION_LINK)) && ln -sfn ../../../.. $(COLLECTION_LINK)
	@echo $(COLLECTIONS) > "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/moefleet-collections.pth"

$(SETUP_STAMP): pyproject.toml requirements.yml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q uv==$(UV_VERSION) \
	  && $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[dev]' \
	  || $(BIN)/pip install -q -e '.[dev]'
	@$(BIN)/ansible-galaxy collection install -r requirements.yml --offline >/dev/null 2>&1 || { \
	  echo "setup: a collection in requirements.yml is not bundled with the pinned ansible package and" \
	       "Galaxy is unreachable here; widen its range to the bundled version" \
	       "(see: $(BIN)/ansible-galaxy collection list) or pin an ansible release that bundles it." >&2; \
	  exit 1; }
	@touch $@

# ansible-lint's syntax-check rule runs `ansible-playbook --syntax-check` on every playbook (deploy.yml,
# playbooks/*.yml, molecule's, sim's) and role, and fails on any: no loop of our own after it.
lint: setup
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production
	$(BIN)/ruff check .
	@$(MAKE) --no-print-directory sanity ee-context

# ansible-test sanity on the collection as it ships (tests/sanity/run.py says which tests, and why not the others).
sanity: setup
	$(BIN)/python tests/sanity/run.py

# The execution environment's build context (execution-environment.yml) with this collection's tarball in it;
# building the image needs a container registry, which is not reachable here.
EE := $(CURDIR)/.ansible/ee
ee-context: setup
	@rm -rf $(EE) && mkdir -p $(EE)
	$(BIN)/ansible-galaxy collection build --output-path $(EE) . >/dev/null
	@mv $(EE)/moefleet-serving-*.tar.gz $(EE)/moefleet-serving.tar.gz
	$(BIN)/ansible-builder create -f execution-environment.yml --context $(EE)/context

unit: setup
	$(BIN)/pytest -q -m "not lab and not oracle" tests

# Real SGLang (the version roles/sglang/defaults/main.yml pins) in a venv cached outside the clone.
oracle-env:
	$(PYTHON) tests/oracle/env.py build

oracle: setup oracle-env
	$(BIN)/pytest -q -m oracle tests/oracle

integration: setup sim-image sim-mirrors
	$(BIN)/python tests/suite.py --jobs 2 lab lab-router

molecule: setup sim-image sim-mirrors
	$(BIN)/python tests/suite.py --jobs 2 'molecule-*'

# What the suite needs before its first job, made side by side: on a fresh machine the host image (debootstrap,
# ~70 s, a third of it waiting on the archive) and the oracle's venvs (pip, from the disk) would otherwise wait for
# each other.
SUITE_INPUTS := sim-image sim-mirrors oracle-env

# The whole suite: every job of tests/suite.py (lint, unit, oracle, the lab's pytest files, each molecule
# scenario), three at a time; its table at the end says what each took.
test: setup
	@$(MAKE) --no-print-directory -j3 $(SUITE_INPUTS)
	$(BIN)/python tests/suite.py

# moefleet upgrade from SGLang 0.5.10 to 0.5.23: on a two-host lab (5-6 minutes), and the routed 3-worker fleet under
# load (the router lab's upgrade variant with a slower, a garbage and a healthy release, about 28 minutes), side by
# side. Not part of make test (its budget).
test-upgrade: setup
	@$(MAKE) --no-print-directory -j3 $(SUITE_INPUTS)
	$(BIN)/python tests/suite.py lab-upgrade lab-router-upgrade

# The edit-test loop (about 8 minutes): lint, unit, simulator and oracle tests, and one traced deploy on a lab host.
check: setup
	@$(MAKE) --no-print-directory -j3 $(SUITE_INPUTS)
	$(BIN)/python tests/suite.py --jobs 4 lint unit sim-parallel oracle lab-deploy


sim-image: setup
	$(BIN)/python sim/lab/lab.py image

sim-mirrors: setup
	$(BIN)/python sim/mirrors/build.py $(LAB)/mirror

sim-up: sim-image sim-mirrors
	$(BIN)/python sim/lab/lab.py up --hosts $(HOSTS)$(if $(filter 1,$(ROUTER) $(MONITORING)), --router)$(if $(filter 1,$(MONITORING)), --monitoring)
	$(BIN)/ansible-playbook sim/playbooks/prepare.yml

sim-down:
	@test -x $(BIN)/python && $(BIN)/python sim/lab/lab.py down || $(PYTHON) sim/lab/lab.py down

demo: sim-up
	$(BIN)/ansible-playbook deploy.yml -e profile=$(PROFILE)$(if $(filter 1,$(ROUTER) $(MONITORING)), -e moefleet_maintenance_window=true)
	$(if $(filter 1,$(MONITORING)),$(BIN)/ansible-playbook playbooks/monitoring.yml)

# (a) to (e), then the comparison with tests/bench/baseline.json: it names each figure that got worse and fails
# nothing (the figures move with the machine's load; tests/bench/README.md).
bench: setup sim-image sim-mirrors
	MOEFLEET_BENCH_ROLLOUT=1 $(BIN)/python tests/bench/run.py

clean: sim-down
	rm -rf $(VENV) .ansible reports
