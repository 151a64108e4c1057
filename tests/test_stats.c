/* Stats: hak_stats_json (valid JSON, snprintf's contract, in_use and mapped
 * following what the program holds), the report at exit (HAKMEM_STATS=json
 * and 1, HAKMEM_STATS_FILE; in a child started with them), and the text
 * report's lines as they always were. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "death.h"
#include "hakmem.h"
#include "sizeclass.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB ((uint64_t)1024)
#define MiB (KiB * 1024)

/* Big enough for any report (about 6 KB with every Tiny class in it);
 * static: nothing here may allocate between two readings. */
static char js[65536], js2[65536];

/* ---- a minimal JSON reader: validates, and finds numbers by path -------------- */

static const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
        p++;
    return p;
}

/* A string without escapes (all the report has); NULL when malformed. */
static const char *json_string(const char *p, const char **s, size_t *n) {
    if (*p != '"') return NULL;
    const char *e = strchr(p + 1, '"');
    if (e == NULL) return NULL;
    for (const char *c = p + 1; c < e; c++)
        if (*c == '\\' || (unsigned char)*c < 0x20) return NULL;
    *s = p + 1;
    *n = (size_t)(e - p - 1);
    return e + 1;
}

/* Any value, skipped; NULL when malformed. Numbers: the report's are
 * non-negative integers, nothing else is accepted. */
static const char *json_value(const char *p, int depth) {
    const char *s;
    size_t n;
    p = json_ws(p);
    if (depth > 16) return NULL;
    if (*p == '"') return json_string(p, &s, &n);
    if (*p >= '0' && *p <= '9') {
        if (*p == '0' && p[1] >= '0' && p[1] <= '9') return NULL; /* no leading zeros */
        while (*p >= '0' && *p <= '9')
            p++;
        return p;
    }
    char close = *p == '{' ? '}' : *p == '[' ? ']' : 0;
    if (!close) return NULL;
    p = json_ws(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
        if (close == '}') {
            if ((p = json_string(json_ws(p), &s, &n)) == NULL) return NULL;
            p = json_ws(p);
            if (*p++ != ':') return NULL;
        }
        if ((p = json_value(p, depth + 1)) == NULL) return NULL;
        p = json_ws(p);
        if (*p == close) return p + 1;
        if (*p++ != ',') return NULL;
    }
}

static bool json_valid(const char *text) {
    const char *e = json_value(text, 0);
    return e != NULL && *json_ws(e) == '\0' && *json_ws(text) == '{';
}

/* The value at path "a.b" (object keys) of a valid object: its start, or
 * NULL when there is none. */
static const char *json_at(const char *text, const char *path) {
    const char *p = json_ws(text);
    while (*path) {
        const char *dot = strchr(path, '.');
        size_t want = dot ? (size_t)(dot - path) : strlen(path);
        if (*p != '{') return NULL;
        p = json_ws(p + 1);
        for (;;) {
            const char *k;
            size_t n;
            if ((p = json_string(p, &k, &n)) == NULL) return NULL;
            p = json_ws(json_ws(p) + 1); /* past ':' */
            if (n == want && memcmp(k, path, n) == 0) break;
            p = json_ws(json_value(p, 0));
            if (*p != ',') return NULL;
            p = json_ws(p + 1);
        }
        path += want + (dot != NULL);
    }
    return p;
}

static uint64_t json_u64(const char *text, const char *path) {
    const char *p = json_at(text, path);
    if (p == NULL || *p < '0' || *p > '9') fail_msg("no number at %s", path);
    return strtoull(p, NULL, 10);
}

/* The stats now, into js. */
static void stats_now(void) {
    int n = hak_stats_json(js, sizeof js);
    assert_true(n > 0 && (size_t)n < sizeof js);
    assert_int_equal(strlen(js), (size_t)n);
}

static uint64_t in_use(void) {
    stats_now();
    return json_u64(js, "in_use.current");
}

/* ---- hak_stats_json ------------------------------------------------------------ */

/* The reader itself must fail on what is not JSON, or the tests below
 * could pass on anything. */
