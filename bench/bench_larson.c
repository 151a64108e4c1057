/* bench_larson — a Larson-style server workload: random-size churn by several
 * threads, with blocks handed between threads so that part of them are freed
 * by a thread other than the one that allocated them.
 *
 * usage: bench_larson [threads [rounds [chunk [seed]]]]   (defaults 1 6000 1000 42)
 * env:   HAKMEM_BENCH_STEPS (default 4000): steps per thread per round
 *        HAKMEM_BENCH_MIN_SIZE, HAKMEM_BENCH_MAX_SIZE (defaults 8, 1000)
 *
 * There are `threads` chunks of `chunk` slots each; the main thread fills every
 * slot with a block of random size in [MIN_SIZE, MAX_SIZE] before timing. In
 * round r, worker thread t owns chunk (t + r) % threads and does STEPS steps on
 * it: pick a random slot of the chunk, free its block, and allocate a new
 * random-size block into it. A barrier ends each round, and ownership of the
 * chunks rotates by one thread. So in each round, the first free of each slot
 * releases a block that another thread allocated (the previous owner; with 1
 * thread the chunk stays put and only the main thread's initial blocks are
 * freed remotely). A round touches chunk * (1 - e^(-STEPS/chunk)) distinct
 * slots: with the defaults ~98% of them, so ~25% of all frees are
 * cross-thread; raise STEPS/chunk for fewer, lower it for more. After the last
 * round the main thread frees what is left (untimed).
 *
 * One op is one free+malloc step; the run does threads * rounds * STEPS ops,
 * a number fixed by the arguments (unless a time budget stops it: below).
 * Throughput is over the wall time from the start of round 0 to the end of
 * the last round (all threads), so it includes the waits at the per-round
 * barriers: a thread that falls behind holds up the others, as in a server
 * whose batches must all complete.
 *
 * With a time budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one
 * round: the last thread to reach a round's barrier decides for all whether
 * the next round is done (so they all stop after the same round, the first to
 * end after the budget is spent), and the run does threads * (rounds done) *
 * STEPS ops. The single-thread run takes the same path (the barrier with one
 * thread), so no thread is added to it.
 *
 * Each chunk carries its own PRNG, seeded from `seed` and the chunk number, so
 * the sizes, slots and tags depend only on the arguments, not on the thread
 * schedule. The first and last byte of every block are written with a tag and
 * checked before the block is freed; a mismatch (heap corruption) ends the run
 * with status 1 and no Throughput line.
 *
 * Output (stdout):
 *   larson: threads=... rounds=... chunk=... steps=... seed=... min_size=... max_size=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include "bench_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#define MAX_THREADS 1024

/* One chunk of slots. Owned by exactly one worker during a round; the
 * round barrier hands it to the next worker. Padded to a cache line so two
 * workers' chunk headers never share one. */
struct chunk {
    _Alignas(64) unsigned char **blk;
    uint32_t *len;
    unsigned char *tag;
    uint64_t rng;   /* this chunk's PRNG state */
    uint64_t check; /* sum of tag + size of the blocks freed from this chunk */
};

/* The barrier between rounds: spin (then yield) rather than sleep, since a
 * round is short and a futex wake-up would cost as much as many steps. The
 * arrivals' writes happen-before the last arrival's fetch_add (a release
 * sequence on `count`), which publishes them to the waiters through the
 * release store of `gen`; so the chunks change hands without a data race,
 * and so does `more`, which the last arrival writes before that store and
 * the others read after it (it is not written again before they all arrive
 * at the next barrier). */
