/* What the kernel says about an address of this process, for tests that
 * check memory really went back to the OS. */
#ifndef HAK_TEST_MAPS_H
#define HAK_TEST_MAPS_H

#include "proc.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The permissions ("rw-p", ...) of the mapping holding p into perms[5];
 * false when p is not mapped at all. Allocates nothing (no stdio), so tests
 * that count what the allocator does may call it. */
static inline bool maps_perms(const void *p, char perms[5]) {
    static char buf[1 << 20];
    if (proc_read("/proc/self/maps", buf, sizeof buf) < 0) return false;
    for (char *line = buf; *line;) {
        char *end;
        uintptr_t lo = strtoull(line, &end, 16), hi = strtoull(end + 1, &end, 16);
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
            memcpy(perms, end + 1, 4);
            perms[4] = 0;
            return true;
        }
        char *nl = strchr(line, '\n');
        if (nl == NULL) break;
        line = nl + 1;
    }
    return false;
}

/* True when the mapping holding p is writable. */
static inline bool maps_writable(const void *p) {
    char perms[5];
    return maps_perms(p, perms) && perms[1] == 'w';
}

/* The same for many addresses while nothing maps or unmaps: the mappings
 * read once (maps_snapshot), then looked up (maps_snapshot_writable). Each
 * maps_writable reads the whole of /proc/self/maps, which the kernel writes
 * out anew: 200000 of them took 8 s, 34 s under TSan (its mappings make
 * the file longer). Allocates nothing. */
struct maps_range {
    uintptr_t lo, hi;
    bool writable;
};
static struct maps_range maps_ranges[1 << 16];
static size_t maps_nranges;

/* False when /proc/self/maps could not be read whole. */
static inline bool maps_snapshot(void) {
    static char buf[1 << 22];
    ssize_t len = proc_read("/proc/self/maps", buf, sizeof buf);
    if (len < 0 || (size_t)len == sizeof buf - 1) return false;
    maps_nranges = 0;
    for (char *line = buf; *line;) {
        if (maps_nranges == sizeof maps_ranges / sizeof maps_ranges[0]) return false;
        char *end;
        struct maps_range *r = &maps_ranges[maps_nranges++];
        r->lo = strtoull(line, &end, 16);
        r->hi = strtoull(end + 1, &end, 16);
        r->writable = end[2] == 'w';
        char *nl = strchr(line, '\n');
        if (nl == NULL) break;
        line = nl + 1;
    }
    return true;
}

/* maps_writable(p) as it was at the last maps_snapshot (the file lists the
 * mappings in address order). */
static inline bool maps_snapshot_writable(const void *p) {
    size_t lo = 0, hi = maps_nranges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)p < maps_ranges[mid].lo)
            hi = mid;
        else if ((uintptr_t)p >= maps_ranges[mid].hi)
            lo = mid + 1;
        else
            return maps_ranges[mid].writable;
    }
    return false;
}

/* True when the page holding p is mapped and in memory. */
static inline bool maps_resident(const void *p) {
    unsigned char v = 0;
    void *pg = (void *)((uintptr_t)p & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1));
    return mincore(pg, 1, &v) == 0 && (v & 1);
}

/* True when the mapping holding p has VmFlags `flag` ("hg": huge pages
 * asked for) in /proc/self/smaps. */
static inline bool maps_vmflag(const void *p, const char *flag) {
    static char buf[1 << 23]; /* ~1.5 KiB a mapping */
    ssize_t len = proc_read("/proc/self/smaps", buf, sizeof buf);
    if (len < 0 || (size_t)len == sizeof buf - 1) abort(); /* cannot tell: the test is wrong */
    bool in = false;
    size_t flen = strlen(flag);
    for (char *line = buf; *line;) {
        char *end, *nl = strchr(line, '\n');
        uintptr_t lo = strtoull(line, &end, 16);
        if (end != line && *end == '-') { /* a mapping's first line */
            uintptr_t hi = strtoull(end + 1, NULL, 16);
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            for (char *f = line + 8; (f = strstr(f, flag)) != NULL && (nl == NULL || f < nl); f++)
                if (f[-1] == ' ' && (f[flen] == ' ' || f[flen] == '\n' || f[flen] == 0))
                    return true;
            return false;
        }
        if (nl == NULL) break;
        line = nl + 1;
    }
    return false;
}

/* True when [p, p+len) is back with the OS, address kept: mapped read-only
 * (not writable) and no page of it in memory. */
static inline bool maps_given_back(const void *p, size_t len) {
    char perms[5];
    if (!maps_perms(p, perms) || perms[1] == 'w') return false;
    for (size_t off = 0; off < len; off += (size_t)sysconf(_SC_PAGESIZE))
        if (maps_resident((const char *)p + off)) return false;
    return true;
}

/* mlockall(flags), true when it took effect: the sanitizer runtimes make
 * mlockall a no-op that returns 0 (their shadow memory cannot be locked), so
 * its success alone says nothing. Takes effect = VmLck no longer zero. */
static inline bool maps_mlockall(int flags) {
    if (mlockall(flags) != 0) return false;
    static char buf[4096];
    if (proc_read("/proc/self/status", buf, sizeof buf) < 0) return false;
    const char *l = strstr(buf, "VmLck:");
    return l != NULL && strtol(l + 6, NULL, 10) > 0;
}

#endif
