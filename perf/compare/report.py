#!/usr/bin/env python3
"""Turn one run.sh result directory into table.md and PNG plots.

    report.py OUTDIR [--lat-max BYTES] [--no-plots]

Reads OUTDIR/raw/<system>__np<N>__<coll>__<band>__r<rep>.csv (the CSV printed by the perf binaries:
collective,nranks,bytes,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,...),
OUTDIR/ceilings.csv, OUTDIR/meta.txt, OUTDIR/runs.tsv and OUTDIR/logs/*.log. busbw is recomputed from
bytes and the out-of-place time with nccl-tests' factors (printed bandwidths may be rounded), so every
system is treated alike. Statistics are over repeats: median, and [min-max] when there are several.
Ratios are topoccl / other: busbw ratio > 1 and latency ratio < 1 mean topoccl is faster.
"""
import argparse
import csv
import glob
import math
import os
import re
import statistics
import sys
import textwrap
from collections import Counter, defaultdict

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"]
# system key -> (label, colour, marker, linestyle); unknown keys get their own name and the next colour
SYSTEMS = {
    "topoccl": ("topoccl", "C0", "o", "-"),
    "mpi": ("OpenMPI (btl vader,self)", "C1", "s", "-"),
    "gloo": ("Gloo (TCP loopback)", "C2", "^", "-"),
    "topoccl-tcp": ("topoccl TCP (NCCL_SHM_DISABLE=1)", "C0", "o", "--"),
    "mpi-tcp": ("OpenMPI (btl tcp,self)", "C1", "s", "--"),
}
MAIN_BASE, TCP_BASE = "topoccl", "topoccl-tcp"
NAME_RE = re.compile(r"^(?P<sys>.+?)__np(?P<np>\d+)__(?P<coll>[a-z_]+)__(?P<band>[a-z]+)__r(?P<rep>\d+)\.csv$")


def bus_factor(coll, n):
    if coll == "all_reduce":
        return 2.0 * (n - 1) / n
    if coll == "broadcast":
        return 1.0
    return (n - 1) / n


def label(sys_):
    return SYSTEMS.get(sys_, (sys_,))[0]


