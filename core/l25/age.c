/* L2.5 tier: what goes back to the OS, and when. The ageing of a heap (its
 * empty bundles, the free blocks of its partly used ones), of the parked
 * heaps and of the shards (their empty bundles, their purge); the tier's
 * pass (l25_age, l25_age_next) and malloc_trim (l25_trim). */
#include "l25/internal.h"

#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/remote.h"

__thread uint32_t l25_purging_mine;

static _Atomic uint64_t l25_purge_next; /* ms: the next l25_purge l25_put makes */

/* Free blocks with pages the first bundle of a shard keeps through an
 * ageing pass (see l25_purge). */
#define L25_KEEP_FREE 2

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
        h->purge_ms = now + hak_cfg.age_ms;
    }
    return released;
}

/* When something of h is next due: a committed empty bundle's age, or the
 * pass when a partly used bundle has a free block with pages; UINT64_MAX
 * when nothing is. */
static uint64_t l25_heap_due(struct l25_heap *h) {
    uint64_t next = UINT64_MAX, age = hak_cfg.age_ms;
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
    if (tc_self.l25) l25_heap_age(tc_self.l25, hak_now_ms());
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

static void l25_parked_trim(struct l25_heap *h, void *released) {
    *(bool *)released |= l25_heap_trim(h);
}

bool l25_trim(void) {
    bool released = false;
    /* This thread's heap, and those of exited threads (each the pass's while
     * it is off the list); other threads' heaps are theirs. */
    if (tc_self.l25) released |= l25_heap_trim(tc_self.l25);
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
        if (h != tc_self.l25) released |= l25_remote_decommit(h);
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

bool l25_age(void) {
    uint64_t now = hak_now_ms(), next = atomic_load_explicit(&l25_purge_next, memory_order_relaxed);
    /* Due, and this thread is the one to do it. */
    if (now < next ||
        !atomic_compare_exchange_strong_explicit(&l25_purge_next, &next, now + hak_cfg.age_ms,
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
    uint64_t age = hak_cfg.age_ms;
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
