// C++17 allocation workout for real/cxx.sh: containers, strings, shared_ptr,
// plain/array/sized/aligned new and delete. Prints a deterministic summary
// that must be identical under glibc, LD_PRELOAD=hakmem and -lhakmem.
// With HAKMEM_EXPECT_LINKED=1 it first checks hakmem is in the process.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const char *what) {
    if (!ok) {
        std::fprintf(stderr, "cxx_prog: check failed: %s\n", what);
        failures++;
    }
}

uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h;
}

uint64_t hash_str(const std::string &s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s)
        h = (h ^ c) * 1099511628211ull;
    return h;
}

bool aligned(const void *p, std::size_t a) {
    return reinterpret_cast<uintptr_t>(p) % a == 0;
}

struct alignas(64) Cache {
    uint64_t v[8];
};

struct Node {
    std::string name;
    std::vector<int> data;
    std::shared_ptr<Node> next;
};

void maps_and_strings() {
    std::map<std::string, std::vector<int>> m;
    for (int i = 0; i < 100000; i++) {
        std::string key = "k" + std::to_string(i * 7919 % 100003) + "_" + std::string(i % 23, 'x');
        auto &v = m[key];
        for (int j = 0; j < i % 17; j++)
            v.push_back(i * j);
    }
    uint64_t h = 0;
    std::size_t elems = 0;
    for (const auto &kv : m) {
        h = mix(h, hash_str(kv.first));
        for (int x : kv.second)
            h = mix(h, static_cast<uint64_t>(x));
        elems += kv.second.size();
    }
    const std::size_t keys = m.size();
    // Erase every third key and re-grow the survivors.
    int n = 0;
    for (auto it = m.begin(); it != m.end();) {
        if (n++ % 3 == 0) {
            it = m.erase(it);
        } else {
            it->second.resize(it->second.size() * 2 + 1, n);
            ++it;
        }
    }
    std::printf("map: keys=%zu elems=%zu hash=%016llx after_erase=%zu\n", keys, elems,
                static_cast<unsigned long long>(h), m.size());

    std::string s;
    for (int i = 0; i < 200000; i++)
        s += std::to_string(i % 1000) + (i % 2 ? "," : ";");
    std::string t = s + s.substr(1000, 5000) + std::string(100000, 'z');
    std::printf("string: len=%zu hash=%016llx\n", t.size(),
                static_cast<unsigned long long>(hash_str(t)));
}

