/* Large tier: where freed mappings wait to be used again, and the tier's
 * malloc and free, which take them and put them there: the BigCache (its
 * shards and entries: taking, splitting, merging, ageing, shedding) and the
 * threads' own caches (large_tc_*). large_alloc and large_free are here,
 * with the caches, so that what they call of them stays inlined in them (a
 * 2 MiB malloc+free pair took 20 more instructions with the BigCache in a
 * file of its own); and realloc's growth over a cached mapping
 * (large_grow_into_cached), for the same reason. The spares are spare.c's;
 * what looks at every cache at once (ageing, trim, fork, figures) is
 * tier.c's. */
#include "large/internal.h"

#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/rmap.h"
#include "box/tier.h"
#include "sizes.h"
#include "tcache.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* Take the guard page of the mapping of `size` bytes at `start` away
 * where it is, if *guarded (a merge: the page is inside the merged mapping); false
 * when refused: the page may still fault, so the mapping may not be merged.
 * (Before a mapping grows, moves or is trimmed: large_drop_guard.) */
static bool large_clear_guard(void *start, size_t size, bool *guarded) {
    if (*guarded && !os_guard_remove(large_guard_page(start, size), LARGE_GUARD)) return false;
    *guarded = false;
    return true;
}

HAK_HIDDEN struct large_cache large_caches[LARGE_SHARDS] = {
    [0 ... LARGE_SHARDS - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER, .glance_oldest_ms = UINT64_MAX}};

/* Threads given a home shard so far. */
static _Atomic uint32_t large_homes;
static __thread uint32_t large_home_at; /* this thread's home shard + 1; 0: none yet */

static uint32_t large_home_index(void) {
    if (hak_unlikely(large_home_at == 0))
        large_home_at =
            atomic_fetch_add_explicit(&large_homes, 1, memory_order_relaxed) % LARGE_SHARDS + 1;
    return large_home_at - 1;
}

/* Bytes the shards other than lc (all of them with NULL) hold, as of their
 * last unlocks. */
static size_t large_others_bytes(const struct large_cache *lc) {
    size_t b = 0;
    for (uint32_t s = 0; s < LARGE_SHARDS; s++)
        if (&large_caches[s] != lc)
            b += atomic_load_explicit(&large_caches[s].glance_bytes, memory_order_relaxed);
    return b;
}

/* Remove entry i. Lock held. */
static struct large_entry large_cache_remove(struct large_cache *lc, uint32_t i) {
    struct large_entry e = lc->e[i];
    lc->e[i] = lc->e[--lc->n];
    lc->bytes -= e.size;
    return e;
}

/* The least recently put entry (by its shard's order: an entry pushed out
 * of a thread's cache is new here). Lock held, lc->n > 0. */
uint32_t large_cache_oldest(const struct large_cache *lc) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < lc->n; i++)
        if (lc->e[i].seq < lc->e[best].seq) best = i;
    return best;
}

/* Make room in shard lc for `size` more bytes and one more entry,
 * evicting its least recently put into out[] (to be unmapped); the bytes
 * of the other shards count towards the bound (what they hold past it is
 * large_cache_shed's). Lock held; how many. */
static uint32_t large_cache_room(struct large_cache *lc, size_t size, struct large_entry *out) {
    size_t others = large_others_bytes(lc);
    uint32_t n = 0;
    while (lc->n > 0 &&
           (lc->n == LARGE_CACHE_N || others + lc->bytes + size > hak_cfg.bigcache_bytes)) {
        out[n] = large_cache_remove(lc, large_cache_oldest(lc));
        out[n++].freed_ms = 0;
    }
    return n;
}

static void large_cache_insert(struct large_cache *lc, struct large_entry e) {
    e.shard = (uint32_t)(lc - large_caches);
    lc->e[lc->n++] = e;
    lc->bytes += e.size;
}

/* Entries past their age: out of the cache into out[] (to be decommitted or
 * unmapped outside the lock by large_cache_retire); how many. Lock held. */
static uint32_t large_cache_scan(struct large_cache *lc, uint64_t now, struct large_entry *out) {
    uint64_t age = hak_cfg.age_ms;
    uint32_t n = 0;
    for (uint32_t i = 0; i < lc->n;) {
        uint64_t idle = now - lc->e[i].freed_ms;
        if (idle >= 2 * age || (idle >= age && !lc->e[i].decommitted))
            out[n++] = large_cache_remove(lc, i);
        else
            i++;
    }
    return n;
}

static void large_cache_merge(struct large_cache *lc, struct large_entry *e);
static void large_cache_shed(const struct large_cache *home);

/* Decommit or unmap what large_cache_scan or large_cache_room took out of
 * shard lc; decommitted entries go back into it. */
