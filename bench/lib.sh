#!/usr/bin/env bash
# Helpers sourced by bench/run.sh, bench/syscalls.sh, bench/instr.sh and bench/real.sh.

# Print the path of a shared library: ldconfig's cache first, then the files of
# the Debian package, then the usual multiarch directory.
find_lib() {
    local soname=$1 pkg=$2 p
    p=$(/sbin/ldconfig -p 2>/dev/null | awk -v n="$soname" '$1 == n && /x86-64/ { print $NF; exit }')
    if [ -z "$p" ] && command -v dpkg >/dev/null; then
        p=$(dpkg -L "$pkg" 2>/dev/null | grep -m1 "/$soname\$" || true)
    fi
    [ -z "$p" ] && p=/usr/lib/x86_64-linux-gnu/$soname
    [ -r "$p" ] && echo "$p"
    return 0
}

# The library to LD_PRELOAD for allocator NAME: nothing for glibc, hakmem's
# from $HAKMEM_SO (also for hakmem-check: hakmem with HAKMEM_CHECK=1, and
# hakmem-prof: with the heap profiler on; see allocator_env), Debian's
# mimalloc and jemalloc (also jemalloc-prof: with jemalloc's own heap profiler
# on, sampling at the same mean rate, to set hakmem-prof's cost beside it). Status 1 when it is not
# there (not built, not installed), 2 for a name none of these.
allocator_so() {
    local p=
    case $1 in
    glibc) return 0 ;;
    hakmem | hakmem-check | hakmem-prof) [ -r "$HAKMEM_SO" ] && p=$(realpath "$HAKMEM_SO") ;;
    mimalloc) p=$(find_lib libmimalloc.so.2 libmimalloc2.0) ;;
    jemalloc | jemalloc-prof) p=$(find_lib libjemalloc.so.2 libjemalloc2) ;;
    *) return 2 ;;
    esac
    [ -n "$p" ] || return 1
    echo "$p"
}

# The environment allocator NAME runs with (VAR=VAL words; none for most).
allocator_env() {
    case $1 in
    hakmem-check) echo HAKMEM_CHECK=1 ;;
    hakmem-prof) echo HAKMEM_PROF=1 HAKMEM_PROF_FILE=/dev/null ;; # (the dump is timed too)
    # 2^19 bytes = hakmem's HAKMEM_PROF_SAMPLE default; no dump at exit (it would litter)
    jemalloc-prof) echo MALLOC_CONF=prof:true,lg_prof_sample:19 ;;
    esac
}

# Fill allocs (the allocators to run, in order), SO[name] (the library to
# LD_PRELOAD; empty for glibc) and skipped (those left out, and why) from
# $ALLOCATORS (names allocator_so knows, space- or comma-separated) and
# $BENCH_EXTRA ("NAME=PATH ..."). The caller declares `declare -A SO=()`.
# Exits 2 on an unknown name, a malformed or repeated entry, or when none is
# left; $1 names the calling script in messages.
pick_allocators() {
    local prog=$1 a so rc e
    allocs=()
    skipped=()
    for a in ${ALLOCATORS//,/ }; do
        rc=0
        so=$(allocator_so "$a") || rc=$?
        if [ $rc -eq 2 ]; then
            echo "$prog: unknown allocator '$a' (known: glibc hakmem hakmem-check hakmem-prof mimalloc jemalloc jemalloc-prof)" >&2
            exit 2
        elif [ $rc -ne 0 ]; then
            echo "$prog: WARNING: no library for $a (not built, or run bench/deps.sh); skipping it" >&2
            skipped+=("$a (no library)")
            continue
        fi
        SO[$a]=$so
        allocs+=("$a")
    done
    for e in ${BENCH_EXTRA:-}; do
        a=${e%%=*} so=${e#*=}
        if [[ $e != *=* || -z $a || ! $a =~ ^[A-Za-z0-9_.-]+$ ]]; then
            echo "$prog: BENCH_EXTRA entries are NAME=PATH (got '$e')" >&2
            exit 2
        fi
        if [ -n "${SO[$a]+x}" ]; then
            echo "$prog: BENCH_EXTRA: allocator '$a' given twice" >&2
            exit 2
        fi
        if ! [ -r "$so" ]; then
            echo "$prog: WARNING: BENCH_EXTRA $a: $so not readable; skipping $a" >&2
            skipped+=("$a (no $so)")
            continue
        fi
        SO[$a]=$(realpath "$so")
        allocs+=("$a")
    done
    if [ "${#allocs[@]}" -eq 0 ]; then
        echo "$prog: no allocator to run" >&2
        exit 2
    fi
}

# Fill the arrays wl_names and wl_specs from the caller's workload_table (one
# "NAME SPEC" per line, # comments), keeping names that match $WORKLOADS (an
# extended regex; all when empty). Exits 2 when none is left; $1 names the
# calling script in that message.
read_workloads() {
    local name spec
    wl_names=()
    wl_specs=()
    while read -r name spec; do
        [[ -z $name || $name == \#* ]] && continue
        if [[ -n ${WORKLOADS:-} ]] && ! grep -Eq -- "$WORKLOADS" <<<"$name"; then continue; fi
        wl_names+=("$name")
        wl_specs+=("$spec")
    done < <(workload_table)
    if [ "${#wl_names[@]}" -eq 0 ]; then
        echo "$1: no workload matches WORKLOADS='${WORKLOADS:-}'" >&2
        exit 2
    fi
}
