/* Arena: one reservation, split in two halves (arena.h). */
#include "box/arena.h"

#include "box/lock.h"
#include "box/os.h"
#include "sizes.h"

#include <pthread.h>

#define ARENA_MAX       ((size_t)1 << 38)   /* 256 GiB */
#define ARENA_MIN       ((size_t)128 << 20) /* 64 MiB a half */
#define ARENA_UNIT      HAK_REGION_SIZE
#define ARENA_MAX_UNITS (ARENA_MAX / 2 / ARENA_UNIT)

static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static bool arena_tried;              /* reserved, or refused: never asked again */
static uintptr_t arena_base;          /* 0: refused */
static size_t arena_size;             /* the whole reservation */
static uintptr_t arena_mid;           /* the upper half */
static size_t arena_units, arena_top; /* units in the upper half; ever used */
/* Bit i: unit i (below arena_top) is free again. Lowest first. */
static uint64_t arena_free_units[ARENA_MAX_UNITS / 64];
static size_t arena_nfree, arena_used;
static uint64_t arena_fallbacks;

/* Reserve on first call. Lock held. */
static void arena_reserve(void) {
    if (arena_tried) return;
    arena_tried = true;
    size_t size = ARENA_MAX;
    /* Aligned to its size, so the upper half is aligned to its own. */
    void *base = os_reserve(&size, ARENA_MIN, ARENA_MAX);
    if (base == NULL) return;
    arena_base = (uintptr_t)base;
    arena_size = size;
    arena_mid = arena_base + size / 2;
    arena_units = size / 2 / ARENA_UNIT;
}

bool arena_ss_range(uintptr_t *base, size_t *span) {
    hak_lock(&arena_lock);
    arena_reserve();
    *base = arena_base;
    *span = arena_size / 2;
    hak_unlock(&arena_lock);
    return arena_base != 0;
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

void *arena_alloc(size_t size) {
    size_t n = (size + ARENA_UNIT - 1) / ARENA_UNIT;
    size_t first = SIZE_MAX;
    hak_lock(&arena_lock);
    arena_reserve();
    if (arena_nfree >= n) first = arena_find_free(n);
    if (first != SIZE_MAX) {
        arena_mark(first, n, false);
        arena_nfree -= n;
    } else if (arena_top + n <= arena_units) {
        first = arena_top;
        arena_top += n;
    }
    if (first != SIZE_MAX) arena_used += n;
    hak_unlock(&arena_lock);

    if (first != SIZE_MAX) {
        void *p = (void *)(arena_mid + first * ARENA_UNIT);
        if (os_commit(p, size)) return p;
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
    return os_map_aligned(hak_align_up(size, HAK_PAGE_SIZE), ARENA_UNIT);
}

void arena_free(void *p, size_t size) {
    uintptr_t a = (uintptr_t)p;
    if (!arena_owns(a)) {
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

void arena_fork_prepare(void) {
    pthread_mutex_lock(&arena_lock);
}
void arena_fork_parent(void) {
    pthread_mutex_unlock(&arena_lock);
}
void arena_fork_child(void) {
    pthread_mutex_init(&arena_lock, NULL);
}

void arena_get_stats(struct arena_stats *s) {
    hak_lock(&arena_lock);
    s->reserved = arena_size;
    s->units_used = arena_used;
    s->fallbacks = arena_fallbacks;
    hak_unlock(&arena_lock);
}
