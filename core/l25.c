/* L2.5 tier: bundles, the heaps that own them (and their remote stacks), the
 * spare stacks, the shards of shared bundles, and the slow paths of the
 * thread cache. */
#include "l25/l25.h"

#include "box/arena.h"
#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lfstack.h"
#include "box/remote.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/tier.h"
#include "box/usage.h"

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

struct l25_shard {
    _Alignas(64) pthread_mutex_t lock;
    struct l25_bundle *partial; /* bundles with free blocks and blocks out */
    /* Bundles with every block free: the committed ones first, newest
     * first, then the decommitted ones. */
    struct l25_bundle *empty;
    uint32_t nempty;
    /* Committed empty bundles on `empty` (under the lock; read without it
     * by l25_steal, which locks only a shard that has one). */
    _Atomic uint32_t ncommitted;
    /* The ageing pass has something to look at here: set (under the lock)
     * when blocks come back or are taken, cleared by a pass that left no
     * committed empty bundle and no free block with pages. Read without the
     * lock: a pass locks only the shards that have work (all 305 were locked
     * every pass, from whichever allocating thread made it). */
    _Atomic bool work;
    uint64_t refills, flushes, carved_bytes;
    uint32_t purging; /* bundles with free blocks out for a purge (l25_shard_purge) */
};

/* This thread has a shard's free blocks out for a purge (l25_shard_purge):
 * a signal handler's take inside it must not wait for them. */
static __thread uint32_t l25_purging_mine;

HAK_HIDDEN struct l25_bundle *l25_desc[L25_MAX_BUNDLES / L25_DESC_CHUNK];

#define L25_LIMIT_DIV 256
/* Free blocks with pages the first bundle of a shard keeps through an
 * ageing pass (see l25_purge). */
#define L25_KEEP_FREE 2

/* Shard L25_SHARDS of a class has the uncoloured bundles for aligned requests. */
#define L25_ALIGNED L25_SHARDS
static struct l25_shard l25_shards[SMALL_NCLASSES][L25_SHARDS + 1] = {
    [0 ... SMALL_NCLASSES - 1] = {[0 ... L25_SHARDS] = {.lock = PTHREAD_MUTEX_INITIALIZER}},
};

/* Descriptors: a high-water mark and a list of the ones given back. */
static pthread_mutex_t l25_desc_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t l25_desc_top;
static struct l25_bundle *l25_desc_free;
static uint64_t l25_mapped, l25_unmapped, l25_bytes, l25_decommits; /* under l25_desc_lock */
static _Atomic uint64_t l25_free_decommitted; /* bytes of free blocks decommitted */

static _Atomic uint64_t l25_purge_next; /* ms: the next l25_purge l25_put makes */

/* Shards are handed to threads in turn. */
static _Atomic uint32_t l25_next_shard;
static __thread uint32_t l25_my_shard = UINT32_MAX;

static uint32_t l25_thread_shard(void) {
    if (hak_unlikely(l25_my_shard == UINT32_MAX))
        l25_my_shard =
            atomic_fetch_add_explicit(&l25_next_shard, 1, memory_order_relaxed) % L25_SHARDS;
    return l25_my_shard;
}

/* The smallest of 2, 4, 8 MiB holding 4 blocks one stride apart. */
static inline size_t l25_span(uint32_t stride) {
    size_t span = HAK_REGION_SIZE;
    while (span < 4 * (size_t)stride)
        span *= 2;
    return span;
}

static inline uint32_t l25_words(uint32_t nblocks) {
    return (nblocks + 63) / 64;
}

/* Make every usable block of b free (a new bundle, or one decommitted, whose
 * bitmaps in its first blocks read as zero again). */
static void l25_bundle_reset(struct l25_bundle *b) {
    uint32_t words = l25_words(b->nblocks);
    memset(b->avail, 0, words * sizeof(uint64_t));
    for (uint32_t i = b->first; i < b->nblocks; i++)
        b->avail[i >> 6] |= (uint64_t)1 << (i & 63);
    if (b->dirty) memset(b->dirty, 0, words * sizeof(uint64_t));
    b->stale1 = 0;
    b->navail = b->nblocks - b->first;
    b->hint = b->first >> 6;
}

/* Descriptor i has its chunk, taken from the arena when it is the first of
 * one; false when the arena refuses. l25_desc_lock held. */
static bool l25_desc_chunk(uint32_t i) {
    struct l25_bundle **c = &l25_desc[i >> L25_DESC_SHIFT];
    if (*c == NULL) *c = arena_meta(L25_DESC_CHUNK * sizeof **c); /* zeroed */
    return *c != NULL;
}

/* b's descriptor back, and its bundle of `span` bytes uncounted: unmapped,
 * or (`unmapped` false) never mapped after all. */
static void l25_desc_put(struct l25_bundle *b, size_t span, bool unmapped) {
    hak_lock(&l25_desc_lock);
    if (unmapped)
        l25_unmapped++;
    else
        l25_mapped--;
    l25_bytes -= span;
    b->base = NULL;
    b->next = l25_desc_free;
    l25_desc_free = b;
    hak_unlock(&l25_desc_lock);
}

/* Coloured (see l25.h): the tier's own classes, except for aligned requests. */
static inline uint32_t l25_stride(uint32_t cls, uint32_t shard) {
    return small_class_size[cls] + (cls >= L25_FIRST && shard != L25_ALIGNED ? 64 : 0);
}

/* Describe in b (descriptor idx) a bundle of class cls for `shard` over
 * [base, base + span), every block free; its bitmaps in its first blocks
 * when it has more than 64. */
static void l25_bundle_format(struct l25_bundle *b, uint32_t cls, uint32_t shard, uint8_t *base,
                              size_t span, uint32_t idx) {
    const uint32_t size = small_class_size[cls], stride = l25_stride(cls, shard);
    memset(&b->owner, 0, sizeof *b - offsetof(struct l25_bundle, owner));
    b->idx = idx;
    b->base = base;
    b->span = span;
    b->cls = cls;
    b->size = size;
    b->stride = stride;
    /* floor(2^64 / stride) + 1, or exactly 2^64 / stride for a power of two
     * (exact then too). */
    b->magic = UINT64_MAX / stride + 1;
    b->nblocks = (uint32_t)(span / stride);
    b->shard = shard;
    b->owner = L25_SHARED;
    if (stride != size) { /* coloured: the state bytes in the gaps */
        /* (l25_alloc_fast writes a cached block's there, past the block: a
         * coloured bundle keeps no bitmap in its first blocks.) */
        assert(b->nblocks <= 64);
        b->mark = base + size + L25_MARK_OFF;
        b->mark_stride = stride;
    } else {
        b->mark = b->mark1;
        b->mark_stride = 1;
    }
    if (b->nblocks <= 64) {
        b->avail = &b->avail1;
        b->dirty = &b->dirty1;
    } else {
        /* The bitmap and the state bytes in the first blocks, which are
         * then never handed out (zeroed: the pages may hold another class's
         * blocks). */
        size_t words = l25_words(b->nblocks) * sizeof(uint64_t), bytes = words + b->nblocks;
        b->avail = (uint64_t *)base;
        b->mark = base + words;
        b->first = (uint32_t)((bytes + size - 1) / size);
        memset(base, 0, bytes);
    }
    l25_bundle_reset(b);
}

/* A new, empty bundle of cls for shard `shard`; NULL when the OS or the
 * descriptor table refuses. Called without locks. */
static struct l25_bundle *l25_bundle_new(uint32_t cls, uint32_t shard, struct l25_heap *owner) {
    const size_t span = l25_span(l25_stride(cls, shard));
    /* Under an address-space limit each class's partly used bundle is space
     * other blocks cannot have: bundles no bigger than 1/256 of the limit
     * (read each time: a program may set it while running). Bigger blocks
     * then get mappings of their own (the front's last resort). */
    if (span > os_as_limit() / L25_LIMIT_DIV) return NULL;
    struct l25_bundle *b;
    uint32_t idx = 0;
    hak_lock(&l25_desc_lock);
    if ((b = l25_desc_free) != NULL) {
        l25_desc_free = b->next;
        idx = b->idx;
    } else if (l25_desc_top < L25_MAX_BUNDLES && l25_desc_chunk(l25_desc_top)) {
        idx = l25_desc_top++;
        b = &l25_desc[idx >> L25_DESC_SHIFT][idx & (L25_DESC_CHUNK - 1)];
        b->idx = idx; /* kept for good: the descriptor may go back unused */
    }
    if (b) { /* counted now, under the one lock (taken back if the mapping fails) */
        l25_mapped++;
        l25_bytes += span;
    }
    hak_unlock(&l25_desc_lock);
    if (b == NULL) return NULL;

