/* Region map: entries for marked spans, nothing elsewhere, leaf creation
 * under concurrency, and the kinds real allocations get. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/rmap.h"
#include "superslab/ss.h"

#include <pthread.h>
#include <stdlib.h>

/* Addresses far above anything the process maps: the map is only a table,
 * so marking them needs no real mapping. */
#define FAR ((uintptr_t)100 << 40)

static void test_unowned_addresses_read_none(void **state) {
    (void)state;
    int local;
    assert_int_equal(rmap_get(NULL), TIER_NONE);
    assert_int_equal(rmap_get(&local), TIER_NONE);
    assert_int_equal(rmap_get((void *)(uintptr_t)0xffff800000001000ull), TIER_NONE);
    assert_int_equal(rmap_get((void *)((uintptr_t)1 << 47)), TIER_NONE);
    assert_int_equal(rmap_get((void *)(FAR + 12345)), TIER_NONE);
}

static void test_span_payload_is_distance_back(void **state) {
    (void)state;
    uint8_t *base = (uint8_t *)(FAR + 64 * HAK_REGION_SIZE);
    size_t size = 5 * HAK_REGION_SIZE + 100; /* six regions, the last partly */
    assert_true(rmap_mark_span(base, size, TIER_LARGE));
    for (uint32_t i = 0; i < 6; i++) {
        uint32_t e = rmap_get(base + i * HAK_REGION_SIZE + 777);
        assert_int_equal(rmap_kind_of(e), TIER_LARGE);
        assert_int_equal(rmap_payload(e), i);
    }
    assert_int_equal(rmap_get(base + 6 * HAK_REGION_SIZE), TIER_NONE);
    assert_int_equal(rmap_get(base - 1), TIER_NONE);
    rmap_clear_span(base, size);
    for (uint32_t i = 0; i < 6; i++)
        assert_int_equal(rmap_get(base + i * HAK_REGION_SIZE), TIER_NONE);
}

static void test_span_across_leaf_boundary(void **state) {
    (void)state;
    /* A leaf covers 2^16 regions; straddle the boundary after FAR's leaf. */
    uintptr_t leaf_span = (uintptr_t)RMAP_LEAF_N << HAK_REGION_SHIFT;
    uint8_t *base = (uint8_t *)(FAR + leaf_span - 2 * HAK_REGION_SIZE);
    assert_true(rmap_mark_span(base, 4 * HAK_REGION_SIZE, TIER_LARGE));
    assert_int_equal(rmap_payload(rmap_get(base + 3 * HAK_REGION_SIZE)), 3);
    assert_int_equal(rmap_kind_of(rmap_get(base + 2 * HAK_REGION_SIZE)), TIER_LARGE);
    rmap_clear_span(base, 4 * HAK_REGION_SIZE);
    assert_int_equal(rmap_get(base + 3 * HAK_REGION_SIZE), TIER_NONE);
}

static void test_set_region_and_refusals(void **state) {
    (void)state;
    uint8_t *r = (uint8_t *)(FAR + 200 * HAK_REGION_SIZE);
    assert_true(rmap_set_region(r, TIER_L25, 37));
    assert_int_equal(rmap_kind_of(rmap_get(r + HAK_REGION_SIZE - 1)), TIER_L25);
    assert_int_equal(rmap_payload(rmap_get(r)), 37);
    rmap_clear_span(r, 1);
    assert_int_equal(rmap_get(r), TIER_NONE);
    /* Beyond the 47-bit user address space nothing can be marked. */
    assert_false(rmap_set_region((void *)((uintptr_t)1 << 47), TIER_L25, 1));
    assert_false(rmap_mark_span((void *)(((uintptr_t)1 << 47) - HAK_REGION_SIZE),
                                2 * HAK_REGION_SIZE, TIER_LARGE));
}

/* Many threads create entries in one fresh leaf at once: the leaf must be
 * installed exactly once and no entry lost. */
#define RACERS 8
static uint8_t *race_base;
static void *racer(void *arg) {
    uintptr_t i = (uintptr_t)arg;
    for (uintptr_t k = 0; k < 64; k++)
        rmap_set_region(race_base + (k * RACERS + i) * HAK_REGION_SIZE, TIER_L25,
                        (uint32_t)(k * RACERS + i));
    return NULL;
}

static void test_concurrent_leaf_creation(void **state) {
    (void)state;
    race_base = (uint8_t *)(FAR + ((uintptr_t)5 * RMAP_LEAF_N << HAK_REGION_SHIFT));
    pthread_t t[RACERS];
    for (uintptr_t i = 0; i < RACERS; i++)
        pthread_create(&t[i], NULL, racer, (void *)i);
    for (int i = 0; i < RACERS; i++)
        pthread_join(t[i], NULL);
    for (uint32_t j = 0; j < 64 * RACERS; j++) {
        uint32_t e = rmap_get(race_base + (size_t)j * HAK_REGION_SIZE);
        assert_int_equal(rmap_kind_of(e), TIER_L25);
        assert_int_equal(rmap_payload(e), j);
    }
    rmap_clear_span(race_base, 64 * RACERS * HAK_REGION_SIZE);
}

static void test_real_blocks_have_their_tier(void **state) {
    (void)state;
    void *tiny = malloc(100), *small = malloc(100000), *large = malloc(3 << 20);
    /* Tiny blocks live in the SuperSlab range, outside the region map. */
    assert_true(ss_contains(tiny));
    assert_int_equal(rmap_get(tiny), TIER_NONE);
    assert_false(ss_contains(small) || ss_contains(large));
    assert_int_equal(rmap_kind_of(rmap_get(small)), TIER_L25);
    assert_int_equal(rmap_kind_of(rmap_get(large)), TIER_LARGE);
    free(tiny);
    free(small);
    free(large);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unowned_addresses_read_none),
        cmocka_unit_test(test_span_payload_is_distance_back),
        cmocka_unit_test(test_span_across_leaf_boundary),
        cmocka_unit_test(test_set_region_and_refusals),
        cmocka_unit_test(test_concurrent_leaf_creation),
        cmocka_unit_test(test_real_blocks_have_their_tier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
