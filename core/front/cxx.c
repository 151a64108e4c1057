/* C++ operators new and delete, exported from C under their Itanium ABI
 * names: a C++ program's new and delete run hakmem's paths directly (not
 * libstdc++'s wrappers over malloc), and a sized delete whose size does not
 * belong to the block is reported. What only the C++ runtime has (the
 * new_handler, throwing std::bad_alloc) is reached through weak references,
 * so a C program neither loads nor needs libstdc++. Array forms are the
 * scalar forms under a second name, as are the nothrow deletes (the extra
 * std::nothrow_t argument is ignored in its register). */
#include "hakmem.h"

#include "front/front.h"

#include <dlfcn.h>
#include <stdlib.h>

#ifndef HAK_NO_OVERRIDE /* the sanitizer builds keep their runtime's operators */

#define CXX_API __attribute__((visibility("default")))
#define CXX_ALIAS(name, target)                                                                    \
    extern __typeof__(target) name __attribute__((alias(#target), visibility("default")))

typedef void (*cxx_new_handler)(void);
/* std::get_new_handler() (libstdc++ and libc++ alike), std::__throw_bad_alloc()
 * (libstdc++; libc++'s is in its inline namespace). */
extern cxx_new_handler _ZSt15get_new_handlerv(void) __attribute__((weak));
extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn));
extern void _ZNSt3__117__throw_bad_allocEv(void) __attribute__((weak, noreturn));

/* new could not allocate n bytes (aligned to align; 0: no alignment): as the
 * standard says, call the new_handler while there is one and retry;
 * without one, throw std::bad_alloc, or for the nothrow forms return NULL.
 * (A handler that throws out of a nothrow new escapes it: C cannot catch.) */
static __attribute__((cold, noinline)) void *cxx_new_failed(size_t n, size_t align, bool nothrow) {
    for (;;) {
        cxx_new_handler h = _ZSt15get_new_handlerv ? _ZSt15get_new_handlerv() : NULL;
        if (h == NULL) break;
        h();
        void *p = align ? hak_aligned_alloc(align, n) : hak_malloc(n);
        if (p != NULL) return p;
    }
    if (nothrow) return NULL;
    if (_ZSt17__throw_bad_allocv) _ZSt17__throw_bad_allocv();
    if (_ZNSt3__117__throw_bad_allocEv) _ZNSt3__117__throw_bad_allocEv();
    /* new without a C++ runtime in reach (one opened RTLD_LOCAL later). */
    struct diag_buf b = {.n = 0};
    diag_str(&b, "hakmem: operator new(): out of memory for ");
    diag_u64(&b, n);
    diag_str(&b, " bytes, and no C++ runtime to throw std::bad_alloc\n");
    diag_flush(&b, 2);
    abort();
}

/* ---- new ------------------------------------------------------------------ */

CXX_API void *_Znwm(size_t n) {
    void *p = front_malloc(n);
    return hak_likely(p != NULL) ? p : cxx_new_failed(n, 0, false);
}
CXX_API void *_ZnwmRKSt9nothrow_t(size_t n) {
    void *p = front_malloc(n);
    return hak_likely(p != NULL) ? p : cxx_new_failed(n, 0, true);
}
CXX_API void *_ZnwmSt11align_val_t(size_t n, size_t align) {
    void *p = hak_aligned_alloc(align, n);
    return hak_likely(p != NULL) ? p : cxx_new_failed(n, align, false);
}
CXX_API void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t n, size_t align) {
    void *p = hak_aligned_alloc(align, n);
    return hak_likely(p != NULL) ? p : cxx_new_failed(n, align, true);
}
CXX_ALIAS(_Znam, _Znwm);
CXX_ALIAS(_ZnamRKSt9nothrow_t, _ZnwmRKSt9nothrow_t);
CXX_ALIAS(_ZnamSt11align_val_t, _ZnwmSt11align_val_t);
CXX_ALIAS(_ZnamSt11align_val_tRKSt9nothrow_t, _ZnwmSt11align_val_tRKSt9nothrow_t);

/* ---- delete --------------------------------------------------------------- */

#define CXX_DELETE "operator delete"

CXX_API void _ZdlPv(void *p) {
    front_free(p, CXX_DELETE);
}
CXX_API void _ZdlPvSt11align_val_t(void *p, size_t align) {
    (void)align;
    front_free(p, CXX_DELETE);
}

/* A sized delete of a pointer that is no live block of hakmem's: a program
 * that replaced only the unsized operator new and delete (libstdc++'s sized
 * delete calls the unsized one) sends its own blocks here. Pass p to the
 * unsized delete the program sees (its own, or hakmem's, which then reports
 * p); looked up once. */
static __attribute__((cold, noinline)) void cxx_delete_foreign(void *p) {
    static void (*_Atomic unsized)(void *);
    void (*f)(void *) = unsized;
    if (f == NULL) {
        f = (void (*)(void *))dlsym(RTLD_DEFAULT, "_ZdlPv");
        if (f == NULL) f = _ZdlPv;
        unsized = f;
    }
    f(p);
}

/* The size must be the one new was given: a block of n's class (or, for
 * Large blocks, of exactly n bytes). */
CXX_API void _ZdlPvm(void *p, size_t n) {
    if (hak_unlikely(!front_free_sized(p, n, true, CXX_DELETE))) cxx_delete_foreign(p);
}
CXX_API void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t align) {
    if (hak_unlikely(!front_free_sized_slow(p, n, align, true, CXX_DELETE))) cxx_delete_foreign(p);
}
CXX_ALIAS(_ZdaPv, _ZdlPv);
CXX_ALIAS(_ZdlPvRKSt9nothrow_t, _ZdlPv);
CXX_ALIAS(_ZdaPvRKSt9nothrow_t, _ZdlPv);
CXX_ALIAS(_ZdaPvSt11align_val_t, _ZdlPvSt11align_val_t);
CXX_ALIAS(_ZdlPvSt11align_val_tRKSt9nothrow_t, _ZdlPvSt11align_val_t);
CXX_ALIAS(_ZdaPvSt11align_val_tRKSt9nothrow_t, _ZdlPvSt11align_val_t);
CXX_ALIAS(_ZdaPvm, _ZdlPvm);
CXX_ALIAS(_ZdaPvmSt11align_val_t, _ZdlPvmSt11align_val_t);

#endif
