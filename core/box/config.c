#include "box/config.h"

#include "box/diag.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct hak_config hak_cfg = {
    .stats = HAK_STATS_OFF,
    .bigcache_bytes = (size_t)128 << 20,
    .unmap_min = SIZE_MAX,
    .age_ms = HAK_CFG_AGE_MS_DEFAULT,
    .large_tcache_bytes = (size_t)16 << 20,
    .hugepages = HAK_HUGE_LARGE,
    .ss_cache = 8,
    .pool_arena_mb_init = 1,
    .pool_arena_mb_max = 8,
    .prof_sample = (uint64_t)512 << 10,
    .prof_file = "hakmem.%p.heap",
};

/* HAKMEM_STATS_FILE, copied: the program may change its environment
 * before the report is written at exit. */
static char config_stats_file[4096];

/* The one line a bad value gets: the variable, the value, what was expected
 * (and the range lo..hi after it, when lo < hi). */
static void config_warn(const char *name, const char *value, const char *expected, uint64_t lo,
                        uint64_t hi) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: ignoring ");
    diag_str(&b, name);
    diag_str(&b, "='");
    diag_str(&b, value);
    diag_str(&b, "': expected ");
    diag_str(&b, expected);
    if (lo < hi) {
        diag_u64(&b, lo);
        diag_str(&b, "..");
        diag_u64(&b, hi);
    }
    diag_str(&b, "; using the default\n");
    diag_flush(&b, 2);
}

/* Parse a decimal integer in [lo, hi]; false (with a warning naming the
 * variable) when it is not one. */
static bool config_int(const char *name, uint64_t lo, uint64_t hi, uint64_t *out) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return false;
    uint64_t v = 0;
    const char *c = s;
    for (; *c >= '0' && *c <= '9'; c++) {
        v = v * 10 + (uint64_t)(*c - '0');
        if (v > hi) break;
    }
    if (*c != '\0' || v < lo || v > hi) {
        config_warn(name, s, "an integer in ", lo, hi);
        return false;
    }
    *out = v;
    return true;
}

/* HAKMEM_STATS: 0, 1 (text) or json. */
static void config_stats(void) {
    const char *s = getenv("HAKMEM_STATS");
    if (s == NULL || *s == '\0') return;
    if (strcmp(s, "0") == 0)
        hak_cfg.stats = HAK_STATS_OFF;
    else if (strcmp(s, "1") == 0)
        hak_cfg.stats = HAK_STATS_TEXT;
    else if (strcmp(s, "json") == 0)
        hak_cfg.stats = HAK_STATS_JSON;
    else
        config_warn("HAKMEM_STATS", s, "0, 1 or json", 0, 0);
}

/* HAKMEM_STATS_FILE: a path (opened at exit); too long for a path, stderr. */
static void config_stats_path(void) {
    const char *s = getenv("HAKMEM_STATS_FILE");
    if (s == NULL || *s == '\0') return;
    size_t n = strlen(s);
    if (n >= sizeof config_stats_file) {
        struct diag_buf b = {.n = 0};
        diag_str(&b,
                 "hakmem: ignoring HAKMEM_STATS_FILE: longer than a path may be; using stderr\n");
        diag_flush(&b, 2);
        return;
    }
    memcpy(config_stats_file, s, n + 1);
    hak_cfg.stats_file = config_stats_file;
}

void config_load(void) {
    uint64_t v;
    config_stats();
    config_stats_path();
    if (config_int("HAKMEM_BIGCACHE_MB", 0, 65536, &v)) hak_cfg.bigcache_bytes = (size_t)v << 20;
    /* The age of every tier's free memory; HAKMEM_BIGCACHE_AGE_MS, its
     * name from when it aged the BigCache alone, is read when the new name
     * is not set (set, the new name wins, even with a value it refuses). */
    const char *age = getenv("HAKMEM_AGE_MS");
    if (config_int(age && *age ? "HAKMEM_AGE_MS" : "HAKMEM_BIGCACHE_AGE_MS", 1, 3600000, &v))
        hak_cfg.age_ms = v;
    if (config_int("HAKMEM_LARGE_TCACHE_MB", 0, 1024, &v))
        hak_cfg.large_tcache_bytes = (size_t)v << 20;
    if (config_int("HAKMEM_HUGEPAGES", 0, 2, &v)) hak_cfg.hugepages = (uint8_t)v;
    if (config_int("HAKMEM_BACKTRACE", 0, 1, &v)) hak_cfg.backtrace = v != 0;
    if (config_int("HAKMEM_CHECK", 0, 1, &v)) hak_cfg.check = v != 0;
    if (config_int("HAKMEM_PROF", 0, 1, &v)) hak_cfg.prof = v != 0;
    if (config_int("HAKMEM_PROF_SAMPLE", 1, (uint64_t)1 << 40, &v)) hak_cfg.prof_sample = v;
    const char *file = getenv("HAKMEM_PROF_FILE");
    if (file != NULL && *file != '\0') hak_cfg.prof_file = file; /* (prof_start copies it) */
    if (config_int("HAKMEM_BACKGROUND", 0, 1, &v)) hak_cfg.background = v != 0;
    if (config_int("HAKMEM_SS_CACHE", 0, 1024, &v)) hak_cfg.ss_cache = v;
    if (config_int("HAKMEM_POOL_ARENA_MB_INIT", 1, 1024, &v))
        hak_cfg.pool_arena_mb_init = (uint32_t)v;
    if (config_int("HAKMEM_POOL_ARENA_MB_MAX", 1, 1024, &v))
        hak_cfg.pool_arena_mb_max = (uint32_t)v;
    if (hak_cfg.pool_arena_mb_max < hak_cfg.pool_arena_mb_init) {
        struct diag_buf b = {.n = 0};
        diag_str(&b, "hakmem: HAKMEM_POOL_ARENA_MB_MAX is below HAKMEM_POOL_ARENA_MB_INIT; "
                     "using the initial size for both\n");
        diag_flush(&b, 2);
        hak_cfg.pool_arena_mb_max = hak_cfg.pool_arena_mb_init;
    }
}
