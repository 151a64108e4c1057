/* bench_memops — memory operations on heap blocks: what an allocator that
 * exports memcpy and its kin (hakmem: checked mode sees the ranges) costs a
 * program that copies, where glibc's are called directly.
 *
 * usage: bench_memops [iters [seed]]                 (defaults 10000000 42)
 * env:   HAKMEM_BENCH_MIN_SIZE, HAKMEM_BENCH_MAX_SIZE (default 16, 256):
 *        the lengths copied
 *
 * 64 pairs of heap blocks of HAKMEM_BENCH_MAX_SIZE bytes are allocated
 * before timing starts. One op is a memcpy of a length drawn from the range
 * (lengths drawn before timing, used in turn) from one block of a pair to
 * the other, a memset of the copy's first half, and a memmove of the copy
 * one byte down; the blocks' first bytes are summed. No allocation in the
 * timed loop: only the memory operations are measured. */
#include "bench_util.h"

#define PAIRS 64
#define NLEN  4096

int main(int argc, char **argv) {
    uint64_t iters = 10000000, seed = 42, lo, hi;
    const struct bench_arg args[] = {
        {"iters", 1, UINT64_MAX, &iters},
        {"seed", 0, UINT64_MAX, &seed},
    };
    if (bench_args("bench_memops", argc, argv, args, 2) ||
        bench_env_u64("bench_memops", "HAKMEM_BENCH_MIN_SIZE", 16, 2, 1 << 24, &lo) ||
        bench_env_u64("bench_memops", "HAKMEM_BENCH_MAX_SIZE", 256, lo, 1 << 24, &hi) ||
        bench_budget_init("bench_memops"))
        return 2;
    printf("memops: iters=%" PRIu64 " seed=%" PRIu64 " sizes=%" PRIu64 "-%" PRIu64 "\n", iters,
           seed, lo, hi);
    fflush(stdout);

    unsigned char *src[PAIRS], *dst[PAIRS];
    for (int i = 0; i < PAIRS; i++) {
        src[i] = malloc(hi);
        dst[i] = malloc(hi);
        if (src[i] == NULL || dst[i] == NULL) {
            fprintf(stderr, "bench_memops: malloc(%" PRIu64 ") failed\n", hi);
            return 1;
        }
        for (uint64_t k = 0; k < hi; k++)
            src[i][k] = (unsigned char)(i + k);
        dst[i][0] = 0;
    }
    static size_t len[NLEN];
    uint64_t rng = seed;
    for (int i = 0; i < NLEN; i++)
        len[i] = (size_t)(lo + bench_bounded((uint32_t)bench_rng_next(&rng), hi - lo + 1));

    uint64_t check = 0, i;
    double t0 = bench_now();
    bench_budget_start();
    for (i = 0; bench_more(i, iters); i++) {
        size_t n = len[i % NLEN];
        unsigned char *s = src[i % PAIRS], *d = dst[i % PAIRS];
        memcpy(d, s, n);
        memset(d, (int)(i & 0x7f), n / 2);
        memmove(d, d + 1, n - 1);
        check += d[0];
    }
    double elapsed = bench_now() - t0;
    for (int k = 0; k < PAIRS; k++) {
        free(src[k]);
        free(dst[k]);
    }
    bench_report(i, elapsed, check, i, iters, "ops");
    return 0;
}
