# shellcheck shell=bash
# Shared helpers for tests/real/*.sh (sourced, not run). Each script sets
# NAME before sourcing. Provides ROOT, LIB (absolute), TMP (removed on exit),
# pass/fail, and run_case to run a command with or without the preload.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LIB=${LIB:-$ROOT/out/release/libhakmem.so}
case $LIB in
/*) ;;
*) LIB=$PWD/$LIB ;;
esac
# shellcheck disable=SC2034 # used by the scripts that source this file
HERE=$ROOT/tests/real
# shellcheck source=tests/lib.sh
source "$ROOT/tests/lib.sh"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-real-$NAME.XXXXXX")
cleanup_hooks=()
reported=0
err_line=
# Exit trap: run cleanup hooks, remove TMP, and make sure that a script that
# stops on an unexpected error still prints its one FAIL line.
cleanup() {
    local rc=$? h
    for h in "${cleanup_hooks[@]+"${cleanup_hooks[@]}"}"; do eval "$h" || true; done
    rm -rf "$TMP"
    if [ "$reported" -eq 0 ]; then
        echo "FAIL real/$NAME: unexpected error (status $rc${err_line:+, line $err_line})"
        exit 1
    fi
}
trap cleanup EXIT
trap 'err_line=$LINENO' ERR

pass() {
    reported=1
    echo "PASS real/$NAME"
    exit 0
}

fail() {
    reported=1
    echo "FAIL real/$NAME: $*"
    exit 1
}

require_lib() {
    [ -f "$LIB" ] || fail "library $LIB not found (run make release)"
    # The preload must really take effect; ld.so only warns when it cannot.
    local maps
    maps=$(LD_PRELOAD=$LIB cat /proc/self/maps 2>&1) || fail "cat failed under LD_PRELOAD=$LIB"
    grep -q libhakmem <<<"$maps" || fail "LD_PRELOAD=$LIB did not load libhakmem"
}

# run_case MODE OUT ERR SECONDS CMD...: runs CMD (MODE=plain or hakmem) under
# `timeout` (SECONDS scaled, tests/lib.sh), stdout to OUT and stderr to
# ERR; returns the exit status.
run_case() {
    local mode=$1 out=$2 err=$3 secs
    secs=$(scaled_limit "$4")
    shift 4
    local rc=0
    if [ "$mode" = hakmem ]; then
        timeout -k 5 "$secs" env LD_PRELOAD="$LIB" "$@" >"$out" 2>"$err" || rc=$?
    else
        timeout -k 5 "$secs" "$@" >"$out" 2>"$err" || rc=$?
    fi
    return "$rc"
}

# describe_rc RC: human-readable exit status.
describe_rc() {
    local rc=$1
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "timed out"
    elif [ "$rc" -gt 128 ]; then
        echo "killed by signal $((rc - 128))"
    else
        echo "exit status $rc"
    fi
}

# last_err FILE: last stderr line, for FAIL messages.
last_err() { { tail -n 1 "$1" 2>/dev/null || true; } | tr -d '\r' | cut -c1-200; }

# diff_head A B: the first lines of diff A B on one line, for FAIL messages.
diff_head() { { diff "$1" "$2" || true; } | head -n 4 | tr '\n' ' ' | cut -c1-300; }

# Fails if a hakmem run printed allocator diagnostics.
check_no_diag() {
    if grep -q '^hakmem:' "$1"; then fail "hakmem diagnostic: $(grep -m1 '^hakmem:' "$1")"; fi
}
