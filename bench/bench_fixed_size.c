/* bench_fixed_size — batched malloc/free of one size.
 *
 * usage: bench_fixed_size [iters [size [seed]]]      (defaults 1000000 64 42)
 * env:   HAKMEM_BENCH_BATCH (default 100): blocks live at a time
 *
 * Each round allocates a batch of blocks of `size` bytes, writes the first
 * byte of each, then frees them all in a shuffled order. The orders are
 * `NPERM` permutations drawn from `seed` before timing starts and used in turn,
 * so the timed loop does no random-number work. One op is one malloc+free
 * pair; `iters` pairs are done in total (the last round may be short). The
 * first byte is checked before each free, so gross heap corruption is detected
 * (exit status 1, no Throughput line). Only the loop is timed. With a time
 * budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one round: the loop
 * stops at the first round after the budget is spent.
 *
 * Output (stdout):
 *   fixed_size: iters=... size=... seed=... batch=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include "bench_util.h"

#define NPERM 16

/* Fisher-Yates shuffle of the identity permutation of [0, n). */
static void make_perm(uint64_t *rng_state, uint32_t *perm, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)bench_bounded((uint32_t)bench_rng_next(rng_state), i);
        uint32_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

int main(int argc, char **argv) {
    uint64_t iters = 1000000, size = 64, seed = 42, batch = 100;

    if (argc > 4) {
        fprintf(stderr, "usage: %s [iters [size [seed]]]\n", argv[0]);
        return 2;
    }
    if (argc > 1 && bench_parse_u64("bench_fixed_size", argv[1], "iters", 1, UINT64_MAX, &iters))
        return 2;
    if (argc > 2 && bench_parse_u64("bench_fixed_size", argv[2], "size", 1, SIZE_MAX / 2, &size))
        return 2;
    if (argc > 3 && bench_parse_u64("bench_fixed_size", argv[3], "seed", 0, UINT64_MAX, &seed))
        return 2;
    const char *b = getenv("HAKMEM_BENCH_BATCH");
    if (b != NULL && b[0] != '\0' &&
        bench_parse_u64("bench_fixed_size", b, "HAKMEM_BENCH_BATCH", 1, 1u << 24, &batch))
        return 2;
    if (batch > iters) batch = iters;
    if (bench_budget_init("bench_fixed_size")) return 2;

    printf("fixed_size: iters=%" PRIu64 " size=%" PRIu64 " seed=%" PRIu64 " batch=%" PRIu64 "\n",
           iters, size, seed, batch);
    fflush(stdout);

    const uint32_t nb = (uint32_t)batch;
    const uint64_t rounds = iters / nb;
    const uint32_t tail = (uint32_t)(iters % nb);
    const uint64_t units = rounds + (tail > 0); /* the rounds, the short one included */
    unsigned char **blk = malloc(nb * sizeof *blk);
    uint32_t *perms = malloc((size_t)(NPERM + 1) * nb * sizeof *perms);
    if (blk == NULL || perms == NULL) {
        fprintf(stderr, "bench_fixed_size: out of memory (bookkeeping)\n");
        return 1;
    }
    uint64_t rng_state = seed;
    for (uint32_t i = 0; i < NPERM; i++)
        make_perm(&rng_state, perms + (size_t)i * nb, nb);
    uint32_t *tail_perm = perms + (size_t)NPERM * nb;
    make_perm(&rng_state, tail_perm, tail);

    uint64_t check = 0, pairs = 0, r;
    double t0 = bench_now();
    bench_budget_start();
    for (r = 0; bench_more(r, units); r++) {
        uint32_t n = r < rounds ? nb : tail;
        const uint32_t *perm = r < rounds ? perms + (size_t)(r % NPERM) * nb : tail_perm;
        for (uint32_t j = 0; j < n; j++) {
            unsigned char *p = malloc(size);
            if (p == NULL) {
                fprintf(stderr, "bench_fixed_size: malloc(%" PRIu64 ") failed\n", size);
                return 1;
            }
            p[0] = (unsigned char)(r + j);
            blk[j] = p;
        }
        for (uint32_t j = 0; j < n; j++) {
            uint32_t k = perm[j];
            unsigned char *p = blk[k];
            if (p[0] != (unsigned char)(r + k)) {
                fprintf(stderr, "bench_fixed_size: block %p (size %" PRIu64 ") corrupted\n",
                        (void *)p, size);
                return 1;
            }
            check += p[0];
            free(p);
        }
        pairs += n;
    }
    double elapsed = bench_now() - t0;

    free(blk);
    free(perms);

    bench_report(pairs, elapsed, check, r, units, "rounds");
    return 0;
}
