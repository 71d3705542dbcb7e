#!/usr/bin/env bash
# Side-by-side: topoccl vs OpenMPI vs Gloo, nccl-tests conventions, one machine, one run.
#
#   perf/compare/run.sh                       everything (2 and 4 ranks, 8 B..256 MiB x4, 3 repeats)
#   QUICK=1 perf/compare/run.sh               8 B..1 MiB, 2 ranks, 1 repeat (about 1-2 minutes)
#   SIZES=8:4M REPEAT=2 NPS=4 perf/compare/run.sh
#
# Builds the comparison's own MPI and Gloo benchmarks and ceiling probes (Makefile here, into
# build/compare), measures memory and loopback-TCP ceilings, then for every repeat, rank count,
# collective and size band runs the systems back to back (their order rotates with the repeat), so
# that the shared machine's noise hits all of them alike. Then the TCP-only variant (topoccl with
# NCCL_SHM_DISABLE=1, OpenMPI --mca btl tcp,self), interleaved the same way. Writes
# $OUT (default perf/compare/results/<UTC timestamp>/): raw/*.csv (one per launch, the CSV of the
# perf binaries), logs/*.log (their stderr), runs.tsv, ceilings.csv, meta.txt, load.txt,
# table.md and *.png (report.py), and prints table.md.
#
# Environment (defaults in brackets):
#   BUILD [build]          topoccl build dir: $BUILD/perf/<coll>_perf, $BUILD/src/api/libnccl.so.2
#   COMPARE_BIN [build/compare]  where the comparison's own programs are built
#   SIZES [8:256M]         MIN:MAX bytes (K/M/G = 1024^k); MINBYTES / MAXBYTES override either end
#   FACTOR [4]             size step factor
#   REPEAT [3]             repeats; tables report the median and min-max over them
#   SMALL_REPEAT [3 x REPEAT]  repeats of the small band for SMALL_SYSTEMS: after the REPEAT full repeats, the
#                          small band alone runs until it has this many. Its launches take seconds, and its
#                          per-repeat ratios span 0.5-2x on 4 ranks, so a median of 5 moves by 10-20% between runs
#   SMALL_SYSTEMS [SYSTEMS without gloo]  (the latency targets are against OpenMPI)
#   NPS ["2 4"]            rank counts
#   COLLS [all_reduce all_gather reduce_scatter alltoall broadcast]
#   SYSTEMS [topoccl mpi gloo]      main comparison (topoccl over its default transports, OpenMPI
#                                   with --mca btl vader,self, Gloo over TCP)
#   TCP_COLLS [all_reduce]          the TCP-only variant ("" to skip): topoccl-tcp vs mpi-tcp
#   CEILINGS [1]           0 skips the memory/TCP probes
#   SMALL_MAX [64K] LARGE_MIN [16M] size bands; each band is one launch with its own -n/-w (and
#                          MAXBYTES gets a launch of its own, band "top", when the grid misses it):
#   ITERS_SMALL [10000] WARMUP_SMALL [500] ITERS_MID [50] WARMUP_MID [5] ITERS_LARGE [5] WARMUP_LARGE [2]
#                          10000: 1000 calls of 0.6 us span less than a scheduler slice, so with 4 ranks on 2 cores
#                          one context switch more or less moved a latency row by 0.4-1.6x between repeats
#   GLOO_ITERS_SMALL [100] GLOO_WARMUP_SMALL [20]
#                          Gloo's small band: its calls take milliseconds, so 100 already span 20+ ms, while
#                          100 sub-microsecond calls of the others span less than one context switch
#   LAT_MAX [64K]          report latency ratios up to this size
#   EDGE [1M]              a size the bandwidth targets start at (">= 1 MiB") that the grid misses (8 B x4 has
#                          512 KiB and 2 MiB): one launch of its own, band "edge", with the mid band's -n/-w;
#                          "" skips it
#   GLOO_BUDGET [30]       seconds: Gloo skips sizes projected to take longer (its 4-rank
#                          alltoall has been measured at ~12 MB/s on this machine kind)
#   RUN_TIMEOUT [900]      seconds per launch
#   MPIRUN [mpirun]  MPIRUN_FLAGS [--allow-run-as-root --oversubscribe]
#   TOPOCCL_MPIRUN_FLAGS [] extra mpirun flags for topoccl launches, e.g. "-x NCCL_DEBUG=WARN"
#   MALLOC_ENV [MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736]
#                          glibc settings given to every rank of every system (mpirun -x): malloc
#                          never returns big blocks to the kernel. OpenMPI mallocs its reduction
#                          scratch per call; fresh mmap'd pages fault on every call, which in this
#                          VM makes its >= 32 MiB all_reduce / reduce_scatter ~10x slower. Set
#                          MALLOC_ENV= to measure the libraries exactly as shipped.
#   OUT                    output directory
#   AA [0]                 1: run our mpi_perf in topoccl's place (an A/A check: its ratios to
#                          OpenMPI show how far the machine's noise alone moves a ratio)
set -u -o pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

