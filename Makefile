# The two commands the README promises: `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build test demo deps venv python bench-scheduler clean

all: build

build:
	$(CARGO) build --release --workspace

# System packages the tests need; installed when missing (root), else listed.
deps:
	@bash scripts/deps.sh

# The project venv, on Debian's Python so that Debian's mpi4py (built for
# its OpenMPI) is seen: `darshan` (pydarshan, which bundles darshan-util's
# reader) lets `sluice what-if` read Darshan logs and ships the DXT logs the
# tests replay; pytest runs the Python package's tests.
VENV := .venv
PYTHON_SYS ?= /usr/bin/python3
venv: $(VENV)/.ready

$(VENV)/.ready: Makefile
	$(PYTHON_SYS) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check darshan pytest zarr xarray matplotlib
	touch $@

# The Python package (python/: maturin + PyO3), built into the venv.
python: venv
	CARGO_TARGET_DIR=$(CURDIR)/target/python $(VENV)/bin/pip install -q --disable-pip-version-check ./python

# Build first: tests start the `sluice` binary and preload its library.
test: deps venv build python
	$(CARGO) test --workspace --release --no-fail-fast
	mpirun --allow-run-as-root --oversubscribe -np 4 $(VENV)/bin/python -m pytest -q -p no:cacheprovider python/tests

demo: build
	@bash scripts/demo.sh

bench-scheduler: build
	./target/release/sluice bench scheduler --json out/bench-scheduler.json

clean:
	$(CARGO) clean
