/* Checked tier: see check.h for the layout and what each check finds. */
#include "check.h"

#include "box/diag.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/rmap.h"
#include "box/secret.h"
#include "box/thread.h"
#include "box/tier.h"
#include "box/usage.h"
#include "sizeclass.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

HAK_HIDDEN bool chk_on;

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
/* A slab region: its descriptor alone in the first page, a guard page (an
 * underflow below the first slot faults there), then slots. */
#define CHK_FIRST     (2 * HAK_PAGE_SIZE)
#define CHK_SLOTS_END (HAK_REGION_SIZE - HAK_PAGE_SIZE) /* then a guard page */
/* Canary bytes after a big block checked at free. Past them the block's
 * slack (room realloc left to grow in place) and then the guard page. */
#define CHK_BIG_TAIL ((size_t)64)
/* Below a big block, a gap up to this is all canary; a longer one (a big
 * alignment) gets a page of it, and inaccessible pages under that. */
#define CHK_BIG_GAP ((size_t)64 << 10)

enum { CHK_LIVE = 1, CHK_FREED = 2 };

static const char *const chk_family_names[] = {"malloc", "operator new", "operator new[]"};

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
static uint64_t chk_skey, chk_scanary, chk_slink, chk_hmul;

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
/* A free slot's link to the next (word1) is xored with this. */
static inline uint64_t chk_link_key(uintptr_t slot) {
    return chk_salted(slot, chk_slink);
}
static uint8_t chk_wipe_byte; /* what freed slots are filled with */

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
 * first there is. */