static void test_reader_rejects_bad_json(void **state) {
    (void)state;
    assert_true(json_valid("{\"a\":{\"b\":[1,2,{}]},\"c\":\"x\"}"));
    const char *bad[] = {"",           "{",     "{\"a\":1,}", "{\"a\" 1}",  "{\"a\":01}",
                         "{\"a\":1}}", "{a:1}", "[1,2]",      "{\"a\":-1}", "{\"a\":1,\"b\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(json_valid(bad[i]));
    assert_int_equal(json_u64("{\"a\":{\"b\":7,\"c\":8}}", "a.c"), 8);
    assert_null(json_at("{\"a\":{\"b\":7}}", "a.x"));
}

static void test_json_valid_with_every_group(void **state) {
    (void)state;
    void *p = malloc(100);
    stats_now();
    assert_true(json_valid(js));
    const char *version = json_at(js, "version");
    assert_non_null(version);
    assert_memory_equal(version, "\"" HAKMEM_VERSION "\"", strlen(HAKMEM_VERSION) + 2);
    assert_int_equal(json_u64(js, "pid"), (uint64_t)getpid());
    const char *paths[] = {"in_use.peak",
                           "mapped.current",
                           "mapped.peak",
                           "slot.stage2_unused",
                           "slot.purged",
                           "ss.live",
                           "pool.chunks_mapped",
                           "pool.drains",
                           "l25.bytes_out",
                           "large.cache_decommits",
                           "arena.reserved_bytes",
                           "os.mmap",
                           "os.mlock"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        (void)json_u64(js, paths[i]);
    /* The class of 100 bytes has traffic: it is listed. */
    const char *classes = json_at(js, "tiny.classes");
    assert_non_null(classes);
    char want[64];
    snprintf(want, sizeof want,
             "{\"class\":%u,\"size\":%u,\"allocs\":", (unsigned)small_class_of(100),
             (unsigned)small_class_size[small_class_of(100)]);
    assert_non_null(strstr(classes, want));
    free(p);
}

/* A big block: in use by its mapping's size (the request, to pages, a
 * guard page, and at most a quarter more to whole huge pages), and exactly
 * back when freed; mapped covers it. */
static void test_in_use_follows_a_large_block(void **state) {
    (void)state;
    const uint64_t n = 48 * MiB - 8 * KiB;
    uint64_t c0 = in_use();
    char *p = malloc(n);
    assert_non_null(p);
    p[0] = p[n - 1] = 1;
    uint64_t c1 = in_use();
    assert_true(c1 >= c0 + n);
    assert_true(c1 <= c0 + n + n / 4 + MiB);
    assert_true(json_u64(js, "in_use.peak") >= c1);
    assert_true(json_u64(js, "mapped.current") >= c1);
    assert_true(json_u64(js, "mapped.peak") >= json_u64(js, "mapped.current"));
    free(p);
    assert_int_equal(in_use(), c0);
    assert_true(json_u64(js, "in_use.peak") >= c1); /* the peak stays */
}

/* Small blocks count from their refill into the thread cache: what the
 * program holds, give or take what the cache holds. */
static void blocks_in_use(size_t size, uint32_t n) {
    static void *blocks[4096];
    uint32_t cls = small_class_of(size);
    uint64_t bytes = (uint64_t)n * small_class_size[cls];
    uint64_t cache = 2 * (uint64_t)small_class_cap[cls] * small_class_size[cls];
    uint64_t c0 = in_use();
    for (uint32_t i = 0; i < n; i++)
        assert_non_null(blocks[i] = malloc(size));
    uint64_t c1 = in_use();
    assert_true(c1 + cache >= c0 + bytes);
    assert_true(c1 <= c0 + bytes + cache);
    for (uint32_t i = 0; i < n; i++)
        free(blocks[i]);
    uint64_t c2 = in_use();
    assert_true(c2 <= c0 + cache && c2 + cache >= c0);
}

static void test_in_use_follows_small_blocks(void **state) {
    (void)state;
    blocks_in_use(64, 4000);   /* Tiny */
    blocks_in_use(3000, 1000); /* Tiny above 1 KiB */
    blocks_in_use(200000, 40); /* L2.5 */
}

/* The Pool tier counts its carved bytes (blocks with their headers, held or
 * free in their chunk) until the chunk is empty: in use moves with
 * pool.carved_bytes, byte for byte, and falls when the chunks are empty. */
static void test_in_use_follows_pool_carving(void **state) {
    (void)state;
    static void *blocks[200];
    malloc_trim(0);
    stats_now();
    int64_t c0 = (int64_t)json_u64(js, "in_use.current");
    int64_t k0 = (int64_t)json_u64(js, "pool.carved_bytes");
    for (int i = 0; i < 200; i++)
        assert_non_null(blocks[i] = malloc(20000));
    stats_now();
    int64_t c1 = (int64_t)json_u64(js, "in_use.current");
    int64_t k1 = (int64_t)json_u64(js, "pool.carved_bytes");
    assert_true(k1 - k0 >= 150 * 20000); /* (some may have been carved before) */
    assert_int_equal(c1 - c0, k1 - k0);
    for (int i = 0; i < 200; i++)
        free(blocks[i]);
    malloc_trim(0);
    stats_now();
    int64_t c2 = (int64_t)json_u64(js, "in_use.current");
    int64_t k2 = (int64_t)json_u64(js, "pool.carved_bytes");
    assert_true(k2 < k1 - 150 * 20000);
    assert_int_equal(c2 - c0, k2 - k0);
}

/* A block freed by another thread counts until its owner takes it back
 * (its next refill from that slab, here a malloc_trim), and then no more. */
#define REMOTE_N 2000
static void *remote_blocks[REMOTE_N];
static void *free_them(void *unused) {
    (void)unused;
    for (int i = 0; i < REMOTE_N; i++)
        free(remote_blocks[i]);
    return NULL;
}
static void test_in_use_after_remote_frees(void **state) {
    (void)state;
    uint64_t cache = 2 * (uint64_t)small_class_cap[small_class_of(48)] * 48;
    malloc_trim(0); /* (what the caches hold now does not go at the trim below) */
    uint64_t c0 = in_use();
    for (int i = 0; i < REMOTE_N; i++)
        assert_non_null(remote_blocks[i] = malloc(48));
    assert_true(in_use() + cache >= c0 + REMOTE_N * 48);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_them, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(in_use() + cache >= c0 + REMOTE_N * 48); /* not taken back yet */
    malloc_trim(0);
    assert_true(in_use() <= c0 + cache);
}

/* snprintf's contract: the full length whatever len is; at most len bytes
 * written, the last of them a NUL. (Nothing allocates between the calls:
 * the object stays the same.) */
static void test_truncation(void **state) {
    (void)state;
    int n = hak_stats_json(NULL, 0);
    assert_true(n > 100);
    memset(js, 'x', sizeof js);
    assert_int_equal(hak_stats_json(js, 0), n);
    assert_int_equal(js[0], 'x'); /* len 0: nothing written */
    assert_int_equal(hak_stats_json(js2, sizeof js2), n);
    assert_true(json_valid(js2));
    memset(js, 'x', sizeof js);
    assert_int_equal(hak_stats_json(js, 10), n);
    assert_int_equal(js[9], '\0');
    assert_memory_equal(js, js2, 9);
    assert_int_equal(js[10], 'x');
    memset(js, 'x', sizeof js);
    assert_int_equal(hak_stats_json(js, (size_t)n), n); /* one short: the last '}' goes */
    assert_int_equal(js[n - 1], '\0');
    assert_memory_equal(js, js2, (size_t)n - 1);
    assert_int_equal(js[n], 'x');
    memset(js, 'x', sizeof js);
    assert_int_equal(hak_stats_json(js, (size_t)n + 1), n); /* exactly room */
    assert_string_equal(js, js2);
    assert_int_equal(js[n + 1], 'x');
    assert_int_equal(hak_stats_json(js, 1), n);
    assert_int_equal(js[0], '\0');
}

/* ---- the report at exit ----------------------------------------------------------- */

static char self[4096];
static const char *child_env[4];

/* In the child: this program again (--child), with child_env set. */
static void exec_child(void *unused) {
    (void)unused;
    unsetenv("HAKMEM_STATS");
    unsetenv("HAKMEM_STATS_FILE");
    for (int i = 0; child_env[i]; i++)
        putenv((char *)child_env[i]);
    umask(0);
    execl(self, self, "--child", (char *)NULL);
    _exit(127);
}

/* Run the child with the given settings; its stderr into d. */
static void run_with(struct death *d, const char *stats, const char *file) {
    static char s[64], f[4200];
    snprintf(s, sizeof s, "HAKMEM_STATS=%s", stats);
    child_env[0] = s;
    child_env[1] = NULL;
    if (file) {
        snprintf(f, sizeof f, "HAKMEM_STATS_FILE=%s", file);
        child_env[1] = f;
        child_env[2] = NULL;
    }
    run_child(exec_child, NULL, d);
    assert_not_hung(d);
    assert_true(WIFEXITED(d->status));
    assert_int_equal(WEXITSTATUS(d->status), 0);
    d->err[d->len] = '\0';
}

static size_t read_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    assert_true(n >= 0);
    buf[n] = '\0';
    return (size_t)n;
}

static void temp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/hakmem-stats-%d-%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid(), name);
}

