/* Conformance tests for the standard allocation API as hakmem exports it:
 * glibc-compatible semantics for every entry point, plus the hak_ aliases.
 *
 * Build with -DHAK_TEST_GLIBC (and without libhakmem.a) to run the same tests
 * against glibc as a reference. */
#include <errno.h>
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "death.h"

#include "hakmem.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

#ifdef HAK_TEST_GLIBC
/* Reference build: map the hak_ names and C23 sized frees onto glibc. */
#define hak_malloc             malloc
#define hak_free               free
#define hak_calloc             calloc
#define hak_realloc            realloc
#define hak_reallocarray       reallocarray
#define hak_posix_memalign     posix_memalign
#define hak_aligned_alloc      aligned_alloc
#define hak_memalign           memalign
#define hak_valloc             valloc
#define hak_pvalloc            pvalloc
#define hak_malloc_usable_size malloc_usable_size
#define hak_malloc_trim        malloc_trim
#define hak_malloc_stats       malloc_stats
static void free_sized(void *p, size_t n) {
    (void)n;
    free(p);
}
static void free_aligned_sized(void *p, size_t a, size_t n) {
    (void)a;
    (void)n;
    free(p);
}
#define hak_free_sized         free_sized
#define hak_free_aligned_sized free_aligned_sized
#else
/* C23 functions that glibc 2.36's headers do not declare yet. */
void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t alignment, size_t size);
#endif

/* Sizes go through volatiles so the compiler cannot reason about (or warn
 * on) deliberately impossible requests. */
static volatile size_t v_size_max = SIZE_MAX;
static volatile size_t v_ptrdiff_max = PTRDIFF_MAX;

static int is_aligned(const void *p, size_t a) {
    return ((uintptr_t)p & (a - 1)) == 0;
}

static unsigned char pat(size_t i, unsigned seed) {
    return (unsigned char)(seed * 31u + i * 7u + (i >> 9));
}

static void fill(void *p, size_t n, unsigned seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = pat(i, seed);
}

/* Index of the first byte not matching fill(seed), or SIZE_MAX if all match. */
static size_t first_bad(const void *p, size_t n, unsigned seed) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != pat(i, seed)) return i;
    return SIZE_MAX;
}

#define assert_pattern(p, n, seed)                                                                 \
    do {                                                                                           \
        size_t bad_ = first_bad((p), (n), (seed));                                                 \
        if (bad_ != SIZE_MAX)                                                                      \
            fail_msg("pattern mismatch at byte %zu of %zu (block %p)", bad_, (size_t)(n),          \
                     (void *)(p));                                                                 \
    } while (0)

static void assert_zero(const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != 0) fail_msg("byte %zu of %zu is 0x%02x, not zero (block %p)", i, n, c[i], p);
}

/* Checks shared by every successful allocation: non-NULL, aligned, usable
 * size covers the request, and the whole usable size can be written. */
static void check_block(void *p, size_t size, size_t align, unsigned seed) {
    assert_non_null(p);
    if (!is_aligned(p, align)) fail_msg("%p not aligned to %zu (size %zu)", p, align, size);
    size_t us = malloc_usable_size(p);
    if (us < size) fail_msg("usable size %zu < requested %zu (%p)", us, size, p);
    fill(p, us, seed);
    assert_pattern(p, us, seed);
}

/* Pass a pointer through a volatile so that -Wuse-after-free cannot see the
 * (legitimate) use of a block after a realloc that failed. */