static uintptr_t chk_unpainted_long(uintptr_t a, uintptr_t end, uint64_t w) {
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

static inline uint64_t chk_wipe_word(void) {
    return chk_wipe_byte * 0x0101010101010101ull;
}

/* ---- reports ---------------------------------------------------------------- */

static _Noreturn void chk_report(const char *fn, enum diag_kind kind, uintptr_t p, size_t n,
                                 ptrdiff_t at) {
    diag_bug(&(struct diag_bug){
        .fn = fn, .kind = kind, .p = (void *)p, .tier = TIER_CHECK, .block = n, .at = at});
}

/* The family a freeing call frees. */
static unsigned chk_family_of(const char *fn) {
    if (fn[0] != 'o' || strncmp(fn, "operator delete", 15) != 0) return CHK_MALLOC;
    return fn[15] == '[' ? CHK_NEW_ARRAY : CHK_NEW;
}

static void chk_check_family(const char *fn, uintptr_t p, size_t n, unsigned fam) {
    if (hak_likely(chk_family_of(fn) == fam)) return;
    diag_bug(&(struct diag_bug){.fn = fn,
                                .kind = DIAG_MISMATCHED_FREE,
                                .p = (void *)p,
                                .tier = TIER_CHECK,
                                .block = n,
                                .by = chk_family_names[fam]});
}

/* ---- slab regions ------------------------------------------------------------ */

struct chk_region {
    uint32_t cls;
    uint32_t size; /* slot size */
    uint32_t nslots;
    _Atomic uint32_t carved; /* slots cut so far, from the front */
};

/* A class's slots no thread holds: a free list (links encoded, see
 * chk_link) and the region slots are cut from. Threads take and give back
 * slots in batches (struct chk_thread). */
struct chk_class {
    pthread_mutex_t lock;
    uintptr_t free;
    struct chk_region *cur;
};
static struct chk_class chk_classes[SMALL_NCLASSES] = {
    [0 ... SMALL_NCLASSES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

/* What a slot's word0 says. */
struct chk_slot {
    size_t n;     /* bytes asked */
    unsigned fam; /* enum chk_family */
    unsigned state;
    size_t uoff; /* the block's offset in the slot */
};

/* word0, before the xor with the slot's key: the fields in the low
 * CHK_INFO_BITS bits (size 20, family 2, state 2, offset/16 13), and above
 * them a keyed hash of those (a product's top bits, which depend on all of
 * its factors' bits), so that any change to the header shows. */
#define CHK_INFO_BITS 37
static inline uint64_t chk_info_hash(uint64_t low, uint64_t key) {
    return ((low ^ key) * chk_hmul) >> CHK_INFO_BITS << CHK_INFO_BITS;
}
/* The word0 of a block of slot (key: chk_key(slot)). */
static inline uint64_t chk_header(uint64_t key, size_t n, unsigned fam, unsigned state,
                                  size_t uoff) {
    uint64_t low =
        (uint64_t)n | (uint64_t)fam << 20 | (uint64_t)state << 22 | (uint64_t)(uoff / 16) << 24;
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
    s->n = low & ((1u << 20) - 1);
    s->fam = low >> 20 & 3;
    s->state = low >> 22 & 3;
    s->uoff = (low >> 24) * 16;
    return (i ^ chk_info_hash(low, key)) >> CHK_INFO_BITS == 0 &&
           (s->state == CHK_LIVE || s->state == CHK_FREED) && s->fam <= CHK_NEW_ARRAY &&
           s->uoff >= CHK_HDR && s->uoff + s->n < size;
}
static bool chk_read(uintptr_t slot, size_t size, struct chk_slot *s) {
    return chk_decode(atomic_load_explicit(chk_word0(slot), memory_order_acquire), chk_key(slot),
                      size, s);
}

static inline struct chk_region *chk_region_of(uintptr_t a) {
    return (struct chk_region *)rmap_region_base((void *)a);
}

/* The slot whose block could start at a (from its header on), or 0. */
static uintptr_t chk_slot_of(uintptr_t a, const struct chk_region *r) {
    uintptr_t first = (uintptr_t)r + CHK_FIRST;
    if ((a & 15) || a < first + CHK_HDR) return 0;
    size_t i = small_class_div(r->cls, a - first - CHK_HDR);
    if (i >= atomic_load_explicit(&r->carved, memory_order_acquire)) return 0;
    return first + i * r->size;
}

static uint8_t *chk_map(size_t size);

static struct chk_region *chk_region_new(uint32_t cls) {
    uint8_t *base = chk_map(HAK_REGION_SIZE);
    if (base == NULL) return NULL;
    if (!rmap_set_region(base, TIER_CHECK, chk_payload(cls, CHK_SLAB))) {
        os_unmap(base, HAK_REGION_SIZE);
        return NULL;
    }
    /* (Refused, at the map count limit: no guard, no other harm.) */
    (void)os_guard(base + HAK_PAGE_SIZE, HAK_PAGE_SIZE);
    (void)os_guard(base + CHK_SLOTS_END, HAK_PAGE_SIZE);
    struct chk_region *r = (struct chk_region *)base;
    r->cls = cls;
    r->size = small_class_size[cls];
    r->nslots = (uint32_t)((CHK_SLOTS_END - CHK_FIRST) / r->size);
    return r;
}

static inline uintptr_t chk_link(uintptr_t slot) {
    uint64_t v;
    __builtin_memcpy(&v, (const void *)(slot + 8), 8);
    return (uintptr_t)(v ^ chk_link_key(slot));
}
static inline void chk_set_link(uintptr_t slot, uintptr_t next) {
    uint64_t v = next ^ chk_link_key(slot);
    __builtin_memcpy((void *)(slot + 8), &v, 8);
}

/* A decoded link must be 0 or a slot of the same class. */
static bool chk_link_ok(uintptr_t next, uint32_t cls) {
    if (next == 0) return true;
    if (rmap_get((void *)next) != rmap_entry(TIER_CHECK, chk_payload(cls, CHK_SLAB))) return false;
    const struct chk_region *r = chk_region_of(next);
    return next >= (uintptr_t)r + CHK_FIRST && chk_slot_of(next + CHK_HDR, r) == next;
}

/* Where a freed slot's block was, for reports: its start and size. */
static uintptr_t chk_old_block(uintptr_t slot, size_t size, size_t *n) {
    struct chk_slot s;
    *n = 0;
    if (!chk_read(slot, size, &s)) return slot + CHK_HDR;
    *n = s.n;
    return slot + s.uoff;
}

/* A slot leaving the free list: every byte after its header must still be
 * the wipe pattern. */
static void chk_verify_wipe(uintptr_t slot, size_t size, const char *fn) {
    uintptr_t bad = chk_unpainted(slot + CHK_HDR, slot + size, chk_wipe_word());
    if (hak_likely(bad == slot + size)) return;
    size_t n;
    uintptr_t u = chk_old_block(slot, size, &n);
    chk_report(fn, DIAG_WRITE_AFTER_FREE, u, n, (ptrdiff_t)(bad - u));
}

/* ---- per-thread slot caches ------------------------------------------------
 * Each thread keeps, without a lock, a quarantine of the slots it freed and
 * free lists of slots per class, taken from and given back to the classes
 * in batches. A freed slot lands at a random place among CHK_T_RAND,
 * pushing the one there into a FIFO of up to CHK_T_BYTES (and CHK_T_RING
 * slots); what leaves the FIFO goes onto the thread's free list. So a block
 * is reused neither at once nor in an order a program could count on. The
 * bound: the quarantine is the working set every reuse reads back (the
 * wipe is verified), so it decides the speed; past the CPU's caches, every
 * reuse is a miss. A thread's cache outlives it: at its exit it goes to a
 * list of unowned ones, which the next new thread takes over. */
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
    uintptr_t ring[CHK_T_RING];
};
#define CHK_T_SIZE hak_align_up(sizeof(struct chk_thread), HAK_PAGE_SIZE)

static __thread struct chk_thread *chk_me;
static pthread_mutex_t chk_t_lock = PTHREAD_MUTEX_INITIALIZER;
static struct chk_thread *chk_t_unowned;

/* An unowned cache, or a new one; NULL when no memory. */
static struct chk_thread *chk_thread_take(void) {
    hak_lock(&chk_t_lock);
    struct chk_thread *t = chk_t_unowned;
    if (t != NULL) chk_t_unowned = t->next;
    hak_unlock(&chk_t_lock);
    if (t != NULL) return t;
    t = os_map_aligned(CHK_T_SIZE, HAK_PAGE_SIZE);
    if (t != NULL) t->rng = chk_mix(hak_secret() ^ (uintptr_t)t) | 1;
    return t;
}

static void chk_thread_give(struct chk_thread *t) {
    hak_lock(&chk_t_lock);
    t->next = chk_t_unowned;
    chk_t_unowned = t;
    hak_unlock(&chk_t_lock);
}

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

/* slot's link, which must be 0 or a slot of class cls; a corrupted one is
 * reported (for call fn) as a write after free of slot's old block (after
 * `unlock`, if not NULL, is released). */
static uintptr_t chk_next(uintptr_t slot, uint32_t cls, pthread_mutex_t *unlock, const char *fn) {
    uintptr_t next = chk_link(slot);
    if (hak_likely(chk_link_ok(next, cls))) return next;
    if (unlock != NULL) hak_unlock(unlock);
    size_t old;
    uintptr_t u = chk_old_block(slot, small_class_size[cls], &old);
    chk_report(fn, DIAG_WRITE_AFTER_FREE, u, old, (ptrdiff_t)(slot + 8 - u));
}

/* Slots to move at a time: CHK_T_LIST / 2 bytes' worth, 1 to CHK_T_BATCH. */
static inline uint32_t chk_batch(uint32_t cls) {
    size_t k = CHK_T_LIST / 2 / small_class_size[cls];
    return k < 1 ? 1 : k > CHK_T_BATCH ? CHK_T_BATCH : (uint32_t)k;
}

/* Give t some slots of class cls: freed ones from the class, or else fresh
 * ones cut from its region. False when no memory. */
static bool chk_refill(struct chk_thread *t, uint32_t cls) {
    struct chk_class *c = &chk_classes[cls];
    uint32_t k = chk_batch(cls);
    hak_lock(&c->lock);
    if (c->free != 0) {
        /* The first k, or all there are: the rest stays the class's. */
        uintptr_t head = c->free, last = head;
        uint32_t n = 1;
        uintptr_t next = chk_next(last, cls, &c->lock, "malloc");
        for (; n < k && next != 0; n++) {
            last = next;
            next = chk_next(last, cls, &c->lock, "malloc");
        }
        c->free = next;
        hak_unlock(&c->lock);
        t->free[cls] = (struct chk_list){head, n};
        return true;
    }
    struct chk_region *r = c->cur;
    if (r == NULL || atomic_load_explicit(&r->carved, memory_order_relaxed) == r->nslots) {
        if ((r = chk_region_new(cls)) == NULL) {
            hak_unlock(&c->lock);
            return false;
        }
        c->cur = r;
    }
    uint32_t i = atomic_load_explicit(&r->carved, memory_order_relaxed);
    uint32_t m = r->nslots - i < k ? r->nslots - i : k;
    /* (Cut is what a pointer must be in to be a block: chk_slot_of.) */
    atomic_store_explicit(&r->carved, i + m, memory_order_release);
    hak_unlock(&c->lock);
    t->fresh[cls] = (uintptr_t)r + CHK_FIRST + (size_t)i * r->size;
    t->fresh_end[cls] = t->fresh[cls] + (size_t)m * r->size;
    return true;
}

/* A slot of class cls for t; 0 when no memory. *wiped: it was used before
 * (its wipe must be verified). */
static uintptr_t chk_take(struct chk_thread *t, uint32_t cls, bool *wiped) {
    struct chk_list *l = &t->free[cls];
    if (l->n == 0 && t->fresh[cls] == t->fresh_end[cls] && !chk_refill(t, cls)) return 0;
    *wiped = l->n != 0;
    if (*wiped) {
        uintptr_t slot = l->head;
        l->head = chk_next(slot, cls, NULL, "malloc");
        l->n--;
        return slot;
    }
    uintptr_t slot = t->fresh[cls];
    t->fresh[cls] += small_class_size[cls];
    return slot;
}

/* Slots head .. last, linked, onto class cls's free list. */
static void chk_class_push(uint32_t cls, uintptr_t head, uintptr_t last) {
    struct chk_class *c = &chk_classes[cls];
    hak_lock(&c->lock);
    chk_set_link(last, c->free);
    c->free = head;
    hak_unlock(&c->lock);
}

/* t's free list of class cls back to the class (fn: the call, for a
 * report). */
static void chk_give_list(struct chk_thread *t, uint32_t cls, const char *fn) {
    struct chk_list *l = &t->free[cls];
    if (l->n == 0) return;
    uintptr_t last = l->head;
    for (uint32_t i = 1; i < l->n; i++)
        last = chk_next(last, cls, NULL, fn);
    chk_class_push(cls, l->head, last);
    *l = (struct chk_list){0, 0};
}

/* A slot out of t's quarantine: onto t's free list of its class; past
 * CHK_T_LIST bytes, that list goes back to the class. */
static void chk_keep(struct chk_thread *t, uintptr_t slot, const char *fn) {
    const struct chk_region *r = chk_region_of(slot);
    struct chk_list *l = &t->free[r->cls];
    chk_set_link(slot, l->head);
    l->head = slot;
    if (++l->n >= 2 && (size_t)l->n * r->size > CHK_T_LIST) chk_give_list(t, r->cls, fn);
}

static uintptr_t chk_t_pop(struct chk_thread *t) {
    uintptr_t x = t->ring[t->head];
    t->head = (t->head + 1) % CHK_T_RING;
    t->n--;
    t->bytes -= chk_region_of(x)->size;
    return x;
}

static void chk_quarantine(struct chk_thread *t, uintptr_t slot, size_t size, const char *fn) {
    t->rng ^= t->rng << 13;
    t->rng ^= t->rng >> 7;
    t->rng ^= t->rng << 17;
    size_t i = (size_t)(t->rng % CHK_T_RAND);
    uintptr_t x = t->rand[i];
    t->rand[i] = slot;
    t->bytes += size;
    if (x != 0) {
        if (t->n == CHK_T_RING) chk_keep(t, chk_t_pop(t), fn);
        t->ring[(t->head + t->n++) % CHK_T_RING] = x;
    }
    while (t->bytes > CHK_T_BYTES && t->n > 0)
        chk_keep(t, chk_t_pop(t), fn);
}

void chk_thread_exit(void) {
    struct chk_thread *t = chk_me;
    if (t == NULL) return;
    /* Its free slots go back to their classes (a program whose many threads
     * ended would keep them otherwise); its quarantine and fresh slots stay
     * with the cache, for the next new thread. */
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++)
        chk_give_list(t, cls, "thread exit");
    chk_thread_give(t);
    chk_me = NULL;
}

/* Verify the wipe of everything in t's quarantine (exit). */
static void chk_thread_verify(const struct chk_thread *t) {
    for (size_t i = 0; i < CHK_T_RAND; i++)
        if (t->rand[i]) chk_verify_wipe(t->rand[i], chk_region_of(t->rand[i])->size, "exit");
    for (size_t i = 0; i < t->n; i++) {
        uintptr_t x = t->ring[(t->head + i) % CHK_T_RING];
        chk_verify_wipe(x, chk_region_of(x)->size, "exit");
    }
}

static void *chk_slab_alloc(size_t n, size_t align, unsigned fam) {
    uint32_t cls = small_class_of(n + align - HAK_MIN_ALIGN + CHK_HDR + 1);
    size_t size = small_class_size[cls];
    bool lent, wiped = false;
    struct chk_thread *t = chk_thread_get(&lent);
    uintptr_t slot = t != NULL ? chk_take(t, cls, &wiped) : 0;
    if (lent && t != NULL) chk_thread_give(t);
    if (slot == 0) {
        errno = ENOMEM;
        return NULL;
    }
    if (wiped) chk_verify_wipe(slot, size, "malloc");
    uintptr_t u = hak_align_up(slot + CHK_HDR, align);
    uint64_t w = chk_canary(slot);
    chk_paint(slot + 8, u, w);        /* word1 and the gap below an aligned block */
    chk_paint(u + n, slot + size, w); /* the tail */
    atomic_store_explicit(chk_word0(slot), chk_header(chk_key(slot), n, fam, CHK_LIVE, u - slot),
                          memory_order_release);
    usage_add((int64_t)n); /* (in use: what was asked) */
    return (void *)u;
}

/* Slab block a's canaries: below it from word1 on, after it to the slot's end. */
static void chk_slab_canaries(uintptr_t slot, size_t size, const struct chk_slot *s,
                              const char *fn) {
    uintptr_t u = slot + s->uoff, end = slot + size;
    uint64_t w = chk_canary(slot);
    uintptr_t bad = chk_unpainted(slot + 8, u, w);
    if (bad != u) chk_report(fn, DIAG_HEAP_UNDERFLOW, u, s->n, -(ptrdiff_t)(u - bad));
    bad = chk_unpainted(u + s->n, end, w);
    if (bad != end) chk_report(fn, DIAG_HEAP_OVERFLOW, u, s->n, (ptrdiff_t)(bad - u));
}

/* ---- big blocks: a mapping each ------------------------------------------------ */

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
    bool kept; /* freed, its pages kept (inaccessible) for reuse */
};

