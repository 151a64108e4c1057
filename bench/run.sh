#!/usr/bin/env bash
# Compare hakmem with glibc, mimalloc and jemalloc on the bench/bench_* workloads.
#
# usage: bench/run.sh            (from the repo root; `make bench` calls it)
# env:   RUNS=9                  runs per (workload, allocator)
#        ALLOCATORS="glibc hakmem mimalloc jemalloc"   subset/order to run
#        WORKLOADS=REGEX         only workloads whose name matches (grep -E)
#        BENCH_BUDGET=1          seconds of work per run: a run stops at the first
#                                unit boundary after it (HAKMEM_BENCH_BUDGET,
#                                bench/bench_util.h) and is marked bounded; 0: none
#        BENCH_TIMEOUT=120       seconds before a single bench run is killed
#        BENCH_CPU=N             pin every bench run to CPU N (taskset)
#        HAKMEM_SO=path          hakmem library (default out/release/libhakmem.so)
#        BENCH_EXTRA="NAME=PATH ..."  more allocators, LD_PRELOADed from PATH
#                                (e.g. mi3=../shared/anchors/libmimalloc-3.4.3.so)
#        BENCH_SET=threads       the thread sweep instead (below): its own
#                                workloads, results in out/bench/threads/
#
# Writes out/bench/results.tsv (one row per run: ops/s, peak RSS, page faults,
# whether the budget bounded it, its seconds), out/bench/table.md (the
# table printed at the end), out/bench/report.md and report.svg (ratios to
# mimalloc, bench/chart.py), out/bench/logs/ (each run's output). Exits
# non-zero if any bench run failed (crash, timeout, no Throughput line).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
unset LD_PRELOAD # the glibc rows must really be glibc
ROOT=$PWD
BIN=out/bench # the bench programs
BENCH_SET=${BENCH_SET:-main}
case $BENCH_SET in
main) OUT=out/bench ;;
threads) OUT=out/bench/threads ;;
*)
    echo "bench/run.sh: BENCH_SET must be main or threads (got '$BENCH_SET')" >&2
    exit 2
    ;;
esac
RUNS=${RUNS:-9}
BENCH_BUDGET=${BENCH_BUDGET:-1}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-120}
ALLOCATORS=${ALLOCATORS:-glibc hakmem mimalloc jemalloc}
WORKLOADS=${WORKLOADS:-}
HAKMEM_SO=${HAKMEM_SO:-$ROOT/out/release/libhakmem.so}