if [ "${QUICK:-0}" = 1 ]; then
  : "${SIZES:=8:1M}" "${REPEAT:=1}" "${NPS:=2}" "${SMALL_REPEAT:=1}"
fi
BUILD=${BUILD:-build}
SIZES=${SIZES:-8:256M}
MINBYTES=${MINBYTES:-${SIZES%%:*}}
MAXBYTES=${MAXBYTES:-${SIZES##*:}}
FACTOR=${FACTOR:-4}
REPEAT=${REPEAT:-3}
SMALL_REPEAT=${SMALL_REPEAT:-$((3 * REPEAT))}
NPS=${NPS:-"2 4"}
COLLS=${COLLS:-"all_reduce all_gather reduce_scatter alltoall broadcast"}
SYSTEMS=${SYSTEMS:-"topoccl mpi gloo"}
SMALL_SYSTEMS=${SMALL_SYSTEMS-$(for s in $SYSTEMS; do [ "$s" = gloo ] || printf '%s ' "$s"; done)}
TCP_COLLS=${TCP_COLLS-all_reduce}
CEILINGS=${CEILINGS:-1}
SMALL_MAX=${SMALL_MAX:-64K}
LARGE_MIN=${LARGE_MIN:-16M}
ITERS_SMALL=${ITERS_SMALL:-10000}; WARMUP_SMALL=${WARMUP_SMALL:-500}
GLOO_ITERS_SMALL=${GLOO_ITERS_SMALL:-100}; GLOO_WARMUP_SMALL=${GLOO_WARMUP_SMALL:-20}
ITERS_MID=${ITERS_MID:-50};      WARMUP_MID=${WARMUP_MID:-5}
ITERS_LARGE=${ITERS_LARGE:-5};   WARMUP_LARGE=${WARMUP_LARGE:-2}
LAT_MAX=${LAT_MAX:-64K}
EDGE=${EDGE-1M}
GLOO_BUDGET=${GLOO_BUDGET:-30}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
MPIRUN=${MPIRUN:-mpirun}
MPIRUN_FLAGS=${MPIRUN_FLAGS:---allow-run-as-root --oversubscribe}
TOPOCCL_MPIRUN_FLAGS=${TOPOCCL_MPIRUN_FLAGS:-}
MALLOC_ENV=${MALLOC_ENV-MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736}
ENVX=()
for kv in $MALLOC_ENV; do ENVX+=(-x "$kv"); done
OUT=${OUT:-perf/compare/results/$(date -u +%Y%m%dT%H%M%SZ)}
BUILD=$(cd "$BUILD" 2>/dev/null && pwd || echo "$BUILD")
BIN=$ROOT/${COMPARE_BIN:-build/compare}   # our own benchmarks (build/ is git-ignored)

die() { echo "run.sh: $*" >&2; exit 1; }

tobytes() {  # 8, 64K, 1M, 2G -> bytes
  local v=$1 n m=1
  case $v in
    *[kK]) n=${v%?}; m=1024 ;;
    *[mM]) n=${v%?}; m=$((1024 * 1024)) ;;
    *[gG]) n=${v%?}; m=$((1024 * 1024 * 1024)) ;;
    *) n=$v ;;
  esac
  [[ $n =~ ^[0-9]+$ ]] || die "bad size '$v'"
  echo $((n * m))
}
MIN_B=$(tobytes "$MINBYTES"); MAX_B=$(tobytes "$MAXBYTES")
SMALL_MAX_B=$(tobytes "$SMALL_MAX"); LARGE_MIN_B=$(tobytes "$LARGE_MIN"); LAT_MAX_B=$(tobytes "$LAT_MAX")
[ "$FACTOR" -ge 2 ] 2>/dev/null || die "FACTOR must be >= 2"
[ "$MIN_B" -ge 1 ] && [ "$MAX_B" -ge "$MIN_B" ] || die "need 1 <= MINBYTES <= MAXBYTES"

