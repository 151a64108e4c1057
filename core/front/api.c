/* The exported allocation API: the standard names, which replace libc's in
 * any process hakmem is loaded into, and the hak_ names from hakmem.h. Each
 * standard function and its hak_ twin call the same inline front code.
 * Here: each call's own front code and malloc's misses; what the misses
 * call when something is due is apart: out of memory (oom.c), the ageing
 * look (age.c), the heap profiler's samples (sample.c). */
#include "hakmem.h"

#include "front/internal.h"
#include "box/libc.h"
#include "front/report.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

/* C23 names glibc 2.36 does not declare yet. */
void free_sized(void *p, size_t size);
void free_aligned_sized(void *p, size_t alignment, size_t size);

/* The small class whose blocks serve n bytes aligned to `align` (a power of
 * two above HAK_MIN_ALIGN); SMALL_NCLASSES when none does. */
static uint32_t front_aligned_class(size_t align, size_t n) {
    if (n > HAK_SMALL_MAX || align > HAK_SMALL_MAX) return SMALL_NCLASSES;
    /* Tiny blocks and aligned L2.5 blocks sit at multiples of their size
     * from a 2 MiB boundary, so a class whose size is a multiple of align
     * gives aligned blocks; the power-of-two class at or above max(n, align)
     * always is one. */
    uint32_t cls = small_class_of(n > align ? n : align);
    /* Pool blocks follow 16-byte headers: aligned only to 16. */
    while ((cls >= POOL_FIRST && cls < POOL_END) || (small_class_size[cls] & (align - 1)))
        cls++;
    return cls;
}

/* A block of n bytes aligned to `align` (a power of two), for family f. */
static void *front_aligned(size_t align, size_t n, enum api_family f) {
    if (hak_unlikely(chk_on)) return chk_alloc(n, align, f);
    if (align <= HAK_MIN_ALIGN) return front_malloc_as(n, f);
    uint32_t cls = front_aligned_class(align, n);
    if (cls < SMALL_NCLASSES) {
        void *p;
        /* Coloured L2.5 blocks (one stride of size + 64 apart, sizes
         * multiples of 4 KiB) are 64-byte aligned; for more, uncoloured ones. */
        if (cls < TINY_NCLASSES || align <= 64)
            p = front_alloc_class(cls, n);
        else
            p = l25_alloc_aligned(cls);
        if (hak_likely(p != NULL)) return p;
    }
    return front_large(n, align, false); /* also the last resort (front_small_failed) */
}

static void *front_calloc(size_t nmemb, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    if (hak_unlikely(chk_on)) return chk_calloc(n);
    if (n > HAK_SMALL_MAX) return front_large(n, HAK_MIN_ALIGN, true);
    void *p = front_alloc_class(small_class_of(n), n);
    if (hak_unlikely(p == NULL)) return large_alloc(n, HAK_MIN_ALIGN, true); /* last resort */
    libc_mem.set(p, 0, n);
    return p;
}

static size_t front_usable_size(void *p) {
    uint32_t e;
    switch (front_owner(p, &e)) {
    case TIER_TINY:
        return tiny_usable_size(p, "malloc_usable_size");
    case TIER_POOL:
        return small_class_size[pool_class_of(p, e, "malloc_usable_size")];
    case TIER_L25:
        return small_class_size[l25_class_of(p, e, "malloc_usable_size")];
    case TIER_LARGE:
        return large_usable_size(p, e, "malloc_usable_size");
    case TIER_CHECK:
        return chk_usable_size(p, e, "malloc_usable_size");
    case TIER_NONE:
        break;
    }
    if (p != NULL) diag_bad_pointer("malloc_usable_size", DIAG_INVALID_POINTER, p, TIER_NONE, 0);
    return 0;
}

