#!/usr/bin/env bash
# `make install` into a temporary prefix, then check what an operator
# would: the command runs from there, `sluice run` finds the interposer in
# ../lib, `man sluice-serve` finds its page through MANPATH, and the Python
# package imports from the prefix. Run by `make test` (after the build and
# the venv exist) and by `make test-install`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
make=${MAKE:-make}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
$make -s install PREFIX="$prefix" >/dev/null
fail() { echo "test-install: $*" >&2; exit 1; }
[ -x "$prefix/bin/sluice" ] || fail "no $prefix/bin/sluice"
[ -f "$prefix/lib/libsluice_preload.so" ] || fail "no $prefix/lib/libsluice_preload.so"
"$prefix/bin/sluice" --version >/dev/null || fail "the installed sluice does not run"
for page in sluice sluice-serve sluice-run sluice-bench-matrix; do
  [ -f "$prefix/share/man/man1/$page.1" ] || fail "no man page $page.1"
done
out=$(MANPATH="$prefix/share/man" MANPAGER=cat MANWIDTH=80 man sluice-serve 2>&1) || fail "man sluice-serve: $out"
grep -q -- "--listen" <<<"$out" || fail "man sluice-serve does not show --listen: $out"
grep -q "sluice-serve" <<<"$out" || fail "man sluice-serve has no NAME: $out"
site=$(ls -d "$prefix"/lib/python3*/site-packages 2>/dev/null | head -1)
[ -n "$site" ] || fail "no Python package under $prefix/lib/python3*/site-packages"
got=$(cd / && PYTHONPATH="$site" "$root/.venv/bin/python" -c "import sluice, sluice._sluice; print(sluice.__file__)") || fail "the installed Python package does not import"
case "$got" in "$site"/*) ;; *) fail "sluice imported from $got, not from the prefix" ;; esac
echo "test-install: ok (binary, interposer, $(ls "$prefix/share/man/man1" | wc -l) man pages, Python package in $prefix)"
