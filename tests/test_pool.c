/* Pool tier (8 KiB .. 52 KiB): class map, arena chunk growth, region-map
 * registry, remote frees drained before carving, chunks unmapped once their
 * blocks are all back, heaps handed to the next thread, bad pointers and
 * double frees. Each test runs its allocations in a fresh thread, so it
 * starts with a heap of its own (or a recycled one, where it says so). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/config.h"
#include "box/rmap.h"
#include "pool.h"
#include "sizeclass.h"
#include "tiny.h"

#include "death.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void run_in_thread(void *(*fn)(void *), void *arg) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

static struct pool_chunk *chunk_of(const void *p) {
    uint32_t e = rmap_get(p);
    assert_int_equal(rmap_kind_of(e), TIER_POOL);
    return pool_chunk_of(p, e);
}

static struct pool_stats pstats(void) {
    struct pool_stats s;
    pool_get_stats(&s);
    return s;
}

/* ---- class map ------------------------------------------------------------------------ */

static void test_class_map(void **state) {
    (void)state;
    assert_int_equal(small_class_size[POOL_FIRST - 1], TINY_MAX);
    assert_int_equal(small_class_size[POOL_END - 1], POOL_MAX);
    for (size_t n = TINY_MAX + 1; n <= POOL_MAX; n++) {
        uint32_t c = small_class_of(n);
        assert_true(c >= POOL_FIRST && c < POOL_END);
        assert_true(small_class_size[c] >= n && small_class_size[c - 1] < n);
    }
    assert_true(small_class_of(POOL_MAX + 1) >= POOL_END);
}

/* ---- arena growth and the registry ----------------------------------------------------- */

#define GROW_N 1200 /* 40 KiB blocks: 48 MiB, past 1+2+4+8+8 MiB of chunks */

static void *grow_thread(void *arg) {
    size_t *sizes = arg; /* out: the sizes of the first 6 chunks, in order */
    static void *b[GROW_N];
    struct pool_chunk *last = NULL;
    int nchunks = 0;
    for (int i = 0; i < GROW_N; i++) {
        b[i] = malloc(40000);
        assert_non_null(b[i]);
        memset(b[i], i & 0xff, 40000);
        struct pool_chunk *c = chunk_of(b[i]);
        assert_ptr_equal(c->owner, tc_self.pool); /* found from the address alone */
        assert_int_equal((uintptr_t)c & (HAK_REGION_SIZE - 1), 0);
        assert_true((uint8_t *)b[i] > (uint8_t *)c && (uint8_t *)b[i] + 40000 <= c->end);
        assert_int_equal(malloc_usable_size(b[i]), small_class_size[small_class_of(40000)]);
        if (c != last && nchunks < 6) sizes[nchunks++] = c->size;
        last = c;
    }
    for (int i = 0; i < GROW_N; i++) {
        assert_int_equal(((uint8_t *)b[i])[39999], (uint8_t)(i & 0xff));
        free(b[i]);
    }
    return NULL;
}

static void test_arena_chunks_grow_1_2_4_8(void **state) {
    (void)state;
    size_t sizes[6] = {0};
    struct pool_stats a = pstats();
    run_in_thread(grow_thread, sizes);
    const size_t mib = (size_t)1 << 20;
    assert_int_equal(sizes[0], 1 * mib);
    assert_int_equal(sizes[1], 2 * mib);
    assert_int_equal(sizes[2], 4 * mib);
    assert_int_equal(sizes[3], 8 * mib);
    assert_int_equal(sizes[4], 8 * mib); /* HAKMEM_POOL_ARENA_MB_MAX */
    struct pool_stats b = pstats();
    assert_true(b.chunks_mapped - a.chunks_mapped >= 6);
    /* Chunks whose blocks all came back were given back, but for the spares
     * the heap keeps (at most twice the largest chunk), which malloc_trim
     * gives back too. */
    assert_true(b.bytes_live - a.bytes_live <= 16 * mib);
    malloc_trim(0);
    assert_true(pstats().chunks_live <= a.chunks_live);
}

static void *grow_small_thread(void *arg) {
    size_t *sizes = arg;
    void *b[300];
    struct pool_chunk *last = NULL;
    int n = 0;
    for (int i = 0; i < 300; i++) {
        b[i] = malloc(30000);
        struct pool_chunk *c = chunk_of(b[i]);
        if (c != last && n < 3) sizes[n++] = c->size;
        last = c;
    }
    for (int i = 0; i < 300; i++)
        free(b[i]);
    return NULL;
}

