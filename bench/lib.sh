#!/usr/bin/env bash
# Helpers sourced by bench/run.sh, bench/syscalls.sh and bench/instr.sh.

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
# from $HAKMEM_SO, Debian's mimalloc and jemalloc. Status 1 when it is not
# there (not built, not installed), 2 for a name none of these.
allocator_so() {
    local p=
    case $1 in
    glibc) return 0 ;;
    hakmem) [ -r "$HAKMEM_SO" ] && p=$(realpath "$HAKMEM_SO") ;;
    mimalloc) p=$(find_lib libmimalloc.so.2 libmimalloc2.0) ;;
    jemalloc) p=$(find_lib libjemalloc.so.2 libjemalloc2) ;;
    *) return 2 ;;
    esac
    [ -n "$p" ] || return 1
    echo "$p"
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
