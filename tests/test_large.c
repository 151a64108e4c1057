/* Large tier: BigCache reuse without syscalls, its byte bound, realloc by
 * page moves, trim, and the live counters behind mallinfo2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/clock.h"
#include "box/config.h"
#include "box/os.h"
#include "prof/prof.h"
#include "large/large.h"
#include "death.h"
#include "maps.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

/* The start of the mapping of p, a Large block at the tier's own alignment:
 * its header is in the mapping's first region (mappings start on region
 * boundaries), at a colour, the block right after it. */
static uint8_t *map_of(const void *p) {
    return (uint8_t *)(((uintptr_t)p - 64) & ~(uintptr_t)(2 * MiB - 1));
}

/* p's distance from its mapping's start. */
static size_t lead_of(const void *p) {
    return (size_t)((const uint8_t *)p - map_of(p));
}

static uint64_t os_total(void) {
    return os_calls(OS_MMAP) + os_calls(OS_MUNMAP) + os_calls(OS_MADVISE) + os_calls(OS_MREMAP) +
           os_calls(OS_MPROTECT);
}

#ifndef HAK_TEST_TSAN /* its runtime calls getrlimit before it can run instrumented code */
/* Interposed (the library's call binds to this definition): counts the
 * looks at the address-space limit. */
static unsigned getrlimit_calls;
int getrlimit(__rlimit_resource_t res, struct rlimit *rl) {
    getrlimit_calls++;
    return prlimit(0, res, NULL, rl);
}

/* Interposed too: the coarse clock the tier ages by runs clock_ahead_ms
 * ahead (moved forward only: a test that ages an entry without sleeping,
 * whatever the machine's speed). */
static _Atomic int64_t clock_ahead_ms;
int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    int64_t ms = atomic_load(&clock_ahead_ms);
    if (r == 0 && clk == CLOCK_MONOTONIC_COARSE && ms != 0) {
        ts->tv_sec += ms / 1000;
        ts->tv_nsec += (ms % 1000) * 1000000;
        if (ts->tv_nsec >= 1000000000) {
            ts->tv_sec++;
            ts->tv_nsec -= 1000000000;
        }
    }
    return r;
}
#endif

/* The BigCache alone: every free goes there (the threads' own caches in
 * front of it are off; tc_reset turns them on). */
static int reset(void **state) {
    (void)state;
    hak_cfg.large_tcache_bytes = 0;
    hak_cfg.bigcache_bytes = 64 * MiB;
    hak_cfg.age_ms = 60000; /* nothing ages during a test unless it says so */
    hak_cfg.hugepages = HAK_HUGE_OFF;
    malloc_trim(0);
    return 0;
}

static void test_free_malloc_cycle_makes_no_syscall(void **state) {
    (void)state;
    void *p = malloc(3 * MiB);
    assert_non_null(p);
    free(p);
    uint64_t before = os_total();
    for (int i = 0; i < 100; i++) {
        void *q = malloc(3 * MiB);
        assert_ptr_equal(q, p); /* the cached mapping comes back */
        memset(q, i, 3 * MiB);
        free(q);
    }
    assert_int_equal(os_total(), before);
}

static void test_cache_reuse_is_zeroed_for_calloc(void **state) {
    (void)state;
    uint8_t *p = malloc(5 * MiB);
    memset(p, 0xcd, 5 * MiB);
    free(p);
    uint8_t *q = calloc(1, 5 * MiB);
    assert_ptr_equal(q, p);
    for (size_t k = 0; k < 5 * MiB; k += 4093)
        assert_int_equal(q[k], 0);
    free(q);
}

static void test_cache_respects_byte_bound(void **state) {
    (void)state;
    hak_cfg.bigcache_bytes = 8 * MiB;
    void *a = malloc(3 * MiB), *b = malloc(3 * MiB), *c = malloc(3 * MiB);
    free(a);
    free(b);
    uint64_t unmaps = os_calls(OS_MUNMAP);
    free(c); /* 3 x 3 MiB > 8 MiB: the oldest must go */
    assert_int_equal(os_calls(OS_MUNMAP), unmaps + 1);
    struct large_stats s;
    large_get_stats(&s);
    assert_true(s.cached_bytes <= 8 * MiB);
    assert_int_equal(s.cached_blocks, 2);

    hak_cfg.bigcache_bytes = 0; /* caching off: every free unmaps */
    void *d = malloc(2 * MiB);
    unmaps = os_calls(OS_MUNMAP);
    free(d);
    assert_int_equal(os_calls(OS_MUNMAP), unmaps + 1);
}

static void test_realloc_moves_pages_not_bytes(void **state) {
    (void)state;
    size_t n = 8 * MiB;
    uint32_t *p = malloc(n);
    for (size_t k = 0; k < n / 4; k++)
        p[k] = (uint32_t)(k * 2654435761u);
    uint64_t remaps = os_calls(OS_MREMAP);
    for (size_t grow = 16 * MiB; grow <= 256 * MiB; grow *= 2) {
        p = realloc(p, grow);
        assert_non_null(p);
    }
    assert_true(os_calls(OS_MREMAP) > remaps);
    for (size_t k = 0; k < n / 4; k++)
        assert_int_equal(p[k], (uint32_t)(k * 2654435761u));
    struct large_stats s;
    large_get_stats(&s);
    assert_true(s.remaps_inplace + s.remaps_moved >= 1);
    p = realloc(p, 2 * MiB); /* shrink in place */
    for (size_t k = 0; k < 2 * MiB / 4; k++)
        assert_int_equal(p[k], (uint32_t)(k * 2654435761u));
    assert_true(malloc_usable_size(p) >= 2 * MiB);
    free(p);
}

static void test_aligned_large_blocks(void **state) {
    (void)state;
    size_t aligns[] = {4096, MiB, 4 * MiB, 16 * MiB};
    for (size_t i = 0; i < 4; i++) {
        void *p = aligned_alloc(aligns[i], 5 * MiB);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % aligns[i], 0);
        assert_true(malloc_usable_size(p) >= 5 * MiB);
        memset(p, 1, 5 * MiB);
        free(p);
    }
}

static void test_trim_releases_cache_and_mallinfo_counts(void **state) {
    (void)state;
    struct mallinfo2 before = mallinfo2();
    void *p = malloc(4 * MiB);
    struct mallinfo2 live = mallinfo2();
    assert_int_equal(live.hblks, before.hblks + 1);
    assert_true(live.hblkhd >= before.hblkhd + 4 * MiB);
    free(p);
    assert_true(mallinfo2().keepcost >= 4 * MiB);
    uint64_t unmaps = os_calls(OS_MUNMAP);
    assert_int_equal(malloc_trim(0), 1);
    assert_true(os_calls(OS_MUNMAP) > unmaps);
    assert_int_equal(mallinfo2().keepcost, 0);
    assert_int_equal(malloc_trim(0), 0); /* nothing left to give back */
}

static void test_zero_size_big_alignment_owns_its_byte(void **state) {
    (void)state;
    /* A zero-size block at an alignment offset once started one past its
     * mapping, where the next mapping then began: two owners of one byte. */
    size_t aligns[] = {2 * MiB, 4 * MiB};
    for (size_t i = 0; i < 2; i++) {
        char *p = aligned_alloc(aligns[i], 0);
        void *q = NULL;
        assert_int_equal(posix_memalign(&q, aligns[i], 0), 0);
        char *r = malloc(200000);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % aligns[i], 0);
        assert_ptr_not_equal(p, r);
        assert_ptr_not_equal(q, r);
        assert_ptr_not_equal(p, q);
        assert_true(malloc_usable_size(p) >= 1);
        p[0] = 1;
        free(p);
        free(q);
        free(r);
    }
}

static void test_successful_realloc_leaves_errno(void **state) {
    (void)state;
    void *blocker[64];
    char *p = malloc(2 * MiB);
    /* Make an in-place grow likely to fail: map right behind the block. */
    for (int i = 0; i < 64; i++)
        blocker[i] = malloc(3 * MiB);
    errno = 0;
    p = realloc(p, 40 * MiB);
    assert_non_null(p);
    assert_int_equal(errno, 0);
    free(p);
    for (int i = 0; i < 64; i++)
        free(blocker[i]);
}

static struct large_stats lstats(void) {
    struct large_stats s;
    large_get_stats(&s);
    return s;
}

/* The BigCache is sharded by the freeing thread: what one thread freed
 * serves another's malloc (no new mapping); the bound holds for all the
 * shards together (a thread whose own shard is empty pushes out what the
 * others hold, the least recently freed first), also when two threads put
 * at once; and what an exited thread left ages on the other threads'
 * calls. Each test's threads are made one after the other, so each has a
 * shard of its own (homes are handed out in turn, to threads that call the
 * tier). */
static void *free_arg(void *arg) {
    free(arg);
    return NULL;
}

static void *malloc_5(void *arg) {
    (void)arg;
    return malloc(5 * MiB);
}

/* fn(arg) on a thread of its own, to its end: what it returned. */
static void *on_a_thread(void *(*fn)(void *), void *arg) {
    pthread_t t;
    void *ret;
    assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
    assert_int_equal(pthread_join(t, &ret), 0);
    return ret;
}

static void test_bigcache_shards_serve_each_other(void **state) {
    (void)state;
    void *p = malloc(5 * MiB);
    memset(p, 1, 5 * MiB);
    on_a_thread(free_arg, p); /* into that thread's shard */
    uint64_t maps = os_calls(OS_MMAP), hits = lstats().cache_hits;
    void *q = on_a_thread(malloc_5, NULL); /* from the next thread's */
    assert_ptr_equal(q, p);
    assert_int_equal(os_calls(OS_MMAP), maps);
    assert_int_equal(lstats().cache_hits, hits + 1);
    free(q);
}

static bool mapped(const void *p) {
    char perms[5];
    return maps_perms(p, perms);
}

