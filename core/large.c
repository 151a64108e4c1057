/* Large tier. The header sits at the mapping's first byte; every region of
 * the mapping is marked RMAP_LARGE with its distance back to that byte, so
 * free finds the header from the pointer in O(1) and can check that the
 * pointer is the one it handed out. */
#include "large.h"

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
#define LARGE_CACHE_N  16

struct large_hdr {
    uint64_t magic;
    void *user;      /* the pointer handed out */
    size_t map_size; /* bytes mapped from the header on */
    size_t offset;   /* user - header */
};

/* BigCache: freed mappings, oldest first. */
struct large_cache {
    pthread_mutex_t lock;
    uint32_t n;
    size_t bytes;
    struct large_hdr *slot[LARGE_CACHE_N];
};
static struct large_cache large_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Atomic uint64_t large_n_allocs, large_n_frees, large_n_hits, large_n_inplace, large_n_moved,
    large_live_blocks, large_live_bytes;

static inline void large_add(_Atomic uint64_t *c, int64_t d) {
    atomic_fetch_add_explicit(c, (uint64_t)d, memory_order_relaxed);
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
    if (h == NULL) errno = ENOMEM;
    return h;
}

static void large_release(struct large_hdr *h) {
    size_t size = h->map_size;
    rmap_clear_span(h, size);
    os_unmap(h, size);
}

/* Best-fitting cached mapping for `need` bytes at `map_align`, at most 25%
 * bigger, or NULL. */
static struct large_hdr *large_cache_take(size_t need, size_t map_align) {
    struct large_cache *c = &large_cache;
    struct large_hdr *best = NULL;
    uint32_t at = 0;
    hak_lock(&c->lock);
    for (uint32_t i = 0; i < c->n; i++) {
        struct large_hdr *h = c->slot[i];
        if (h->map_size < need || h->map_size - need > need / 4) continue;
        if (((uintptr_t)h & (map_align - 1)) != 0) continue;
        if (best == NULL || h->map_size < best->map_size) best = h, at = i;
    }
    if (best) {
        c->bytes -= best->map_size;
        memmove(&c->slot[at], &c->slot[at + 1], (c->n - at - 1) * sizeof c->slot[0]);
        c->n--;
    }
    hak_unlock(&c->lock);
    return best;
}

/* Keep h for reuse, evicting the oldest entries to stay in budget. */
static void large_cache_put(struct large_hdr *h) {
    struct large_cache *c = &large_cache;
    struct large_hdr *evict[LARGE_CACHE_N + 1];
    uint32_t ne = 0;
    size_t budget = hak_cfg.bigcache_bytes;
    if (h->map_size > budget) {
        large_release(h);
        return;
    }
    hak_lock(&c->lock);
    while (c->n == LARGE_CACHE_N || c->bytes + h->map_size > budget) {
        evict[ne++] = c->slot[0];
        c->bytes -= c->slot[0]->map_size;
        memmove(&c->slot[0], &c->slot[1], (c->n - 1) * sizeof c->slot[0]);
        c->n--;
    }
    c->slot[c->n++] = h;
    c->bytes += h->map_size;
    hak_unlock(&c->lock);
    for (uint32_t i = 0; i < ne; i++)
        large_release(evict[i]); /* syscalls outside the lock */
}

void *large_alloc(size_t size, size_t align, bool zero) {
    size_t off = large_offset(align);
    if (off > HAK_MAX_REQUEST / 2 || size > HAK_MAX_REQUEST - off - HAK_PAGE_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    /* A zero-size block still needs a byte of its own: without it, a block at
     * an alignment offset would start one past its mapping. */
    size_t need = hak_align_up(off + (size ? size : 1), HAK_PAGE_SIZE);
    size_t map_align = large_map_align(align);

    struct large_hdr *h = large_cache_take(need, map_align);
    bool dirty = h != NULL;
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
    struct large_cache *c = &large_cache;
    struct large_hdr *all[LARGE_CACHE_N];
    hak_lock(&c->lock);
    uint32_t n = c->n;
    memcpy(all, c->slot, n * sizeof all[0]);
    c->n = 0;
    c->bytes = 0;
    hak_unlock(&c->lock);
    for (uint32_t i = 0; i < n; i++)
        large_release(all[i]);
    return n > 0;
}

void large_fork_prepare(void) {
    pthread_mutex_lock(&large_cache.lock);
}
void large_fork_parent(void) {
    pthread_mutex_unlock(&large_cache.lock);
}
void large_fork_child(void) {
    pthread_mutex_init(&large_cache.lock, NULL);
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
    hak_unlock(&large_cache.lock);
}
