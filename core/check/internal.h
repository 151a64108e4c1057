/* Checked tier, inside: what the files of core/check/ share, included by
 * them alone (check.h is the tier's interface). The region entry's payload,
 * the slot header, a big block's descriptor; the values from the secret and
 * the patterns painted and checked with them; what one file calls in
 * another; and chk_slab_canaries, slots.c's but inlined in verdict.c's
 * chk_inspect as when the tier was one file. The files:
 *   slots.c    slab regions, the per-thread slot caches and quarantine
 *   big.c      big blocks, a mapping each, and their quarantine
 *   zero.c     malloc(0)'s unique addresses
 *   verdict.c  one block whatever its kind, reports, the tier's interface */
#ifndef HAK_CHECK_INTERNAL_H
#define HAK_CHECK_INTERNAL_H

#include "check/check.h"

#include "box/diag.h"
#include "box/rmap.h"
#include "box/thread.h"
#include "sizeclass.h"

#include <pthread.h>
#include <stdatomic.h>

/* A region entry's payload: what the region holds in its low two bits; above
 * them a slab region's class, or how many regions back a mapping starts. */
enum { CHK_SLAB, CHK_BIG, CHK_ZERO };
static inline uint32_t chk_sub(uint32_t e) {
    return rmap_payload(e) & 3u;
}
static inline uint32_t chk_arg(uint32_t e) {
    return rmap_payload(e) >> 2;
}
static inline uint32_t chk_payload(uint32_t arg, uint32_t sub) {
    return arg << 2 | sub;
}

#define CHK_HDR      ((size_t)16)
#define CHK_SLOT_MAX ((size_t)128 << 10) /* bigger slots: a mapping each */

/* A slot's state. WIPING: its free has begun and is zeroing it (a second
 * free, or a look at the slot, takes it as freed; the walk at exit leaves
 * it alone). */
enum { CHK_LIVE = 1, CHK_FREED = 2, CHK_WIPING = 3 };

/* ---- values from the secret ---------------------------------------------- */

/* A full mix, for deriving the salts below once. */
static inline uint64_t chk_mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
/* From the secret at chk_start: one per use, so that no value serves as
 * another (a canary is no key); chk_hmul is odd. */
extern HAK_HIDDEN uint64_t chk_skey, chk_scanary, chk_slink, chk_hmul; /* verdict.c */

/* The per-address values below: one multiply each, on the hot path, where a
 * full mix was 17 of every pair's ~1000 instructions. Against a program's
 * bugs (not an attacker who reads memory) that is enough: a value depends
 * on every bit of the address and of the secret. */
static inline uint64_t chk_salted(uintptr_t a, uint64_t salt) {
    uint64_t x = (a ^ salt) * 0x9e3779b97f4a7c15ull;
    return x ^ x >> 32;
}
/* word0 is a slot's header xor this: a pointer whose "header" decodes to
 * nothing valid is no block. */
static inline uint64_t chk_key(uintptr_t slot) {
    return chk_salted(slot, chk_skey);
}
/* Canary bytes of a slot (or big mapping): the byte at address x is byte
 * x % 8 of this word. The high bits set: text and string terminators, the
 * commonest overflows, never match. */
static inline uint64_t chk_canary(uintptr_t slot) {
    return chk_salted(slot, chk_scanary) | 0x8080808080808080ull;
}

/* The 8 bytes at address a of the pattern w (byte x % 8 of w at address
 * x), as a little-endian word. */
static inline uint64_t chk_pattern_at(uint64_t w, uintptr_t a) {
    unsigned r = (unsigned)(a & 7) * 8;
    return w >> r | w << ((64 - r) & 63);
}
static inline uint64_t chk_load(uintptr_t a) {
    uint64_t v;
    __builtin_memcpy(&v, (const void *)a, 8); /* -fno-builtin: keeps it a move */
    return v;
}
static inline void chk_store(uintptr_t a, uint64_t v) {
    __builtin_memcpy((void *)a, &v, 8);
}

/* Fill [a, end) with the pattern w: unaligned words at both ends, aligned
 * ones between (canaries start and end anywhere). */