static void test_bigcache_bound_holds_over_all_shards(void **state) {
    (void)state;
    hak_cfg.bigcache_bytes = 16 * MiB;
    void *p[5];
    for (int i = 0; i < 5; i++)
        assert_non_null(p[i] = malloc(5 * MiB));
    /* 15 MiB, in three shards, freed at three readings of the tier's clock
     * (their order across shards is their time of free; the clock is a
     * coarse one, a tick of 1 to 10 ms with the kernel). */
    for (int i = 0; i < 3; i++) {
        for (uint64_t t = hak_now_ms(); hak_now_ms() == t;) {
            struct timespec ms1 = {0, 1000 * 1000};
            nanosleep(&ms1, NULL);
        }
        on_a_thread(free_arg, p[i]);
    }
    size_t three = lstats().cached_bytes; /* (each with its guard page) */
    assert_true(three >= 15 * MiB && three <= 16 * MiB);
    uint64_t unmaps = os_calls(OS_MUNMAP);
    /* Two more frees, by threads whose shards hold nothing to push out:
     * the two freed first go, not the newest. */
    on_a_thread(free_arg, p[3]);
    assert_true(mapped(p[3]));
    on_a_thread(free_arg, p[4]);
    assert_true(lstats().cached_bytes <= 16 * MiB);
    assert_int_equal(lstats().cached_blocks, 3);
    assert_int_equal(os_calls(OS_MUNMAP), unmaps + 2);
    assert_false(mapped(p[0]));
    assert_false(mapped(p[1]));
    for (int i = 2; i < 5; i++)
        assert_true(mapped(p[i]));
}

/* A put past the bound never pushes out what it put, however big next to
 * the other shards' entries: their oldest go. */
static void test_bigcache_put_keeps_its_own(void **state) {
    (void)state;
    hak_cfg.bigcache_bytes = 16 * MiB;
    void *p[3], *big = malloc(8 * MiB);
    for (int i = 0; i < 3; i++)
        assert_non_null(p[i] = malloc(5 * MiB));
    for (int i = 0; i < 3; i++)
        on_a_thread(free_arg, p[i]);
    on_a_thread(free_arg, big);
    assert_true(mapped(big));
    assert_true(lstats().cached_bytes <= 16 * MiB);
    uint64_t maps = os_calls(OS_MMAP);
    void *q = malloc(8 * MiB);
    assert_ptr_equal(q, big);
    assert_int_equal(os_calls(OS_MMAP), maps);
    free(q);
}

/* Two threads free a 10 MiB block each at the same moment, into their own
 * shards, round after round, under a 16 MiB bound: once both frees have
 * returned, at most one of them is cached. */
#define BOUND_ROUNDS 3000
static pthread_barrier_t bound_bar;
static void *bound_racer(void *arg) {
    void **slot = arg;
    for (int r = 0; r < BOUND_ROUNDS; r++) {
        pthread_barrier_wait(&bound_bar);
        free(*slot);
        pthread_barrier_wait(&bound_bar);
    }
    return NULL;
}

static void test_bigcache_bound_holds_for_puts_at_once(void **state) {
    (void)state;
    hak_cfg.bigcache_bytes = 16 * MiB;
    void *slot[2];
    pthread_t t[2];
    pthread_barrier_init(&bound_bar, NULL, 3);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, bound_racer, &slot[i]), 0);
    int over = 0;
    for (int r = 0; r < BOUND_ROUNDS; r++) {
        for (int i = 0; i < 2; i++)
            assert_non_null(slot[i] = malloc(10 * MiB));
        pthread_barrier_wait(&bound_bar);
        pthread_barrier_wait(&bound_bar);
        over += lstats().cached_bytes > 16 * MiB;
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    pthread_barrier_destroy(&bound_bar);
    assert_int_equal(over, 0);
}

/* (Frees a 5 MiB block and sees that it keeps its pages.) */
static void *free_resident(void *arg) {
    free(arg);
    return maps_resident(arg) ? arg : NULL;
}

/* Large calls every 10 ms until p is decommitted, or a hang limit. */
static void *call_until_decommitted(void *p) {
    /* The calls are for blocks a quarter of p's size at most, which do not
     * take it. A hang limit (scaled: tests/timing.h) fifty times the age. */
    int64_t limit = hak_test_limit_ms(1000);
    for (int64_t t0 = hak_test_now_ms(); maps_resident(p) && hak_test_now_ms() - t0 < limit;) {
        struct timespec ms10 = {0, 10 * 1000 * 1000};
        nanosleep(&ms10, NULL);
        free(malloc(MiB + 1));
    }
    return maps_resident(p) ? p : NULL;
}

static void test_bigcache_other_shards_age(void **state) {
    (void)state;
    uint8_t *p = malloc(5 * MiB);
    memset(p, 1, 5 * MiB);
    hak_cfg.age_ms = 20;
    /* A thread that is gone: nobody calls into its shard. */
    assert_ptr_equal(on_a_thread(free_resident, p), p);
    /* The next thread's calls look at every shard's ages. */
    assert_null(on_a_thread(call_until_decommitted, p));
    hak_cfg.age_ms = 60000;
}

static void test_cache_bounds_entries(void **state) {
    (void)state;
    /* 64 entries at most (LARGE_CACHE_N): of 66 freed mappings, the two
     * least recently freed go (the byte bound holds them all). */
    hak_cfg.bigcache_bytes = 128 * MiB;
    void *p[66];
    for (int i = 0; i < 66; i++)
        p[i] = malloc(MiB + 4096);
    uint64_t unmaps = os_calls(OS_MUNMAP);
    for (int i = 0; i < 66; i++)
        free(p[i]);
    assert_int_equal(os_calls(OS_MUNMAP), unmaps + 2);
    assert_int_equal(lstats().cached_blocks, 64);
    /* The ones evicted were the first two freed: their regions are no one's. */
    expect_free_abort(do_free, p[0], "invalid pointer");
    expect_free_abort(do_free, p[1], "invalid pointer");
    /* A block of that size takes one of the others, no syscall. */
    uint64_t before = os_total();
    void *q = malloc(MiB + 4096);
    bool cached = false;
    for (int i = 2; i < 66; i++)
        cached |= q == p[i];
    assert_true(cached);
    assert_int_equal(os_total(), before);
    free(q);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Ageing tests: an entry freed at f and looked at (on any call of the tier)
 * at l is decommitted when l - f is in [age, 2 age), unmapped from 2 age on.
 * The tests sleep to land in that window; a slow or busy machine may
 * overshoot it. So an attempt reads the tier's own clock (hak_now_ms)
 * before the free and after its last call of the tier: when that span
 * passes 2 age, a look may have come too late, and nothing is judged; the
 * attempt is made again with twice the age. Each judged attempt can fail
 * for the bug; a machine stalled through all of them (50 ms to 1.6 s of
 * age) fails the test, saying so. */
#define AGE_FIRST_MS 50
#define AGE_TRIES    6

/* One attempt at `age`; false when the window was missed (cleaned up). */
static bool decommitted_then_unmapped(uint64_t age) {
    hak_cfg.age_ms = age;
    /* Freed later to make the tier look at the ages (a malloc would take
     * the cached entry instead). */
    uint8_t *tick1 = malloc(9 * MiB), *tick2 = malloc(20 * MiB);
    uint8_t *p = malloc(3 * MiB);
    memset(p, 0xee, 3 * MiB);
    uint64_t f0 = hak_now_ms();
    free(p);
    uint64_t f1 = hak_now_ms();
    bool resident = maps_resident(p + MiB);
    uint64_t dec = lstats().cache_decommits;
    sleep_ms((long)age * 8 / 5); /* past the age, not yet twice it */
    uint64_t l0 = hak_now_ms();
    free(tick1);
    uint64_t decommits = lstats().cache_decommits;
    bool dropped = !maps_resident(p + MiB);
    /* Still cached, its pages reading as zero: calloc needs no memset. (An
     * entry with pages is preferred: the 9 MiB one is taken out of the way
     * first.) */
    uint8_t *t = malloc(9 * MiB);
    uint8_t *q = calloc(1, 3 * MiB);
    uint64_t l1 = hak_now_ms();
    if (l0 - f1 < age || l1 - f0 >= 2 * age) {
        print_message("age %llu ms: the looks fell %llu to %llu ms after the free, outside "
                      "[age, 2 age): again with twice the age\n",
                      (unsigned long long)age, (unsigned long long)(l0 - f1),
                      (unsigned long long)(l1 - f0));
        free(q);
        free(t);
        free(tick2);
        malloc_trim(0);
        return false;
    }
    assert_true(resident);
    assert_int_equal(decommits, dec + 1);
    assert_true(dropped);
    assert_ptr_equal(t, tick1);
    assert_ptr_equal(q, p);
    for (size_t k = 0; k < 3 * MiB; k += 4096)
        assert_int_equal(q[k], 0);
    memset(q, 0x11, 3 * MiB);
    free(q);
    free(t);
    /* Past twice the age: both entries unmapped (a later look, however
     * late, finds them older still). */
    sleep_ms((long)age * 14 / 5);
    uint64_t unmaps = os_calls(OS_MUNMAP);
    free(tick2);
    assert_true(os_calls(OS_MUNMAP) >= unmaps + 2);
    assert_int_equal(lstats().cached_blocks, 1); /* the 20 MiB one just freed */
    return true;
}

static void test_unused_entries_decommitted_then_unmapped(void **state) {
    (void)state;
    uint64_t age = AGE_FIRST_MS;
    for (int i = 0; i < AGE_TRIES; i++, age *= 2)
        if (decommitted_then_unmapped(age)) return;
    fail_msg("the machine was too slow or busy for every age tried (%d ms to %llu ms)",
             AGE_FIRST_MS, (unsigned long long)age / 2);
}

/* Review find: a calloc served by a decommitted entry (taken as zero
 * throughout) whose header moved to another colour found the old header's
 * bytes in its block (the old header's line lies inside the new block).
 * The entry is aged by the clock moved forward, not by sleeping. */
static void test_calloc_over_an_old_colour_is_zero(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip(); /* (no interposed clock there) */
#else
    const int64_t age = 100;
    hak_cfg.age_ms = age;
    uint8_t *tick = malloc(9 * MiB);
    const size_t n1 = 400 * 4096 + 1 - 64, n2 = 400 * 4096 - 64;
    uint8_t *p = malloc(n1); /* slack in its last page: a colour */
    assert_true(lead_of(p) > 64);
    memset(p, 0xab, n1);
    free(p);
    uint64_t dec = lstats().cache_decommits;
    atomic_fetch_add(&clock_ahead_ms, age * 3 / 2); /* past the age, not twice it */
    free(tick);                                     /* a look at the ages: p's entry decommitted */
    uint8_t *t = malloc(9 * MiB);                   /* (the tick's entry out of the way) */
    assert_int_equal(lstats().cache_decommits, dec + 1);
    uint8_t *q = calloc(1, n2); /* no slack: its header at the start */
    assert_ptr_equal(map_of(q), map_of(p));
    assert_int_equal(lead_of(q), 64);
    for (size_t k = 0; k < n2; k++)
        if (q[k] != 0) fail_msg("calloc'd byte %zu is %#x", k, q[k]);
    free(q);
    free(t);
#endif
}

static void test_hugepages_option(void **state) {
    (void)state;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0)
        skip(); /* no THP in this kernel: the option falls back silently */
    malloc_trim(0);
    uint8_t *p = malloc(8 * MiB);
    assert_false(maps_vmflag(p, "hg"));
    free(p);
    malloc_trim(0);
    hak_cfg.hugepages = HAK_HUGE_LARGE;
    p = malloc(8 * MiB);
    assert_true(maps_vmflag(p, "hg"));
    memset(p, 1, 8 * MiB);
    free(p);
    malloc_trim(0);
    /* Rounded up to whole 2 MiB regions when that adds at most a quarter
     * (mapped, not reported: the usable size is the request's pages), and
     * the guard page past them, out of the last huge page. */
    uint64_t live = lstats().live_bytes;
    p = malloc(5 * MiB + 4096);
    assert_int_equal(lstats().live_bytes, live + 6 * MiB + 4096);
    assert_int_equal(malloc_usable_size(p), 5 * MiB + 8192 - lead_of(p));
    free(p);
    malloc_trim(0);
    p = malloc(2 * MiB + 4096); /* to 4 MiB would nearly double it */
    assert_true(lstats().live_bytes <= live + 2 * MiB + 8192 + 4096); /* (+ its guard page) */
    free(p);
}

