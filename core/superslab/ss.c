/* SuperSlab slot management. Everything here runs on slow paths (a slab
 * acquired or given back per tens to thousands of blocks), under one lock. */
#include "superslab/ss.h"

#include "box/arena.h"
#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/usage.h"
#include "sizeclass.h"

#include <pthread.h>
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

static pthread_mutex_t ss_lock = PTHREAD_MUTEX_INITIALIZER;
static struct superslab *ss_partial;            /* SuperSlabs with an UNUSED slot */
static struct ss_slab *ss_empty[TINY_NCLASSES]; /* EMPTY slabs by class */
static struct superslab *ss_cache;              /* all-empty, decommitted */
static struct ss_stats ss_st;
static uint8_t ss_epoch; /* ss_purge passes, mod 256 */
/* ms: when the next timed pass is due. Written under the lock, read without
 * it too (a pass not due costs no lock). */
static _Atomic uint64_t ss_purge_next;
/* An EMPTY slot may still hold pages: a later pass has work (ss_age_next). */
static bool ss_dirty;
/* Bytes carved in slabs not reset since. Carves are counted per thread and
 * published in batches (box/usage.h): a carve runs on every core, and a
 * counter line written by all of them on each would be a shared write per
 * carve. Resets and retires, under the lock, go straight to it. */
static _Atomic int64_t ss_carved;
static __thread int64_t ss_carved_pending;

void ss_note_carved(size_t bytes) {
    usage_batch_add(&ss_carved, &ss_carved_pending, (int64_t)bytes, USAGE_BATCH_SLACK);
}

void ss_flush_counts(void) {
    usage_batch_flush(&ss_carved, &ss_carved_pending);
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
    atomic_fetch_sub_explicit(&ss_carved, (int64_t)s->carved * s->size, memory_order_relaxed);
    s->free = NULL;
    atomic_store_explicit(&s->remote, NULL, memory_order_relaxed);
    s->div_mul = (uint32_t)(((uint64_t)1 << 32) / size + 1);
    s->size = (uint16_t)size;
    s->capacity = (uint16_t)(SS_SLOT_SIZE / size);
    ss_set_carved(s, 0);
    s->used = 0;
    s->cls = (uint8_t)cls;
}

/* Place for one more SuperSlab in the range: a given-back one, else the next
 * one past the used extent, growing the range when it is full. 0 when it
 * cannot grow; no more tries then until malloc_trim (or an allocation that
 * failed) gave something back, so a full range costs no syscall per slab.
 * Lock held. */
static uintptr_t ss_range_take(void) {
    uintptr_t base = atomic_load_explicit(&ss_bounds.base, memory_order_relaxed);
    size_t span = atomic_load_explicit(&ss_bounds.span, memory_order_relaxed);
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
        atomic_store_explicit(&ss_bounds.base, base, memory_order_relaxed);
        atomic_store_explicit(&ss_bounds.span, span, memory_order_relaxed);
    }
    ss_range_used += SS_SIZE;
    return base + ss_range_used - SS_SIZE;
}

/* The place of a SuperSlab given back to the OS (or never mapped) is free
 * again. Lock held. */
static void ss_range_put(uintptr_t a) {
    size_t i = (a - atomic_load_explicit(&ss_bounds.base, memory_order_relaxed)) / SS_SIZE;
    ss_range_free[i / 64] |= 1ull << (i % 64);
    ss_range_nfree++;
}

/* A fresh SuperSlab with every slot UNUSED, or NULL. Lock held. */
static struct superslab *ss_map(void) {
    uintptr_t a = ss_range_take();
    if (a == 0) return NULL;
    if (!os_commit((void *)a, SS_SIZE)) {
        ss_range_put(a);
        return NULL;
    }
    struct superslab *ss = (struct superslab *)a;
    for (uint32_t i = 0; i < SS_NSLOTS; i++)
        atomic_store_explicit(&ss->slab[i].owner, SS_NO_OWNER, memory_order_relaxed);
    return ss;
}

/* Give a SuperSlab back to the OS; its place stays in the range, read-only
 * and zero. Lock held. */
static void ss_unmap(struct superslab *ss) {
    os_uncommit(ss, SS_SIZE);
    ss_range_put((uintptr_t)ss);
    ss_st.live--;
    ss_st.unmapped++;
}

