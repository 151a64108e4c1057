#!/bin/bash
# Heap-bug suite runner (tests/heapbugs/README.md): builds bugs and bugs_cxx
# into out/heapbugs/, runs every case under every allocator, one process per
# case, and writes out/heapbugs/results.tsv and table.md.
#
#   tests/heapbugs/run.sh                        every available allocator
#   HEAPBUGS_ALLOCATORS="glibc hakmem" ...       these only
#   HEAPBUGS_EXTRA="hak0=/tmp/old.so" ...        more, as NAME=LIB[,VAR=VAL...]
#   HEAPBUGS_GATE=tests/heapbugs/must_catch ...  hakmem and hakmem-check only;
#                                                fails if a listed case is not caught
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self=$here/$(basename "${BASH_SOURCE[0]}")
root=$(cd "$here/../.." && pwd)
MITIGATED=42 # HB_MITIGATED in heapbugs.h

# Outcome of one run: "OUTCOME<TAB>DETAIL" from its exit status and stderr log.
classify() {
    local rc=$1 log=$2 alloc=$3
    case $rc in
    0)
        if [ -s "$log" ] && [[ " ${HB_NOISY:-} " != *" $alloc "* ]]; then
            printf 'CAUGHT\treported'
        else
            printf 'MISSED\t-'
        fi
        ;;
    "$MITIGATED") printf 'CAUGHT\tmitigated' ;;
    124 | 137) printf 'HANG\ttimeout' ;;
    2 | 3) printf 'ERROR\texit %s' "$rc" ;;
    *)
        if [ "$rc" -gt 128 ]; then
            printf 'CAUGHT\tSIG%s' "$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))"
        else
            printf 'CAUGHT\texit %s' "$rc"
        fi
        ;;
    esac
}

# Runs BIN ARG under an allocator (LIB or "-", ENVS "VAR=VAL,..." or "-");
# stderr to LOG. Prints the exit status.
run_under() {
    local lib=$1 envs=$2 log=$3 bin=$4 arg=$5 rc=0 cmd=(env)
    local -a kv=()
    [ "$lib" = - ] || cmd+=("LD_PRELOAD=$lib")
    if [ "$envs" != - ]; then
        IFS=, read -ra kv <<<"$envs"
        cmd+=("${kv[@]}")
    fi
    # The group keeps bash's "Segmentation fault" line off our stderr.
    { timeout -k 2 "${HB_TIMEOUT:-10}" "${cmd[@]}" "$bin" "$arg" </dev/null >/dev/null 2>"$log" || rc=$?; } 2>/dev/null
    echo "$rc"
}

# Worker (one job line from xargs): "index alloc lib envs bin case kind tier".
if [ "${1:-}" = --run-one ]; then
    IFS=$'\t' read -r idx alloc lib envs bin case kind tier <<<"$2"
    log=$HB_LOGS/$alloc/$case.log
    rc=$(run_under "$lib" "$envs" "$log" "$bin" "$case")
    msg=$(head -n 1 "$log" | tr '\t' ' ' | cut -c 1-160)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$idx" "$case" "$kind" "$tier" "$alloc" \
        "$(classify "$rc" "$log" "$alloc")" "${msg:--}"
    exit 0
fi

out=${HEAPBUGS_OUT:-$root/out/heapbugs}
anchors=${HEAPBUGS_ANCHORS:-$root/../shared/anchors}
hakmem_lib=${HEAPBUGS_HAKMEM:-$root/out/release/libhakmem.so}
gate=${HEAPBUGS_GATE:-}
# A case runs in milliseconds: one past this hangs (tests/lib.sh scales it).
# shellcheck source=tests/lib.sh
source "$root/tests/lib.sh"
export HB_TIMEOUT=${HEAPBUGS_TIMEOUT:-$(scaled_limit 10)}

# LIB<TAB>ENVS of a known allocator name ("-": none).
known() {
    local lib envs=-
    case $1 in
    glibc) lib=- ;;
    hakmem) lib=$hakmem_lib ;;
    hakmem-check) lib=$hakmem_lib envs=HAKMEM_CHECK=1 ;;
    mimalloc) lib=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2 ;;
    jemalloc) lib=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 ;;
    mi3) lib=$anchors/libmimalloc-3.4.3.so ;;
    mi-secure) lib=$anchors/libmimalloc-secure-2.4.1.so ;;
    hardened-light) lib=$anchors/libhardened_malloc-light.so ;;
    scudo) lib=/usr/lib/llvm-19/lib/clang/19/lib/linux/libclang_rt.scudo_standalone-x86_64.so ;;
    *) return 1 ;;
    esac
    printf '%s\t%s\n' "$lib" "$envs"
}