/* The chunk sizes come from HAKMEM_POOL_ARENA_MB_INIT / _MAX. */
static void test_arena_sizes_follow_config(void **state) {
    (void)state;
    uint32_t init = hak_cfg.pool_arena_mb_init, max = hak_cfg.pool_arena_mb_max;
    hak_cfg.pool_arena_mb_init = 2;
    hak_cfg.pool_arena_mb_max = 4;
    /* A heap starts at the initial size when it is new, or recycled with no
     * chunk left (trim sees to that). */
    malloc_trim(0);
    size_t sizes[3] = {0};
    run_in_thread(grow_small_thread, sizes);
    hak_cfg.pool_arena_mb_init = init;
    hak_cfg.pool_arena_mb_max = max;
    const size_t mib = (size_t)1 << 20;
    assert_int_equal(sizes[0], 2 * mib);
    assert_int_equal(sizes[1], 4 * mib);
    assert_int_equal(sizes[2], 4 * mib);
}

/* ---- remote frees ---------------------------------------------------------------------- */

#define RF_N 60 /* 12 KiB blocks: all in the thread's first chunk */

static void *rf_blocks[RF_N];

static void *rf_free_all(void *arg) {
    (void)arg;
    for (int i = 0; i < RF_N; i++)
        free(rf_blocks[i]);
    return NULL;
}

static void *rf_owner(void *arg) {
    int *reused = arg;
    for (int i = 0; i < RF_N; i++) {
        rf_blocks[i] = malloc(12000);
        memset(rf_blocks[i], 0x3c, 12000);
    }
    struct pool_stats a = pstats();
    run_in_thread(rf_free_all, NULL); /* another thread frees them all */
    struct pool_stats b = pstats();
    /* Counted as the owner takes them back, not by the freeing thread. */
    assert_int_equal(b.remote_frees - a.remote_frees, 0);
    /* The next refill drains them first: the blocks come back, no chunk is
     * mapped for them. */
    void *again[RF_N];
    for (int i = 0; i < RF_N; i++) {
        again[i] = malloc(12000);
        for (int j = 0; j < RF_N; j++)
            if (again[i] == rf_blocks[j]) {
                (*reused)++;
                break;
            }
    }
    struct pool_stats c = pstats();
    assert_true(c.drains > b.drains);
    assert_int_equal(c.remote_frees - a.remote_frees, RF_N);
    assert_int_equal(c.chunks_mapped, b.chunks_mapped);
    for (int i = 0; i < RF_N; i++)
        free(again[i]);
    return NULL;
}

static void test_remote_frees_drained_before_carving(void **state) {
    (void)state;
    int reused = 0;
    run_in_thread(rf_owner, &reused);
    assert_int_equal(reused, RF_N);
}

/* Many threads free into one owner while it keeps allocating and freeing. */
#define RC_THREADS 4
#define RC_PER     3000

static void *rc_q[RC_THREADS][RC_PER];
static _Atomic int rc_ready[RC_THREADS];

static void *rc_freer(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < RC_PER; i++) {
        while (atomic_load(&rc_ready[t]) <= i)
            ;
        uint8_t *p = rc_q[t][i];
        if (p[0] != (uint8_t)(t * 31 + i) || p[9000] != (uint8_t)i) abort();
        free(p);
    }
    return NULL;
}

static void test_remote_frees_under_concurrency(void **state) {
    (void)state;
    pthread_t f[RC_THREADS];
    for (int t = 0; t < RC_THREADS; t++)
        assert_int_equal(pthread_create(&f[t], NULL, rc_freer, (void *)(intptr_t)t), 0);
    for (int i = 0; i < RC_PER; i++) {
        for (int t = 0; t < RC_THREADS; t++) {
            uint8_t *p = malloc(9001 + (size_t)((i * 7 + t) % 40000));
            p[0] = (uint8_t)(t * 31 + i);
            p[9000] = (uint8_t)i;
            rc_q[t][i] = p;
            atomic_store(&rc_ready[t], i + 1);
        }
        void *own = malloc(20000); /* the owner's own traffic, which drains */
        free(own);
    }
    for (int t = 0; t < RC_THREADS; t++)
        assert_int_equal(pthread_join(f[t], NULL), 0);
    malloc_trim(0); /* drains what is left */
}

/* A burst freed and allocated again reuses the chunks: after the first
 * round, no mapping is made or removed. */
