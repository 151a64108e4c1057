/* Small tier, 1 KiB .. HAK_SMALL_MAX: size-classed blocks carved from 2 MiB
 * regions (one class per region, recorded in the region map), served through
 * the thread cache (core/tcache.h) in front of a locked per-class free list.
 *
 * It also serves, uncached, Tiny-class requests of a thread that may not
 * cache (see tc_thread_start). This is the foundation's simple path; the
 * Pool and L2.5 tiers replace it. */
#ifndef HAK_SMALL_H
#define HAK_SMALL_H

#include "box/diag.h"
#include "box/rmap.h"
#include "tcache.h"

#include <stdbool.h>

void *small_alloc_slow(uint32_t cls);
/* Entered with cls < SMALL_FIRST (no push tried), or after small_free's
 * push failed (room overdrawn: refunded here). */
void small_free_slow(void *p, uint32_t cls, const char *fn);
/* One block of any class straight from the shared list, bypassing caches. */
void *small_alloc_uncached(uint32_t cls);

/* Allocate a block of class cls (>= SMALL_FIRST); NULL (errno ENOMEM) when
 * out of memory. */
HAK_INLINE void *small_alloc(uint32_t cls) {
    void *p = tc_pop(cls);
    return hak_likely(p != NULL) ? p : small_alloc_slow(cls);
}

/* True when p is the start of a block of class cls in its region. */
HAK_INLINE bool small_is_block(const void *p, uint32_t cls) {
    size_t off = (uintptr_t)p - rmap_region_base(p), size = small_class_size[cls];
    /* At a multiple of the size, and a whole block before the region's end. */
    return small_class_div(cls, off) * size == off && off <= HAK_REGION_SIZE - size;
}

/* Free p, whose region entry says class cls. `fn` names the API call for the
 * error message. */
HAK_INLINE void small_free(void *p, uint32_t cls, const char *fn) {
    if (hak_unlikely(!small_is_block(p, cls))) return diag_reject(fn, "invalid pointer", p);
    /* The cheapest double-free check: the block freed last in this class. */
    if (hak_unlikely(hak_tc.head[cls] == p)) return diag_reject(fn, "double free", p);
    /* Blocks of the other tiers' classes served here (past a full SuperSlab
     * range, or to a thread that may not cache) must not mix with those
     * tiers' cached ones: they (and uncached threads' frees) go to the slow
     * path. */
    if (hak_unlikely(cls < SMALL_FIRST || !tc_push(cls, p))) small_free_slow(p, cls, fn);
}

/* Return every block this thread caches to the shared lists. */
void small_thread_flush(void);

/* Fork: hold every lock across fork() so the child sees consistent state. */
void small_fork_prepare(void);
void small_fork_parent(void);
void small_fork_child(void);

struct small_stats {
    uint64_t regions;      /* 2 MiB regions mapped */
    uint64_t carved_bytes; /* bytes ever handed to a thread cache */
    uint64_t refills, flushes;
};
void small_get_stats(struct small_stats *s);

#endif