static void chk_big_tail(const struct chk_big *b) {
    uintptr_t t = b->u + b->n, end = b->end - t > CHK_BIG_TAIL ? t + CHK_BIG_TAIL : b->end;
    chk_paint(t, end, chk_canary((uintptr_t)b));
}

static uint8_t *chk_big_reuse(size_t map, size_t data_len);

/* A block of n bytes with room for cap >= n in place; `zero`: calloc's. */
static void *chk_big_alloc(size_t n, size_t align, unsigned fam, size_t cap, bool zero) {
    if (cap > HAK_MAX_REQUEST - align - 4 * HAK_REGION_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    size_t data_len = hak_align_up(cap + align + CHK_HDR, HAK_PAGE_SIZE);
    size_t map = hak_align_up(3 * HAK_PAGE_SIZE + data_len, HAK_REGION_SIZE);
    uint8_t *base = chk_big_reuse(map, data_len);
    bool fresh = base == NULL;
    if (fresh) {
        if ((base = chk_map(map)) == NULL) {
            errno = ENOMEM;
            return NULL;
        }
        for (size_t i = 0; i < map / HAK_REGION_SIZE; i++)
            if (!rmap_set_region(base + i * HAK_REGION_SIZE, TIER_CHECK,
                                 chk_payload((uint32_t)i, CHK_BIG))) {
                rmap_clear_span(base, map);
                os_unmap(base, map);
                errno = ENOMEM;
                return NULL;
            }
    }
    struct chk_big *b = (struct chk_big *)base;
    b->data = (uintptr_t)base + 2 * HAK_PAGE_SIZE;
    b->end = b->data + data_len;
    if (fresh) {
        (void)os_guard(base + HAK_PAGE_SIZE, HAK_PAGE_SIZE);
        (void)os_guard((void *)b->end, (uintptr_t)base + map - b->end);
    }
    b->u = (b->end - cap) & ~(uintptr_t)(align - 1);
    b->n = n;
    b->map = map;
    b->fam = fam;
    b->kept = false;
    b->check = chk_key((uintptr_t)base) ^ b->u;
    /* (A reused mapping holds its last block's bytes.) */
    if (zero && !fresh) memset((void *)b->u, 0, n);
    /* Canary down to the guard page; but below a big alignment's gap (up to
     * the alignment: gigabytes for posix_memalign(2^33)) a page of it, and
     * the rest inaccessible: painting it all made every page resident. */
    b->lo = b->data;
    if (b->u - b->data > CHK_BIG_GAP) {
        b->lo = (b->u - HAK_PAGE_SIZE) & ~(uintptr_t)(HAK_PAGE_SIZE - 1);
        (void)os_guard((void *)b->data, b->lo - b->data); /* (refused: merely not guarded) */
    }
    chk_paint(b->lo, b->u, chk_canary((uintptr_t)base));
    chk_big_tail(b);
    atomic_store_explicit(&b->state, CHK_LIVE, memory_order_release);
    usage_add((int64_t)n);
    return (void *)b->u;
}

static void chk_big_canaries(const struct chk_big *b, const char *fn) {
    uint64_t w = chk_canary((uintptr_t)b);
    uintptr_t bad = chk_unpainted(b->lo, b->u, w);
    if (bad != b->u) chk_report(fn, DIAG_HEAP_UNDERFLOW, b->u, b->n, -(ptrdiff_t)(b->u - bad));
    uintptr_t t = b->u + b->n, end = b->end - t > CHK_BIG_TAIL ? t + CHK_BIG_TAIL : b->end;
    bad = chk_unpainted(t, end, w);
    if (bad != end) chk_report(fn, DIAG_HEAP_OVERFLOW, b->u, b->n, (ptrdiff_t)(bad - b->u));
}

/* ---- malloc(0): unique addresses nothing can be read or written at --------- */

#define CHK_ZERO_SPAN ((size_t)64 << 20) /* 4M zero-size blocks live at once */
static uintptr_t chk_zero_base;
static size_t chk_zero_n;               /* addresses in the span */
static _Atomic uint64_t *chk_zero_live; /* a bit per address: handed out */
static _Atomic size_t chk_zero_high;    /* addresses ever handed out, from the front */
static size_t chk_zero_next;            /* where the search for a free one starts */
static _Atomic size_t chk_zero_count;   /* live ones: when all are, no search */
static pthread_mutex_t chk_zero_lock = PTHREAD_MUTEX_INITIALIZER;

static void chk_zero_start(void) {
    size_t span = CHK_ZERO_SPAN;
    void *base = os_reserve(&span, HAK_REGION_SIZE, HAK_REGION_SIZE);
    if (base == NULL) return;
    size_t n = span / 16;
    void *bits = os_map_aligned(hak_align_up(n / 8, HAK_PAGE_SIZE), HAK_PAGE_SIZE);
    bool ok = bits != NULL;
    for (size_t i = 0; ok && i < span / HAK_REGION_SIZE; i++)
        ok = rmap_set_region((uint8_t *)base + i * HAK_REGION_SIZE, TIER_CHECK,
                             chk_payload((uint32_t)i, CHK_ZERO));
    if (!ok) {
        rmap_clear_span(base, span);
        os_unmap(base, span);
        if (bits) os_unmap(bits, hak_align_up(n / 8, HAK_PAGE_SIZE));
        return;
    }
    chk_zero_live = bits;
    chk_zero_n = n;
    chk_zero_base = (uintptr_t)base;
}

static void *chk_zero_alloc(void) {
    if (chk_zero_base == 0 ||
        atomic_load_explicit(&chk_zero_count, memory_order_relaxed) >= chk_zero_n)
        return NULL;
    size_t words = chk_zero_n / 64;
    void *p = NULL;
    hak_lock(&chk_zero_lock);
    for (size_t k = 0, w = chk_zero_next / 64; k <= words; k++, w = (w + 1) % words) {
        uint64_t v = atomic_load_explicit(&chk_zero_live[w], memory_order_relaxed);
        if (v == ~0ull) continue;
        size_t i = w * 64 + (size_t)__builtin_ctzll(~v);
        atomic_fetch_or_explicit(&chk_zero_live[w], 1ull << (i % 64), memory_order_relaxed);
        atomic_fetch_add_explicit(&chk_zero_count, 1, memory_order_relaxed);
        chk_zero_next = (i + 1) % chk_zero_n;
        if (i + 1 > atomic_load_explicit(&chk_zero_high, memory_order_relaxed))
            atomic_store_explicit(&chk_zero_high, i + 1, memory_order_relaxed);
        p = (void *)(chk_zero_base + i * 16);
        break;
    }
    hak_unlock(&chk_zero_lock);
    return p;
}

/* Is zero-size block a live? Its index, or -1 (never handed out: not a
 * block), or -2 (freed). */
static ptrdiff_t chk_zero_find(uintptr_t a) {
    size_t i = (a - chk_zero_base) / 16;
    if (chk_zero_base == 0 || a < chk_zero_base || (a & 15) || i >= chk_zero_n) return -1;
    if (atomic_load_explicit(&chk_zero_live[i / 64], memory_order_relaxed) >> (i % 64) & 1)
        return (ptrdiff_t)i;
    return i < atomic_load_explicit(&chk_zero_high, memory_order_relaxed) ? -2 : -1;
}

static void chk_zero_free(uintptr_t a, const char *fn) {
    ptrdiff_t i = chk_zero_find(a);
    if (i < 0)
        diag_bad_pointer(fn, i == -2 ? DIAG_DOUBLE_FREE : DIAG_INVALID_POINTER, (void *)a,
                         TIER_CHECK, 0);
    size_t k = (size_t)i;
    uint64_t bit = 1ull << (k % 64);
    /* (Two threads freeing it at once: one finds the bit gone.) */
    if (!(atomic_fetch_and_explicit(&chk_zero_live[k / 64], ~bit, memory_order_relaxed) & bit))
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, 0);
    atomic_fetch_sub_explicit(&chk_zero_count, 1, memory_order_relaxed);
}