static void large_cache_retire(struct large_cache *lc, const struct large_entry *out, uint32_t n) {
    if (n == 0) return; /* the usual case: no need of the clock */
    uint64_t now = hak_now_ms();
    bool any = false;
    for (uint32_t i = 0; i < n; i++) {
        struct large_entry e = out[i];
        if (e.freed_ms == 0 || e.decommitted || now - e.freed_ms >= 2 * hak_cfg.age_ms) {
            large_release(e.at, e.size);
            continue;
        }
        if (!os_decommit(e.at, e.size)) { /* locked (mlockall): its pages cannot go */
            large_release(e.at, e.size);
            continue;
        }
        /* Back in, as old as it was; dropped if the cache filled meanwhile. */
        bool kept = false;
        e.decommitted = true;
        large_shard_lock(lc);
        large_cache_merge(lc, &e); /* with decommitted neighbours */
        if (lc->n < LARGE_CACHE_N &&
            large_others_bytes(lc) + lc->bytes + e.size <= hak_cfg.bigcache_bytes) {
            large_cache_insert(lc, e);
            lc->decommits++;
            kept = true;
        }
        large_shard_unlock(lc);
        if (!kept) large_release(e.at, e.size);
        any |= kept;
    }
    if (any) large_cache_shed(lc); /* (a put into another shard meanwhile) */
}

/* Shard lc's entries past their age decommitted or unmapped. */
void large_shard_age(struct large_cache *lc, uint64_t now) {
    struct large_entry old[LARGE_CACHE_N];
    if (!large_shard_any(lc)) return;
    large_shard_lock(lc);
    uint32_t n = large_cache_scan(lc, now, old);
    large_shard_unlock(lc);
    large_cache_retire(lc, old, n);
}

/* When the ages were last looked at (large_age_look, large_age_next). */
HAK_HIDDEN _Atomic uint64_t large_looked_ms;

/* Every quarter age at most (the looks are not free; every call with an age
 * under 4 ms), the first of the tier's calls past it looks at the ages of
 * every shard, of the spares and, with `tcs`, of the threads' own caches. */
static void large_age_look(uint64_t now, bool tcs) {
    uint64_t quarter = hak_cfg.age_ms / 4,
             last = atomic_load_explicit(&large_looked_ms, memory_order_relaxed);
    if (quarter > 0 &&
        (now <= last || now - last < quarter ||
         !atomic_compare_exchange_strong_explicit(&large_looked_ms, &last, now,
                                                  memory_order_relaxed, memory_order_relaxed)))
        return;
    for (uint32_t s = 0; s < LARGE_SHARDS; s++)
        large_shard_age(&large_caches[s], now);
    large_spare_age(now);
    if (tcs) large_tc_age_all(false, now);
}

/* What all shards hold, as of their last unlocks. After a put's unlock, a
 * sequentially consistent fence between its own glance's store and these
 * loads: of two puts at once, one sees the other's entry at least (each
 * seeing only its own, both could pass the bound and leave it passed). */
static size_t large_cache_total(void) {
    atomic_thread_fence(memory_order_seq_cst);
    return large_others_bytes(NULL);
}

/* The shards together past the bound after a put into `home` (which made
 * what room its own entries could): the other shards' least recently put
 * entries out (the shard whose oldest was freed first), and unmapped. */
static void large_cache_shed(const struct large_cache *home) {
    while (large_cache_total() > hak_cfg.bigcache_bytes) {
        struct large_cache *from = NULL;
        uint64_t first = UINT64_MAX;
        for (uint32_t s = 0; s < LARGE_SHARDS; s++) {
            struct large_cache *lc = &large_caches[s];
            uint64_t ms = atomic_load_explicit(&lc->glance_oldest_ms, memory_order_relaxed);
            if (lc != home && large_shard_any(lc) && ms <= first) first = ms, from = lc;
        }
        if (from == NULL) return; /* (the home alone: its put made the room it could) */
        struct large_entry e = {0};
        large_shard_lock(from);
        if (from->n > 0) e = large_cache_remove(from, large_cache_oldest(from));
        large_shard_unlock(from);
        if (e.at != NULL) large_release(e.at, e.size);
    }
}

/* Merge into *e the cached entries right before and after it in address
 * space that are parts of the same kernel mapping with pages in the same
 * state (decommitted or not, huge or not): the parts a split made come
 * together again. Lock held. */
static void large_cache_merge(struct large_cache *lc, struct large_entry *e) {
    for (uint32_t i = 0; i < lc->n;) {
        struct large_entry *c = &lc->e[i];
        bool before = c->at + c->size == e->at;
        bool after = e->at + e->size == c->at;
        /* The lower one's guard would be inside (a call, under the lock:
         * merges are rare). */
        if (c->map != e->map || c->decommitted != e->decommitted || c->thp != e->thp ||
            (!before && !after) ||
            (before ? !large_clear_guard(c->at, c->size, &c->guarded)
                    : !large_clear_guard(e->at, e->size, &e->guarded))) {
            i++;
            continue;
        }
        struct large_entry n = large_cache_remove(lc, i);
        if (before) {
            e->at = n.at;
            e->colour = n.colour;
        } else {
            e->guarded = n.guarded;
        }
        e->size += n.size;
        if (n.seq > e->seq) e->seq = n.seq;
        if (n.freed_ms > e->freed_ms) e->freed_ms = n.freed_ms;
        i = 0; /* the merged range may touch another */
    }
}