static void *launder(void *p) {
    void *volatile v = p;
    return v;
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* ---- malloc / usable size ---------------------------------------------- */

static void test_malloc_zero_unique(void **state) {
    (void)state;
    enum { N = 256 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = malloc(0);
        assert_non_null(p[i]);
        assert_true(is_aligned(p[i], 16));
    }
    qsort(p, N, sizeof p[0], cmp_ptr);
    for (int i = 1; i < N; i++)
        if (p[i] == p[i - 1]) fail_msg("malloc(0) returned %p twice", p[i]);
    for (int i = 0; i < N; i++)
        free(p[i]);
}

/* Every size 0..2048 live at once, each filled over its whole usable size:
 * a usable size that overlaps a neighbour corrupts its pattern. */
static void test_usable_size_every_small(void **state) {
    (void)state;
    enum { N = 2049 };
    void **p = malloc(N * sizeof *p);
    assert_non_null(p);
    for (size_t n = 0; n < N; n++) {
        p[n] = malloc(n);
        check_block(p[n], n, 16, (unsigned)n);
    }
    for (size_t n = 0; n < N; n++) {
        assert_true(malloc_usable_size(p[n]) >= n);
        assert_pattern(p[n], malloc_usable_size(p[n]), (unsigned)n);
    }
    for (size_t n = 0; n < N; n++)
        free(p[n]);
    free(p);
}

static void test_usable_size_ranges(void **state) {
    (void)state;
    size_t sizes[256];
    size_t ns = 0;
    const size_t edges[] = {1024, 8192, 53248, 1048576, 2 * MiB};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) {
        sizes[ns++] = edges[e] - 1;
        sizes[ns++] = edges[e];
        sizes[ns++] = edges[e] + 1;
    }
    for (size_t s = 2049; s <= 4 * MiB; s = s + s / 7 + 13)
        sizes[ns++] = s;
    sizes[ns++] = 4 * MiB - 1;
    sizes[ns++] = 4 * MiB;
    assert_true(ns <= sizeof sizes / sizeof sizes[0]);

    void *p[256];
    for (size_t i = 0; i < ns; i++) {
        p[i] = malloc(sizes[i]);
        check_block(p[i], sizes[i], 16, (unsigned)i);
    }
    for (size_t i = 0; i < ns; i++)
        assert_pattern(p[i], malloc_usable_size(p[i]), (unsigned)i);
    for (size_t i = 0; i < ns; i++)
        free(p[i]);
}

static void test_malloc_usable_size_null(void **state) {
    (void)state;
    assert_int_equal(malloc_usable_size(NULL), 0);
}

/* ---- failures ------------------------------------------------------------ */

static void test_malloc_enomem(void **state) {
    (void)state;
    const size_t bad[] = {v_size_max, v_ptrdiff_max + 1, v_size_max - 4095, v_size_max / 2 + 7};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        errno = 0;
        void *p = malloc(bad[i]);
        if (p != NULL) fail_msg("malloc(%zu) succeeded", bad[i]);
        assert_int_equal(errno, ENOMEM);
    }
    /* The heap still works after the failures. */
    void *p = malloc(100);
    check_block(p, 100, 16, 1);
    free(p);
}

static void test_calloc_overflow(void **state) {
    (void)state;
    errno = 0;
    assert_null(calloc(v_size_max / 2, 3));
    assert_int_equal(errno, ENOMEM);
    errno = 0;
    assert_null(calloc(3, v_size_max / 2));
    assert_int_equal(errno, ENOMEM);
    errno = 0;
    assert_null(calloc((size_t)1 << 33, (size_t)1 << 33));
    assert_int_equal(errno, ENOMEM);
    errno = 0;
    assert_null(calloc(1, v_size_max));
    assert_int_equal(errno, ENOMEM);
}