/* Take an UNUSED slot of a partial SuperSlab. Lock held; ss_partial set. */
static struct ss_slab *ss_take_unused(uint32_t cls, uint32_t size) {
    struct superslab *ss = ss_partial;
    uint32_t i = (uint32_t)__builtin_ctz(ss->unused_mask);
    ss->unused_mask &= ~(1u << i);
    if (ss->unused_mask == 0) ss_unlink(&ss_partial, ss);
    ss->nactive++;
    ss_slab_reset(&ss->slab[i], cls, size);
    return &ss->slab[i];
}

struct ss_slab *ss_acquire(uint32_t cls, uint32_t size) {
    struct ss_slab *s = NULL;
    hak_lock(&ss_lock);
    if ((s = ss_empty[cls]) != NULL) {
        /* Stage 1: this class's own empty slab, blocks already carved. */
        ss_slab_unlink(&ss_empty[cls], s);
        ss_of(s)->nempty--;
        ss_of(s)->nactive++;
        ss_st.stage1++;
    } else if (ss_partial) {
        s = ss_take_unused(cls, size); /* stage 2 */
        ss_st.stage2++;
    } else {
        for (uint32_t c = 0; c < TINY_NCLASSES && s == NULL; c++) {
            if ((s = ss_empty[c]) == NULL) continue;
            /* Stage 2, recycled: another class's empty slab, re-cut. */
            ss_slab_unlink(&ss_empty[c], s);
            ss_of(s)->nempty--;
            ss_of(s)->nactive++;
            ss_slab_reset(s, cls, size);
            ss_st.stage2_reclass++;
        }
        if (s == NULL) {
            /* Stage 3: a cached SuperSlab (its pages fault back in as
             * zeroes), else a new one. */
            struct superslab *ss = ss_cache;
            if (ss) {
                ss_unlink(&ss_cache, ss);
                ss_st.cached--;
                ss_st.stage3_cache++;
            } else if ((ss = ss_map()) != NULL) {
                ss_st.live++;
                ss_st.stage3_os++;
            }
            if (ss) {
                ss->unused_mask = SS_ALL_SLOTS;
                ss_push(&ss_partial, ss);
                s = ss_take_unused(cls, size);
            }
        }
    }
    if (s) s->state = SS_ACTIVE;
    hak_unlock(&ss_lock);
    return s;
}

/* Every slot of ss is back: reset them and cache or unmap it. Lock held. */
static void ss_retire(struct superslab *ss) {
    for (uint32_t i = SS_FIRST_SLOT; i < SS_NSLOTS; i++) {
        struct ss_slab *s = &ss->slab[i];
        if (s->state == SS_EMPTY) ss_slab_unlink(&ss_empty[s->cls], s);
        atomic_fetch_sub_explicit(&ss_carved, (int64_t)s->carved * s->size, memory_order_relaxed);
        ss_set_carved(s, 0);
        s->state = SS_UNUSED;
    }
    if (ss->unused_mask) ss_unlink(&ss_partial, ss);
    ss->unused_mask = SS_ALL_SLOTS;
    ss->nempty = 0;
    ss_st.retired++;
    /* Cached: the header slot kept, the 31 data slots' pages given back, so
     * they are cut again from zeroes. Pages that cannot go (locked) would
     * keep the old cuts' bytes and free marks: such a SuperSlab is unmapped. */
    if (ss_st.cached < hak_cfg.ss_cache &&
        os_decommit((uint8_t *)ss + SS_SLOT_SIZE, SS_SIZE - SS_SLOT_SIZE)) {
        ss_push(&ss_cache, ss);
        ss_st.cached++;
    } else {
        ss_unmap(ss);
    }
}

static bool ss_age_locked(void);