/* Put a mapping (whole, or the rest of a split one) into shard lc. */
static void large_cache_add_to(struct large_cache *lc, struct large_entry e) {
    struct large_entry old[LARGE_CACHE_N];
    if (e.size > hak_cfg.bigcache_bytes) {
        large_release(e.at, e.size);
        return;
    }
    large_shard_lock(lc);
    /* (A split-off rest keeps its place, in the shard whose order it has.) */
    bool fresh = e.seq == 0 || e.shard != (uint32_t)(lc - large_caches);
    large_cache_merge(lc, &e);
    if (e.size > hak_cfg.bigcache_bytes) {
        large_shard_unlock(lc);
        large_release(e.at, e.size);
        return;
    }
    uint32_t nold = large_cache_room(lc, e.size, old);
    if (fresh) e.seq = ++lc->seq; /* the newest, whatever it merged with */
    large_cache_insert(lc, e);
    large_shard_unlock(lc);
    large_cache_retire(lc, old, nold); /* syscalls outside the lock */
    large_cache_shed(lc);
    bell_ring();
    large_age_look(hak_now_ms(), false);
}

/* What a split leaves of entry e from offset `keep` (a region multiple) on:
 * cached as an entry of its own, its regions pointing to its own header
 * (the part before may be moved or unmapped while it waits: a stale
 * pointer into it must still find a mapped header). */
/* Put it into this thread's shard. */
static void large_cache_add(struct large_entry e) {
    large_cache_add_to(&large_caches[large_home_index()], e);
}

static void large_cache_add_rest(struct large_entry e, size_t keep) {
    uint8_t *rest = e.at + keep;
    large_mark(rest, e.size - keep, 0); /* cannot fail: the leaves exist */
    e.at = rest;
    e.colour = 0;
    e.size -= keep;
    large_cache_add(e);
}

/* The cached entry to serve `need` bytes of room at `map_align`: the smallest one
 * with its pages that is big enough (for a request below a region, at most
 * 4x bigger); else the biggest one with its pages (grown by the caller);
 * else the smallest decommitted one big enough. With
 * `small_pages`, only mappings without huge pages (a block to grow in place:
 * a huge page would make 2 MiB resident for its first byte). Lock held;
 * LARGE_CACHE_N when there is none. */
static uint32_t large_cache_pick(const struct large_cache *lc, size_t need, size_t map_align,
                                 bool small_pages, bool *fits_now) {
    uint32_t fit = LARGE_CACHE_N, grow = LARGE_CACHE_N, cold = LARGE_CACHE_N;
    for (uint32_t i = 0; i < lc->n; i++) {
        const struct large_entry *e = &lc->e[i];
        if (((uintptr_t)e->at & (map_align - 1)) != 0 || (small_pages && e->thp)) continue;
        /* A request below a region (with its guard page, were it fresh)
         * would keep a whole region of a bigger entry (a split leaves
         * region-aligned parts): not more than 4x. */
        if (need + LARGE_GUARD < HAK_REGION_SIZE && e->size / 4 > need + LARGE_GUARD) continue;
        bool fits = large_room_of(e->size, e->guarded) >= need;
        if (e->decommitted) {
            if (fits && (cold == LARGE_CACHE_N || e->size < lc->e[cold].size)) cold = i;
        } else if (fits) {
            if (fit == LARGE_CACHE_N || e->size < lc->e[fit].size) fit = i;
        } else if (grow == LARGE_CACHE_N || e->size > lc->e[grow].size) {
            grow = i;
        }
    }
    *fits_now = fit != LARGE_CACHE_N;
    return fit != LARGE_CACHE_N ? fit : grow != LARGE_CACHE_N ? grow : cold;
}

/* large_cache_pick over the shards: the home's first, then the others that
 * hold anything. A mapping that fits with its pages is taken from the first
 * shard that has one; else what the rule picks in the first shard that has
 * anything for the request (a growth or decommitted pages). Size 0 when
 * there is none. */
static struct large_entry large_cache_pick_any(size_t need, size_t map_align, bool small_pages) {
    uint32_t home = large_home_index();
    bool others = false;
    for (uint32_t s = 0; s < LARGE_SHARDS && !others; s++)
        others = s != home && large_shard_any(&large_caches[s]);
    struct large_entry got = {0};
    /* (Alone in its home, a shard's pick is the whole rule: one pass.) */
    for (int pass = others ? 0 : 1; pass < 2; pass++) {
        for (uint32_t k = 0; k < LARGE_SHARDS; k++) {
            struct large_cache *lc = &large_caches[(home + k) % LARGE_SHARDS];
            if (k > 0 && (!others || !large_shard_any(lc))) continue;
            bool fits;
            large_shard_lock(lc);
            uint32_t i = large_cache_pick(lc, need, map_align, small_pages, &fits);
            if (i != LARGE_CACHE_N && (fits || pass == 1)) got = large_cache_remove(lc, i);
            large_shard_unlock(lc);
            if (got.at != NULL) return got;
        }
    }
    return got;
}

