#!/bin/sh
# The profiler's stack walker when a library is unloaded and another loaded
# at its addresses (tests/unwind/): no walk may use the first library's
# rules, on the thread's stack or on a coroutine's; the same for a library
# loaded before the walker started. The walker is linked in
# from the debug library (LIB, default out/debug/libhakmem.a).
set -eu
lib=${LIB:-out/debug/libhakmem.a}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL check_unwind: $*"
  exit 1
}
cc -O1 -shared -fPIC -DSZ=600 tests/unwind/f.c -o "$tmp/libbig.so"
cc -O1 -shared -fPIC -DSZ=300 tests/unwind/f.c -o "$tmp/libsmall.so"
cc -O1 -g -D_GNU_SOURCE -Icore tests/unwind/reload.c "$lib" -o "$tmp/reload" -ldl -pthread
"$tmp/reload" "$tmp/libbig.so" "$tmp/libsmall.so" || fail "walks went wrong after a reload (exit $?)"
"$tmp/reload" "$tmp/libsmall.so" "$tmp/libbig.so" || fail "walks went wrong after a reload (exit $?)"
"$tmp/reload" --before "$tmp/libbig.so" "$tmp/libsmall.so" || fail "a library loaded before the walker started, reloaded (exit $?)"
"$tmp/reload" --before "$tmp/libsmall.so" "$tmp/libbig.so" || fail "a library loaded before the walker started, reloaded (exit $?)"
echo "PASS check_unwind"
