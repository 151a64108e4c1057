#include "prof/unwind.h"

#include "box/os.h"
#include "sizes.h"

#include <stdatomic.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__GLIBC__) &&                                                   \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <pthread.h>
#include <string.h>
#include <sys/auxv.h>

/* ---- rules -------------------------------------------------------------------
 * What it takes to step from a frame to its caller's, for one return address:
 * CFA (the caller's %rsp) = %rsp or %rbp + cfa_off; the return address is at
 * CFA + 8 ra_off8; %rbp was saved at CFA + 8 rbp_off8 (0: not saved, the
 * caller's is the same). Packed in a word so that a table slot is read whole. */
enum uw_kind {
    UW_RSP_CFA = 1, /* a frame to step out of, its CFA from %rsp */
    UW_RBP_CFA,     /* the same, from %rbp */
    UW_END,         /* the outermost frame (return address undefined), or code no table covers */
    UW_FAIL,        /* a rule this box does not read */
};

struct uw_rule {
    int32_t cfa_off;
    int8_t rbp_off8;
    int8_t ra_off8;
    uint8_t span8; /* 8 * this: the most below the CFA that is read */
    uint8_t kind;  /* enum uw_kind; never 0, so a written rule is never 0 */
};
_Static_assert(sizeof(struct uw_rule) == sizeof(uint64_t), "a rule is one word");

/* (__builtin_memcpy: the library is built with -fno-builtin, under which a
 * plain memcpy stays a call into libc, on every frame of a walk.) */
static uint64_t uw_pack(struct uw_rule r) {
    uint64_t w;
    __builtin_memcpy(&w, &r, sizeof w);
    return w;
}

static struct uw_rule uw_unpack(uint64_t w) {
    struct uw_rule r;
    __builtin_memcpy(&r, &w, sizeof r);
    return r;
}

static const struct uw_rule uw_fail = {.kind = UW_FAIL};
static const struct uw_rule uw_end = {.kind = UW_END};

/* ---- reading .eh_frame -------------------------------------------------------- */

/* A cursor over bytes known to be [p, end). */
struct uw_in {
    const uint8_t *p, *end;
    bool bad; /* read past end, or an encoding not understood */
};

static uint64_t uw_u(struct uw_in *in, size_t n) {
    if ((size_t)(in->end - in->p) < n) {
        in->bad = true;
        in->p = in->end;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, in->p, n); /* little-endian */
    in->p += n;
    return v;
}

static uint64_t uw_uleb(struct uw_in *in) {
    uint64_t v = 0;
    for (unsigned shift = 0; in->p < in->end; shift += 7) {
        uint8_t b = *in->p++;
        if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    in->bad = true;
    return 0;
}

static int64_t uw_sleb(struct uw_in *in) {
    uint64_t v = 0;
    for (unsigned shift = 0; in->p < in->end;) {
        uint8_t b = *in->p++;
        if (shift < 64) v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) {
            if (shift < 64 && (b & 0x40)) v |= ~(uint64_t)0 << shift; /* sign-extend */
            return (int64_t)v;
        }
    }
    in->bad = true;
    return 0;
}

/* A pointer in DW_EH_PE encoding `enc`: absolute, or relative to the field
 * itself (pcrel) or to `data` (datarel). Indirect ones are read as the
 * address of the pointer (only the personality routine is, and it is skipped). */
static uintptr_t uw_ptr(struct uw_in *in, uint8_t enc, uintptr_t data) {
    uintptr_t at = (uintptr_t)in->p, v;
    switch (enc & 0x0f) {
    case 0x00:
        v = (uintptr_t)uw_u(in, 8);
        break; /* absptr */
    case 0x01:
        v = (uintptr_t)uw_uleb(in);
        break; /* uleb128 */
    case 0x02:
        v = (uintptr_t)uw_u(in, 2);
        break; /* udata2 */
    case 0x03:
        v = (uintptr_t)uw_u(in, 4);
        break; /* udata4 */
    case 0x04:
        v = (uintptr_t)uw_u(in, 8);
        break; /* udata8 */
    case 0x09:
        v = (uintptr_t)uw_sleb(in);
        break; /* sleb128 */
    case 0x0a:
        v = (uintptr_t)(intptr_t)(int16_t)uw_u(in, 2);
        break; /* sdata2 */
    case 0x0b:
        v = (uintptr_t)(intptr_t)(int32_t)uw_u(in, 4);
        break; /* sdata4 */
    case 0x0c:
        v = (uintptr_t)uw_u(in, 8);
        break; /* sdata8 */
    default:
        in->bad = true;
        return 0;
    }
    switch (enc & 0x70) {
    case 0x00:
        return v;
    case 0x10:
        return v + at; /* pcrel */
    case 0x30:
        return v + data; /* datarel */
    default:
        in->bad = true;
        return 0;
    }
}

