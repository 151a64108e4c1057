/* Pool tier slow paths: heaps, arena chunks, per-chunk free lists, remote
 * frees. Everything here is owner-only except the remote stack and the
 * stack of recycled heaps. */
#include "pool.h"

#include "box/arena.h"
#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lfstack.h"
#include "box/remote.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/tier.h"
#include "box/usage.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>

#define POOL_CHUNK_MIN HAK_REGION_SIZE /* an arena unit: what a smaller chunk costs anyway */
#define POOL_LIMIT_DIV 128

/* The remote stack, which other threads write, has a cache line of its own,
 * and heaps start on lines of their own (see tiny.c's heaps). */
struct pool_heap {
    _Alignas(64) _Atomic(void *) remote;     /* blocks freed by other threads */
    _Alignas(64) struct pool_chunk *cur;     /* carving from its tail */
    struct pool_chunk *avail[POOL_NCLASSES]; /* chunks with free blocks, per class */
    struct pool_chunk *chunks;               /* all of them */
    struct pool_chunk *spares;               /* empty chunks kept for the next need */
    size_t spare_bytes;                      /* their bytes, at most pool_spare_max() */
    uint64_t spare_ms;                       /* when a spare was last taken or added */
    size_t next_size;                        /* bytes of the next chunk */
    _Atomic(void *) next_free;               /* on pool_heaps */
};
#define POOL_HEAP_CHUNK (64 * 1024)
#define POOL_HEAP_LINK  offsetof(struct pool_heap, next_free)

/* Heaps of exited threads (their chunks and spares with them) and never
 * used ones: a lock-free stack (box/lfstack.h; heaps are never unmapped), so
 * a thread's start and exit take no lock. The passes over the heaps of
 * exited threads (ageing, trim) take the stack whole, tidy it without a
 * lock and put it back (a thread starting meanwhile gets a fresh heap);
 * pool_lock keeps them one at a time, and keeps fork out of them. */
static struct lf_stack pool_heaps;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
/* Spare bytes of the heaps of exited threads (approximate: changed as they
 * come and go). */
static _Atomic size_t pool_parked_bytes;

static _Atomic uint64_t pool_st_mapped, pool_st_unmapped, pool_st_bytes;
/* Remote frees taken back and drains: counted per thread, published in
 * batches (a drain every few refills: two atomics on a line every thread
 * writes, each time), at thread exit and before a read. */
#define POOL_DRAIN_BATCH  64
#define POOL_REMOTE_BATCH 4096 /* blocks */
static _Atomic int64_t pool_st_remote, pool_st_drains;
static __thread int64_t pool_remote_pending, pool_drains_pending;
/* Carved bytes: counted per thread, published in batches (box/usage.h), at
 * thread exit and before a read. */
static _Atomic int64_t pool_st_carved;
static __thread int64_t pool_carved_pending;

static inline uint32_t pool_k(uint32_t cls) {
    return cls - POOL_FIRST;
}

/* This thread's pending counts, published. */
static void pool_flush_counts(void) {
    usage_batch_flush(&pool_st_carved, &pool_carved_pending);
    usage_batch_flush(&pool_st_remote, &pool_remote_pending);
    usage_batch_flush(&pool_st_drains, &pool_drains_pending);
}

/* ---- heaps ----------------------------------------------------------------------------- */

static struct pool_heap *pool_heap_get(void) {
    struct pool_heap *h = lf_pop_or_fresh(&pool_heaps, POOL_HEAP_LINK, sizeof *h, POOL_HEAP_CHUNK);
    if (h == NULL) return NULL;
    /* An exited thread's heap: its chunks come along. */
    atomic_fetch_sub_explicit(&pool_parked_bytes, h->spare_bytes, memory_order_relaxed);
    /* With none left, it grows from the start again, as a new one. */
    if (h->chunks == NULL) h->next_size = (size_t)hak_cfg.pool_arena_mb_init << 20;
    return h;
}

/* ---- chunks ---------------------------------------------------------------------------- */

static void pool_avail_push(struct pool_heap *h, struct pool_chunk *c, uint32_t k) {
    c->prev[k] = NULL;
    c->next[k] = h->avail[k];
    if (h->avail[k]) h->avail[k]->prev[k] = c;
    h->avail[k] = c;
}