def human(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def fnum(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a >= 0.01:
        return f"{x:.3f}"
    return f"{x:.2g}"


def stats(vals):
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    if not vals:
        return None
    return statistics.median(vals), min(vals), max(vals), len(vals)


def cell(st):
    if st is None:
        return "—"
    med, lo, hi, n = st
    return fnum(med) if n == 1 else f"{fnum(med)} [{fnum(lo)}–{fnum(hi)}]"


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and not math.isnan(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


class Data:
    def __init__(self, out):
        self.out = out
        # (sys, np, coll, bytes) -> {rep: row}
        self.rows = defaultdict(dict)
        self.bad_files = []
        for path in sorted(glob.glob(os.path.join(out, "raw", "*.csv"))):
            m = NAME_RE.match(os.path.basename(path))
            if not m:
                self.bad_files.append(os.path.basename(path))
                continue
            sys_, np_, rep = m["sys"], int(m["np"]), int(m["rep"])
            with open(path, errors="replace") as f:
                for line in f:
                    parts = line.strip().split(",")
                    if len(parts) != 15 or parts[0] not in COLLS:
                        continue  # header, comments, library logging
                    try:
                        r = dict(coll=parts[0], np=int(parts[1]), bytes=int(parts[2]), count=int(parts[3]),
                                 oop_us=float(parts[7]), oop_busbw_printed=float(parts[9]), oop_wrong=int(parts[10]),
                                 ip_us=float(parts[11]), ip_wrong=int(parts[14]))
                    except ValueError:
                        continue
                    if r["bytes"] <= 0 or r["np"] != np_:
                        continue
                    self.rows[(sys_, np_, r["coll"], r["bytes"])][rep] = r
        self.systems = sorted({k[0] for k in self.rows}, key=lambda s: (list(SYSTEMS).index(s) if s in SYSTEMS else 99, s))
        self.nps = sorted({k[1] for k in self.rows})

    def sizes(self, systems, np_, coll):
        return sorted({k[3] for k in self.rows if k[0] in systems and k[1] == np_ and k[2] == coll})

    def per_rep(self, sys_, np_, coll, b, what, place="oop"):
        d = self.rows.get((sys_, np_, coll, b), {})
        out = {}
        for rep, r in d.items():
            t = r[f"{place}_us"]
            if t <= 0:
                continue
            out[rep] = t if what == "time" else b / 1e3 / t * bus_factor(coll, np_)
        return out

    def st(self, sys_, np_, coll, b, what, place="oop"):
        return stats(list(self.per_rep(sys_, np_, coll, b, what, place).values()))

    def ratio(self, base, other, np_, coll, b, what):
        """(ratio of medians, min paired ratio, max paired ratio, pairs) or None"""
        sb, so = self.st(base, np_, coll, b, what), self.st(other, np_, coll, b, what)
        if not sb or not so or so[0] == 0:
            return None
        pb, po = self.per_rep(base, np_, coll, b, what), self.per_rep(other, np_, coll, b, what)
        paired = [pb[r] / po[r] for r in pb if r in po and po[r] > 0]
        if not paired:
            return sb[0] / so[0], sb[0] / so[0], sb[0] / so[0], 1
        return sb[0] / so[0], min(paired), max(paired), len(paired)


def read_meta(out):
    p = os.path.join(out, "meta.txt")
    return open(p).read().strip() if os.path.exists(p) else ""


def read_ceilings(out):
    p = os.path.join(out, "ceilings.csv")
    if not os.path.exists(p):
        return []
    with open(p) as f:
        return [r for r in csv.DictReader(f) if r.get("ceiling")]


def ceiling_value(ceil, what, variant, threads=None):
    for r in ceil:
        if r["ceiling"] == what and r["variant"] == variant and (threads is None or int(r["threads"]) == threads):
            return float(r["median"])
    return None


def log_notes(out):
    notes = []
    for path in sorted(glob.glob(os.path.join(out, "logs", "*.log"))):
        with open(path, errors="replace") as f:
            for line in f:
                if "stopping after" in line or "skip gloo" in line:
                    notes.append(f"{os.path.basename(path)[:-4]}: {line.strip().lstrip('# ')}")
    return notes


def failed_runs(out):
    p = os.path.join(out, "runs.tsv")
    bad = []
    if os.path.exists(p):
        with open(p) as f:
            for r in csv.DictReader(f, delimiter="\t"):
                if r["rc"] != "0":
                    bad.append(f"{r['system']} np={r['np']} {r['coll']} band {r['band']} rep {r['rep']}: exit {r['rc']}"
                               f" (logs/{r['system']}__np{r['np']}__{r['coll']}__{r['band']}__r{r['rep']}.log)")
    return bad


def comparison_table(d, systems, base, np_, coll, lat_max):
    systems = [s for s in systems if any(k[0] == s and k[1] == np_ and k[2] == coll for k in d.rows)]
    if not systems:
        return []
    others = [s for s in systems if s != base] if base in systems else []
    hdr = ["size"] + [f"{label(s)} busbw GB/s" for s in systems]
    hdr += [f"busbw {base}/{s}" for s in others]
    hdr += [f"{label(s)} time µs" for s in systems]
    hdr += [f"latency {base}/{s}" for s in others]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---:|" * len(hdr)]
    for b in d.sizes(systems, np_, coll):
        row = [human(b)]
        row += [cell(d.st(s, np_, coll, b, "busbw")) for s in systems]
        row += [cell(d.ratio(base, s, np_, coll, b, "busbw")) for s in others]
        row += [cell(d.st(s, np_, coll, b, "time")) for s in systems]
        row += [cell(d.ratio(base, s, np_, coll, b, "time")) if b <= lat_max else "" for s in others]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def summary_table(d, systems, base, nps, colls, lat_max):
    """headline numbers per (np, coll): latency at the smallest and busbw at the largest size"""
    systems = [s for s in systems if any(k[0] == s for k in d.rows)]
    others = [s for s in systems if s != base] if base in systems else []
    hdr = ["ranks", "collective", "smallest size", "largest size"]
    hdr += [f"{label(s)}: µs @ smallest / busbw @ largest" for s in systems]
    for s in others:
        hdr += [f"{base}/{s}: latency, geomean ≤ {human(lat_max)}", f"{base}/{s}: busbw, geomean > {human(lat_max)}"]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---|---|" + "---:|" * (len(hdr) - 2)]
    for np_ in nps:
        for coll in colls:
            sizes = d.sizes(systems, np_, coll)
            if not sizes:
                continue
            lo, hi = sizes[0], sizes[-1]
            row = [str(np_), coll, human(lo), human(hi)]
            for s in systems:
                t, bw = d.st(s, np_, coll, lo, "time"), d.st(s, np_, coll, hi, "busbw")
                row.append(f"{fnum(t[0]) if t else '—'} / {fnum(bw[0]) if bw else '—'}")
            for s in others:
                lat = [d.ratio(base, s, np_, coll, b, "time") for b in sizes if b <= lat_max]
                bw = [d.ratio(base, s, np_, coll, b, "busbw") for b in sizes if b > lat_max]
                gl, gb = geomean([x[0] for x in lat if x]), geomean([x[0] for x in bw if x])
                row += [fnum(gl), fnum(gb)]
            lines.append("| " + " | ".join(row) + " |")
    return lines


# In place: OpenMPI's mpi_perf passes MPI_IN_PLACE (broadcast has one buffer in MPI, so it is left out); Gloo's
# in-place columns repeat its one form, so it is left out too. Frameworks reduce gradients in place, so a
# placement that runs far slower than the other shows here.
IN_PLACE_COLLS = ["all_reduce", "all_gather", "reduce_scatter", "alltoall"]


def in_place_table(d, base, other, np_):
    colls = [c for c in IN_PLACE_COLLS if d.sizes([base], np_, c) and d.sizes([other], np_, c)]
    if not colls:
        return []
    hdr = ["size"] + [f"{c}: {base} / {label(other).split(' (')[0]} µs (speedup); {base} in/out of place" for c in colls]
    lines = ["| " + " | ".join(hdr) + " |", "|" + "---:|" * len(hdr)]
    for b in sorted(set().union(*(d.sizes([base, other], np_, c) for c in colls))):
        row = [human(b)]
        for c in colls:
            mine, theirs = d.st(base, np_, c, b, "time", "ip"), d.st(other, np_, c, b, "time", "ip")
            mine_oop = d.st(base, np_, c, b, "time")
            if not mine or not theirs:
                row.append("—")
                continue
            text = f"{fnum(mine[0])} / {fnum(theirs[0])} ({fnum(theirs[0] / mine[0])}x)"
            if mine_oop and mine_oop[0] > 0:
                text += f"; {fnum(mine[0] / mine_oop[0])}"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def correctness(d):
    per = defaultdict(lambda: [0, 0, 0, 0])  # rows, checked, wrong rows, wrong elements
    bad = []
    for (s, np_, coll, b), reps in d.rows.items():
        for rep, r in reps.items():
            for w in (r["oop_wrong"], r["ip_wrong"]):
                per[s][0] += 1
                if w >= 0:
                    per[s][1] += 1
                if w > 0:
                    per[s][2] += 1
                    per[s][3] += w
                    bad.append(f"{s} np={np_} {coll} {human(b)} rep {rep}: {w} wrong")
    lines = ["| system | results (oop + ip) | checked | wrong results | wrong elements |", "|---|---:|---:|---:|---:|"]
    for s in d.systems:
        a = per[s]
        lines.append(f"| {label(s)} | {a[0]} | {a[1]} | {a[2]} | {a[3]} |")
    return lines, bad


def plot(d, out, systems, base, nps, colls, fname, title, ceil, tcp):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = [(np_, c) for np_ in nps for c in colls if any(k[1] == np_ and k[2] == c and k[0] in systems for k in d.rows)]
    if not panels:
        return None
    ncol = len(panels)
    fig, axes = plt.subplots(2, ncol, figsize=(max(6.5, 4.2 * ncol), 7.6), squeeze=False)
    xfmt = FuncFormatter(lambda v, _: human(int(v)).replace(" ", "").replace("iB", "") if v >= 1 else "")
    extra = 0
    for j, (np_, coll) in enumerate(panels):
        for i, what in enumerate(("busbw", "time")):
            ax = axes[i][j]
            for s in systems:
                xs, med, lo, hi = [], [], [], []
                for b in d.sizes([s], np_, coll):
                    st = d.st(s, np_, coll, b, what)
                    if st and st[0] > 0:
                        xs.append(b), med.append(st[0]), lo.append(st[1]), hi.append(st[2])
                if not xs:
                    continue
                lab, col, mk, ls = SYSTEMS.get(s, (s, f"C{3 + extra}", "d", "-"))
                ax.plot(xs, med, marker=mk, linestyle=ls, color=col, label=lab, markersize=4)
                if any(h != l for h, l in zip(hi, lo)):
                    ax.fill_between(xs, lo, hi, color=col, alpha=0.18, linewidth=0)
            if what == "busbw":
                ref = ceiling_value(ceil, "tcp", "bidi_per_direction") if tcp else ceiling_value(ceil, "membw", "memcpy", 1)
                if ref:
                    ax.axhline(ref, color="grey", linestyle=":", linewidth=1,
                               label="loopback TCP, per direction both ways" if tcp else "memcpy, 1 thread")
            else:
                ref = ceiling_value(ceil, "tcp", "rtt8") if tcp else ceiling_value(ceil, "shm", "cacheline_one_way")
                if ref:
                    ax.axhline(ref / 2 if tcp else ref, color="grey", linestyle=":", linewidth=1,
                               label="TCP 8 B one way (rtt/2)" if tcp else "shm cache-line handoff, one way")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(xfmt)
            ax.grid(True, which="major", alpha=0.3)
            ax.set_xlabel("size (nccl-tests size, bytes)")
            ax.set_ylabel("busbw, GB/s" if what == "busbw" else "time per call, µs")
            ax.set_title(f"{coll}, {np_} ranks", fontsize=10)
            ax.legend(fontsize=7, loc="best")
    fig.suptitle("\n".join(textwrap.wrap(title, 70 if ncol < 3 else 160)), fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, fname)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return fname


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--lat-max", type=int, default=64 << 10)
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    out, lat_max = a.out, a.lat_max
    d = Data(out)
    ceil = read_ceilings(out)
    main_sys = [s for s in d.systems if not s.endswith("-tcp")]
    tcp_sys = [s for s in d.systems if s.endswith("-tcp")]
    if tcp_sys and "gloo" in d.systems:
        tcp_sys.append("gloo")  # Gloo only has TCP
    tcp_colls = [c for c in COLLS if any(k[0] in tcp_sys and k[0] != "gloo" and k[2] == c for k in d.rows)]
    reps = sorted({rep for v in d.rows.values() for rep in v})
    # run.sh's SMALL_REPEAT gives the small band more repeats than the rest: say how many each part had.
    counts = Counter(len(v) for v in d.rows.values())
    fewest = min(counts) if counts else 0
    more = sorted({(k[0], len(v)) for k, v in d.rows.items() if len(v) > fewest})
    more_text = ""
    if more:
        by_count = defaultdict(list)
        for sys_, n in more:
            by_count[n].append(SYSTEMS[sys_][0].split(" (")[0] if sys_ in SYSTEMS else sys_)
        more_text = " (" + "; ".join(f"{n} for {', '.join(names)} at the sizes of the small band, SMALL_REPEAT"
                                      for n, names in sorted(by_count.items())) + ")"

    md = [f"# topoccl vs OpenMPI vs Gloo — {os.path.basename(os.path.abspath(out))}", ""]
    md += ["```", read_meta(out), "```", ""]
    md += [f"nccl-tests conventions: size = max(send, recv) bytes per rank; time = mean per call over -n calls, "
           f"averaged over ranks; busbw = size/time × 2(n−1)/n (all_reduce), (n−1)/n (all_gather, reduce_scatter, "
           f"alltoall), 1 (broadcast); out-of-place numbers. Cells: median over {fewest} repeat(s){more_text}"
           + (" [min–max]" if len(reps) > 1 else "") + f"; the systems ran interleaved in every repeat. "
           f"Ratios are {MAIN_BASE}/other (busbw > 1 and latency < 1: topoccl faster), the ratio of the medians"
           + (" [min–max of the per-repeat ratios]" if len(reps) > 1 else "") + f"; latency ratios up to {human(lat_max)}.", ""]
    if MAIN_BASE not in d.systems:
        md += [f"**topoccl was not measured** (no `build/perf/all_reduce_perf`, or all its runs failed): the tables "
               f"show the reference systems only.", ""]
    if ceil:
        md += ["## Ceilings of this machine", "", "| probe | variant | threads | best | median | unit |",
               "|---|---|---:|---:|---:|---|"]
        md += [f"| {r['ceiling']} | {r['variant']} | {r['threads']} | {r['best']} | {r['median']} | {r['unit']} |" for r in ceil]
        md += ["", "membw: arrays of MEMBW_MIB (256 MiB unless set), memcpy and stream (non-temporal stores) count 2×S bytes, "
               "acc (a += b) 3×S; tcp: 127.0.0.1, TCP_NODELAY; shm: one cache line handed between two processes; "
               "switch: two processes on one CPU yielding a turn to each other, one hand-off; copies: an out-of-place "
               "all-to-all's or all-gather's copies alone on two threads, us per call (variant coll-npN-bytes; "
               "`targets.py` sets them beside the rows that miss).", ""]
    lines, bad = correctness(d)
    md += ["## Correctness", ""] + lines + [""]
    md += (["**Wrong results:**", ""] + [f"- {x}" for x in bad] + [""]) if bad else ["Every checked result was exact (0 wrong elements).", ""]
    md += ["## Summary", "", f"Median µs at the smallest and busbw (GB/s) at the largest size; geometric means of the "
           f"{MAIN_BASE}/other ratios over the sizes."
           , ""]
    md += summary_table(d, main_sys, MAIN_BASE, d.nps, COLLS, lat_max) + [""]
    if tcp_colls:
        md += summary_table(d, tcp_sys, TCP_BASE, d.nps, tcp_colls, lat_max) + [""]
    for np_ in d.nps:
        md += [f"## {np_} ranks", ""]
        for coll in COLLS:
            t = comparison_table(d, main_sys, MAIN_BASE, np_, coll, lat_max)
            if t:
                md += [f"### {coll}, {np_} ranks", ""] + t + [""]
    if MAIN_BASE in d.systems and "mpi" in d.systems:
        md += ["## In place", "", f"Time per call in place, medians: {MAIN_BASE} / OpenMPI (MPI_IN_PLACE), the speedup (OpenMPI's "
               f"time over {MAIN_BASE}'s: > 1, {MAIN_BASE} faster), and {MAIN_BASE}'s in-place time over its out-of-place "
               f"time. Broadcast is left out (MPI_Bcast has one buffer), and Gloo (one form only).", ""]
        for np_ in d.nps:
            t = in_place_table(d, MAIN_BASE, "mpi", np_)
            if t:
                md += [f"### In place, {np_} ranks", ""] + t + [""]
    if tcp_colls:
        md += ["## TCP only: topoccl with NCCL_SHM_DISABLE=1, OpenMPI with --mca btl tcp,self, Gloo", ""]
        for np_ in d.nps:
            for coll in tcp_colls:
                t = comparison_table(d, tcp_sys, TCP_BASE, np_, coll, lat_max)
                if t:
                    md += [f"### {coll} over TCP, {np_} ranks", ""] + t + [""]
    notes = log_notes(out) + failed_runs(out) + [f"unrecognised file raw/{f}" for f in d.bad_files]
    if notes:
        md += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]

    pngs = []
    if not a.no_plots:
        try:
            for np_ in d.nps:
                p = plot(d, out, main_sys, MAIN_BASE, [np_], COLLS, f"np{np_}.png",
                         f"{np_} ranks: busbw (top) and time per call (bottom); median, band = min–max over repeats", ceil, False)
                if p:
                    pngs.append(p)
            if tcp_colls:
                p = plot(d, out, tcp_sys, TCP_BASE, d.nps, tcp_colls, "tcp.png",
                         "TCP only: topoccl (NCCL_SHM_DISABLE=1) vs OpenMPI (btl tcp,self) vs Gloo", ceil, True)
                if p:
                    pngs.append(p)
        except ImportError as e:
            print(f"report.py: no plots ({e}); install python3-matplotlib", file=sys.stderr)
    if pngs:
        md += ["## Plots", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(md))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