static inline void chk_paint(uintptr_t a, uintptr_t end, uint64_t w) {
    if (hak_unlikely(end - a < 8)) {
        for (; a < end; a++)
            *(uint8_t *)a = (uint8_t)(w >> (a & 7) * 8);
        return;
    }
    chk_store(a, chk_pattern_at(w, a));
    for (uintptr_t x = (a + 8) & ~(uintptr_t)7; x + 8 <= end; x += 8)
        chk_store(x, w);
    chk_store(end - 8, chk_pattern_at(w, end - 8));
}

/* The first byte at x of the word read v (pattern word p) that differs. */
static inline uintptr_t chk_first_diff(uintptr_t x, uint64_t v, uint64_t p) {
    return x + (uintptr_t)__builtin_ctzll(v ^ p) / 8;
}

/* The first byte of [a, end) that is not the pattern w; end when none. The
 * words are checked in address order, so the first difference found is the
 * first there is. (Static, not inline, as when the tier was one file: the
 * compiler keeps it out of line in each file that calls it, and inlines
 * chk_unpainted, below; `unused`: zero.c does not call it.) */
static __attribute__((unused)) uintptr_t chk_unpainted_long(uintptr_t a, uintptr_t end,
                                                            uint64_t w) {
    if (end - a < 8) {
        for (; a < end; a++)
            if (*(const uint8_t *)a != (uint8_t)(w >> (a & 7) * 8)) return a;
        return end;
    }
    uint64_t v = chk_load(a), p = chk_pattern_at(w, a);
    if (v != p) return chk_first_diff(a, v, p);
    uintptr_t x = (a + 8) & ~(uintptr_t)7;
    /* 32 bytes a step, with no branch inside: the compiler vectorises it. */
    for (; x + 32 <= end; x += 32)
        if (((chk_load(x) ^ w) | (chk_load(x + 8) ^ w) | (chk_load(x + 16) ^ w) |
             (chk_load(x + 24) ^ w)) != 0)
            break;
    for (; x + 8 <= end; x += 8)
        if ((v = chk_load(x)) != w) return chk_first_diff(x, v, w);
    if (x < end && (v = chk_load(end - 8)) != (p = chk_pattern_at(w, end - 8)))
        return chk_first_diff(end - 8, v, p);
    return end;
}
static inline uintptr_t chk_unpainted(uintptr_t a, uintptr_t end, uint64_t w) {
    /* Most canaries: 8 to 16 bytes, two words that overlap, all there. */
    if (end - a >= 8 && end - a <= 16 && chk_load(a) == chk_pattern_at(w, a) &&
        chk_load(end - 8) == chk_pattern_at(w, end - 8))
        return end;
    return chk_unpainted_long(a, end, w);
}

/* ---- reports (verdict.c) ---------------------------------------------------- */

_Noreturn void chk_report(const char *fn, enum diag_kind kind, uintptr_t p, size_t n, ptrdiff_t at);

/* ---- slab regions (slots.c) ------------------------------------------------- */

struct chk_region {
    uint32_t cls;
    uint32_t size; /* slot size */
    uint32_t per;  /* slots in each half */
    uint32_t nslots;
    _Atomic uint32_t carved; /* slots cut so far, from the front */
    struct chk_region *next; /* the class's regions, newest first */
};

/* A class's slots no thread holds: a free list (links encoded, see
 * chk_link) and the region slots are cut from. Threads take and give back
 * slots in batches (struct chk_thread). */
struct chk_class {
    pthread_mutex_t lock;
    uintptr_t free;
    struct chk_region *cur;
    struct chk_region *_Atomic all; /* every region, for the walk at exit */
};
extern HAK_HIDDEN struct chk_class chk_classes[SMALL_NCLASSES];

/* What a slot's word0 says. */
struct chk_slot {
    size_t n;     /* bytes asked */
    unsigned fam; /* enum api_family */
    unsigned state;
    size_t uoff;  /* the block's offset in the slot */
    unsigned gen; /* how many times word0 was written, mod 256 */
};

/* word0, before the xor with the slot's key: the fields in the low
 * CHK_INFO_BITS bits (size 17, family 2, state 2, offset/16 13, generation
 * 8), and above them a keyed hash of those (a product's top bits, which
 * depend on all of its factors' bits), so that any change to the header
 * shows. The generation changes with every store of word0 (malloc, free's
 * two, an in-place realloc): a walk that reads the same word0 before and
 * after looking at the slot knows nothing changed in between, even when a
 * realloc grew the block and shrank it back (the same fields again). */
