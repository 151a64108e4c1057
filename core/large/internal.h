/* What the Large tier's files (core/large/: block.c, cache.c, growth.c,
 * sampled.c, spare.c, tier.c) share, each thing declared once; they alone
 * include it.
 *
 * Large tier. The header sits in the mapping's first page, at the start or
 * at a colour (large_place); every region of the mapping but the first is
 * marked TIER_LARGE with its distance back to the start, and the first with
 * the colour, so free finds the header from the pointer in O(1) and can
 * check that the pointer is the one it handed out. Every kernel mapping of
 * the tier ends in a guard page (LARGE_GUARD). */
#ifndef HAK_LARGE_INTERNAL_H
#define HAK_LARGE_INTERNAL_H

#include "large/large.h"

#include "box/lock.h"
#include "box/os.h"
#include "prof/prof.h"
#include "box/rmap.h"
#include "box/secret.h"
#include "box/usage.h"
#include "sizes.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LARGE_LIVE     0x4556494cu /* "LIVE" */
#define LARGE_FREE     0x45455246u /* "FREE" */
#define LARGE_HDR_SIZE ((size_t)64)

struct large_hdr {
    uint32_t magic;
    bool thp;        /* the mapping asked for huge pages */
    bool growing;    /* from large_alloc_growing: counted in large_growing_live */
    bool guarded;    /* the mapping's last page is a guard (LARGE_GUARD) */
    uint8_t sample;  /* enum large_sample */
    size_t offset;   /* from the header to the block (the pointer handed out) */
    size_t req;      /* the size last asked for */
    size_t map_size; /* bytes mapped from the mapping's start on */
    size_t ready;    /* bytes from the start on whose pages are (taken as) resident */
    uint64_t map;    /* the kernel mapping it is (part of): see large_entry */
    /* The heap profiler's view (large_follow): the chance that the block is
     * sampled is that of the bytes its countdown passed over for it. */
    union {
        size_t drawn;         /* unsampled: those bytes */
        struct prof_rec *rec; /* sampled: its record, which counts them (NULL:
                               * there was no memory for one) */
    } prof;
};
/* What the heap profiler knows of a block. */
enum large_sample {
    LS_NONE,
    LS_LARGE, /* it has a record of it (prof_record) */
    LS_SMALL, /* and it is a small class's block it moved here (its drawn
               * bytes: the class size): its mapping counts in
               * large_sampled_small */
};
/* The 8 bytes below the block hold a canary (large_canary): a write before
 * the block (an underflow) reaches it before any field of the header, and
 * the fields a report needs come first, farthest from the block. */
_Static_assert(sizeof(struct large_hdr) <= LARGE_HDR_SIZE - 8, "the header and the canary fit");

/* The block of mapping h: the pointer handed out. */
HAK_INLINE void *large_user(const struct large_hdr *h) {
    return (uint8_t *)h + h->offset;
}

/* Header colours. Mappings start on region boundaries (2 MiB), so the
 * headers of all blocks, were each at its start, would share their address
 * bits below 2 MiB, and so would the parts of blocks growing side by side:
 * the CPU's caches and TLBs pick a set by those bits, and 64 buffers grown
 * by appends (append_64k), their headers read and their ends written at
 * every realloc, missed the TLB at every step (0.7x mimalloc's speed; with
 * 32 buffers, which fit the ways of one set, 1.1x). So a block at the
 * tier's own alignment has its header (and itself after it) at a colour:
 * one of LARGE_COLOURS cache lines of its first page, taken in turn within
 * the slack its last page leaves (no page more for it: jemalloc's random
 * offset costs one); a growing block, which has room to spare, also up to
 * 15 pages in (address space only: they are never touched). The first
 * region's entry names the colour (LARGE_FIRST | colour, in lines from the
 * start, or 0 for the start); the header of a block at a bigger alignment
 * is at the start. */
#define LARGE_COLOURS      64
#define LARGE_COLOUR_SIZE  ((size_t)64)
#define LARGE_PAGE_COLOURS 16
/* Region payload flag: the mapping's first region, its header's colour in
 * the low bits. Other regions' payloads (distances back) stay below it:
 * mappings are at most LARGE_MAP_MAX bytes. */
