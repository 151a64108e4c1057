/* Thread cache: per-thread, per-class lists of free blocks in front of every
 * size-classed tier. malloc pops, free pushes; no atomic, lock or call on
 * either path. Each tier refills a class from its own structures when it is
 * empty and takes blocks back when it is over capacity. */
#ifndef HAK_TCACHE_H
#define HAK_TCACHE_H

#include "sizeclass.h"
#include "tc_counts.h"

#include <assert.h>
#include <stdbool.h>

struct tiny_heap;
struct pool_heap;
struct l25_heap;

/* A thread's context, `tc_self`: its cache lists with their counter words,
 * and the heaps of the tiers that keep one per thread. One thread-local
 * object, so that every field is a constant offset from the thread pointer
 * on the fast paths. */
struct tc_context {
    void *head[SMALL_NCLASSES]; /* free blocks, linked through word 0 */
    /* room is 0 while the caches are closed: until this thread's first slow
     * path (and again after its exit hook ran), so a thread's first free of
     * a class also takes a slow path, which arms the exit hook
     * (tc_thread_start). */
    union tc_counts cnt[SMALL_NCLASSES];
    /* Each list's capacity: small_class_cap while open, more for a Tiny
     * class whose blocks went back to their slabs and came out again
     * (tc_grow); 0 while closed. */
    uint16_t cap[SMALL_NCLASSES];
    bool open;              /* caches open: room counts from cap */
    struct tiny_heap *heap; /* this thread's Tiny heap, NULL until needed */
    struct pool_heap *pool; /* this thread's Pool heap, NULL until needed */
    struct l25_heap *l25;   /* this thread's L2.5 heap, NULL until needed */
    int32_t purge_tick;     /* misses until the front looks at the clock (front_purge) */
    /* Tiny allocs, for stats: those of earlier countdowns, and the value
     * the current countdown started from (what it has gone down by since is
     * the rest). Frees need no count of their own: tiny.c derives them from
     * the cache's in- and outflows. */
    uint64_t allocs[TINY_NCLASSES];
    int64_t armed[SMALL_NCLASSES]; /* that value + 1; 0: never armed */
};

extern HAK_HIDDEN __thread struct tc_context tc_self;

HAK_INLINE void *tc_pop(uint32_t cls) {
    void *p = tc_self.head[cls];
    if (hak_likely(p != NULL)) {
        /* The countdown is due: the miss path (tc_due) undoes the add. */
        if (hak_unlikely(tc_word_sub(&tc_self.cnt[(size_t)cls], -TC_POP))) return NULL;
        tc_self.head[cls] = *(void **)p;
    }
    return p;
}

/* Pop from a list a slow path just filled (not empty): the miss path
 * counted the allocation in the countdown already (tc_due). */
static inline void *tc_pop_filled(uint32_t cls) {
    void *p = tc_self.head[cls];
    tc_self.head[cls] = *(void **)p;
    tc_self.cnt[cls].room++;
    return p;
}

/* The countdown of cls (tc_counts.h). */
static inline int64_t tc_countdown(uint32_t cls) {
    return tc_word_countdown(&tc_self.cnt[cls]);
}

/* On every miss of cls (a pop that returned NULL must come here): count
 * this allocation; true when it is the one the countdown points at. The
 * caller then calls tc_due_undo, samples it or not, and calls tc_rearm. */
HAK_INLINE bool tc_due(uint32_t cls) {
    return tc_word_sub(&tc_self.cnt[(size_t)cls], (int64_t)1 << TC_CD_SHIFT);
}

/* After tc_due said true: the countdown back at 0, and room as it was
 * before the pop that found it due, if one did. */
static inline void tc_due_undo(uint32_t cls) {
    tc_word_undo_due(&tc_self.cnt[cls]);
}

/* Start the next countdown of cls (it is at 0, tc_due_undo): cd >= 0
 * allocations to pass before the next due one. False when the due one was
 * the thread's first allocation of the class (countdowns start at 0,
 * unarmed): that one is no sample. */
static inline bool tc_rearm(uint32_t cls, int64_t cd) {
    int64_t was = tc_self.armed[cls];
    if (cls < TINY_NCLASSES && was != 0) tc_self.allocs[cls] += (uint64_t)(was - 1);
    tc_self.armed[cls] = cd + 1;
    tc_word_add_countdown(&tc_self.cnt[cls], cd);
    return was != 0;
}

