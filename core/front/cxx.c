/* C++ operators new and delete, exported from C under their Itanium ABI
 * names: a C++ program's new and delete run hakmem's paths directly (not
 * libstdc++'s wrappers over malloc), and a sized delete whose size does not
 * belong to the block is reported. What only the C++ runtime has (the
 * new_handler, throwing std::bad_alloc) is reached through weak references,
 * so a C program neither loads nor needs libstdc++.
 *
 * The standard lets a program replace any of these forms, and defines the
 * others (array, nothrow, sized) in terms of the ones it replaced. So every
 * name is exported weak (a static link with a program's own takes the
 * program's), and once a program is seen to have replaced one, every form
 * of hakmem's goes on to the C++ runtime's own (RTLD_NEXT), which calls the
 * program's replacements as the standard says. */
#include "hakmem.h"

#include "front/front.h"

#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

#ifndef HAK_NO_OVERRIDE /* the sanitizer builds keep their runtime's operators */

typedef void (*cxx_new_handler)(void);
typedef cxx_new_handler (*cxx_get_handler)(void);
/* std::get_new_handler(), std::__throw_bad_alloc() (libstdc++ and libc++). */
extern cxx_new_handler _ZSt15get_new_handlerv(void) __attribute__((weak));
extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn));

/* The C++ runtime's `name`: bound at load (the weak reference `weak`), or
 * failing that (a runtime loaded later by dlopen, even RTLD_LOCAL), found
 * in whichever loaded library has it. Failure paths only. */
struct cxx_find {
    const char *name;
    void *sym;
};

static int cxx_find_in(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct cxx_find *f = arg;
    void *lib = info->dlpi_name && *info->dlpi_name
                    ? dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD)
                    : NULL;
    if (lib == NULL) return 0;
    f->sym = dlsym(lib, f->name);
    dlclose(lib);
    return f->sym != NULL;
}

static void *cxx_runtime(void *weak, const char *name) {
    if (weak != NULL) return weak;
    struct cxx_find f = {name, NULL};
    dl_iterate_phdr(cxx_find_in, &f);
    return f.sym;
}

/* new could not allocate n bytes (aligned to align; 0: no alignment): as
 * the standard says, call the new_handler while there is one and retry;
 * without one, throw std::bad_alloc. */
static __attribute__((cold, noinline)) void *cxx_new_failed(size_t n, size_t align,
                                                            enum api_family f) {
    cxx_get_handler get = cxx_runtime((void *)_ZSt15get_new_handlerv, "_ZSt15get_new_handlerv");
    for (;;) {
        cxx_new_handler h = get != NULL ? get() : NULL;
        if (h == NULL) break;
        h();
        void *p = align ? front_aligned_as(align, n, f) : front_malloc_as(n, f);
        if (p != NULL) return p;
    }
    void (*thrower)(void) =
        cxx_runtime((void *)_ZSt17__throw_bad_allocv, "_ZSt17__throw_bad_allocv");
    if (thrower != NULL) thrower();
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: operator new(): out of memory for ");
    diag_u64(&b, n);
    diag_str(&b, " bytes, and no C++ runtime to throw std::bad_alloc\n");
    diag_flush(&b, 2);
    abort();
}

/* ---- hakmem's own forms ------------------------------------------------------ */

/* The names reports give, which also tell the checked tier (check.h) what
 * the block must have been allocated by. */
#define CXX_DELETE       "operator delete"
#define CXX_DELETE_ARRAY "operator delete[]"
/* The family each form allocates for, and the delete that frees it. */
#define CXX_NEW       API_NEW
#define CXX_NEW_ARRAY API_NEW_ARRAY

HAK_INLINE void *cxx_new(size_t n, enum api_family f) {
    void *p = front_malloc_as(n, f);
    return hak_likely(p != NULL) ? p : cxx_new_failed(n, 0, f);
}
HAK_INLINE void *cxx_new_aligned(size_t n, size_t align, enum api_family f) {
    void *p = front_aligned_as(align, n, f);
    return hak_likely(p != NULL) ? p : cxx_new_failed(n, align, f);
}
HAK_INLINE void cxx_delete(void *p, const char *fn) {
    front_free(p, fn);
}
/* The size must be the one new was given: a block of n's class (or, for
 * Large blocks, of exactly n bytes). */
HAK_INLINE void cxx_delete_sized(void *p, size_t n, const char *fn) {
    if (hak_unlikely(!front_free_sized(p, n, true, fn))) cxx_delete(p, fn);
}
HAK_INLINE void cxx_delete_sized_aligned(void *p, size_t n, size_t align, const char *fn) {
    if (hak_unlikely(!front_free_sized_slow(p, n, align, true, fn))) cxx_delete(p, fn);
}