#define LARGE_FIRST   ((uint32_t)1 << 23)
#define LARGE_MAP_MAX ((size_t)(LARGE_FIRST - 1) << HAK_REGION_SHIFT)

/* The first region's payload for a header at `colour`. */
HAK_INLINE uint32_t large_first_payload(uint32_t colour) {
    return colour != 0 ? LARGE_FIRST | colour : 0;
}
_Static_assert(LARGE_PAGE_COLOURS *HAK_PAGE_SIZE + LARGE_COLOURS * LARGE_COLOUR_SIZE <
                   HAK_REGION_SIZE / 16,
               "a header in the first region, a growing block with room");

/* The start of h's mapping: the region h is in. */
HAK_INLINE uint8_t *large_start(const struct large_hdr *h) {
    return (uint8_t *)((uintptr_t)h & ~(HAK_REGION_SIZE - 1));
}

/* h's colour: its distance from the start, in lines. */
HAK_INLINE uint32_t large_colour_of(const struct large_hdr *h) {
    return (uint32_t)(((uintptr_t)h & (HAK_REGION_SIZE - 1)) / LARGE_COLOUR_SIZE);
}

/* Bytes from the start of h's mapping to its block. */
HAK_INLINE size_t large_lead(const struct large_hdr *h) {
    return ((uintptr_t)h & (HAK_REGION_SIZE - 1)) + h->offset;
}

HAK_INLINE uint64_t *large_canary(const void *user) {
    return (uint64_t *)user - 1;
}

/* The canary's value: from the per-process secret, every byte's high bit
 * set, so that no byte of text or small number written over it matches its
 * byte there (the report names the farthest byte written: one that matched
 * would be missed). */
HAK_INLINE uint64_t large_canary_value(void) {
    return hak_secret() | 0x8080808080808080ull;
}

/* Every kernel mapping the tier makes ends in a guard page: a block's
 * linear overflow faults there, at the latest, instead of running into the
 * next mapping (and a block above it that underflows stops there too).
 * Address space only. The part of a mapping that holds it (`guarded`) may
 * use the mapping up to it: its room (large_room). It stays while the
 * mapping is cached, and where the cache splits a mapping the rest keeps it:
 * taking, splitting, merging and growing over a cached rest make no call.
 * The parts of one mapping (a block cut from a bigger freed one, and the
 * rest, which another block may take) have none between them. It is taken
 * away before the mapping is resized or moved (mremap refuses a range that
 * mprotect split, and a guard inside would stay there), and added at the
 * new end. */
#define LARGE_GUARD HAK_PAGE_SIZE

/* Kernel mappings made so far (block.c). */
extern HAK_HIDDEN _Atomic uint64_t large_maps;

/* The guard page of a mapping of `size` bytes at `start`. */
HAK_INLINE void *large_guard_page(const void *start, size_t size) {
    return (uint8_t *)start + size - LARGE_GUARD;
}

/* The bytes a mapping of `size` may hold a block in: all but its guard
 * page, if `guarded`. */
HAK_INLINE size_t large_room_of(size_t size, bool guarded) {
    return size - (guarded ? LARGE_GUARD : 0);
}

HAK_INLINE size_t large_room(const struct large_hdr *h) {
    return large_room_of(h->map_size, h->guarded);
}

static inline uint64_t large_map_id(void) {
    return atomic_fetch_add_explicit(&large_maps, 1, memory_order_relaxed) + 1;
}

/* Blocks from large_alloc_growing live now (growth.c: LARGE_GROWING_MAX). */
extern HAK_HIDDEN _Atomic uint32_t large_growing_live;

