/* Multi-threaded stress: blocks cross threads (freed by a thread other than
 * the one that allocated them) and threads come and go while holding cached
 * memory. Worker threads never call cmocka (not thread-safe); they record
 * failures and the main thread asserts on them. */
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rng.h"

#include "box/rmap.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

/* ---- failure recording --------------------------------------------------- */

static atomic_int g_errors;
static char g_first_error[256];
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;

static void record_error(const char *what, const void *p, size_t n) {
    if (atomic_fetch_add(&g_errors, 1) == 0) {
        pthread_mutex_lock(&g_err_mu);
        snprintf(g_first_error, sizeof g_first_error, "%s (block %p, size %zu)", what, p, n);
        pthread_mutex_unlock(&g_err_mu);
    }
}

static void reset_errors(void) {
    atomic_store(&g_errors, 0);
    g_first_error[0] = 0;
}

static void assert_no_errors(void) {
    int e = atomic_load(&g_errors);
    if (e != 0) fail_msg("%d error(s); first: %s", e, g_first_error);
}

/* ---- patterns ------------------------------------------------------------ */

/* Word i of a block holds a hash of (address, size, i): a block that moved,
 * got a neighbour's data, or was reused while live fails the check. */
static uint64_t word_pat(uintptr_t base, size_t n, size_t i) {
    uint64_t x = base ^ (n * 0x9E3779B97F4A7C15ull) ^ ((i + 1) * 0xC2B2AE3D27D4EB4Full);
    return x ^ (x >> 29);
}

/* Dense in the first and last 4 KiB, one word per 512 bytes in between, so
 * multi-MiB blocks stay cheap while every page is still checked. */
static bool pattern(void *p, size_t n, bool write) {
    uint64_t *w = p;
    const size_t nw = n / 8, dense = 512;
    const uintptr_t base = (uintptr_t)p;
    for (size_t i = 0; i < nw;) {
        uint64_t v = word_pat(base, n, i);
        if (write)
            w[i] = v;
        else if (w[i] != v)
            return false;
        i += (i < dense || i + dense >= nw) ? 1 : 64;
    }
    unsigned char *c = p;
    for (size_t b = nw * 8; b < n; b++) {
        unsigned char v = (unsigned char)(base + n + b);
        if (write)
            c[b] = v;
        else if (c[b] != v)
            return false;
    }
    return true;
}

static void *alloc_filled(size_t n) {
    void *p = malloc(n);
    if (p == NULL) {
        record_error("malloc returned NULL", p, n);
        return NULL;
    }
    if ((uintptr_t)p & 15) record_error("block not 16-byte aligned", p, n);
    pattern(p, n, true);
    return p;
}

static void verify_and_free(void *p, size_t n) {
    if (!pattern(p, n, false)) record_error("pattern corrupted", p, n);
    free(p);
}

/* Mostly 0..64 KiB, log-uniform (so small sizes dominate), 0.2% 1..4 MiB. */
static size_t pick_size(uint64_t *rng) {
    uint64_t r = rng_next(rng);
    if (r % 1000 < 2) return 1 * MiB + (size_t)((r >> 10) % (3 * MiB));
    unsigned bits = (unsigned)((r >> 10) % 17);
    return (size_t)((r >> 20) & ((1ull << bits) - 1));
}

/* ---- cross-thread handoff ------------------------------------------------ */

#define NTHREADS 8
#define OPS      40000
#define SLOTS    256
#define QCAP     8192

struct blk {
    void *p;
    size_t n;
};

struct queue {
    pthread_mutex_t mu;
    size_t head, count;
    struct blk items[QCAP];
};

static struct queue g_q[NTHREADS];
static pthread_barrier_t g_barrier;
static atomic_long g_remote_frees;