static void *cycle_thread(void *arg) {
    uint64_t *syscalls = arg;
    static void *b[100];
    struct pool_stats first = {0};
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < 100; i++)
            b[i] = malloc(40000);
        for (int i = 0; i < 100; i++)
            free(b[i]);
        if (round == 0) first = pstats();
    }
    struct pool_stats last = pstats();
    *syscalls =
        (last.chunks_mapped - first.chunks_mapped) + (last.chunks_unmapped - first.chunks_unmapped);
    return NULL;
}

static void test_burst_cycles_make_no_syscall(void **state) {
    (void)state;
    uint64_t syscalls = 99;
    run_in_thread(cycle_thread, &syscalls);
    assert_int_equal(syscalls, 0);
}

/* ---- chunks go back, heaps go on ------------------------------------------------------- */

static void *burst_thread(void *arg) {
    (void)arg;
    static void *b[2000];
    for (int i = 0; i < 2000; i++)
        b[i] = malloc(8193 + (size_t)(i * 13) % 45000);
    for (int i = 0; i < 2000; i++)
        free(b[i]);
    return NULL;
}

static void test_chunks_unmapped_when_blocks_all_back(void **state) {
    (void)state;
    struct pool_stats a = pstats();
    run_in_thread(burst_thread, NULL);
    struct pool_stats b = pstats();
    assert_true(b.chunks_mapped > a.chunks_mapped);
    /* ~45 MiB went through; the exited thread's heap keeps its spares only. */
    assert_true(b.bytes_live - a.bytes_live <= (size_t)16 << 20);
    assert_true(b.chunks_unmapped > a.chunks_unmapped);
    /* A new thread takes the heap over and bursts again from its spares. */
    run_in_thread(burst_thread, NULL);
    struct pool_stats c = pstats();
    assert_true(c.chunks_mapped - b.chunks_mapped < b.chunks_mapped - a.chunks_mapped);
    malloc_trim(0);
    struct pool_stats d = pstats(); /* trim took earlier tests' spares too */
    assert_true(d.chunks_live <= a.chunks_live);
    assert_true(d.bytes_live <= a.bytes_live);
}

static void *heap_of_thread(void *arg) {
    struct pool_heap **out = arg;
    void *p = malloc(10000);
    *out = tc_self.pool;
    free(p);
    return NULL;
}

static void test_heaps_recycled(void **state) {
    (void)state;
    struct pool_heap *h1 = NULL, *h2 = NULL;
    run_in_thread(heap_of_thread, &h1);
    run_in_thread(heap_of_thread, &h2);
    assert_non_null(h1);
    assert_ptr_equal(h1, h2); /* the second thread took the first one's heap */
}

/* A block freed by a thread after its owner exited reaches the owner's
 * (recycled) heap, and trim gives its chunk back. */
static void *alloc_and_exit(void *arg) {
    void **out = arg;
    *out = malloc(50000);
    memset(*out, 7, 50000);
    return NULL;
}

static void test_free_after_owner_exit(void **state) {
    (void)state;
    void *p = NULL;
    run_in_thread(alloc_and_exit, &p);
    assert_int_equal(((uint8_t *)p)[49999], 7);
    struct pool_stats a = pstats();
    free(p); /* a remote free into a heap nobody runs */
    struct pool_stats b = pstats();
    assert_true(malloc_trim(0)); /* takes it back (counted then), unmaps its chunk */
    struct pool_stats c = pstats();
    assert_int_equal(c.remote_frees - a.remote_frees, 1);
    assert_true(c.chunks_unmapped > b.chunks_unmapped);
}

/* ---- realloc ---------------------------------------------------------------------------- */

static void test_realloc_within_and_across(void **state) {
    (void)state;
    uint8_t *p = malloc(9000);
    for (int i = 0; i < 9000; i++)
        p[i] = (uint8_t)i;
    uint8_t *q = realloc(p, 9500); /* same class (10 KiB): stays */
    assert_ptr_equal(q, p);
    q = realloc(q, 40000);
    for (int i = 0; i < 9000; i++)
        assert_int_equal(q[i], (uint8_t)i);
    q = realloc(q, 3000); /* down to a Tiny class */
    for (int i = 0; i < 3000; i++)
        assert_int_equal(q[i], (uint8_t)i);
    free(q);
}

/* ---- bad pointers ----------------------------------------------------------------------- */

/* Double free once the block has left the thread cache for its chunk. */
static void do_double_free_after_spill(void *p) {
    void *volatile v = p;
    void *other[16];
    free(v);
    for (int i = 0; i < 16; i++)
        other[i] = malloc(small_class_size[small_class_of(20000)]);
    for (int i = 0; i < 16; i++)
        free(other[i]); /* the cache fills: v goes on to its chunk */
    free(v);
}