/* ---- the exported names ----------------------------------------------------------- */

/* Whether hakmem's forms are the program's: 0 not looked yet, 1 yes, 2 it
 * replaced one (whose name then resolves to its own definition). */
static _Atomic int cxx_state;

/* The names this file defines, and the names' hidden twins (below). */
#define CXX_NAME_LIST(X)                                                                           \
    X(_Znwm)                                                                                       \
    X(_Znam)                                                                                       \
    X(_ZnwmSt11align_val_t)                                                                        \
    X(_ZnamSt11align_val_t)                                                                        \
    X(_ZnwmRKSt9nothrow_t)                                                                         \
    X(_ZnamRKSt9nothrow_t)                                                                         \
    X(_ZnwmSt11align_val_tRKSt9nothrow_t)                                                          \
    X(_ZnamSt11align_val_tRKSt9nothrow_t)                                                          \
    X(_ZdlPv)                                                                                      \
    X(_ZdaPv)                                                                                      \
    X(_ZdlPvRKSt9nothrow_t)                                                                        \
    X(_ZdaPvRKSt9nothrow_t) X(_ZdlPvSt11align_val_t) X(_ZdaPvSt11align_val_t)                      \
        X(_ZdlPvSt11align_val_tRKSt9nothrow_t) X(_ZdaPvSt11align_val_tRKSt9nothrow_t) X(_ZdlPvm)   \
            X(_ZdaPvm) X(_ZdlPvmSt11align_val_t) X(_ZdaPvmSt11align_val_t)

static bool cxx_look(void);

HAK_INLINE bool cxx_mine(void) {
    int s = cxx_state;
    return hak_likely(s == 1) || (s == 0 && cxx_look());
}

/* The C++ runtime's form of `name` (RTLD_NEXT: the definition after
 * hakmem's), looked up once; NULL without a runtime. */
#define CXX_NEXT(name, ret, params)                                                                \
    static ret(*cxx_next_##name(void)) params {                                                    \
        static ret(*_Atomic f) params;                                                             \
        ret(*g) params = f;                                                                        \
        if (g == NULL) f = g = (ret(*) params)dlsym(RTLD_NEXT, #name);                             \
        return g;                                                                                  \
    }

/* Each name is weak: a static link with the program's own takes the
 * program's. */
#define CXX_API __attribute__((weak, visibility("default")))

/* Each form: the exported name, whose fast path is hakmem's own when the
 * program replaced nothing, and out of line (cxx_other_NAME) the look at
 * what it replaced and the runtime's form. */
#define CXX_NEW_FORM(name, params, args, own)                                                      \
    CXX_NEXT(name, void *, params)                                                                 \
    static __attribute__((cold, noinline)) void *cxx_other_##name params {                         \
        if (!cxx_mine() && cxx_next_##name() != NULL) return cxx_next_##name() args;               \
        return own;                                                                                \
    }                                                                                              \
    CXX_API void *name params {                                                                    \
        if (hak_unlikely(cxx_state != 1)) return cxx_other_##name args;                            \
        return own;                                                                                \
    }

#define CXX_DELETE_FORM(name, params, args, own)                                                   \
    CXX_NEXT(name, void, params)                                                                   \
    static __attribute__((cold, noinline)) void cxx_other_##name params {                          \
        if (!cxx_mine() && cxx_next_##name() != NULL) {                                            \
            cxx_next_##name() args;                                                                \
            return;                                                                                \
        }                                                                                          \
        own;                                                                                       \
    }                                                                                              \
    CXX_API void name params {                                                                     \
        if (hak_unlikely(cxx_state != 1)) {                                                        \
            cxx_other_##name args;                                                                 \
            return;                                                                                \
        }                                                                                          \
        own;                                                                                       \
    }

/* The nothrow forms return NULL where new would throw. A new_handler may
 * itself throw, which C cannot catch: with one installed, the runtime's
 * nothrow form (a try block around the throwing new) takes over. */
#define CXX_NOTHROW_FORM(name, params, args, alloc)                                                \
    CXX_NEXT(name, void *, params)                                                                 \
    static __attribute__((cold, noinline)) void *cxx_other_##name params {                         \
        if (!cxx_mine() || (_ZSt15get_new_handlerv && _ZSt15get_new_handlerv())) {                 \
            if (cxx_next_##name() != NULL) return cxx_next_##name() args;                          \
        }                                                                                          \
        return alloc;                                                                              \
    }                                                                                              \
    CXX_API void *name params {                                                                    \
        void *p;                                                                                   \
        if (hak_likely(cxx_state == 1) && hak_likely((p = alloc) != NULL)) return p;               \
        return cxx_other_##name args;                                                              \
    }