/* ---- big blocks' quarantine -------------------------------------------------- */

/* Freed big blocks wait in a FIFO, inaccessible: a pointer to one faults
 * for as long. Up to CHK_Q_BIG_KEEP bytes of them keep their pages
 * (mprotect); a new block of the same mapping size takes the oldest of
 * those with CHK_Q_BIG_WAIT or more freed after it (chk_big_reuse), for two
 * mprotect calls where a fresh mapping costs a page fault per page
 * (bench_scenarios mir, 256 KiB buffers: 7.5 times faster). The others'
 * pages are given back (os_uncommit); mappings are unmapped as they leave
 * the FIFO. */
#define CHK_Q_BIG      64
#define CHK_Q_BIG_WAIT 16
#define CHK_Q_BIG_SPAN ((size_t)1 << 30)  /* their address space, at most */
#define CHK_Q_BIG_KEEP ((size_t)32 << 20) /* their pages kept, at most */
static pthread_mutex_t chk_q_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t chk_q_big[CHK_Q_BIG];
static size_t chk_q_big_head, chk_q_big_n, chk_q_big_span, chk_q_big_kept;

static void chk_unmap_big(struct chk_big *g) {
    size_t map = g->map;
    rmap_clear_span(g, map);
    os_unmap(g, map);
}

