#!/usr/bin/env python3
"""Chart the results of bench/run.sh as ratios to mimalloc.

usage: bench/chart.py [DIR] [--baseline NAME]   (DIR defaults to out/bench)

Reads DIR's results.tsv, meta.tsv and failures.tsv (through report.py's
reading functions) and writes:

- DIR/report.svg: two panels sharing the workload rows, each allocator's
  median ops/s / mimalloc's (higher is better) and median peak RSS /
  mimalloc's (lower is better), one horizontal bar per allocator on a log
  scale, drawn from the reference line at 1 (= mimalloc), its value at its
  end; the axes span at most 0.01x-100x, bars beyond are cut at the end;
- DIR/report.md: the machine and library versions, the chart (a relative
  link to report.svg) and the same ratios as two tables.

Medians over the runs as in report.py; an allocator with any failed run in a
workload reads FAILED k/N there (no bar), one that did not run there reads
"not run", and a workload where mimalloc failed or did not run has no ratios.
A ratio whose allocator or baseline had a run bounded by the time budget
(results.tsv's bounded column) has a * (after its value in the tables and at
its bar's end), and a footnote says what that means.
--baseline names another allocator to divide by (e.g. a BENCH_EXTRA one when
mimalloc was not run). Without any baseline results, report.md says so and no
SVG is written. run.sh calls this after report.py. Standard library only.
"""
import argparse
import math
import os
import sys
from xml.sax.saxutils import escape, quoteattr

sys.dont_write_bytecode = True  # no bench/__pycache__ in the tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402  (bench/report.py: reading and medians)

# Okabe-Ito colours (distinguishable with colour blindness); BENCH_EXTRA and
# other allocators take the rest in turn.
COLOURS = {"hakmem": "#D55E00", "glibc": "#0072B2", "jemalloc": "#009E73"}
SPARE = ["#E69F00", "#CC79A7", "#56B4E9", "#000000", "#999999", "#F0E442"]

SANS = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif"
MONO = "DejaVu Sans Mono, Liberation Mono, Consolas, Menlo, monospace"
# The axes stop at 10^CLIP_LO and 10^CLIP_HI: bars beyond end there, broken
# by two white strokes, with their value written after them.
CLIP_LO, CLIP_HI = -2, 2
CHAR_W = 0.61  # width of a monospace character, in ems (DejaVu Sans Mono: 0.602)


def fmt_ratio(r):
    """A ratio with about 3 significant digits: 3888x, 80.1x, 1.03x, 0.013x."""
    if r >= 100:
        return f"{r:.0f}x"
    if r >= 10:
        return f"{r:.1f}x"
    if r >= 0.1:
        return f"{r:.2f}x"
    return f"{r:.2g}x"


def meta_versions(meta):
    """{allocator: its version line}: run.sh writes one version line per
    allocator, in the order of the allocators line."""
    return dict(zip(report.meta_first(meta, "allocators", "").split(), meta.get("version", [])))


def cells(workloads, allocs, runs, med, base):
    """The ratio cells: {(workload, allocator): (kind, thr, rss, bounded)} for
    every allocator but base, with kind "ok" (thr and rss the ratios; bounded:
    whether a run of the allocator or of base was bounded by the budget),
    "failed" (thr is "FAILED k/N"), "not run", or "no base" (base failed or did
    not run in this workload: thr says which)."""
    out = {}
    for w in workloads:
        if (w, base) not in runs:
            bnote = f"{base} not run"
        elif med[(w, base)] is None:
            bnote = f"{base} {report.failed_runs(runs, (w, base))}"
        else:
            bnote = None
        for a in allocs:
            if a == base:
                continue
            if (w, a) not in runs:
                out[(w, a)] = ("not run", None, None, False)
            elif med[(w, a)] is None:
                out[(w, a)] = ("failed", report.failed_runs(runs, (w, a)), None, False)
            elif bnote:
                out[(w, a)] = ("no base", bnote, None, False)
            else:
                (o, s, _, _), (bo, bs, _, _) = med[(w, a)], med[(w, base)]
                bounded = bool(report.bounded_runs(runs, (w, a)) or
                               report.bounded_runs(runs, (w, base)))
                out[(w, a)] = ("ok", o / bo if bo else None, s / bs if bs else None, bounded)
    return out


# ---- SVG ------------------------------------------------------------------------


