/* Tiny tier slow paths: per-thread heaps of slabs, refill and flush between
 * the thread cache and the slabs, remote frees, orphan adoption. */
#include "tiny.h"

#include "box/arena.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/tier.h"
#include "box/lfstack.h"
#include "box/remote.h"
#include "box/usage.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* Which heap list a slab is on. */
enum { WHERE_CUR, WHERE_AVAIL, WHERE_FULL, WHERE_SPARE };

/* Empty slabs a heap keeps (any class, the least recently emptied given
 * back first) before it gives them back to the SuperSlabs: a class whose
 * slabs hold few blocks (8 of 8 KiB) empties and needs one again all the
 * time, and each trip to the SuperSlabs is two atomics on lines every
 * thread writes. Given back at the thread's exit and on malloc_trim; up to
 * 2 x 64 KiB a thread. */
#define TINY_SPARES   2
#define TINY_IDLE_MAX 64

/* A thread's slabs. Heaps are never unmapped, only recycled, so a remote
 * freer may still touch the heap a slab's owner field named a moment ago.
 * The word remote freers write has a cache line of its own, and heaps start
 * on lines of their own: the owner's fields share a line with no word other
 * threads write. */
struct tiny_heap {
    _Alignas(64) _Atomic uint32_t remote_pending; /* bit c: a class-c slab got remote frees */
    /* Odd while the owner's exit lets its slabs go; never reset (a pusher
     * that read this heap as a slab's owner compares it across its push:
     * tiny_remote_push). */
    _Alignas(64) _Atomic uint32_t exits; /* (a line of its own: read by pushers, seldom written) */
    _Alignas(64) struct ss_slab *cur[TINY_NCLASSES]; /* slab refills come from */
    struct ss_slab *avail[TINY_NCLASSES];            /* owned slabs with free blocks */
    struct ss_slab *full[TINY_NCLASSES];             /* owned slabs with none at last look */
    bool warm[TINY_NCLASSES];                        /* first refill done (pre-warm) */
    bool refilled[TINY_NCLASSES];  /* a refill since the class's last flush (tiny_free_slow) */
    bool grew[TINY_NCLASSES];      /* the list grew since the last look (tiny_age) */
    bool passed_on[TINY_NCLASSES]; /* the last flush gave other threads' blocks back */
    /* SuperSlabs this heap's releases left idle (ss_release), the latest
     * TINY_IDLE_MAX: retired at the thread's exit, which gives back what
     * it used at once (the others wait for a purge pass). */
    struct superslab *idle[TINY_IDLE_MAX];
    uint32_t nidle;
    struct ss_slab *spare[TINY_SPARES]; /* empty slabs kept, newest first */
    _Atomic(void *) next_free;          /* on tiny_heaps */
};
#define TINY_HEAP_CHUNK (64 * 1024)
#define TINY_HEAP_LINK  offsetof(struct tiny_heap, next_free)
#define TINY_SLAB_LINK  offsetof(struct ss_slab, next)

/* Heaps of exited threads (and never used ones), and the slabs exited
 * threads left with blocks out, per class: lock-free stacks (box/lfstack.h),
 * so that a thread's start and exit, and an adoption, take no lock. An
 * adoption takes a class's orphans all at once; a thread exit hands over
 * each class's slabs in one step. */
static struct lf_stack tiny_heaps;
static struct lf_stack tiny_orphans[TINY_NCLASSES];
/* Blocks went back to an orphan since the last sweep of them: caches give
 * other threads' blocks back late (at a flush, at their thread's exit), so
 * an orphan's last blocks may come back after its owner left, and nothing
 * else would give it back until a thread needing its class adopts it or
 * malloc_trim (tiny_age sweeps, tiny_sweep_orphans). */
static _Alignas(64) _Atomic bool tiny_orphans_fed;
/* Sweeps started (each clears the flag first): one that starts while an
 * exit or another sweep holds orphans off the stack may clear a feed of
 * theirs, so the holder raises the flag again after it puts them back when
 * the count moved meanwhile. */
static _Atomic uint32_t tiny_sweeps;

