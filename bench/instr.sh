#!/usr/bin/env bash
# Instructions per malloc+free pair of each allocator, counted by callgrind.
#
# usage: bench/instr.sh          (from the repo root; `make bench-instr` calls it)
# env:   ALLOCATORS="hakmem mimalloc glibc jemalloc"   subset/order to measure
#        BENCH_EXTRA="NAME=PATH ..."  more allocators, LD_PRELOADed from PATH
#                                (as bench/run.sh's: e.g. mi3=<libmimalloc-3.4.3.so>)
#        HAKMEM_SO=path          hakmem library (default out/release/libhakmem.so)
#        INSTR_SIZE=64           block size passed to bench_fixed_size
#        INSTR_TIMEOUT=600       seconds before a single valgrind run is killed
#
# For each allocator, runs `out/bench/bench_fixed_size N SIZE 42` under
# `valgrind --tool=callgrind` with N = 1000000 and N = 2000000, and reports
# (Ir(2M) - Ir(1M)) / 1M: the instructions of one more malloc+free pair, with
# process start-up, library initialisation and exit cancelling out. That count
# includes bench_fixed_size's own loop (the same for every allocator); the
# table also gives it without the loop, i.e. minus the growth of main()'s self
# cost (from callgrind_annotate), which leaves the instructions spent in
# malloc and free themselves.
#
# Prints a markdown table (allocator, instructions/pair, ratio to mimalloc,
# and the same two without the bench loop) and saves it to out/bench/instr.md; callgrind's out files and logs go to
# out/bench/instr/. Exits 1 if any run failed (crash, no total in the out
# file, or a library that does not take over malloc/free).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
unset LD_PRELOAD # the glibc row must really be glibc
unset HAKMEM_BENCH_BUDGET # Ir(2M) - Ir(1M) needs all of both runs
ROOT=$PWD
OUT=out/bench
DIR=$OUT/instr
ALLOCATORS=${ALLOCATORS:-hakmem mimalloc glibc jemalloc}
HAKMEM_SO=${HAKMEM_SO:-$ROOT/out/release/libhakmem.so}
SIZE=${INSTR_SIZE:-64}
INSTR_TIMEOUT=${INSTR_TIMEOUT:-600}
SEED=42
N1=1000000
N2=2000000
BIN=bench_fixed_size

