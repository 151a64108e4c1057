#!/bin/bash
# python3 running an allocation-heavy workload must print the same output
# with and without hakmem preloaded.
set -euo pipefail
NAME=python
# shellcheck source=tests/real/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

command -v python3 >/dev/null || fail "python3 not installed"
require_lib
# Resolve wrappers (e.g. pyenv shims) so timing goes to Python itself.
PY=$(python3 -c 'import sys; print(sys.executable)')
# PYTHONMALLOC=malloc sends every object allocation to malloc (not pymalloc
# arenas), so the test exercises the allocator rather than Python's own pool.
export PYTHONHASHSEED=0 PYTHONMALLOC=malloc

rc=0
# (600 s: a few seconds on glibc, several times that in checked mode.)
run_case plain "$TMP/plain.out" "$TMP/plain.err" 600 "$PY" "$HERE/workload.py" || rc=$?
[ "$rc" -eq 0 ] || fail "plain run: $(describe_rc "$rc"): $(last_err "$TMP/plain.err")"
grep -q '^done$' "$TMP/plain.out" || fail "plain run did not finish"

run_case hakmem "$TMP/hak.out" "$TMP/hak.err" 600 "$PY" "$HERE/workload.py" || rc=$?
[ "$rc" -eq 0 ] || fail "hakmem run: $(describe_rc "$rc"): $(last_err "$TMP/hak.err")"
check_no_diag "$TMP/hak.err"

# Python really ran on hakmem (maps of a preloaded interpreter).
maps=$(LD_PRELOAD=$LIB "$PY" -c 'print(open("/proc/self/maps").read())')
grep -q libhakmem <<<"$maps" || fail "libhakmem not mapped in python"

cmp -s "$TMP/plain.out" "$TMP/hak.out" ||
    fail "output differs: $(diff_head "$TMP/plain.out" "$TMP/hak.out")"
pass
