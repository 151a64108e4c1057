#include "box/diag.h"

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

void diag_flush(struct diag_buf *b, int fd) {
    size_t off = 0;
    while (off < b->n) {
        ssize_t w = write(fd, b->s + off, b->n - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    b->n = 0;
}

void diag_bad_pointer(const char *fn, const char *what, const void *p) {
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: ");
    diag_str(&b, fn);
    diag_str(&b, "(): ");
    diag_str(&b, what);
    diag_str(&b, " ");
    diag_hex(&b, (uintptr_t)p);
    diag_str(&b, "\n");
    diag_flush(&b, 2);
    abort();
}

void diag_reject(const char *fn, const char *what, const void *p) {
    diag_bad_pointer(fn, what, p);
}
