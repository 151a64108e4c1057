/* Large tier. The header sits at the mapping's first byte; every region of
 * the mapping is marked RMAP_LARGE with its distance back to that byte, so
 * free finds the header from the pointer in O(1) and can check that the
 * pointer is the one it handed out. */
#include "large.h"

#include "box/clock.h"
#include "box/config.h"
#include "box/diag.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/rmap.h"
#include "sizes.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define LARGE_LIVE     0x68616b4c4956450aull /* "hakLIVE" */
#define LARGE_FREE     0x68616b465245450aull /* "hakFREE" */
#define LARGE_HDR_SIZE ((size_t)64)

struct large_hdr {
    uint64_t magic;
    void *user;      /* the pointer handed out */
    size_t map_size; /* bytes mapped from the header on */
    size_t offset;   /* user - header */
};

/* BigCache: freed mappings by size class, four classes per power of two
 * from 1 MiB to 1 GiB (bigger ones are not kept), a few per class, all of
 * them together within hak_cfg.bigcache_bytes. An entry unused for
 * hak_cfg.bigcache_age_ms is decommitted (its pages go, the mapping stays
 * for reuse), and after twice that it is unmapped: the ages are looked at
 * on the tier's own calls and on malloc_trim. */
#define LARGE_CLASS_MIN_LG 20
#define LARGE_NCLASSES     41 /* up to 1 MiB, then four per power of two to 1 GiB */
#define LARGE_CLASS_N      4  /* entries per class */

struct large_entry {
    struct large_hdr *h; /* unreadable once decommitted: the size is here */
    size_t size;
    uint64_t freed_ms; /* when it was freed */
    bool decommitted;
};

struct large_cache {
    pthread_mutex_t lock;
    size_t bytes;     /* mapped bytes of all entries */
    uint32_t n;       /* entries */
    uint64_t aged_ms; /* last look at the ages */
    uint64_t decommits;
    uint8_t count[LARGE_NCLASSES];
    struct large_entry e[LARGE_NCLASSES][LARGE_CLASS_N]; /* oldest first */
};
static struct large_cache large_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Atomic uint64_t large_n_allocs, large_n_frees, large_n_hits, large_n_inplace, large_n_moved,
    large_live_blocks, large_live_bytes;

static inline void large_add(_Atomic uint64_t *c, int64_t d) {
    atomic_fetch_add_explicit(c, (uint64_t)d, memory_order_relaxed);
}

/* The class of a mapping of `size` bytes (a page multiple > 0): the smallest
 * class at least that big, four per power of two; LARGE_NCLASSES when too
 * big to keep. Sizes up to 1 MiB share class 0. */
static uint32_t large_class(size_t size) {
    if (size <= ((size_t)1 << LARGE_CLASS_MIN_LG)) return 0;
    size_t m = size - 1;
    unsigned lg = 63u - (unsigned)__builtin_clzl(m);
    uint32_t c = (lg - LARGE_CLASS_MIN_LG) * 4 + (uint32_t)((m >> (lg - 2)) & 3) + 1;
    return c < LARGE_NCLASSES ? c : LARGE_NCLASSES;
}

/* Alignment of the mapping itself: regions at least, more for big requests. */
static inline size_t large_map_align(size_t align) {
    return align > HAK_REGION_SIZE ? align : HAK_REGION_SIZE;
}

static inline size_t large_offset(size_t align) {
    return align > LARGE_HDR_SIZE ? align : LARGE_HDR_SIZE;
}

/* A fresh mapping of `size` bytes at `map_align`, registered in the region
 * map; NULL with errno ENOMEM when either step fails (nothing is left). */
