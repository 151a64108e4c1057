#!/usr/bin/env bash
# A program built against glibc alone, run with hakmem preloaded, that
# mixes the standard allocation calls with glibc's __libc_* names both ways
# (interposers, runtimes and debugging libraries call those to reach "the
# real malloc") and asks glibc's introspection calls: every block must stay
# hakmem's (no "free(): invalid pointer" either way) and malloc_info must
# describe hakmem's heap (issue 34).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL check_libc_names: $*"; exit 1; }

make -s release >/dev/null || fail "make release failed"
cat > "$tmp/mix.c" <<'C'
#define _GNU_SOURCE
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
void *__libc_malloc(size_t); void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t); void __libc_free(void *);
void *__libc_memalign(size_t, size_t);
int main(void) {
    static const size_t sizes[] = {24, 20000, 200000, 4u << 20};
    for (int i = 0; i < 4; i++) {
        size_t n = sizes[i];
        char *p = malloc(n);
        memset(p, 1, n);
        __libc_free(p);                    /* malloc's block, glibc's name */
        p = __libc_malloc(n);
        memset(p, 2, n);
        p = realloc(p, 2 * n);
        p = __libc_realloc(p, 3 * n);
        if (p[n - 1] != 2) return 1;
        free(p);                           /* __libc_malloc's block, free */
        free(__libc_calloc(1, n));
        __libc_free(__libc_memalign(4096, n));
    }
    if (mallopt(M_ARENA_MAX, 2) != 1) return 2;
    malloc_info(0, stdout);
    puts("ok");
    return 0;
}
C
cc -O1 -fno-builtin "$tmp/mix.c" -o "$tmp/mix" || fail "could not build the program"
"$tmp/mix" > "$tmp/glibc.out" 2>&1 || fail "the program fails under glibc itself: $(cat "$tmp/glibc.out")"
LD_PRELOAD=$PWD/out/release/libhakmem.so "$tmp/mix" > "$tmp/hak.out" 2> "$tmp/hak.err" ||
    fail "exit $? under hakmem: $(cat "$tmp/hak.err")"
[ ! -s "$tmp/hak.err" ] || fail "stderr under hakmem: $(cat "$tmp/hak.err")"
grep -q '^ok$' "$tmp/hak.out" || fail "no ok line"
grep -q 'name="superslab"' "$tmp/hak.out" || fail "malloc_info is not hakmem's: $(head -5 "$tmp/hak.out")"
echo "PASS check_libc_names"