class Axis:
    """A log10 axis over whole decades [10^lo, 10^hi] mapped to [x0, x1]: the
    decades the values span, at least 0.1x-10x, at most 10^CLIP_LO-10^CLIP_HI
    (one realloc row at 20000x would otherwise squeeze every 1.1x to a few
    pixels); x() clamps the values beyond, clipped() tells which."""

    def __init__(self, values, x0, x1):
        vs = [v for v in values if v and v > 0]
        self.lo = max(CLIP_LO, min(-1, math.floor(math.log10(min(vs))) if vs else -1))
        self.hi = min(CLIP_HI, max(1, math.ceil(math.log10(max(vs))) if vs else 1))
        self.x0, self.x1 = x0, x1

    def clipped(self, v):
        return not 10.0 ** self.lo <= v <= 10.0 ** self.hi

    def x(self, v):
        d = min(max(math.log10(v), self.lo), self.hi)
        return self.x0 + (d - self.lo) / (self.hi - self.lo) * (self.x1 - self.x0)

    def ticks(self):
        """(value, label or None, major) for the decades, and 2 and 5 times
        each (labelled only when the axis spans 3 decades or fewer)."""
        few = self.hi - self.lo <= 3
        out = []
        for d in range(self.lo, self.hi + 1):
            for m in (1, 2, 5):
                if d == self.hi and m > 1:
                    break
                v = m * 10.0 ** d
                label = f"{v:g}x" if m == 1 or few else None
                out.append((v, label, m == 1))
        return out


class Svg:
    def __init__(self):
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", family=SANS, fill="#000",
             weight=None, extra=""):
        w = f' font-weight="{weight}"' if weight else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-family={quoteattr(family)} '
                 f'font-size="{size}" text-anchor="{anchor}" fill="{fill}"{w}{extra}>'
                 f'{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, extra=""):
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{stroke}" stroke-width="{width}"{extra}/>')

    def rect(self, x, y, w, h, fill, extra=""):
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                 f'fill="{fill}"{extra}/>')


def text_w(s, size):
    return len(s) * size * CHAR_W


