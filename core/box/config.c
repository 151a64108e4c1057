#include "box/config.h"

#include "box/diag.h"

#include <stdint.h>
#include <stdlib.h>

struct hak_config hak_cfg = {
    .stats = false,
    .bigcache_bytes = (size_t)128 << 20,
    .bigcache_age_ms = HAK_CFG_AGE_MS_DEFAULT,
    .hugepages = true,
    .ss_cache = 8,
    .pool_arena_mb_init = 1,
    .pool_arena_mb_max = 8,
};

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
        struct diag_buf b = {.n = 0};
        diag_str(&b, "hakmem: ignoring ");
        diag_str(&b, name);
        diag_str(&b, "='");
        diag_str(&b, s);
        diag_str(&b, "': expected an integer in ");
        diag_u64(&b, lo);
        diag_str(&b, "..");
        diag_u64(&b, hi);
        diag_str(&b, "; using the default\n");
        diag_flush(&b, 2);
        return false;
    }
    *out = v;
    return true;
}

void config_load(void) {
    uint64_t v;
    if (config_int("HAKMEM_STATS", 0, 1, &v)) hak_cfg.stats = v != 0;
    if (config_int("HAKMEM_BIGCACHE_MB", 0, 65536, &v)) hak_cfg.bigcache_bytes = (size_t)v << 20;
    if (config_int("HAKMEM_BIGCACHE_AGE_MS", 1, 3600000, &v)) hak_cfg.bigcache_age_ms = v;
    if (config_int("HAKMEM_HUGEPAGES", 0, 1, &v)) hak_cfg.hugepages = v != 0;
    if (config_int("HAKMEM_BACKTRACE", 0, 1, &v)) hak_cfg.backtrace = v != 0;
    if (config_int("HAKMEM_CHECK", 0, 1, &v)) hak_cfg.check = v != 0;
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
