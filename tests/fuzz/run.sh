#!/usr/bin/env bash
# Fuzz the hakmem libFuzzer targets (out/fuzz/fuzz_*, built by `make checked`).
# Run from the repository root; `make fuzz FUZZ_SECONDS=600` builds and runs it.
#
# For each target:
#   1. replay every input of tests/fuzz/regress/<target>/ (inputs that once
#      crashed; they must pass now) and of the seed corpus tests/fuzz/corpus/<target>/;
#   2. fuzz for FUZZ_SECONDS (default 60) from a temporary copy of the corpus
#      (nothing is written into the repository), with tests/fuzz/dict.
# The targets run side by side, TEST_JOBS at a time (default one per core).
# One line per target: "PASS fuzz/<target>: <execs> execs in <s> s, corpus <n>"
# or "FAIL fuzz/<target>: <reason>", the failing input copied to
# out/fuzz/crashes/ and the first lines of the report printed. Exit status 1
# when any target failed.
#
# Environment: FUZZ_SECONDS (per target), FUZZ_SEGMENT (longest run of one
# libFuzzer process, default 300 s; longer runs are several in a row on the
# same corpus), FUZZ_ARTIFACTS (keep libFuzzer's artifacts there instead of a
# temporary directory), FUZZ_TARGETS (names to run, default all), FUZZ_EXTRA
# (more libFuzzer flags), TEST_JOBS and HAKMEM_TEST_TIME_SCALE (tests/lib.sh).
set -euo pipefail

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_SEGMENT=${FUZZ_SEGMENT:-300}
FUZZ_EXTRA=${FUZZ_EXTRA:-}
ROOT=$(pwd)
if [[ ! -d tests/fuzz || ! -d out ]]; then
    echo "FAIL fuzz: run tests/fuzz/run.sh from the repository root (after make checked)" >&2
    exit 1
fi
if ! [[ $FUZZ_SECONDS =~ ^[0-9]+$ && $FUZZ_SEGMENT =~ ^[1-9][0-9]*$ ]]; then
    echo "FAIL fuzz: FUZZ_SECONDS and FUZZ_SEGMENT must be whole numbers of seconds" >&2
    exit 1
fi

# shellcheck source=tests/lib.sh
source tests/lib.sh
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-fuzz.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
CRASHES=$ROOT/out/fuzz/crashes
# -timeout: one input running this long is a hang or a cliff (inputs take
# milliseconds; fuzz_badptr's own limit on a child, 9 s, comes first).
COMMON=(-rss_limit_mb=2560 -timeout="$(scaled_limit 20)" -print_final_stats=1)
# hakmem's blocks are not ASan's: leak checks would only see the harness.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

max_len_of() {
    case $1 in
    fuzz_badptr) echo 1024 ;;
    *) echo 4096 ;;
    esac
}

# The report's first lines: from the first line naming the failure on.
report_head() {
    local log=$1
    local start
    start=$(grep -n -m1 -E 'MODEL VIOLATION|ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error:|==[0-9]+==ERROR|Test unit written|SUMMARY:' "$log" | cut -d: -f1 || true)
    if [[ -n $start ]]; then
        tail -n "+$start" "$log" | head -n 25 | sed 's/^/    /'
    else
        tail -n 25 "$log" | sed 's/^/    /'
    fi
}

# Copy the artifact libFuzzer wrote (crash-, timeout-, oom-, leak-) to out/fuzz/crashes/.
save_artifact() {
    local target=$1 dir=$2 log=$3
    local f
    f=$(grep -o -m1 -E "Test unit written to [^ ]+" "$log" | sed 's/Test unit written to //' || true)
    if [[ -z $f || ! -f $f ]]; then
        f=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' \
            -o -name 'leak-*' \) -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -n1 | cut -d' ' -f2- || true)
    fi
    if [[ -n $f && -f $f ]]; then
        mkdir -p "$CRASHES"
        cp "$f" "$CRASHES/$target-$(basename "$f")"
        echo "$CRASHES/$target-$(basename "$f")"
    fi
}

shopt -s nullglob
targets=()
for bin in out/fuzz/fuzz_*; do
    [[ -f $bin && -x $bin ]] || continue
    name=$(basename "$bin")
    if [[ -n ${FUZZ_TARGETS:-} && " $FUZZ_TARGETS " != *" $name "* ]]; then continue; fi
    targets+=("$name")
done
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "FAIL fuzz: no targets in out/fuzz (make checked builds them)"
    exit 1
fi