if [ -n "$gate" ]; then
    [ -r "$gate" ] || { echo "heapbugs: gate file $gate not readable" >&2; exit 2; }
    gate=$(cd "$(dirname "$gate")" && pwd)/$(basename "$gate")
    specs="hakmem hakmem-check"
    out=$out/gate
else
    specs="${HEAPBUGS_ALLOCATORS:-glibc hakmem hakmem-check mimalloc jemalloc mi3 mi-secure hardened-light scudo} ${HEAPBUGS_EXTRA:-}"
fi

# Allocators: names[i], libs[i], envs[i]. An entry is NAME or NAME=LIB[,VAR=VAL...].
names=()
libs=()
envs=()
read -ra spec_list <<<"$specs"
for spec in "${spec_list[@]}"; do
    if [[ $spec == *=* ]]; then
        name=${spec%%=*}
        rest=${spec#*=}
        lib=${rest%%,*}
        env=-
        [[ $rest == *,* ]] && env=${rest#*,}
        [ -n "$lib" ] || lib=-
        [ "$lib" = - ] || [[ $lib == /* ]] || lib=$PWD/$lib
    elif line=$(known "$spec"); then
        name=$spec
        IFS=$'\t' read -r lib env <<<"$line"
    else
        echo "heapbugs: unknown allocator '$spec' (give NAME=LIB)" >&2
        exit 2
    fi
    if [[ ! $name =~ ^[A-Za-z0-9._-]+$ ]] || [[ " ${names[*]} " == *" $name "* ]]; then
        echo "heapbugs: bad or repeated allocator name '$name'" >&2
        exit 2
    fi
    if [ "$lib" = "$hakmem_lib" ] && [ ! -f "$lib" ]; then
        echo "heapbugs: building $lib (make release)" >&2
        make -C "$root" release >/dev/null
    fi
    if [ "$lib" != - ] && [ ! -f "$lib" ]; then
        echo "heapbugs: skipping $name: $lib not found" >&2
        continue
    fi
    names+=("$name")
    libs+=("$lib")
    envs+=("$env")
done
[ ${#names[@]} -gt 0 ] || { echo "heapbugs: no allocator to run" >&2; exit 2; }

# Build.
mkdir -p "$out"
gcc -O0 -g -fno-builtin -w -pthread -o "$out/bugs" "$here/bugs.c"
g++ -O0 -g -fno-builtin -fsized-deallocation -w -pthread -o "$out/bugs_cxx" "$here/bugs_cxx.cc"

export HB_LOGS=$out/logs
rm -rf "$HB_LOGS"
ulimit -c 0

# Control runs: correct use must exit 0, or the allocator is left out (the
# gate fails). One that writes to stderr even then cannot be credited with
# reports ("noisy").
HB_NOISY=
keep=()
for i in "${!names[@]}"; do
    mkdir -p "$HB_LOGS/${names[i]}"
    ok=1
    for bin in bugs bugs_cxx; do
        log=$HB_LOGS/${names[i]}/control_$bin.log
        rc=$(run_under "${libs[i]}" "${envs[i]}" "$log" "$out/$bin" control)
        if [ "$rc" != 0 ]; then
            echo "heapbugs: ${names[i]}: $bin control exited $rc (see $log): left out" >&2
            [ -z "$gate" ] || exit 1
            ok=0
        elif [ -s "$log" ]; then
            echo "heapbugs: ${names[i]}: writes to stderr on correct use; reports not counted" >&2
            HB_NOISY="$HB_NOISY ${names[i]}"
        fi
    done
    [ "$ok" = 0 ] || keep+=("$i")
done
[ ${#keep[@]} -gt 0 ] || { echo "heapbugs: no allocator passed the control runs" >&2; exit 1; }
sel_names=()
sel_libs=()
sel_envs=()
for i in "${keep[@]}"; do
    sel_names+=("${names[i]}")
    sel_libs+=("${libs[i]}")
    sel_envs+=("${envs[i]}")
done
names=("${sel_names[@]}")
libs=("${sel_libs[@]}")
envs=("${sel_envs[@]}")
export HB_NOISY

# Cases: "name kind tier" with their program.
cases=$out/cases.tsv
{
    "$out/bugs" --list | sed "s|^|$out/bugs\t|"
    "$out/bugs_cxx" --list | sed "s|^|$out/bugs_cxx\t|"
} >"$cases"
ncases=$(wc -l <"$cases")

# One job per (allocator, case), case-major so slow cases spread over workers.
jobs=$out/jobs.tsv
awk -F'\t' -v n="${#names[@]}" -v names="${names[*]}" -v libs="$(printf '%s\t' "${libs[@]}")" \
    -v envs="$(printf '%s\t' "${envs[@]}")" 'BEGIN { split(names, N, " "); split(libs, L, "\t"); split(envs, E, "\t") }
    { for (a = 1; a <= n; a++) printf "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", (a - 1) * 100000 + NR, N[a], L[a], E[a], $1, $2, $3, $4 }' \
    "$cases" >"$jobs"

results=$out/results.tsv
start=$SECONDS
xargs -d '\n' -P "${HEAPBUGS_JOBS:-$(nproc)}" -n 1 "$self" --run-one <"$jobs" | sort -n | cut -f 2- >"$results.tmp"
{
    printf 'case\tkind\ttier\tallocator\toutcome\tdetail\tmessage\n'
    cat "$results.tmp"
} >"$results"
rm -f "$results.tmp"

# table.md: summary, kind x allocator, case x allocator.
table=$out/table.md
awk -F'\t' -v names="${names[*]}" -v total="$ncases" '
    BEGIN { na = split(names, A, " ") }
    NR == 1 { next }
    {
        c = $1; k = $2; a = $4; o = $5; d = $6
        if (!(c in seen)) { seen[c] = 1; order[++nc] = c; kindof[c] = k }
        if (!(k in kseen)) { kseen[k] = 1; korder[++nk] = k }
        mark = o == "CAUGHT" ? (d == "reported" ? "R" : "C") : o == "HANG" ? "H" : o == "ERROR" ? "E" : "·"
        m[c, a] = mark
        if (o == "CAUGHT") { caught[a]++; kc[k, a]++ }
        if (d == "reported") rep[a]++
        if (d == "mitigated") mit[a]++
        if (o == "HANG") hang[a]++
        if (o == "ERROR") err[a]++
        if (a == A[1]) kt[k]++
    }
    function row(s) { print "| " s " |" }
    # A table: one row per key (keys[1..n]), one column per allocator.
    function grid(title, keys, n, cell,   i, j, s, sep) {
        s = title; sep = "---"
        for (i = 1; i <= na; i++) { s = s " | " A[i]; sep = sep " | :-:" }
        row(s); row(sep)
        for (j = 1; j <= n; j++) {
            s = keys[j]
            for (i = 1; i <= na; i++) s = s " | " cell[keys[j], A[i]]
            row(s)
        }
    }
    END {
        print "## Summary (caught of " total ")\n"
        print "| allocator | caught | of which reported only | of which mitigated | hangs | errors |"
        print "| --- | ---: | ---: | ---: | ---: | ---: |"
        for (i = 1; i <= na; i++)
            row(sprintf("%s | %d / %d | %d | %d | %d | %d", A[i], caught[A[i]], total, rep[A[i]], mit[A[i]], hang[A[i]], err[A[i]]))
        print "\n## Caught per kind\n"
        for (j = 1; j <= nk; j++)
            for (i = 1; i <= na; i++) kcell[korder[j], A[i]] = kc[korder[j], A[i]] + 0 "/" kt[korder[j]]
        grid("kind", korder, nk, kcell)
        print "\n## Per case (C caught, R reported on stderr only, H hang, E error, · missed)\n"
        grid("case", order, nc, m)
    }' "$results" >"$table"

# Summary on stdout.
sed -n '/^## Summary/,/^## Caught per kind/p' "$table" | sed '$d'
echo "($((SECONDS - start)) s; $results, $table, logs in $HB_LOGS)"

# Gate: every case FILE lists must be caught: "default" by hakmem and
# hakmem-check, "checked" by hakmem-check.
if [ -n "$gate" ]; then
    fail=0
    while read -r line || [ -n "$line" ]; do
        read -r case mode rest <<<"${line%%#*}"
        [ -n "${case:-}" ] || continue
        case $mode in
        default) want="hakmem hakmem-check" ;;
        checked) want="hakmem-check" ;;
        *)
            echo "GATE $gate: bad mode '$mode' for $case" >&2
            fail=1
            continue
            ;;
        esac
        [ -z "$rest" ] || { echo "GATE $gate: extra words after '$case $mode'" >&2; fail=1; }
        if ! awk -F'\t' -v c="$case" '$2 == c { f = 1 } END { exit !f }' "$cases"; then
            echo "GATE $gate: unknown case $case" >&2
            fail=1
            continue
        fi
        for a in $want; do
            got=$(awk -F'\t' -v c="$case" -v a="$a" '$1 == c && $4 == a { print $5 " (" $6 ")" }' "$results")
            if [[ $got != CAUGHT* ]]; then
                echo "NOT CAUGHT $case ($mode) under $a: ${got:-not run}"
                fail=1
            fi
        done
    done <"$gate"
    awk -F'\t' '$5 == "HANG" { print "warning: HANG " $1 " under " $4 }' "$results"
    if [ "$fail" -ne 0 ]; then
        echo "heapbugs gate: FAILED"
        exit 1
    fi
    echo "heapbugs gate: every case in $gate caught"
fi
