/* bench_remote_free — producer/consumer: every block is freed by a thread
 * other than the one that allocated it.
 *
 * usage: bench_remote_free [iters [seed]]             (defaults 800000 42)
 * env:   HAKMEM_BENCH_MIN_SIZE, HAKMEM_BENCH_MAX_SIZE (defaults 16, 1024)
 *        HAKMEM_BENCH_QUEUE (default 1024): queue capacity in blocks, a power
 *        of two >= 64; at most this many blocks are in flight
 *
 * The main thread (producer) allocates `iters` blocks of random size in
 * [MIN_SIZE, MAX_SIZE], writes a tag in the first and last byte of each, and
 * passes them through a bounded single-producer/single-consumer ring of
 * pointers to a consumer thread, which checks the tags and frees the blocks.
 * The consumer replays the producer's PRNG stream, so it knows each block's
 * size and tag without them travelling through the queue. A tag mismatch (heap
 * corruption) ends the run with status 1 and no Throughput line.
 *
 * The ring is lock-free (C11 atomics). To keep its cost small next to
 * malloc/free, each side keeps a private copy of its index and of the last
 * index it read from the other side, and publishes its own index only every
 * BATCH blocks (and before it waits), so the shared indices' cache lines move
 * between the cores about once per BATCH blocks. A side that finds the ring
 * full/empty spins briefly, then yields.
 *
 * One op is one block transferred (a malloc on the producer and a remote free
 * on the consumer). Throughput is over the wall time from the start of
 * production until the consumer has freed the last block. With a time budget
 * (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one block: the producer
 * stops at its first block after the budget is spent and publishes how many
 * it made (`end`), and the consumer stops when it has freed that many.
 *
 * Output (stdout):
 *   remote_free: iters=... seed=... min_size=... max_size=... queue=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include "bench_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <unistd.h>

#define BATCH 32

static struct {
    _Alignas(64) atomic_size_t tail; /* next slot the producer fills (published) */
    _Alignas(64) atomic_size_t head; /* next slot the consumer empties (published) */
    _Alignas(64) unsigned char **slot;
    size_t mask;
    /* The number of blocks made, once the producer is done (SIZE_MAX
     * before); stored after the last tail, so a consumer that has caught up
     * with the tail and reads it has freed them all. */
    atomic_size_t end;
} ring;

static uint64_t iters, seed, min_size, span;
static uint64_t consumer_check;
static pthread_barrier_t start_barrier;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static inline void backoff(unsigned *spins) {
    if (++*spins < 1000)
        cpu_relax();
    else
        sched_yield(); /* the other side is not running: let it */
}

/* The size and tag of the next block of the stream `rng` (the producer's and
 * the consumer's copies yield the same sequence). */
static inline void next_block(uint64_t *rng, uint32_t *n, unsigned char *tag) {
    uint64_t x = bench_rng_next(rng);
    *n = (uint32_t)(min_size + bench_bounded((uint32_t)x, span));
    *tag = (unsigned char)(x >> 24);
}

