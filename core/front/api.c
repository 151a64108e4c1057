/* The exported allocation API: the standard names, which replace libc's in
 * any process hakmem is loaded into, and the hak_ names from hakmem.h. Each
 * standard function and its hak_ twin call the same inline front code. */
#include "hakmem.h"

#include "box/stats.h"
#include "front/front.h"
#include "front/lifecycle.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#define HAK_API __attribute__((visibility("default")))

/* C23 names glibc 2.36 does not declare yet. */
void free_sized(void *p, size_t size);
void free_aligned_sized(void *p, size_t alignment, size_t size);

/* A block of n bytes aligned to `align` (a power of two). */
static void *front_aligned(size_t align, size_t n) {
    if (align <= HAK_MIN_ALIGN) return front_malloc(n);
    if (n <= HAK_SMALL_MAX && align <= HAK_SMALL_MAX) {
        /* Tiny blocks and aligned L2.5 blocks sit at multiples of their size
         * from a 2 MiB boundary, so a class whose size is a multiple of align
         * gives aligned blocks; the power-of-two class at or above
         * max(n, align) always is one. */
        uint32_t cls = small_class_of(n > align ? n : align);
        /* Pool blocks follow 16-byte headers: aligned only to 16. */
        while ((cls >= POOL_FIRST && cls < POOL_END) || (small_class_size[cls] & (align - 1)))
            cls++;
        if (cls < TINY_NCLASSES) return tiny_alloc(cls);
        /* Coloured L2.5 blocks (one stride of size + 64 apart, sizes multiples
         * of 4 KiB) are 64-byte aligned; for more, uncoloured ones. */
        return align <= 64 ? l25_alloc(cls) : l25_alloc_aligned(cls);
    }
    return large_alloc(n, align, false);
}

static void *front_calloc(size_t nmemb, size_t size) {
    size_t n;
    if (__builtin_mul_overflow(nmemb, size, &n)) {
        errno = ENOMEM;
        return NULL;
    }
    if (n > HAK_SMALL_MAX) return large_alloc(n, HAK_MIN_ALIGN, true);
    void *p = front_alloc_class(small_class_of(n));
    if (p) memset(p, 0, n);
    return p;
}

static size_t front_usable_size(void *p) {
    if (ss_contains(p)) return tiny_usable_size(p, "malloc_usable_size");
    uint32_t e = rmap_get(p);
    switch (rmap_kind_of(e)) {
    case RMAP_POOL:
        return small_class_size[pool_class_of(p, e, "malloc_usable_size")];
    case RMAP_L25:
        return small_class_size[l25_class_of(p, e, "malloc_usable_size")];
    case RMAP_LARGE:
        return large_usable_size(p, e, "malloc_usable_size");
    default:
        if (p != NULL) diag_bad_pointer("malloc_usable_size", "invalid pointer", p);
        return 0;
    }
}

/* Move p's first `keep` bytes into a new block of n bytes. */
static void *front_move(void *p, size_t keep, size_t n) {
    void *q = front_malloc(n);
    if (q == NULL) return NULL;
    memcpy(q, p, keep < n ? keep : n);
    front_free(p, "realloc");
    return q;
}

/* realloc of a valid block of class cls. */
static void *front_realloc_class(void *p, uint32_t cls, size_t n) {
    size_t have = small_class_size[cls];
    /* Stay put unless growing, or shrinking by more than a power of two. */
    if (n <= have && small_class_of(n) + 4 > cls) return p;
    if (n > have && n > POOL_MAX) {
        /* A block growing past the Pool tier is likely to grow on (a buffer,
         * a vector): room for as much again saves copies (a buffer grown by
         * 1.5x copies every other step), and the slack's pages are touched
         * only if used. Past the L2.5 tier it becomes a Large block, which
         * may take over a bigger cached mapping to grow into. */
        int saved = errno; /* a refusal here is no failure of realloc */
        void *q = n > HAK_SMALL_MAX
                      ? large_alloc_growing(n)
                      : front_malloc(n + n / 2 < HAK_SMALL_MAX ? n + n / 2 : HAK_SMALL_MAX);
        if (q) {
            memcpy(q, p, have);
            front_free(p, "realloc");
            return q;
        }
        errno = saved;
    }
    return front_move(p, have, n);
}

static void *front_realloc(void *p, size_t n) {
    if (p == NULL) return front_malloc(n);
    if (n == 0) {
        front_free(p, "realloc"); /* glibc: realloc(p, 0) frees and returns NULL */
        return NULL;
    }
    if (ss_contains(p)) {
        tiny_usable_size(p, "realloc"); /* validates p */
        return front_realloc_class(p, ss_slab_of(p)->cls, n);
    }
    uint32_t e = rmap_get(p);
    switch (rmap_kind_of(e)) {
    case RMAP_POOL:
        return front_realloc_class(p, pool_class_of(p, e, "realloc"), n);
    case RMAP_L25:
        return front_realloc_class(p, l25_class_of(p, e, "realloc"), n);
    case RMAP_LARGE:
        if (n > HAK_SMALL_MAX) return large_realloc(p, e, n);
        return front_move(p, large_usable_size(p, e, "realloc"), n);
    default:
        diag_bad_pointer("realloc", "invalid pointer", p);
    }
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
    void *p = front_aligned(align, n);
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
    return front_aligned(align, n);
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
    return front_aligned(align, n);
}

