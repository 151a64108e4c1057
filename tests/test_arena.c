/* Arena: one reservation; SuperSlabs in its lower half, Pool chunks, L2.5
 * bundles and heap records carved from its upper half in 2 MiB units without
 * an mmap each, given back read-only and reused lowest first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/arena.h"
#include "box/os.h"
#include "box/rmap.h"
#include "maps.h"
#include "superslab/ss.h"

#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

static void test_halves_of_one_reservation(void **state) {
    (void)state;
    free(malloc(16)); /* the SuperSlab range exists */
    uintptr_t base;
    size_t span;
    assert_true(arena_ss_range(&base, &span));
    assert_int_equal(base, ss_range_base);
    assert_int_equal(span, ss_range_span);
    struct arena_stats s;
    arena_get_stats(&s);
    assert_int_equal(s.reserved, 2 * span);
    /* The upper half is aligned to its size: one region-map leaf. */
    uint8_t *p = arena_alloc(2 * MiB);
    assert_true((uintptr_t)p >= base + span && (uintptr_t)p < base + 2 * span);
    assert_int_equal((base + span) % span, 0);
    arena_free(p, 2 * MiB);
}

static void test_alloc_commits_free_gives_back(void **state) {
    (void)state;
    uint64_t mm = os_calls(OS_MMAP);
    uint8_t *p = arena_alloc(4 * MiB);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % (2 * MiB), 0);
    assert_true(maps_writable(p) && maps_writable(p + 4 * MiB - 1));
    for (size_t k = 0; k < 4 * MiB; k += 4096)
        assert_int_equal(p[k], 0);
    memset(p, 0x3c, 4 * MiB);
    assert_int_equal(os_calls(OS_MMAP), mm); /* no mapping of its own */
    arena_free(p, 4 * MiB);
    assert_true(maps_given_back(p, 4 * MiB));
    /* The place is reused (or a lower one), and reads as zero again. */
    uint8_t *q = arena_alloc(4 * MiB);
    assert_true(q <= p);
    assert_int_equal(p[12345], 0);
    assert_int_equal(q[12345], 0);
    arena_free(q, 4 * MiB);
}

static void test_runs_of_free_units(void **state) {
    (void)state;
    uint8_t *a = arena_alloc(2 * MiB), *b = arena_alloc(2 * MiB), *c = arena_alloc(2 * MiB);
    assert_ptr_equal(b, a + 2 * MiB);
    assert_ptr_equal(c, b + 2 * MiB);
    arena_free(a, 2 * MiB);
    arena_free(c, 2 * MiB);
    /* a and c are free but not adjacent: a 4 MiB request goes elsewhere, a
     * 1 MiB one takes the lowest free unit. */
    uint8_t *d = arena_alloc(4 * MiB);
    assert_true(d != a && d != c);
    uint8_t *e = arena_alloc(1 * MiB);
    assert_ptr_equal(e, a);
    arena_free(b, 2 * MiB);
    uint8_t *f = arena_alloc(4 * MiB); /* b and c together now */
    assert_ptr_equal(f, b);
    arena_free(d, 4 * MiB);
    arena_free(e, 1 * MiB);
    arena_free(f, 4 * MiB);
}

static void test_tiers_map_nothing(void **state) {
    (void)state;
    /* Pool chunks, L2.5 bundles and SuperSlabs: not one mmap between them. */
    free(malloc(100));
    free(malloc(20000));
    free(malloc(300000));
    uint64_t mm = os_calls(OS_MMAP);
    void *p[64];
    for (int i = 0; i < 64; i++)
        p[i] = malloc(i % 2 ? 40000 : 500000);
    for (int i = 0; i < 64; i++)
        free(p[i]);
    assert_int_equal(os_calls(OS_MMAP), mm);
    struct arena_stats s;
    arena_get_stats(&s);
    assert_int_equal(s.fallbacks, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_halves_of_one_reservation),
        cmocka_unit_test(test_alloc_commits_free_gives_back),
        cmocka_unit_test(test_runs_of_free_units),
        cmocka_unit_test(test_tiers_map_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
