/* bench_random_mixed — random-size churn over a fixed working set.
 *
 * usage: bench_random_mixed [iters [ws [seed]]]      (defaults 1000000 400 42)
 * env:   HAKMEM_BENCH_MIN_SIZE, HAKMEM_BENCH_MAX_SIZE (defaults 16, 1024)
 *
 * A working set of `ws` slots is filled with blocks of random size in
 * [MIN_SIZE, MAX_SIZE]. Each of the `iters` timed steps picks a random slot,
 * frees its block and allocates a new random-size block into it; one op is one
 * free+malloc step. The first and last byte of every block are written with a
 * per-block tag and checked again before the block is freed, so pages are really touched,
 * the compiler cannot drop the work, and gross heap corruption is detected
 * (exit status 1, no Throughput line). Only the loop is timed.
 *
 * Output (stdout):
 *   random_mixed: iters=... ws=... seed=... min_size=... max_size=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static uint64_t rng_state;

/* splitmix64: fast, full-period 64-bit generator; plenty for benchmarking. */
static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Map a 32-bit random value onto [0, n) without division (n <= 2^32). */
static inline uint64_t bounded(uint32_t r, uint64_t n) {
    return ((uint64_t)r * n) >> 32;
}

static int parse_u64(const char *s, const char *what, uint64_t min, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    if (s[0] == '-') goto bad;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end != '\0' || v < min || v > max) goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "bench_random_mixed: invalid %s '%s' (want %" PRIu64 "..%" PRIu64 ")\n", what,
            s, min, max);
    return -1;
}

static int env_u64(const char *name, uint64_t def, uint64_t min, uint64_t max, uint64_t *out) {
    const char *s = getenv(name);
    if (s == NULL || s[0] == '\0') {
        *out = def;
        return 0;
    }
    return parse_u64(s, name, min, max, out);
}

static double now_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    uint64_t iters = 1000000, ws = 400, seed = 42, min_size, max_size;

    if (argc > 4) {
        fprintf(stderr, "usage: %s [iters [ws [seed]]]\n", argv[0]);
        return 2;
    }
    if (argc > 1 && parse_u64(argv[1], "iters", 1, UINT64_MAX, &iters)) return 2;
    if (argc > 2 && parse_u64(argv[2], "ws", 1, UINT32_MAX, &ws)) return 2;
    if (argc > 3 && parse_u64(argv[3], "seed", 0, UINT64_MAX, &seed)) return 2;
    if (env_u64("HAKMEM_BENCH_MIN_SIZE", 16, 1, UINT32_MAX, &min_size)) return 2;
    if (env_u64("HAKMEM_BENCH_MAX_SIZE", 1024, 1, UINT32_MAX, &max_size)) return 2;
    if (max_size < min_size) {
        fprintf(stderr, "bench_random_mixed: HAKMEM_BENCH_MAX_SIZE < HAKMEM_BENCH_MIN_SIZE\n");
        return 2;
    }
    const uint64_t span = max_size - min_size + 1; /* <= 2^32 */

    printf("random_mixed: iters=%" PRIu64 " ws=%" PRIu64 " seed=%" PRIu64 " min_size=%" PRIu64
           " max_size=%" PRIu64 "\n",
           iters, ws, seed, min_size, max_size);
    fflush(stdout);

    unsigned char **slot = malloc(ws * sizeof *slot);
    uint32_t *len = malloc(ws * sizeof *len);
    unsigned char *tags = malloc(ws);
    if (slot == NULL || len == NULL || tags == NULL) {
        fprintf(stderr, "bench_random_mixed: out of memory (bookkeeping)\n");
        return 1;
    }

    rng_state = seed;
    uint64_t check = 0;
    for (uint64_t i = 0; i < ws; i++) {
        uint64_t r = rng_next();
        uint32_t n = (uint32_t)(min_size + bounded((uint32_t)r, span));
        unsigned char tag = (unsigned char)(r >> 40);
        unsigned char *p = malloc(n);
        if (p == NULL) {
            fprintf(stderr, "bench_random_mixed: malloc(%" PRIu32 ") failed\n", n);
            return 1;
        }
        p[0] = tag;
        p[n - 1] = tag;
        slot[i] = p;
        len[i] = n;
        tags[i] = tag;
    }

    double t0 = now_sec();
    for (uint64_t i = 0; i < iters; i++) {
        uint64_t r = rng_next();
        uint64_t k = bounded((uint32_t)(r >> 32), ws);
        uint32_t n = (uint32_t)(min_size + bounded((uint32_t)r, span));
        unsigned char tag = (unsigned char)(r >> 24);

        unsigned char *old = slot[k];
        uint32_t oldn = len[k];
        if (old[0] != tags[k] || old[oldn - 1] != tags[k]) {
            fprintf(stderr, "bench_random_mixed: block %p (size %" PRIu32 ") corrupted\n",
                    (void *)old, oldn);
            return 1;
        }
        check += old[0] + oldn;
        free(old);

        unsigned char *p = malloc(n);
        if (p == NULL) {
            fprintf(stderr, "bench_random_mixed: malloc(%" PRIu32 ") failed\n", n);
            return 1;
        }
        p[0] = tag;
        p[n - 1] = tag;
        slot[k] = p;
        len[k] = n;
        tags[k] = tag;
    }
    double elapsed = now_sec() - t0;

    for (uint64_t i = 0; i < ws; i++) {
        if (slot[i][0] != tags[i] || slot[i][len[i] - 1] != tags[i]) {
            fprintf(stderr, "bench_random_mixed: block %p (size %" PRIu32 ") corrupted\n",
                    (void *)slot[i], len[i]);
            return 1;
        }
        check += slot[i][0] + len[i];
        free(slot[i]);
    }
    free(slot);
    free(len);
    free(tags);

    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (elapsed <= 0) elapsed = 1e-9;
    printf("Throughput = %.0f ops/s\n", (double)iters / elapsed);
    printf("Peak RSS = %ld KiB\n", ru.ru_maxrss);
    const char *chk = getenv("HAKMEM_BENCH_CHECK");
    if (chk != NULL && chk[0] != '\0' && strcmp(chk, "0") != 0)
        fprintf(stderr, "checksum = %016" PRIx64 "\n", check);
    return 0;
}
