/* Free memory goes back to the OS: at malloc_trim, and without it once it
 * has been unused for HAKMEM_AGE_MS (here 50 ms), on the program's
 * own later calls. A long-running program (redis) that stops using some
 * sizes must not keep their memory: it once kept every empty 64 KiB slot of
 * a SuperSlab one of whose slots was still in use, and the free blocks of
 * L2.5 bundles, until malloc_trim, which redis never calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/config.h"
#include "hakmem.h"
#include "l25/l25.h"
#include "maps.h"
#include "superslab/ss.h"
#include "timing.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KiB    ((size_t)1 << 10)
#define AGE_MS 50

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A program going on with other sizes, one slice of it. */
static void other_work(void) {
    static void *keep[4096];
    for (int i = 0; i < 4096; i++)
        keep[i] = malloc(24 + (i % 7) * 16);
    for (int i = 0; i < 4096; i++)
        free(keep[i]);
    sleep_ms(AGE_MS / 2);
}

/* The first pass may have been timed with the default age (1 s) before
 * main set AGE_MS: up to 3 s of other work (scaled: tests/timing.h), by the
 * clock. Only a lower bound on the time matters (the age must pass): a
 * slow or busy machine takes longer over each slice, which only ages the
 * memory more; the limit is there to end a test that would never see it
 * go. */
#define WORK_UNTIL(cond)                                                                           \
    for (int64_t t0_ = hak_test_now_ms(), l_ = hak_test_limit_ms(3000);                            \
         !(cond) && hak_test_now_ms() - t0_ < l_;)                                                 \
    other_work()

/* Resident pages among the first byte of each block's pages. */
static size_t resident(void **b, size_t n, size_t size) {
    size_t r = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < size; k += 4096)
            r += maps_resident((uint8_t *)b[i] + k);
    return r;
}

/* Slots of two classes alternate in the SuperSlabs; every block of one
 * class is freed while the other keeps each SuperSlab in use. */
enum { ROUNDS = 200, NA = 51, NB = 8 };
static void *a[ROUNDS * NA], *bk[ROUNDS * NB];

static void fill_two_classes(void) {
    for (int r = 0; r < ROUNDS; r++) {
        for (int i = 0; i < NA; i++)
            memset(a[r * NA + i] = malloc(1100), 1, 1100);
        for (int i = 0; i < NB; i++)
            memset(bk[r * NB + i] = malloc(8000), 2, 8000);
    }
}

static void free_all(void **b, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(b[i]);
}

/* Pages of the 1100 B blocks' slots that are still resident, read after
 * the blocks were freed (the addresses stay valid: their slots are not
 * given back, only their pages). */
static size_t slot_pages_resident(void) {
    size_t r = 0;
    for (size_t i = 0; i < ROUNDS * NA; i += NA)
        for (size_t k = 0; k < 64 * KiB; k += 4096)
            r += maps_resident((uint8_t *)ss_slab_base(ss_slab_of(a[i])) + k);
    return r;
}

static void test_trim_gives_back_empty_slots(void **state) {
    (void)state;
    fill_two_classes();
    free_all(a, ROUNDS * NA);
    size_t before = slot_pages_resident();
    malloc_trim(0);
    size_t after = slot_pages_resident();
    print_message("empty slots: %zu pages resident before malloc_trim, %zu after\n", before, after);
    assert_true(before > ROUNDS * 8);
    assert_true(after < before / 10);
    free_all(bk, ROUNDS * NB);
    /* The slots work again: carved anew. */
    fill_two_classes();
    free_all(a, ROUNDS * NA);
    free_all(bk, ROUNDS * NB);
}

/* Without malloc_trim: slots empty for the age go on later calls. */
static void test_empty_slots_age_out(void **state) {
    (void)state;
    malloc_trim(0);
    fill_two_classes();
    free_all(a, ROUNDS * NA);
    size_t before = slot_pages_resident();
    WORK_UNTIL(slot_pages_resident() < before / 10);
    size_t after = slot_pages_resident();
    print_message("empty slots: %zu pages resident, then %zu\n", before, after);
    assert_true(before > ROUNDS * 8);
    assert_true(after < before / 10);
    free_all(bk, ROUNDS * NB);
}

/* Resident pages of the freed (even) blocks. */
static size_t freed_resident(void **b, size_t n, size_t size) {
    size_t r = 0;
    for (size_t i = 0; i < n; i += 2)
        r += resident(&b[i], 1, size);
    return r;
}

/* L2.5: free blocks of bundles that still have blocks out go back once no
 * block came back to the bundle for an age, on later calls. */
static void test_l25_free_blocks_age_out(void **state) {
    (void)state;
    enum { N = 64 };
    static void *b[N];
    const size_t size = 200 * KiB;
    for (int i = 0; i < N; i++)
        memset(b[i] = malloc(size), 3, size);
    for (int i = 0; i < N; i += 2) /* every other one: bundles stay in use */
        free(b[i]);
    size_t before = freed_resident(b, N, size);
    WORK_UNTIL(freed_resident(b, N, size) < before / 4);
    size_t after = freed_resident(b, N, size);
    print_message("freed L2.5 blocks: %zu pages resident, then %zu\n", before, after);
    assert_true(before > N / 2 * 40);
    assert_true(after < before / 4);
    for (int i = 1; i < N; i += 2) { /* the live ones are intact */
        for (size_t k = 0; k < size; k += 4096)
            assert_int_equal(((uint8_t *)b[i])[k], 3);
        free(b[i]);
    }
}

