#!/usr/bin/env bash
# The short cluster test (ctest "cluster: ..."): 2 emulated hosts x 2 ranks, NIC A 2 Gbit/s + NIC B
# 500 Mbit/s each. Checks every collective with -c 1 over the hierarchical, ring and synthesized plans,
# then counts bytes per NIC to prove the traffic went where the plan said: striped 4:1 by speed, and with
# TOPOCCL_NET_NICS=near each rank on its own NIC (its shard weighted 4:1, and its sockets on that NIC only). Exit 77 (ctest: skipped) without root, network
# namespaces or mpirun. Usage: cluster_test.sh BUILD_DIR
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUILD="$(cd "${1:?usage: cluster_test.sh BUILD_DIR}" && pwd)"
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, tc)"
command -v mpirun >/dev/null || skip "no mpirun (openmpi-bin)"
command -v tc >/dev/null || skip "no tc (iproute2)"
probe="tcprobe$$"
ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces here"
probe_ok=1
ip -n "$probe" link add p0 type veth peer name p1 2>/dev/null || probe_ok=0
[ "$probe_ok" = 1 ] && { tc -n "$probe" qdisc add dev p0 root tbf rate 1gbit burst 128k latency 20ms 2>/dev/null || probe_ok=2; }
ip netns del "$probe"
[ "$probe_ok" = 0 ] && skip "cannot create veth pairs here"
[ "$probe_ok" = 2 ] && skip "the kernel has no tbf qdisc to shape NICs with"
for bin in all_reduce_perf all_gather_perf reduce_scatter_perf alltoall_perf broadcast_perf reduce_perf \
  sendrecv_perf gather_perf scatter_perf; do
  [ -x "$BUILD/perf/$bin" ] || skip "$BUILD/perf/$bin not built (needs MPI)"
done

PREFIX="tct$((RANDOM % 1000))"
WORK="$(mktemp -d /tmp/topoccl-cluster-test.XXXXXX)"
cleanup() { "$HERE/cluster.sh" down -p "$PREFIX" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
"$HERE/cluster.sh" up -p "$PREFIX" -n 2 -k 2 -r 2gbit,500mbit
"$HERE/cluster.sh" topology -p "$PREFIX" -s 2 > "$WORK/cluster.json"
# CLUSTER_FILE picks the file a run reads: the nominal one (NIC speeds as shaped) unless a check says otherwise.
run() { "$HERE/cluster.sh" mpirun -p "$PREFIX" -s 2 -T 180 -x TOPOCCL_CLUSTER_FILE="${CLUSTER_FILE:-$WORK/cluster.json}" "$@"; }
fail() { echo "FAILED: $*"; exit 1; }

check() {  # label, then mpirun arguments; the run must pass its own -c 1 check
  local label="$1"; shift
  if ! run "$@" > "$WORK/out.txt" 2>&1 || ! grep -q "Out of bounds values : 0 OK" "$WORK/out.txt"; then
    cat "$WORK/out.txt"; fail "$label"
  fi
  echo "ok: $label"
}

# Every collective; all-reduce also over each plan the selection can take across hosts, and every type and op.
for algo in hierarchical ring; do
  check "all_reduce NCCL_ALGO=$algo, every type and op, 4 B - 4 MiB" -x NCCL_ALGO="$algo" -- \
    "$BUILD/perf/all_reduce_perf" -b 4 -e 4M -f 32 -n 1 -w 0 -c 1 -d all -o all
done
check "all_reduce, default selection, 3 channels" -x TOPOCCL_NCHANNELS=3 -- \
  "$BUILD/perf/all_reduce_perf" -b 1K -e 8M -f 8 -n 1 -w 0 -c 1
for coll in all_gather reduce_scatter alltoall broadcast reduce sendrecv gather scatter; do
  check "$coll, 8 B - 1 MiB" -- "$BUILD/perf/${coll}_perf" -b 8 -e 1M -f 32 -n 1 -w 0 -c 1 -r all
done
# Synthesized plans for the cluster graph (cached on disk after the first run), checked in every size band.
for coll in all_reduce all_gather reduce_scatter alltoall; do
  check "$coll over synthesized plans, 1 KiB - 16 MiB" -x TOPOCCL_SYNTHESIZE=all -x TOPOCCL_SYNTH_BUDGET_MS=2000 \
    -x TOPOCCL_PLAN_CACHE_DIR="$WORK/plans" -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=TUNING -- \
    "$BUILD/perf/${coll}_perf" -b 1K -e 16M -f 16 -n 1 -w 0 -c 1
  grep -q "synthesized ${coll//_/} for" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "no synthesized ${coll//_/} plan"; }