static _Atomic uint64_t tiny_st[TINY_NCLASSES][6]; /* tiny_class_stats, in order */
enum { ST_ALLOCS, ST_FREES, ST_REFILLS, ST_FLUSHES, ST_REMOTE, ST_ADOPTED };

static inline void tiny_stat(uint32_t cls, int which, uint64_t n) {
    if (hak_unlikely(hak_cfg.stats))
        atomic_fetch_add_explicit(&tiny_st[cls][which], n, memory_order_relaxed);
}

/* This thread's block flows per Tiny class, for stats. The fast paths count
 * allocs only (the countdowns, tc_take_allocs): every block that enters the cache comes from
 * a free or a refill and every one that leaves goes to an alloc or a flush,
 * so frees = allocs + flushed - refilled + (cached now - cached at the last
 * merge). */
static __thread struct {
    uint64_t refilled[TINY_NCLASSES], flushed[TINY_NCLASSES], remote[TINY_NCLASSES];
    uint32_t cached[TINY_NCLASSES];
} tiny_flow;

/* Move this thread's alloc/free counts into the totals. */
static void tiny_merge_counts(void) {
    for (uint32_t c = 0; c < TINY_NCLASSES; c++) {
        uint32_t cached = tc_count(c);
        uint64_t allocs = tc_take_allocs(c);
        uint64_t frees = allocs + tiny_flow.flushed[c] - tiny_flow.refilled[c] + cached -
                         tiny_flow.cached[c] + tiny_flow.remote[c];
        /* (Classes the thread never used add nothing: a thread exit is not
         * 40 atomics on the lines every exit writes.) */
        if (allocs) atomic_fetch_add_explicit(&tiny_st[c][ST_ALLOCS], allocs, memory_order_relaxed);
        if (frees) atomic_fetch_add_explicit(&tiny_st[c][ST_FREES], frees, memory_order_relaxed);
        tiny_flow.flushed[c] = tiny_flow.refilled[c] = tiny_flow.remote[c] = 0;
        tiny_flow.cached[c] = cached;
    }
}
/* ---- heap lists ------------------------------------------------------------ */

static struct ss_slab **tiny_list(struct tiny_heap *h, struct ss_slab *s) {
    return s->where == WHERE_AVAIL ? &h->avail[s->cls] : &h->full[s->cls];
}

static void tiny_list_push(struct tiny_heap *h, struct ss_slab *s, uint8_t where) {
    s->where = where;
    ss_slab_push(tiny_list(h, s), s);
}

static void tiny_list_unlink(struct tiny_heap *h, struct ss_slab *s) {
    ss_slab_unlink(tiny_list(h, s), s);
}

/* ---- heaps ----------------------------------------------------------------- */

static struct tiny_heap *tiny_heap_get(void) {
    struct tiny_heap *h = lf_pop_or_fresh(&tiny_heaps, TINY_HEAP_LINK, sizeof *h, TINY_HEAP_CHUNK);
    if (h == NULL) return NULL;
    /* An exited thread's (a fresh one is zeroed already), cleared field by
     * field: next_free may still be read by a popper that lost the race for
     * this heap (box/lfstack.h). */
    atomic_store_explicit(&h->remote_pending, 0, memory_order_relaxed);
    memset(h->cur, 0, offsetof(struct tiny_heap, next_free) - offsetof(struct tiny_heap, cur));
    return h;
}

/* ---- moving blocks between a slab and the thread cache ------------------------ */

/* Move the slab's remote list onto its free list. Owner only. */
static void tiny_drain(struct ss_slab *s) {
    void *list = remote_take(&s->remote);
    if (list == NULL) return;
    /* A list longer than the blocks out can only come from a double free
     * by another thread (it may even loop): stop and say so. */
    uint32_t n = 1;
    void *last = list;
    for (; *(void **)last; n++) {
        if (hak_unlikely(n >= s->used))
            diag_bad_pointer("free", DIAG_DOUBLE_FREE, *(void **)last, TIER_TINY, s->size);
        last = *(void **)last;
    }
    *(void **)last = s->free;
    s->free = list;
    s->used = (uint16_t)(s->used - n);
    /* In use until here, not from the remote free: counted once a list
     * rather than on every cross-thread free. */
    usage_add(-(int64_t)n * s->size);
}

