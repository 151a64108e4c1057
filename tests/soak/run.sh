#!/bin/bash
# make soak: minutes of load on hakmem with content checks (tests/soak/README.md).
#   1. soak/mt: tests/soak/soak_mt.c, SOAK_THREADS (default 4) threads for
#      SOAK_SECONDS (default 300) under LD_PRELOAD=libhakmem.so;
#   2. soak/redis-*: tests/soak/redis.sh, redis-server under jemalloc, hakmem
#      and mimalloc with the same redis-benchmark traffic (about SOAK_SECONDS/3
#      each) and content checks; hakmem's fragmentation <= 1.2 x jemalloc's.
# env: SOAK_SECONDS, SOAK_THREADS, SOAK_PARTS (default "mt redis"),
#      SOAK_BASELINE=1 (soak_mt also without the preload, on glibc, for
#      comparison), LIB (default out/release/libhakmem.so).
# One PASS/FAIL line per check, then the tables, also written to
# out/soak/report.md; exit 1 on any FAIL. Any "hakmem:" line on stderr fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tests/soak
cd "$ROOT"
SOAK_SECONDS=${SOAK_SECONDS:-300}
SOAK_THREADS=${SOAK_THREADS:-4}
SOAK_PARTS=${SOAK_PARTS:-mt redis}
SOAK_BASELINE=${SOAK_BASELINE:-0}
LIB=${LIB:-$ROOT/out/release/libhakmem.so}
OUT=$ROOT/out/soak
MIMALLOC=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2

case $SOAK_SECONDS in '' | *[!0-9]* | 0)
    echo "tests/soak/run.sh: SOAK_SECONDS must be a positive whole number of seconds" >&2
    exit 2
    ;;
esac
mkdir -p "$OUT"
rm -f "$OUT/report.md" "$OUT/redis.md"

fails=0
lines=()
result() { # result PASS|FAIL|SKIP NAME [WHY]
    local l="$1 soak/$2${3:+: $3}"
    echo "$l"
    lines+=("$l")
    [ "$1" = FAIL ] && fails=$((fails + 1))
    return 0
}

# A copy of the library: the run takes minutes, and a rebuild of
# out/release meanwhile must not change what later processes load.
if [ ! -f "$LIB" ]; then
    result FAIL setup "library $LIB not found (run make release)"
    exit 1
fi
# (A new file renamed into place: a process still mapping an older copy keeps it.)
cp -L "$LIB" "$OUT/libhakmem.so.tmp.$$"
mv -f "$OUT/libhakmem.so.tmp.$$" "$OUT/libhakmem.so"
SOLIB=$OUT/libhakmem.so
maps=$(LD_PRELOAD=$SOLIB cat /proc/self/maps 2>&1) || maps=
if ! grep -q libhakmem <<<"$maps"; then
    result FAIL setup "LD_PRELOAD=$SOLIB did not load libhakmem"
    exit 1
fi
rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
[ -z "$(git -C "$ROOT" status --porcelain -- core include Makefile 2>/dev/null)" ] || rev="$rev+dirty"
build="hakmem $rev, library built $(date -r "$LIB" '+%F %T')"
echo "soak: SOAK_SECONDS=$SOAK_SECONDS, $build, $(nproc) CPUs"

