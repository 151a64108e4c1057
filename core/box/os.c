/* OS boundary. Aligned mappings are placed at a hint address first (one
 * syscall when the kernel honours it, which it does unless the range is taken)
 * and fall back to over-mapping and trimming. */
#include "box/os.h"
#include "box/libc.h"
#include "box/tier.h"
#include "box/clock.h"

#include "sizes.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Atomic uint64_t os_counts[OS_NCALLS];
/* os_mapped, os_mapped_peak: relaxed, as the call counts (a reader wants a
 * figure, not an order with other memory). */
static _Atomic uint64_t os_bytes, os_bytes_peak;

/* Next hint address for aligned mappings: an area well away from the kernel's
 * own mmap base and the brk heap, with a random start so addresses are not
 * predictable from run to run. */
#define OS_HINT_BASE  ((uintptr_t)4 << 40)  /* 4 TiB */
#define OS_HINT_LIMIT ((uintptr_t)64 << 40) /* 64 TiB: past this, no more hints */
static _Atomic uintptr_t os_hint_next;

static inline void os_count(enum os_call k) {
    atomic_fetch_add_explicit(&os_counts[k], 1, memory_order_relaxed);
}

#ifdef HAK_FAULT_INJECT
static const char *const os_site_names[OS_NSITES] = {
    [OS_SITE_MMAP] = "mmap",
    [OS_SITE_MUNMAP] = "munmap",
    [OS_SITE_DECOMMIT] = "decommit madvise",
    [OS_SITE_HUGEPAGES] = "hugepages madvise",
    [OS_SITE_POPULATE] = "populate madvise",
    [OS_SITE_RESERVE_PROBE] = "reserve lock-probe madvise",
    [OS_SITE_RESERVE_UNLOCK] = "reserve munlock",
    [OS_SITE_RESERVE_AT] = "reserve-at mmap",
    [OS_SITE_RESERVE_PROT] = "readable mprotect",
    [OS_SITE_COMMIT] = "commit mprotect",
    [OS_SITE_COMMIT_LOCK] = "commit mlock",
    [OS_SITE_UNCOMMIT_MAP] = "uncommit mmap",
    [OS_SITE_UNCOMMIT_UNLOCK] = "uncommit munlock",
    [OS_SITE_UNCOMMIT_DROP] = "uncommit madvise",
    [OS_SITE_UNCOMMIT_PROT] = "uncommit mprotect",
    [OS_SITE_RESIZE] = "resize mremap",
    [OS_SITE_MOVE] = "move mremap",
    [OS_SITE_GUARD] = "guard mprotect",
    [OS_SITE_GUARD_ADD] = "guard-add madvise",
    [OS_SITE_GUARD_REMOVE] = "guard-remove madvise",
};
static _Atomic uint64_t os_fault_n;                            /* calls since the last arm */
static _Atomic uint64_t os_fault_lo = UINT64_MAX, os_fault_hi; /* fail calls lo+1 .. hi */
static _Atomic uint64_t os_site_calls[OS_NSITES], os_site_failed[OS_NSITES];
static _Atomic uint32_t os_fault_sites = ~(uint32_t)0; /* sites the window applies to */
void (*_Atomic os_decommit_hook)(void *p, size_t size);

void os_fault_only(uint32_t sites) {
    atomic_store(&os_fault_sites, sites);
}

void os_fault_arm(uint64_t skip, uint64_t count) {
    atomic_store(&os_fault_lo, UINT64_MAX); /* nothing fails while the window moves */
    atomic_store(&os_fault_n, 0);
    atomic_store(&os_fault_hi, count > UINT64_MAX - skip ? UINT64_MAX : skip + count);
    atomic_store(&os_fault_lo, skip);
}
void os_fault_disarm(void) {
    atomic_store(&os_fault_lo, UINT64_MAX);
}
uint64_t os_fault_seen(void) {
    return atomic_load(&os_fault_n);
}
uint64_t os_fault_site_calls(enum os_site s) {
    return atomic_load(&os_site_calls[s]);
}
uint64_t os_fault_site_failed(enum os_site s) {
    return atomic_load(&os_site_failed[s]);
}
const char *os_fault_site_name(enum os_site s) {
    return os_site_names[s];
}