#define CHK_INFO_BITS 42
#define CHK_SIZE_BITS 17 /* slab blocks are below CHK_SLOT_MAX, 128 KiB */
#define CHK_GEN_SHIFT 34
/* word0 w's fields (key: its slot's), unchecked. */
static inline uint64_t chk_info_of(uint64_t w, uint64_t key) {
    return (w ^ key) & ((1ull << CHK_INFO_BITS) - 1);
}
static inline uint64_t chk_info_hash(uint64_t low, uint64_t key) {
    return ((low ^ key) * chk_hmul) >> CHK_INFO_BITS << CHK_INFO_BITS;
}
/* The word0 of a block of slot (key: chk_key(slot)). */
static inline uint64_t chk_header(uint64_t key, size_t n, unsigned fam, unsigned state, size_t uoff,
                                  unsigned gen) {
    uint64_t low = (uint64_t)n | (uint64_t)fam << 17 | (uint64_t)state << 19 |
                   (uint64_t)(uoff / 16) << 21 | (uint64_t)(gen & 0xff) << CHK_GEN_SHIFT;
    return (low | chk_info_hash(low, key)) ^ key;
}

static inline _Atomic uint64_t *chk_word0(uintptr_t slot) {
    return (_Atomic uint64_t *)slot;
}

/* Decode w, the word0 of a slot of `size` bytes whose key is `key`; false
 * when it is no header (overwritten, or no block was ever there). */
static inline bool chk_decode(uint64_t w, uint64_t key, size_t size, struct chk_slot *s) {
    uint64_t i = w ^ key;
    uint64_t low = i & ((1ull << CHK_INFO_BITS) - 1);
    s->n = low & ((1u << CHK_SIZE_BITS) - 1);
    s->fam = low >> 17 & 3;
    s->state = low >> 19 & 3;
    s->uoff = (low >> 21 & 0x1fff) * 16;
    s->gen = (unsigned)(low >> CHK_GEN_SHIFT);
    return (i ^ chk_info_hash(low, key)) >> CHK_INFO_BITS == 0 && s->state != 0 &&
           s->fam <= API_NEW_ARRAY && s->uoff >= CHK_HDR && s->uoff + s->n < size;
}

static inline struct chk_region *chk_region_of(uintptr_t a) {
    return (struct chk_region *)rmap_region_base((void *)a);
}
uintptr_t chk_slot_of(uintptr_t a, const struct chk_region *r);
uintptr_t chk_slot_at(uintptr_t x, const struct chk_region *r);

/* ---- per-thread slot caches (slots.c) --------------------------------------- */

/* The slab blocks this thread's last ranges were found inside (range.c:
 * chk_range), each with its slot's word0 as it was then. In the thread's
 * cache, not a __thread of its own: a new thread variable moves every
 * other one, and the thread cache's fast-path fields landed across cache
 * lines (default mode 5% slower on fixed_size_16). */
#define CHK_SEEN 2
struct chk_seen {
    uintptr_t slot, u;
    size_t n; /* 0: an empty entry */
    uint64_t word;
};

#define CHK_T_RAND  16
#define CHK_T_RING  ((size_t)4096)
#define CHK_T_BYTES ((size_t)1 << 20)
#define CHK_T_LIST  ((size_t)256 << 10) /* free slots a thread keeps per class, in bytes */
#define CHK_T_BATCH 32u                 /* slots moved per lock, at most */

struct chk_list {
    uintptr_t head;
    uint32_t n;
};

struct chk_thread {
    struct chk_thread *next; /* on the unowned list */
    uint64_t rng;
    struct chk_list free[SMALL_NCLASSES];
    /* Slots cut from a region for this thread and not handed out yet:
     * never used, so nothing to verify. */
    uintptr_t fresh[SMALL_NCLASSES], fresh_end[SMALL_NCLASSES];
    uintptr_t rand[CHK_T_RAND];
    size_t head, n, bytes; /* the FIFO; bytes: it and rand together */
    struct chk_seen seen[CHK_SEEN];
    unsigned seen_next;
    uintptr_t ring[CHK_T_RING];
};
extern HAK_HIDDEN __thread struct chk_thread *chk_me;
extern HAK_HIDDEN pthread_mutex_t chk_t_lock;
struct chk_thread *chk_thread_take(void);
void chk_thread_give(struct chk_thread *t);

