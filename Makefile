# resourcewatch — `make help` lists the targets.
SHELL := /bin/bash
CARGO ?= cargo
K ?= 10
INTERVAL ?= 2s

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Install system packages (clang-14, libbpf-dev, protoc, perf) when missing
	@.ci/install-deps

.PHONY: corpus-deps
corpus-deps: ## Install the leak corpus's runtimes (python3, nodejs, openjdk-17, golang) when missing
	@.ci/install-deps --corpus

.PHONY: corpus
corpus: deps corpus-deps ## Run the leak corpus live (11 min, root), print LEAKS.md's table, re-record its traces
	$(CARGO) build --release -p resourcewatch-bench -p resourcewatch-workloads
	./target/release/resourcewatch-bench corpus --record node-agent/corpus/traces/run$$(date +%Y%m%d-%H%M)

.PHONY: build
build: deps ## Build everything in release mode
	$(CARGO) build --release --workspace --bins

.PHONY: top
top: ## Run the standalone agent's live Top-K view on this machine (root: re-runs itself through sudo)
ifeq ($(AS_ROOT),)
top: deps
	$(CARGO) build --release -p resourcewatch-agent
	./target/release/resourcewatch-agent top -k $(K) --interval $(INTERVAL)
else
	$(AS_ROOT) $(MAKE) top K=$(K) INTERVAL=$(INTERVAL)
endif

.PHONY: probe
probe: deps ## Report what this kernel allows (BTF, tracepoints, cgroups, privileges)
	$(CARGO) run --release -q -p resourcewatch-agent -- probe

.PHONY: generate
generate: ## Regenerate the CRD YAML (crds/, config/crd/, the chart's files/crds/) from the Rust types, and config/ from the chart
	$(CARGO) run -q -p resourcewatch-crds --bin crdgen > crds/resourcewatch.io_resourcewatches.yaml
	cp crds/resourcewatch.io_resourcewatches.yaml config/crd/resourcewatch.io_resourcewatches.yaml
	cp crds/resourcewatch.io_resourcewatches.yaml charts/resourcewatch/files/crds/resourcewatch.io_resourcewatches.yaml
	$(CARGO) run -q -p resourcewatch-crds --bin crdgen cluster > crds/resourcewatch.io_clusterresourcewatches.yaml
	cp crds/resourcewatch.io_clusterresourcewatches.yaml config/crd/resourcewatch.io_clusterresourcewatches.yaml
	cp crds/resourcewatch.io_clusterresourcewatches.yaml charts/resourcewatch/files/crds/resourcewatch.io_clusterresourcewatches.yaml
	$(CARGO) run -q -p resourcewatch-crds --bin crdgen policy > crds/resourcewatch.io_remediationpolicies.yaml
	cp crds/resourcewatch.io_remediationpolicies.yaml config/crd/resourcewatch.io_remediationpolicies.yaml
	cp crds/resourcewatch.io_remediationpolicies.yaml charts/resourcewatch/files/crds/resourcewatch.io_remediationpolicies.yaml
	charts/config.py

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt --all

.PHONY: lint
lint: deps ## rustfmt check, clippy with warnings as errors, and the benchmark report against its kept runs
	$(CARGO) fmt --all -- --check
	python3 bench/tables.py --check
	$(CARGO) clippy $(if $(LINT_TARGET_DIR),--target-dir $(LINT_TARGET_DIR)) --workspace --all-targets -- -D warnings

.PHONY: build-tests
build-tests: deps ## The debug builds the test steps run (the operator and plugin, every test binary), so later steps start warm
	@# The later steps' own cargo invocations, each once: a package set resolves its own
	@# dependency features, so `--workspace` alone would leave some of theirs to build.
	$(CARGO) build -p resourcewatch-operator -p kubectl-resourcewatch
	$(CARGO) test -p resourcewatch-e2e --no-run
	$(CARGO) test -p resourcewatch-agent --lib --test kernel --test stacks --no-run
	$(CARGO) test --workspace --no-run

