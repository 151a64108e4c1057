/* Tiny stress: STRESS_THREADS threads for STRESS_SECONDS doing malloc,
 * calloc, realloc and free of 0 .. 1024 bytes (seeded random sizes), and
 * handing a share of their blocks to random other threads through
 * mutex-protected queues; the receiver frees them. Every block carries a
 * pattern derived from its address, size and the seed of the thread that
 * allocated it, checked before every free and realloc; calloc's blocks must
 * read zero. At the end every block must have been freed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/config.h"
#include "sizeclass.h"
#include "tiny.h"

#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define STRESS_SECONDS 10
#define STRESS_THREADS 8
#define STRESS_SLOTS   2048  /* blocks a thread holds at most */
#define STRESS_QCAP    65536 /* blocks waiting in a thread's queue at most */
#define STRESS_MAXSIZE 1024

struct blk {
    uint8_t *p;
    uint32_t size;
    uint64_t seed; /* the allocating thread's */
};

struct queue {
    pthread_mutex_t lock;
    struct blk *items;
    uint32_t n;
};

struct worker {
    uint32_t id;
    uint64_t seed, rng;
    struct blk slot[STRESS_SLOTS];
    uint32_t nlive;
    /* counters, summed by the test */
    uint64_t allocs, frees, ops, handed, received, reallocs, callocs;
    uint64_t pattern_errors, zero_errors, null_errors, size_errors, align_errors;
};

static struct queue g_q[STRESS_THREADS];
static struct worker *g_w;
static pthread_barrier_t g_stop;
static struct timespec g_start;

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte i of the pattern of a block: a function of (address, size, seed). */
static inline uint64_t pattern_base(const void *p, uint32_t size, uint64_t seed) {
    return mix((uintptr_t)p ^ seed ^ ((uint64_t)size << 48));
}

#define GOLDEN 0x9e3779b97f4a7c15ull

/* Word j of the pattern starting at x; byte i is byte i%8 of word i/8. */
static inline uint64_t pattern_word(uint64_t x, uint32_t j) {
    return x + j * GOLDEN;
}

static void fill(const struct blk *b) {
    uint64_t x = pattern_base(b->p, b->size, b->seed);
    uint32_t words = b->size / 8;
    for (uint32_t j = 0; j < words; j++) {
        uint64_t w = pattern_word(x, j);
        memcpy(b->p + 8 * j, &w, 8);
    }
    for (uint32_t i = words * 8; i < b->size; i++)
        b->p[i] = (uint8_t)(pattern_word(x, i / 8) >> (8 * (i & 7)));
}

/* Do the n bytes at q hold the first n bytes of b's pattern? */
static bool holds(const struct blk *b, const uint8_t *q, uint32_t n) {
    uint64_t x = pattern_base(b->p, b->size, b->seed);
    uint32_t words = n / 8;
    for (uint32_t j = 0; j < words; j++) {
        uint64_t v;
        memcpy(&v, q + 8 * j, 8);
        if (v != pattern_word(x, j)) return false;
    }
    for (uint32_t i = words * 8; i < n; i++)
        if (q[i] != (uint8_t)(pattern_word(x, i / 8) >> (8 * (i & 7)))) return false;
    return true;
}

static void check_new(struct worker *w, const struct blk *b) {
    if (b->p == NULL) {
        w->null_errors++;
        return;
    }
    if ((uintptr_t)b->p & 15) w->align_errors++;
    if (malloc_usable_size(b->p) < b->size) w->size_errors++;
}

static void release(struct worker *w, struct blk *b) {
    if (!holds(b, b->p, b->size)) w->pattern_errors++;
    free(b->p);
    w->frees++;
}

static void drain_queue(struct worker *w) {
    struct queue *q = &g_q[w->id];
    pthread_mutex_lock(&q->lock);
    uint32_t n = q->n;
    struct blk batch[256];
    while (n > 0) {
        uint32_t k = n < 256 ? n : 256;
        memcpy(batch, q->items + n - k, k * sizeof batch[0]);
        n -= k;
        q->n = n;
        pthread_mutex_unlock(&q->lock);
        for (uint32_t i = 0; i < k; i++)
            release(w, &batch[i]);
        w->received += k;
        pthread_mutex_lock(&q->lock);
        n = q->n;
    }
    pthread_mutex_unlock(&q->lock);
}

