#!/usr/bin/env bash
# The memory operations hakmem exports (core/front/memops.c) give the C
# library's results: a program copying, moving (overlapping both ways),
# filling and string-copying, checked byte for byte against plain loops,
# built three ways: linked with libhakmem.a dynamically (the C library's
# found with dlsym), statically with -static (no dlsym: the stand-ins of
# core/box/libc.c serve for good), and preloaded in checked mode. (Their
# speed is a benchmark's matter: docs/BENCHMARKS.md, issue 33.)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL check_memops: $*"; exit 1; }

make -s release >/dev/null || fail "make release failed"
cat > "$tmp/ops.c" <<'C'
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static unsigned char a[4096], b[4096], want[4096];
static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 7);
}
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "line %d: %s\n", __LINE__, #c); return 1; } } while (0)
int main(void) {
    for (size_t n = 0; n < 300; n += 7) {
        for (size_t off = 0; off < 40; off += 13) {
            fill(a, sizeof a, (unsigned)n); fill(b, sizeof b, (unsigned)off);
            memcpy(want, b, sizeof b);
            for (size_t i = 0; i < n; i++) want[100 + off + i] = a[50 + i];
            CHECK(memcpy(b + 100 + off, a + 50, n) == b + 100 + off);
            CHECK(memcmp(b, want, sizeof b) == 0);
            CHECK(mempcpy(b, a, n) == b + n);
            /* overlapping, the destination above and below */
            fill(a, sizeof a, 3); memcpy(want, a, sizeof a);
            for (size_t i = n; i-- > 0;) want[200 + off + i] = want[200 + i];
            CHECK(memmove(a + 200 + off, a + 200, n) == a + 200 + off);
            CHECK(memcmp(a, want, sizeof a) == 0);
            fill(a, sizeof a, 5); memcpy(want, a, sizeof a);
            for (size_t i = 0; i < n; i++) want[200 + i] = want[200 + off + i];
            memmove(a + 200, a + 200 + off, n);
            CHECK(memcmp(a, want, sizeof a) == 0);
            memcpy(want, a, sizeof a);
            for (size_t i = 0; i < n; i++) want[300 + off + i] = (unsigned char)(0x100 + n - 3);
            CHECK(memset(a + 300 + off, (int)(0x100 + n - 3), n) == a + 300 + off);
            CHECK(memcmp(a, want, sizeof a) == 0);
        }
    }
    char s[64], d[64];
    strcpy(s, "hakmem memops");
    CHECK(strcpy(d, s) == d && strcmp(d, s) == 0);
    CHECK(stpcpy(d, "ab") == d + 2 && strcmp(d, "ab") == 0);
    CHECK(strcat(d, "cd") == d && strcmp(d, "abcd") == 0);
    memset(d, 'x', sizeof d);
    CHECK(strncpy(d, "abc", 8) == d && memcmp(d, "abc\0\0\0\0\0x", 9) == 0);
    CHECK(strncpy(d, "abcdef", 3) == d && memcmp(d, "abc\0", 4) == 0);
    return 0;
}
C
cc -O2 -fno-builtin -w "$tmp/ops.c" -o "$tmp/dyn" out/release/libhakmem.a -pthread || fail "dynamic build"
cc -O2 -fno-builtin -w -static "$tmp/ops.c" -o "$tmp/static" out/release/libhakmem.a -pthread 2>/dev/null ||
    fail "static build (libc6-dev's libc.a)"
"$tmp/dyn" || fail "linked with libhakmem.a: wrong results"
"$tmp/static" || fail "static (the stand-ins): wrong results"
HAKMEM_CHECK=1 LD_PRELOAD="$PWD/out/release/libhakmem.so" "$tmp/dyn" 2>"$tmp/err" || fail "checked mode: $(head -1 "$tmp/err")"
[ ! -s "$tmp/err" ] || fail "checked mode wrote: $(head -1 "$tmp/err")"
echo "PASS check_memops"
