/* Front: size -> tier and pointer -> tier, both O(1), inlined into every
 * entry point. The common malloc is a class lookup and a thread-local pop;
 * the common free is a range check (Tiny's SuperSlab range) and a
 * thread-local push; other pointers go through the region map. */
#ifndef HAK_FRONT_H
#define HAK_FRONT_H

#include "box/diag.h"
#include "box/rmap.h"
#include "large.h"
#include "pool.h"
#include "l25.h"
#include "tiny.h"

HAK_INLINE void *front_malloc(size_t n) {
    if (hak_likely(n < TINY_LUT_N)) return tiny_alloc(small_class_lut[n]);
    if (n <= TINY_MAX) return tiny_alloc(small_class_of(n));
    if (n <= POOL_MAX) return pool_alloc(small_class_of(n));
    if (n <= HAK_SMALL_MAX) return l25_alloc(small_class_of(n));
    return large_alloc(n, HAK_MIN_ALIGN, false);
}

/* A block of class cls from whichever tier serves that class. */
HAK_INLINE void *front_alloc_class(uint32_t cls) {
    if (cls < TINY_NCLASSES) return tiny_alloc(cls);
    return cls < POOL_END ? pool_alloc(cls) : l25_alloc(cls);
}

/* Free p; `fn` names the API call in error messages. NULL is a no-op, and
 * anything hakmem did not hand out aborts with a message naming it. */
HAK_INLINE void front_free(void *p, const char *fn) {
    if (hak_likely(ss_contains(p))) {
        tiny_free(p, fn);
        return;
    }
    uint32_t e = rmap_get(p);
    if (rmap_kind_of(e) == RMAP_POOL) {
        pool_free(p, e, fn);
        return;
    }
    if (rmap_kind_of(e) == RMAP_L25) {
        l25_free(p, e, fn);
        return;
    }
    if (rmap_kind_of(e) == RMAP_LARGE) {
        large_free(p, e, fn);
        return;
    }
    if (p != NULL) diag_reject(fn, "invalid pointer", p);
}

#endif