.PHONY: unit
SKIPPED_TESTS := $(or $(CARGO_TARGET_DIR),target)/tmp/skipped-tests.txt

unit: deps ## Unit and kernel integration tests (without root/BTF kernel tests skip and are listed; RW_REQUIRE_PRIVILEGED_TESTS=1 makes a skip a failure)
	@rm -f $(SKIPPED_TESTS)
	$(CARGO) test --workspace --no-fail-fast -- --test-threads=1
	@if [ -s $(SKIPPED_TESTS) ]; then \
	  echo "== $$(wc -l < $(SKIPPED_TESTS)) tests skipped (they need root, BTF and the kernel's tracepoints):"; \
	  sed 's/^/   /' $(SKIPPED_TESTS); \
	else echo "== no test skipped"; fi

.PHONY: vm-kernel
vm-kernel: deps ## The agent's kernel and stack tests again on Linux 6.1 with cgroup v2 only, in a QEMU/TCG VM (the CI subset; ALL=1: every test, about an hour)
ifeq ($(AS_ROOT),)
	e2e/run-vm-kernel-tests.sh $(if $(ALL),--all,)
else
	$(AS_ROOT) $(MAKE) vm-kernel ALL=$(ALL)
endif

.PHONY: fuzz fuzz-ci
FUZZ_SECONDS ?= 300
fuzz: ## Fuzz what the agent reads from workloads and the operator from agents and users (cargo-fuzz, ASan; FUZZ_SECONDS per target, findings kept in the corpora)
	e2e/run-fuzz.sh --keep $(FUZZ_SECONDS)

fuzz-ci: ## The fuzz targets under libFuzzer, 15 s each from their committed corpora (make test replays the corpora with mutations in its unit step instead: e2e/fuzz-replay)
	e2e/run-fuzz.sh 15

.PHONY: demo
# demo, test and top need root (a cluster, BPF). Run as root they run here; run as a
# sudo user they re-run themselves through sudo, so `make demo` works verbatim for both
# (a fresh machine logged in as root has no sudo binary at all).
# A user's PATH usually lacks the sbin directories root's has (iptables, modprobe, sysctl,
# ip): they are added, after the user's own (where cargo is).
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo -E env "PATH=$$PATH:/usr/local/sbin:/usr/sbin:/sbin")

demo: ## Local cluster demo: cluster up, images, install via config/, workloads + sample, kubectl get resourcewatch -o wide
ifeq ($(AS_ROOT),)
demo: deps
	e2e/demo.sh
else
	$(AS_ROOT) $(MAKE) demo
endif

.PHONY: down
down: ## Stop the local cluster and leave the machine as it was (then checks it)
ifeq ($(AS_ROOT),)
	e2e/cluster/down.sh
	e2e/cluster/check-clean.sh
else
	$(AS_ROOT) $(MAKE) down
endif

.PHONY: e2e
e2e: deps ## End-to-end tests on the real single-node cluster (installs through config/; down + clean check after)
	e2e/run-cluster-tests.sh

.PHONY: e2e-api
e2e-api: deps ## Operator API tests against a real kube-apiserver (started and stopped here; RW_E2E_KUBECONFIG=FILE opts in to another cluster)
	e2e/run-api-tests.sh

.PHONY: scale
scale: deps ## The operator at 1,000 nodes / 20,000 pods / 500 watches against a real kube-apiserver (started and stopped here; about 20 min); e2e/scale/scale.csv and scale.png
	e2e/run-scale.sh

.PHONY: scale-ci
scale-ci: deps ## The operator at 100 nodes / 2,000 pods / 50 watches; fails on a figure over x2 e2e/scale/baseline-ci.json (a regression check, not in make test: its figures are timings)
	e2e/run-scale.sh --ci

.PHONY: chart
chart: ## Render the Helm chart offline, check it, and check that config/ is its render (see charts/README.md)
	charts/check.sh