# fuzz_target NAME: steps 1 and 2 for one target; its PASS or FAIL line (and
# report) on stdout, status 1 when it failed.
fuzz_target() {
    local name=$1 bin art log base maxlen inputs f rc bad why saved corpus dict start total failed left seg limit secs execs n
    bin=$ROOT/out/fuzz/$name
    art=${FUZZ_ARTIFACTS:-$TMP/artifacts}/$name
    mkdir -p "$art"
    log=$TMP/$name.log
    # A checked-mode target (<target>_check) is its base target's programs.
    base=${name%_check}
    maxlen=$(max_len_of "$base")

    # 1. Regressions and the seed corpus, each input once (files given one by
    #    one: libFuzzer runs them and writes nothing).
    inputs=()
    for f in tests/fuzz/regress/$base/* tests/fuzz/corpus/$base/*; do
        [[ -f $f && $(basename "$f") != README* ]] && inputs+=("$f")
    done
    if [[ ${#inputs[@]} -gt 0 ]]; then
        rc=0
        timeout --kill-after=30 "$(scaled_limit $((60 + ${#inputs[@]} * 10)))" \
            "$bin" "${COMMON[@]}" -artifact_prefix="$art/" "${inputs[@]}" >"$log" 2>&1 || rc=$?
        if [[ $rc -ne 0 ]]; then
            bad=$(grep -o -E "Running: [^ ]+" "$log" | tail -n1 | sed 's/Running: //' || true)
            [[ $rc -eq 124 || $rc -eq 137 ]] && why="replay timed out" || why="replay failed (exit $rc)"
            saved=
            if [[ -n $bad && -f $bad ]]; then # the input itself
                mkdir -p "$CRASHES"
                cp "$bad" "$CRASHES/$name-$(basename "$bad")"
                saved=$CRASHES/$name-$(basename "$bad")
            else
                saved=$(save_artifact "$name" "$art" "$log")
            fi
            echo "FAIL fuzz/$name: $why on ${bad:-an input}; input: ${saved:-?}"
            report_head "$log"
            return 1
        fi
    fi

    # 2. Fuzz from a temporary copy of the corpus, in segments of at most
    #    FUZZ_SEGMENT seconds (a fresh process each: mappings leaked by
    #    injected munmap failures do not pile up).
    corpus=$TMP/corpus-$name
    mkdir -p "$corpus"
    if [[ -d tests/fuzz/corpus/$base ]]; then
        cp tests/fuzz/corpus/$base/* "$corpus"/ 2>/dev/null || true
    fi
    dict=()
    [[ -f tests/fuzz/dict ]] && dict=(-dict="$ROOT/tests/fuzz/dict")
    start=$(date +%s)
    total=0
    failed=0
    left=$FUZZ_SECONDS
    while [[ $left -gt 0 ]]; do
        seg=$((left < FUZZ_SEGMENT ? left : FUZZ_SEGMENT))
        limit=$(scaled_limit $((seg + 300)))
        rc=0
        # shellcheck disable=SC2086
        timeout --kill-after=30 "$limit" \
            "$bin" "${COMMON[@]}" "${dict[@]}" -max_len="$maxlen" -max_total_time="$seg" \
            -artifact_prefix="$art/" $FUZZ_EXTRA "$corpus" >"$log" 2>&1 || rc=$?
        secs=$(($(date +%s) - start))
        if [[ $rc -ne 0 ]]; then
            if [[ $rc -eq 124 || $rc -eq 137 ]]; then
                why="libFuzzer did not stop (killed after $limit s)"
            elif grep -q -E "MODEL VIOLATION" "$log"; then
                why="model violation"
            elif grep -q -E "ERROR: libFuzzer: (timeout|out-of-memory)" "$log"; then
                why=$(grep -o -m1 -E "ERROR: libFuzzer: (timeout|out-of-memory)[^)]*\)?" "$log")
            elif grep -q -E "ERROR: AddressSanitizer|runtime error:" "$log"; then
                # (|| true: under pipefail a report this does not match, such
                # as "SEGV", ended the script without a FAIL line.)
                why=$(grep -o -m1 -E "(ERROR: AddressSanitizer: [A-Za-z-]+|runtime error: .*)" "$log" | head -c 200 || true)
                why=${why:-crash (exit $rc)}
            else
                why="crash (exit $rc)"
            fi
            saved=$(save_artifact "$name" "$art" "$log")
            echo "FAIL fuzz/$name: $why after $secs s; input: ${saved:-none written}"
            report_head "$log"
            failed=1
            break
        fi
        execs=$(grep -o -E "stat::number_of_executed_units: *[0-9]+" "$log" | grep -o -E "[0-9]+$" | tail -n1 || true)
        total=$((total + ${execs:-0}))
        left=$((FUZZ_SECONDS - secs))
    done
    if [[ $failed -ne 0 ]]; then
        return 1
    fi
    n=$(find "$corpus" -type f | wc -l)
    echo "PASS fuzz/$name: $total execs in $(($(date +%s) - start)) s, corpus $n"
}

# The targets side by side, TEST_JOBS at a time (each libFuzzer process is
# one thread), their lines printed in a fixed order (tests/lib.sh's jobs).
JOBS_TMP=$TMP
JOBS_REPORTER="report_lines fuzz"
for name in "${targets[@]}"; do
    job_start "$name" fuzz_target "$name"
done
jobs_flush "$JOBS_REPORTER" all
[[ $lines_failed -eq 0 ]]