static void test_bad_pointers(void **state) {
    (void)state;
    uint8_t *p = malloc(20000);
    expect_free_abort(do_free, p + 16, "invalid pointer");
    expect_free_abort(do_free, p + 8, "invalid pointer");
    expect_free_abort(do_free, p + 4096, "invalid pointer");
    expect_free_abort(do_free, p - 16, "invalid pointer");
    struct pool_chunk *c = chunk_of(p);
    expect_free_abort(do_free, (uint8_t *)c, "invalid pointer");
    expect_free_abort(do_free, (uint8_t *)c + POOL_CHUNK_HDR + POOL_HDR + 0x100000,
                      "invalid pointer");
    expect_free_abort(do_free, c->bump + POOL_HDR, "invalid pointer"); /* never carved */
    expect_free_abort(do_double_free, p, "double free");
    expect_free_abort(do_double_free_after_spill, p, "double free");
    free(p);
}

static void *free_in_thread(void *p) {
    free(p);
    return NULL;
}

static void cross_thread_double_free(void *p) {
    free(p); /* this thread owns it */
    run_in_thread(free_in_thread, p);
}

static void test_cross_thread_double_free(void **state) {
    (void)state;
    void *p = malloc(30000);
    expect_free_abort(cross_thread_double_free, p, "double free");
    free(p);
}

static void *use_16mib_and_exit(void *arg) {
    (void)arg;
    static __thread void *b[512];
    for (int i = 0; i < 512; i++)
        b[i] = malloc(32000); /* 16 MiB of Pool blocks */
    for (int i = 0; i < 512; i++)
        free(b[i]);
    return NULL;
}

static void test_exited_threads_spares_bounded(void **state) {
    (void)state;
    malloc_trim(0);
    struct pool_stats a = pstats();
    /* 16 threads at once, each with 16 MiB, all exited: their heaps keep
     * 32 MiB of spares together (4x HAKMEM_POOL_ARENA_MB_MAX), not 16x16. */
    pthread_t t[16];
    for (int i = 0; i < 16; i++)
        assert_int_equal(pthread_create(&t[i], NULL, use_16mib_and_exit, NULL), 0);
    for (int i = 0; i < 16; i++)
        pthread_join(t[i], NULL);
    struct pool_stats b = pstats();
    assert_true(b.bytes_live - a.bytes_live <= (size_t)32 << 20);
    malloc_trim(0);
    assert_true(pstats().bytes_live <= a.bytes_live);
}

/* A thread that carves Pool blocks and exits: what its exit gives back
 * (its current chunk emptied into the spares) comes off the carved count
 * too. Its change was once left pending in the exiting thread, and the
 * count (mallinfo2's uordblks) stayed above what the chunks held. */
static void *carve_and_exit(void *arg) {
    (void)arg;
    void *p[8];
    for (int i = 0; i < 8; i++) {
        p[i] = malloc(20000);
        memset(p[i], i, 20000);
    }
    for (int i = 0; i < 8; i++)
        free(p[i]);
    return NULL;
}

static void test_carved_count_back_after_exit(void **state) {
    (void)state;
    struct pool_stats a = pstats();
    run_in_thread(carve_and_exit, NULL);
    struct pool_stats b = pstats();
    assert_int_equal(b.carved_bytes, a.carved_bytes);
    struct mallinfo2 mi = mallinfo2();
    assert_true(mi.uordblks <= mi.arena);
}

/* Threads starting and exiting while others trim: the heaps of exited
 * threads are taken whole by the trim and put back, without a lock; a heap
 * is never given to two running threads, and blocks left by a wave of
 * threads, freed by the next one into heaps nobody runs, keep their bytes. */
#define CHURN_WAVES   8
#define CHURN_THREADS 8
#define CHURN_BLOCKS  16

static pthread_mutex_t churn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t churn_all_alive; /* a wave's threads run at once */
static struct pool_heap *churn_running[CHURN_THREADS];
static _Atomic int churn_errors;
static _Atomic bool churn_done;
static void *churn_left[CHURN_WAVES + 1][CHURN_THREADS][CHURN_BLOCKS / 2];

struct churn_arg {
    int wave, slot;
};

static size_t churn_size(int wave, int slot, int i) {
    return 8192 + (size_t)((wave * 131 + slot * 31 + i * 977) % 45000);
}

