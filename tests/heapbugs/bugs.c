/* Heap-bug programs (C cases): `bugs CASE` runs one bug and exits 0 when the
 * bug went unnoticed, HB_MITIGATED when the program saw it mitigated; a catch
 * by the allocator stops the process or reports on stderr. `bugs --list`
 * prints every case (name, kind, tier). See README.md. */
#define _GNU_SOURCE
#include "heapbugs.h"

#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

/* The bugs are intentional. */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
#pragma GCC diagnostic ignored "-Wuse-after-free"
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

/* C23; absent from older C libraries. */
extern void free_sized(void *p, size_t size) __attribute__((weak));

#define SECRET 0x5ec2e75ec2e75ec2ull

/* Writes n bytes past the end of a block, then frees it and its neighbour. */
static int overflow(size_t size, size_t n) {
    char *p = fresh(size), *q = fresh(size);
    fill(p + size, n, 0x41);
    free(p);
    free(q);
    return churn(size);
}

/* Writes n bytes before the start of a block, then frees it and the one before. */
static int underflow(size_t size, size_t n) {
    char *q = fresh(size), *p = fresh(size);
    fill(p - n, n, 0x41);
    free(p);
    free(q);
    return churn(size);
}

/* The same two, but p is never freed: the program exits (no canary is
 * looked at by a free). */
static int overflow_nofree(size_t size, size_t n) {
    char *p = fresh(size);
    fill(p + size, n, 0x41);
    return 0;
}

static int underflow_nofree(size_t size, size_t n) {
    char *p = fresh(size);
    fill(p - n, n, 0x41);
    return 0;
}

/* A source for the copies below, outside the heap: 1 MiB more than the
 * largest block, filled with 'b' and ending in a NUL. */
static const char *copy_source(size_t len) {
    char *m =
        (char *)mmap(NULL, len + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) exit(HB_SETUP);
    fill(m, len, 'b');
    return m;
}

/* memcpy of size + n bytes into a block of size: n bytes past its end; the
 * block is never freed. */
static int memcpy_over(size_t size, size_t n) {
    char *p = fresh(size);
    memcpy(p, copy_source(size + n), size + n);
    return 0;
}

/* memcpy of n bytes to the n bytes before a block, never freed. */
static int memcpy_under(size_t size, size_t n) {
    char *p = fresh(size);
    memcpy(p - n, copy_source(n), n);
    return 0;
}

/* memset / memmove of size + n bytes into a block of size, never freed. */
static int memset_over(size_t size, size_t n) {
    char *p = fresh(size);
    memset(p, 0x41, size + n);
    return 0;
}

static int memmove_over(size_t size, size_t n) {
    char *p = fresh(size);
    memmove(p, copy_source(size + n), size + n);
    return 0;
}

/* strcpy of a string of size characters: its NUL lands 1 byte past the end. */
static int strcpy_over(size_t size, size_t unused) {
    (void)unused;
    char *p = fresh(size);
    strcpy(p, copy_source(size));
    return 0;
}

/* memcpy of size + n bytes out of a block: a read past its end. */
static int memcpy_overread(size_t size, size_t n) {
    char *p = fresh(size);
    char *d = (char *)copy_source(size + n);
    memcpy(d, p, size + n);
    return 0;
}

/* Writes 8 bytes at offset off of a freed block. */
static int uaf_write(size_t size, size_t off) {
    char *p = fresh(size);
    free(p);
    fill(p + off, 8, 0x41);
    return churn(size);
}

/* The same in the middle of the block, past the first 16 bytes. */
static int uaf_write_mid(size_t size, size_t unused) {
    (void)unused;
    size_t mid = size / 2 & ~(size_t)7;
    return uaf_write(size, mid < 16 ? 16 : mid);
}

/* Writes 8 bytes in the middle of a freed block, then exits: nothing is
 * allocated or freed after the bug. */
static int uaf_write_exit(size_t size, size_t unused) {
    (void)unused;
    size_t mid = size / 2 & ~(size_t)7;
    char *p = fresh(size);
    free(p);
    fill(p + (mid < 16 ? 16 : mid), 8, 0x41);
    return 0;
}

/* Frees a block, then up to 5000 others of its size (at most 256 MiB), so
 * that it has left any quarantine; then writes into it and exits. */
static int uaf_write_late(size_t size, size_t unused) {
    (void)unused;
    size_t n = 256 * HB_MIB / size < 5000 ? 256 * HB_MIB / size : 5000;
    size_t mid = size / 2 & ~(size_t)7;
    char **others = (char **)malloc(n * sizeof *others);
    char *p = fresh(size);
    if (!others) exit(HB_SETUP);
    for (size_t i = 0; i < n; i++)
        if (!(others[i] = (char *)malloc(size))) exit(HB_SETUP);
    free(p);
    for (size_t i = 0; i < n; i++)
        free(others[i]);
    fill(p + (mid < 16 ? 16 : mid), 8, 0x41);
    return 0;
}

/* Blocks of size filled with a secret and freed, up to 5000 of them (at
 * most 256 MiB: past any quarantine), then as many allocated again and
 * read: mitigated when none shows a word of an earlier owner's data. */
static int uninit_read_reused(size_t size, size_t unused) {
    (void)unused;
    size_t n = 256 * HB_MIB / size < 5000 ? 256 * HB_MIB / size : 5000, left = 0;
    uint64_t **b = (uint64_t **)malloc(n * sizeof *b);
    if (!b) exit(HB_SETUP);
    for (size_t i = 0; i < n; i++) {
        if (!(b[i] = (uint64_t *)malloc(size))) exit(HB_SETUP);
        for (size_t w = 0; w < size / 8; w++)
            b[i][w] = SECRET;
    }
    for (size_t i = 0; i < n; i++)
        free(b[i]);
    for (size_t i = 0; i < n; i++)
        if (!(b[i] = (uint64_t *)malloc(size))) exit(HB_SETUP);
    for (size_t i = 0; i < n; i++) {
        volatile uint64_t *v = b[i];
        for (size_t w = 0; w < size / 8; w++)
            left += v[w] == SECRET;
    }
    return left ? 0 : HB_MITIGATED;
}

/* Reads a freed block that held a secret, past its first 16 bytes (links).
 * Mitigated when no word of the secret is left (or the read faults). */
static int uaf_read(size_t size, size_t unused) {
    (void)unused;
    uint64_t *p = (uint64_t *)fresh(size);
    size_t words = size / 8, left = 0;
    for (size_t i = 0; i < words; i++)
        p[i] = SECRET;
    free(p);
    volatile uint64_t *v = p;
    for (size_t i = 2; i < words; i++)
        left += v[i] == SECRET;
    return left ? 0 : HB_MITIGATED;
}

static int double_free_immediate(size_t size, size_t unused) {
    (void)unused;
    char *a = fresh(size);
    free(a);
    free(a);
    return churn(size);
}

static int double_free_interleaved(size_t size, size_t unused) {
    (void)unused;
    char *a = fresh(size), *b = fresh(size);
    free(a);
    free(b);
    free(a);
    return churn(size);
}

/* Frees a, then up to 1000 other blocks of its size (at most 256 MiB of
 * them), then a again. */
static int double_free_delayed(size_t size, size_t unused) {
    (void)unused;
    size_t n = 256 * HB_MIB / size < 1000 ? 256 * HB_MIB / size : 1000;
    char **others = (char **)malloc(n * sizeof *others);
    char *a = fresh(size);
    if (!others) exit(HB_SETUP);
    for (size_t i = 0; i < n; i++)
        if (!(others[i] = (char *)malloc(size))) exit(HB_SETUP);
    free(a);
    for (size_t i = 0; i < n; i++)
        free(others[i]);
    free(a);
    free(others);
    return churn(size);
}

static void *free_in_thread(void *p) {
    free(p);
    return NULL;
}

/* Another thread frees a, then the main thread frees it again. */
static int double_free_cross_thread(size_t size, size_t unused) {
    (void)unused;
    char *a = fresh(size);
    pthread_t t;
    if (pthread_create(&t, NULL, free_in_thread, a) != 0) exit(HB_SETUP);
    pthread_join(t, NULL);
    free(a);
    return churn(size);
}

static void free_sized_or_free(void *p, size_t size) {
    if (free_sized)
        free_sized(p, size);
    else
        free(p);
}

static int double_free_sized(size_t size, size_t unused) {
    (void)unused;
    char *a = fresh(size);
    free_sized_or_free(a, size);
    free_sized_or_free(a, size);
    return churn(size);
}

/* free(p + off) of a live block (p itself is leaked, not freed). */
static int free_interior(size_t size, size_t off) {
    char *p = fresh(size);
    free(p + off);
    return churn(size);
}

/* A zeroed "header" in front of the freed address, so a header read is
 * deterministic. */
struct fake {
    size_t head[2];
    char body[64];
};
static struct fake global_fake;

static int free_stack(size_t size, size_t unused) {
    (void)unused;
    struct fake f;
    memset(&f, 0, sizeof f);
    free(f.body);
    return churn(size);
}

static int free_global(size_t size, size_t unused) {
    (void)unused;
    free(global_fake.body);
    return churn(size);
}

static int free_literal(size_t size, size_t unused) {
    (void)unused;
    free((void *)"heapbugs: a string literal");
    return churn(size);
}

/* A 16-byte aligned address 1 MiB past a live block, never handed out. */
static int free_wild(size_t size, size_t unused) {
    (void)unused;
    char *p = fresh(size);
    uintptr_t w = ((uintptr_t)p + HB_MIB + 0x1230) & ~(uintptr_t)15;
    free((void *)w);
    return churn(size);
}

/* The second page of a private mapping (the page before it is mapped and zero). */
static int free_mmap(size_t size, size_t unused) {
    (void)unused;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *m =
        (char *)mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) exit(HB_SETUP);
    free(m + page);
    return churn(size);
}

static int realloc_freed(size_t size, size_t unused) {
    (void)unused;
    char *p = fresh(size);
    free(p);
    free(realloc(p, 2 * size));
    return churn(size);
}

/* realloc(p + off) of a live block (p is leaked). */
static int realloc_interior(size_t size, size_t off) {
    char *p = fresh(size);
    free(realloc(p + off, 2 * size));
    return churn(size);
}

/* malloc(0), then 8 bytes written (write) or one read (read). A NULL
 * result is a mitigation: there is nothing to misuse. */
static int zero_size(size_t unused, size_t write) {
    (void)unused;
    char *p = (char *)malloc(0);
    if (!p) return HB_MITIGATED;
    if (write)
        fill(p, 8, 0x41);
    else
        (void)*(volatile char *)p;
    free(p);
    return churn(0);
}

/* Frees a block, then allocates `window` blocks of its size: mitigated when
 * none of them is the freed block (a dangling pointer to it would alias). */
static int reuse(size_t size, size_t window) {
    char *b[8];
    uintptr_t was = (uintptr_t)fresh(size);
    int again = 0;
    free((void *)was);
    for (size_t i = 0; i < window; i++) {
        b[i] = (char *)malloc(size);
        again |= (uintptr_t)b[i] == was;
    }
    for (size_t i = 0; i < window; i++)
        free(b[i]);
    return again ? 0 : HB_MITIGATED;
}

/* Correct use of everything the cases touch: must exit 0 with nothing on stderr. */
static int control(void) {
    for (int t = 0; t < NTIERS; t++) {
        size_t size = tier_sizes[t];
        char *p = fresh(size), *q = (char *)calloc(1, tier_exact[t]);
        pthread_t th;
        if (!q || !(p = (char *)realloc(p, 2 * size))) return HB_SETUP;
        free_sized_or_free(q, tier_exact[t]);
        if (pthread_create(&th, NULL, free_in_thread, p) != 0) return HB_SETUP;
        pthread_join(th, NULL);
        churn(size);
    }
    free(malloc(0));
    return churn(0);
}

