/* L2.5 tier: bundle geometry and the block index, the thread cache in front
 * (capped, spilled, returned at exit and on trim), shards, exact double-free
 * detection, decommit of empty bundles and of free blocks, and the uncached
 * blocks it serves for the other tiers' classes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/clock.h"
#include "box/config.h"
#include "box/os.h"
#include "death.h"
#include "l25/l25.h"
#include "maps.h"
#include "pool.h"

#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

static struct l25_stats stats(void) {
    struct l25_stats s;
    l25_get_stats(&s);
    return s;
}

static struct l25_bundle *bundle_of(const void *p) {
    uint32_t e = rmap_get(p);
    assert_int_equal(rmap_kind_of(e), TIER_L25);
    return l25_bundle_of(e);
}

static void run_in_thread(void *(*fn)(void *), void *arg) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

/* Thread bodies of the bundle-reuse tests (arg: the bundles seen). */
struct reuse_seen {
    uint8_t *a[8]; /* the bundles of the first size's blocks */
    uint32_t na;
    bool all_reused; /* every block of the second size in one of them */
    uint64_t mapped; /* bundles mapped during the second size's blocks */
};

static bool seen_in(const struct reuse_seen *r, const uint8_t *base) {
    for (uint32_t i = 0; i < r->na; i++)
        if (r->a[i] == base) return true;
    return false;
}

static void *pinned_then_other_size(void *arg) {
    struct reuse_seen *r = arg;
    enum { A = 256 << 10, B = 192 << 10 }; /* 7 and 10 a 2 MiB bundle */
    static void *p[56], *q[80];
    for (int i = 0; i < 56; i++) {
        p[i] = malloc(A);
        memset(p[i], 1, A);
        uint8_t *base = bundle_of(p[i])->base;
        if (!seen_in(r, base)) {
            assert_true(r->na < 8);
            r->a[r->na++] = base;
        }
    }
    assert_int_equal(r->na, 8);
    /* Every bundle's blocks but one first, then the one of each: the thread
     * cache keeps the last ones freed, each in a bundle of its own. */
    bool last[56] = {false};
    for (uint32_t k = 0; k < r->na; k++)
        for (int i = 0; i < 56; i++)
            if (bundle_of(p[i])->base == r->a[k]) {
                last[i] = true;
                break;
            }
    for (int i = 0; i < 56; i++)
        if (!last[i]) free(p[i]);
    for (int i = 0; i < 56; i++)
        if (last[i]) free(p[i]);
    uint64_t mapped = stats().bundles_mapped;
    r->all_reused = true;
    for (int i = 0; i < 80; i++) {
        q[i] = malloc(B);
        memset(q[i], 2, B);
        r->all_reused &= seen_in(r, bundle_of(q[i])->base);
    }
    r->mapped = stats().bundles_mapped - mapped;
    for (int i = 0; i < 80; i++)
        free(q[i]);
    return NULL;
}

/* Blocks of one size freed, then as many bytes of another size (same
 * bundle span) asked for: the second size gets the first one's bundles,
 * even when the thread's cache still holds a block of each (before, those
 * few blocks kept every bundle from being empty, and new ones were mapped:
 * bench_burst's peak RSS 1.8x its live bytes). */
static void test_cached_blocks_do_not_pin_bundles(void **state) {
    (void)state;
    malloc_trim(0); /* (no empty bundle or spare of an earlier test to take first) */
    struct reuse_seen r = {0};
    run_in_thread(pinned_then_other_size, &r);
    assert_true(r.all_reused);
    assert_int_equal(r.mapped, 0);
}

#if !defined(HAK_TEST_TSAN) && !defined(__SANITIZE_ADDRESS__)
/* The child of test_locked_bundle_recut_keeps_state: the old blocks' bytes
 * (L25_LIVE throughout) must not become the state bytes of a recut
 * bundle's blocks. */
static void locked_recut_child(void *arg) {
    (void)arg;
    if (!maps_mlockall(MCL_CURRENT | MCL_FUTURE)) _exit(77); /* not allowed here */
    hak_cfg.age_ms = 1;
    enum { A = 256 << 10, B = 192 << 10, N = 64 }; /* 7 and 10 a 2 MiB bundle */
    static void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = malloc(A);
        CHILD_CHECK(p[i] != NULL);
        memset(p[i], L25_LIVE, A);
    }
    for (int i = 0; i < N; i++)
        free(p[i]);
    l25_thread_flush();
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    l25_thread_age(); /* their decommit refused: the pages are locked */
    uint8_t *q = malloc(B);
    CHILD_CHECK(q != NULL);
    struct l25_bundle *b = bundle_of(q);
    /* A block of the recut bundle not handed out (past the refill's), whose
     * state byte lies where an old block's bytes were. */
    uint32_t a_stride = (A + 64), refill = 8;
    for (uint32_t i = b->first + refill; i < b->nblocks; i++) {
        size_t mark = (size_t)(l25_mark(b, i) - b->base);
        if (mark / a_stride >= 7 || mark % a_stride >= (size_t)A) continue;
        do_free(b->base + (size_t)i * b->stride); /* never handed out: must abort */
        _exit(0);
    }
    _exit(78);
}

/* Under mlockall a bundle's decommit is refused and its pages keep their
 * bytes. It was taken as decommitted all the same, so a recut for another
 * class left the old blocks' bytes as its blocks' state bytes: a free of a
 * block never handed out passed as a live one's (and put it into the cache
 * while its bundle held it free too). */
static void test_locked_bundle_recut_keeps_state(void **state) {
    (void)state;
    struct death d;
    run_child(locked_recut_child, NULL, &d);
    assert_not_hung(&d);
    if (WIFEXITED(d.status) && WEXITSTATUS(d.status) == 77) skip();
    if (WIFEXITED(d.status))
        fail_msg("free of a block never handed out passed (exit %d): %s", WEXITSTATUS(d.status),
                 d.err);
    assert_aborted(&d);
    assert_non_null(strstr(d.err, "hakmem: free(): double free"));
}
#endif

static void test_bundle_geometry(void **state) {
    (void)state;
    for (uint32_t cls = L25_FIRST; cls < SMALL_NCLASSES; cls++) {
        size_t size = small_class_size[cls];
        uint8_t *p = malloc(size);
        struct l25_bundle *b = bundle_of(p);
        assert_int_equal(b->cls, cls);
        /* Blocks a cache line more than their size apart; at least 4 a
         * bundle, the bundle the smallest of 2, 4, 8 MiB that holds them. */
        assert_int_equal(b->stride, size + 64);
        assert_true(b->nblocks >= 4);
        assert_true(b->span == 2u << 20 || b->span / 2 < 4 * b->stride);
        assert_int_equal(b->nblocks, b->span / b->stride);
        assert_int_equal((uintptr_t)b->base % (2u << 20), 0);
        assert_int_equal(b->first, 0);
        /* Every block start is one, nothing else is: the division without a
         * divide is exact over the whole span. */
        for (size_t off = 0; off < b->span; off += 16) {
            int64_t i = l25_index(b, b->base + off);
            if (off % b->stride == 0 && off / b->stride < b->nblocks)
                assert_int_equal(i, (int64_t)(off / b->stride));
            else
                assert_int_equal(i, -1);
        }
        assert_int_equal(malloc_usable_size(p), size);
        free(p);
    }
}