static void test_reallocarray(void **state) {
    (void)state;
    int *p = reallocarray(NULL, 10, sizeof(int));
    check_block(p, 10 * sizeof(int), 16, 0);
    for (int i = 0; i < 10; i++)
        p[i] = i * 3;
    p = reallocarray(p, 100000, sizeof(int));
    assert_non_null(p);
    for (int i = 0; i < 10; i++)
        assert_int_equal(p[i], i * 3);

    /* Overflow: NULL + ENOMEM, and the old block is untouched and usable. */
    for (int i = 0; i < 100000; i++)
        p[i] = i ^ 0x5a5a;
    errno = 0;
    void *r = reallocarray(launder(p), v_size_max / 2, 3);
    assert_null(r);
    assert_int_equal(errno, ENOMEM);
    errno = 0;
    r = reallocarray(launder(p), 3, v_size_max / 2);
    assert_null(r);
    assert_int_equal(errno, ENOMEM);
    for (int i = 0; i < 100000; i++)
        if (p[i] != (i ^ 0x5a5a)) fail_msg("element %d changed after failed reallocarray", i);
    assert_true(malloc_usable_size(p) >= 100000 * sizeof(int));
    p = reallocarray(p, 20, sizeof(int));
    assert_non_null(p);
    for (int i = 0; i < 20; i++)
        assert_int_equal(p[i], i ^ 0x5a5a);
    free(p);
}

/* ---- calloc -------------------------------------------------------------- */

static const size_t calloc_sizes[] = {1,           16,      100,     1000,       1024,
                                      4096,        8193,    53249,   100000,     1 * MiB,
                                      1 * MiB + 1, 2 * MiB, 3 * MiB, 3 * MiB + 5};

static void test_calloc_zeroed(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof calloc_sizes / sizeof calloc_sizes[0]; i++) {
        size_t n = calloc_sizes[i];
        unsigned char *p = calloc(n, 1);
        assert_non_null(p);
        assert_true(is_aligned(p, 16));
        assert_true(malloc_usable_size(p) >= n);
        assert_zero(p, n);
        free(p);
        /* Same total as nmemb * size. */
        p = calloc(1 + n / 8, 8);
        assert_non_null(p);
        assert_zero(p, (1 + n / 8) * 8);
        free(p);
    }
}

/* A block freed dirty and handed back by calloc must be zeroed again. */
static void test_calloc_after_dirty_free(void **state) {
    (void)state;
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < sizeof calloc_sizes / sizeof calloc_sizes[0]; i++) {
            size_t n = calloc_sizes[i];
            unsigned char *p = malloc(n);
            assert_non_null(p);
            memset(p, 0xAB, malloc_usable_size(p));
            free(p);
            p = calloc(1, n);
            assert_non_null(p);
            assert_zero(p, n);
            memset(p, 0xAB, malloc_usable_size(p));
            free(p);
            p = calloc(n, 1);
            assert_non_null(p);
            assert_zero(p, n);
            free(p);
        }
    }
    /* Many small dirty blocks at once, then calloc them back. */
    enum { N = 2000 };
    static void *blk[N];
    for (int i = 0; i < N; i++) {
        blk[i] = malloc(48);
        assert_non_null(blk[i]);
        memset(blk[i], 0xAB, malloc_usable_size(blk[i]));
    }
    for (int i = 0; i < N; i++)
        free(blk[i]);
    for (int i = 0; i < N; i++) {
        blk[i] = calloc(6, 8);
        assert_non_null(blk[i]);
        assert_zero(blk[i], 48);
    }
    for (int i = 0; i < N; i++)
        free(blk[i]);
}

/* ---- aligned allocation ---------------------------------------------------- */

static const size_t align_sizes[] = {0, 1, 100, 5000, 100000, 3 * MiB};
#define N_ALIGN_SIZES (sizeof align_sizes / sizeof align_sizes[0])

enum { ALLOC_POSIX, ALLOC_ALIGNED, ALLOC_MEMALIGN };

static void *alloc_aligned(int kind, size_t a, size_t n) {
    void *p = NULL;
    switch (kind) {
    case ALLOC_POSIX: {
        int rc = posix_memalign(&p, a, n);
        if (rc != 0) fail_msg("posix_memalign(%zu, %zu) = %d", a, n, rc);
        break;
    }
    case ALLOC_ALIGNED:
        p = aligned_alloc(a, n);
        break;
    default:
        p = memalign(a, n);
        break;
    }
    if (p == NULL) fail_msg("aligned allocation kind %d (%zu, %zu) failed", kind, a, n);
    return p;
}