/* Take the oldest big block out of quarantine (lock held). */
static struct chk_big *chk_q_big_pop(void) {
    struct chk_big *g = (struct chk_big *)chk_q_big[chk_q_big_head];
    chk_q_big_head = (chk_q_big_head + 1) % CHK_Q_BIG;
    chk_q_big_n--;
    chk_q_big_span -= g->map;
    if (g->kept) chk_q_big_kept -= g->end - g->data;
    return g;
}

static void chk_quarantine_big(struct chk_big *b) {
    size_t len = b->end - b->data;
    hak_lock(&chk_q_lock);
    b->kept = chk_q_big_kept + len <= CHK_Q_BIG_KEEP;
    if (b->kept) chk_q_big_kept += len;
    hak_unlock(&chk_q_lock);
    if (b->kept && !os_guard((void *)b->data, len)) {
        hak_lock(&chk_q_lock);
        chk_q_big_kept -= len;
        hak_unlock(&chk_q_lock);
        b->kept = false;
    }
    /* Its pages go; what is left reads as zeros and faults when written.
     * That is what the block and its canaries covered: os_uncommit may have
     * to clear what it is given (when the OS refuses to drop pages), and
     * the rest of the range is the inaccessible gap below a big
     * alignment's block (the clearing faulted there: the fuzzer) and pages
     * this block never touched (up to the alignment: gigabytes made
     * resident). Those only lose their pages, if they have any. */
    if (!b->kept) {
        uintptr_t t = hak_align_up(b->u + b->n + CHK_BIG_TAIL, HAK_PAGE_SIZE);
        if (t > b->end) t = b->end;
        os_uncommit((void *)b->lo, t - b->lo);
        if (t < b->end) (void)os_decommit((void *)t, b->end - t);
    }
    struct chk_big *out[CHK_Q_BIG];
    size_t nout = 0;
    hak_lock(&chk_q_lock);
    while (chk_q_big_n > 0 &&
           (chk_q_big_n == CHK_Q_BIG || chk_q_big_span + b->map > CHK_Q_BIG_SPAN))
        out[nout++] = chk_q_big_pop();
    chk_q_big[(chk_q_big_head + chk_q_big_n++) % CHK_Q_BIG] = (uintptr_t)b;
    chk_q_big_span += b->map;
    hak_unlock(&chk_q_lock);
    for (size_t i = 0; i < nout; i++)
        chk_unmap_big(out[i]);
}