/* Blocks from slab s into the cache of cls, which is empty; how many moved.
 * Reuse comes before new memory: the slab's free list (after taking its
 * remote list), whole when the cache has room for it, else `want` of it;
 * only when it is empty, freshly carved blocks. */
static uint32_t tiny_take(struct ss_slab *s, uint32_t cls, uint32_t want) {
    if (s->free == NULL) tiny_drain(s);
    uint32_t n = (uint32_t)(s->carved - s->used); /* the free list's length */
    void *first = s->free, *last;
    if (n != 0 && n <= (uint32_t)tc_self.cnt[cls].room) {
        /* The whole list becomes the cache as it stands: no walk, whose every
         * step would be a cache miss on a block freed long ago. */
        s->free = NULL;
        tc_fill(cls, first, n);
    } else if (n != 0) {
        n = want;
        last = first;
        for (uint32_t i = 1; i < n; i++)
            last = *(void **)last;
        s->free = *(void **)last;
        *(void **)last = NULL;
        tc_fill(cls, first, n);
    } else {
        /* Carve from the slot's never-used tail, no further than the blocks
         * starting in the page the tail starts in (at least 4, for blocks of
         * a page or more): carving links every block, so each block carved
         * is memory made resident, and a cache needs only what it will hand
         * out soon. */
        uint32_t at = (uint32_t)s->carved * s->size;
        uint32_t page =
            (uint32_t)((hak_align_up(at + 1, HAK_PAGE_SIZE) - at + s->size - 1) / s->size);
        if (page < TINY_CARVE_MIN) page = TINY_CARVE_MIN;
        n = (uint32_t)(s->capacity - s->carved);
        if (n > want) n = want;
        if (n > page) n = page;
        if (n == 0) return 0;
        uint8_t *b = first = ss_slab_base(s) + at;
        /* A carve of two pages or more (blocks of 2 KiB and up): their pages
         * come in with one call rather than a fault each as the links below
         * are written (a fault costs ~12 us in a virtual machine). */
        if ((size_t)n * s->size >= 2 * HAK_PAGE_SIZE) {
            size_t lo = at & ~(HAK_PAGE_SIZE - 1);
            size_t hi = hak_align_up(at + (size_t)n * s->size, HAK_PAGE_SIZE);
            os_populate(ss_slab_base(s) + lo, hi - lo);
        }
        for (uint32_t i = 0; i < n; i++, b += s->size) {
            *(void **)b = b + s->size;
            *tiny_free_mark(b) = s; /* free: a free() of it is a double free */
        }
        *(void **)(b - s->size) = NULL; /* the last one ends the chain */
        ss_set_carved(s, s->carved + n);
        ss_note_carved((size_t)n * s->size);
        tc_fill(cls, first, n);
    }
    s->used = (uint16_t)(s->used + n);
    tiny_flow.refilled[cls] += n;
    usage_add((int64_t)n * s->size);
    return n;
}

/* ss was left idle by a release of h's (noted once; past TINY_IDLE_MAX
 * notes, the oldest are overwritten). */
static void tiny_note_idle(struct tiny_heap *h, struct superslab *ss) {
    for (uint32_t i = 0; i < h->nidle && i < TINY_IDLE_MAX; i++)
        if (h->idle[i] == ss) return;
    h->idle[h->nidle++ % TINY_IDLE_MAX] = ss;
}

/* An empty slab, unless refills are coming from it, among the heap's
 * spares (and the oldest spare back to the SuperSlabs). Owner only. */
static void tiny_maybe_release(struct tiny_heap *h, struct ss_slab *s) {
    if (s->used != 0 || s == h->cur[s->cls]) return;
    tiny_list_unlink(h, s);
    struct ss_slab *old = h->spare[TINY_SPARES - 1];
    memmove(&h->spare[1], &h->spare[0], (TINY_SPARES - 1) * sizeof h->spare[0]);
    h->spare[0] = s;
    s->where = WHERE_SPARE;
    if (old && ss_release(old, false)) tiny_note_idle(h, ss_of(old));
}

