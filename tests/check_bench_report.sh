#!/bin/bash
# bench/chart.py on synthetic results: report.md's ratio tables hold the
# expected medians' ratios to mimalloc, FAILED k/N for an allocator with a
# failed run, "not run" for one missing from a workload and n/a where
# mimalloc itself failed; report.svg parses as XML and has exactly one bar
# per allocator and panel where there is a ratio, with the right workload,
# allocator and ratio, the labels (workloads, legend, FAILED, ticks) and cut
# marks on the bars beyond the axes' 0.01x-100x. Without
# mimalloc results it writes no SVG and says so. Runs the time budget bounded
# (results.tsv's bounded column) put a * on the ratios they enter (tables and
# bars, with a footnote) and on mimalloc's own column, and in bench/report.py's
# table a * on the cell's Mops/s and on hakmem's ratios they enter, with the
# cell listed under the table; a results.tsv without that column (older runs)
# gives the same figures unmarked. Prints PASS/FAIL lines.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-chart.XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/ok" "$dir/nobase" "$dir/old"

# w_a: everyone ran (medians: mimalloc 100 ops/s, 1000 KiB), the budget
# bounded one jemalloc run; w_b: hakmem failed once, jemalloc did not run, the
# budget bounded one mimalloc run; w_c: mimalloc failed once.
{
    printf 'workload\tallocator\trun\tops_per_s\tpeak_rss_kib\tfaults\tbounded\tseconds\n'
    printf 'w_a\tmimalloc\t1\t100\t1000\t5\t-\t0.5\nw_a\tmimalloc\t2\t125\t900\t5\t-\t0.5\n'
    printf 'w_a\tmimalloc\t3\t90\t1100\t5\t-\t0.5\n'
    printf 'w_a\thakmem\t1\t200\t500\t5\t-\t0.5\nw_a\thakmem\t2\t300\t500\t5\t-\t0.5\n'
    printf 'w_a\thakmem\t3\t250\t400\t5\t-\t0.5\n'
    printf 'w_a\tglibc\t1\t50\t2000\t5\t-\t0.5\nw_a\tglibc\t2\t50\t2000\t5\t-\t0.5\n'
    printf 'w_a\tglibc\t3\t50\t2000\t5\t-\t0.5\n'
    printf 'w_a\tjemalloc\t1\t1000\t10\t5\t-\t0.5\nw_a\tjemalloc\t2\t1000\t10\t5\t3/10\t1.1\n'
    printf 'w_a\tjemalloc\t3\t1000\t10\t5\t-\t0.5\n'
    printf 'w_a\tmi3\t1\t100\t1000\t5\t-\t0.5\nw_a\tmi3\t2\t100\t1000\t5\t-\t0.5\n'
    printf 'w_a\tmi3\t3\t100\t1000\t5\t-\t0.5\n'
    printf 'w_b\tmimalloc\t1\t1000000\t100\t5\t7/60\t1.2\nw_b\tmimalloc\t2\t1000000\t100\t5\t-\t0.5\n'
    printf 'w_b\tmimalloc\t3\t1000000\t100\t5\t-\t0.5\n'
    printf 'w_b\thakmem\t1\t2000000\t50\t5\t-\t0.5\nw_b\thakmem\t2\tFAILED\t-\t-\t-\t0.1\n'
    printf 'w_b\thakmem\t3\t2000000\t50\t5\t-\t0.5\n'
    printf 'w_b\tglibc\t1\t3000\t100000\t5\t-\t0.5\nw_b\tglibc\t2\t3000\t100000\t5\t-\t0.5\n'
    printf 'w_b\tglibc\t3\t3000\t100000\t5\t-\t0.5\n'
    printf 'w_b\tmi3\t1\t500000\t300\t5\t-\t0.5\nw_b\tmi3\t2\t500000\t300\t5\t-\t0.5\n'
    printf 'w_b\tmi3\t3\t500000\t300\t5\t-\t0.5\n'
    printf 'w_c\tmimalloc\t1\t100\t100\t5\t-\t0.5\nw_c\tmimalloc\t2\tFAILED\t-\t-\t-\t-\n'
    printf 'w_c\thakmem\t1\t100\t100\t5\t-\t0.5\nw_c\thakmem\t2\t100\t100\t5\t-\t0.5\n'
    printf 'w_c\tglibc\t1\t100\t100\t5\t-\t0.5\nw_c\tglibc\t2\t100\t100\t5\t-\t0.5\n'
} >"$dir/ok/results.tsv"
{
    printf 'date\t2026-01-02 03:04:05 UTC\nnproc\t2\nkernel\tLinux 6.1\ncpu\tTest CPU\nruns\t3\n'
    printf 'budget\t1.5\nallocators\tglibc hakmem mimalloc jemalloc mi3\n'
    printf 'version\tglibc 2.36\nversion\thakmem 0.1.0 (abc1234)\nversion\tmimalloc 2.0.9-1\n'
    printf 'version\tjemalloc 5.3.0-1\nversion\tmi3 (libmimalloc-3.4.3.so)\n'
} >"$dir/ok/meta.tsv"
printf 'workload\tallocator\trun\treason\tlog\n' >"$dir/ok/failures.tsv"
grep -v mimalloc "$dir/ok/results.tsv" >"$dir/nobase/results.tsv"
cp "$dir/ok/meta.tsv" "$dir/nobase/"
touch "$dir/nobase/report.svg" # a stale chart must go
# The same results as written before run.sh had a budget: no bounded column.
cut -f1-6 "$dir/ok/results.tsv" >"$dir/old/results.tsv"
grep -v '^budget' "$dir/ok/meta.tsv" >"$dir/old/meta.tsv"
cp "$dir/ok/failures.tsv" "$dir/old/"

