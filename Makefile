# meshrun: a Kubernetes operator for parallel training jobs.
# `make help` lists the targets. Everything installs what it needs on first use.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV        ?= .venv
PY          := $(VENV)/bin/python
CLUSTER_DIR := .cluster
KUBECTL     := $(CLUSTER_DIR)/bin/kubectl
NODES       ?= 8
PYTEST_ARGS ?=
export KUBECONFIG_LOCAL := $(abspath $(CLUSTER_DIR)/kubeconfig)

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	@echo "== python venv ($(VENV)): torch, kopf, kubernetes, test tools"
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[operator,client,trainer,plot,dev]'
	@touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create the Python virtualenv with every dependency

.PHONY: tools
tools: ## Build the cluster binaries from Go modules (cached in ~/.cache/meshrun)
	hack/build-tools.sh

.PHONY: test-tools
test-tools: ## The binaries every test needs: the control plane's, Kueue's manager, the real node's kubelet, CoreDNS and image registry
	hack/build-tools.sh kube kubelet etcd helm registry kueue kwok coredns

.PHONY: images
images: ## The operator and trainer images in the real node's Docker engine (built here, imported by the tests)
	hack/realnode/deps.sh
	hack/realnode/images.sh build operator meshrun/operator:0.1.0 --no-import
	hack/realnode/images.sh build trainer meshrun/trainer:0.1.0 --no-import

.PHONY: cluster-up
cluster-up: venv tools ## Start (or reuse) the local cluster: NODES fake GPU nodes, plus a real node (REAL_NODE=0 to skip)
	NODES=$(NODES) hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the local control plane and remove its state
	hack/cluster.sh down

.PHONY: lint
lint: venv ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

.PHONY: fmt
fmt: venv ## Apply ruff formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

.PHONY: typecheck
typecheck: venv ## mypy --strict on the core, operator and trainer packages
	$(VENV)/bin/mypy

.PHONY: verify
verify: venv ## Static checks: lint, types, the arrows between the layers, chart CRDs in sync
	$(MAKE) lint typecheck
	$(VENV)/bin/lint-imports
	hack/verify.sh

# The suite runs on TEST_WORKERS xdist workers: the tiers that train (trainer, real node) one
# test at a time on one worker, the tests that wait on the cluster side by side on the others
# (tests/scheduling.py); it ends with the time per tier and the 20 slowest tests.
TEST_WORKERS ?= 4
XDIST := -n $(TEST_WORKERS) --dist loadgroup

# The tests start hundreds of Python processes (the workers, an operator per cluster test, the
# CLI, trainer ranks). Where the environment asks for no bytecode (PYTHONDONTWRITEBYTECODE), each
# of them compiled every module of the project, and each worker rewrote every test module's
# asserts, again on every run; the test targets keep the bytecode (in the ignored __pycache__
# folders): a worker's collection of the suite 15.0 s -> 10.6 s, an operator's start 0.80 s ->
# 0.60 s of CPU.
test test-unit test-trainer test-cluster test-realnode: export PYTHONDONTWRITEBYTECODE =

.PHONY: test-unit
test-unit: venv ## The unit tier: pure tests (no cluster, no process launches)
	$(PY) -m pytest -m unit -n 2 --durations=20 $(PYTEST_ARGS)

.PHONY: test-trainer
test-trainer: venv ## The trainer tier: real trainer processes over gloo on the CPUs
	$(PY) -m pytest -m trainer --durations=20 $(PYTEST_ARGS)

.PHONY: test-cluster
test-cluster: venv test-tools ## The cluster tier without the real node: operator, chart, Kueue (starts the cluster if needed)
	$(PY) -m pytest -m "cluster and not realnode" $(XDIST) --durations=20 $(PYTEST_ARGS)

.PHONY: test-realnode
test-realnode: venv test-tools ## The real-node tier: pods that train on the real kubelet node, the examples
	$(PY) -m pytest -m realnode --durations=20 $(PYTEST_ARGS)

.PHONY: test
test: venv test-tools ## Every test: static checks, then all tiers side by side (starts the cluster if needed)
	$(MAKE) verify
	$(PY) -m pytest $(XDIST) --durations=20 $(PYTEST_ARGS)

.PHONY: demo
demo: cluster-up ## Run the main demo job on the local cluster
	hack/demo.sh

.PHONY: e2e-kind
e2e-kind: ## kind end-to-end, offline (node image built here, cached; KIND_NODE_IMAGE=kindest/node:... to use a published one): helm install, run every example
	hack/e2e-kind.sh

.PHONY: e2e-kind-down
e2e-kind-down: ## Remove what e2e-kind made: the kind cluster and its Docker engine (E2E_KIND_PURGE=1: the cached node image too)
	hack/e2e-kind.sh down

.PHONY: bench
bench: venv tools ## Run the benchmarks under bench/ (prints figures)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

.PHONY: clean
clean: cluster-down ## Remove the venv and local state (the Go build cache stays)
	rm -rf $(VENV) $(CLUSTER_DIR)