void front_describe(const void *p, struct front_block *b) {
    *b = (struct front_block){.tier = TIER_NONE};
    uint32_t e;
    int cls;
    switch (front_owner(p, &e)) {
    case TIER_TINY: {
        struct ss_slab *s = ss_slab_of(p);
        *b = (struct front_block){TIER_TINY, tiny_is_live(p), s->cls, s->size};
        return;
    }
    case TIER_POOL:
        cls = pool_live_class(p, e);
        b->tier = TIER_POOL;
        b->live = cls >= 0;
        b->cls = cls >= 0 ? (uint32_t)cls : 0;
        b->size = cls >= 0 ? small_class_size[cls] : 0;
        return;
    case TIER_L25:
        b->tier = TIER_L25;
        b->live = l25_is_live(p, e);
        b->cls = l25_bundle_of(e)->cls;
        b->size = small_class_size[b->cls];
        return;
    case TIER_LARGE:
        b->tier = TIER_LARGE;
        b->live = large_is_live(p, e, &b->size);
        b->cls = SMALL_NCLASSES;
        return;
    case TIER_CHECK:
        b->tier = TIER_CHECK;
        b->live = chk_is_live(p, e, &b->size);
        b->cls = SMALL_NCLASSES;
        return;
    case TIER_NONE:
        return;
    }
}

/* Does a live block b serve a request of n bytes aligned to align (0: no
 * alignment asked)? `exact`: see front_free_sized_slow. */
static bool front_size_belongs(const struct front_block *b, size_t n, size_t align, bool exact) {
    uint32_t cls = align > HAK_MIN_ALIGN ? front_aligned_class(align, n)
                   : n <= HAK_SMALL_MAX  ? small_class_of(n)
                                         : SMALL_NCLASSES;
    uint32_t bcls = b->cls;
    if (b->tier == TIER_CHECK) return b->size == n; /* it knows the size asked */
    if (b->tier == TIER_LARGE) {
        if (b->size == n) return true;
        /* A small block is Large when its tier had no memory
         * (front_small_failed): it then asked for a class size, n's own or,
         * for realloc's room to grow, a bigger one. The rules below hold. */
        if (b->size > HAK_SMALL_MAX || small_class_size[small_class_of(b->size)] != b->size)
            return false;
        bcls = small_class_of(b->size);
    }
    if (exact || align > HAK_MIN_ALIGN) return bcls == cls;
    /* realloc keeps a block that shrinks less than four classes down
     * (small_class_keeps), and grows one within the L2.5 tier to a block
     * for half as much again: at most three classes up. */
    return cls <= bcls && bcls < cls + 4 && n <= b->size;
}

bool front_free_sized_slow(void *p, size_t n, size_t align, bool exact, const char *fn) {
    if (p == NULL) return true;
    struct front_block b;
    front_describe(p, &b);
    if (!b.live) return false;
    if (hak_unlikely(!front_size_belongs(&b, n, align, exact)))
        diag_bug(&(struct diag_bug){.fn = fn,
                                    .kind = DIAG_SIZE_MISMATCH,
                                    .p = p,
                                    .tier = b.tier,
                                    .block = b.size,
                                    .given = n});
    front_free(p, fn);
    return true;
}

/* Move p's first `keep` bytes into a new block of n bytes. */
static void *front_move(void *p, size_t keep, size_t n) {
    void *q = front_malloc(n);
    if (q == NULL) return NULL;
    libc_mem.cpy(q, p, keep < n ? keep : n);
    front_free(p, "realloc");
    return q;
}

/* A block realloc grows to this size or more becomes a Large block with
 * room to grow in place (large_alloc_growing): each later step up to 2 MiB
 * is then free, where the size classes would copy it at every step. Below
 * it, copies are cheaper than the mapping. */
#define FRONT_GROW_MIN 4096

