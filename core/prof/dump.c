/* The heap profiler's dump: prof.c's records written out as a profile
 * pprof reads, at exit and when asked (hak_prof_dump). */
#include "prof/internal.h"

#include "box/diag.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- the dump ----------------------------------------------------------------
 * pprof's heap-profile text (gperftools' heap-profiler): a header with the
 * totals, a line per stack (pprof adds up lines of the same stack), then
 * /proc/self/maps for the symbols. "heapprofile" says the figures are
 * estimates already: pprof does not scale them again. The bracketed
 * allocated totals are not kept (0): only the in-use views mean anything. */

/* Empty b into fd when what comes next might not fit: every piece the dump
 * appends at once (a number, an address, a literal) is under PROF_PIECE. */
#define PROF_PIECE 64
static void prof_room(struct diag_buf *b, int fd, bool *ok) {
    if (b->n + PROF_PIECE > sizeof b->s && !diag_flush(b, fd)) *ok = false;
}

/* "N: BYTES [0: 0] @" */
static void prof_put_counts(struct diag_buf *b, int fd, bool *ok, uint64_t n, uint64_t bytes) {
    prof_room(b, fd, ok);
    diag_u64(b, n);
    diag_str(b, ": ");
    diag_u64(b, bytes);
    diag_str(b, " [0: 0] @");
}

static void prof_put_maps(struct diag_buf *b, int fd, bool *ok) {
    diag_str(b, "\nMAPPED_LIBRARIES:\n");
    if (!diag_flush(b, fd)) *ok = false;
    int in = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        *ok = false;
        return;
    }
    char buf[8192]; /* few reads: the kernel makes the text again for each */
    ssize_t got;
    while ((got = read(in, buf, sizeof buf)) > 0)
        if (!diag_write(fd, buf, (size_t)got)) *ok = false;
    if (got < 0) *ok = false;
    close(in);
}

/* path with each %p replaced by the process id (and %% by %), into out
 * (len bytes); false when it does not fit. */
static bool prof_expand(const char *path, char *out, size_t len) {
    struct diag_buf pid = {.n = 0};
    diag_u64(&pid, (uint64_t)getpid());
    size_t n = 0;
    for (const char *c = path; *c; c++) {
        const char *piece = c;
        size_t k = 1;
        if (c[0] == '%' && c[1] == 'p') {
            piece = pid.s;
            k = pid.n;
            c++;
        } else if (c[0] == '%' && c[1] == '%') {
            c++;
        }
        if (k >= len - n) return false; /* (room for the '\0' kept) */
        memcpy(out + n, piece, k);
        n += k;
    }
    out[n] = '\0';
    return true;
}

/* Take the records' lock for a dump, waiting a second at most: at exit (or
 * in a signal handler) it may be held by code this thread interrupted,
 * which never gives it back. */
static bool prof_lock_dump(void) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (hak_spin_trylock(&prof_lock)) return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec) >= 1000000000) {
            errno = EDEADLK;
            return false;
        }
        struct timespec nap = {0, 50000}; /* 50 us (raw: no cancellation point) */
        syscall(SYS_nanosleep, &nap, NULL);
    }
}

/* A record as the dump writes it. */
struct prof_line {
    uint64_t n, size;
    uint32_t depth;
    void *pc[PROF_DEPTH];
};
#define PROF_BATCH 8 /* lines copied at a time: on the stack, ~4 KiB */

/* The dump copies the records a few at a time, under the lock, into its
 * own frame, and writes them with no lock held: a write is a cancellation
 * point, and a preloaded wrapper of it may allocate (and sample, which
 * takes the lock). No memory to ask for: a dump near a memory limit still
 * works. The cursor: bucket *b, past the first *skip records of its chain.
 * The lines copied (0 at the end); -1 with errno when the lock stayed held. */
static int prof_copy_lines(uint32_t *b, uint32_t *skip, struct prof_line *out) {
    if (!prof_lock_dump()) return -1;
    int n = 0;
    for (; *b < PROF_BUCKETS; ++*b, *skip = 0) {
        const struct prof_rec *r = prof_table[*b];
        for (uint32_t k = 0; r != NULL && k < *skip; k++)
            r = r->next;
        for (; r != NULL; r = r->next, ++*skip) {
            if (n == PROF_BATCH) goto full;
            if (r->depth == 0) continue; /* no stack: nothing pprof could show */
            out[n].n = atomic_load_explicit(&r->n, memory_order_acquire);
            out[n].size = atomic_load_explicit(&r->size, memory_order_relaxed);
            out[n].depth = r->depth;
            memcpy(out[n].pc, r->pc, r->depth * sizeof r->pc[0]);
            n++;
        }
    }
full:
    hak_spin_unlock(&prof_lock);
    return n;
}