/* The state a CFA program builds: how to find the CFA, %rbp and the return
 * address. */
enum { UW_SAME, UW_AT, UW_UNDEF, UW_OTHER };
struct uw_state {
    int cfa_reg; /* DWARF number: 6 %rbp, 7 %rsp; anything else fails */
    int64_t cfa_off;
    int rbp_how, ra_how;
    int64_t rbp_off, ra_off;
};

#define UW_RBP      6
#define UW_RSP      7
#define UW_RA       16
#define UW_REMEMBER 8 /* DW_CFA_remember_state nesting kept */

/* A rule for register `reg` at CFA + off (how UW_AT) or of another kind. */
static void uw_set(struct uw_state *s, uint64_t reg, int how, int64_t off) {
    if (reg == UW_RBP) {
        s->rbp_how = how;
        s->rbp_off = off;
    } else if (reg == UW_RA) {
        s->ra_how = how;
        s->ra_off = off;
    }
}

/* DW_CFA_restore: reg's rule as the CIE's program left it. */
static void uw_restore(struct uw_state *s, const struct uw_state *init, uint64_t reg) {
    if (reg == UW_RBP) uw_set(s, reg, init->rbp_how, init->rbp_off);
    if (reg == UW_RA) uw_set(s, reg, init->ra_how, init->ra_off);
}

/* Run the CFA program in `in` from location `loc` while it describes
 * `target`. `init` is the state after the CIE's program (DW_CFA_restore);
 * false on an instruction this box does not read. */
