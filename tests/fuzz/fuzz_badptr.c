/* libFuzzer target: bad pointers must abort with one line naming them.
 *
 * An input is a 6-byte header and a short program (tests/fuzz/fuzz_model.h,
 * 16 slots, at most 48 operations, fully checked as in fuzz_api). After the
 * program, one bad call runs in a fork()ed child with stderr on a pipe: the
 * child must die of SIGABRT within 5 s having written exactly one line
 *     hakmem: <fn>(): <invalid pointer|double free> 0x<pointer>
 * and nothing else. The parent is never touched by the bad call.
 *
 * Header: case, fn, target, offset (2 bytes), flags.
 *   case   interior   a pointer inside a live block (p + 1 .. usable - 1)
 *          foreign    stack, global, libc malloc, private mmap page, NULL +
 *                     small, non-canonical, the page right after a live
 *                     Large mapping, the unused SuperSlab range
 *          freed      a pointer the program freed earlier
 *          double     the child frees a live block, then calls fn on it
 *          xthread    one thread frees a live block in the parent, the child
 *                     of the other thread calls fn on it
 *          near       a live block's address +- k*16, or its 2 MiB region's
 *                     base + k*16 (whatever lies there)
 *   fn     free, free_sized, free_aligned_sized, realloc, malloc_usable_size
 *   flags  bit 0: the bad call comes from the worker thread (it forks)
 *
 * Only what hakmem promises to catch (docs/DESIGN.md, "Free and bad
 * pointers") is generated; everything else is skipped:
 *   - a pointer that is the start of a live block is valid;
 *   - a pointer inside a live block (its usable size) is an invalid pointer;
 *   - in the SuperSlab range (Tiny), the start of a carved
 *     block that is not live is free (marked so in its second word) or in a
 *     slot given back: the call must abort, realloc and malloc_usable_size
 *     saying "invalid pointer", the free calls either word;
 *   - anywhere else the call must abort; the word may be either ("double
 *     free" for a block that is still free where it was, "invalid pointer"
 *     once its memory was given back or re-carved).
 * Foreign and interior pointers must say "invalid pointer".
 *
 * Environment: FUZZ_BADPTR_STATS=1 prints counters at exit;
 * FUZZ_BADPTR_STRICT=1 also requires the "ideal" word for freed pointers
 * ("double free" from the free calls; see expect_for()), to find where hakmem
 * says "invalid pointer" for a block that was freed. */
#include "fuzz_model.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

#include "../timing.h"

/* A child still running after this (scaled: tests/timing.h, 3 times for
 * this ASan build: 9 s) is killed as hung. The children take 6 ms (median),
 * 37 ms at most (checked mode), here: 3 s is 80 times that. Scaled alike,
 * it stays under libFuzzer's -timeout of tests/fuzz/run.sh (20 s, scaled by
 * HAKMEM_TEST_TIME_SCALE), so that a hang is reported here, with its case. */
#define BAD_LIMIT_BASE_MS 3000

enum bad_case { C_INTERIOR, C_FOREIGN, C_FREED, C_DOUBLE, C_XTHREAD, C_NEAR, C_N };
static const char *const case_name[] = {"interior", "foreign", "freed",
                                        "double",   "xthread", "near"};

enum bad_fn { B_FREE, B_FREE_SIZED, B_FREE_ALIGNED_SIZED, B_REALLOC, B_USABLE, B_N };
static const char *const bad_fn_name[] = {"free", "free_sized", "free_aligned_sized", "realloc",
                                          "malloc_usable_size"};

#define W_INVALID "invalid pointer"
#define W_DOUBLE  "double free"

/* What the child does and what it must say. */
struct bad {
    enum bad_case kind;
    enum bad_fn fn;
    uint8_t *q;         /* the bad pointer */
    size_t size, align; /* free_sized / free_aligned_sized arguments */
    size_t realloc_n;   /* realloc's size */
    bool prefree;       /* the child first frees q (valid), then the bad call */
    const char *word;   /* required word, or NULL: either */
    const char *ideal;  /* the word expected in strict mode */
    bool worker;        /* the bad call comes from the worker */
    int foreign;        /* sub-kind of C_FOREIGN */
    int pipe_w;
    pid_t pid;
    const char *what; /* description for reports */
};

static struct bad g_bad;
static bool bp_stats, bp_strict;
static uint64_t bp_runs, bp_cases[C_N], bp_skips[C_N], bp_word_other;
static _Alignas(64) char bp_global[256];