/* For each alignment, all sizes live together, filled and cross-checked. */
static void check_alignments(int kind, size_t min_align) {
    size_t aligns[32];
    size_t na = 0;
    for (size_t a = min_align; a <= 1 * MiB; a <<= 1)
        aligns[na++] = a;
    aligns[na++] = 2 * MiB;
    aligns[na++] = 4 * MiB;
    for (size_t ai = 0; ai < na; ai++) {
        void *p[N_ALIGN_SIZES];
        size_t a = aligns[ai];
        for (size_t si = 0; si < N_ALIGN_SIZES; si++) {
            p[si] = alloc_aligned(kind, a, align_sizes[si]);
            check_block(p[si], align_sizes[si], a < 16 ? 16 : a, (unsigned)(ai * 8 + si));
        }
        for (size_t si = 0; si < N_ALIGN_SIZES; si++)
            assert_pattern(p[si], malloc_usable_size(p[si]), (unsigned)(ai * 8 + si));
        for (size_t si = 0; si < N_ALIGN_SIZES; si++)
            free(p[si]);
    }
}

static void test_posix_memalign_valid(void **state) {
    (void)state;
    check_alignments(ALLOC_POSIX, sizeof(void *));
}

static void test_posix_memalign_einval(void **state) {
    (void)state;
    const size_t bad[] = {0, 1, 2, 4, 3, 12, 24, 40, 48, 96, 100, 4097, 3 * MiB, SIZE_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *sentinel = (void *)(uintptr_t)0x5eed;
        void *out = sentinel;
        int rc = posix_memalign(&out, bad[i], 100);
        if (rc != EINVAL) fail_msg("posix_memalign(align %zu) returned %d, not EINVAL", bad[i], rc);
        assert_ptr_equal(out, sentinel);
    }
}

static void test_posix_memalign_enomem(void **state) {
    (void)state;
    void *sentinel = (void *)(uintptr_t)0x5eed;
    void *out = sentinel;
    assert_int_equal(posix_memalign(&out, 64, v_size_max - 10), ENOMEM);
    assert_ptr_equal(out, sentinel);
}

static void test_aligned_alloc_valid(void **state) {
    (void)state;
    check_alignments(ALLOC_ALIGNED, 1);
}

static void test_aligned_alloc_einval(void **state) {
    (void)state;
    const size_t bad[] = {3, 5, 6, 12, 24, 48, 100, 4097, 65535, 1 * MiB + 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        errno = 0;
        void *p = aligned_alloc(bad[i], 128);
        if (p != NULL) fail_msg("aligned_alloc(%zu, 128) succeeded", bad[i]);
        assert_int_equal(errno, EINVAL);
    }
}

static void test_memalign_valid(void **state) {
    (void)state;
    check_alignments(ALLOC_MEMALIGN, 1);
}

static size_t next_pow2(size_t a) {
    size_t r = 1;
    while (r < a)
        r <<= 1;
    return r;
}

static void test_memalign_rounds_up(void **state) {
    (void)state;
    const size_t odd[] = {3, 5, 24, 48, 100, 3000, 5000, 65537, 600000, 1 * MiB + 1};
    const size_t sizes[] = {1, 100, 5000, 100000};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            void *p = memalign(odd[i], sizes[s]);
            size_t want = next_pow2(odd[i]);
            assert_non_null(p);
            if (!is_aligned(p, want))
                fail_msg("memalign(%zu, %zu) = %p, not aligned to %zu", odd[i], sizes[s], p, want);
            check_block(p, sizes[s], 16, (unsigned)i);
            free(p);
        }
    }
}

static void test_valloc(void **state) {
    (void)state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sizes[] = {0, 1, 100, 4095, 4096, 5000, 100000, 3 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = valloc(sizes[i]);
        check_block(p, sizes[i], page, (unsigned)i);
        free(p);
    }
}