static void test_bigger_entry_split_keeps_its_pages(void **state) {
    (void)state;
    /* A 7 MiB buffer freed (written whole), then a 2 MiB block wanted: the
     * cached mapping is split at the first region boundary past the request,
     * without a syscall, and both parts keep their pages (no page faults to
     * refill them). */
    uint8_t *p = malloc(7 * MiB);
    memset(p, 0x77, 7 * MiB);
    free(p);
    uint64_t before = os_total();
    uint8_t *q = malloc(2 * MiB - 4096);
    assert_ptr_equal(q, p);
    assert_int_equal(os_total(), before);
    assert_true(maps_resident(q + MiB));
    assert_true(malloc_usable_size(q) < 3 * MiB);
    assert_int_equal(lstats().cached_blocks, 1);
    /* The rest is a block of its own, not part of q. */
    expect_free_abort(do_free, q + 4 * MiB, "invalid pointer");
    uint8_t *r = malloc(5 * MiB - 8192); /* the rest, exactly: 2 MiB in */
    assert_ptr_equal(map_of(r), map_of(p) + 2 * MiB);
    assert_int_equal(os_total(), before);
    assert_true(maps_resident(r + 4 * MiB));
    assert_int_equal(r[4 * MiB], 0x77); /* its old bytes: a plain malloc */
    memset(r, 0x55, 5 * MiB - 8192);
    assert_int_equal(q[2 * MiB - 4097], 0x77); /* each its own */
    free(q);
    free(r);
    /* Freed neighbours merge again: one entry, which a 7 MiB request takes
     * whole, without a syscall. */
    assert_int_equal(lstats().cached_blocks, 1);
    expect_free_abort(do_free, r, "double free");
    before = os_total();
    uint8_t *w = malloc(7 * MiB);
    assert_ptr_equal(w, p);
    assert_int_equal(os_total(), before);
    assert_int_equal(lstats().cached_blocks, 0);
    free(w);
}

static void test_smaller_entry_grown_keeps_its_pages(void **state) {
    (void)state;
    /* Only a 3 MiB entry cached, 9 MiB wanted: the entry is grown with
     * mremap (in place or moved), its 3 MiB still resident and zeroed for
     * calloc, the rest fresh. */
    uint8_t *p = malloc(3 * MiB);
    memset(p, 0x33, 3 * MiB);
    free(p);
    uint64_t rm = os_calls(OS_MREMAP);
    uint8_t *q = calloc(1, 9 * MiB);
    assert_non_null(q);
    /* mremap in place, or (refused: something mapped right after it) moved */
    assert_true(os_calls(OS_MREMAP) == rm + 1 || os_calls(OS_MREMAP) == rm + 2);
    assert_int_equal(lstats().cached_blocks, 0);
    for (size_t k = 0; k < 9 * MiB; k += 4096)
        assert_int_equal(q[k], 0);
    assert_int_equal(q[9 * MiB - 1], 0);
    memset(q, 0x99, 9 * MiB);
    assert_true(malloc_usable_size(q) >= 9 * MiB);
    free(q);
    assert_int_equal(lstats().cached_blocks, 1);
    assert_true(lstats().cached_bytes >= 9 * MiB);
}

static void test_eviction_of_the_whole_cache(void **state) {
    (void)state;
    /* Four entries in each of the 11 smallest classes (126 MiB, within the
     * 128 MiB budget), then one block as big as the budget: every entry is
     * evicted at once. */
    hak_cfg.bigcache_bytes = 128 * MiB;
    malloc_trim(0);
    const size_t lower[11] = {4,  5,  6,  7,  8, 10,
                              12, 14, 16, 20, 24}; /* class floors, quarter MiB */
    void *p[44];
    for (int c = 0; c < 11; c++)
        for (int k = 0; k < 4; k++)
            p[c * 4 + k] = malloc(lower[c] * (MiB / 4) + 4096);
    for (int i = 0; i < 44; i++)
        free(p[i]);
    assert_int_equal(lstats().cached_blocks, 44);
    void *big = malloc(128 * MiB - 8192);
    free(big);
    struct large_stats s = lstats();
    assert_true(s.cached_bytes <= 128 * MiB);
    assert_int_equal(s.cached_blocks, 1);
}

static void test_locked_entries_not_reported_decommitted(void **state) {
    (void)state;
    /* Under mlockall(MCL_FUTURE) the cache cannot drop a mapping's pages:
     * an aged entry must then not pass for decommitted (calloc would skip
     * its memset and return old bytes). In a child: mlockall is for the
     * whole process. */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!maps_mlockall(MCL_CURRENT | MCL_FUTURE)) _exit(77);
        /* The look must come in [age, 2 age) (the decommit is tried, and
         * refused); past 2 age the entry is unmapped untried and nothing is
         * tested: then again with twice the age (see AGE_TRIES). */
        uint64_t age = 30;
        for (int i = 0; i < AGE_TRIES; i++, age *= 2) {
            hak_cfg.age_ms = age;
            uint8_t *p = malloc(4 * MiB);
            memset(p, 0xab, 4 * MiB);
            uint64_t f0 = hak_now_ms();
            free(p);
            sleep_ms((long)age * 5 / 3);
            free(malloc(9 * MiB)); /* looks at the ages */
            uint8_t *q = calloc(1, 4 * MiB);
            bool in_time = hak_now_ms() - f0 < 2 * age;
            for (size_t k = 0; k < 4 * MiB; k += 512)
                if (q[k] != 0) _exit(3);
            free(q);
            malloc_trim(0);
            if (in_time) _exit(0);
        }
        _exit(4);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) skip();
    if (WEXITSTATUS(st) == 4) fail_msg("the machine was too slow or busy for every age tried");
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_realloc_grown_block_grows_in_place(void **state) {
    (void)state;
    hak_cfg.hugepages = HAK_HUGE_LARGE; /* a growing block must still get small pages */
    uint64_t live = lstats().live_bytes;
    uint8_t *p = malloc(100);
    memset(p, 0x5a, 100);
    /* Past 4 KiB it becomes a Large block with room to its region's end:
     * from then on every step to 2 MiB stays in place, without a syscall. */
    p = realloc(p, 5000);
    assert_int_equal(p[99], 0x5a);
    /* The room is not reported as usable (programs count memory by it). */
    assert_int_equal(malloc_usable_size(p),
                     ((lead_of(p) + 5000 + 4095) & ~(size_t)4095) - lead_of(p));
    assert_int_equal(lstats().live_bytes - live, 2 * MiB);
    assert_false(maps_vmflag(p, "hg"));
    assert_false(maps_resident(p + MiB)); /* room is address space only */
    uint64_t before = os_total(), advised = os_calls(OS_MADVISE);
    size_t n = 5000;
    /* (Its last page is its guard; its colour's pages are not its room.) */
    size_t most = 2 * MiB - 4096 - ((lead_of(p) + 4095) & ~(size_t)4095);
    while (n < most) {
        size_t m = n + n / 2 < most ? n + n / 2 : most;
        uint8_t *q = realloc(p, m);
        assert_ptr_equal(q, p);
        memset(p + n, (int)(m & 0xff), m - n);
        n = m;
    }
    /* No mapping call; only the calls that bring its pages in ahead of it
     * (test_growing_block_pages_come_in_ahead), one per window at most. */
    assert_true(os_calls(OS_MADVISE) - advised <= 12);
    assert_int_equal(os_total() - (os_calls(OS_MADVISE) - advised), before);
    assert_int_equal(p[99], 0x5a);
    assert_int_equal(p[n - 1], (uint8_t)(n & 0xff));
    /* Shrunk to a small size, it goes back to a size class (copied). */
    uint8_t *s = realloc(p, 200);
    assert_non_null(s);
    assert_int_equal(s[99], 0x5a);
    assert_true(malloc_usable_size(s) < 4096);
    free(s);
    /* Freed, its mapping is cached and serves the next growing block. (No
     * mapping call; the 3000-byte block's carve may bring a populate, or
     * an mprotect making a new Tiny slot writable.) */
    before = os_calls(OS_MMAP) + os_calls(OS_MUNMAP) + os_calls(OS_MREMAP);
    p = malloc(3000);
    p = realloc(p, 6000);
    assert_int_equal(os_calls(OS_MMAP) + os_calls(OS_MUNMAP) + os_calls(OS_MREMAP), before);
    free(p);
}

/* A buffer grown by realloc from 16 B to 1 MiB, freed, again and again:
 * from the second time on, its growing block comes from the cache with no
 * system call at all (the lookup of the address-space limit, one per
 * buffer, made realloc_growth_16-1m a third of glibc's speed). */