/* A cached mapping with at least `need` bytes of room at `map_align` (see
 * large_cache_pick for `small_pages`), its regions marked for it and its
 * map_size, thp and guarded set, or NULL. One that must grow gets its
 * guard page past `need` (so a whole-regions `need` keeps its last huge
 * page). *clean: bytes from this offset on read as zero (pages
 * decommitted, or added by growth), and before it the pages are taken as
 * resident (a grown mapping's old guard page too: a hint only); it may pass
 * the map_size of a split one. */
static struct large_hdr *large_cache_take(size_t need, size_t map_align, bool small_pages,
                                          size_t *clean) {
    struct large_entry got = large_cache_pick_any(need, map_align, small_pages);
    large_age_look(hak_now_ms(), true);
    if (got.at == NULL) return NULL;

    uint8_t *start = got.at;
    *clean = got.decommitted ? 0 : got.size;
    bool grown = large_room_of(got.size, got.guarded) < need;
    if (grown) {
        /* Grown where it is, or its pages moved to a new mapping; its guard
         * page would be inside. */
        if (!large_drop_guard(start, &got.size, &got.guarded, got.colour)) {
            large_release(start, got.size);
            return NULL;
        }
        need += LARGE_GUARD;
        int saved = errno; /* a refusal is no failure of malloc */
        if (os_resize(start, got.size, need)) {
            if (got.thp) os_hugepages(start, need); /* the part added too */
        } else {
            /* (The move keeps the moved mapping's own huge-page setting.) */
            uint8_t *dst = (uint8_t *)large_map(need, map_align, false, 0);
            rmap_clear_span(start, got.size);
            if (dst == NULL || !os_move(start, got.size, need, dst)) {
                /* (mremap refuses a range of two merged mappings.) */
                if (dst) large_release(dst, need);
                large_mark(start, got.size, got.colour); /* cannot fail: the leaves exist */
                large_cache_add(got);
                errno = saved;
                return NULL;
            }
            start = dst;
            got.map = large_map_id(); /* a kernel mapping of its own now */
        }
        errno = saved;
        got.size = need;
    } else {
        /* The rest past the next region boundary stays cached, pages and
         * all, as a mapping of its own (with the guard page). */
        size_t keep = hak_align_up(need, HAK_REGION_SIZE);
        if (got.size > keep && got.size - keep >= HAK_REGION_SIZE) {
            large_cache_add_rest(got, keep);
            got.size = keep;
            got.guarded = false;
        }
    }
    /* Its regions may have pointed to the header of the mapping it was cut
     * from. Cannot fail: their leaves exist (or the growth made them). */
    if (!large_mark(start, got.size, got.colour)) {
        large_release(start, got.size);
        return NULL;
    }
    struct large_hdr *h = (struct large_hdr *)(start + got.colour * LARGE_COLOUR_SIZE);
    h->map_size = got.size;
    h->map = got.map;
    h->thp = got.thp;
    h->guarded = got.guarded;
    if (grown) large_guard(h); /* (h->ready is set by the caller) */
    return h;
}

/* The cached mapping that starts at `at`, out of the cache if it has at
 * least `min` bytes and is part of kernel mapping `map` with the same
 * huge-page setting as `thp` (else the two would be kernel mappings of their
 * own, which mremap refuses as one); size 0 when there is none. */
static struct large_entry large_cache_claim(const void *at, size_t min, uint64_t map, bool thp) {
    uint32_t home = large_home_index();
    struct large_entry got = {0};
    for (uint32_t k = 0; k < LARGE_SHARDS; k++) {
        struct large_cache *lc = &large_caches[(home + k) % LARGE_SHARDS];
        if (k > 0 && !large_shard_any(lc)) continue;
        bool found = false;
        large_shard_lock(lc);
        for (uint32_t i = 0; i < lc->n && !found; i++) {
            if (lc->e[i].at != at) continue;
            found = true;
            if (lc->e[i].size >= min && lc->e[i].map == map && lc->e[i].thp == thp)
                got = large_cache_remove(lc, i);
        }
        large_shard_unlock(lc);
        if (found) break;
    }
    return got;
}

/* Keep h, freed at `freed_ms`, for reuse. */
static void large_cache_put_at(struct large_hdr *h, uint64_t freed_ms, struct large_cache *lc) {
    large_cache_add_to(lc, (struct large_entry){.at = large_start(h),
                                                .colour = (uint16_t)large_colour_of(h),
                                                .size = h->map_size,
                                                .freed_ms = freed_ms,
                                                .map = h->map,
                                                .thp = h->thp,
                                                .guarded = h->guarded});
}

