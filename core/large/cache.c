/* Large tier: where freed mappings wait to be used again, and the tier's
 * malloc and free, which take them and put them there. The BigCache (its
 * shards and entries: taking, splitting, merging, ageing, shedding), the
 * profiler's spares, the threads' own caches (large_tc_*), and what looks
 * at all of them: large_age_next, large_trim, the fork hooks and
 * large_get_stats. large_alloc and large_free are here, with the caches,
 * so that what they call of them stays inlined in them; and realloc's
 * growth over a cached mapping (large_grow_into_cached), for the same
 * reason. */
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

/* BigCache: freed mappings kept for reuse, at most LARGE_CACHE_N a shard
 * and hak_cfg.bigcache_bytes together. A request takes the smallest one that
 * holds it and leaves the rest, from the first region boundary past the
 * request on, in the cache (the same pages, still resident: no fault when a
 * later request takes it); or, when none is big enough, grows the biggest
 * one with mremap, so that only the new part takes page faults. An entry
 * unused for hak_cfg.bigcache_age_ms is decommitted (its pages go, the
 * mapping stays for reuse), and after twice that it is unmapped: the ages
 * are looked at on the tier's own calls, by the background thread
 * (large_age_next) and on malloc_trim. */
#define LARGE_CACHE_N 64

/* The BigCache is sharded: LARGE_SHARDS caches, each with its own lock and
 * LARGE_CACHE_N entries, and every thread puts what it frees into its own
 * shard (its home: handed out in turn, at its first look; what is taken
 * out of a thread's own cache by another thread goes to the owner's).
 * Threads whose big blocks miss their own caches (large_tc) each take a
 * lock of their own, not one that every thread takes, on a line no other
 * thread writes. A request takes from its home first, then from the
 * others that hold anything (a look at their counts without their locks).
 * The bound, hak_cfg.bigcache_bytes, is for all of them together: a put
 * pushes out its home's least recently put entries first, then the other
 * shards' (the one whose oldest was freed first), never its own. The parts
 * of a split mapping merge again within a shard only. Ages are looked at
 * in every shard at once, every quarter age, by whichever call comes first
 * (large_age_look). A single thread's frees all go to its one shard (the
 * profiler's spares, which a later look moves to the BigCache, go to the
 * looker's). */
#define LARGE_SHARDS 16