static bool q_push(int to, struct blk b) {
    struct queue *q = &g_q[to];
    bool ok = false;
    pthread_mutex_lock(&q->mu);
    if (q->count < QCAP) {
        q->items[(q->head + q->count) % QCAP] = b;
        q->count++;
        ok = true;
    }
    pthread_mutex_unlock(&q->mu);
    return ok;
}

/* Frees everything other threads handed to `me`. */
static void q_drain(int me) {
    struct queue *q = &g_q[me];
    struct blk batch[256];
    for (;;) {
        size_t k = 0;
        pthread_mutex_lock(&q->mu);
        while (q->count > 0 && k < 256) {
            batch[k++] = q->items[q->head];
            q->head = (q->head + 1) % QCAP;
            q->count--;
        }
        pthread_mutex_unlock(&q->mu);
        if (k == 0) return;
        for (size_t i = 0; i < k; i++)
            verify_and_free(batch[i].p, batch[i].n);
        atomic_fetch_add(&g_remote_frees, (long)k);
    }
}

static void *handoff_worker(void *arg) {
    const int me = (int)(intptr_t)arg;
    uint64_t rng = 0x1234567ull * (uint64_t)(me + 1) + 99;
    struct blk slot[SLOTS];
    memset(slot, 0, sizeof slot);

    for (int op = 0; op < OPS; op++) {
        if ((op & 31) == 0) q_drain(me);
        uint64_t r = rng_next(&rng);
        struct blk *s = &slot[r % SLOTS];
        if (s->p != NULL) {
            unsigned action = (unsigned)((r >> 16) % 100);
            if (action < 45) {
                /* Hand it to another thread, which verifies and frees it. */
                int to = (int)((me + 1 + (r >> 24) % (NTHREADS - 1)) % NTHREADS);
                if (!q_push(to, *s)) verify_and_free(s->p, s->n);
            } else if (action < 55) {
                /* realloc: the first min(old, new, 4 KiB) bytes must move. */
                size_t nn = pick_size(&rng);
                uintptr_t oldbase = (uintptr_t)s->p;
                size_t oldn = s->n;
                if (!pattern(s->p, oldn, false)) record_error("pattern before realloc", s->p, oldn);
                void *np = realloc(s->p, nn);
                if (np == NULL && nn != 0) {
                    record_error("realloc returned NULL", s->p, nn);
                    free(s->p);
                    s->p = NULL;
                    continue;
                }
                size_t keep = oldn < nn ? oldn : nn;
                keep = keep < 4096 ? keep / 8 : 512;
                for (size_t i = 0; i < keep; i++)
                    if (((uint64_t *)np)[i] != word_pat(oldbase, oldn, i)) {
                        record_error("realloc lost contents", np, nn);
                        break;
                    }
                if (np == NULL) {
                    s->p = NULL;
                    continue;
                }
                pattern(np, nn, true);
                s->p = np;
                s->n = nn;
                continue;
            } else {
                verify_and_free(s->p, s->n);
            }
            s->p = NULL;
        }
        s->n = pick_size(&rng);
        s->p = alloc_filled(s->n);
    }
    for (int i = 0; i < SLOTS; i++)
        if (slot[i].p != NULL) verify_and_free(slot[i].p, slot[i].n);
    /* Nobody pushes after this barrier, so one more drain empties the queue. */
    pthread_barrier_wait(&g_barrier);
    q_drain(me);
    return NULL;
}

static void test_cross_thread_handoff(void **state) {
    (void)state;
    reset_errors();
    atomic_store(&g_remote_frees, 0);
    assert_int_equal(pthread_barrier_init(&g_barrier, NULL, NTHREADS), 0);
    for (int i = 0; i < NTHREADS; i++) {
        pthread_mutex_init(&g_q[i].mu, NULL);
        g_q[i].head = g_q[i].count = 0;
    }
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, handoff_worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    pthread_barrier_destroy(&g_barrier);
    for (int i = 0; i < NTHREADS; i++) {
        assert_int_equal(g_q[i].count, 0);
        pthread_mutex_destroy(&g_q[i].mu);
    }
    assert_no_errors();
    /* The handoff really happened at scale (not all pushes overflowed). */
    long remote = atomic_load(&g_remote_frees);
    if (remote < NTHREADS * OPS / 20) fail_msg("only %ld remote frees", remote);
}