# ---- prerequisites and build -------------------------------------------------------------
PY=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then PY=$p; break; fi
done
if ! command -v mpicxx >/dev/null || [ ! -f /usr/include/gloo/allreduce.h ] || [ -z "$PY" ]; then
  echo "run.sh: installing missing packages (scripts/install-deps.sh, then the comparison's own: Gloo, matplotlib)"
  scripts/install-deps.sh || die "scripts/install-deps.sh failed"
  # Only the comparison needs these, so they stay out of the build and CI's package list.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=300 libgloo-dev python3-matplotlib \
    || die "apt-get install libgloo-dev python3-matplotlib failed"
  for p in /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then PY=$p; break; fi
  done
fi
[ -n "$PY" ] || { PY=python3; echo "run.sh: no python3 with matplotlib: table only, no plots" >&2; }
mkdir -p "$BIN"
make -s -C "$HERE" BIN="$BIN" all || die "building the comparison benchmarks failed"

if [ "${AA:-0}" = 1 ]; then  # A/A check: "topoccl" is our mpi_perf, so its ratios show the noise floor
  BUILD=$BIN/aa; mkdir -p "$BUILD/perf"
  for c in all_reduce all_gather reduce_scatter alltoall broadcast; do ln -sf "$BIN/mpi_perf" "$BUILD/perf/${c}_perf"; done
  echo "run.sh: AA=1: the \"topoccl\" runs are mpi_perf (an A/A check of the noise)"
fi
HAVE_TOPOCCL=1
if [ ! -x "$BUILD/perf/all_reduce_perf" ]; then
  HAVE_TOPOCCL=0
  echo "run.sh: $BUILD/perf/all_reduce_perf not found: skipping topoccl (build the project first, or set BUILD)" >&2
fi
# the topoccl binaries link libnccl.so.2 like an application; make sure the build's is found
export LD_LIBRARY_PATH="$BUILD/src/api${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

mkdir -p "$OUT/raw" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
echo "run.sh: results in $OUT"

# ---- sizes and bands -----------------------------------------------------------------------
ALL_SIZES=()
for ((s = MIN_B; s <= MAX_B; s *= FACTOR)); do ALL_SIZES+=("$s"); done
declare -A BAND_B BAND_E BAND_N BAND_W
BANDS=()
for s in "${ALL_SIZES[@]}"; do
  if [ "$s" -le "$SMALL_MAX_B" ]; then b=small; elif [ "$s" -lt "$LARGE_MIN_B" ]; then b=mid; else b=large; fi
  if [ -z "${BAND_B[$b]:-}" ]; then BAND_B[$b]=$s; BANDS+=("$b"); fi
  BAND_E[$b]=$s
done
# MAXBYTES itself when the MIN*FACTOR^k grid misses it (8 B x4 ends at 128 MiB): one more launch
if [ "${ALL_SIZES[-1]}" != "$MAX_B" ]; then
  ALL_SIZES+=("$MAX_B"); BAND_B[top]=$MAX_B; BAND_E[top]=$MAX_B; BANDS+=(top)
fi
# EDGE, when inside MINBYTES..MAXBYTES and off the grid: its own launch, in size order among the bands
if [ -n "$EDGE" ]; then
  EDGE_B=$(tobytes "$EDGE")
  on_grid=0
  for s in "${ALL_SIZES[@]}"; do [ "$s" = "$EDGE_B" ] && on_grid=1; done
  if [ "$on_grid" = 0 ] && [ "$EDGE_B" -ge "$MIN_B" ] && [ "$EDGE_B" -le "$MAX_B" ]; then
    BAND_B[edge]=$EDGE_B; BAND_E[edge]=$EDGE_B
    ordered=() placed=0
    for b in "${BANDS[@]}"; do
      if [ "$placed" = 0 ] && [ "${BAND_B[$b]}" -gt "$EDGE_B" ]; then ordered+=(edge); placed=1; fi
      ordered+=("$b")
    done
    [ "$placed" = 0 ] && ordered+=(edge)
    BANDS=("${ordered[@]}")
    ALL_SIZES+=("$EDGE_B")
    mapfile -t ALL_SIZES < <(printf '%s\n' "${ALL_SIZES[@]}" | sort -n)
  fi