static void test_pvalloc(void **state) {
    (void)state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t sizes[] = {0, 1, 100, 4095, 4096, 4097, 100000, 3 * MiB + 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = pvalloc(sizes[i]);
        size_t want = sizes[i] == 0 ? page : (sizes[i] + page - 1) / page * page;
        check_block(p, want, page, (unsigned)i);
        free(p);
    }
}

/* ---- realloc ------------------------------------------------------------- */

static void test_realloc_null_is_malloc(void **state) {
    (void)state;
    void *p = realloc(NULL, 100);
    check_block(p, 100, 16, 3);
    free(p);
    p = realloc(NULL, 0);
    assert_non_null(p);
    free(p);
    p = realloc(NULL, 3 * MiB);
    check_block(p, 3 * MiB, 16, 4);
    free(p);
}

static long rss_pages(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = 0;
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = -1;
    fclose(f);
    return rss;
}

/* realloc(p, 0) returns NULL and frees p: doing it many times with touched
 * 256 KiB blocks must not grow the resident set (a leak would add ~1 GiB). */
static void test_realloc_zero_frees(void **state) {
    (void)state;
    long before = rss_pages();
    assert_true(before > 0);
    for (int i = 0; i < 4000; i++) {
        size_t n = (i & 1) ? 256 * KiB : 64;
        char *p = malloc(n);
        assert_non_null(p);
        for (size_t off = 0; off < n; off += 4096)
            p[off] = (char)i;
        void *r = realloc(p, 0);
        assert_null(r);
    }
    long after = rss_pages();
    long grown_mib = (after - before) * (long)sysconf(_SC_PAGESIZE) / (long)MiB;
    if (grown_mib > 128) fail_msg("RSS grew by %ld MiB: realloc(p, 0) leaks", grown_mib);
}

/* Grow and shrink across every tier; the common prefix must survive. */
static void test_realloc_chain(void **state) {
    (void)state;
    const size_t chain[] = {16,      2 * KiB,  60 * KiB, 2 * MiB, 64 * MiB,
                            2 * MiB, 60 * KiB, 2 * KiB,  16,      10};
    size_t cur = chain[0];
    unsigned char *p = malloc(cur);
    assert_non_null(p);
    fill(p, cur, 0);
    for (size_t i = 1; i < sizeof chain / sizeof chain[0]; i++) {
        size_t next = chain[i];
        p = realloc(p, next);
        assert_non_null(p);
        assert_true(is_aligned(p, 16));
        assert_true(malloc_usable_size(p) >= next);
        assert_pattern(p, cur < next ? cur : next, (unsigned)(i - 1));
        fill(p, next, (unsigned)i);
        cur = next;
    }
    free(p);
}

/* Small steps through sizes, then geometric growth to 4 MiB and back down:
 * catches in-place resize paths that lose bytes at class boundaries. */
static void test_realloc_steps(void **state) {
    (void)state;
    size_t cur = 1;
    unsigned seed = 0;
    unsigned char *p = malloc(cur);
    assert_non_null(p);
    fill(p, cur, seed);
    size_t steps[1024];
    size_t ns = 0;
    for (size_t s = 2; s <= 300; s++)
        steps[ns++] = s;
    for (size_t s = 301; s <= 4 * MiB; s = s + s / 5)
        steps[ns++] = s;
    size_t up = ns;
    for (size_t i = up; i-- > 0;)
        steps[ns++] = steps[i] / 2 + 1;
    assert_true(ns <= sizeof steps / sizeof steps[0]);
    for (size_t i = 0; i < ns; i++) {
        size_t next = steps[i];
        p = realloc(p, next);
        assert_non_null(p);
        assert_true(is_aligned(p, 16));
        assert_true(malloc_usable_size(p) >= next);
        assert_pattern(p, cur < next ? cur : next, seed);
        seed++;
        fill(p, next, seed);
        cur = next;
    }
    free(p);
}