/* Keep h, freed now, for reuse. */
void large_cache_put(struct large_hdr *h) {
    large_cache_put_at(h, hak_now_ms(), &large_caches[large_home_index()]);
}

/* Grow h's room to `pages` over the cached mapping right after it, if
 * there is one big enough (what a split left of h's own mapping, typically:
 * no syscall, no fault for the pages it kept); what h does not need of it
 * stays cached, from the next region boundary on, with the guard page. */
bool large_grow_into_cached(struct large_hdr *h, size_t pages) {
    size_t old = h->map_size;
    /* (At least the room wanted, whether the rest has the guard page or
     * not.) */
    struct large_entry got =
        large_cache_claim(large_start(h) + old, pages - old + LARGE_GUARD, h->map, h->thp);
    if (got.size == 0) return false;
    size_t size = old + got.size, keep = hak_align_up(pages, HAK_REGION_SIZE);
    bool guarded = got.guarded;
    if (size > keep && size - keep >= HAK_REGION_SIZE) {
        got.at = large_start(h);
        got.colour = (uint16_t)large_colour_of(h);
        got.size = size;
        large_cache_add_rest(got, keep);
        size = keep;
        guarded = false;
    }
    /* Its regions pointed to its own header: now to h's. Cannot fail (the
     * leaves exist). */
    large_mark(large_start(h), size, large_colour_of(h));
    large_set_map_size(h, size, guarded, !got.decommitted);
    large_add(LC_INPLACE, 1);
    large_live_add((int64_t)size - (int64_t)old);
    return true;
}

/* ---- the threads' own caches ---------------------------------------------- */

HAK_HIDDEN _Atomic int large_tc_mode;

HAK_HIDDEN struct large_tc large_tcs[LARGE_TC_RECORDS];
HAK_HIDDEN __thread struct large_tc *large_my_tc;
/* One drainer at a time: it stops records and waits on them. */
HAK_HIDDEN hak_spin large_tc_drain_lock = HAK_SPIN_INIT;

static size_t large_tc_bound(void) {
    size_t b = hak_cfg.bigcache_bytes / 8;
    return b < hak_cfg.large_tcache_bytes ? b : hak_cfg.large_tcache_bytes;
}

/* large_tc_mode, registering for membarrier the first time. */
static int large_tc_mode_get(void) {
    int m = atomic_load_explicit(&large_tc_mode, memory_order_acquire);
    if (m != LARGE_TC_UNSET) return m;
    int want = os_barrier_register() ? LARGE_TC_MEMBARRIER : LARGE_TC_FENCE;
    if (atomic_compare_exchange_strong_explicit(&large_tc_mode, &m, want, memory_order_acq_rel,
                                                memory_order_acquire))
        return want;
    return m;
}

/* The owner takes its record: true unless a drainer has it (then leave it
 * alone: no large_tc_leave) or the owner has it already. */
static inline bool large_tc_enter(struct large_tc *t) {
    /* Busy already: a signal handler's malloc or free inside the owner's
     * (whose leave would end the outer one's hold): not for it. */
    if (hak_unlikely(atomic_load_explicit(&t->busy, memory_order_relaxed))) return false;
    if (hak_likely(t->mode == LARGE_TC_MEMBARRIER)) {
        atomic_store_explicit(&t->busy, 1, memory_order_relaxed);
        atomic_signal_fence(memory_order_seq_cst); /* (the drainer's membarrier orders it) */
    } else {
        atomic_store_explicit(&t->busy, 1, memory_order_seq_cst);
    }
    /* (seq_cst: as busy's, without membarrier; a plain load either way) */
    if (hak_likely(!atomic_load_explicit(&t->stop, memory_order_seq_cst))) return true;
    atomic_store_explicit(&t->busy, 0, memory_order_release);
    return false;
}

static inline void large_tc_leave(struct large_tc *t) {
    atomic_store_explicit(&t->busy, 0, memory_order_release);
}

/* Bytes the records hold the right to cache (each its bound when claimed):
 * together at most half the BigCache's bound, so that the threads'
 * caches, which take mappings out of everyone's reach, do not starve the
 * BigCache when many threads free big blocks (with 32 threads, each keeping
 * 16 MiB, the BigCache ran dry and every miss faulted fresh pages in: a
 * tenth of the throughput). */
static _Atomic size_t large_tc_granted;
static __thread bool large_tc_denied; /* no record for this thread: do not ask again */

/* A record for this thread, claimed at its first Large free (a thread that
 * never frees one holds no share), or NULL. */