/* The oldest block in quarantine that kept its pages, is of `map` bytes
 * and has CHK_Q_BIG_WAIT others after it: its mapping, with data_len bytes
 * after its guard page readable and writable (the rest inaccessible, and
 * what it had there given back). NULL when there is none. */
static uint8_t *chk_big_reuse(size_t map, size_t data_len) {
    hak_lock(&chk_q_lock);
    struct chk_big *g = NULL;
    for (size_t i = 0; g == NULL && i + CHK_Q_BIG_WAIT < chk_q_big_n; i++) {
        size_t at = (chk_q_big_head + i) % CHK_Q_BIG;
        const struct chk_big *old = (const struct chk_big *)chk_q_big[at];
        if (!old->kept || old->map != map) continue;
        /* Out of the FIFO: the ones before it move up one place. */
        for (; at != chk_q_big_head; at = (at + CHK_Q_BIG - 1) % CHK_Q_BIG)
            chk_q_big[at] = chk_q_big[(at + CHK_Q_BIG - 1) % CHK_Q_BIG];
        chk_q_big[chk_q_big_head] = (uintptr_t)old;
        g = chk_q_big_pop();
    }
    hak_unlock(&chk_q_lock);
    if (g == NULL) return NULL;
    size_t had = g->end - g->data;
    if (!os_commit((void *)g->data, data_len)) {
        chk_unmap_big(g);
        return NULL;
    }
    if (had > data_len) (void)os_decommit((void *)(g->data + data_len), had - data_len);
    return (uint8_t *)g;
}

/* A mapping for the tier; when the OS refuses (an address-space limit), once
 * more after the big blocks in quarantine gave back their address space. */
static uint8_t *chk_map(size_t size) {
    uint8_t *p = os_map_aligned(size, HAK_REGION_SIZE);
    if (p != NULL) return p;
    struct chk_big *out[CHK_Q_BIG];
    size_t nout = 0;
    hak_lock(&chk_q_lock);
    while (chk_q_big_n > 0)
        out[nout++] = chk_q_big_pop();
    hak_unlock(&chk_q_lock);
    for (size_t i = 0; i < nout; i++)
        chk_unmap_big(out[i]);
    return nout ? os_map_aligned(size, HAK_REGION_SIZE) : NULL;
}

/* ---- one block, whatever its kind --------------------------------------------- */

struct chk_block {
    uint32_t sub;   /* CHK_SLAB, CHK_BIG, CHK_ZERO */
    uintptr_t slot; /* a slab block's slot; a big block's mapping */
    size_t size;    /* a slab block's slot size */
    uint64_t key;   /* a slab block's: chk_key(slot), and its word0 as read */
    uint64_t word;
    struct chk_slot s;
};

/* What a pointer (entry e) is to the tier. */
enum chk_verdict {
    CHK_NOT_A_BLOCK,
    CHK_IS_LIVE,
    CHK_IS_FREED,
    CHK_IS_OVERWRITTEN, /* a block starts there, its header overwritten */
};

