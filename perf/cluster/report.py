#!/usr/bin/env python3
"""Tables for perf/cluster/run.sh: medians over repeats, spread, % of the NIC ceiling, measured/predicted."""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

out = Path(sys.argv[1])
rows = defaultdict(list)  # (label, size) -> [(time_us, predicted_us, plan)]
for line in (out / "times.txt").read_text().splitlines():
    label, size, _rep, time, pred, plan = line.split()
    rows[(label, int(size))].append((float(time), None if pred == "-" else float(pred), plan))


def median(label, size):
    values = rows.get((label, size))
    if not values:
        return None, None, None, None
    times = [v[0] for v in values]
    preds = [v[1] for v in values if v[1]]
    return statistics.median(times), (min(times), max(times)), (statistics.median(preds) if preds else None), values[0][2]


def goodput_gbps(cluster_file):
    host = json.loads((out / cluster_file).read_text())["hosts"][0]
    return sum(n.get("goodput_gbps", n["gbps"]) for n in host["nics"]), host["nics"]


def ms(us):
    return f"{us / 1000:.1f}"


print(f"# Emulated cluster results ({out.name})\n")
size = 64 << 20
total, nics = goodput_gbps("a-cluster.json") if (out / "a-cluster.json").exists() else (1, [])
ceiling_us = size * 8 / (total * 1e9) * 1e6
print("## A. 2 hosts x 2 ranks, 64 MiB all-reduce\n")
print("NICs per host (calibrated TCP goodput, alpha): " +
      ", ".join(f"{n['name']} {n.get('goodput_gbps', n['gbps'])} Gbit/s, {n.get('alpha_us', '?')} us" for n in nics) +
      f". Each host must send S = 64 MiB each way, so the ceiling is S / {total:.3f} Gbit/s = {ms(ceiling_us)} ms.\n")
print("| configuration | plan | median ms | min-max ms | algbw MB/s | % of ceiling | vs OpenMPI both NICs | predicted ms | measured/predicted |")
print("|---|---|---|---|---|---|---|---|---|")
mpi_both, *_ = median("a.openmpi.both-nics", size)
mpi_both = mpi_both or float("nan")
for label in ["a.topoccl.default", "a.topoccl.synthesized", "a.topoccl.ring-both-nics", "a.topoccl.ring-nicA",
              "a.openmpi.both-nics", "a.openmpi.nicA"]:
    t, spread, pred, plan = median(label, size)
    if t is None:
        continue
    predicted = ms(pred) if pred else "-"
    ratio = f"{t / pred:.3f}" if pred else "-"
    print(f"| {label[2:]} | {plan} | {ms(t)} | {ms(spread[0])}-{ms(spread[1])} | {size / t:.1f} | "
          f"{100 * ceiling_us / t:.1f}% | {mpi_both / t:.2f}x | {predicted} | {ratio} |")

if not (out / "b-cluster.json").exists():
    sys.exit(0)
print("\n## B. 4 hosts x 2 ranks\n")
total_b, _ = goodput_gbps("b-cluster.json")
print(f"Calibrated goodput per host: {total_b:.3f} Gbit/s over both NICs.\n")
print("| collective | size | configuration | plan | median ms | min-max ms | predicted ms | measured/predicted | vs flat ring on NIC A | vs OpenMPI both NICs |")
print("|---|---|---|---|---|---|---|---|---|---|")
for coll in ["all_reduce", "all_gather"]:
    for size in [16 << 20, 64 << 20]:
        flat, *_ = median(f"b.{coll}.topoccl.flat-ring-nicA", size)
        mpi, *_ = median(f"b.{coll}.openmpi.both-nics", size)
        for variant in ["topoccl.default", "topoccl.synthesized", "topoccl.flat-ring-nicA", "openmpi.both-nics"]:
            t, spread, pred, plan = median(f"b.{coll}.{variant}", size)
            if t is None:
                continue
            print(f"| {coll} | {size >> 20} MiB | {variant} | {plan} | {ms(t)} | {ms(spread[0])}-{ms(spread[1])} | "
                  f"{ms(pred) if pred else '-'} | {f'{t / pred:.3f}' if pred else '-'} | "
                  f"{f'{flat / t:.2f}x' if flat else '-'} | {f'{mpi / t:.2f}x' if mpi else '-'} |")