static struct large_tc *large_tc_claim(void) {
    /* (want > 0: the caller has a mapping within half of it.) */
    size_t want = large_tc_bound(),
           g = atomic_load_explicit(&large_tc_granted, memory_order_relaxed);
    large_tc_denied = true;
    do {
        if (g + want > hak_cfg.bigcache_bytes / 2) return NULL;
    } while (!atomic_compare_exchange_weak_explicit(&large_tc_granted, &g, g + want,
                                                    memory_order_relaxed, memory_order_relaxed));
    int mode = large_tc_mode_get();
    for (uint32_t i = 0; i < LARGE_TC_RECORDS; i++) {
        bool free = false;
        if (!atomic_load_explicit(&large_tcs[i].claimed, memory_order_relaxed) &&
            atomic_compare_exchange_strong_explicit(&large_tcs[i].claimed, &free, true,
                                                    memory_order_acquire, memory_order_relaxed)) {
            large_tcs[i].credit = want;
            large_tcs[i].home = large_home_index();
            large_tcs[i].mode = mode;
            large_tc_denied = false;
            return large_my_tc = &large_tcs[i];
        }
    }
    atomic_fetch_sub_explicit(&large_tc_granted, want, memory_order_relaxed);
    return NULL;
}

/* Slot i of record t, which the caller has, emptied: its mapping. */
static struct large_hdr *large_tc_empty(struct large_tc *t, uint32_t i) {
    struct large_hdr *h = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
    atomic_store_explicit(&t->slot[i], NULL, memory_order_relaxed);
    t->bytes -= atomic_load_explicit(&t->size[i], memory_order_relaxed);
    return h;
}

/* Entries taken out of records to the BigCache (no record held). */
static void large_tc_to_bigcache(struct large_hdr *const *out, const uint64_t *out_ms,
                                 const uint32_t *out_home, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        large_cache_put_at(out[i], out_ms[i], &large_caches[out_home[i]]);
}

/* Keep freed mapping h in this thread's cache; false when it is not for it. */
static bool large_tc_put(struct large_hdr *h) {
    struct large_tc *t = large_my_tc;
    size_t size = h->map_size, bound = large_tc_bound();
    if (h->growing || size > bound / 2) return false;
    if (t == NULL) {
        /* A thread whose first calls are Large ones arms its exit hook here
         * (which gives the record back), as its first small free would. */
        if (large_tc_denied || (!tc_self.open && !tc_thread_start()) || large_tls.batch == 0 ||
            (t = large_tc_claim()) == NULL)
            return false;
    }
    if (bound > t->credit) bound = t->credit;
    if (size > bound / 2) return false;
    uint64_t now = hak_now_ms(); /* (before: no call while busy) */
    if (!large_tc_enter(t)) return false;
    /* Pushed out (the least recently freed first, until it fits): to the
     * BigCache once the record is left. */
    struct large_hdr *out[LARGE_TC_N];
    uint64_t out_ms[LARGE_TC_N];
    uint32_t out_home[LARGE_TC_N], nout = 0, at;
    for (;;) {
        uint32_t oldest = LARGE_TC_N;
        at = LARGE_TC_N;
        for (uint32_t i = 0; i < LARGE_TC_N; i++) {
            if (atomic_load_explicit(&t->slot[i], memory_order_relaxed) == NULL)
                at = i;
            else if (oldest == LARGE_TC_N || t->seq[i] < t->seq[oldest])
                oldest = i;
        }
        if (at != LARGE_TC_N && t->bytes + size <= bound) break;
        out_ms[nout] = atomic_load_explicit(&t->freed_ms[oldest], memory_order_relaxed);
        out_home[nout] = t->home;
        out[nout++] = large_tc_empty(t, oldest);
    }
    t->seq[at] = ++t->nput;
    t->room[at] = large_room(h);
    atomic_store_explicit(&t->size[at], size, memory_order_relaxed);
    t->bytes += size;
    atomic_store_explicit(&t->freed_ms[at], now, memory_order_relaxed);
    atomic_store_explicit(&t->slot[at], h, memory_order_relaxed);
    large_tc_leave(t);
    large_tc_to_bigcache(out, out_ms, out_home, nout);
    return true;
}

/* A mapping from this thread's cache with at least `need` bytes of room at
 * `map_align`, and not twice that (a bigger one is the BigCache's to
 * split): the smallest; NULL when there is none. */
static struct large_hdr *large_tc_take(size_t need, size_t map_align) {
    struct large_tc *t = large_my_tc;
    if (t == NULL || !large_tc_enter(t)) return NULL;
    uint32_t best = LARGE_TC_N;
    size_t best_room = SIZE_MAX;
    for (uint32_t i = 0; i < LARGE_TC_N; i++) {
        struct large_hdr *h = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
        if (h == NULL) continue;
        size_t room = t->room[i];
        if (((uintptr_t)large_start(h) & (map_align - 1)) == 0 && room >= need &&
            room / 2 <= need && room < best_room)
            best = i, best_room = room;
    }
    struct large_hdr *h = best != LARGE_TC_N ? large_tc_empty(t, best) : NULL;
    large_tc_leave(t);
    return h;
}

