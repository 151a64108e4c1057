/* glibc's allocator API beyond the standard calls (core/front/glibc.c and
 * api.c's aliases): the __libc_* names reach hakmem, mallopt answers as
 * glibc does and maps what has an equivalent, mallinfo and malloc_info
 * describe hakmem's heap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/config.h"
#include "box/os.h"
#include "death.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

#ifndef HAK_TEST_TSAN /* (its library exports the hak_ names only) */
/* glibc declares none of them. */
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t nmemb, size_t n);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);
void *__libc_memalign(size_t align, size_t n);
void *__libc_valloc(size_t n);
void *__libc_pvalloc(size_t n);
int __posix_memalign(void **out, size_t align, size_t n);

static const size_t sizes[] = {24, 20000, 200000, 4 * MiB}; /* Tiny, Pool, L2.5, Large */

/* A block of one name freed by the other, both ways, in every tier. */
static void test_libc_names_mix_with_standard_ones(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        char *p = malloc(n);
        assert_non_null(p);
        memset(p, 1, n);
        __libc_free(p);
        p = __libc_malloc(n);
        assert_non_null(p);
        assert_true(malloc_usable_size(p) >= n);
        memset(p, 2, n);
        p = realloc(p, 2 * n);
        assert_int_equal(p[n - 1], 2);
        p = __libc_realloc(p, 3 * n);
        assert_int_equal(p[n - 1], 2);
        free(p);
        unsigned char *z = __libc_calloc(n, 1);
        assert_non_null(z);
        for (size_t k = 0; k < n; k += 97)
            assert_int_equal(z[k], 0);
        free(z);
    }
    void *a = __libc_memalign(4096, 100), *v = __libc_valloc(100), *pv = __libc_pvalloc(1), *pm;
    assert_int_equal((uintptr_t)a % 4096, 0);
    assert_int_equal((uintptr_t)v % 4096, 0);
    assert_int_equal((uintptr_t)pv % 4096, 0);
    assert_true(malloc_usable_size(pv) >= 4096);
    assert_int_equal(__posix_memalign(&pm, 256, 100), 0);
    assert_int_equal((uintptr_t)pm % 256, 0);
    assert_int_equal(__posix_memalign(&pm, 3, 100), EINVAL);
    free(a);
    free(v);
    free(pv);
    __libc_free(pm);
    __libc_free(NULL);
}

static void libc_free_twice(void *p) {
    __libc_free(p);
    __libc_free(p);
}

/* __libc_free is hakmem's free: a double free is hakmem's report. */
static void test_libc_free_is_hakmems(void **state) {
    (void)state;
    void *p = __libc_malloc(40);
    expect_free_abort(libc_free_twice, p, "double free");
    free(p);
}
#endif

/* glibc's own mallopt, from the C library itself. */
static int glibc_mallopt(int param, int value) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(libc);
    int (*fn)(int, int) = (int (*)(int, int))dlsym(libc, "mallopt");
    assert_non_null(fn);
    int rc = fn(param, value);
    dlclose(libc);
    return rc;
}

/* Every glibc parameter, and ones it does not know, with values in and out
 * of their ranges: the same answer as glibc's. */
static void test_mallopt_answers_as_glibc(void **state) {
    (void)state;
    struct hak_config saved = hak_cfg;
    static const int params[] = {
        M_MXFAST,     M_NLBLKS,         M_GRAIN,    M_KEEP,         M_TRIM_THRESHOLD,
        M_TOP_PAD,    M_MMAP_THRESHOLD, M_MMAP_MAX, M_CHECK_ACTION, M_PERTURB,
        M_ARENA_TEST, M_ARENA_MAX,      -9,         12345,          0};
    static const int values[] = {-1, 0, 1, 64, 160, 161, 100000, 1 << 30, INT_MAX};
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
            int want = glibc_mallopt(params[i], values[k]);
            if (mallopt(params[i], values[k]) != want)
                fail_msg("mallopt(%d, %d): glibc says %d", params[i], values[k], want);
        }
    }
    hak_cfg = saved;
}

static uint64_t unmaps(void) {
    return os_calls(OS_MUNMAP);
}

/* M_TRIM_THRESHOLD bounds the freed memory kept (the BigCache): 0 keeps
 * none, so a freed Large block goes back at once. */
static void test_mallopt_trim_threshold(void **state) {
    (void)state;
    struct hak_config saved = hak_cfg;
    hak_cfg.age_ms = 3600000; /* nothing kept ages out meanwhile, however slow the machine */
    malloc_trim(0);
    assert_int_equal(mallopt(M_TRIM_THRESHOLD, 0), 1);
    assert_int_equal(hak_cfg.bigcache_bytes, 0);
    void *p = malloc(4 * MiB);
    uint64_t u = unmaps();
    free(p);
    assert_true(unmaps() > u);
    assert_int_equal(mallinfo2().keepcost, 0);
    assert_int_equal(mallopt(M_TRIM_THRESHOLD, 64 << 20), 1);
    assert_int_equal(hak_cfg.bigcache_bytes, 64 * MiB);
    p = malloc(4 * MiB);
    u = unmaps();
    free(p);
    assert_int_equal(unmaps(), u);
    assert_true(mallinfo2().keepcost >= 4 * MiB);
    assert_int_equal(mallopt(M_TRIM_THRESHOLD, -1), 1); /* never trim: the most kept */
    assert_int_equal(hak_cfg.bigcache_bytes, HAK_CFG_BIGCACHE_MAX);
    hak_cfg = saved;
    malloc_trim(0);
}