static uint32_t random_size(struct worker *w) {
    return (uint32_t)(rng(&w->rng) % (STRESS_MAXSIZE + 1));
}

static void op_malloc(struct worker *w) {
    if (w->nlive == STRESS_SLOTS) return;
    struct blk *b = &w->slot[w->nlive];
    b->size = random_size(w);
    b->seed = w->seed;
    b->p = malloc(b->size);
    check_new(w, b);
    if (b->p == NULL) return;
    fill(b);
    w->nlive++;
    w->allocs++;
}

static void op_calloc(struct worker *w) {
    if (w->nlive == STRESS_SLOTS) return;
    struct blk *b = &w->slot[w->nlive];
    uint32_t m = 1 + (uint32_t)(rng(&w->rng) % 64);
    uint32_t n = (uint32_t)(rng(&w->rng) % (STRESS_MAXSIZE / m + 1));
    b->size = m * n;
    b->seed = w->seed;
    b->p = calloc(m, n);
    check_new(w, b);
    if (b->p == NULL) return;
    for (uint32_t i = 0; i < b->size; i++)
        if (b->p[i] != 0) {
            w->zero_errors++;
            break;
        }
    fill(b);
    w->nlive++;
    w->allocs++;
    w->callocs++;
}

static void take_out(struct worker *w, uint32_t k) {
    w->slot[k] = w->slot[--w->nlive];
}

static void op_free(struct worker *w) {
    if (w->nlive == 0) return;
    uint32_t k = (uint32_t)(rng(&w->rng) % w->nlive);
    release(w, &w->slot[k]);
    take_out(w, k);
}

static void op_realloc(struct worker *w) {
    if (w->nlive == 0) return;
    uint32_t k = (uint32_t)(rng(&w->rng) % w->nlive);
    struct blk *b = &w->slot[k], old = *b;
    if (!holds(&old, old.p, old.size)) w->pattern_errors++;
    uint32_t n = random_size(w);
    uint8_t *q = realloc(old.p, n);
    w->reallocs++;
    if (n == 0) { /* frees, as glibc's */
        if (q != NULL) w->null_errors++;
        w->frees++;
        take_out(w, k);
        return;
    }
    b->p = q;
    b->size = n;
    b->seed = w->seed;
    check_new(w, b);
    if (q == NULL) {
        b->p = old.p; /* realloc failed: the old block is still ours */
        b->size = old.size;
        b->seed = old.seed;
        return;
    }
    if (!holds(&old, q, old.size < n ? old.size : n)) w->pattern_errors++;
    fill(b);
}

/* Hand up to 16 blocks to a random other thread. */
static void op_handoff(struct worker *w) {
    if (w->nlive == 0) return;
    uint32_t to = (w->id + 1 + (uint32_t)(rng(&w->rng) % (STRESS_THREADS - 1))) % STRESS_THREADS;
    uint32_t n = 1 + (uint32_t)(rng(&w->rng) % 16);
    struct queue *q = &g_q[to];
    pthread_mutex_lock(&q->lock);
    while (n-- > 0 && w->nlive > 0 && q->n < STRESS_QCAP) {
        uint32_t k = (uint32_t)(rng(&w->rng) % w->nlive);
        q->items[q->n++] = w->slot[k];
        take_out(w, k);
        w->handed++;
    }
    pthread_mutex_unlock(&q->lock);
}

static double elapsed(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - g_start.tv_sec) + (double)(now.tv_nsec - g_start.tv_nsec) / 1e9;
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    for (;;) {
        if ((w->ops & 255) == 0 && elapsed() >= STRESS_SECONDS) break;
        uint32_t r = (uint32_t)(rng(&w->rng) % 100);
        if (r < 35)
            op_malloc(w);
        else if (r < 45)
            op_calloc(w);
        else if (r < 60)
            op_realloc(w);
        else if (r < 88)
            op_free(w);
        else
            op_handoff(w);
        if ((w->ops & 15) == 0) drain_queue(w);
        w->ops++;
    }
    /* Nobody hands anything over after this point. */
    pthread_barrier_wait(&g_stop);
    drain_queue(w);
    while (w->nlive > 0)
        op_free(w);
    return NULL;
}

