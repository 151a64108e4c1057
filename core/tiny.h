/* Tiny tier, classes 0 .. TINY_NCLASSES-1 (16 B .. 8 KiB, sizes.h): blocks
 * in SuperSlab slabs owned by one thread each, served through the thread
 * cache (core/tcache.h).
 *
 * free pushes the block on the thread cache, whichever thread's slab it is
 * of: the cache hands it out again as it would one of its own. When a full
 * cache gives blocks back, each run of one slab's blocks goes onto the slab:
 * its free list when this thread owns it, else its remote list with one
 * CAS, and the owner takes the whole list with one exchange when it refills.
 * A thread that exits gives back its empty slabs and leaves the others to be
 * adopted by the next thread that needs their class. */
#ifndef HAK_TINY_H
#define HAK_TINY_H

#include "box/diag.h"
#include "superslab/ss.h"
#include "tcache.h"

/* Fewest blocks a refill carves when it carves (see tiny_take). */
#define TINY_CARVE_MIN 4u

/* Refill the (open) thread cache of cls and hand out a block; NULL (errno
 * ENOMEM) when the tier has no memory. */
void *tiny_alloc_slow(uint32_t cls);
/* The push of p (a block of s, marked free) found the list of its class
 * full, or the caches closed. */
void tiny_free_slow(void *p, struct ss_slab *s);
/* free of p, which fails the block test of its slab s: a double free when
 * p is a marked block of an EMPTY slab, else an invalid pointer. Never
 * returns (not declared so: reached with a tail jump). */
__attribute__((cold)) void tiny_reject(const void *p, const struct ss_slab *s, const char *fn);

/* Double frees. A free block's second word holds the address of its slab's
 * descriptor: written when the block is carved or freed, cleared when it is
 * handed out. free finding it there is a double free, however many frees
 * ago, by whichever thread, wherever the block went since (thread cache,
 * slab free list, remote list). A program cannot hold that address (the
 * descriptor is never handed out, and ss.c zeroes what an old cut left in a
 * re-cut slot), so the word never matches by chance; it costs a store on
 * each path (the smallest block, 16 bytes, has the word). */
HAK_INLINE void **tiny_free_mark(void *p) {
    return (void **)p + 1;
}

/* Mark p, a block of slab s, free; true when it was already (a double free). */
HAK_INLINE bool tiny_mark_free(void *p, struct ss_slab *s) {
    /* (Stored only when not: a compare with memory, then the store.) */
    if (*tiny_free_mark(p) == s) return true;
    *tiny_free_mark(p) = s;
    return false;
}

/* p leaves the tier for the program. */
HAK_INLINE void *tiny_handed_out(void *p) {
    *tiny_free_mark(p) = NULL;
    return p;
}

/* A block of cls from this thread's cache; NULL when it has none
 * (tiny_alloc_slow then refills it). */
HAK_INLINE void *tiny_alloc_fast(uint32_t cls) {
    void *p = tc_pop(cls);
    if (hak_likely(p != NULL))
        tiny_handed_out(p); /* (tc_pop read its first word: the line is here) */
    return p;
}

/* Free p, a pointer into a SuperSlab; `fn` names the API call. A block that
 * passes the block test (ss_is_block: a block carved in an ACTIVE slab;
 * UNUSED and EMPTY ones pass none) and is not marked free is a live block.
 * So no look at the owner: the cache takes any thread's. */
HAK_INLINE void tiny_free(void *p, const char *fn) {
    struct ss_slab *s = ss_slab_of(p);
    if (hak_unlikely(!ss_is_block(s, p))) return tiny_reject(p, s, fn);
    if (hak_unlikely(tiny_mark_free(p, s)))
        return diag_reject(fn, DIAG_DOUBLE_FREE, p, TIER_TINY, s->size);
    /* (Its class holds while p is out: a slab with blocks out keeps it.) */
    if (hak_unlikely(!tc_push(s->cls, p))) tiny_free_slow(p, s);
}

/* True when p (a pointer into a SuperSlab) is a block held by the program. */
HAK_INLINE bool tiny_is_live(const void *p) {
    struct ss_slab *s = ss_slab_of(p);
    /* An EMPTY slab keeps its carved count; its blocks are all free. So is
     * a block marked free in a slab still in use. */
    return ss_is_block(s, p) && s->state == SS_ACTIVE && *tiny_free_mark((void *)p) != s;
}

/* Block size of p (a pointer into a SuperSlab); aborts naming p when it is
 * not a live block. */
HAK_INLINE size_t tiny_usable_size(const void *p, const char *fn) {
    struct ss_slab *s = ss_slab_of(p);
    if (!tiny_is_live(p)) diag_bad_pointer(fn, DIAG_INVALID_POINTER, p, TIER_TINY, s->size);
    return s->size;
}

#ifdef HAK_FAULT_INJECT
/* Tests: called by a thread's exit with a class's new orphans let go and
 * not yet on the orphan stack. */
extern void (*tiny_exit_publish_hook)(void);
#endif

/* Thread exit: return the cache to the slabs, give back empty slabs, leave
 * the rest for adoption. */
void tiny_thread_exit(void);
/* malloc_trim: drain this thread's slabs and the orphans, give back every
 * empty slab; true when something was given back. */
bool tiny_trim(void);
/* This thread's lists grown for batches (tc_grow) and not grown again
 * since the last call: emptied, back to their first capacity (a grown list
 * keeps up to TC_GROW_BYTES of blocks, each holding its slab). Every
 * HAKMEM_AGE_MS at most, from the thread's own calls. */
void tiny_age(void);

struct tiny_class_stats {
    uint64_t allocs, frees; /* exited threads' and the caller's */
    uint64_t refills, flushes, remote_frees, adopted;
};
void tiny_get_stats(struct tiny_class_stats st[TINY_NCLASSES]);

/* The tier contract (box/tier.h): tiny_age, tiny_trim, tiny_thread_exit;
 * the per-class table of the stats report. */
extern HAK_HIDDEN const struct tier_ops tiny_tier;

#endif