static void *front_pvalloc(size_t n) {
    if (n > HAK_MAX_REQUEST) {
        errno = ENOMEM;
        return NULL;
    }
    return front_aligned(HAK_PAGE_SIZE, n ? hak_align_up(n, HAK_PAGE_SIZE) : HAK_PAGE_SIZE);
}

static int front_trim(void) {
    l25_thread_flush();
    bool tiny = tiny_trim(), ss = ss_trim(), pool = pool_trim(), l25 = l25_trim();
    bool large = large_trim();
    return tiny || ss || pool || l25 || large;
}

static struct mallinfo2 front_mallinfo2(void) {
    struct l25_stats s;
    struct large_stats l;
    struct ss_stats t;
    struct pool_stats o;
    l25_get_stats(&s);
    large_get_stats(&l);
    ss_get_stats(&t);
    pool_get_stats(&o);
    struct mallinfo2 mi = {0};
    /* Size-classed address space: SuperSlabs, Pool chunks, L2.5 bundles. */
    mi.arena = t.live * HAK_REGION_SIZE + o.bytes_live + s.bytes_mapped;
    mi.uordblks = s.carved_bytes + t.carved_bytes + o.carved_bytes; /* carved into blocks */
    mi.fordblks = mi.arena - mi.uordblks;                           /* not carved yet */
    mi.hblks = l.live_blocks;
    mi.hblkhd = l.live_bytes;
    mi.keepcost = l.cached_bytes; /* freed large mappings kept for reuse */
    return mi;
}

/* ---- standard names ---------------------------------------------------- */
HAK_API void *malloc(size_t n) {
    return front_malloc(n);
}
HAK_API void free(void *p) {
    front_free(p, "free");
}
HAK_API void *calloc(size_t nmemb, size_t size) {
    return front_calloc(nmemb, size);
}
HAK_API void *realloc(void *p, size_t n) {
    return front_realloc(p, n);
}
HAK_API void *reallocarray(void *p, size_t nmemb, size_t size) {
    return front_reallocarray(p, nmemb, size);
}
HAK_API int posix_memalign(void **out, size_t align, size_t n) {
    return front_posix_memalign(out, align, n);
}
HAK_API void *aligned_alloc(size_t align, size_t n) {
    return front_aligned_alloc(align, n);
}
HAK_API void *memalign(size_t align, size_t n) {
    return front_memalign(align, n);
}
HAK_API void *valloc(size_t n) {
    return front_aligned(HAK_PAGE_SIZE, n);
}
HAK_API void *pvalloc(size_t n) {
    return front_pvalloc(n);
}
HAK_API size_t malloc_usable_size(void *p) {
    return front_usable_size(p);
}
HAK_API void free_sized(void *p, size_t size) {
    (void)size;
    front_free(p, "free_sized");
}
HAK_API void free_aligned_sized(void *p, size_t align, size_t size) {
    (void)align, (void)size;
    front_free(p, "free_aligned_sized");
}
HAK_API int malloc_trim(size_t pad) {
    (void)pad;
    return front_trim();
}
HAK_API struct mallinfo2 mallinfo2(void) {
    return front_mallinfo2();
}
HAK_API void malloc_stats(void) {
    stats_print(2);
}

/* ---- hak_ names ---------------------------------------------------------- */
HAK_API void *hak_malloc(size_t n) {
    return front_malloc(n);
}
HAK_API void hak_free(void *p) {
    front_free(p, "free");
}
HAK_API void *hak_calloc(size_t nmemb, size_t size) {
    return front_calloc(nmemb, size);
}
HAK_API void *hak_realloc(void *p, size_t n) {
    return front_realloc(p, n);
}
HAK_API void *hak_reallocarray(void *p, size_t nmemb, size_t size) {
    return front_reallocarray(p, nmemb, size);
}
HAK_API int hak_posix_memalign(void **out, size_t align, size_t n) {
    return front_posix_memalign(out, align, n);
}
HAK_API void *hak_aligned_alloc(size_t align, size_t n) {
    return front_aligned_alloc(align, n);
}
HAK_API void *hak_memalign(size_t align, size_t n) {
    return front_memalign(align, n);
}
HAK_API void *hak_valloc(size_t n) {
    return front_aligned(HAK_PAGE_SIZE, n);
}
HAK_API void *hak_pvalloc(size_t n) {
    return front_pvalloc(n);
}
HAK_API size_t hak_malloc_usable_size(void *p) {
    return front_usable_size(p);
}
HAK_API void hak_free_sized(void *p, size_t size) {
    (void)size;
    front_free(p, "free_sized");
}
HAK_API void hak_free_aligned_sized(void *p, size_t align, size_t size) {
    (void)align, (void)size;
    front_free(p, "free_aligned_sized");
}
HAK_API int hak_malloc_trim(size_t pad) {
    (void)pad;
    return front_trim();
}
HAK_API void hak_malloc_stats(void) {
    stats_print(2);
}
