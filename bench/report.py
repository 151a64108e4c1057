#!/usr/bin/env python3
"""Render the results of bench/run.sh as a markdown table.

usage: bench/report.py [DIR]     (DIR defaults to out/bench)

Reads DIR/results.tsv (one row per run), DIR/meta.tsv (machine and library
versions) and DIR/failures.tsv, and prints, per workload and allocator, the
median ops/s, peak RSS and page faults over the runs; hakmem rows also get
the ratios of hakmem's median to the other allocators' medians (Debian's
mimalloc, glibc, jemalloc, then any BENCH_EXTRA allocators). Any failed run turns its cell
into FAILED. A cell any of whose runs the time budget bounded (results.tsv's
bounded column) has a * on its Mops/s and is listed under the table. run.sh
saves this output as DIR/table.md.
"""
import csv
import os
import statistics
import sys

ORDER = ["glibc", "hakmem", "mimalloc", "jemalloc"]
BASELINES = ["mimalloc", "glibc", "jemalloc"]  # hakmem/X ops/s ratios, in this order
SHORT = {"mimalloc": "mi", "glibc": "glibc", "jemalloc": "je"}


def read_tsv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def read_meta(path):
    meta = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                key, _, val = line.rstrip("\n").partition("\t")
                meta.setdefault(key, []).append(val)
    return meta


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "n/a"
    r = a / b
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


def mops(ops):
    """ops/s in millions: 2 decimals, or 3 significant digits below 1 so that
    slow workloads (e.g. realloc_growth, hundreds of ops/s) do not read 0.00."""
    m = ops / 1e6
    return f"{m:.2f}" if m >= 1 else f"{m:.3g}"


def render(rows, align):
    """Markdown table with columns padded so it also reads well in a terminal."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def fmt(r):
        cells = [c.rjust(w) if al == "r" else c.ljust(w) for c, w, al in zip(r, widths, align)]
        return "| " + " | ".join(cells) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if al == "r" else ("-" * (w + 2))
                         for w, al in zip(widths, align)) + "|"
    return "\n".join([fmt(rows[0]), sep] + [fmt(r) for r in rows[1:]])


def load(d):
    """The results of one bench/run.sh session in DIR d: (results, failures,
    meta), the rows of results.tsv and failures.tsv as dicts and meta.tsv as
    key -> [values]."""
    return (read_tsv(os.path.join(d, "results.tsv")), read_tsv(os.path.join(d, "failures.tsv")),
            read_meta(os.path.join(d, "meta.tsv")))


def summarize(results):
    """Group results.tsv's rows and take medians. Returns (workloads, allocs,
    extras, runs, med): workloads in run order; allocators in the canonical
    order (ORDER), then any others by name; extras, the allocators not in ORDER
    (BENCH_EXTRA, hakmem-check) in run order; runs[(workload, allocator)], a
    list of (ops, rss, faults, bounded) per run, None for a failed run's
    values, bounded (units done, planned) for a run the budget bounded, else
    None (also in results.tsv files older than the bounded column);
    med[(workload, allocator)] = (ops, rss, spread, faults), medians over the
    runs (faults None when not recorded), or None if any run failed. A
    (workload, allocator) pair that never ran is in neither."""
    workloads, allocs = [], []
    runs = {}
    for r in results:
        w, a = r["workload"], r["allocator"]
        if w not in workloads:
            workloads.append(w)
        if a not in allocs:
            allocs.append(a)
        ok = r["ops_per_s"] != "FAILED"
        flt = r.get("faults", "-")
        bnd = r.get("bounded") or "-"
        runs.setdefault((w, a), []).append(
            (float(r["ops_per_s"]) if ok else None, float(r["peak_rss_kib"]) if ok else None,
             float(flt) if ok and flt not in ("-", "", None) else None,
             tuple(int(x) for x in bnd.split("/")) if ok and bnd != "-" else None))
    extras = [a for a in allocs if a not in ORDER]  # BENCH_EXTRA, in run order
    allocs.sort(key=lambda a: (ORDER.index(a) if a in ORDER else len(ORDER), a))

    med = {}
    for key, rs in runs.items():
        ops = [x[0] for x in rs if x[0] is not None]
        if len(ops) < len(rs):
            med[key] = None
            continue
        m = statistics.median(ops)
        spread = (max(ops) - min(ops)) / m if m else 0.0
        flts = [x[2] for x in rs if x[2] is not None]
        med[key] = (m, statistics.median(x[1] for x in rs), spread,
                    statistics.median(flts) if flts else None)
    return workloads, allocs, extras, runs, med


def meta_first(meta, key, dflt="?"):
    return meta.get(key, [dflt])[0]


def machine_lines(meta):
    """Markdown list items for the machine, the library versions and the
    allocators skipped, from meta.tsv."""
    first = lambda k: meta_first(meta, k)
    out = [f"- machine: nproc {first('nproc')}, {first('kernel')}, CPU {first('cpu')}"
           + (f", pinned to {first('pinned')}" if "pinned" in meta else ""),
           "- libraries: " + "; ".join(meta.get("version", []))]
    out += [f"- skipped: {s}" for s in meta.get("skipped", [])]
    return out


def failed_runs(runs, key):
    """'FAILED k/N' for (workload, allocator) key."""
    nfail = sum(1 for x in runs[key] if x[0] is None)
    return f"FAILED {nfail}/{len(runs[key])}"


def bounded_runs(runs, key):
    """The (units done, planned) of the runs of (workload, allocator) key that
    the time budget bounded; [] when none was (or the pair did not run)."""
    return [x[3] for x in runs.get(key, []) if x[3] is not None]


def budget_text(meta):
    """The budget of the session as '2 s', from meta.tsv ('?' when absent)."""
    return f"{meta_first(meta, 'budget')} s"


def bounded_note(runs, key):
    """What the runs of key that the budget bounded did: '9/9 runs, units
    done: median 7 of 60'."""
    b = bounded_runs(runs, key)
    done = statistics.median(d for d, _ in b)
    planned = max(p for _, p in b)
    return (f"{len(b)}/{len(runs[key])} runs bounded, units done: median {done:g} of "
            f"{planned}")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "out/bench"
    results, failures, meta = load(d)
    if not results:
        print(f"report.py: no results in {d}/results.tsv", file=sys.stderr)
        return 1

    workloads, allocs, extras, runs, med = summarize(results)
    baselines = [b for b in BASELINES if b in allocs] + extras
    rss_baselines = [b for b in ["mimalloc"] + extras if b in allocs]

    have_hakmem = "hakmem" in allocs
    header = ["workload", "allocator", "Mops/s", "spread", "RSS KiB", "faults"]
    align = ["l", "l", "r", "r", "r", "r"]
    if have_hakmem:
        header += [f"hak/{SHORT.get(b, b)}" for b in baselines]
        header += [f"RSS hak/{SHORT.get(b, b)}" for b in rss_baselines]
        align += ["r"] * (len(baselines) + len(rss_baselines))
    rows = [header]
    for w in workloads:
        for i, a in enumerate(allocs):
            if (w, a) not in runs:
                continue
            m = med[(w, a)]
            label = w if i == 0 or all((w, x) not in runs for x in allocs[:i]) else ""
            if m is None:
                row = [label, a, failed_runs(runs, (w, a)), "", "", ""]
            else:
                mark = "*" if bounded_runs(runs, (w, a)) else ""
                row = [label, a, mops(m[0]) + mark, f"{100 * m[2]:.1f}%", f"{m[1]:.0f}",
                       "-" if m[3] is None else f"{m[3]:.0f}"]
            if have_hakmem:
                if a == "hakmem":
                    def val(x, idx):
                        mx = med.get((w, x))
                        return mx[idx] if mx else None
                    def mark(rt, x):  # a * on a ratio with a bounded side
                        b = bounded_runs(runs, (w, "hakmem")) or bounded_runs(runs, (w, x))
                        return rt + "*" if b and rt != "n/a" else rt
                    h_ops, h_rss = val("hakmem", 0), val("hakmem", 1)
                    row += [mark(ratio(h_ops, val(b, 0)), b) for b in baselines]
                    row += [mark(ratio(h_rss, val(b, 1)), b) for b in rss_baselines]
                else:
                    row += [""] * (len(baselines) + len(rss_baselines))
            rows.append(row)

    out = []
    out.append(f"## hakmem benchmark ({meta_first(meta, 'date')})")
    out.append("")
    out += machine_lines(meta)
    first = lambda k: meta_first(meta, k)
    out.append(f"- {first('runs')} interleaved runs per cell. Mops/s and RSS KiB: medians over "
               "the runs of ops/s (in millions), of peak RSS and of page faults (minor + major, "
               "getrusage); spread: (max-min)/median of ops/s")
    if "budget" in meta and float(first("budget")) > 0:
        out.append(f"- time budget: {budget_text(meta)} per run (BENCH_BUDGET): a run still at "
                   "work then stops at the end of its current unit of work (bench/README.md)")
    elif "budget" in meta:
        out.append("- no time budget (BENCH_BUDGET=0): every run did its whole work")
    if have_hakmem:
        out.append("- hak/X: hakmem's median ops/s / X's (> 1: hakmem faster); "
                   "RSS hak/X: hakmem's median peak RSS / X's (> 1: hakmem uses more)")
    out.append("")
    out.append(render(rows, align))
    bounded = [(w, a) for w in workloads for a in allocs
               if med.get((w, a)) and bounded_runs(runs, (w, a))]
    if bounded:
        out.append("")
        out.append(f"\\* rate over a bounded run: the workload's full work did not fit the "
                   f"{budget_text(meta)} budget, so Mops/s is the rate over the units of work done "
                   "(the first ones: their first-touch costs weigh more than in a whole run), and "
                   "RSS KiB and faults are those of the bounded runs (faults count only the work "
                   "done). The ratios are still given, with a * where either side was bounded. "
                   "Bounded cells:")
        out.append("")
        for w, a in bounded:
            out.append(f"- {w} / {a}: {bounded_note(runs, (w, a))}")
    if meta.get("workload"):
        out.append("")
        out.append("Workloads (`NAME: [ENV] BINARY ARGS`, run as out/bench/BINARY):")
        out.append("")
        for wl in meta["workload"]:
            name, _, spec = wl.partition("\t")
            out.append(f"- `{name}`: `{spec}`")
    if failures:
        out.append("")
        out.append(f"**FAILED runs ({len(failures)}):**")
        out.append("")
        groups = {}  # (workload, allocator, reason) -> [(run, log)]
        for f in failures:
            groups.setdefault((f["workload"], f["allocator"], f["reason"]), []).append(
                (f["run"], f["log"]))
        for (w, a, reason), rl in groups.items():
            out.append(f"- {w} / {a}: run {','.join(r for r, _ in rl)}: {reason} "
                       f"(log: {rl[0][1]})")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