static void test_blocks_coloured_aligned_ones_not(void **state) {
    (void)state;
    /* Consecutive blocks start at different offsets in their pages... */
    uint8_t *b[4];
    for (int i = 0; i < 4; i++)
        b[i] = malloc(256 << 10);
    int offsets = 0;
    for (int i = 0; i < 4; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= ((uintptr_t)b[i] & 4095) == ((uintptr_t)b[j] & 4095);
        offsets += !seen;
    }
    assert_true(offsets >= 3);
    /* ...but aligned requests get blocks at multiples of their size. */
    void *a[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(posix_memalign(&a[i], 65536, 200000), 0);
        assert_int_equal((uintptr_t)a[i] % 65536, 0);
        assert_int_equal(bundle_of(a[i])->stride, small_class_size[small_class_of(262144)]);
    }
    for (int i = 0; i < 4; i++) {
        free(b[i]);
        free(a[i]);
    }
}

static void test_cache_capped_and_spills(void **state) {
    (void)state;
    enum { N = 64 };
    void *blocks[N];
    uint32_t cls = small_class_of(100000);
    for (int i = 0; i < N; i++)
        blocks[i] = malloc(100000);
    uint64_t before = stats().flushes;
    for (int i = 0; i < N; i++)
        free(blocks[i]);
    assert_true(tc_count(cls) <= small_class_cap[cls]);
    assert_true(stats().flushes >= before + N - small_class_cap[cls]);
}

static void *alloc_free_and_exit(void *arg) {
    size_t n = (size_t)(uintptr_t)arg;
    void *b[50];
    for (int i = 0; i < 50; i++)
        b[i] = malloc(n);
    for (int i = 0; i < 50; i++)
        free(b[i]);
    assert_true(tc_count(small_class_of(n)) > 0);
    return NULL;
}

static void test_thread_exit_returns_cache(void **state) {
    (void)state;
    l25_thread_flush(); /* this thread's cache out of the count */
    uint64_t out = stats().carved_bytes;
    run_in_thread(alloc_free_and_exit, (void *)(uintptr_t)70000);
    /* Every block the thread took is back in its bundle. */
    assert_int_equal(stats().carved_bytes, out);
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
    l25_thread_flush();
    uint64_t out = stats().carved_bytes;
    void *b[50];
    for (int i = 0; i < 50; i++)
        b[i] = malloc(70000);
    run_in_thread(free_only, b);
    assert_int_equal(stats().carved_bytes, out);
}

static void *free_all(void *arg) {
    void **b = arg;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(((uint8_t *)b[i])[59999], (uint8_t)i);
        free(b[i]);
    }
    return NULL;
}

static void test_cross_thread_free_and_reuse(void **state) {
    (void)state;
    void *b[100];
    for (int i = 0; i < 100; i++) {
        b[i] = malloc(60000);
        memset(b[i], i, 60000);
    }
    uint64_t mapped = stats().bundles_mapped;
    run_in_thread(free_all, b);
    /* Freed elsewhere, those blocks are back in their bundles: allocating
     * as many again takes no new bundle. */
    void *c[100];
    for (int i = 0; i < 100; i++)
        c[i] = malloc(60000);
    assert_int_equal(stats().bundles_mapped, mapped);
    for (int i = 0; i < 100; i++)
        free(c[i]);
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

static void test_double_free_cached(void **state) {
    (void)state;
    /* The first free puts the block in the cache; the second must still be
     * caught (the live bit, not the cache head). */
    void *p = malloc(200000), *q = malloc(200000);
    expect_free_abort(do_double_free, p, "double free");
    free(q);
    free(p);
}

static void free_two_then_first(void *arg) {
    void **b = arg;
    free(b[0]);
    free(b[1]); /* b[0] is no longer the cache head */
    free(b[0]);
}

static void test_double_free_not_at_head(void **state) {
    (void)state;
    void *b[2] = {malloc(300000), malloc(300000)};
    char line[160];
    snprintf(line, sizeof line, "hakmem: free(): double free %p", b[0]);
    expect_death(free_two_then_first, b, line);
    free(b[0]);
    free(b[1]);
}

static void test_interior_and_tail_rejected(void **state) {
    (void)state;
    uint8_t *p = malloc(600000); /* 640 KiB class: 6 blocks in 4 MiB */
    struct l25_bundle *b = bundle_of(p);
    assert_int_equal(b->nblocks, 6);
    expect_free_abort(do_free, p + 4096, "invalid pointer");
    expect_free_abort(do_free, p + 655360, "invalid pointer"); /* one size on: in the pad */
    /* Where a 7th block would start: the unused tail of the bundle. */
    expect_free_abort(do_free, b->base + 6 * (size_t)b->stride, "invalid pointer");
    free(p);
}

static size_t resident_blocks(uint8_t **b, int n, size_t size) {
    size_t r = 0;
    for (int i = 0; i < n; i++)
        r += maps_resident(b[i]) && maps_resident(b[i] + size - 1);
    return r;
}

/* One attempt at the age hak_cfg.age_ms: NULL when judged, else
 * (the machine too slow or busy for the age: see below) not. */
static void *bundle_cycle(void *arg) {
    (void)arg;
    uint64_t age = hak_cfg.age_ms;
    /* 256 KiB blocks, 7 a bundle (the stride is 256 KiB + 64): four
     * bundles. */
    enum { N = 24 };
    uint8_t *b[N];
    struct l25_stats s0 = stats();
    for (int i = 0; i < N; i++) {
        b[i] = malloc(256 << 10);
        memset(b[i], 0xab, 256 << 10);
    }
    assert_true(stats().bundles_mapped >= s0.bundles_mapped + 3);
    uint64_t f0 = hak_now_ms(); /* (the tier's clock) */
    for (int i = 0; i < N; i++)
        free(b[i]);
    l25_thread_flush(); /* what the cache held, too */
    /* Empty bundles stay committed for a while (a cycle like this one makes
     * no syscall), then are decommitted when their shard is next used. The
     * first holds only if the frees and this look took less than the age:
     * on a slow or busy machine they may not have, and the caller tries
     * again with a longer age. */
    uint64_t early = stats().decommits;
    if (hak_now_ms() - f0 >= age) return (void *)1;
    assert_int_equal(early, s0.decommits);
    long nap = (long)age * 3 / 2;
    struct timespec ts = {nap / 1000, nap % 1000 * 1000000};
    nanosleep(&ts, NULL);
    free(malloc(256 << 10)); /* the shard looks at the ages */
    l25_thread_flush();
    assert_true(stats().decommits >= s0.decommits + 2);
    assert_true(resident_blocks(b, N, 256 << 10) <= 8);
    /* Decommitted bundles are reused before new ones are mapped. */
    uint64_t mapped = stats().bundles_mapped;
    for (int i = 0; i < N; i++)
        b[i] = malloc(256 << 10);
    assert_int_equal(stats().bundles_mapped, mapped);
    int fresh = 0;
    for (int i = 0; i < N; i++) {
        fresh += b[i][4096] == 0; /* decommitted: fresh pages */
        free(b[i]);
    }
    assert_true(fresh >= N - 8);
    return NULL;
}

static void test_empty_bundles_decommitted(void **state) {
    (void)state;
    uint64_t age = hak_cfg.age_ms;
    /* From 40 ms, twice as long each time the machine was too slow. */
    bool judged = false;
    for (int i = 0; i < 6 && !judged; i++) {
        hak_cfg.age_ms = (uint64_t)40 << i;
        pthread_t t;
        void *missed;
        assert_int_equal(pthread_create(&t, NULL, bundle_cycle, NULL), 0);
        assert_int_equal(pthread_join(t, &missed), 0);
        judged = missed == NULL;
        if (!judged) {
            print_message("age %llu ms: the frees took longer: again with twice the age\n",
                          (unsigned long long)hak_cfg.age_ms);
            malloc_trim(0); /* (the empty bundles unmapped: the next cycle maps its own) */
        }
    }
    hak_cfg.age_ms = age;
    if (!judged) fail_msg("the machine was too slow or busy for every age tried (to 1.28 s)");
}

static void *partial_trim(void *arg) {
    (void)arg;
    enum { N = 8 };
    uint8_t *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(256 << 10);
        memset(b[i], 0xcd, 256 << 10);
    }
    for (int i = 1; i < N; i++)
        free(b[i]);
    malloc_trim(0);
    /* The bundle keeps b[0] live; the others' pages are gone. */
    assert_true(maps_resident(b[0]) && maps_resident(b[0] + (256 << 10) - 1));
    assert_int_equal(resident_blocks(b + 1, N - 1, 256 << 10), 0);
    assert_int_equal(b[0][12345], 0xcd);
    free(b[0]);
    return NULL;
}