/* A spare slab of cls out of the heap's, or NULL. */
static struct ss_slab *tiny_take_spare(struct tiny_heap *h, uint32_t cls) {
    for (uint32_t i = 0; i < TINY_SPARES && h->spare[i]; i++) {
        struct ss_slab *s = h->spare[i];
        if (s->cls != cls) continue;
        memmove(&h->spare[i], &h->spare[i + 1], (TINY_SPARES - 1 - i) * sizeof h->spare[0]);
        h->spare[TINY_SPARES - 1] = NULL;
        return s;
    }
    return NULL;
}

/* Every spare back to the SuperSlabs; true when there was one. */
static bool tiny_release_spares(struct tiny_heap *h) {
    bool any = h->spare[0] != NULL;
    for (uint32_t i = 0; i < TINY_SPARES; i++) {
        if (h->spare[i]) ss_release(h->spare[i], true);
        h->spare[i] = NULL;
    }
    return any;
}

/* Take the orphans of cls and make them ours: the first to carve from, the
 * others on the avail list (their remote frees are drained as they are
 * used; one that turns out full moves to the full list then). */
static struct ss_slab *tiny_adopt(struct tiny_heap *h, uint32_t cls) {
    struct ss_slab *first = lf_take_all(&tiny_orphans[cls]);
    if (first == NULL) return NULL;
    uint64_t n = 0;
    for (struct ss_slab *s = first, *next; s; s = next, n++) {
        next = s->next;
        atomic_store_explicit(&s->owner, h, memory_order_release);
        if (s != first) tiny_list_push(h, s, WHERE_AVAIL);
    }
    tiny_stat(cls, ST_ADOPTED, n);
    return first;
}

/* Take back the remote frees of every full slab of cls that got some: a
 * slab whose blocks are all back leaves the heap (tiny_maybe_release), so
 * that another thread can have it (a producer whose blocks other threads
 * free would otherwise keep, slab by slab, the most it ever had out); the
 * others go to the avail list. The owner's bit is set only when a slab's
 * remote list turns non-empty, so all of them must be collected when it is
 * seen, not just the first. */
static void tiny_collect_remote(struct tiny_heap *h, uint32_t cls) {
    uint32_t bit = 1u << cls;
    if (!(atomic_load_explicit(&h->remote_pending, memory_order_relaxed) & bit)) return;
    atomic_fetch_and_explicit(&h->remote_pending, ~bit, memory_order_relaxed);
    for (struct ss_slab *s = h->full[cls], *next; s; s = next) {
        next = s->next;
        if (atomic_load_explicit(&s->remote, memory_order_relaxed) == NULL) continue;
        tiny_drain(s);
        tiny_list_unlink(h, s);
        tiny_list_push(h, s, WHERE_AVAIL);
        tiny_maybe_release(h, s);
    }
}

/* The current slab of cls ran dry: find the next one. */
static struct ss_slab *tiny_next_slab(struct tiny_heap *h, uint32_t cls) {
    struct ss_slab *old = h->cur[cls], *s;
    h->cur[cls] = NULL;
    if (old) tiny_list_push(h, old, WHERE_FULL);
    tiny_collect_remote(h, cls);
    if ((s = h->avail[cls]) != NULL) {
        tiny_list_unlink(h, s);
    } else if ((s = tiny_take_spare(h, cls)) == NULL && (s = tiny_adopt(h, cls)) == NULL) {
        s = ss_acquire(cls, small_class_size[cls]);
        if (s == NULL) return NULL;
        atomic_store_explicit(&s->owner, h, memory_order_release);
    }
    s->where = WHERE_CUR;
    h->cur[cls] = s;
    return s;
}

