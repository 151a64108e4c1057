#!/bin/bash
# GNU sort over a ~50 MB generated file (plain, numeric on a key, unique on
# a key): the sha256 of every output must match with and without hakmem.
set -euo pipefail
NAME='sort'
# shellcheck source=tests/real/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

require_lib
export LC_ALL=C
AWK=$(command -v gawk || command -v awk)

# ~1.6M lines of "word number word number": generated once, read by both runs.
timeout "$(scaled_limit 600)" "$AWK" 'BEGIN {
    srand(42)
    for (i = 0; i < 1600000; i++)
        printf "w%06d %d x%05d %.3f\n", int(rand() * 200000), int(rand() * 1000000000),
            int(rand() * 50000), rand() * 1000
}' >"$TMP/in.txt"
size=$(stat -c %s "$TMP/in.txt")
[ "$size" -gt 40000000 ] || fail "generated input only $size bytes"

# Each mode: three sorts, one line per output digest.
sorts() {
    set -euo pipefail
    sort -S 64M "$1" | sha256sum
    sort -S 64M -n -k2 "$1" | sha256sum
    sort -S 16M -u -k3,3 "$1" | sha256sum
    sort -S 64M -t ' ' -k4,4g -k1,1r "$1" | sha256sum
}
for mode in plain hakmem; do
    rc=0
    run_case "$mode" "$TMP/$mode.out" "$TMP/$mode.err" 600 \
        bash -c "$(declare -f sorts); sorts $TMP/in.txt" || rc=$?
    [ "$rc" -eq 0 ] || fail "$mode run: $(describe_rc "$rc"): $(last_err "$TMP/$mode.err")"
done
check_no_diag "$TMP/hakmem.err"
[ "$(wc -l <"$TMP/plain.out")" -eq 4 ] || fail "plain run: expected 4 digests"
# The digest of the plain sort must be the digest of the input sorted (sanity
# that sort actually ran on the data, not on an empty stream).
empty=$(printf '' | sha256sum)
! grep -qF "$empty" "$TMP/plain.out" || fail "plain run: a sort produced no output"
cmp -s "$TMP/plain.out" "$TMP/hakmem.out" ||
    fail "sha256 differs: $(diff_head "$TMP/plain.out" "$TMP/hakmem.out")"
pass