/* realloc of a valid block of class cls. */
static void *front_realloc_class(void *p, uint32_t cls, size_t n) {
    size_t have = small_class_size[cls];
    if (small_class_keeps(cls, n)) return p;
    if (n > have && n >= FRONT_GROW_MIN) {
        /* Growing: likely to grow on. Failing room of its own, within the
         * L2.5 tier, room for half as much again saves half the copies; the
         * slack's pages are touched only if used. (Past it, front_move's
         * malloc is a Large block anyway.) */
        void *q = large_alloc_growing(n);
        if (q == NULL && n > POOL_MAX && n <= HAK_SMALL_MAX) {
            int saved = errno; /* a refusal here is no failure of realloc */
            /* (For n bytes: a sample of it is one of n bytes.) */
            q = front_alloc_class(
                small_class_of(n + n / 2 < HAK_SMALL_MAX ? n + n / 2 : HAK_SMALL_MAX), n);
            if (q == NULL) errno = saved;
        }
        if (q) {
            libc_mem.cpy(q, p, have);
            front_free(p, "realloc");
            return q;
        }
    }
    return front_move(p, have, n);
}

static void *front_realloc(void *p, size_t n) {
    if (p == NULL) return front_malloc(n);
    if (n == 0) {
        front_free(p, "realloc"); /* glibc: realloc(p, 0) frees and returns NULL */
        return NULL;
    }
    uint32_t e;
    switch (front_owner(p, &e)) {
    case TIER_TINY:
        tiny_usable_size(p, "realloc"); /* validates p */
        return front_realloc_class(p, ss_slab_of(p)->cls, n);
    case TIER_POOL:
        return front_realloc_class(p, pool_class_of(p, e, "realloc"), n);
    case TIER_L25:
        return front_realloc_class(p, l25_class_of(p, e, "realloc"), n);
    case TIER_LARGE: {
        void *q = large_realloc(p, e, n);
        /* A small size, or pages not moved (mremap refused): bytes copied,
         * as any block's. */
        return q ? q : front_move(p, large_usable_size(p, e, "realloc"), n);
    }
    case TIER_CHECK:
        return chk_realloc(p, e, n);
    case TIER_NONE:
        break;
    }
    diag_bad_pointer("realloc", DIAG_INVALID_POINTER, p, TIER_NONE, 0);
}

static void *front_reallocarray(void *p, size_t nmemb, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    return front_realloc(p, n);
}

static int front_posix_memalign(void **out, size_t align, size_t n) {
    if (align % sizeof(void *) != 0 || !hak_is_pow2(align)) return EINVAL;
    int saved = errno; /* report through the return value only */
    void *p = front_aligned(align, n, API_MALLOC);
    errno = saved;
    if (p == NULL) return ENOMEM;
    *out = p;
    return 0;
}

static void *front_aligned_alloc(size_t align, size_t n) {
    if (!hak_is_pow2(align)) { /* C17 / glibc 2.38: only powers of two */
        errno = EINVAL;
        return NULL;
    }
    return front_aligned(align, n, API_MALLOC);
}

static void *front_memalign(size_t align, size_t n) {
    if (!hak_is_pow2(align)) {           /* glibc rounds up to a power of two */
        if (align > ((size_t)1 << 63)) { /* glibc: above SIZE_MAX / 2 + 1 */
            errno = EINVAL;
            return NULL;
        }
        /* 0 means no alignment; otherwise <= 2^63, which then fails as ENOMEM */
        align = align ? (size_t)1 << (64 - __builtin_clzl(align)) : 1;
    }
    return front_aligned(align, n, API_MALLOC);
}

static void *front_pvalloc(size_t n) {
    if (n > HAK_MAX_REQUEST) {
        errno = ENOMEM;
        return NULL;
    }
    return front_aligned(HAK_PAGE_SIZE, n ? hak_align_up(n, HAK_PAGE_SIZE) : HAK_PAGE_SIZE,
                         API_MALLOC);
}

/* ---- malloc's misses --------------------------------------------------------
 * What front.h's fast path calls when the thread cache is empty. */
