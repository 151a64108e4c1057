// C++ operators new and delete, as hakmem exports them (core/front/cxx.c):
// every form allocates from hakmem and frees back to it, aligned forms
// align, new calls the new_handler and then throws std::bad_alloc, nothrow
// forms return NULL, and a sized delete whose size does not belong to the
// block aborts with one line naming it. Linked statically against the debug
// library, whose operators replace libstdc++'s.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <malloc.h>
#include <new>
#include <setjmp.h>
#include <stdarg.h>
#include <string>

extern "C" {
#include <cmocka.h>

#include "box/os.h"
}

#include "death.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)

// One size per tier: Tiny, Tiny above 1 KiB, Pool, L2.5, Large.
static const size_t sizes[] = {16, 100, 1000, 5000, 20000, 200000, 3 * MiB};

// Keeps the compiler from pairing or eliding the calls under test.
template <typename T> static T launder(T v) {
    T volatile x = v;
    return x;
}

// A pointer hakmem handed out: malloc_usable_size (hakmem's) takes it, and
// free takes it back; anything else aborts the test binary.
static void assert_hakmem_block(void *p, size_t n) {
    assert_non_null(p);
    assert_true(malloc_usable_size(p) >= n);
    memset(p, 0xab, n);
}

static void test_every_form_allocates_from_hakmem(void **) {
    for (size_t n : sizes) {
        void *p = operator new(n);
        assert_hakmem_block(p, n);
        operator delete(p);
        p = operator new[](n);
        assert_hakmem_block(p, n);
        operator delete[](p);
        p = operator new(n, std::nothrow);
        assert_hakmem_block(p, n);
        operator delete(p, std::nothrow);
        p = operator new[](n, std::nothrow);
        assert_hakmem_block(p, n);
        operator delete[](p, std::nothrow);
        p = operator new(n);
        operator delete(p, n);
        p = operator new[](n);
        operator delete[](p, n);
    }
    // What the compiler emits for objects and arrays.
    auto *one = new int(7);
    assert_int_equal(*one, 7);
    delete launder(one);
    auto *many = new std::string[5];
    many[4] = std::string(100, 'x');
    delete[] launder(many);
}

static void test_aligned_forms_align(void **) {
    for (size_t align = 32; align <= 4 * MiB; align *= 2) {
        for (size_t n : {size_t(1), size_t(24), align - 1, align, align * 3 + 8}) {
            std::align_val_t a{align};
            void *p = operator new(n, a);
            assert_true((uintptr_t)p % align == 0);
            assert_hakmem_block(p, n);
            operator delete(p, a);
            p = operator new[](n, a, std::nothrow);
            assert_true((uintptr_t)p % align == 0);
            assert_hakmem_block(p, n);
            operator delete[](p, a, std::nothrow);
            p = operator new(n, a, std::nothrow);
            operator delete(p, a);
            p = operator new[](n, a);
            operator delete[](p, n, a); // sized and aligned
            p = operator new(n, a);
            operator delete(p, n, a);
        }
    }
    struct alignas(256) Page {
        char c[300];
    };
    Page *q = new Page[3];
    assert_true((uintptr_t)q % 256 == 0);
    delete[] launder(q);
}

// A size no allocation can have: new fails at once.
static const size_t huge = SIZE_MAX / 2;

// Whether new(huge, args...) throws std::bad_alloc (it cannot return).
static void *volatile new_sink;
template <typename... A> static bool new_throws_bad_alloc(void *(*f)(size_t, A...), A... args) {
    try {
        new_sink = f(launder(huge), args...);
    } catch (const std::bad_alloc &) {
        return true;
    }
    return false;
}

static void test_new_throws_bad_alloc(void **) {
    assert_true(new_throws_bad_alloc<>(&operator new));
    assert_true(new_throws_bad_alloc<std::align_val_t>(&operator new[], std::align_val_t{64}));
}

static void test_nothrow_returns_null(void **) {
    assert_null(operator new(launder(huge), std::nothrow));
    assert_null(operator new[](launder(huge), std::nothrow));
    assert_null(operator new (launder(huge), std::align_val_t{64}, std::nothrow));
    assert_null(operator new[](launder(huge), std::align_val_t{4096}, std::nothrow));
}

// The new_handler runs on each failure until new succeeds or it is gone: a
// handler that gives up after three calls sees three calls, then new throws.
static int handler_calls;
static void give_up_after_three() {
    if (++handler_calls == 3) std::set_new_handler(nullptr);
}

static void test_new_handler_called_until_removed(void **) {
    handler_calls = 0;
    std::set_new_handler(give_up_after_three);
    assert_true(new_throws_bad_alloc<>(&operator new));
    assert_int_equal(handler_calls, 3);
    // nothrow new calls it too, then returns NULL.
    handler_calls = 0;
    std::set_new_handler(give_up_after_three);
    assert_null(operator new(launder(huge), std::nothrow));
    assert_int_equal(handler_calls, 3);
}

// A handler that finds memory (here: the OS, refusing every call until the
// handler runs) lets new succeed on its retry, after one call.
static void find_memory() {
    handler_calls++;
    os_fault_disarm();
}