static void test_growing_block_from_cache_makes_no_syscall(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip();
#else
    for (int round = 0; round < 20; round++) {
        if (round == 1) getrlimit_calls = 0;
        uint8_t *p = malloc(16);
        for (size_t n = 16; n < MiB; n += n / 2) {
            p = realloc(p, n + n / 2);
            p[n] = (uint8_t)round;
        }
        free(p);
    }
    assert_int_equal(getrlimit_calls, 0);
#endif
}

/* Whether this kernel populates ranges on request (Linux 5.14 on). */
static bool kernel_populates(void) {
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    bool ok = os_populate(m, 4096);
    munmap(m, 4096);
    return ok;
}

/* A buffer grown by small appends takes its pages a window at a time, one
 * call each, not a page fault per page (~12 us each in a virtual machine). */
static void test_growing_block_pages_come_in_ahead(void **state) {
    (void)state;
    if (!kernel_populates()) skip();
    malloc_trim(0); /* a fresh mapping: no page of it resident */
    uint64_t advised = os_calls(OS_MADVISE);
    uint8_t *p = realloc(malloc(100), 5000);
    assert_ptr_equal(realloc(p, 5016), p);       /* an append */
    assert_true(maps_resident(p + 8 * 1024));    /* a page past its end */
    assert_false(maps_resident(p + 256 * 1024)); /* but not all of its room */
    for (size_t n = 5000; n < 64 * 1024; n += 16) {
        uint8_t *q = realloc(p, n + 16);
        assert_ptr_equal(q, p);
        memset(p + n, 0x42, 16);
    }
    /* 60 KiB in 3868 appends: a few windows. */
    assert_true(os_calls(OS_MADVISE) - advised <= 6);
    assert_true(maps_resident(p + 64 * 1024));
    free(p);
}

/* Found by tests/oom (CPython crashed): a growing block cut from a bigger
 * cached mapping took the whole mapping's pages as its own, so realloc grew
 * it "in place" over the rest the split left in the cache, which the next
 * malloc was then handed too. */
static void test_growing_block_from_split_entry_stays_in_its_part(void **state) {
    (void)state;
    uint8_t *big = malloc(7 * MiB);
    memset(big, 0x31, 7 * MiB); /* cached with its pages */
    free(big);
    uint8_t *p = realloc(malloc(100), 5000); /* its first region; 5 MiB stay cached */
    assert_int_equal(lstats().cached_blocks, 1);
    p = realloc(p, 3 * MiB);
    assert_non_null(p);
    memset(p, 0x62, 3 * MiB);
    uint8_t *q = malloc(4 * MiB);
    assert_true(q + 4 * MiB <= p || q >= p + 3 * MiB); /* no overlap */
    memset(q, 0x73, 4 * MiB);
    assert_int_equal(p[3 * MiB - 1], 0x62);
    free(q);
    free(p);
}

/* Big steps (a vector doubling, a program asking for much and touching
 * little, CPython's over-allocation) bring in nothing: their pages come as touched, so RSS stays
 * what the program uses (bench realloc_growth writes a byte per step: its RSS rose by 1.1 MiB when
 * every step populated). */
static void test_growing_block_big_steps_populate_nothing(void **state) {
    (void)state;
    if (!kernel_populates()) skip();
    malloc_trim(0);
    uint64_t advised = os_fault_site_calls(OS_SITE_POPULATE);
    uint8_t *p = realloc(malloc(100), 5000);
    uintptr_t written[32];
    unsigned nw = 0;
    for (size_t n = 5000; n < 600000; n += n / 2) {
        uint8_t *q = realloc(p, n + n / 2);
        assert_ptr_equal(q, p);
        p[n + n / 2 - 1] = 1;
        written[nw++] = (uintptr_t)&p[n + n / 2 - 1] & ~(uintptr_t)4095;
    }
    assert_int_equal(os_fault_site_calls(OS_SITE_POPULATE), advised);
    /* No page is in but those written (and the first, which the copy of
     * its first 100 bytes wrote). */
    unsigned untouched = 0;
    for (uintptr_t pg = ((uintptr_t)p + 100 + 4095) & ~(uintptr_t)4095; pg < (uintptr_t)p + 600000;
         pg += 4096) {
        bool w = false;
        for (unsigned i = 0; i < nw; i++)
            w |= written[i] == pg;
        if (w) continue;
        assert_false(maps_resident((void *)pg));
        untouched++;
    }
    assert_true(untouched > 100);
    free(p);
    /* Nor steps of an eighth (CPython's lists over-allocate so, and fill
     * the room later or never: populating them took its RSS up 1.9%). */
    malloc_trim(0);
    advised = os_fault_site_calls(OS_SITE_POPULATE);
    p = realloc(malloc(100), 5000);
    for (size_t n = 5000; n < 600000; n += n / 8) {
        uint8_t *q = realloc(p, n + n / 8);
        assert_ptr_equal(q, p);
        p[n - 1] = 1;
    }
    assert_int_equal(os_fault_site_calls(OS_SITE_POPULATE), advised);
    free(p);
}

/* A kernel that will not populate: the pages fault in as touched, and a
 * refused window is not asked for again at every append. */
static void test_refused_populate_asked_once_per_window(void **state) {
    (void)state;
    malloc_trim(0);
    os_fault_only(1u << OS_SITE_POPULATE);
    os_fault_arm(0, UINT64_MAX);
    uint8_t *p = realloc(malloc(100), 5000);
    memset(p, 0x17, 5000);
    for (size_t n = 5000; n < 64 * 1024; n += 16) {
        uint8_t *q = realloc(p, n + 16);
        assert_ptr_equal(q, p);
        memset(p + n, 0x42, 16);
    }
    uint64_t refused = os_fault_site_failed(OS_SITE_POPULATE);
    os_fault_disarm();
    os_fault_only(~0u);
    assert_true(refused >= 1 && refused <= 6);
    assert_int_equal(p[4999], 0x17);
    assert_int_equal(p[64 * 1024 - 1], 0x42);
    free(p);
}

/* A freed block that merges with its own cached rest is the most recently
 * freed entry: eviction takes an older one (it kept the rest's old place in
 * the order and went first). */
static void test_merged_entry_is_newest(void **state) {
    (void)state;
    hak_cfg.bigcache_bytes = 28 * MiB;
    /* (Each mapping has its guard page past its regions.) */
    uint8_t *p = malloc(8 * MiB - 4096), *q = malloc(16 * MiB - 4096), *s = malloc(6 * MiB - 4096);
    memset(p, 0x88, 8 * MiB - 4096);
    free(p);
    uint8_t *r = malloc(2 * MiB - 4096); /* p's first region; its other 6 MiB stay cached */
    assert_ptr_equal(r, p);
    free(q);
    free(r); /* merges with the rest: the 8 MiB again, freed last */
    assert_int_equal(lstats().cached_bytes, 24 * MiB + 8192);
    free(s); /* 30 MiB: the least recently freed (q's 16 MiB) goes */
    assert_int_equal(lstats().cached_bytes, 14 * MiB + 8192);
    uint64_t before = os_total();
    assert_ptr_equal(malloc(8 * MiB - 4096), p);
    assert_int_equal(os_total(), before);
    free(p);
}

/* Huge pages refused (a kernel without THP): the mapping is not recorded as
 * huge, so a growing block, which wants small pages, may still reuse it. */
static void test_refused_hugepages_not_recorded(void **state) {
    (void)state;
    hak_cfg.hugepages = HAK_HUGE_LARGE;
    os_fault_only(1u << OS_SITE_HUGEPAGES);
    os_fault_arm(0, UINT64_MAX);
    uint8_t *p = malloc(4 * MiB - 4096);
    os_fault_disarm();
    os_fault_only(~0u);
    assert_non_null(p);
    free(p);
    uint8_t *q = malloc(100);
    q = realloc(q, 5000); /* a growing block: from the cached mapping */
    assert_ptr_equal(map_of(q), map_of(p));
    free(q);
}

static void test_realloc_trims_only_when_asked_for_less(void **state) {
    (void)state;
    uint8_t *p = malloc(16 * MiB);
    uint64_t rm = os_calls(OS_MREMAP);
    p = realloc(p, 17 * MiB);        /* grows */
    p = realloc(p, 16 * MiB + 4096); /* less than before, but more than half */
    assert_true(malloc_usable_size(p) >= 16 * MiB + 4096);
    uint64_t grown = os_calls(OS_MREMAP);
    assert_true(grown >= rm + 1);
    p = realloc(p, 4 * MiB); /* less than half: trimmed */
    assert_int_equal(os_calls(OS_MREMAP), grown + 1);
    assert_true(malloc_usable_size(p) < 5 * MiB);
    free(p);
}

/* Blocks grown side by side do not share their address bits below 2 MiB
 * (where every mapping starts): their headers and their ends fall in
 * different sets of the caches and TLBs (append_64k missed at every append
 * when all 64 shared one). A bigger alignment keeps the header at the
 * start; a colour survives a move of the pages, and free finds it. */
static void test_blocks_side_by_side_get_colours(void **state) {
    (void)state;
    enum { N = 64 };
    uint8_t *p[N];
    bool line[64] = {0}, page[16] = {0};
    unsigned lines = 0, pages = 0;
    for (int i = 0; i < N; i++) {
        p[i] = realloc(malloc(100), 5000); /* a growing block */
        assert_non_null(p[i]);
        memset(p[i], i, 5000);
        size_t lead = lead_of(p[i]);
        assert_true(lead >= 64 && lead < 16 * 4096 + 4096);
        unsigned l = (unsigned)(((uintptr_t)p[i] - 64) / 64 % 64), g = (unsigned)(lead / 4096 % 16);
        lines += !line[l];
        pages += !page[g];
        line[l] = page[g] = true;
    }
    assert_true(lines >= 48);
    assert_true(pages >= 12);
    /* Big blocks: a line within their last page's slack, no page more. */
    malloc_trim(0); /* no cached mapping (an earlier test's, at its own colour) serves them */
    uint64_t live = lstats().live_bytes;
    uint8_t *b = malloc(3 * MiB);
    assert_true(lead_of(b) > 64 && lead_of(b) <= 4096); /* (the last line: the block at page 1) */
    assert_int_equal(lstats().live_bytes - live, 3 * MiB + 4096 + 4096); /* + a page, + the guard */
    /* None at an exact fit: its last page has no slack. */
    uint8_t *x = malloc(3 * MiB - 64);
    assert_int_equal(lead_of(x), 64);
    free(x);
    /* An aligned block has its header at the start. */
    void *a;
    assert_int_equal(posix_memalign(&a, 4096, 3 * MiB), 0);
    assert_int_equal((uintptr_t)a & (2 * MiB - 1), 4096);
    free(a);
    /* Moved (grown past its room), a coloured block keeps its colour. */
    size_t had = lead_of(p[5]);
    uint8_t *q = realloc(p[5], 5 * MiB);
    assert_non_null(q);
    assert_int_equal(lead_of(q), had);
    assert_int_equal(q[4999], 5);
    free(q); /* (its header found at its colour: no abort) */
    expect_free_abort(do_free, q, "double free");
    free(b);
    for (int i = 0; i < N; i++) {
        if (i == 5) continue;
        assert_int_equal(p[i][4999], (uint8_t)i);
        free(p[i]);
    }
}