static inline void *front_class_slow(uint32_t cls) {
    /* A thread that may not cache (its exit has begun) has no cache and no
     * heap: the L2.5 tier's bundles serve it, one block at a time. */
    if (hak_unlikely(!tc_self.open) && !life_thread_start()) return l25_alloc_uncached(cls);
    if (cls >= POOL_END) return l25_alloc_slow(cls);
    void *p = cls < TINY_NCLASSES ? tiny_alloc_slow(cls) : pool_alloc_slow(cls);
    /* Its tier had no memory (a full SuperSlab range, a refused chunk): the
     * L2.5 tier has bundles of every class, in mappings of their own. */
    return hak_likely(p != NULL) ? p : l25_alloc_uncached(cls);
}

HAK_HIDDEN void *front_class_miss(uint32_t cls, size_t n) {
    if (hak_unlikely(--tc_self.purge_tick < 0)) front_purge();
    if (hak_unlikely(tc_due(cls))) return front_class_due(cls, n);
    return front_class_slow(cls);
}

HAK_HIDDEN void *front_malloc_miss(size_t n, size_t cls, enum api_family f) {
    if (hak_unlikely(chk_on)) return chk_alloc(n, 0, f);
    if (hak_unlikely(--tc_self.purge_tick < 0)) front_purge();
    if (cls >= SMALL_NCLASSES) return front_large_miss(n);
    if (hak_unlikely(tc_due(cls))) return front_malloc_due(n, cls);
    void *p = front_class_slow(cls); /* (inlined: Pool blocks come this way often) */
    return hak_likely(p != NULL) ? p : front_small_failed(cls);
}

/* (No inlining nor interprocedural passes: seen inlined, the table look
 * folded into the caller's, and its register move came back.) */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noipa))
#else
__attribute__((noinline))
#endif
HAK_HIDDEN void *
front_lut_miss(size_t n, enum api_family f) {
    return front_malloc_miss(n, small_class_lut[n], f);
}

/* ---- entry points ---------------------------------------------------------
 * Each is defined once, under its hak_ name; the standard names are aliases
 * of the same code (below), so a program calling either runs one function.
 * After a failure with ENOMEM, one more try once the caches gave their
 * memory back (front_retry); malloc does it in front_malloc_miss. */
HAK_API int hak_prof_dump(const char *path) {
    return prof_dump(path);
}
HAK_API void *hak_malloc(size_t size) {
    return front_malloc(size);
}
HAK_API void hak_free(void *ptr) {
    front_free(ptr, "free");
}
HAK_API void *hak_calloc(size_t nmemb, size_t size) {
    void *p;
    FRONT_TRY(p, p == NULL, front_calloc(nmemb, size));
    return p;
}
/* realloc's every way to fail ends in front_malloc (front_move), which
 * makes the one retry itself: no FRONT_TRY, so a call that fails trims once,
 * and a realloc in place is a tail call. */
HAK_API void *hak_realloc(void *ptr, size_t size) {
    return front_realloc(ptr, size);
}
HAK_API void *hak_reallocarray(void *ptr, size_t nmemb, size_t size) {
    return front_reallocarray(ptr, nmemb, size);
}
HAK_API int hak_posix_memalign(void **out, size_t alignment, size_t size) {
    int saved = errno;
    int rc = front_posix_memalign(out, alignment, size);
    if (hak_unlikely(rc == ENOMEM)) {
        errno = ENOMEM; /* what front_retry looks at */
        if (front_retry()) {
            rc = front_posix_memalign(out, alignment, size);
            front_retrying = false;
        }
    }
    errno = saved; /* reports through its return value only */
    return rc;
}
HAK_API void *hak_aligned_alloc(size_t alignment, size_t size) {
    void *p;
    FRONT_TRY(p, p == NULL, front_aligned_alloc(alignment, size));
    return p;
}
HAK_HIDDEN void *front_aligned_as(size_t align, size_t n, enum api_family f) {
    void *p;
    FRONT_TRY(p, p == NULL, front_aligned(align, n, f));
    return p;
}
HAK_API void *hak_memalign(size_t alignment, size_t size) {
    void *p;
    FRONT_TRY(p, p == NULL, front_memalign(alignment, size));
    return p;
}
HAK_API void *hak_valloc(size_t size) {
    void *p;
    FRONT_TRY(p, p == NULL, front_aligned(HAK_PAGE_SIZE, size, API_MALLOC));
    return p;
}
HAK_API void *hak_pvalloc(size_t size) {
    void *p;
    FRONT_TRY(p, p == NULL, front_pvalloc(size));
    return p;
}
HAK_API size_t hak_malloc_usable_size(void *ptr) {
    return front_usable_size(ptr);
}
/* A size that does not belong to the block is reported (front_size_belongs);
 * a pointer that is no live block, as free would. */
