/* Size classes: every size maps to the smallest class that holds it, waste
 * stays within 25% above 64 B, and the reciprocal division is exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "sizeclass.h"

static void test_sizes_sorted_and_aligned(void **state) {
    (void)state;
    assert_int_equal(small_class_size[0], 16);
    assert_int_equal(small_class_size[SMALL_NCLASSES - 1], HAK_SMALL_MAX);
    for (int c = 0; c < SMALL_NCLASSES; c++) {
        assert_int_equal(small_class_size[c] % 16, 0);
        if (c) assert_true(small_class_size[c] > small_class_size[c - 1]);
    }
}

/* sizes.h's byte edges are where its class runs end: a size's tier by
 * bytes (the front's dispatch) and by class (the thread cache's) agree. */
static void test_tier_edges_agree(void **state) {
    (void)state;
    assert_int_equal(small_class_size[TINY_NCLASSES - 1], TINY_MAX);
    assert_int_equal(small_class_size[POOL_END - 1], POOL_MAX);
    assert_int_equal(POOL_FIRST, TINY_NCLASSES);
    assert_int_equal(L25_FIRST, POOL_END);
    assert_int_equal(small_class_of(TINY_MAX), TINY_NCLASSES - 1);
    assert_int_equal(small_class_of(TINY_MAX + 1), POOL_FIRST);
    assert_int_equal(small_class_of(POOL_MAX), POOL_END - 1);
    assert_int_equal(small_class_of(POOL_MAX + 1), L25_FIRST);
    assert_int_equal(small_class_of(HAK_SMALL_MAX), SMALL_NCLASSES - 1);
}

static void test_class_of_is_smallest_fit(void **state) {
    (void)state;
    for (size_t n = 0; n <= HAK_SMALL_MAX; n++) {
        uint32_t c = small_class_of(n);
        assert_true(c < SMALL_NCLASSES);
        assert_true(small_class_size[c] >= n);
        if (c) assert_true(small_class_size[c - 1] < n);
    }
}

static void test_waste_at_most_25_percent_above_64(void **state) {
    (void)state;
    for (int c = 1; c < SMALL_NCLASSES; c++) {
        size_t smallest = small_class_size[c - 1] + 1; /* worst case for class c */
        if (smallest <= 64) continue;
        assert_true((small_class_size[c] - smallest) * 4 <= smallest);
    }
}

static void test_reciprocal_division_exact(void **state) {
    (void)state;
    for (uint32_t c = 0; c < SMALL_NCLASSES; c++) {
        size_t size = small_class_size[c];
        for (size_t k = 0; k * size < HAK_REGION_SIZE; k++) {
            size_t at = k * size;
            assert_int_equal(small_class_div(c, at), k);
            if (at + 1 < HAK_REGION_SIZE) assert_int_equal(small_class_div(c, at + 1), k);
            if (at + size - 1 < HAK_REGION_SIZE)
                assert_int_equal(small_class_div(c, at + size - 1), k);
        }
    }
}

static void test_cache_caps_in_range(void **state) {
    (void)state;
    for (int c = 0; c < SMALL_NCLASSES; c++) {
        assert_in_range(small_class_cap[c], 2, 128);
        /* The L2.5 tier's classes: 8 blocks each. */
        if (c >= (int)L25_FIRST) {
            assert_int_equal(small_class_cap[c], 8);
            continue;
        }
        /* Otherwise a thread never caches more than ~64 KiB of one class
         * beyond 2 blocks. */
        if (small_class_cap[c] > 2)
            assert_true((size_t)small_class_cap[c] * small_class_size[c] <= 65536);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_sorted_and_aligned),
        cmocka_unit_test(test_tier_edges_agree),
        cmocka_unit_test(test_class_of_is_smallest_fit),
        cmocka_unit_test(test_waste_at_most_25_percent_above_64),
        cmocka_unit_test(test_reciprocal_division_exact),
        cmocka_unit_test(test_cache_caps_in_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