fi
BAND_N[edge]=$ITERS_MID;    BAND_W[edge]=$WARMUP_MID
BAND_N[small]=$ITERS_SMALL; BAND_W[small]=$WARMUP_SMALL
BAND_N[mid]=$ITERS_MID;     BAND_W[mid]=$WARMUP_MID
BAND_N[large]=$ITERS_LARGE; BAND_W[large]=$WARMUP_LARGE
BAND_N[top]=$ITERS_LARGE;   BAND_W[top]=$WARMUP_LARGE

# ---- metadata --------------------------------------------------------------------------------
note_load() {
  { echo "== $1  $(date -u +%FT%TZ)  loadavg: $(cat /proc/loadavg)"
    ps -eo pcpu,etime,comm --sort=-pcpu | head -5; } >> "$OUT/load.txt"
}
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm), $(nproc) cpus, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "mem: $(free -g | awk '/Mem:/ {print $2 " GiB"}'), /dev/shm $(df -h /dev/shm | awk 'NR==2 {print $2}')"
  echo "openmpi: $($MPIRUN --version 2>/dev/null | head -1)"
  echo "gloo: libgloo-dev $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null)"
  [ "${AA:-0}" = 1 ] && echo "AA=1: topoccl = mpi_perf (A/A noise check)"
  echo "topoccl: $([ $HAVE_TOPOCCL = 1 ] && echo "$BUILD/perf/*_perf, built $(date -u -r "$BUILD/perf/all_reduce_perf" +%FT%TZ)" || echo "not found ($BUILD/perf/all_reduce_perf)")"
  echo "sizes: ${ALL_SIZES[*]}"
  for b in "${BANDS[@]}"; do echo "band $b: -b ${BAND_B[$b]} -e ${BAND_E[$b]} -f $FACTOR -n ${BAND_N[$b]} -w ${BAND_W[$b]}"; done
  echo "gloo small band: -n $GLOO_ITERS_SMALL -w $GLOO_WARMUP_SMALL"
  echo "repeat: $REPEAT  nps: $NPS  colls: $COLLS  systems: $SYSTEMS  tcp_colls: $TCP_COLLS"
  echo "small band: $SMALL_REPEAT repeats for ${SMALL_SYSTEMS:-(none)}  membw arrays: ${MEMBW_MIB:-256} MiB"
  echo "mpirun: $MPIRUN $MPIRUN_FLAGS  (mpi: --mca btl vader,self; mpi-tcp: --mca btl tcp,self;"
  echo "        topoccl: $TOPOCCL_MPIRUN_FLAGS; topoccl-tcp: -x NCCL_SHM_DISABLE=1; gloo: FileStore + TCP 127.0.0.1)"
  echo "env for every rank: ${MALLOC_ENV:-(none)}"
  echo "gloo_budget: $GLOO_BUDGET s  run_timeout: $RUN_TIMEOUT s  lat_max: $LAT_MAX_B"
} > "$OUT/meta.txt"
printf 'system\tnp\tcoll\tband\trep\trc\tseconds\thandoff_us\n' > "$OUT/runs.tsv"

# ---- ceilings --------------------------------------------------------------------------------
if [ "$CEILINGS" = 1 ]; then
  echo "run.sh: ceilings (memory bandwidth, loopback TCP, shared-memory handshake, context switch, all-to-all and all-gather copies alone)"
  note_load ceilings
  { "$BIN/ceilings" header
    timeout 300 "$BIN/ceilings" membw -s "${MEMBW_MIB:-256}" -r 5
    timeout 300 "$BIN/ceilings" tcp -m 512 -r 3
    timeout 120 "$BIN/ceilings" shm
    timeout 60 "$BIN/ceilings" switch
    timeout 300 "$BIN/ceilings" copies -r 3; } > "$OUT/ceilings.csv" 2> "$OUT/logs/ceilings.log"
  column -s, -t < "$OUT/ceilings.csv" | sed 's/^/  /'
fi

# ---- one launch ------------------------------------------------------------------------------
declare -A GLOO_SKIP   # "np coll rep" -> reason, once Gloo would blow its size budget
launch() {  # system np coll band rep
  local sys=$1 np=$2 coll=$3 band=$4 rep=$5
  local name="${sys}__np${np}__${coll}__${band}__r${rep}"
  local iters=${BAND_N[$band]} warmup=${BAND_W[$band]}
  if [ "$sys" = gloo ] && [ "$band" = small ]; then iters=$GLOO_ITERS_SMALL; warmup=$GLOO_WARMUP_SMALL; fi
  local flags=(-b "${BAND_B[$band]}" -e "${BAND_E[$band]}" -f "$FACTOR" -n "$iters"
               -w "$warmup" -c 1 -d float -o sum --csv)
  local cmd=() store=""
  case $sys in
    topoccl|topoccl-tcp)
      [ $HAVE_TOPOCCL = 1 ] || return 0
      cmd=($MPIRUN $MPIRUN_FLAGS -np "$np" "${ENVX[@]}" -x LD_LIBRARY_PATH $TOPOCCL_MPIRUN_FLAGS)
      [ "$sys" = topoccl-tcp ] && cmd+=(-x NCCL_SHM_DISABLE=1)
      cmd+=("$BUILD/perf/${coll}_perf" "${flags[@]}") ;;
    mpi)     cmd=($MPIRUN $MPIRUN_FLAGS --mca btl vader,self -np "$np" "${ENVX[@]}" "$BIN/mpi_perf" --coll "$coll" "${flags[@]}") ;;
    mpi-tcp) cmd=($MPIRUN $MPIRUN_FLAGS --mca btl tcp,self -np "$np" "${ENVX[@]}" "$BIN/mpi_perf" --coll "$coll" "${flags[@]}") ;;
    gloo)
      local key="$np $coll $rep"
      if [ -n "${GLOO_SKIP[$key]:-}" ]; then
        echo "    skip gloo np=$np $coll $band: ${GLOO_SKIP[$key]}" | tee -a "$OUT/logs/$name.log"
        return 0
      fi
      store=$(mktemp -d /tmp/compare_gloo_store.XXXXXX); CUR_STORE=$store
      cmd=($MPIRUN $MPIRUN_FLAGS -np "$np" "${ENVX[@]}" "$BIN/gloo_perf" --coll "$coll" --store "$store"
           --size-budget "$GLOO_BUDGET" --timeout "$RUN_TIMEOUT" "${flags[@]}") ;;
    *) die "unknown system $sys" ;;
  esac
  echo "$(date -u +%T) ${cmd[*]}" > "$OUT/logs/$name.log"
  # The machine's mode right before the launch: this VM's two vCPUs move a cache line between them in 0.03, 0.08 or
  # 0.3 us at different times, and every time measured moves with it (targets.py shows it beside each miss). 10 ms.
  local handoff
  handoff=$(timeout 10 "$BIN/ceilings" shm -p 20 2>/dev/null | awk -F, '$1 == "shm" {print $5}') || handoff=""
  local t0=$SECONDS rc
  timeout "$RUN_TIMEOUT" "${cmd[@]}" > "$OUT/raw/$name.csv" 2>> "$OUT/logs/$name.log"
  rc=$?
  local dt=$((SECONDS - t0))
  [ -n "$store" ] && rm -rf "$store"; CUR_STORE=""
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$np" "$coll" "$band" "$rep" "$rc" "$dt" "${handoff:-NA}" >> "$OUT/runs.tsv"
  local rows; rows=$(grep -c "^$coll," "$OUT/raw/$name.csv" 2>/dev/null) || rows=0
  printf '    %-11s np=%s %-14s %-5s r%s  %3ss  %2s rows  rc=%s\n' "$sys" "$np" "$coll" "$band" "$rep" "$dt" "$rows" "$rc"
  if [ "$rc" != 0 ]; then
    echo "    !! $sys np=$np $coll $band rep $rc: exit $rc, see $OUT/logs/$name.log" >&2
    tail -3 "$OUT/logs/$name.log" | sed 's/^/    !! /' >&2
  fi
  if [ "$sys" = gloo ]; then
    # carry Gloo's size budget across bands: project the next band's first size from the last row
    if grep -q "stopping after" "$OUT/logs/$name.log" || [ "$rc" = 124 ]; then
      GLOO_SKIP["$np $coll $rep"]="over the ${GLOO_BUDGET}s size budget in band $band"
    else
      local last; last=$(grep "^$coll," "$OUT/raw/$name.csv" | tail -1)
      if [ -n "$last" ]; then
        local nb="" i
        for ((i = 0; i + 1 < ${#BANDS[@]}; i++)); do [ "${BANDS[$i]}" = "$band" ] && nb=${BANDS[$((i + 1))]}; done
        if [ -n "$nb" ]; then
          local over
          over=$(echo "$last" | awk -F, -v nb="${BAND_B[$nb]}" -v n="${BAND_N[$nb]}" -v w="${BAND_W[$nb]}" -v B="$GLOO_BUDGET" \
                 '{ t = $8 * 1e-6 * nb / $3 * (n + 2 * w + 1); if (B > 0 && t > B) printf "%.0f", t }')
          [ -n "$over" ] && GLOO_SKIP["$np $coll $rep"]="band $nb projected at ${over}s > ${GLOO_BUDGET}s size budget"
        fi
      fi
    fi
  fi
  return 0
}

rotate() {  # rotate the words of $1 left by $2
  local -a w=($1); local n=${#w[@]} k=$2 i out=()
  for ((i = 0; i < n; i++)); do out+=("${w[$(((i + k) % n))]}"); done
  echo "${out[*]}"
}

# ---- the interleaved runs ----------------------------------------------------------------------
CUR_STORE=""
trap '[ -n "$CUR_STORE" ] && rm -rf "$CUR_STORE"' EXIT
T_START=$SECONDS
for ((rep = 1; rep <= REPEAT; rep++)); do
  note_load "repeat $rep"
  echo "run.sh: repeat $rep/$REPEAT  (load $(cut -d' ' -f1-3 /proc/loadavg))"
  order=$(rotate "$SYSTEMS" $((rep - 1)))
  tcp_order=$(rotate "topoccl-tcp mpi-tcp" $((rep - 1)))
  for np in $NPS; do
    for coll in $COLLS; do
      for band in "${BANDS[@]}"; do
        for sys in $order; do launch "$sys" "$np" "$coll" "$band" "$rep"; done
      done
    done
    for coll in $TCP_COLLS; do
      for band in "${BANDS[@]}"; do
        for sys in $tcp_order; do launch "$sys" "$np" "$coll" "$band" "$rep"; done
      done
    done
  done
done
# The small band again, until it has SMALL_REPEAT repeats: same interleaving, same rotation.
if [ -n "${BAND_B[small]:-}" ] && [ -n "${SMALL_SYSTEMS// /}" ]; then
  for ((rep = REPEAT + 1; rep <= SMALL_REPEAT; rep++)); do
    note_load "repeat $rep (small band)"
    echo "run.sh: small band, repeat $rep/$SMALL_REPEAT  (load $(cut -d' ' -f1-3 /proc/loadavg))"
    order=$(rotate "$SMALL_SYSTEMS" $((rep - 1)))
    for np in $NPS; do
      for coll in $COLLS; do
        for sys in $order; do launch "$sys" "$np" "$coll" small "$rep"; done
      done
    done
  done
fi
note_load end
echo "run.sh: measurements took $((SECONDS - T_START)) s"

# ---- report ------------------------------------------------------------------------------------
"$PY" "$HERE/report.py" "$OUT" --lat-max "$LAT_MAX_B"
report_rc=$?
[ -f "$OUT/table.md" ] || die "report.py failed (exit $report_rc)"
# Results get committed: name files relative to the repository, not this machine's checkout.
find "$OUT" -type f \( -name '*.md' -o -name '*.txt' -o -name '*.log' -o -name '*.tsv' -o -name '*.csv' \) \
  -exec sed -i "s|$ROOT/||g" {} +
echo
cat "$OUT/table.md"
echo
echo "run.sh: wrote $OUT/table.md $(cd "$OUT" && ls *.png 2>/dev/null | tr '\n' ' ')"
failed=$(awk -F'\t' 'NR > 1 && $6 != 0' "$OUT/runs.tsv" | wc -l)
[ "$failed" = 0 ] || echo "run.sh: $failed launch(es) failed, see runs.tsv and logs/" >&2
[ "$report_rc" = 0 ] || echo "run.sh: wrong results, see the Correctness section of table.md" >&2
[ "$failed" = 0 ] && [ "$report_rc" = 0 ]
