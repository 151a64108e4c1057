#!/bin/bash
# Out of memory, for real: programs under LD_PRELOAD with a tight limit on the
# address space (`ulimit -v`, RLIMIT_AS: every mmap/brk/mremap past it fails
# with ENOMEM; the stand-in for exhaustion under strict overcommit, though
# stricter: the limit counts every mapping, MAP_NORESERVE and PROT_NONE
# reservations included, which the commit limit does not), each run with
# glibc's malloc (no preload) and with hakmem in the same run:
#   tiers-KIB-TIER  tests/oom/oom_tiers.c: malloc in one size range until NULL
#                   (errno ENOMEM), calloc/realloc/posix_memalign at
#                   exhaustion, every block checked, free, allocate again;
#                   KIB 100000, 150000, 300000 (and 1000000 for mixed)
#   seq-KIB         every range in one process, then the first again: memory
#                   given back by one range is reusable by the others
#   python-*-KIB    python3 allocating until MemoryError, freeing, allocating
#                   again, exiting 0 (tests/oom/py_fill.py)
#   sort-*          GNU sort: the right output, or sort's own "memory
#                   exhausted" and a plain non-zero status
# Each case prints one line, `PASS oom/CASE (figures)` or `FAIL oom/CASE: why`;
# the last line is `oom: N passed, M failed`. A case fails on a signal
# (segfault, abort), a timeout (hang), a `hakmem:` diagnostic line on stderr,
# a library ld.so could not preload under the limit, a failed check, or when
# hakmem gives the program less than 0.8x the memory glibc gives it under the
# same limit (ratios are measured in this run, against glibc, never against
# stored figures).
#
# The cases run side by side, TEST_JOBS at a time (tests/lib.sh), their lines
# printed in a fixed order.
# Environment: LIB (default out/release/libhakmem.so); OOM_EXTRA_LIBS, a
# space-separated list of other malloc libraries whose figures are printed
# under each case for comparison (`    also LIB: ...`), never checked.
# Exits non-zero if any case failed. To see where the address space goes,
# run one case by hand, e.g.
#   (ulimit -v 300000; OOM_MAPS_DIR=/tmp/m HAKMEM_STATS=1 \
#    LD_PRELOAD=$PWD/out/release/libhakmem.so out/oom/oom_tiers l25)
# (maps at exhaustion and after the frees, and malloc_stats(), see
# oom_tiers.c; py_fill.py takes OOM_MAPS_DIR too).
# shellcheck disable=SC2317 # (the case functions are called through start_case)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/tests/oom
LIB=${LIB:-$ROOT/out/release/libhakmem.so}
case $LIB in
/*) ;;
*) LIB=$PWD/$LIB ;;
esac
EXTRA_LIBS=${OOM_EXTRA_LIBS:-}
MIN_RATIO=0.8
# Seconds a run may take (tests/lib.sh): every run here takes under 10
# (glibc, a loaded 2-core machine); one that takes far longer hangs.
# shellcheck source=tests/lib.sh
source "$ROOT/tests/lib.sh"
SECS=$(scaled_limit 150)
export LC_ALL=C
# Stats lines start with `hakmem:` too, and would read as diagnostics.
unset HAKMEM_STATS

passed=0
failed=0
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-oom.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# Figures of OOM_EXTRA_LIBS, printed under the case's line.
also=
pass() {
    passed=$((passed + 1))
    echo "PASS oom/$1${2:+ ($2)}"
    printf '%s' "$also"
    also=
}
fail() {
    failed=$((failed + 1))
    echo "FAIL oom/$1: $2"
    printf '%s' "$also"
    also=
}
# Cases run side by side, TEST_JOBS at a time (tests/lib.sh's jobs: each is
# one program at a time, and limits hold per process): start_case FN NAME ...
# starts one; their lines come in order; one that ends without its line (set
# -e, a signal) is a FAIL too.
JOBS_TMP=$TMP
JOBS_REPORTER="report_lines oom"
start_case() { job_start "$2" "$@"; }
finish() {
    jobs_flush "$JOBS_REPORTER" all
    passed=$((passed + lines_passed))
    failed=$((failed + lines_failed))
    echo "oom: $passed passed, $failed failed"
    if [ "$failed" -eq 0 ]; then exit 0; fi
    exit 1
}

# ---- setup --------------------------------------------------------------------
if [ ! -f "$LIB" ]; then
    fail setup "library $LIB not found (run make release)"
    finish
fi
# The preload must really take effect; ld.so only warns when it cannot.
if ! LD_PRELOAD=$LIB grep -q libhakmem /proc/self/maps 2>/dev/null; then
    fail setup "LD_PRELOAD=$LIB did not load libhakmem"
    finish
fi
BIN=$ROOT/out/oom/oom_tiers
if [ ! -x "$BIN" ] || [ "$HERE/oom_tiers.c" -nt "$BIN" ]; then
    mkdir -p "$ROOT/out/oom"
    # The calls under test must stay calls (no malloc+memset -> calloc, no
    # elided malloc/free pairs); memcpy may be inlined.
    if ! ${CC:-cc} -std=c11 -O2 -Wall -Wextra -fno-builtin-malloc -fno-builtin-calloc \
        -fno-builtin-realloc -fno-builtin-free -fno-builtin-posix_memalign \
        -o "$BIN" "$HERE/oom_tiers.c" 2>"$TMP/cc.err"; then
        fail setup "cannot build oom_tiers: $(head -n 3 "$TMP/cc.err" | tr '\n' ' ')"
        finish
    fi
fi

# ---- helpers ------------------------------------------------------------------
# limited KIB PRELOAD OUT ERR SECONDS CMD...: CMD under `ulimit -v KIB`,
# preloading PRELOAD (empty: glibc's malloc), bounded by `timeout`; stdout to
# OUT, stderr to ERR; returns CMD's status (124/137: timed out, >128: signal).
limited() {
    local kib=$1 preload=$2 out=$3 err=$4 secs=$5
    shift 5
    local rc=0
    # The braces take bash's own "Aborted"/"Segmentation fault" notice.
    # shellcheck disable=SC2016 # expanded by the inner shell
    {
        timeout -k 5 "$secs" bash -c '
            ulimit -v "$1" || exit 99
            [ -z "$2" ] || export LD_PRELOAD=$2
            shift 2
            exec "$@"' limited "$kib" "$preload" "$@" >"$out" 2>"$err" || rc=$?
    } 2>/dev/null
    return "$rc"
}

# trouble RC ERR: why a run counts as broken whatever its output (a hang, a
# signal, a library ld.so could not preload, a hakmem diagnostic), or nothing.
trouble() {
    local rc=$1 err=$2
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "timed out (hang?)"
    elif [ "$rc" -eq 99 ]; then
        echo "ulimit -v refused"
    elif [ "$rc" -gt 128 ]; then
        echo "killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?')): $(last_err "$err")"
    elif grep -q 'LD_PRELOAD cannot be preloaded' "$err"; then
        # ld.so could not map the library under the limit: the run was glibc's.
        echo "not preloaded under the limit: $(grep -m1 'LD_PRELOAD cannot be preloaded' "$err" | cut -c1-200)"
    elif grep -q '^hakmem:' "$err"; then
        echo "hakmem diagnostic: $(grep -m1 '^hakmem:' "$err" | cut -c1-200)"
    fi
}

last_err() { { grep -v '^[[:space:]]*$' "$1" | tail -n 1 || true; } | tr -d '\r' | cut -c1-200; }

# value FILE KEY: the number after KEY on its line, or empty.
value() { awk -v k="$2" '$1 == k { print $2; exit }' "$1"; }

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "inf" }'; }
below() { awk -v a="$1" -v b="$2" -v r="$MIN_RATIO" 'BEGIN { exit !(a < r * b) }'; }
libname() { basename "$1"; }

# ---- oom_tiers ----------------------------------------------------------------
# tiers_case NAME KIB TIER...: oom_tiers TIER... under glibc and hakmem.
# Every `X.round1`, `X.round2`, `X.again` figure of hakmem must be at least
# 0.8x glibc's; the headline figure is the sum of the round1 figures.
tiers_case() {
    local name=$1 kib=$2
    shift 2
    local g=$TMP/$name.glibc h=$TMP/$name.hakmem rc=0 why
    limited "$kib" "" "$g.out" "$g.err" "$SECS" "$BIN" "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$name" "glibc baseline: status $rc: $(grep -m1 '^error:' "$g.out" || last_err "$g.err")"
        return
    fi
    rc=0
    limited "$kib" "$LIB" "$h.out" "$h.err" "$SECS" "$BIN" "$@" || rc=$?
    local gsum hsum
    gsum=$(awk '$1 ~ /\.round1$/ { s += $2 } END { print s + 0 }' "$g.out")
    hsum=$(awk '$1 ~ /\.round1$/ { s += $2 } END { print s + 0 }' "$h.out")
    local figs
    figs="hakmem $(mib "$hsum") MiB, glibc $(mib "$gsum") MiB, $(ratio "$hsum" "$gsum")x"
    local lib
    for lib in $EXTRA_LIBS; do
        local x=$TMP/$name.extra xrc=0
        limited "$kib" "$lib" "$x.out" "$x.err" "$SECS" "$BIN" "$@" || xrc=$?
        also+="    also $(libname "$lib"): $(mib "$(awk '$1 ~ /\.round1$/ { s += $2 } END { print s + 0 }' "$x.out")") MiB, status $xrc $(trouble "$xrc" "$x.err")$(grep -m1 '^error:' "$x.out" | cut -c1-120 || true)"$'\n'
    done
    why=$(trouble "$rc" "$h.err")
    if [ -n "$why" ]; then
        fail "$name" "$why [$figs so far]"
        return
    fi
    local problems=
    if [ "$rc" -ne 0 ]; then
        problems="status $rc, $(grep -c '^error:' "$h.out") check(s) failed, first: $(grep -m1 '^error:' "$h.out" || last_err "$h.err");"
    fi
    # Every figure against glibc's.
    local key gv hv short=
    while read -r key gv; do
        hv=$(value "$h.out" "$key")
        if [ -z "$hv" ]; then
            short+=" $key missing;"
        elif below "$hv" "$gv"; then
            short+=" $key $(mib "$hv") MiB vs glibc $(mib "$gv") ($(ratio "$hv" "$gv")x);"
        fi
    done < <(awk '$1 ~ /\.(round1|round2|again)$/' "$g.out")
    if [ -n "$short" ]; then # the first six
        local n
        n=$(tr -cd ';' <<<"$short" | wc -c)
        [ "$n" -le 6 ] || short="$(cut -d';' -f1-6 <<<"$short"); and $((n - 6)) more;"
        problems+=" less than ${MIN_RATIO}x glibc's memory:$short"
    fi
    if [ -n "$problems" ]; then
        fail "$name" "${problems# } [$figs]"
    else
        pass "$name" "$figs"
    fi
}

# Not 50000: after the program's own 10 MB, 40 MB are left, and hakmem's
# fixed costs (a SuperSlab and 2 MiB arena units for its records, Pool
# chunks) are then a fifth of it (0.72x glibc's in round 2, 0.87x in round 1:
# docs/RELIABILITY.md).
# 150000: just above the point where a 128 MiB reservation fits.
for kib in 100000 150000 300000; do
    for tier in tiny tiny8k pool l25 large mixed; do
        start_case tiers_case "tiers-$kib-$tier" "$kib" "$tier"
    done
done
start_case tiers_case tiers-1000000-mixed 1000000 mixed
start_case tiers_case seq-100000 100000 tiny tiny8k pool l25 large mixed
start_case tiers_case seq-300000 300000 large l25 pool tiny8k tiny mixed

# ---- python -------------------------------------------------------------------
# python_case NAME KIB MODE PYTHONMALLOC: py_fill.py MODE (PYTHONMALLOC
# empty: unset, Python's default): exits 0 (MemoryError caught, never a
# crash), round2 at least 0.9x round1, round1 at least 0.8x glibc's.
PY=
if command -v python3 >/dev/null; then
    # Resolve wrappers (pyenv shims are shell scripts) to the interpreter.
    PY=$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=
fi
python_case() {
    local name=$1 kib=$2 mode=$3 pymalloc=$4
    if [ -z "$PY" ]; then
        fail "$name" "python3 not installed"
        return
    fi
    local g=$TMP/$name.glibc h=$TMP/$name.hakmem rc=0 why
    # The interpreter itself runs under the preload (no env(1) in between).
    py_run() { # PRELOAD OUT ERR
        (
            unset PYTHONMALLOC
            [ -z "$pymalloc" ] || export PYTHONMALLOC=$pymalloc
            export PYTHONHASHSEED=0
            limited "$kib" "$1" "$2" "$3" "$SECS" "$PY" "$HERE/py_fill.py" "$mode"
        )
    }
    py_run "" "$g.out" "$g.err" || rc=$?
    if [ "$rc" -ne 0 ] || ! grep -q '^done$' "$g.out"; then
        fail "$name" "glibc baseline: status $rc: $(last_err "$g.err")"
        return
    fi
    rc=0
    py_run "$LIB" "$h.out" "$h.err" || rc=$?
    local unit g1 h1 h2
    unit=$(value "$g.out" unit)
    g1=$(value "$g.out" round1)
    h1=$(value "$h.out" round1)
    h2=$(value "$h.out" round2)
    local figs
    figs="hakmem ${h1:-none} $unit, glibc $g1 $unit, $(ratio "${h1:-0}" "$g1")x"
    local lib
    for lib in $EXTRA_LIBS; do
        local x=$TMP/$name.extra xrc=0
        py_run "$lib" "$x.out" "$x.err" || xrc=$?
        also+="    also $(libname "$lib"): $(value "$x.out" round1) $unit, status $xrc $(trouble "$xrc" "$x.err")"$'\n'
    done
    why=$(trouble "$rc" "$h.err")
    if [ -n "$why" ]; then
        fail "$name" "$why [$figs]"
    elif [ "$rc" -ne 0 ] || ! grep -q '^done$' "$h.out"; then
        fail "$name" "python exited $rc: $(last_err "$h.err") [$figs]"
    elif [ "$h2" -lt $((h1 * 8 / 10)) ]; then
        fail "$name" "after freeing got $h2 $unit, less than 80% of the first $h1 [$figs]"
    elif below "$h1" "$g1"; then
        fail "$name" "less than ${MIN_RATIO}x glibc's memory [$figs]"
    else
        pass "$name" "$figs"
    fi
}

for kib in 100000 300000; do
    # 1 MiB bytearrays, Python's own small-object allocator as shipped.
    start_case python_case "python-bytes-$kib" "$kib" bytes ""
    # Small objects, each a malloc (and the list's array grown by realloc).
    start_case python_case "python-objects-$kib" "$kib" objects malloc
done

# ---- sort ---------------------------------------------------------------------
# ~35 MB of 1M random lines, and a file whose first line alone (64 MiB) is
# bigger than the address space a 60000 KiB limit leaves.
AWK=$(command -v gawk || command -v awk)
timeout "$(scaled_limit 600)" "$AWK" 'BEGIN {
    srand(7)
    for (i = 0; i < 1000000; i++)
        printf "%08x %d w%05d %.4f\n", int(rand() * 4294967295), int(rand() * 1e9),
            int(rand() * 50000), rand() * 1000
}' >"$TMP/lines.txt"
{
    head -c $((64 << 20)) /dev/zero | tr '\0' a
    printf '\nb\na\n'
} >"$TMP/long.txt"
mkdir -p "$TMP/sorttmp"
reference() { timeout "$(scaled_limit 600)" sort --parallel=1 -T "$TMP/sorttmp" "$1" | sha256sum | cut -d' ' -f1; }
LINES_REF=$(reference "$TMP/lines.txt")
LONG_REF=$(reference "$TMP/long.txt")

# sort_case NAME KIB EXPECT FILE REF SORT-ARGS...: REF is the sha256 of FILE
# sorted without a limit. EXPECT is glibc's outcome under this limit,
# `sorted` or `exhausted` (if glibc does otherwise, the case itself is wrong
# for this machine and fails). hakmem must sort it right, or fail with sort's
# own message and a plain status; failing where glibc sorted it is giving the
# program less memory than glibc: a FAIL.
sort_outcome() { # RC OUT ERR REF -> sorted | wrong | exhausted | other
    local rc=$1 out=$2 err=$3 ref=$4
    if [ "$rc" -eq 0 ]; then
        if [ "$(sha256sum <"$out" | cut -d' ' -f1)" = "$ref" ]; then echo sorted; else echo wrong; fi
    elif [ "$rc" -lt 128 ] && grep -qiE '^sort: .*(memory exhausted|cannot allocate memory)' "$err"; then
        echo exhausted
    else
        echo other
    fi
}
sort_case() {
    local name=$1 kib=$2 expect=$3 file=$4 ref=$5
    shift 5
    local g=$TMP/$name.glibc h=$TMP/$name.hakmem rc=0 go ho why
    local cmd=(sort --parallel=1 -T "$TMP/sorttmp" "$@" "$file")
    limited "$kib" "" "$g.out" "$g.err" "$SECS" "${cmd[@]}" || rc=$?
    go=$(sort_outcome "$rc" "$g.out" "$g.err" "$ref")
    rm -f "$g.out"
    if [ "$go" != "$expect" ]; then
        fail "$name" "glibc baseline: $go (status $rc: $(last_err "$g.err")), expected $expect"
        return
    fi
    rc=0
    limited "$kib" "$LIB" "$h.out" "$h.err" "$SECS" "${cmd[@]}" || rc=$?
    ho=$(sort_outcome "$rc" "$h.out" "$h.err" "$ref")
    rm -f "$h.out"
    local lib
    for lib in $EXTRA_LIBS; do
        local x=$TMP/$name.extra xrc=0
        limited "$kib" "$lib" "$x.out" "$x.err" "$SECS" "${cmd[@]}" || xrc=$?
        also+="    also $(libname "$lib"): $(sort_outcome "$xrc" "$x.out" "$x.err" "$ref"), status $xrc"$'\n'
        rm -f "$x.out"
    done
    local figs="hakmem $ho, glibc $go"
    why=$(trouble "$rc" "$h.err")
    if [ -n "$why" ]; then
        fail "$name" "$why [$figs]"
    elif [ "$ho" = wrong ]; then
        fail "$name" "status 0 but the output differs from the unlimited sort's"
    elif [ "$ho" = other ]; then
        fail "$name" "status $rc without sort's own message: $(last_err "$h.err")"
    elif [ "$ho" = exhausted ] && [ "$go" = sorted ]; then
        fail "$name" "sort failed cleanly ($(last_err "$h.err")) where glibc sorted it: less memory than glibc"
    else
        pass "$name" "$figs"
    fi
}

# Holds it all: the default buffer (half the limit) takes the whole input.
start_case sort_case sort-inmem-1000000 1000000 sorted "$TMP/lines.txt" "$LINES_REF"
# Cannot hold it all: malloc of 1 GiB fails, sort halves its buffer until one
# fits and merges through temporary files.
start_case sort_case sort-spill-100000 100000 sorted "$TMP/lines.txt" "$LINES_REF" -S 1G
# Tighter still: glibc's sort needs about 11 MB of address space here.
start_case sort_case sort-spill-30000 30000 sorted "$TMP/lines.txt" "$LINES_REF" -S 1G
# No allocator can: one line is bigger than the whole limit.
start_case sort_case sort-longline-60000 60000 exhausted "$TMP/long.txt" "$LONG_REF"

finish