/* Look at a, filling *b as far as it goes; never reports. */
static enum chk_verdict chk_find(uintptr_t a, uint32_t e, struct chk_block *b) {
    b->sub = chk_sub(e);
    b->s = (struct chk_slot){.n = 0, .fam = CHK_MALLOC, .state = CHK_LIVE};
    if (b->sub == CHK_ZERO) {
        ptrdiff_t i = chk_zero_find(a);
        return i >= 0 ? CHK_IS_LIVE : i == -2 ? CHK_IS_FREED : CHK_NOT_A_BLOCK;
    }
    if (b->sub == CHK_BIG) {
        uintptr_t base = rmap_region_base((void *)a) - (uintptr_t)chk_arg(e) * HAK_REGION_SIZE;
        const struct chk_big *g = (const struct chk_big *)base;
        if (g->u != a || g->check != (chk_key(base) ^ a)) return CHK_NOT_A_BLOCK;
        b->slot = base;
        b->s.n = g->n;
        b->s.fam = g->fam;
        return atomic_load_explicit(&g->state, memory_order_acquire) == CHK_LIVE ? CHK_IS_LIVE
                                                                                 : CHK_IS_FREED;
    }
    const struct chk_region *r = chk_region_of(a);
    b->slot = chk_slot_of(a, r);
    b->size = r->size;
    if (b->slot == 0) return CHK_NOT_A_BLOCK;
    b->key = chk_key(b->slot);
    b->word = atomic_load_explicit(chk_word0(b->slot), memory_order_acquire);
    if (chk_decode(b->word, b->key, b->size, &b->s)) {
        if (b->slot + b->s.uoff != a) return CHK_NOT_A_BLOCK;
        return b->s.state == CHK_LIVE ? CHK_IS_LIVE : CHK_IS_FREED;
    }
    /* A slot cut for a thread and not handed out yet: zero throughout (one
     * ever handed out ends in canary or wipe bytes, high bits set). */
    if (b->word == 0 && *(const uint8_t *)(b->slot + b->size - 1) == 0) return CHK_NOT_A_BLOCK;
    /* An underflow reaching at least word0, below the canary. */
    return a == b->slot + CHK_HDR ? CHK_IS_OVERWRITTEN : CHK_NOT_A_BLOCK;
}

/* p (entry e) as a live block: anything else is reported. */
static void chk_live(uintptr_t a, uint32_t e, const char *fn, struct chk_block *b) {
    switch (chk_find(a, e, b)) {
    case CHK_IS_LIVE:
        return;
    case CHK_IS_FREED:
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, b->s.n);
    case CHK_IS_OVERWRITTEN:
        chk_report(fn, DIAG_HEAP_UNDERFLOW, a, 0, -(ptrdiff_t)CHK_HDR);
    case CHK_NOT_A_BLOCK:
        break;
    }
    diag_bad_pointer(fn, DIAG_INVALID_POINTER, (void *)a, TIER_CHECK, 0);
}

/* Every check of a live block before it is freed or resized. */
static void chk_inspect(uintptr_t a, const struct chk_block *b, const char *fn) {
    if (b->sub == CHK_SLAB) chk_slab_canaries(b->slot, b->size, &b->s, fn);
    if (b->sub == CHK_BIG) chk_big_canaries((const struct chk_big *)b->slot, fn);
    if (b->sub != CHK_ZERO) chk_check_family(fn, a, b->s.n, b->s.fam);
}

static void chk_release_block_as(uintptr_t a, const struct chk_block *b, const char *fn) {
    if (b->sub == CHK_ZERO) {
        chk_zero_free(a, fn);
        return;
    }
    if (b->sub == CHK_BIG) {
        struct chk_big *g = (struct chk_big *)b->slot;
        uint32_t live = CHK_LIVE;
        if (!atomic_compare_exchange_strong(&g->state, &live, CHK_FREED))
            diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, g->n);
        usage_add(-(int64_t)g->n);
        chk_quarantine_big(g);
        return;
    }
    /* (From the header chk_find read: another thread's free of it between
     * then and now makes the exchange fail.) */
    uint64_t live = b->word;
    uint64_t freed = chk_header(b->key, b->s.n, b->s.fam, CHK_FREED, b->s.uoff);
    if (!atomic_compare_exchange_strong(chk_word0(b->slot), &live, freed))
        diag_bad_pointer(fn, DIAG_DOUBLE_FREE, (void *)a, TIER_CHECK, b->s.n);
    usage_add(-(int64_t)b->s.n);
    memset((void *)(b->slot + CHK_HDR), chk_wipe_byte, b->size - CHK_HDR);
    bool lent;
    struct chk_thread *t = chk_thread_get(&lent);
    if (hak_unlikely(t == NULL)) { /* no memory for a cache: straight back to its class */
        chk_class_push(chk_region_of(b->slot)->cls, b->slot, b->slot);
        return;
    }
    chk_quarantine(t, b->slot, b->size, fn);
    if (lent) chk_thread_give(t);
}

/* free() must not change errno: the OS calls a release makes (mprotect,
 * madvise, a thread's cache mapped) set it when refused. */
static void chk_release_block(uintptr_t a, const struct chk_block *b, const char *fn) {
    int saved = errno;
    chk_release_block_as(a, b, fn);
    errno = saved;
}

/* ---- the tier's interface -------------------------------------------------------- */

static void *chk_alloc_as(size_t n, size_t align, enum chk_family f, bool zero) {
    if (align < HAK_MIN_ALIGN) align = HAK_MIN_ALIGN;
    /* (new's zero-size blocks need their family: a slot.) */
    if (n == 0 && align == HAK_MIN_ALIGN && f == CHK_MALLOC) {
        void *z = chk_zero_alloc();
        if (z != NULL) return z;
    }
    if (n > HAK_MAX_REQUEST || align > ((size_t)1 << 40)) {
        errno = ENOMEM;
        return NULL;
    }
    if (n + align - HAK_MIN_ALIGN + CHK_HDR + 1 <= CHK_SLOT_MAX) return chk_slab_alloc(n, align, f);
    return chk_big_alloc(n, align, f, n, zero);
}