static void bp_print_stats(void) {
    fprintf(stderr, "fuzz_badptr: %llu inputs;", (unsigned long long)bp_runs);
    for (int c = 0; c < C_N; c++)
        fprintf(stderr, " %s %llu run/%llu skipped;", case_name[c], (unsigned long long)bp_cases[c],
                (unsigned long long)bp_skips[c]);
    fprintf(stderr, " freed pointers reported with the non-ideal word: %llu\n",
            (unsigned long long)bp_word_other);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    fz_checked_mode(*argv);
    const char *e = getenv("FUZZ_BADPTR_STATS");
    bp_stats = e && *e == '1';
    e = getenv("FUZZ_BADPTR_STRICT");
    bp_strict = e && *e == '1';
    if (bp_stats) atexit(bp_print_stats);
    fz_warm_up();
    return 0;
}

/* ---- the child -------------------------------------------------------------------- */

static _Noreturn void bad_child(struct bad *b) {
    static const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS,  SIGILL,  SIGFPE,  SIGALRM, SIGTRAP,
                               SIGTERM, SIGINT,  SIGUSR1, SIGUSR2, SIGXFSZ, SIGSYS};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    dup2(b->pipe_w, 2);
    close(b->pipe_w);
    void *volatile q = b->q;
    if (b->prefree) hak_free(q);
    switch (b->fn) {
    case B_FREE:
        hak_free(q);
        break;
    case B_FREE_SIZED:
        hak_free_sized(q, b->size);
        break;
    case B_FREE_ALIGNED_SIZED:
        hak_free_aligned_sized(q, b->align, b->size);
        break;
    case B_REALLOC: {
        void *volatile r = hak_realloc(q, b->realloc_n);
        (void)r;
        break;
    }
    case B_USABLE: {
        volatile size_t n = hak_malloc_usable_size(q);
        (void)n;
        break;
    }
    default:
        break;
    }
    static const char msg[] = "fuzz_badptr child: the bad call returned\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(0);
}

/* Runs on the thread that makes the bad call: fork there, so the child is
 * that thread (its caches, its heaps). */
static void bad_fork(void *arg) {
    struct bad *b = arg;
    _Alignas(64) char stackbuf[256];
    memset(stackbuf, 0x11, sizeof stackbuf);
    if (b->kind == C_FOREIGN && b->foreign == 0) b->q = (uint8_t *)stackbuf + 64;
    b->pid = fork();
    if (b->pid == 0) bad_child(b);
    /* Keep stackbuf alive (and its address meaningful) until the fork. */
    __asm__ volatile("" ::"r"(stackbuf) : "memory");
}

/* out is exactly one report line: `head`, then its detail in parentheses
 * (" (block of 32 bytes, tiny tier)"). */
static bool bp_is_report(const char *out, const char *head) {
    size_t n = strlen(head), len = strlen(out);
    return strncmp(out, head, n) == 0 && strncmp(out + n, " (", 2) == 0 && len > n + 3 &&
           strcmp(out + len - 2, ")\n") == 0 && strchr(out, '\n') == out + len - 1;
}