def svg_chart(workloads, bars, cell, base, meta, base_version):
    """The chart as an SVG string. bars: the allocators drawn, in order."""
    colour = {}
    spare = iter(SPARE * 4)
    for a in bars:
        colour[a] = COLOURS.get(a) or next(spare)
    versions = meta_versions(meta)

    pad = 20
    width = 1200
    label_w = max([text_w(w, 12) for w in workloads] + [120]) + 14
    gap = 40  # between the panels
    panel_w = (width - 2 * pad - label_w - gap) / 2
    px0 = [pad + label_w, pad + label_w + panel_w + gap]
    inner = 44  # room for a value label beyond the axis' last decade

    bar_h, pitch, row_pad = 8, 10, 10
    row_h = len(bars) * pitch + row_pad

    svg = Svg()
    # Header: title, subtitle, legend.
    y = pad + 18
    first = lambda k: report.meta_first(meta, k)
    svg.text(pad, y, f"Each allocator as a ratio to {base}: median throughput and peak RSS "
             "per workload", size=18, weight="bold")
    y += 20
    sub = [f"{first('date')}; {first('runs')} interleaved runs per cell, medians; "
           f"1x = {base_version}",
           f"nproc {first('nproc')}, {first('kernel')}, CPU {first('cpu')}"]
    if len("; ".join(sub)) * 12 * 0.56 <= width - 2 * pad:  # fits on one line
        sub = ["; ".join(sub)]
    for k, s in enumerate(sub):
        svg.text(pad, y + 16 * k, s, size=12, fill="#333")
    y += 16 * (len(sub) - 1)
    y += 22
    x = pad
    for a in bars:
        v = versions.get(a, a)
        label = v if v == a or v.startswith(a + " ") else f"{a}: {v}"
        wdt = 16 + text_w(label, 11) + 22
        if x + wdt > width - pad:
            x, y = pad, y + 18
        svg.rect(x, y - 10, 12, 12, colour[a])
        svg.text(x + 16, y, label, size=11, family=MONO)
        x += wdt
    y += 30

    values = [[], []]
    for (kind, t, r, _) in cell.values():
        if kind == "ok":
            values[0].append(t)
            values[1].append(r)
    axes = [Axis(values[i], px0[i] + inner, px0[i] + panel_w - inner) for i in range(2)]
    titles = [(f"Throughput / {base}'s", "higher is better", "\u2190 slower", "faster \u2192"),
              (f"Peak RSS / {base}'s", "lower is better", "\u2190 less memory",
               "more memory \u2192")]

    # Panel titles, direction notes, top tick labels.
    for i, ax in enumerate(axes):
        cx = px0[i] + panel_w / 2
        title, better, left, right = titles[i]
        svg.text(cx, y, f"{title} ({better})", size=14, anchor="middle", weight="bold")
        x1 = ax.x(1)
        svg.text(x1 - 6, y + 18, left, size=11, anchor="end", fill="#555")
        svg.text(x1 + 6, y + 18, right, size=11, fill="#555")
    y += 40
    top = y
    bottom = top + len(workloads) * row_h

    def tick_labels(yy):
        for ax in axes:
            for v, label, _ in ax.ticks():
                if label:
                    svg.text(ax.x(v), yy, label, size=11, anchor="middle", fill="#333")

    tick_labels(top - 6)

    # Rows: shading, workload names.
    for k, w in enumerate(workloads):
        ry = top + k * row_h
        if k % 2 == 0:
            svg.rect(pad, ry, width - 2 * pad, row_h, "#f2f2f2")
        svg.text(px0[0] - 10, ry + row_h / 2 + 4, w, size=12, anchor="end", family=MONO)

    # Grid and the reference line.
    for ax in axes:
        for v, _, major in ax.ticks():
            if v == 1:
                continue
            svg.line(ax.x(v), top, ax.x(v), bottom, stroke="#bbb" if major else "#ddd")
    for i, ax in enumerate(axes):
        svg.line(ax.x0 - inner, bottom, ax.x1 + inner, bottom, stroke="#666")
        svg.line(ax.x0 - inner, top, ax.x1 + inner, top, stroke="#666")

    # Bars.
    clipped = [False, False]
    any_bounded = False
    for k, w in enumerate(workloads):
        ry = top + k * row_h + row_pad / 2 + (pitch - bar_h) / 2
        nobase = [cell[(w, a)][1] for a in bars if cell[(w, a)][0] == "no base"]
        if nobase:
            for ax in axes:
                svg.text(ax.x(1) + 6, top + k * row_h + row_h / 2 + 4,
                         f"no ratio: {nobase[0]}", size=11, fill="#c00000")
            continue
        for j, a in enumerate(bars):
            by = ry + j * pitch
            kind, t, r, bounded = cell[(w, a)]
            for i, ax in enumerate(axes):
                x1 = ax.x(1)
                if kind == "failed":
                    svg.text(x1 + 6, by + bar_h - 0.5, f"{a} {t}", size=9, family=MONO,
                             fill="#c00000", weight="bold", extra=' class="failed"')
                    continue
                if kind == "not run":
                    svg.text(x1 + 6, by + bar_h - 0.5, f"{a} not run", size=9, family=MONO,
                             fill="#777", extra=' class="notrun"')
                    continue
                v = (t, r)[i]
                if not v:
                    continue
                xv = ax.x(v)
                label = fmt_ratio(v) + ("*" if bounded else "")
                any_bounded = any_bounded or bounded
                tip = f"{w}: {a} {('throughput', 'peak RSS')[i]} / {base} = {label}"
                if bounded:
                    tip += " (over a run bounded by the time budget)"
                svg.add(f'<rect class="bar" x="{min(x1, xv):.1f}" y="{by:.1f}" '
                        f'width="{max(abs(xv - x1), 1):.1f}" height="{bar_h}" '
                        f'fill="{colour[a]}" data-workload={quoteattr(w)} '
                        f'data-allocator={quoteattr(a)} data-panel="{("ops", "rss")[i]}" '
                        f'data-ratio="{v:.6g}" data-bounded="{int(bounded)}">'
                        f'<title>{escape(tip)}</title></rect>')
                if ax.clipped(v):
                    clipped[i] = True
                    sx = xv - 9 if v > 1 else xv + 5
                    for dx in (0, 4):
                        svg.add(f'<path class="cut" d="M{sx + dx:.1f} {by + bar_h + 1:.1f} '
                                f'l3 {-bar_h - 2}" stroke="#fff" stroke-width="1.5"/>')
                if v >= 1:
                    svg.text(xv + 3, by + bar_h - 0.5, label, size=9, fill="#222")
                else:
                    svg.text(xv - 3, by + bar_h - 0.5, label, size=9, anchor="end", fill="#222")

    # Reference lines on top of the bars.
    for ax in axes:
        svg.line(ax.x(1), top - 2, ax.x(1), bottom + 2, stroke="#000", width=1.5)

    # Bottom: tick labels, axis labels.
    tick_labels(bottom + 16)
    for i, ax in enumerate(axes):
        cx = px0[i] + panel_w / 2
        what = ("median ops/s", "median peak RSS")[i]
        cut = "; // = bar cut at the axis' end" if clipped[i] else ""
        svg.text(cx, bottom + 34, f"{what} / {base}'s (log scale; 1x = {base}{cut})",
                 size=12, anchor="middle")
    height = bottom + 34 + pad
    if any_bounded:
        svg.text(pad, bottom + 56, f"* {bounded_footnote(base, meta)}", size=12,
                 extra=' class="bounded-note"')
        height += 22
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
            f'viewBox="0 0 {width} {height:.0f}">')
    return "\n".join(['<?xml version="1.0" encoding="UTF-8"?>', head,
                      f'<rect x="0" y="0" width="{width}" height="{height:.0f}" fill="#fff"/>']
                     + svg.parts + ["</svg>", ""])