static void test_trim_decommits_free_blocks(void **state) {
    (void)state;
    run_in_thread(partial_trim, NULL);
}

static void test_trim_unmaps_empty_bundles(void **state) {
    (void)state;
    void *b[16];
    for (int i = 0; i < 16; i++)
        b[i] = malloc(150000);
    for (int i = 0; i < 16; i++)
        free(b[i]);
    malloc_trim(0);
    struct l25_stats s = stats();
    /* Nothing is out: every bundle went back. */
    assert_int_equal(s.carved_bytes, 0);
    assert_int_equal(s.bytes_mapped, 0);
    assert_int_equal(s.bundles_mapped, s.bundles_unmapped);
}

static void *one_block_freed(void *arg) {
    void **out = arg;
    size_t n = (size_t)(uintptr_t)out[0];
    uint8_t *p = malloc(n);
    memset(p, 0xab, n);
    out[1] = bundle_of(p)->base;
    free(p); /* the bundle is empty once this thread's cache goes back */
    return NULL;
}

static void *one_block_of_other_class(void *arg) {
    void **out = arg;
    size_t n = (size_t)(uintptr_t)out[0];
    uint8_t *p = malloc(n);
    struct l25_bundle *b = bundle_of(p);
    assert_int_equal(b->cls, small_class_of(n));
    assert_int_equal(b->stride, small_class_size[b->cls] + 64);
    assert_int_equal(b->navail, b->nblocks - 1 - (tc_count(b->cls)));
    memset(p, 0xcd, n);
    out[1] = b->base;
    /* The pages the other class wrote past this block (its first block
     * was 420000 bytes) are free memory now, which trim gives back. */
    assert_true(maps_resident(b->base + 400000));
    malloc_trim(0);
    assert_false(maps_resident(b->base + 400000));
    assert_int_equal(p[n - 1], 0xcd);
    free(p);
    return NULL;
}

/* A committed empty bundle of one class serves another class with the same
 * span (a burst of other sizes after a burst of frees reuses their pages:
 * bench_burst faulted its memory in again every round). */
static void test_empty_bundle_serves_other_class(void **state) {
    (void)state;
    malloc_trim(0);
    void *a[2] = {(void *)(uintptr_t)420000, NULL}, *b[2] = {(void *)(uintptr_t)310000, NULL};
    assert_int_not_equal(small_class_of(420000), small_class_of(310000));
    run_in_thread(one_block_freed, a);
    uint64_t mapped = stats().bundles_mapped;
    run_in_thread(one_block_of_other_class, b);
    assert_ptr_equal(b[1], a[1]);
    assert_int_equal(stats().bundles_mapped, mapped);
}

static pthread_barrier_t both_live;

static void *grab(void *arg) {
    void **out = arg;
    *out = malloc(90000);
    pthread_barrier_wait(&both_live); /* neither exits (handing its heap on) before both took */
    return NULL;
}

static void test_threads_own_their_bundles(void **state) {
    (void)state;
    void *a, *b;
    pthread_t t1, t2;
    /* Two live threads draw from heaps of their own, hence from different
     * bundles. */
    pthread_barrier_init(&both_live, NULL, 2);
    pthread_create(&t1, NULL, grab, &a);
    pthread_create(&t2, NULL, grab, &b);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    pthread_barrier_destroy(&both_live);
    struct l25_bundle *ba = bundle_of(a), *bb = bundle_of(b);
    assert_ptr_not_equal(ba->owner, bb->owner);
    assert_ptr_not_equal(ba->owner, L25_SHARED);
    assert_ptr_not_equal(ba, bb);
    free(a);
    free(b);
}

