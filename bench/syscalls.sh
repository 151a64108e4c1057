#!/usr/bin/env bash
# Memory-management system calls of each allocator, counted by strace.
#
# usage: bench/syscalls.sh       (from the repo root; `make bench-syscalls` calls it)
# env:   ALLOCATORS="glibc hakmem mimalloc jemalloc"   subset/order to run
#        BENCH_EXTRA="NAME=PATH ..."  more allocators (as bench/run.sh)
#        WORKLOADS=REGEX         only workloads whose name matches (grep -E)
#        HAKMEM_SO=path          hakmem library (default out/release/libhakmem.so)
#        SYSCALLS_TIMEOUT=300    seconds before a single traced run is killed
#
# Runs each workload below once per allocator under
#   strace -f -c -e trace=mmap,munmap,madvise,mremap,mprotect,brk
# (the allocator preloaded into the bench only, with strace's -E, as run.sh
# preloads it) and prints a markdown table of the calls of each kind. The
# counts are for the whole process: the dynamic loader mapping the libraries,
# libc's and the allocator's initialisation, thread stacks (mmap + mprotect
# of the guard page per thread) and exit are included; the `startup` workload
# (a 1-iteration bench_fixed_size) shows that fixed part for each allocator.
# Unlike timings the counts hardly depend on the machine's load; they do
# depend on the allocators' versions and settings.
#
# Writes out/bench/syscalls.md (the table, also printed) and
# out/bench/syscalls/ (strace's summary and the bench's output of each run).
# Exits 1 if any run failed (crash, timeout, no Throughput line, or a library
# that does not take over malloc/free): its row reads FAILED.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
unset LD_PRELOAD # the glibc rows must really be glibc
unset HAKMEM_BENCH_BUDGET # the counts are for the whole work of each run
ROOT=$PWD
OUT=out/bench
DIR=$OUT/syscalls
ALLOCATORS=${ALLOCATORS:-glibc hakmem mimalloc jemalloc}
WORKLOADS=${WORKLOADS:-}
HAKMEM_SO=${HAKMEM_SO:-$ROOT/out/release/libhakmem.so}
SYSCALLS_TIMEOUT=${SYSCALLS_TIMEOUT:-300}
CALLS=(mmap munmap madvise mremap mprotect brk)

