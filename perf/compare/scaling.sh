#!/usr/bin/env bash
# How all-reduce cost grows with the rank count: topoccl (and OpenMPI, for reference) at a small and a
# large size on 2, 3, 4, 6 and 8 ranks of this machine, interleaved, repeated; medians in a table.
#
#   perf/compare/scaling.sh                     4 KiB and 64 MiB, ranks "2 3 4 6 8", 3 repeats
#   RANKS="2 4" REPEAT=1 SMALL=8 LARGE=1M perf/compare/scaling.sh
#
# Environment: BUILD [build] (topoccl build dir), COMPARE_BIN [build/compare] (mpi_perf, built by run.sh or
# `make -C perf/compare`), RANKS, REPEAT, SMALL [4K], LARGE [64M], SYSTEMS ["topoccl mpi"], MALLOC_ENV (as in
# run.sh), OUT [perf/compare/results/scaling-<UTC timestamp>]. Writes raw/*.csv, runs.tsv and table.md.
#
# The step count is the critical path in message rounds of the plan topoccl ran (all_reduce_perf --predict
# names it in each row): direct 1 round (each rank receives n-1 messages), recursive doubling log2 P rounds
# (P the largest power of two <= n, plus 2 when n is not a power of two: fold in, fold out), halving-doubling
# 2 log2 P (+2), ring 2(n-1), reduce_scatter_allgather 2 (n-1 messages in each). With more ranks than the
# machine's cores the ranks share them, so the large-size time is also given against a CPU model: every rank
# copies (or reduces) 2(n-1)/n x size, and the cores do that work in turn. At the small size, sharing makes every call wait for the core's other ranks to be switched in:
# both benchmarks count their processes' context switches in the timed loop (--switches), given per call and
# core, and the time divided by them (what one switch costs, plus the call's own work).
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT" || exit 2

BUILD=${BUILD:-build}
COMPARE_BIN=${COMPARE_BIN:-build/compare}
RANKS=${RANKS:-"2 3 4 6 8"}
REPEAT=${REPEAT:-3}
SMALL=${SMALL:-4K}
LARGE=${LARGE:-64M}
SYSTEMS=${SYSTEMS:-"topoccl mpi"}
MPIRUN_FLAGS=${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe}
MALLOC_ENV=${MALLOC_ENV-MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736}
OUT=${OUT:-perf/compare/results/scaling-$(date -u +%Y%m%dT%H%M%SZ)}
# REPORT_ONLY=DIR: rewrite DIR/table.md from DIR/raw without running anything.
if [ -n "${REPORT_ONLY:-}" ]; then OUT=$REPORT_ONLY; REPEAT=0; fi
ENVX=()
for kv in $MALLOC_ENV; do ENVX+=(-x "$kv"); done

[ -n "${REPORT_ONLY:-}" ] || [ -x "$BUILD/perf/all_reduce_perf" ] || { echo "scaling.sh: $BUILD/perf/all_reduce_perf missing (cmake --build $BUILD)" >&2; exit 2; }
if [ -z "${REPORT_ONLY:-}" ] && [[ " $SYSTEMS " == *" mpi "* ]] && [ ! -x "$COMPARE_BIN/mpi_perf" ]; then
  make -s -C perf/compare BIN="$ROOT/$COMPARE_BIN" "$ROOT/$COMPARE_BIN/mpi_perf" >/dev/null || { echo "scaling.sh: cannot build mpi_perf" >&2; exit 2; }
fi
mkdir -p "$OUT/raw" "$OUT/logs"
[ -n "${REPORT_ONLY:-}" ] || printf 'system\tranks\tsize\trepeat\texit\tseconds\n' > "$OUT/runs.tsv"
[ -n "${REPORT_ONLY:-}" ] || {
  echo "date: $(date -u +%FT%TZ)"; echo "host: $(uname -n) $(uname -r), $(nproc) cores"
  echo "command: RANKS=\"$RANKS\" REPEAT=$REPEAT SMALL=$SMALL LARGE=$LARGE perf/compare/scaling.sh"
  echo "topoccl: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"; echo "MALLOC_ENV: $MALLOC_ENV"
} > "$OUT/meta.txt"

