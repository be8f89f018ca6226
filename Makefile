# sdcguard: `make demo` runs a simulated fleet and a real node through the lifecycle,
# `make test` runs every check. Both install what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON3 ?= python3
CACHE ?= $(or $(SDCGUARD_CACHE),$(HOME)/.cache/sdcguard)
# The venv (torch and torch-xla make it several GB) lives outside the checkout, keyed by
# the three distributions' requirements and the dev group (tests/venv_requirements.py),
# so every clone on a machine shares it.
DEPS_KEY := $(shell $(PYTHON3) tests/venv_requirements.py --key)
VENV ?= $(CACHE)/venv-py311-$(DEPS_KEY)
PY := $(VENV)/bin/python
export PYTHONPATH := $(CURDIR)/operator:$(CURDIR)/jobs:$(CURDIR)
export SDCGUARD_CACHE := $(CACHE)
export PJRT_DEVICE ?= CPU
# Compiled bytecode is cached outside the checkout, as the venv is: the suite starts
# hundreds of Python processes (operators, probes, the CLI) that import the project, and
# a shell that sets PYTHONDONTWRITEBYTECODE would have every one compile it again.
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(CACHE)/pycache

.PHONY: help venv hooks binaries karpenter checkov mkdocs docs images crds lint typecheck unit cluster e2e test demo bench-detection bench-scale bench-probe bench-retention bench-training bench-exposure cluster-up cluster-install cluster-down clean

help:
	@echo "make demo    - the operator as the chart's Pod on a real containerd node; a simulated"
	@echo "               fleet and the real node through the lifecycle (DEMO_ARGS=--simulated-only:"
	@echo "               no real node, the operator as a local process)"
	@echo "make test    - lint, type check, unit, cluster and end-to-end tests"
	@echo "make images  - build the operator and probe images (buildah; cached by content)"
	@echo "make cluster-up | cluster-down - local control plane with a real containerd node"
	@echo "make cluster-install - helm install the operator on it, as cluster-up printed"
	@echo "make crds    - regenerate crds/ and the chart's copy from the pydantic models"
	@echo "make docs    - the docs site (MkDocs, strict) into site/; reference pages from the code"
	@echo "make bench-detection | bench-scale | bench-probe | bench-training | bench-exposure"
	@echo "               - benchmarks (results in bench/results)"

venv: hooks $(VENV)/.complete

# Points git at the repository's hooks (.githooks/commit-msg checks subjects), for
# developers: not in CI, not outside a git checkout, and never over a hooks path
# someone already set.
hooks:
	@if [ -z "$${CI:-}" ] && git rev-parse --is-inside-work-tree >/dev/null 2>&1 \
		&& [ "$$(git rev-parse --show-toplevel)" = "$(CURDIR)" ] \
		&& [ -z "$$(git config --get core.hooksPath)" ]; then \
		git config core.hooksPath .githooks && echo "[hooks] git uses .githooks/ (commit-msg)"; \
	fi

# No file prerequisite: the path is keyed by the dependency list, so a change of
# dependencies makes a new venv, and editing tool settings in pyproject.toml does not.
$(VENV)/.complete:
	@if [ -e "$(VENV)" ] && [ ! -f "$(VENV)/pyvenv.cfg" ]; then \
		echo "[venv] $(VENV) is not a venv (no pyvenv.cfg): not replacing it; VENV names a venv's folder, not its bin/" >&2; \
		exit 2; \
	fi
	@echo "[venv] creating $(VENV) (first time on this machine: torch + torch-xla, ~4 GB download)"
	@rm -rf $(VENV) && $(PYTHON3) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@$(PYTHON3) tests/venv_requirements.py > $(VENV)/requirements.txt
	@$(PY) -m pip install --progress-bar on -r $(VENV)/requirements.txt
	@touch $@

binaries:
	@bash tests/cluster/build-binaries.sh >/dev/null

# Karpenter's kwok cloud provider for the autoscaling tests, built from its Go
# module and cached by version like the control plane.
karpenter:
	@bash tests/autoscaling/build-karpenter.sh >/dev/null