/* Fork, run the bad call, check how the child died and what it said. */
static void bad_run(struct fz *m, struct bad *b) {
    int fd[2];
    if (pipe2(fd, O_CLOEXEC) != 0) {
        perror("fuzz_badptr: pipe");
        abort();
    }
    b->pipe_w = fd[1];
    struct fz_call c = {.fn = F_FUNC, .func = bad_fork, .arg = b};
    fflush(NULL);
    fz_call_on(&c, b->worker);
    close(fd[1]);
    if (b->pid < 0) {
        perror("fuzz_badptr: fork");
        abort();
    }
    char out[8192];
    size_t len = 0;
    bool timedout = false;
    int64_t deadline = hak_test_now_ms() + hak_test_limit_ms(BAD_LIMIT_BASE_MS);
    for (;;) {
        int64_t left = deadline - hak_test_now_ms();
        if (left <= 0) {
            timedout = true;
            break;
        }
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t n = read(fd[0], out + len, sizeof out - 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* EOF: the child is gone */
        len += (size_t)n;
        if (len == sizeof out - 1) break;
    }
    close(fd[0]);
    out[len] = 0;
    int status = 0;
    for (;;) {
        pid_t w = waitpid(b->pid, &status, WNOHANG);
        if (w == b->pid) break;
        if (w < 0 && errno != EINTR) {
            perror("fuzz_badptr: waitpid");
            abort();
        }
        if (timedout || hak_test_now_ms() > deadline) {
            timedout = true;
            kill(b->pid, SIGKILL);
            while (waitpid(b->pid, &status, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }

    char want_a[160], want_b[160];
    const char *fn = bad_fn_name[b->fn];
    snprintf(want_a, sizeof want_a, "hakmem: %s(): %s 0x%lx", fn, b->word ? b->word : W_INVALID,
             (unsigned long)(uintptr_t)b->q);
    snprintf(want_b, sizeof want_b, "hakmem: %s(): %s 0x%lx", fn, W_DOUBLE,
             (unsigned long)(uintptr_t)b->q);
    const char *why = NULL;
    char hung[320], limit[256];
    snprintf(hung, sizeof hung, "the child hung (killed after %s)",
             hak_test_limit_text(limit, sizeof limit, BAD_LIMIT_BASE_MS));
    if (timedout)
        why = hung;
    else if (!WIFSIGNALED(status))
        why = "the child did not die of a signal (the bad call returned)";
    else if (WTERMSIG(status) != SIGABRT)
        why = "the child died of a signal other than SIGABRT";
    else if (!bp_is_report(out, want_a) && (b->word != NULL || !bp_is_report(out, want_b)))
        why = "the child's stderr is not exactly the one expected line";
    if (why)
        fz_fail(m,
                "bad pointer case '%s' (%s): %s(%p)%s from the %s thread%s\n%s\n"
                "  status 0x%x%s%s, stderr (%zu bytes):\n%s\n  expected: %s%s%s",
                case_name[b->kind], b->what, fn, (void *)b->q,
                b->fn == B_REALLOC ? " (realloc)" : "", b->worker ? "worker" : "main",
                b->prefree ? ", after a valid free of it in the child" : "", why, status,
                WIFSIGNALED(status) ? ", signal " : "",
                WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "", len, out, want_a,
                b->word ? "" : "  or  ", b->word ? "" : want_b);
    if (b->word == NULL && b->ideal) {
        char ideal[160];
        snprintf(ideal, sizeof ideal, "hakmem: %s(): %s 0x%lx", fn, b->ideal,
                 (unsigned long)(uintptr_t)b->q);
        if (!bp_is_report(out, ideal)) {
            bp_word_other++;
            if (bp_strict)
                fz_fail(m, "strict: case '%s' (%s): got %s expected %s", case_name[b->kind],
                        b->what, out, ideal);
        }
    }
}

/* ---- choosing the case -------------------------------------------------------------- */

/* Index of the n-th live slot (n taken modulo their count), or -1. */
static int pick_live(struct fz *m, unsigned n) {
    int live[FZ_MAX_SLOTS], k = 0;
    for (int i = 0; i < m->nslots; i++)
        if (m->s[i].p) live[k++] = i;
    return k ? live[n % (unsigned)k] : -1;
}

enum where { AT_LIVE_START, IN_LIVE, SS_BLOCK, SS_OTHER, ELSEWHERE };

/* What lies at q now, as far as the model and the SuperSlab headers say. */
static enum where classify(struct fz *m, const uint8_t *q) {
    for (int i = 0; i < m->nslots; i++) {
        const struct fz_blk *b = &m->s[i];
        if (!b->p) continue;
        if (q == b->p) return AT_LIVE_START;
        if (q > b->p && q < b->p + b->usable) return IN_LIVE;
    }
    if (ss_contains(q)) {
        /* (A block of a slab given back, EMPTY, fails the block test but
         * is one all the same: its free may be told a double free.) */
        const struct ss_slab *s = ss_slab_of(q);
        bool block = ss_is_block(s, q) || (s->state == SS_EMPTY && ss_was_block(s, q));
        return block ? SS_BLOCK : SS_OTHER;
    }
    return ELSEWHERE;
}

/* Whether the call looks the block up (realloc to a new size,
 * malloc_usable_size: "invalid pointer" for a freed block) rather than
 * freeing it again (the free calls, realloc(p, 0) among them: "double
 * free"). */
static bool looks_up(const struct bad *b) {
    return (b->fn == B_REALLOC && b->realloc_n != 0) || b->fn == B_USABLE;
}

/* The word a call on a freed block gets. */
static const char *freed_word(const struct bad *b) {
    return looks_up(b) ? W_INVALID : W_DOUBLE;
}

/* Set b->word (and b->ideal) for a pointer that is no live block's start;
 * false: not a case hakmem promises to catch. */
static bool expect_for(struct fz *m, struct bad *b, bool freed_block, enum fz_tier was) {
    switch (classify(m, b->q)) {
    case AT_LIVE_START:
        return false;
    case SS_BLOCK:
        /* Marked free, or in a slot given back (not ACTIVE): a free call
         * may say either. */
        b->ideal = freed_word(b);
        b->word = looks_up(b) ? W_INVALID : NULL;
        return true;
    case IN_LIVE:
    case SS_OTHER:
        b->word = W_INVALID;
        return true;
    case ELSEWHERE:
        if (!freed_block) {
            b->word = NULL; /* whatever lies there: either word, but it must abort */
            return true;
        }
        b->word = NULL;
        b->ideal = freed_word(b);
        if (was == T_LARGE) b->ideal = NULL; /* documented: either, once unmapped */
        return true;
    }
    return false;
}

static size_t realloc_size(uint16_t off) {
    static const size_t n[] = {0, 1, 100, 1024, 5000, 20000, 100000, 2 << 20};
    return n[off % (sizeof n / sizeof n[0])];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static struct fz m;
    struct fz_in in = {.d = data, .n = size, .i = 0};
    uint8_t hcase = fz_u8(&in), hfn = fz_u8(&in), htarget = fz_u8(&in);
    uint16_t off = fz_u16(&in);
    uint8_t flags = fz_u8(&in);
    fz_init(&m, 16, 64 * FZ_MiB, 48, true);
    fz_run(&m, &in);
    if (m.armed) {
        os_fault_disarm();
        m.armed = false;
    }
    fz_check_all(&m, true);
    bp_runs++;

    struct bad *b = &g_bad;
    memset(b, 0, sizeof *b);
    b->kind = (enum bad_case)(hcase % C_N);
    b->fn = (enum bad_fn)(hfn % B_N);
    b->worker = flags & 1;
    b->realloc_n = realloc_size((uint16_t)(off >> 8));
    b->size = off;
    b->align = (size_t)1 << (hfn >> 4);
    bool run = false;
    void *libc_block = NULL;
    void *mapped = NULL;
    size_t mapped_len = 0;
    char what[160] = "";

    switch (b->kind) {
    case C_INTERIOR: {
        int s = pick_live(&m, htarget);
        if (s < 0 || m.s[s].usable < 2) break;
        const struct fz_blk *blk = &m.s[s];
        size_t k = 1 + off % (blk->usable - 1);
        if ((flags & 2) && blk->usable > 32) k = 16 * (1 + off % ((blk->usable - 1) / 16));
#ifdef FUZZ_BADPTR_SELFTEST
        k = 0; /* a valid pointer: the harness must report the silent success */
#endif
        b->q = blk->p + k;
        snprintf(what, sizeof what, "slot %d %p + %zu (usable %zu, %s)", s, (void *)blk->p, k,
                 blk->usable, fz_tier_name[blk->tier]);
        run = classify(&m, b->q) == IN_LIVE;
#ifdef FUZZ_BADPTR_SELFTEST
        run = true;
#endif
        b->word = W_INVALID;
        break;
    }
    case C_FOREIGN:
        b->foreign = (flags >> 1) % 8;
        b->word = W_INVALID;
        run = true;
        switch (b->foreign) {
        case 0: /* stack: set by bad_fork on the calling thread */
            snprintf(what, sizeof what, "stack buffer");
            break;
        case 1:
            b->q = (uint8_t *)bp_global + 16 * (off % 8);
            snprintf(what, sizeof what, "global");
            break;
        case 2:
            libc_block = malloc(100);
            b->q = libc_block;
            snprintf(what, sizeof what, "libc malloc block");
            break;
        case 3:
            mapped_len = FZ_PAGE;
            mapped =
                mmap(NULL, mapped_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (mapped == MAP_FAILED) {
                mapped = NULL;
                run = false;
                break;
            }
            b->q = (uint8_t *)mapped + 16 * (off % 256);
            snprintf(what, sizeof what, "private mmap page");
            break;
        case 4:
            b->q = (uint8_t *)(uintptr_t)(16 * (1 + off % 4096));
            snprintf(what, sizeof what, "NULL + small");
            break;
        case 5: {
            static const uintptr_t nc[] = {(uintptr_t)1 << 47,    ((uintptr_t)1 << 47) + 0x10000,
                                           0xffff800000001000ull, 0xdead000000000000ull,
                                           (uintptr_t)-16,        0x00007ffffffff000ull};
            b->q = (uint8_t *)nc[off % (sizeof nc / sizeof nc[0])];
            snprintf(what, sizeof what, "non-canonical or kernel address");
            break;
        }
        case 6: { /* the page right after a live Large mapping */
            int s = -1;
            for (int i = 0; i < m.nslots; i++)
                if (m.s[i].p && m.s[i].tier == T_LARGE) s = i;
            run = false;
            if (s < 0) break;
            uint8_t *end = m.s[s].p + m.s[s].usable; /* the mapping's end */
            if ((uintptr_t)end & (FZ_PAGE - 1)) break;
            mapped_len = FZ_PAGE;
            mapped = mmap(end, mapped_len, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (mapped == MAP_FAILED || mapped != end) {
                if (mapped != MAP_FAILED) munmap(mapped, mapped_len);
                mapped = NULL;
                break;
            }
            b->q = (uint8_t *)mapped + 16 * (off % 256);
            snprintf(what, sizeof what, "page after slot %d's Large mapping %p", s,
                     (void *)m.s[s].p);
            run = classify(&m, b->q) == ELSEWHERE;
            break;
        }
        default: { /* the SuperSlab range, its far end (never used) or its start */
            if (ss_bounds.span == 0) {
                run = false;
                break;
            }
            uintptr_t a =
                (flags & 0x80) ? ss_bounds.base + ss_bounds.span - 2 * FZ_MiB : ss_bounds.base;
            b->q = (uint8_t *)a + 16 * (uintptr_t)off;
            snprintf(what, sizeof what, "SuperSlab range %s + %u",
                     (flags & 0x80) ? "end - 2 MiB" : "base", 16u * off);
            run = classify(&m, b->q) == SS_OTHER;
            break;
        }
        }
        break;
    case C_FREED: {
        unsigned n = m.nfreed < FZ_NFREED ? m.nfreed : FZ_NFREED;
        if (n == 0) break;
        const struct fz_freed *f = &m.freed[htarget % n];
        b->q = f->p;
        b->size = f->req;
        b->align = f->align;
        snprintf(what, sizeof what, "freed %s block (req %zu, freed by %s)", fz_tier_name[f->tier],
                 f->req, f->by_worker ? "worker" : "main");
        run = expect_for(&m, b, true, (enum fz_tier)f->tier);
        break;
    }
    case C_DOUBLE: {
        int s = pick_live(&m, htarget);
        if (s < 0) break;
        const struct fz_blk *blk = &m.s[s];
        b->q = blk->p;
        b->size = blk->req;
        b->align = blk->align;
        b->prefree = true;
        snprintf(what, sizeof what, "slot %d %s block (req %zu)", s, fz_tier_name[blk->tier],
                 blk->req);
        run = true;
        if (ss_contains(blk->p)) {
            /* Tiny: the block is marked free (tests/test_double_free.c). */
            b->word = freed_word(b);
        } else {
            b->word = NULL;
            b->ideal = freed_word(b);
            if (blk->tier == T_LARGE) b->ideal = NULL; /* documented: either, once unmapped */
        }
        break;
    }
    case C_XTHREAD: {
        int s = pick_live(&m, htarget);
        if (s < 0) break;
        struct fz_blk blk = m.s[s];
        b->q = blk.p;
        b->size = blk.req;
        b->align = blk.align;
        /* The other thread frees it (in the parent, through the model). */
        fz_free_slot(&m, s, 0, !b->worker);
        snprintf(what, sizeof what, "slot %d %s block (req %zu) freed by the %s thread", s,
                 fz_tier_name[blk.tier], blk.req, b->worker ? "main" : "worker");
        run = expect_for(&m, b, true, (enum fz_tier)blk.tier);
        break;
    }
    case C_NEAR: {
        int s = pick_live(&m, htarget);
        if (s < 0) break;
        const struct fz_blk *blk = &m.s[s];
        int16_t k = (int16_t)off;
        uintptr_t base =
            (flags & 2) ? (uintptr_t)blk->p & ~(uintptr_t)(2 * FZ_MiB - 1) : (uintptr_t)blk->p;
        b->q = (uint8_t *)(base + (uintptr_t)((intptr_t)k * 16));
        snprintf(what, sizeof what, "%s of slot %d %p (%s) %+d*16",
                 (flags & 2) ? "region base" : "start", s, (void *)blk->p, fz_tier_name[blk->tier],
                 k);
        run = expect_for(&m, b, false, T_NONE);
        break;
    }
    default:
        break;
    }

    if (run) {
        b->what = what;
        bp_cases[b->kind]++;
        fz_trace(&m, "bad call: case %s (%s), %s(%p) from %s%s", case_name[b->kind], what,
                 bad_fn_name[b->fn], (void *)b->q, b->worker ? "worker" : "main",
                 b->prefree ? " after a valid free" : "");
        bad_run(&m, b);
    } else {
        bp_skips[b->kind]++;
    }
    if (libc_block) free(libc_block);
    if (mapped) munmap(mapped, mapped_len);
    fz_finish(&m);
    return 0;
}