HAK_API void hak_free_sized(void *ptr, size_t size) {
    if (hak_unlikely(!front_free_sized(ptr, size, false, "free_sized")))
        front_free(ptr, "free_sized");
}
HAK_API void hak_free_aligned_sized(void *ptr, size_t alignment, size_t size) {
    if (!front_free_sized_slow(ptr, size, alignment, false, "free_aligned_sized"))
        front_free(ptr, "free_aligned_sized");
}
HAK_API int hak_malloc_trim(size_t pad) {
    (void)pad;
    return front_trim();
}
HAK_API void hak_malloc_stats(void) {
    report_text(2);
}
HAK_API int hak_stats_json(char *buf, size_t len) {
    return (int)report_json(buf, len);
}
HAK_API struct mallinfo2 hak_mallinfo2(void) {
    struct tier_stats s = {0};
    tiers_stats(&s);
    struct mallinfo2 mi = {0};
    mi.arena = s.mapped;    /* size-classed address space */
    mi.uordblks = s.carved; /* carved into blocks */
    /* Not carved yet (the counts read one after the other: a chunk given
     * back between the reads can make carved the larger). */
    mi.fordblks = mi.arena > mi.uordblks ? mi.arena - mi.uordblks : 0;
    mi.hblks = s.own_blocks;
    mi.hblkhd = s.own_bytes;
    mi.keepcost = s.kept_bytes; /* freed mappings kept for reuse */
    return mi;
}

/* ---- standard names ---------------------------------------------------------
 * Left out of the sanitizer builds (HAK_NO_OVERRIDE), whose tests call the
 * hak_ names while the sanitizer's own malloc serves everything else. */
#ifndef HAK_NO_OVERRIDE
HAK_ALIAS(malloc, hak_malloc);
HAK_ALIAS(free, hak_free);
HAK_ALIAS(calloc, hak_calloc);
HAK_ALIAS(realloc, hak_realloc);
HAK_ALIAS(reallocarray, hak_reallocarray);
HAK_ALIAS(posix_memalign, hak_posix_memalign);
HAK_ALIAS(aligned_alloc, hak_aligned_alloc);
HAK_ALIAS(memalign, hak_memalign);
HAK_ALIAS(valloc, hak_valloc);
HAK_ALIAS(pvalloc, hak_pvalloc);
HAK_ALIAS(malloc_usable_size, hak_malloc_usable_size);
HAK_ALIAS(free_sized, hak_free_sized);
HAK_ALIAS(free_aligned_sized, hak_free_aligned_sized);
HAK_ALIAS(malloc_trim, hak_malloc_trim);
HAK_ALIAS(malloc_stats, hak_malloc_stats);
HAK_ALIAS(mallinfo2, hak_mallinfo2);
/* glibc's own names for its allocator: interposers, runtimes and debugging
 * libraries call them to reach "the real malloc", which must be hakmem's,
 * or a block crosses allocators (free(): invalid pointer). */
HAK_ALIAS(__libc_malloc, hak_malloc);
HAK_ALIAS(__libc_calloc, hak_calloc);
HAK_ALIAS(__libc_realloc, hak_realloc);
HAK_ALIAS(__libc_free, hak_free);
HAK_ALIAS(__libc_memalign, hak_memalign);
HAK_ALIAS(__libc_valloc, hak_valloc);
HAK_ALIAS(__libc_pvalloc, hak_pvalloc);
HAK_ALIAS(__posix_memalign, hak_posix_memalign);
#endif
