/* bench_mid_large_mt — mid-size (8-32 KiB) churn, one private working set per
 * thread.
 *
 * usage: bench_mid_large_mt [threads [iters [ws [seed]]]]   (defaults 1 100000 256 42)
 * env:   HAKMEM_BENCH_MIN_SIZE, HAKMEM_BENCH_MAX_SIZE (defaults 8192, 32768)
 *
 * Each of the `threads` worker threads owns a working set of `ws` slots, which
 * it fills (untimed) with blocks of random size in [MIN_SIZE, MAX_SIZE]. After
 * a start barrier, each worker does `iters` steps: pick a random slot of its
 * own set, free its block and allocate a new random-size block into it. No
 * block crosses threads, so this measures the per-thread path of the mid-size
 * tier (hakmem's Pool) and, with 2+ threads, whether threads contend on shared
 * state. The first and last byte of every block are written with a per-block
 * tag (so up to two pages of each block are touched) and checked before the
 * block is freed; a mismatch (heap corruption) ends the run with status 1 and
 * no Throughput line.
 *
 * One op is one free+malloc step; a run does threads * iters ops (`iters` is
 * per thread). Throughput is over the wall time from the start barrier to the
 * moment the last worker finishes (an end barrier), all threads together.
 * With a time budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one
 * step: each worker stops at its first step after the budget is spent (the
 * flag they all read), and the run counts the steps they did.
 *
 * Each thread has its own PRNG, seeded from `seed` and the thread number, so
 * the sizes, slots and tags depend only on the arguments, not on the schedule.
 *
 * Output (stdout):
 *   mid_large_mt: threads=... iters=... ws=... seed=... min_size=... max_size=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include "bench_util.h"

#include <pthread.h>
#include <unistd.h>

#define MAX_THREADS 1024

/* One worker's state, padded to a cache line so two workers never share one. */
struct worker_state {
    _Alignas(64) uint64_t rng;
    uint64_t check; /* sum of tag + size of the blocks this worker freed */
    uint64_t done;  /* its timed steps */
};

static uint64_t iters, ws, min_size, span;
static uint32_t nthreads;
static pthread_barrier_t edge_barrier; /* main + workers: start and end of the timed phase */

