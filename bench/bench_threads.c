/* bench_threads — many threads sharing an allocator: the patterns that make
 * a global lock or a shared cache line show on a many-core machine.
 *
 * usage: bench_threads MODE [threads [ops [seed]]]      (defaults 2 200000 42)
 * env:   HAKMEM_BENCH_MIN_SIZE, HAKMEM_BENCH_MAX_SIZE (defaults 64, 64; min >= 8)
 *        HAKMEM_BENCH_QUEUE (default 1024): ring and pairs, blocks in flight
 *
 * MODE:
 *   ring   threads in a ring, each allocating blocks and passing them to the
 *          next, which frees them (mimalloc-bench's xmalloc-test, with every
 *          thread both producer and consumer): every free is a remote one.
 *   pairs  producer/consumer pairs: thread 2k only allocates, thread 2k+1
 *          only frees what its producer made (threads rounded up to even).
 *   local  each thread replaces blocks in 16 slots of its own at random:
 *          no block crosses threads (the cost of the tier's own path).
 *   churn  threads that exit while holding half their blocks: rounds of
 *          `threads` short-lived threads, each freeing what its predecessor
 *          in the same seat left, allocating 256 blocks and freeing half.
 *
 * `ops` is per thread: blocks each thread allocates (ring, local, churn; in
 * churn each seat's threads share it). One op is one malloc and one free,
 * so Throughput counts blocks allocated and freed per second, in total.
 * Blocks move through single-producer single-consumer rings of pointers
 * (HAKMEM_BENCH_QUEUE slots, a power of two up to 4096, default 1024: the
 * blocks in flight per thread; indices published every 32 blocks), so the
 * benchmark's own shared lines move once per 32 blocks. The timed (and
 * counted) phase ends when every thread is done, before any exits (churn's
 * exits are its work). Every block carries its size and a
 * tag, checked by whichever thread frees it.
 *
 * With a time budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is a block
 * of a thread (of a round of threads, in churn): each thread stops at its
 * first block after the budget is spent, and tells its consumer how many it
 * made. Under the count build (bench_count_begin) the timed phase is counted.
 *
 * Output (stdout):
 *   threads: mode=... threads=... ops=... seed=... min_size=... max_size=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB */
#include "bench_util.h"

#include <pthread.h>
#include <sched.h>

#define RING_SLOTS 4096u /* the most HAKMEM_BENCH_QUEUE may ask */
#define PUBLISH    32u
#define SLOTS      16u  /* local: blocks per thread */
#define CHURN_KEEP 256u /* churn: blocks a thread allocates per life */

enum mode { RING, PAIRS, LOCAL, CHURN };

struct ring {
    _Alignas(64) atomic_size_t tail; /* published by the producer */
    _Alignas(64) atomic_size_t head; /* published by the consumer */
    _Alignas(64) atomic_size_t end;  /* blocks the producer made, once done (SIZE_MAX before) */
    unsigned char *slot[RING_SLOTS];
};

struct worker {
    _Alignas(64) pthread_t tid;
    uint32_t index;
    struct ring *out; /* where this thread's blocks go (NULL: it only frees) */
    struct ring *in;  /* where blocks to free come from (NULL: it only allocates) */
    uint64_t made, freed, rng;
    /* producer side */
    size_t tail, head_seen, unpublished;
    /* consumer side */
    size_t head, tail_seen, consumed;
    uint64_t check;
};

static enum mode mode;
static uint64_t nthreads, ops, seed, min_size, span, queue;
static struct worker *workers;
static struct ring *rings;
static pthread_barrier_t start;
static unsigned char **churn_left; /* churn: CHURN_KEEP / 2 blocks per seat */

static void fail(const char *what) {
    fprintf(stderr, "bench_threads: %s\n", what);
    _exit(1);
}

static inline void relax(unsigned *spins) {
    if (++*spins < 200)
        __builtin_ia32_pause();
    else
        sched_yield();
}

static inline uint32_t next_size(uint64_t *rng) {
    return (uint32_t)(min_size + bench_bounded((uint32_t)bench_rng_next(rng), span));
}

/* A block of random size: its size in its first 4 bytes, a tag derived from
 * it in its last, so whichever thread frees it can check it. */
static unsigned char *make_block(struct worker *w) {
    uint32_t n = next_size(&w->rng);
    unsigned char *p = malloc(n);
    if (p == NULL) fail("malloc failed");
    memcpy(p, &n, sizeof n);
    p[n - 1] = (unsigned char)(n * 31 + 7);
    w->made++;
    return p;
}

static void drop_block(struct worker *w, unsigned char *p) {
    uint32_t n;
    memcpy(&n, p, sizeof n);
    if (n < min_size || n - min_size >= span || p[n - 1] != (unsigned char)(n * 31 + 7)) {
        fprintf(stderr, "bench_threads: block %p corrupted\n", (void *)p);
        _exit(1);
    }
    w->check += n;
    w->freed++;
    free(p);
}