/* A freed mapping in the BigCache (cache.c). */
struct large_entry {
    uint8_t *at; /* the mapping's start (its header: unreadable once decommitted) */
    size_t size;
    uint64_t freed_ms; /* when it was freed; 0: to be unmapped */
    uint64_t seq;      /* order of the frees in its shard (many share a millisecond) */
    uint32_t shard;    /* the shard it is (or was last) in: its seq is that one's */
    /* The kernel mapping (large_map, or a move) it is part of: only parts
     * of one merge again, since mremap refuses a range over two. */
    uint64_t map;
    bool decommitted;
    bool thp;        /* the mapping asked for huge pages */
    bool guarded;    /* its last page is a guard */
    uint16_t colour; /* its header's (kept for its next block, if it fits) */
};

/* The tier's counters. A thread adds its changes to its own copy and
 * publishes them (an atomic add per counter changed) every LARGE_BATCH
 * changes, once its live bytes not published pass LARGE_PUBLISH_BYTES
 * either way (a huge block shows at once, in mallinfo2 too), before it
 * reads them, and at its exit: an atomic on a line every thread writes cost
 * ~5 ns, a sampled small block (a Large block per sample) made seven, and
 * a malloc and free of a few MiB published all of them each time (9
 * atomics a pair, 7 on this one line, when the bound was 256 KiB). A
 * malloc and free make 5 changes (allocs, hits, frees and live bytes twice)
 * and publish 4 counters: every 1024 changes is 0.02 atomics a pair (every
 * 64, with the live blocks a counter of their own, was 0.45: the count
 * build's local_1-4m). The live blocks are the allocs less the frees. Until
 * then another thread's reading misses a running thread's latest changes,
 * up to ~400 blocks and 64 MiB. Signed: a thread's published frees of
 * blocks another thread allocated may come before that thread's publishing
 * of them. */
enum { LC_ALLOCS, LC_FREES, LC_HITS, LC_INPLACE, LC_MOVED, LC_LIVE_BYTES, LC_N };
#define LARGE_BATCH         1024
#define LARGE_PUBLISH_BYTES ((int64_t)64 << 20)
/* (Both defined in block.c.) */
extern HAK_HIDDEN _Atomic int64_t large_count[LC_N];
struct large_tls {
    int64_t d[LC_N];
    uint32_t changes;
    /* LARGE_BATCH while the thread's exit hook publishes the rest
     * (large_thread_start), 0 (at once) before and after. */
    uint32_t batch;
};
extern HAK_HIDDEN __thread struct large_tls large_tls;

static inline void large_publish(void) {
    for (int c = 0; c < LC_N; c++)
        if (large_tls.d[c] != 0) {
            atomic_fetch_add_explicit(&large_count[c], large_tls.d[c], memory_order_relaxed);
            large_tls.d[c] = 0;
        }
    large_tls.changes = 0;
}

static inline void large_add(int c, int64_t d) {
    large_tls.d[c] += d;
    int64_t live = large_tls.d[LC_LIVE_BYTES];
    if (++large_tls.changes >= large_tls.batch || live > LARGE_PUBLISH_BYTES ||
        live < -LARGE_PUBLISH_BYTES)
        large_publish();
}

/* The live blocks' mappings grew by d bytes (shrank, when negative): they
 * are what the tier has in use (box/usage.h). */
static inline void large_live_add(int64_t d) {
    large_add(LC_LIVE_BYTES, d);
    usage_add(d);
}

/* Alignment of the mapping itself: regions at least, more for big requests. */
static inline size_t large_map_align(size_t align) {
    return align > HAK_REGION_SIZE ? align : HAK_REGION_SIZE;
}

static inline size_t large_offset(size_t align) {
    return align > LARGE_HDR_SIZE ? align : LARGE_HDR_SIZE;
}

/* Register the mapping of `size` bytes at `start` in the region map, its
 * header at `colour`; false when it is too big or a leaf cannot be mapped
 * (nothing marked). Once marked, a range's leaves exist: marking it again
 * cannot fail. */
static inline bool large_mark(void *start, size_t size, uint32_t colour) {
    /* (The first region's entry in one store: a live block's stays its.) */
    return size <= LARGE_MAP_MAX &&
           rmap_mark_span_from(start, size, TIER_LARGE, large_first_payload(colour));
}

static inline void large_release(void *start, size_t size) {
    rmap_clear_span(start, size);
    os_unmap(start, size);
}

