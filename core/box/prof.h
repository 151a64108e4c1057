/* Heap profiler (HAKMEM_PROF): which calls hold the memory in use.
 *
 * Allocations are sampled as if a random point fell on every
 * HAKMEM_PROF_SAMPLE-th byte allocated on average (a Poisson process over
 * the bytes, as in jemalloc and tcmalloc): an allocation of n bytes is
 * sampled with probability 1 - exp(-n/S). The front asks this box when the
 * next sample is due (per size class, in allocations: the thread caches
 * count them down at no cost; and in bytes for the rest), moves a sampled
 * block where its free is seen (the Large tier, which calls prof_forget),
 * and records it here with its call stack. A dump writes the live samples,
 * each scaled by 1/probability, in the heap-profile format pprof reads.
 *
 * This box knows no tier: it is handed addresses and sizes. */
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
/* An allocation of n bytes outside the class countdowns (a Large block):
 * true when it is to be sampled. Only with prof_on. */
bool prof_bytes_due(size_t n);

/* p, n bytes asked, is a sampled block: one chosen with the probability of
 * `size` bytes (its class size, or n). Takes the stack of the calls that led
 * here. */
void prof_record(const void *p, size_t n, size_t size);
/* p, a sampled block, is freed (or its sample dropped). */
void prof_forget(const void *p);
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
void prof_fork_release(void);

#endif
