/* Diagnostics: the one place hakmem talks to the user on stderr. Everything
 * here writes with write(2), never stdio, so it is safe inside malloc. */
#ifndef HAK_DIAG_H
#define HAK_DIAG_H

#include <stddef.h>
#include <stdint.h>

/* "hakmem: <fn>(): <what> 0x<ptr>" on stderr, then abort(). */
_Noreturn void diag_bad_pointer(const char *fn, const char *what, const void *p);

/* The same, for hot paths: deliberately not declared noreturn, so a caller
 * can reach it with a tail jump and needs no stack frame of its own. It
 * never returns. */
__attribute__((cold)) void diag_reject(const char *fn, const char *what, const void *p);

/* A small append-only text buffer for building lines without stdio. */
struct diag_buf {
    char s[512];
    size_t n;
};
void diag_str(struct diag_buf *b, const char *s);
void diag_u64(struct diag_buf *b, uint64_t v);
void diag_hex(struct diag_buf *b, uint64_t v);
/* Right-aligned in `width` columns. */
void diag_u64w(struct diag_buf *b, uint64_t v, int width);
void diag_flush(struct diag_buf *b, int fd);

#endif