static void *consumer(void *arg) {
    (void)arg;
    uint64_t rng = seed, check = 0;
    size_t head = 0, tail_seen = 0, unpublished = 0;
    pthread_barrier_wait(&start_barrier);
    for (;;) {
        if (head == tail_seen) {
            unsigned spins = 0;
            if (unpublished) { /* let the producer reuse what we took */
                atomic_store_explicit(&ring.head, head, memory_order_release);
                unpublished = 0;
            }
            while ((tail_seen = atomic_load_explicit(&ring.tail, memory_order_acquire)) == head) {
                if (atomic_load_explicit(&ring.end, memory_order_acquire) == head) goto done;
                backoff(&spins);
            }
        }
        unsigned char *p = ring.slot[head & ring.mask];
        head++;
        if (++unpublished == BATCH) {
            atomic_store_explicit(&ring.head, head, memory_order_release);
            unpublished = 0;
        }
        uint32_t n;
        unsigned char tag;
        next_block(&rng, &n, &tag);
        if (p[0] != tag || p[n - 1] != tag) {
            fprintf(stderr, "bench_remote_free: block %p (size %" PRIu32 ") corrupted\n", (void *)p,
                    n);
            _exit(1); /* the producer may be waiting on us: leave at once */
        }
        check += tag + n;
        free(p);
    }
done:
    consumer_check = check;
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t max_size, queue;
    iters = 800000;
    seed = 42;

    if (argc > 3) {
        fprintf(stderr, "usage: %s [iters [seed]]\n", argv[0]);
        return 2;
    }
    if (argc > 1 && bench_parse_u64("bench_remote_free", argv[1], "iters", 1, UINT64_MAX, &iters))
        return 2;
    if (argc > 2 && bench_parse_u64("bench_remote_free", argv[2], "seed", 0, UINT64_MAX, &seed))
        return 2;
    if (bench_env_u64("bench_remote_free", "HAKMEM_BENCH_MIN_SIZE", 16, 1, UINT32_MAX, &min_size))
        return 2;
    if (bench_env_u64("bench_remote_free", "HAKMEM_BENCH_MAX_SIZE", 1024, 1, UINT32_MAX, &max_size))
        return 2;
    if (bench_env_u64("bench_remote_free", "HAKMEM_BENCH_QUEUE", 1024, 64, 1u << 24, &queue))
        return 2;
    if (max_size < min_size) {
        fprintf(stderr, "bench_remote_free: HAKMEM_BENCH_MAX_SIZE < HAKMEM_BENCH_MIN_SIZE\n");
        return 2;
    }
    if (queue & (queue - 1)) {
        fprintf(stderr, "bench_remote_free: HAKMEM_BENCH_QUEUE must be a power of two\n");
        return 2;
    }
    if (bench_budget_init("bench_remote_free")) return 2;
    span = max_size - min_size + 1; /* <= 2^32 */

    printf("remote_free: iters=%" PRIu64 " seed=%" PRIu64 " min_size=%" PRIu64 " max_size=%" PRIu64
           " queue=%" PRIu64 "\n",
           iters, seed, min_size, max_size, queue);
    fflush(stdout);

    ring.slot = malloc(queue * sizeof *ring.slot);
    if (ring.slot == NULL) {
        fprintf(stderr, "bench_remote_free: out of memory (bookkeeping)\n");
        return 1;
    }
    ring.mask = queue - 1;
    atomic_init(&ring.tail, 0);
    atomic_init(&ring.head, 0);
    atomic_init(&ring.end, SIZE_MAX);

    pthread_t tid;
    if (pthread_barrier_init(&start_barrier, NULL, 2) != 0) {
        fprintf(stderr, "bench_remote_free: pthread_barrier_init failed\n");
        return 1;
    }
    int e = pthread_create(&tid, NULL, consumer, NULL);
    if (e != 0) {
        fprintf(stderr, "bench_remote_free: pthread_create: %s\n", strerror(e));
        return 1;
    }

    uint64_t rng = seed;
    size_t tail = 0, head_seen = 0, unpublished = 0;
    pthread_barrier_wait(&start_barrier);
    double t0 = bench_now();
    bench_budget_start();
    uint64_t done;
    for (done = 0; bench_more(done, iters); done++) {
        uint32_t n;
        unsigned char tag;
        next_block(&rng, &n, &tag);
        unsigned char *p = malloc(n);
        if (p == NULL) {
            fprintf(stderr, "bench_remote_free: malloc(%" PRIu32 ") failed\n", n);
            _exit(1);
        }
        p[0] = tag;
        p[n - 1] = tag;
        if (tail - head_seen == queue) {
            unsigned spins = 0;
            if (unpublished) { /* the consumer may be waiting for these */
                atomic_store_explicit(&ring.tail, tail, memory_order_release);
                unpublished = 0;
            }
            while (tail - (head_seen = atomic_load_explicit(&ring.head, memory_order_acquire)) ==
                   queue)
                backoff(&spins);
        }
        ring.slot[tail & ring.mask] = p;
        tail++;
        if (++unpublished == BATCH) {
            atomic_store_explicit(&ring.tail, tail, memory_order_release);
            unpublished = 0;
        }
    }
    atomic_store_explicit(&ring.tail, tail, memory_order_release);
    atomic_store_explicit(&ring.end, tail, memory_order_release);
    pthread_join(tid, NULL);
    double elapsed = bench_now() - t0;

    pthread_barrier_destroy(&start_barrier);
    free(ring.slot);

    bench_report(done, elapsed, consumer_check, done, iters, "blocks");
    return 0;
}
