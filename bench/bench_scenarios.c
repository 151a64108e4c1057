/* bench_scenarios — the three application-shaped workloads the original hakmem
 * measured: string-builder (8-64 B), json (64 KiB documents), mir (256 KiB
 * buffers).
 *
 * usage: bench_scenarios [scenario [iters [seed]]]   (defaults string 1000000 42)
 *        scenario is one of string, json, mir
 *
 * string: a ring of STRING_RING (64) live strings. One op builds one string and
 *   frees the oldest one: the target length L is uniform in [8, 64]; the
 *   builder mallocs 8 bytes, then appends chunks of 1..16 bytes, doubling the
 *   capacity with realloc (8 -> 16 -> 32 -> 64) whenever a chunk does not fit,
 *   until the string holds L bytes (about 2.2 reallocs per string on
 *   average). The new string replaces the ring's oldest one, which is checked
 *   and freed. So one op = 1 malloc + 0..3 reallocs + 1 free.
 * json: one op is one document: malloc a 64 KiB buffer, write a byte at the end
 *   of each of its 16 pages of 4 KiB, allocate JSON_NODES (16) nodes of sizes
 *   uniform in [32, 256] that belong to it (their pointers and sizes are stored
 *   in the document's first bytes, their first and last byte tagged), then
 *   read everything back, free the nodes and free the document. One op = 17
 *   mallocs + 17 frees, nothing live between ops.
 * mir: a ring of MIR_RING (4) live 256 KiB buffers. One op checks and frees the
 *   oldest buffer and allocates a new one, writing a byte in each of its 64
 *   pages of 4 KiB. One op = 1 malloc + 1 free + 64 page writes (page faults
 *   if the allocator gave the memory back to the kernel).
 *
 * Every block is tagged when written and checked before it is freed (for
 * strings, also after each realloc: the bytes written before must survive);
 * a mismatch (heap corruption) ends the run with status 1 and no Throughput
 * line. Only the `iters` ops are timed; the rings are filled before and
 * emptied after. Sizes, lengths and tags come from the seeded PRNG. With a
 * time budget (HAKMEM_BENCH_BUDGET, bench_util.h) the unit is one op: the loop
 * stops at the first op after the budget is spent.
 *
 * Output (stdout):
 *   scenario: name=... iters=... seed=...
 *   Throughput = <integer> ops/s
 *   Peak RSS = <integer> KiB
 * With HAKMEM_BENCH_CHECK=1 a checksum of the run goes to stderr; it depends
 * only on the parameters, so it shows that the run is deterministic. */
#include "bench_util.h"

#define STRING_RING 64
#define STRING_MIN  8
#define STRING_MAX  64
#define STRING_INIT 8  /* first malloc of a string */
#define CHUNK_MAX   16 /* appended chunks are 1..CHUNK_MAX bytes */

#define JSON_DOC   (64 * 1024)
#define JSON_NODES 16
#define NODE_MIN   32
#define NODE_MAX   256

#define MIR_BUF  (256 * 1024)
#define MIR_RING 4

#define PAGE 4096

static void corrupted(const char *what, const void *p, size_t n) {
    fprintf(stderr, "bench_scenarios: %s %p (size %zu) corrupted\n", what, p, n);
    exit(1);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "bench_scenarios: malloc(%zu) failed\n", n);
        exit(1);
    }
    return p;
}

/* ---- string ------------------------------------------------------------------ */

struct str {
    unsigned char *p;
    uint32_t len;
    unsigned char tag;
};

/* Build a string of random length in [STRING_MIN, STRING_MAX] by appends and
 * realloc growth. Byte i of the string is tag + i. */