if ! [[ $RUNS =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/run.sh: RUNS must be a positive integer (got '$RUNS')" >&2
    exit 2
fi
if ! [[ $BENCH_BUDGET =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]]; then
    echo "bench/run.sh: BENCH_BUDGET must be a number of seconds (got '$BENCH_BUDGET')" >&2
    exit 2
fi

# ---- workloads -----------------------------------------------------------------
# One workload per line: NAME [VAR=value ...] BINARY [ARGS ...]
# BINARY is a bench/BINARY.c program (built as out/bench/BINARY); the VAR=value
# words are put in its environment. To add a workload, add a line here.
# Iteration counts are picked so that one run takes ~0.2-0.5 s under glibc on
# the reference machine (random_mixed keeps the 1M iterations of its spec).
# larson's arguments are threads, rounds, chunk (slots per thread), seed;
# HAKMEM_BENCH_STEPS is its steps per thread per round. remote_free's
# HAKMEM_BENCH_QUEUE is the queue capacity (blocks in flight).
# mid_large_mt's arguments are threads, iters per thread, ws (slots per
# thread), seed. The workloads of big blocks below cannot follow the
# 0.2-0.5 s rule, the allocators differ too much; their counts are the work
# of the faster ones, and the time budget (BENCH_BUDGET, 1 s) stops the slow
# ones (their cells marked *). realloc_growth: to 64 MiB, glibc grows its
# large blocks with mremap (~8 us per realloc) while mimalloc and jemalloc
# copy them (~3 ms per realloc on average, ~0.15 s per 16 B -> 64 MiB
# iteration: the budget stops them after 5-8 of the 60); to 1 MiB, glibc
# grows in place at the top of its heap (~60M reallocs/s) while hakmem and
# mimalloc copy (~0.5M/s). The 64 MiB one plans 60 growths (~15 ms for glibc
# and hakmem): with 20, a few ms in all, the first growth (fresh mappings,
# page faults) weighed most and medians moved by 30%. large_churn_1-32m: 150
# replacements, 50-200 a second (glibc's rate climbs as its mmap threshold
# rises, so fewer would change its figure); large_churn_1-4m: 3000, 1300-5000
# a second (jemalloc ~250). append_64m: 8 rounds of 2 buffers grown side by
# side to 64 MiB (the round is the budget's unit: mimalloc takes ~1.5 s for
# one, it took 3-10 s for a round of 8 buffers).
workload_table() {
    cat <<'EOF'
# name                      env / binary / args (iters, then bench-specific)
random_mixed_16-1024_ws400  HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_random_mixed 1000000 400 42
random_mixed_16-1024_ws4096 HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_random_mixed 1000000 4096 42
fixed_size_16               bench_fixed_size 30000000 16 42
fixed_size_64               bench_fixed_size 30000000 64 42
fixed_size_256              bench_fixed_size 15000000 256 42
fixed_size_1024             bench_fixed_size 10000000 1024 42
halves_64                   bench_halves 3000 64 42
halves_1024                 bench_halves 1500 1024 42
halves_4096                 bench_halves 500 4096 42
larson_8-1000_1t            HAKMEM_BENCH_MIN_SIZE=8 HAKMEM_BENCH_MAX_SIZE=1000 HAKMEM_BENCH_STEPS=4000 bench_larson 1 6000 1000 42
larson_8-1000_2t            HAKMEM_BENCH_MIN_SIZE=8 HAKMEM_BENCH_MAX_SIZE=1000 HAKMEM_BENCH_STEPS=4000 bench_larson 2 500 1000 42
build_2t                    bench_build 400 2 42
remote_free_16-1024         HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 HAKMEM_BENCH_QUEUE=1024 bench_remote_free 800000 42
random_mixed_16-65536_ws400 HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=65536 bench_random_mixed 1000000 400 42
mid_large_mt_1t             HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=32768 bench_mid_large_mt 1 1500000 256 42
mid_large_mt_2t             HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=32768 bench_mid_large_mt 2 800000 256 42
scenario_string             bench_scenarios string 2500000 42
scenario_json               bench_scenarios json 1000000 42
scenario_mir                bench_scenarios mir 800000 42
realloc_growth              HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=67108864 bench_realloc_growth 60 42
realloc_growth_16-1m        HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1048576 bench_realloc_growth 10000 42
large_churn_1-32m           HAKMEM_BENCH_MIN_SIZE=1048576 HAKMEM_BENCH_MAX_SIZE=33554432 bench_large_churn 150 20 42
large_churn_1-32m_write     HAKMEM_BENCH_INIT=write HAKMEM_BENCH_MIN_SIZE=1048576 HAKMEM_BENCH_MAX_SIZE=33554432 bench_large_churn 150 20 42
large_churn_1-4m            HAKMEM_BENCH_MIN_SIZE=1048576 HAKMEM_BENCH_MAX_SIZE=4194304 bench_large_churn 3000 4 42
append_64k                  HAKMEM_BENCH_MAX_SIZE=65536 HAKMEM_BENCH_STEP=16 bench_append 4 64 42
append_1m                   HAKMEM_BENCH_MAX_SIZE=1048576 HAKMEM_BENCH_STEP=256 bench_append 2 64 42
append_64m                  HAKMEM_BENCH_MAX_SIZE=67108864 HAKMEM_BENCH_STEP=65536 bench_append 8 2 42
burst_8k-1m                 HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=1048576 bench_burst 6 256 42
memops_16-256               HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=256 bench_memops 20000000 42
memops_1k-16k               HAKMEM_BENCH_MIN_SIZE=1024 HAKMEM_BENCH_MAX_SIZE=16384 bench_memops 2000000 42
EOF
}

# The thread sweep (BENCH_SET=threads; make bench runs it after the main
# set, with RUNS=5): the patterns a many-core machine makes of a global lock
# or a shared cache line (bench/bench_threads.c), at 2, 8 and 32 threads.
# ops are per thread, so each row of a pattern does the same work in all:
# ring (every block freed by the next thread: xmalloc-test) at 64 B,
# 16-1024 B, 1-8 KiB, 8-52 KiB and 64-512 KiB (L2.5); producer/consumer pairs; threads exiting with half their
# blocks (churn; ops/256 rounds); Large blocks freed and taken again by
# each thread (local, 16 slots a thread). On a 2-core machine 8 and 32
# threads oversubscribe it: the rows then show what waiting on a lock held
# by a preempted thread costs, not parallel speed-up.
threads_table() {
    cat <<'EOF2'
# name               env / binary / args (mode, threads, ops per thread)
ring_64_2t           bench_threads ring 2 400000
ring_64_8t           bench_threads ring 8 100000
ring_64_32t          bench_threads ring 32 25000
ring_16-1024_2t      HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_threads ring 2 400000
ring_16-1024_8t      HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_threads ring 8 100000
ring_16-1024_32t     HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_threads ring 32 25000
ring_1-8k_2t         HAKMEM_BENCH_MIN_SIZE=1024 HAKMEM_BENCH_MAX_SIZE=8192 HAKMEM_BENCH_QUEUE=256 bench_threads ring 2 200000
ring_1-8k_8t         HAKMEM_BENCH_MIN_SIZE=1024 HAKMEM_BENCH_MAX_SIZE=8192 HAKMEM_BENCH_QUEUE=256 bench_threads ring 8 50000
ring_1-8k_32t        HAKMEM_BENCH_MIN_SIZE=1024 HAKMEM_BENCH_MAX_SIZE=8192 HAKMEM_BENCH_QUEUE=256 bench_threads ring 32 12500
ring_8-52k_2t        HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=53248 HAKMEM_BENCH_QUEUE=256 bench_threads ring 2 100000
ring_8-52k_8t        HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=53248 HAKMEM_BENCH_QUEUE=256 bench_threads ring 8 25000
ring_8-52k_32t       HAKMEM_BENCH_MIN_SIZE=8192 HAKMEM_BENCH_MAX_SIZE=53248 HAKMEM_BENCH_QUEUE=256 bench_threads ring 32 6250
ring_64-512k_2t      HAKMEM_BENCH_MIN_SIZE=65536 HAKMEM_BENCH_MAX_SIZE=524288 HAKMEM_BENCH_QUEUE=64 bench_threads ring 2 100000
ring_64-512k_8t      HAKMEM_BENCH_MIN_SIZE=65536 HAKMEM_BENCH_MAX_SIZE=524288 HAKMEM_BENCH_QUEUE=64 bench_threads ring 8 25000
ring_64-512k_32t     HAKMEM_BENCH_MIN_SIZE=65536 HAKMEM_BENCH_MAX_SIZE=524288 HAKMEM_BENCH_QUEUE=64 bench_threads ring 32 6250
pairs_8-2048_2t      HAKMEM_BENCH_MIN_SIZE=8 HAKMEM_BENCH_MAX_SIZE=2048 bench_threads pairs 2 400000
pairs_8-2048_8t      HAKMEM_BENCH_MIN_SIZE=8 HAKMEM_BENCH_MAX_SIZE=2048 bench_threads pairs 8 100000
pairs_8-2048_32t     HAKMEM_BENCH_MIN_SIZE=8 HAKMEM_BENCH_MAX_SIZE=2048 bench_threads pairs 32 25000
churn_16-1024_2t     HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_threads churn 2 51200
churn_16-1024_8t     HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_threads churn 8 12800
churn_16-1024_32t    HAKMEM_BENCH_MIN_SIZE=16 HAKMEM_BENCH_MAX_SIZE=1024 bench_threads churn 32 3200
local_1-4m_2t        HAKMEM_BENCH_MIN_SIZE=1048576 HAKMEM_BENCH_MAX_SIZE=4194304 bench_threads local 2 8000
local_1-4m_8t        HAKMEM_BENCH_MIN_SIZE=1048576 HAKMEM_BENCH_MAX_SIZE=4194304 bench_threads local 8 2000
local_1-4m_32t       HAKMEM_BENCH_MIN_SIZE=1048576 HAKMEM_BENCH_MAX_SIZE=4194304 bench_threads local 32 500
EOF2
}
[ "$BENCH_SET" = threads ] && workload_table() { threads_table; }

# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
read_workloads bench/run.sh

# Binary of a workload spec: the first word without '='.
spec_binary() {
    local w
    for w in $1; do
        [[ $w == *=* ]] || {
            echo "$w"
            return
        }
    done
}

# Build the bench binaries (these targets do not need the library to build);
# bench_fixed_size always, for the preflight below.
PROBE=bench_fixed_size
bins=("$BIN/$PROBE")
for spec in "${wl_specs[@]}"; do
    b=$(spec_binary "$spec")
    [ -f "bench/$b.c" ] || {
        echo "bench/run.sh: workload uses bench/$b.c, which does not exist" >&2
        exit 2
    }
    bins+=("$BIN/$b")
done
mapfile -t bins < <(printf '%s\n' "${bins[@]}" | sort -u)
make --no-print-directory -s "${bins[@]}"

# ---- allocators ---------------------------------------------------------------
# pick_allocators (bench/lib.sh, sourced above): the allocators to run and their libraries

pkg_version() { dpkg-query -W -f '${Version}' "$1" 2>/dev/null || echo unknown; }

declare -A SO=() VER=()
pick_allocators bench/run.sh
for a in "${allocs[@]}"; do
    case $a in
    glibc) VER[$a]="glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')" ;;
    hakmem | hakmem-check | hakmem-prof)
        v=$(sed -n 's/^#define HAKMEM_VERSION "\(.*\)"/\1/p' include/hakmem.h)
        rev=$(git rev-parse --short HEAD 2>/dev/null || echo "no commit")
        if [ -n "$(git status --porcelain -- core include Makefile 2>/dev/null)" ]; then
            rev="$rev+dirty"
        fi
        VER[$a]="hakmem ${v:-?} ($rev, built $(date -r "${SO[$a]}" '+%F %T'))"
        ;;
    mimalloc | jemalloc | jemalloc-prof)
        pkg=libmimalloc2.0
        [ "$a" != mimalloc ] && pkg=libjemalloc2
        owner=$(dpkg -S "$(realpath "${SO[$a]}")" 2>/dev/null | cut -d: -f1 | head -1)
        VER[$a]="$a $(pkg_version "${owner:-$pkg}")"
        ;;
    *) VER[$a]="$a ($(basename "${SO[$a]}"))" ;; # BENCH_EXTRA
    esac
