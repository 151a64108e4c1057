/* OS boundary. Aligned mappings are placed at a hint address first (one
 * syscall when the kernel honours it, which it does unless the range is taken)
 * and fall back to over-mapping and trimming. */
#include "box/os.h"

#include "sizes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static _Atomic uint64_t os_counts[OS_NCALLS];

/* Next hint address for aligned mappings: an area well away from the kernel's
 * own mmap base and the brk heap, with a random start so addresses are not
 * predictable from run to run. */
#define OS_HINT_BASE  ((uintptr_t)4 << 40)  /* 4 TiB */
#define OS_HINT_LIMIT ((uintptr_t)64 << 40) /* 64 TiB: past this, no more hints */
static _Atomic uintptr_t os_hint;

static inline void os_count(enum os_call k) {
    atomic_fetch_add_explicit(&os_counts[k], 1, memory_order_relaxed);
}

uint64_t os_calls(enum os_call kind) {
    return atomic_load_explicit(&os_counts[kind], memory_order_relaxed);
}

#define OS_RW   (PROT_READ | PROT_WRITE)
#define OS_ANON (MAP_PRIVATE | MAP_ANONYMOUS)

static void *os_mmap_as(void *hint, size_t size, int prot, int flags) {
    os_count(OS_MMAP);
    void *p = mmap(hint, size, prot, flags, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void os_unmap(void *p, size_t size) {
    os_count(OS_MUNMAP);
    munmap(p, size);
}

bool os_decommit(void *p, size_t size) {
    int saved = errno; /* free() must not change errno */
    os_count(OS_MADVISE);
    bool ok = madvise(p, size, MADV_DONTNEED) == 0; /* EINVAL on locked pages */
    errno = saved;
    return ok;
}

bool os_hugepages(void *p, size_t size) {
    int saved = errno; /* a refusal is no failure of malloc */
    os_count(OS_MADVISE);
    bool ok = madvise(p, size, MADV_HUGEPAGE) == 0;
    errno = saved;
    return ok;
}

static uintptr_t os_hint_start(void) {
    /* AT_RANDOM: 16 random bytes the kernel gives every process. */
    const uint8_t *r = (const uint8_t *)getauxval(AT_RANDOM);
    uintptr_t rnd = r ? ((uintptr_t)r[0] << 8 | r[1]) : 0;
    return OS_HINT_BASE + (rnd << 24); /* + up to 1 TiB, 16 MiB steps */
}

/* Reserve `span` bytes of hint space aligned to `align`; 0 when exhausted. */
static uintptr_t os_take_hint(size_t span, size_t align) {
    uintptr_t cur = atomic_load_explicit(&os_hint, memory_order_relaxed);
    for (;;) {
        uintptr_t start = cur ? cur : os_hint_start();
        start = hak_align_up(start, align);
        uintptr_t next = start + hak_align_up(span, HAK_REGION_SIZE);
        if (next > OS_HINT_LIMIT) return 0;
        if (atomic_compare_exchange_weak_explicit(&os_hint, &cur, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return start;
    }
}

/* A mapping of `size` aligned to `align` (> page) with the given protection
 * and flags: at a hint address, else over-mapped and trimmed. */
static void *os_map_aligned_as(size_t size, size_t align, int prot, int flags) {
    uintptr_t hint = os_take_hint(size, align);
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
static bool os_lock_future;

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

void os_fork_child(void) {
    /* mlockall's MCL_FUTURE is not inherited by a child (fork(2)). */
    os_lock_future = false;
}

void *os_reserve(size_t *size, size_t min, size_t align) {
    int saved = errno; /* refused bigger tries are no failure */
    size_t want = *size;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        /* Reserved space counts against the limit: leave most of it to the
         * rest of the program. */
        while (want > min && want > rl.rlim_cur / 8)
            want >>= 1;
    }
    long lck0 = os_locked_kb();
    for (; want >= min; want >>= 1) {
        /* Inaccessible first: under mlockall(MCL_FUTURE) a readable mapping
         * would be populated, page tables for every page of it. */
        size_t a = align < want ? align : want; /* over-mapping must stay possible */
        uint8_t *p = os_map_aligned_as(want, a, PROT_NONE, OS_ANON | MAP_NORESERVE);
        if (p == NULL) continue;
        /* Is it locked (mlockall(MCL_FUTURE), with or without MCL_ONFAULT)?
         * Then the kernel counted it as locked memory. */
        long lck = os_locked_kb();
        if (lck0 >= 0 && lck >= 0) {
            os_lock_future = lck - lck0 >= (long)(want / 2048); /* half of it, in KiB */
        } else { /* no /proc: madvise refuses locked pages, touches none here */
            os_count(OS_MADVISE);
            int saved = errno;
            os_lock_future = madvise(p, HAK_PAGE_SIZE, MADV_DONTNEED) != 0;
            errno = saved;
        }
        if (os_lock_future) {
            os_count(OS_MLOCK);
            munlock(p, want);
        }
        os_count(OS_MPROTECT);
        if (mprotect(p, want, PROT_READ) != 0) {
            os_unmap(p, want);
            continue;
        }
        *size = want;
        errno = saved;
        return p;
    }
    return NULL;
}

bool os_commit(void *p, size_t size) {
    /* mprotect, not a MAP_FIXED mmap: a refusal (commit limit) then leaves
     * the place as it was, where some kernels would leave a hole. */
    os_count(OS_MPROTECT);
    if (mprotect(p, size, OS_RW) != 0) return false;
    if (os_lock_future) {
        os_count(OS_MLOCK);
        mlock(p, size);
    }
    return true;
}

void os_uncommit(void *p, size_t size) {
    int saved = errno;
    /* A fresh mapping in place, as the reservation was made (inaccessible
     * first, unlocked, then read-only): the pages go, and so do the commit
     * charge (strict overcommit) and the "written" mark that would put
     * the range in core dumps. */
    os_count(OS_MMAP);
    if (mmap(p, size, PROT_NONE, OS_ANON | MAP_FIXED | MAP_NORESERVE, -1, 0) != MAP_FAILED) {
        if (os_lock_future) {
            os_count(OS_MLOCK);
            munlock(p, size);
        }
        os_count(OS_MPROTECT);
        mprotect(p, size, PROT_READ);
    } else {
        /* Refused (map count limit): drop the pages where they are. */
        if (os_lock_future) {
            os_count(OS_MLOCK);
            munlock(p, size); /* locked pages cannot be dropped */
        }
        os_decommit(p, size);
        os_count(OS_MPROTECT);
        mprotect(p, size, PROT_READ);
    }
    errno = saved;
}

bool os_resize(void *p, size_t old_size, size_t new_size) {
    os_count(OS_MREMAP);
    return mremap(p, old_size, new_size, 0) != MAP_FAILED;
}

bool os_move(void *p, size_t old_size, size_t new_size, void *dst) {
    os_count(OS_MREMAP);
    return mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dst) != MAP_FAILED;
}
