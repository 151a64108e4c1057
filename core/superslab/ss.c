/* SuperSlab slot management. Everything here runs on slow paths (a slab
 * acquired or given back per tens to thousands of blocks), on every thread:
 * the common ones, an EMPTY slab taken or given back, take no lock. */
#include "superslab/ss.h"

#include "box/arena.h"
#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lfstack.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/tier.h"
#include "box/usage.h"
#include "sizeclass.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <string.h>

/* The SuperSlab range (ss.h): the lower half of the arena (box/arena.h),
 * growing in place up to 128 GiB (64 Ki SuperSlabs). */
#define SS_RANGE_MAX ((size_t)1 << 37)
/* Written once, together, under ss_lock, before any pointer into the range
 * exists; read relaxed by free (see ss_contains). Until
 * then a base of 2^63 puts every user address outside. */
struct ss_bounds ss_bounds = {.base = (uintptr_t)1 << 63};
static bool ss_range_stuck;     /* the range could not grow: do not ask again */
static uintptr_t ss_range_used; /* bytes from the base ever mapped */
/* Bit i: the i-th SuperSlab of the range was given back to the OS and its
 * place can be mapped again. Lowest first, so the range stays compact. */
static uint64_t ss_range_free[SS_RANGE_MAX / SS_SIZE / 64];
static uint64_t ss_range_nfree;
/* Bit i: the i-th SuperSlab is being given back (ss_unmap, outside the
 * lock): no retire reads its header meanwhile. */
static uint64_t ss_range_dying[SS_RANGE_MAX / SS_SIZE / 64];

/* What no thread's allocation waits for is under ss_lock: a SuperSlab's
 * UNUSED slots (ss_partial), the cache, the range, and retiring a SuperSlab
 * whose slots all came back, which happen once per SuperSlab, not per slab.
 * No system call is made while it is held except growing and shrinking the
 * range. EMPTY slabs wait on a lock-free stack per class (box/lfstack.h:
 * descriptors are never unmapped, only made read-only zeroes, so a popper
 * may read a stale link), each on a line of its own. */
static pthread_mutex_t ss_lock = PTHREAD_MUTEX_INITIALIZER;
static struct superslab *ss_partial; /* SuperSlabs with an UNUSED slot */
/* ss_partial != NULL, for a look without the lock (ss_partial_changed). */
static _Atomic bool ss_have_partial;
static struct { struct lf_stack s; } __attribute__((aligned(64))) ss_empty[TINY_NCLASSES];
#define SS_SLAB_LINK offsetof(struct ss_slab, next)

/* A chain of class cls's EMPTY slabs back onto its stack. */
static void ss_push_chain(uint32_t cls, const struct ss_chain *c) {
    if (c->first) lf_push_chain(&ss_empty[cls].s, c->first, c->last, SS_SLAB_LINK);
}
static struct superslab *ss_cache; /* all-empty, decommitted */
/* SuperSlabs whose retire found a slab missing, as when a purge pass held
 * it: the pass tries them again once it has put its slabs back (one whose
 * slab an acquire took is tried again at that slab's release). Beyond
 * SS_RETRY_MAX the rest wait for a release or malloc_trim (ss_trim). */
#define SS_RETRY_MAX 32
static struct superslab *ss_retry[SS_RETRY_MAX];
static uint32_t ss_nretry;
/* The counts changed under ss_lock (live, cached, stage2, stage3_*,
 * retired, unmapped); the others are counted per thread (ss_count). */
static struct ss_stats ss_st;
/* One purge pass at a time; allocations never wait for it. */
static pthread_mutex_t ss_purge_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint8_t ss_epoch; /* ss_purge passes, mod 256 */
/* ms: when the next timed pass is due (a pass not due costs no lock). */
static _Atomic uint64_t ss_purge_next;
/* An EMPTY slot may still hold pages: a later pass has work (ss_age_next). */
static _Atomic bool ss_dirty;

/* Set ss_dirty. The background thread arms its bell, then looks
 * (ss_age_next): one of the two sees the other's store. */