/* ---- ring and pairs ------------------------------------------------------------ */

/* Try to pass one more block on; false when the ring is full. */
static bool produce(struct worker *w) {
    struct ring *r = w->out;
    if (w->tail - w->head_seen == queue) {
        w->head_seen = atomic_load_explicit(&r->head, memory_order_acquire);
        if (w->tail - w->head_seen == queue) {
            if (w->unpublished) {
                atomic_store_explicit(&r->tail, w->tail, memory_order_release);
                w->unpublished = 0;
            }
            return false;
        }
    }
    r->slot[w->tail & (queue - 1)] = make_block(w);
    w->tail++;
    if (++w->unpublished == PUBLISH) {
        atomic_store_explicit(&r->tail, w->tail, memory_order_release);
        w->unpublished = 0;
    }
    return true;
}

/* Free what has arrived; true when something was, or the producer is done
 * and all of its blocks are freed (*over). */
static bool consume(struct worker *w, bool *over) {
    struct ring *r = w->in;
    if (w->head == w->tail_seen) {
        atomic_store_explicit(&r->head, w->head, memory_order_release);
        w->tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
        if (w->head == w->tail_seen) {
            *over = atomic_load_explicit(&r->end, memory_order_acquire) == w->head;
            return false;
        }
    }
    size_t n = 0;
    while (w->head != w->tail_seen && n < PUBLISH) {
        drop_block(w, r->slot[w->head & (queue - 1)]);
        w->head++;
        n++;
    }
    atomic_store_explicit(&r->head, w->head, memory_order_release);
    return true;
}

static void *ring_worker(void *arg) {
    struct worker *w = arg;
    pthread_barrier_wait(&start);
    bool producing = w->out != NULL, consuming = w->in != NULL;
    unsigned spins = 0;
    while (producing || consuming) {
        bool moved = false;
        if (producing) {
            if (!bench_more(w->made, ops)) {
                atomic_store_explicit(&w->out->tail, w->tail, memory_order_release);
                atomic_store_explicit(&w->out->end, w->tail, memory_order_release);
                producing = false;
            } else {
                for (unsigned i = 0; i < PUBLISH && bench_more(w->made, ops); i++)
                    if (!produce(w))
                        break;
                    else
                        moved = true;
            }
        }
        if (consuming) {
            bool over = false;
            moved |= consume(w, &over);
            if (over) consuming = false;
        }
        if (moved)
            spins = 0;
        else
            relax(&spins);
    }
    pthread_barrier_wait(&start); /* the timed phase ends with the slowest, before exits */
    return NULL;
}

/* ---- local ------------------------------------------------------------------------ */

static void *local_worker(void *arg) {
    struct worker *w = arg;
    unsigned char *slot[SLOTS];
    for (uint32_t i = 0; i < SLOTS; i++)
        slot[i] = make_block(w);
    w->made = 0;
    pthread_barrier_wait(&start);
    while (bench_more(w->made, ops)) {
        uint32_t i = (uint32_t)bench_rng_next(&w->rng) % SLOTS;
        drop_block(w, slot[i]);
        slot[i] = make_block(w);
    }
    pthread_barrier_wait(&start); /* the timed phase ends with the slowest */
    for (uint32_t i = 0; i < SLOTS; i++)
        drop_block(w, slot[i]);
    return NULL;
}

/* ---- churn ------------------------------------------------------------------------ */

static void *churn_life(void *arg) {
    struct worker *w = arg;
    unsigned char **left = churn_left + (size_t)w->index * (CHURN_KEEP / 2);
    unsigned char *mine[CHURN_KEEP];
    for (uint32_t i = 0; i < CHURN_KEEP / 2; i++)
        if (left[i]) drop_block(w, left[i]);
    for (uint32_t i = 0; i < CHURN_KEEP; i++)
        mine[i] = make_block(w);
    for (uint32_t i = 0; i < CHURN_KEEP; i += 2)
        drop_block(w, mine[i]);
    for (uint32_t i = 0; i < CHURN_KEEP / 2; i++)
        left[i] = mine[2 * i + 1];
    return NULL;
}

static uint64_t churn_run(void) {
    uint64_t rounds = (ops + CHURN_KEEP - 1) / CHURN_KEEP, r;
    for (r = 0; bench_more(r, rounds); r++) {
        for (uint64_t t = 0; t < nthreads; t++)
            if (pthread_create(&workers[t].tid, NULL, churn_life, &workers[t]) != 0)
                fail("pthread_create failed");
        for (uint64_t t = 0; t < nthreads; t++)
            pthread_join(workers[t].tid, NULL);
    }
    return r;
}