/* The calling thread's cache. A thread that cannot be told of its exit (past
 * it, or while arming for it) is lent an unowned one for the call: *lent,
 * and chk_thread_give after. NULL when there is no memory for one. */
static inline struct chk_thread *chk_thread_get(bool *lent) {
    *lent = false;
    if (hak_likely(chk_me != NULL)) return chk_me;
    if (!thread_arm()) {
        *lent = true;
        return chk_thread_take();
    }
    return chk_me = chk_thread_take(); /* NULL: the next call tries again */
}
void chk_class_push(uint32_t cls, uintptr_t head, uintptr_t last);
void chk_quarantine(struct chk_thread *t, uintptr_t slot, size_t size, const char *fn);
/* Every slot, every live big block (exit, malloc_trim): see chk_walk. */
void chk_walk_slots(const char *fn);
void chk_walk_big(const char *fn);
void *chk_slab_alloc(size_t n, size_t align, unsigned fam);

/* (Here, not in slots.c: inlined in chk_inspect, on every free.) */
/* The first byte of a live slab block's canaries (below it from word1 on,
 * after it to the slot's end) that is not canary, and *kind what it is; 0
 * when all are. free reports it (chk_slab_canaries), the walk at exit too. */
static inline uintptr_t chk_slab_bad(uintptr_t slot, size_t size, const struct chk_slot *s,
                                     enum diag_kind *kind) {
    uintptr_t u = slot + s->uoff, end = slot + size, bad;
    uint64_t w = chk_canary(slot);
    *kind = DIAG_HEAP_UNDERFLOW;
    if ((bad = chk_unpainted(slot + 8, u, w)) != u) return bad;
    *kind = DIAG_HEAP_OVERFLOW;
    bad = chk_unpainted(u + s->n, end, w);
    return bad != end ? bad : 0;
}

static inline void chk_slab_canaries(uintptr_t slot, size_t size, const struct chk_slot *s,
                                     const char *fn) {
    enum diag_kind kind;
    uintptr_t bad = chk_slab_bad(slot, size, s, &kind), u = slot + s->uoff;
    if (hak_unlikely(bad != 0)) chk_report(fn, kind, u, s->n, (ptrdiff_t)(bad - u));
}

/* ---- big blocks: a mapping each (big.c) ------------------------------------- */

/* In the mapping's first page; then a guard page, the block's pages (the
 * block at their end, give or take alignment and room to grow), and guard
 * pages to the mapping's end. */
struct chk_big {
    uint64_t check; /* chk_key(base) ^ u: this is a descriptor, for this block */
    uintptr_t u;
    size_t n;   /* bytes asked */
    size_t map; /* the mapping's size */
    uintptr_t data, end;
    uintptr_t lo; /* the canary below the block: [lo, u) */
    _Atomic uint32_t state;
    uint32_t fam;
    bool kept;                   /* freed, its pages kept (inaccessible) for reuse */
    struct chk_big *prev, *next; /* live, on chk_big_live (chk_q_lock) */
};

void chk_big_tail(const struct chk_big *b);
/* The descriptor of the big mapping that holds x (entry e, CHK_BIG), NULL
 * when its check word says it is none. */
static inline const struct chk_big *chk_big_at(uintptr_t x, uint32_t e) {
    uintptr_t base = rmap_region_base((void *)x) - (uintptr_t)chk_arg(e) * HAK_REGION_SIZE;
    const struct chk_big *g = (const struct chk_big *)base;
    return g->check == (chk_key(base) ^ g->u) ? g : NULL;
}
void *chk_big_alloc(size_t n, size_t align, unsigned fam, size_t cap);
void chk_big_canaries(const struct chk_big *b, const char *fn);

/* Their quarantine; chk_map: a mapping for the tier (slab regions too). */
extern HAK_HIDDEN pthread_mutex_t chk_q_lock;
void chk_quarantine_big(struct chk_big *b);
uint8_t *chk_map(size_t size);

/* ---- malloc(0) (zero.c) ---------------------------------------------------- */

extern HAK_HIDDEN pthread_mutex_t chk_zero_lock;
void chk_zero_start(void);
void *chk_zero_alloc(void);
ptrdiff_t chk_zero_find(uintptr_t a);
void chk_zero_free(uintptr_t a, const char *fn);

#endif