static void test_uncached_blocks_of_other_classes(void **state) {
    (void)state;
    /* Tiny and Pool classes served here (a thread that may not cache, or
     * past a full SuperSlab range) keep their bitmaps in their first blocks. */
    uint32_t classes[] = {0, 5, 19, 27, POOL_FIRST, POOL_END - 1};
    for (size_t k = 0; k < sizeof classes / sizeof classes[0]; k++) {
        uint32_t cls = classes[k];
        size_t size = small_class_size[cls];
        uint8_t *p = l25_alloc_uncached(cls);
        assert_non_null(p);
        struct l25_bundle *b = bundle_of(p);
        /* Bitmaps in the first blocks when they do not fit inline. */
        assert_int_equal(b->first > 0, b->nblocks > 64);
        assert_true(p >= b->base + (size_t)b->first * size);
        assert_int_equal(malloc_usable_size(p), size);
        memset(p, 0x5a, size);
        uint8_t *q = l25_alloc_uncached(cls);
        assert_ptr_not_equal(p, q);
        if (b->first) expect_free_abort(do_free, b->base, "invalid pointer"); /* the bitmaps */
        free(p);
        expect_free_abort(do_free, p, "double free");
        /* Not cached: the block is back in its bundle, the next to go out. */
        assert_ptr_equal(l25_alloc_uncached(cls), p);
        free(p);
        free(q);
    }
}

#ifndef HAK_TEST_TSAN /* TSan has terabytes reserved: no limit can be set */
/* Bytes of address space this process has mapped (statm's first field). */
static size_t mapped_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    size_t pages = 0;
    if (f == NULL || fscanf(f, "%zu", &pages) != 1) pages = 0;
    if (f) fclose(f);
    return pages * (size_t)sysconf(_SC_PAGESIZE);
}

/* A program that lowers its address-space limit and allocates at once gets
 * what the limit leaves: the tier's sizes and the reservations kept are
 * decided on the limit as it is now (read with a 10 ms old value, the same
 * child got 586-911 MiB of 1 GiB, reservations kept as if there were no
 * limit; 939 reading it each time). In a child: the limit is its own. */
static void test_limit_set_then_allocate_gets_it_all(void **state) {
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        free(malloc(100000));
        struct rlimit lim = {mapped_now() + ((size_t)1 << 30), RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(2);
        size_t got = 0;
        void *prev = NULL;
        uint64_t rng = 42;
        for (;;) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t n = (53 << 10) + (size_t)(rng >> 33) % (971 << 10);
            void **p = malloc(n);
            if (p == NULL) break;
            memset(p, 1, 4096);
            *p = prev;
            prev = p;
            got += n;
        }
        _exit(got >= (size_t)870 << 20 ? 0 : 1); /* 85% of the 1 GiB */
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}
#endif

static void test_growing_realloc_leaves_room(void **state) {
    (void)state;
    /* A block grown past 4 KiB becomes a Large block with room to grow in
     * place to its region's end (test_large.c). */
    uint8_t *p = malloc(40000);
    memset(p, 0x21, 40000);
    p = realloc(p, 70000);
    assert_int_equal(rmap_kind_of(rmap_get(p)), TIER_LARGE);
    assert_true(malloc_usable_size(p) >= 70000);
    assert_int_equal(p[39999], 0x21);
    assert_ptr_equal(realloc(p, 1000000), p); /* in its room */
    assert_int_equal(p[39999], 0x21);
    free(p);
#ifndef HAK_TEST_TSAN /* TSan has terabytes reserved: no limit can be set */
    /* Refused that (here: under an address-space limit, which fresh room
     * would eat into, and no cached mapping to take), a block grown into
     * this tier gets room for half as much again, so the next growth step
     * of a buffer stays in place. */
    malloc_trim(0);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    lim = old;
    if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > ((rlim_t)1 << 40))
        lim.rlim_cur = (rlim_t)1 << 40; /* a limit nothing here comes near */
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_cur > lim.rlim_max) lim.rlim_cur = lim.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
    p = malloc(40000);
    memset(p, 0x21, 40000);
    p = realloc(p, 70000);
    assert_true(malloc_usable_size(p) >= 105000);
    uint8_t *q = realloc(p, 105000);
    assert_ptr_equal(q, p);
    for (size_t k = 0; k < 40000; k += 997)
        assert_int_equal(q[k], 0x21);
    /* Near the top of the tier, the room stops at 1 MiB; past it, a Large
     * block. */
    q = realloc(q, 900000);
    assert_int_equal(malloc_usable_size(q), 1u << 20);
    assert_int_equal(q[39999], 0x21);
    q = realloc(q, 3u << 20);
    assert_int_equal(rmap_kind_of(rmap_get(q)), TIER_LARGE);
    assert_int_equal(q[39999], 0x21);
    free(q);
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
#endif
    /* A malloc of the same size gets no room. */
    void *r = malloc(70000);
    assert_int_equal(malloc_usable_size(r), small_class_size[small_class_of(70000)]);
    free(r);
}

static void *boundary_trim(void *arg) {
    (void)arg;
    enum { N = 8 };
    uint8_t *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = malloc(256 << 10);
        memset(b[i], 0x5e, 256 << 10);
    }
    /* Every other block freed and trimmed, then the rest: the pages two
     * blocks share must go too once both are free. b[0] stays live, so the
     * bundle is not unmapped, which would hide a page left behind. */
    for (int i = 1; i < N; i += 2)
        free(b[i]);
    malloc_trim(0);
    for (int i = 0; i < N; i += 2)
        assert_true(maps_resident(b[i]));
    for (int i = 2; i < N; i += 2)
        free(b[i]);
    uint8_t *first = b[0];
    malloc_trim(0);
    /* (b[1]'s first page is b[0]'s last: b[0] is still live.) */
    for (int i = 1; i < N; i++) {
        if (i > 1) assert_false(maps_resident(b[i]));
        assert_false(maps_resident(b[i] + (256 << 10) - 1));
    }
    free(first);
    return NULL;
}

static void test_trim_decommits_shared_pages_later(void **state) {
    (void)state;
    run_in_thread(boundary_trim, NULL);
}

static void *churn(void *arg) {
    (void)arg;
    enum { N = 90 };
    void *b[N];
    for (int round = 0; round < 150; round++) {
        int n = 10 + (round * 7) % (N - 10); /* working sets of 10 .. 89 blocks */
        for (int i = 0; i < n; i++) {
            b[i] = malloc(60000 + (size_t)(i % 3) * 70000);
            ((uint8_t *)b[i])[0] = (uint8_t)i;
        }
        for (int i = 0; i < n; i++) {
            if (((uint8_t *)b[i])[0] != (uint8_t)i) abort();
            free(b[i]);
        }
        l25_thread_flush();
    }
    return NULL;
}

static void test_concurrent_empty_bundles(void **state) {
    (void)state;
    /* Threads empty and refill bundles of shared shards while empty ones
     * age out within a millisecond: decommits, parks and unmaps race with
     * takes. Afterwards every bundle is accounted for. */
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 1;
    pthread_t t[6];
    for (int i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, NULL), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    hak_cfg.age_ms = age;
    malloc_trim(0);
    struct l25_stats st = stats();
    assert_int_equal(st.carved_bytes, 0);
    assert_int_equal(st.bytes_mapped, 0);
    assert_int_equal(st.bundles_mapped, st.bundles_unmapped);
}