static void string_build(uint64_t *rng, struct str *s) {
    uint64_t x = bench_rng_next(rng);
    uint32_t target =
        STRING_MIN + (uint32_t)bench_bounded((uint32_t)x, STRING_MAX - STRING_MIN + 1);
    unsigned char tag = (unsigned char)(x >> 32);
    uint32_t cap = STRING_INIT, len = 0;
    unsigned char *p = xmalloc(cap);
    uint64_t chunks = 0; /* 4 random bits per chunk length */
    for (unsigned used = 16; len < target; used++) {
        if (used == 16) {
            chunks = bench_rng_next(rng);
            used = 0;
        }
        uint32_t c = 1 + (uint32_t)(chunks & (CHUNK_MAX - 1));
        chunks >>= 4;
        if (c > target - len) c = target - len;
        if (len + c > cap) {
            while (len + c > cap)
                cap *= 2;
            unsigned char *q = realloc(p, cap);
            if (q == NULL) {
                fprintf(stderr, "bench_scenarios: realloc(%" PRIu32 ") failed\n", cap);
                exit(1);
            }
            p = q;
            /* What was appended so far must have moved with the block. */
            if (len > 0 && (p[0] != tag || p[len - 1] != (unsigned char)(tag + len - 1)))
                corrupted("string", p, len);
        }
        for (uint32_t i = 0; i < c; i++)
            p[len + i] = (unsigned char)(tag + len + i);
        len += c;
    }
    s->p = p;
    s->len = len;
    s->tag = tag;
}

static uint64_t string_free(struct str *s) {
    const unsigned char *p = s->p;
    uint32_t n = s->len;
    if (p[0] != s->tag || p[n / 2] != (unsigned char)(s->tag + n / 2) ||
        p[n - 1] != (unsigned char)(s->tag + n - 1))
        corrupted("string", p, n);
    free(s->p);
    return s->tag + n;
}

/* The scenarios' timed loops: `iters` ops at most (the number done in *done),
 * from the seeded PRNG `rng`, adding to *check; each returns its time. */
static double run_string(uint64_t iters, uint64_t *done, uint64_t *rng, uint64_t *check) {
    struct str ring[STRING_RING];
    for (int i = 0; i < STRING_RING; i++)
        string_build(rng, &ring[i]);
    double t0 = bench_now();
    bench_budget_start();
    uint64_t i;
    for (i = 0; bench_more(i, iters); i++) {
        struct str *s = &ring[i % STRING_RING];
        *check += string_free(s);
        string_build(rng, s);
    }
    double elapsed = bench_now() - t0;
    *done = i;
    for (int i = 0; i < STRING_RING; i++)
        *check += string_free(&ring[i]);
    return elapsed;
}

/* ---- json -------------------------------------------------------------------- */

/* The start of a document: its nodes. */
struct doc_head {
    unsigned char *node[JSON_NODES];
    uint32_t node_len[JSON_NODES];
    unsigned char tag;
};

static uint64_t json_doc(uint64_t *rng) {
    uint64_t x = bench_rng_next(rng);
    unsigned char tag = (unsigned char)(x >> 32);
    unsigned char *doc = xmalloc(JSON_DOC);
    struct doc_head *h = (struct doc_head *)doc;
    h->tag = tag;
    for (size_t off = PAGE - 1; off < JSON_DOC; off += PAGE)
        doc[off] = (unsigned char)(tag + off / PAGE);
    for (int k = 0; k < JSON_NODES; k++) {
        if (k % 2 == 0) x = bench_rng_next(rng);
        uint32_t n = NODE_MIN + (uint32_t)bench_bounded((uint32_t)x, NODE_MAX - NODE_MIN + 1);
        x >>= 32;
        unsigned char *p = xmalloc(n);
        p[0] = (unsigned char)(tag + k);
        p[n - 1] = (unsigned char)(tag + k);
        h->node[k] = p;
        h->node_len[k] = n;
    }

    /* Read it back and free it. */
    uint64_t check = 0;
    for (size_t off = PAGE - 1; off < JSON_DOC; off += PAGE)
        if (doc[off] != (unsigned char)(tag + off / PAGE))
            corrupted("json document", doc, JSON_DOC);
    if (h->tag != tag) corrupted("json document", doc, JSON_DOC);
    for (int k = 0; k < JSON_NODES; k++) {
        unsigned char *p = h->node[k];
        uint32_t n = h->node_len[k];
        if (p[0] != (unsigned char)(tag + k) || p[n - 1] != (unsigned char)(tag + k))
            corrupted("json node", p, n);
        check += p[0] + n;
        free(p);
    }
    free(doc);
    return check + tag;
}