static struct large_hdr *large_map(size_t size, size_t map_align) {
    struct large_hdr *h = os_map_aligned(size, map_align);
    if (h && !rmap_mark_span(h, size, RMAP_LARGE)) {
        os_unmap(h, size);
        h = NULL;
    }
    if (h == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    /* Huge pages where asked for; the kernel may say no, which is fine. */
    if (hak_cfg.hugepages && size >= HAK_REGION_SIZE) os_hugepages(h, size);
    return h;
}

static void large_release(struct large_hdr *h, size_t size) {
    rmap_clear_span(h, size);
    os_unmap(h, size);
}

/* Remove entry i of class c. Lock held. */
static struct large_entry large_cache_remove(struct large_cache *lc, uint32_t c, uint32_t i) {
    struct large_entry e = lc->e[c][i];
    memmove(&lc->e[c][i], &lc->e[c][i + 1], (lc->count[c] - i - 1) * sizeof e);
    lc->count[c]--;
    lc->n--;
    lc->bytes -= e.size;
    return e;
}

/* The least recently freed entry of all. Lock held, lc->n > 0. */
static uint32_t large_cache_oldest(struct large_cache *lc) {
    uint32_t best = 0;
    for (uint32_t c = 0; c < LARGE_NCLASSES; c++)
        if (lc->count[c] && (!lc->count[best] || lc->e[c][0].freed_ms < lc->e[best][0].freed_ms))
            best = c;
    return best;
}

/* Entries past their age: out of the cache into out[] (to be decommitted or
 * unmapped outside the lock by large_cache_retire); how many. Lock held. */
static uint32_t large_cache_expire(struct large_cache *lc, uint64_t now, struct large_entry *out,
                                   uint32_t max) {
    uint64_t age = hak_cfg.bigcache_age_ms;
    uint32_t n = 0;
    /* A look every quarter age at most: the scan is not free. */
    if (now - lc->aged_ms < age / 4) return 0;
    lc->aged_ms = now;
    for (uint32_t c = 0; c < LARGE_NCLASSES && n < max; c++) {
        for (uint32_t i = 0; i < lc->count[c] && n < max;) {
            struct large_entry *e = &lc->e[c][i];
            uint64_t idle = now - e->freed_ms;
            if (idle >= 2 * age || (idle >= age && !e->decommitted))
                out[n++] = large_cache_remove(lc, c, i);
            else
                i++;
        }
    }
    return n;
}

/* Decommit or unmap what large_cache_expire took out; decommitted entries go
 * back into the cache. */
static void large_cache_retire(const struct large_entry *out, uint32_t n);

/* Give the tail of cached mapping h (`size` bytes) beyond `need` back to the
 * OS: the front keeps its resident pages, so a block copied into it (a
 * realloc leaving a smaller tier) takes no page faults. Returns the size h
 * has now. */
static size_t large_trim_to(struct large_hdr *h, size_t size, size_t need) {
    size_t keep = hak_align_up(need, HAK_REGION_SIZE);
    if (keep < size) rmap_clear_span((uint8_t *)h + keep, size - keep);
    int saved = errno; /* a refusal is no failure of malloc */
    if (os_resize(h, size, need)) return need;
    errno = saved;
    rmap_mark_span(h, size, RMAP_LARGE); /* cannot fail: the leaves exist */
    return size;
}

/* A cached mapping for `need` bytes at `map_align`, or NULL: the newest one
 * at most 25% bigger, else the smallest one up to 4x bigger (with
 * `any_bigger`, of any size) that still has its pages, cut down to `need`.
 * *zeroed when its pages were decommitted (they read as zero). */
static struct large_hdr *large_cache_take(size_t need, size_t map_align, bool any_bigger,
                                          bool *zeroed) {
    struct large_cache *lc = &large_cache;
    struct large_entry old[LARGE_NCLASSES * LARGE_CLASS_N];
    struct large_entry got = {0};
    uint32_t c0 = large_class(need), nold;
    hak_lock(&lc->lock);
    /* Class c0 holds sizes just below and above need; c0+1 those up to 25%
     * over it. Newest first: their pages are the likeliest still in cache. */
    for (uint32_t c = c0; c <= c0 + 1 && c < LARGE_NCLASSES && got.h == NULL; c++) {
        for (uint32_t i = lc->count[c]; i-- > 0;) {
            struct large_entry *e = &lc->e[c][i];
            if (e->size < need || e->size - need > need / 4) continue;
            if (((uintptr_t)e->h & (map_align - 1)) != 0) continue;
            got = large_cache_remove(lc, c, i);
            break;
        }
    }
    /* Up to 4x the request: a much bigger mapping is likelier wanted again
     * at its own size (a recycled scratch buffer) than worth cutting; but
     * for a block that realloc grows, any. */
    for (uint32_t c = c0 + 2; c < LARGE_NCLASSES && got.h == NULL; c++) {
        for (uint32_t i = lc->count[c]; i-- > 0;) {
            struct large_entry *e = &lc->e[c][i];
            if (e->decommitted || (!any_bigger && e->size / 4 > need)) continue;
            if (((uintptr_t)e->h & (map_align - 1)) != 0) continue;
            got = large_cache_remove(lc, c, i);
            break;
        }
    }
    nold = large_cache_expire(lc, hak_now_ms(), old, LARGE_NCLASSES * LARGE_CLASS_N);
    hak_unlock(&lc->lock);
    large_cache_retire(old, nold);
    if (got.h == NULL) return NULL;
    *zeroed = got.decommitted;
    /* A decommitted header reads as zero: the size comes from the entry. */
    got.h->map_size = got.size - need > need / 4 ? large_trim_to(got.h, got.size, need) : got.size;
    return got.h;
}

/* Keep h for reuse, evicting the oldest entries to stay in bounds. */
static void large_cache_put(struct large_hdr *h) {
    struct large_cache *lc = &large_cache;
    struct large_entry old[LARGE_NCLASSES * LARGE_CLASS_N + 1]; /* the whole cache, at worst */
    uint32_t c = large_class(h->map_size), nold = 0;
    size_t budget = hak_cfg.bigcache_bytes;
    if (c >= LARGE_NCLASSES || h->map_size > budget) {
        large_release(h, h->map_size);
        return;
    }
    uint64_t now = hak_now_ms();
    hak_lock(&lc->lock);
    if (lc->count[c] == LARGE_CLASS_N) {
        old[nold] = large_cache_remove(lc, c, 0);
        old[nold++].freed_ms = 0; /* unmap */
    }
    while (lc->bytes + h->map_size > budget) {
        old[nold] = large_cache_remove(lc, large_cache_oldest(lc), 0);
        old[nold++].freed_ms = 0;
    }
    lc->e[c][lc->count[c]++] = (struct large_entry){.h = h, .size = h->map_size, .freed_ms = now};
    lc->n++;
    lc->bytes += h->map_size;
    nold += large_cache_expire(lc, now, old + nold, LARGE_NCLASSES * LARGE_CLASS_N + 1 - nold);
    hak_unlock(&lc->lock);
    large_cache_retire(old, nold); /* syscalls outside the lock */
}

static void large_cache_retire(const struct large_entry *out, uint32_t n) {
    struct large_cache *lc = &large_cache;
    uint64_t now = hak_now_ms();
    for (uint32_t i = 0; i < n; i++) {
        struct large_entry e = out[i];
        if (e.freed_ms == 0 || e.decommitted || now - e.freed_ms >= 2 * hak_cfg.bigcache_age_ms) {
            large_release(e.h, e.size);
            continue;
        }
        if (!os_decommit(e.h, e.size)) { /* locked (mlockall): its pages cannot go */
            large_release(e.h, e.size);
            continue;
        }
        /* Back in, as old as it was; dropped if the cache filled meanwhile. */
        uint32_t c = large_class(e.size);
        bool kept = false;
        hak_lock(&lc->lock);
        if (lc->count[c] < LARGE_CLASS_N && lc->bytes + e.size <= hak_cfg.bigcache_bytes) {
            uint32_t j = lc->count[c];
            while (j > 0 && lc->e[c][j - 1].freed_ms > e.freed_ms) {
                lc->e[c][j] = lc->e[c][j - 1];
                j--;
            }
            e.decommitted = true;
            lc->e[c][j] = e;
            lc->count[c]++;
            lc->n++;
            lc->bytes += e.size;
            lc->decommits++;
            kept = true;
        }
        hak_unlock(&lc->lock);
        if (!kept) large_release(e.h, e.size);
    }
}

static void *large_alloc_as(size_t size, size_t align, bool zero, bool growing) {
    size_t off = large_offset(align);
    if (off > HAK_MAX_REQUEST / 2 || size > HAK_MAX_REQUEST - off - HAK_PAGE_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    /* A zero-size block still needs a byte of its own: without it, a block at
     * an alignment offset would start one past its mapping. */
    size_t need = hak_align_up(off + (size ? size : 1), HAK_PAGE_SIZE);
    size_t map_align = large_map_align(align);

    bool zeroed = false;
    struct large_hdr *h = large_cache_take(need, map_align, growing, &zeroed);
    bool dirty = h != NULL && !zeroed;
    if (h) {
        large_add(&large_n_hits, 1);
    } else {
        if ((h = large_map(need, map_align)) == NULL) return NULL;
        h->map_size = need;
    }
    h->magic = LARGE_LIVE;
    h->offset = off;
    h->user = (uint8_t *)h + off;
    if (zero && dirty) memset(h->user, 0, size); /* fresh mappings are already zero */
    large_add(&large_n_allocs, 1);
    large_add(&large_live_blocks, 1);
    large_add(&large_live_bytes, (int64_t)h->map_size);
    return h->user;
}

void *large_alloc(size_t size, size_t align, bool zero) {
    return large_alloc_as(size, align, zero, false);
}

void *large_alloc_growing(size_t size) {
    return large_alloc_as(size, HAK_MIN_ALIGN, false, true);
}

/* The live header for p, or abort naming p. */
static struct large_hdr *large_header(const void *p, uint32_t entry, const char *fn) {
    uintptr_t back = (uintptr_t)rmap_payload(entry) << HAK_REGION_SHIFT;
    struct large_hdr *h = (struct large_hdr *)(rmap_region_base(p) - back);
    if (hak_likely(h->magic == LARGE_LIVE && h->user == p)) return h;
    if (h->magic == LARGE_FREE && h->user == p) diag_bad_pointer(fn, "double free", p);
    diag_bad_pointer(fn, "invalid pointer", p);
}

void large_free(void *p, uint32_t entry, const char *fn) {
    struct large_hdr *h = large_header(p, entry, fn);
    h->magic = LARGE_FREE;
    large_add(&large_n_frees, 1);
    large_add(&large_live_blocks, -1);
    large_add(&large_live_bytes, -(int64_t)h->map_size);
    large_cache_put(h);
}

size_t large_usable_size(const void *p, uint32_t entry, const char *fn) {
    struct large_hdr *h = large_header(p, entry, fn);
    return h->map_size - h->offset;
}

/* Move block h's pages into a fresh aligned mapping of `need` bytes. */
static void *large_move(struct large_hdr *h, size_t need) {
    size_t off = h->offset, old = h->map_size;
    struct large_hdr *dst = large_map(need, large_map_align(off > LARGE_HDR_SIZE ? off : 0));
    if (dst == NULL) return NULL;
    rmap_clear_span(h, old);
    if (!os_move(h, old, need, dst)) {
        rmap_mark_span(h, old, RMAP_LARGE);
        rmap_clear_span(dst, need);
        os_unmap(dst, need);
        errno = ENOMEM;
        return NULL;
    }
    dst->map_size = need;
    dst->user = (uint8_t *)dst + off;
    large_add(&large_n_moved, 1);
    large_add(&large_live_bytes, (int64_t)need - (int64_t)old);
    return dst->user;
}

void *large_realloc(void *p, uint32_t entry, size_t n) {
    struct large_hdr *h = large_header(p, entry, "realloc");
    size_t off = h->offset, old = h->map_size;
    if (n > HAK_MAX_REQUEST - off - HAK_PAGE_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    size_t need = hak_align_up(off + n, HAK_PAGE_SIZE);
    if (need <= old && need >= old / 2) return p; /* fits; not worth trimming */
    int saved = errno; /* a failed in-place attempt must not show in errno */

    /* Region-map entries of a range are always cleared before the range is
     * given up, so another thread mapping it next never has its fresh
     * entries erased. Re-marking after a failure cannot fail: the leaves
     * exist already. */
    if (need < old) {
        size_t keep = hak_align_up(need, HAK_REGION_SIZE);
        if (keep < old) rmap_clear_span((uint8_t *)h + keep, old - keep);
        if (!os_resize(h, old, need)) {
            rmap_mark_span(h, old, RMAP_LARGE);
            errno = saved;
            return p; /* keep the bigger mapping */
        }
    } else if (os_resize(h, old, need)) {
        if (!rmap_mark_span(h, need, RMAP_LARGE)) {
            os_resize(h, need, old); /* cannot register the growth: undo it */
            errno = ENOMEM;
            return NULL;
        }
    } else {
        errno = saved; /* the move's own calls leave errno alone unless they fail */
        return large_move(h, need);
    }
    h->map_size = need;
    large_add(&large_n_inplace, 1);
    large_add(&large_live_bytes, (int64_t)need - (int64_t)old);
    errno = saved;
    return p;
}

bool large_trim(void) {
    struct large_cache *lc = &large_cache;
    struct large_entry all[LARGE_NCLASSES * LARGE_CLASS_N];
    uint32_t n = 0;
    hak_lock(&lc->lock);
    for (uint32_t c = 0; c < LARGE_NCLASSES; c++)
        while (lc->count[c])
            all[n++] = large_cache_remove(lc, c, lc->count[c] - 1);
    hak_unlock(&lc->lock);
    for (uint32_t i = 0; i < n; i++)
        large_release(all[i].h, all[i].size);
    return n > 0;
}

void large_fork_prepare(void) {
    pthread_mutex_lock(&large_cache.lock);
}
void large_fork_release(void) {
    pthread_mutex_unlock(&large_cache.lock);
}

void large_get_stats(struct large_stats *s) {
    s->allocs = atomic_load(&large_n_allocs);
    s->frees = atomic_load(&large_n_frees);
    s->cache_hits = atomic_load(&large_n_hits);
    s->remaps_inplace = atomic_load(&large_n_inplace);
    s->remaps_moved = atomic_load(&large_n_moved);
    s->live_blocks = atomic_load(&large_live_blocks);
    s->live_bytes = atomic_load(&large_live_bytes);
    hak_lock(&large_cache.lock);
    s->cached_blocks = large_cache.n;
    s->cached_bytes = large_cache.bytes;
    s->cache_decommits = large_cache.decommits;
    hak_unlock(&large_cache.lock);
}
