/* Checked tier: slab regions and their slots (a block below CHK_SLOT_MAX
 * each), the per-thread slot caches and the small blocks' quarantine; at
 * exit, the check of what is still in quarantine. */
#include "check/internal.h"

#include "box/lock.h"
#include "box/os.h"
#include "box/secret.h"
#include "box/usage.h"

#include <errno.h>

/* ---- slab regions ------------------------------------------------------------ */

/* A slab region: two halves of slots, each between guard pages, so that a
 * run of writes 1 MiB long from any block, up or down, faults:
 *
 *   [descriptor][guard][slots of half 0][guard][guard, guard][slots of half 1][guard]
 *   0           4K     8K               1M-4K  1M            1M+8K            2M-4K
 *
 * A slot never straddles a guard: each half holds chk_region.per slots. */
#define CHK_HALF  (HAK_REGION_SIZE / 2)
#define CHK_FIRST (2 * HAK_PAGE_SIZE)            /* a half's first slot, from the half's start */
#define CHK_SPAN  (CHK_HALF - 3 * HAK_PAGE_SIZE) /* a half's slots: CHK_FIRST to a guard page */

HAK_HIDDEN struct chk_class chk_classes[SMALL_NCLASSES] = {
    [0 ... SMALL_NCLASSES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

static bool chk_read(uintptr_t slot, size_t size, struct chk_slot *s) {
    return chk_decode(atomic_load_explicit(chk_word0(slot), memory_order_acquire), chk_key(slot),
                      size, s);
}

/* The i-th slot of r. */
static inline uintptr_t chk_slot_addr(const struct chk_region *r, uint32_t i) {
    uint32_t h = i >= r->per;
    return (uintptr_t)r + h * CHK_HALF + CHK_FIRST + (size_t)(i - h * r->per) * r->size;
}

/* The slot cut so far that holds byte x of r, or 0 (guard pages, the
 * descriptor, the slack at a half's end, slots not cut yet). */
uintptr_t chk_slot_at(uintptr_t x, const struct chk_region *r) {
    uintptr_t off = x - (uintptr_t)r;
    uint32_t h = off >= CHK_HALF;
    off -= h * CHK_HALF;
    if (off < CHK_FIRST || off >= CHK_FIRST + CHK_SPAN) return 0;
    size_t i = small_class_div(r->cls, off - CHK_FIRST);
    if (i >= r->per) return 0;
    if (h * r->per + i >= atomic_load_explicit(&r->carved, memory_order_acquire)) return 0;
    return x - (off - CHK_FIRST - i * r->size);
}

/* The slot whose block could start at a (from its header on), or 0. */
uintptr_t chk_slot_of(uintptr_t a, const struct chk_region *r) {
    if ((a & 15) || a - (uintptr_t)r < CHK_HDR) return 0;
    return chk_slot_at(a - CHK_HDR, r);
}

static struct chk_region *chk_region_new(uint32_t cls) {
    uint8_t *base = chk_map(HAK_REGION_SIZE);
    if (base == NULL) return NULL;
    if (!rmap_set_region(base, TIER_CHECK, chk_payload(cls, CHK_SLAB))) {
        os_unmap(base, HAK_REGION_SIZE);
        return NULL;
    }
    /* (Refused, at the map count limit: no guard, no other harm.) */
    (void)os_guard(base + HAK_PAGE_SIZE, HAK_PAGE_SIZE);
    (void)os_guard(base + CHK_HALF - HAK_PAGE_SIZE, 3 * HAK_PAGE_SIZE);
    (void)os_guard(base + HAK_REGION_SIZE - HAK_PAGE_SIZE, HAK_PAGE_SIZE);
    struct chk_region *r = (struct chk_region *)base;
    r->cls = cls;
    r->size = small_class_size[cls];
    r->per = (uint32_t)(CHK_SPAN / r->size);
    r->nslots = 2 * r->per;
    /* (On the class's list of every region, for the walk at exit.) */
    r->next = atomic_load_explicit(&chk_classes[cls].all, memory_order_relaxed);
    atomic_store_explicit(&chk_classes[cls].all, r, memory_order_release);
    return r;
}

/* A free slot's link to the next (word1) is xored with this. */
static inline uint64_t chk_link_key(uintptr_t slot) {
    return chk_salted(slot, chk_slink);
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
    return chk_slot_of(next + CHK_HDR, r) == next;
}

/* Where a freed slot's block was, for reports: its start and size. */
static uintptr_t chk_old_block(uintptr_t slot, size_t size, size_t *n) {
    struct chk_slot s;
    *n = 0;
    if (!chk_read(slot, size, &s)) return slot + CHK_HDR;
    *n = s.n;
    return slot + s.uoff;
}

/* The first byte of [a, end) that is not zero; end when none. a and end
 * 16-aligned (a slot past its header, and its end). 128 bytes a step, ORed
 * together with no branch, in 16-byte vectors: every reuse of a slot reads
 * it all, and a word at a time was a quarter of a checked pair's
 * instructions at 256 B (bench_scenarios json, 64 KiB: a third). */
typedef uint64_t chk_v2 __attribute__((vector_size(16)));
static inline chk_v2 chk_vload(uintptr_t a) {
    chk_v2 v;
    __builtin_memcpy(&v, (const void *)a, sizeof v);
    return v;
}
static uintptr_t chk_zero_scan(uintptr_t a, uintptr_t end) {
    uintptr_t x = a;
    for (; x + 128 <= end; x += 128) {
        chk_v2 o =
            (chk_vload(x) | chk_vload(x + 16)) | (chk_vload(x + 32) | chk_vload(x + 48)) |
            ((chk_vload(x + 64) | chk_vload(x + 80)) | (chk_vload(x + 96) | chk_vload(x + 112)));
        if ((o[0] | o[1]) != 0) break;
    }
    for (; x + 16 <= end; x += 16) { /* the rest, or the 128 bytes that hold one */
        chk_v2 v = chk_vload(x);
        if ((v[0] | v[1]) != 0) break;
    }
    for (; x < end; x += 8) {
        uint64_t w = chk_load(x);
        if (w != 0) return x + (uintptr_t)__builtin_ctzll(w) / 8;
    }
    return end;
}

/* A slot leaving the free list: every byte after its header must still be
 * zero, as its free left it. */
static void chk_verify_wipe(uintptr_t slot, size_t size, const char *fn) {
    uintptr_t bad = chk_zero_scan(slot + CHK_HDR, slot + size);
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
#define CHK_T_SIZE hak_align_up(sizeof(struct chk_thread), HAK_PAGE_SIZE)

HAK_HIDDEN __thread struct chk_thread *chk_me;
HAK_HIDDEN pthread_mutex_t chk_t_lock = PTHREAD_MUTEX_INITIALIZER;
static struct chk_thread *chk_t_unowned;

/* An unowned cache, or a new one; NULL when no memory. */
struct chk_thread *chk_thread_take(void) {
    hak_lock(&chk_t_lock);
    struct chk_thread *t = chk_t_unowned;
    if (t != NULL) chk_t_unowned = t->next;
    hak_unlock(&chk_t_lock);
    if (t != NULL) return t;
    t = os_map_aligned(CHK_T_SIZE, HAK_PAGE_SIZE);
    if (t != NULL) t->rng = chk_mix(hak_secret() ^ (uintptr_t)t) | 1;
    return t;
}

void chk_thread_give(struct chk_thread *t) {
    hak_lock(&chk_t_lock);
    t->next = chk_t_unowned;
    chk_t_unowned = t;
    hak_unlock(&chk_t_lock);
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
    /* (Up to the end of i's half: the slots cut are contiguous.) */
    uint32_t left = (i < r->per ? r->per : r->nslots) - i;
    uint32_t m = left < k ? left : k;
    /* (Cut is what a pointer must be in to be a block: chk_slot_of.) */
    atomic_store_explicit(&r->carved, i + m, memory_order_release);
    hak_unlock(&c->lock);
    t->fresh[cls] = chk_slot_addr(r, i);
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
void chk_class_push(uint32_t cls, uintptr_t head, uintptr_t last) {
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

void chk_quarantine(struct chk_thread *t, uintptr_t slot, size_t size, const char *fn) {
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

/* The first byte of slot (state s, word0 w) that is wrong, or 0: a freed
 * slot's bytes after its header must be zero, a live block's canaries
 * intact. *kind: what the byte is. */
static uintptr_t chk_slot_bad(uintptr_t slot, size_t size, const struct chk_slot *s,
                              enum diag_kind *kind) {
    if (s->state != CHK_FREED) return chk_slab_bad(slot, size, s, kind);
    *kind = DIAG_WRITE_AFTER_FREE;
    uintptr_t bad = chk_zero_scan(slot + CHK_HDR, slot + size);
    return bad != slot + size ? bad : 0;
}

/* Every slot cut from every region. Other threads may be freeing,
 * allocating and resizing meanwhile: a slot whose word0 is not the same
 * after the look as before is left alone (a free changes it before it
 * zeroes, a malloc after it paints, a realloc before the block grows; and
 * every store of word0 moves its generation on, so a block grown and
 * shrunk back does not show the same word0), and so is one being zeroed
 * (CHK_WIPING). The reads are a seqlock reader's,
 * racy and validated after: TSan reports them, so test_check's walk beside
 * busy threads runs outside TSan. */
void chk_walk_slots(const char *fn) {
    for (uint32_t cls = 0; cls < SMALL_NCLASSES; cls++) {
        const struct chk_region *r =
            atomic_load_explicit(&chk_classes[cls].all, memory_order_acquire);
        for (; r != NULL; r = r->next) {
            uint32_t carved = atomic_load_explicit(&r->carved, memory_order_acquire);
            for (uint32_t i = 0; i < carved; i++) {
                uintptr_t slot = chk_slot_addr(r, i);
                uint64_t w = atomic_load_explicit(chk_word0(slot), memory_order_acquire);
                struct chk_slot s;
                enum diag_kind kind;
                if (w == 0 || !chk_decode(w, chk_key(slot), r->size, &s) || s.state == CHK_WIPING)
                    continue;
                uintptr_t bad = chk_slot_bad(slot, r->size, &s, &kind);
                atomic_thread_fence(memory_order_acquire);
                if (bad == 0 || atomic_load_explicit(chk_word0(slot), memory_order_relaxed) != w)
                    continue;
                /* Found: looked at once more, and only the same byte under
                 * the same word0 again is a bug (a belt to the generation's
                 * braces: a word0 that came back after 256 stores). */
                if (chk_slot_bad(slot, r->size, &s, &kind) != bad) continue;
                atomic_thread_fence(memory_order_acquire);
                if (atomic_load_explicit(chk_word0(slot), memory_order_relaxed) != w) continue;
                uintptr_t u = slot + s.uoff;
                chk_report(fn, kind, u, s.n, (ptrdiff_t)(bad - u));
            }
        }
    }
}

void chk_walk(const char *fn) {
    chk_walk_slots(fn);
    chk_walk_big(fn);
}

void chk_exit(void) {
    if (chk_on) chk_walk("exit");
}

void *chk_slab_alloc(size_t n, size_t align, unsigned fam) {
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
    uint64_t key = chk_key(slot);
    unsigned gen = 0; /* word0's generation: the freed header's, one on */
    if (wiped) {
        chk_verify_wipe(slot, size, "malloc");
        /* (Its bits alone, not decoded: any other value would do as well.) */
        gen = (unsigned)(chk_info_of(atomic_load_explicit(chk_word0(slot), memory_order_relaxed),
                                     key) >>
                         CHK_GEN_SHIFT) +
              1;
        /* Not freed any more, not live yet: the walk at exit leaves a word0
         * of 0 alone, and this store is seen before any of the paint. */
        atomic_store_explicit(chk_word0(slot), 0, memory_order_relaxed);
        atomic_thread_fence(memory_order_release);
    }
    uintptr_t u = hak_align_up(slot + CHK_HDR, align);
    uint64_t w = chk_canary(slot);
    chk_paint(slot + 8, u, w);        /* word1 and the gap below an aligned block */
    chk_paint(u + n, slot + size, w); /* the tail */
    atomic_store_explicit(chk_word0(slot), chk_header(key, n, fam, CHK_LIVE, u - slot, gen),
                          memory_order_release);
    usage_add((int64_t)n); /* (in use: what was asked) */
    return (void *)u;
}
