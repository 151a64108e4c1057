/* OS boundary: aligned mappings, in-place resize, page moves, decommit, and
 * the per-kind call counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/os.h"
#include "sizes.h"

#include <string.h>

static void test_map_aligned_honours_alignment(void **state) {
    (void)state;
    size_t aligns[] = {HAK_PAGE_SIZE, 64 << 10, HAK_REGION_SIZE, 4 << 20, 64 << 20};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        uint64_t before = os_calls(OS_MMAP);
        size_t size = 3 * HAK_PAGE_SIZE;
        uint8_t *p = os_map_aligned(size, aligns[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % aligns[i], 0);
        assert_true(os_calls(OS_MMAP) > before);
        for (size_t k = 0; k < size; k++)
            assert_int_equal(p[k], 0);
        memset(p, 0x5a, size);
        os_unmap(p, size);
    }
}

static void test_counts_every_kind(void **state) {
    (void)state;
    uint64_t mm = os_calls(OS_MMAP), mu = os_calls(OS_MUNMAP), ma = os_calls(OS_MADVISE),
             mr = os_calls(OS_MREMAP);
    uint8_t *p = os_map_aligned(HAK_PAGE_SIZE, HAK_PAGE_SIZE);
    assert_non_null(p);
    os_decommit(p, HAK_PAGE_SIZE);
    assert_true(os_resize(p, HAK_PAGE_SIZE, HAK_PAGE_SIZE)); /* same size: a no-op remap */
    os_unmap(p, HAK_PAGE_SIZE);
    assert_int_equal(os_calls(OS_MMAP), mm + 1);
    assert_int_equal(os_calls(OS_MADVISE), ma + 1);
    assert_int_equal(os_calls(OS_MREMAP), mr + 1);
    assert_int_equal(os_calls(OS_MUNMAP), mu + 1);
}

static void test_decommit_reads_zero(void **state) {
    (void)state;
    size_t size = 16 * HAK_PAGE_SIZE;
    uint8_t *p = os_map_aligned(size, HAK_REGION_SIZE);
    assert_non_null(p);
    memset(p, 0xab, size);
    os_decommit(p, size);
    for (size_t k = 0; k < size; k += 511)
        assert_int_equal(p[k], 0);
    os_unmap(p, size);
}

static void test_resize_in_place_keeps_contents(void **state) {
    (void)state;
    /* A 2 MiB-aligned mapping from the hint area normally has room after it. */
    size_t small = 4 * HAK_PAGE_SIZE, big = 64 * HAK_PAGE_SIZE;
    uint8_t *p = os_map_aligned(small, HAK_REGION_SIZE);
    assert_non_null(p);
    for (size_t k = 0; k < small; k++)
        p[k] = (uint8_t)(k * 7);
    if (os_resize(p, small, big)) {
        for (size_t k = 0; k < small; k++)
            assert_int_equal(p[k], (uint8_t)(k * 7));
        p[big - 1] = 1; /* the grown part is usable */
        assert_true(os_resize(p, big, small));
    }
    os_unmap(p, small);
}

static void test_move_keeps_contents(void **state) {
    (void)state;
    size_t old = 8 * HAK_PAGE_SIZE, new = 32 * HAK_PAGE_SIZE;
    uint8_t *p = os_map_aligned(old, HAK_REGION_SIZE);
    uint8_t *dst = os_map_aligned(new, HAK_REGION_SIZE);
    assert_non_null(p);
    assert_non_null(dst);
    for (size_t k = 0; k < old; k++)
        p[k] = (uint8_t)(k * 13);
    assert_true(os_move(p, old, new, dst));
    for (size_t k = 0; k < old; k++)
        assert_int_equal(dst[k], (uint8_t)(k * 13));
    dst[new - 1] = 1;
    os_unmap(dst, new);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_aligned_honours_alignment),
        cmocka_unit_test(test_counts_every_kind),
        cmocka_unit_test(test_decommit_reads_zero),
        cmocka_unit_test(test_resize_in_place_keeps_contents),
        cmocka_unit_test(test_move_keeps_contents),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