done

mkdir -p "$OUT/logs"
rm -f "$OUT"/logs/*.log

# Preflight: check that a preloaded library really takes over malloc/free.
# Otherwise ld.so may silently fall back to glibc and we would report glibc's
# numbers under another name. Such an allocator's runs are all FAILED.
# The probe is bench_fixed_size with a tiny iteration count, whichever
# workloads are selected (its first argument is an iteration count).
declare -A BROKEN=()
probe=$PROBE
for a in "${allocs[@]}"; do
    so=${SO[$a]}
    [ -z "$so" ] && continue
    log=$OUT/logs/preflight.$a.log
    set +e
    LD_DEBUG=bindings LD_PRELOAD=$so timeout -k 5 "$BENCH_TIMEOUT" "$BIN/$probe" 1000 \
        </dev/null >"$log" 2>&1
    rc=$?
    set -e
    targets=$(grep -E "binding file [^ ]*/$probe \[0\] to .*symbol \`(malloc|free)'" "$log" |
        sed -E 's/.* to ([^ ]+) \[.*/\1/' | sort -u)
    ok=1
    [ -n "$targets" ] || ok=0
    for t in $targets; do
        [ "$(realpath "$t" 2>/dev/null)" = "$(realpath "$so")" ] || ok=0
    done
    if [ $ok -eq 0 ]; then
        if [ $rc -ne 0 ]; then
            echo "bench/run.sh: WARNING: $a preflight exited with status $rc (see $log)" >&2
        else
            echo "bench/run.sh: ERROR: preloading $so does not replace malloc/free" \
                "(bound to: ${targets:-nothing}); all $a runs count as FAILED" >&2
            BROKEN[$a]="malloc/free not interposed by $so"
        fi
    fi
done

# ---- metadata -------------------------------------------------------------------
{
    printf 'date\t%s\n' "$(date '+%F %T %Z')"
    printf 'nproc\t%s\n' "$(nproc)"
    printf 'kernel\t%s\n' "$(uname -sr)"
    printf 'cpu\t%s\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    printf 'runs\t%s\n' "$RUNS"
    printf 'budget\t%s\n' "$BENCH_BUDGET"
    printf 'allocators\t%s\n' "${allocs[*]}"
    for a in "${allocs[@]}"; do printf 'version\t%s\n' "${VER[$a]}"; done
    for s in "${skipped[@]}"; do printf 'skipped\t%s\n' "$s"; done
    for i in "${!wl_names[@]}"; do printf 'workload\t%s\t%s\n' "${wl_names[$i]}" "${wl_specs[$i]}"; done
    if [ -n "${BENCH_CPU:-}" ]; then printf 'pinned\tCPU %s\n' "$BENCH_CPU"; fi
} >"$OUT/meta.tsv"

# ---- runs ---------------------------------------------------------------------
RESULTS=$OUT/results.tsv
FAILURES=$OUT/failures.tsv
printf 'workload\tallocator\trun\tops_per_s\tpeak_rss_kib\tfaults\tbounded\tseconds\n' >"$RESULTS"
printf 'workload\tallocator\trun\treason\tlog\n' >"$FAILURES"
pin=()
[ -n "${BENCH_CPU:-}" ] && pin=(taskset -c "$BENCH_CPU")
nfail=0

# Times are in microseconds since the epoch: ${EPOCHREALTIME//[!0-9]/} (bash's
# clock without its decimal separator, which follows the locale; no process).

# A duration in microseconds as 42s or 3m05s.
fmt_dur() {
    local s=$((($1 + 500000) / 1000000))
    if [ $s -lt 60 ]; then echo "${s}s"; else printf '%dm%02ds' $((s / 60)) $((s % 60)); fi
}

# run_one WORKLOAD_INDEX ALLOCATOR RUN: one bench run; appends to the TSVs and
# prints a short result on stdout: its Mops/s (e.g. "71.87M", "0.000193M*",
# * when the budget bounded it) or "FAILED".
run_one() {
    local i=$1 a=$2 r=$3 name=${wl_names[$1]} w rc ops rss faults bounded reason="" t0 secs mops ldso
    local log=$OUT/logs/$name.$a.$r.log
    local -a envs=() cmd=()
    for w in ${wl_specs[$i]}; do
        if [ ${#cmd[@]} -eq 0 ] && [[ $w == *=* ]]; then
            envs+=("$w")
        elif [ ${#cmd[@]} -eq 0 ]; then
            cmd+=("$BIN/$w")
        else
            cmd+=("$w")
        fi
    done
    [ -n "${SO[$a]}" ] && envs+=("LD_PRELOAD=${SO[$a]}")
    envs+=($(allocator_env "$a") "HAKMEM_BENCH_BUDGET=$BENCH_BUDGET")
    if [ -n "${BROKEN[$a]:-}" ]; then
        echo "not run: ${BROKEN[$a]}" >"$log"
        reason=${BROKEN[$a]}
    else
        set +e
        t0=${EPOCHREALTIME//[!0-9]/}
        "${pin[@]}" timeout -k 5 "$BENCH_TIMEOUT" env "${envs[@]}" "${cmd[@]}" </dev/null >"$log" 2>&1
        rc=$?
        secs=$((${EPOCHREALTIME//[!0-9]/} - t0))
        set -e
        # One awk reads the log (a sed or grep per field, ~10 processes a run,
        # cost some 25 s of a 9-run session): the lines run.sh reads ("-" for
        # one missing), the run's seconds, its Mops/s as report.py prints
        # them (3 significant digits below 1; * when the budget bounded it)
        # and the first line from ld.so, if any.
        read -r ops rss faults bounded secs mops ldso < <(awk -v us="$secs" '
            /^Throughput = [0-9]+ ops\/s$/ { ops = $3 }
            /^Peak RSS = [0-9]+ KiB$/ { rss = $4 }
            /^Page faults = [0-9]+$/ { flt = $4 }
            /^Bounded = [0-9]+\/[0-9]+ / { bnd = $3 }
            /ld\.so/ && ldso == "" { ldso = $0 }
            END {
                m = ops / 1e6
                printf "%s %s %s %s %.3f ", (ops == "" ? "-" : ops), (rss == "" ? "-" : rss),
                    (flt == "" ? "-" : flt), (bnd == "" ? "-" : bnd), us / 1e6
                printf (m >= 1 ? "%.2fM%s %s\n" : "%.3gM%s %s\n"), m, (bnd == "" ? "" : "*"), ldso
            }' "$log")
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            reason="timed out after ${BENCH_TIMEOUT}s"
        elif [ $rc -gt 128 ]; then
            reason="killed by SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"
        elif [ $rc -ne 0 ]; then
            reason="exit status $rc"
        elif [ -n "$ldso" ]; then
            reason="ld.so error: $ldso"
        elif [ "$ops" = - ] || [ "$rss" = - ]; then
            reason="no Throughput/Peak RSS line"
        fi
    fi
    if [ -n "$reason" ]; then
        printf '%s\t%s\t%s\tFAILED\t-\t-\t-\t%s\n' "$name" "$a" "$r" "${secs:--}" >>"$RESULTS"
        printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$a" "$r" "$reason" "$log" >>"$FAILURES"
        echo "FAILED"
        return 1
    fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$a" "$r" "$ops" "$rss" "$faults" "$bounded" \
        "$secs" >>"$RESULTS"
    echo "$mops"
}

n=${#allocs[@]}
nw=${#wl_names[@]}
budget_note="a budget of ${BENCH_BUDGET} s per run"
[[ $BENCH_BUDGET =~ ^[0.]*$ ]] && budget_note="no time budget"
echo "bench/run.sh: $nw workloads x $n allocators (${allocs[*]}) x $RUNS runs, $budget_note" >&2
# Progress: one line per (run, workload), saying how many of the RUNS x nw
# lines are done and about how long is left: the mean time each workload's
# line took in the runs so far, summed over the lines still to come (known
# once run 1 has timed every workload; all runs do the same work, so the
# estimate is as good as the machine is steady).
declare -a cost_us=() cost_n=()
t_start=${EPOCHREALTIME//[!0-9]/}
nbounded=0
for ((r = 1; r <= RUNS; r++)); do
    for i in "${!wl_names[@]}"; do
        t_line=${EPOCHREALTIME//[!0-9]/}
        line="run $r/$RUNS ${wl_names[$i]}:"
        # Rotate the starting allocator every run so no allocator always goes first.
        for ((k = 0; k < n; k++)); do
            a=${allocs[$(((r - 1 + k) % n))]}
            if res=$(run_one "$i" "$a" "$r"); then :; else nfail=$((nfail + 1)); fi
            [[ $res == *'*' ]] && nbounded=$((nbounded + 1))
            line+=" $a=$res"
        done
        cost_us[i]=$((${cost_us[i]:-0} + ${EPOCHREALTIME//[!0-9]/} - t_line))
        cost_n[i]=$((${cost_n[i]:-0} + 1))
        done_lines=$(((r - 1) * nw + i + 1))
        if ((r > 1 || i == nw - 1)); then
            left=0
            for j in "${!wl_names[@]}"; do
                # lines of workload j still to come: the runs after r, and this run's after i
                todo=$((RUNS - r + (j > i ? 1 : 0)))
                left=$((left + todo * cost_us[j] / cost_n[j]))
            done
            eta="~$(fmt_dur $left) left"
            [ $done_lines -eq $((RUNS * nw)) ] && eta="done"
        else
            eta="time left known after run 1"
        fi
        printf '[%3d%%, %s] %s\n' $((100 * done_lines / (RUNS * nw))) "$eta" "$line" >&2
    done
done
echo "bench/run.sh: done in $(fmt_dur $((${EPOCHREALTIME//[!0-9]/} - t_start))) ($((RUNS * nw * n)) runs," \
    "$nbounded bounded by the budget: *)" >&2

# ---- table --------------------------------------------------------------------
python3 bench/report.py "$OUT" | tee "$OUT/table.md"
# The same as ratios to mimalloc: a chart and its tables.
python3 bench/chart.py "$OUT"

if [ $nfail -gt 0 ]; then
    echo "bench/run.sh: $nfail bench run(s) FAILED; see $FAILURES and $OUT/logs/" >&2
    exit 1
fi