static void pool_avail_unlink(struct pool_heap *h, struct pool_chunk *c, uint32_t k) {
    if (c->prev[k])
        c->prev[k]->next[k] = c->next[k];
    else
        h->avail[k] = c->next[k];
    if (c->next[k]) c->next[k]->prev[k] = c->prev[k];
}

static void pool_all_link(struct pool_heap *h, struct pool_chunk *c) {
    c->all_prev = NULL;
    c->all_next = h->chunks;
    if (h->chunks) h->chunks->all_prev = c;
    h->chunks = c;
}

/* A chunk for h to carve from, made its current one: the spare, else a new
 * mapping; false when out of memory. */
static bool pool_chunk_new(struct pool_heap *h) {
    struct pool_chunk *c = h->spares;
    if (c) {
        h->spares = c->all_next;
        h->spare_bytes -= c->size;
        h->spare_ms = hak_now_ms();
        pool_all_link(h, c);
        h->cur = c;
        return true;
    }
    /* Under an address-space limit a chunk's uncarved tail is space other
     * blocks cannot have: chunks of at most 1/128 of the limit, and when
     * even that is refused, one of the smallest size. */
    size_t size = h->next_size, cap = os_as_limit() / POOL_LIMIT_DIV & ~(POOL_CHUNK_MIN - 1);
    if (size > cap) size = cap > POOL_CHUNK_MIN ? cap : POOL_CHUNK_MIN;
    c = arena_alloc(size);
    if (c == NULL && size > POOL_CHUNK_MIN) c = arena_alloc(size = POOL_CHUNK_MIN);
    if (c == NULL) return false;
    if (!rmap_mark_span(c, size, TIER_POOL)) {
        arena_free(c, size);
        return false;
    }
    c->owner = h;
    c->size = size;
    atomic_store_explicit(&c->bump, (uint8_t *)c + POOL_CHUNK_HDR, memory_order_relaxed);
    c->end = (uint8_t *)c + size - ARENA_GUARD; /* (the guard page: arena.h) */
    pool_all_link(h, c);
    h->cur = c;
    size_t max = (size_t)hak_cfg.pool_arena_mb_max << 20;
    h->next_size = size * 2 <= max ? size * 2 : max;
    atomic_fetch_add_explicit(&pool_st_mapped, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool_st_bytes, size, memory_order_relaxed);
    return true;
}

/* Bytes of c carved into blocks (with their headers). */
static size_t pool_carved(struct pool_chunk *c) {
    uint8_t *bump = atomic_load_explicit(&c->bump, memory_order_relaxed);
    return (size_t)(bump - (uint8_t *)c - POOL_CHUNK_HDR);
}

/* The tier's bytes in use (box/usage.h) are its carved bytes: a Pool-sized
 * malloc and free take the slow paths below nearly every time (a thread
 * caches 1 to 6 blocks of a class), where counting each block cost 41
 * instructions a pair (bench/instr.sh, 20000 B: 181.8 -> 222.9); carving
 * and emptying a chunk are rare. Out of line: inlined, it cost
 * pool_alloc_slow a register saved and restored on every call. */
__attribute__((noinline)) static void pool_carved_add(int64_t bytes) {
    /* Carving (every thread, often) is counted per thread and published in
     * batches; a chunk emptied or unmapped (rare, and maybe by a thread that
     * never reads the stats: the background one) goes to the total at once,
     * so the published total never exceeds what the chunks hold (mallinfo2:
     * uordblks <= arena), and no thread's exit leaves a change pending. */
    if (bytes > 0)
        usage_batch_add(&pool_st_carved, &pool_carved_pending, bytes, USAGE_BATCH_SLACK);
    else
        atomic_fetch_add_explicit(&pool_st_carved, bytes, memory_order_relaxed);
    usage_add(bytes);
}

static void pool_chunk_unmap(struct pool_chunk *c) {
    size_t size = c->size, carved = pool_carved(c);
    rmap_clear_span(c, size);
    arena_free(c, size);
    atomic_fetch_add_explicit(&pool_st_unmapped, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&pool_st_bytes, size, memory_order_relaxed);
    pool_carved_add(-(int64_t)carved);
}

/* Empty chunks a heap keeps: twice the largest chunk, so a burst freed and
 * allocated again, or a thread pool's threads exiting and starting (the heap
 * and its spares go to the next thread), make no syscall. malloc_trim gives
 * them back. */
