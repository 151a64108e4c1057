/* What a report says: every detection prints one line naming the call, the
 * kind, the pointer, then the block's size and tier (or where the pointer
 * is), and aborts; HAKMEM_BACKTRACE=1 adds the calls that led there.
 * Underflows below Large and Pool blocks, and an overflow into the next Pool
 * block's header, are caught by default. And
 * free_sized / free_aligned_sized: a size that does not belong to the block
 * is reported, while every size a correct program can pass (after realloc
 * shrank or grew the block) frees it. Each bad call runs in a fork()ed
 * child (tests/death.h). */
#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "death.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

/* C23; glibc 2.36's headers do not declare them yet. */
void free_sized(void *ptr, size_t size);
void free_aligned_sized(void *ptr, size_t alignment, size_t size);

/* One size per tier: Tiny, Tiny above 1 KiB, Pool, L2.5, Large. */
static const size_t sizes[] = {100, 3000, 20000, 200000, 3 * MiB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static const char *tier_of(size_t n) {
    return n <= 8 * KiB ? "tiny" : n <= 52 * KiB ? "pool" : n <= MiB ? "L2.5" : "large";
}

/* The block size a report gives: the class size, or for Large blocks the
 * size asked. */
static size_t block_of(void *p, size_t n) {
    return n > MiB ? n : malloc_usable_size(p);
}

static void test_double_free_names_block_and_tier(void **state) {
    (void)state;
    for (size_t i = 0; i < NSIZES; i++) {
        void *p = malloc(sizes[i]);
        char line[160];
        snprintf(line, sizeof line, "hakmem: free(): double free %p (block of %zu bytes, %s tier)",
                 p, block_of(p, sizes[i]), tier_of(sizes[i]));
        expect_death(do_double_free, p, line);
        free(p);
    }
}

/* A pointer that starts no block says which tier's memory it is in (and
 * the size of the blocks there, where the tier knows it). */
static void test_invalid_pointer_says_where(void **state) {
    (void)state;
    for (size_t i = 0; i < NSIZES; i++) {
        char *p = malloc(sizes[i]);
        char line[160];
        size_t n = sizes[i];
        if (n <= 8 * KiB || (n > 52 * KiB && n <= MiB))
            snprintf(line, sizeof line,
                     "hakmem: free(): invalid pointer %p (in the %s tier, blocks of %zu bytes)",
                     (void *)(p + 8), tier_of(n), malloc_usable_size(p));
        else
            snprintf(line, sizeof line, "hakmem: free(): invalid pointer %p (in the %s tier)",
                     (void *)(p + 8), tier_of(n));
        expect_death(do_free, p + 8, line);
        free(p);
    }
    static char global[64];
    char line[160];
    snprintf(line, sizeof line, "hakmem: free(): invalid pointer %p (not hakmem's memory)",
             (void *)global);
    expect_death(do_free, global, line);
}

/* ---- underflows ------------------------------------------------------------
 * Caught without a checked mode where a header sits below the block: a Large
 * block's canary (any write within 8 bytes below it, before the header), a
 * Pool block's address tag (right below it). */

struct underflow {
    char *p;
    size_t n;
};

static void underflow_then_free(void *arg) {
    struct underflow *u = arg;
    memset(u->p - u->n, 0x41, u->n);
    free(u->p);
}

static void test_large_underflow_reported(void **state) {
    (void)state;
    const size_t aligns[] = {0, 4096, 2 * MiB};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++)
        /* (From 48 bytes on, the header's own fields are overwritten: the
         * block is then reported as an invalid pointer.) */
        for (size_t n = 1; n <= 40; n += n < 8 ? 1 : 8) {
            size_t size = 3 * MiB + 8;
            char *p = aligns[a] ? aligned_alloc(aligns[a], size) : malloc(size);
            struct underflow u = {p, n};
            char line[160];
            snprintf(line, sizeof line,
                     "hakmem: free(): heap underflow %p (byte -%zu written, block of %zu bytes, "
                     "large tier)",
                     (void *)p, n < 8 ? n : 8, size);
            expect_death(underflow_then_free, &u, line);
            free(p);
        }
}

/* An underflow that writes text (or any byte below 0x80) over the canary is
 * reported with its exact farthest byte, whatever the secret: no canary
 * byte can be such a byte. (Found flaky: the test above wrote 'A', and a
 * secret with an 'A' byte made the report one byte short.) Each step writes
 * one byte, n below the block: the 7-bit byte nearest the canary's own. */
struct underflow_with {
    char *p;
    size_t n;
    unsigned char v;
};

static void underflow_with_then_free(void *arg) {
    struct underflow_with *u = arg;
    u->p[-(ptrdiff_t)u->n] = (char)u->v;
    free(u->p);
}