# ---- soak_mt ------------------------------------------------------------------------
mt_rows=()
# run_mt NAME PRELOAD: soak_mt for SOAK_SECONDS, one result line.
run_mt() {
    local name=$1 pre=$2 log=$OUT/$1.log errf=$OUT/$1.stderr rc=0
    local limit=$((SOAK_SECONDS + SOAK_SECONDS / 5 + 120))
    echo "soak/$name: soak_mt $SOAK_THREADS threads, $SOAK_SECONDS s${pre:+, LD_PRELOAD=$pre} (log $log)"
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" env ${pre:+LD_PRELOAD=$pre} "$OUT/soak_mt" "$SOAK_THREADS" "$SOAK_SECONDS" \
        2>"$errf" | tee "$log" || rc=${PIPESTATUS[0]}
    [ -s "$errf" ] && sed 's/^/  stderr: /' "$errf" | head -n 60
    local summary
    summary=$(grep -E '^soak_mt: (PASS|FAIL) ' "$log" | tail -n 1 || true)
    kv() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$summary"; }
    local why=
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="timed out after $limit s (hang)"
    elif [ "$rc" -gt 128 ]; then why="killed by signal $((rc - 128))"
    elif [ "$rc" -ne 0 ]; then why="exit status $rc"
    elif [[ $summary != "soak_mt: PASS "* ]]; then why="no PASS summary line"
    fi
    local first
    first=$(grep -m1 -E '^hakmem:' "$errf" || true)
    [ -z "$first" ] || why="${why:+$why; }hakmem diagnostic: $first"
    first=$(grep -m1 -E 'CONTENT MISMATCH|CHECK FAILED|HANG' "$errf" || true)
    [ -z "$first" ] || why="${why:+$why; }$first"
    if [ -n "$why" ]; then result FAIL "$name" "$why"; else result PASS "$name"; fi
    local hwm alloc="glibc (no preload)"
    [ -z "$pre" ] || alloc="hakmem (LD_PRELOAD)"
    hwm=$(kv peak_rss_kib)
    mt_rows+=("| $name | $alloc | $(kv threads) | $(kv seconds) | $(kv ops) | $(kv ops_per_s) | $(kv threads_started) | $(kv forks) | $(kv xthread_frees) | $(awk -v k="$hwm" 'BEGIN { if (k == "") print "?"; else printf "%.1f MiB", k / 1024 }') | $(kv peak_live_mib) MiB | $([ -n "$why" ] && echo FAIL || echo PASS) |")
}

if [[ " $SOAK_PARTS " == *" mt "* ]]; then
    if ! cc -O2 -pthread -std=gnu11 -Wall -Wextra -o "$OUT/soak_mt" "$HERE/soak_mt.c" 2>"$OUT/build.log"; then
        cat "$OUT/build.log"
        result FAIL mt "soak_mt.c does not build"
    else
        run_mt mt "$SOLIB"
        [ "$SOAK_BASELINE" = 1 ] && run_mt mt-glibc ""
    fi
fi

# ---- redis ---------------------------------------------------------------------------
if [[ " $SOAK_PARTS " == *" redis "* ]]; then
    if [ ! -r "$MIMALLOC" ]; then
        echo "soak: installing libmimalloc2.0 for the redis comparison" >&2
        sudo=()
        [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
        export DEBIAN_FRONTEND=noninteractive
        if ! timeout 300 "${sudo[@]}" apt-get install -y -q --no-install-recommends libmimalloc2.0 >&2; then
            timeout 300 "${sudo[@]}" apt-get update -q >&2 || true
            timeout 300 "${sudo[@]}" apt-get install -y -q --no-install-recommends libmimalloc2.0 >&2 ||
                echo "soak: could not install libmimalloc2.0; the mimalloc column is skipped" >&2
        fi
    fi
    rc=0
    LIB=$SOLIB SOAK_OUT=$OUT MIMALLOC=$MIMALLOC SOAK_SECONDS=$SOAK_SECONDS \
        timeout -k 10 $((SOAK_SECONDS * 4 + 1800)) "$HERE/redis.sh" 2>&1 | tee "$OUT/redis.out" ||
        rc=${PIPESTATUS[0]}
    while IFS= read -r l; do
        lines+=("$l")
        [[ $l == FAIL* ]] && fails=$((fails + 1))
    done < <(grep -E '^(PASS|FAIL|SKIP) soak/' "$OUT/redis.out")
    if [ "$rc" -ne 0 ] && ! grep -q '^FAIL soak/' "$OUT/redis.out"; then
        result FAIL redis "tests/soak/redis.sh: exit status $rc"
    fi
fi

# ---- report ----------------------------------------------------------------------------
{
    echo "# hakmem soak report"
    echo
    echo "$(date '+%F %T'), SOAK_SECONDS=$SOAK_SECONDS, $build, $(nproc) CPUs, $(uname -r)"
    echo
    for l in "${lines[@]}"; do echo "    $l"; done
    if [ "${#mt_rows[@]}" -gt 0 ]; then
        echo
        echo "### soak_mt (multi-threaded mixed workload with content checks)"
        echo
        echo "| run | allocator | threads | seconds | ops | ops/s | threads started | forks | cross-thread frees | peak RSS (VmHWM) | peak live | result |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
        printf '%s\n' "${mt_rows[@]}"
    fi
    if [ -f "$OUT/redis.md" ]; then
        echo
        cat "$OUT/redis.md"
    fi
} >"$OUT/report.md"
echo
echo "---- $OUT/report.md"
cat "$OUT/report.md"
[ "$fails" -eq 0 ]