static size_t pool_spare_max(void) {
    return (size_t)hak_cfg.pool_arena_mb_max << 21;
}

/* Every block of c is back on its free lists: it becomes one of h's spares,
 * as if new, or goes back to the OS when they are at their bound. */
static void pool_chunk_release(struct pool_heap *h, struct pool_chunk *c) {
    for (uint32_t k = 0; k < POOL_NCLASSES; k++) {
        if (c->free[k]) pool_avail_unlink(h, c, k);
        c->free[k] = NULL;
    }
    if (c->all_prev)
        c->all_prev->all_next = c->all_next;
    else
        h->chunks = c->all_next;
    if (c->all_next) c->all_next->all_prev = c->all_prev;
    if (h->cur == c) h->cur = NULL;
    if (h->spare_bytes + c->size <= pool_spare_max()) {
        pool_carved_add(-(int64_t)pool_carved(c));
        atomic_store_explicit(&c->bump, (uint8_t *)c + POOL_CHUNK_HDR, memory_order_relaxed);
        c->all_next = h->spares;
        h->spares = c;
        h->spare_bytes += c->size;
        h->spare_ms = hak_now_ms();
        return;
    }
    pool_chunk_unmap(c);
}

/* Block b of class cls comes back to its chunk (owned by h). A chunk whose
 * blocks are all back is unmapped unless it is the one being carved. */
static void pool_give(struct pool_heap *h, void *b, uint32_t cls) {
    struct pool_chunk *c = pool_chunk_of(b, rmap_get(b));
    uint32_t k = pool_k(cls);
    if (c->free[k] == NULL) pool_avail_push(h, c, k);
    *(void **)b = c->free[k];
    c->free[k] = b;
    if (--c->out == 0 && c != h->cur) pool_chunk_release(h, c);
}

/* Take the remote stack: every block on it comes back to its chunk. The
 * blocks are counted as remote frees here, once a stack, not by each
 * remote free (a shared counter written on every one). */
static void pool_drain(struct pool_heap *h) {
    void *b = remote_take(&h->remote);
    if (b == NULL) return;
    uint64_t n = 0;
    for (; b; n++) {
        void *next = *(void **)b;
        pool_give(h, b, pool_hdr_of(b)->cls);
        b = next;
    }
    usage_batch_add(&pool_st_remote, &pool_remote_pending, (int64_t)n, POOL_REMOTE_BATCH);
    usage_batch_add(&pool_st_drains, &pool_drains_pending, 1, POOL_DRAIN_BATCH);
}

/* ---- allocation and free -------------------------------------------------------------- */

static void *pool_hand_out(struct pool_chunk *c, void *b, uint32_t cls) {
    c->out++;
    struct pool_hdr *hd = pool_hdr_of(b);
    hd->tag = hd->tag_end = pool_tag(b);
    hd->cls = (uint8_t)cls;
    hd->state = POOL_LIVE;
    return b;
}

void *pool_alloc_slow(uint32_t cls) {
    struct pool_heap *h = tc_self.pool;
    if (h == NULL && (h = tc_self.pool = pool_heap_get()) == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    /* Free blocks of the chunks first; when there are none, the blocks
     * other threads gave back (a drain that brings one of this class saves
     * carving). Draining only then takes the remote stack, a line the
     * freers write, once a batch rather than on every call. */
    uint32_t k = pool_k(cls);
    struct pool_chunk *c = h->avail[k];
    if (c == NULL) {
        pool_drain(h);
        c = h->avail[k];
    }
    if (c) {
        void *b = c->free[k];
        c->free[k] = *(void **)b;
        if (c->free[k] == NULL) pool_avail_unlink(h, c, k);
        return pool_hand_out(c, b, cls);
    }
    size_t stride = POOL_HDR + small_class_size[cls];
    c = h->cur;
    if (c == NULL ||
        (size_t)(c->end - atomic_load_explicit(&c->bump, memory_order_relaxed)) < stride) {
        /* The old chunk's tail (less than a block) is left; the chunk goes
         * when its blocks are all back. */
        if (c && c->out == 0) pool_chunk_release(h, c);
        if (!pool_chunk_new(h)) {
            errno = ENOMEM;
            return NULL;
        }
        c = h->cur;
    }
    pool_carved_add((int64_t)stride); /* (first: no block kept across the call) */
    uint8_t *bump = atomic_load_explicit(&c->bump, memory_order_relaxed);
    void *b = bump + POOL_HDR;
    atomic_store_explicit(&c->bump, bump + stride, memory_order_relaxed);
    return pool_hand_out(c, b, cls);
}

/* The chain b of n blocks of cls, off this thread's cache, back to their
 * chunks (tcache.h's give-back). */
static void pool_give_back(uint32_t cls, void *b, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        void *next = *(void **)b;
        pool_give(tc_self.pool, b, cls);
        b = next;
    }
}