/* M_MMAP_THRESHOLD: a freed Large block whose mapping is at least that big
 * goes back at once, as glibc's mapped blocks do; smaller ones are kept. */
static void test_mallopt_mmap_threshold(void **state) {
    (void)state;
    struct hak_config saved = hak_cfg;
    hak_cfg.age_ms = 3600000; /* nothing kept ages out meanwhile, however slow the machine */
    malloc_trim(0);
    assert_int_equal(mallopt(M_MMAP_THRESHOLD, 8 << 20), 1);
    void *p = malloc(4 * MiB);
    uint64_t u = unmaps();
    free(p);
    assert_int_equal(unmaps(), u); /* kept */
    size_t kept = mallinfo2().keepcost;
    assert_true(kept >= 4 * MiB);
    p = malloc(16 * MiB);
    u = unmaps();
    free(p);
    assert_true(unmaps() > u);
    assert_int_equal(mallinfo2().keepcost, kept);
    hak_cfg = saved;
    malloc_trim(0);
}

/* mallinfo: mallinfo2's figures, each saturating at INT_MAX. */
static void test_mallinfo_saturates(void **state) {
    (void)state;
    void *small = malloc(100);
    struct mallinfo2 m2 = mallinfo2();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo m = mallinfo();
#pragma GCC diagnostic pop
    assert_int_equal(m.hblks, (int)m2.hblks);
    assert_int_equal(m.hblkhd, (int)m2.hblkhd);
    assert_true(m.arena > 0 && (size_t)m.arena == m2.arena);
    assert_int_equal((size_t)m.uordblks, m2.uordblks);
    /* 3 GiB of untouched pages: address space, a figure past INT_MAX. */
    void *big = malloc((size_t)3 << 30);
    assert_non_null(big);
    m2 = mallinfo2();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    m = mallinfo();
#pragma GCC diagnostic pop
    assert_true(m2.hblkhd > INT_MAX);
    assert_int_equal(m.hblkhd, INT_MAX);
    assert_int_equal(m.hblks, (int)m2.hblks);
    free(big);
    free(small);
}

/* The value of attribute `attr` of the first element starting with `tag`. */
static unsigned long long xml_value(const char *xml, const char *tag, const char *attr) {
    const char *t = strstr(xml, tag);
    assert_non_null(t);
    const char *a = strstr(t, attr);
    assert_non_null(a);
    return strtoull(a + strlen(attr), NULL, 10);
}

/* malloc_info: glibc's XML shape, a <heap> per tier holding memory, the
 * mmap total being the blocks with a mapping of their own. */
static void test_malloc_info(void **state) {
    (void)state;
    /* (A file, not open_memstream: under TSan the C library's malloc
     * would own its buffer, which the test's free, renamed, is not.) */
    static char buf[1 << 16];
    FILE *f = tmpfile();
    assert_non_null(f);
    errno = 0;
    assert_int_equal(malloc_info(1, f), EINVAL);
    assert_int_equal(errno, 0);
    void *big = malloc(4 * MiB), *small = malloc(100);
    memset(small, 1, 100);
    struct mallinfo2 m2 = mallinfo2();
    assert_int_equal(malloc_info(0, f), 0);
    rewind(f);
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    buf[len] = 0;
    fclose(f);
    assert_true(strncmp(buf, "<malloc version=\"1\">\n<heap nr=\"0\"", 33) == 0);
    assert_true(len > 10 && strcmp(buf + len - 10, "</malloc>\n") == 0);
    assert_non_null(strstr(buf, "name=\"large\""));
    assert_non_null(strstr(buf, "name=\"superslab\""));
    /* The totals (after the last </heap>). */
    const char *totals = buf;
    for (const char *h; (h = strstr(totals, "</heap>")) != NULL;)
        totals = h + 7;
    assert_int_equal(xml_value(totals, "<total type=\"mmap\"", "count=\""), m2.hblks);
    assert_int_equal(xml_value(totals, "<total type=\"mmap\"", "size=\""), m2.hblkhd);
    assert_true(xml_value(totals, "<system type=\"current\"", "size=\"") >= 4 * MiB);
    assert_true(xml_value(totals, "<aspace type=\"total\"", "size=\"") >=
                xml_value(totals, "<system type=\"current\"", "size=\""));
    int heaps = 0;
    for (const char *h = buf; (h = strstr(h, "<heap nr=\"")) != NULL; h++)
        assert_int_equal(xml_value(h, "<heap", "nr=\""), heaps++);
    assert_true(heaps >= 2);
    free(big);
    free(small);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#ifndef HAK_TEST_TSAN
        cmocka_unit_test(test_libc_names_mix_with_standard_ones),
        cmocka_unit_test(test_libc_free_is_hakmems),
#endif
        cmocka_unit_test(test_mallopt_answers_as_glibc),
        cmocka_unit_test(test_mallopt_trim_threshold),
        cmocka_unit_test(test_mallopt_mmap_threshold),
        cmocka_unit_test(test_mallinfo_saturates),
        cmocka_unit_test(test_malloc_info),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
