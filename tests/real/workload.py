# Allocation-heavy, deterministic Python workload for real/python.sh: every
# line it prints must be identical with and without hakmem preloaded.
import hashlib

N = 1_000_000


def digest(parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\n")
    return h.hexdigest()[:24]


# A big dict: string keys, tuple or list values.
d = {}
for i in range(N):
    k = "key%07d" % (i * 7919 % N)
    d[k] = (i, str(i * 3)) if i % 2 else [i, "v%d" % i, i % 10]
print("dict entries", len(d))
acc = 0
for k, v in d.items():
    acc = (acc * 1000003 + len(k) + v[0]) % (1 << 61)
print("dict checksum", acc)

# Delete a third, re-add with new shapes (frees and reallocations).
for i in range(0, N, 3):
    del d["key%07d" % i]
for i in range(0, N, 3):
    d["new%07d" % i] = ("x" * (i % 50), i)
print("dict after churn", len(d), digest(list(d)[:1000] + list(d)[-1000:]))

# One list of 1M tuples (pseudo-random, cheap to generate), sorted several ways.
items = [((i * 2654435761) % 100003, "s%08x" % ((i * 40503 + 17) * 2246822519 % (1 << 32))) for i in range(N)]
by_num = sorted(items)
by_str = sorted(items, key=lambda t: t[1])
strs = sorted((t[1] for t in items), reverse=True)
for name, lst in (("num", by_num), ("str", by_str)):
    print("sorted", name, digest("%d:%s" % t for t in lst[:: N // 5000]))
print("sorted strs", digest(strs[:: N // 5000]))
items.sort(key=lambda t: -t[0])
print("in-place", digest(t[1] for t in items[:2000]))

# String building and joins.
joined = ",".join(t[1] for t in by_num)
print("join len", len(joined), hashlib.sha256(joined.encode()).hexdigest()[:24])
parts = joined.split(",")
print("split", len(parts), parts[0], parts[-1])
big = "".join(chr(97 + (i * 7) % 26) * (i % 17) for i in range(200000))
print("big string", len(big), hashlib.sha256(big.encode()).hexdigest()[:24])
words = {}
for i in range(0, len(big) - 8, 5):
    w = big[i : i + 8]
    words[w] = words.get(w, 0) + 1
top = sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
print("top words", top)

# Nested containers built and dropped repeatedly.
total = 0
for r in range(5):
    nested = [[j] * (j % 30) for j in range(20000)]
    total += sum(len(x) for x in nested)
    del nested
print("nested total", total)
print("done")