    uint8_t *base = arena_alloc(span);
    if (base == NULL) {
        l25_desc_put(b, span, false);
        return NULL;
    }
    l25_bundle_format(b, cls, shard, base, span, idx);
    b->owner = owner;
    /* Published in the region map only once the descriptor is complete. */
    for (size_t r = 0; r < span; r += HAK_REGION_SIZE) {
        if (!rmap_set_region(base + r, TIER_L25, idx)) {
            rmap_clear_span(base, span);
            arena_free(base, span);
            l25_desc_put(b, span, false);
            return NULL;
        }
    }
    return b;
}

static void l25_bundle_unmap(struct l25_bundle *b) {
    size_t span = b->span;
    rmap_clear_span(b->base, span);
    arena_free(b->base, span);
    l25_desc_put(b, span, true);
}

static void l25_count_decommit(void) {
    hak_lock(&l25_desc_lock);
    l25_decommits++;
    hak_unlock(&l25_desc_lock);
}

/* ---- shard lists (shard lock held) ------------------------------------------ */

static void l25_list_push(struct l25_bundle **head, struct l25_bundle *b) {
    b->prev = NULL;
    b->next = *head;
    if (*head) (*head)->prev = b;
    *head = b;
}

static void l25_list_remove(struct l25_bundle **head, struct l25_bundle *b) {
    if (b->prev)
        b->prev->next = b->next;
    else
        *head = b->next;
    if (b->next) b->next->prev = b->prev;
}

/* Committed empty bundles on all shards' empty lists, by span (2, 4, 8 MiB):
 * what l25_steal may find. */
static _Atomic uint32_t l25_spares[3];

static inline _Atomic uint32_t *l25_spares_of(size_t span) {
    return &l25_spares[span >> (HAK_REGION_SHIFT + 1)]; /* 0, 1, 2 */
}

/* Work for the ageing pass. Shard lock held. */
static inline void l25_work(struct l25_shard *s) {
    if (!atomic_load_explicit(&s->work, memory_order_relaxed))
        atomic_store_explicit(&s->work, true, memory_order_relaxed);
}

/* Off the shard's empty list. Shard lock held. */
static void l25_empty_unlink(struct l25_shard *s, struct l25_bundle *b) {
    l25_list_remove(&s->empty, b);
    s->nempty--;
    if (b->committed) {
        atomic_fetch_sub_explicit(l25_spares_of(b->span), 1, memory_order_relaxed);
        atomic_store_explicit(&s->ncommitted,
                              atomic_load_explicit(&s->ncommitted, memory_order_relaxed) - 1,
                              memory_order_relaxed);
    }
}

/* Work the shard's empty list asks for, done once the lock is dropped. */
struct l25_todo {
    struct l25_bundle *b[L25_EMPTY_MAX + 2];
    bool unmap[L25_EMPTY_MAX + 2];
    uint32_t n;
};

/* Empty bundles stay committed (a working set that empties bundles and
 * fills them again makes no syscall; another class may take them, see
 * l25_steal) until unused for the cache age (HAKMEM_BIGCACHE_AGE_MS), then
 * are decommitted; past L25_EMPTY_MAX the oldest is unmapped. Takes those
 * bundles off the list into *t. Shard lock held. */
static void l25_tidy_empty(struct l25_shard *s, uint64_t now, struct l25_todo *t) {
    const uint32_t room = sizeof t->b / sizeof t->b[0];
    /* Bundles being decommitted are off the list and come back later, so
     * nempty can pass the bound by more than one: trim to it, as far as
     * *t has room (the next call takes the rest). */
    while (s->nempty > L25_EMPTY_MAX && t->n < room) { /* the oldest: the list's last */
        struct l25_bundle *last = s->empty;
        while (last->next)
            last = last->next;
        l25_empty_unlink(s, last);
        t->b[t->n] = last;
        t->unmap[t->n++] = true;
    }
    for (struct l25_bundle *b = s->empty, *next; b && b->committed && t->n < room; b = next) {
        next = b->next;
        /* (empty_ms may be later than a now read before the walk) */
        if (b->empty_ms > now || now - b->empty_ms < hak_cfg.bigcache_age_ms) continue;
        l25_empty_unlink(s, b);
        t->b[t->n] = b;
        t->unmap[t->n++] = false;
    }
}

/* b, empty and committed (its pages kept), first on the shard's empty list,
 * emptied now. Shard lock held. */