static const struct kind {
    const char *kind;
    int (*fn)(size_t size, size_t arg);
    size_t arg;
    unsigned tiers; /* one case per tier in the mask; none: one case without tier */
    unsigned exact; /* tiers with a *_exact variant too */
} kinds[] = {
    {"overflow_1", overflow, 1, ALL, T_TINY | T_POOL},
    {"overflow_32", overflow, 32, ALL, 0},
    {"overflow_1m", overflow, HB_MIB, ALL, 0},
    {"underflow_1", underflow, 1, ALL, 0},
    {"underflow_32", underflow, 32, ALL, 0},
    {"underflow_1m", underflow, HB_MIB, ALL, 0},
    {"overflow_1m_nofree", overflow_nofree, HB_MIB, ALL, 0},
    {"underflow_1m_nofree", underflow_nofree, HB_MIB, ALL, 0},
    {"memcpy_overflow_1", memcpy_over, 1, ALL, T_TINY | T_POOL},
    {"memcpy_overflow_32", memcpy_over, 32, ALL, 0},
    {"memcpy_overflow_1m", memcpy_over, HB_MIB, ALL, 0},
    {"memcpy_underflow_1", memcpy_under, 1, ALL, 0},
    {"memcpy_underflow_32", memcpy_under, 32, ALL, 0},
    {"memcpy_underflow_1m", memcpy_under, HB_MIB, ALL, 0},
    {"memset_overflow_32", memset_over, 32, ALL, 0},
    {"memmove_overflow_32", memmove_over, 32, ALL, 0},
    {"strcpy_overflow_1", strcpy_over, 0, ALL, 0},
    {"memcpy_overread_32", memcpy_overread, 32, ALL, 0},
    {"use_after_free_write_start", uaf_write, 0, ALL, 0},
    {"use_after_free_write_mid", uaf_write_mid, 0, ALL, 0},
    {"use_after_free_write_exit", uaf_write_exit, 0, ALL, 0},
    {"use_after_free_write_late", uaf_write_late, 0, ALL, 0},
    {"use_after_free_read", uaf_read, 0, ALL, 0},
    {"uninit_read_reused", uninit_read_reused, 0, ALL, 0},
    {"double_free_immediate", double_free_immediate, 0, ALL, 0},
    {"double_free_interleaved", double_free_interleaved, 0, ALL, 0},
    {"double_free_delayed", double_free_delayed, 0, ALL, 0},
    {"double_free_cross_thread", double_free_cross_thread, 0, ALL, 0},
    {"double_free_sized", double_free_sized, 0, ALL, 0},
    {"invalid_free_interior_16", free_interior, 16, ALL, 0},
    {"invalid_free_interior_page", free_interior, 4096, T_POOL | T_L25 | T_LARGE, 0},
    {"invalid_free_unaligned", free_interior, 1, ALL, 0},
    {"invalid_free_stack", free_stack, 0, NO_TIER, 0},
    {"invalid_free_global", free_global, 0, NO_TIER, 0},
    {"invalid_free_literal", free_literal, 0, NO_TIER, 0},
    {"invalid_free_wild", free_wild, 0, NO_TIER, 0},
    {"invalid_free_mmap", free_mmap, 0, NO_TIER, 0},
    {"realloc_freed", realloc_freed, 0, ALL, 0},
    {"realloc_interior", realloc_interior, 16, ALL, 0},
    {"zero_size_write", zero_size, 1, NO_TIER, 0},
    {"zero_size_read", zero_size, 0, NO_TIER, 0},
    {"reuse_immediate", reuse, 1, ALL, 0},
    {"reuse_within_8", reuse, 8, ALL, 0},
};

int main(int argc, char **argv) {
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        const struct kind *d = &kinds[k];
        if (d->tiers == NO_TIER) hb_add(d->kind, -1, 0, d->fn, SZ_TINY, d->arg);
        for (int t = 0; t < NTIERS; t++) {
            if (d->tiers & 1u << t) hb_add(d->kind, t, 0, d->fn, tier_sizes[t], d->arg);
            if (d->exact & 1u << t) hb_add(d->kind, t, 1, d->fn, tier_exact[t], d->arg);
        }
    }
    return hb_main(argc, argv, control);
}