/* The header's totals (a pass of their own: lines may come and go before
 * they are written, as the program runs on). false when the lock stayed
 * held. */
static bool prof_totals(uint64_t *count, uint64_t *bytes) {
    if (!prof_lock_dump()) return false;
    *count = *bytes = 0;
    for (uint32_t i = 0; i < PROF_BUCKETS; i++)
        for (const struct prof_rec *r = prof_table[i]; r != NULL; r = r->next) {
            if (r->depth == 0) continue;
            uint64_t n = atomic_load_explicit(&r->n, memory_order_acquire);
            struct prof_est e =
                prof_estimate(n, atomic_load_explicit(&r->size, memory_order_relaxed));
            *count += e.count;
            *bytes += e.bytes;
        }
    hak_spin_unlock(&prof_lock);
    return true;
}

static int prof_dump_to(const char *path) {
    char name[sizeof prof_file];
    if (!prof_expand(path != NULL ? path : prof_file, name, sizeof name)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    uint64_t total_n, total_bytes;
    if (!prof_totals(&total_n, &total_bytes)) return -1;
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    struct diag_buf b = {.n = 0};
    bool ok = true;
    diag_str(&b, "heap profile: ");
    prof_put_counts(&b, fd, &ok, total_n, total_bytes);
    diag_str(&b, " heapprofile\n");
    struct prof_line line[PROF_BATCH];
    uint32_t bucket = 0, skip = 0;
    int got;
    while ((got = prof_copy_lines(&bucket, &skip, line)) > 0)
        for (int i = 0; i < got; i++) {
            const struct prof_line *r = &line[i];
            struct prof_est e = prof_estimate(r->n, r->size);
            prof_put_counts(&b, fd, &ok, e.count, e.bytes);
            for (uint32_t f = 0; f < r->depth; f++) {
                prof_room(&b, fd, &ok);
                diag_str(&b, " ");
                diag_hex(&b, (uintptr_t)r->pc[f]);
            }
            diag_str(&b, "\n"); /* (the last piece left room for it) */
        }
    int err = got < 0 ? errno : 0; /* (EDEADLK: the lock stayed held) */
    if (got < 0) ok = false;
    prof_put_maps(&b, fd, &ok);
    if (!ok && err == 0) err = errno != 0 ? errno : EIO;
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        errno = err;
        return -1;
    }
    return 0;
}

/* The dump, not cancelled halfway (a file cut short, its snapshot's
 * mapping lost): a cancel that comes meanwhile waits. */
static int prof_dump_whole(const char *path) {
    if (!prof_on) {
        errno = EINVAL;
        return -1;
    }
    int state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &state);
    int rc = prof_dump_to(path);
    int saved = errno;
    pthread_setcancelstate(state, NULL);
    errno = saved;
    return rc;
}

int prof_dump(const char *path) {
    int rc = prof_dump_whole(path);
    /* A cancellation point still (its writes were), now at its end: a
     * thread that dumps in a loop can be cancelled. */
    int saved = errno;
    pthread_testcancel();
    errno = saved;
    return rc;
}

void prof_exit(void) {
    if (!prof_on) return;
    uint64_t lost = atomic_load_explicit(&prof_n_lost, memory_order_relaxed);
    if (lost != 0) {
        struct diag_buf b = {.n = 0};
        diag_str(&b, "hakmem: heap profile: ");
        diag_u64(&b, lost);
        diag_str(&b, " sampled allocations were not recorded (too many sampled blocks in use at "
                     "once, or no memory for one); the profile undercounts: a larger "
                     "HAKMEM_PROF_SAMPLE takes fewer\n");
        diag_flush(&b, 2);
    }
    if (prof_dump_whole(NULL) == 0) return;
    int err = errno;
    /* The file it tried: %p as the process id (the setting itself when
     * that is too long). */
    char name[sizeof prof_file];
    if (!prof_expand(prof_file, name, sizeof name)) memcpy(name, prof_file, sizeof name);
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: could not write the heap profile to '");
    diag_flush(&b, 2);
    diag_write(2, name, strlen(name)); /* (a path may not fit in b) */
    diag_str(&b, "' (errno ");
    diag_u64(&b, (uint64_t)err);
    diag_str(&b, ")\n");
    diag_flush(&b, 2);
}