static void *worker(void *arg) {
    struct worker_state *w = arg;
    unsigned char **blk = malloc(ws * sizeof *blk);
    uint32_t *len = malloc(ws * sizeof *len);
    unsigned char *tags = malloc(ws);
    if (blk == NULL || len == NULL || tags == NULL) {
        fprintf(stderr, "bench_mid_large_mt: out of memory (bookkeeping)\n");
        _exit(1);
    }
    uint64_t rng = w->rng, check = 0;
    for (uint64_t k = 0; k < ws; k++) {
        uint64_t x = bench_rng_next(&rng);
        uint32_t n = (uint32_t)(min_size + bench_bounded((uint32_t)x, span));
        unsigned char tag = (unsigned char)(x >> 24);
        blk[k] = bench_alloc_tagged("bench_mid_large_mt", n, tag);
        len[k] = n;
        tags[k] = tag;
    }

    pthread_barrier_wait(&edge_barrier);
    uint64_t done;
    for (done = 0; bench_more(done, iters); done++) {
        uint64_t x = bench_rng_next(&rng);
        uint64_t k = bench_bounded((uint32_t)(x >> 32), ws);
        uint32_t n = (uint32_t)(min_size + bench_bounded((uint32_t)x, span));
        unsigned char tag = (unsigned char)(x >> 24);
        unsigned char *old = blk[k];
        uint32_t oldn = len[k];
        bench_check_tagged("bench_mid_large_mt", old, oldn, tags[k]);
        check += old[0] + oldn;
        free(old);
        blk[k] = bench_alloc_tagged("bench_mid_large_mt", n, tag);
        len[k] = n;
        tags[k] = tag;
    }
    pthread_barrier_wait(&edge_barrier);

    /* Untimed: check and free what is left. */
    for (uint64_t k = 0; k < ws; k++) {
        bench_check_tagged("bench_mid_large_mt", blk[k], len[k], tags[k]);
        check += blk[k][0] + len[k];
        free(blk[k]);
    }
    free(blk);
    free(len);
    free(tags);
    w->rng = rng;
    w->check = check;
    w->done = done;
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t threads = 1, seed = 42, max_size;
    iters = 100000;
    ws = 256;

    if (argc > 5) {
        fprintf(stderr, "usage: %s [threads [iters [ws [seed]]]]\n", argv[0]);
        return 2;
    }
    if (argc > 1 &&
        bench_parse_u64("bench_mid_large_mt", argv[1], "threads", 1, MAX_THREADS, &threads))
        return 2;
    if (argc > 2 && bench_parse_u64("bench_mid_large_mt", argv[2], "iters", 1, UINT64_MAX, &iters))
        return 2;
    if (argc > 3 && bench_parse_u64("bench_mid_large_mt", argv[3], "ws", 1, 1u << 24, &ws))
        return 2;
    if (argc > 4 && bench_parse_u64("bench_mid_large_mt", argv[4], "seed", 0, UINT64_MAX, &seed))
        return 2;
    if (bench_env_u64("bench_mid_large_mt", "HAKMEM_BENCH_MIN_SIZE", 8192, 1, UINT32_MAX,
                      &min_size))
        return 2;
    if (bench_env_u64("bench_mid_large_mt", "HAKMEM_BENCH_MAX_SIZE", 32768, 1, UINT32_MAX,
                      &max_size))
        return 2;
    if (max_size < min_size) {
        fprintf(stderr, "bench_mid_large_mt: HAKMEM_BENCH_MAX_SIZE < HAKMEM_BENCH_MIN_SIZE\n");
        return 2;
    }
    if (iters > UINT64_MAX / threads) {
        fprintf(stderr, "bench_mid_large_mt: threads * iters overflows\n");
        return 2;
    }
    if (bench_budget_init("bench_mid_large_mt")) return 2;
    nthreads = (uint32_t)threads;
    span = max_size - min_size + 1; /* <= 2^32 */

    printf("mid_large_mt: threads=%" PRIu64 " iters=%" PRIu64 " ws=%" PRIu64 " seed=%" PRIu64
           " min_size=%" PRIu64 " max_size=%" PRIu64 "\n",
           threads, iters, ws, seed, min_size, max_size);
    fflush(stdout);

    struct worker_state *st = aligned_alloc(64, nthreads * sizeof *st);
    pthread_t *tid = malloc(nthreads * sizeof *tid);
    if (st == NULL || tid == NULL) {
        fprintf(stderr, "bench_mid_large_mt: out of memory (bookkeeping)\n");
        return 1;
    }
    if (pthread_barrier_init(&edge_barrier, NULL, nthreads + 1) != 0) {
        fprintf(stderr, "bench_mid_large_mt: pthread_barrier_init failed\n");
        return 1;
    }
    for (uint32_t t = 0; t < nthreads; t++) {
        st[t].rng = seed ^ ((uint64_t)(t + 1) * 0xd1b54a32d192ed03ULL);
        st[t].check = 0;
        int e = pthread_create(&tid[t], NULL, worker, &st[t]);
        if (e != 0) {
            fprintf(stderr, "bench_mid_large_mt: pthread_create: %s\n", strerror(e));
            return 1;
        }
    }
    pthread_barrier_wait(&edge_barrier);
    double t0 = bench_now();
    bench_budget_start();
    pthread_barrier_wait(&edge_barrier);
    double elapsed = bench_now() - t0;

    uint64_t check = 0, ops = 0;
    for (uint32_t t = 0; t < nthreads; t++) {
        pthread_join(tid[t], NULL);
        check += st[t].check;
        ops += st[t].done;
    }
    pthread_barrier_destroy(&edge_barrier);
    free(st);
    free(tid);

    bench_report(ops, elapsed, check, ops, threads * iters, "steps");
    return 0;
}