if ! [[ $SYSCALLS_TIMEOUT =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/syscalls.sh: SYSCALLS_TIMEOUT must be a positive integer (got '$SYSCALLS_TIMEOUT')" >&2
    exit 2
fi

# ---- workloads -----------------------------------------------------------------
# One per line, as in run.sh: NAME [VAR=value ...] BINARY [ARGS ...]. The
# iteration counts are run.sh's, so the counts go with its timings.
workload_table() {
    cat <<'EOF'
startup                     bench_fixed_size 1 64 42
random_mixed_16-65536_ws400 HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=65536 bench_random_mixed 1000000 400 42
mid_large_mt_1t             HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=32768 bench_mid_large_mt 1 1500000 256 42
mid_large_mt_2t             HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=32768 bench_mid_large_mt 2 800000 256 42
scenario_mir                bench_scenarios mir 800000 42
realloc_growth              HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=67108864 bench_realloc_growth 20 42
EOF
}

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
read_workloads bench/syscalls.sh

command -v strace >/dev/null || {
    echo "bench/syscalls.sh: strace not found (run bench/deps.sh)" >&2
    exit 1
}

# Build the bench binaries used (bench_fixed_size always: the preflight probe).
PROBE=bench_fixed_size
bins=("$OUT/$PROBE")
for spec in "${wl_specs[@]}"; do
    for w in $spec; do
        if [[ $w != *=* ]]; then
            bins+=("$OUT/$w")
            break
        fi
    done
done
mapfile -t bins < <(printf '%s\n' "${bins[@]}" | sort -u)
make --no-print-directory -s "${bins[@]}"

# ---- allocators ---------------------------------------------------------------
# pick_allocators (bench/lib.sh, sourced above): the allocators to run and their libraries

mkdir -p "$DIR"
rm -f "$DIR"/*.log "$DIR"/*.strace

# Does preloading $1 really bind the bench's malloc and free to it? (run.sh's
# preflight, done natively)
interposes() {
    local so=$1 log=$DIR/preflight.$2.log targets t
    LD_DEBUG=bindings LD_PRELOAD=$so "$OUT/$PROBE" 1000 </dev/null >"$log" 2>&1 || true
    targets=$(grep -E "binding file [^ ]*/$PROBE \[0\] to .*symbol \`(malloc|free)'" "$log" |
        sed -E 's/.* to ([^ ]+) \[.*/\1/' | sort -u)
    [ -n "$targets" ] || return 1
    for t in $targets; do
        [ "$(realpath "$t" 2>/dev/null)" = "$(realpath "$so")" ] || return 1
    done
}

declare -A SO=() BROKEN=()
pick_allocators bench/syscalls.sh
for a in "${allocs[@]}"; do
    so=${SO[$a]}
    if [ -n "$so" ] && ! interposes "$so" "$a"; then
        echo "bench/syscalls.sh: ERROR: preloading $so does not replace malloc/free" \
            "(see $DIR/preflight.$a.log); all $a rows count as FAILED" >&2
        BROKEN[$a]="malloc/free not interposed by $so"
    fi
done

# ---- runs ---------------------------------------------------------------------
# count FILE CALL: the calls column of CALL in strace -c's summary (0 if absent).
count() {
    awk -v c="$2" '$NF == c && $1 ~ /^[0-9.]+$/ { n = $4 } END { print n + 0 }' "$1"
}

rows=()
failed=()
for i in "${!wl_names[@]}"; do
    name=${wl_names[$i]}
    for a in "${allocs[@]}"; do
        log=$DIR/$name.$a.log st=$DIR/$name.$a.strace
        envs=() cmd=()
        for w in ${wl_specs[$i]}; do
            if [ ${#cmd[@]} -eq 0 ] && [[ $w == *=* ]]; then
                envs+=(-E "$w")
            elif [ ${#cmd[@]} -eq 0 ]; then
                cmd+=("$OUT/$w")
            else
                cmd+=("$w")
            fi
        done
        [ -n "${SO[$a]}" ] && envs+=(-E "LD_PRELOAD=${SO[$a]}")
        reason=""
        if [ -n "${BROKEN[$a]:-}" ]; then
            reason=${BROKEN[$a]}
        else
            set +e
            timeout -k 5 "$SYSCALLS_TIMEOUT" strace -f -c -e trace=mmap,munmap,madvise,mremap,mprotect,brk \
                -o "$st" "${envs[@]}" "${cmd[@]}" </dev/null >"$log" 2>&1
            rc=$?
            set -e
            if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
                reason="timed out after ${SYSCALLS_TIMEOUT}s"
            elif [ $rc -ne 0 ]; then
                reason="exit status $rc"
            elif ! grep -q '^Throughput = ' "$log"; then
                reason="no Throughput line"
            elif ! grep -q 'total$' "$st"; then
                reason="no strace summary"
            fi
        fi
        if [ -n "$reason" ]; then
            rows+=("$name|$a|FAILED||||||")
            failed+=("$name / $a: $reason (log: $log)")
            echo "bench/syscalls.sh: $name $a: FAILED ($reason)" >&2
            continue
        fi
        declare -A n=()
        for c in "${CALLS[@]}"; do n[$c]=$(count "$st" "$c"); done
        rows+=("$name|$a|${n[mmap]}|${n[munmap]}|${n[madvise]}|$((n[mmap] + n[munmap] + n[madvise]))|${n[mremap]}|${n[mprotect]}|${n[brk]}")
        echo "bench/syscalls.sh: $name $a: mmap ${n[mmap]} munmap ${n[munmap]} madvise ${n[madvise]}" >&2
    done
done

# ---- table --------------------------------------------------------------------
{
    echo "## Memory syscalls per run (strace -f -c)"
    echo
    echo "- $(date '+%F %T %Z'); nproc $(nproc), $(uname -sr)"
    echo "- whole-process counts, one run each: the dynamic loader, libc's and the allocator's"
    echo "  initialisation, thread stacks and exit are included; \`startup\` (bench_fixed_size 1 64 42)"
    echo "  shows that fixed part"
    libs=()
    for a in "${allocs[@]}"; do libs+=("$a: ${SO[$a]:-no preload}"); done
    joined=$(printf '%s; ' "${libs[@]}")
    echo "- allocators: ${joined%; }"
    echo
    printf '%s\n' "${rows[@]}" | python3 -c '
import sys
head = ["workload", "allocator", "mmap", "munmap", "madvise", "mmap+munmap+madvise",
        "mremap", "mprotect", "brk"]
rows = [head] + [l.rstrip("\n").split("|") for l in sys.stdin if l.strip()]
w = [max(len(r[i]) for r in rows) for i in range(len(head))]
prev = None
for k, r in enumerate(rows):
    cells = list(r)
    if k > 0:
        if cells[0] == prev:
            cells[0] = ""
        else:
            prev = cells[0]
    print("| " + " | ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i])
                             for i, c in enumerate(cells)) + " |")
    if k == 0:
        print("|" + "|".join("-" * (w[i] + 2) if i < 2 else "-" * (w[i] + 1) + ":"
                             for i in range(len(head))) + "|")
'
    echo
    echo "Workloads (\`NAME: [ENV] BINARY ARGS\`, run as out/bench/BINARY):"
    echo
    for i in "${!wl_names[@]}"; do echo "- \`${wl_names[$i]}\`: \`${wl_specs[$i]}\`"; done
    if [ ${#failed[@]} -gt 0 ]; then
        echo
        echo "**FAILED runs (${#failed[@]}):**"
        echo
        for f in "${failed[@]}"; do echo "- $f"; done
    fi
} | tee "$OUT/syscalls.md"

[ ${#failed[@]} -eq 0 ] || exit 1