static bool uw_run(struct uw_in *in, uintptr_t loc, uintptr_t target, uint64_t code_align,
                   int64_t data_align, struct uw_state *s, const struct uw_state *init) {
    struct uw_state saved[UW_REMEMBER];
    int nsaved = 0;
    while (in->p < in->end && !in->bad) {
        uint8_t op = *in->p++;
        uint64_t reg, delta = 0;
        switch (op >> 6) { /* the three kinds with an operand in their low six bits */
        case 1:
            delta = (op & 0x3f) * code_align;
            goto advance;
        case 2:
            uw_set(s, op & 0x3f, UW_AT, (int64_t)uw_uleb(in) * data_align);
            continue;
        case 3:
            uw_restore(s, init, op & 0x3f);
            continue;
        }
        switch (op) {
        case 0x00:
            continue; /* nop */
        case 0x02:
            delta = uw_u(in, 1) * code_align;
            goto advance;
        case 0x03:
            delta = uw_u(in, 2) * code_align;
            goto advance;
        case 0x04:
            delta = uw_u(in, 4) * code_align;
            goto advance;
        case 0x05: /* offset_extended */
            reg = uw_uleb(in);
            uw_set(s, reg, UW_AT, (int64_t)uw_uleb(in) * data_align);
            continue;
        case 0x11: /* offset_extended_sf */
            reg = uw_uleb(in);
            uw_set(s, reg, UW_AT, uw_sleb(in) * data_align);
            continue;
        case 0x06:
            uw_restore(s, init, uw_uleb(in));
            continue; /* restore_extended */
        case 0x07:
            uw_set(s, uw_uleb(in), UW_UNDEF, 0);
            continue; /* undefined */
        case 0x08:
            uw_set(s, uw_uleb(in), UW_SAME, 0);
            continue; /* same_value */
        case 0x09:    /* register: reg's value is in another register */
            uw_set(s, uw_uleb(in), UW_OTHER, 0);
            uw_uleb(in);
            continue;
        case 0x0a: /* remember_state */
            if (nsaved == UW_REMEMBER) return false;
            saved[nsaved++] = *s;
            continue;
        case 0x0b: /* restore_state (the CFA rule included, as GCC's epilogues expect) */
            if (nsaved == 0) return false;
            *s = saved[--nsaved];
            continue;
        case 0x0c: /* def_cfa */
            s->cfa_reg = (int)uw_uleb(in);
            s->cfa_off = (int64_t)uw_uleb(in);
            continue;
        case 0x12: /* def_cfa_sf */
            s->cfa_reg = (int)uw_uleb(in);
            s->cfa_off = uw_sleb(in) * data_align;
            continue;
        case 0x0d:
            s->cfa_reg = (int)uw_uleb(in);
            continue; /* def_cfa_register */
        case 0x0e:
            s->cfa_off = (int64_t)uw_uleb(in);
            continue;
        case 0x13:
            s->cfa_off = uw_sleb(in) * data_align;
            continue;
        case 0x0f:
            return false; /* def_cfa_expression */
        case 0x10:        /* expression */
        case 0x16:        /* val_expression */
            reg = uw_uleb(in);
            uw_set(s, reg, UW_OTHER, 0);
            delta = uw_uleb(in);
            if (delta > (uint64_t)(in->end - in->p)) return false;
            in->p += delta;
            continue;
        case 0x14: /* val_offset */
            reg = uw_uleb(in);
            uw_set(s, reg, UW_OTHER, 0);
            uw_uleb(in);
            continue;
        case 0x15: /* val_offset_sf */
            reg = uw_uleb(in);
            uw_set(s, reg, UW_OTHER, 0);
            uw_sleb(in);
            continue;
        case 0x2e:
            uw_uleb(in);
            continue; /* GNU_args_size: the CFA does not move */
        default:
            return false; /* set_loc, GNU_negative_offset_extended, ... */
        }
    advance:
        if (loc + delta > target) return true; /* what follows describes later code */
        loc += delta;
    }
    return !in->bad;
}

/* The rule for return address `ra`, read from its object's tables. */
static struct uw_rule uw_find(uintptr_t ra) {
    uintptr_t target = ra - 1; /* in the call, even when it ends its function */
    struct dl_find_object dlfo;
    /* No object here (JIT code, which libgcc may know of): backtrace(). */
    if (_dl_find_object((void *)target, &dlfo) != 0 || dlfo.dlfo_eh_frame == NULL) return uw_fail;

