# The two commands the README promises: `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build test demo deps venv bench-scheduler clean

all: build

build:
	$(CARGO) build --release --workspace

# System packages the tests need; installed when missing (root), else listed.
deps:
	@bash scripts/deps.sh

# The project venv: Python packages the tests use. `darshan` (pydarshan,
# which bundles darshan-util's reader) lets `sluice what-if` read Darshan
# logs; it also ships the real DXT logs the tests replay.
VENV := .venv
venv: $(VENV)/.ready

$(VENV)/.ready:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check darshan
	touch $@

# Build first: tests start the `sluice` binary and preload its library.
test: deps venv build
	$(CARGO) test --workspace --release --no-fail-fast

demo: build
	@bash scripts/demo.sh

bench-scheduler: build
	./target/release/sluice bench scheduler --json out/bench-scheduler.json

clean:
	$(CARGO) clean