CXX_NEW_FORM(_Znwm, (size_t n), (n), cxx_new(n, CXX_NEW))
CXX_NEW_FORM(_Znam, (size_t n), (n), cxx_new(n, CXX_NEW_ARRAY))
CXX_NEW_FORM(_ZnwmSt11align_val_t, (size_t n, size_t a), (n, a), cxx_new_aligned(n, a, CXX_NEW))
CXX_NEW_FORM(_ZnamSt11align_val_t, (size_t n, size_t a), (n, a),
             cxx_new_aligned(n, a, CXX_NEW_ARRAY))
CXX_NOTHROW_FORM(_ZnwmRKSt9nothrow_t, (size_t n, const void *t), (n, t),
                 front_malloc_as(n, CXX_NEW))
CXX_NOTHROW_FORM(_ZnamRKSt9nothrow_t, (size_t n, const void *t), (n, t),
                 front_malloc_as(n, CXX_NEW_ARRAY))
CXX_NOTHROW_FORM(_ZnwmSt11align_val_tRKSt9nothrow_t, (size_t n, size_t a, const void *t), (n, a, t),
                 front_aligned_as(a, n, CXX_NEW))
CXX_NOTHROW_FORM(_ZnamSt11align_val_tRKSt9nothrow_t, (size_t n, size_t a, const void *t), (n, a, t),
                 front_aligned_as(a, n, CXX_NEW_ARRAY))
CXX_DELETE_FORM(_ZdlPv, (void *p), (p), cxx_delete(p, CXX_DELETE))
CXX_DELETE_FORM(_ZdaPv, (void *p), (p), cxx_delete(p, CXX_DELETE_ARRAY))
CXX_DELETE_FORM(_ZdlPvRKSt9nothrow_t, (void *p, const void *t), (p, t), cxx_delete(p, CXX_DELETE))
CXX_DELETE_FORM(_ZdaPvRKSt9nothrow_t, (void *p, const void *t), (p, t),
                cxx_delete(p, CXX_DELETE_ARRAY))
CXX_DELETE_FORM(_ZdlPvSt11align_val_t, (void *p, size_t a), (p, a), cxx_delete(p, CXX_DELETE))
CXX_DELETE_FORM(_ZdaPvSt11align_val_t, (void *p, size_t a), (p, a), cxx_delete(p, CXX_DELETE_ARRAY))
CXX_DELETE_FORM(_ZdlPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t a, const void *t), (p, a, t),
                cxx_delete(p, CXX_DELETE))
CXX_DELETE_FORM(_ZdaPvSt11align_val_tRKSt9nothrow_t, (void *p, size_t a, const void *t), (p, a, t),
                cxx_delete(p, CXX_DELETE_ARRAY))
CXX_DELETE_FORM(_ZdlPvm, (void *p, size_t n), (p, n), cxx_delete_sized(p, n, CXX_DELETE))
CXX_DELETE_FORM(_ZdaPvm, (void *p, size_t n), (p, n), cxx_delete_sized(p, n, CXX_DELETE_ARRAY))
CXX_DELETE_FORM(_ZdlPvmSt11align_val_t, (void *p, size_t n, size_t a), (p, n, a),
                cxx_delete_sized_aligned(p, n, a, CXX_DELETE))
CXX_DELETE_FORM(_ZdaPvmSt11align_val_t, (void *p, size_t n, size_t a), (p, n, a),
                cxx_delete_sized_aligned(p, n, a, CXX_DELETE_ARRAY))

/* This file's definitions under hidden names: where a name resolves to
 * another definition, the program replaced that form. */
#define CXX_OWN(name)                                                                              \
    extern __typeof__(name) cxx_own_##name __attribute__((alias(#name), visibility("hidden")));
CXX_NAME_LIST(CXX_OWN)

static __attribute__((cold, noinline)) bool cxx_look(void) {
    int s = 1;
    /* (dlsym, not &name: the compiler may bind that to this file's definition.) */
#define CXX_LOOK(name)                                                                             \
    if (dlsym(RTLD_DEFAULT, #name) != (void *)cxx_own_##name) s = 2;
    CXX_NAME_LIST(CXX_LOOK)
    cxx_state = s;
    return s == 1;
}

#endif
