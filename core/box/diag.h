/* Diagnostics: the one place hakmem talks to the user on stderr. Everything
 * here writes with write(2), never stdio, so it is safe inside malloc. */
#ifndef HAK_DIAG_H
#define HAK_DIAG_H

#include "box/tier.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a heap bug is... */
enum diag_kind {
    DIAG_INVALID_POINTER,
    DIAG_DOUBLE_FREE,
    DIAG_SIZE_MISMATCH,
    DIAG_HEAP_UNDERFLOW,
    DIAG_HEAP_OVERFLOW,
    DIAG_WRITE_AFTER_FREE,
    DIAG_MISMATCHED_FREE, /* freed by another family than allocated it (free of new's) */
    DIAG_USE_AFTER_FREE,  /* a memory operation on a freed block (checked mode) */
};

/* The API family a block was allocated through (malloc and its kin,
 * operator new, operator new[]): its free must be the same family's. The
 * front passes it down; checked mode records it and a mismatched free
 * names it. */
enum api_family { API_MALLOC, API_NEW, API_NEW_ARRAY };
/* ... and where: the tier whose memory the pointer is in (enum hak_tier,
 * box/tier.h; TIER_NONE: no tier's). */

/* One heap bug, as reported:
 *   hakmem: <fn>(): <kind> <p> (<detail>, block of <block> bytes, <tier> tier)
 * block: the block's size (for an invalid pointer, the size of the tier's
 * blocks there), 0 when unknown. */
struct diag_bug {
    const char *fn; /* the API call: "free", "operator delete" */
    enum diag_kind kind;
    const void *p;
    enum hak_tier tier;
    size_t block;
    size_t given;   /* size mismatch: the size the caller gave */
    ptrdiff_t at;   /* underflow, overflow, write after free: the byte written, from p */
    bool read;      /* ... read, not written (a memory operation's source) */
    const char *by; /* mismatched free: the call that allocated the block */
};

/* Print the report (and a backtrace when armed), then abort(). */
_Noreturn void diag_bug(const struct diag_bug *bug);

/* The common reports, with no detail beyond the block. */
_Noreturn void diag_bad_pointer(const char *fn, enum diag_kind kind, const void *p,
                                enum hak_tier tier, size_t block);
/* The same, for hot paths: deliberately not declared noreturn, so a caller
 * can reach it with a tail jump and needs no stack frame of its own. It
 * never returns. */
__attribute__((cold)) void diag_reject(const char *fn, enum diag_kind kind, const void *p,
                                       enum hak_tier tier, size_t block);

/* HAKMEM_BACKTRACE: every report also prints the calls that led to it. Arms
 * the unwinder now (it loads a library and allocates on first use), so call
 * it where malloc works: not from inside the allocator. */
void diag_arm_backtrace(void);

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
/* All n bytes of s to fd (retrying short writes); false if some were not written. */
bool diag_write(int fd, const void *s, size_t n);
/* Write it all to fd and empty it; false when a write failed. */
bool diag_flush(struct diag_buf *b, int fd);

#endif