static void *free_it(void *p) {
    free(p);
    return NULL;
}

static void free_elsewhere_then_here(void *p) {
    run_in_thread(free_it, p); /* onto the owner's remote stack */
    free(p);
}

static void free_here_then_elsewhere(void *p) {
    free(p);
    run_in_thread(free_it, p);
}

/* A block freed by a thread other than its owner's is caught when freed
 * again, by either. */
static void test_double_free_remote(void **state) {
    (void)state;
    void *p = malloc(200000);
    char line[160];
    snprintf(line, sizeof line, "hakmem: free(): double free %p", p);
    expect_death(free_elsewhere_then_here, p, line);
    expect_death(free_here_then_elsewhere, p, line);
    free(p);
}

static void *owner_reuses(void *arg) {
    (void)arg;
    const size_t n = 300000; /* 6 blocks a bundle */
    void *p = malloc(n);
    struct l25_bundle *b = bundle_of(p);
    assert_ptr_not_equal(b->owner, L25_SHARED);
    uint32_t navail = b->navail;
    uint64_t mapped = stats().bundles_mapped;
    run_in_thread(free_it, p);
    /* On the owner's remote stack: the bundle has not seen it yet. */
    assert_int_equal(b->navail, navail);
    void *q[16];
    int k = 0;
    bool found = false;
    while (k < 16 && !found)
        found = (q[k++] = malloc(n)) == p; /* a refill drains first */
    for (int i = 0; i < k; i++)
        free(q[i]);
    assert_true(found);
    assert_int_equal(stats().bundles_mapped, mapped);
    return NULL;
}

static void test_remote_free_reused_by_owner(void **state) {
    (void)state;
    run_in_thread(owner_reuses, NULL);
}

static void *alloc_and_exit(void *arg) {
    void **b = arg;
    for (int i = 0; i < 20; i++)
        memset(b[i] = malloc(60000 + (size_t)i * 40000), i, 1000);
    b[20] = bundle_of(b[0])->owner;
    return NULL;
}

static void *owner_of_one(void *arg) {
    void **out = arg;
    void *p = malloc(60000);
    *out = bundle_of(p)->owner;
    free(p);
    return NULL;
}

/* A thread's heap outlives it: blocks it left out are freed to it later,
 * the next thread gets it (bundles and all), and malloc_trim takes back
 * everything, so nothing leaks. */
static void test_exited_heap_handed_on(void **state) {
    (void)state;
    malloc_trim(0);
    void *b[21];
    run_in_thread(alloc_and_exit, b);
    for (int i = 0; i < 20; i++) { /* frees to a heap no thread has */
        assert_int_equal(((uint8_t *)b[i])[999], (uint8_t)i);
        free(b[i]);
    }
    void *next = NULL;
    run_in_thread(owner_of_one, &next);
    assert_ptr_equal(next, b[20]);
    malloc_trim(0);
    struct l25_stats st = stats();
    assert_int_equal(st.carved_bytes, 0);
    assert_int_equal(st.bytes_mapped, 0);
    assert_int_equal(st.bundles_mapped, st.bundles_unmapped);
}

/* Each L2.5 class's cache holds 8 blocks: frees of 8 take no flush. */
static void test_cache_holds_eight(void **state) {
    (void)state;
    for (uint32_t cls = L25_FIRST; cls < SMALL_NCLASSES; cls++) {
        void *b[8];
        size_t n = small_class_size[cls];
        for (int i = 0; i < 8; i++)
            b[i] = malloc(n);
        l25_thread_flush();
        uint64_t flushes = stats().flushes;
        for (int i = 0; i < 8; i++)
            free(b[i]);
        assert_true(small_class_cap[cls] >= 8);
        assert_int_equal(tc_count(cls), 8);
        assert_int_equal(stats().flushes, flushes);
        l25_thread_flush();
    }
}

static void *empty_twelve_bundles(void *arg) {
    (void)arg;
    enum { N = 7 * 12 }; /* 256 KiB blocks, 7 a bundle */
    void *b[N];
    for (int i = 0; i < N; i++)
        b[i] = malloc(256 << 10);
    for (int i = 0; i < N; i++)
        free(b[i]);
    l25_thread_flush();
    return NULL;
}

/* Empty bundles past a heap's bound are spares any heap takes: the pages
 * one thread freed serve another's next burst, with no new mapping. */
static void test_spare_bundles_serve_other_heaps(void **state) {
    (void)state;
    malloc_trim(0);
    run_in_thread(empty_twelve_bundles, NULL);
    uint64_t mapped = stats().bundles_mapped;
    enum { N = 7 * 4 };
    void *b[N];
    for (int i = 0; i < N; i++)
        b[i] = malloc(256 << 10);
    assert_int_equal(stats().bundles_mapped, mapped);
    for (int i = 0; i < N; i++)
        free(b[i]);
    malloc_trim(0);
    assert_int_equal(stats().bytes_mapped, 0);
}

/* n blocks of 256 KiB (7 a bundle), written, into b; all freed. */
struct bundles_of {
    uint8_t **b;
    int n;
};

static void *empty_bundles(void *arg) {
    const struct bundles_of *o = arg;
    for (int i = 0; i < o->n; i++)
        memset(o->b[i] = malloc(256 << 10), 0x77, 256 << 10);
    for (int i = 0; i < o->n; i++)
        free(o->b[i]);
    return NULL;
}

/* The empty bundles of a thread that exited age out on other threads'
 * calls, with no background thread and no thread taking its heap. */
static void test_exited_threads_empty_bundles_age(void **state) {
    (void)state;
    malloc_trim(0);
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 40;
    uint8_t *b[21];
    uint64_t decommits = stats().decommits;
    run_in_thread(empty_bundles, &(struct bundles_of){b, 21});
    assert_true(resident_blocks(b, 21, 256 << 10) >= 14);
    uint64_t t0 = hak_now_ms();
    /* (Up to ten original ages, scaled for slow builds and machines:
     * tests/timing.h.) */
    uint64_t limit = (uint64_t)hak_test_limit_ms((int64_t)(10 * age));
    while (hak_now_ms() - t0 < limit && resident_blocks(b, 21, 256 << 10) > 0) {
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
        l25_age(); /* the tier's pass, when due: what any thread's calls make */
    }
    hak_cfg.age_ms = age;
    assert_int_equal(resident_blocks(b, 21, 256 << 10), 0);
    assert_true(stats().decommits >= decommits + 3);
    malloc_trim(0);
}

enum { THIRTY = 7 * 30 }; /* 256 KiB blocks, 7 a bundle */