.PHONY: chart-install
chart-install: deps ## Install, upgrade and uninstall the chart with Helm's engine on the local cluster (started and stopped when down; root)
	e2e/run-chart-install.sh

.PHONY: krew
krew: deps ## The kubectl plugin's krew archive and manifest (static binary, sha256 filled in): target/krew/
	kubectl-plugin/krew/build.sh

.PHONY: rules
rules: ## promtool check + test of the alerting rules (config/prometheus/; Debian's promtool, cached)
	e2e/prometheus/check-rules.sh

.PHONY: test
test: ## Everything CI runs: lint, unit, kernel (6.18/v1 here, 6.1/v2 in a VM), fuzz, drift, API, chart and cluster e2e tests
ifeq ($(AS_ROOT),)
# Each step runs even when one before it failed; the end of the output names the failed
# tests and times every step (.ci/steps). Two lanes: the cluster's (the debug builds, the
# API tests, the cluster e2e) in order, and beside it the steps that need no cluster, each
# started at a mark (e2e/ci-sync.sh): the unit tests once the cluster's own builds are done
# (chain) and before the cluster tests start, clippy at the lowest priority in its own
# target directory (cargo holds a target directory's lock through a compile: a starved
# clippy must not hold back the cluster lane's cargo), the kernel tests in the VM after the
# cluster tests, beside the metrics and remediation tests (the VM node waits for them). Why: docs/development.md.
test: deps
	RW_PREBUILD=1 LINT_TARGET_DIR=$(or $(CARGO_TARGET_DIR),target)/lint .ci/steps \
	  --beside "unit@chain lint/19 vm-kernel@cluster-tests-done rules/19 chart/19" build-tests e2e-api e2e
else
	$(AS_ROOT) $(MAKE) test
endif

.PHONY: trials
trials: ## The pre-OOM remediation trials of operator/REMEDIATION.md on the local cluster (root; about 15 min): output in operator/trials/DATE.md
ifeq ($(AS_ROOT),)
trials: deps
	e2e/run-trials.sh $(ARGS)
else
	$(AS_ROOT) $(MAKE) trials
endif

.PHONY: bench
bench: deps ## The runs behind node-agent/BENCHMARKS.md, 3 of each table, kept in node-agent/bench-runs/ (root, idle machine; about 90 minutes; ONLY="words": those tables)
	$(CARGO) build --release -p resourcewatch-agent -p resourcewatch-bench -p resourcewatch-workloads
	bench/reports.sh $(ONLY)

IMAGE_TAG ?= 0.1.0
STATIC_TARGET := x86_64-unknown-linux-gnu
STATIC_DIR := $(or $(CARGO_TARGET_DIR),target)/$(STATIC_TARGET)/release

.PHONY: images images-locked
images: deps ## Build the operator, agent and workload images (static binaries; docker-archive tarballs in target/images/, no Docker needed)
	@# One build at a time: CI's prebuild and the e2e step may both run it, and two
	@# rustc or cc runs writing one output in target/images/ remove each other's
	@# temporary objects (a cold CI run failed so, linking burn-rs). The second waits,
	@# then finds everything built.
	@mkdir -p target
	flock target/.images.lock $(MAKE) --no-print-directory images-locked