    /* .eh_frame_hdr: version 1, three encodings, the .eh_frame pointer, the
     * count and a table of (start, FDE) sorted by start, both relative to
     * the header when it is datarel sdata4 (as binutils' ld writes it). */
    const uint8_t *hdr = dlfo.dlfo_eh_frame;
    if (hdr[0] != 1 || hdr[3] != 0x3b) return uw_fail;
    struct uw_in in = {hdr + 4, hdr + 4 + 16, false};
    uw_ptr(&in, hdr[1], (uintptr_t)hdr);
    uintptr_t count = uw_ptr(&in, hdr[2], (uintptr_t)hdr);
    if (in.bad || count == 0) return in.bad ? uw_fail : uw_end;
    const int32_t *table = (const int32_t *)(const void *)in.p;
    size_t lo = 0, hi = count; /* the last entry starting at or before target */
    if ((uintptr_t)hdr + table[0] > target) return uw_end;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)hdr + table[2 * mid] <= target)
            lo = mid;
        else
            hi = mid;
    }
    const uint8_t *fde = hdr + table[2 * lo + 1];

    /* The FDE: length, offset back to its CIE, where and how long its code is. */
    uint32_t fde_len, cie_off;
    memcpy(&fde_len, fde, 4);
    memcpy(&cie_off, fde + 4, 4);
    if (fde_len < 8 || fde_len == 0xffffffffu || cie_off == 0) return uw_fail;
    const uint8_t *cie = fde + 4 - cie_off;

    /* The CIE: version, augmentation, alignment factors, return register. */
    uint32_t cie_len;
    memcpy(&cie_len, cie, 4);
    if (cie_len < 8 || cie_len == 0xffffffffu) return uw_fail;
    struct uw_in c = {cie + 8, cie + 4 + cie_len, false};
    uint8_t version = (uint8_t)uw_u(&c, 1);
    const char *aug = (const char *)c.p;
    size_t aug_len = strnlen(aug, (size_t)(c.end - c.p));
    c.p += aug_len + 1;
    if ((version != 1 && version != 3) || c.p > c.end) return uw_fail;
    uint64_t code_align = uw_uleb(&c);
    int64_t data_align = uw_sleb(&c);
    uint64_t ra_reg = version == 1 ? uw_u(&c, 1) : uw_uleb(&c);
    uint8_t fde_enc = 0; /* absptr */
    if (aug[0] == 'z') {
        uint64_t n = uw_uleb(&c);
        if (n > (uint64_t)(c.end - c.p)) return uw_fail;
        struct uw_in a = {c.p, c.p + n, false};
        for (size_t i = 1; i < aug_len; i++) {
            switch (aug[i]) {
            case 'R':
                fde_enc = (uint8_t)uw_u(&a, 1);
                break;
            case 'L':
                uw_u(&a, 1);
                break;
            case 'P':
                uw_ptr(&a, (uint8_t)uw_u(&a, 1), 0);
                break;
            case 'B':
                break;
            default:
                return uw_fail; /* 'S': a signal frame; or unknown */
            }
        }
        if (a.bad) return uw_fail;
        c.p += n;
    } else if (aug_len != 0) {
        return uw_fail;
    }
    /* The FDE's own addresses: absolute or pcrel, read in place. */
    if (c.bad || ra_reg != UW_RA || (fde_enc & 0xf0 & ~0x10) != 0) return uw_fail;

    struct uw_in f = {fde + 8, fde + 4 + fde_len, false};
    uintptr_t start = uw_ptr(&f, fde_enc, 0);
    uintptr_t range = uw_ptr(&f, fde_enc & 0x0f, 0);
    if (aug[0] == 'z') {
        uint64_t n = uw_uleb(&f);
        if (n > (uint64_t)(f.end - f.p)) return uw_fail;
        f.p += n;
    }
    if (f.bad) return uw_fail;
    if (target < start || target - start >= range) return uw_end; /* between functions */

    struct uw_state s = {.cfa_reg = UW_RSP, .rbp_how = UW_SAME, .ra_how = UW_UNDEF};
    if (!uw_run(&c, start, target, code_align, data_align, &s, &s)) return uw_fail;
    struct uw_state init = s;
    if (!uw_run(&f, start, target, code_align, data_align, &s, &init)) return uw_fail;

    if (s.ra_how == UW_UNDEF) return uw_end;
    if (s.cfa_reg != UW_RSP && s.cfa_reg != UW_RBP) return uw_fail;
    if (s.ra_how != UW_AT || (s.rbp_how != UW_AT && s.rbp_how != UW_SAME)) return uw_fail;
    if (s.cfa_off < 8 || s.cfa_off > INT32_MAX) return uw_fail;
    if (s.ra_off % 8 != 0 || s.ra_off < -1024 || s.ra_off >= 0) return uw_fail;
    if (s.rbp_how == UW_AT && (s.rbp_off % 8 != 0 || s.rbp_off < -1024 || s.rbp_off >= 0))
        return uw_fail;
    int8_t rbp8 = s.rbp_how == UW_AT ? (int8_t)(s.rbp_off / 8) : 0, ra8 = (int8_t)(s.ra_off / 8);
    return (struct uw_rule){
        .cfa_off = (int32_t)s.cfa_off,
        .rbp_off8 = rbp8,
        .ra_off8 = ra8,
        .span8 = (uint8_t)(rbp8 < ra8 ? -rbp8 : -ra8),
        .kind = s.cfa_reg == UW_RBP ? UW_RBP_CFA : UW_RSP_CFA,
    };
}