static void l25_empty_push(struct l25_shard *s, struct l25_bundle *b) {
    b->committed = true;
    b->empty_ms = hak_now_ms();
    l25_list_push(&s->empty, b);
    s->nempty++;
    atomic_fetch_add_explicit(l25_spares_of(b->span), 1, memory_order_relaxed);
    atomic_store_explicit(&s->ncommitted,
                          atomic_load_explicit(&s->ncommitted, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* b has no block out any more: off the partial list, onto the empty one.
 * Shard lock held. */
static void l25_became_empty(struct l25_shard *s, struct l25_bundle *b, struct l25_todo *t) {
    if (b->listed) l25_list_remove(&s->partial, b);
    b->listed = false;
    l25_empty_push(s, b);
    l25_tidy_empty(s, b->empty_ms, t);
}

/* b (decommitted) onto the empty list at *head, behind the committed ones. */
static void l25_insert_parked(struct l25_bundle **head, struct l25_bundle *b) {
    struct l25_bundle *after = NULL;
    for (struct l25_bundle *e = *head; e && e->committed; e = e->next)
        after = e;
    if (after) {
        b->prev = after;
        b->next = after->next;
        if (b->next) b->next->prev = b;
        after->next = b;
    } else {
        l25_list_push(head, b);
    }
}

/* Put b back on the empty list: decommitted, behind the committed ones;
 * else (the decommit refused: mlockall) among the committed ones again,
 * its pages and their bytes kept, looked at again an age later. */
static void l25_park(struct l25_shard *s, struct l25_bundle *b, bool decommitted) {
    hak_lock(&s->lock);
    if (decommitted) {
        b->committed = false;
        l25_insert_parked(&s->empty, b);
        s->nempty++;
    } else {
        l25_empty_push(s, b);
    }
    hak_unlock(&s->lock);
}

/* Give b's pages (every block free) back to the OS; true when they went
 * (refused for locked memory: mlockall). Its owner's. */
static bool l25_bundle_decommit(struct l25_bundle *b) {
    if (!os_decommit(b->base, b->span)) return false;
    if (b->first) l25_bundle_reset(b); /* its bitmaps went with the pages */
    if (b->dirty) memset(b->dirty, 0, l25_words(b->nblocks) * sizeof(uint64_t));
    l25_count_decommit();
    return true;
}

/* Do what l25_tidy_empty asked: unmap, or decommit and park. No lock held. */
static void l25_release(struct l25_shard *s, struct l25_todo *t) {
    for (uint32_t k = 0; k < t->n; k++) {
        struct l25_bundle *b = t->b[k];
        if (t->unmap[k])
            l25_bundle_unmap(b);
        else {
            l25_park(s, b, l25_bundle_decommit(b));
        }
    }
}

/* ---- taking blocks out --------------------------------------------------------- */

/* Up to `want` free blocks of b into out[]; how many. Its owner's. */
static uint32_t l25_take_bits(struct l25_bundle *b, void **out, uint32_t want) {
    uint32_t got = 0, words = l25_words(b->nblocks);
    for (uint32_t w = b->hint; w < words && got < want; w++) {
        uint64_t bits = b->avail[w];
        while (bits && got < want) {
            uint32_t i = (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            out[got++] = b->base + (size_t)(w * 64 + i) * b->stride;
        }
        /* Taken: the bits below what is left in the word (all, when the loop
         * ended on want with bits left, are the ones just taken). */
        uint64_t taken = b->avail[w] & ~bits;
        b->avail[w] = bits;
        if (b->dirty) {
            b->dirty[w] |= taken;
            b->stale1 &= ~taken; /* in use again: no longer free since a pass */
        }
        if (bits == 0) b->hint = w + 1;
    }
    b->navail -= got;
    return got;
}

/* Up to `want` free blocks of b into out[]; how many. Shard lock held. */
static uint32_t l25_take_from(struct l25_shard *s, struct l25_bundle *b, void **out,
                              uint32_t want) {
    uint32_t got = l25_take_bits(b, out, want);
    s->carved_bytes += (uint64_t)got * b->size;
    if (b->navail == 0 && b->listed) {
        l25_list_remove(&s->partial, b);
        b->listed = false;
    }
    return got;
}

/* A committed empty bundle another class's shard keeps, made one of class
 * cls for shard sh, or NULL: a burst of other sizes after a burst of frees
 * reuses the pages the frees left instead of faulting in new ones. No lock
 * held. */
static struct l25_bundle *l25_steal(uint32_t cls, uint32_t sh) {
    size_t span = l25_span(l25_stride(cls, sh));
    if (atomic_load_explicit(l25_spares_of(span), memory_order_relaxed) == 0) return NULL;
    for (uint32_t c = 0; c < SMALL_NCLASSES; c++) {
        for (uint32_t k = 0; k <= L25_SHARDS; k++) {
            struct l25_shard *s = &l25_shards[c][k];
            /* Only a shard with one is locked (a lock each of the 305
             * shards was 2 locks an op when blocks crossed threads). */
            if (atomic_load_explicit(&s->ncommitted, memory_order_relaxed) == 0) continue;
            hak_lock(&s->lock);
            /* Committed ones come first; a shard's bundles share a span. */
            struct l25_bundle *b = s->empty;
            if (b && b->committed && b->span == span) {
                l25_empty_unlink(s, b);
                hak_unlock(&s->lock);
                l25_bundle_format(b, cls, sh, b->base, b->span, b->idx);
                /* Its old blocks' bytes lie where the new ones' state is. */
                for (uint32_t i = b->first; i < b->nblocks; i++)
                    *l25_mark(b, i) = L25_FREE;
                /* Its pages are still resident: every free block may hold
                 * some, for the ageing and malloc_trim to give back. */
                if (b->dirty) b->dirty1 = b->avail1;
                return b;
            }
            hak_unlock(&s->lock);
        }
    }
    return NULL;
}

/* Up to `want` blocks of cls from shard `sh` into out[]; how many (0: out of
 * memory). */
static uint32_t l25_take(uint32_t cls, uint32_t sh, void **out, uint32_t want) {
    struct l25_shard *s = &l25_shards[cls][sh];
    struct l25_todo todo = {.n = 0};
    hak_lock(&s->lock);
    s->refills++;
    struct l25_bundle *b;
    for (unsigned tries = 0;; tries++) {
        /* (Past bundles whose free blocks are all out for a purge.) */
        for (b = s->partial; b && b->navail == 0; b = b->next)
            ;
        /* (Not inside fork's handlers: the purger may wait for a lock the
         * forking thread holds, or be in the parent.) */
        if (b || s->empty || s->purging == 0 || l25_purging_mine || hak_in_fork) break;
        /* Every free block is out for a purge: back in a moment, rather
         * than a bundle mapped (or ENOMEM) beside them. */
        hak_unlock(&s->lock);
        hak_backoff(tries);
        hak_lock(&s->lock);
    }
    if (b == NULL && (b = s->empty) != NULL) { /* a committed one first */
        l25_empty_unlink(s, b);
        l25_list_push(&s->partial, b);
        b->listed = true;
    }
    if (s->empty) l25_tidy_empty(s, hak_now_ms(), &todo);
    if (b == NULL) {
        hak_unlock(&s->lock);
        if ((b = l25_steal(cls, sh)) == NULL && (b = l25_bundle_new(cls, sh, L25_SHARED)) == NULL)
            return 0;
        hak_lock(&s->lock);
        l25_list_push(&s->partial, b);
        b->listed = true;
    }
    uint32_t got = l25_take_from(s, b, out, want);
    l25_work(s);
    hak_unlock(&s->lock);
    usage_add((int64_t)got * small_class_size[cls]);
    if (todo.n) l25_release(s, &todo);
    return got;
}

/* The largest batch a refill brings: a thread cache's half. */
#define L25_BATCH_MAX 64

void *l25_alloc_aligned(uint32_t cls) {
    void *p;
    if (l25_take(cls, L25_ALIGNED, &p, 1) == 0) {
        errno = ENOMEM;
        return NULL;
    }
    l25_set_live(p);
    return p;
}

void *l25_alloc_uncached(uint32_t cls) {
    void *p;
    if (l25_take(cls, l25_thread_shard(), &p, 1) == 0) {
        errno = ENOMEM;
        return NULL;
    }
    l25_set_live(p);
    return p;
}

/* ---- giving blocks back ------------------------------------------------------- */

/* Blocks `bits` of word w of b free again: the bundle to the empty list
 * when they were its last blocks out (its work in todo, after the lock),
 * else back on the partial list if a refill had taken it off. Lock held. */
static void l25_return_locked(struct l25_shard *s, struct l25_bundle *b, uint32_t w, uint64_t bits,
                              struct l25_todo *todo) {
    b->avail[w] |= bits;
    if (b->hint > w) b->hint = w;
    b->navail += (uint32_t)__builtin_popcountll(bits);
    if (b->navail == b->nblocks - b->first) {
        l25_became_empty(s, b, todo);
    } else if (!b->listed) {
        l25_list_push(&s->partial, b);
        b->listed = true;
    }
}

/* p (a block of b, neither live nor cached) back into b; true when it is
 * time for a look at the clock (a purge pass due?). Lock of b's shard s
 * held; work for after it in *todo. */
static bool l25_put_locked(struct l25_shard *s, struct l25_bundle *b, void *p,
                           struct l25_todo *todo) {
    l25_work(s);
    size_t i = l25_div(b, (size_t)((uint8_t *)p - b->base));
    s->flushes++;
    s->carved_bytes -= b->size;
    l25_return_locked(s, b, (uint32_t)(i >> 6), (uint64_t)1 << (i & 63), todo);
    return (s->flushes & 63) == 0; /* every 64 blocks back */
}

/* The chain of n blocks from p (linked through their first word, none live
 * or cached) back into their bundles: one lock for each run of blocks of one
 * shard, not one a block. */
static void l25_put_chain(void *p, uint32_t n) {
    int64_t bytes = 0;
    bool look = false;
    while (n) {
        struct l25_bundle *b = l25_bundle_of(rmap_get(p));
        struct l25_shard *s = &l25_shards[b->cls][b->shard];
        struct l25_todo todo = {.n = 0};
        hak_lock(&s->lock);
        for (;;) {
            void *next = *(void **)p;
            bytes += b->size;
            look |= l25_put_locked(s, b, p, &todo);
            p = next;
            if (--n == 0 || todo.n + 2 > sizeof todo.b / sizeof todo.b[0]) break;
            /* The next block, while it is of this shard. (Its bundle has a
             * block out, ours: it cannot be re-cut for another meanwhile.) */
            b = l25_bundle_of(rmap_get(p));
            if (&l25_shards[b->cls][b->shard] != s) break;
        }
        hak_unlock(&s->lock);
        if (todo.n) l25_release(s, &todo); /* syscalls outside the lock */
    }
    usage_add(-bytes);
    if (hak_unlikely(look)) l25_age();
    bell_ring(); /* a free block, or an empty bundle, to age */
}

static void l25_put(void *p) {
    l25_put_chain(p, 1);
}

/* ---- heaps: bundles owned by a thread --------------------------------------------- */

#define L25_NCLASSES       (SMALL_NCLASSES - L25_FIRST)
#define L25_HEAP_EMPTY_MAX 8   /* empty bundles a heap keeps (any class) */
#define L25_SPARE_MAX      256 /* empty bundles no heap keeps */

/* Empty bundles no heap keeps (past a heap's bound, or an exiting
 * thread's), by class, at most L25_SPARE_MAX of them: any heap short of a
 * bundle takes one of its class, else one of another class with the same
 * span, recut (a thread that freed a burst, or exited, hands its pages to
 * one that allocates the next). One compare-and-swap a bundle, no lock;
 * aged by the tier's pass (l25_age), emptied by malloc_trim. */
static struct lf_stack l25_spare[L25_NCLASSES];
static _Atomic uint32_t l25_nspare;
#define L25_SPARE_LINK offsetof(struct l25_bundle, spare_next)

/* Bytes of the spares that keep their pages (see l25_spare_put). */
static _Atomic size_t l25_spare_hot;
/* ms: when the spares' ageing has something to do first (the earliest
 * spare due to be decommitted or unmapped); UINT64_MAX: nothing. The
 * ageing runs then, not on the tier's pass every age: an exiting thread's
 * bundles, empty at the frees, went a second age later (the background
 * thread's RSS fell 450 ms after a burst, past its 400 ms promise). */
static _Atomic uint64_t l25_spares_due = UINT64_MAX;

/* The spares' ageing is due at `due` at the latest. */
static void l25_spares_due_by(uint64_t due) {
    uint64_t cur = atomic_load_explicit(&l25_spares_due, memory_order_relaxed);
    while (due < cur && !atomic_compare_exchange_weak_explicit(
                            &l25_spares_due, &cur, due, memory_order_relaxed, memory_order_relaxed))
        ;
}

/* When spare b is next due to age: decommitted at the age, unmapped at
 * twice it. */
static uint64_t l25_spare_due(const struct l25_bundle *b) {
    return b->empty_ms + (b->committed ? 1 : 2) * hak_cfg.bigcache_age_ms;
}

/* The spares keep their pages up to twice the BigCache's bound
 * (HAKMEM_BIGCACHE_MB: what the program lets the allocator keep for reuse;
 * 256 MiB by default), the rest decommitted as they come. A burst's and an
 * exiting thread's bundles are taken back by the next threads, and their
 * pages faulted back in cost more than the program's own work (mimalloc's
 * test-stress, 16 threads re-created 25 times: keeping only the first 16
 * of an exiting thread's and 48 of a live heap's made 350 000 more page
 * faults, 1.9x mimalloc 3.4's time; 128 MiB, 1.3x). But only the tier's
 * pass ages them (l25_spares_age, on a slow path of any thread, or the
 * background thread): a program whose calls then all hit the thread caches
 * keeps them, so they are bounded in bytes too (16 threads that freed 64
 * MiB each and exited: 1.2 GiB kept for good without one). */
static inline size_t l25_spare_hot_max(void) {
    return 2 * hak_cfg.bigcache_bytes;
}

/* b (empty, on no list) onto the spares, its pages kept while the bound
 * allows; false when the spares are full. */
static bool l25_spare_put(struct l25_bundle *b) {
    if (atomic_load_explicit(&l25_nspare, memory_order_relaxed) >= L25_SPARE_MAX) return false;
    if (b->committed) {
        size_t hot = atomic_fetch_add_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
        if (hot + b->span > l25_spare_hot_max()) {
            atomic_fetch_sub_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
            if (l25_bundle_decommit(b))
                b->committed = false;
            else /* (refused, mlockall: its pages and their bytes stay, counted) */
                atomic_fetch_add_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
        }
    }
    atomic_fetch_add_explicit(&l25_nspare, 1, memory_order_relaxed);
    uint64_t due = l25_spare_due(b);
    lf_push(&l25_spare[b->cls - L25_FIRST], b, L25_SPARE_LINK);
    l25_spares_due_by(due);
    bell_ring(); /* (the background thread's next look may be later) */
    return true;
}

/* b, just taken off the spares (to be used, decommitted or unmapped), no
 * longer counted there. */
static void l25_spare_gone(const struct l25_bundle *b) {
    if (b->committed) atomic_fetch_sub_explicit(&l25_spare_hot, b->span, memory_order_relaxed);
}

static struct l25_bundle *l25_spare_pop(struct lf_stack *s) {
    if (lf_addr(atomic_load_explicit(&s->top, memory_order_relaxed)) == NULL) return NULL;
    struct l25_bundle *b = lf_pop(s, L25_SPARE_LINK);
    if (b) {
        atomic_fetch_sub_explicit(&l25_nspare, 1, memory_order_relaxed);
        l25_spare_gone(b);
    }
    return b;
}

/* A spare for class cls: one of cls (its blocks where the program's
 * touched pages are), else one of a class with the same span (a look at
 * each stack's top: no lock); NULL when none. */
static struct l25_bundle *l25_spare_get(uint32_t cls) {
    struct l25_bundle *b = l25_spare_pop(&l25_spare[cls - L25_FIRST]);
    if (b || atomic_load_explicit(&l25_nspare, memory_order_relaxed) == 0) return b;
    size_t span = l25_span(l25_stride(cls, 0));
    for (uint32_t c = L25_FIRST; c < SMALL_NCLASSES && b == NULL; c++)
        if (c != cls && l25_span(l25_stride(c, 0)) == span)
            b = l25_spare_pop(&l25_spare[c - L25_FIRST]);
    return b;
}

/* The spares: committed ones unused for the age decommitted, decommitted
 * ones unused for twice the age unmapped; with `all` every one unmapped.
 * True when memory went back. */
static bool l25_spares_age(uint64_t now, bool all) {
    bool released = false;
    uint64_t age = hak_cfg.bigcache_age_ms, due = UINT64_MAX;
    for (size_t k = 0; k < sizeof l25_spare / sizeof l25_spare[0]; k++) {
        struct l25_bundle *b = lf_take_all(&l25_spare[k]), *first = NULL, *last = NULL;
        uint32_t gone = 0;
        while (b) {
            struct l25_bundle *next = atomic_load_explicit(&b->spare_next, memory_order_relaxed);
            uint64_t idle = now > b->empty_ms ? now - b->empty_ms : 0;
            if (all || (!b->committed && idle >= 2 * age)) {
                l25_spare_gone(b);
                l25_bundle_unmap(b);
                released = true;
                gone++;
            } else {
                if (b->committed && idle >= age) {
                    if (l25_bundle_decommit(b)) {
                        l25_spare_gone(b);
                        b->committed = false;
                        released = true;
                    } else {
                        b->empty_ms = now; /* (refused: an age later again) */
                    }
                }
                if (l25_spare_due(b) < due) due = l25_spare_due(b);
                atomic_store_explicit(&b->spare_next, first, memory_order_relaxed);
                first = b;
                if (last == NULL) last = b;
            }
            b = next;
        }
        if (gone) atomic_fetch_sub_explicit(&l25_nspare, gone, memory_order_relaxed);
        if (first) lf_push_chain(&l25_spare[k], first, last, L25_SPARE_LINK);
    }
    l25_spares_due_by(due);
    return released;
}

/* A thread's bundles of the tier's own classes: everything in it is its
 * thread's alone (a parked heap's: the pass that took it off the list,
 * l25_parked_each), but the remote stack, which other threads push on, on a
 * line of its own. */
struct l25_heap {
    /* Blocks other threads freed, linked through the first word of their
     * colouring gap (the line their state byte is on). */
    _Alignas(64) _Atomic(void *) remote;
    /* ms: when the owner last took its remote stack (on the same line: the
     * owner writes it as it takes the stack). A freer that finds it older
     * than the age gives the block's pages back before it pushes it: an
     * idle or exited owner would hold them for good. */
    _Atomic uint64_t active_ms;
    _Alignas(64) struct l25_bundle *partial[L25_NCLASSES]; /* free blocks and blocks out */
    /* Bundles with every block free, any class: the committed ones first,
     * newest first, then the decommitted ones. */
    struct l25_bundle *empty;
    uint32_t nempty;
    uint64_t purge_ms; /* the next pass over partly used bundles' free blocks */
    /* The owner's counts (a load and a store, no locked instruction), read
     * by l25_get_stats. */
    _Atomic uint64_t refills, flushes;
    _Atomic int64_t carved_bytes;
    struct l25_heap *next_free, *next_all;
    uint64_t park_pass; /* the last pass over parked heaps that had it (l25_parked_each) */
};

static pthread_mutex_t l25_heap_lock = PTHREAD_MUTEX_INITIALIZER; /* the heap lists */
static struct l25_heap *l25_heaps_free; /* of exited threads, their bundles with them */
static uint64_t l25_park_passes;        /* passes over them so far (l25_parked_each) */
static uint32_t l25_parked_out;         /* parked heaps a pass has off the list now */
static struct l25_heap *l25_heaps_all;  /* every heap, for the stats */
static struct l25_heap *l25_heaps_fresh;
static uint32_t l25_heaps_fresh_n;

static inline void l25_add(_Atomic uint64_t *c, uint64_t d) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d,
                          memory_order_relaxed);
}

static inline void l25_carved(struct l25_heap *h, int64_t d) {
    atomic_store_explicit(&h->carved_bytes,
                          atomic_load_explicit(&h->carved_bytes, memory_order_relaxed) + d,
                          memory_order_relaxed);
    usage_add(d);
}

/* h's owner is at work now (a store only when the ms changed). */
static void l25_heap_active(struct l25_heap *h) {
    uint64_t now = hak_now_ms();
    if (atomic_load_explicit(&h->active_ms, memory_order_relaxed) != now)
        atomic_store_explicit(&h->active_ms, now, memory_order_relaxed);
}

static struct l25_heap *l25_heap_get(void) {
    hak_lock(&l25_heap_lock);
    struct l25_heap *h = l25_heaps_free;
    if (h) {
        l25_heaps_free = h->next_free; /* an exited thread's: its bundles come along */
    } else {
        if (l25_heaps_fresh_n == 0) {
            size_t bytes = 64 * 1024;
            l25_heaps_fresh = arena_meta(bytes);
            l25_heaps_fresh_n = l25_heaps_fresh ? (uint32_t)(bytes / sizeof *h) : 0;
        }
        if (l25_heaps_fresh_n) {
            h = l25_heaps_fresh++;
            l25_heaps_fresh_n--;
            h->next_all = l25_heaps_all;
            l25_heaps_all = h;
        }
    }
    hak_unlock(&l25_heap_lock);
    if (h) l25_heap_active(h);
    return h;
}

/* b (empty, off every list) on h's empty list: committed in front,
 * decommitted behind the committed ones. */
static void l25_heap_empty_add(struct l25_heap *h, struct l25_bundle *b) {
    if (b->committed)
        l25_list_push(&h->empty, b);
    else
        l25_insert_parked(&h->empty, b);
    h->nempty++;
}

static void l25_heap_empty_unlink(struct l25_heap *h, struct l25_bundle *b) {
    l25_list_remove(&h->empty, b);
    h->nempty--;
}

/* The empty bundles of h: past the bound (all of them with `all`) the
 * oldest unmapped; committed ones unused for the age decommitted. */
static bool l25_heap_tidy(struct l25_heap *h, uint64_t now, bool all) {
    bool released = false;
    while (h->nempty > (all ? 0u : L25_HEAP_EMPTY_MAX)) {
        struct l25_bundle *last = h->empty;
        while (last->next)
            last = last->next;
        l25_heap_empty_unlink(h, last);
        if (all || !l25_spare_put(last)) {
            l25_bundle_unmap(last);
            released = true;
        }
    }
    for (struct l25_bundle *b = h->empty, *next; b && b->committed; b = next) {
        next = b->next;
        /* (empty_ms may be later than a now read before the walk) */
        if (b->empty_ms > now || now - b->empty_ms < hak_cfg.bigcache_age_ms) continue;
        l25_heap_empty_unlink(h, b);
        if (l25_bundle_decommit(b)) {
            b->committed = false;
            released = true;
        } else {
            b->empty_ms = now; /* (refused: its pages and their bytes stay) */
        }
        l25_heap_empty_add(h, b);
    }
    return released;
}

/* p, a block of b (h's; neither live nor cached), back into b. */
static void l25_heap_put(struct l25_heap *h, struct l25_bundle *b, void *p) {
    size_t i = l25_div(b, (size_t)((uint8_t *)p - b->base));
    b->avail[i >> 6] |= (uint64_t)1 << (i & 63);
    if (b->hint > i >> 6) b->hint = (uint32_t)(i >> 6);
    uint32_t k = b->cls - L25_FIRST;
    if (++b->navail == b->nblocks - b->first) {
        if (b->listed) l25_list_remove(&h->partial[k], b);
        b->listed = false;
        b->committed = true;
        b->empty_ms = hak_now_ms();
        l25_heap_empty_add(h, b);
        l25_heap_tidy(h, b->empty_ms, false);
    } else if (!b->listed) {
        l25_list_push(&h->partial[k], b);
        b->listed = true;
    }
}

/* The chain of n blocks from p (linked through their first word), h's
 * (this thread's, or a parked one), back into their bundles. */
static void l25_heap_put_chain(struct l25_heap *h, void *p, uint32_t n) {
    int64_t bytes = 0;
    for (uint32_t k = 0; k < n; k++) {
        void *next = *(void **)p;
        struct l25_bundle *b = l25_bundle_of(rmap_get(p));
        bytes += b->size;
        l25_heap_put(h, b, p);
        p = next;
    }
    l25_add(&h->flushes, n);
    l25_carved(h, -bytes);
}

/* Take h's remote stack: every block on it back into its bundle, one
 * exchange for all. */
static void l25_drain(struct l25_heap *h) {
    l25_heap_active(h);
    void *p = remote_take(&h->remote);
    if (p == NULL) return;
    int64_t bytes = 0;
    uint64_t n = 0;
    while (p) {
        struct l25_bundle *b = l25_bundle_of(rmap_get(p));
        void *next = *(void **)((uint8_t *)p + b->size);
        bytes += b->size;
        n++;
        l25_heap_put(h, b, p);
        p = next;
    }
    l25_add(&h->flushes, n);
    l25_carved(h, -bytes);
}

/* b (empty) made a bundle of cls for h. */
static void l25_recut(struct l25_bundle *b, uint32_t cls, struct l25_heap *h) {
    bool committed = b->committed;
    l25_bundle_format(b, cls, 0, b->base, b->span, b->idx);
    b->owner = h;
    if (committed) {
        /* Its old blocks' bytes lie where the new ones' state is; its pages
         * are still resident: every free block may hold some, for the
         * ageing and malloc_trim to give back. */
        for (uint32_t i = b->first; i < b->nblocks; i++)
            *l25_mark(b, i) = L25_FREE;
        b->dirty1 = b->avail1;
    }
}

/* An empty bundle of h for class cls (one with the span cls needs, made one
 * of cls if it was another class's: a burst of other sizes after a burst of
 * frees reuses the pages the frees left), off the empty list; NULL when h
 * has none. */
static struct l25_bundle *l25_heap_empty_take(struct l25_heap *h, uint32_t cls) {
    size_t span = l25_span(l25_stride(cls, 0));
    /* One of this class (its blocks where they were: the pages the program
     * touched are the ones it touches again), else the first of the span
     * (committed ones come first). */
    struct l25_bundle *b = h->empty, *any = NULL;
    for (; b && b->cls != cls; b = b->next)
        if (any == NULL && b->span == span) any = b;
    if (b == NULL && (b = any) == NULL) return NULL;
    l25_heap_empty_unlink(h, b);
    if (b->cls != cls) l25_recut(b, cls, h);
    return b;
}

/* An empty bundle made h's for class cls: one of h's own, else a spare;
 * NULL when there is none. */
static struct l25_bundle *l25_heap_reuse(struct l25_heap *h, uint32_t cls) {
    struct l25_bundle *b = l25_heap_empty_take(h, cls);
    if (b == NULL && (b = l25_spare_get(cls)) != NULL) {
        if (b->cls != cls)
            l25_recut(b, cls, h);
        else
            b->owner = h;
    }
    return b;
}

/* Whether this thread's cache holds any L2.5 block. */
static bool l25_cached_any(void) {
    for (uint32_t c = L25_FIRST; c < SMALL_NCLASSES; c++)
        if (tc_count(c)) return true;
    return false;
}

/* Up to `want` blocks of cls from h into out[]; how many (0: out of memory). */
static uint32_t l25_heap_take(struct l25_heap *h, uint32_t cls, void **out, uint32_t want) {
    uint32_t k = cls - L25_FIRST;
    struct l25_bundle *b = h->partial[k];
    if (b == NULL && (b = l25_heap_reuse(h, cls)) == NULL) {
        /* Before a new bundle is mapped, this thread's cached blocks of
         * every class go back: they may be all that keeps some of h's
         * bundles from being empty (the last blocks of a class freed, each
         * in a bundle of its own). A burst of other sizes after a burst of
         * frees mapped 150 MiB of bundles beside ones the first burst left
         * holding a few cached blocks each (bench_burst: peak RSS 1.8x the
         * live bytes). */
        if (l25_cached_any()) {
            l25_thread_flush();
            b = h->partial[k]; /* (cls's own: none cached, this is a miss) */
            if (b == NULL) b = l25_heap_reuse(h, cls);
        }
        if (b == NULL && (b = l25_bundle_new(cls, 0, h)) == NULL) return 0;
    }
    if (!b->listed) {
        if (h->empty) l25_heap_tidy(h, hak_now_ms(), false); /* ages looked at */
        l25_list_push(&h->partial[k], b);
        b->listed = true;
    }
    uint32_t got = l25_take_bits(b, out, want);
    if (b->navail == 0) {
        l25_list_remove(&h->partial[k], b);
        b->listed = false;
    }
    l25_add(&h->refills, 1);
    l25_carved(h, (int64_t)got * b->size);
    return got;
}

void *l25_alloc_slow(uint32_t cls) {
    struct l25_heap *h = hak_tc.l25;
    if (h == NULL && (h = hak_tc.l25 = l25_heap_get()) == NULL) return l25_alloc_uncached(cls);
    /* Blocks other threads gave back first: a drain that brings one of this
     * class saves a bundle. */
    l25_drain(h);
    void *blocks[L25_BATCH_MAX];
    uint32_t want = tc_batch(cls);
    uint32_t got = l25_heap_take(h, cls, blocks, want ? want : 1);
    if (got == 0) {
        errno = ENOMEM;
        return NULL;
    }
    /* The first goes to the program; the rest become the (empty) cache. */
    if (got > 1) {
        for (uint32_t i = 1; i + 1 < got; i++)
            *(void **)blocks[i] = blocks[i + 1];
        *(void **)blocks[got - 1] = NULL;
        tc_fill(cls, blocks[1], got - 1);
    }
    l25_set_live(blocks[0]);
    return blocks[0];
}

/* The chain p of n blocks of cls, off this thread's cache, back to their
 * bundles (tcache.h's give-back). */
static void l25_give_back(uint32_t cls, void *p, uint32_t n) {
    (void)cls;
    l25_heap_put_chain(hak_tc.l25, p, n);
}

void l25_free_slow(void *p, uint32_t cls) {
    tc_refund(cls);
    tc_overflow(cls, p, l25_give_back);
}

/* The pages wholly inside block p of b (its ends share pages with its
 * neighbours; its gap, with its link and state, is past its end). Its
 * freer's, before it is pushed. */
static void l25_block_decommit(struct l25_bundle *b, void *p) {
    if (hak_huge_heaps()) return; /* whole bundles only */
    uintptr_t lo = hak_align_up((uintptr_t)p, HAK_PAGE_SIZE);
    uintptr_t hi = ((uintptr_t)p + b->size) & ~(uintptr_t)(HAK_PAGE_SIZE - 1);
    if (hi > lo && os_decommit((void *)lo, hi - lo))
        atomic_fetch_add_explicit(&l25_free_decommitted, hi - lo, memory_order_relaxed);
}

void l25_free_other(void *p, struct l25_bundle *b) {
    if (b->owner == L25_SHARED) {
        l25_put(p);
        return;
    }
    /* Onto the owner's remote stack: the bundle keeps p counted out until
     * its owner drains it, so it stays mapped; heaps are never unmapped. */
    struct l25_heap *h = b->owner;
    uint64_t now = hak_now_ms(), active = atomic_load_explicit(&h->active_ms, memory_order_relaxed);
    if (now > active && now - active >= hak_cfg.bigcache_age_ms) l25_block_decommit(b, p);
    remote_push(&h->remote, p, (void **)((uint8_t *)p + b->size));
}

void l25_thread_flush(void) {
    tc_flush_all(L25_FIRST, SMALL_NCLASSES, l25_give_back);
}

void l25_thread_exit(void) {
    l25_thread_flush();
    struct l25_heap *h = hak_tc.l25;
    if (h == NULL) return;
    l25_drain(h);
    /* Its empty bundles to the spares, which the tier's pass ages whoever
     * calls (a parked heap is aged only by the background thread): with
     * none, the ones past the spares' bound unmapped. */
    /* (Last first: the committed ones, at the front, end on top.) */
    struct l25_bundle *b = h->empty;
    while (b && b->next)
        b = b->next;
    while (b) {
        struct l25_bundle *prev = b->prev;
        l25_heap_empty_unlink(h, b);
        if (!l25_spare_put(b)) l25_bundle_unmap(b);
        b = prev;
    }
    hak_tc.l25 = NULL;
    hak_lock(&l25_heap_lock);
    h->next_free = l25_heaps_free;
    l25_heaps_free = h;
    hak_unlock(&l25_heap_lock);
    bell_ring(); /* its bundles age now, with no thread to look at them */
}

/* ---- trim ------------------------------------------------------------------------ */

/* The next run of set bits in *bits (taken out of it): consecutive free
 * blocks, whose pages go in one call. 0 when none is left. */
static inline uint64_t l25_next_run(uint64_t *bits) {
    if (*bits == 0) return 0;
    uint32_t i = (uint32_t)__builtin_ctzll(*bits);
    uint32_t n = (uint32_t)__builtin_ctzll(~(*bits >> i));
    uint64_t run = n == 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1) << i;
    *bits &= ~run;
    return run;
}

/* Decommit the pages of run `run` of word w of b's blocks (none live or
 * cached, none taken meanwhile): only pages wholly inside the run (and the
 * unused tail after the last block), since its ends share pages with
 * neighbours that may be live. True when pages went (not refused:
 * mlockall). */
static bool l25_run_decommit(struct l25_bundle *b, uint32_t w, uint64_t run) {
    /* Huge pages: whole bundles only. The passes run as ever and clear the
     * run's dirty bits, so nothing stays due. */
    if (hak_huge_heaps()) return false;
    size_t first = (size_t)w * 64 + (size_t)__builtin_ctzll(run),
           last = first + (size_t)__builtin_popcountll(run);
    uintptr_t lo = hak_align_up((uintptr_t)b->base + first * b->stride, HAK_PAGE_SIZE);
    uintptr_t hi = last == b->nblocks
                       ? (uintptr_t)b->base + b->span
                       : ((uintptr_t)b->base + last * b->stride) & ~(uintptr_t)(HAK_PAGE_SIZE - 1);
    if (hi <= lo || !os_decommit((void *)lo, hi - lo)) return false;
    atomic_fetch_add_explicit(&l25_free_decommitted, hi - lo, memory_order_relaxed);
    return true;
}

/* The free blocks of b among `eligible` of word w whose pages are to go:
 * of each run of consecutive free blocks, from its first block that may
 * hold pages to its last, and the free block on either side of those (the
 * pages a block shares with a neighbour that was live at the last look are
 * in it now); not the rest of the run, which never had pages since (and
 * which a refill may take while a shard's purge has these out: a run of
 * never used blocks behind one freed block was all of a bundle's free
 * blocks). Each run of the result is one call. */
static uint64_t l25_dirty_spans(const struct l25_bundle *b, uint32_t w, uint64_t eligible) {
    uint64_t bits = b->avail[w] & eligible, spans = 0;
    for (uint64_t run; (run = l25_next_run(&bits)) != 0;) {
        uint64_t d = run & b->dirty[w];
        if (d == 0) continue;
        uint32_t lo = (uint32_t)__builtin_ctzll(d), hi = 63u - (uint32_t)__builtin_clzll(d);
        if (lo > 0 && (run >> (lo - 1) & 1)) lo--;
        if (hi < 63 && (run >> (hi + 1) & 1)) hi++;
        spans |= (hi - lo == 63 ? ~(uint64_t)0 : (((uint64_t)1 << (hi - lo + 1)) - 1) << lo);
    }
    return spans;
}

/* Decommit the free blocks of b among `eligible` that may hold pages: its
 * owner's (a heap's bundle). (Tracked bundles have at most 64 blocks: one
 * word.) */
static bool l25_decommit_free(struct l25_bundle *b, uint64_t eligible) {
    if (b->dirty == NULL) return false;
    bool any = false;
    for (uint32_t w = 0; w < l25_words(b->nblocks); w++) {
        uint64_t runs = l25_dirty_spans(b, w, eligible);
        b->dirty[w] &= ~runs;
        for (uint64_t run; (run = l25_next_run(&runs)) != 0;)
            any |= l25_run_decommit(b, w, run);
    }
    return any;
}

/* The pass over h's partly used bundles: decommit their free blocks' pages
 * (but the L25_KEEP_FREE lowest of each class's first bundle, the ones its
 * next refills take). Its owner's. */
static bool l25_heap_purge(struct l25_heap *h) {
    bool released = false;
    for (uint32_t k = 0; k < L25_NCLASSES; k++) {
        for (struct l25_bundle *b = h->partial[k]; b; b = b->next) {
            uint64_t keep = 0, avail = b->avail1 & b->dirty1;
            for (int n = 0; n < L25_KEEP_FREE && avail && b == h->partial[k]; n++) {
                keep |= avail & -avail;
                avail &= avail - 1;
            }
            released |= l25_decommit_free(b, b->stale1 | ~keep);
            b->stale1 = b->avail1 & b->dirty1; /* free now, pages and all */
        }
    }
    return released;
}

/* h's ageing (its owner's, or a parked heap's, by the pass that has it off
 * the list): its remote frees taken back, its empty bundles aged, and its
 * free blocks' pass when due. */
static bool l25_heap_age(struct l25_heap *h, uint64_t now) {
    l25_drain(h);
    bool released = l25_heap_tidy(h, now, false);
    if (now >= h->purge_ms) {
        released |= l25_heap_purge(h);
        h->purge_ms = now + hak_cfg.bigcache_age_ms;
    }
    return released;
}

/* When something of h is next due: a committed empty bundle's age, or the
 * pass when a partly used bundle has a free block with pages; UINT64_MAX
 * when nothing is. */
static uint64_t l25_heap_due(struct l25_heap *h) {
    uint64_t next = UINT64_MAX, age = hak_cfg.bigcache_age_ms;
    for (struct l25_bundle *b = h->empty; b && b->committed; b = b->next)
        if (b->empty_ms + age < next) next = b->empty_ms + age;
    for (uint32_t k = 0; k < L25_NCLASSES; k++)
        for (struct l25_bundle *b = h->partial[k]; b; b = b->next)
            if ((b->avail1 & b->dirty1) != 0 && h->purge_ms < next) next = h->purge_ms;
    return next;
}

/* malloc_trim for h: every empty bundle unmapped, the free blocks of the
 * others decommitted. */
static bool l25_heap_trim(struct l25_heap *h) {
    l25_drain(h);
    bool released = l25_heap_tidy(h, 0, true);
    for (uint32_t k = 0; k < L25_NCLASSES; k++)
        for (struct l25_bundle *b = h->partial[k]; b; b = b->next)
            released |= l25_decommit_free(b, ~(uint64_t)0);
    return released;
}

void l25_thread_age(void) {
    l25_thread_flush();
    if (hak_tc.l25) l25_heap_age(hak_tc.l25, hak_now_ms());
}

/* The pages of the blocks on h's remote stack (not h's: its owner may be
 * at work), given back: the stack taken whole (the owner's next take finds
 * the blocks pushed since), the blocks' pages decommitted, the stack put
 * back. The blocks stay out of their bundles until the owner takes them. */
static bool l25_remote_decommit(struct l25_heap *h) {
    void *first = remote_take(&h->remote), *last = NULL;
    if (first == NULL) return false;
    uint64_t before = atomic_load_explicit(&l25_free_decommitted, memory_order_relaxed);
    for (void *p = first; p;) {
        struct l25_bundle *b = l25_bundle_of(rmap_get(p));
        l25_block_decommit(b, p);
        last = p;
        p = *(void **)((uint8_t *)p + b->size);
    }
    if (last) {
        struct l25_bundle *lb = l25_bundle_of(rmap_get(last));
        remote_push(&h->remote, first, (void **)((uint8_t *)last + lb->size));
    }
    return atomic_load_explicit(&l25_free_decommitted, memory_order_relaxed) != before;
}

static bool l25_shard_purge(struct l25_shard *s, bool all); /* (below) */

/* This thread has a parked heap off the list (l25_parked_each): a signal
 * handler's trim inside it must not wait for that heap to come back. */
static __thread uint32_t l25_parked_mine;

/* Each parked heap (an exited thread's) through fn, without l25_heap_lock:
 * taken off the list as a starting thread takes one, the pass's alone, and
 * put back in front after, numbered with the pass so that the pass does not
 * take it again. A thread starting or exiting takes the lock, and waited
 * behind every parked heap's decommits and unmaps. A heap another pass
 * renumbered meanwhile is looked at again (bounded, but for `wait_all`);
 * with `wait_all` (a trim) the pass also waits for the heaps other passes
 * have off the list, and takes them in turn. */
static void l25_parked_each(void (*fn)(struct l25_heap *, void *), void *arg, bool wait_all) {
    hak_lock(&l25_heap_lock);
    uint64_t pass = ++l25_park_passes;
    unsigned tries = 0;
    uint32_t budget = 8;
    for (struct l25_heap *h = l25_heaps_free; h; h = h->next_free)
        budget += 2;
    while (wait_all || budget-- > 0) {
        struct l25_heap **at = &l25_heaps_free;
        while (*at && (*at)->park_pass == pass)
            at = &(*at)->next_free;
        struct l25_heap *h = *at;
        if (h == NULL) {
            if (!wait_all || l25_parked_out == 0 || l25_parked_mine || hak_in_fork) break;
            hak_unlock(&l25_heap_lock); /* (another pass has one: a moment) */
            hak_backoff(tries++);
            hak_lock(&l25_heap_lock);
            continue;
        }
        *at = h->next_free;
        l25_parked_out++;
        l25_parked_mine++;
        hak_unlock(&l25_heap_lock);
        fn(h, arg);
        hak_lock(&l25_heap_lock);
        l25_parked_mine--;
        l25_parked_out--;
        h->park_pass = pass;
        h->next_free = l25_heaps_free;
        l25_heaps_free = h;
    }
    hak_unlock(&l25_heap_lock);
}

static void l25_parked_trim(struct l25_heap *h, void *released) {
    *(bool *)released |= l25_heap_trim(h);
}

bool l25_trim(void) {
    bool released = false;
    /* This thread's heap, and those of exited threads (each the pass's while
     * it is off the list); other threads' heaps are theirs. */
    if (hak_tc.l25) released |= l25_heap_trim(hak_tc.l25);
    released |= l25_spares_age(0, true);
    l25_parked_each(l25_parked_trim, &released, true);
    /* Live threads' heaps are theirs, but not the blocks other threads
     * freed to them: a thread that went idle would keep those for good.
     * (The list only grows at its head, and heaps are never unmapped: walked
     * from the head read under the lock, without it.) */
    hak_lock(&l25_heap_lock);
    struct l25_heap *all = l25_heaps_all;
    hak_unlock(&l25_heap_lock);
    for (struct l25_heap *h = all; h; h = h->next_all)
        if (h != hak_tc.l25) released |= l25_remote_decommit(h);
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++) {
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++) {
            struct l25_shard *s = &l25_shards[cls][sh];
            hak_lock(&s->lock);
            struct l25_bundle *empty = NULL;
            while (s->empty) {
                struct l25_bundle *b = s->empty;
                l25_empty_unlink(s, b);
                b->next = empty;
                empty = b;
            }
            hak_unlock(&s->lock);
            while (empty) {
                struct l25_bundle *next = empty->next;
                l25_bundle_unmap(empty);
                empty = next;
                released = true;
            }
            released |= l25_shard_purge(s, true);
        }
    }
    return released;
}

