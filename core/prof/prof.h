/* Heap profiler (HAKMEM_PROF): which calls hold the memory in use.
 *
 * Allocations are sampled as if a random point fell on every
 * HAKMEM_PROF_SAMPLE-th byte allocated on average (a Poisson process over
 * the bytes, as in jemalloc and tcmalloc): an allocation of n bytes is
 * sampled with probability 1 - exp(-n/S). The front asks this box when the
 * next sample is due (per size class, in allocations: the thread caches
 * count them down at no cost; and in bytes for the rest) and moves a
 * sampled block where its free is seen: the Large tier, which records it
 * here with its call stack and tells of its frees and reallocs. A realloc
 * that moves a block is a new allocation; one that keeps it (a class's
 * block in its class, a Large block resized) draws only the bytes it grows
 * by, and a sampled block keeps its record. A dump writes the live samples,
 * each scaled by 1/probability, in the heap-profile format pprof reads.
 *
 * This box knows no tier: it is handed addresses and sizes. Its files:
 * prof.c (sampling, the records), dump.c (the profile written out),
 * unwind.c (the stack walker), internal.h (what they share). */
#ifndef HAK_PROF_H
#define HAK_PROF_H

#include "sizes.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Sampling is on (set once, by prof_start, after the unwinder is loaded). */
extern HAK_HIDDEN bool prof_on;
/* This thread is recording a sample: what the unwinder allocates is not
 * sampled (it would recurse). */
extern HAK_HIDDEN __thread bool prof_busy;

/* Turn sampling on, one sample per `sample` bytes on average, dumping at
 * exit to `file` (%p: the process id). Loads the unwinder: call where malloc
 * works, not from inside the allocator. */
void prof_start(uint64_t sample, const char *file);
/* The settings were read and sampling stays off. */
void prof_decline(void);

/* Allocations of a class of `size` bytes to pass before the next sampled
 * one (>= 0); huge with sampling off, small until the settings are read (so
 * that a thread's countdowns started then come back soon). */
int64_t prof_countdown(size_t size);
/* This thread's countdown of bytes outside the class countdowns: below 0,
 * a sample is due (prof_bytes_passed). */
extern HAK_HIDDEN __thread int64_t prof_bytes_left;
/* The countdown passed 0 at an allocation of n bytes: true when it is to be
 * sampled, the countdown restarted. False at the thread's first, and while
 * it records a sample (prof_busy: the bytes are given back, none drawn). */
bool prof_bytes_passed(size_t n);

/* Count n bytes outside the class countdowns down: true when the countdown
 * passed 0 (prof_bytes_passed decides then). A caller keeping its fast path
 * free of calls tests this and calls prof_bytes_passed apart. */
HAK_INLINE bool prof_bytes_count(size_t n) {
    return hak_unlikely((prof_bytes_left -= (int64_t)n) < 0);
}

/* An allocation of n bytes outside the class countdowns (a Large block, a
 * block realloc grows in place): true when it is to be sampled. Only with
 * prof_on. */
HAK_INLINE bool prof_bytes_due(size_t n) {
    return prof_bytes_count(n) && prof_bytes_passed(n);
}

/* A sample's record: what the calls below take, from the one that made it. */
struct prof_rec;

/* p, n bytes asked, is a sampled block: one chosen with the probability of
 * `size` bytes (its class size, or n). Takes the stack of the calls that led
 * here. Its record, or NULL: sampling is off, or there was no memory for one
 * (the sample is lost, and counted). */
struct prof_rec *prof_record(const void *p, size_t n, size_t size);
/* The sampled block of record r (NULL: none) is freed, or its sample
 * dropped. */
void prof_forget(struct prof_rec *r);
/* ... is at `to` now (where it was, or its pages moved) and n bytes, after
 * a realloc that kept it the same block. Past the bytes its chance was
 * that of, it has that of n: an unsampled block growing so far draws the
 * difference (the Large tier's large_follow). Takes no lock where the block
 * stays: only the block's own calls change its record, as they alone may
 * use the block. */
void prof_resize(struct prof_rec *r, const void *to, size_t n);
/* The bytes whose chance r was sampled with; 0 for NULL. */
size_t prof_drawn(const struct prof_rec *r);
/* An allocation was chosen but not sampled: its tier had no room for a
 * sampled block. Counted, and said at exit: the profile undercounts. */
void prof_lost(void);

/* Write the profile to `path` (NULL: the HAKMEM_PROF_FILE of prof_start);
 * 0, or -1 with errno (EINVAL: sampling is off; ENAMETOOLONG; EDEADLK: the
 * records stayed locked for a second). Writes with no lock held; not
 * cancelled halfway, a cancellation point at its end (hakmem.h). */
int prof_dump(const char *path);
/* At exit: the dump to the configured file; a line on stderr if it fails. */
void prof_exit(void);

void prof_fork_prepare(void);
void prof_fork_release(bool child);

/* Its part of the tier contract (box/tier.h): its lock at fork. */
extern HAK_HIDDEN const struct tier_ops prof_tier;

#endif
