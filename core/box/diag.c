#include "box/diag.h"

#include <execinfo.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void diag_str(struct diag_buf *b, const char *s) {
    while (*s && b->n < sizeof b->s)
        b->s[b->n++] = *s++;
}

static void diag_digits(struct diag_buf *b, uint64_t v, unsigned base, int width) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v);
    for (int pad = width - n; pad > 0 && b->n < sizeof b->s; pad--)
        b->s[b->n++] = ' ';
    while (n && b->n < sizeof b->s)
        b->s[b->n++] = tmp[--n];
}

void diag_u64(struct diag_buf *b, uint64_t v) {
    diag_digits(b, v, 10, 0);
}
void diag_u64w(struct diag_buf *b, uint64_t v, int width) {
    diag_digits(b, v, 10, width);
}

void diag_hex(struct diag_buf *b, uint64_t v) {
    diag_str(b, "0x");
    diag_digits(b, v, 16, 0);
}

bool diag_write(int fd, const void *s, size_t n) {
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, (const char *)s + off, n - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    return off == n;
}

bool diag_flush(struct diag_buf *b, int fd) {
    bool all = diag_write(fd, b->s, b->n);
    b->n = 0;
    return all;
}

static const char *const diag_kinds[] = {
    [DIAG_INVALID_POINTER] = "invalid pointer", [DIAG_DOUBLE_FREE] = "double free",
    [DIAG_SIZE_MISMATCH] = "size mismatch",     [DIAG_HEAP_UNDERFLOW] = "heap underflow",
    [DIAG_HEAP_OVERFLOW] = "heap overflow",     [DIAG_WRITE_AFTER_FREE] = "write after free",
    [DIAG_MISMATCHED_FREE] = "mismatched free", [DIAG_USE_AFTER_FREE] = "use after free",
};
static const char *const diag_tiers[] = {
    [TIER_NONE] = "",    [TIER_TINY] = "tiny",   [TIER_POOL] = "pool",
    [TIER_L25] = "L2.5", [TIER_LARGE] = "large", [TIER_CHECK] = "checked",
};

static bool diag_bt_armed;
static _Atomic bool diag_reporting;

void diag_arm_backtrace(void) {
    void *frame[2];
    backtrace(frame, 2); /* loads the unwinder now, while malloc works */
    diag_bt_armed = true;
}

/* The detail in parentheses: what the kind needs, then the block. */
static void diag_detail(struct diag_buf *b, const struct diag_bug *bug) {
    if (bug->tier == TIER_NONE) {
        diag_str(b, "not hakmem's memory");
        return;
    }
    switch (bug->kind) {
    case DIAG_INVALID_POINTER: /* no block starts there: say what the tier has */
        diag_str(b, "in the ");
        diag_str(b, diag_tiers[bug->tier]);
        diag_str(b, " tier");
        if (bug->block) {
            diag_str(b, ", blocks of ");
            diag_u64(b, bug->block);
            diag_str(b, " bytes");
        }
        return;
    case DIAG_SIZE_MISMATCH:
        diag_str(b, "size ");
        diag_u64(b, bug->given);
        diag_str(b, " given, ");
        break;
    case DIAG_HEAP_UNDERFLOW:
    case DIAG_HEAP_OVERFLOW:
    case DIAG_WRITE_AFTER_FREE:
    case DIAG_USE_AFTER_FREE:
        diag_str(b, "byte ");
        if (bug->at < 0) diag_str(b, "-");
        diag_u64(b, bug->at < 0 ? (uint64_t)-bug->at : (uint64_t)bug->at);
        diag_str(b, bug->read ? " read, " : " written, ");
        break;
    case DIAG_MISMATCHED_FREE:
        diag_str(b, "allocated by ");
        diag_str(b, bug->by);
        diag_str(b, ", ");
        break;
    case DIAG_DOUBLE_FREE:
        break;
    }
    /* (An underflow that overwrote the header leaves the size unknown.) */
    if (bug->block != 0 || bug->kind != DIAG_HEAP_UNDERFLOW) {
        diag_str(b, "block of ");
        diag_u64(b, bug->block);
        diag_str(b, " bytes, ");
    }
    diag_str(b, diag_tiers[bug->tier]);
    diag_str(b, " tier");
}

void diag_bug(const struct diag_bug *bug) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: ");
    diag_str(&b, bug->fn);
    diag_str(&b, "(): ");
    diag_str(&b, diag_kinds[bug->kind]);
    diag_str(&b, " ");
    diag_hex(&b, (uintptr_t)bug->p);
    diag_str(&b, " (");
    diag_detail(&b, bug);
    diag_str(&b, ")\n");
    diag_flush(&b, 2);
    /* Once only: the unwinder may itself trip over the heap this reports. */
    if (diag_bt_armed && !atomic_exchange(&diag_reporting, true)) {
        void *frame[64];
        int n = backtrace(frame, 64);
        diag_str(&b, "hakmem: backtrace:\n");
        diag_flush(&b, 2);
        backtrace_symbols_fd(frame + 1, n - 1, 2); /* (without this function) */
    }
    abort();
}

void diag_bad_pointer(const char *fn, enum diag_kind kind, const void *p, enum hak_tier tier,
                      size_t block) {
    diag_bug(&(struct diag_bug){.fn = fn, .kind = kind, .p = p, .tier = tier, .block = block});
}

void diag_reject(const char *fn, enum diag_kind kind, const void *p, enum hak_tier tier,
                 size_t block) {
    diag_bad_pointer(fn, kind, p, tier, block);
}