static void test_growing_blocks_bounded(void **state) {
    (void)state;
    /* At most 1024 growing blocks live (each a mapping of its own): the
     * others grow through the size classes, as before. */
    enum { N = 1030 };
    static uint8_t *p[N];
    uint64_t live = lstats().live_blocks;
    for (int i = 0; i < N; i++) {
        p[i] = malloc(64);
        p[i][0] = (uint8_t)i;
        p[i] = realloc(p[i], 8192);
        assert_non_null(p[i]);
        assert_int_equal(p[i][0], (uint8_t)i);
    }
    assert_int_equal(lstats().live_blocks, live + 1024);
    for (int i = 0; i < N; i++)
        free(p[i]);
    assert_int_equal(lstats().live_blocks, live);
    /* All freed: a growing block gets its room again. */
    uint8_t *q = realloc(malloc(64), 8192);
    assert_int_equal(lstats().live_blocks, live + 1);
    free(q);
}

static void stale_into_rest(void *p) {
    /* p's block was split off a cached mapping whose front was then moved
     * away by realloc: its regions must not point to the unmapped header. */
    uint8_t *q = malloc(3 * MiB);
    uint8_t *r = realloc(q, 100 * MiB);
    if (r == q) abort(); /* not moved: no test (the rest is right after it) */
    do_free(p);
}

static void test_split_rest_of_a_moved_block_still_checked(void **state) {
    (void)state;
    /* Review find: a free() of a stale pointer into the cached rest of a
     * split mapping, after the split-off front moved, read an unmapped
     * header (SIGSEGV) instead of aborting with the one-line message. */
    uint8_t *p = malloc(10 * MiB - 4096);
    free(p); /* cached whole */
    expect_free_abort(stale_into_rest, p + 6 * MiB, "invalid pointer");
    /* The same for a real double free of a block that lived in the rest. */
    uint8_t *a = malloc(3 * MiB), *b = malloc(5 * MiB);
    assert_ptr_equal(a, p);
    assert_ptr_equal(map_of(b), map_of(p) + 4 * MiB);
    free(b);
    free(a);               /* merged again */
    free(malloc(9 * MiB)); /* taken whole, its regions all marked for p's header */
    /* (The rest's header is at its start; b's was at its colour: the same
     * line, with b's block after it, only when that was the start.) */
    expect_free_abort(stale_into_rest, b, lead_of(b) == 64 ? "double free" : "invalid pointer");
}

static void test_realloc_copy_keeps_errno(void **state) {
    (void)state;
    /* Review find: a realloc that could not move the pages (mremap refused)
     * and copied the bytes instead succeeded with errno set to ENOMEM. */
    uint8_t *p = malloc(3 * MiB);
    uint8_t *z = malloc(3 * MiB); /* keeps p from growing where it is */
    memset(p, 0x3c, 3 * MiB);
    os_fault_only(1u << OS_SITE_RESIZE | 1u << OS_SITE_MOVE);
    os_fault_arm(0, UINT64_MAX);
    errno = 0;
    uint8_t *q = realloc(p, 40 * MiB);
    int e = errno;
    os_fault_disarm();
    os_fault_only(UINT32_MAX);
    assert_non_null(q);
    assert_int_equal(e, 0);
    assert_int_equal(q[3 * MiB - 1], 0x3c);
    free(q);
    free(z);
}

static void test_parts_of_two_mappings_do_not_merge(void **state) {
    (void)state;
    /* Review find: freed neighbours from two kernel mappings merged into one
     * entry, which mremap then refused (EFAULT): copies, errno, and a refused
     * call that trimmed every cache. Only parts of one mapping merge. */
    uint8_t *q = malloc(3 * MiB), *z = malloc(3 * MiB), *w = malloc(4 * MiB - 4096);
    q = realloc(q, 8 * MiB - 4096); /* moved: a mapping of its own, maybe next to w */
    free(w);
    free(q);
    assert_int_equal(lstats().cached_blocks, 2);
    free(z);
}

static void test_small_pages_entry_gets_huge_pages(void **state) {
    (void)state;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0) skip();
    /* Review find: a Large block grown from a cached growing block's mapping
     * (small pages) kept small pages. */
    hak_cfg.hugepages = HAK_HUGE_LARGE;
    uint8_t *g = realloc(malloc(100), 5000);
    free(g);
    uint8_t *p = malloc(64 * MiB);
    assert_true(maps_vmflag(p, "hg"));
    free(p);
}

/* In a child: write byte after byte from p on until a write faults; the
 * address of the fault (0 when `limit` bytes went without one). */