/* Nothing for the ageing pass: no committed empty bundle, no free block
 * that may hold pages (a bundle whose pages are not tracked counts as
 * such while it has a free block). Shard lock held. */
static bool l25_idle(struct l25_shard *s) {
    if (atomic_load_explicit(&s->ncommitted, memory_order_relaxed)) return false;
    for (struct l25_bundle *b = s->partial; b; b = b->next)
        if (b->dirty == NULL ? b->navail != 0 : (b->avail1 & b->dirty1) != 0) return false;
    return true;
}

/* Every shard's ageing step: under its lock, the empty bundles aged (by
 * their own clocks) and then visit(s, arg) if any; the unmaps and decommits that
 * asked for after the lock. True if some memory went back. */
static bool l25_sweep(uint64_t now, bool (*visit)(struct l25_shard *, void *), void *arg) {
    bool released = false;
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++) {
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++) {
            struct l25_shard *s = &l25_shards[cls][sh];
            struct l25_todo todo = {.n = 0};
            if (!atomic_load_explicit(&s->work, memory_order_relaxed)) continue;
            hak_lock(&s->lock);
            if (s->empty) l25_tidy_empty(s, now, &todo);
            if (visit) released |= visit(s, arg);
            if (todo.n == 0 && l25_idle(s))
                atomic_store_explicit(&s->work, false, memory_order_relaxed);
            hak_unlock(&s->lock);
            if (todo.n) {
                l25_release(s, &todo);
                released = true;
            }
        }
    }
    return released;
}

