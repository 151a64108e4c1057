/* Arena: one window of address space, grown in place (arena.h). */
#include "box/arena.h"

#include "box/config.h"
#include "box/lock.h"
#include "box/os.h"
#include "box/tier.h"
#include "sizes.h"

#include <pthread.h>
#include <stdatomic.h>

#define ARENA_WINDOW    ((size_t)1 << 38)   /* 256 GiB: two halves of 128 GiB */
#define ARENA_MIN       ((size_t)128 << 20) /* smallest window a fallback takes */
#define ARENA_STEP      ((size_t)32 << 20)  /* first reservation of each half */
#define ARENA_LIMIT_DIV 32 /* under an address-space limit, steps of at most 1/32 of it */
#define ARENA_UNIT      HAK_REGION_SIZE
#define ARENA_MAX_UNITS (ARENA_WINDOW / 2 / ARENA_UNIT)
#define ARENA_TRIES     4 /* windows tried at hint addresses before the fallback */
/* Guards that split a mapping (no guard markers): each costs a mapping of
 * the process's map count (65530 by default), so a bounded few. */
#define ARENA_SPLIT_GUARDS 1024

static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
/* Placing the window was tried and refused (address space exhausted): not
 * tried again until arena_trim, when memory went back. */
static bool arena_refused;
static uintptr_t arena_lo; /* the window; 0: refused */
static size_t arena_half;  /* size of each half: ARENA_WINDOW / 2, less in a fallback */
/* The whole window is reserved already (the fallback when no hint address
 * could be had): growing a half is then only making it readable. */
static bool arena_whole;
static size_t arena_ss_top; /* bytes of the lower half reserved (readable) */
static uintptr_t arena_mid; /* the upper half */
static size_t arena_units;  /* units of the upper half reserved */
static size_t arena_top;    /* units ever used */
/* The upper half could not grow (refused, or something mapped in the way):
 * not tried again until arena_trim, when memory went back. */
static bool arena_units_stuck;
/* Bit i: unit i (below arena_top) is free again. Lowest first. */
static uint64_t arena_free_units[ARENA_MAX_UNITS / 64];
static size_t arena_nfree, arena_used;
static uint64_t arena_fallbacks;
static _Atomic uint32_t arena_split_guards; /* guards made by mprotect so far */

/* The next step of a half with `have` bytes reserved: as much again, at
 * least ARENA_STEP, within the half. Under an address-space limit
 * (RLIMIT_AS, read each time: a program may set it while running) at most
 * 1/32 of it, as reserved space counts against it used or not. */
static size_t arena_step(size_t have) {
    size_t s = have < ARENA_STEP ? ARENA_STEP : have;
    size_t limit = os_as_limit();
    if (limit != SIZE_MAX) {
        /* A power of two of units: halving a refused step keeps whole units. */
        size_t cap = ARENA_UNIT;
        while (cap * 2 <= limit / ARENA_LIMIT_DIV)
            cap *= 2;
        if (s > cap) s = cap;
    }
    return s < arena_half - have ? s : arena_half - have;
}

/* Place the window on first use: its lower half's first step at a hint
 * address far from everything else (so both halves have room to grow in
 * place), else the whole window wherever the OS puts it. Lock held. */
static void arena_place(void) {
    /* The hint windows are taken once: a placement refused for want of
     * address space (a limit) is tried again, at the same places, after
     * memory went back; fresh hints each time would use up hint space. */
    static uintptr_t hints[ARENA_TRIES];
    static bool whole_tried;
    if (arena_lo != 0 || arena_refused) return;
    arena_refused = true; /* until it succeeds below */
    arena_half = ARENA_WINDOW / 2;
    size_t first = arena_step(0);
    for (int i = 0; i < ARENA_TRIES; i++) {
        uintptr_t w = hints[i] ? hints[i] : (hints[i] = os_hint(ARENA_WINDOW, ARENA_WINDOW));
        if (w == 0) break;
        if (!os_reserve_at((void *)w, first)) continue;
        if (!os_readable((void *)w, first)) {
            os_unmap((void *)w, first);
            continue;
        }
        arena_lo = w;
        arena_ss_top = first;
        break;
    }
    if (arena_lo == 0 && !whole_tried) {
        /* No hint honoured (a sanitizer's shadow, valgrind): the whole
         * window at once, as large as the OS grants. Once. */
        whole_tried = true;
        size_t size = ARENA_WINDOW;
        void *w = os_reserve(&size, ARENA_MIN, ARENA_WINDOW);
        if (w == NULL) return;
        arena_lo = (uintptr_t)w;
        arena_half = size / 2;
        arena_whole = true;
    }
    if (arena_lo == 0) return;
    arena_mid = arena_lo + arena_half;
    arena_refused = false;
}

/* Reserve [at, at + *step) after a half's reserved part, readable when
 * asked; under an address-space limit (or anything else in the way) the
 * step is halved down to `need`. false when not even that is granted. */
