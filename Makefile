# The two commands the README promises: `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build test demo deps bench-scheduler clean

all: build

build:
	$(CARGO) build --release --workspace

# System packages the tests need; installed when missing (root), else listed.
deps:
	@bash scripts/deps.sh

# Build first: tests start the `sluice` binary and preload its library.
test: deps build
	$(CARGO) test --workspace --release --no-fail-fast

demo: build
	@bash scripts/demo.sh

bench-scheduler: build
	./target/release/sluice bench scheduler --json out/bench-scheduler.json

clean:
	$(CARGO) clean
