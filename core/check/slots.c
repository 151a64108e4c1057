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

/* A slab region: its descriptor alone in the first page, a guard page (an
 * underflow below the first slot faults there), then slots. */
#define CHK_FIRST     (2 * HAK_PAGE_SIZE)
#define CHK_SLOTS_END (HAK_REGION_SIZE - HAK_PAGE_SIZE) /* then a guard page */

HAK_HIDDEN struct chk_class chk_classes[SMALL_NCLASSES] = {
    [0 ... SMALL_NCLASSES - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

static bool chk_read(uintptr_t slot, size_t size, struct chk_slot *s) {
    return chk_decode(atomic_load_explicit(chk_word0(slot), memory_order_acquire), chk_key(slot),
                      size, s);
}

/* The slot whose block could start at a (from its header on), or 0. */
uintptr_t chk_slot_of(uintptr_t a, const struct chk_region *r) {
    uintptr_t first = (uintptr_t)r + CHK_FIRST;
    if ((a & 15) || a < first + CHK_HDR) return 0;
    size_t i = small_class_div(r->cls, a - first - CHK_HDR);
    if (i >= atomic_load_explicit(&r->carved, memory_order_acquire)) return 0;
    return first + i * r->size;
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
    (void)os_guard(base + CHK_SLOTS_END, HAK_PAGE_SIZE);
    struct chk_region *r = (struct chk_region *)base;
    r->cls = cls;
    r->size = small_class_size[cls];
    r->nslots = (uint32_t)((CHK_SLOTS_END - CHK_FIRST) / r->size);
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

/* Verify the wipe of everything in t's quarantine (exit). */
static void chk_thread_verify(const struct chk_thread *t) {
    for (size_t i = 0; i < CHK_T_RAND; i++)
        if (t->rand[i]) chk_verify_wipe(t->rand[i], chk_region_of(t->rand[i])->size, "exit");
    for (size_t i = 0; i < t->n; i++) {
        uintptr_t x = t->ring[(t->head + i) % CHK_T_RING];
        chk_verify_wipe(x, chk_region_of(x)->size, "exit");
    }
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
