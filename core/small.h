/* Small tier, 0 .. HAK_SMALL_MAX bytes: size-classed blocks carved from 2 MiB
 * regions (one class per region, recorded in the region map), with a
 * per-thread cache per class in front of a locked per-class free list.
 *
 * This is the foundation's simple, correct path; the Tiny and Pool tiers
 * replace it for their size ranges. */
#ifndef HAK_SMALL_H
#define HAK_SMALL_H

#include "box/diag.h"
#include "box/rmap.h"
#include "sizeclass.h"

#include <stdbool.h>

struct small_tcache {
    void *head[SMALL_NCLASSES];     /* free blocks, linked through word 0 */
    uint16_t count[SMALL_NCLASSES]; /* length of each list */
    /* Capacity per class: 0 until this thread's first slow path (and again
     * after its exit hook ran), so a thread's first free of a class also
     * takes the slow path, which arms the exit hook. */
    uint16_t cap[SMALL_NCLASSES];
};

extern __thread struct small_tcache small_tc;

void *small_alloc_slow(uint32_t cls);
void small_free_slow(void *p, uint32_t cls);

/* Allocate a block of class cls; NULL (errno ENOMEM) when out of memory. */
HAK_INLINE void *small_alloc(uint32_t cls) {
    void *p = small_tc.head[cls];
    if (hak_likely(p != NULL)) {
        small_tc.head[cls] = *(void **)p;
        small_tc.count[cls]--;
        return p;
    }
    return small_alloc_slow(cls);
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
    if (hak_unlikely(!small_is_block(p, cls))) diag_bad_pointer(fn, "invalid pointer", p);
    void *head = small_tc.head[cls];
    /* The cheapest double-free check: the block freed last in this class. */
    if (hak_unlikely(head == p)) diag_bad_pointer(fn, "double free", p);
    if (hak_unlikely(small_tc.count[cls] >= small_tc.cap[cls])) {
        small_free_slow(p, cls);
        return;
    }
    *(void **)p = head;
    small_tc.head[cls] = p;
    small_tc.count[cls]++;
}

/* Return every block this thread caches to the shared lists. */
void small_thread_flush(void);
/* Thread exit: flush, and close the caches so anything freed later goes
 * through the slow path (which re-arms the exit hook). */
void small_thread_exit(void);

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
