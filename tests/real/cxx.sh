#!/bin/bash
# A C++17 program (out/tests/cxx_prog, built by `make tests`) must print the
# same summary on glibc, under LD_PRELOAD=hakmem, and when linked with
# -lhakmem (out/tests/cxx_prog_linked). The hakmem runs set
# HAKMEM_EXPECT_LINKED=1 so the program itself checks hakmem is loaded.
# Also: a program that replaced only the unsized operator new and delete
# (out/tests/cxx_replaced) runs cleanly under hakmem's sized delete, and a C
# program under LD_PRELOAD maps no C++ runtime (hakmem's operators reach it
# by weak references only).
set -euo pipefail
NAME=cxx
# shellcheck source=tests/real/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PLAIN=$ROOT/out/tests/cxx_prog
LINKED=$ROOT/out/tests/cxx_prog_linked
[ -x "$PLAIN" ] || fail "$PLAIN missing (run make tests)"
[ -x "$LINKED" ] || fail "$LINKED missing (run make tests)"
REPLACED=$ROOT/out/tests/cxx_replaced
[ -x "$REPLACED" ] || fail "$REPLACED missing (run make tests)"
require_lib

maps=$(LD_PRELOAD=$LIB cat /proc/self/maps)
if grep -E 'libstdc\+\+|libc\+\+' <<<"$maps"; then fail "a C program under LD_PRELOAD maps a C++ runtime"; fi
rc=0
run_case hakmem "$TMP/replaced.out" "$TMP/replaced.err" 60 "$REPLACED" || rc=$?
[ "$rc" -eq 0 ] || fail "replaced operators: $(describe_rc "$rc"): $(last_err "$TMP/replaced.err")"
[ "$(cat "$TMP/replaced.out")" = ok ] || fail "replaced operators: $(cat "$TMP/replaced.out")"
check_no_diag "$TMP/replaced.err"
STATIC=$ROOT/out/tests/cxx_replaced_static
[ -x "$STATIC" ] || fail "$STATIC missing (run make tests)"
run_case plain "$TMP/static.out" "$TMP/static.err" 60 "$STATIC" || rc=$?
[ "$rc" -eq 0 ] || fail "replaced operators, static: $(describe_rc "$rc"): $(last_err "$TMP/static.err")"
[ "$(cat "$TMP/static.out")" = ok ] || fail "replaced operators, static: $(cat "$TMP/static.out")"

rc=0
run_case plain "$TMP/plain.out" "$TMP/plain.err" 60 env -u HAKMEM_EXPECT_LINKED "$PLAIN" || rc=$?
[ "$rc" -eq 0 ] || fail "plain run: $(describe_rc "$rc"): $(last_err "$TMP/plain.err")"
run_case hakmem "$TMP/preload.out" "$TMP/preload.err" 60 env HAKMEM_EXPECT_LINKED=1 "$PLAIN" ||
    rc=$?
[ "$rc" -eq 0 ] || fail "LD_PRELOAD run: $(describe_rc "$rc"): $(last_err "$TMP/preload.err")"
run_case plain "$TMP/linked.out" "$TMP/linked.err" 60 env HAKMEM_EXPECT_LINKED=1 "$LINKED" || rc=$?
[ "$rc" -eq 0 ] || fail "linked run: $(describe_rc "$rc"): $(last_err "$TMP/linked.err")"
check_no_diag "$TMP/preload.err"
check_no_diag "$TMP/linked.err"

[ "$(tail -n 1 "$TMP/plain.out")" = ok ] || fail "plain run did not print ok"
cmp -s "$TMP/plain.out" "$TMP/preload.out" ||
    fail "LD_PRELOAD output differs: $(diff_head "$TMP/plain.out" "$TMP/preload.out")"
cmp -s "$TMP/plain.out" "$TMP/linked.out" ||
    fail "linked output differs: $(diff_head "$TMP/plain.out" "$TMP/linked.out")"
pass