static bool arena_extend(uintptr_t at, size_t *step, size_t need, bool readable) {
    /* Steps and need are whole units; so is every half taken. */
    for (size_t s = *step; s >= need && s > 0; s = s / 2 & ~(ARENA_UNIT - 1)) {
        if (!arena_whole && !os_reserve_at((void *)at, s)) continue;
        if (readable && !os_readable((void *)at, s)) {
            if (!arena_whole) os_unmap((void *)at, s);
            continue;
        }
        *step = s;
        return true;
    }
    return false;
}

bool arena_ss_grow(uintptr_t *base, size_t *span) {
    hak_lock(&arena_lock);
    arena_place();
    bool grew = false;
    if (arena_lo != 0 && arena_ss_top < arena_half) {
        /* Readable: free may read a descriptor anywhere in the range. */
        size_t step = arena_step(arena_ss_top);
        grew = arena_extend(arena_lo + arena_ss_top, &step, HAK_REGION_SIZE, true);
        if (grew) arena_ss_top += step;
    }
    grew |= arena_ss_top > *span; /* the window's first step */
    *base = arena_lo;
    *span = arena_ss_top;
    hak_unlock(&arena_lock);
    return grew;
}

bool arena_ss_shrink(size_t top) {
    bool any = false;
    hak_lock(&arena_lock);
    if (!arena_whole && top < arena_ss_top &&
        os_unmap((void *)(arena_lo + top), arena_ss_top - top)) {
        arena_ss_top = top;
        any = true;
    }
    hak_unlock(&arena_lock);
    return any;
}

/* n consecutive free units below arena_top; their first, or SIZE_MAX. */
static size_t arena_find_free(size_t n) {
    size_t run = 0;
    for (size_t i = 0; i < arena_top; i++) {
        if (!(arena_free_units[i / 64] >> (i % 64) & 1)) {
            run = 0;
            if (arena_free_units[i / 64] >> (i % 64) == 0) i |= 63; /* rest of the word used */
            continue;
        }
        if (++run == n) return i + 1 - n;
    }
    return SIZE_MAX;
}

static void arena_mark(size_t first, size_t n, bool free) {
    for (size_t i = first; i < first + n; i++) {
        if (free)
            arena_free_units[i / 64] |= 1ull << (i % 64);
        else
            arena_free_units[i / 64] &= ~(1ull << (i % 64));
    }
}

static inline bool arena_owns(uintptr_t a) {
    return a - arena_mid < arena_units * ARENA_UNIT;
}

/* n units past arena_top, reserving more of the upper half if needed; their
 * first, or SIZE_MAX. Lock held. */
static size_t arena_take_top(size_t n) {
    size_t max = arena_half / ARENA_UNIT;
    if (arena_lo == 0 || arena_top + n > max) return SIZE_MAX;
    if (arena_top + n > arena_units) {
        size_t have = arena_units * ARENA_UNIT, need = (arena_top + n) * ARENA_UNIT - have;
        size_t step = arena_step(have);
        if (step < need) step = need;
        /* Inaccessible until committed: nothing reads the upper half's
         * unused parts (the region map says they are no one's). */
        if (arena_units_stuck || !arena_extend(arena_mid + have, &step, need, false)) {
            arena_units_stuck = true; /* no syscalls per chunk while it cannot grow */
            return SIZE_MAX;
        }
        arena_units += step / ARENA_UNIT;
    }
    arena_top += n;
    return arena_top - n;
}

/* A guard that splits a mapping (no markers) may be made: one of the
 * first ARENA_SPLIT_GUARDS. */
static bool arena_split_guard_left(void) {
    return atomic_fetch_add_explicit(&arena_split_guards, 1, memory_order_relaxed) <
           ARENA_SPLIT_GUARDS;
}

/* Commit [p, p+size) with its last page a guard (arena.h). false when the
 * OS refused. */
static bool arena_commit(uint8_t *p, size_t size) {
    /* An earlier run's guard marker may still be inside this one: giving
     * units back (arena_free) takes markers away only when the kernel grants
     * a fresh mapping, and the madvise that drops the pages instead keeps
     * them; so may units a refused unmap left at the top (arena_trim)
     * (fuzz_api: a block written over one faulted). One call a run. */
    if (os_guard_markers() && !os_guard_remove(p, size)) return false;
    if (hak_huge_heaps()) return os_commit(p, size); /* a guard would split a huge page */
    if (os_guard_markers()) {
        if (!os_commit(p, size)) return false;
        /* (Refused in locked memory: no guard then.) */
        os_guard_add(p + size - ARENA_GUARD, ARENA_GUARD);
        return true;
    }
    /* The last page is left as the reservation (or arena_free) made it. */
    return os_commit(p, arena_split_guard_left() ? size - ARENA_GUARD : size);
}

