/* A lock-free stack (Treiber's) of records that are never unmapped, only
 * recycled (thread heaps, SuperSlab slab descriptors, whose places stay
 * readable): one compare-and-swap to push or pop, so a thread starting or
 * exiting, or a slab taken or given back, takes no lock that every other
 * one may need.
 *
 * Records are 64-byte aligned, so the top word holds a record's address
 * shifted down by 6 in its low 42 bits (user-space addresses below 2^48 on
 * x86-64 and AArch64) and a count of pops in the high 22, so that a pop
 * racing a pop and a push of the same record (ABA) fails its
 * compare-and-swap instead of installing a stale link, unless 4 million
 * pops and takes came between its two reads. A popper may read the link of
 * a record another thread popped a moment ago: the record is still mapped
 * and readable, and the compare-and-swap then fails. Each record has an
 * atomic link at `link_off`. */
#ifndef HAK_LFSTACK_H
#define HAK_LFSTACK_H

#include "box/arena.h"

#include <assert.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct lf_stack {
    _Atomic uint64_t top;
};

#define LF_ALIGN_SHIFT 6
#define LF_ADDR_BITS   42
#define LF_ADDR_MASK   (((uint64_t)1 << LF_ADDR_BITS) - 1)
#define LF_TAG_ONE     ((uint64_t)1 << LF_ADDR_BITS)

static inline _Atomic(void *) *lf_link(void *rec, size_t link_off) {
    return (_Atomic(void *) *)((char *)rec + link_off);
}

static inline void *lf_addr(uint64_t top) {
    return (void *)(uintptr_t)((top & LF_ADDR_MASK) << LF_ALIGN_SHIFT);
}

/* The address bits of rec (64-byte aligned, below 2^48). */
static inline uint64_t lf_bits(const void *rec) {
    assert(((uintptr_t)rec & ((1u << LF_ALIGN_SHIFT) - 1)) == 0 &&
           (uint64_t)(uintptr_t)rec >> LF_ALIGN_SHIFT <= LF_ADDR_MASK);
    return (uint64_t)(uintptr_t)rec >> LF_ALIGN_SHIFT;
}

static inline void lf_push_chain(struct lf_stack *s, void *first, void *last, size_t link_off) {
    uint64_t old = atomic_load_explicit(&s->top, memory_order_relaxed), new;
    do {
        atomic_store_explicit(lf_link(last, link_off), lf_addr(old), memory_order_relaxed);
        new = (old & ~LF_ADDR_MASK) | lf_bits(first);
    } while (!atomic_compare_exchange_weak_explicit(&s->top, &old, new, memory_order_release,
                                                    memory_order_relaxed));
}

static inline void lf_push(struct lf_stack *s, void *rec, size_t link_off) {
    lf_push_chain(s, rec, rec, link_off);
}

/* The top record, or NULL when the stack is empty. */
static inline void *lf_pop(struct lf_stack *s, size_t link_off) {
    uint64_t old = atomic_load_explicit(&s->top, memory_order_acquire), new;
    void *rec;
    do {
        if ((rec = lf_addr(old)) == NULL) return NULL;
        void *next = atomic_load_explicit(lf_link(rec, link_off), memory_order_relaxed);
        new = ((old & ~LF_ADDR_MASK) + LF_TAG_ONE) | lf_bits(next);
    } while (!atomic_compare_exchange_weak_explicit(&s->top, &old, new, memory_order_acquire,
                                                    memory_order_acquire));
    return rec;
}

/* A fresh array of n records of `size` bytes at `recs`: the first is the
 * caller's, the others pushed (a chunk of heaps: one for the thread that
 * needed it, the rest for the next ones). */
static inline void *lf_push_fresh(struct lf_stack *s, void *recs, size_t n, size_t size,
                                  size_t link_off) {
    char *r = recs;
    if (n < 2) return recs;
    for (size_t i = 1; i + 1 < n; i++)
        atomic_store_explicit(lf_link(r + i * size, link_off), r + (i + 1) * size,
                              memory_order_relaxed);
    lf_push_chain(s, r + size, r + (n - 1) * size, link_off);
    return recs;
}

/* A record for a new owner: a recycled one from s, or when s is empty the
 * first of a fresh, zeroed chunk of `chunk` bytes of records of `size`
 * bytes from the metadata arena, the others pushed for the next owners.
 * NULL when the arena has no memory. The one recycling of per-thread heaps
 * (Tiny's, Pool's): a recycled record keeps what its last owner left in
 * it, which the caller clears or takes over. */
static inline void *lf_pop_or_fresh(struct lf_stack *s, size_t link_off, size_t size,
                                    size_t chunk) {
    void *rec = lf_pop(s, link_off);
    if (rec != NULL) return rec;
    void *recs = arena_meta(chunk);
    return recs ? lf_push_fresh(s, recs, chunk / size, size, link_off) : NULL;
}

/* Every record at once (a chain, linked at link_off), or NULL: a load first,
 * so an empty stack costs no locked instruction. */
static inline void *lf_take_all(struct lf_stack *s) {
    uint64_t old = atomic_load_explicit(&s->top, memory_order_relaxed);
    do {
        if (lf_addr(old) == NULL) return NULL;
    } while (!atomic_compare_exchange_weak_explicit(&s->top, &old,
                                                    (old & ~LF_ADDR_MASK) + LF_TAG_ONE,
                                                    memory_order_acquire, memory_order_relaxed));
    return lf_addr(old);
}

#endif