static void test_large_underflow_of_text_exact(void **state) {
    (void)state;
    char *p = malloc(3 * MiB + 8);
    for (size_t n = 1; n <= 8; n++) {
        struct underflow_with u = {p, n, (unsigned char)(p[-(ptrdiff_t)n] & 0x7f)};
        char line[160];
        snprintf(line, sizeof line,
                 "hakmem: free(): heap underflow %p (byte -%zu written, block of %zu bytes, "
                 "large tier)",
                 (void *)p, n, 3 * MiB + 8);
        expect_death(underflow_with_then_free, &u, line);
    }
    free(p);
}

static void test_pool_underflow_rejected(void **state) {
    (void)state;
    /* Whatever the address: each byte of the tag below the block, alone,
     * written with the 7-bit byte nearest it (a tag byte that 'A' matched
     * let the loop below miss a 1-byte underflow, by the block's address). */
    for (size_t n = 1; n <= 4; n++) {
        char *p = malloc(20000);
        struct underflow_with u = {p, n, (unsigned char)(p[-(ptrdiff_t)n] & 0x7f)};
        char line[160];
        snprintf(line, sizeof line, "hakmem: free(): invalid pointer %p (in the pool tier)",
                 (void *)p);
        expect_death(underflow_with_then_free, &u, line);
        free(p);
    }
    for (size_t n = 1; n <= 32; n *= 2) {
        char *p = malloc(20000);
        struct underflow u = {p, n};
        char line[160];
        snprintf(line, sizeof line, "hakmem: free(): invalid pointer %p (in the pool tier)",
                 (void *)p);
        expect_death(underflow_then_free, &u, line);
        free(p);
    }
}

/* The header of the next Pool block starts with its tag too: a write of one
 * byte past a block's end makes the next block's free fail. */
static void overflow_then_free_next(void *arg) {
    char **ab = arg;
    ab[0][malloc_usable_size(ab[0])] = 0x41;
    free(ab[1]);
}

static void test_pool_overflow_into_next_rejected(void **state) {
    (void)state;
    char *ab[2] = {malloc(20000), malloc(20000)};
    size_t usable = malloc_usable_size(ab[0]);
    assert_ptr_equal(ab[1], ab[0] + usable + 16); /* carved one after the other */
    char line[160];
    snprintf(line, sizeof line, "hakmem: free(): invalid pointer %p (in the pool tier)",
             (void *)ab[1]);
    expect_death(overflow_then_free_next, ab, line);
    free(ab[0]);
    free(ab[1]);
}

/* ---- free_sized ----------------------------------------------------------- */

struct sized {
    void *p;
    size_t n, align;
};

static void free_sized_child(void *arg) {
    struct sized *s = arg;
    size_t volatile n = s->n;
    if (s->align)
        free_aligned_sized(s->p, s->align, n);
    else
        free_sized(s->p, n);
}

static void expect_mismatch(const char *fn, void *p, size_t given, size_t block, const char *tier,
                            size_t align) {
    struct sized s = {p, given, align};
    char line[192];
    snprintf(line, sizeof line,
             "hakmem: %s(): size mismatch %p (size %zu given, block of %zu bytes, %s tier)", fn, p,
             given, block, tier);
    expect_death(free_sized_child, &s, line);
}

static void test_free_sized_wrong_size_aborts(void **state) {
    (void)state;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i];
        void *p = malloc(n);
        size_t block = block_of(p, n);
        expect_mismatch("free_sized", p, block + 1, block, tier_of(n), 0); /* more than it has */
        expect_mismatch("free_sized", p, n / 32, block, tier_of(n), 0);    /* far less */
        free_sized(p, n);
    }
}

static void test_free_aligned_sized_wrong_size_aborts(void **state) {
    (void)state;
    for (size_t i = 0; i < NSIZES; i++) {
        size_t n = sizes[i];
        void *p = aligned_alloc(64, n);
        size_t block = block_of(p, n);
        /* (Aligned blocks of the Pool's sizes come from the L2.5 tier's
         * first class: a size must be of another class to tell, and the
         * block is an L2.5 block.) */
        const char *tier = strcmp(tier_of(n), "pool") == 0 ? "L2.5" : tier_of(n);
        expect_mismatch("free_aligned_sized", p, n * 4 + 64, block, tier, 64);
        free_aligned_sized(p, 64, n);
    }
}

/* Start sizes and end sizes of the realloc chains below: every tier, both
 * edges of each, and sizes between classes. */
static const size_t starts[] = {1, 16, 100, 1024, 3000, 8192, 9000, 53248, 60000, 400000, 2 * MiB};
static size_t ends[400];
static size_t nends;