static void *churn_thread(void *arg) {
    struct churn_arg *a = arg;
    void *p[CHURN_BLOCKS];
    uint8_t mark = (uint8_t)(a->wave * CHURN_THREADS + a->slot + 1);
    for (int i = 0; i < CHURN_BLOCKS; i++) {
        p[i] = malloc(churn_size(a->wave, a->slot, i));
        memset(p[i], mark, churn_size(a->wave, a->slot, i));
    }
    pthread_mutex_lock(&churn_lock);
    churn_running[a->slot] = tc_self.pool;
    pthread_mutex_unlock(&churn_lock);
    pthread_barrier_wait(&churn_all_alive);
    pthread_mutex_lock(&churn_lock);
    for (int i = 0; i < CHURN_THREADS; i++)
        if (i != a->slot && churn_running[i] == tc_self.pool) atomic_fetch_add(&churn_errors, 1);
    pthread_mutex_unlock(&churn_lock);
    pthread_barrier_wait(&churn_all_alive);
    /* The previous wave's blocks: still theirs, freed here (remote frees
     * into heaps of exited threads). */
    if (a->wave > 0) {
        for (int i = 0; i < CHURN_BLOCKS / 2; i++) {
            uint8_t *q = churn_left[a->wave - 1][a->slot][i];
            uint8_t want = (uint8_t)((a->wave - 1) * CHURN_THREADS + a->slot + 1);
            size_t n = churn_size(a->wave - 1, a->slot, CHURN_BLOCKS / 2 + i);
            if (q[0] != want || q[n - 1] != want) atomic_fetch_add(&churn_errors, 1);
            free(q);
        }
    }
    for (int i = 0; i < CHURN_BLOCKS / 2; i++)
        free(p[i]);
    for (int i = 0; i < CHURN_BLOCKS / 2; i++)
        churn_left[a->wave][a->slot][i] = p[CHURN_BLOCKS / 2 + i];
    pthread_mutex_lock(&churn_lock);
    churn_running[a->slot] = NULL;
    pthread_mutex_unlock(&churn_lock);
    return NULL;
}

static void *churn_trimmer(void *arg) {
    (void)arg;
    while (!atomic_load(&churn_done))
        malloc_trim(0);
    return NULL;
}

static void test_heaps_recycled_while_trimmed(void **state) {
    (void)state;
    malloc_trim(0);
    struct pool_stats before = pstats();
    pthread_t trimmer, t[CHURN_THREADS];
    struct churn_arg args[CHURN_THREADS];
    assert_int_equal(pthread_barrier_init(&churn_all_alive, NULL, CHURN_THREADS), 0);
    assert_int_equal(pthread_create(&trimmer, NULL, churn_trimmer, NULL), 0);
    for (int w = 0; w < CHURN_WAVES; w++) {
        for (int i = 0; i < CHURN_THREADS; i++) {
            args[i] = (struct churn_arg){w, i};
            assert_int_equal(pthread_create(&t[i], NULL, churn_thread, &args[i]), 0);
        }
        for (int i = 0; i < CHURN_THREADS; i++)
            pthread_join(t[i], NULL);
    }
    atomic_store(&churn_done, true);
    pthread_join(trimmer, NULL);
    pthread_barrier_destroy(&churn_all_alive);
    for (int i = 0; i < CHURN_THREADS; i++)
        for (int j = 0; j < CHURN_BLOCKS / 2; j++)
            free(churn_left[CHURN_WAVES - 1][i][j]);
    assert_int_equal(atomic_load(&churn_errors), 0);
    malloc_trim(0);
    assert_true(pstats().bytes_live <= before.bytes_live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exited_threads_spares_bounded),
        cmocka_unit_test(test_class_map),
        cmocka_unit_test(test_arena_chunks_grow_1_2_4_8),
        cmocka_unit_test(test_arena_sizes_follow_config),
        cmocka_unit_test(test_remote_frees_drained_before_carving),
        cmocka_unit_test(test_remote_frees_under_concurrency),
        cmocka_unit_test(test_carved_count_back_after_exit),
        cmocka_unit_test(test_burst_cycles_make_no_syscall),
        cmocka_unit_test(test_chunks_unmapped_when_blocks_all_back),
        cmocka_unit_test(test_heaps_recycled),
        cmocka_unit_test(test_free_after_owner_exit),
        cmocka_unit_test(test_realloc_within_and_across),
        cmocka_unit_test(test_bad_pointers),
        cmocka_unit_test(test_cross_thread_double_free),
        cmocka_unit_test(test_heaps_recycled_while_trimmed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