/* The due allocation is served from the class after all (not sampled): it
 * counts, and its pop (or miss) takes back this one, not the countdown's. */
static inline void tc_serve_due(uint32_t cls) {
    tc_self.armed[cls]++;
    tc_word_add_countdown(&tc_self.cnt[cls], 1);
}

/* Tiny allocs of cls counted since the last call. */
static inline uint64_t tc_take_allocs(uint32_t cls) {
    uint64_t n = tc_self.allocs[cls];
    tc_self.allocs[cls] = 0;
    if (tc_self.armed[cls] != 0) {
        int64_t cd = tc_countdown(cls);
        n += (uint64_t)(tc_self.armed[cls] - 1 - cd);
        tc_self.armed[cls] = cd + 1;
    }
    return n;
}

/* Push p: first, or with `behind` behind the list's first block when there
 * is one, so that the next pop of cls returns another block than p (L2.5's
 * free of a block of 128 KiB and more: not handed straight back to the
 * next request, where a dangling pointer to it would alias the new block,
 * as glibc's mmapped ones are not; a loop of one block takes turns with
 * the list's first). When the list is full or the caches are closed
 * nothing is pushed and false comes back with the room overdrawn to -1:
 * the caller's slow path gives that unit back (tc_refund) first. Restoring
 * it here would cost the fast path a register and two instructions. */
HAK_INLINE bool tc_push_behind(uint32_t cls, void *p, bool behind) {
    size_t c = cls; /* (one zero extension for both uses) */
    if (hak_unlikely(tc_word_room_take(&tc_self.cnt[c]))) return false;
    void **first = tc_self.head[c];
    if (behind && first != NULL) {
        *(void **)p = *first;
        *first = p;
        return true;
    }
    *(void **)p = first;
    tc_self.head[c] = p;
    return true;
}

/* p first (the Tiny and Pool frees): `behind` a constant false, compiled out. */
HAK_INLINE bool tc_push(uint32_t cls, void *p) {
    return tc_push_behind(cls, p, false);
}

/* Undo the overdraft of a tc_push that returned false. */
static inline void tc_refund(uint32_t cls) {
    tc_self.cnt[cls].room++;
}

/* Blocks on the list of cls. */
static inline uint32_t tc_count(uint32_t cls) {
    return (uint32_t)tc_self.cap[cls] - (uint32_t)tc_self.cnt[cls].room;
}

/* The list of cls is empty: make the NULL-terminated chain of n blocks
 * (n <= room) at first its list. */
static inline void tc_fill(uint32_t cls, void *first, uint32_t n) {
    tc_self.head[cls] = first;
    tc_self.cnt[cls].room = (int16_t)(tc_self.cnt[cls].room - n);
}

/* Put a chain first..last of n blocks (n <= room) in front of the list of cls. */
static inline void tc_push_chain(uint32_t cls, void *first, void *last, uint32_t n) {
    *(void **)last = tc_self.head[cls];
    tc_self.head[cls] = first;
    tc_self.cnt[cls].room = (int16_t)(tc_self.cnt[cls].room - n);
}

/* Detach the first n (<= count) blocks of cls; returns the first, *last the
 * last (its link is left as it was). */
static inline void *tc_take(uint32_t cls, uint32_t n, void **last) {
    void *first = tc_self.head[cls], *b = first;
    for (uint32_t i = 1; i < n; i++)
        b = *(void **)b;
    tc_self.head[cls] = *(void **)b;
    tc_self.cnt[cls].room = (int16_t)(tc_self.cnt[cls].room + n);
    *last = b;
    return first;
}

/* Half a capacity: the batch a refill brings and a flush gives back. */
static inline uint32_t tc_batch(uint32_t cls) {
    return tc_self.cap[cls] / 2u;
}

/* ---- blocks back to their tier: the one flush protocol -------------------- *
 *
 * Every tier returns cached blocks through these, with its own give-back.
 * What a full list does when free's push fails (tc_push false, the room
 * refunded first) is the tier's, as its misses differ:
 *   Tiny   grows the list when its batches outgrow it (tc_grow); else half
 *          the list back (tc_flush), the cap fitted, then the push
 *   Pool   the freed block alone back: a Pool miss takes one block, not a
 *          batch, so a halved list would send the next allocations to the
 *          chunks one at a time
 *   L2.5   half the list back (tc_flush), then the push */

/* A tier's way back for cached blocks: the chain `first` of n blocks of cls
 * (linked through word 0, already off the list) returned to the slabs,
 * chunks or bundles they came from, or to their owners' remote lists. */