# The manifest scanner the chart tests run, in a venv of its own keyed by its
# version (its pins clash with the project's venv).
checkov:
	@PYTHON3=$(PYTHON3) bash tests/chart/install-checkov.sh >/dev/null

# The docs site's builder (MkDocs and the Material theme), in a venv of its own
# keyed by their versions: a docs tool only, it needs none of the project's pins.
mkdocs:
	@PYTHON3=$(PYTHON3) bash docs/tools/install-mkdocs.sh >/dev/null

# Reference pages are written from the code first (the project's venv imports the
# operator), then the site is built in strict mode: a broken link, a page missing
# from the nav or a figure that names no benchmark result fails.
DOCS_GENERATED ?= $(CURDIR)/.docs-generated
docs: venv mkdocs
	$(PY) docs/tools/gen_reference.py --out $(DOCS_GENERATED)
	SDCGUARD_DOCS_GENERATED=$(DOCS_GENERATED) $$(PYTHON3=$(PYTHON3) bash docs/tools/install-mkdocs.sh) build --strict --site-dir $(CURDIR)/site

# Operator, probe and the local node's pause image, as OCI archives under
# $(CACHE)/images, tagged by content: a machine builds each content once.
images: venv binaries
	@PY=$(PY) bash images/build.sh >/dev/null

crds: venv
	$(PY) -m sdcguard.api.crdgen --out crds --chart charts/sdcguard

lint: venv
	$(VENV)/bin/lint-imports --config pyproject.toml
	$(PY) -m ruff check operator jobs tests bench images
	$(PY) -m ruff format --check operator jobs tests bench images

typecheck: venv
	$(PY) -m mypy operator/sdcguard operator/sdcdev jobs/sdcprobe jobs/sdctrain bench/training

unit: venv checkov
	$(PY) -m pytest -q -m "not cluster and not e2e" tests

cluster: venv binaries karpenter
	$(PY) -m pytest -q -m "cluster and not e2e" tests

e2e: venv binaries
	$(PY) -m pytest -q -m e2e tests

test: hooks lint typecheck binaries karpenter checkov mkdocs
	@PY=$(PY) bash images/build.sh >/dev/null || echo "[images] not built (see above): the tests under tests/realnode will fail; the others run"
	PY=$(PY) bash tests/run-suites.sh

demo: hooks venv binaries
	$(PY) -m sdcdev.sim.demo $(DEMO_ARGS)

cluster-up: venv binaries images
	$(PY) -m sdcdev.cluster.localcluster up --real-node

# The exact helm install that cluster-up printed (images, API server and ports filled in).
cluster-install: venv
	$(PY) -m sdcdev.cluster.localcluster install

cluster-down: venv
	$(PY) -m sdcdev.cluster.localcluster down

bench-detection: venv
	$(PY) -m bench.detection.run --mode $(or $(MODE),quick)

# SCALE_SIZES: the end-to-end run's fleet sizes. 10,000 and 20,000 nodes (100,000 and
# 200,000 Pods) take hours and many GB of memory (bench/results/scale.md); they are
# refused when the memory is not there: make bench-scale SCALE_SIZES=10000,20000
SCALE_SIZES ?= 100,1000,5000
bench-scale: venv binaries
	$(PY) -m bench.scale.run --sizes $(SCALE_SIZES)
	$(PY) -m bench.scale.inventory
	$(PY) -m bench.scale.blast
	$(PY) -m bench.scale.startup

# RETENTION_ARGS: the full size is --nodes 2000 --tests-per-node 400 (800,000 SDCTests).
bench-retention: venv binaries
	$(PY) -m bench.retention.run $(RETENTION_ARGS)

bench-probe: venv
	$(PY) -m bench.probe.run

bench-training: venv
	$(PY) -m bench.training.run

# A simulated fleet of 2,000 nodes over 180 days per policy, scheduled by the
# operator's own budgets and order: exposure of faulty nodes to work.
bench-exposure: venv
	$(PY) -m bench.exposure.run

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache
