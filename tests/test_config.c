/* Configuration: valid values are taken, bad ones warn once naming the
 * variable and leave the default. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "box/config.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Run config_load with stderr captured into buf. */
static void load_capturing(char *buf, size_t cap) {
    int fds[2], saved = dup(2);
    assert_int_equal(pipe(fds), 0);
    dup2(fds[1], 2);
    config_load();
    dup2(saved, 2);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], buf, cap - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fds[0]);
}

static int defaults(void **state) {
    (void)state;
    unsetenv("HAKMEM_STATS");
    unsetenv("HAKMEM_STATS_FILE");
    unsetenv("HAKMEM_BIGCACHE_MB");
    unsetenv("HAKMEM_POOL_ARENA_MB_INIT");
    unsetenv("HAKMEM_POOL_ARENA_MB_MAX");
    unsetenv("HAKMEM_AGE_MS");
    unsetenv("HAKMEM_BIGCACHE_AGE_MS");
    unsetenv("HAKMEM_HUGEPAGES");
    unsetenv("HAKMEM_BACKTRACE");
    unsetenv("HAKMEM_BACKGROUND");
    hak_cfg.stats = HAK_STATS_OFF;
    hak_cfg.stats_file = NULL;
    hak_cfg.background = false;
    hak_cfg.backtrace = false;
    hak_cfg.age_ms = HAK_CFG_AGE_MS_DEFAULT;
    hak_cfg.hugepages = HAK_HUGE_LARGE;
    hak_cfg.bigcache_bytes = (size_t)128 << 20;
    hak_cfg.pool_arena_mb_init = 1;
    hak_cfg.pool_arena_mb_max = 8;
    return 0;
}

static void test_valid_values_taken(void **state) {
    (void)state;
    char err[512];
    setenv("HAKMEM_STATS", "1", 1);
    setenv("HAKMEM_BIGCACHE_MB", "128", 1);
    setenv("HAKMEM_AGE_MS", "400", 1);
    setenv("HAKMEM_HUGEPAGES", "0", 1);
    setenv("HAKMEM_BACKTRACE", "1", 1);
    setenv("HAKMEM_BACKGROUND", "1", 1); /* (read only: the thread starts in the constructor) */
    load_capturing(err, sizeof err);
    assert_string_equal(err, "");
    assert_true(hak_cfg.backtrace);
    assert_true(hak_cfg.background);
    assert_true(hak_cfg.stats);
    assert_int_equal(hak_cfg.age_ms, 400);
    assert_int_equal(hak_cfg.hugepages, HAK_HUGE_OFF);
    assert_int_equal(hak_cfg.bigcache_bytes, (size_t)128 << 20);
    setenv("HAKMEM_HUGEPAGES", "2", 1); /* every heap */
    load_capturing(err, sizeof err);
    assert_string_equal(err, "");
    assert_int_equal(hak_cfg.hugepages, HAK_HUGE_ALL);
}

static void test_bad_values_warn_and_keep_default(void **state) {
    (void)state;
    const char *bad[] = {"abc", "-1", "99999999", "12x", "2", "JSON", "jsonx", "json ", "1x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[512];
        setenv("HAKMEM_STATS", bad[i], 1);
        load_capturing(err, sizeof err);
        assert_non_null(strstr(err, "HAKMEM_STATS"));
        assert_int_equal(strchr(err, '\n') - err + 1, (long)strlen(err)); /* one line */
        assert_false(hak_cfg.stats);
    }
    char err[512];
    unsetenv("HAKMEM_STATS");
    setenv("HAKMEM_BIGCACHE_MB", "lots", 1);
    load_capturing(err, sizeof err);
    assert_non_null(strstr(err, "HAKMEM_BIGCACHE_MB"));
    assert_int_equal(hak_cfg.bigcache_bytes, (size_t)128 << 20);
    unsetenv("HAKMEM_BIGCACHE_MB");
    setenv("HAKMEM_AGE_MS", "0", 1); /* 0 would decommit at once: not allowed */
    setenv("HAKMEM_HUGEPAGES", "3", 1);
    setenv("HAKMEM_BACKGROUND", "2", 1);
    load_capturing(err, sizeof err);
    assert_non_null(strstr(err, "HAKMEM_AGE_MS"));
    assert_non_null(strstr(err, "HAKMEM_HUGEPAGES"));
    assert_non_null(strstr(err, "HAKMEM_BACKGROUND"));
    assert_false(hak_cfg.background);
    assert_int_equal(hak_cfg.age_ms, HAK_CFG_AGE_MS_DEFAULT);
    assert_int_equal(hak_cfg.hugepages, HAK_HUGE_LARGE); /* the default kept */
}

/* The age's old name, HAKMEM_BIGCACHE_AGE_MS, is still read; the new one
 * wins when both are set. */
static void test_age_old_name_still_read(void **state) {
    (void)state;
    char err[512];
    setenv("HAKMEM_BIGCACHE_AGE_MS", "700", 1);
    load_capturing(err, sizeof err);
    assert_string_equal(err, "");
    assert_int_equal(hak_cfg.age_ms, 700);
    setenv("HAKMEM_AGE_MS", "300", 1);
    load_capturing(err, sizeof err);
    assert_string_equal(err, "");
    assert_int_equal(hak_cfg.age_ms, 300);
    /* A refused new value is not replaced by the old name's: the warning
     * says the default is used, and it is. */
    hak_cfg.age_ms = HAK_CFG_AGE_MS_DEFAULT;
    setenv("HAKMEM_AGE_MS", "0", 1);
    load_capturing(err, sizeof err);
    assert_non_null(strstr(err, "HAKMEM_AGE_MS"));
    assert_int_equal(hak_cfg.age_ms, HAK_CFG_AGE_MS_DEFAULT);
}

/* HAKMEM_STATS=json: the JSON report; HAKMEM_STATS_FILE: where it goes,
 * kept as it was read (a program may change its environment before exit). */
static void test_stats_json_and_file(void **state) {
    (void)state;
    char err[512];
    static char file[] = "HAKMEM_STATS_FILE=/tmp/some stats.json";
    setenv("HAKMEM_STATS", "json", 1);
    putenv(file);
    load_capturing(err, sizeof err);
    assert_string_equal(err, "");
    assert_int_equal(hak_cfg.stats, HAK_STATS_JSON);
    assert_string_equal(hak_cfg.stats_file, "/tmp/some stats.json");
    memcpy(strchr(file, '=') + 1, "/elsewhere", 11); /* the environment changes */
    assert_string_equal(hak_cfg.stats_file, "/tmp/some stats.json");
    setenv("HAKMEM_STATS", "1", 1);
    load_capturing(err, sizeof err);
    assert_int_equal(hak_cfg.stats, HAK_STATS_TEXT);
    setenv("HAKMEM_STATS", "0", 1);
    load_capturing(err, sizeof err);
    assert_int_equal(hak_cfg.stats, HAK_STATS_OFF);
    /* Longer than any path: warned, and stderr kept. */
    static char longer[5000];
    memset(longer, 'a', sizeof longer - 1);
    hak_cfg.stats_file = NULL;
    setenv("HAKMEM_STATS_FILE", longer, 1);
    load_capturing(err, sizeof err);
    assert_non_null(strstr(err, "HAKMEM_STATS_FILE"));
    assert_null(hak_cfg.stats_file);
}

static void test_pool_arena_sizes(void **state) {
    (void)state;
    char err[512];
    setenv("HAKMEM_POOL_ARENA_MB_INIT", "2", 1);
    setenv("HAKMEM_POOL_ARENA_MB_MAX", "16", 1);
    load_capturing(err, sizeof err);
    assert_string_equal(err, "");
    assert_int_equal(hak_cfg.pool_arena_mb_init, 2);
    assert_int_equal(hak_cfg.pool_arena_mb_max, 16);
    /* A maximum below the initial size: one line, and the initial size for
     * both. */
    setenv("HAKMEM_POOL_ARENA_MB_INIT", "4", 1);
    setenv("HAKMEM_POOL_ARENA_MB_MAX", "2", 1);
    load_capturing(err, sizeof err);
    assert_non_null(strstr(err, "HAKMEM_POOL_ARENA_MB_MAX"));
    assert_int_equal(strchr(err, '\n') - err + 1, (long)strlen(err));
    assert_int_equal(hak_cfg.pool_arena_mb_init, 4);
    assert_int_equal(hak_cfg.pool_arena_mb_max, 4);
    setenv("HAKMEM_POOL_ARENA_MB_INIT", "0", 1); /* out of range: warned, default */
    unsetenv("HAKMEM_POOL_ARENA_MB_MAX");
    hak_cfg.pool_arena_mb_init = 1;
    hak_cfg.pool_arena_mb_max = 8;
    load_capturing(err, sizeof err);
    assert_non_null(strstr(err, "HAKMEM_POOL_ARENA_MB_INIT"));
    assert_int_equal(hak_cfg.pool_arena_mb_init, 1);
}

/* Settings are read even when the first malloc comes before libc has set
 * up the environment: from a .preinit_array function, where sanitizer
 * runtimes allocate. This binary allocates there; run again with a setting,
 * it must see it. (Before the fix, the settings were read there, found
 * empty, and never read again.) */
static void allocate_early(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    free(malloc(100));
}
__attribute__((section(".preinit_array"),
               used)) static void (*const early)(int, char **, char **) = allocate_early;

/* The number this test binary prints when run again with `arg`, under the
 * environment setting `env`. */
static unsigned long run_self(const char *env, const char *arg) {
    char cmd[4200], self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = '\0';
    snprintf(cmd, sizeof cmd, "%s '%s' %s", env, self, arg);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    unsigned long v = 0;
    assert_int_equal(fscanf(f, "%lu", &v), 1);
    assert_int_equal(pclose(f), 0);
    return v;
}

static void test_settings_read_after_preinit_malloc(void **state) {
    (void)state;
    assert_int_equal(run_self("HAKMEM_BIGCACHE_MB=7", "--print-bigcache"), 7);
}

/* A program whose first calls are Large ones, made before hakmem's
 * constructor (a library's constructor): the settings are read at the
 * first, and the blocks after it are the setting's (here checked mode's,
 * which gives a block exactly the size asked). Before the fix, only a small
 * malloc or the constructor read them: the Large tier served the second
 * block unchecked. */
static void *early_block;
__attribute__((constructor(101))) static void large_first(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc > 1 && strcmp(argv[1], "--large-first") == 0) {
        free(malloc((size_t)4 << 20));
        early_block = malloc(((size_t)4 << 20) + 1);
    }
}

static void test_large_first_calls_read_settings(void **state) {
    (void)state;
    assert_int_equal(run_self("HAKMEM_CHECK=1", "--large-first"), ((unsigned long)4 << 20) + 1);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--large-first") == 0) {
        printf("%zu\n", malloc_usable_size(early_block));
        free(early_block);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--print-bigcache") == 0) {
        free(malloc(100));
        printf("%zu\n", hak_cfg.bigcache_bytes >> 20);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_valid_values_taken, defaults),
        cmocka_unit_test_setup(test_bad_values_warn_and_keep_default, defaults),
        cmocka_unit_test_setup(test_age_old_name_still_read, defaults),
        cmocka_unit_test_setup(test_stats_json_and_file, defaults),
        cmocka_unit_test_setup(test_pool_arena_sizes, defaults),
        cmocka_unit_test(test_settings_read_after_preinit_malloc),
        cmocka_unit_test(test_large_first_calls_read_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