/* arena_alloc's unit(s), in small pages: records' units too. */
static void *arena_take(size_t size) {
    size_t n = (size + ARENA_UNIT - 1) / ARENA_UNIT;
    size_t first = SIZE_MAX;
    hak_lock(&arena_lock);
    arena_place();
    if (arena_nfree >= n) first = arena_find_free(n);
    if (first != SIZE_MAX) {
        arena_mark(first, n, false);
        arena_nfree -= n;
    } else {
        first = arena_take_top(n);
    }
    if (first != SIZE_MAX) arena_used += n;
    hak_unlock(&arena_lock);

    if (first != SIZE_MAX) {
        uint8_t *p = (uint8_t *)(arena_mid + first * ARENA_UNIT);
        if (arena_commit(p, size)) return p;
        hak_lock(&arena_lock); /* refused (commit limit): the units are free again */
        arena_mark(first, n, true);
        arena_nfree += n;
        arena_used -= n;
        hak_unlock(&arena_lock);
        return NULL;
    }
    hak_lock(&arena_lock);
    arena_fallbacks++;
    hak_unlock(&arena_lock);
    size = hak_align_up(size, HAK_PAGE_SIZE);
    uint8_t *p = os_map_aligned(size, ARENA_UNIT);
    if (p != NULL && !hak_huge_heaps() && (os_guard_markers() || arena_split_guard_left()))
        os_guard_add(p + size - ARENA_GUARD, ARENA_GUARD);
    return p;
}

void *arena_alloc(size_t size) {
    void *p = arena_take(size);
    if (p != NULL && hak_huge_heaps()) os_hugepages(p, size); /* (HAKMEM_HUGEPAGES=2) */
    return p;
}

/* The unit records are carved from, and what is left of it. */
static uint8_t *arena_meta_cur;
static size_t arena_meta_left;

void *arena_meta(size_t size) {
    size = hak_align_up(size, 64);
    if (size > ARENA_UNIT - ARENA_GUARD) return NULL;
    hak_lock(&arena_lock);
    if (arena_meta_left < size) {
        hak_unlock(&arena_lock);
        uint8_t *u = arena_take(ARENA_UNIT); /* (records: small pages) */
        if (u == NULL) return NULL;
        hak_lock(&arena_lock);
        arena_meta_cur = u; /* (a unit another thread took meanwhile keeps its rest) */
        arena_meta_left = ARENA_UNIT - ARENA_GUARD;
    }
    void *p = arena_meta_cur;
    arena_meta_cur += size;
    arena_meta_left -= size;
    hak_unlock(&arena_lock);
    return p;
}

void arena_free(void *p, size_t size) {
    uintptr_t a = (uintptr_t)p;
    hak_lock(&arena_lock);
    bool owned = arena_owns(a);
    hak_unlock(&arena_lock);
    if (!owned) {
        os_unmap(p, hak_align_up(size, HAK_PAGE_SIZE));
        return;
    }
    /* Pages gone, place read-only and zero again before anyone can take it. */
    os_uncommit(p, hak_align_up(size, HAK_PAGE_SIZE));
    size_t n = (size + ARENA_UNIT - 1) / ARENA_UNIT;
    hak_lock(&arena_lock);
    arena_mark((a - arena_mid) / ARENA_UNIT, n, true);
    arena_nfree += n;
    arena_used -= n;
    hak_unlock(&arena_lock);
}

bool arena_trim(void) {
    bool any = false;
    hak_lock(&arena_lock);
    arena_refused = arena_units_stuck = false; /* memory went back: may fit now */
    if (os_as_limit() == SIZE_MAX) {           /* reservations cost nothing: keep them */
        hak_unlock(&arena_lock);
        return false;
    }
    /* Free units at the top are never-used ones again. */
    while (arena_top > 0 &&
           (arena_free_units[(arena_top - 1) / 64] >> ((arena_top - 1) % 64) & 1)) {
        arena_top--;
        arena_free_units[arena_top / 64] &= ~(1ull << (arena_top % 64));
        arena_nfree--;
    }
    if (!arena_whole && arena_units > arena_top &&
        os_unmap((void *)(arena_mid + arena_top * ARENA_UNIT),
                 (arena_units - arena_top) * ARENA_UNIT)) {
        arena_units = arena_top;
        any = true;
    }
    hak_unlock(&arena_lock);
    return any;
}

void arena_fork_prepare(void) {
    pthread_mutex_lock(&arena_lock);
}
void arena_fork_release(bool child) {
    (void)child; /* the same in parent and child */
    pthread_mutex_unlock(&arena_lock);
}

void arena_get_stats(struct arena_stats *s) {
    hak_lock(&arena_lock);
    s->reserved = arena_whole ? 2 * arena_half : arena_ss_top + arena_units * ARENA_UNIT;
    s->units_used = arena_used;
    s->fallbacks = arena_fallbacks;
    hak_unlock(&arena_lock);
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void arena_collect(enum tier_collect kind, struct tier_done *done) {
    if (kind == COLLECT_TRIM)
        tier_released(done, arena_trim()); /* after the tiers: what they gave back */
}

static void arena_tier_stats(struct tier_stats *s) {
    struct arena_stats a;
    arena_get_stats(&a);
    tier_row(s, "arena.reserved_bytes", a.reserved);
    tier_row(s, "arena.units_used", a.units_used);
    tier_row(s, "arena.fallbacks", a.fallbacks);
}

const struct tier_ops arena_tier = {.name = "arena",
                                    .collect = arena_collect,
                                    .fork_prepare = arena_fork_prepare,
                                    .fork_release = arena_fork_release,
                                    .stats = arena_tier_stats};