if ! [[ $SIZE =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/instr.sh: INSTR_SIZE must be a positive integer (got '$SIZE')" >&2
    exit 2
fi
if ! [[ $INSTR_TIMEOUT =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/instr.sh: INSTR_TIMEOUT must be a positive integer (got '$INSTR_TIMEOUT')" >&2
    exit 2
fi

bench/deps.sh # valgrind, mimalloc, jemalloc
command -v valgrind >/dev/null || {
    echo "bench/instr.sh: valgrind not found (bench/deps.sh should have installed it)" >&2
    exit 1
}
make --no-print-directory -s "$OUT/$BIN"
mkdir -p "$DIR"
rm -f "$DIR"/*.out "$DIR"/*.log

# find_lib SONAME PACKAGE: path of an allocator library
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Does preloading $1 really bind the bench's malloc and free to it? (as in
# run.sh's preflight; checked natively, since LD_DEBUG output under valgrind
# would mix with valgrind's own)
interposes() {
    local so=$1 log=$DIR/preflight.$2.log targets t
    LD_DEBUG=bindings LD_PRELOAD=$so "$OUT/$BIN" 1000 </dev/null >"$log" 2>&1 || true
    targets=$(grep -E "binding file [^ ]*/$BIN \[0\] to .*symbol \`(malloc|free)'" "$log" |
        sed -E 's/.* to ([^ ]+) \[.*/\1/' | sort -u)
    [ -n "$targets" ] || return 1
    for t in $targets; do
        [ "$(realpath "$t" 2>/dev/null)" = "$(realpath "$so")" ] || return 1
    done
}

# Total Ir of a callgrind out file (its `totals:` line, else `summary:`).
total_ir() {
    awk '/^totals:/ { t = $2 } /^summary:/ { s = $2 } END { if (t != "") print t; else if (s != "") print s }' "$1"
}

# Self cost of the bench's main() in a callgrind out file ("" if not found);
# callgrind_annotate lists code inlined from other files as separate entries,
# so add up every `FILE:main` line.
main_self() {
    callgrind_annotate --auto=no --threshold=100 "$1" 2>/dev/null |
        awk '/^ *[0-9,]+ +\([ 0-9.]+%\) +[^ ]*:main( \[[^]]*\])?$/ { gsub(",", "", $1); s += $1; n++ }
             END { if (n) print s }'
}

declare -A IR=() ALLOC_IR=() WHY=()
LOOP=""
allocs=()
nfail=0
fail() { # ALLOCATOR REASON
    WHY[$1]=$2
    nfail=$((nfail + 1))
    echo "bench/instr.sh: $1: FAILED: $2" >&2
}

# The named allocators, then BENCH_EXTRA's (EXTRA_SO: their libraries).
declare -A EXTRA_SO=()
names=()
for a in ${ALLOCATORS//,/ }; do names+=("$a"); done
for e in ${BENCH_EXTRA:-}; do
    a=${e%%=*} p=${e#*=}
    if [[ $e != *=* || -z $a || -z $p || ! $a =~ ^[A-Za-z0-9_.-]+$ ]]; then
        echo "bench/instr.sh: BENCH_EXTRA entries are NAME=PATH (got '$e')" >&2
        exit 2
    fi
    for n in "${names[@]}"; do
        if [ "$n" = "$a" ]; then
            echo "bench/instr.sh: BENCH_EXTRA: allocator '$a' given twice" >&2
            exit 2
        fi
    done
    EXTRA_SO[$a]=$p
    names+=("$a")
done

for a in "${names[@]}"; do
    rc=0
    if [ -n "${EXTRA_SO[$a]+x}" ]; then
        so=""
        if [ -r "${EXTRA_SO[$a]}" ]; then so=$(realpath "${EXTRA_SO[$a]}"); else rc=1; fi
    else
        so=$(allocator_so "$a") || rc=$?
    fi
    if [ $rc -eq 2 ]; then
        echo "bench/instr.sh: unknown allocator '$a' (known: glibc hakmem mimalloc jemalloc)" >&2
        exit 2
    fi
    allocs+=("$a")
    if [ "$a" != glibc ]; then
        if [ $rc -ne 0 ]; then
            fail "$a" "library not found"
            continue
        fi
        if ! interposes "$so" "$a"; then
            fail "$a" "preloading $so does not replace malloc/free (see $DIR/preflight.$a.log)"
            continue
        fi
    fi
    ir=() self=()
    for n in $N1 $N2; do
        f=$DIR/callgrind.$a.$n.out
        log=$DIR/$a.$n.log
        echo "bench/instr.sh: $a: callgrind $BIN $n $SIZE $SEED" >&2
        set +e
        # valgrind passes LD_PRELOAD on to the client (with its own preloads
        # added); no `env` wrapper, or callgrind would trace env instead.
        if [ -n "$so" ]; then
            # (the allocator's own settings, bench/lib.sh, exported in a subshell: no env wrapper)
            ev=$(allocator_env "$a")
            ( [ -z "$ev" ] || export "${ev?}"; LD_PRELOAD=$so timeout -k 5 "$INSTR_TIMEOUT" valgrind --tool=callgrind \
                --callgrind-out-file="$f" "$OUT/$BIN" "$n" "$SIZE" "$SEED" </dev/null >"$log" 2>&1 )
        else
            timeout -k 5 "$INSTR_TIMEOUT" valgrind --tool=callgrind \
                --callgrind-out-file="$f" "$OUT/$BIN" "$n" "$SIZE" "$SEED" </dev/null >"$log" 2>&1
        fi
        rc=$?
        set -e
        t=""
        [ -r "$f" ] && t=$(total_ir "$f")
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            fail "$a" "N=$n timed out after ${INSTR_TIMEOUT}s (see $log)"
            break
        elif [ $rc -gt 128 ]; then
            fail "$a" "N=$n killed by SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128))) (see $log)"
            break
        elif [ $rc -ne 0 ]; then
            fail "$a" "N=$n exited with status $rc (see $log)"
            break
        elif ! grep -q '^Throughput = ' "$log"; then
            fail "$a" "N=$n printed no Throughput line (see $log)"
            break
        elif [ -z "$t" ]; then
            fail "$a" "N=$n: no totals/summary line in $f"
            break
        elif [ -n "$so" ] && ! grep -qF "/$(basename "$so")" "$f"; then
            fail "$a" "N=$n: $(basename "$so") does not appear in $f (not preloaded?)"
            break
        fi
        ir+=("$t")
        self+=("$(main_self "$f")")
    done
    [ -n "${WHY[$a]:-}" ] && continue
    IR[$a]=$(awk -v a="${ir[0]}" -v b="${ir[1]}" -v d=$((N2 - N1)) 'BEGIN { printf "%.1f", (b - a) / d }')
    if [ -n "${self[0]}" ] && [ -n "${self[1]}" ]; then
        ALLOC_IR[$a]=$(awk -v a="${ir[0]}" -v b="${ir[1]}" -v ma="${self[0]}" -v mb="${self[1]}" \
            -v d=$((N2 - N1)) 'BEGIN { printf "%.1f", ((b - mb) - (a - ma)) / d }')
        LOOP=$(awk -v ma="${self[0]}" -v mb="${self[1]}" -v d=$((N2 - N1)) \
            'BEGIN { printf "%.1f", (mb - ma) / d }')
    fi
done

# X / mimalloc's X, as "1.23x" (n/a when either is missing).
vs_mi() {
    if [ -n "$1" ] && [ -n "$2" ]; then
        awk -v x="$1" -v m="$2" 'BEGIN { if (m > 0) printf "%.2fx", x / m; else print "n/a" }'
    else
        echo n/a
    fi
}

# ---- table ----------------------------------------------------------------------
{
    echo "## Instructions per malloc+free pair ($(date '+%F %T %Z'))"
    echo
    echo "callgrind Ir of \`$BIN N $SIZE $SEED\`: (Ir(N=$N2) - Ir(N=$N1)) / $((N2 - N1))."
    echo
    fmt='| %-9s | %17s | %11s | %17s | %11s |\n'
    # shellcheck disable=SC2059
    printf "$fmt" allocator instructions/pair "vs mimalloc" "without loop" "vs mimalloc"
    printf '|-----------|------------------:|------------:|------------------:|------------:|\n'
    for a in "${allocs[@]}"; do
        if [ -n "${IR[$a]:-}" ]; then
            # shellcheck disable=SC2059
            printf "$fmt" "$a" "${IR[$a]}" "$(vs_mi "${IR[$a]}" "${IR[mimalloc]:-}")" \
                "${ALLOC_IR[$a]:-?}" "$(vs_mi "${ALLOC_IR[$a]:-}" "${ALLOC_IR[mimalloc]:-}")"
        else
            # shellcheck disable=SC2059
            printf "$fmt" "$a" FAILED "" "" ""
        fi
    done
    echo
    echo "without loop: minus the bench loop's own instructions (main()'s self cost:"
    echo "${LOOP:-?} per pair), i.e. those spent in malloc and free."
    if [ $nfail -gt 0 ]; then
        echo
        for a in "${allocs[@]}"; do
            [ -n "${WHY[$a]:-}" ] && echo "- $a FAILED: ${WHY[$a]}"
        done
    fi
} | tee "$OUT/instr.md"

if [ $nfail -gt 0 ]; then
    echo "bench/instr.sh: $nfail allocator(s) FAILED; see $DIR/" >&2
    exit 1
fi