void unordered_and_sort() {
    std::unordered_map<std::string, int> um;
    um.reserve(16);
    for (int i = 0; i < 200000; i++)
        um["u" + std::to_string((i * 2654435761u) % 150000)] += i % 10;
    std::vector<std::pair<std::string, int>> v(um.begin(), um.end());
    std::sort(v.begin(), v.end(), [](const auto &a, const auto &b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    uint64_t h = 0;
    for (std::size_t i = 0; i < v.size(); i += 97)
        h = mix(h, hash_str(v[i].first) + v[i].second);
    std::printf("unordered: size=%zu top=%s:%d hash=%016llx\n", v.size(), v[0].first.c_str(),
                v[0].second, static_cast<unsigned long long>(h));

    std::vector<uint64_t> nums;
    uint64_t x = 88172645463325252ull;
    for (int i = 0; i < 1000000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        nums.push_back(x % 1000000007ull);
    }
    std::sort(nums.begin(), nums.end());
    check(std::is_sorted(nums.begin(), nums.end()), "std::sort");
    std::printf("sort: n=%zu min=%llu median=%llu max=%llu\n", nums.size(),
                static_cast<unsigned long long>(nums.front()),
                static_cast<unsigned long long>(nums[nums.size() / 2]),
                static_cast<unsigned long long>(nums.back()));
}

void shared_ptrs() {
    std::vector<std::shared_ptr<Node>> roots;
    for (int i = 0; i < 2000; i++) {
        auto head = std::make_shared<Node>();
        head->name = "node" + std::to_string(i);
        auto cur = head;
        for (int j = 0; j < i % 20; j++) {
            cur->next = std::shared_ptr<Node>(new Node{"n" + std::to_string(j), {}, nullptr});
            cur->next->data.assign(static_cast<std::size_t>(j * 3), j);
            cur = cur->next;
        }
        roots.push_back(head);
    }
    std::size_t nodes = 0, ints = 0;
    for (const auto &r : roots)
        for (auto p = r; p; p = p->next) {
            nodes++;
            ints += p->data.size();
        }
    std::weak_ptr<Node> w = roots[1999];
    roots.clear();
    check(w.expired(), "shared_ptr released");
    std::printf("shared_ptr: nodes=%zu ints=%zu\n", nodes, ints);
}

void raw_new_delete() {
    // Plain, array and explicitly sized new/delete.
    uint64_t sum = 0;
    for (int i = 0; i < 20000; i++) {
        auto *p = new uint64_t(static_cast<uint64_t>(i));
        auto *a = new int[static_cast<std::size_t>(i % 300 + 1)];
        a[i % 300] = i;
        sum += *p + static_cast<uint64_t>(a[i % 300]);
        delete p;
        delete[] a;
        std::size_t n = static_cast<std::size_t>(i % 5000 + 1);
        void *raw = ::operator new(n);
        std::memset(raw, i & 0xff, n);
        sum += static_cast<unsigned char *>(raw)[n - 1];
        ::operator delete(raw, n);
    }
    // Over-aligned types and explicit alignment.
    bool all_aligned = true;
    std::vector<Cache *> cs;
    for (int i = 0; i < 1000; i++) {
        Cache *c = new Cache();
        c->v[0] = static_cast<uint64_t>(i);
        all_aligned &= aligned(c, 64);
        cs.push_back(c);
    }
    Cache *arr = new Cache[333];
    all_aligned &= aligned(arr, 64);
    for (Cache *c : cs) {
        sum += c->v[0];
        delete c;
    }
    delete[] arr;
    for (int i = 0; i < 200; i++) {
        std::size_t n = static_cast<std::size_t>(i * 1000 + 1);
        char *p = new (std::align_val_t(4096)) char[n];
        all_aligned &= aligned(p, 4096);
        p[0] = 1;
        p[n - 1] = 2;
        sum += static_cast<uint64_t>(p[0] + p[n - 1]);
        ::operator delete[](p, std::align_val_t(4096));
        void *q = ::operator new(n, std::align_val_t(1 << 16));
        all_aligned &= aligned(q, 1 << 16);
        ::operator delete(q, n, std::align_val_t(1 << 16));
    }
    check(all_aligned, "aligned new honours alignment");
    std::printf("new/delete: sum=%llu aligned=%s\n", static_cast<unsigned long long>(sum),
                all_aligned ? "yes" : "no");
}

// C allocation calls from C++ code. Besides exercising them, these direct
// references keep -lhakmem a DT_NEEDED entry of the linked binary: with the
// toolchain's default --as-needed, a library that only libstdc++ uses would
// be dropped from the link.
void c_allocs() {
    uint64_t h = 0;
    void *keep[64] = {};
    for (int i = 0; i < 5000; i++) {
        std::size_t n = static_cast<std::size_t>((i * 37) % 20000 + 1);
        auto *p = static_cast<unsigned char *>(std::malloc(n));
        check(p != nullptr, "malloc");
        std::memset(p, i & 0xff, n);
        p = static_cast<unsigned char *>(std::realloc(p, n * 2));
        check(p != nullptr && p[n - 1] == (i & 0xff), "realloc keeps contents");
        h = mix(h, p[0] + n);
        auto *z = static_cast<unsigned char *>(std::calloc(n, 3));
        check(z != nullptr && z[n * 3 - 1] == 0, "calloc zeroes");
        std::free(keep[i % 64]);
        keep[i % 64] = z;
        std::free(p);
    }
    for (void *k : keep)
        std::free(k);
    std::printf("c alloc: hash=%016llx\n", static_cast<unsigned long long>(h));
}

} // namespace

int main() {
    const char *expect = std::getenv("HAKMEM_EXPECT_LINKED");
    if (expect != nullptr && std::strcmp(expect, "1") == 0 &&
        dlsym(RTLD_DEFAULT, "hak_malloc") == nullptr) {
        std::fprintf(stderr, "cxx_prog: hakmem is not loaded (no hak_malloc)\n");
        return 1;
    }
    maps_and_strings();
    unordered_and_sort();
    shared_ptrs();
    raw_new_delete();
    c_allocs();
    if (failures != 0) return 1;
    std::printf("ok\n");
    return 0;
}
