/* OS boundary: the only module that calls mmap, munmap, madvise, mremap,
 * mprotect and mlock/munlock.
 * Every call is counted by kind so stats and tests can see the syscall traffic. */
#ifndef HAK_OS_H
#define HAK_OS_H

#include "sizes.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum os_call { OS_MMAP, OS_MUNMAP, OS_MADVISE, OS_MREMAP, OS_MPROTECT, OS_MLOCK, OS_NCALLS };

/* Anonymous read-write mapping of `size` bytes (a page multiple) whose start
 * is aligned to `align` (a power of two >= page). NULL when the OS refuses. */
void *os_map_aligned(size_t size, size_t align);
/* false when refused (splitting a mapping past the map count limit): the
 * range is then still mapped. */
bool os_unmap(void *p, size_t size);
/* Give the pages back; they read as zero when touched again. false (and
 * the pages kept, contents and all) when the OS refuses: locked pages
 * (mlockall). errno is left alone. */
bool os_decommit(void *p, size_t size);
/* Ask for transparent huge pages on [p, p+size); false when the kernel
 * refuses (THP off or unsupported), which changes nothing else. */
bool os_hugepages(void *p, size_t size);
/* Make the pages of [p, p+size) (both page multiples) resident and
 * writable in one call, where touching them would take a page fault each
 * (each costs a trip into the kernel; in a virtual machine, many
 * microseconds). false when the kernel cannot (before Linux 5.14, which says
 * EINVAL for a well-formed range: then never asked again) or has no memory
 * for them, which changes nothing else: they fault in when touched. errno is
 * left alone. */
bool os_populate(void *p, size_t size);
/* Grow or shrink a mapping where it stands; false when the range beyond it
 * is taken (the mapping is then untouched). */
bool os_resize(void *p, size_t old_size, size_t new_size);
/* Move a mapping's pages onto dst (a mapping of new_size from os_map_aligned,
 * which it replaces), resizing it; no byte is copied. false when refused. */
bool os_move(void *p, size_t old_size, size_t new_size, void *dst);

/* The address-space limit (RLIMIT_AS) in bytes; SIZE_MAX when there is none.
 * Read now: a system call, which takes a lock of the whole process in the
 * kernel (prlimit64: its leader's task lock). For decisions that outlive
 * the call (reservations kept, chunk and bundle sizes). */
size_t os_as_limit(void);
/* The same as read at most 10 ms ago and since the last refused call: for a
 * decision made on every allocation (a Large malloc asked for it each time:
 * malloc-large, 1967 calls), where a stale one costs at most that
 * allocation a refusal, after which it is read again. */
size_t os_as_limit_recent(void);

/* A hint address for a `span`-byte mapping aligned to `align`, from an area
 * well away from the kernel's own placements, never handed out twice; 0
 * when that area is used up. */
uintptr_t os_hint(size_t span, size_t align);

/* Reserved address space: inaccessible (PROT_NONE, MAP_NORESERVE): no
 * memory, no commit charge, and nothing mlockall(MCL_CURRENT) would populate.
 * Under mlockall(MCL_FUTURE) it is unlocked at once (os_commit locks what it
 * commits). It counts against RLIMIT_AS, though: reserve what is needed.
 *
 * os_reserve: the largest power-of-two size from *size down to min (both
 * powers of two >= page) that the OS grants, aligned to `align` or to its
 * own size when that is smaller; *size says what was granted. Under an
 * address-space limit no more than an eighth of it is asked for, unless
 * that is below min. NULL when not even min is granted. */
void *os_reserve(size_t *size, size_t min, size_t align);
/* Reserve exactly [p, p+size), where nothing is mapped; false when anything
 * is in the way or the OS refuses (nothing is then changed). */
bool os_reserve_at(void *p, size_t size);
/* Make reserved [p, p+size) readable: it reads as zeros and still costs no
 * memory. false when refused. */
bool os_readable(void *p, size_t size);
/* Make [p, p+size) inside a reservation (or made inaccessible by os_guard)
 * readable and writable: zero-filled where it has no pages, as they were
 * where it has (locked, if the program asked for all its memory locked).
 * false, and nothing changed, when the OS refuses. */
bool os_commit(void *p, size_t size);
/* Give [p, p+size) inside a reservation back to the OS: its pages go, the
 * addresses stay reserved, read-only and reading as zeros (always: if the
 * OS refuses to drop the pages, they are cleared, so the range must be
 * writable: none of it inaccessible). */
void os_uncommit(void *p, size_t size);
/* The same, but [p, p+size) stays readable throughout (its old bytes, then
 * zeros), for memory other threads may read meanwhile without a lock (the
 * SuperSlab headers); under mlockall(MCL_FUTURE) the kernel maps its zero
 * pages at once, so for small ranges only. */
void os_uncommit_readable(void *p, size_t size);

/* Make [p, p+size) (page multiples) inaccessible: a guard, where any access
 * faults. false when refused (the pages are then as they were). */
bool os_guard(void *p, size_t size);
/* A guard that is taken away again: [p, p+size) (page multiples) inside a
 * mapping faults on any access and costs no memory; it stays through
 * os_decommit. Where the kernel has guard markers (Linux 6.13) the mapping
 * stays one mapping; older kernels get mprotect, which splits it, and
 * mremap refuses a range over two: take the guard away before os_resize or
 * os_move of a range that holds it. false when refused (nothing changed;
 * the kernel refuses markers in locked memory). */