/* The empty bundles of a thread that exited, and a live heap's past its
 * bound, keep their pages until they age: the next threads take them back
 * with no page fault and no new mapping (mimalloc's test-stress re-creates
 * its threads every round: with only the first 16 of an exiting thread's
 * kept and 48 of a live heap's, 350 000 more page faults, 1.9x mimalloc
 * 3.4's time). */
static void test_exited_threads_bundles_keep_pages(void **state) {
    (void)state;
    malloc_trim(0);
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 3600000; /* (no ageing while it runs) */
    static uint8_t *b[THIRTY];
    run_in_thread(empty_bundles, &(struct bundles_of){b, THIRTY});
    size_t resident = resident_blocks(b, THIRTY, 256 << 10);
    uint64_t mapped = stats().bundles_mapped;
    run_in_thread(empty_bundles, &(struct bundles_of){b, THIRTY});
    hak_cfg.age_ms = age;
    assert_int_equal(resident, THIRTY);
    assert_int_equal(stats().bundles_mapped, mapped);
    malloc_trim(0);
    assert_int_equal(stats().bytes_mapped, 0);
}

/* ...but no more than twice HAKMEM_BIGCACHE_MB of them: past that they go
 * decommitted, since a program whose calls then all hit the thread caches
 * never ages them (16 threads that freed 64 MiB each and exited kept 1.2
 * GiB for good). */
static void test_exited_threads_bundles_keep_bounded_pages(void **state) {
    (void)state;
    malloc_trim(0);
    uint64_t age = hak_cfg.age_ms;
    size_t bound = hak_cfg.bigcache_bytes;
    hak_cfg.age_ms = 3600000;                 /* (no ageing while it runs) */
    hak_cfg.bigcache_bytes = (size_t)8 << 20; /* 16 MiB of spares: 8 bundles */
    static uint8_t *b[THIRTY];
    run_in_thread(empty_bundles, &(struct bundles_of){b, THIRTY});
    size_t resident = resident_blocks(b, THIRTY, 256 << 10);
    hak_cfg.age_ms = age;
    hak_cfg.bigcache_bytes = bound;
    assert_true(resident <= 8 * 7);
    malloc_trim(0);
    assert_int_equal(stats().bytes_mapped, 0);
}

static pthread_barrier_t allocated, go_free;

/* Blocks of one size, their first bytes written with a pattern; freed (and
 * the thread gone) once told to. */
struct burst {
    size_t size;
    uint8_t pattern;
    bool wait; /* wait for go_free before freeing */
};

static void *burst_of(void *arg) {
    struct burst *o = arg;
    enum { N = 64 };
    void *b[N];
    for (int i = 0; i < N; i++)
        memset(b[i] = malloc(o->size), o->pattern, o->size);
    pthread_barrier_wait(&allocated);
    if (o->wait) pthread_barrier_wait(&go_free);
    for (int i = 0; i < N; i++)
        free(b[i]);
    return NULL;
}

static void *first_byte_of_one(void *arg) {
    uint8_t *p = malloc(256 << 10);
    *(uint8_t *)arg = p[4096]; /* (the first words held links while cached) */
    free(p);
    return NULL;
}

/* A spare of the class asked for is taken before one of another class with
 * the same span: its blocks lie where they were, on the pages the program
 * touched (recut, the next burst faulted fresh pages in: bench_threads ring
 * 64-512 KiB, 24 000 page faults against 17 000). */
static void test_spare_of_same_class_first(void **state) {
    (void)state;
    malloc_trim(0);
    struct burst y = {.size = 256 << 10, .pattern = 0x5a}, x = {200000, 0x3c, true};
    pthread_t ty, tx;
    pthread_barrier_init(&allocated, NULL, 3);
    pthread_barrier_init(&go_free, NULL, 2);
    pthread_create(&ty, NULL, burst_of, &y);
    pthread_create(&tx, NULL, burst_of, &x);
    pthread_barrier_wait(&allocated); /* two heaps, each its bundles */
    pthread_join(ty, NULL);           /* y's bundles spare first... */
    pthread_barrier_wait(&go_free);
    pthread_join(tx, NULL); /* ...then x's, same span, on top */
    pthread_barrier_destroy(&allocated);
    pthread_barrier_destroy(&go_free);
    uint8_t first = 0;
    run_in_thread(first_byte_of_one, &first); /* a heap with no bundle of its own */
    assert_int_equal(first, 0x5a);            /* where one of y's blocks was */
    malloc_trim(0);
}

/* Blocks freed to a thread that is alive but idle (a producer waiting for
 * work) sit on its remote stack: malloc_trim from another thread gives
 * their pages back (they stayed resident for good). */
static _Atomic int idle_step;
static uint8_t *idle_blocks[16];

static void *idle_producer(void *arg) {
    (void)arg;
    for (int i = 0; i < 16; i++)
        memset(idle_blocks[i] = malloc(256 << 10), 0x77, 256 << 10);
    atomic_store(&idle_step, 1);
    while (atomic_load(&idle_step) != 2)
        sched_yield(); /* idle: no allocator call */
    return NULL;
}

static void test_trim_reaches_blocks_freed_to_idle_thread(void **state) {
    (void)state;
    pthread_t t;
    atomic_store(&idle_step, 0);
    assert_int_equal(pthread_create(&t, NULL, idle_producer, NULL), 0);
    while (atomic_load(&idle_step) != 1)
        sched_yield();
    for (int i = 0; i < 16; i++)
        free(idle_blocks[i]);
    malloc_trim(0);
    /* (A block's first and last pages may be shared with a neighbour.) */
    size_t resident = 0;
    for (int i = 0; i < 16; i++)
        resident += maps_resident(idle_blocks[i] + (128 << 10));
    atomic_store(&idle_step, 2);
    pthread_join(t, NULL);
    assert_int_equal(resident, 0);
}

/* A probe of what a pass holds while it gives pages back: a malloc_trim
 * runs with os_decommit_hook set; inside the first decommit that falls in
 * [lo, hi), the hook has a thread waiting beside it make a call (`call`)
 * and waits for it, up to a hang limit: a call that needs a lock the pass
 * holds over the madvise would wait for good. */
struct lock_probe {
    uint8_t *lo, *hi;
    void (*call)(void);
    _Atomic int step; /* 0: idle, 1: asked, 2: done */
    _Atomic bool seen, waited_out;
};
static struct lock_probe probe;

static void *probe_caller(void *arg) {
    (void)arg;
    while (atomic_load(&probe.step) == 0)
        sched_yield();
    probe.call();
    atomic_store(&probe.step, 2);
    return NULL;
}

