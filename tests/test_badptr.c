/* Death tests: invalid and double frees must abort with exactly one
 * diagnostic line naming the pointer. Each case runs in a fork()ed child with
 * stderr on a pipe; the parent checks the signal and the text. */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

/* The C library's own malloc and free (its __libc_* names are hakmem's
 * now: issue 34), from libc.so.6 itself. */
static void *glibc_fn(const char *name) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(libc);
    void *fn = dlsym(libc, name);
    assert_non_null(fn);
    dlclose(libc);
    return fn;
}

#include "death.h"

static void expect_invalid(const char *fn_name, void (*fn)(void *), void *ptr) {
    char line[128];
    snprintf(line, sizeof line, "hakmem: %s(): invalid pointer %p", fn_name, ptr);
    expect_death(fn, ptr, line);
}

/* ---- operations run in the child ------------------------------------------ */

/* Pointers travel through a volatile so the compiler cannot diagnose or
 * fold the deliberately bad calls. */
static void do_realloc(void *p) {
    void *volatile v = p;
    void *r = realloc(v, 100);
    /* Reaching here means no abort; print so the failure is explained. */
    fprintf(stderr, "realloc returned %p\n", r);
}

static void do_usable_size(void *p) {
    void *volatile v = p;
    size_t n = malloc_usable_size(v);
    fprintf(stderr, "malloc_usable_size returned %zu\n", n);
}

/* ---- bad pointers --------------------------------------------------------- */

_Alignas(64) static char g_global[256];

static void test_free_stack(void **state) {
    (void)state;
    _Alignas(64) char buf[256];
    memset(buf, 0, sizeof buf);
    expect_invalid("free", do_free, buf);
}

static void test_free_global(void **state) {
    (void)state;
    expect_invalid("free", do_free, g_global);
}

/* A block of the C library's own heap. */
static void test_free_glibc_malloc(void **state) {
    (void)state;
    void *(*glibc_malloc)(size_t) = (void *(*)(size_t))glibc_fn("malloc");
    void (*glibc_free)(void *) = (void (*)(void *))glibc_fn("free");
    assert_true(glibc_malloc != malloc);
    void *p = glibc_malloc(100);
    assert_non_null(p);
    expect_invalid("free", do_free, p);
    glibc_free(p);
}

static void test_free_random_address(void **state) {
    (void)state;
    expect_invalid("free", do_free, (void *)(uintptr_t)0x123456789a0ull);
}

/* Memory the program mapped itself, 2 MiB aligned like hakmem's own. */
static void test_free_foreign_mapping(void **state) {
    (void)state;
    size_t len = 4 * MiB;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    char *p = (char *)(((uintptr_t)m + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
    expect_invalid("free", do_free, p);
    munmap(m, len);
}

static void test_free_interior_small(void **state) {
    (void)state;
    char *p = malloc(64);
    assert_non_null(p);
    expect_invalid("free", do_free, p + 16);
    free(p);
}

static void test_free_misaligned_small(void **state) {
    (void)state;
    char *p = malloc(64);
    assert_non_null(p);
    expect_invalid("free", do_free, p + 1);
    free(p);
}

static void test_free_interior_large(void **state) {
    (void)state;
    char *p = malloc(3 * MiB);
    assert_non_null(p);
    expect_invalid("free", do_free, p + 4096);
    free(p);
}

static void test_realloc_stack(void **state) {
    (void)state;
    _Alignas(64) char buf[256];
    memset(buf, 0, sizeof buf);
    expect_invalid("realloc", do_realloc, buf);
}

static void test_realloc_interior_small(void **state) {
    (void)state;
    char *p = malloc(64);
    assert_non_null(p);
    expect_invalid("realloc", do_realloc, p + 16);
    free(p);
}

static void test_realloc_interior_large(void **state) {
    (void)state;
    char *p = malloc(3 * MiB);
    assert_non_null(p);
    expect_invalid("realloc", do_realloc, p + 4096);
    free(p);
}

static void test_usable_size_stack(void **state) {
    (void)state;
    _Alignas(64) char buf[256];
    memset(buf, 0, sizeof buf);
    expect_invalid("malloc_usable_size", do_usable_size, buf);
}

static void test_usable_size_interior_small(void **state) {
    (void)state;
    char *p = malloc(64);
    assert_non_null(p);
    expect_invalid("malloc_usable_size", do_usable_size, p + 16);
    free(p);
}

static void test_usable_size_interior_large(void **state) {
    (void)state;
    char *p = malloc(3 * MiB);
    assert_non_null(p);
    expect_invalid("malloc_usable_size", do_usable_size, p + 4096);
    free(p);
}

/* ---- double free ---------------------------------------------------------- */

static void expect_double_free(size_t size) {
    void *p = malloc(size);
    assert_non_null(p);
    struct death d;
    run_child(do_double_free, p, &d);
    assert_aborted(&d);
    char dbl[128], inv[128];
    snprintf(dbl, sizeof dbl, "hakmem: free(): double free %p", p);
    snprintf(inv, sizeof inv, "hakmem: free(): invalid pointer %p", p);
    int e1, e2, hak;
    count_lines(&d, dbl, &e1, &hak);
    count_lines(&d, inv, &e2, &hak);
    if (e1 + e2 != 1 || hak != 1)
        fail_msg("expected one \"%s\" (or invalid pointer) line; stderr was:\n%s", dbl, d.err);
    free(p); /* still live in the parent */
}

static void test_double_free_small(void **state) {
    (void)state;
    expect_double_free(32);
}

static void test_double_free_large(void **state) {
    (void)state;
    expect_double_free(4 * MiB);
}

/* The detector must not fire on valid use: same ops on good pointers. */
static void good_ops(void *arg) {
    (void)arg;
    void *p = malloc(64);
    void *q = malloc(3 * MiB);
    if (malloc_usable_size(p) < 64 || malloc_usable_size(q) < 3 * MiB) _exit(3);
    p = realloc(p, 100);
    q = realloc(q, 4 * MiB);
    if (p == NULL || q == NULL) _exit(4);
    free(p);
    free(q);
    free(NULL);
}

static void test_valid_use_does_not_abort(void **state) {
    (void)state;
    expect_clean_exit(good_ops, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_use_does_not_abort),
        cmocka_unit_test(test_free_stack),
        cmocka_unit_test(test_free_global),
        cmocka_unit_test(test_free_glibc_malloc),
        cmocka_unit_test(test_free_random_address),
        cmocka_unit_test(test_free_foreign_mapping),
        cmocka_unit_test(test_free_interior_small),
        cmocka_unit_test(test_free_misaligned_small),
        cmocka_unit_test(test_free_interior_large),
        cmocka_unit_test(test_realloc_stack),
        cmocka_unit_test(test_realloc_interior_small),
        cmocka_unit_test(test_realloc_interior_large),
        cmocka_unit_test(test_usable_size_stack),
        cmocka_unit_test(test_usable_size_interior_small),
        cmocka_unit_test(test_usable_size_interior_large),
        cmocka_unit_test(test_double_free_small),
        cmocka_unit_test(test_double_free_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
