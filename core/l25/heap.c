/* L2.5 tier: the heaps, one a thread, that own the bundles of the tier's
 * classes: taking a heap (an exited thread's first), its partial and empty
 * lists, the thread cache's slow paths (refill, overflow, flush), frees from
 * other threads (their remote stack, which the owner drains), thread exit,
 * and the passes over the parked heaps of exited threads. l25_alloc_slow and
 * l25_free_slow are here with everything of the heap they call, so that it
 * stays inlined in them. */
#include "l25/internal.h"

#include "box/arena.h"
#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/remote.h"
#include "box/usage.h"

#include <errno.h>

#define L25_HEAP_EMPTY_MAX 8 /* empty bundles a heap keeps (any class) */

/* The largest batch a refill brings: a thread cache's half. */
#define L25_BATCH_MAX 64

pthread_mutex_t l25_heap_lock = PTHREAD_MUTEX_INITIALIZER; /* the heap lists */
static struct l25_heap *l25_heaps_free; /* of exited threads, their bundles with them */
static uint64_t l25_park_passes;        /* passes over them so far (l25_parked_each) */
uint32_t l25_parked_out;                /* parked heaps a pass has off the list now */
struct l25_heap *l25_heaps_all;         /* every heap, for the stats */
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
static inline void l25_heap_active(struct l25_heap *h) {
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

bool l25_heap_tidy(struct l25_heap *h, uint64_t now, bool all) {
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
        if (b->empty_ms > now || now - b->empty_ms < hak_cfg.age_ms) continue;
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

void l25_drain(struct l25_heap *h) {
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
    struct l25_heap *h = tc_self.l25;
    if (h == NULL && (h = tc_self.l25 = l25_heap_get()) == NULL) return l25_alloc_uncached(cls);
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
    l25_heap_put_chain(tc_self.l25, p, n);
}

void l25_free_slow(void *p, uint32_t cls) {
    tc_refund(cls);
    if (!tc_self.open) { /* (never with a heap: defensive) */
        *(void **)p = NULL;
        l25_give_back(cls, p, 1);
        return;
    }
    /* Full: half back, then p in (tcache.h). */
    uint32_t half = tc_batch(cls);
    tc_flush(cls, half ? half : 1, l25_give_back);
    tc_push_behind(cls, p, small_class_size[cls] >= L25_BEHIND_MIN);
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
    if (now > active && now - active >= hak_cfg.age_ms) l25_block_decommit(b, p);
    remote_push(&h->remote, p, (void **)((uint8_t *)p + b->size));
}

void l25_thread_flush(void) {
    tc_flush_all(L25_FIRST, SMALL_NCLASSES, l25_give_back);
}

void l25_thread_exit(void) {
    l25_thread_flush();
    struct l25_heap *h = tc_self.l25;
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
    tc_self.l25 = NULL;
    hak_lock(&l25_heap_lock);
    h->next_free = l25_heaps_free;
    l25_heaps_free = h;
    hak_unlock(&l25_heap_lock);
    bell_ring(); /* its bundles age now, with no thread to look at them */
}

/* This thread has a parked heap off the list (l25_parked_each): a signal
 * handler's trim inside it must not wait for that heap to come back. */
static __thread uint32_t l25_parked_mine;

void l25_parked_each(void (*fn)(struct l25_heap *, void *), void *arg, bool wait_all) {
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