/* ---- the table of rules ------------------------------------------------------
 * Open addressing on a key: the return address, with one more than the count
 * of objects unloaded so far (the generation) in its top 16 bits. A library
 * unloaded and another loaded at its addresses must not be read with the
 * first one's rules: after an unload no key of the old generation matches
 * again. A return address in an object that stays loaded (uw_stays) is its
 * own key, the same in every generation. A slot
 * is claimed once (CAS from 0) and its rule written after; a reader that
 * finds the key without the rule yet, or no room, reads the tables itself.
 * Slots of old generations are not reused (a reader could pair a new key with
 * an old rule): a program that unloads libraries often fills the table, and
 * its walks then read the tables each time, correct but slower. */
#define UW_SLOTS   16384 /* return addresses kept; 256 KiB, touched as used */
#define UW_PROBE   8
#define UW_GEN_MAX 0xffff /* generations a key can tell apart; past it, no caching */

struct uw_slot {
    _Atomic uint64_t key;
    _Atomic uint64_t rule;
};

static struct uw_slot *uw_table;

/* The code of the objects that stay loaded: those loaded at start-up (the
 * program, the libraries it was linked or preloaded with, the dynamic
 * loader), which glibc never unloads. They come first in the loader's list,
 * the loader itself last (AT_BASE); what follows it came by dlopen, before
 * the walker started or after, and may be unloaded: its code goes by
 * generation. A walk through the first needs no generation, which costs a
 * call into the loader and a lock (dl_iterate_phdr). (Not a dlopen of ours
 * to pin objects: at the library constructor that ran the constructors of
 * libraries not yet initialised inside ours, under the loader's lock, and
 * one that waits for a thread of its own hung.) */
#define UW_STAYS 32
static struct { uintptr_t lo, hi; } uw_stay[UW_STAYS];
static _Atomic int uw_nstay; /* (published after the ranges) */

struct uw_note {
    uintptr_t loader; /* its load address; 0: unknown, the program alone is taken */
    int n;
};

static int uw_note_stay(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct uw_note *note = arg;
    for (int i = 0; i < info->dlpi_phnum && note->n < UW_STAYS; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        uw_stay[note->n].lo = info->dlpi_addr + ph->p_vaddr;
        uw_stay[note->n].hi = uw_stay[note->n].lo + ph->p_memsz;
        note->n++;
    }
    return note->loader == 0 || info->dlpi_addr == note->loader; /* the last of them */
}

static bool uw_stays(uintptr_t ra) {
    int n = atomic_load_explicit(&uw_nstay, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (ra - uw_stay[i].lo < uw_stay[i].hi - uw_stay[i].lo) return true;
    return false;
}

static bool uw_stack_known(void); /* (the walk: below) */

bool unwind_start(void) {
    if (uw_table != NULL) return true;
    uw_table = os_map_aligned(UW_SLOTS * sizeof *uw_table, HAK_PAGE_SIZE);
    if (uw_table == NULL) return false;
    struct uw_note note = {.loader = (uintptr_t)getauxval(AT_BASE), .n = 0};
    dl_iterate_phdr(uw_note_stay, &note);
    atomic_store_explicit(&uw_nstay, note.n, memory_order_release);
    /* This thread's stack now: for the main thread glibc reads
     * /proc/self/maps with stdio, several KiB of stack, which its first
     * sample may not have (a coroutine's small stack). */
    uw_stack_known();
    return true;
}

static struct uw_rule uw_lookup(uint64_t key, uintptr_t ra) {
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 50); /* 14 bits */
    _Static_assert(UW_SLOTS == 1 << 14, "uw_lookup's shift");
    for (int probe = 0; probe < UW_PROBE; probe++, i = (i + 1) & (UW_SLOTS - 1)) {
        struct uw_slot *s = &uw_table[i];
        uint64_t k = atomic_load_explicit(&s->key, memory_order_acquire);
        if (k == key) {
            uint64_t w = atomic_load_explicit(&s->rule, memory_order_acquire);
            return w != 0 ? uw_unpack(w) : uw_find(ra);
        }
        if (k != 0) continue;
        struct uw_rule r = uw_find(ra);
        if (atomic_compare_exchange_strong_explicit(&s->key, &k, key, memory_order_acq_rel,
                                                    memory_order_acquire))
            atomic_store_explicit(&s->rule, uw_pack(r), memory_order_release);
        return r;
    }
    return uw_find(ra);
}