static void test_exit_json_to_file(void **state) {
    (void)state;
    char path[512];
    temp_path(path, sizeof path, "json");
    /* Longer than the report: the file is truncated, not overwritten. */
    unlink(path);
    struct death d;
    run_with(&d, "json", path);
    assert_string_equal(d.err, ""); /* nothing on stderr */
    size_t n = read_file(path, js, sizeof js);
    assert_true(n > 0 && js[n - 1] == '\n');
    js[n - 1] = '\0';
    assert_true(json_valid(js));
    assert_true(json_u64(js, "in_use.peak") >= 2 * MiB); /* the child's block */
    assert_true(json_u64(js, "large.allocs") >= 1);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644); /* created so (the child's umask: 0) */
    /* Again over a longer file: truncated, not overwritten in part. */
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    memset(js, ' ', 40000);
    assert_int_equal(write(fd, js, 40000), 40000);
    close(fd);
    run_with(&d, "json", path);
    n = read_file(path, js, sizeof js);
    assert_true(n < 40000 && js[n - 1] == '\n');
    js[n - 1] = '\0';
    assert_true(json_valid(js));
    unlink(path);
}

static void test_exit_text_to_file(void **state) {
    (void)state;
    char path[512];
    temp_path(path, sizeof path, "text");
    struct death d;
    run_with(&d, "1", path);
    assert_string_equal(d.err, "");
    read_file(path, js, sizeof js);
    assert_memory_equal(js, "hakmem: stats (", 15);
    assert_non_null(strstr(js, "\nhakmem:   os.mlock "));
    unlink(path);
}

static void test_exit_json_to_stderr(void **state) {
    (void)state;
    struct death d;
    run_with(&d, "json", NULL);
    assert_true(d.len > 0 && d.err[d.len - 1] == '\n');
    d.err[d.len - 1] = '\0';
    assert_true(json_valid(d.err));
}

/* A file that cannot be opened: one line says so, and the report goes to
 * stderr. */
static void test_exit_file_refused(void **state) {
    (void)state;
    struct death d;
    run_with(&d, "json", "/nonexistent-dir/stats.json");
    char *nl = strchr(d.err, '\n');
    assert_non_null(nl);
    *nl = '\0';
    assert_non_null(strstr(d.err, "HAKMEM_STATS_FILE"));
    assert_non_null(strstr(d.err, "/nonexistent-dir/stats.json"));
    char *rest = nl + 1;
    size_t n = strlen(rest);
    assert_true(n > 0 && rest[n - 1] == '\n');
    rest[n - 1] = '\0';
    assert_true(json_valid(rest));
}

static void test_bogus_setting_warns(void **state) {
    (void)state;
    struct death d;
    run_with(&d, "bogus", NULL);
    assert_non_null(strstr(d.err, "HAKMEM_STATS='bogus'"));
    assert_int_equal(strchr(d.err, '\n') - d.err + 1, (long)d.len); /* one line, no report */
}

/* ---- the text report ------------------------------------------------------------------ */

/* malloc_stats() on stderr, into js. */
static void text_report(void) {
    int fds[2], saved = dup(2);
    assert_int_equal(pipe(fds), 0);
    dup2(fds[1], 2);
    malloc_stats();
    dup2(saved, 2);
    close(saved);
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while ((r = read(fds[0], js + n, sizeof js - 1 - n)) > 0)
        n += (size_t)r;
    js[n] = '\0';
    close(fds[0]);
}

/* The lines tools may parse: the header, the Tiny table, then every counter
 * in this order, name padded to 24 columns, value right-aligned in 16. */