static void test_stress_tiny(void **state) {
    (void)state;
    hak_cfg.stats = true;
    g_w = mmap(NULL, STRESS_THREADS * sizeof *g_w, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(g_w != MAP_FAILED);
    for (uint32_t i = 0; i < STRESS_THREADS; i++) {
        pthread_mutex_init(&g_q[i].lock, NULL);
        g_q[i].items = mmap(NULL, STRESS_QCAP * sizeof(struct blk), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(g_q[i].items != MAP_FAILED);
        g_q[i].n = 0;
        g_w[i].id = i;
        g_w[i].seed = mix(0x5eed0000ull + i);
        g_w[i].rng = g_w[i].seed | 1;
    }
    pthread_barrier_init(&g_stop, NULL, STRESS_THREADS);
    struct tiny_class_stats st0[TINY_NCLASSES], st1[TINY_NCLASSES];
    tiny_get_stats(st0);
    clock_gettime(CLOCK_MONOTONIC, &g_start);
    pthread_t t[STRESS_THREADS];
    for (uint32_t i = 0; i < STRESS_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &g_w[i]), 0);
    for (uint32_t i = 0; i < STRESS_THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    double secs = elapsed();
    pthread_barrier_destroy(&g_stop);
    tiny_get_stats(st1);

    struct worker sum = {0};
    for (uint32_t i = 0; i < STRESS_THREADS; i++) {
        struct worker *w = &g_w[i];
        sum.allocs += w->allocs;
        sum.frees += w->frees;
        sum.ops += w->ops;
        sum.handed += w->handed;
        sum.received += w->received;
        sum.reallocs += w->reallocs;
        sum.callocs += w->callocs;
        sum.pattern_errors += w->pattern_errors;
        sum.zero_errors += w->zero_errors;
        sum.null_errors += w->null_errors;
        sum.size_errors += w->size_errors;
        sum.align_errors += w->align_errors;
        sum.nlive += w->nlive;
        assert_int_equal(g_q[i].n, 0);
    }
    uint64_t remote = 0, tallocs = 0, tfrees = 0;
    for (int c = 0; c < TINY_NCLASSES; c++) {
        remote += st1[c].remote_frees - st0[c].remote_frees;
        tallocs += st1[c].allocs - st0[c].allocs;
        tfrees += st1[c].frees - st0[c].frees;
    }
    print_message("stress: %.1f s, %llu ops (%llu allocs, %llu callocs, %llu reallocs), "
                  "%llu handed over, %llu remote frees\n",
                  secs, (unsigned long long)sum.ops, (unsigned long long)sum.allocs,
                  (unsigned long long)sum.callocs, (unsigned long long)sum.reallocs,
                  (unsigned long long)sum.handed, (unsigned long long)remote);
    for (uint32_t i = 0; i < STRESS_THREADS; i++) {
        munmap(g_q[i].items, STRESS_QCAP * sizeof(struct blk));
        pthread_mutex_destroy(&g_q[i].lock);
    }
    munmap(g_w, STRESS_THREADS * sizeof *g_w);
    hak_cfg.stats = false;

    assert_int_equal(sum.pattern_errors, 0);
    assert_int_equal(sum.zero_errors, 0);
    assert_int_equal(sum.null_errors, 0);
    assert_int_equal(sum.size_errors, 0);
    assert_int_equal(sum.align_errors, 0);
    /* Everything allocated was freed: by its thread or by a receiver. */
    assert_int_equal(sum.nlive, 0);
    assert_int_equal(sum.handed, sum.received);
    assert_int_equal(sum.allocs, sum.frees);
    /* hakmem's own count agrees: as many Tiny frees as allocations, but for
     * what glibc keeps per thread: pthread_create allocates each thread's
     * TLS vector and frees it only once the stack leaves glibc's cache. */
    if (tallocs < tfrees || tallocs - tfrees > STRESS_THREADS)
        fail_msg("hakmem counted %llu Tiny allocations and %llu frees", (unsigned long long)tallocs,
                 (unsigned long long)tfrees);
    assert_true(secs >= STRESS_SECONDS);
    assert_true(sum.ops >= 100000);
    assert_true(sum.handed > 0);
    /* A received block is another thread's: its receiver's cache keeps it
     * for the receiver's own mallocs, and gives back the surplus (and all it
     * holds at exit) to the owners' slabs. */
    assert_true(remote > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress_tiny),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