void ss_release(struct ss_slab *s) {
    struct superslab *ss = ss_of(s);
    hak_lock(&ss_lock);
    atomic_store_explicit(&s->owner, SS_NO_OWNER, memory_order_relaxed);
    s->state = SS_EMPTY;
    s->epoch = ss_epoch;
    ss_slab_push(&ss_empty[s->cls], s);
    ss->nactive--;
    ss->nempty++;
    ss_st.releases++;
    ss_dirty = true;
    if (ss->nactive == 0) ss_retire(ss);
    ss_age_locked(); /* slots released are the ones a later pass finds empty */
    hak_unlock(&ss_lock);
    bell_ring();
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
    size_t span = atomic_load_explicit(&ss_bounds.span, memory_order_relaxed);
    if (used == span) return false;
    /* The range ends first, then its tail goes: a free of a stale pointer
     * there finds it outside instead of reading an unmapped descriptor. */
    atomic_store_explicit(&ss_bounds.span, used, memory_order_relaxed);
    if (arena_ss_shrink(used)) return true;
    atomic_store_explicit(&ss_bounds.span, span, memory_order_relaxed); /* refused: it stays */
    return false;
}

bool ss_trim(void) {
    bool any = false;
    hak_lock(&ss_lock);
    ss_range_stuck = false; /* memory was given back: the range may grow again */
    while (ss_cache) {
        struct superslab *ss = ss_cache;
        ss_unlink(&ss_cache, ss);
        ss_unmap(ss);
        ss_st.cached--;
        any = true;
    }
    any |= ss_range_shrink();
    hak_unlock(&ss_lock);
    return any;
}

/* Slots ss_purge decommits per pass: the calls run under the lock. */
#define SS_PURGE_BATCH 1024

/* Lock held. */
static bool ss_purge_locked(bool all) {
    uint32_t n = 0, max = all ? UINT32_MAX : SS_PURGE_BATCH;
    bool left = false; /* a slot empty since this pass only */
    for (uint32_t cls = 0; cls < TINY_NCLASSES && n < max; cls++) {
        for (struct ss_slab *s = ss_empty[cls]; s && n < max; s = s->next) {
            /* Empty since an earlier pass, and still holding carved blocks
             * (a slot purged before is carved 0: nothing of it is resident). */
            if (s->carved == 0) continue;
            if (s->epoch == ss_epoch && !all) {
                left = true;
                continue;
            }
            if (!os_decommit(ss_slab_base(s), SS_SLOT_SIZE)) continue; /* locked pages */
            atomic_fetch_sub_explicit(&ss_carved, (int64_t)s->carved * s->size,
                                      memory_order_relaxed);
            s->free = NULL; /* its links went with the pages */
            ss_set_carved(s, 0);
            n++;
        }
    }
    ss_epoch++;
    ss_st.purged += n;
    ss_dirty = left || n >= max; /* (slots whose pages are locked stay as they are) */
    return n > 0;
}

/* A pass when one is due (every cache age: one timer, whoever calls).
 * Lock held. */
static bool ss_age_locked(void) {
    uint64_t now = hak_now_ms();
    if (now < atomic_load_explicit(&ss_purge_next, memory_order_relaxed)) return false;
    atomic_store_explicit(&ss_purge_next, now + hak_cfg.bigcache_age_ms, memory_order_relaxed);
    return ss_purge_locked(false);
}

bool ss_purge(bool all) {
    /* Nothing due: not even the lock. */
    if (!all && hak_now_ms() < atomic_load_explicit(&ss_purge_next, memory_order_relaxed))
        return false;
    hak_lock(&ss_lock);
    bool any = all ? ss_purge_locked(true) : ss_age_locked();
    hak_unlock(&ss_lock);
    return any;
}

uint64_t ss_age_next(void) {
    hak_lock(&ss_lock);
    ss_age_locked();
    uint64_t next =
        ss_dirty ? atomic_load_explicit(&ss_purge_next, memory_order_relaxed) : UINT64_MAX;
    hak_unlock(&ss_lock);
    return next;
}

void ss_fork_prepare(void) {
    pthread_mutex_lock(&ss_lock);
}
void ss_fork_release(void) {
    pthread_mutex_unlock(&ss_lock);
}

void ss_get_stats(struct ss_stats *st) {
    hak_lock(&ss_lock);
    *st = ss_st;
    hak_unlock(&ss_lock);
    ss_flush_counts(); /* this thread's carves, published */
    int64_t carved = atomic_load_explicit(&ss_carved, memory_order_relaxed);
    st->carved_bytes = carved > 0 ? (uint64_t)carved : 0; /* (others' carves may be pending) */
}
