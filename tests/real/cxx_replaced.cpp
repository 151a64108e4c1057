// A program that replaces only the unsized operator new and delete, with
// blocks of its own (a header before each), as some programs do. The
// compiler still emits sized deletes, which it leaves to the library: under
// LD_PRELOAD=hakmem they reach hakmem's sized delete with pointers hakmem
// never handed out, which must go on to the program's unsized delete, not
// abort (real/cxx.sh); the array and nothrow forms, which the standard
// defines over the replaced pair, must reach it too. Prints "ok" when every
// block came back to its owner. Built twice: plain, and linked statically
// with libhakmem.a (whose operators are weak: the program's win).
// (What GCC warns of is this program's point.)
#pragma GCC diagnostic ignored "-Wsized-deallocation"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

static long live; // blocks of this program's operator new not yet deleted

void *operator new(std::size_t n) {
    char *p = static_cast<char *>(std::malloc(n + 16));
    if (p == nullptr) throw std::bad_alloc();
    live++;
    return p + 16;
}

void operator delete(void *p) noexcept {
    if (p == nullptr) return;
    live--;
    std::free(static_cast<char *>(p) - 16);
}

struct Node {
    Node *next;
    std::string name;
};

// 130 and 146 bytes (with the header) are one size class: a sized delete
// must not take the program's pointer for the start of a block of it.
struct Odd {
    char c[130];
};

int main() {
    Node *head = nullptr;
    for (int i = 0; i < 1000; i++)
        head = new Node{head, std::string(i % 50 + 20, 'n')};
    std::vector<int> v;
    for (int i = 0; i < 100000; i++)
        v.push_back(i);
    while (head) {
        Node *n = head->next;
        delete head; // a sized delete: operator delete(void *, std::size_t)
        head = n;
    }
    for (int i = 0; i < 100; i++)
        delete new Odd;
    Odd *arr = new Odd[3]; // array forms go to the replaced pair too
    delete[] arr;
    char *nt = new (std::nothrow) char[40];
    delete[] nt;
    v.clear();
    v.shrink_to_fit();
    if (live != 0) {
        std::printf("live blocks left: %ld\n", live);
        return 1;
    }
    std::printf("ok\n");
    return 0;
}