static void fill_ends(void) {
    nends = 0;
    for (size_t n = 1; n <= 4 * MiB && nends + 3 <= sizeof ends / sizeof ends[0]; n += n / 7 + 1) {
        ends[nends++] = n;
        ends[nends++] = n + 1;
        ends[nends++] = n * 3 / 2;
    }
}

/* malloc(a), realloc to b (shrinking or growing, in place or moved), then
 * free_sized(b): all must run cleanly. */
static void realloc_chains(void *unused) {
    (void)unused;
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++)
        for (size_t j = 0; j < nends; j++) {
            char *p = malloc(starts[i]);
            p[0] = 1;
            char *q = realloc(p, ends[j]);
            if (q == NULL) _exit(3);
            q[ends[j] - 1] = 2;
            free_sized(q, ends[j]);
        }
    /* A buffer grown step by step, freed at its last size (past 4 KiB a
     * growing block becomes a Large block with room to grow; the L2.5
     * tier's half-as-much-again growth is for when such blocks run out). */
    for (size_t stop = 60000; stop <= 3 * MiB; stop += stop / 3) {
        char *p = NULL;
        size_t n = 0;
        while (n < stop) {
            n += n / 16 + 100;
            p = realloc(p, n);
            if (p == NULL) _exit(4);
        }
        free_sized(p, n);
    }
}

static void test_free_sized_after_realloc_runs_cleanly(void **state) {
    (void)state;
    fill_ends();
    expect_clean_exit(realloc_chains, NULL);
}

static void aligned_sizes(void *unused) {
    (void)unused;
    for (size_t align = 8; align <= 2 * MiB; align *= 2)
        for (size_t j = 0; j < nends; j += 5) {
            size_t n = (ends[j] + align - 1) / align * align; /* aligned_alloc's rule */
            void *p = aligned_alloc(align, n);
            if (p == NULL) _exit(3);
            free_aligned_sized(p, align, n);
            p = calloc(1, ends[j]);
            free_sized(p, ends[j]);
        }
}

static void test_free_aligned_sized_runs_cleanly(void **state) {
    (void)state;
    fill_ends();
    expect_clean_exit(aligned_sizes, NULL);
}

/* ---- HAKMEM_BACKTRACE ----------------------------------------------------- */

/* Re-run this binary with the setting in its environment (it is read at
 * start-up): the report is followed by a backtrace naming the caller. */
static const char *self;

__attribute__((noinline)) void reports_frees_twice(void) {
    void *volatile p = malloc(40);
    free(p);
    free(p);
}

static void exec_double_free(void *env) {
    setenv("HAKMEM_BACKTRACE", env, 1);
    execl(self, self, "--double-free", (char *)NULL);
    _exit(9);
}

static void test_backtrace_follows_the_report(void **state) {
    (void)state;
    struct death d;
    run_child(exec_double_free, "1", &d);
    assert_aborted(&d);
    /* Frames print as "binary(+offset)[address]"; the binary is this one,
     * run again: reports_frees_twice is at the same offset from its base. */
    Dl_info info;
    assert_true(dladdr((void *)reports_frees_twice, &info) != 0);
    uintptr_t f = (uintptr_t)reports_frees_twice - (uintptr_t)info.dli_fbase;
    bool found = false;
    const char *bt = strstr(d.err, "hakmem: backtrace:\n");
    for (const char *s = bt; s && (s = strstr(s, "(+0x")) != NULL; s++) {
        uintptr_t a = (uintptr_t)strtoull(s + 2, NULL, 16);
        found |= a > f && a < f + 256;
    }
    if (!strstr(d.err, "hakmem: free(): double free") || !bt || !found)
        fail_msg("expected the report, then a backtrace through reports_frees_twice (%p):\n%s",
                 (void *)reports_frees_twice, d.err);
    run_child(exec_double_free, "0", &d);
    assert_aborted(&d);
    if (strstr(d.err, "backtrace")) fail_msg("a backtrace without HAKMEM_BACKTRACE:\n%s", d.err);
}

int main(int argc, char **argv) {
    self = argv[0];
    if (argc > 1 && strcmp(argv[1], "--double-free") == 0) reports_frees_twice();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_double_free_names_block_and_tier),
        cmocka_unit_test(test_invalid_pointer_says_where),
        cmocka_unit_test(test_large_underflow_reported),
        cmocka_unit_test(test_large_underflow_of_text_exact),
        cmocka_unit_test(test_pool_underflow_rejected),
        cmocka_unit_test(test_pool_overflow_into_next_rejected),
        cmocka_unit_test(test_free_sized_wrong_size_aborts),
        cmocka_unit_test(test_free_aligned_sized_wrong_size_aborts),
        cmocka_unit_test(test_free_sized_after_realloc_runs_cleanly),
        cmocka_unit_test(test_free_aligned_sized_runs_cleanly),
        cmocka_unit_test(test_backtrace_follows_the_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