/* h's mapping now has `size` bytes, its last page a guard if `guarded`.
 * `resident`: the pages added came with theirs. The pages of a block that
 * is not growing are all taken as resident (large_populate is for growing
 * ones); a growing block's ready shrinks with its room, and grows only over
 * resident pages right after it. */
static inline void large_set_map_size(struct large_hdr *h, size_t size, bool guarded,
                                      bool resident) {
    size_t was = large_room(h);
    h->map_size = size;
    h->guarded = guarded;
    size_t room = large_room(h);
    if (!h->growing || (resident && h->ready == was) || h->ready > room) h->ready = room;
}

/* The mappings of sampled small blocks, live or spare (sampled.c:
 * LARGE_SAMPLED_MAX). */
extern HAK_HIDDEN _Atomic uint32_t large_sampled_small;

/* n mappings of sampled small blocks are no longer (see above). */
static inline void large_sampled_out(uint32_t n) {
    atomic_fetch_sub_explicit(&large_sampled_small, n, memory_order_relaxed);
}

/* h, a sampled block, is freed or reallocated: its sample goes. True when
 * it was a small block (moved here by the profiler): its mapping is still
 * counted in large_sampled_small. */
static inline bool large_unsample(struct large_hdr *h) {
    prof_forget(h->prof.rec);
    bool small = h->sample == LS_SMALL;
    h->sample = LS_NONE;
    return small;
}

/* large_follow's rare parts (sampled.c). */
__attribute__((cold, noinline)) void *large_sample_follows(struct large_hdr *h, void *p, size_t n);
__attribute__((cold, noinline)) void *large_countdown_passed(struct large_hdr *h, void *p, size_t n,
                                                             size_t more);

/* Block p, header h, n bytes now after a realloc (the same block, resized
 * in place or its pages moved; or a new one, drawn 0): the profiler's view
 * of it follows; p. Its chance to have been sampled is that of the bytes
 * drawn for it. A sampled block keeps its record, at its new address and
 * size. An unsampled one that grows past those bytes has the countdown
 * pass over the new ones. The process being one over bytes, either way the
 * chance is then that of all its bytes allocated at once, and each byte was
 * drawn once: a buffer grown a little at a time is sampled as often as its
 * bytes say (drawn whole at every step, as a new allocation, it would be
 * sampled at nearly every step once past HAKMEM_PROF_SAMPLE). Only tail
 * calls: a realloc in place saves no registers for it. */
HAK_INLINE void *large_follow(struct large_hdr *h, void *p, size_t n) {
    if (hak_unlikely(h->sample != LS_NONE)) return large_sample_follows(h, p, n);
    size_t more = n > h->prof.drawn ? n - h->prof.drawn : 0;
    h->prof.drawn += more;
    /* (prof_bytes_due, its call a tail call.) */
    return prof_bytes_count(more) ? large_countdown_passed(h, p, n, more) : p;
}

/* (block.c) */
__attribute__((noreturn, noinline, cold)) void
large_reject(const void *p, const struct large_hdr *h, const char *fn);

/* The header of the mapping p is in (region entry TIER_LARGE). */
HAK_INLINE struct large_hdr *large_mapping_of(const void *p, uint32_t entry) {
    uint32_t pl = rmap_payload(entry);
    uintptr_t base = rmap_region_base(p);
    /* The first region names the colour; any other, its distance back to
     * the start (a header there: a block at a bigger alignment's; for a
     * pointer into a coloured one's, a line that says no block). */
    if (pl & LARGE_FIRST)
        return (struct large_hdr *)(base + (pl - LARGE_FIRST) * LARGE_COLOUR_SIZE);
    return (struct large_hdr *)(base - ((uintptr_t)pl << HAK_REGION_SHIFT));
}

HAK_INLINE bool large_hdr_live(const struct large_hdr *h, const void *p) {
    return h->magic == LARGE_LIVE && large_user(h) == p && *large_canary(p) == large_canary_value();
}

/* The live header for p, or abort naming p. Inlined: realloc of a growing
 * buffer is this and a compare. */