/* ---- thread churn -------------------------------------------------------- */

#define CHURN_THREADS 200
#define CHURN_BATCH   4
#define CHURN_OPS     1000
#define CHURN_KEEP    16

struct churn_out {
    struct blk keep[CHURN_KEEP];
};

/* Each short-lived thread allocates and frees, ends with ~1 MiB freed into
 * whatever it caches, and hands CHURN_KEEP live blocks to the main thread,
 * which frees them after the owner has exited. */
static void *churn_worker(void *arg) {
    struct churn_out *out = arg;
    uint64_t rng = (uint64_t)(uintptr_t)arg * 2654435761u + 7;
    struct blk live[32];
    memset(live, 0, sizeof live);
    for (int op = 0; op < CHURN_OPS; op++) {
        struct blk *s = &live[rng_next(&rng) % 32];
        if (s->p != NULL) verify_and_free(s->p, s->n);
        s->n = (size_t)(rng_next(&rng) % (8 * KiB));
        s->p = alloc_filled(s->n);
    }
    for (int i = 0; i < 32; i++)
        if (live[i].p != NULL) verify_and_free(live[i].p, live[i].n);
    void *big[256];
    for (int i = 0; i < 256; i++)
        big[i] = alloc_filled(4000 + (size_t)(i % 4) * 16);
    for (int i = 0; i < 256; i++)
        if (big[i] != NULL) verify_and_free(big[i], 4000 + (size_t)(i % 4) * 16);
    for (int i = 0; i < CHURN_KEEP; i++) {
        out->keep[i].n = (size_t)(rng_next(&rng) % (32 * KiB));
        out->keep[i].p = alloc_filled(out->keep[i].n);
    }
    return NULL;
}

static long rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = 0;
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = -1;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE) / (long)MiB;
}

static void test_thread_churn(void **state) {
    (void)state;
    reset_errors();
    static struct churn_out out[CHURN_THREADS];
    long rss_half = 0;
    for (int base = 0; base < CHURN_THREADS; base += CHURN_BATCH) {
        pthread_t t[CHURN_BATCH];
        for (int i = 0; i < CHURN_BATCH; i++)
            assert_int_equal(pthread_create(&t[i], NULL, churn_worker, &out[base + i]), 0);
        for (int i = 0; i < CHURN_BATCH; i++)
            assert_int_equal(pthread_join(t[i], NULL), 0);
        /* Free the dead threads' blocks from here. */
        for (int i = 0; i < CHURN_BATCH; i++)
            for (int k = 0; k < CHURN_KEEP; k++)
                if (out[base + i].keep[k].p != NULL)
                    verify_and_free(out[base + i].keep[k].p, out[base + i].keep[k].n);
        if (base + CHURN_BATCH == CHURN_THREADS / 2) rss_half = rss_mib();
    }
    assert_no_errors();
    /* Each thread touches >1 MiB; if exited threads' memory were never
     * reused, the second 100 threads alone would add >100 MiB. */
    long grown = rss_mib() - rss_half;
    if (grown > 64) fail_msg("RSS grew %ld MiB over the last %d threads", grown, CHURN_THREADS / 2);
}

/* Main allocates, many short-lived threads free (remote frees to a live
 * owner), then main reuses the memory. */
static struct blk g_shared[4096];

static void *remote_free_worker(void *arg) {
    int part = (int)(intptr_t)arg;
    for (int i = part; i < 4096; i += 8)
        verify_and_free(g_shared[i].p, g_shared[i].n);
    return NULL;
}

