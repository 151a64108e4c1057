/* The sampling front: a class countdown that came due (tcache.h) gives the
 * heap profiler its sampled block, and with the profiler off brings the
 * thread to its look at the ages. */
#include "front/internal.h"

/* The thread's look at the ages (front_purge) comes once per
 * FRONT_LOOK_ALLOCS allocations of a class at least, besides its misses. */
#define FRONT_LOOK_ALLOCS 4096

/* The countdown of cls is due (tcache.h): this allocation, of n bytes, is
 * the one to sample. With the profiler on (and this thread not recording
 * one already: the unwinder allocates), it gets a Large block, aligned as
 * the class's blocks are, whose free the profiler sees. NULL otherwise: the
 * caller serves it from the class, which does not move the next countdown
 * (started first, so that an allocation made while recording finds it
 * running). */
static void *front_sample(size_t n, uint32_t cls) {
    tc_due_undo(cls);
    size_t size = small_class_size[cls];
    int64_t cd = prof_countdown(size);
    if (!prof_on) {
        /* Nothing to sample: the countdown still comes due every
         * FRONT_LOOK_ALLOCS allocations of the class, for the thread's look
         * at the ages, which its misses alone would seldom bring once its
         * cache holds its batches (tc_grow). */
        if (cd > FRONT_LOOK_ALLOCS) cd = FRONT_LOOK_ALLOCS;
        front_purge();
    }
    if (tc_rearm(cls, cd) && prof_on && !prof_busy) {
        size_t align = size & -size; /* what the class's blocks are aligned to */
        void *p = large_alloc_sampled(size, align < 2 * HAK_PAGE_SIZE ? align : 2 * HAK_PAGE_SIZE,
                                      false, n, true);
        if (p != NULL) return p;
        prof_lost();
    }
    tc_serve_due(cls);
    return NULL;
}

/* Out of line, so that the misses (api.c) keep their registers. */
HAK_HIDDEN __attribute__((cold, noinline)) void *front_class_due(uint32_t cls, size_t n) {
    void *p = front_sample(n, cls);
    return p != NULL ? p : front_alloc_class(cls, n);
}

HAK_HIDDEN __attribute__((cold, noinline)) void *front_malloc_due(size_t n, uint32_t cls) {
    void *p = front_sample(n, cls);
    if (p == NULL) p = front_alloc_class(cls, n);
    return hak_likely(p != NULL) ? p : front_small_failed(cls);
}