void *tiny_alloc_slow(uint32_t cls) {
    struct tiny_heap *h = tc_self.heap;
    if (h == NULL && (h = tc_self.heap = tiny_heap_get()) == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    /* Pre-warm: a thread's first refill of a class asks for the whole cache
     * (a fresh slab gives what its first page holds); later ones for half,
     * leaving the other half for frees. */
    uint32_t want = h->warm[cls] ? tc_batch(cls) : (uint32_t)tc_self.cnt[cls].room;
    h->warm[cls] = true;
    struct ss_slab *s = h->cur[cls];
    while (s == NULL || tiny_take(s, cls, want) == 0) {
        /* No slab: the SuperSlab range is full (or was refused) or the OS
         * is out of memory. */
        if ((s = tiny_next_slab(h, cls)) == NULL) {
            errno = ENOMEM;
            return NULL;
        }
    }
    h->refilled[cls] = true;
    tiny_stat(cls, ST_REFILLS, 1);
    return tiny_handed_out(tc_pop_filled(cls));
}

static void tiny_orphan_fed(void) {
    if (!atomic_load_explicit(&tiny_orphans_fed, memory_order_seq_cst))
        atomic_store_explicit(&tiny_orphans_fed, true, memory_order_seq_cst);
}

/* A holder of orphans off the stack (an exit, a sweep) has put them back:
 * a sweep since `sweeps` (the count when it took them) may have cleared a
 * feed of theirs. */
static void tiny_orphans_back(uint32_t sweeps) {
    if (atomic_load_explicit(&tiny_sweeps, memory_order_seq_cst) != sweeps) tiny_orphan_fed();
}

/* A run first..last of k blocks of s, a slab this thread does not own,
 * onto its remote list: one CAS. */
static void tiny_remote_push(struct ss_slab *s, void *first, void *last, uint32_t k) {
    /* Read all we need of the descriptor first: once the run is on the
     * remote list the owner may drain it, give the slab back and the
     * SuperSlab may be unmapped. After the CAS only the heap (never
     * unmapped) is touched. */
    uint32_t cls = s->cls;
    struct tiny_heap *h = atomic_load_explicit(&s->owner, memory_order_seq_cst);
    uint32_t exits = 0;
    bool orphan = h == SS_NO_OWNER;
    if (!orphan) { /* (the owner read again after its exit count: see below) */
        exits = atomic_load_explicit(&h->exits, memory_order_seq_cst);
        orphan = atomic_load_explicit(&s->owner, memory_order_seq_cst) != h;
    }
    void *old = remote_push(&s->remote, first, (void **)last);
    /* First blocks back since the owner last looked: tell it, in case the
     * slab sits on its full list. (An owner that changed since the read
     * above is told nothing; the blocks wait for the slab's next drain.) */
    if (h != SS_NO_OWNER && old == NULL &&
        !(atomic_load_explicit(&h->remote_pending, memory_order_relaxed) & (1u << cls)))
        atomic_fetch_or_explicit(&h->remote_pending, 1u << cls, memory_order_relaxed);
    /* Onto an orphan, or maybe one: the owner read above may have exited
     * since, or be exiting, and let the slab go before the push landed.
     * Its heap (never unmapped; the descriptor may be, by now) says so:
     * its exit count, odd during an exit, bumped at both ends, read before
     * the owner was read again (so a count read after a whole exit goes
     * with an owner read after it: no owner); and the exit's tiny_let_go
     * looks at the remote list after it stores no owner. All seq_cst:
     * either the exit sees the push or this sees the exit. A spurious
     * "fed" costs a sweep. */
    if (!orphan) {
        uint32_t now = atomic_load_explicit(&h->exits, memory_order_seq_cst);
        orphan = now != exits || (now & 1);
    }
    if (orphan) tiny_orphan_fed();
    tiny_stat(cls, ST_REMOTE, k);
}

/* Return the chain `b` of n blocks of cls, just off this thread's cache, to
 * their slabs (tcache.h's give-back). The cache holds blocks mostly in
 * runs of one slab (a batch is allocated from one slab, and freed in order
 * or in reverse): each run, already linked, goes onto its slab in one
 * splice, its slab's counts and lists updated once (per block, one load and
 * one compare of the slot it lies in). A run of a slab another thread owns,
 * or none, goes onto its remote list, to be counted when drained. */
static void tiny_give_back(uint32_t cls, void *b, uint32_t n) {
    struct tiny_heap *h = tc_self.heap; /* (NULL: every block is another's, or none's) */
    void *last;
    uint32_t own = 0;
    tiny_flow.flushed[cls] += n;
    for (uint32_t i = 0; i < n;) {
        void *first = b;
        uintptr_t slot = (uintptr_t)b >> SS_SLOT_SHIFT;
        uint32_t k = 0;
        do {
            last = b;
            b = *(void **)b;
            k++;
        } while (i + k < n && (uintptr_t)b >> SS_SLOT_SHIFT == slot);
        i += k;
        struct ss_slab *s = ss_slab_of(first);
        /* (Only this thread makes a slab its own: the answer holds.) */
        if (h == NULL || atomic_load_explicit(&s->owner, memory_order_relaxed) != h) {
            tiny_remote_push(s, first, last, k);
            continue;
        }
        own += k;
        *(void **)last = s->free;
        s->free = first;
        s->used = (uint16_t)(s->used - k);
        if (s->where == WHERE_FULL) {
            tiny_list_unlink(h, s);
            tiny_list_push(h, s, WHERE_AVAIL);
        }
        tiny_maybe_release(h, s);
    }
    usage_add(-(int64_t)own * small_class_size[cls]);
    if (h != NULL) h->passed_on[cls] = own < n;
    tiny_stat(cls, ST_FLUSHES, 1);
}

void tiny_reject(const void *p, const struct ss_slab *s, const char *fn) {
    /* (An EMPTY slot's pages are readable whatever became of them.) */
    if (s->state == SS_EMPTY && ss_was_block(s, p) && *tiny_free_mark((void *)p) == s)
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, p, TIER_TINY, s->size);
    diag_bad_pointer(fn, DIAG_INVALID_POINTER, p, TIER_TINY, s->size);
}