/* dl_iterate_phdr: the loader's count of objects unloaded (from the first
 * object; the count is global). */
static int uw_subs(struct dl_phdr_info *info, size_t size, void *arg) {
    if (size < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) return -1;
    *(unsigned long long *)arg = info->dlpi_subs;
    return 1;
}

/* ---- the walk ---------------------------------------------------------------- */

/* This thread's stack, asked of glibc at its first walk (pthread_getattr_np,
 * which may allocate: the caller's allocations then are not sampled). A walk
 * reads only between its %rsp and the top of this range; a walk on another
 * stack (a coroutine's, a signal stack) is left to backtrace(). */
static __thread struct {
    uintptr_t lo, hi;
    int state; /* 0: not asked yet; 1: known; -1: unknown */
} uw_stack;

static bool uw_stack_known(void) {
    if (hak_likely(uw_stack.state != 0)) return uw_stack.state > 0;
    uw_stack.state = -1;
    pthread_attr_t a;
    if (pthread_getattr_np(pthread_self(), &a) != 0) return false;
    void *addr;
    size_t size;
    if (pthread_attr_getstack(&a, &addr, &size) == 0 && size != 0) {
        uw_stack.lo = (uintptr_t)addr;
        uw_stack.hi = (uintptr_t)addr + size;
        uw_stack.state = 1;
    }
    pthread_attr_destroy(&a);
    return uw_stack.state > 0;
}

/* The rules of this thread's last walk, by depth: a sample from the same
 * place as the last finds its frames' rules here, in a few cache lines,
 * instead of across the table. Keyed as the table is. */
#define UW_MEMO 32
static __thread struct {
    uint64_t key;
    uint64_t rule;
} uw_memo[UW_MEMO];

/* The rule for return address ra, keyed `key` (0: too many unloads to tell
 * apart, not kept), at `depth` of a walk: this thread's last walk's, else
 * the table's (and this walk's from now on). */
static struct uw_rule uw_rule_at(int depth, uint64_t key, uintptr_t ra) {
    if (key == 0) return uw_find(ra);
    if (depth >= UW_MEMO) return uw_lookup(key, ra);
    if (uw_memo[depth].key == key) return uw_unpack(uw_memo[depth].rule);
    struct uw_rule r = uw_lookup(key, ra);
    uw_memo[depth].key = key;
    uw_memo[depth].rule = uw_pack(r);
    return r;
}

/* This thread's last whole walk, when every frame of it was in code that
 * stays loaded: where it started, each word it read and what it found. A
 * walk is a function of its start and of the words it reads (a frame's rule
 * is one of its return address alone), so a walk from the same start that
 * finds the same words in the same places goes the same way: it compares
 * them instead of stepping frame by frame (a sample from a loop's call site
 * costs a compare per frame). */
#define UW_LAST 32 /* steps kept; a longer walk is not */
static __thread struct {
    int n;         /* steps; 0: none kept */
    int max;       /* the walk's max; its result is n or n - 1 return addresses */
    bool zero_end; /* the last step read a 0 return address (not a result) */
    bool need_bp;  /* the start's %rbp was used (for a CFA) */
    uintptr_t sp, bp;
    struct {
        const uintptr_t *ra_at, *bp_at;
        uintptr_t ra, bp;
        /* The %rbp it read (at bp_at) was used for a CFA. One only saved
         * there (the register held the program's data) may differ. */
        bool bp_used;
    } step[UW_LAST];
} uw_last;

/* The last walk again, if it starts at (sp, bp) with this max and finds
 * every word where it found it: its result count, else -1. */
static int uw_replay(void **pc, int max, uintptr_t sp, uintptr_t bp) {
    if (uw_last.n == 0 || uw_last.max != max || uw_last.sp != sp ||
        (uw_last.need_bp && uw_last.bp != bp))
        return -1;
    /* (Every word read lies between sp and the top of the stack: sp is the
     * same, so it is still this thread's stack to read.) */
    for (int i = 0; i < uw_last.n; i++)
        if (*uw_last.step[i].ra_at != uw_last.step[i].ra ||
            (uw_last.step[i].bp_used && *uw_last.step[i].bp_at != uw_last.step[i].bp))
            return -1;
    int n = uw_last.n - uw_last.zero_end;
    for (int i = 0; i < n; i++)
        pc[i] = (void *)uw_last.step[i].ra;
    return n;
}