static void ss_set_dirty(void) {
    atomic_store_explicit(&ss_dirty, true, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    bell_ring();
}
/* Bytes carved in slabs not reset since. Counted per thread and published
 * in batches (box/usage.h): a carve runs on every core, and a counter line
 * written by all of them on each would be a shared write per carve. */
static _Atomic int64_t ss_carved;
static __thread int64_t ss_carved_pending;

/* Slab events counted without a lock: per thread, summed when read. */
enum { SC_STAGE1, SC_RECLASS, SC_RELEASES, SC_PURGED, SC_N };
static _Atomic uint64_t ss_counts[SC_N];
static __thread uint64_t ss_counts_pending[SC_N];

#define SS_COUNT_BATCH 64

static inline void ss_count(int c, uint64_t n) {
    if ((ss_counts_pending[c] += n) < SS_COUNT_BATCH) return;
    atomic_fetch_add_explicit(&ss_counts[c], ss_counts_pending[c], memory_order_relaxed);
    ss_counts_pending[c] = 0;
}

void ss_note_carved(size_t bytes) {
    usage_batch_add(&ss_carved, &ss_carved_pending, (int64_t)bytes, USAGE_BATCH_SLACK);
}

/* A slab's state, read without the lock by a retire (and by remote frees). */
static inline void ss_set_state(struct ss_slab *s, enum ss_state st) {
    __atomic_store_n(&s->state, (uint8_t)st, __ATOMIC_RELAXED);
}

/* Carved bytes gone (a slab reset, purged or retired): to the total at
 * once, as the Pool tier's, so that the published total never exceeds what
 * the slabs hold (mallinfo2: uordblks <= arena). Batched, a thread that
 * uncarved what another published kept it counted for as long as it lived
 * (the API fuzzer: uordblks 10240, arena 0 after a trim). A slab's reset
 * is rare: one atomic for a slab's worth of blocks. */
static void ss_note_uncarved(const struct ss_slab *s) {
    if (s->carved != 0)
        atomic_fetch_sub_explicit(&ss_carved, (int64_t)s->carved * s->size, memory_order_relaxed);
}

void ss_flush_counts(void) {
    usage_batch_flush(&ss_carved, &ss_carved_pending);
    for (int c = 0; c < SC_N; c++) {
        if (ss_counts_pending[c])
            atomic_fetch_add_explicit(&ss_counts[c], ss_counts_pending[c], memory_order_relaxed);
        ss_counts_pending[c] = 0;
    }
}

#define SS_ALL_SLOTS (~(uint32_t)0 << SS_FIRST_SLOT)

static void ss_push(struct superslab **head, struct superslab *ss) {
    ss->prev = NULL;
    ss->next = *head;
    if (*head) (*head)->prev = ss;
    *head = ss;
}

static void ss_unlink(struct superslab **head, struct superslab *ss) {
    if (ss->prev)
        ss->prev->next = ss->next;
    else
        *head = ss->next;
    if (ss->next) ss->next->prev = ss->prev;
}

static void ss_slab_reset(struct ss_slab *s, uint32_t cls, uint32_t size) {
    /* What the old cut carved still holds its bytes (a purged slot carved
     * none): among them the Tiny free marks, the descriptor's address, at the
     * old block size's offsets. Left there, a new block whose program moved
     * never-written bytes over its second word would read as free. */
    memset(ss_slab_base(s), 0, (size_t)s->carved * s->size);
    ss_note_uncarved(s);
    s->free = NULL;
    atomic_store_explicit(&s->remote, NULL, memory_order_relaxed);
    s->div_mul = (uint32_t)(((uint64_t)1 << 32) / size + 1);
    s->size = (uint16_t)size;
    s->capacity = (uint16_t)(SS_SLOT_SIZE / size);
    ss_set_carved(s, 0);
    s->used = 0;
    /* (Read by a retire that races this re-cut: see ss_retire_idle.) */
    __atomic_store_n(&s->cls, (uint8_t)cls, __ATOMIC_RELAXED);
}

/* Place for one more SuperSlab in the range: a given-back one, else the next
 * one past the used extent, growing the range when it is full. 0 when it
 * cannot grow; no more tries then until malloc_trim (or an allocation that
 * failed) gave something back, so a full range costs no syscall per slab.
 * Lock held. */
static uintptr_t ss_range_take(void) {
    uintptr_t base = __atomic_load_n(&ss_bounds.base, __ATOMIC_RELAXED);
    size_t span = __atomic_load_n(&ss_bounds.span, __ATOMIC_RELAXED);
    if (ss_range_nfree) {
        for (size_t w = 0;; w++) {
            if (ss_range_free[w] == 0) continue;
            size_t i = w * 64 + (size_t)__builtin_ctzll(ss_range_free[w]);
            ss_range_free[w] &= ss_range_free[w] - 1;
            ss_range_nfree--;
            return base + i * SS_SIZE;
        }
    }
    if (ss_range_used == span) {
        if (ss_range_stuck || !arena_ss_grow(&base, &span)) {
            ss_range_stuck = true;
            return 0;
        }
        /* Base first: a reader seeing the new span with the old base (2^63)
         * still finds no user address inside. */
        __atomic_store_n(&ss_bounds.base, base, __ATOMIC_RELAXED);
        __atomic_store_n(&ss_bounds.span, span, __ATOMIC_RELAXED);
    }
    ss_range_used += SS_SIZE;
    return base + ss_range_used - SS_SIZE;
}

/* The place of a SuperSlab given back to the OS (or never mapped) is free
 * again. Lock held. */
static void ss_range_put(uintptr_t a) {
    size_t i = (a - __atomic_load_n(&ss_bounds.base, __ATOMIC_RELAXED)) / SS_SIZE;
    ss_range_free[i / 64] |= 1ull << (i % 64);
    ss_range_nfree++;
}

/* The place of ss is taken (its SuperSlab in use, cached, or being given
 * back): its header is mapped, whatever the range did since. Lock held. */
static bool ss_place_taken(const struct superslab *ss) {
    size_t off = (uintptr_t)ss - __atomic_load_n(&ss_bounds.base, __ATOMIC_RELAXED);
    if (off >= ss_range_used) return false;
    size_t i = off / SS_SIZE;
    return !((ss_range_free[i / 64] | ss_range_dying[i / 64]) >> (i % 64) & 1);
}

/* Give a SuperSlab no list holds back to the OS; its place stays in the
 * range, read-only and zero. Lock not held. */
static void ss_unmap(struct superslab *ss) {
    size_t i = ((uintptr_t)ss - __atomic_load_n(&ss_bounds.base, __ATOMIC_RELAXED)) / SS_SIZE;
    hak_lock(&ss_lock);
    ss_range_dying[i / 64] |= 1ull << (i % 64);
    hak_unlock(&ss_lock);
    /* Readable throughout all the same (a stale pop may read a link). */
    os_uncommit_readable(ss, SS_SIZE);
    hak_lock(&ss_lock);
    ss_range_dying[i / 64] &= ~(1ull << (i % 64));
    ss_range_put((uintptr_t)ss);
    ss_st.live--;
    ss_st.unmapped++;
    hak_unlock(&ss_lock);
}

/* After ss_partial changed. Lock held. */
static void ss_partial_changed(void) {
    atomic_store_explicit(&ss_have_partial, ss_partial != NULL, memory_order_relaxed);
}

/* Take an UNUSED slot of a partial SuperSlab, the lowest; it may not be
 * writable yet (ss_slot_ready, after the lock). Lock held; ss_partial set. */
static struct ss_slab *ss_take_unused(uint32_t cls, uint32_t size) {
    struct superslab *ss = ss_partial;
    uint32_t i = (uint32_t)__builtin_ctz(ss->unused_mask);
    ss->unused_mask &= ~(1u << i);
    if (ss->unused_mask == 0) {
        ss_unlink(&ss_partial, ss);
        ss_partial_changed();
    }
    ss_slab_reset(&ss->slab[i], cls, size);
    return &ss->slab[i];
}

/* s, just taken by ss_take_unused, made writable if it is not yet (one
 * 64 KiB mprotect a slot a SuperSlab's life, which joins the mapping of
 * the slots below; the slot's page faults cost more). Lock not held. false
 * when the OS refused (commit limit): s is UNUSED again. (Taken, not yet
 * ACTIVE, s keeps its SuperSlab from being retired: ss_retire_idle.) */
static bool ss_slot_ready(struct ss_slab *s) {
    struct superslab *ss = ss_of(s);
    uint32_t bit = 1u << (s - ss->slab);
    if (atomic_load_explicit(&ss->writable, memory_order_relaxed) & bit) return true;
    if (os_commit(ss_slab_base(s), SS_SLOT_SIZE)) {
        atomic_fetch_or_explicit(&ss->writable, bit, memory_order_relaxed);
        return true;
    }
    hak_lock(&ss_lock);
    if (ss->unused_mask == 0) ss_push(&ss_partial, ss);
    ss->unused_mask |= bit;
    ss_partial_changed();
    hak_unlock(&ss_lock);
    return false;
}

/* s, out of every list, becomes its SuperSlab's ACTIVE slot. */
static struct ss_slab *ss_activate(struct ss_slab *s) {
    atomic_fetch_add_explicit(&ss_of(s)->nactive, 1, memory_order_relaxed);
    ss_set_state(s, SS_ACTIVE);
    return s;
}

/* Stage 3: a cached SuperSlab (its pages fault back in as zeroes), else a
 * new one; its first slot for cls. The mapping is made without the lock. */
static struct ss_slab *ss_acquire_new(uint32_t cls, uint32_t size) {
    struct ss_slab *s = NULL;
    struct superslab *ss;
    uintptr_t a = 0;
    hak_lock(&ss_lock);
    if (ss_partial) { /* another thread mapped one meanwhile */
        s = ss_take_unused(cls, size);
        ss_st.stage2++;
        hak_unlock(&ss_lock);
        return ss_slot_ready(s) ? s : NULL;
    }
    if ((ss = ss_cache) != NULL) {
        ss_unlink(&ss_cache, ss);
        ss_st.cached--;
        ss_st.stage3_cache++;
    } else {
        a = ss_range_take();
    }
    hak_unlock(&ss_lock);
    if (ss == NULL) {
        if (a == 0) return NULL;
        /* The header slot; the others as they are taken (ss_slot_ready),
         * but in huge pages, which a read-only slot would split. */
        bool all = hak_huge_heaps();
        if (!os_commit((void *)a, all ? SS_SIZE : SS_SLOT_SIZE)) {
            hak_lock(&ss_lock);
            ss_range_put(a);
            hak_unlock(&ss_lock);
            return NULL;
        }
        /* The flag stays with the place while it is cached (decommit keeps it). */
        if (hak_huge_heaps()) os_hugepages((void *)a, SS_SIZE);
        ss = (struct superslab *)a;
        atomic_store_explicit(&ss->writable, all ? ~0u : 1u, memory_order_relaxed);
        for (uint32_t i = 0; i < SS_NSLOTS; i++)
            atomic_store_explicit(&ss->slab[i].owner, SS_NO_OWNER, memory_order_relaxed);
    }
    hak_lock(&ss_lock);
    if (a) {
        ss_st.live++;
        ss_st.stage3_os++;
    }
    ss->unused_mask = SS_ALL_SLOTS;
    ss_push(&ss_partial, ss);
    ss_partial_changed();
    s = ss_take_unused(cls, size);
    hak_unlock(&ss_lock);
    return ss_slot_ready(s) ? s : NULL;
}

struct ss_slab *ss_acquire(uint32_t cls, uint32_t size) {
    /* Stage 1: this class's own empty slab, blocks already carved. */
    struct ss_slab *s = lf_pop(&ss_empty[cls].s, SS_SLAB_LINK);
    if (s) {
        ss_count(SC_STAGE1, 1);
        ss_activate(s);
        ss_set_carved(s, s->carved); /* its blocks pass the block test again */
        return s;
    }
    /* Stage 2: an UNUSED slot of a mapped SuperSlab. */
    if (atomic_load_explicit(&ss_have_partial, memory_order_relaxed)) {
        hak_lock(&ss_lock);
        if (ss_partial) {
            s = ss_take_unused(cls, size);
            ss_st.stage2++;
        }
        hak_unlock(&ss_lock);
        if (s && ss_slot_ready(s)) return ss_activate(s);
        s = NULL;
    }
    /* Stage 2, recycled: another class's empty slab, re-cut (counted active
     * first, so that a retire of its SuperSlab sees it taken). */
    for (uint32_t c = 0; c < TINY_NCLASSES; c++) {
        if ((s = lf_pop(&ss_empty[c].s, SS_SLAB_LINK)) == NULL) continue;
        ss_activate(s);
        ss_slab_reset(s, cls, size);
        ss_count(SC_RECLASS, 1);
        return s;
    }
    s = ss_acquire_new(cls, size);
    return s ? ss_activate(s) : NULL;
}

/* Every slot of ss is back and out of every list: reset them, then cache
 * ss decommitted or give it back. Lock held; released on return. */
static void ss_retire(struct superslab *ss) {
    for (uint32_t i = SS_FIRST_SLOT; i < SS_NSLOTS; i++) {
        struct ss_slab *s = &ss->slab[i];
        ss_note_uncarved(s);
        ss_set_carved(s, 0);
        ss_set_state(s, SS_UNUSED);
    }
    if (ss->unused_mask) {
        ss_unlink(&ss_partial, ss);
        ss_partial_changed();
    }
    ss->unused_mask = SS_ALL_SLOTS;
    ss_st.retired++;
    /* (Not in huge pages: a cached SuperSlab keeps its first slot, and the
     * rest, decommitted, would split the huge page.) */
    bool cache = ss_st.cached < hak_cfg.ss_cache && !hak_huge_heaps();
    if (cache) ss_st.cached++; /* its place in the cache, held */
    hak_unlock(&ss_lock);
    /* Cached: the header slot kept, the 31 data slots' pages given back, so
     * they are cut again from zeroes. Pages that cannot go (locked) would
     * keep the old cuts' bytes and free marks: such a SuperSlab is unmapped. */
    bool dropped = cache && os_decommit((uint8_t *)ss + SS_SLOT_SIZE, SS_SIZE - SS_SLOT_SIZE);
    /* Its data slots read-only again, as a new SuperSlab's, so that they
     * are made writable as they are taken (kept writable if refused). */
    if (dropped && os_readable((uint8_t *)ss + SS_SLOT_SIZE, SS_SIZE - SS_SLOT_SIZE))
        atomic_store_explicit(&ss->writable, 1u, memory_order_relaxed);
    if (!dropped) {
        if (cache) {
            hak_lock(&ss_lock);
            ss_st.cached--;
            hak_unlock(&ss_lock);
        }
        ss_unmap(ss);
        return;
    }
    hak_lock(&ss_lock);
    ss_push(&ss_cache, ss);
    hak_unlock(&ss_lock);
}

/* Lock held. */
static void ss_queue_retry(struct superslab *ss) {
    for (uint32_t i = 0; i < ss_nretry; i++)
        if (ss_retry[i] == ss) return;
    if (ss_nretry < SS_RETRY_MAX) ss_retry[ss_nretry++] = ss;
}

/* ss had no ACTIVE slot a moment ago: retire it if every slot it used is
 * EMPTY and on the stacks now. The stacks of its slots' classes are taken
 * whole, its slabs picked out, the rest put back: when all of its slabs are
 * in hand, nothing else can reach it (its UNUSED slots are under ss_lock);
 * when one is missing, someone popped it (and will count it active, and
 * release it again) or holds it for a purge (which tries again after). */
void ss_retire_idle(struct superslab *ss) {
    hak_lock(&ss_lock);
    /* A retry, or a release that raced another retire of ss, may come after
     * its place was given back, even unmapped (ss_range_shrink). */
    if (!ss_place_taken(ss)) {
        hak_unlock(&ss_lock);
        return;
    }
    uint32_t used = ~ss->unused_mask & SS_ALL_SLOTS;
    if (used == 0 || atomic_load_explicit(&ss->nactive, memory_order_acquire) != 0) {
        hak_unlock(&ss_lock);
        return;
    }
    uint32_t classes = 0, found = 0;
    for (uint32_t m = used; m; m &= m - 1) {
        const struct ss_slab *s = &ss->slab[__builtin_ctz(m)];
        /* A slot in use reads UNUSED only in a SuperSlab given back since
         * it was queued for a retry (its header reads as zeroes). */
        if (__atomic_load_n(&s->state, __ATOMIC_RELAXED) == SS_UNUSED) {
            hak_unlock(&ss_lock);
            return;
        }
        classes |= 1u << __atomic_load_n(&s->cls, __ATOMIC_RELAXED);
    }
    struct ss_slab *mine = NULL;
    for (uint32_t m = classes; m; m &= m - 1) {
        uint32_t c = (uint32_t)__builtin_ctz(m);
        struct ss_chain keep = {NULL, NULL};
        for (struct ss_slab *s = lf_take_all(&ss_empty[c].s), *next; s; s = next) {
            next = s->next;
            if (ss_of(s) == ss) {
                ss_slab_link(s, mine);
                mine = s;
                found++;
            } else {
                ss_chain_add(&keep, s);
            }
        }
        ss_push_chain(c, &keep);
    }
    if (found == (uint32_t)__builtin_popcount(used) &&
        atomic_load_explicit(&ss->nactive, memory_order_acquire) == 0)
        return ss_retire(ss);
    for (struct ss_slab *s = mine, *next; s; s = next) {
        next = s->next;
        lf_push(&ss_empty[s->cls].s, s, SS_SLAB_LINK);
    }
    ss_queue_retry(ss);
    hak_unlock(&ss_lock);
}

/* Try again the retires that found a slab missing. */
static void ss_retry_retires(void) {
    struct superslab *todo[SS_RETRY_MAX];
    hak_lock(&ss_lock);
    uint32_t n = ss_nretry;
    memcpy(todo, ss_retry, n * sizeof todo[0]);
    ss_nretry = 0;
    hak_unlock(&ss_lock);
    for (uint32_t i = 0; i < n; i++)
        ss_retire_idle(todo[i]);
}

bool ss_release(struct ss_slab *s, bool retire) {
    struct superslab *ss = ss_of(s);
    bool idle = false;
    atomic_store_explicit(&s->owner, SS_NO_OWNER, memory_order_relaxed);
    /* No block of an EMPTY slab passes the block test: free takes any
     * thread's block on the mark alone, which a write after free can have
     * cleared (tiny_reject still tells a double free by it). Its carved
     * count stays, for a reuse of the class (ss_acquire). */
    __atomic_store_n(&s->valid_lim, 0, __ATOMIC_RELAXED);
    ss_set_state(s, SS_EMPTY);
    s->epoch = atomic_load_explicit(&ss_epoch, memory_order_relaxed);
    ss_count(SC_RELEASES, 1);
    lf_push(&ss_empty[s->cls].s, s, SS_SLAB_LINK);
    /* Pushed before it stops counting: until then ss cannot be retired. */
    if (atomic_fetch_sub_explicit(&ss->nactive, 1, memory_order_acq_rel) == 1) {
        if (retire)
            ss_retire_idle(ss);
        else
            idle = true;
    }
    /* A later pass has work. After the push (the fence): a pass that
     * cleared the flag before its look finds the slab or is seen here. */
    atomic_thread_fence(memory_order_seq_cst);
    if (!atomic_load_explicit(&ss_dirty, memory_order_relaxed)) ss_set_dirty();
    ss_purge(false); /* slots released are the ones a later pass finds empty */
    return idle;
}

/* Under an address-space limit, which counts reserved space too: places at
 * the top of the range given back to the OS end the range again, and their
 * reservation goes. Only pointers to given-back memory could point there,
 * which free then finds outside the range: an invalid pointer. (Without a
 * limit a reservation costs nothing: it stays, for reuse.) Lock held. */
static bool ss_range_shrink(void) {
    if (os_as_limit() == SIZE_MAX) return false;
    size_t used = ss_range_used;
    while (used > 0) {
        size_t i = used / SS_SIZE - 1;
        if (!(ss_range_free[i / 64] >> (i % 64) & 1)) break;
        ss_range_free[i / 64] &= ~(1ull << (i % 64));
        ss_range_nfree--;
        used -= SS_SIZE;
    }
    ss_range_used = used; /* the places above are past the used extent again */
    size_t span = __atomic_load_n(&ss_bounds.span, __ATOMIC_RELAXED);
    if (used == span) return false;
    /* The range ends first, then its tail goes: a free of a stale pointer
     * there finds it outside instead of reading an unmapped descriptor. */
    __atomic_store_n(&ss_bounds.span, used, __ATOMIC_RELAXED);
    if (arena_ss_shrink(used)) return true;
    __atomic_store_n(&ss_bounds.span, span, __ATOMIC_RELAXED); /* refused: it stays */
    return false;
}

/* Every SuperSlab with no ACTIVE slot retired (a trim; a thread's exit that
 * left more idle than it noted; ones whose retire was missed, the retry
 * queue full): up to SS_RETRY_MAX a round, found on the stacks. */
void ss_retire_all_idle(void) {
    for (int round = 0; round < 64; round++) {
        hak_lock(&ss_lock);
        for (uint32_t c = 0; c < TINY_NCLASSES && ss_nretry < SS_RETRY_MAX; c++) {
            struct ss_slab *first = lf_take_all(&ss_empty[c].s), *last = NULL;
            for (struct ss_slab *s = first; s; last = s, s = s->next)
                if (atomic_load_explicit(&ss_of(s)->nactive, memory_order_relaxed) == 0)
                    ss_queue_retry(ss_of(s));
            if (first) lf_push_chain(&ss_empty[c].s, first, last, SS_SLAB_LINK);
        }
        bool full = ss_nretry == SS_RETRY_MAX;
        hak_unlock(&ss_lock);
        ss_retry_retires();
        if (!full) return;
    }
}

bool ss_trim(void) {
    ss_retire_all_idle();
    hak_lock(&ss_lock);
    struct superslab *cached = ss_cache;
    bool any = cached != NULL;
    ss_cache = NULL;
    /* (A retire between its decommit and its push holds a place in the
     * count: only the ones taken here come off.) */
    for (struct superslab *ss = cached; ss; ss = ss->next)
        ss_st.cached--;
    hak_unlock(&ss_lock);
    for (struct superslab *ss = cached, *next; ss; ss = next) {
        next = ss->next;
        ss_unmap(ss);
    }
    hak_lock(&ss_lock);
    ss_range_stuck = false; /* memory was given back: the range may grow again */
    any |= ss_range_shrink();
    hak_unlock(&ss_lock);
    return any;
}

/* Slots a timed pass decommits at most. */
#define SS_PURGE_BATCH 1024
/* SuperSlabs with no ACTIVE slot a pass retires at most (the others, at the
 * next). */
#define SS_IDLE_MAX 256

/* ss in idle[0 .. n) (once): the new n. */
static uint32_t ss_note_idle(struct superslab **idle, uint32_t n, struct superslab *ss) {
    for (uint32_t i = n; i-- > 0;)
        if (idle[i] == ss) return n;
    idle[n] = ss;
    return n + 1;
}

/* One pass over every class's EMPTY slabs: each one empty since an earlier
 * pass (every one, with `all`) and still holding carved blocks gives its
 * pages back. A class's stack is taken whole; the slabs the pass keeps go
 * back at once, the others once decommitted (meanwhile the class takes
 * another slot). ss_purge_lock held. */
static bool ss_purge_pass(bool all) {
    uint32_t n = 0, max = all ? UINT32_MAX : SS_PURGE_BATCH;
    uint8_t epoch = atomic_load_explicit(&ss_epoch, memory_order_relaxed);
    /* Cleared first: a slab released after its class was looked at sets it
     * again (the fence: before any look, see ss_release). */
    atomic_store_explicit(&ss_dirty, false, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    bool left = false; /* a slot empty since this pass only */
    /* SuperSlabs with no ACTIVE slot: retired after the pass (ss_release
     * left them for it, to be reused for up to an age). */
    struct superslab *idle[SS_IDLE_MAX];
    uint32_t nidle = 0;
    bool huge = hak_huge_heaps();
    for (uint32_t cls = 0; cls < TINY_NCLASSES; cls++) {
        struct ss_chain keep = {NULL, NULL}, todo = {NULL, NULL};
        for (struct ss_slab *s = lf_take_all(&ss_empty[cls].s), *next; s; s = next) {
            next = s->next;
            /* A slot purged before is carved 0: nothing of it is resident.
             * Huge pages go back whole, with their SuperSlab only. */
            bool held = s->carved != 0 && !huge;
            bool due = held && (all || s->epoch != epoch);
            struct superslab *ss = ss_of(s);
            if (nidle < SS_IDLE_MAX &&
                atomic_load_explicit(&ss->nactive, memory_order_relaxed) == 0)
                nidle = ss_note_idle(idle, nidle, ss);
            if (due && n < max) {
                n++;
                ss_chain_add(&todo, s);
            } else {
                left |= held;
                ss_chain_add(&keep, s);
            }
        }
        ss_push_chain(cls, &keep);
        for (struct ss_slab *s = todo.first; s; s = s->next) {
            /* (Locked pages stay as they are.) */
            if (os_decommit(ss_slab_base(s), SS_SLOT_SIZE)) {
                ss_note_uncarved(s);
                s->free = NULL; /* its links went with the pages */
                ss_set_carved(s, 0);
                ss_count(SC_PURGED, 1);
            }
        }
        ss_push_chain(cls, &todo);
    }
    atomic_store_explicit(&ss_epoch, (uint8_t)(epoch + 1), memory_order_relaxed);
    if (left || n >= max) ss_set_dirty();
    ss_retry_retires();
    for (uint32_t i = 0; i < nidle; i++)
        ss_retire_idle(idle[i]);
    if (nidle == SS_IDLE_MAX) ss_set_dirty(); /* (more for the next pass) */
    return n > 0 || nidle > 0;
}

bool ss_purge(bool all) {
    /* Nothing due: not even the lock. */
    uint64_t now = hak_now_ms();
    if (!all && now < atomic_load_explicit(&ss_purge_next, memory_order_relaxed)) return false;
    if (all) {
        hak_lock(&ss_purge_lock);
    } else if (hak_in_fork || pthread_mutex_trylock(&ss_purge_lock) != 0) {
        return false; /* a pass is being made */
    }
    bool any = false;
    /* Every cache age: one timer, whoever calls. */
    if (all || now >= atomic_load_explicit(&ss_purge_next, memory_order_relaxed)) {
        atomic_store_explicit(&ss_purge_next, now + hak_cfg.age_ms, memory_order_relaxed);
        any = ss_purge_pass(all);
    }
    hak_unlock(&ss_purge_lock);
    return any;
}

uint64_t ss_age_next(void) {
    /* After the bell was armed: see ss_release. */
    atomic_thread_fence(memory_order_seq_cst);
    ss_purge(false);
    return atomic_load_explicit(&ss_dirty, memory_order_relaxed)
               ? atomic_load_explicit(&ss_purge_next, memory_order_relaxed)
               : UINT64_MAX;
}

void ss_fork_prepare(void) {
    pthread_mutex_lock(&ss_purge_lock);
    pthread_mutex_lock(&ss_lock);
}
void ss_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    pthread_mutex_unlock(&ss_lock);
    pthread_mutex_unlock(&ss_purge_lock);
}

void ss_get_stats(struct ss_stats *st) {
    hak_lock(&ss_lock);
    *st = ss_st;
    hak_unlock(&ss_lock);
    ss_flush_counts(); /* this thread's counts, published */
    st->stage1 = atomic_load_explicit(&ss_counts[SC_STAGE1], memory_order_relaxed);
    st->stage2_reclass = atomic_load_explicit(&ss_counts[SC_RECLASS], memory_order_relaxed);
    st->releases = atomic_load_explicit(&ss_counts[SC_RELEASES], memory_order_relaxed);
    st->purged = atomic_load_explicit(&ss_counts[SC_PURGED], memory_order_relaxed);
    int64_t carved = atomic_load_explicit(&ss_carved, memory_order_relaxed);
    st->carved_bytes = carved > 0 ? (uint64_t)carved : 0; /* (others' carves may be pending) */
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void ss_collect(enum tier_collect kind, struct tier_done *done) {
    switch (kind) {
    case COLLECT_AGE:
        tier_released(done, ss_purge(false));
        break;
    case COLLECT_IDLE:
        tier_due(done, ss_age_next());
        break;
    case COLLECT_TRIM: /* after Tiny gave back its empty slabs */
        tier_released(done, ss_trim());
        tier_released(done, ss_purge(true));
        break;
    default:
        break;
    }
}

static void ss_tier_stats(struct tier_stats *s) {
    struct ss_stats t;
    ss_get_stats(&t);
    s->mapped += t.live * HAK_REGION_SIZE;
    s->carved += t.carved_bytes;
    tier_row(s, "slot.stage1_empty_same", t.stage1);
    tier_row(s, "slot.stage2_unused", t.stage2);
    tier_row(s, "slot.stage2_empty_other", t.stage2_reclass);
    tier_row(s, "slot.stage3_cached_ss", t.stage3_cache);
    tier_row(s, "slot.stage3_new_ss", t.stage3_os);
    tier_row(s, "slot.releases", t.releases);
    tier_row(s, "ss.live", t.live);
    tier_row(s, "ss.cached", t.cached);
    tier_row(s, "ss.retired", t.retired);
    tier_row(s, "ss.unmapped", t.unmapped);
    tier_row(s, "slot.purged", t.purged);
}

const struct tier_ops ss_tier = {.name = "superslab",
                                 .collect = ss_collect,
                                 .fork_prepare = ss_fork_prepare,
                                 .fork_release = ss_fork_release,
                                 .stats = ss_tier_stats};