HAK_INLINE struct large_hdr *large_header(const void *p, uint32_t entry, const char *fn) {
    struct large_hdr *h = large_mapping_of(p, entry);
    if (hak_unlikely(!large_hdr_live(h, p))) large_reject(p, h, fn);
    return h;
}

/* ---- what one file has that another calls ---------------------------------- */

/* block.c */
struct large_hdr *large_map(size_t size, size_t map_align, bool thp, uint32_t colour);
void large_guard(struct large_hdr *h);
bool large_drop_guard(uint8_t *start, size_t *size, bool *guarded, uint32_t colour);
uint32_t large_colour_for(size_t off, size_t size, size_t room, bool growing, uint32_t keep);
void *large_open(struct large_hdr *h, size_t off, size_t size, bool growing, bool zero,
                 size_t clean);

/* cache.c: the tier's malloc and free, and the caches they take from */
void large_tc_release(void);
void *large_alloc_as(size_t size, size_t align, bool zero, bool growing);

/* ---- the BigCache (cache.c) ------------------------------------------------- */

/* BigCache: freed mappings kept for reuse, at most LARGE_CACHE_N a shard
 * and hak_cfg.bigcache_bytes together. A request takes the smallest one that
 * holds it and leaves the rest, from the first region boundary past the
 * request on, in the cache (the same pages, still resident: no fault when a
 * later request takes it); or, when none is big enough, grows the biggest
 * one with mremap, so that only the new part takes page faults. An entry
 * unused for hak_cfg.age_ms is decommitted (its pages go, the
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
extern HAK_HIDDEN struct large_cache large_caches[LARGE_SHARDS];
/* When the ages were last looked at (large_age_look, large_age_next). */
extern HAK_HIDDEN _Atomic uint64_t large_looked_ms;

/* The least recently put entry of shard lc. Lock held, lc->n > 0. */
uint32_t large_cache_oldest(const struct large_cache *lc);

static inline void large_shard_lock(struct large_cache *lc) {
    hak_lock(&lc->lock);
}

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

/* Shard lc's entries past their age decommitted or unmapped. */
void large_shard_age(struct large_cache *lc, uint64_t now);
/* Keep h, freed now, for reuse (in this thread's shard). */
void large_cache_put(struct large_hdr *h);
bool large_grow_into_cached(struct large_hdr *h, size_t pages);

/* ---- the spares (spare.c) --------------------------------------------------- */

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

struct large_spares {
    hak_spin lock;
    uint32_t n;
    size_t bytes; /* mapped bytes of all of them */
    struct large_hdr *h[LARGE_SPARES];
    size_t room[LARGE_SPARES]; /* large_room of each: the search reads no header */
    /* When one was last put here (hak_now_ms); 0 with none. Unused for
     * hak_cfg.age_ms, they go to the BigCache (large_spare_age). */
    uint64_t used_ms;
};
extern HAK_HIDDEN struct large_spares large_spares;

struct large_hdr *large_spare_take(size_t room);
/* Keep freed mapping h as a spare; false when there is no room for it. */
bool large_spare_put(struct large_hdr *h);
/* Every spare out: into *out (LARGE_SPARES of room); how many. */
uint32_t large_spare_drain(struct large_hdr **out);
/* The spares unused for the age go to the BigCache; when they are due to,
 * UINT64_MAX with none. */
uint64_t large_spare_age(uint64_t now);

/* ---- the threads' own caches (cache.c) ------------------------------------- */

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
extern HAK_HIDDEN _Atomic int large_tc_mode;

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
extern HAK_HIDDEN struct large_tc large_tcs[LARGE_TC_RECORDS];
extern HAK_HIDDEN __thread struct large_tc *large_my_tc;
/* One drainer at a time: it stops records and waits on them. */
extern HAK_HIDDEN hak_spin large_tc_drain_lock;

/* Every thread's cache's entries unused for the age (all with `all`) to
 * the BigCache; when the next of those left is due. */
uint64_t large_tc_age_all(bool all, uint64_t now);
/* Record t's entries to the BigCache and the record given back. */
void large_tc_give_back(struct large_tc *t);

#endif