static double run_json(uint64_t iters, uint64_t *done, uint64_t *rng, uint64_t *check) {
    double t0 = bench_now();
    bench_budget_start();
    uint64_t i;
    for (i = 0; bench_more(i, iters); i++)
        *check += json_doc(rng);
    double elapsed = bench_now() - t0;
    *done = i;
    return elapsed;
}

/* ---- mir --------------------------------------------------------------------- */

static unsigned char *mir_alloc(unsigned char tag) {
    unsigned char *p = xmalloc(MIR_BUF);
    for (size_t off = 0; off < MIR_BUF; off += PAGE)
        p[off] = (unsigned char)(tag + off / PAGE);
    return p;
}

static uint64_t mir_free(unsigned char *p, unsigned char tag) {
    for (size_t off = 0; off < MIR_BUF; off += PAGE)
        if (p[off] != (unsigned char)(tag + off / PAGE)) corrupted("mir buffer", p, MIR_BUF);
    free(p);
    return tag;
}

static double run_mir(uint64_t iters, uint64_t *done, uint64_t *rng, uint64_t *check) {
    unsigned char *ring[MIR_RING];
    unsigned char tags[MIR_RING];
    for (int i = 0; i < MIR_RING; i++) {
        tags[i] = (unsigned char)(bench_rng_next(rng) >> 32);
        ring[i] = mir_alloc(tags[i]);
    }
    double t0 = bench_now();
    bench_budget_start();
    uint64_t i;
    for (i = 0; bench_more(i, iters); i++) {
        unsigned k = (unsigned)(i % MIR_RING);
        *check += mir_free(ring[k], tags[k]);
        tags[k] = (unsigned char)(bench_rng_next(rng) >> 32);
        ring[k] = mir_alloc(tags[k]);
    }
    double elapsed = bench_now() - t0;
    *done = i;
    for (int i = 0; i < MIR_RING; i++)
        *check += mir_free(ring[i], tags[i]);
    return elapsed;
}

int main(int argc, char **argv) {
    const char *scenario = "string";
    uint64_t iters = 1000000, seed = 42;

    if (argc > 4) {
        fprintf(stderr, "usage: %s [string|json|mir [iters [seed]]]\n", argv[0]);
        return 2;
    }
    if (argc > 1) scenario = argv[1];
    double (*run)(uint64_t, uint64_t *, uint64_t *, uint64_t *);
    if (strcmp(scenario, "string") == 0)
        run = run_string;
    else if (strcmp(scenario, "json") == 0)
        run = run_json;
    else if (strcmp(scenario, "mir") == 0)
        run = run_mir;
    else {
        fprintf(stderr, "bench_scenarios: unknown scenario '%s' (want string, json or mir)\n",
                scenario);
        return 2;
    }
    if (argc > 2 && bench_parse_u64("bench_scenarios", argv[2], "iters", 1, UINT64_MAX, &iters))
        return 2;
    if (argc > 3 && bench_parse_u64("bench_scenarios", argv[3], "seed", 0, UINT64_MAX, &seed))
        return 2;
    if (bench_budget_init("bench_scenarios")) return 2;

    printf("scenario: name=%s iters=%" PRIu64 " seed=%" PRIu64 "\n", scenario, iters, seed);
    fflush(stdout);

    uint64_t rng = seed, check = 0, done;
    double elapsed = run(iters, &done, &rng, &check);
    bench_report(done, elapsed, check, done, iters, "ops");
    return 0;
}
