/* Front: size -> tier and pointer -> tier, both O(1), inlined into every
 * entry point. The common malloc is a class lookup and a thread-local pop;
 * the common free is a range check (Tiny's SuperSlab range) and a
 * thread-local push; other pointers go through the region map. */
#ifndef HAK_FRONT_H
#define HAK_FRONT_H

#include "box/diag.h"
#include "box/rmap.h"
#include "check/check.h"
#include "large/large.h"
#include "pool.h"
#include "l25/l25.h"
#include "tiny.h"

/* malloc(n) when the thread cache had nothing for it (cls: n's class, or
 * SMALL_NCLASSES for a Large block): the tiers' slow paths, and when the OS
 * refused memory, once more after every cache gave its memory back
 * (api.c; the retry: oom.c). Out of line, so the fast path below keeps its
 * arguments in their registers and tail-jumps here. f: the family
 * allocating, for the checked tier (HAKMEM_CHECK), which serves every miss
 * while on. */
void *front_malloc_miss(size_t n, size_t cls, enum api_family f);
/* The same for n < SMALL_LUT_N, which finds the class again (one load): a
 * class passed from the table look cost the fast path a register move. */
void *front_lut_miss(size_t n, enum api_family f);
/* A block of small class cls the thread cache had none of, for
 * front_alloc_class: the class's tier (NULL, errno ENOMEM, when even the
 * L2.5 tier has no memory). It and front_malloc_miss share the one place
 * where the case of a thread that may not cache is decided (api.c,
 * front_class_slow). */
void *front_class_miss(uint32_t cls, size_t n);

HAK_INLINE void *front_malloc_as(size_t n, enum api_family f) {
    if (hak_likely(n < SMALL_LUT_N)) {
        void *p = tiny_alloc_fast(small_class_lut[n]);
        return hak_likely(p != NULL) ? p : front_lut_miss(n, f);
    }
    /* (Passed on: Pool blocks miss often, a thread cache holding few.) */
    void *p = NULL;
    uint32_t cls = SMALL_NCLASSES;
    if (n <= TINY_MAX) {
        cls = small_class_of(n);
        p = tiny_alloc_fast(cls);
    } else if (n <= POOL_MAX) {
        cls = small_class_of(n);
        p = pool_alloc_fast(cls);
    } else if (n <= HAK_SMALL_MAX) {
        cls = small_class_of(n);
        p = l25_alloc_fast(cls);
    }
    return hak_likely(p != NULL) ? p : front_malloc_miss(n, cls, f);
}

HAK_INLINE void *front_malloc(size_t n) {
    return front_malloc_as(n, API_MALLOC);
}

/* A block of class cls, for a request of n bytes (the heap profiler's
 * record), from whichever tier serves that class. */
HAK_INLINE void *front_alloc_class(uint32_t cls, size_t n) {
    void *p = cls < TINY_NCLASSES ? tiny_alloc_fast(cls)
              : cls < POOL_END    ? pool_alloc_fast(cls)
                                  : l25_alloc_fast(cls);
    return hak_likely(p != NULL) ? p : front_class_miss(cls, n);
}

/* Whose block p may be, past Tiny's SuperSlab range: the region map's
 * entry for p goes to *e. NULL is TIER_NONE before the map's look (free(NULL)
 * is common, a program's optional fields, and the look would cost it 15
 * instructions). */
HAK_INLINE enum hak_tier front_owner_mapped(const void *p, uint32_t *e) {
    if (p == NULL) return TIER_NONE;
    *e = rmap_get(p);
    return (enum hak_tier)rmap_kind_of(*e);
}

/* Whose block p may be: the one pointer -> tier dispatch of every entry
 * point. Tiny's range first (a range check: its blocks are the commonest);
 * *e is set for the tiers in the region map only. */
HAK_INLINE enum hak_tier front_owner(const void *p, uint32_t *e) {
    if (hak_likely(ss_contains(p))) return TIER_TINY;
    return front_owner_mapped(p, e);
}

/* Free p; `fn` names the API call in error messages. NULL is a no-op, and
 * anything hakmem did not hand out aborts with a message naming it. */
HAK_INLINE void front_free(void *p, const char *fn) {
    if (hak_likely(ss_contains(p))) {
        tiny_free(p, fn);
        return;
    }
    /* (front_owner, with its first test taken here: the compiler did not
     * drop the second one, 2 instructions a Pool free. Tested in turn,
     * commonest first: a switch's jump table cost 4 more.) */
    uint32_t e;
    enum hak_tier t = front_owner_mapped(p, &e);
    if (t == TIER_POOL) {
        pool_free(p, e, fn);
    } else if (t == TIER_L25) {
        l25_free(p, e, fn);
    } else if (t == TIER_LARGE) {
        large_free(p, e, fn);
    } else if (t == TIER_CHECK) {
        chk_free(p, e, fn);
    } else if (p != NULL) {
        diag_reject(fn, DIAG_INVALID_POINTER, p, TIER_NONE, 0);
    }
}

/* What hakmem knows of a pointer: for checks and reports. */
struct front_block {
    enum hak_tier tier; /* whose memory p is in; TIER_NONE: none's */
    bool live;          /* p is a block held by the program */
    uint32_t cls;       /* a small tier's: the class */
    size_t size;        /* a small tier's: the class size; Large: the size last asked */
};
void front_describe(const void *p, struct front_block *b);

/* free_sized and sized operator delete, when the fast path below could not
 * tell p and n agree: free p if n belongs to it, report a size mismatch if
 * not. `exact`: p was allocated for n bytes (aligned to align, 0 for none)
 * and never resized, so its class is n's own; otherwise (free_sized)
 * realloc may have shrunk it in place. False, with nothing done, when p is
 * not a live block. */
bool front_free_sized_slow(void *p, size_t n, size_t align, bool exact, const char *fn);

/* aligned_alloc for family f, with the retry of an out-of-memory failure
 * (C++ aligned new). */
void *front_aligned_as(size_t align, size_t n, enum api_family f);

/* Free p, which the caller says was allocated for n bytes (see above). A
 * pointer into the SuperSlab range with n's class is freed, or reported,
 * by the Tiny tier itself; false only from the slow path. */
HAK_INLINE bool front_free_sized(void *p, size_t n, bool exact, const char *fn) {
    /* (The descriptor of any pointer into the SuperSlab range can be read;
     * tiny_free then checks that p starts a block.) */
    if (hak_likely(ss_contains(p)) && hak_likely(n <= TINY_MAX) &&
        hak_likely(ss_slab_of(p)->cls == small_class_of(n))) {
        tiny_free(p, fn);
        return true;
    }
    return front_free_sized_slow(p, n, 0, exact, fn);
}

#endif