static int fault_pipe = -1;
static void fault_report(int sig, siginfo_t *si, void *ctx) {
    (void)sig, (void)ctx;
    uintptr_t at = (uintptr_t)si->si_addr;
    _exit(write(fault_pipe, &at, sizeof at) == sizeof at ? 0 : 3);
}
static uintptr_t first_fault(uint8_t *p, size_t limit) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fault_pipe = fd[1];
        struct sigaction sa = {.sa_sigaction = fault_report, .sa_flags = SA_SIGINFO};
        sigaction(SIGSEGV, &sa, NULL);
        for (size_t i = 0; i < limit; i++)
            ((volatile uint8_t *)p)[i] = 0xee;
        uintptr_t none = 0;
        _exit(write(fd[1], &none, sizeof none) == sizeof none ? 0 : 3);
    }
    close(fd[1]);
    uintptr_t at = 1;
    assert_int_equal(read(fd[0], &at, sizeof at), (ssize_t)sizeof at);
    close(fd[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return at;
}

/* The first page past a block's pages: where a fresh mapping's guard is. */
static uintptr_t pages_end(const uint8_t *p, size_t n) {
    return ((uintptr_t)p + n + 4095) & ~(uintptr_t)4095;
}

/* A Large block's overflow faults at the guard page past its pages, through
 * every way its mapping changes: fresh, reused from the cache (no call),
 * grown, moved, trimmed, cut from a bigger cached mapping. */
static void guard_follows_the_block(void) {
    size_t n = 3 * MiB + 100;
    uint8_t *p = malloc(n);
    assert_non_null(p);
    memset(p, 0x11, n);
    assert_int_equal(first_fault(p, 8 * MiB), pages_end(p, n));
    free(p);
    uint64_t before = os_total();
    uint8_t *q = malloc(n); /* the same mapping, its guard still there */
    assert_ptr_equal(q, p);
    assert_int_equal(os_total(), before);
    assert_int_equal(first_fault(q, 8 * MiB), pages_end(q, n));
    /* Grown (in place or moved) and trimmed: the guard at each new end. */
    q = realloc(q, 9 * MiB + 5);
    assert_non_null(q);
    assert_int_equal(q[3 * MiB + 99], 0x11);
    assert_int_equal(first_fault(q, 16 * MiB), pages_end(q, 9 * MiB + 5));
    q = realloc(q, 2 * MiB + 7);
    assert_int_equal(q[2 * MiB + 6], 0x11);
    assert_int_equal(first_fault(q, 16 * MiB), pages_end(q, 2 * MiB + 7));
    free(q);
    /* Cut from a bigger cached mapping: the rest keeps the guard page, the
     * part taken has none at its end (the rest follows it), and grown over
     * the rest it has the rest's. */
    malloc_trim(0);
    uint8_t *big = malloc(12 * MiB - 4096);
    free(big);
    uint8_t *a = malloc(2 * MiB - 4096);
    assert_ptr_equal(a, big);
    uint8_t *b = malloc(10 * MiB - 4096); /* the rest */
    assert_ptr_equal(map_of(b), map_of(big) + 2 * MiB);
    assert_int_equal(first_fault(b, 16 * MiB), pages_end(b, 10 * MiB - 4096));
    free(b);
    before = os_total();
    a = realloc(a, 6 * MiB); /* over the rest, to the next region boundary */
    assert_ptr_equal(a, big);
    assert_int_equal(os_total(), before);
    uint8_t *c = malloc(4 * MiB - 4096); /* what it left */
    assert_ptr_equal(map_of(c), map_of(big) + 8 * MiB);
    assert_int_equal(first_fault(c, 16 * MiB), pages_end(c, 4 * MiB - 4096));
    free(c);
    a = realloc(a, 12 * MiB - 4096); /* over that too: the guard page is a's */
    assert_ptr_equal(a, big);
    assert_int_equal(first_fault(a, 16 * MiB), pages_end(a, 12 * MiB - 4096));
    free(a);
}

static void test_guard_page_after_every_block(void **state) {
    (void)state;
    guard_follows_the_block();
}

/* A kernel without guard markers (before Linux 6.13): mprotect, the same
 * guards. */
static void test_guard_page_by_mprotect(void **state) {
    (void)state;
    os_fault_no_markers(true);
    malloc_trim(0);
    guard_follows_the_block();
    malloc_trim(0);
    os_fault_no_markers(false);
}

/* Refused guards: a block goes without one, and a guard page that cannot
 * be unmapped keeps its mapping from growing or moving (realloc copies). */
static void test_refused_guard_calls(void **state) {
    (void)state;
    os_fault_only(1u << OS_SITE_GUARD_ADD);
    os_fault_arm(0, UINT64_MAX);
    uint8_t *p = malloc(3 * MiB);
    os_fault_disarm();
    assert_non_null(p);
    memset(p, 0x21, 3 * MiB);
    p = realloc(p, 7 * MiB); /* nothing to take away */
    assert_non_null(p);
    assert_int_equal(p[3 * MiB - 1], 0x21);
    os_fault_only(1u << OS_SITE_MUNMAP);
    os_fault_arm(0, UINT64_MAX);
    uint64_t was = os_fault_site_failed(OS_SITE_MUNMAP);
    uint8_t *q = realloc(p, 15 * MiB); /* a copy: its guard page stays */
    uint64_t refused = os_fault_site_failed(OS_SITE_MUNMAP) - was;
    os_fault_disarm();
    os_fault_only(~0u);
    assert_true(refused >= 1);
    assert_non_null(q);
    assert_int_equal(q[3 * MiB - 1], 0x21);
    assert_int_equal(q[7 * MiB - 1], 0);
    assert_int_equal(first_fault(q, 32 * MiB), pages_end(q, 15 * MiB));
    free(q);
}

/* ---- spares: the mappings of sampled small blocks ---------------------------
 * Each check runs in a child that turns the profiler on (at a rate at which
 * nothing is sampled by itself) and asks for sampled blocks directly. */

static void spares_reused(void *arg) {
    (void)arg;
    prof_start((uint64_t)1 << 60, "/dev/null");
    /* 10000 bytes after the 64-byte header (at a colour that leaves it
     * there): three pages of room. */
    uint8_t *p = large_alloc_sampled(10000, 16, false, 10000, true);
    CHILD_CHECK(p != NULL);
    uint8_t *map = map_of(p);
    memset(p, 0xab, 10000);
    free(p);
    uint64_t before = os_total();
    for (int i = 0; i < 100; i++) {
        bool zero = i % 2 == 1; /* (calloc: the spare's pages were written) */
        size_t n = 9000 + (size_t)i * 10;
        uint8_t *q = large_alloc_sampled(n, 16, zero, n, true);
        CHILD_CHECK(q == p);
        for (size_t k = 0; zero && k < n; k++)
            CHILD_CHECK(q[k] == 0);
        memset(q, 0xcd, n);
        free(q);
    }
    CHILD_CHECK(os_total() == before); /* no call for any of them */
    /* A block at a bigger alignment gets its offset in the same mapping:
     * 8192 + 4096 bytes, its three pages. */
    uint8_t *a = large_alloc_sampled(4096, 8192, false, 4096, true);
    CHILD_CHECK(a == map + 8192);
    memset(a, 1, 4096);
    free(a);
    /* A block of less than half a spare's room does not take it: one page
     * against three. */
    uint8_t *small = large_alloc_sampled(100, 16, false, 100, true);
    CHILD_CHECK(small != NULL && map_of(small) != map);
    free(small);
}

static void test_sampled_small_mapping_comes_back_without_syscalls(void **state) {
    (void)state;
    expect_clean_exit(spares_reused, NULL);
}

static void spares_bounded_counted_trimmed(void *arg) {
    (void)arg;
    prof_start((uint64_t)1 << 60, "/dev/null");
    struct large_stats s0, s;
    large_get_stats(&s0);
    void *p[20];
    for (int i = 0; i < 20; i++) {
        p[i] = large_alloc_sampled(3000, 16, false, 3000, true);
        CHILD_CHECK(p[i] != NULL);
    }
    for (int i = 0; i < 20; i++)
        free(p[i]);
    /* Every freed mapping is cached (spares and BigCache alike), so the
     * counters behind mallinfo2 and the stats see them all. */
    large_get_stats(&s);
    CHILD_CHECK(s.cached_blocks == s0.cached_blocks + 20);
    CHILD_CHECK(s.live_blocks == s0.live_blocks);
    /* A trim gives back the spares too. */
    uint64_t unmaps = os_calls(OS_MUNMAP);
    malloc_trim(0);
    large_get_stats(&s);
    CHILD_CHECK(s.cached_blocks == 0 && s.cached_bytes == 0);
    CHILD_CHECK(os_calls(OS_MUNMAP) >= unmaps + 20);
    /* The background thread's pass sees the spares: with nothing else
     * cached, it has a next pass to wait for (when they are due to age). */
    void *q = large_alloc_sampled(3000, 16, false, 3000, true);
    free(q);
    CHILD_CHECK(large_age_next() != UINT64_MAX);
    large_get_stats(&s);
    CHILD_CHECK(s.cached_blocks == 1);
    /* Without the background thread, spares unused for the age go to the
     * BigCache on the tier's own look at its ages, and age there. */
    malloc_trim(0);
    hak_cfg.age_ms = 20;
    uint8_t *r = large_alloc_sampled(3000, 16, false, 3000, true);
    memset(r, 7, 3000);
    free(r);
    CHILD_CHECK(maps_resident(r));
    /* Two ages (40 ms) and a look; eventually, within a hang limit
     * (scaled: tests/timing.h) fifty times that. */
    int64_t limit = hak_test_limit_ms(2000);
    for (int64_t t0 = hak_test_now_ms(); maps_resident(r) && hak_test_now_ms() - t0 < limit;) {
        struct timespec ms10 = {0, 10 * 1000 * 1000};
        nanosleep(&ms10, NULL);
        free(malloc(3 * MiB)); /* a call of the tier: it looks at the ages */
    }
    CHILD_CHECK(!maps_resident(r)); /* decommitted in the BigCache */
    hak_cfg.age_ms = 60000;
    /* With caching off, no spare is kept either: the free unmaps. */
    hak_cfg.bigcache_bytes = 0;
    q = large_alloc_sampled(3000, 16, false, 3000, true);
    unmaps = os_calls(OS_MUNMAP);
    free(q);
    CHILD_CHECK(os_calls(OS_MUNMAP) == unmaps + 1);
}

static void test_sampled_spares_bounded_counted_and_trimmed(void **state) {
    (void)state;
    expect_clean_exit(spares_bounded_counted_trimmed, NULL);
}

static void spare_double_free(void *arg) {
    (void)arg;
    prof_start((uint64_t)1 << 60, "/dev/null");
    void *p = large_alloc_sampled(64, 16, false, 64, true);
    fprintf(stderr, "p=%p\n", p);
    do_double_free(p);
}

static void test_double_free_of_a_spare_is_caught(void **state) {
    (void)state;
    struct death d;
    run_child(spare_double_free, NULL, &d);
    assert_aborted(&d);
    void *p = NULL;
    assert_int_equal(sscanf(d.err, "p=%p", &p), 1);
    char line[160];
    snprintf(line, sizeof line, "hakmem: free(): double free %p", p);
    int exact, hak;
    count_lines(&d, line, &exact, &hak);
    if (exact != 1 || hak != 1) fail_msg("expected \"%s\"; stderr was:\n%s", line, d.err);
}

/* Mappings of sampled small blocks, spares too, are at most 16384
 * (LARGE_SAMPLED_MAX); the count goes down as they leave, so a program that
 * frees its samples can take as many again. */
#define SAMPLED_MAX 16384
static void sampled_mappings_bounded(void *arg) {
    (void)arg;
    prof_start((uint64_t)1 << 60, "/dev/null");
    static void *p[SAMPLED_MAX];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < SAMPLED_MAX; i++) {
            p[i] = large_alloc_sampled(100, 16, false, 100, true);
            CHILD_CHECK(p[i] != NULL);
        }
        CHILD_CHECK(large_alloc_sampled(100, 16, false, 100, true) == NULL); /* the bound */
        free(p[0]); /* a spare now: the next sample of its size takes it */
        p[0] = large_alloc_sampled(100, 16, false, 100, true);
        CHILD_CHECK(p[0] != NULL);
        CHILD_CHECK(large_alloc_sampled(100, 16, false, 100, true) == NULL);
        /* A Large block sampled is not one of them. */
        void *big = large_alloc_sampled(2 * MiB, 16, false, 2 * MiB, false);
        CHILD_CHECK(big != NULL);
        free(big);
        for (int i = 0; i < SAMPLED_MAX; i++) /* to the spares, then the BigCache */
            free(p[i]);
        if (round == 0) {
            /* Reallocated, a sample leaves too. */
            void *q = large_alloc_sampled(100, 16, false, 100, true);
            CHILD_CHECK(q != NULL);
            q = realloc(q, 200);
            CHILD_CHECK(q != NULL);
            free(q);
        }
        malloc_trim(0); /* the spares go: round 1 maps them all again */
    }
}

static void test_sampled_small_mappings_bounded_and_counted_out(void **state) {
    (void)state;
    expect_clean_exit(sampled_mappings_bounded, NULL);
}

/* ---- counters: each thread publishes its own -------------------------------------- */

static void *large_churn(void *arg) {
    free(malloc(16)); /* (arms the thread's exit hook: its counts may wait) */
    int n = *(int *)arg;
    for (int i = 0; i < n; i++)
        free(malloc(2 * MiB));
    return NULL;
}

/* A big block another thread holds shows at once (mallinfo2 reads these):
 * a thread keeps to itself only a few small blocks' bytes. */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static int hold_state; /* 1: allocated; 2: may free */

static void *hold_big(void *arg) {
    (void)arg;
    free(malloc(16)); /* (arms the thread's exit hook: its counts may wait) */
    void *p = malloc(512 * MiB);
    pthread_mutex_lock(&hold_mu);
    hold_state = 1;
    pthread_cond_broadcast(&hold_cv);
    while (hold_state != 2)
        pthread_cond_wait(&hold_cv, &hold_mu);
    pthread_mutex_unlock(&hold_mu);
    free(p);
    return NULL;
}

static void test_big_block_of_another_thread_counted_at_once(void **state) {
    (void)state;
    struct large_stats s0, s;
    large_get_stats(&s0);
    hold_state = 0;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hold_big, NULL), 0);
    pthread_mutex_lock(&hold_mu);
    while (hold_state != 1)
        pthread_cond_wait(&hold_cv, &hold_mu);
    large_get_stats(&s);
    assert_true(s.live_bytes >= s0.live_bytes + 512 * MiB);
    assert_int_equal(s.live_blocks, s0.live_blocks + 1);
    hold_state = 2;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
    assert_int_equal(pthread_join(t, NULL), 0);
}

/* Fewer changes than a thread keeps to itself: its exit publishes them. */
static void test_thread_counts_published_at_exit(void **state) {
    (void)state;
    struct large_stats s0, s;
    large_get_stats(&s0);
    int n = 5;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, large_churn, &n), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    large_get_stats(&s);
    assert_int_equal(s.allocs, s0.allocs + 5);
    assert_int_equal(s.frees, s0.frees + 5);
    assert_int_equal(s.live_blocks, s0.live_blocks);
    /* This thread's own changes are all there when it reads them. */
    large_churn(&n);
    large_get_stats(&s);
    assert_int_equal(s.allocs, s0.allocs + 10);
    assert_int_equal(s.live_bytes, s0.live_bytes);
}

