/* bench_trim_stall — how long an aligned malloc and free waits while another
 * thread gives memory back.
 *
 * usage: bench_trim_stall [ops [seed]]                 (defaults 4000000 42)
 *
 * A worker replaces, at random, one of 64 blocks of 96 KiB allocated with
 * posix_memalign(4096, ...) (the alignment of O_DIRECT buffers: in hakmem the
 * L2.5 tier's shared, locked bundles), timing each free + posix_memalign
 * pair, `ops` times. Beside it a trimmer, every 50 ms, allocates and writes
 * 1000 such blocks, frees every other one (free blocks with pages, between
 * live ones) and calls malloc_trim(0), then frees the rest. An allocator
 * that gives the free blocks' pages back while holding a lock the worker's
 * calls need makes the worker wait for the whole pass.
 *
 * Output (stdout): the worker's latency distribution, and how many of its
 * pairs took more than 1 ms (on a machine with fewer than two idle cores a
 * preempted worker counts too: compare allocators in the same sitting).
 *   trim_stall: ops=... seed=...
 *   p50 <us> us p99 <us> us p99.9 <us> us max <us> us over_1ms <n> */
#include "bench_util.h"

#include <malloc.h>
#include <pthread.h>

#define BLOCK     ((size_t)96 << 10)
#define SLOTS     64
#define TRIM_N    1000
#define TRIM_GAP  50000000L /* ns between passes */
#define ALIGNMENT 4096

static atomic_bool stop;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *trimmer(void *arg) {
    (void)arg;
    static void *p[TRIM_N];
    while (!atomic_load(&stop)) {
        for (int i = 0; i < TRIM_N; i++) {
            if (posix_memalign(&p[i], ALIGNMENT, BLOCK) != 0) abort();
            memset(p[i], 3, BLOCK);
        }
        for (int i = 0; i < TRIM_N; i += 2)
            free(p[i]);
        malloc_trim(0);
        for (int i = 1; i < TRIM_N; i += 2)
            free(p[i]);
        struct timespec gap = {0, TRIM_GAP};
        nanosleep(&gap, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t ops = 4000000, seed = 42;
    const struct bench_arg args[] = {{"ops", 1, 1u << 30, &ops}, {"seed", 0, UINT64_MAX, &seed}};
    if (bench_args("bench_trim_stall", argc, argv, args, 2)) return 2;
    double *lat = malloc(ops * sizeof *lat); /* us, one a pair */
    void *slot[SLOTS];
    if (lat == NULL) return 1;
    for (int i = 0; i < SLOTS; i++) {
        if (posix_memalign(&slot[i], ALIGNMENT, BLOCK) != 0) return 1;
        memset(slot[i], 1, BLOCK);
    }
    pthread_t t;
    if (pthread_create(&t, NULL, trimmer, NULL) != 0) return 1;
    uint64_t rng = seed;
    for (uint64_t i = 0; i < ops; i++) {
        uint32_t k = (uint32_t)bench_bounded((uint32_t)bench_rng_next(&rng), SLOTS);
        double t0 = bench_now();
        free(slot[k]);
        if (posix_memalign(&slot[k], ALIGNMENT, BLOCK) != 0) return 1;
        lat[i] = (bench_now() - t0) * 1e6;
        memset(slot[k], 2, 4096); /* (a page of it in use) */
    }
    atomic_store(&stop, true);
    pthread_join(t, NULL);
    for (int i = 0; i < SLOTS; i++)
        free(slot[i]);
    uint64_t over = 0;
    for (uint64_t i = 0; i < ops; i++)
        over += lat[i] > 1000.0;
    qsort(lat, ops, sizeof *lat, cmp_double);
    printf("trim_stall: ops=%" PRIu64 " seed=%" PRIu64 "\n", ops, seed);
    printf("p50 %.1f us p99 %.1f us p99.9 %.1f us max %.0f us over_1ms %" PRIu64 "\n", lat[ops / 2],
           lat[ops * 99 / 100], lat[ops * 999 / 1000], lat[ops - 1], over);
    free(lat);
    return 0;
}