done

# Calibration fits each NIC's alpha and goodput into a cluster file the runs accept; --predict prints the
# model's time for the plan that ran (the ratio is measured in perf/, not asserted here).
"$HERE/cluster.sh" calibrate -p "$PREFIX" -s 2 -b "$BUILD" > "$WORK/calibrated.json" 2> "$WORK/calibrate.log" ||
  { cat "$WORK/calibrate.log"; fail "calibration"; }
grep -q '"goodput_gbps"' "$WORK/calibrated.json" || { cat "$WORK/calibrated.json"; fail "calibration wrote no fit"; }
CLUSTER_FILE="$WORK/calibrated.json" check "all_reduce --predict on the calibrated cluster file" -- \
  "$BUILD/perf/all_reduce_perf" -b 4M -e 4M -n 1 -w 0 -c 1 --predict
grep -q "predicted .*hierarchical .* us, measured/predicted" "$WORK/out.txt" || { cat "$WORK/out.txt"; fail "no prediction line"; }

# Bytes per NIC: host 0's eth0 / eth1 transmit ratio over a 16 MiB all-reduce.
nic_ratio() {  # prints host 0 tx bytes on eth0, eth1 and their ratio for the run given as arguments
  "$HERE/cluster.sh" counters -p "$PREFIX" > "$WORK/before"
  run "$@" > "$WORK/out.txt" 2>&1 || { cat "$WORK/out.txt"; fail "run for the NIC byte count"; }
  "$HERE/cluster.sh" counters -p "$PREFIX" > "$WORK/after"
  paste "$WORK/before" "$WORK/after" | awk -v h="${PREFIX}0" '
    $1 == h && $2 == "eth0" { a = $7 - $3 } $1 == h && $2 == "eth1" { b = $7 - $3 }
    END { printf "%d %d %.3f\n", a, b, (b > 0 ? a / b : 1e9) }'
}
# Wire bytes include retransmissions, which a CPU-starved moment of the 2-core CI machine inflates on the slow
# NIC (seen once: 3.27 and 3.00 where the same build read 3.92 and 4.00 alone), so a ratio out of its band is
# measured once more before it fails; both readings are printed.
# The nominal file says 2 and 0.5 Gbit/s, so these runs expect 4. (A calibrated file weighs by fitted goodput:
# one CI run read exactly 3.000 with near after a noisy calibration, its shard weights rounded to 3:1.)
EXPECTED=4
ratio_in_band() { awk -v r="$1" -v e="$EXPECTED" 'BEGIN { exit !(r > 0.8 * e && r < 1.2 * e) }'; }
nic_ratio_checked() {  # label, then the run's arguments; prints "a b ratio" of the reading that is judged
  local label=$1 a b ratio
  shift
  read -r a b ratio < <(nic_ratio "$@")
  if ! ratio_in_band "$ratio"; then
    echo "$label: eth0 $a B, eth1 $b B, ratio $ratio out of $EXPECTED +- 20%; measuring again" >&2
    read -r a b ratio < <(nic_ratio "$@")
  fi
  echo "$a $b $ratio"
}
read -r a b ratio < <(nic_ratio_checked "all NICs" -x NCCL_ALGO=hierarchical -- "$BUILD/perf/all_reduce_perf" -b 16M -e 16M -n 4 -w 0)
echo "all NICs, striped by speed: host 0 sent eth0 $a B, eth1 $b B, ratio $ratio (expected 4)"
ratio_in_band "$ratio" || fail "eth0:eth1 = $ratio, expected 4 +- 20%"
[ "$a" -gt $((16 << 20)) ] || fail "host 0 sent only $a B on eth0 for 4 x 16 MiB all-reduce"
read -r a b ratio < <(nic_ratio_checked "nearest NIC" -x NCCL_ALGO=hierarchical -x TOPOCCL_NET_NICS=near -- \
  "$BUILD/perf/all_reduce_perf" -b 16M -e 16M -n 4 -w 0)