/* The drainer's barrier, between its stores of stop and its loads of busy:
 * after it, an owner that did not see its stop is seen busy. (Without
 * membarrier the four are sequentially consistent: ordered as they are.)
 * False when it failed (nothing may be taken). */
static bool large_tc_barrier(int mode) {
    return mode != LARGE_TC_MEMBARRIER || os_barrier();
}

/* An entry freed at `ms` is due at `now` (all of them with `all`); when it
 * is not, *next becomes its time if that is sooner. */
static bool large_tc_due(uint64_t ms, uint64_t now, bool all, uint64_t *next) {
    uint64_t age = hak_cfg.age_ms;
    if (all || (ms <= now && now - ms >= age)) return true;
    if (ms + age < *next) *next = ms + age;
    return false;
}

/* The due entries of record t (the caller has it) into out[*n] on, their
 * free times into out_ms, the record's shard into out_home. */
static void large_tc_take_due(struct large_tc *t, uint64_t now, bool all, uint64_t *next,
                              struct large_hdr **out, uint64_t *out_ms, uint32_t *out_home,
                              uint32_t *n) {
    for (uint32_t i = 0; i < LARGE_TC_N; i++) {
        if (atomic_load_explicit(&t->slot[i], memory_order_relaxed) == NULL) continue;
        uint64_t ms = atomic_load_explicit(&t->freed_ms[i], memory_order_relaxed);
        if (!large_tc_due(ms, now, all, next)) continue;
        out_ms[*n] = ms;
        out_home[*n] = t->home;
        out[(*n)++] = large_tc_empty(t, i);
    }
}

/* This thread holds large_tc_drain_lock: a signal handler's trim or
 * ageing inside it leaves the records to the next look (the lock would
 * never come free). */
static __thread bool large_tc_draining;

/* The entries of every thread's cache unused for the age at `now` (all of
 * them with `all`) to the BigCache, where they age on; when the next of
 * those left is due, UINT64_MAX with none (`now` for a record that was
 * busy: the next look takes it). A look at the records first (no barrier,
 * no lock when nothing is due: the ager runs every quarter age); then up to
 * LARGE_TC_CHUNK records with something to take are stopped at once, one
 * barrier for them, their entries taken out, and the records let go before
 * the entries go to the BigCache. With `all` (a trim) a busy record is
 * waited for. (Records given back are empty.) */
uint64_t large_tc_age_all(bool all, uint64_t now) {
    uint64_t next = UINT64_MAX;
    if (large_tc_draining) return now;
    for (uint32_t r = 0; r < LARGE_TC_RECORDS;) {
        struct large_tc *stopped[LARGE_TC_CHUNK];
        uint32_t ns = 0;
        for (; r < LARGE_TC_RECORDS && ns < LARGE_TC_CHUNK; r++) {
            struct large_tc *t = &large_tcs[r];
            if (!atomic_load_explicit(&t->claimed, memory_order_relaxed)) continue;
            bool due = false;
            for (uint32_t i = 0; i < LARGE_TC_N; i++)
                if (atomic_load_explicit(&t->slot[i], memory_order_relaxed) != NULL)
                    due |= large_tc_due(atomic_load_explicit(&t->freed_ms[i], memory_order_relaxed),
                                        now, all, &next);
            if (due) stopped[ns++] = t;
        }
        if (ns == 0) break;
        struct large_hdr *out[LARGE_TC_CHUNK * LARGE_TC_N];
        uint64_t out_ms[LARGE_TC_CHUNK * LARGE_TC_N];
        uint32_t out_home[LARGE_TC_CHUNK * LARGE_TC_N], nout = 0;
        int mode = large_tc_mode_get();
        hak_spin_lock(&large_tc_drain_lock);
        large_tc_draining = true;
        for (uint32_t k = 0; k < ns; k++)
            atomic_store_explicit(&stopped[k]->stop, 1, memory_order_seq_cst);
        bool barrier = large_tc_barrier(mode);
        for (uint32_t k = 0; k < ns && barrier; k++) {
            struct large_tc *t = stopped[k];
            bool busy;
            for (unsigned spins = 0;
                 (busy = atomic_load_explicit(&t->busy, memory_order_acquire)) != 0; spins++) {
                /* (its own record, busy: a signal handler inside the owner's
                 * hold; waiting would never end. Bounded for the others.) */
                if (!all || t == large_my_tc || spins > 4096) break;
                hak_backoff(spins);
            }
            if (busy) {
                next = now; /* (in its malloc or free now: the next look) */
                continue;
            }
            large_tc_take_due(t, now, all, &next, out, out_ms, out_home, &nout);
        }
        if (!barrier) next = now;
        for (uint32_t k = 0; k < ns; k++)
            atomic_store_explicit(&stopped[k]->stop, 0, memory_order_release);
        large_tc_draining = false;
        hak_spin_unlock(&large_tc_drain_lock);
        large_tc_to_bigcache(out, out_ms, out_home, nout);
    }
    return next;
}