/* A thread that may not cache (its exit has begun, checked mode) frees p,
 * a block of s marked free, straight to its slab. It owns no slab (no heap:
 * those come with open caches). */
static void tiny_free_uncached(void *p, struct ss_slab *s) {
    if (s->state != SS_ACTIVE)
        diag_bad_pointer("free", DIAG_INVALID_POINTER, p, TIER_TINY, s->size);
    tiny_flow.remote[s->cls]++; /* (counted apart: it never was in the cache) */
    tiny_remote_push(s, p, p, 1);
}

/* After a flush: a list that passed other threads' blocks on holds a
 * quarter of its first capacity (at least TINY_FOREIGN_CAP) until a flush
 * finds only its own again. What a thread frees of others' blocks waits in
 * its cache, out of their owners' reach, and the owners carve more memory
 * meanwhile (the ring rows at 8 threads held 2x the RSS with full lists).
 * Owner only: called with h == NULL, everything it holds is others'. */
#define TINY_FOREIGN_CAP 16u
static void tiny_fit_cap(struct tiny_heap *h, uint32_t cls) {
    uint32_t first = small_class_cap[cls], cap = tc_self.cap[cls];
    if (h != NULL && !h->passed_on[cls]) {
        if (cap < first) tc_set_cap(cls, first);
        return;
    }
    uint32_t want = first / 4 > TINY_FOREIGN_CAP ? first / 4 : TINY_FOREIGN_CAP;
    if (want >= cap) return;
    uint32_t n = tc_count(cls);
    if (n > want / 2) tc_flush(cls, n - want / 2, tiny_give_back);
    tc_set_cap(cls, want);
}

void tiny_free_slow(void *p, struct ss_slab *s) {
    uint32_t cls = s->cls;
    tc_refund(cls);
    if (hak_unlikely(!tc_self.open)) {
        /* A thread's first free before any slow path of its own (one that
         * only frees what others allocate) arms its exit hook here, which
         * will give back what its cache then holds. */
        if (!tc_thread_start()) return tiny_free_uncached(p, s);
        tc_push(cls, p);
        return;
    }
    /* The list is full. When blocks of the class came back from the slabs
     * since it was last full, the list is too small for the thread's
     * batches: it grows (tc_grow). Otherwise (or at its bound) half goes
     * back. Then it keeps p. */
    struct tiny_heap *h = tc_self.heap;
    bool grew = false;
    if (h != NULL) {
        grew = h->refilled[cls] && !h->passed_on[cls] && tc_grow(cls);
        /* (In use for batches, grown now or at its bound: tiny_age keeps it.) */
        h->grew[cls] |= h->refilled[cls];
        h->refilled[cls] = false;
    }
    if (!grew) { /* (half back, the cap fitted before p goes in: tcache.h) */
        tc_flush(cls, tc_batch(cls), tiny_give_back);
        tiny_fit_cap(h, cls);
    }
    tc_push(cls, p);
}