void *chk_alloc(size_t n, size_t align, enum chk_family f) {
    return chk_alloc_as(n, align, f, false);
}

void chk_free(void *p, uint32_t e, const char *fn) {
    struct chk_block b;
    chk_live((uintptr_t)p, e, fn, &b);
    chk_inspect((uintptr_t)p, &b, fn);
    chk_release_block((uintptr_t)p, &b, fn);
}

void *chk_realloc(void *p, uint32_t e, size_t n) {
    uintptr_t a = (uintptr_t)p;
    struct chk_block b;
    chk_live(a, e, "realloc", &b);
    chk_inspect(a, &b, "realloc");
    if (n > HAK_MAX_REQUEST) { /* (also: the in-place tests below would wrap) */
        errno = ENOMEM;
        return NULL;
    }
    if (b.sub == CHK_SLAB && n + b.s.uoff < b.size &&
        small_class_of(n + b.s.uoff + 1) + 4 > chk_region_of(a)->cls) {
        /* In place: the tail canary moves to the new end (growing, what
         * lies past it is canary already). */
        if (n < b.s.n) chk_paint(a + n, a + b.s.n, chk_canary(b.slot));
        atomic_store_explicit(chk_word0(b.slot), chk_header(b.key, n, b.s.fam, CHK_LIVE, b.s.uoff),
                              memory_order_release);
        usage_add((int64_t)n - (int64_t)b.s.n);
        return p;
    }
    if (b.sub == CHK_BIG) {
        struct chk_big *g = (struct chk_big *)b.slot;
        size_t room = g->end - a;
        if (n <= room && n > room / 4 && n + CHK_HDR + 1 > CHK_SLOT_MAX) {
            usage_add((int64_t)n - (int64_t)g->n);
            g->n = n;
            chk_big_tail(g);
            return p;
        }
    }
    /* Moved. A big block that grows gets as much room again (address space:
     * the pages past its tail canary are not touched), so growing step by
     * step copies at most every other step, by 1.5 or by 2 (was a quarter
     * more: every step copied, bench_realloc_growth 16 B - 1 MiB). */
    void *q = NULL;
    if (n + CHK_HDR + 1 <= CHK_SLOT_MAX) {
        q = chk_alloc(n, 0, CHK_MALLOC);
    } else {
        int saved = errno;
        if (n > b.s.n && n <= HAK_MAX_REQUEST / 2)
            q = chk_big_alloc(n, HAK_MIN_ALIGN, CHK_MALLOC, 2 * n, false);
        if (q == NULL) { /* shrinking, or no address space for the room */
            errno = saved;
            q = chk_big_alloc(n, HAK_MIN_ALIGN, CHK_MALLOC, n, false);
        }
    }
    if (q == NULL) return NULL;
    memcpy(q, p, b.s.n < n ? b.s.n : n);
    chk_release_block(a, &b, "realloc");
    return q;
}

void *chk_calloc(size_t n) {
    void *p = chk_alloc_as(n, 0, CHK_MALLOC, true);
    /* A big block is zeroed by chk_big_alloc: touching fresh pages from the
     * OS would make all of them resident. Slots hold the wipe. */
    if (p != NULL && chk_sub(rmap_get(p)) != CHK_BIG) memset(p, 0, n);
    return p;
}

size_t chk_usable_size(const void *p, uint32_t e, const char *fn) {
    struct chk_block b;
    chk_live((uintptr_t)p, e, fn, &b);
    return b.s.n;
}

bool chk_is_live(const void *p, uint32_t e, size_t *size) {
    struct chk_block b;
    bool live = chk_find((uintptr_t)p, e, &b) == CHK_IS_LIVE;
    *size = live ? b.s.n : 0;
    return live;
}

void chk_start(void) {
    uint64_t s = hak_secret();
    chk_skey = chk_mix(s + 1);
    chk_scanary = chk_mix(s + 2);
    chk_slink = chk_mix(s + 3);
    chk_hmul = chk_mix(s + 4) | 1;
    chk_wipe_byte = (uint8_t)(0x80 | (s >> 40 & 0x7f));
    chk_zero_start();
    chk_on = true;
}

void chk_exit(void) {
    if (!chk_on) return;
    /* This thread's quarantine and those of threads that ended: any other
     * thread may be changing its own now. */
    if (chk_me != NULL) chk_thread_verify(chk_me);
    hak_lock(&chk_t_lock);
    for (const struct chk_thread *t = chk_t_unowned; t != NULL; t = t->next)
        chk_thread_verify(t);
    hak_unlock(&chk_t_lock);
}

void chk_fork_prepare(void) {
    hak_lock(&chk_t_lock);
    hak_lock(&chk_q_lock);
    hak_lock(&chk_zero_lock);
    for (uint32_t c = 0; c < SMALL_NCLASSES; c++)
        hak_lock(&chk_classes[c].lock);
}

void chk_fork_release(void) {
    for (uint32_t c = 0; c < SMALL_NCLASSES; c++)
        hak_unlock(&chk_classes[c].lock);
    hak_unlock(&chk_zero_lock);
    hak_unlock(&chk_q_lock);
    hak_unlock(&chk_t_lock);
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void chk_collect(enum tier_collect kind, struct tier_done *done) {
    (void)done;
    if (kind == COLLECT_EXIT) chk_thread_exit();
}

static void chk_tier_fork_release(bool child) {
    (void)child;
    chk_fork_release();
}

const struct tier_ops chk_tier = {.name = "check",
                                  .collect = chk_collect,
                                  .fork_prepare = chk_fork_prepare,
                                  .fork_release = chk_tier_fork_release};