/* Record t's entries to the BigCache and the record given back: its
 * thread's exit, or a fork child's for a thread it does not have. The
 * caller has it. */
void large_tc_give_back(struct large_tc *t) {
    struct large_hdr *out[LARGE_TC_N];
    uint64_t out_ms[LARGE_TC_N];
    uint32_t out_home[LARGE_TC_N], nout = 0;
    uint64_t next = UINT64_MAX;
    large_tc_take_due(t, 0, true, &next, out, out_ms, out_home, &nout);
    t->bytes = 0;
    large_tc_leave(t);
    large_tc_to_bigcache(out, out_ms, out_home, nout);
    atomic_fetch_sub_explicit(&large_tc_granted, t->credit, memory_order_relaxed);
    atomic_store_explicit(&t->claimed, false, memory_order_release);
}

/* This thread's record: emptied, and given back. */
void large_tc_release(void) {
    struct large_tc *t = large_my_tc;
    if (t == NULL) return;
    while (!large_tc_enter(t)) /* a drainer has it: a moment */
        syscall(SYS_sched_yield);
    large_my_tc = NULL;
    large_tc_give_back(t);
}

void *large_alloc_as(size_t size, size_t align, bool zero, bool growing) {
    size_t off = large_offset(align);
    /* (A mapping of room, guard page and region rounding fits LARGE_MAP_MAX.) */
    if (off > LARGE_MAP_MAX / 2 || size > LARGE_MAP_MAX - off - 2 * HAK_REGION_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    /* The block's room: its pages. A zero-size block still needs a byte of
     * its own: without it, a block at an alignment offset would start one
     * past its mapping. */
    size_t room = hak_align_up(off + (size ? size : 1), HAK_PAGE_SIZE);
    size_t map_align = large_map_align(align);
    bool thp = false;
    if (growing) {
        /* Room to grow in place to the end of its region (its mapping
         * there, guard page and all): address space only, its pages
         * untouched until used. */
        room = hak_align_up(room + LARGE_GUARD, HAK_REGION_SIZE) - LARGE_GUARD;
    } else if (hak_cfg.hugepages && room >= HAK_REGION_SIZE) {
        /* A mapping of whole regions is all huge pages, its last part too:
         * worth up to a quarter more address space (not under a limit on
         * it), which a huge page then makes resident as soon as any of it is
         * touched. */
        thp = true;
        size_t whole = hak_align_up(room, HAK_REGION_SIZE);
        if (whole != room && whole - room <= room / 4 && os_as_limit_recent() == SIZE_MAX)
            room = whole;
    }

    size_t clean = 0; /* fresh mappings are zero throughout */
    struct large_hdr *h = growing ? NULL : large_tc_take(room, map_align);
    if (h)
        clean = h->map_size; /* (its pages were used: taken as resident) */
    else
        h = large_cache_take(room, map_align, growing, &clean);
    if (h) {
        large_add(LC_HITS, 1);
        /* A small-pages mapping asks for huge pages now (not under an
         * address-space limit: there this made CPython's second fill in
         * tests/oom get 21% less, a cause not yet understood). */
        if (thp && !h->thp && os_as_limit_recent() == SIZE_MAX)
            h->thp = os_hugepages(large_start(h), h->map_size);
    } else {
        /* Room to grow costs 2 MiB of fresh address space: not under a limit
         * on it (looked up only here: it is a system call). */
        if (growing && os_as_limit() != SIZE_MAX) return NULL;
        /* (Its guard page past its room: out of its last huge page.) */
        uint32_t colour = large_colour_for(off, size, room, growing, 0);
        if ((h = large_map(room + LARGE_GUARD, map_align, thp, colour)) == NULL) return NULL;
        h->map_size = room + LARGE_GUARD;
        h->guarded = false;
        large_guard(h);
    }
    return large_open(h, off, size, growing, zero, clean);
}

void *large_alloc(size_t size, size_t align, bool zero) {
    return large_alloc_as(size, align, zero, false);
}

void large_free(void *p, uint32_t entry, const char *fn) {
    struct large_hdr *h = large_header(p, entry, fn);
    /* A sampled small block's mapping: kept for the next (a spare). */
    bool spare = hak_unlikely(h->sample != LS_NONE) && large_unsample(h);
    h->magic = LARGE_FREE;
    if (h->growing) atomic_fetch_sub_explicit(&large_growing_live, 1, memory_order_relaxed);
    large_add(LC_FREES, 1);
    large_live_add(-(int64_t)h->map_size);
    if (hak_unlikely(spare)) {
        if (large_spare_put(h)) return;
        large_sampled_out(1);
    }
    /* mallopt(M_MMAP_THRESHOLD): back at once, as glibc's mapped blocks go. */
    if (hak_unlikely(h->map_size >= hak_cfg.unmap_min)) {
        large_release(large_start(h), h->map_size);
        return;
    }
    if (!large_tc_put(h)) large_cache_put(h);
}
