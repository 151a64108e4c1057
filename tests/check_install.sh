#!/usr/bin/env bash
# `make install` into a temporary prefix, then build a program against it with
# pkg-config (shared and static) and check hakmem is the allocator it runs on.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL check_install: $*"; exit 1; }

make -s install PREFIX="$tmp/pfx" >/dev/null || fail "make install failed"
for f in lib/libhakmem.so.0 lib/libhakmem.so lib/libhakmem.a include/hakmem.h lib/pkgconfig/hakmem.pc; do
  [ -e "$tmp/pfx/$f" ] || fail "missing $f"
done
cat > "$tmp/app.c" <<'C'
#include <hakmem.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    char *p = malloc(100), *q = hak_malloc(3 << 20);
    /* hakmem's usable size for a 100-byte request is its 112-byte class */
    printf("%zu %d\n", malloc_usable_size(p), q != NULL);
    hak_free(q);
    free(p);
    return 0;
}
C
export PKG_CONFIG_PATH="$tmp/pfx/lib/pkgconfig"
# shellcheck disable=SC2046
cc "$tmp/app.c" $(pkg-config --cflags --libs hakmem) -Wl,-rpath,"$tmp/pfx/lib" -o "$tmp/app_shared" \
  || fail "shared link failed"
# shellcheck disable=SC2046
cc "$tmp/app.c" $(pkg-config --cflags hakmem) "$tmp/pfx/lib/libhakmem.a" -pthread -o "$tmp/app_static" \
  || fail "static link failed"
# Not `ldd | grep -q`: under pipefail, grep -q's early exit can kill ldd with
# SIGPIPE and fail the pipeline although the line was there.
libs=$(ldd "$tmp/app_shared") || fail "ldd failed"
grep -q 'libhakmem.so.0' <<<"$libs" || fail "app not linked to libhakmem.so.0"
for app in app_shared app_static; do
  out=$("$tmp/$app") || fail "$app exited non-zero"
  [ "$out" = "112 1" ] || fail "$app printed '$out', expected '112 1'"
done
echo "PASS check_install"