bool os_guard_add(void *p, size_t size);
/* Take os_guard_add's guard away: [p, p+size) is readable and writable
 * again. false when refused: it may still fault. */
bool os_guard_remove(void *p, size_t size);
/* Whether os_guard_add costs no mapping (the kernel has guard markers). */
bool os_guard_markers(void);

uint64_t os_calls(enum os_call kind);

/* Address space hakmem has mapped, now and at most so far: every mapping
 * this module made and has not unmapped, whatever its protection (the
 * arena's inaccessible reservations included: they cost no memory, but
 * count against RLIMIT_AS). Exact: kept on every mmap, munmap and mremap. */
uint64_t os_mapped(void);
uint64_t os_mapped_peak(void);

/* Calls of this thread the OS refused (a mapping, a commit, a move: memory or
 * address space it would not give) since the last call of this; resets. */
uint32_t os_take_refusals(void);

/* A process-wide memory barrier (membarrier(2), private expedited): when
 * os_barrier returns, every other thread of the process that was running
 * has passed a full barrier, so a thread's plain store and its later load
 * are ordered against the caller's store before and load after the call.
 * os_barrier_register registers the process for it (once; again in a fork
 * child does no harm); false where the kernel has no membarrier. errno is
 * the caller's. */
bool os_barrier_register(void);
bool os_barrier(void);

/* After a fork (the tier contract's release step): in the child, what the
 * parent learnt of mlockall does not hold. */
void os_fork_release(bool child);

#ifdef HAK_FAULT_INJECT
/* Test builds only (the release build has none of this): make OS calls fail
 * as the kernel does when out of memory, map count or address space, with
 * errno ENOMEM. After os_fault_arm(skip, count) the next `skip` calls go
 * through, the `count` after them fail (UINT64_MAX: all, until disarmed),
 * then calls go through again. Every call in this module counts: each
 * memory call site (enum os_site) is one point of failure. */
enum os_site {
    OS_SITE_MMAP,            /* os_map_aligned, os_reserve: mmap */
    OS_SITE_MUNMAP,          /* os_unmap */
    OS_SITE_DECOMMIT,        /* os_decommit: madvise MADV_DONTNEED */
    OS_SITE_HUGEPAGES,       /* os_hugepages: madvise MADV_HUGEPAGE */
    OS_SITE_POPULATE,        /* os_populate: madvise MADV_POPULATE_WRITE */
    OS_SITE_RESERVE_PROBE,   /* lock detection without /proc: madvise */
    OS_SITE_RESERVE_UNLOCK,  /* a reservation under mlockall: munlock */
    OS_SITE_RESERVE_AT,      /* os_reserve_at: mmap at a hint */
    OS_SITE_RESERVE_PROT,    /* os_readable: mprotect PROT_READ */
    OS_SITE_COMMIT,          /* os_commit: mprotect PROT_READ|PROT_WRITE */
    OS_SITE_COMMIT_LOCK,     /* os_commit: mlock */
    OS_SITE_UNCOMMIT_MAP,    /* os_uncommit: mmap MAP_FIXED */
    OS_SITE_UNCOMMIT_UNLOCK, /* os_uncommit: munlock */
    OS_SITE_UNCOMMIT_DROP,   /* os_uncommit, mapping refused: madvise MADV_DONTNEED */
    OS_SITE_UNCOMMIT_PROT,   /* os_uncommit: mprotect PROT_READ */
    OS_SITE_RESIZE,          /* os_resize: mremap */
    OS_SITE_MOVE,            /* os_move: mremap MREMAP_FIXED */
    OS_SITE_GUARD,           /* os_guard: mprotect PROT_NONE */
    OS_SITE_GUARD_ADD,       /* os_guard_add: madvise MADV_GUARD_INSTALL or mprotect */
    OS_SITE_GUARD_REMOVE,    /* os_guard_remove: madvise MADV_GUARD_REMOVE or mprotect */
    OS_NSITES
};
void os_fault_arm(uint64_t skip, uint64_t count);
void os_fault_disarm(void);
/* Only the sites whose bit (1u << site) is set count towards the window and
 * fail; the others always go through. All of them until changed. */
void os_fault_only(uint32_t sites);
/* Calls made since the last arm (failed or not). */
uint64_t os_fault_seen(void);
/* Per site: calls made, and calls failed on purpose, since start-up. */
uint64_t os_fault_site_calls(enum os_site s);
uint64_t os_fault_site_failed(enum os_site s);
const char *os_fault_site_name(enum os_site s);
#ifndef __cplusplus /* (C++ has no _Atomic; test_cxx.cc needs none of it) */
/* Called after every decommit (range and all; made, or failed by the
 * window above) while set: a test's look at what the caller holds then. */
extern void (*_Atomic os_decommit_hook)(void *p, size_t size);
#endif
/* os_guard_add and os_guard_remove use mprotect, as on a kernel without
 * guard markers, while `on` (tests of that path). */
void os_fault_no_markers(bool on);
#endif

/* Its part of the tier contract (box/tier.h): the calls' counters, and
 * os_fork_release in a fork child. */
extern HAK_HIDDEN const struct tier_ops os_tier;

#endif