launch() {  # system ranks size repeat
  local system=$1 np=$2 size=$3 rep=$4 iters warm cmd
  if [ "$size" = "$SMALL" ]; then iters=2000; warm=50; else iters=5; warm=2; fi
  case $system in
    topoccl) cmd=("$BUILD/perf/all_reduce_perf" -b "$size" -e "$size" -n "$iters" -w "$warm" -c 1 -d float -o sum --csv --predict --switches) ;;
    mpi) cmd=(--mca btl "vader,self" "$COMPARE_BIN/mpi_perf" --coll all_reduce -b "$size" -e "$size" -n "$iters" -w "$warm" -c 1 --csv --switches) ;;
    *) echo "scaling.sh: unknown system $system" >&2; return 1 ;;
  esac
  local name="${system}__np${np}__${size}__r${rep}" start end rc
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout 900 mpirun $MPIRUN_FLAGS "${ENVX[@]}" -np "$np" "${cmd[@]}" > "$OUT/raw/$name.csv" 2> "$OUT/logs/$name.log"
  rc=$?
  end=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\t%s\t%.1f\n' "$system" "$np" "$size" "$rep" "$rc" "$(echo "$end - $start" | bc)" >> "$OUT/runs.tsv"
  echo "  $name: exit $rc" >&2
}

for rep in $(seq 1 "$REPEAT"); do
  for np in $RANKS; do
    for size in "$SMALL" "$LARGE"; do
      for system in $SYSTEMS; do launch "$system" "$np" "$size" "$rep"; done
    done
  done
done

python3 - "$OUT" "$(nproc)" <<'PY' | tee "$OUT/table.md"
import csv, glob, math, os, statistics, sys
out, cores = sys.argv[1], int(sys.argv[2])
rows = {}  # (system, np, bytes) -> [(time_us, wrong)]
plans = {}
switches = {}
for path in glob.glob(os.path.join(out, "raw", "*.csv")):
    system = os.path.basename(path).split("__")[0]
    with open(path) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            if not r.get("oop_time_us"):
                continue
            rows.setdefault((system, int(r["nranks"]), int(r["bytes"])), []).append(
                (float(r["oop_time_us"]), int(float(r["oop_wrong"] or 0))))
            if r.get("oop_switches_per_call"):  # --switches; runs before it had none
                switches.setdefault((system, int(r["nranks"]), int(r["bytes"])), []).append(float(r["oop_switches_per_call"]))
            if r.get("oop_plan"):  # the plan topoccl ran (--predict); runs before it had none
                plans[(int(r["nranks"]), int(r["bytes"]))] = r["oop_plan"]
def med(key):
    v = rows.get(key)
    return (statistics.median(t for t, _ in v), min(t for t, _ in v), max(t for t, _ in v), sum(w for _, w in v)) if v else None
ranks = sorted({k[1] for k in rows})
sizes = sorted({k[2] for k in rows})
NAMES = {"recursive_doubling": "rd", "halving_doubling": "hd", "reduce_scatter_allgather": "rsag"}
def algorithm(n, nbytes):
    if (n, nbytes) in plans:  # what topoccl said it ran
        return NAMES.get(plans[(n, nbytes)], plans[(n, nbytes)])
    # older runs: the selection table of their day (src/algorithms/selection.cpp)
    if nbytes < 64 * 1024:
        return "direct" if 3 <= n <= 8 else "rd"
    return "ring"
def steps(n, nbytes):
    a = algorithm(n, nbytes)
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n; other ranks fold in first and out last
    fold = 2 if p != n else 0
    if a == "direct":
        return 1
    if a == "rd":
        return int(math.log2(p)) + fold
    if a == "hd":  # reduce-scatter by halving, all-gather by doubling
        return 2 * int(math.log2(p)) + fold
    if a == "rsag":  # direct reduce-scatter, then direct all-gather: two rounds of n-1 messages each
        return 2
    return 2 * (n - 1)