static void test_realloc_huge_fails(void **state) {
    (void)state;
    const size_t sizes[] = {100, 70 * KiB, 3 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        void *p = malloc(n);
        assert_non_null(p);
        fill(p, n, 9);
        const size_t huge[] = {v_size_max, v_ptrdiff_max + 1, v_size_max - 4095};
        for (size_t h = 0; h < sizeof huge / sizeof huge[0]; h++) {
            errno = 0;
            void *r = realloc(launder(p), huge[h]);
            if (r != NULL) fail_msg("realloc(%zu -> %zu) succeeded", n, huge[h]);
            assert_int_equal(errno, ENOMEM);
        }
        p = launder(p);
        assert_true(malloc_usable_size(p) >= n);
        assert_pattern(p, n, 9);
        p = realloc(p, n * 2);
        assert_non_null(p);
        assert_pattern(p, n, 9);
        free(p);
    }
}

/* ---- free variants ------------------------------------------------------- */

static void test_free_null(void **state) {
    (void)state;
    for (int i = 0; i < 100; i++) {
        free(NULL);
        free_sized(NULL, 0);
        free_aligned_sized(NULL, 64, 0);
    }
    void *p = malloc(10);
    check_block(p, 10, 16, 0);
    free(p);
}

static size_t mixed_size(unsigned i) {
    switch (i % 10) {
    case 0:
        return i % 17;
    case 1:
        return 1000 + i % 100;
    case 2:
        return 8000 + i % 400;
    case 3:
        return 53000 + i % 600;
    case 4:
        return i % 97 == 0 ? 1 * MiB + i : 200 + i % 50;
    default:
        return 16 + (i * 37) % 900;
    }
}

/* Blocks freed with free_sized / free_aligned_sized must return to the heap
 * cleanly: the next wave of allocations must not overlap anything. */
static void test_free_sized(void **state) {
    (void)state;
    enum { N = 3000 };
    static void *p[N];
    static size_t sz[N];
    for (int wave = 0; wave < 3; wave++) {
        for (unsigned i = 0; i < N; i++) {
            sz[i] = mixed_size(i + (unsigned)wave * 7);
            p[i] = malloc(sz[i]);
            assert_non_null(p[i]);
            fill(p[i], sz[i], i);
        }
        for (unsigned i = 0; i < N; i++)
            assert_pattern(p[i], sz[i], i);
        for (unsigned i = 0; i < N; i++)
            free_sized(p[i], sz[i]);
    }
    /* Reuse check: fresh blocks are distinct and keep their contents. */
    for (unsigned i = 0; i < N; i++) {
        sz[i] = mixed_size(i);
        p[i] = malloc(sz[i]);
        assert_non_null(p[i]);
        fill(p[i], sz[i], i + 1);
    }
    for (unsigned i = 0; i < N; i++)
        assert_pattern(p[i], sz[i], i + 1);
    for (unsigned i = 0; i < N; i++)
        free(p[i]);
}

static void test_free_aligned_sized(void **state) {
    (void)state;
    enum { N = 2000 };
    static void *p[N];
    static size_t sz[N], al[N];
    for (int wave = 0; wave < 2; wave++) {
        for (unsigned i = 0; i < N; i++) {
            al[i] = (size_t)16 << (i % 13); /* 16 .. 64 KiB */
            sz[i] = i % 211 == 0 ? 2 * MiB + i : al[i] * (1 + i % 3);
            p[i] = aligned_alloc(al[i], sz[i]);
            assert_non_null(p[i]);
            assert_true(is_aligned(p[i], al[i]));
            fill(p[i], sz[i] < 4096 ? sz[i] : 4096, i);
        }
        for (unsigned i = 0; i < N; i++)
            assert_pattern(p[i], sz[i] < 4096 ? sz[i] : 4096, i);
        for (unsigned i = 0; i < N; i++)
            free_aligned_sized(p[i], al[i], sz[i]);
    }
    void *q = malloc(1000);
    check_block(q, 1000, 16, 0);
    free(q);
}

/* ---- malloc_trim / mallinfo2 / malloc_stats ------------------------------- */