/* The list is full: p alone goes back, not half the list (tcache.h). A
 * Pool miss takes one block from the chunks, not a batch, so a list halved
 * here would send the next allocations there one at a time (bench_fixed_size
 * at 20000 B: 47 instructions more a pair). */
void pool_free_slow(void *p, uint32_t cls) {
    tc_refund(cls);
    pool_give(tc_self.pool, p, cls);
}

void pool_free_remote(void *p, struct pool_chunk *c) {
    /* The chunk keeps p counted out until its owner drains it, so it stays
     * mapped; the heap is never unmapped. */
    remote_push(&c->owner->remote, p, (void **)p);
}

/* ---- thread exit, trim, fork ----------------------------------------------------------- */

/* Every spare chunk of h back to the OS. */
static void pool_spares_unmap(struct pool_heap *h) {
    while (h->spares) {
        struct pool_chunk *c = h->spares;
        h->spares = c->all_next;
        h->spare_bytes -= c->size;
        pool_chunk_unmap(c);
    }
}

/* Tidy h: remote blocks to their chunks, the current chunk among the spares
 * when nothing of it is out, and with `all` every spare back to the OS. */
static bool pool_heap_tidy(struct pool_heap *h, bool all) {
    uint64_t before = atomic_load_explicit(&pool_st_unmapped, memory_order_relaxed);
    pool_drain(h);
    /* The current chunk stays current while it has blocks out: dropped, its
     * uncarved tail would be lost until they all came back. */
    if (h->cur && h->cur->out == 0) pool_chunk_release(h, h->cur);
    if (all) pool_spares_unmap(h);
    return atomic_load_explicit(&pool_st_unmapped, memory_order_relaxed) != before;
}

void pool_thread_exit(void) {
    struct pool_heap *h = tc_self.pool;
    if (h == NULL) return;
    tc_flush_all(POOL_FIRST, POOL_END, pool_give_back);
    pool_heap_tidy(h, false); /* the spares go with the heap to the next thread */
    tc_self.pool = NULL;
    /* ...as far as the exited threads' spares stay within twice a heap's
     * bound together: with many threads gone, what is left goes back. */
    struct pool_chunk *drop = NULL;
    while (h->spares &&
           atomic_load_explicit(&pool_parked_bytes, memory_order_relaxed) + h->spare_bytes >
               2 * pool_spare_max()) {
        struct pool_chunk *c = h->spares;
        h->spares = c->all_next;
        h->spare_bytes -= c->size;
        c->all_next = drop;
        drop = c;
    }
    atomic_fetch_add_explicit(&pool_parked_bytes, h->spare_bytes, memory_order_relaxed);
    lf_push(&pool_heaps, h, POOL_HEAP_LINK);
    while (drop) {
        struct pool_chunk *c = drop;
        drop = c->all_next;
        pool_chunk_unmap(c);
    }
    pool_flush_counts(); /* last: a thread's counts left pending at its exit would be lost */
    /* Its spares age now, with no thread to look at them. The background
     * thread arms its bell, then looks (pool_each_parked): one of the two
     * sees the other's store. */
    atomic_thread_fence(memory_order_seq_cst);
    bell_ring();
}

bool pool_age(void) {
    struct pool_heap *h = tc_self.pool;
    if (h == NULL || h->spares == NULL || hak_now_ms() - h->spare_ms < hak_cfg.age_ms) return false;
    pool_spares_unmap(h); /* none taken or added for the age: the need has passed */
    return true;
}

/* Visit every heap of an exited thread: the stack taken whole, each heap
 * ours while it is off it, then put back; the parked bytes follow what the
 * visits gave back. */
