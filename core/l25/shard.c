/* L2.5 tier: the shards of shared bundles (owner L25_SHARED), a lock each:
 * their partial and empty lists, taking blocks out (from a bundle of the
 * shard's, a committed empty one stolen from another class's shard, or a
 * new one) and putting them back; the tier's aligned and uncached mallocs.
 * Their ageing is in age.c. */
#include "l25/internal.h"

#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/usage.h"

#include <errno.h>

struct l25_shard l25_shards[SMALL_NCLASSES][L25_SHARDS + 1] = {
    [0 ... SMALL_NCLASSES - 1] = {[0 ... L25_SHARDS] = {.lock = PTHREAD_MUTEX_INITIALIZER}},
};

/* Shards are handed to threads in turn. */
static _Atomic uint32_t l25_next_shard;
static __thread uint32_t l25_my_shard = UINT32_MAX;

static uint32_t l25_thread_shard(void) {
    if (hak_unlikely(l25_my_shard == UINT32_MAX))
        l25_my_shard =
            atomic_fetch_add_explicit(&l25_next_shard, 1, memory_order_relaxed) % L25_SHARDS;
    return l25_my_shard;
}

/* Committed empty bundles on all shards' empty lists, by span (2, 4, 8 MiB):
 * what l25_steal may find. */
static _Atomic uint32_t l25_spares[3];

static inline _Atomic uint32_t *l25_spares_of(size_t span) {
    return &l25_spares[span >> (HAK_REGION_SHIFT + 1)]; /* 0, 1, 2 */
}

void l25_empty_unlink(struct l25_shard *s, struct l25_bundle *b) {
    l25_list_remove(&s->empty, b);
    s->nempty--;
    if (b->committed) {
        atomic_fetch_sub_explicit(l25_spares_of(b->span), 1, memory_order_relaxed);
        atomic_store_explicit(&s->ncommitted,
                              atomic_load_explicit(&s->ncommitted, memory_order_relaxed) - 1,
                              memory_order_relaxed);
    }
}

void l25_tidy_empty(struct l25_shard *s, uint64_t now, struct l25_todo *t) {
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
        if (b->empty_ms > now || now - b->empty_ms < hak_cfg.age_ms) continue;
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

void l25_release(struct l25_shard *s, struct l25_todo *t) {
    for (uint32_t k = 0; k < t->n; k++) {
        struct l25_bundle *b = t->b[k];
        if (t->unmap[k])
            l25_bundle_unmap(b);
        else {
            l25_park(s, b, l25_bundle_decommit(b));
        }
    }
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

void l25_return_locked(struct l25_shard *s, struct l25_bundle *b, uint32_t w, uint64_t bits,
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

void l25_put(void *p) {
    l25_put_chain(p, 1);
}