struct spin_barrier {
    _Alignas(64) atomic_uint count; /* arrivals in this generation */
    atomic_uint gen;                /* bumped by the last arrival */
    unsigned n;
    bool more; /* the last arrival's decision: is there a next round? */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Wait for all the threads to have done `done` rounds; whether they go on to
 * round `done` (bench_more, asked once for all by the last arrival). */
static bool spin_barrier_wait(struct spin_barrier *b, uint64_t done, uint64_t planned) {
    /* `gen` cannot move on before this thread arrives, so g is current. */
    unsigned g = atomic_load_explicit(&b->gen, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) + 1 == b->n) {
        b->more = bench_more(done, planned);
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        atomic_store_explicit(&b->gen, g + 1, memory_order_release);
        return b->more;
    }
    for (unsigned spins = 0; atomic_load_explicit(&b->gen, memory_order_acquire) == g; spins++) {
        if (spins < 2000)
            cpu_relax();
        else
            sched_yield(); /* more threads than CPUs, or a preempted peer */
    }
    return b->more;
}

static struct chunk *chunks;
static uint32_t nthreads, chunk_slots, steps;
static uint64_t rounds, rounds_done, min_size, span;
static pthread_barrier_t edge_barrier;    /* main + workers: start and end of the timed phase */
static struct spin_barrier round_barrier; /* workers: end of each round */

/* Check and free slot k's block (adding it to the chunk's checksum), as the
 * workers' loop does. */
static void release_slot(struct chunk *c, uint32_t k) {
    unsigned char *old = c->blk[k];
    uint32_t oldn = c->len[k];
    bench_check_tagged("bench_larson", old, oldn, c->tag[k]);
    c->check += old[0] + oldn;
    free(old);
}

