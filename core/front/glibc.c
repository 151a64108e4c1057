/* glibc's tuning and introspection calls, answered for hakmem's heap:
 * mallopt, mallinfo (the old int form) and malloc_info. Without them a
 * program tuning M_TRIM_THRESHOLD or printing malloc_info would get glibc's
 * answer for glibc's empty heap, silently. (mallinfo2, malloc_stats and
 * malloc_trim are api.c's.) */
#include "hakmem.h"

#include "box/config.h"
#include "box/libc.h"
#include "box/os.h"
#include "front/internal.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>

/* glibc's largest M_MXFAST: 80 * sizeof(size_t) / 4. */
#define GLIBC_MAX_FAST (80 * sizeof(size_t) / 4)

/* glibc's answer to mallopt(param, value) where the program has no C
 * library to ask (static): glibc 2.36's, 1 but for an M_MXFAST out of its
 * range (1 also for a parameter it does not know). */
static int glibc_answer(int param, int value) {
    if (param == M_MXFAST) return value >= 0 && (size_t)value <= GLIBC_MAX_FAST;
    return 1;
}

/* Every glibc parameter is accepted with glibc's answer: its own mallopt's,
 * which differs between its versions (a value glibc refuses changes
 * nothing here either). Two have an equivalent (docs/CONFIG.md, mallopt);
 * the others change nothing: hakmem has no fastbins, top pad, arenas shared
 * by threads, mapping count limit, check action or perturb byte. */
HAK_API int hak_mallopt(int param, int value) {
    int (*glibc)(int, int) = __atomic_load_n(&libc_mallopt, __ATOMIC_RELAXED);
    int rc = glibc ? glibc(param, value) : glibc_answer(param, value);
    if (rc != 1) return rc;
    switch (param) {
    case M_TRIM_THRESHOLD: /* free memory kept before it goes back: the BigCache's bound */
        __atomic_store_n(&hak_cfg.bigcache_bytes, value < 0 ? HAK_CFG_BIGCACHE_MAX : (size_t)value,
                         __ATOMIC_RELAXED);
        return 1;
    case M_MMAP_THRESHOLD: /* blocks this big go back to the OS when freed */
        /* (Blocks over 1 MiB always have a mapping of their own; smaller
         * ones stay in their tiers whatever the value.) */
        __atomic_store_n(&hak_cfg.unmap_min, value < 0 ? SIZE_MAX : (size_t)value,
                         __ATOMIC_RELAXED);
        return 1;
    default:
        return 1;
    }
}

static int glibc_int(size_t v) {
    return v > INT_MAX ? INT_MAX : (int)v;
}

/* glibc's deprecated form: mallinfo2's figures, each at most INT_MAX. */
HAK_API struct mallinfo hak_mallinfo(void) {
    struct mallinfo2 m = hak_mallinfo2();
    return (struct mallinfo){.arena = glibc_int(m.arena),
                             .ordblks = glibc_int(m.ordblks),
                             .smblks = glibc_int(m.smblks),
                             .hblks = glibc_int(m.hblks),
                             .hblkhd = glibc_int(m.hblkhd),
                             .usmblks = glibc_int(m.usmblks),
                             .fsmblks = glibc_int(m.fsmblks),
                             .uordblks = glibc_int(m.uordblks),
                             .fordblks = glibc_int(m.fordblks),
                             .keepcost = glibc_int(m.keepcost)};
}

/* malloc_info's walk: a <heap> per tier that holds memory. */
struct glibc_walk {
    FILE *fp;
    int nr;
    uint64_t held, free_bytes; /* every tier's: memory held; of it, in no block */
};

static void glibc_heap(const char *name, const struct tier_stats *s, void *arg) {
    struct glibc_walk *w = arg;
    unsigned long long held = s->mapped + s->own_bytes + s->kept_bytes;
    /* (The two counts are read one after the other: a chunk given back
     * between the reads can make carved the larger.) */
    unsigned long long free_bytes =
        (s->mapped > s->carved ? s->mapped - s->carved : 0) + s->kept_bytes;
    if (held == 0) return;
    w->held += held;
    w->free_bytes += free_bytes;
    fprintf(w->fp,
            "<heap nr=\"%d\" name=\"%s\">\n<sizes>\n</sizes>\n"
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"0\" size=\"%llu\"/>\n"
            "<system type=\"current\" size=\"%llu\"/>\n"
            "<system type=\"max\" size=\"%llu\"/>\n"
            "<aspace type=\"total\" size=\"%llu\"/>\n"
            "<aspace type=\"mprotect\" size=\"%llu\"/>\n</heap>\n",
            w->nr++, name, free_bytes, held, held, held, held);
}

/* glibc's XML shape: a <heap> per tier holding memory (Tiny's SuperSlabs,
 * Pool, L2.5, Large, checked) where glibc has one per arena, each with the
 * memory it holds and, as "rest", what of it is in no block (not carved, or
 * freed mappings kept); then the totals: "mmap" the blocks with a mapping of
 * their own, "system" what the tiers hold now and the most address space
 * hakmem had mapped, "aspace" what it has mapped now (reservations too). */
HAK_API int hak_malloc_info(int options, FILE *fp) {
    if (options != 0) return EINVAL; /* (as glibc: returned, errno untouched) */
    struct glibc_walk w = {.fp = fp};
    fputs("<malloc version=\"1\">\n", fp);
    tiers_each_stats(glibc_heap, &w);
    struct mallinfo2 m = hak_mallinfo2();
    fprintf(fp,
            "<total type=\"fast\" count=\"0\" size=\"0\"/>\n"
            "<total type=\"rest\" count=\"0\" size=\"%llu\"/>\n"
            "<total type=\"mmap\" count=\"%zu\" size=\"%zu\"/>\n"
            "<system type=\"current\" size=\"%llu\"/>\n"
            "<system type=\"max\" size=\"%llu\"/>\n"
            "<aspace type=\"total\" size=\"%llu\"/>\n"
            "<aspace type=\"mprotect\" size=\"%llu\"/>\n</malloc>\n",
            (unsigned long long)w.free_bytes, m.hblks, m.hblkhd, (unsigned long long)w.held,
            (unsigned long long)os_mapped_peak(), (unsigned long long)os_mapped(),
            (unsigned long long)w.held);
    return 0;
}

#ifndef HAK_NO_OVERRIDE
/* (mallinfo is deprecated in glibc's header: defining it is not using it.) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
HAK_ALIAS(mallopt, hak_mallopt);
HAK_ALIAS(mallinfo, hak_mallinfo);
HAK_ALIAS(malloc_info, hak_malloc_info);
#pragma GCC diagnostic pop
#endif