/* ---- thread exit, trim, fork ----------------------------------------------------- */

/* Drain s; give it back if empty (true), else add it to c, ownerless. */
static bool tiny_let_go(struct ss_slab *s, struct ss_chain *c) {
    tiny_drain(s);
    if (s->used == 0) {
        ss_release(s, true);
        return true;
    }
    atomic_store_explicit(&s->owner, SS_NO_OWNER, memory_order_seq_cst);
    /* Blocks pushed since the drain, by a pusher that read us as owner:
     * the sweep is told (see tiny_remote_push). */
    if (atomic_load_explicit(&s->remote, memory_order_seq_cst) != NULL) tiny_orphan_fed();
    ss_chain_add(c, s);
    return false;
}

static void tiny_orphan(uint32_t cls, const struct ss_chain *c) {
    if (c->first) lf_push_chain(&tiny_orphans[cls], c->first, c->last, TINY_SLAB_LINK);
}

/* The exiting thread's heap (its cache given back): its slabs left (empty
 * ones given back), the heap to the next thread. */
#ifdef HAK_FAULT_INJECT
void (*tiny_exit_publish_hook)(void);
#endif

static void tiny_heap_exit(struct tiny_heap *h) {
    uint32_t sweeps = atomic_load_explicit(&tiny_sweeps, memory_order_seq_cst);
    atomic_fetch_add_explicit(&h->exits, 1, memory_order_seq_cst); /* (odd: see tiny_remote_push) */
    for (uint32_t cls = 0; cls < TINY_NCLASSES; cls++) {
        h->refilled[cls] = h->grew[cls] = false; /* (the next thread's lists start small) */
        struct ss_slab *lists[] = {h->cur[cls], h->avail[cls], h->full[cls]};
        struct ss_chain c = {NULL, NULL};
        for (int l = 0; l < 3; l++) {
            for (struct ss_slab *s = lists[l], *next; s; s = next) {
                next = l ? s->next : NULL; /* cur is a single slab */
                tiny_let_go(s, &c);
            }
        }
#ifdef HAK_FAULT_INJECT
        if (tiny_exit_publish_hook && c.first) tiny_exit_publish_hook();
#endif
        tiny_orphan(cls, &c);
    }
    tiny_orphans_back(sweeps);
    tiny_release_spares(h);
    /* What it left idle earlier (and its flush above) goes too; past the
     * notes' room, a sweep of every idle SuperSlab. */
    for (uint32_t i = 0; i < h->nidle && i < TINY_IDLE_MAX; i++)
        ss_retire_idle(h->idle[i]);
    if (h->nidle > TINY_IDLE_MAX) ss_retire_all_idle();
    h->nidle = 0;
    tc_self.heap = NULL;
    atomic_fetch_add_explicit(&h->exits, 1, memory_order_seq_cst);
    lf_push(&tiny_heaps, h, TINY_HEAP_LINK);
}

void tiny_thread_exit(void) {
    tiny_merge_counts();
    /* (A thread without a heap may cache other threads' blocks.) */
    tc_flush_all(0, TINY_NCLASSES, tiny_give_back);
    if (tc_self.heap) tiny_heap_exit(tc_self.heap);
    ss_flush_counts(); /* last: nothing above is left pending */
}

/* Orphans whose blocks all came back to them: the class's all taken (ours
 * to drain meanwhile), the others put back. True when one was given back. */
static bool tiny_sweep_orphans(void) {
    bool any = false;
    atomic_store_explicit(&tiny_orphans_fed, false, memory_order_seq_cst);
    uint32_t sweeps = atomic_fetch_add_explicit(&tiny_sweeps, 1, memory_order_seq_cst) + 1;
    for (uint32_t cls = 0; cls < TINY_NCLASSES; cls++) {
        struct ss_chain c = {NULL, NULL};
        for (struct ss_slab *s = lf_take_all(&tiny_orphans[cls]), *next; s; s = next) {
            next = s->next;
            any |= tiny_let_go(s, &c);
        }
        tiny_orphan(cls, &c);
    }
    tiny_orphans_back(sweeps);
    return any;
}