def messages(n, nbytes):  # messages each rank receives
    a = algorithm(n, nbytes)
    return n - 1 if a == "direct" else 2 * (n - 1) if a == "rsag" else steps(n, nbytes)
def switches_per_core(system, n, nbytes):  # medians over repeats, all ranks' switches / the cores they share
    v = switches.get((system, n, nbytes))
    return statistics.median(v) / min(n, cores) if v else None
wrong = sum(v[3] for v in (med(k) for k in rows) if v)
print(f"# all-reduce vs ranks ({cores} cores; float sum, out of place; medians over repeats, [min-max])\n")
print(f"Wrong elements over all runs: {wrong}.\n")
for nbytes in sizes:
    label = f"{nbytes // 1024} KiB" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"
    small = nbytes < 64 * 1024
    print(f"## {label}\n")
    base = med(("topoccl", ranks[0], nbytes))
    if small:
        print("| ranks | algorithm | steps (rounds) | messages in per rank | topoccl µs | µs per step | time / 2-rank time | steps / 2-rank steps | context switches per call per core | µs per switch | OpenMPI µs | OpenMPI switches per call per core | topoccl/OpenMPI time |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    else:
        print("| ranks | algorithm | steps | topoccl ms | busbw GB/s | CPU model ms | time / model | OpenMPI ms | OpenMPI busbw GB/s | busbw topoccl/OpenMPI |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in ranks:
        t = med(("topoccl", n, nbytes)); m = med(("mpi", n, nbytes))
        s = steps(n, nbytes)
        if t is None:
            continue
        tcell = f"{t[0]:.1f} [{t[1]:.1f}-{t[2]:.1f}]" if small else f"{t[0]/1e3:.1f} [{t[1]/1e3:.1f}-{t[2]/1e3:.1f}]"
        mcell = "" if m is None else (f"{m[0]:.1f}" if small else f"{m[0]/1e3:.1f}")
        if small:
            ratio = "" if m is None else f"{t[0]/m[0]:.2f}"
            sw = switches_per_core("topoccl", n, nbytes); msw = switches_per_core("mpi", n, nbytes)
            swcell = "" if sw is None else f"{sw:.2f}"
            perswitch = "-" if not sw or sw < 0.1 else f"{t[0]/sw:.1f}"  # ranks with cores of their own hardly switch
            mswcell = "" if msw is None else f"{msw:.2f}"
            print(f"| {n} | {algorithm(n, nbytes)} | {s} | {messages(n, nbytes)} | {tcell} | {t[0]/s:.2f} | {t[0]/base[0]:.2f} | {s/steps(ranks[0], nbytes):.2f} | {swcell} | {perswitch} | {mcell} | {mswcell} | {ratio} |")
        else:
            bus = lambda us: nbytes / (us * 1e3) * 2 * (n - 1) / n
            # Each rank moves 2(n-1)/n x size through its core; n ranks share min(n, cores) cores. The per-core
            # rate is the 2-rank run's (which has a core per rank), so the model is the 2-rank time scaled.
            model = base[0] * ((2 * (n - 1) / n) / (2 * (ranks[0] - 1) / ranks[0])) * max(1.0, n / cores) / max(1.0, ranks[0] / cores)
            mb = "" if m is None else f"{bus(m[0]):.2f}"
            ratio = "" if m is None else f"{bus(t[0])/bus(m[0]):.2f}"
            print(f"| {n} | {algorithm(n, nbytes)} | {s} | {tcell} | {bus(t[0]):.2f} | {model/1e3:.1f} | {t[0]/model:.2f} | {mcell} | {mb} | {ratio} |")
    print()
PY
echo "scaling.sh: wrote $OUT/table.md" >&2