static void test_remote_free_to_main(void **state) {
    (void)state;
    reset_errors();
    uint64_t rng = 42;
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 4096; i++) {
            g_shared[i].n = pick_size(&rng) % (16 * KiB);
            g_shared[i].p = alloc_filled(g_shared[i].n);
            assert_non_null(g_shared[i].p);
        }
        pthread_t t[8];
        for (int i = 0; i < 8; i++)
            assert_int_equal(pthread_create(&t[i], NULL, remote_free_worker, (void *)(intptr_t)i),
                             0);
        for (int i = 0; i < 8; i++)
            assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_no_errors();
    }
    /* Memory freed remotely comes back to the owner without corruption. */
    for (int i = 0; i < 4096; i++)
        g_shared[i].p = alloc_filled(g_shared[i].n = 64 + i % 512);
    for (int i = 0; i < 4096; i++)
        verify_and_free(g_shared[i].p, g_shared[i].n);
    assert_no_errors();
}

/* glibc frees a thread's strerror buffer after the pthread key destructors
 * ran; that block must not be stranded in the dead thread's cache. */
static void *strerror_and_exit(void *arg) {
    const char *volatile s = strerror(100000 + (int)(intptr_t)arg);
    (void)s;
    return NULL;
}

static void test_frees_after_thread_exit_hook_not_leaked(void **state) {
    (void)state;
    enum { THREADS = 20000 };
    size_t before = mallinfo2().uordblks;
    for (intptr_t i = 0; i < THREADS; i++) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, strerror_and_exit, (void *)i), 0);
        assert_int_equal(pthread_join(t, NULL), 0);
    }
    /* Signed: ageing may give memory back meanwhile (empty slots purged). */
    long long grown = (long long)mallinfo2().uordblks - (long long)before;
    /* Leaking one 32-byte buffer per thread would be 640 KB. */
    if (grown > 128 * 1024) fail_msg("heap grew %lld bytes over %d threads", grown, THREADS);
}

/* After its exit hook ran, a thread may not cache: its requests of every
 * small class are decided once, at the front, and served by the L2.5 tier's
 * bundles one block at a time (Tiny and Pool classes included). */
static const size_t late_sizes[3] = {16, 20000, 100000};
static void *late_blocks[3];
static _Atomic int late_kinds[3];

static void late_destructor(void *arg) {
    (void)arg;
    for (int i = 0; i < 3; i++) {
        uint8_t *p = malloc(late_sizes[i]);
        if (p == NULL) continue;
        memset(p, 0x40 + i, late_sizes[i]);
        atomic_store(&late_kinds[i], (int)rmap_kind_of(rmap_get(p)) + 1);
        late_blocks[i] = p;
    }
    free(malloc(24)); /* and freed there too */
}

static void *late_thread(void *arg) {
    pthread_key_t *key = arg;
    free(malloc(32)); /* arms the exit hook (its key is older: it runs first) */
    pthread_setspecific(*key, (void *)1);
    return NULL;
}

static void test_allocs_after_thread_exit_hook_uncached(void **state) {
    (void)state;
    pthread_key_t key;
    assert_int_equal(pthread_key_create(&key, late_destructor), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, late_thread, &key), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    for (int i = 0; i < 3; i++) {
        assert_non_null(late_blocks[i]);
        assert_int_equal(atomic_load(&late_kinds[i]), (int)TIER_L25 + 1);
        uint8_t *p = late_blocks[i];
        assert_int_equal(p[0], 0x40 + i);
        assert_int_equal(p[late_sizes[i] - 1], 0x40 + i);
        free(p);
    }
    pthread_key_delete(key);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_thread_handoff),
        cmocka_unit_test(test_thread_churn),
        cmocka_unit_test(test_frees_after_thread_exit_hook_not_leaked),
        cmocka_unit_test(test_remote_free_to_main),
        cmocka_unit_test(test_allocs_after_thread_exit_hook_uncached),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