echo "nearest NIC only, shards weighted by NIC speed: host 0 sent eth0 $a B, eth1 $b B, ratio $ratio (expected 4)"
ratio_in_band "$ratio" || fail "eth0:eth1 = $ratio with TOPOCCL_NET_NICS=near, expected 4"
# With the calibrated file, near weights host 0's shards by fitted goodput, rounded as the communicator does.
read -r EXPECTED fitted < <(python3 -c 'import json, sys
nics = json.load(open(sys.argv[1]))["hosts"][0]["nics"]
g = [n.get("goodput_gbps") or n["gbps"] for n in nics]
print(min(64, max(1, int(g[0] / g[1] + 0.5))), "%g:%g" % (g[0], g[1]))' "$WORK/calibrated.json")
read -r a b ratio < <(CLUSTER_FILE="$WORK/calibrated.json" nic_ratio_checked "nearest NIC, calibrated" \
  -x NCCL_ALGO=hierarchical -x TOPOCCL_NET_NICS=near -- "$BUILD/perf/all_reduce_perf" -b 16M -e 16M -n 4 -w 0)
echo "nearest NIC, calibrated file (fitted $fitted Gbit/s, so shard weights $EXPECTED:1): host 0 sent eth0 $a B, eth1 $b B, ratio $ratio"
ratio_in_band "$ratio" || fail "eth0:eth1 = $ratio with TOPOCCL_NET_NICS=near and the calibrated file, expected $EXPECTED"
EXPECTED=4

# Which NIC each rank's data streams use, from the sockets themselves (ss) in the middle of a run: with near,
# host 0's two ranks each on one NIC, a different one each; with all, each on both.
nics_of_ranks() {
  run "$@" -- "$BUILD/perf/all_reduce_perf" -b 16M -e 16M -n 30 -w 0 > "$WORK/bg.txt" 2>&1 &
  local job=$!
  sleep 3
  ip netns exec "${PREFIX}0" ss -tnpi state established | awk -f "$HERE/nics_of.awk" | sort -k2 > "$WORK/nics.txt"
  wait "$job" || { cat "$WORK/bg.txt"; fail "the run for the socket census"; }
}
nics_of_ranks -x NCCL_ALGO=hierarchical -x TOPOCCL_NET_NICS=near
echo "near, per rank process on host 0: $(tr '\n' ';' < "$WORK/nics.txt")"
[ "$(awk 'NF == 2' "$WORK/nics.txt" | cut -d' ' -f2 | sort -u | wc -l)" = 2 ] && [ "$(wc -l < "$WORK/nics.txt")" = 2 ] ||
  fail "with TOPOCCL_NET_NICS=near each of host 0's ranks should send on its own single NIC: $(cat "$WORK/nics.txt")"
nics_of_ranks -x NCCL_ALGO=hierarchical
echo "all, per rank process on host 0: $(tr '\n' ';' < "$WORK/nics.txt")"
[ "$(awk 'NF == 3' "$WORK/nics.txt" | wc -l)" = 2 ] || fail "striped ranks should each send on both NICs: $(cat "$WORK/nics.txt")"

# A NIC that dies mid-run: every rank fails within TOPOCCL_TIMEOUT_MS, and the report names the stuck stream's NIC
# ("eth1->eth1" from the dialling side, "->eth1" from the accepting side: whichever rank stalls first reports).
# (NIC B goes down; NIC A stays up so that OpenMPI itself can still tear the job down.)
( sleep 3; ip -n "${PREFIX}1" link set eth1 down ) &
downer=$!
started=$(date +%s)
if run -x TOPOCCL_TIMEOUT_MS=3000 -- "$BUILD/perf/all_reduce_perf" -b 16M -e 16M -n 500 -w 1 -c 0 > "$WORK/out.txt" 2>&1; then
  fail "the all-reduce went on with NIC B down"
fi
wait "$downer"
elapsed=$(( $(date +%s) - started ))
ip -n "${PREFIX}1" link set eth1 up
grep -q "made no progress for 3000 ms" "$WORK/out.txt" && grep -q "stuck: .*->eth1" "$WORK/out.txt" ||
  { cat "$WORK/out.txt"; fail "no stall report naming eth1"; }
[ "$elapsed" -lt 30 ] || fail "the job took $elapsed s to fail after NIC B went down"
echo "ok: NIC B down mid-run -> every rank failed in ${elapsed} s (link down at 3 s), naming the stuck eth1 stream"
echo "cluster test: PASSED"