images-locked:
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release --target $(STATIC_TARGET) \
	  -p resourcewatch-operator -p resourcewatch-agent -p resourcewatch-workloads --bin resourcewatch-operator --bin resourcewatch-agent --bin leak-sim
	mkdir -p target/images
	e2e/cluster/image.sh localhost/resourcewatch/operator:$(IMAGE_TAG) target/images/operator.tar $(STATIC_DIR)/resourcewatch-operator
	e2e/cluster/image.sh localhost/resourcewatch/agent:$(IMAGE_TAG) target/images/agent.tar $(STATIC_DIR)/resourcewatch-agent
	e2e/cluster/image.sh localhost/resourcewatch/workloads:$(IMAGE_TAG) target/images/workloads.tar $(STATIC_DIR)/leak-sim
	@# The stack fixture leaking in a known C function (frame pointers, glibc from this
	@# machine as a shared library): what the e2e's growth-site test must name.
	@# Beside it the CPU burner whose hot loop is burn_here (what the e2e's profile must
	@# name), and both fixtures in Go (frame pointers) and Rust (none: rustc's release
	@# default), static binaries.
	cc -O2 -fno-omit-frame-pointer -o target/images/leak-c node-agent/tests/fixtures/stacks/leak.c
	cc -O2 -fno-omit-frame-pointer -o target/images/burn-c node-agent/tests/fixtures/stacks/burn.c
	@# The same two built as distributions build C: -O2, no frame pointers (walked with .eh_frame).
	cc -O2 -fomit-frame-pointer -o target/images/leak-c-nofp node-agent/tests/fixtures/stacks/leak.c
	cc -O2 -fomit-frame-pointer -o target/images/burn-c-nofp node-agent/tests/fixtures/stacks/burn.c
	for f in leak burn; do \
	  GO111MODULE=off GOCACHE=$(CURDIR)/target/gocache go build -o target/images/$$f-go node-agent/tests/fixtures/stacks/$$f.go && \
	  rustc -O -C target-feature=+crt-static --target $(STATIC_TARGET) -o target/images/$$f-rs node-agent/tests/fixtures/stacks/$$f.rs || exit 1; \
	done
	@# The hostile workload: crafted ELF files, a FIFO, a truncated mapping, a fake
	@# JVM, a huge perf map and a chroot symlink, around a library that leaks and burns.
	cc -O2 -fno-omit-frame-pointer -o target/images/hostile node-agent/tests/fixtures/hostile/hostile.c -lpthread
	cc -O2 -fno-omit-frame-pointer -shared -fPIC -o target/images/libtenant.so node-agent/tests/fixtures/hostile/libtenant.c
	e2e/cluster/image.sh --with-libs --path /leak-c --add target/images/burn-c:/burn-c \
	  --add target/images/hostile:/hostile --add target/images/libtenant.so:/app/libtenant.so \
	  --add target/images/leak-c-nofp:/leak-c-nofp --add target/images/burn-c-nofp:/burn-c-nofp \
	  --add target/images/leak-go:/leak-go --add target/images/burn-go:/burn-go \
	  --add target/images/leak-rs:/leak-rs --add target/images/burn-rs:/burn-rs \
	  localhost/resourcewatch/c-workloads:$(IMAGE_TAG) target/images/c-workloads.tar target/images/leak-c
	@# A real runtime for the e2e warm-up pod: this machine's node and its libraries, and the
	@# corpus's Node.js program (make corpus-deps installs node when missing).
	@.ci/install-deps --node
	e2e/cluster/image.sh --with-libs --path /usr/bin/node --add node-agent/corpus/programs/mem.js:/mem.js \
	  --add node-agent/tests/fixtures/stacks/leak.js:/leak.js --add node-agent/tests/fixtures/stacks/burn.js:/burn.js \
	  localhost/resourcewatch/node-workloads:$(IMAGE_TAG) target/images/node-workloads.tar "$$(readlink -f "$$(command -v node)")"
	@# CPython 3.12 (perf trampolines, `-X perf`) from pyenv (e2e/cluster/python-image.sh):
	@# the interpreter at /usr/local/bin/python3 (stdlib landmark /usr/local/lib/python3.x/os.py),
	@# libpython at its own path, the few modules `-S` start-up imports, the fixtures.
	e2e/cluster/python-image.sh localhost/resourcewatch/python-workloads:$(IMAGE_TAG) target/images/python-workloads.tar
	@# This machine's OpenJDK 17 runtime and the Java stack fixtures (no JDK tools in it: the
	@# agent asks the JVM for its perf map).
	e2e/cluster/java-image.sh localhost/resourcewatch/java-workloads:$(IMAGE_TAG) target/images/java-workloads.tar