/* True when this call must fail; errno is then ENOMEM. */
static bool os_fault(enum os_site s) {
    atomic_fetch_add_explicit(&os_site_calls[s], 1, memory_order_relaxed);
    if (!(atomic_load(&os_fault_sites) >> s & 1)) return false;
    uint64_t n = atomic_fetch_add(&os_fault_n, 1) + 1;
    if (n <= atomic_load(&os_fault_lo) || n > atomic_load(&os_fault_hi)) return false;
    atomic_fetch_add_explicit(&os_site_failed[s], 1, memory_order_relaxed);
    errno = ENOMEM;
    return true;
}
#else
#define os_fault(s) false
#endif

/* Refused calls of this thread since os_take_refusals last looked. */
static __thread uint32_t os_refused;

uint32_t os_take_refusals(void) {
    uint32_t n = os_refused;
    os_refused = 0;
    return n;
}

/* The address-space limit as last read (os_as_limit), and when (hak_now_ms;
 * 0: to be read again), for os_as_limit_recent; os_limit_gen counts the
 * refused calls, so that a read made before one is not kept after it. */
#define OS_LIMIT_MS 10
static _Atomic size_t os_limit;
static _Atomic uint64_t os_limit_ms;
static _Atomic uint64_t os_limit_gen;

/* ok, counting a refusal when not. */
static inline bool os_granted(bool ok) {
    if (hak_unlikely(!ok)) {
        os_refused++;
        atomic_fetch_add_explicit(&os_limit_gen, 1, memory_order_seq_cst);
        atomic_store_explicit(&os_limit_ms, 0, memory_order_seq_cst);
    }
    return ok;
}

uint64_t os_calls(enum os_call kind) {
    return atomic_load_explicit(&os_counts[kind], memory_order_relaxed);
}