void tiny_age(void) {
    if (atomic_load_explicit(&tiny_orphans_fed, memory_order_relaxed)) tiny_sweep_orphans();
    struct tiny_heap *h = tc_self.heap;
    if (h == NULL) return; /* (only a heap's lists grow) */
    for (uint32_t cls = 0; cls < TINY_NCLASSES; cls++) {
        if (tc_self.cap[cls] <= small_class_cap[cls]) continue;
        if (h->grew[cls]) { /* (in use: its batches grew it this age) */
            h->grew[cls] = false;
            continue;
        }
        tc_flush_list(cls, tiny_give_back);
        tc_shrink(cls);
    }
}

bool tiny_trim(void) {
    bool any = false;
    struct tiny_heap *h = tc_self.heap;
    for (uint32_t cls = 0; cls < TINY_NCLASSES; cls++) {
        tc_flush_list(cls, tiny_give_back);
        if (h == NULL) continue; /* (other threads' blocks in its cache, at most) */
        tc_shrink(cls);          /* (and grows again if the thread's batches need it) */
        struct ss_slab *cur = h->cur[cls];
        if (cur) {
            tiny_drain(cur);
            if (cur->used == 0) { /* refills would come from it: not any more */
                h->cur[cls] = NULL;
                ss_release(cur, true);
                any = true;
            }
        }
        struct ss_slab *lists[] = {h->avail[cls], h->full[cls]};
        for (int l = 0; l < 2; l++) {
            for (struct ss_slab *s = lists[l], *next; s; s = next) {
                next = s->next;
                tiny_drain(s);
                if (s->used == 0) {
                    tiny_list_unlink(h, s);
                    ss_release(s, true);
                    any = true;
                } else if (s->free && s->where == WHERE_FULL) {
                    /* Drained blocks: refills must find this slab again. */
                    tiny_list_unlink(h, s);
                    tiny_list_push(h, s, WHERE_AVAIL);
                }
            }
        }
    }
    if (h) any |= tiny_release_spares(h); /* (the flushes above may have made some) */
    return tiny_sweep_orphans() || any;
}

void tiny_get_stats(struct tiny_class_stats st[TINY_NCLASSES]) {
    tiny_merge_counts();
    for (uint32_t c = 0; c < TINY_NCLASSES; c++) {
        st[c].allocs = atomic_load(&tiny_st[c][ST_ALLOCS]);
        st[c].frees = atomic_load(&tiny_st[c][ST_FREES]);
        st[c].refills = atomic_load(&tiny_st[c][ST_REFILLS]);
        st[c].flushes = atomic_load(&tiny_st[c][ST_FLUSHES]);
        st[c].remote_frees = atomic_load(&tiny_st[c][ST_REMOTE]);
        st[c].adopted = atomic_load(&tiny_st[c][ST_ADOPTED]);
    }
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void tiny_collect(enum tier_collect kind, struct tier_done *done) {
    switch (kind) {
    case COLLECT_THREAD:
        tiny_age();
        break;
    case COLLECT_TRIM:
        tier_released(done, tiny_trim());
        break;
    /* Last of the tiers with thread caches (the table's reverse order): a
     * Tiny free in their exits (a signal handler's) would go into the
     * cache, whatever slab it is of. */
    case COLLECT_EXIT:
        tiny_thread_exit();
        break;
    default:
        break;
    }
}

static void tiny_tier_stats(struct tier_stats *s) {
    if (s->classes == NULL) return;
    struct tiny_class_stats st[TINY_NCLASSES];
    tiny_get_stats(st);
    for (uint32_t c = 0; c < TINY_NCLASSES; c++)
        s->classes[c] = (struct stats_class){
            .cls = c,
            .size = small_class_size[c],
            .allocs = st[c].allocs,
            .frees = st[c].frees,
            .refills = st[c].refills,
            .flushes = st[c].flushes,
            .remote_frees = st[c].remote_frees,
            .adopted = st[c].adopted,
        };
    s->nclasses = TINY_NCLASSES;
}

const struct tier_ops tiny_tier = {
    .name = "tiny", .collect = tiny_collect, .stats = tiny_tier_stats};
