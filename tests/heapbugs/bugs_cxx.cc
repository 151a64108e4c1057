// Heap-bug programs (C++ cases): mismatched new/delete forms and sized
// deletes with a wrong size. Same command line and exit statuses as bugs.c
// (`bugs_cxx --list`, `bugs_cxx CASE`). Build with -fsized-deallocation.
#include "heapbugs.h"

#include <new>

// The bugs are intentional.
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#pragma GCC diagnostic ignored "-Wmismatched-dealloc"
#pragma GCC diagnostic ignored "-Wdelete-non-virtual-dtor"
#pragma GCC diagnostic ignored "-Wclass-memaccess"
#pragma GCC diagnostic ignored "-Warray-bounds"

static volatile unsigned char sink;

// N bytes with a destructor: delete[] of it reads an array cookie.
template <size_t N> struct Obj {
    unsigned char b[N];
    ~Obj() { sink = b[0]; }
};

struct Elem {
    size_t v;
    ~Elem() { sink = (unsigned char)v; }
};

// No virtual destructor: `delete base` passes sizeof(Base) to sized delete.
struct Base {
    unsigned char head[16];
};
template <size_t N> struct Derived : Base { unsigned char tail[N - sizeof(Base)]; };

template <size_t N> static int new_free(size_t, size_t) {
    Obj<N> *p = new Obj<N>;
    fill(p, N, 'a');
    free(p);
    return churn(N);
}

template <size_t N> static int malloc_delete(size_t, size_t) {
    Obj<N> *p = reinterpret_cast<Obj<N> *>(fresh(N));
    delete p;
    return churn(N);
}

// new[] of N bytes in all (cookie + elements) freed with scalar delete: the
// pointer given back is 8 bytes into the block.
template <size_t N> static int new_array_delete(size_t, size_t) {
    Elem *p = new Elem[(N - sizeof(size_t)) / sizeof(Elem)];
    delete p;
    return churn(N);
}

// Scalar new freed with delete[]: the cookie read is the 8 bytes before the block.
template <size_t N> static int new_delete_array(size_t, size_t) {
    Obj<N> *p = new Obj<N>;
    fill(p, N, 'a');
    delete[] p;
    return churn(N);
}

template <size_t N> static int sized_delete_wrong_size(size_t, size_t) {
    Base *b = new Derived<N>;
    fill(b, N, 'a');
    delete b; // operator delete(b, sizeof(Base))
    return churn(N);
}

// Sized delete with the size of another size class (and tier): 4 times N.
template <size_t N> static int delete_other_class_size(size_t, size_t) {
    void *p = ::operator new(N);
    fill(p, N, 'a');
    ::operator delete(p, 4 * N);
    return churn(N);
}

// Correct use of the same forms: must exit 0 with nothing on stderr.
template <size_t N> static void control_tier() {
    delete new Obj<N>;
    Obj<N> *two = new Obj<N>[2];
    delete[] two;
    delete[] new Elem[(N - sizeof(size_t)) / sizeof(Elem)];
    Base *b = new Derived<N>;
    delete static_cast<Derived<N> *>(b);
    ::operator delete(::operator new(N), N);
    free(malloc(N));
}

static int control() {
    control_tier<SZ_TINY>();
    control_tier<SZ_POOL>();
    control_tier<SZ_L25>();
    control_tier<SZ_LARGE>();
    return 0;
}

#define PER_TIER(f)                                                                                \
    { f<SZ_TINY>, f<SZ_POOL>, f<SZ_L25>, f<SZ_LARGE> }

static const struct {
    const char *kind;
    int (*fn[NTIERS])(size_t, size_t);
} kinds[] = {
    {"cxx_new_free", PER_TIER(new_free)},
    {"cxx_malloc_delete", PER_TIER(malloc_delete)},
    {"cxx_new_array_delete", PER_TIER(new_array_delete)},
    {"cxx_new_delete_array", PER_TIER(new_delete_array)},
    {"cxx_sized_delete_wrong_size", PER_TIER(sized_delete_wrong_size)},
    {"cxx_delete_other_class_size", PER_TIER(delete_other_class_size)},
};

int main(int argc, char **argv) {
    for (const auto &k : kinds)
        for (int t = 0; t < NTIERS; t++)
            hb_add(k.kind, t, 0, k.fn[t], tier_sizes[t], 0);
    return hb_main(argc, argv, control);
}
