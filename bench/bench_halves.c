/* bench_halves — batches of one size, the first half freed in the order it
 * was allocated, the second half in reverse; on the main thread, then on a
 * second thread, then on the main thread again.
 *
 * usage: bench_halves [iters [size [seed]]]             (defaults 100000 64 42)
 * env:   HAKMEM_BENCH_BATCH (default 0: every count of BATCHES in turn): the
 *        blocks allocated per round
 *
 * A round allocates `batch` blocks of `size` bytes, writes a byte of each,
 * frees the first half oldest first and the second half newest first (FIFO
 * then LIFO: what a queue drained from both ends, or a parser dropping its
 * early nodes and then unwinding, does). Each of the three phases (main
 * thread, a thread of its own, main thread again) does `iters` rounds of
 * each batch count in BATCHES (25, 100, 400, 1600), or of HAKMEM_BENCH_BATCH
 * alone. The FIFO half is what a thread cache kept as a LIFO stack serves
 * worst: it frees the blocks in the order they left it, so the first ones
 * freed are the next round's last ones allocated. A thread that allocates
 * only briefly (the second phase) pays for its start-up and exit too.
 *
 * One op is one malloc+free pair. Each block's byte is checked before it is
 * freed (corruption: exit status 1, no Throughput line). With a time budget
 * (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is a round of one batch
 * count on one phase; a phase stops at the first such round past the
 * budget, the later phases do one round each.
 *
 * Output (stdout): a parameter line, then Throughput, Peak RSS and Page
 * faults (bench_util.h). seed only varies the bytes written. */
#include "bench_util.h"

#include <pthread.h>

static const char *prog = "bench_halves";

static const uint32_t BATCHES[] = {25, 100, 400, 1600};
#define NBATCH (sizeof BATCHES / sizeof BATCHES[0])

struct phase {
    uint64_t iters, size, seed;
    uint32_t batch; /* 0: each of BATCHES */
    unsigned char **blk;
    uint64_t pairs, check, units, done;
    int failed;
};

/* One round: a batch allocated, written, freed in two halves. */
static int round_of(struct phase *ph, uint32_t n, uint64_t tag) {
    unsigned char **blk = ph->blk;
    for (uint32_t j = 0; j < n; j++) {
        unsigned char *p = malloc(ph->size);
        if (p == NULL) {
            fprintf(stderr, "%s: malloc(%" PRIu64 ") failed\n", prog, ph->size);
            return 1;
        }
        p[0] = (unsigned char)(tag + j);
        blk[j] = p;
    }
    uint32_t half = n / 2;
    for (uint32_t j = 0; j < n; j++) {
        uint32_t k = j < half ? j : n - 1 - (j - half); /* FIFO, then LIFO */
        unsigned char *p = blk[k];
        if (p[0] != (unsigned char)(tag + k)) {
            fprintf(stderr, "%s: block %p (size %" PRIu64 ") corrupted\n", prog, (void *)p,
                    ph->size);
            return 1;
        }
        ph->check += p[0];
        free(p);
    }
    ph->pairs += n;
    return 0;
}

static void *run_phase(void *arg) {
    struct phase *ph = arg;
    uint32_t kinds = ph->batch ? 1 : (uint32_t)NBATCH;
    for (uint32_t b = 0; b < kinds && !ph->failed; b++) {
        uint32_t n = ph->batch ? ph->batch : BATCHES[b];
        for (uint64_t i = 0; bench_more(i, ph->iters) && !ph->failed; i++) {
            ph->failed = round_of(ph, n, ph->seed + i);
            ph->done++;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t iters = 100000, size = 64, seed = 42, batch;
    const struct bench_arg args[] = {{"iters", 1, UINT64_MAX, &iters},
                                     {"size", 1, (uint64_t)1 << 30, &size},
                                     {"seed", 0, UINT64_MAX, &seed}};
    if (bench_args(prog, argc, argv, args, 3)) return 2;
    if (bench_env_u64(prog, "HAKMEM_BENCH_BATCH", 0, 0, 1u << 20, &batch)) return 2;
    if (bench_budget_init(prog)) return 2;
    printf("halves: iters=%" PRIu64 " size=%" PRIu64 " seed=%" PRIu64 " batch=%" PRIu64 "\n", iters,
           size, seed, batch);
    fflush(stdout);

    uint32_t most = batch ? (uint32_t)batch : BATCHES[NBATCH - 1];
    unsigned char **blk = malloc(most * sizeof *blk);
    if (blk == NULL) {
        fprintf(stderr, "%s: out of memory (bookkeeping)\n", prog);
        return 1;
    }
    struct phase ph = {
        .iters = iters, .size = size, .seed = seed, .batch = (uint32_t)batch, .blk = blk};
    uint64_t units = 3 * iters * (batch ? 1 : NBATCH);
    double t0 = bench_now();
    bench_budget_start();
    run_phase(&ph); /* the main thread */
    pthread_t t;
    if (pthread_create(&t, NULL, run_phase, &ph) != 0 || pthread_join(t, NULL) != 0) {
        fprintf(stderr, "%s: cannot run a thread\n", prog);
        return 1;
    }
    run_phase(&ph); /* the main thread again */
    double elapsed = bench_now() - t0;
    free(blk);
    if (ph.failed) return 1;
    bench_report(ph.pairs, elapsed, ph.check, ph.done, units, "rounds");
    return 0;
}
