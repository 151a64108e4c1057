/* Configuration: HAKMEM_* environment variables, read once at start-up.
 * docs/CONFIG.md lists each with its default and range. */
#ifndef HAK_CONFIG_H
#define HAK_CONFIG_H

#include "sizes.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* HAKMEM_STATS: 0, 1, json. */
enum hak_stats_mode { HAK_STATS_OFF, HAK_STATS_TEXT, HAK_STATS_JSON };

/* HAKMEM_HUGEPAGES: which mappings ask for transparent huge pages. */
enum hak_huge {
    HAK_HUGE_OFF,   /* none */
    HAK_HUGE_LARGE, /* Large blocks of 2 MiB or more (not growing ones) */
    HAK_HUGE_ALL,   /* those, and every SuperSlab, Pool chunk and L2.5 bundle */
};

struct hak_config {
    uint8_t stats;          /* HAKMEM_STATS: a report at exit (enum hak_stats_mode) */
    const char *stats_file; /* HAKMEM_STATS_FILE: where it goes; NULL: stderr */
    size_t bigcache_bytes;  /* HAKMEM_BIGCACHE_MB: bytes of freed large mappings kept */
    size_t unmap_min; /* mallopt(M_MMAP_THRESHOLD): a freed Large mapping this big goes back */
    uint64_t age_ms;  /* HAKMEM_AGE_MS (or its old name HAKMEM_BIGCACHE_AGE_MS): free memory unused
                         this long goes back, in every tier */
    size_t large_tcache_bytes;   /* HAKMEM_LARGE_TCACHE_MB: a thread's own freed mappings */
    uint8_t hugepages;           /* HAKMEM_HUGEPAGES: who asks for huge pages (enum hak_huge) */
    uint64_t ss_cache;           /* HAKMEM_SS_CACHE: empty SuperSlabs kept, decommitted */
    uint32_t pool_arena_mb_init; /* HAKMEM_POOL_ARENA_MB_INIT: a thread's first Pool chunk */
    uint32_t pool_arena_mb_max;  /* HAKMEM_POOL_ARENA_MB_MAX: Pool chunks grow to this */
    bool backtrace;              /* HAKMEM_BACKTRACE: a backtrace with every heap-bug report */
    bool check;                  /* HAKMEM_CHECK: the checked tier serves every allocation */
    bool prof;                   /* HAKMEM_PROF: the heap profiler samples allocations */
    uint64_t prof_sample;        /* HAKMEM_PROF_SAMPLE: mean bytes between samples */
    const char *prof_file;       /* HAKMEM_PROF_FILE: where the profile goes at exit */
    bool background;             /* HAKMEM_BACKGROUND: a thread ages the caches */
};

/* How long free memory stays resident unused before it goes back to the
 * OS. 250 ms: long enough that a program's next phase reuses it (mimalloc
 * purges after 10 ms), short enough that `git gc --aggressive` and CPython
 * peak below jemalloc's RSS (at 1000 ms: 1.09x and 1.04x). */
#define HAK_CFG_AGE_MS_DEFAULT 250

/* HAKMEM_BIGCACHE_MB's largest value, in bytes (and mallopt's for a
 * negative M_TRIM_THRESHOLD: never trim). */
#define HAK_CFG_BIGCACHE_MAX ((size_t)65536 << 20)

/* Defaults until config_load runs; then what the environment says. */
extern HAK_HIDDEN struct hak_config hak_cfg;

/* HAKMEM_HUGEPAGES=2: the small-block heaps are in huge pages, so their
 * free memory goes back to the OS only in whole units (an empty SuperSlab,
 * bundle or chunk), never page by page, malloc_trim included: a partial
 * decommit would split the huge page, the next touch would fault again, and
 * khugepaged would collapse the unit back into a whole huge page, pages the
 * tier then takes as given back. */
static inline bool hak_huge_heaps(void) {
    return hak_cfg.hugepages == HAK_HUGE_ALL;
}

/* Read the environment; warns once per bad variable and keeps its default. */
void config_load(void);

#endif