/* Bundles whose free blocks a shard's purge takes out at once. */
#define L25_PURGE_BATCH 32

/* The free blocks of shard s's partly used bundles that may hold pages
 * (with `all`, a trim), or those of them a pass should give back (free since
 * the previous pass and never taken since: a whole period unused, whatever
 * else the bundle saw; and any other but the L25_KEEP_FREE lowest of the
 * shard's first bundle, the ones its refills take next), decommitted
 * without the shard's lock: under it they are taken out of their bundles,
 * which stay where they are on the partial list (a refill passes over a
 * bundle with none left; s->purging says blocks are out, and a refill that
 * finds no other waits for them rather than mapping a bundle), and they come
 * back once their pages are gone. An aligned or uncached malloc or free of
 * the class took the lock and waited behind the pass's hundreds of madvise
 * calls. L25_PURGE_BATCH bundles at a time, from the list's head each time
 * (those done have no such block left; bounded, since frees meanwhile bring
 * more). */
static bool l25_shard_purge(struct l25_shard *s, bool all) {
    struct {
        struct l25_bundle *b;
        uint64_t bits;
    } out[L25_PURGE_BATCH];
    bool released = false;
    for (uint32_t round = 0; round < 64; round++) {
        uint32_t n = 0;
        hak_lock(&s->lock);
        for (struct l25_bundle *b = s->partial; b && n < L25_PURGE_BATCH; b = b->next) {
            if (b->dirty == NULL) continue;
            uint64_t keep = 0, avail = b->avail1 & b->dirty1;
            for (int k = 0; !all && k < L25_KEEP_FREE && avail && b == s->partial; k++) {
                keep |= avail & -avail;
                avail &= avail - 1;
            }
            /* (stale1 as the previous pass left it: round 0 sets it anew.) */
            uint64_t stale = round == 0 ? b->stale1 : 0;
            uint64_t bits = l25_dirty_spans(b, 0, all ? ~(uint64_t)0 : stale | ~keep);
            b->dirty1 &= ~bits;
            b->avail1 &= ~bits;
            b->navail -= (uint32_t)__builtin_popcountll(bits);
            if (!all) b->stale1 = b->avail1 & b->dirty1; /* free now, pages and all */
            if (bits) {
                out[n].b = b;
                out[n++].bits = bits;
            }
        }
        s->purging += n;
        l25_purging_mine += n > 0; /* (before the unlock: a handler's take then) */
        hak_unlock(&s->lock);
        if (n == 0) break;
        for (uint32_t k = 0; k < n; k++) {
            uint64_t runs = out[k].bits;
            for (uint64_t run; (run = l25_next_run(&runs)) != 0;)
                released |= l25_run_decommit(out[k].b, 0, run);
        }
        /* Back, as freed blocks come back. */
        for (uint32_t k = 0; k < n;) {
            struct l25_todo todo = {.n = 0};
            hak_lock(&s->lock);
            for (; k < n && todo.n + 2 <= sizeof todo.b / sizeof todo.b[0]; k++) {
                l25_return_locked(s, out[k].b, 0, out[k].bits, &todo);
                s->purging--;
            }
            l25_work(s);
            hak_unlock(&s->lock);
            if (todo.n) l25_release(s, &todo);
        }
        l25_purging_mine--;
        bell_ring(); /* (an empty bundle, to age) */
    }
    return released;
}

