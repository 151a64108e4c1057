/* Large tier: the spares, the mappings of freed sampled blocks that are not
 * Large, kept apart from the BigCache (cache.c) for the next sample. */
#include "large/internal.h"

#include "box/bell.h"
#include "box/clock.h"
#include "box/config.h"
#include "box/lock.h"
#include "sizes.h"

#include <string.h>

HAK_HIDDEN struct large_spares large_spares = {.lock = HAK_SPIN_INIT};

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
bool large_spare_put(struct large_hdr *h) {
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
uint32_t large_spare_drain(struct large_hdr **out) {
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
uint64_t large_spare_age(uint64_t now) {
    hak_spin_lock(&large_spares.lock); /* (the look the bell's promise needs: bell.h) */
    uint64_t used = large_spares.used_ms;
    hak_spin_unlock(&large_spares.lock);
    if (used == 0) return UINT64_MAX;
    /* (now was read before the lock: a put since may be later.) */
    if (used >= now || now - used < hak_cfg.age_ms) return used + hak_cfg.age_ms;
    large_spare_flush();
    return UINT64_MAX;
}
