/* Usage: bytes in use, now and at most so far, for the stats. "In use" is
 * what the tiers have handed out, counted where they know it on their slow
 * paths: a Tiny or L2.5 block from when it leaves its slab or
 * bundle (into a thread cache or to the program) until it is back there (a
 * thread cache's flush; for a block freed by another thread, its slab
 * owner's drain of the remote list), at its class size; the Pool tier's
 * blocks as they are carved, until their chunk is empty (see pool.c); a
 * Large block at its mapping's size; a checked-mode block at the size
 * asked. So blocks sitting in thread caches count, and the thread caches'
 * pop and push count nothing: they pay no instruction for this.
 *
 * Each thread gathers its changes and publishes them to the shared counter
 * once they add up to USAGE_SLACK either way, so a refill, a remote free or
 * a Large malloc costs a thread-local add, not an atomic on a line all
 * threads write. A thread publishes the rest when it exits (from its exit
 * hook) and before it reads the counter; until then another thread's
 * reading may miss up to USAGE_SLACK of each thread's latest changes. The
 * peak is kept at each publishing: the value published before plus the
 * highest the thread's own changes reached since (exact for one thread; with
 * several, their highs may not have been at the same moment). */
#ifndef HAK_USAGE_H
#define HAK_USAGE_H

#include "sizes.h"

#include <stdatomic.h>
#include <stdint.h>

/* 64 MiB: a Large block of a few MiB published at every malloc and free
 * with 256 KiB (two atomics a pair, on a line every thread writes), and an
 * L2.5 block of up to 1 MiB nearly so (with 64 KiB, bench/instr.sh at
 * 100000 B counted 51 more instructions a pair than with 256 KiB). */
#define USAGE_SLACK ((int64_t)64 << 20)
/* The tiers' own counters of carved bytes (usage_batch_add), read by
 * mallinfo2: kept closer. */
#define USAGE_BATCH_SLACK ((int64_t)256 << 10)

/* This thread's changes not published yet, the highest they reached since
 * the last publishing, and when they are published: once pending +
 * USAGE_SLACK >= span, as unsigned. span is 2 * USAGE_SLACK + 1 (past
 * USAGE_SLACK either way) while the thread has an exit hook that publishes
 * the rest (usage_thread_start), 0 (at once) before and after. One
 * thread-local object: one address to compute, not three. */
struct usage_tls {
    int64_t pending;
    int64_t high;
    uint64_t span;
};
extern HAK_HIDDEN __thread struct usage_tls usage_tls;

/* Publish this thread's pending changes. */
void usage_publish(void);

/* `bytes` more in use (fewer when negative). Slow paths only. */
static inline void usage_add(int64_t bytes) {
    usage_tls.pending += bytes;
    if (usage_tls.pending > usage_tls.high) usage_tls.high = usage_tls.pending;
    if ((uint64_t)(usage_tls.pending + USAGE_SLACK) >= usage_tls.span) usage_publish();
}

/* The same batching for a tier's own shared counter (carved bytes): this
 * thread's changes gather in *pending and go to *total once they pass
 * `slack` either way; the tier publishes the rest (usage_batch_flush) at
 * its thread exit and before it reads *total. */
static inline void usage_batch_flush(_Atomic int64_t *total, int64_t *pending) {
    if (*pending != 0) atomic_fetch_add_explicit(total, *pending, memory_order_relaxed);
    *pending = 0;
}

static inline void usage_batch_add(_Atomic int64_t *total, int64_t *pending, int64_t d,
                                   int64_t slack) {
    *pending += d;
    if (*pending >= slack || *pending <= -slack) usage_batch_flush(total, pending);
}

/* This thread's exit hook is armed: changes may wait. */
void usage_thread_start(void);
/* Its exit hook runs: publish, and from now on at once. */
void usage_thread_exit(void);

/* The published counter (after this thread's changes are published). */
uint64_t usage_current(void);
uint64_t usage_peak(void);

/* Its part of the tier contract (box/tier.h): usage_thread_start when a
 * thread arms, usage_thread_exit when it exits. */
extern HAK_HIDDEN const struct tier_ops usage_tier;

#endif