/* ---- the threads' own caches (HAKMEM_LARGE_TCACHE_MB) -------------------- */

static int tc_reset(void **state) {
    reset(state);
    hak_cfg.bigcache_bytes = 128 * MiB;
    hak_cfg.large_tcache_bytes = 16 * MiB;
    return 0;
}

/* What is taken out of a thread's own cache by another thread (an ager, a
 * trim, a fork child for the parent's threads) goes to that thread's
 * shard, where the rest of its mapping is: the two merge again (in the
 * taker's shard they would stay two entries, and a request for the whole
 * would map anew). */
static pthread_barrier_t owner_bar;
static void *split_then_wait(void *arg) {
    void *p = malloc(20 * MiB); /* over half the thread cache's bound: freed to the BigCache */
    memset(p, 1, 20 * MiB);
    free(p);
    void *q = malloc(3 * MiB); /* its first 4 MiB; the rest stays in this thread's shard */
    assert_ptr_equal(q, p);
    free(q); /* into this thread's own cache */
    *(void **)arg = p;
    pthread_barrier_wait(&owner_bar);
    pthread_barrier_wait(&owner_bar); /* (alive while the child takes it) */
    return NULL;
}

static void child_merges_other_threads_cache(void *arg) {
    CHILD_CHECK(lstats().cached_blocks == 1); /* merged */
    uint64_t maps = os_calls(OS_MMAP);
    void *q = malloc(20 * MiB);
    CHILD_CHECK(q == arg);
    CHILD_CHECK(os_calls(OS_MMAP) == maps);
    free(q);
}

static void test_taken_thread_cache_to_its_owners_shard(void **state) {
    (void)state;
    pthread_t t;
    void *p = NULL;
    pthread_barrier_init(&owner_bar, NULL, 2);
    assert_int_equal(pthread_create(&t, NULL, split_then_wait, &p), 0);
    pthread_barrier_wait(&owner_bar);
    assert_int_equal(lstats().cached_blocks, 2);
    expect_clean_exit(child_merges_other_threads_cache, p);
    pthread_barrier_wait(&owner_bar);
    assert_int_equal(pthread_join(t, NULL), 0);
    pthread_barrier_destroy(&owner_bar);
}

static void *malloc_3(void *arg) {
    (void)arg;
    void *p = malloc(3 * MiB);
    memset(p, 3, 3 * MiB);
    return p;
}

/* A freed mapping comes back to the thread that freed it, without a call;
 * another thread does not get it. */
static void test_thread_cache_is_the_threads_own(void **state) {
    (void)state;
    void *p = malloc(3 * MiB);
    memset(p, 1, 3 * MiB);
    free(p);
    pthread_t t;
    void *q;
    assert_int_equal(pthread_create(&t, NULL, malloc_3, NULL), 0);
    assert_int_equal(pthread_join(t, &q), 0);
    assert_ptr_not_equal(q, p);
    uint64_t calls = os_total();
    for (int i = 0; i < 10; i++) {
        void *r = malloc(3 * MiB);
        assert_ptr_equal(r, p);
        memset(r, i, 3 * MiB);
        free(r);
    }
    assert_int_equal(os_total(), calls);
    free(q);
}

/* Four mappings at most, none over half the bound: the others, and the
 * oldest when a fifth comes, go to the BigCache, which every thread
 * reaches; nothing is unmapped on the way. */
static void test_thread_cache_bounded(void **state) {
    (void)state;
    void *p[5], *big = malloc(9 * MiB);
    for (int i = 0; i < 5; i++)
        p[i] = malloc(3 * MiB);
    uint64_t unmaps = os_calls(OS_MUNMAP);
    for (int i = 0; i < 5; i++)
        free(p[i]);
    free(big);
    assert_int_equal(os_calls(OS_MUNMAP), unmaps);
    assert_int_equal(lstats().cached_blocks, 6);
    /* The 9 MiB one and the first 3 MiB one are in the BigCache. */
    void *q[2];
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, malloc_3, NULL), 0);
    assert_int_equal(pthread_join(t, &q[0]), 0);
    assert_ptr_equal(q[0], p[0]);
    q[1] = malloc(9 * MiB);
    assert_ptr_equal(q[1], big);
    free(q[0]);
    free(q[1]);
}

static pthread_barrier_t tc_bar;

/* Frees a 3 MiB block into its cache, then idles until told, then
 * allocates again. */
static void *tc_idler(void *arg) {
    uint8_t **out = arg;
    uint8_t *p = malloc(3 * MiB);
    memset(p, 0x5a, 3 * MiB);
    free(p);
    *out = p;
    pthread_barrier_wait(&tc_bar); /* freed */
    pthread_barrier_wait(&tc_bar); /* the main thread looked */
    uint8_t *q = malloc(3 * MiB);  /* (its slot was taken: found so) */
    assert_non_null(q);
    memset(q, 1, 3 * MiB);
    free(q);
    return NULL;
}

/* Start a tc_idler and wait for its free: *p is then in its cache. */
static void idler_start(pthread_t *t, uint8_t **p) {
    pthread_barrier_init(&tc_bar, NULL, 2);
    assert_int_equal(pthread_create(t, NULL, tc_idler, p), 0);
    pthread_barrier_wait(&tc_bar);
}

/* Let the idler allocate again and end. */
static void idler_stop(pthread_t t) {
    pthread_barrier_wait(&tc_bar);
    assert_int_equal(pthread_join(t, NULL), 0);
    pthread_barrier_destroy(&tc_bar);
}

/* An idle thread's cached mapping ages all the same: the ageing pass
 * (the background thread's) takes it into the BigCache, which decommits
 * it. */
static void test_idle_thread_cache_ages(void **state) {
    (void)state;
    hak_cfg.age_ms = 20;
    uint8_t *p = NULL;
    pthread_t t;
    idler_start(&t, &p);
    assert_true(maps_resident(p + MiB));
    sleep_ms(60);
    large_age_next();
    assert_false(maps_resident(p + MiB));
    idler_stop(t);
    hak_cfg.age_ms = 60000;
}

static void *free_and_exit(void *arg) {
    void **out = arg;
    *out = malloc(3 * MiB);
    memset(*out, 2, 3 * MiB);
    free(*out);
    return NULL;
}

/* A thread's cache goes to the BigCache when it exits. */
static void test_thread_cache_to_bigcache_at_exit(void **state) {
    (void)state;
    void *p = NULL;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_and_exit, &p), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    uint64_t calls = os_total();
    void *q = malloc(3 * MiB);
    assert_ptr_equal(q, p);
    assert_int_equal(os_total(), calls);
    free(q);
}

/* malloc_trim empties every thread's cache, and the thread goes on. */
static void test_trim_empties_every_thread_cache(void **state) {
    (void)state;
    uint8_t *p = NULL;
    pthread_t t;
    idler_start(&t, &p);
    uint64_t unmaps = os_calls(OS_MUNMAP);
    assert_true(malloc_trim(0));
    assert_true(os_calls(OS_MUNMAP) > unmaps);
    assert_false(maps_resident(p + MiB));
    idler_stop(t);
}

/* A double free of a mapping in a thread's cache is caught. */
static void do_free_twice(void *p) {
    free(p);
    free(p);
}

static void test_thread_cache_double_free_caught(void **state) {
    (void)state;
    void *p = malloc(3 * MiB);
    expect_free_abort(do_free_twice, p, "double free");
}

/* Many threads freeing big blocks: the threads' caches together keep at
 * most half the BigCache's bound, and the rest reaches the BigCache, where
 * every thread finds it. (Each of 8 threads kept 4 mappings of its own, and
 * another thread's mallocs mapped fresh memory for every one.) */
#define TC_MANY 8
static void *free_four_and_wait(void *arg) {
    (void)arg;
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = malloc(3 * MiB);
    pthread_barrier_wait(&tc_bar); /* all 32 mapped (none reused meanwhile) */
    for (int i = 0; i < 4; i++)
        free(p[i]);
    pthread_barrier_wait(&tc_bar); /* freed */
    pthread_barrier_wait(&tc_bar); /* the main thread took its blocks */
    return NULL;
}

static void test_thread_caches_leave_the_bigcache_its_share(void **state) {
    (void)state;
    pthread_t t[TC_MANY];
    pthread_barrier_init(&tc_bar, NULL, TC_MANY + 1);
    for (int i = 0; i < TC_MANY; i++)
        assert_int_equal(pthread_create(&t[i], NULL, free_four_and_wait, NULL), 0);
    pthread_barrier_wait(&tc_bar);
    pthread_barrier_wait(&tc_bar);
    /* 32 mappings freed; the caches hold at most 64 MiB of them (4 threads'
     * worth, 16 mappings): 16 at least are the BigCache's. */
    void *q[16];
    uint64_t maps = os_calls(OS_MMAP);
    for (int i = 0; i < 16; i++)
        q[i] = malloc(3 * MiB);
    assert_int_equal(os_calls(OS_MMAP), maps);
    pthread_barrier_wait(&tc_bar);
    for (int i = 0; i < TC_MANY; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    pthread_barrier_destroy(&tc_bar);
    for (int i = 0; i < 16; i++)
        free(q[i]);
}

/* A block freed by another thread than the one that allocated it goes to
 * the freeing thread's cache, and comes back to that thread without a call;
 * freed again, it is caught. */
static void *free_then_malloc_3(void *arg) {
    free(arg);
    uint64_t calls = os_total();
    void *q = malloc(3 * MiB);
    assert_ptr_equal(q, arg);
    assert_int_equal(os_total(), calls);
    memset(q, 4, 3 * MiB);
    free(q);
    return NULL;
}

static void do_free_once(void *p) {
    free(p);
}

static void test_cross_thread_free_to_the_freers_cache(void **state) {
    (void)state;
    uint64_t live = lstats().live_blocks;
    void *p = malloc(3 * MiB);
    memset(p, 1, 3 * MiB);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_then_malloc_3, p), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(lstats().live_blocks, live);
    expect_free_abort(do_free_once, p, "double free");
}