static void test_malloc_trim(void **state) {
    (void)state;
    enum { N = 1000 };
    static void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = malloc(i % 50 == 0 ? 2 * MiB : 10 * KiB);
        assert_non_null(p[i]);
        fill(p[i], 10 * KiB, (unsigned)i);
    }
    for (int i = 0; i < N; i++)
        free(p[i]);
    int r = malloc_trim(0);
    if (r != 0 && r != 1) fail_msg("malloc_trim(0) returned %d", r);
    r = malloc_trim(1 * MiB);
    if (r != 0 && r != 1) fail_msg("malloc_trim(1 MiB) returned %d", r);
    /* The heap works after trimming, including the trimmed ranges. */
    for (int i = 0; i < N; i++) {
        p[i] = malloc(i % 50 == 0 ? 2 * MiB : 10 * KiB);
        assert_non_null(p[i]);
        fill(p[i], 10 * KiB, (unsigned)i + 1);
    }
    for (int i = 0; i < N; i++)
        assert_pattern(p[i], 10 * KiB, (unsigned)i + 1);
    for (int i = 0; i < N; i++)
        free(p[i]);
}

/* hblkhd counts memory in dedicated mappings: with four 4 MiB blocks live it
 * must have grown by at least one block (caches may already count others),
 * and cover all four. */
static void test_mallinfo2_hblkhd(void **state) {
    (void)state;
#ifdef HAK_TEST_GLIBC
    /* glibc raises its mmap threshold after earlier big frees; pin it. */
    mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
#endif
    struct mallinfo2 before = mallinfo2();
    char *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = malloc(4 * MiB);
        assert_non_null(p[i]);
        memset(p[i], i + 1, 4 * MiB);
    }
    struct mallinfo2 during = mallinfo2();
    if (during.hblkhd < before.hblkhd + 4 * MiB)
        fail_msg("hblkhd %zu -> %zu with 16 MiB live in large blocks", before.hblkhd,
                 during.hblkhd);
    assert_true(during.hblkhd >= 16 * MiB);
    for (int i = 0; i < 4; i++)
        free(p[i]);
}

/* Bytes fn wrote to stderr, run in a child that must exit normally. */
static size_t stderr_bytes_of(void (*fn)(void *)) {
    struct death d;
    run_child(fn, NULL, &d);
    assert_not_hung(&d);
    if (!WIFEXITED(d.status) || WEXITSTATUS(d.status) != 0) fail_msg("child status 0x%x", d.status);
    return d.len;
}

static void call_malloc_stats(void *unused) {
    (void)unused;
    void *p = malloc(1000);
    malloc_stats();
    free(p);
}

static void test_malloc_stats(void **state) {
    (void)state;
    assert_true(stderr_bytes_of(call_malloc_stats) > 0);
}

/* ---- hak_ aliases -------------------------------------------------------- */

static void test_hak_malloc_family(void **state) {
    (void)state;
    void *p = hak_malloc(100);
    check_block(p, 100, 16, 1);
    assert_true(hak_malloc_usable_size(p) >= 100);
    assert_int_equal(hak_malloc_usable_size(p), malloc_usable_size(p));
    hak_free(p);
    p = hak_malloc(0);
    assert_non_null(p);
    hak_free(p);
    hak_free(NULL);
    errno = 0;
    assert_null(hak_malloc(v_size_max));
    assert_int_equal(errno, ENOMEM);

    unsigned char *c = hak_calloc(1000, 3);
    assert_non_null(c);
    assert_zero(c, 3000);
    errno = 0;
    assert_null(hak_calloc(v_size_max / 2, 3));
    assert_int_equal(errno, ENOMEM);

    fill(c, 3000, 5);
    c = hak_realloc(c, 100000);
    assert_non_null(c);
    assert_pattern(c, 3000, 5);
    c = hak_reallocarray(c, 3 * MiB, 1);
    assert_non_null(c);
    assert_pattern(c, 3000, 5);
    errno = 0;
    assert_null(hak_reallocarray(launder(c), v_size_max / 2, 3));
    assert_int_equal(errno, ENOMEM);
    assert_pattern(c, 3000, 5);
    assert_null(hak_realloc(c, 0));

    /* The aliases and the standard names share one heap. */
    p = hak_malloc(200);
    check_block(p, 200, 16, 2);
    free(p);
    p = malloc(300);
    check_block(p, 300, 16, 3);
    assert_true(hak_malloc_usable_size(p) >= 300);
    hak_free(p);
    p = hak_malloc(5000);
    hak_free_sized(p, 5000);
}