__attribute__((noinline)) int unwind_stack(void **pc, int max) {
    if (uw_table == NULL || !uw_stack_known()) return -1;
    uintptr_t ra, sp, bp;
    /* This function's own state: an address inside it (ra - 1 is in the
     * lea, after the prologue) and the registers there. */
    __asm__ volatile("leaq 1f(%%rip), %0\n1:\n\tmovq %%rsp, %1\n\tmovq %%rbp, %2"
                     : "=r"(ra), "=r"(sp), "=r"(bp));
    uintptr_t top = uw_stack.hi;
    if (sp < uw_stack.lo || sp >= top) return -1;
    int again = uw_replay(pc, max, sp, bp);
    if (again >= 0) return again;
    uw_last.n = 0; /* (kept again below, if this walk may be) */
    uw_last.sp = sp;
    uw_last.bp = bp;
    uw_last.need_bp = false;
    bool keep = true; /* every frame so far in code that stays, and few enough */
    int bp_step = -1; /* the step that read bp; -1: it is the start's */
    unsigned long long gen = 0;
    bool gen_known = false; /* asked of the loader at the first frame that needs it */
    int n = 0, depth = 0;
    bool zero_end = false;
    for (; n < max; depth++) {
        if (ra >> 48 != 0) return -1; /* not a user-space code address */
        /* A return address that stays is its own key; one the last walk had
         * at this depth says so in one compare (the common case). */
        uint64_t key = ra;
        if (!(depth < UW_MEMO && uw_memo[depth].key == ra) && !uw_stays(ra)) {
            if (!gen_known && dl_iterate_phdr(uw_subs, &gen) != 1) return -1;
            gen_known = true;
            key = gen + 1 < UW_GEN_MAX ? ra | (uint64_t)(gen + 1) << 48 : 0;
            keep = false; /* (its rule may change when objects are unloaded) */
        }
        struct uw_rule r = uw_rule_at(depth, key, ra);
        if (r.kind == UW_END) break;
        if (r.kind == UW_FAIL) return -1;
        if (r.kind == UW_RBP_CFA) {
            if (bp_step < 0)
                uw_last.need_bp = true;
            else if (bp_step < UW_LAST)
                uw_last.step[bp_step].bp_used = true;
        }
        uintptr_t cfa = (r.kind == UW_RBP_CFA ? bp : sp) + (uintptr_t)(intptr_t)r.cfa_off;
        /* What is read (span8 words below the CFA) lies in the caller's
         * part of the stack: above this frame's %rsp, below the top. A walk
         * that would leave it went wrong somewhere: backtrace() instead. */
        if (cfa > top || cfa < sp + 8 * (uintptr_t)r.span8) return -1;
        const uintptr_t *bp_at = NULL;
        if (r.rbp_off8 != 0) {
            bp_at = (const uintptr_t *)(cfa + (uintptr_t)(intptr_t)r.rbp_off8 * 8);
            bp = *bp_at;
            bp_step = depth;
        }
        const uintptr_t *ra_at = (const uintptr_t *)(cfa + (uintptr_t)(intptr_t)r.ra_off8 * 8);
        ra = *ra_at;
        sp = cfa;
        if (depth < UW_LAST) {
            uw_last.step[depth].ra_at = ra_at;
            uw_last.step[depth].bp_at = bp_at;
            uw_last.step[depth].ra = ra;
            uw_last.step[depth].bp = bp;
            uw_last.step[depth].bp_used = false;
        } else {
            keep = false;
        }
        if (ra == 0) {
            zero_end = true;
            depth++;
            break;
        }
        pc[n++] = (void *)ra;
    }
    if (keep) {
        uw_last.max = max;
        uw_last.zero_end = zero_end;
        uw_last.n = depth;
    }
    return n;
}

#else /* no reader for this platform: backtrace() every time */

bool unwind_start(void) {
    return true;
}

int unwind_stack(void **pc, int max) {
    (void)pc;
    (void)max;
    return -1;
}

#endif
