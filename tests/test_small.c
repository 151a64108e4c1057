/* Small tier: the per-thread cache stays within its cap, spills and refills
 * in batches, goes back to the shared lists at thread exit and on trim, and
 * blocks freed by another thread are reused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "small.h"
#include "pool.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static uint64_t flushes(void) {
    struct small_stats s;
    small_get_stats(&s);
    return s.flushes;
}

static void test_block_boundaries(void **state) {
    (void)state;
    for (size_t n = POOL_MAX + 1; n <= HAK_SMALL_MAX; n = n * 3 + 1) {
        uint8_t *p = malloc(n);
        uint32_t cls = small_class_of(n);
        assert_int_equal(rmap_payload(rmap_get(p)), cls);
        assert_true(small_is_block(p, cls));
        assert_false(small_is_block(p + 8, cls));
        if (small_class_size[cls] > 16) {
            assert_false(small_is_block(p + 16, cls));
            assert_false(small_is_block(p + small_class_size[cls] - 16, cls));
        }
        assert_true(small_is_block(p + small_class_size[cls], cls)); /* the next block */
        free(p);
    }
}

static void test_cache_capped_and_spills(void **state) {
    (void)state;
    enum { N = 200 };
    void *blocks[N];
    uint32_t cls = small_class_of(100000);
    for (int i = 0; i < N; i++)
        blocks[i] = malloc(100000);
    uint64_t before = flushes();
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    assert_true(tc_count(cls) <= small_class_cap[cls]);
    /* 200 frees through a small cache spill in batches of half its size. */
    assert_true(flushes() >= before + (N - small_class_cap[cls]) / (small_class_cap[cls] / 2));
}

static void *alloc_free_and_exit(void *arg) {
    size_t n = (size_t)(uintptr_t)arg;
    void *b[50];
    for (int i = 0; i < 50; i++)
        b[i] = malloc(n);
    for (int i = 0; i < 50; i++)
        free(b[i]);
    return NULL;
}

static void test_thread_exit_returns_cache(void **state) {
    (void)state;
    uint64_t before = flushes();
    pthread_t t;
    pthread_create(&t, NULL, alloc_free_and_exit, (void *)(uintptr_t)70000);
    pthread_join(t, NULL);
    /* The exiting thread held 50 cached blocks; its exit hook gave them back. */
    assert_true(flushes() > before);
}

static void *free_only(void *arg) {
    void **b = arg;
    for (int i = 0; i < 50; i++)
        free(b[i]);
    return NULL;
}

static void test_free_only_thread_returns_cache_at_exit(void **state) {
    (void)state;
    /* A consumer thread that never calls malloc must still give back what
     * it cached when it exits. */
    void *b[50];
    for (int i = 0; i < 50; i++)
        b[i] = malloc(70000);
    uint64_t before = flushes();
    pthread_t t;
    pthread_create(&t, NULL, free_only, b);
    pthread_join(t, NULL);
    assert_true(flushes() > before);
}

static void *free_all(void *arg) {
    void **b = arg;
    for (int i = 0; i < 500; i++) {
        assert_int_equal(((uint8_t *)b[i])[0], (uint8_t)i);
        free(b[i]);
    }
    return NULL;
}

static void test_cross_thread_free_and_reuse(void **state) {
    (void)state;
    void *b[500];
    for (int i = 0; i < 500; i++) {
        b[i] = malloc(60000);
        memset(b[i], i, 60000);
    }
    pthread_t t;
    pthread_create(&t, NULL, free_all, b);
    pthread_join(t, NULL);
    /* Freed elsewhere, those blocks are in the shared list: allocating
     * again must hand at least some of them back out. */
    int reused = 0;
    void *c[500];
    for (int i = 0; i < 500; i++) {
        c[i] = malloc(60000);
        for (int j = 0; j < 500 && !reused; j++)
            reused = c[i] == b[j];
    }
    for (int i = 0; i < 500; i++)
        free(c[i]);
    assert_true(reused);
}

static void test_trim_empties_this_threads_cache(void **state) {
    (void)state;
    void *p = malloc(100000), *q = malloc(100);
    free(p);
    free(q);
    assert_true(tc_count(small_class_of(100000)) > 0);
    assert_true(tc_count(small_class_of(100)) > 0);
    malloc_trim(0);
    for (int c = 0; c < SMALL_NCLASSES; c++)
        assert_int_equal(tc_count(c), 0);
}

static void test_block_past_region_end_rejected(void **state) {
    (void)state;
    /* In the 640 KiB class a region holds 3 whole blocks; the 4th "block
     * start" would run past the region's end. */
    uint8_t *p = malloc(600000);
    uint32_t cls = small_class_of(600000);
    assert_int_equal(small_class_size[cls], 655360);
    uint8_t *base = (uint8_t *)rmap_region_base(p);
    assert_true(small_is_block(base + 2 * 655360, cls));
    assert_false(small_is_block(base + 3 * 655360, cls));
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_boundaries),
        cmocka_unit_test(test_block_past_region_end_rejected),
        cmocka_unit_test(test_cache_capped_and_spills),
        cmocka_unit_test(test_thread_exit_returns_cache),
        cmocka_unit_test(test_free_only_thread_returns_cache_at_exit),
        cmocka_unit_test(test_cross_thread_free_and_reuse),
        cmocka_unit_test(test_trim_empties_this_threads_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