/* ---- main ------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    nthreads = 2;
    ops = 200000;
    seed = 42;
    if (argc < 2) {
        fprintf(stderr, "usage: %s ring|pairs|local|churn [threads [ops [seed]]]\n", argv[0]);
        return 2;
    }
    const char *names[] = {"ring", "pairs", "local", "churn"};
    mode = (enum mode)4;
    for (int m = 0; m < 4; m++)
        if (strcmp(argv[1], names[m]) == 0) mode = (enum mode)m;
    if (mode == (enum mode)4) {
        fprintf(stderr, "bench_threads: unknown mode '%s'\n", argv[1]);
        return 2;
    }
    const struct bench_arg args[] = {{"threads", 1, 1024, &nthreads},
                                     {"ops", 1, UINT64_MAX / 4, &ops},
                                     {"seed", 0, UINT64_MAX, &seed}};
    uint64_t max_size;
    if (bench_args("bench_threads", argc - 1, argv + 1, args, 3)) return 2;
    if (bench_env_u64("bench_threads", "HAKMEM_BENCH_QUEUE", 1024, 64, RING_SLOTS, &queue)) return 2;
    if (queue & (queue - 1)) {
        fprintf(stderr, "bench_threads: HAKMEM_BENCH_QUEUE must be a power of two\n");
        return 2;
    }
    if (bench_env_u64("bench_threads", "HAKMEM_BENCH_MIN_SIZE", 64, 8, UINT32_MAX, &min_size) ||
        bench_env_u64("bench_threads", "HAKMEM_BENCH_MAX_SIZE", 64, 8, UINT32_MAX, &max_size))
        return 2;
    if (max_size < min_size) {
        fprintf(stderr, "bench_threads: HAKMEM_BENCH_MAX_SIZE < HAKMEM_BENCH_MIN_SIZE\n");
        return 2;
    }
    if (bench_budget_init("bench_threads")) return 2;
    span = max_size - min_size + 1;
    if (mode == PAIRS && nthreads % 2) nthreads++;
    printf("threads: mode=%s threads=%" PRIu64 " ops=%" PRIu64 " seed=%" PRIu64 " min_size=%" PRIu64
           " max_size=%" PRIu64 "\n",
           names[mode], nthreads, ops, seed, min_size, max_size);
    fflush(stdout);

    workers = calloc(nthreads, sizeof *workers);
    rings = calloc(nthreads, sizeof *rings);
    churn_left = calloc(nthreads * (CHURN_KEEP / 2), sizeof *churn_left);
    if (!workers || !rings || !churn_left) fail("out of memory (bookkeeping)");
    for (uint64_t t = 0; t < nthreads; t++) {
        struct worker *w = &workers[t];
        w->index = (uint32_t)t;
        w->rng = seed * 0x9e3779b97f4a7c15ull + t;
        atomic_init(&rings[t].end, SIZE_MAX);
        if (mode == RING) {
            w->out = &rings[t];
            w->in = &rings[(t + nthreads - 1) % nthreads];
        } else if (mode == PAIRS) {
            if (t % 2 == 0)
                w->out = &rings[t];
            else
                w->in = &rings[t - 1];
        }
    }

    uint64_t total = 0, done = 0, planned = ops;
    double t0;
    if (mode == CHURN) {
        t0 = bench_now();
        bench_count_begin();
        bench_budget_start();
        uint64_t rounds = churn_run();
        total = rounds * CHURN_KEEP * nthreads;
        done = rounds;
        planned = (ops + CHURN_KEEP - 1) / CHURN_KEEP;
    } else {
        if (pthread_barrier_init(&start, NULL, (unsigned)nthreads + 1) != 0)
            fail("pthread_barrier_init failed");
        for (uint64_t t = 0; t < nthreads; t++)
            if (pthread_create(&workers[t].tid, NULL, mode == LOCAL ? local_worker : ring_worker,
                               &workers[t]) != 0)
                fail("pthread_create failed");
        bench_count_begin();
        pthread_barrier_wait(&start);
        t0 = bench_now();
        bench_budget_start();
        pthread_barrier_wait(&start);
        done = ops;
        for (uint64_t t = 0; t < nthreads; t++) {
            total += workers[t].made;
            if (workers[t].out && workers[t].made < done) done = workers[t].made;
            if (mode == LOCAL && workers[t].made < done) done = workers[t].made;
        }
    }
    double elapsed = bench_now() - t0;
    bench_count_end(total);
    if (mode != CHURN)
        for (uint64_t t = 0; t < nthreads; t++)
            pthread_join(workers[t].tid, NULL);
    uint64_t check = 0;
    for (uint64_t t = 0; t < nthreads; t++)
        check += workers[t].check;
    if (mode == CHURN)
        for (uint64_t i = 0; i < nthreads * (CHURN_KEEP / 2); i++)
            if (churn_left[i]) drop_block(&workers[0], churn_left[i]);
    bench_report(total, elapsed, check, done, planned, mode == CHURN ? "rounds" : "blocks");
    return 0;
}