struct large_cache {
    _Alignas(64) pthread_mutex_t lock;
    size_t bytes; /* mapped bytes of all entries */
    uint32_t n;   /* entries, in no order */
    uint64_t decommits;
    uint64_t seq; /* frees so far */
    /* n, bytes and when the least recently freed entry was freed
     * (UINT64_MAX: none) as of the last unlock: what other threads' looks
     * read without the lock (large_shard_unlock). */
    _Atomic uint32_t glance_n;
    _Atomic size_t glance_bytes;
    _Atomic uint64_t glance_oldest_ms; /* (its large_cache_oldest's) */
    struct large_entry e[LARGE_CACHE_N];
};
static struct large_cache large_caches[LARGE_SHARDS] = {
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

static inline void large_shard_lock(struct large_cache *lc) {
    hak_lock(&lc->lock);
}

static uint32_t large_cache_oldest(const struct large_cache *lc);

static inline void large_shard_unlock(struct large_cache *lc) {
    uint64_t oldest = lc->n > 0 ? lc->e[large_cache_oldest(lc)].freed_ms : UINT64_MAX;
    atomic_store_explicit(&lc->glance_n, lc->n, memory_order_relaxed);
    atomic_store_explicit(&lc->glance_bytes, lc->bytes, memory_order_relaxed);
    atomic_store_explicit(&lc->glance_oldest_ms, oldest, memory_order_relaxed);
    hak_unlock(&lc->lock);
}

/* Whether shard lc may hold anything (read without its lock). */
static inline bool large_shard_any(struct large_cache *lc) {
    return atomic_load_explicit(&lc->glance_n, memory_order_relaxed) != 0;
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
static uint32_t large_cache_oldest(const struct large_cache *lc) {
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
    uint64_t age = hak_cfg.bigcache_age_ms;
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
static uint64_t large_spare_age(uint64_t now);            /* (the spares: below) */
static uint64_t large_tc_age_all(bool all, uint64_t now); /* (the threads' caches: below) */

/* Decommit or unmap what large_cache_scan or large_cache_room took out of
 * shard lc; decommitted entries go back into it. */
static void large_cache_retire(struct large_cache *lc, const struct large_entry *out, uint32_t n) {
    if (n == 0) return; /* the usual case: no need of the clock */
    uint64_t now = hak_now_ms();
    bool any = false;
    for (uint32_t i = 0; i < n; i++) {
        struct large_entry e = out[i];
        if (e.freed_ms == 0 || e.decommitted || now - e.freed_ms >= 2 * hak_cfg.bigcache_age_ms) {
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
static void large_shard_age(struct large_cache *lc, uint64_t now) {
    struct large_entry old[LARGE_CACHE_N];
    if (!large_shard_any(lc)) return;
    large_shard_lock(lc);
    uint32_t n = large_cache_scan(lc, now, old);
    large_shard_unlock(lc);
    large_cache_retire(lc, old, n);
}

/* When the ages were last looked at (large_age_look, large_age_next). */
static _Atomic uint64_t large_looked_ms;

/* Every quarter age at most (the looks are not free; every call with an age
 * under 4 ms), the first of the tier's calls past it looks at the ages of
 * every shard, of the spares and, with `tcs`, of the threads' own caches. */
static void large_age_look(uint64_t now, bool tcs) {
    uint64_t quarter = hak_cfg.bigcache_age_ms / 4,
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
static void large_cache_put(struct large_hdr *h) {
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

/* Spares: the mappings of freed sampled blocks that are not Large (a small
 * block the profiler moved here), kept for the next such sample out of the
 * BigCache's way. Samples come at a steady rate (one per HAKMEM_PROF_SAMPLE
 * bytes), each one a mapping: through the BigCache (a scan of its entries
 * and their ages, merges with neighbours) a sample's mapping cost more than
 * its stack walk. At most LARGE_SPARES of them and LARGE_SPARE_BYTES
 * together (nor more than the BigCache may hold, nor more than it, with
 * them, by 2 MiB). Unused for the age, they go to the BigCache, to age
 * there: at the tier's look at its ages, or the background thread's. A trim
 * unmaps them. */
#define LARGE_SPARES      8
#define LARGE_SPARE_BYTES ((size_t)2 << 20)

static struct {
    hak_spin lock;
    uint32_t n;
    size_t bytes; /* mapped bytes of all of them */
    struct large_hdr *h[LARGE_SPARES];
    size_t room[LARGE_SPARES]; /* large_room of each: the search reads no header */
    /* When one was last put here (hak_now_ms); 0 with none. Unused for
     * hak_cfg.bigcache_age_ms, they go to the BigCache (large_spare_age). */
    uint64_t used_ms;
} large_spares = {.lock = HAK_SPIN_INIT};

/* A spare with at least `room` bytes of room, and not more than twice as
 * many: the smallest; NULL when none. */
struct large_hdr *large_spare_take(size_t room) {
    hak_spin_lock(&large_spares.lock);
    uint32_t best = LARGE_SPARES;
    size_t best_room = SIZE_MAX;
    for (uint32_t i = 0; i < large_spares.n; i++) {
        size_t r = large_spares.room[i];
        if (r >= room && r / 2 <= room && r < best_room) {
            best = i;
            best_room = r;
        }
    }
    struct large_hdr *h = NULL;
    if (best != LARGE_SPARES) {
        h = large_spares.h[best];
        large_spares.n--;
        large_spares.h[best] = large_spares.h[large_spares.n];
        large_spares.room[best] = large_spares.room[large_spares.n];
        large_spares.bytes -= h->map_size;
        if (large_spares.n == 0) large_spares.used_ms = 0; /* nothing to age */
    }
    hak_spin_unlock(&large_spares.lock);
    return h;
}

/* Keep freed mapping h as a spare; false when there is no room for it. */
static bool large_spare_put(struct large_hdr *h) {
    hak_spin_lock(&large_spares.lock);
    size_t most =
        LARGE_SPARE_BYTES < hak_cfg.bigcache_bytes ? LARGE_SPARE_BYTES : hak_cfg.bigcache_bytes;
    bool room = large_spares.n < LARGE_SPARES && large_spares.bytes + h->map_size <= most;
    if (room) {
        large_spares.h[large_spares.n] = h;
        large_spares.room[large_spares.n++] = large_room(h);
        large_spares.bytes += h->map_size;
        large_spares.used_ms = hak_now_ms();
    }
    hak_spin_unlock(&large_spares.lock);
    if (room) bell_ring(); /* memory to age (large_age_next) */
    return room;
}

/* Every spare out: into *out (LARGE_SPARES of room); how many. */
static uint32_t large_spare_drain(struct large_hdr **out) {
    hak_spin_lock(&large_spares.lock);
    uint32_t n = large_spares.n;
    memcpy(out, large_spares.h, n * sizeof *out);
    large_spares.n = 0;
    large_spares.bytes = 0;
    large_spares.used_ms = 0;
    hak_spin_unlock(&large_spares.lock);
    large_sampled_out(n);
    return n;
}

/* The spares go to the BigCache, to age there. */
static void large_spare_flush(void) {
    struct large_hdr *h[LARGE_SPARES];
    uint32_t n = large_spare_drain(h);
    for (uint32_t i = 0; i < n; i++)
        large_cache_put(h[i]);
}

/* The spares, unused for the age at `now`, go to the BigCache; when they are
 * due to, UINT64_MAX with none. On the tier's own calls (the BigCache's
 * look at its ages) and the background thread's. */
static uint64_t large_spare_age(uint64_t now) {
    hak_spin_lock(&large_spares.lock); /* (the look the bell's promise needs: bell.h) */
    uint64_t used = large_spares.used_ms;
    hak_spin_unlock(&large_spares.lock);
    if (used == 0) return UINT64_MAX;
    /* (now was read before the lock: a put since may be later.) */
    if (used >= now || now - used < hak_cfg.bigcache_age_ms) return used + hak_cfg.bigcache_age_ms;
    large_spare_flush();
    return UINT64_MAX;
}

/* ---- the threads' own caches ---------------------------------------------- */

/* Each thread keeps the last few mappings it freed, for its own next Large
 * mallocs: reused without the BigCache's lock (a malloc and a free of a big
 * buffer each took it, and scanned its 64 entries under it). At most
 * LARGE_TC_N of them, and HAKMEM_LARGE_TCACHE_MB together (but an eighth of
 * the BigCache's bound at most, and all threads' together half of it:
 * large_tc_granted), none bigger than half that; one pushed out
 * by a newer one goes to the BigCache with its time of free, all of them at
 * the thread's exit and on a malloc_trim.
 *
 * The caches are records any thread can reach, not thread-locals, so that
 * an idle thread's mappings still age: whoever looks at the BigCache's
 * ages (the tier's own calls, the background thread) takes the entries
 * unused for the age out of every record (large_tc_age_all) into the
 * BigCache, which decommits and unmaps them in turn; a malloc_trim takes
 * them all. Records are claimed from a fixed table at a thread's first
 * Large free and given back at its exit; a thread that gets none caches
 * nothing of its own.
 *
 * The owner's operations make no atomic read-modify-write and write only
 * the record's own lines: an asymmetric handshake with the rare drainer (the
 * ager, a trim). The owner marks itself busy (a plain store),
 * then reads its record's stop word; a drainer sets stop, makes every
 * running thread of the process pass a full barrier (membarrier, private
 * expedited: os_barrier) and then reads busy. So either the owner sees stop
 * (and leaves the record alone: its malloc or free goes to the BigCache) or
 * the drainer sees it busy (an ageing pass skips the record and comes back;
 * a trim waits: the owner's part inside is a few loads and stores, no call)
 * or both; never neither. Each has the record to itself in turn, and the
 * release and acquire of busy and stop order what each wrote in it. Where
 * the kernel has no membarrier (registered at the first claim) the owner's
 * store of busy is a sequentially consistent one (an exchange), as the
 * drainer's store of stop always is, and the drainer calls nothing
 * (large_tc_mode): an exchange a malloc or free, as before. (One exchange a
 * hit took the record's slot; the count build's local_1-4m made 1.0 of them
 * an op.) A fork child gives the records of threads it has not back
 * (large_fork_child). */
#define LARGE_TC_N       4
#define LARGE_TC_RECORDS 256
#define LARGE_TC_CHUNK   16 /* records a drainer stops at once */

/* How the owner's busy and the drainer's stop are ordered. */
enum { LARGE_TC_UNSET, LARGE_TC_MEMBARRIER, LARGE_TC_FENCE };
static _Atomic int large_tc_mode;

struct large_tc {
    /* The owner's line: busy and mode it writes, stop a drainer (rarely). */
    _Alignas(64) _Atomic uint32_t busy;
    _Atomic uint32_t stop;
    _Atomic bool claimed;
    int mode; /* large_tc_mode, when claimed */
    /* Whoever has the record (its owner between large_tc_enter and
     * large_tc_leave, or a drainer that stopped it and found it not busy).
     * The slots, their times and sizes are atomics (relaxed: plain loads
     * and stores) for the drainer's and large_get_stats' glimpses. */
    _Atomic(struct large_hdr *) slot[LARGE_TC_N];
    _Atomic uint64_t freed_ms[LARGE_TC_N];
    /* Each slot's map_size (the mapping may be a drainer's and gone by the
     * time another thread would read its header). */
    _Atomic size_t size[LARGE_TC_N];
    size_t room[LARGE_TC_N];  /* their large_room */
    uint64_t seq[LARGE_TC_N]; /* order of the frees (many share a ms) */
    uint64_t nput;
    size_t bytes; /* their sizes together */
    /* The owner's alone: */
    size_t credit; /* its share of large_tc_granted */
    uint32_t home; /* its owner's BigCache shard: where its entries go */
};
static struct large_tc large_tcs[LARGE_TC_RECORDS];
static __thread struct large_tc *large_my_tc;
/* One drainer at a time: it stops records and waits on them. */
static hak_spin large_tc_drain_lock = HAK_SPIN_INIT;

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
        if (large_tc_denied || (!hak_tc.open && !tc_thread_start()) || large_tls.batch == 0 ||
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
    uint64_t age = hak_cfg.bigcache_age_ms;
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
static uint64_t large_tc_age_all(bool all, uint64_t now) {
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
static void large_tc_give_back(struct large_tc *t) {
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
    if (!large_tc_put(h)) large_cache_put(h);
}

uint64_t large_age_next(void) {
    atomic_store_explicit(&large_looked_ms, hak_now_ms(), memory_order_relaxed);
    uint64_t next = large_spare_age(hak_now_ms());
    uint64_t tc_next = large_tc_age_all(false, hak_now_ms());
    if (tc_next < next) next = tc_next;
    /* What the shards keep: due when unused for the age (decommit), or
     * twice that (unmap: address space only, the pages went at the first). */
    uint64_t age = hak_cfg.bigcache_age_ms;
    for (uint32_t s = 0; s < LARGE_SHARDS; s++) {
        struct large_cache *lc = &large_caches[s];
        large_shard_age(lc, hak_now_ms());
        if (!large_shard_any(lc)) continue;
        large_shard_lock(lc);
        for (uint32_t i = 0; i < lc->n; i++) {
            uint64_t due = lc->e[i].freed_ms + (lc->e[i].decommitted ? 2 * age : age);
            if (due < next) next = due;
        }
        large_shard_unlock(lc);
    }
    return next;
}

bool large_trim(void) {
    large_tc_age_all(true, 0); /* every thread's own caches too */
    struct large_hdr *spare[LARGE_SPARES];
    uint32_t nspare = large_spare_drain(spare);
    for (uint32_t i = 0; i < nspare; i++)
        large_release(large_start(spare[i]), spare[i]->map_size);
    uint32_t n = 0;
    for (uint32_t s = 0; s < LARGE_SHARDS; s++) {
        struct large_cache *lc = &large_caches[s];
        struct large_entry all[LARGE_CACHE_N];
        large_shard_lock(lc);
        uint32_t k = lc->n;
        memcpy(all, lc->e, k * sizeof all[0]);
        lc->n = 0;
        lc->bytes = 0;
        large_shard_unlock(lc);
        for (uint32_t i = 0; i < k; i++)
            large_release(all[i].at, all[i].size);
        n += k;
    }
    return n + nspare > 0;
}

void large_fork_prepare(void) {
    hak_spin_lock(&large_tc_drain_lock); /* (no record is stopped while it is held) */
    hak_spin_lock(&large_spares.lock);
    for (uint32_t s = 0; s < LARGE_SHARDS; s++)
        pthread_mutex_lock(&large_caches[s].lock);
}
void large_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    for (uint32_t s = LARGE_SHARDS; s-- > 0;)
        pthread_mutex_unlock(&large_caches[s].lock);
    hak_spin_unlock(&large_spares.lock);
    hak_spin_unlock(&large_tc_drain_lock);
}

void large_fork_child(void) {
    /* The registration for membarrier is the parent's (a kernel may not
     * carry it over): again, or the fence with the exchange, set while this
     * is the only thread. */
    if (atomic_load_explicit(&large_tc_mode, memory_order_relaxed) == LARGE_TC_MEMBARRIER &&
        !os_barrier_register()) {
        atomic_store_explicit(&large_tc_mode, LARGE_TC_FENCE, memory_order_relaxed);
        if (large_my_tc) large_my_tc->mode = LARGE_TC_FENCE;
    }
    /* The records of the parent's other threads have no thread here (one
     * may have been inside its malloc or free, busy): their mappings go to
     * the BigCache and the records are given back. */
    for (uint32_t r = 0; r < LARGE_TC_RECORDS; r++) {
        struct large_tc *t = &large_tcs[r];
        if (t == large_my_tc || !atomic_load_explicit(&t->claimed, memory_order_relaxed)) continue;
        atomic_store_explicit(&t->stop, 0, memory_order_relaxed);
        large_tc_give_back(t);
    }
}

/* A published counter, never below 0 (see large_count). */
static uint64_t large_counted(int c) {
    int64_t v = atomic_load_explicit(&large_count[c], memory_order_relaxed);
    return v > 0 ? (uint64_t)v : 0;
}

void large_get_stats(struct large_stats *s) {
    large_publish(); /* (this thread's own changes: all of them) */
    s->allocs = large_counted(LC_ALLOCS);
    s->frees = large_counted(LC_FREES);
    s->cache_hits = large_counted(LC_HITS);
    s->remaps_inplace = large_counted(LC_INPLACE);
    s->remaps_moved = large_counted(LC_MOVED);
    /* (Published allocs and frees: frees of another thread's blocks may be
     * published first.) */
    s->live_blocks = s->allocs > s->frees ? s->allocs - s->frees : 0;
    s->live_bytes = large_counted(LC_LIVE_BYTES);
    hak_spin_lock(&large_spares.lock);
    s->cached_blocks = large_spares.n;
    s->cached_bytes = large_spares.bytes;
    hak_spin_unlock(&large_spares.lock);
    for (uint32_t r = 0; r < LARGE_TC_RECORDS; r++) { /* (racing their threads: a glimpse) */
        for (uint32_t i = 0; i < LARGE_TC_N; i++) {
            struct large_hdr *h = atomic_load_explicit(&large_tcs[r].slot[i], memory_order_relaxed);
            if (h == NULL) continue;
            s->cached_blocks++;
            s->cached_bytes += atomic_load_explicit(&large_tcs[r].size[i], memory_order_relaxed);
        }
    }
    s->cache_decommits = 0;
    for (uint32_t k = 0; k < LARGE_SHARDS; k++) {
        struct large_cache *lc = &large_caches[k];
        large_shard_lock(lc);
        s->cached_blocks += lc->n;
        s->cached_bytes += lc->bytes;
        s->cache_decommits += lc->decommits;
        large_shard_unlock(lc);
    }
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void large_collect(enum tier_collect kind, struct tier_done *done) {
    switch (kind) {
    case COLLECT_IDLE:
        tier_due(done, large_age_next());
        break;
    case COLLECT_TRIM:
        tier_released(done, large_trim());
        break;
    case COLLECT_EXIT:
        large_thread_exit();
        break;
    default:
        break; /* (the tier ages on its own calls) */
    }
}

static void large_tier_stats(struct tier_stats *s) {
    struct large_stats l;
    large_get_stats(&l);
    s->own_blocks += l.live_blocks;
    s->own_bytes += l.live_bytes;
    s->kept_bytes += l.cached_bytes;
    tier_row(s, "large.allocs", l.allocs);
    tier_row(s, "large.frees", l.frees);
    tier_row(s, "large.cache_hits", l.cache_hits);
    tier_row(s, "large.remaps_inplace", l.remaps_inplace);
    tier_row(s, "large.remaps_moved", l.remaps_moved);
    tier_row(s, "large.live_blocks", l.live_blocks);
    tier_row(s, "large.live_bytes", l.live_bytes);
    tier_row(s, "large.cached_blocks", l.cached_blocks);
    tier_row(s, "large.cached_bytes", l.cached_bytes);
    tier_row(s, "large.cache_decommits", l.cache_decommits);
}

const struct tier_ops large_tier = {.name = "large",
                                    .collect = large_collect,
                                    .thread_armed = large_thread_start,
                                    .fork_prepare = large_fork_prepare,
                                    .fork_release = large_fork_release,
                                    .fork_child = large_fork_child,
                                    .stats = large_tier_stats};