static bool l25_purge(uint64_t now) {
    bool released = l25_sweep(now, NULL, NULL); /* (the empty bundles) */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++)
            if (atomic_load_explicit(&l25_shards[cls][sh].work, memory_order_relaxed))
                released |= l25_shard_purge(&l25_shards[cls][sh], false);
    return released;
}

/* The spares' ageing, when due and this thread is the one to do it (the
 * due time is taken; the pass sets it again from what it leaves). */
static bool l25_spares_age_due(uint64_t now) {
    uint64_t due = atomic_load_explicit(&l25_spares_due, memory_order_relaxed);
    if (now < due ||
        !atomic_compare_exchange_strong_explicit(&l25_spares_due, &due, UINT64_MAX,
                                                 memory_order_relaxed, memory_order_relaxed))
        return false;
    return l25_spares_age(now, false);
}

bool l25_age(void) {
    uint64_t now = hak_now_ms(), next = atomic_load_explicit(&l25_purge_next, memory_order_relaxed);
    /* Due, and this thread is the one to do it. */
    if (now < next || !atomic_compare_exchange_strong_explicit(
                          &l25_purge_next, &next, now + hak_cfg.bigcache_age_ms,
                          memory_order_relaxed, memory_order_relaxed))
        return l25_spares_age_due(now);
    bool released = l25_spares_age_due(now);
    if (l25_purge(now)) released = true;
    return released;
}

