# The two commands the README promises: `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build test test-install demo deps venv python install install-bin install-python bench-scheduler clean

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
	@bash scripts/test-install.sh

# `make install PREFIX=DIR` (default /usr/local; DESTDIR is honoured):
#   DIR/bin/sluice                     the command
#   DIR/lib/libsluice_preload.so       the interposer (`sluice run` looks in ../lib)
#   DIR/share/man/man1/sluice*.1       the manual pages, generated from the CLI
#   DIR/lib/python3.X/site-packages/   the Python package (pip --prefix, from
#                                      the project venv's pip; put that
#                                      directory on PYTHONPATH, or install
#                                      into a venv with `PIP=venv/bin/pip`)
PREFIX ?= /usr/local
PIP ?= $(VENV)/bin/pip
BIN_DIR = $(DESTDIR)$(PREFIX)/bin
LIB_DIR = $(DESTDIR)$(PREFIX)/lib
MAN_DIR = $(DESTDIR)$(PREFIX)/share/man/man1
install: install-bin install-python

install-bin: build
	install -d $(BIN_DIR) $(LIB_DIR) $(MAN_DIR)
	install -m 755 target/release/sluice $(BIN_DIR)/sluice
	install -m 755 target/release/libsluice_preload.so $(LIB_DIR)/libsluice_preload.so
	$(BIN_DIR)/sluice man $(MAN_DIR)

# With the project venv's pip, into the prefix only: --ignore-installed
# keeps pip from uninstalling the venv's own copy (`make python`) first.
install-python: venv
	CARGO_TARGET_DIR=$(CURDIR)/target/python $(PIP) install -q --disable-pip-version-check $(if $(filter $(VENV)/bin/pip,$(PIP)),--prefix $(DESTDIR)$(PREFIX) --ignore-installed --no-deps) ./python

# `make install` into a temporary prefix: the files are there, `man
# sluice-serve` finds its page, and the package imports from the prefix.
test-install:
	@bash scripts/test-install.sh

demo: build
	@bash scripts/demo.sh

bench-scheduler: build
	./target/release/sluice bench scheduler --json out/bench-scheduler.json

clean:
	$(CARGO) clean