/* `bytes` more (or, negative, fewer) mapped. */
static void os_mapped_add(int64_t bytes) {
    uint64_t now = atomic_fetch_add_explicit(&os_bytes, (uint64_t)bytes, memory_order_relaxed) +
                   (uint64_t)bytes;
    if (bytes <= 0) return;
    uint64_t peak = atomic_load_explicit(&os_bytes_peak, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&os_bytes_peak, &peak, now, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

uint64_t os_mapped(void) {
    return atomic_load_explicit(&os_bytes, memory_order_relaxed);
}
uint64_t os_mapped_peak(void) {
    return atomic_load_explicit(&os_bytes_peak, memory_order_relaxed);
}

#define OS_RW   (PROT_READ | PROT_WRITE)
#define OS_ANON (MAP_PRIVATE | MAP_ANONYMOUS)

static void *os_mmap_as(void *hint, size_t size, int prot, int flags) {
    os_count(OS_MMAP);
    void *p = os_fault(OS_SITE_MMAP) ? MAP_FAILED : mmap(hint, size, prot, flags, -1, 0);
    if (!os_granted(p != MAP_FAILED)) return NULL;
    os_mapped_add((int64_t)size);
    return p;
}

bool os_unmap(void *p, size_t size) {
    int saved = errno; /* free() must not change errno */
    os_count(OS_MUNMAP);
    bool ok = !os_fault(OS_SITE_MUNMAP) && munmap(p, size) == 0;
    if (ok) os_mapped_add(-(int64_t)size);
    errno = saved;
    return ok;
}

bool os_decommit(void *p, size_t size) {
    int saved = errno; /* free() must not change errno */
    os_count(OS_MADVISE);
    /* EINVAL on locked pages */
    bool ok = !os_fault(OS_SITE_DECOMMIT) && madvise(p, size, MADV_DONTNEED) == 0;
#ifdef HAK_FAULT_INJECT
    void (*hook)(void *, size_t) = atomic_load(&os_decommit_hook);
    if (hook) hook(p, size);
#endif
    errno = saved;
    return ok;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; glibc 2.36's headers may lack it */
#endif
static _Atomic bool os_no_populate; /* the kernel said EINVAL: it has no such advice */

bool os_populate(void *p, size_t size) {
    if (atomic_load_explicit(&os_no_populate, memory_order_relaxed)) return false;
    int saved = errno; /* a refusal is no failure of the caller */
    os_count(OS_MADVISE);
    bool ok = !os_fault(OS_SITE_POPULATE) && madvise(p, size, MADV_POPULATE_WRITE) == 0;
    /* (EINVAL for an unaligned range would be the caller's bug, not the
     * kernel's lack: not taken as the latter.) */
    if (!ok && errno == EINVAL && ((uintptr_t)p | size) % HAK_PAGE_SIZE == 0)
        atomic_store_explicit(&os_no_populate, true, memory_order_relaxed);
    errno = saved;
    return ok;
}

bool os_hugepages(void *p, size_t size) {
    int saved = errno; /* a refusal is no failure of malloc */
    os_count(OS_MADVISE);
    bool ok = !os_fault(OS_SITE_HUGEPAGES) && madvise(p, size, MADV_HUGEPAGE) == 0;
    errno = saved;
    return ok;
}

static uintptr_t os_hint_start(void) {
    /* AT_RANDOM: 16 random bytes the kernel gives every process. */
    const uint8_t *r = (const uint8_t *)getauxval(AT_RANDOM);
    uintptr_t rnd = r ? ((uintptr_t)r[0] << 8 | r[1]) : 0;
    return OS_HINT_BASE + (rnd << 24); /* + up to 1 TiB, 16 MiB steps */
}

uintptr_t os_hint(size_t span, size_t align) {
    uintptr_t cur = atomic_load_explicit(&os_hint_next, memory_order_relaxed);
    for (;;) {
        uintptr_t start = cur ? cur : os_hint_start();
        start = hak_align_up(start, align);
        uintptr_t next = start + hak_align_up(span, HAK_REGION_SIZE);
        if (next > OS_HINT_LIMIT) return 0;
        if (atomic_compare_exchange_weak_explicit(&os_hint_next, &cur, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return start;
    }
}

/* A mapping of `size` aligned to `align` (> page) with the given protection
 * and flags: at a hint address, else over-mapped and trimmed. */
static void *os_map_aligned_as(size_t size, size_t align, int prot, int flags) {
    uintptr_t hint = os_hint(size, align);
    if (hint) {
        void *p = os_mmap_as((void *)hint, size, prot, flags);
        if (p == NULL) return NULL;
        if (((uintptr_t)p & (align - 1)) == 0) return p;
        os_unmap(p, size); /* the kernel put it elsewhere: range taken */
    }

    /* Over-map by align and trim both ends. */
    size_t over = size + align - HAK_PAGE_SIZE;
    if (over < size) return NULL;
    uint8_t *raw = os_mmap_as(NULL, over, prot, flags);
    if (raw == NULL) return NULL;
    uint8_t *p = (uint8_t *)hak_align_up((uintptr_t)raw, align);
    if (p > raw) os_unmap(raw, (size_t)(p - raw));
    size_t tail = (size_t)(raw + over - (p + size));
    if (tail) os_unmap(p + size, tail);
    return p;
}

void *os_map_aligned(size_t size, size_t align) {
    if (align <= HAK_PAGE_SIZE) return os_mmap_as(NULL, size, OS_RW, OS_ANON);
    return os_map_aligned_as(size, align, OS_RW, OS_ANON);
}

/* New mappings come locked and populated (mlockall(MCL_FUTURE)): set by
 * os_reserve, which then locks each committed part itself, as the program
 * asked, while the read-only reservation stays unlocked. */
static _Atomic bool os_lock_future; /* set once learnt; cleared only in a fork child */

/* VmLck of /proc/self/status in KiB, -1 when unreadable. Without stdio
 * and without libc's open/read/close: this runs inside malloc, under
 * allocator locks, and another preloaded library's wrapper of those that
 * allocates would deadlock (they are cancellation points, too). */
static long os_locked_kb(void) {
    int saved = errno;
    long fd = syscall(SYS_openat, AT_FDCWD, "/proc/self/status", O_RDONLY | O_CLOEXEC);
    char buf[4096];
    long n = fd >= 0 ? syscall(SYS_read, fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) syscall(SYS_close, fd);
    errno = saved;
    if (n <= 0) return -1;
    buf[n] = '\0';
    const char *c = strstr(buf, "VmLck:");
    if (c == NULL) return -1;
    for (c += 6; *c == ' ' || *c == '\t'; c++)
        ;
    long v = 0;
    for (; *c >= '0' && *c <= '9'; c++)
        v = v * 10 + (*c - '0');
    return v;
}

static bool os_membarrier(int cmd) {
    int saved = errno;
    bool ok = syscall(SYS_membarrier, cmd, 0, 0) == 0;
    errno = saved;
    return ok;
}

bool os_barrier_register(void) {
    return os_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
}

bool os_barrier(void) {
    return os_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

void os_fork_release(bool child) {
    /* mlockall's MCL_FUTURE is not inherited by a child (fork(2)). */
    if (child) atomic_store_explicit(&os_lock_future, false, memory_order_relaxed);
}

/* A reservation was just made at p (PROT_NONE): learn from it whether the
 * program runs under mlockall(MCL_FUTURE), with or without MCL_ONFAULT (the
 * kernel then counts the new mapping as locked memory), and if so unlock
 * it: what is committed later is locked as it is committed (os_commit),
 * and the rest must never be populated. lck0: VmLck before the mapping. */
static void os_reserved(void *p, size_t size, long lck0) {
    long lck = os_locked_kb();
    bool locked;
    if (lck0 >= 0 && lck >= 0) {
        locked = lck - lck0 >= (long)(size / 2048); /* half of it, in KiB */
    } else { /* no /proc: madvise refuses locked pages, touches none here */
        os_count(OS_MADVISE);
        locked = os_fault(OS_SITE_RESERVE_PROBE) || madvise(p, HAK_PAGE_SIZE, MADV_DONTNEED) != 0;
    }
    /* Only ever learnt, never unlearnt: another thread's munlock between the
     * two reads above must not make later commits go unlocked. */
    if (locked) {
        atomic_store_explicit(&os_lock_future, true, memory_order_relaxed);
        os_count(OS_MLOCK);
        if (!os_fault(OS_SITE_RESERVE_UNLOCK)) munlock(p, size);
    }
}

size_t os_as_limit(void) {
    uint64_t gen = atomic_load_explicit(&os_limit_gen, memory_order_seq_cst), now = hak_now_ms();
    struct rlimit rl;
    size_t limit = SIZE_MAX;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < SIZE_MAX)
        limit = (size_t)rl.rlim_cur;
    atomic_store_explicit(&os_limit, limit, memory_order_relaxed);
    atomic_store_explicit(&os_limit_ms, now ? now : 1, memory_order_seq_cst);
    /* A refusal since the read: the program may have set another limit
     * before it, which this read may have missed. */
    if (atomic_load_explicit(&os_limit_gen, memory_order_seq_cst) != gen)
        atomic_store_explicit(&os_limit_ms, 0, memory_order_seq_cst);
    return limit;
}

size_t os_as_limit_recent(void) {
    uint64_t at = atomic_load_explicit(&os_limit_ms, memory_order_acquire);
    if (at != 0 && hak_now_ms() - at < OS_LIMIT_MS)
        return atomic_load_explicit(&os_limit, memory_order_relaxed);
    return os_as_limit();
}

void *os_reserve(size_t *size, size_t min, size_t align) {
    int saved = errno; /* refused bigger tries are no failure */
    size_t want = *size;
    /* Reserved space counts against an address-space limit: leave most of
     * it to the rest of the program. */
    while (want > min && want > os_as_limit() / 8)
        want >>= 1;
    for (; want >= min; want >>= 1) {
        size_t a = align < want ? align : want; /* over-mapping must stay possible */
        long lck0 = os_locked_kb();
        uint8_t *p = os_map_aligned_as(want, a, PROT_NONE, OS_ANON | MAP_NORESERVE);
        if (p == NULL) continue;
        os_reserved(p, want, lck0);
        *size = want;
        errno = saved;
        return p;
    }
    errno = saved;
    return NULL;
}

bool os_reserve_at(void *p, size_t size) {
    int saved = errno; /* a refusal is no failure of malloc */
    long lck0 = os_locked_kb();
    os_count(OS_MMAP);
    /* A hint, not MAP_FIXED_NOREPLACE: the kernel honours it when the range
     * is free, and the sanitizers' mmap, which drops hints outside their
     * application ranges, turns a fixed address at 0 into a crash. */
    void *q = os_fault(OS_SITE_RESERVE_AT)
                  ? MAP_FAILED
                  : mmap(p, size, PROT_NONE, OS_ANON | MAP_NORESERVE, -1, 0);
    if (q != MAP_FAILED) os_mapped_add((int64_t)size); /* (placed elsewhere: unmapped below) */
    bool ok = os_granted(q == p);
    if (q != MAP_FAILED && !ok) os_unmap(q, size); /* placed elsewhere: the range is taken */
    if (ok) os_reserved(p, size, lck0);
    errno = saved;
    return ok;
}

/* mprotect, counted, errno left alone; `injected`: fail it (os_fault). */
static bool os_protect(void *p, size_t size, int prot, bool injected) {
    int saved = errno;
    os_count(OS_MPROTECT);
    bool ok = !injected && mprotect(p, size, prot) == 0;
    errno = saved;
    return ok;
}

bool os_readable(void *p, size_t size) {
    return os_protect(p, size, PROT_READ, os_fault(OS_SITE_RESERVE_PROT));
}

bool os_guard(void *p, size_t size) {
    return os_protect(p, size, PROT_NONE, os_fault(OS_SITE_GUARD));
}

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102 /* Linux 6.13; glibc 2.36's headers lack it */
#define MADV_GUARD_REMOVE  103
#endif
/* Whether the kernel has guard markers: 1 yes, 0 no, -1 not asked yet. */
static _Atomic int os_markers = -1;

static bool os_have_markers(void) {
    int m = atomic_load_explicit(&os_markers, memory_order_relaxed);
    if (hak_unlikely(m < 0)) {
        /* An empty range: a kernel that knows the advice says 0 and does
         * nothing, an older one EINVAL. */
        int saved = errno;
        os_count(OS_MADVISE);
        m = madvise((void *)HAK_PAGE_SIZE, 0, MADV_GUARD_INSTALL) == 0;
        errno = saved;
        atomic_store_explicit(&os_markers, m, memory_order_relaxed);
    }
    return m == 1;
}

#ifdef HAK_FAULT_INJECT
void os_fault_no_markers(bool on) {
    atomic_store(&os_markers, on ? 0 : -1);
}
#endif

/* madvise(advice) where the kernel has guard markers, else mprotect(prot);
 * counted, errno left alone. */
static bool os_guard_set(void *p, size_t size, int advice, int prot, bool injected) {
    if (!os_have_markers()) return os_protect(p, size, prot, injected);
    int saved = errno;
    os_count(OS_MADVISE);
    bool ok = !injected && madvise(p, size, advice) == 0;
    errno = saved;
    return ok;
}

bool os_guard_markers(void) {
    return os_have_markers();
}

bool os_guard_add(void *p, size_t size) {
    return os_guard_set(p, size, MADV_GUARD_INSTALL, PROT_NONE, os_fault(OS_SITE_GUARD_ADD));
}

bool os_guard_remove(void *p, size_t size) {
    return os_guard_set(p, size, MADV_GUARD_REMOVE, OS_RW, os_fault(OS_SITE_GUARD_REMOVE));
}

bool os_commit(void *p, size_t size) {
    /* mprotect, not a MAP_FIXED mmap: a refusal (commit limit) then leaves
     * the place as it was, where some kernels would leave a hole. */
    os_count(OS_MPROTECT);
    if (!os_granted(!os_fault(OS_SITE_COMMIT) && mprotect(p, size, OS_RW) == 0)) return false;
    if (atomic_load_explicit(&os_lock_future, memory_order_relaxed)) {
        os_count(OS_MLOCK);
        if (!os_fault(OS_SITE_COMMIT_LOCK)) mlock(p, size);
    }
    return true;
}

/* Zero [p, p+size): the pages that hold something. A page never touched
 * reads as zero already, and writing it would make it resident (a range
 * can be gigabytes of address space with a few pages in use: the checked
 * fuzzer ran out of memory here). Where mincore cannot tell, every page.
 * (A page out in swap counts as unused and keeps its bytes: this runs only
 * when the kernel refused a fresh mapping and madvise both, which it does
 * not do to anonymous memory but at its map count limit.) */
static void os_clear(void *p, size_t size) {
    unsigned char in[256]; /* one per page of a 1 MiB step */
    for (size_t at = 0; at < size; at += sizeof in * HAK_PAGE_SIZE) {
        size_t n = size - at < sizeof in * HAK_PAGE_SIZE ? size - at : sizeof in * HAK_PAGE_SIZE;
        uint8_t *q = (uint8_t *)p + at;
        if (mincore(q, n, in) != 0) {
            libc_mem.set(q, 0, n);
            continue;
        }
        for (size_t i = 0; i * HAK_PAGE_SIZE < n; i++)
            if (in[i] & 1) libc_mem.set(q + i * HAK_PAGE_SIZE, 0, HAK_PAGE_SIZE);
    }
}

/* os_uncommit and os_uncommit_readable: `readable`, the fresh mapping is
 * made read-only in one step. */
static void os_uncommit_as(void *p, size_t size, bool readable) {
    int saved = errno;
    /* A fresh mapping in place, as the reservation was made (inaccessible
     * first, unlocked, then read-only): the pages go, and so do the commit
     * charge (strict overcommit) and the "written" mark that would put
     * the range in core dumps. (It replaces
     * what was there: os_mapped stays as it is.) */
    os_count(OS_MMAP);
    if (!os_fault(OS_SITE_UNCOMMIT_MAP) &&
        /* MAP_FIXED over our own range: the result is p or MAP_FAILED, never
         * new memory to keep (cppcheck's posix model counts every mmap as one). */
        // cppcheck-suppress leakReturnValNotUsed
        mmap(p, size, readable ? PROT_READ : PROT_NONE, OS_ANON | MAP_FIXED | MAP_NORESERVE, -1,
             0) != MAP_FAILED) {
        if (atomic_load_explicit(&os_lock_future, memory_order_relaxed)) {
            os_count(OS_MLOCK);
            if (!os_fault(OS_SITE_UNCOMMIT_UNLOCK)) munlock(p, size);
        }
        if (!readable) {
            os_count(OS_MPROTECT);
            if (!os_fault(OS_SITE_UNCOMMIT_PROT)) mprotect(p, size, PROT_READ);
        }
    } else {
        /* Refused (map count limit): drop the pages where they are. */
        if (atomic_load_explicit(&os_lock_future, memory_order_relaxed)) {
            os_count(OS_MLOCK);
            /* locked pages cannot be dropped */
            if (!os_fault(OS_SITE_UNCOMMIT_UNLOCK)) munlock(p, size);
        }
        os_count(OS_MADVISE);
        /* Still refused: clear them. The place is handed out again as zero
         * memory (chunk headers, bitmaps rely on it), and it is writable. */
        if (os_fault(OS_SITE_UNCOMMIT_DROP) || madvise(p, size, MADV_DONTNEED) != 0)
            os_clear(p, size);
        os_count(OS_MPROTECT);
        if (!os_fault(OS_SITE_UNCOMMIT_PROT)) mprotect(p, size, PROT_READ);
    }
    errno = saved;
}

void os_uncommit(void *p, size_t size) {
    os_uncommit_as(p, size, false);
}

void os_uncommit_readable(void *p, size_t size) {
    os_uncommit_as(p, size, true);
}

bool os_resize(void *p, size_t old_size, size_t new_size) {
    os_count(OS_MREMAP);
    if (os_fault(OS_SITE_RESIZE) || mremap(p, old_size, new_size, 0) == MAP_FAILED) return false;
    os_mapped_add((int64_t)new_size - (int64_t)old_size);
    return true;
}

bool os_move(void *p, size_t old_size, size_t new_size, void *dst) {
    os_count(OS_MREMAP);
    if (!os_fault(OS_SITE_MOVE) &&
        mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dst) != MAP_FAILED) {
        os_mapped_add(-(int64_t)old_size); /* dst's mapping (counted) now holds the pages */
        return true;
    }
    /* Only a want of memory is a refusal that giving caches back may cure
     * (EFAULT: the range is not one mapping). */
    if (errno == ENOMEM) os_granted(false);
    return false;
}

/* ---- the tier contract (box/tier.h) ----------------------------------------- */

static void os_tier_stats(struct tier_stats *s) {
    tier_row(s, "os.mmap", os_calls(OS_MMAP));
    tier_row(s, "os.munmap", os_calls(OS_MUNMAP));
    tier_row(s, "os.madvise", os_calls(OS_MADVISE));
    tier_row(s, "os.mremap", os_calls(OS_MREMAP));
    tier_row(s, "os.mprotect", os_calls(OS_MPROTECT));
    tier_row(s, "os.mlock", os_calls(OS_MLOCK));
}

const struct tier_ops os_tier = {
    .name = "os", .fork_release = os_fork_release, .stats = os_tier_stats};