/* What l25_age_next learns of the shards: when the next empty bundle is
 * due, and whether a partly used bundle has free blocks with pages. */
struct l25_due {
    uint64_t next;
    bool dirty;
};

static bool l25_due_shard(struct l25_shard *s, void *arg) {
    struct l25_due *d = arg;
    uint64_t age = hak_cfg.bigcache_age_ms;
    for (struct l25_bundle *b = s->empty; b && b->committed; b = b->next)
        if (b->empty_ms + age < d->next) d->next = b->empty_ms + age;
    for (struct l25_bundle *b = s->partial; b && !d->dirty; b = b->next)
        d->dirty = b->dirty != NULL && (b->avail1 & b->dirty1) != 0;
    return false;
}

/* A parked heap's ageing; *next becomes its next due time if sooner. */
static void l25_parked_age(struct l25_heap *h, void *next) {
    l25_heap_age(h, hak_now_ms());
    uint64_t due = l25_heap_due(h);
    if (due < *(uint64_t *)next) *(uint64_t *)next = due;
}

uint64_t l25_age_next(void) {
    l25_age(); /* the pass over the partly used bundles, when due */
    struct l25_due d = {.next = UINT64_MAX, .dirty = false};
    l25_sweep(hak_now_ms(), l25_due_shard, &d);
    uint64_t pass = atomic_load_explicit(&l25_purge_next, memory_order_relaxed);
    uint64_t next = d.dirty && pass < d.next ? pass : d.next,
             spares = atomic_load_explicit(&l25_spares_due, memory_order_relaxed);
    if (spares < next) next = spares;
    /* The heaps of exited threads: what was freed to them since, and their
     * ageing (a live thread ages its own, on its slow path). */
    l25_parked_each(l25_parked_age, &next, false);
    return next;
}

