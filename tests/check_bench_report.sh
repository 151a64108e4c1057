#!/bin/bash
# bench/chart.py on synthetic results: report.md's ratio tables hold the
# expected medians' ratios to mimalloc, FAILED k/N for an allocator with a
# failed run, "not run" for one missing from a workload and n/a where
# mimalloc itself failed; report.svg parses as XML and has exactly one bar
# per allocator and panel where there is a ratio, with the right workload,
# allocator and ratio, the labels (workloads, legend, FAILED, ticks) and cut
# marks on the bars beyond the axes' 0.01x-100x. Without
# mimalloc results it writes no SVG and says so. Prints PASS/FAIL lines.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir=$(mktemp -d "${TMPDIR:-/tmp}/hakmem-chart.XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/ok" "$dir/nobase"

# w_a: everyone ran (medians: mimalloc 100 ops/s, 1000 KiB); w_b: hakmem
# failed once, jemalloc did not run; w_c: mimalloc failed once.
{
    printf 'workload\tallocator\trun\tops_per_s\tpeak_rss_kib\tfaults\n'
    printf 'w_a\tmimalloc\t1\t100\t1000\t5\nw_a\tmimalloc\t2\t125\t900\t5\nw_a\tmimalloc\t3\t90\t1100\t5\n'
    printf 'w_a\thakmem\t1\t200\t500\t5\nw_a\thakmem\t2\t300\t500\t5\nw_a\thakmem\t3\t250\t400\t5\n'
    printf 'w_a\tglibc\t1\t50\t2000\t5\nw_a\tglibc\t2\t50\t2000\t5\nw_a\tglibc\t3\t50\t2000\t5\n'
    printf 'w_a\tjemalloc\t1\t1000\t10\t5\nw_a\tjemalloc\t2\t1000\t10\t5\nw_a\tjemalloc\t3\t1000\t10\t5\n'
    printf 'w_a\tmi3\t1\t100\t1000\t5\nw_a\tmi3\t2\t100\t1000\t5\nw_a\tmi3\t3\t100\t1000\t5\n'
    printf 'w_b\tmimalloc\t1\t1000000\t100\t5\nw_b\tmimalloc\t2\t1000000\t100\t5\nw_b\tmimalloc\t3\t1000000\t100\t5\n'
    printf 'w_b\thakmem\t1\t2000000\t50\t5\nw_b\thakmem\t2\tFAILED\t-\t-\nw_b\thakmem\t3\t2000000\t50\t5\n'
    printf 'w_b\tglibc\t1\t3000\t100000\t5\nw_b\tglibc\t2\t3000\t100000\t5\nw_b\tglibc\t3\t3000\t100000\t5\n'
    printf 'w_b\tmi3\t1\t500000\t300\t5\nw_b\tmi3\t2\t500000\t300\t5\nw_b\tmi3\t3\t500000\t300\t5\n'
    printf 'w_c\tmimalloc\t1\t100\t100\t5\nw_c\tmimalloc\t2\tFAILED\t-\t-\n'
    printf 'w_c\thakmem\t1\t100\t100\t5\nw_c\thakmem\t2\t100\t100\t5\n'
    printf 'w_c\tglibc\t1\t100\t100\t5\nw_c\tglibc\t2\t100\t100\t5\n'
} >"$dir/ok/results.tsv"
{
    printf 'date\t2026-01-02 03:04:05 UTC\nnproc\t2\nkernel\tLinux 6.1\ncpu\tTest CPU\nruns\t3\n'
    printf 'allocators\tglibc hakmem mimalloc jemalloc mi3\n'
    printf 'version\tglibc 2.36\nversion\thakmem 0.1.0 (abc1234)\nversion\tmimalloc 2.0.9-1\n'
    printf 'version\tjemalloc 5.3.0-1\nversion\tmi3 (libmimalloc-3.4.3.so)\n'
} >"$dir/ok/meta.tsv"
printf 'workload\tallocator\trun\treason\tlog\n' >"$dir/ok/failures.tsv"
grep -v mimalloc "$dir/ok/results.tsv" >"$dir/nobase/results.tsv"
cp "$dir/ok/meta.tsv" "$dir/nobase/"
touch "$dir/nobase/report.svg" # a stale chart must go

fail=0
if ! python3 bench/chart.py "$dir/ok" 2>"$dir/ok.err"; then
    echo "FAIL check_bench_report: bench/chart.py failed: $(cat "$dir/ok.err")"
    exit 1
fi
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


def table(title):
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
want_ops = {
    "workload": ["mimalloc Mops/s", "glibc", "hakmem", "jemalloc", "mi3"],
    "w_a": ["0.0001", "0.50x", "2.50x", "10.0x", "1.00x"],
    "w_b": ["1.00", "0.003x", "FAILED 1/3", "not run", "0.50x"],
    "w_c": ["FAILED 1/2", "n/a", "n/a", "not run", "not run"],
}
want_rss = {
    "workload": ["mimalloc RSS KiB", "glibc", "hakmem", "jemalloc", "mi3"],
    "w_a": ["1000", "2.00x", "0.50x", "0.01x", "1.00x"],
    "w_b": ["100", "1000x", "FAILED 1/3", "not run", "3.00x"],
    "w_c": ["FAILED 1/2", "n/a", "n/a", "not run", "not run"],
}
for name, got, want in (("throughput", ops, want_ops), ("RSS", rss, want_rss)):
    check(got == want, f"report.md {name} table: got {got}, want {want}")
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
    texts = [t.firstChild.data if t.firstChild else ""
             for t in doc.getElementsByTagName("text")]
    alltext = "\n".join(texts)
    for s in ("w_a", "w_b", "w_c", "glibc 2.36", "hakmem 0.1.0 (abc1234)", "jemalloc 5.3.0-1",
              "mi3 (libmimalloc-3.4.3.so)", "hakmem FAILED 1/3", "jemalloc not run",
              "mimalloc FAILED 1/2", "higher is better", "lower is better", "1x", "0.01x",
              "100x", "1000x", "0.003x", "log scale"):
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