static void probe_hook(void *p, size_t size) {
    if ((uint8_t *)p < probe.lo || (uint8_t *)p + size > probe.hi ||
        atomic_exchange(&probe.seen, true))
        return;
    atomic_store(&probe.step, 1);
    int64_t t0 = hak_test_now_ms(), limit = hak_test_limit_ms(5000);
    while (atomic_load(&probe.step) != 2 && hak_test_now_ms() - t0 < limit)
        sched_yield();
    atomic_store(&probe.waited_out, atomic_load(&probe.step) != 2);
}

/* malloc_trim with the probe on bundle b's span: it reached a decommit
 * there, and `call` did not wait behind it. */
static void trim_probed(const struct l25_bundle *b, void (*call)(void)) {
    probe.lo = b->base;
    probe.hi = b->base + b->span;
    probe.call = call;
    atomic_store(&probe.step, 0);
    atomic_store(&probe.seen, false);
    atomic_store(&probe.waited_out, false);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, probe_caller, NULL), 0);
    atomic_store(&os_decommit_hook, probe_hook);
    malloc_trim(0);
    atomic_store(&os_decommit_hook, NULL);
    atomic_store(&probe.step, 1); /* (the caller goes, if the hook never asked) */
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(atomic_load(&probe.seen)); /* the trim gave pages of b back */
    assert_false(atomic_load(&probe.waited_out));
}

/* A shard's purge makes its madvise calls without the shard's lock: an
 * aligned malloc and free of the class, which take it, do not wait behind
 * them (they waited behind the pass's hundreds of calls, a trim's or the
 * ageing's every age). */
#define PURGE_SIZE ((size_t)96 << 10)

static void aligned_call(void) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, PURGE_SIZE) == 0) free(p);
}

static void test_shard_purge_outside_its_lock(void **state) {
    (void)state;
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 3600 * 1000; /* no ageing pass takes them first */
    uint8_t *blk[8];
    for (int i = 0; i < 8; i++) {
        assert_int_equal(posix_memalign((void **)&blk[i], 4096, PURGE_SIZE), 0);
        memset(blk[i], i + 1, PURGE_SIZE); /* pages, for the purge to give back */
    }
    /* One shared (aligned) bundle, its free blocks between live ones. */
    struct l25_bundle *b = bundle_of(blk[0]);
    assert_ptr_equal(b->owner, L25_SHARED);
    for (int i = 1; i < 8; i += 2)
        free(blk[i]);
    uint64_t mapped = stats().bundles_mapped;
    trim_probed(b, aligned_call);
    /* (Served by the bundle's untouched blocks, which the purge leaves in:
     * not a bundle mapped beside the ones out, nor a wait for them.) */
    assert_int_equal(stats().bundles_mapped, mapped);
    hak_cfg.age_ms = age;
    for (int i = 0; i < 8; i += 2)
        free(blk[i]);
}

/* Aligned mallocs and frees of shared bundles on several threads while
 * trims and ageing passes purge them (blocks taken out of their bundles and
 * put back around the madvise calls): every block keeps what its thread
 * wrote, none is handed out twice. */
static _Atomic bool purge_race_stop;

static void *purge_race_worker(void *arg) {
    uint64_t rng = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    uint8_t *held[16] = {0};
    size_t len[16] = {0};
    while (!atomic_load(&purge_race_stop)) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        uint32_t k = (uint32_t)(rng % 16);
        if (held[k]) {
            for (size_t o = 0; o < len[k]; o += 4096)
                assert_int_equal(held[k][o], (uint8_t)((uintptr_t)arg << 4 | k));
            free(held[k]);
            held[k] = NULL;
        } else {
            len[k] = (64 << 10) + (size_t)(rng >> 20) % (192 << 10);
            assert_int_equal(posix_memalign((void **)&held[k], 4096, len[k]), 0);
            for (size_t o = 0; o < len[k]; o += 4096)
                held[k][o] = (uint8_t)((uintptr_t)arg << 4 | k);
        }
    }
    for (int k = 0; k < 16; k++)
        free(held[k]);
    return NULL;
}

static void test_shard_purge_races_aligned_calls(void **state) {
    (void)state;
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 2; /* a pass every few calls */
    pthread_t t[3];
    atomic_store(&purge_race_stop, false);
    for (uintptr_t i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&t[i], NULL, purge_race_worker, (void *)(i + 1)), 0);
    int64_t t0 = hak_test_now_ms();
    while (hak_test_now_ms() - t0 < 1000) {
        malloc_trim(0);
        sched_yield();
    }
    atomic_store(&purge_race_stop, true);
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    hak_cfg.age_ms = age;
}

/* A pass over the parked heaps (a trim's, the background thread's) makes
 * its system calls without l25_heap_lock, which a thread's first L2.5
 * malloc takes for a heap. */
static void *park_live[4];

static void *park_owner(void *arg) {
    (void)arg;
    uint8_t *b[6];
    for (int i = 0; i < 6; i++)
        memset(b[i] = malloc(200 << 10), i + 1, 200 << 10);
    free(b[1]);
    free(b[3]); /* free blocks with pages, between live ones, at its exit */
    park_live[0] = b[0], park_live[1] = b[2], park_live[2] = b[4], park_live[3] = b[5];
    return NULL;
}

static void first_l25_call(void) {
    free(malloc(200 << 10)); /* the probe's thread's first: a heap */
}

static void test_parked_heaps_passed_outside_the_lock(void **state) {
    (void)state;
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 3600 * 1000; /* no ageing takes them first */
    run_in_thread(park_owner, NULL);
    trim_probed(bundle_of(park_live[0]), first_l25_call);
    hak_cfg.age_ms = age;
    for (int i = 0; i < 4; i++)
        free(park_live[i]);
}

/* A fork while another thread's trim has a parked heap off the list (inside
 * its decommit): the child's own malloc_trim returns (it waited for that
 * heap, which never comes back there, for good). */
static _Atomic int fork_inside, fork_release;

static void fork_hook(void *p, size_t size) {
    if ((uint8_t *)p < probe.lo || (uint8_t *)p + size > probe.hi) return;
    atomic_store(&fork_inside, 1);
    while (!atomic_load(&fork_release))
        sched_yield();
}

static void *fork_trimmer(void *arg) {
    (void)arg;
    malloc_trim(0);
    return NULL;
}

static void child_trims(void *arg) {
    (void)arg;
    atomic_store(&os_decommit_hook, NULL);
    malloc_trim(0);
}