/* Free blocks of L2.5 bundles taken by aligned requests (the shards'
 * bundles, not a thread's heap): every other one of N freed. */
enum { NAL = 64 };
static void *al[NAL];

static void fill_aligned(size_t size) {
    for (int i = 0; i < NAL; i++) {
        assert_int_equal(posix_memalign(&al[i], 4096, size), 0);
        memset(al[i], 4, size);
    }
    for (int i = 0; i < NAL; i += 2)
        free(al[i]);
}

/* HAKMEM_HUGEPAGES=2: new SuperSlabs and L2.5 bundles ask for huge pages,
 * and the free blocks of a unit still in use keep their pages, past the
 * age and at malloc_trim (a page given back would split the huge page, and
 * khugepaged would make it whole again behind the tier's back); a unit goes
 * back whole once empty. The default (1) asks for none of them and ages the
 * pages out. Either way the ageing settles: nothing stays due (a pass due
 * for ever wakes HAKMEM_BACKGROUND's thread every age). */
static void test_huge_heaps_give_back_whole_units(void **state) {
    (void)state;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
        skip(); /* no THP in this kernel: the request is refused, nothing else */
    enum { N = 64 };
    static void *b[N];
    const size_t size = 200 * KiB;
    int64_t aged_ms = 0;
    for (int huge = 0; huge <= 1; huge++) {
        malloc_trim(0);
        hak_cfg.hugepages = huge ? HAK_HUGE_ALL : HAK_HUGE_LARGE;
        fill_two_classes(); /* more SuperSlabs than the cache holds: new ones */
        for (int i = 0; i < N; i++)
            memset(b[i] = malloc(size), 3, size);
        fill_aligned(size);
        const void *last_ss = a[ROUNDS * NA - 1], *last_bundle = b[N - 1];
        assert_true(maps_vmflag(last_ss, "hg") == huge);
        assert_true(maps_vmflag(last_bundle, "hg") == huge);
        free_all(a, ROUNDS * NA);
        for (int i = 0; i < N; i += 2)
            free(b[i]);
        size_t slots = slot_pages_resident(), blocks = freed_resident(b, N, size),
               aligned = freed_resident(al, NAL, size);
        assert_true(slots > ROUNDS * 8 && blocks > N / 2 * 40 && aligned > NAL / 2 * 40);
        /* Other work: by default until the pages went, in huge mode twice
         * as long as that took. */
        int64_t t0 = hak_test_now_ms();
        if (huge) {
            while (hak_test_now_ms() - t0 < 2 * aged_ms)
                other_work();
        } else {
            WORK_UNTIL(slot_pages_resident() < slots / 10 &&
                       freed_resident(b, N, size) < blocks / 4 &&
                       freed_resident(al, NAL, size) < aligned / 4);
            aged_ms = hak_test_now_ms() - t0 + AGE_MS;
        }
        size_t slots_aged = slot_pages_resident(), blocks_aged = freed_resident(b, N, size),
               aligned_aged = freed_resident(al, NAL, size);
        /* Settled: two ages on, nothing of the tiers is due. */
        sleep_ms(2 * AGE_MS);
        (void)ss_age_next(), (void)l25_age_next();
        sleep_ms(2 * AGE_MS);
        assert_int_equal(l25_age_next(), UINT64_MAX);
        assert_int_equal(ss_age_next(), UINT64_MAX);
        malloc_trim(0);
        size_t slots_trim = slot_pages_resident(), blocks_trim = freed_resident(b, N, size);
        print_message("hugepages=%d, %lld ms: free slots %zu -> %zu (aged) -> %zu (trim) pages, "
                      "free L2.5 blocks %zu -> %zu -> %zu, aligned %zu -> %zu\n",
                      huge ? 2 : 1, (long long)(hak_test_now_ms() - t0), slots, slots_aged,
                      slots_trim, blocks, blocks_aged, blocks_trim, aligned, aligned_aged);
        if (huge) {
            assert_true(slots_aged >= slots && blocks_aged >= blocks && aligned_aged >= aligned);
            assert_true(slots_trim >= slots && blocks_trim >= blocks);
        } else {
            assert_true(slots_aged < slots / 10 && blocks_aged < blocks / 4 &&
                        aligned_aged < aligned / 4);
        }
        /* Empty, the units go back whole (but SuperSlabs another class still
         * uses: in huge mode their free slots stay as they are). */
        free_all(bk, ROUNDS * NB);
        for (int i = 1; i < N; i += 2)
            free(b[i]);
        for (int i = 1; i < NAL; i += 2)
            free(al[i]);
        malloc_trim(0);
        assert_true(slot_pages_resident() < slots / 10);
        assert_int_equal(freed_resident(b, N, size) + freed_resident(&b[1], N - 1, size), 0);
        assert_int_equal(freed_resident(al, NAL, size) + freed_resident(&al[1], NAL - 1, size), 0);
    }
    hak_cfg.hugepages = HAK_HUGE_LARGE;
}

int main(void) {
    hak_cfg.age_ms = AGE_MS;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trim_gives_back_empty_slots),
        cmocka_unit_test(test_empty_slots_age_out),
        cmocka_unit_test(test_l25_free_blocks_age_out),
        cmocka_unit_test(test_huge_heaps_give_back_whole_units),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
