/* Pool tier, 8 KiB .. 52 KiB (classes POOL_FIRST .. POOL_END-1): per-thread
 * arenas. Each thread carves blocks of every Pool class from its own arena
 * chunks, which grow 1 -> 2 -> 4 -> 8 MiB (HAKMEM_POOL_ARENA_MB_INIT/MAX) and
 * are registered in the region map, so free finds a block's chunk and owner
 * in O(1). A block has a 16-byte header (an address-derived tag, its class,
 * LIVE or FREE): free validates a pointer exactly and catches every double
 * free of a block still in its chunk. Freed blocks go to the thread cache,
 * then to their chunk's per-class free list; a chunk whose blocks are all
 * back becomes one of the heap's spare chunks (up to twice the largest chunk
 * size in all; they stay with the heap when its thread exits), or is given
 * back to the OS. Blocks freed by another thread go on the owner's
 * lock-free remote stack, which the owner drains before it refills. */
#ifndef HAK_POOL_H
#define HAK_POOL_H

#include "box/diag.h"
#include "box/rmap.h"
#include "tcache.h"

#define POOL_NCLASSES (POOL_END - POOL_FIRST)
#define POOL_HDR      16u

struct pool_heap;

/* Just before every block. */
struct pool_hdr {
    /* The block's tag at both ends of its header: a write of even one byte
     * past the block before (an overflow) or before this block (an
     * underflow) changes one, and free then rejects the block. */
    uint32_t tag_end; /* pool_tag(block), right after the block before */
    uint8_t pad[6];
    uint8_t cls;
    uint8_t state; /* POOL_LIVE with the program, POOL_FREE otherwise */
    uint32_t tag;  /* pool_tag(block), right below the block */
};
_Static_assert(sizeof(struct pool_hdr) == POOL_HDR, "block header size");

enum { POOL_LIVE = 0xa1, POOL_FREE = 0xf7 };

/* The start of an arena chunk (region-aligned). */
struct pool_chunk {
    struct pool_heap *owner; /* never changes: heaps are recycled, not freed */
    size_t size;
    /* Never-carved tail. Written by the owner only, but read by any thread
     * freeing a block of the chunk (pool_is_block): atomic, relaxed (a freer
     * learnt of its block after the carve that moved bump past it). */
    _Atomic(uint8_t *) bump;
    uint8_t *end;
    uint32_t out; /* blocks not on this chunk's free lists */
    void *free[POOL_NCLASSES];
    /* Per class: the heap's list of chunks with free blocks of that class. */
    struct pool_chunk *next[POOL_NCLASSES], *prev[POOL_NCLASSES];
    struct pool_chunk *all_next, *all_prev; /* every chunk of the heap */
};
#define POOL_CHUNK_HDR 512u /* first block header at this offset */
_Static_assert(sizeof(struct pool_chunk) <= POOL_CHUNK_HDR, "chunk header size");

/* Every byte's high bit set: no text or small number written over a tag
 * leaves it whole. */
static inline uint32_t pool_tag(const void *block) {
    return ((uint32_t)((uintptr_t)block >> 4) ^ 0x9e3779b9u) | 0x80808080u;
}

static inline struct pool_hdr *pool_hdr_of(const void *block) {
    return (struct pool_hdr *)block - 1;
}

/* The chunk holding p, whose region entry (kind TIER_POOL) is e: the payload
 * counts regions back to the chunk's first. */
HAK_INLINE struct pool_chunk *pool_chunk_of(const void *p, uint32_t e) {
    return (struct pool_chunk *)(rmap_region_base(p) -
                                 ((uintptr_t)rmap_payload(e) << HAK_REGION_SHIFT));
}

/* True when p is the start of a block of chunk c: inside its carved part,
 * 16-byte aligned, with a header tagged for p. */
HAK_INLINE bool pool_is_block(const struct pool_chunk *c, const void *p) {
    const uint8_t *b = p;
    return ((uintptr_t)b & 15) == 0 && b >= (const uint8_t *)c + POOL_CHUNK_HDR + POOL_HDR &&
           b < atomic_load_explicit(&c->bump, memory_order_relaxed) &&
           pool_hdr_of(b)->tag == pool_tag(b) && pool_hdr_of(b)->tag_end == pool_tag(b);
}