static void test_text_report_unchanged(void **state) {
    (void)state;
    static const char *const names[] = {"slot.stage1_empty_same",
                                        "slot.stage2_unused",
                                        "slot.stage2_empty_other",
                                        "slot.stage3_cached_ss",
                                        "slot.stage3_new_ss",
                                        "slot.releases",
                                        "ss.live",
                                        "ss.cached",
                                        "ss.retired",
                                        "ss.unmapped",
                                        "slot.purged",
                                        "pool.chunks_mapped",
                                        "pool.chunks_unmapped",
                                        "pool.bytes_mapped",
                                        "pool.carved_bytes",
                                        "pool.remote_frees",
                                        "pool.drains",
                                        "l25.bundles_mapped",
                                        "l25.bundles_unmapped",
                                        "l25.bytes_mapped",
                                        "l25.bytes_out",
                                        "l25.refills",
                                        "l25.flushes",
                                        "l25.decommits",
                                        "l25.free_decommitted",
                                        "large.allocs",
                                        "large.frees",
                                        "large.cache_hits",
                                        "large.remaps_inplace",
                                        "large.remaps_moved",
                                        "large.live_blocks",
                                        "large.live_bytes",
                                        "large.cached_blocks",
                                        "large.cached_bytes",
                                        "large.cache_decommits",
                                        "arena.reserved_bytes",
                                        "arena.units_used",
                                        "arena.fallbacks",
                                        "os.mmap",
                                        "os.munmap",
                                        "os.madvise",
                                        "os.mremap",
                                        "os.mprotect",
                                        "os.mlock"};
    void *p = malloc(24);
    text_report();
    free(p);
    char *line = js, *nl;
    assert_non_null(nl = strchr(line, '\n'));
    *nl = '\0';
    assert_string_equal(line, "hakmem: stats (allocs/frees: exited threads and this one)");
    line = nl + 1;
    assert_non_null(nl = strchr(line, '\n'));
    *nl = '\0';
    assert_string_equal(line, "hakmem:   tiny class   size        allocs         frees   refills"
                              "   flushes  remote_frees  adopted");
    line = nl + 1;
    /* Class rows: eight right-aligned numbers in 10, 7, 14, 14, 10, 10, 14, 9 columns. */
    int rows = 0;
    while (strncmp(line, "hakmem:   ", 10) == 0 && line[10] == ' ') {
        assert_non_null(nl = strchr(line, '\n'));
        assert_int_equal(nl - line, 10 + 10 + 7 + 14 + 14 + 10 + 10 + 14 + 9);
        unsigned long v[8];
        assert_int_equal(sscanf(line + 10, "%lu %lu %lu %lu %lu %lu %lu %lu", &v[0], &v[1], &v[2],
                                &v[3], &v[4], &v[5], &v[6], &v[7]),
                         8);
        line = nl + 1;
        rows++;
    }
    assert_true(rows >= 1);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char want[64];
        int w = snprintf(want, sizeof want, "hakmem:   %-24s", names[i]);
        assert_non_null(nl = strchr(line, '\n'));
        assert_int_equal(nl - line, w + 16);
        assert_memory_equal(line, want, (size_t)w);
        for (int k = w; k < w + 16; k++)
            assert_true(line[k] == ' ' || (line[k] >= '0' && line[k] <= '9'));
        assert_true(line[w + 15] >= '0' && line[w + 15] <= '9');
        line = nl + 1;
    }
    assert_string_equal(line, ""); /* nothing after */
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--child") == 0) {
        char *big = malloc(2 * MiB), *small = malloc(100); /* Large and Tiny */
        big[0] = small[0] = 1;
        free(big);
        free(small);
        return 0; /* exit: the report */
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_rejects_bad_json),
        cmocka_unit_test(test_json_valid_with_every_group),
        cmocka_unit_test(test_in_use_follows_a_large_block),
        cmocka_unit_test(test_in_use_follows_small_blocks),
        cmocka_unit_test(test_in_use_follows_pool_carving),
        cmocka_unit_test(test_in_use_after_remote_frees),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_exit_json_to_file),
        cmocka_unit_test(test_exit_text_to_file),
        cmocka_unit_test(test_exit_json_to_stderr),
        cmocka_unit_test(test_exit_file_refused),
        cmocka_unit_test(test_bogus_setting_warns),
        cmocka_unit_test(test_text_report_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