def bounded_footnote(base, meta):
    """What a * on a ratio means."""
    return (f"the allocator's or {base}'s runs were bounded by the {report.budget_text(meta)} "
            "time budget (the full work did not fit): a rate and peak RSS over part of the work")


# ---- markdown -------------------------------------------------------------------


def md_table(workloads, bars, cell, med, runs, base, idx):
    """Ratio table for panel idx (0: throughput, 1: RSS), rendered by report.py."""
    absname = ("Mops/s", "RSS KiB")[idx]
    header = ["workload", f"{base} {absname}"] + bars
    rows = [header]
    for w in workloads:
        m = med.get((w, base))
        if (w, base) not in runs:
            b = "not run"
        elif m is None:
            b = report.failed_runs(runs, (w, base))
        else:
            b = report.mops(m[0]) if idx == 0 else f"{m[1]:.0f}"
            b += "*" if report.bounded_runs(runs, (w, base)) else ""
        row = [w, b]
        for a in bars:
            kind, t, r, bounded = cell[(w, a)]
            if kind == "ok":
                v = (t, r)[idx]
                row.append(fmt_ratio(v) + ("*" if bounded else "") if v else "n/a")
            elif kind == "failed":
                row.append(t)
            elif kind == "not run":
                row.append("not run")
            else:
                row.append("n/a")
        rows.append(row)
    return report.render(rows, ["l", "r"] + ["r"] * len(bars))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", nargs="?", default="out/bench")
    ap.add_argument("--baseline", default="mimalloc",
                    help="allocator the others are divided by (default mimalloc)")
    args = ap.parse_args()
    d, base = args.dir, args.baseline
    results, _, meta = report.load(d)
    if not results:
        print(f"chart.py: no results in {d}/results.tsv", file=sys.stderr)
        return 1
    workloads, allocs, _, runs, med = report.summarize(results)
    md_path, svg_path = os.path.join(d, "report.md"), os.path.join(d, "report.svg")
    versions = meta_versions(meta)
    base_version = versions.get(base, base)

    out = [f"# hakmem benchmark: ratios to {base} ({report.meta_first(meta, 'date')})", ""]
    out += report.machine_lines(meta)
    out.append(f"- {report.meta_first(meta, 'runs')} interleaved runs per cell (bench/run.sh); "
               f"each ratio is an allocator's median over the runs / {base_version}'s median")
    out.append("- FAILED k/N: k of the N runs failed (no ratio; reasons in table.md and "
               "failures.tsv); not run: that allocator did not run that workload")
    if any(report.bounded_runs(runs, key) for key in runs):
        out.append(f"- \\*: {bounded_footnote(base, meta)}; table.md lists the bounded cells "
                   f"(on {base}'s own column: its runs were bounded)")
    out.append("")
    bars = [a for a in allocs if a != base]
    if base not in allocs or not bars:
        why = f"no {base} results" if base not in allocs else f"only {base} was run"
        out.append(f"**{why} in results.tsv: no ratios to chart** (`bench/chart.py --baseline "
                   "NAME` divides by another allocator).")
        if os.path.exists(svg_path):
            os.remove(svg_path)
        with open(md_path, "w") as f:
            f.write("\n".join(out) + "\n")
        print(f"chart.py: {why}; wrote {md_path} without a chart", file=sys.stderr)
        return 0

    cell = cells(workloads, allocs, runs, med, base)
    svg = svg_chart(workloads, bars, cell, base, meta, base_version)
    with open(svg_path, "w") as f:
        f.write(svg)
    out.append(f"![Throughput and peak RSS of each allocator as a ratio to {base}, "
               f"per workload, log scale](report.svg)")
    out.append("")
    out.append(f"## Throughput / {base} (higher is better)")
    out.append("")
    out.append(f"Median ops/s / {base}'s; the {base} column is its median in millions of ops/s.")
    out.append("")
    out.append(md_table(workloads, bars, cell, med, runs, base, 0))
    out.append("")
    out.append(f"## Peak RSS / {base} (lower is better)")
    out.append("")
    out.append(f"Median peak RSS / {base}'s; the {base} column is its median in KiB.")
    out.append("")
    out.append(md_table(workloads, bars, cell, med, runs, base, 1))
    with open(md_path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"chart.py: wrote {md_path} and {svg_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