/* ---- fork and stats -------------------------------------------------------------- */

void l25_fork_prepare(void) {
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++)
            pthread_mutex_lock(&l25_shards[cls][sh].lock);
    pthread_mutex_lock(&l25_heap_lock);
    pthread_mutex_lock(&l25_desc_lock);
}

void l25_fork_child(void) {
    /* A purge of the parent's other threads had blocks out, a pass over
     * the parked heaps one of them: they stay out here (a leak, as those
     * threads' heaps are), and no refill or trim waits for them. */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++)
            l25_shards[cls][sh].purging = 0;
    l25_parked_out = 0; /* (and the parked heaps their passes had out) */
}

void l25_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    pthread_mutex_unlock(&l25_desc_lock);
    pthread_mutex_unlock(&l25_heap_lock);
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++)
            pthread_mutex_unlock(&l25_shards[cls][sh].lock);
}

void l25_get_stats(struct l25_stats *st) {
    *st = (struct l25_stats){0};
    if (hak_tc.l25) l25_drain(hak_tc.l25); /* what others freed to this thread, counted back */
    int64_t carved = 0;
    hak_lock(&l25_heap_lock);
    for (struct l25_heap *h = l25_heaps_all; h; h = h->next_all) {
        st->refills += atomic_load_explicit(&h->refills, memory_order_relaxed);
        st->flushes += atomic_load_explicit(&h->flushes, memory_order_relaxed);
        carved += atomic_load_explicit(&h->carved_bytes, memory_order_relaxed);
    }
    hak_unlock(&l25_heap_lock);
    st->carved_bytes = carved > 0 ? (uint64_t)carved : 0;
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++) {
        for (uint32_t sh = 0; sh <= L25_SHARDS; sh++) {
            struct l25_shard *s = &l25_shards[cls][sh];
            hak_lock(&s->lock);
            st->refills += s->refills;
            st->flushes += s->flushes;
            st->carved_bytes += s->carved_bytes;
            hak_unlock(&s->lock);
        }
    }
    hak_lock(&l25_desc_lock);
    st->bundles_mapped = l25_mapped;
    st->bundles_unmapped = l25_unmapped;
    st->bytes_mapped = l25_bytes;
    st->decommits = l25_decommits;
    st->free_decommitted = atomic_load_explicit(&l25_free_decommitted, memory_order_relaxed);
    hak_unlock(&l25_desc_lock);
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void l25_collect(enum tier_collect kind, struct tier_done *done) {
    switch (kind) {
    case COLLECT_THREAD:
        l25_thread_age();
        break;
    case COLLECT_AGE:
        tier_released(done, l25_age());
        break;
    case COLLECT_IDLE:
        tier_due(done, l25_age_next());
        break;
    case COLLECT_TRIM: /* this thread's cache first: its blocks may be all a bundle holds */
        l25_thread_flush();
        tier_released(done, l25_trim());
        break;
    case COLLECT_EXIT:
        l25_thread_exit();
        break;
    }
}

static void l25_tier_stats(struct tier_stats *s) {
    struct l25_stats st;
    l25_get_stats(&st);
    s->mapped += st.bytes_mapped;
    s->carved += st.carved_bytes;
    tier_row(s, "l25.bundles_mapped", st.bundles_mapped);
    tier_row(s, "l25.bundles_unmapped", st.bundles_unmapped);
    tier_row(s, "l25.bytes_mapped", st.bytes_mapped);
    tier_row(s, "l25.bytes_out", st.carved_bytes);
    tier_row(s, "l25.refills", st.refills);
    tier_row(s, "l25.flushes", st.flushes);
    tier_row(s, "l25.decommits", st.decommits);
    tier_row(s, "l25.free_decommitted", st.free_decommitted);
}

const struct tier_ops l25_tier = {.name = "l25",
                                  .collect = l25_collect,
                                  .fork_prepare = l25_fork_prepare,
                                  .fork_release = l25_fork_release,
                                  .fork_child = l25_fork_child,
                                  .stats = l25_tier_stats};