fail=0
for d in ok old; do
    if ! python3 bench/chart.py "$dir/$d" 2>"$dir/$d.err"; then
        echo "FAIL check_bench_report: bench/chart.py ($d) failed: $(cat "$dir/$d.err")"
        exit 1
    fi
    if ! python3 bench/report.py "$dir/$d" >"$dir/$d/table.md" 2>"$dir/$d.err"; then
        echo "FAIL check_bench_report: bench/report.py ($d) failed: $(cat "$dir/$d.err")"
        exit 1
    fi
done
if ! python3 bench/chart.py "$dir/nobase" 2>"$dir/nobase.err"; then
    echo "FAIL check_bench_report: bench/chart.py without mimalloc failed: $(cat "$dir/nobase.err")"
    exit 1
fi

python3 - "$dir" <<'EOF' || fail=1
import sys
import xml.dom.minidom

d = sys.argv[1]
errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)


md = open(f"{d}/ok/report.md").read()


def table(title, md=md):
    """The rows of the markdown table after the heading starting with title."""
    lines = md.split("\n")
    start = next((i for i, l in enumerate(lines) if l.startswith("## " + title)), None)
    if start is None:
        errors.append(f"report.md: no '## {title}' heading")
        return {}
    rows = {}
    for l in lines[start + 1:]:
        if l.startswith("## "):
            break
        if l.startswith("|") and not l.startswith("|-"):
            cells = [c.strip() for c in l.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


cols = ["mimalloc", "glibc", "hakmem", "jemalloc", "mi3"]
ops = table("Throughput / mimalloc")
rss = table("Peak RSS / mimalloc")
# * : a bounded run on either side of the ratio (w_a's jemalloc, w_b's
# mimalloc, so every ratio of w_b and mimalloc's own column there).
want_ops = {
    "workload": ["mimalloc Mops/s", "glibc", "hakmem", "jemalloc", "mi3"],
    "w_a": ["0.0001", "0.50x", "2.50x", "10.0x*", "1.00x"],
    "w_b": ["1.00*", "0.003x*", "FAILED 1/3", "not run", "0.50x*"],
    "w_c": ["FAILED 1/2", "n/a", "n/a", "not run", "not run"],
}
want_rss = {
    "workload": ["mimalloc RSS KiB", "glibc", "hakmem", "jemalloc", "mi3"],
    "w_a": ["1000", "2.00x", "0.50x", "0.01x*", "1.00x"],
    "w_b": ["100*", "1000x*", "FAILED 1/3", "not run", "3.00x*"],
    "w_c": ["FAILED 1/2", "n/a", "n/a", "not run", "not run"],
}
for name, got, want in (("throughput", ops, want_ops), ("RSS", rss, want_rss)):
    check(got == want, f"report.md {name} table: got {got}, want {want}")
check("- \\*: the allocator's or mimalloc's runs were bounded by the 1.5 s time budget" in md,
      "report.md: no footnote for the bounded ratios")

# Results without the bounded column: the same tables, unmarked.
old_md = open(f"{d}/old/report.md").read()
unmark = lambda t: {k: [c.rstrip("*") for c in v] for k, v in t.items()}
for name, title, want in (("throughput", "Throughput / mimalloc", want_ops),
                          ("RSS", "Peak RSS / mimalloc", want_rss)):
    got = table(title, old_md)
    check(got == unmark(want), f"report.md {name} table (no bounded column): got {got}")
check("*" not in old_md.replace("**", ""), "report.md (no bounded column): a * mark")

# report.py's table: a * on the bounded cells' Mops/s and on hakmem's ratios
# with a bounded side; the cells listed under the table, with the budget.
tbl = open(f"{d}/ok/table.md").read()
rows, last = {}, None
for l in tbl.split("\n"):
    if l.startswith("| ") and not l.startswith("| workload"):
        c = [x.strip() for x in l.strip().strip("|").split("|")]
        last = c[0] or last
        rows[(last, c[1])] = c[2:]
check(rows.get(("w_a", "jemalloc"), [""])[0] == "0.001*",
      f"table.md: w_a jemalloc Mops/s not marked: {rows.get(('w_a', 'jemalloc'))}")
check(rows.get(("w_a", "mimalloc"), [""])[0] == "0.0001",
      f"table.md: w_a mimalloc Mops/s marked: {rows.get(('w_a', 'mimalloc'))}")
check(rows.get(("w_b", "mimalloc"), [""])[0] == "1.00*",
      f"table.md: w_b mimalloc Mops/s not marked: {rows.get(('w_b', 'mimalloc'))}")
# hakmem's row: Mops/s spread RSS faults hak/mi hak/glibc hak/je hak/mi3 RSS hak/mi RSS hak/mi3
want = ["2.50x", "5.00x", "0.25x*", "2.50x", "0.50x", "0.50x"]
check(rows.get(("w_a", "hakmem"), [])[4:] == want,
      f"table.md: w_a hakmem ratios: {rows.get(('w_a', 'hakmem'))}, want {want}")
for s in ("time budget: 1.5 s per run", "did not fit the 1.5 s budget",
          "- w_a / jemalloc: 1/3 runs bounded, units done: median 3 of 10",
          "- w_b / mimalloc: 1/3 runs bounded, units done: median 7 of 60"):
    check(s in tbl, f"table.md: no '{s}'")
check("w_a / mimalloc:" not in tbl, "table.md: an unbounded cell listed as bounded")
old_tbl = open(f"{d}/old/table.md").read()
check("*" not in old_tbl.replace("**", "") and "budget" not in old_tbl,
      "table.md (no bounded column): a bounded mark")
check("](report.svg)" in md, "report.md: no relative link to report.svg")
for s in ("2026-01-02 03:04:05 UTC", "Test CPU", "mimalloc 2.0.9-1", "jemalloc 5.3.0-1"):
    check(s in md, f"report.md: no '{s}' (from meta.tsv)")

try:
    doc = xml.dom.minidom.parse(f"{d}/ok/report.svg")
except Exception as e:  # not well-formed
    errors.append(f"report.svg is not valid XML: {e}")
    doc = None
if doc:
    bars = sorted((r.getAttribute("data-workload"), r.getAttribute("data-allocator"),
                   r.getAttribute("data-panel"), round(float(r.getAttribute("data-ratio")), 6))
                  for r in doc.getElementsByTagName("rect") if r.getAttribute("class") == "bar")
    want = sorted([("w_a", "glibc", "ops", 0.5), ("w_a", "hakmem", "ops", 2.5),
                   ("w_a", "jemalloc", "ops", 10.0), ("w_a", "mi3", "ops", 1.0),
                   ("w_a", "glibc", "rss", 2.0), ("w_a", "hakmem", "rss", 0.5),
                   ("w_a", "jemalloc", "rss", 0.01), ("w_a", "mi3", "rss", 1.0),
                   ("w_b", "glibc", "ops", 0.003), ("w_b", "mi3", "ops", 0.5),
                   ("w_b", "glibc", "rss", 1000.0), ("w_b", "mi3", "rss", 3.0)])
    check(bars == want, f"report.svg bars: got {bars}, want {want}")
    marked = sorted((r.getAttribute("data-workload"), r.getAttribute("data-allocator"),
                     r.getAttribute("data-panel"))
                    for r in doc.getElementsByTagName("rect")
                    if r.getAttribute("class") == "bar" and r.getAttribute("data-bounded") == "1")
    want = sorted([("w_a", "jemalloc", "ops"), ("w_a", "jemalloc", "rss"), ("w_b", "glibc", "ops"),
                   ("w_b", "glibc", "rss"), ("w_b", "mi3", "ops"), ("w_b", "mi3", "rss")])
    check(marked == want, f"report.svg bounded bars: got {marked}, want {want}")
    texts = [t.firstChild.data if t.firstChild else ""
             for t in doc.getElementsByTagName("text")]
    alltext = "\n".join(texts)
    for s in ("w_a", "w_b", "w_c", "glibc 2.36", "hakmem 0.1.0 (abc1234)", "jemalloc 5.3.0-1",
              "mi3 (libmimalloc-3.4.3.so)", "hakmem FAILED 1/3", "jemalloc not run",
              "mimalloc FAILED 1/2", "higher is better", "lower is better", "1x", "0.01x",
              "100x", "1000x*", "0.003x*", "10.0x*", "2.50x", "log scale",
              "* the allocator's or mimalloc's runs were bounded by the 1.5 s time budget"):
        check(s in alltext, f"report.svg: no text '{s}'")
    check(texts.count("hakmem FAILED 1/3") == 2, "report.svg: FAILED not shown in both panels")
    # The axes stop at 0.01x and 100x: w_b's glibc bars (0.003x, 1000x) are
    # cut there, two strokes each.
    cuts = [p for p in doc.getElementsByTagName("path") if p.getAttribute("class") == "cut"]
    check(len(cuts) == 4, f"report.svg: {len(cuts)} cut marks, want 4 (2 bars beyond the axes)")

import os
nb = open(f"{d}/nobase/report.md").read()
check("no mimalloc results" in nb, "without mimalloc: report.md does not say there are no ratios")
check(not os.path.exists(f"{d}/nobase/report.svg"), "without mimalloc: a report.svg is left")

for e in errors:
    print(f"FAIL check_bench_report: {e}")
sys.exit(1 if errors else 0)
EOF

[ "$fail" -eq 0 ] || exit 1
echo "PASS check_bench_report"
