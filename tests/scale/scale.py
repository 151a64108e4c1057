#!/usr/bin/env python3
"""Run the many-core scenarios under the count build and hold them to budgets.

usage: tests/scale/scale.py [--sites N] [--only REGEX] [--budgets FILE] [--no-budgets]

Each scenario (tests/scale/scenarios) runs a bench program with
LD_PRELOAD=out/count/libhakmem.so (tests/scale/count.c), which counts, per
call site of the allocator and per operation (a malloc and a free) of the
timed phase: atomic read-modify-writes (rmw), locks taken (lock), writes to
a cache line another thread holds (swrite) and reads of a line another
thread wrote since (sread). Counts depend on the thread schedule only a
little: they are per op, over hundreds of thousands of ops.

Prints a table of the totals, then each scenario's costliest sites, named
with addr2line (function, file:line, innermost first where inlined). Exits
1 when a scenario exceeds a budget of tests/scale/budgets (the ceilings
make test holds the code to; --budgets tests/scale/goals: where the design
must get to) or fails.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = os.path.join(ROOT, "out/count/libhakmem.so")
DEPTH = int(os.environ.get("SCALE_DEPTH", "3"))
KINDS = ["rmw", "lock", "swrite", "sread"]


def read_table(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                rows.append(line.split())
    return rows


def run(name, words):
    env = dict(os.environ)
    argv = []
    for w in words:
        if not argv and "=" in w:
            k, v = w.split("=", 1)
            env[k] = v
        else:
            argv.append(w)
    argv[0] = os.path.join(ROOT, "out/bench", argv[0])
    env["LD_PRELOAD"] = LIB
    env.pop("HAKMEM_BENCH_BUDGET", None)
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    if p.returncode != 0 or "Throughput" not in p.stdout:
        sys.stdout.write(p.stdout + p.stderr)
        return None
    total, sites = None, []
    for line in p.stdout.splitlines():
        m = re.match(r"count (total|site (0x[0-9a-f]+))((?: \w+=[0-9.]+)+)$", line)
        if not m:
            continue
        vals = dict((k, float(v)) for k, v in re.findall(r"(\w+)=([0-9.]+)", m.group(3)))
        if m.group(1) == "total":
            total = vals
        else:
            sites.append((m.group(2), vals))
    if total is None:
        print(f"{name}: no count lines (is {LIB} the count build?)")
    return total, sites


def resolve(addrs):
    """addr -> 'function file:line < caller file:line ...' (innermost first)."""
    if not addrs:
        return {}
    p = subprocess.run(["addr2line", "-f", "-i", "-a", "-e", LIB] + addrs,
                       capture_output=True, text=True)
    out, cur = {}, None
    lines = p.stdout.splitlines()
    i = 0
    while i < len(lines):
        if re.match(r"^0x[0-9a-f]+$", lines[i]):
            cur = "0x%x" % int(lines[i], 16)
            out[cur] = []
            i += 1
            continue
        fn, loc = lines[i], lines[i + 1] if i + 1 < len(lines) else "?"
        loc = re.sub(r" \(discriminator \d+\)", "", loc)
        loc = loc.replace(ROOT + "/", "")
        out[cur].append(f"{fn} {loc}")
        i += 2
    return {a: " < ".join(v[:DEPTH]) for a, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sites", type=int, default=4, help="sites shown per scenario")
    ap.add_argument("--only", default="", help="scenarios matching this regex")
    ap.add_argument("--budgets", default=os.path.join(ROOT, "tests/scale/budgets"))
    ap.add_argument("--no-budgets", action="store_true")
    a = ap.parse_args()
    here = os.path.join(ROOT, "tests/scale")
    scenarios = read_table(os.path.join(here, "scenarios"))
    budgets = {r[0]: [float(x) for x in r[1:4]] for r in read_table(a.budgets)}
    failed = []
    results = []
    for row in scenarios:
        name = row[0]
        if a.only and not re.search(a.only, name):
            continue
        if name not in budgets:
            print(f"FAIL {name}: no budget in {a.budgets}")
            failed.append(name)
            continue
        r = run(name, row[1:])
        if r is None or r[0] is None:
            print(f"FAIL {name}: the run failed")
            failed.append(name)
            continue
        results.append((name, r[0], r[1]))
    print("%-16s %8s %8s %8s %8s   budget rmw/lock/swrite" % ("scenario (per op)", *KINDS))
    for name, total, _ in results:
        b = budgets[name]
        over = [k for k, lim in zip(KINDS, b) if total[k] > lim]
        mark = "  OVER: " + ",".join(over) if over and not a.no_budgets else ""
        print("%-16s %8.4f %8.4f %8.4f %8.4f   %g/%g/%g%s" % (
            name, *[total[k] for k in KINDS], *b, mark))
        if over and not a.no_budgets:
            failed.append(name)
    for name, total, sites in results:
        cost = lambda v: v["rmw"] + v["lock"] + v["swrite"] + v["sread"]
        top = sorted(sites, key=lambda s: -cost(s[1]))[: a.sites]
        top = [s for s in top if cost(s[1]) >= 0.0005]
        if not top:
            continue
        names = resolve([s[0] for s in top])
        print(f"\n{name}: costliest sites (per op)")
        for addr, v in top:
            print("  %s  %s" % (" ".join("%s=%.4f" % (k, v[k]) for k in KINDS if v[k] >= 0.00005),
                               names.get("0x%x" % int(addr, 16), addr)))
    if failed:
        print(f"\nFAIL check_scale: {' '.join(failed)}")
        return 1
    print("\nPASS check_scale")
    return 0


if __name__ == "__main__":
    sys.exit(main())
