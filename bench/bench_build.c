/* bench_build — threads each building and tearing down linked structures of
 * mixed small blocks.
 *
 * usage: bench_build [rounds [threads [seed]]]              (defaults 400 2 42)
 * env:   HAKMEM_BENCH_NODES (default 4000): nodes per structure
 *
 * Each thread, each round, builds a structure of `nodes` nodes: a node (40
 * to 128 bytes) holding a name (8 to 200 bytes, most of them short) and,
 * for one node in eight, an array (256 to 2048 bytes), linked into a list;
 * it writes every block, then walks the structure, checks it and frees it
 * node by node in the order it was built. One structure in four is kept for
 * the next three rounds before it is torn down, so lifetimes overlap, as the
 * parse trees, symbol tables and request objects of a program working on
 * several things at once do (mimalloc-bench's alloc-test). The threads share
 * nothing: every block is freed by the thread that allocated it.
 *
 * One op is one malloc+free pair. With a time budget (HAKMEM_BENCH_BUDGET,
 * bench_util.h) the unit is a round of one thread; each thread stops at the
 * first round past the budget.
 *
 * Output (stdout): a parameter line, then Throughput, Peak RSS and Page
 * faults (bench_util.h). Corruption: exit status 1, no Throughput line. */
#include "bench_util.h"

#include <pthread.h>

static const char *prog = "bench_build";

#define KEEP_EVERY 4 /* one structure in KEEP_EVERY is kept ... */
#define KEEP_FOR   3 /* ... for this many rounds */

struct node {
    struct node *next;
    unsigned char *name, *array;
    uint32_t name_len, array_len, node_len;
    unsigned char tag;
};

struct worker {
    uint64_t rounds, nodes, seed;
    uint64_t pairs, check, done;
    struct node *kept[KEEP_FOR]; /* structures waiting, oldest first */
    int failed;
};

static void *alloc_or_die(size_t n) {
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "%s: malloc(%zu) failed\n", prog, n);
        exit(1);
    }
    return p;
}

/* A name's length: most of them short, as identifiers and keys are. */
static uint32_t name_len(uint64_t *rng) {
    uint64_t r = bench_rng_next(rng);
    if ((r & 3) != 0) return 8 + (uint32_t)bench_bounded((uint32_t)(r >> 32), 25);
    return 8 + (uint32_t)bench_bounded((uint32_t)(r >> 32), 193);
}

static struct node *build(struct worker *w, uint64_t *rng, unsigned char tag) {
    struct node *head = NULL, **tail = &head;
    for (uint64_t i = 0; i < w->nodes; i++) {
        uint64_t r = bench_rng_next(rng);
        uint32_t nlen = (uint32_t)sizeof(struct node) +
                        (uint32_t)bench_bounded((uint32_t)r, 129 - sizeof(struct node));
        struct node *n = alloc_or_die(nlen);
        n->next = NULL;
        n->node_len = nlen;
        n->tag = tag;
        n->name_len = name_len(rng);
        n->name = alloc_or_die(n->name_len);
        memset(n->name, tag, n->name_len);
        n->array = NULL;
        n->array_len = 0;
        if ((r >> 32 & 7) == 0) {
            n->array_len = 256 + (uint32_t)bench_bounded((uint32_t)(r >> 35), 1793);
            n->array = alloc_or_die(n->array_len);
            memset(n->array, tag ^ 0x5a, n->array_len);
        }
        w->pairs += 2 + (n->array != NULL);
        *tail = n;
        tail = &n->next;
    }
    return head;
}

static int tear_down(struct worker *w, struct node *n) {
    while (n) {
        struct node *next = n->next;
        if (n->name[0] != n->tag || n->name[n->name_len - 1] != n->tag ||
            (n->array && n->array[n->array_len - 1] != (unsigned char)(n->tag ^ 0x5a))) {
            fprintf(stderr, "%s: node %p corrupted\n", prog, (void *)n);
            return 1;
        }
        w->check += n->name_len + n->array_len + n->node_len;
        free(n->name);
        free(n->array);
        free(n);
        n = next;
    }
    return 0;
}

static void *run(void *arg) {
    struct worker *w = arg;
    uint64_t rng = w->seed;
    for (uint64_t i = 0; bench_more(i, w->rounds) && !w->failed; i++) {
        struct node *s = build(w, &rng, (unsigned char)(i * 7 + 1));
        if (i % KEEP_EVERY == 0) {
            /* Kept: the oldest kept one goes instead. */
            struct node *old = w->kept[0];
            memmove(&w->kept[0], &w->kept[1], (KEEP_FOR - 1) * sizeof w->kept[0]);
            w->kept[KEEP_FOR - 1] = s;
            s = old;
        }
        w->failed = tear_down(w, s);
        w->done++;
    }
    for (int k = 0; k < KEEP_FOR && !w->failed; k++)
        w->failed = tear_down(w, w->kept[k]);
    return NULL;
}

int main(int argc, char **argv) {
    uint64_t rounds = 400, threads = 2, seed = 42, nodes;
    const struct bench_arg args[] = {{"rounds", 1, UINT64_MAX, &rounds},
                                     {"threads", 1, 1024, &threads},
                                     {"seed", 0, UINT64_MAX, &seed}};
    if (bench_args(prog, argc, argv, args, 3)) return 2;
    if (bench_env_u64(prog, "HAKMEM_BENCH_NODES", 4000, 1, 1u << 24, &nodes)) return 2;
    if (bench_budget_init(prog)) return 2;
    printf("build: rounds=%" PRIu64 " threads=%" PRIu64 " seed=%" PRIu64 " nodes=%" PRIu64 "\n",
           rounds, threads, seed, nodes);
    fflush(stdout);

    struct worker *w = calloc(threads, sizeof *w);
    pthread_t *t = calloc(threads, sizeof *t);
    if (w == NULL || t == NULL) {
        fprintf(stderr, "%s: out of memory (bookkeeping)\n", prog);
        return 1;
    }
    double t0 = bench_now();
    bench_budget_start();
    bench_count_begin();
    for (uint64_t i = 0; i < threads; i++) {
        w[i] = (struct worker){.rounds = rounds, .nodes = nodes, .seed = seed + i * 0x9e37};
        if (pthread_create(&t[i], NULL, run, &w[i]) != 0) {
            fprintf(stderr, "%s: cannot start thread %" PRIu64 "\n", prog, i);
            return 1;
        }
    }
    uint64_t pairs = 0, check = 0, done = 0;
    int failed = 0;
    for (uint64_t i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        pairs += w[i].pairs;
        check += w[i].check;
        done += w[i].done;
        failed |= w[i].failed;
    }
    double elapsed = bench_now() - t0;
    bench_count_end(pairs);
    free(w);
    free(t);
    if (failed) return 1;
    bench_report(pairs, elapsed, check, done, rounds * threads, "rounds");
    return 0;
}
