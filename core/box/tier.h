/* The tier contract: the cold operations every module with state of its own
 * offers the front, which holds them in one table (core/front/tiers.c)
 * whose order is the lock order. Lifecycle, fork, malloc_trim, the ageing
 * looks, the background thread, mallinfo2 and the stats report loop over
 * the table; none names a tier. The hot paths are not here: they stay
 * static inline in each tier's header, dispatched by the region map's kind.
 *
 * Every field may be NULL: the module has no such work. */
#ifndef HAK_TIER_H
#define HAK_TIER_H

#include "box/stats.h"

#include <stdbool.h>
#include <stdint.h>

/* Which tier owns a block: the region map's kind of entry (box/rmap.h: its
 * low 8 bits), the tier a report names (box/diag.h) and the front's
 * dispatch are this one enum. Tiny's blocks live in SuperSlabs, which have
 * a range of their own: no region-map entry is ever TIER_TINY. */
enum hak_tier {
    TIER_NONE = 0, /* no tier's memory */
    TIER_L25 = 1,
    TIER_LARGE = 2,
    TIER_POOL = 3,
    TIER_CHECK = 4,
    TIER_TINY = 5,
};

/* What a collect is asked to do. */
enum tier_collect {
    /* This thread's periodic look at its own caches (every age at most, on
     * its own allocations): what it alone may touch. */
    COLLECT_THREAD,
    /* One thread's periodic look for the process (every age at most, one
     * thread at a time): a pass of each tier whose own timer says one is
     * due. */
    COLLECT_AGE,
    /* The background thread's pass (HAKMEM_BACKGROUND): what is due now,
     * and when the next thing is. */
    COLLECT_IDLE,
    /* malloc_trim: everything that can go back to the OS, now. */
    COLLECT_TRIM,
    /* This thread exits: what it caches goes back (from the thread box's
     * exit hook; in the table's reverse order, so the layers above give
     * back to the layers below before these close). */
    COLLECT_EXIT,
};

/* What a collect did, gathered over the table. */
struct tier_done {
    bool released;    /* memory went back to the OS (malloc_trim's answer) */
    uint64_t next_ms; /* COLLECT_IDLE: when something is next due; UINT64_MAX none */
};

static inline void tier_released(struct tier_done *d, bool released) {
    d->released |= released;
}

static inline void tier_due(struct tier_done *d, uint64_t ms) {
    if (ms < d->next_ms) d->next_ms = ms;
}

/* What a module reports: mallinfo2's fields, and the stats report's rows
 * (rows NULL for mallinfo2). Each adds its own. */
struct tier_stats {
    uint64_t mapped;     /* address space of the size-classed tiers */
    uint64_t carved;     /* of it, bytes carved into blocks */
    uint64_t own_blocks; /* blocks with a mapping of their own */
    uint64_t own_bytes;  /* their bytes */
    uint64_t kept_bytes; /* freed mappings kept for reuse */
    struct stats_row *rows;
    uint32_t nrows, max_rows;
    struct stats_class *classes; /* the Tiny table: nclasses rows */
    uint32_t nclasses;
};

/* A row of the stats report, in the text report's order. */
static inline void tier_row(struct tier_stats *s, const char *name, uint64_t v) {
    if (s->rows != NULL && s->nrows < s->max_rows)
        s->rows[s->nrows++] = (struct stats_row){name, v};
}

struct tier_ops {
    const char *name;
    void (*collect)(enum tier_collect kind, struct tier_done *done);
    /* A thread armed its exit hook (box/thread.h): what it batches may wait
     * until the hook runs. */
    void (*thread_armed)(void);
    /* fork: take every lock (in table order, before the fork), release them
     * (reverse order, parent and child alike: in the child the forking
     * thread, their owner, is the only thread), then in the child only set
     * right what other threads had in hand (table order). */
    void (*fork_prepare)(void);
    void (*fork_release)(bool child);
    void (*fork_child)(void);
    void (*stats)(struct tier_stats *s);
};

#endif