/* A block of cls for a thread whose cache is open and empty for it; NULL
 * (errno ENOMEM) when the tier has no memory. */
void *pool_alloc_slow(uint32_t cls);
/* p (this thread's chunk) did not fit in the thread cache: the push failed,
 * the room is overdrawn. */
void pool_free_slow(void *p, uint32_t cls);
void pool_free_remote(void *p, struct pool_chunk *c);

/* A block of cls from this thread's cache; NULL when it has none
 * (pool_alloc_slow then takes one from the chunks). */
HAK_INLINE void *pool_alloc_fast(uint32_t cls) {
    void *p = tc_pop(cls);
    if (hak_likely(p != NULL)) pool_hdr_of(p)->state = POOL_LIVE;
    return p;
}

/* Free p, whose region entry e says TIER_POOL; `fn` names the API call. */
HAK_INLINE void pool_free(void *p, uint32_t e, const char *fn) {
    struct pool_chunk *c = pool_chunk_of(p, e);
    if (hak_unlikely(!pool_is_block(c, p)))
        return diag_reject(fn, DIAG_INVALID_POINTER, p, TIER_POOL, 0);
    struct pool_hdr *h = pool_hdr_of(p);
    if (hak_unlikely(h->state != POOL_LIVE))
        return diag_reject(fn, h->state == POOL_FREE ? DIAG_DOUBLE_FREE : DIAG_INVALID_POINTER, p,
                           TIER_POOL, h->state == POOL_FREE ? small_class_size[h->cls] : 0);
    h->state = POOL_FREE;
    if (hak_unlikely(c->owner != tc_self.pool)) return pool_free_remote(p, c);
    if (hak_unlikely(!tc_push(h->cls, p))) pool_free_slow(p, h->cls);
}

/* The class of p (TIER_POOL entry e) when it is a live block, else -1. */
static inline int pool_live_class(const void *p, uint32_t e) {
    if (!pool_is_block(pool_chunk_of(p, e), p) || pool_hdr_of(p)->state != POOL_LIVE) return -1;
    return (int)pool_hdr_of(p)->cls;
}

/* The class of p (TIER_POOL entry e); aborts naming p when it is not a live
 * block. */
static inline uint32_t pool_class_of(const void *p, uint32_t e, const char *fn) {
    int cls = pool_live_class(p, e);
    if (cls < 0) diag_bad_pointer(fn, DIAG_INVALID_POINTER, p, TIER_POOL, 0);
    return (uint32_t)cls;
}

/* Thread exit: the cache back to the chunks, the heap to the next thread. */
void pool_thread_exit(void);
/* malloc_trim: drain and give back what the heaps of exited threads hold;
 * true when a chunk was unmapped. */
bool pool_trim(void);
/* This thread's spare chunks go back to the OS when none was taken or added
 * for HAKMEM_AGE_MS; true when they did. */
bool pool_age(void);
/* The background thread (front/background.c): the heaps of exited threads
 * take back the blocks freed to them since, and give their spare chunks back
 * to the OS once none was taken or added for the age; when the next heap's
 * come due, UINT64_MAX when none has spares. */
uint64_t pool_age_parked(void);

/* fork: take every lock of the tier before, release them after (parent and
 * child alike: in the child the forking thread, their owner, is the only one). */
void pool_fork_prepare(void);
void pool_fork_release(bool child);

struct pool_stats {
    uint64_t chunks_mapped, chunks_unmapped, chunks_live, bytes_live, carved_bytes;
    uint64_t remote_frees, drains; /* blocks other threads freed, counted as their
                                    * owner takes them back; those takes */
};
void pool_get_stats(struct pool_stats *s);

/* The tier contract (box/tier.h): pool_age, pool_age_parked, pool_trim,
 * pool_thread_exit, the locks at fork, the counters. */
extern HAK_HIDDEN const struct tier_ops pool_tier;

#endif