static void test_hak_aligned_family(void **state) {
    (void)state;
    void *sentinel = (void *)(uintptr_t)0x5eed, *p = sentinel;
    assert_int_equal(hak_posix_memalign(&p, 24, 100), EINVAL);
    assert_ptr_equal(p, sentinel);
    assert_int_equal(hak_posix_memalign(&p, 4096, 100), 0);
    check_block(p, 100, 4096, 1);
    hak_free(p);

    p = hak_aligned_alloc(65536, 5000);
    check_block(p, 5000, 65536, 2);
    hak_free_aligned_sized(p, 65536, 5000);
    errno = 0;
    assert_null(hak_aligned_alloc(24, 100));
    assert_int_equal(errno, EINVAL);

    p = hak_memalign(48, 100);
    check_block(p, 100, 64, 3);
    hak_free(p);
    p = hak_memalign(2 * MiB, 3 * MiB);
    check_block(p, 3 * MiB, 2 * MiB, 4);
    hak_free(p);

    p = hak_valloc(5000);
    check_block(p, 5000, 4096, 5);
    hak_free(p);
    p = hak_pvalloc(5000);
    check_block(p, 8192, 4096, 6);
    hak_free(p);
    p = hak_pvalloc(0);
    check_block(p, 4096, 4096, 7);
    hak_free(p);

    int r = hak_malloc_trim(0);
    assert_true(r == 0 || r == 1);
}

static void call_hak_malloc_stats(void *unused) {
    (void)unused;
    hak_malloc_stats();
}

static void test_hak_malloc_stats(void **state) {
    (void)state;
    assert_true(stderr_bytes_of(call_hak_malloc_stats) > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malloc_zero_unique),
        cmocka_unit_test(test_usable_size_every_small),
        cmocka_unit_test(test_usable_size_ranges),
        cmocka_unit_test(test_malloc_usable_size_null),
        cmocka_unit_test(test_malloc_enomem),
        cmocka_unit_test(test_calloc_overflow),
        cmocka_unit_test(test_reallocarray),
        cmocka_unit_test(test_calloc_zeroed),
        cmocka_unit_test(test_calloc_after_dirty_free),
        cmocka_unit_test(test_posix_memalign_valid),
        cmocka_unit_test(test_posix_memalign_einval),
        cmocka_unit_test(test_posix_memalign_enomem),
        cmocka_unit_test(test_aligned_alloc_valid),
        cmocka_unit_test(test_aligned_alloc_einval),
        cmocka_unit_test(test_memalign_valid),
        cmocka_unit_test(test_memalign_rounds_up),
        cmocka_unit_test(test_valloc),
        cmocka_unit_test(test_pvalloc),
        cmocka_unit_test(test_realloc_null_is_malloc),
        cmocka_unit_test(test_realloc_zero_frees),
        cmocka_unit_test(test_realloc_chain),
        cmocka_unit_test(test_realloc_steps),
        cmocka_unit_test(test_realloc_huge_fails),
        cmocka_unit_test(test_free_null),
        cmocka_unit_test(test_free_sized),
        cmocka_unit_test(test_free_aligned_sized),
        cmocka_unit_test(test_malloc_trim),
        cmocka_unit_test(test_mallinfo2_hblkhd),
        cmocka_unit_test(test_malloc_stats),
        cmocka_unit_test(test_hak_malloc_family),
        cmocka_unit_test(test_hak_aligned_family),
        cmocka_unit_test(test_hak_malloc_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