static void test_fork_inside_parked_pass(void **state) {
    (void)state;
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 3600 * 1000;
    run_in_thread(park_owner, NULL);
    struct l25_bundle *b = bundle_of(park_live[0]);
    probe.lo = b->base;
    probe.hi = b->base + b->span;
    atomic_store(&fork_inside, 0);
    atomic_store(&fork_release, 0);
    atomic_store(&os_decommit_hook, fork_hook);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fork_trimmer, NULL), 0);
    int64_t t0 = hak_test_now_ms();
    while (!atomic_load(&fork_inside) && hak_test_now_ms() - t0 < hak_test_limit_ms(5000))
        sched_yield();
    bool inside = atomic_load(&fork_inside);
    struct death d;
    if (inside) run_child(child_trims, NULL, &d);
    atomic_store(&fork_release, 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    atomic_store(&os_decommit_hook, NULL);
    hak_cfg.age_ms = age;
    assert_true(inside); /* the trim reached the parked heap */
    assert_not_hung(&d);
    assert_true(WIFEXITED(d.status) && WEXITSTATUS(d.status) == 0);
    for (int i = 0; i < 4; i++)
        free(park_live[i]);
}

/* The ageing pass keeps the L25_KEEP_FREE lowest free blocks with pages of a
 * shard's first bundle (the next refills take them) and gives back the
 * other free blocks' pages: in a fresh process (the pass's clock is its
 * own), with HAKMEM_AGE_MS=20, one aligned bundle, its odd blocks
 * freed, up to the first pass that gives pages back. Prints "kept K purged
 * P". */
#define KEEP_N 10

static bool page_resident(const uint8_t *p) {
    unsigned char v = 0;
    const void *pg = (const void *)(((uintptr_t)p + 8192) & ~(uintptr_t)4095);
    return mincore((void *)pg, 4096, &v) == 0 && (v & 1);
}

static int keep_main(void) {
    uint8_t *b[KEEP_N];
    for (int i = 0; i < KEEP_N; i++) {
        if (posix_memalign((void **)&b[i], 4096, PURGE_SIZE) != 0) return 2;
        memset(b[i], i + 1, PURGE_SIZE);
    }
    for (int i = 1; i < KEEP_N; i += 2)
        free(b[i]);
    /* The first pass that gives pages back (an earlier one, made at the
     * process's start under the default age, may set the next one later
     * than ours would be). */
    uint64_t before = stats().free_decommitted;
    int64_t t0 = hak_test_now_ms();
    while (stats().free_decommitted == before && hak_test_now_ms() - t0 < hak_test_limit_ms(3000)) {
        struct timespec ts = {0, 30 * 1000000};
        nanosleep(&ts, NULL);
        l25_age();
    }
    int kept = page_resident(b[1]) + page_resident(b[3]), purged = 0;
    for (int i = 5; i < KEEP_N; i += 2)
        purged += !page_resident(b[i]);
    fprintf(stderr, "kept %d purged %d\n", kept, purged);
    return 0;
}

static void exec_keep(void *arg) {
    (void)arg;
    setenv("HAKMEM_AGE_MS", "20", 1);
    exec_self_as("--keep");
}

static void test_ageing_keeps_refills_blocks(void **state) {
    (void)state;
    struct death d;
    run_child(exec_keep, NULL, &d);
    assert_not_hung(&d);
    assert_true(WIFEXITED(d.status) && WEXITSTATUS(d.status) == 0);
    assert_string_equal(d.err, "kept 2 purged 3\n");
}

/* A freed block of 128 KiB and more is not the next request's of its size
 * (issue 33: a dangling pointer would alias it; glibc's mmapped blocks are
 * not handed straight back either): a loop of one block takes turns with
 * another. */
static void test_freed_block_not_handed_straight_back(void **state) {
    (void)state;
    /* No ageing pass in between, however slow the machine: one flushes the
     * cache, and the refill after it may start with the freed block. */
    uint64_t age = hak_cfg.age_ms;
    hak_cfg.age_ms = 3600000;
    const size_t sizes[] = {128 * 1024, 200000, 256 * 1024 - 8, 600000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = malloc(sizes[i]);
        assert_non_null(p);
        for (int k = 0; k < 100; k++) {
            free(p);
            void *q = malloc(sizes[i]);
            assert_non_null(q);
            if (q == p)
                fail_msg("%zu bytes, round %d: the freed block came straight back", sizes[i], k);
            p = q;
        }
        free(p);
    }
    hak_cfg.age_ms = age;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--keep") == 0) return keep_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bundle_geometry),
        cmocka_unit_test(test_cached_blocks_do_not_pin_bundles),
#if !defined(HAK_TEST_TSAN) && !defined(__SANITIZE_ADDRESS__)
        cmocka_unit_test(test_locked_bundle_recut_keeps_state),
#endif
        cmocka_unit_test(test_trim_reaches_blocks_freed_to_idle_thread),
        cmocka_unit_test(test_blocks_coloured_aligned_ones_not),
        cmocka_unit_test(test_cache_capped_and_spills),
        cmocka_unit_test(test_thread_exit_returns_cache),
        cmocka_unit_test(test_free_only_thread_returns_cache_at_exit),
        cmocka_unit_test(test_cross_thread_free_and_reuse),
        cmocka_unit_test(test_trim_empties_this_threads_cache),
        cmocka_unit_test(test_double_free_cached),
        cmocka_unit_test(test_double_free_not_at_head),
        cmocka_unit_test(test_interior_and_tail_rejected),
        cmocka_unit_test(test_empty_bundles_decommitted),
        cmocka_unit_test(test_trim_decommits_free_blocks),
        cmocka_unit_test(test_trim_decommits_shared_pages_later),
        cmocka_unit_test(test_trim_unmaps_empty_bundles),
        cmocka_unit_test(test_empty_bundle_serves_other_class),
        cmocka_unit_test(test_threads_own_their_bundles),
        cmocka_unit_test(test_uncached_blocks_of_other_classes),
        cmocka_unit_test(test_growing_realloc_leaves_room),
#ifndef HAK_TEST_TSAN
        cmocka_unit_test(test_limit_set_then_allocate_gets_it_all),
#endif
        cmocka_unit_test(test_concurrent_empty_bundles),
        cmocka_unit_test(test_double_free_remote),
        cmocka_unit_test(test_remote_free_reused_by_owner),
        cmocka_unit_test(test_exited_heap_handed_on),
        cmocka_unit_test(test_cache_holds_eight),
        cmocka_unit_test(test_spare_bundles_serve_other_heaps),
        cmocka_unit_test(test_exited_threads_empty_bundles_age),
        cmocka_unit_test(test_exited_threads_bundles_keep_pages),
        cmocka_unit_test(test_exited_threads_bundles_keep_bounded_pages),
        cmocka_unit_test(test_spare_of_same_class_first),
        cmocka_unit_test(test_shard_purge_outside_its_lock),
        cmocka_unit_test(test_shard_purge_races_aligned_calls),
        cmocka_unit_test(test_parked_heaps_passed_outside_the_lock),
        cmocka_unit_test(test_fork_inside_parked_pass),
        cmocka_unit_test(test_ageing_keeps_refills_blocks),
        cmocka_unit_test(test_freed_block_not_handed_straight_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