static void test_new_handler_that_frees_lets_new_succeed(void **) {
    handler_calls = 0;
    std::set_new_handler(find_memory);
    os_fault_arm(0, UINT64_MAX); // (64 MiB: more than any cached mapping)
    void *p = operator new(64 * MiB);
    os_fault_disarm();
    std::set_new_handler(nullptr);
    assert_int_equal(handler_calls, 1);
    assert_hakmem_block(p, 64 * MiB);
    operator delete(p, 64 * MiB);
}

// A handler that throws std::bad_alloc: nothrow new returns NULL (it must
// not let the exception out, which would terminate the program).
static void throw_bad_alloc() {
    handler_calls++;
    throw std::bad_alloc();
}

static void test_nothrow_new_with_throwing_handler_returns_null(void **) {
    handler_calls = 0;
    std::set_new_handler(throw_bad_alloc);
    void *p = operator new(launder(huge), std::nothrow);
    void *q = operator new[](launder(huge), std::align_val_t{256}, std::nothrow);
    std::set_new_handler(nullptr);
    assert_null(p);
    assert_null(q);
    assert_int_equal(handler_calls, 2);
}

// A handler may throw its own exception out of new.
struct handler_ran {};
static void throw_from_handler() {
    throw handler_ran{};
}

static void test_new_handler_may_throw(void **) {
    std::set_new_handler(throw_from_handler);
    bool caught = false;
    try {
        void *p = operator new[](launder(huge));
        operator delete[](p);
    } catch (const handler_ran &) {
        caught = true;
    }
    std::set_new_handler(nullptr);
    assert_true(caught);
}

// ---- sized delete ------------------------------------------------------------

struct sized_case {
    size_t n, wrong;
    void *p;
};

static void delete_with_size(void *arg) {
    auto *c = static_cast<sized_case *>(arg);
    operator delete(c->p, launder(c->wrong));
}

static const char *tier_of(size_t n) {
    return n <= 8 * KiB ? "tiny" : n <= 52 * KiB ? "pool" : n <= MiB ? "L2.5" : "large";
}

// A size of another class (or, for Large, another size) aborts naming the
// pointer, the size given, the block and its tier; the block's own size
// frees it.
static void test_sized_delete_mismatch_aborts(void **) {
    for (size_t n : sizes) {
        for (size_t wrong : {n * 2 + 64, n / 2}) { // (16 B: no smaller class)
            if (wrong < 16) continue;
            sized_case c{n, wrong, operator new(n)};
            size_t block = n > MiB ? n : malloc_usable_size(c.p);
            char line[256];
            snprintf(line, sizeof line,
                     "hakmem: operator delete(): size mismatch %p (size %zu given, block of %zu "
                     "bytes, %s tier)",
                     c.p, wrong, block, tier_of(n));
            expect_death(delete_with_size, &c, line);
            operator delete(c.p, n);
        }
    }
}

// Deleting a derived object through a base without a virtual destructor:
// the compiler passes the base's size.
struct Base {
    char b[16];
};
struct Derived : Base {
    char d[200];
};

static void delete_through_base(void *p) {
    delete launder(static_cast<Base *>(static_cast<Derived *>(p)));
}

static void test_delete_through_base_aborts(void **) {
    Derived *d = new Derived;
    char line[256];
    snprintf(line, sizeof line,
             "hakmem: operator delete(): size mismatch %p (size %zu given, block of %zu bytes, "
             "tiny tier)",
             static_cast<void *>(d), sizeof(Base), malloc_usable_size(d));
    expect_death(delete_through_base, d, line);
    delete d;
}

// Sizes in the same class as the block's own are the same class: no report.
static void test_sized_delete_same_class_frees(void **) {
    for (size_t n : sizes) {
        void *p = operator new(n);
        size_t usable = malloc_usable_size(p);
        if (n <= MiB)
            operator delete(p, usable); // the class's top
        else
            operator delete(p, n);
    }
}

static void double_delete(void *p) {
    void *volatile v = p;
    operator delete(v, 100);
    operator delete(v, 100);
}

static void test_sized_double_delete_aborts(void **) {
    void *p = operator new(100);
    char line[128];
    snprintf(line, sizeof line, "hakmem: operator delete(): double free %p", p);
    expect_death(double_delete, p, line);
    operator delete(p, 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_form_allocates_from_hakmem),
        cmocka_unit_test(test_aligned_forms_align),
        cmocka_unit_test(test_new_throws_bad_alloc),
        cmocka_unit_test(test_nothrow_returns_null),
        cmocka_unit_test(test_new_handler_called_until_removed),
        cmocka_unit_test(test_new_handler_that_frees_lets_new_succeed),
        cmocka_unit_test(test_new_handler_may_throw),
        cmocka_unit_test(test_nothrow_new_with_throwing_handler_returns_null),
        cmocka_unit_test(test_sized_delete_mismatch_aborts),
        cmocka_unit_test(test_delete_through_base_aborts),
        cmocka_unit_test(test_sized_delete_same_class_frees),
        cmocka_unit_test(test_sized_double_delete_aborts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