typedef void tc_give_fn(uint32_t cls, void *first, uint32_t n);

/* The first n (1 <= n <= count) blocks of cls given back. Off the list
 * before `give` runs: a signal handler that mallocs or frees this class
 * during the tier's work finds the list consistent. (n = 0 would unlink one
 * block and count none.) */
static inline void tc_flush(uint32_t cls, uint32_t n, tc_give_fn *give) {
    assert(n >= 1 && n <= tc_count(cls));
    void *last;
    give(cls, tc_take(cls, n, &last), n);
}

/* Every block on the list of cls given back. */
static inline void tc_flush_list(uint32_t cls, tc_give_fn *give) {
    uint32_t n = tc_count(cls);
    if (n) tc_flush(cls, n, give);
}

/* Every block of the classes first .. end-1 given back (a tier's thread
 * exit and trim). */
static inline void tc_flush_all(uint32_t first, uint32_t end, tc_give_fn *give) {
    for (uint32_t cls = first; cls < end; cls++)
        tc_flush_list(cls, give);
}

/* The capacity of cls set to cap (its room with it): the list holds no more
 * than cap blocks now. */
static inline void tc_set_cap(uint32_t cls, uint32_t cap) {
    tc_self.cnt[cls].room = (int16_t)(tc_self.cnt[cls].room + ((int32_t)cap - tc_self.cap[cls]));
    tc_self.cap[cls] = (uint16_t)cap;
}

/* A list grows to TC_GROW_BYTES of blocks at most (and TC_GROW_MAX blocks:
 * room is 16 bits). */
#define TC_GROW_BYTES ((uint32_t)128 << 10)
#define TC_GROW_MAX   2048u
/* ... and all of a thread's lists together grow by TC_GROW_BUDGET blocks at
 * most: a grown list's blocks each keep their slab in use (a batch freed
 * in random order leaves one in each of many slabs). Enough for a
 * structure of a dozen classes of ~1000 blocks built and torn down in
 * turn (mimalloc-bench's alloc-test: with 4096, its lists flushed and
 * refilled every round, a walk of cold blocks each time, at 0.7x
 * mimalloc's speed; with this, level, and less RSS). Up to ~1 MiB of
 * blocks a thread; a list unused for an age shrinks back (tiny_age). */
#define TC_GROW_BUDGET 16384u

/* Double the capacity of cls (its room with it), up to the bound above;
 * false when it is there already. For a thread that frees more blocks of
 * a class in a row than its list holds, and then allocates them again
 * (batches: a queue, a parser's nodes, a request's buffers): each flush
 * and refill would move half a list between the list and the slabs, a walk
 * of every block twice, where a list that holds the batch moves nothing. */
static inline bool tc_grow(uint32_t cls) {
    uint32_t cap = tc_self.cap[cls], most = TC_GROW_BYTES / small_class_size[cls];
    if (most > TC_GROW_MAX) most = TC_GROW_MAX;
    if (cap >= most) return false;
    uint32_t grown = 2 * cap < most ? 2 * cap : most, more = grown - cap;
    for (uint32_t c = 0; c < TINY_NCLASSES; c++) /* (only Tiny lists grow) */
        if (tc_self.cap[c] > small_class_cap[c])
            more += (uint32_t)(tc_self.cap[c] - small_class_cap[c]);
    if (more > TC_GROW_BUDGET) return false;
    tc_set_cap(cls, grown);
    return true;
}

/* The list of cls, empty, back to its first capacity. */
static inline void tc_shrink(uint32_t cls) {
    if (tc_self.open && tc_self.cap[cls] > small_class_cap[cls])
        tc_set_cap(cls, small_class_cap[cls]);
}

/* No thread caches in this process: set once at start-up, before any thread
 * caches (checked mode serves every allocation itself). */
extern HAK_HIDDEN bool tc_off;

/* A thread's first slow path: arm its exit hook and open the caches. False
 * when the hook cannot be armed (start-up still running in another thread,
 * or the thread is past its exit hook) or caches are off: the thread must
 * then work uncached, so nothing it frees is stranded in a cache nobody will
 * return. */
bool tc_thread_start(void);
/* Thread exit: close the caches, so later frees take the slow path again. */
void tc_thread_close(void);

/* Its part of the tier contract (box/tier.h): the caches close at a
 * thread's exit, after every tier above flushed its lists. */
extern HAK_HIDDEN const struct tier_ops tc_tier;

#endif
