/* What the front's files share (core/front/): api.c's entry points and
 * misses call the out-of-memory policy (oom.c), the ageing look (age.c)
 * and the sampling front (sample.c). Only core/front/ includes it. */
#ifndef HAK_FRONT_INTERNAL_H
#define HAK_FRONT_INTERNAL_H

#include "front/front.h"
#include "front/lifecycle.h"
#include "front/tiers.h"
#include "prof/prof.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* An exported entry point (its hak_ name) ... */
#define HAK_API __attribute__((visibility("default")))
/* ... and a standard name for it: the same code (api.c, glibc.c). */
#define HAK_ALIAS(name, target)                                                                    \
    extern __typeof__(target) name __attribute__((alias(#target), visibility("default")))

/* A Large block of n bytes; with the profiler on, maybe one its byte
 * countdown chose (prof.h). */
static inline void *front_large(size_t n, size_t align, bool zero) {
    /* A program whose first calls are Large ones (before hakmem's
     * constructor: another library's) reads the settings here, as the small
     * tiers' first slow path does (life_thread_start). */
    life_ensure();
    if (hak_unlikely(prof_on) && prof_bytes_due(n))
        return large_alloc_sampled(n, align, zero, n, false);
    return large_alloc(n, align, zero);
}

static inline int front_trim(void) {
    return tiers_collect(COLLECT_TRIM).released;
}

/* ---- out of memory (oom.c) ----------------------------------------------- */

/* A retry after front_retry is under way (FRONT_TRY). */
extern HAK_HIDDEN __thread bool front_retrying;
/* After a NULL with errno ENOMEM: true when trimming the caches gave memory
 * back, and the caller is to try once more (oom.c). */
HAK_HIDDEN __attribute__((cold, noinline)) bool front_retry(void);

/* var = expr, and once more after front_retry when `failed`. */
#define FRONT_TRY(var, failed, expr)                                                               \
    do {                                                                                           \
        (var) = (expr);                                                                            \
        if (hak_unlikely(failed) && front_retry()) {                                               \
            (var) = (expr);                                                                        \
            front_retrying = false;                                                                \
        }                                                                                          \
    } while (0)

/* A small block of class cls its tier could not serve: the retry, then a
 * mapping of its own. */
HAK_HIDDEN __attribute__((cold, noinline)) void *front_small_failed(uint32_t cls);
/* malloc(n) of a Large size, with the retry. */
HAK_HIDDEN __attribute__((noinline)) void *front_large_miss(size_t n);

/* ---- ageing (age.c) ------------------------------------------------------ */

/* The thread's look at the clock: its own caches, then (one thread at a
 * time) every tier's, each HAKMEM_AGE_MS at most. */
HAK_HIDDEN __attribute__((noinline)) void front_purge(void);

/* ---- sampling (sample.c) ------------------------------------------------- */

/* The countdown of class cls is due (tc_due): the sampled block, or else
 * the class's own (front_class_miss's NULL when there is none;
 * front_malloc_due's last resort is front_small_failed). */
HAK_HIDDEN __attribute__((cold, noinline)) void *front_class_due(uint32_t cls, size_t n);
HAK_HIDDEN __attribute__((cold, noinline)) void *front_malloc_due(size_t n, uint32_t cls);

#endif
