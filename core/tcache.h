/* Thread cache: per-thread, per-class lists of free blocks in front of every
 * size-classed tier. malloc pops, free pushes; no atomic, lock or call on
 * either path. Each tier refills a class from its own structures when it is
 * empty and takes blocks back when it is over capacity. */
#ifndef HAK_TCACHE_H
#define HAK_TCACHE_H

#include "sizeclass.h"

#include <stdbool.h>

struct tiny_heap;
struct pool_heap;

struct hak_tcache {
    void *head[SMALL_NCLASSES]; /* free blocks, linked through word 0 */
    /* Blocks each list may still take. Free's whole capacity check is one
     * decrement and a sign test. 0 while the caches are closed:
     * until this thread's first slow path (and again after its exit hook
     * ran), so a thread's first free of a class also takes a slow path,
     * which arms the exit hook (tc_thread_start). */
    int16_t room[SMALL_NCLASSES];
    bool open;              /* caches open: room counts from small_class_cap */
    struct tiny_heap *heap; /* this thread's Tiny heap, NULL until needed */
    struct pool_heap *pool; /* this thread's Pool heap, NULL until needed */
    /* Tiny allocs served by this cache, for stats: one add on the fast
     * path, cheaper than testing whether stats are on. Frees need no count
     * of their own: tiny.c derives them from the cache's in- and outflows. */
    uint64_t allocs[TINY_NCLASSES];
};

extern HAK_HIDDEN __thread struct hak_tcache hak_tc;

HAK_INLINE void *tc_pop(uint32_t cls) {
    void *p = hak_tc.head[cls];
    if (hak_likely(p != NULL)) {
        hak_tc.head[cls] = *(void **)p;
        hak_tc.room[cls]++;
    }
    return p;
}

/* Push p. When the list is full or the caches are closed nothing is pushed
 * and false comes back with the room overdrawn to -1: the caller's slow path
 * gives that unit back (tc_refund) first. Restoring it here would cost the
 * fast path a register and two instructions. */
HAK_INLINE bool tc_push(uint32_t cls, void *p) {
    if (hak_unlikely(--hak_tc.room[cls] < 0)) return false;
    *(void **)p = hak_tc.head[cls];
    hak_tc.head[cls] = p;
    return true;
}

/* Undo the overdraft of a tc_push that returned false. */
static inline void tc_refund(uint32_t cls) {
    hak_tc.room[cls]++;
}

/* Blocks on the list of cls. */
static inline uint32_t tc_count(uint32_t cls) {
    return hak_tc.open ? (uint32_t)small_class_cap[cls] - hak_tc.room[cls] : 0;
}

/* The list of cls is empty: make the NULL-terminated chain of n blocks
 * (n <= room) at first its list. */
static inline void tc_fill(uint32_t cls, void *first, uint32_t n) {
    hak_tc.head[cls] = first;
    hak_tc.room[cls] = (int16_t)(hak_tc.room[cls] - n);
}

/* Put a chain first..last of n blocks (n <= room) in front of the list of cls. */
static inline void tc_push_chain(uint32_t cls, void *first, void *last, uint32_t n) {
    *(void **)last = hak_tc.head[cls];
    hak_tc.head[cls] = first;
    hak_tc.room[cls] = (int16_t)(hak_tc.room[cls] - n);
}

/* Detach the first n (<= count) blocks of cls; returns the first, *last the
 * last (its link is left as it was). */
static inline void *tc_take(uint32_t cls, uint32_t n, void **last) {
    void *first = hak_tc.head[cls], *b = first;
    for (uint32_t i = 1; i < n; i++)
        b = *(void **)b;
    hak_tc.head[cls] = *(void **)b;
    hak_tc.room[cls] = (int16_t)(hak_tc.room[cls] + n);
    *last = b;
    return first;
}

/* Half a capacity: the batch a refill brings and a flush gives back. */
static inline uint32_t tc_batch(uint32_t cls) {
    return small_class_cap[cls] / 2u;
}

/* A thread's first slow path: arm its exit hook and open the caches. False
 * when the hook cannot be armed (start-up still running in another thread,
 * or the thread is past its exit hook): the thread must then work uncached,
 * so nothing it frees is stranded in a cache nobody will return. */
bool tc_thread_start(void);
/* Thread exit: close the caches, so later frees take the slow path again. */
void tc_thread_close(void);

#endif