/* The owner's malloc and free (plain loads and stores) against the ager and
 * malloc_trim taking its cache from under it: no mapping is handed out
 * twice (each block's bytes stay its own), none is lost (after a trim
 * nothing is cached, nothing live). */
#define TC_RACE_OPS 2000
static _Atomic bool tc_race_done;
static void *tc_race_owner(void *arg) {
    (void)arg;
    uint8_t *slot[4] = {0};
    size_t len[4] = {0};
    uint32_t rng = 12345;
    for (int i = 0; i < TC_RACE_OPS; i++) {
        rng = rng * 1103515245u + 12345u;
        uint32_t k = (rng >> 16) % 4;
        if (slot[k]) {
            for (size_t j = 0; j < len[k]; j += 4096)
                assert_int_equal(slot[k][j], (uint8_t)(k + 1));
            free(slot[k]);
        }
        len[k] = MiB + (rng >> 8) % (3 * MiB);
        slot[k] = malloc(len[k]);
        assert_non_null(slot[k]);
        for (size_t j = 0; j < len[k]; j += 4096)
            slot[k][j] = (uint8_t)(k + 1);
    }
    for (int k = 0; k < 4; k++)
        free(slot[k]);
    atomic_store(&tc_race_done, true);
    return NULL;
}

static void test_thread_cache_owner_races_ager_and_trim(void **state) {
    (void)state;
    hak_cfg.age_ms = 1;
    uint64_t live = lstats().live_blocks;
    atomic_store(&tc_race_done, false);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, tc_race_owner, NULL), 0);
    for (unsigned i = 0; !atomic_load(&tc_race_done); i++) {
        if (i % 8 == 0)
            malloc_trim(0);
        else
            large_age_next();
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    hak_cfg.age_ms = 60000;
    malloc_trim(0);
    struct large_stats s = lstats();
    assert_int_equal(s.live_blocks, live);
    assert_int_equal(s.cached_blocks, 0);
}

/* In a fork child, the caches of the parent's other threads (which the
 * child does not have) go to the BigCache: the child's own mallocs reuse
 * their mappings. (They stayed in records no thread of the child owned.) */
static void child_reuses_other_threads_cache(void *arg) {
    uint64_t maps = os_calls(OS_MMAP);
    void *q = malloc(3 * MiB);
    CHILD_CHECK(q == arg);
    CHILD_CHECK(os_calls(OS_MMAP) == maps);
    free(q);
}

static void test_fork_child_gets_other_threads_caches(void **state) {
    (void)state;
    uint8_t *p = NULL;
    pthread_t t;
    idler_start(&t, &p); /* p is in t's cache */
    expect_clean_exit(child_reuses_other_threads_cache, p);
    idler_stop(t);
}

/* Signal handlers that call the allocator while the thread they interrupt
 * is inside it, with a thread sending signals as fast as it can. */
static pthread_t sig_target;
static _Atomic bool sig_stop;

static void sig_trim(int sig) {
    (void)sig;
    malloc_trim(0);
}

static void sig_malloc(int sig) {
    (void)sig;
    char *volatile p = malloc(2 * MiB);
    free(p);
}

static void *sig_sender(void *arg) {
    (void)arg;
    while (!atomic_load(&sig_stop)) {
        pthread_kill(sig_target, SIGUSR1);
        for (volatile int i = 0; i < 2000; i++)
            ;
    }
    return NULL;
}

struct sig_case {
    void (*handler)(int);
    bool ageing; /* the thread makes the ageing pass too, an age of 1 ms */
};

static void in_handler_child(void *arg) {
    const struct sig_case *c = arg;
    struct sigaction sa = {.sa_handler = c->handler};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    CHILD_CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    if (c->ageing) hak_cfg.age_ms = 1;
    sig_target = pthread_self();
    free(malloc(2 * MiB)); /* this thread's cache claimed */
    pthread_t t;
    CHILD_CHECK(pthread_create(&t, NULL, sig_sender, NULL) == 0);
    int64_t end = now_ms() + 1500;
    while (now_ms() < end) {
        char *volatile p = malloc(2 * MiB);
        CHILD_CHECK(p != NULL);
        p[0] = 1;
        free(p);
        if (c->ageing) large_age_next();
    }
    atomic_store(&sig_stop, true);
    pthread_join(t, NULL);
    _exit(0);
}

/* malloc_trim in a handler that interrupts the thread inside its own
 * cache's take or put: the trim does not wait for the thread's own record
 * (busy until the handler returns: it waited forever, holding the drain
 * lock every ager then spun on). */
static void test_trim_in_handler_inside_own_cache(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    /* ThreadSanitizer's runtime defers signals and takes its own locks in
     * malloc_trim: it deadlocks on itself under the signal flood. */
    skip();
#endif
    expect_clean_exit(in_handler_child, &(struct sig_case){sig_trim, false});
}

/* A malloc in a handler that interrupts the thread's own ageing pass over
 * the threads' caches (an age under 4 ms makes every BigCache call look):
 * it does not wait for the drain lock the thread holds (it spun forever). */
static void test_malloc_in_handler_inside_own_ageing(void **state) {
    (void)state;
#ifdef HAK_TEST_TSAN
    skip(); /* (as above) */
#endif
    expect_clean_exit(in_handler_child, &(struct sig_case){sig_malloc, true});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_free_malloc_cycle_makes_no_syscall, reset),
        cmocka_unit_test_setup(test_cache_reuse_is_zeroed_for_calloc, reset),
        cmocka_unit_test_setup(test_cache_respects_byte_bound, reset),
        cmocka_unit_test_setup(test_bigcache_shards_serve_each_other, reset),
        cmocka_unit_test_setup(test_bigcache_bound_holds_over_all_shards, reset),
        cmocka_unit_test_setup(test_bigcache_put_keeps_its_own, reset),
        cmocka_unit_test_setup(test_bigcache_bound_holds_for_puts_at_once, reset),
        cmocka_unit_test_setup(test_bigcache_other_shards_age, reset),
        cmocka_unit_test_setup(test_realloc_moves_pages_not_bytes, reset),
        cmocka_unit_test_setup(test_aligned_large_blocks, reset),
        cmocka_unit_test_setup(test_trim_releases_cache_and_mallinfo_counts, reset),
        cmocka_unit_test_setup(test_zero_size_big_alignment_owns_its_byte, reset),
        cmocka_unit_test_setup(test_successful_realloc_leaves_errno, reset),
        cmocka_unit_test_setup(test_cache_bounds_entries, reset),
        cmocka_unit_test_setup(test_unused_entries_decommitted_then_unmapped, reset),
        cmocka_unit_test_setup(test_calloc_over_an_old_colour_is_zero, reset),
        cmocka_unit_test_setup(test_hugepages_option, reset),
        cmocka_unit_test_setup(test_bigger_entry_split_keeps_its_pages, reset),
        cmocka_unit_test_setup(test_smaller_entry_grown_keeps_its_pages, reset),
        cmocka_unit_test_setup(test_eviction_of_the_whole_cache, reset),
        cmocka_unit_test_setup(test_locked_entries_not_reported_decommitted, reset),
        cmocka_unit_test_setup(test_realloc_grown_block_grows_in_place, reset),
        cmocka_unit_test_setup(test_realloc_trims_only_when_asked_for_less, reset),
        cmocka_unit_test_setup(test_blocks_side_by_side_get_colours, reset),
        cmocka_unit_test_setup(test_growing_blocks_bounded, reset),
        cmocka_unit_test_setup(test_growing_block_from_cache_makes_no_syscall, reset),
        cmocka_unit_test_setup(test_merged_entry_is_newest, reset),
        cmocka_unit_test_setup(test_refused_hugepages_not_recorded, reset),
        cmocka_unit_test_setup(test_growing_block_pages_come_in_ahead, reset),
        cmocka_unit_test_setup(test_growing_block_big_steps_populate_nothing, reset),
        cmocka_unit_test_setup(test_growing_block_from_split_entry_stays_in_its_part, reset),
        cmocka_unit_test_setup(test_refused_populate_asked_once_per_window, reset),
        cmocka_unit_test_setup(test_split_rest_of_a_moved_block_still_checked, reset),
        cmocka_unit_test_setup(test_realloc_copy_keeps_errno, reset),
        cmocka_unit_test_setup(test_parts_of_two_mappings_do_not_merge, reset),
        cmocka_unit_test_setup(test_small_pages_entry_gets_huge_pages, reset),
        cmocka_unit_test_setup(test_guard_page_after_every_block, reset),
        cmocka_unit_test_setup(test_guard_page_by_mprotect, reset),
        cmocka_unit_test_setup(test_refused_guard_calls, reset),
        cmocka_unit_test_setup(test_sampled_small_mapping_comes_back_without_syscalls, reset),
        cmocka_unit_test_setup(test_sampled_spares_bounded_counted_and_trimmed, reset),
        cmocka_unit_test_setup(test_double_free_of_a_spare_is_caught, reset),
        cmocka_unit_test_setup(test_sampled_small_mappings_bounded_and_counted_out, reset),
        cmocka_unit_test_setup(test_thread_counts_published_at_exit, reset),
        cmocka_unit_test_setup(test_big_block_of_another_thread_counted_at_once, reset),
        cmocka_unit_test_setup(test_thread_cache_is_the_threads_own, tc_reset),
        cmocka_unit_test_setup(test_thread_cache_bounded, tc_reset),
        cmocka_unit_test_setup(test_idle_thread_cache_ages, tc_reset),
        cmocka_unit_test_setup(test_thread_cache_to_bigcache_at_exit, tc_reset),
        cmocka_unit_test_setup(test_trim_empties_every_thread_cache, tc_reset),
        cmocka_unit_test_setup(test_thread_cache_double_free_caught, tc_reset),
        cmocka_unit_test_setup(test_thread_caches_leave_the_bigcache_its_share, tc_reset),
        cmocka_unit_test_setup(test_cross_thread_free_to_the_freers_cache, tc_reset),
        cmocka_unit_test_setup(test_trim_in_handler_inside_own_cache, tc_reset),
        cmocka_unit_test_setup(test_malloc_in_handler_inside_own_ageing, tc_reset),
        cmocka_unit_test_setup(test_thread_cache_owner_races_ager_and_trim, tc_reset),
        cmocka_unit_test_setup(test_fork_child_gets_other_threads_caches, tc_reset),
        cmocka_unit_test_setup(test_taken_thread_cache_to_its_owners_shard, tc_reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