static void pool_each_parked(void (*visit)(struct pool_heap *, void *), void *arg) {
    atomic_thread_fence(memory_order_seq_cst); /* (see pool_thread_exit) */
    hak_lock(&pool_lock);
    struct pool_heap *first = lf_take_all(&pool_heaps), *last = NULL;
    size_t before = 0, after = 0;
    for (struct pool_heap *h = first; h;
         last = h, h = atomic_load_explicit(&h->next_free, memory_order_relaxed)) {
        before += h->spare_bytes;
        visit(h, arg);
        after += h->spare_bytes;
    }
    if (first) lf_push_chain(&pool_heaps, first, last, POOL_HEAP_LINK);
    atomic_fetch_sub_explicit(&pool_parked_bytes, before - after, memory_order_relaxed);
    hak_unlock(&pool_lock);
}

static void pool_age_one(struct pool_heap *h, void *arg) {
    uint64_t *next = arg, age = hak_cfg.age_ms;
    pool_heap_tidy(h, false);    /* blocks freed to it since its thread exited */
    uint64_t now = hak_now_ms(); /* (after the tidy, which may stamp spare_ms) */
    if (h->spares && now >= h->spare_ms && now - h->spare_ms >= age)
        pool_spares_unmap(h);
    else if (h->spares && h->spare_ms + age < *next)
        *next = h->spare_ms + age;
}

uint64_t pool_age_parked(void) {
    uint64_t next = UINT64_MAX;
    pool_each_parked(pool_age_one, &next);
    return next;
}

static void pool_trim_one(struct pool_heap *h, void *arg) {
    *(bool *)arg |= pool_heap_tidy(h, true);
}

bool pool_trim(void) {
    bool any = false;
    struct pool_heap *mine = tc_self.pool;
    if (mine) {
        tc_flush_all(POOL_FIRST, POOL_END, pool_give_back);
        any |= pool_heap_tidy(mine, true);
    }
    pool_each_parked(pool_trim_one, &any);
    return any;
}

void pool_fork_prepare(void) {
    pthread_mutex_lock(&pool_lock);
}
void pool_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    pthread_mutex_unlock(&pool_lock);
}

void pool_get_stats(struct pool_stats *s) {
    s->chunks_mapped = atomic_load_explicit(&pool_st_mapped, memory_order_relaxed);
    s->chunks_unmapped = atomic_load_explicit(&pool_st_unmapped, memory_order_relaxed);
    s->chunks_live = s->chunks_mapped - s->chunks_unmapped;
    s->bytes_live = atomic_load_explicit(&pool_st_bytes, memory_order_relaxed);
    pool_flush_counts(); /* this thread's, published (others' may be pending) */
    int64_t carved = atomic_load_explicit(&pool_st_carved, memory_order_relaxed);
    s->carved_bytes = carved > 0 ? (uint64_t)carved : 0;
    s->remote_frees = (uint64_t)atomic_load_explicit(&pool_st_remote, memory_order_relaxed);
    s->drains = (uint64_t)atomic_load_explicit(&pool_st_drains, memory_order_relaxed);
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void pool_collect(enum tier_collect kind, struct tier_done *done) {
    switch (kind) {
    case COLLECT_THREAD:
        pool_age();
        break;
    case COLLECT_IDLE:
        tier_due(done, pool_age_parked());
        break;
    case COLLECT_TRIM:
        tier_released(done, pool_trim());
        break;
    case COLLECT_EXIT:
        pool_thread_exit();
        break;
    default:
        break;
    }
}

static void pool_tier_stats(struct tier_stats *s) {
    struct pool_stats o;
    pool_get_stats(&o);
    s->mapped += o.bytes_live;
    s->carved += o.carved_bytes;
    tier_row(s, "pool.chunks_mapped", o.chunks_mapped);
    tier_row(s, "pool.chunks_unmapped", o.chunks_unmapped);
    tier_row(s, "pool.bytes_mapped", o.bytes_live);
    tier_row(s, "pool.carved_bytes", o.carved_bytes);
    tier_row(s, "pool.remote_frees", o.remote_frees);
    tier_row(s, "pool.drains", o.drains);
}

const struct tier_ops pool_tier = {.name = "pool",
                                   .collect = pool_collect,
                                   .fork_prepare = pool_fork_prepare,
                                   .fork_release = pool_fork_release,
                                   .stats = pool_tier_stats};
