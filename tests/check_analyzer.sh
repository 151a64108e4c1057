#!/bin/bash
# Static analysis of core/: cppcheck over every core/**/*.c in the three
# configurations the code has (release; debug with fault injection; hak_
# names only, HAK_NO_OVERRIDE), and gcc -fanalyzer over every function once,
# in the configuration with the most paths (below). Prints every finding and
# "PASS check_analyzer" when there is none, else "FAIL check_analyzer: N
# findings" (N distinct finding lines) and exits 1.
#
# Needs (installs nothing): gcc >= 10 for -fanalyzer and cppcheck (Debian
# packages gcc, cppcheck; setarch, from util-linux, is used when present).
# Validated with Debian 12's gcc 12.2 and cppcheck 2.10; another version may
# find other things. About a minute on 2 cores.
#
# A finding the tools cannot see past is kept out at its line with a comment
# saying why: `// cppcheck-suppress <id>` on the line before (--inline-suppr).
# Nothing is suppressed here for the whole tree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LC_ALL=C # ASCII quotes in messages, a fixed sort order

fail() {
    echo "FAIL check_analyzer: $*"
    exit 1
}
[ -d core ] || fail "core/ not found"
command -v gcc >/dev/null || fail "gcc not found (Debian package gcc)"
command -v cppcheck >/dev/null || fail "cppcheck not found (Debian package cppcheck)"
echo 'int x;' | gcc -fanalyzer -x c -c - -o /dev/null 2>/dev/null ||
    fail "gcc $(gcc -dumpversion) has no -fanalyzer (gcc >= 10 needed)"

mapfile -t srcs < <(find core -type f -name '*.c' | sort)
[ ${#srcs[@]} -gt 0 ] || fail "no .c files under core/"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-analyzer.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The configurations, as the Makefile builds them (HAK_DEBUG and NDEBUG change
# nothing in core/ today; they are passed as the builds pass them).
configs=(
    "release:-DNDEBUG"
    "debug:-DHAK_DEBUG -DHAK_FAULT_INJECT"
    "no-override:-DHAK_DEBUG -DHAK_FAULT_INJECT -DHAK_NO_OVERRIDE"
)
common="-D_GNU_SOURCE -Iinclude -Icore"

# gcc -fanalyzer at -O0: optimised builds inline into paths the analyzer gives
# up on (-Wanalyzer-too-complex), -O0 is both faster and more complete. The two
# params raise its per-point and per-block state limits (defaults 8 and 5) so
# that it follows every path but one program point of core/ to the end.
gcc_flags="-std=c11 $common -fPIC -pthread -fvisibility=hidden -ftls-model=initial-exec -fno-builtin
    -O0 -fanalyzer --param=analyzer-max-enodes-per-program-point=64
    --param=analyzer-bb-explosion-factor=50 -fdiagnostics-plain-output"

# gcc -fanalyzer takes minutes where cppcheck takes seconds, so it reads each
# function once, in the configuration with the most paths: debug, whose OS
# calls can all fail on demand (fault injection) on top of the failures the
# release build handles, and whose assertions it reads as the invariants they
# are. The other two add no path of their own but where a file's code tests
# fault injection itself (os.c: the release build's OS calls without the
# injection points); HAK_NO_OVERRIDE only leaves out code (the standard names'
# aliases, the C++ operators). So: every file in debug, and in release the
# files that test HAK_FAULT_INJECT. Biggest files first: the longest jobs
# start at once instead of ending the run alone.
gcc_configs=(
    "debug:-DHAK_DEBUG -DHAK_FAULT_INJECT:."
    "release:-DNDEBUG:^[[:space:]]*#[[:space:]]*if.*HAK_FAULT_INJECT"
)
mapfile -t by_size < <(wc -c "${srcs[@]}" | sed '$d' | sort -rn | awk '{ print $2 }')
jobs=()
for cfg in "${gcc_configs[@]}"; do
    name=${cfg%%:*} rest=${cfg#*:}
    flags=${rest%%:*} pick=${rest#*:}
    for f in "${by_size[@]}"; do
        grep -qE "$pick" "$f" || continue
        jobs+=("$name" "$f" "$flags")
    done
done
# The analyzer picks which of equal paths to show by address: without
# address-space randomisation (setarch -R, util-linux) it shows the same one
# every run. The findings themselves do not depend on it.
norand="setarch $(uname -m) -R"
$norand true 2>/dev/null || norand=
export gcc_flags tmp norand
# shellcheck disable=SC2016 # the inner script expands its own arguments
printf '%s\0' "${jobs[@]}" |
    xargs -0 -n 3 -P "$(nproc)" bash -c '
        log="$tmp/gcc.$0.${1//\//_}"
        rc=0
        $norand gcc $gcc_flags $2 -c "$1" -o /dev/null >"$log" 2>&1 || rc=$?
        [ "$rc" -eq 0 ] || echo "$1:0: error: gcc exited $rc [$0]" >>"$log"
    ' || fail "gcc jobs did not run"

report=$tmp/report
findings=$tmp/findings
: >"$report"
: >"$findings"
for cfg in "${gcc_configs[@]}"; do
    for f in "${srcs[@]}"; do
        log="$tmp/gcc.${cfg%%:*}.${f//\//_}"
        [ -s "$log" ] || continue # none, or not analysed there
        { echo "--- gcc -fanalyzer (${cfg%%:*}) $f"; cat "$log"; } >>"$report"
        grep -E '^[^ :]+:[0-9]+(:[0-9]+)?: (warning|error): ' "$log" | sed 's/^/gcc: /' >>"$findings" || true
    done
done

# cppcheck: every check but information and unusedFunction (functions are
# called across files), the posix and gnu library models (gnu's mmap takes the
# fd -1 of anonymous mappings), a fixed 64-bit Unix platform.
for cfg in "${configs[@]}"; do
    log="$tmp/cppcheck.${cfg%%:*}"
    rc=0
    # shellcheck disable=SC2086
    cppcheck -q --enable=warning,style,performance,portability --inconclusive --std=c11 \
        --platform=unix64 --library=posix --library=gnu $common ${cfg#*:} \
        --suppress=missingIncludeSystem --inline-suppr \
        --template='{file}:{line}:{column}: {severity}: {message} [{id}]' \
        "${srcs[@]}" >"$log" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || echo "cppcheck:0:0: error: cppcheck exited $rc [${cfg%%:*}]" >>"$log"
    grep -E '^[^ ]+:[0-9]+:[0-9]+: [a-z]+: ' "$log" | sed 's/^/cppcheck: /' >>"$findings" || true
done
# Mostly the same lines in each configuration: each distinct line once.
if [ -n "$(cat "$tmp"/cppcheck.*)" ]; then
    { echo "--- cppcheck"; sort -u "$tmp"/cppcheck.*; } >>"$report"
fi

cat "$report"
# The same finding in several configurations counts once.
n=$(sort -u "$findings" | wc -l)
if [ "$n" -gt 0 ] || [ -s "$report" ]; then
    [ "$n" -gt 0 ] || n=1 # output that is no finding line (a note, a crash)
    echo "FAIL check_analyzer: $n findings"
    exit 1
fi
echo "PASS check_analyzer"