static void *worker(void *arg) {
    const uint32_t id = (uint32_t)(uintptr_t)arg;
    pthread_barrier_wait(&edge_barrier);
    uint64_t r = 0;
    do {
        struct chunk *c = &chunks[(id + r) % nthreads];
        /* Work on locals: the tag stores could alias the chunk's fields. */
        unsigned char **blk = c->blk;
        uint32_t *len = c->len;
        unsigned char *tags = c->tag;
        uint64_t rng = c->rng, check = c->check;
        for (uint32_t i = 0; i < steps; i++) {
            uint64_t x = bench_rng_next(&rng);
            uint32_t k = (uint32_t)bench_bounded((uint32_t)(x >> 32), chunk_slots);
            uint32_t n = (uint32_t)(min_size + bench_bounded((uint32_t)x, span));
            unsigned char tag = (unsigned char)(x >> 24);
            unsigned char *old = blk[k];
            uint32_t oldn = len[k];
            bench_check_tagged("bench_larson", old, oldn, tags[k]);
            check += old[0] + oldn;
            free(old);
            blk[k] = bench_alloc_tagged("bench_larson", n, tag);
            len[k] = n;
            tags[k] = tag;
        }
        c->rng = rng;
        c->check = check;
        r++;
    } while (r < rounds && spin_barrier_wait(&round_barrier, r, rounds));
    if (id == 0) rounds_done = r; /* the same in every thread */
    pthread_barrier_wait(&edge_barrier);
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t threads = 1, chunk = 1000, seed = 42, nsteps, max_size;
    rounds = 6000;

    if (argc > 5) {
        fprintf(stderr, "usage: %s [threads [rounds [chunk [seed]]]]\n", argv[0]);
        return 2;
    }
    if (argc > 1 && bench_parse_u64("bench_larson", argv[1], "threads", 1, MAX_THREADS, &threads))
        return 2;
    if (argc > 2 && bench_parse_u64("bench_larson", argv[2], "rounds", 1, UINT32_MAX, &rounds))
        return 2;
    if (argc > 3 && bench_parse_u64("bench_larson", argv[3], "chunk", 1, 1u << 24, &chunk))
        return 2;
    if (argc > 4 && bench_parse_u64("bench_larson", argv[4], "seed", 0, UINT64_MAX, &seed))
        return 2;
    if (bench_env_u64("bench_larson", "HAKMEM_BENCH_STEPS", 4000, 1, UINT32_MAX, &nsteps)) return 2;
    if (bench_env_u64("bench_larson", "HAKMEM_BENCH_MIN_SIZE", 8, 1, UINT32_MAX, &min_size))
        return 2;
    if (bench_env_u64("bench_larson", "HAKMEM_BENCH_MAX_SIZE", 1000, 1, UINT32_MAX, &max_size))
        return 2;
    if (max_size < min_size) {
        fprintf(stderr, "bench_larson: HAKMEM_BENCH_MAX_SIZE < HAKMEM_BENCH_MIN_SIZE\n");
        return 2;
    }
    nthreads = (uint32_t)threads;
    chunk_slots = (uint32_t)chunk;
    steps = (uint32_t)nsteps;
    span = max_size - min_size + 1; /* <= 2^32 */
    /* rounds * steps < 2^64; refuse a total op count that would wrap. */
    if (rounds * steps > UINT64_MAX / threads) {
        fprintf(stderr, "bench_larson: threads * rounds * steps overflows\n");
        return 2;
    }
    if (bench_budget_init("bench_larson")) return 2;

    printf("larson: threads=%" PRIu64 " rounds=%" PRIu64 " chunk=%" PRIu64 " steps=%" PRIu64
           " seed=%" PRIu64 " min_size=%" PRIu64 " max_size=%" PRIu64 "\n",
           threads, rounds, chunk, nsteps, seed, min_size, max_size);
    fflush(stdout);

    chunks = aligned_alloc(64, nthreads * sizeof *chunks);
    pthread_t *tid = malloc(nthreads * sizeof *tid);
    if (chunks == NULL || tid == NULL) {
        fprintf(stderr, "bench_larson: out of memory (bookkeeping)\n");
        return 1;
    }
    /* Fill every chunk from the main thread, each from its own PRNG stream. */
    for (uint32_t t = 0; t < nthreads; t++) {
        struct chunk *c = &chunks[t];
        c->blk = malloc(chunk_slots * sizeof *c->blk);
        c->len = malloc(chunk_slots * sizeof *c->len);
        c->tag = malloc(chunk_slots);
        if (c->blk == NULL || c->len == NULL || c->tag == NULL) {
            fprintf(stderr, "bench_larson: out of memory (bookkeeping)\n");
            return 1;
        }
        c->rng = seed ^ ((uint64_t)(t + 1) * 0xd1b54a32d192ed03ULL);
        c->check = 0;
        for (uint32_t k = 0; k < chunk_slots; k++) {
            uint64_t x = bench_rng_next(&c->rng);
            uint32_t n = (uint32_t)(min_size + bench_bounded((uint32_t)x, span));
            unsigned char tag = (unsigned char)(x >> 24);
            c->blk[k] = bench_alloc_tagged("bench_larson", n, tag);
            c->len[k] = n;
            c->tag[k] = tag;
        }
    }

    atomic_init(&round_barrier.count, 0);
    atomic_init(&round_barrier.gen, 0);
    round_barrier.n = nthreads;
    if (pthread_barrier_init(&edge_barrier, NULL, nthreads + 1) != 0) {
        fprintf(stderr, "bench_larson: pthread_barrier_init failed\n");
        return 1;
    }
    for (uint32_t t = 0; t < nthreads; t++) {
        int e = pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)t);
        if (e != 0) {
            fprintf(stderr, "bench_larson: pthread_create: %s\n", strerror(e));
            return 1;
        }
    }
    bench_count_begin();
    pthread_barrier_wait(&edge_barrier);
    double t0 = bench_now();
    bench_budget_start();
    pthread_barrier_wait(&edge_barrier);
    double elapsed = bench_now() - t0;
    bench_count_end(threads * rounds_done * steps);
    for (uint32_t t = 0; t < nthreads; t++)
        pthread_join(tid[t], NULL);

    uint64_t check = 0;
    for (uint32_t t = 0; t < nthreads; t++) {
        struct chunk *c = &chunks[t];
        for (uint32_t k = 0; k < chunk_slots; k++)
            release_slot(c, k);
        check += c->check;
        free(c->blk);
        free(c->len);
        free(c->tag);
    }
    pthread_barrier_destroy(&edge_barrier);
    free(chunks);
    free(tid);

    bench_report(threads * rounds_done * steps, elapsed, check, rounds_done, rounds, "rounds");
    return 0;
}
