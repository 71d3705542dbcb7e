#!/usr/bin/env bash
# An emulated cluster on one Linux machine: hosts are network namespaces, NICs are veth pairs shaped
# with tbf, one bridge per NIC index (a "rail") in a switch namespace. Needs root.
#
#   cluster.sh up [-n HOSTS] [-k NICS] [-r RATES] [-d DELAYS] [-p PREFIX]
#       RATES: one per NIC index, e.g. 2gbit,500mbit ("0": unshaped). DELAYS: one-way, e.g. 50us (needs
#       sch_netem in the kernel; refused with a clear message where it is missing).
#   cluster.sh down [-p PREFIX]         removes the namespaces and every process left inside them
#   cluster.sh status [-p PREFIX]       addresses, byte counters and qdiscs per NIC
#   cluster.sh counters [-p PREFIX]     "HOST NIC TX_BYTES RX_BYTES" per line, for tests to diff
#   cluster.sh topology [-p PREFIX] [-s RANKS_PER_HOST] [--nics 0,1]   the cluster file (JSON, topoccl-cluster
#       v1), with every NIC or only the listed ones
#   cluster.sh calibrate -b BUILD_DIR [-p PREFIX] [-s RANKS_PER_HOST]   the cluster file with each NIC's alpha and
#       TCP goodput fitted from sendrecv_perf between hosts 0 and 1 over that NIC alone (8 B, 1 MiB, 16 MiB)
#   cluster.sh exec HOST -- CMD...      run CMD on HOST (its namespace, hostname HOST)
#   cluster.sh mpirun [-p PREFIX] [-s RANKS_PER_HOST] [-T SECONDS] [--nics 0,1] [MPIRUN-ARGS] -- PROG ARGS
#       OpenMPI across the hosts: mpirun runs inside host 0, orted reaches the others through agent.sh.
#
# Host j is namespace PREFIX<j> with hostname PREFIX<j>; its NIC i is eth<i> with address
# 10.79.<i+1>.<j+1>/24 on bridge br<i>. State: /run/topoccl-cluster/PREFIX.env.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE_DIR=/run/topoccl-cluster
HOSTS=2 NICS=2 RATES="2gbit,500mbit" DELAYS="0" PREFIX=tcl SLOTS=1 TIMEOUT=300 NICSEL="" BUILD=""
ALPHA=() GOODPUT=()  # per NIC index, filled by calibrate

die() { echo "cluster.sh: $*" >&2; exit 1; }
usage() { awk 'NR>1 && /^#/{sub(/^# ?/,""); print; next} NR>1{exit}' "$0"; }

cmd="${1:-}"; [ -n "$cmd" ] || { usage; exit 2; }; shift
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) HOSTS="$2"; shift 2;;
    -k) NICS="$2"; shift 2;;
    -r) RATES="$2"; shift 2;;
    -d) DELAYS="$2"; shift 2;;
    -p) PREFIX="$2"; shift 2;;
    -s) SLOTS="$2"; shift 2;;
    -T) TIMEOUT="$2"; shift 2;;
    -b) BUILD="$2"; shift 2;;
    --nics) NICSEL="$2"; shift 2;;
    -h|--help) usage; exit 0;;
    --) shift; break;;
    *) if [ "$cmd" = exec ] && [ -z "${EXEC_HOST:-}" ]; then EXEC_HOST="$1"; shift
       elif [ "$cmd" = mpirun ]; then EXTRA+=("$1"); shift
       else die "unknown option '$1' for $cmd"; fi;;
  esac
done
[[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,6}$ ]] || die "-p: prefix must match [a-z][a-z0-9]{0,6}, got '$PREFIX'"
STATE="$STATE_DIR/$PREFIX.env"
SW="${PREFIX}sw"

nth() { local IFS=,; local a=($1); local i=$2; [ "$i" -lt "${#a[@]}" ] && echo "${a[$i]}" || echo "${a[${#a[@]}-1]}"; }
# "2gbit" -> bit/s
to_bps() {
  local v="${1,,}"
  [[ "$v" =~ ^([0-9]+(\.[0-9]+)?)([kmg]?)(bit)?$ ]] || die "-r: bad rate '$1' (e.g. 2gbit, 500mbit, 0)"
  awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
    'BEGIN{m=1; if(u=="k")m=1e3; if(u=="m")m=1e6; if(u=="g")m=1e9; printf "%d\n", n*m}'
}
to_us() {
  local v="${1,,}"
  [[ "$v" =~ ^([0-9]+)(us|ms)?$ ]] || die "-d: bad delay '$1' (e.g. 50us, 1ms, 0)"
  [ "${BASH_REMATCH[2]}" = ms ] && echo $((BASH_REMATCH[1] * 1000)) || echo "${BASH_REMATCH[1]}"
}
need_root() { [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"; }
load() { [ -e "$STATE" ] || die "cluster '$PREFIX' is not up (cluster.sh up -p $PREFIX)"; . "$STATE"; }
in_host() { local h="$1"; shift; ip netns exec "$h" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$h" "$@"; }

shape() {  # namespace device bit/s delay_us
  local ns="$1" dev="$2" bps="$3" dus="$4" parent=root burst
  if [ "$dus" -gt 0 ]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "${dus}us" limit 100000 2>/dev/null ||
      die "-d: this kernel has no sch_netem, so delay cannot be emulated here (rates still can: drop -d)"
    parent="parent 1:1"
  fi
  if [ "$bps" -gt 0 ]; then
    # burst >= 1 ms of data and >= 128 KiB so tbf need not split GSO packets: the long-run rate stays exact.
    burst=$((bps / 8 / 1000)); [ "$burst" -lt 131072 ] && burst=131072
    tc -n "$ns" qdisc add dev "$dev" $parent handle 10: tbf rate "${bps}bit" burst "$burst" latency 20ms
  fi
}

up() {
  need_root
  [ -e "$STATE" ] && die "cluster '$PREFIX' is already up; cluster.sh down -p $PREFIX first"
  [ "$HOSTS" -ge 1 ] && [ "$HOSTS" -le 64 ] || die "-n: hosts must be 1..64, got $HOSTS"
  [ "$NICS" -ge 1 ] && [ "$NICS" -le 4 ] || die "-k: NICs per host must be 1..4, got $NICS"
  mkdir -p "$STATE_DIR"
  printf 'HOSTS=%s\nNICS=%s\nRATES=%s\nDELAYS=%s\n' "$HOSTS" "$NICS" "$RATES" "$DELAYS" > "$STATE"
  trap 'echo "cluster.sh: up failed; removing what it made" >&2; down_quiet' ERR
  ip netns add "$SW"; ip -n "$SW" link set lo up
  for ((i = 0; i < NICS; i++)); do
    ip -n "$SW" link add "br$i" type bridge stp_state 0 forward_delay 0; ip -n "$SW" link set "br$i" up
  done
  local names; names="$(printf '127.0.0.1 localhost\n'; for ((j = 0; j < HOSTS; j++)); do echo "10.79.1.$((j + 1)) $PREFIX$j"; done)"
  for ((j = 0; j < HOSTS; j++)); do
    local h="$PREFIX$j"
    ip netns add "$h"; ip -n "$h" link set lo up
    # "ip netns exec" bind-mounts this over /etc/hosts, so OpenMPI resolves the host names.
    mkdir -p "/etc/netns/$h"; echo "$names" > "/etc/netns/$h/hosts"
    for ((i = 0; i < NICS; i++)); do
      local port="h${j}n$i"
      ip link add "$port" netns "$SW" type veth peer name "eth$i" netns "$h"
      ip -n "$SW" link set "$port" master "br$i" up
      ip -n "$h" addr add "10.79.$((i + 1)).$((j + 1))/24" dev "eth$i"
      ip -n "$h" link set "eth$i" up
      local bps dus; bps="$(to_bps "$(nth "$RATES" "$i")")"; dus="$(to_us "$(nth "$DELAYS" "$i")")"
      shape "$h" "eth$i" "$bps" "$dus"  # what the host sends
      shape "$SW" "$port" "$bps" 0      # what it receives: the link is full duplex at the rate
    done
  done
  trap - ERR
  echo "cluster.sh: $HOSTS hosts x $NICS NICs up (rates $RATES, delays $DELAYS), prefix $PREFIX" >&2
}

down_quiet() {
  local ns pid
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${PREFIX}([0-9]+|sw)$" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
  done
  sleep 0.2
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${PREFIX}([0-9]+|sw)$" || true); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    case "$ns" in *sw) ;; *) rm -rf "/etc/netns/$ns";; esac
  done
  rm -f "$STATE"
}

counters() {
  load
  for ((j = 0; j < HOSTS; j++)); do
    for ((i = 0; i < NICS; i++)); do
      echo "$PREFIX$j eth$i $(ip netns exec "$PREFIX$j" cat /sys/class/net/eth$i/statistics/tx_bytes)" \
        "$(ip netns exec "$PREFIX$j" cat /sys/class/net/eth$i/statistics/rx_bytes)"
    done
  done
}

status() {
  load
  echo "cluster $PREFIX: $HOSTS hosts x $NICS NICs, rates $RATES, delays $DELAYS"
  for ((j = 0; j < HOSTS; j++)); do
    for ((i = 0; i < NICS; i++)); do
      printf '  %-6s eth%d 10.79.%d.%d  tx %-12s rx %-12s %s\n' "$PREFIX$j" "$i" $((i + 1)) $((j + 1)) \
        "$(ip netns exec "$PREFIX$j" cat /sys/class/net/eth$i/statistics/tx_bytes)" \
        "$(ip netns exec "$PREFIX$j" cat /sys/class/net/eth$i/statistics/rx_bytes)" \
        "$(tc -n "$PREFIX$j" qdisc show dev "eth$i" | head -1 | awk '{print $2, $7, $8}')"
    done
  done
}

# The cluster file: hosts, ranks per host, NICs with address, speed and rail, and which local ranks sit
# nearest each NIC (local rank r nearest NIC r mod NICS, as GPU r under the PCIe switch of NIC r).
topology() {
  load
  local gbps
  printf '{\n  "format": "topoccl-cluster",\n  "version": 1,\n  "name": "%s-%dx%d",\n  "hosts": [\n' "$PREFIX" "$HOSTS" "$NICS"
  for ((j = 0; j < HOSTS; j++)); do
    printf '    {"name": "%s", "ranks": %d, "nics": [' "$PREFIX$j" "$SLOTS"
    local first=1
    for ((i = 0; i < NICS; i++)); do
      if [ -n "$NICSEL" ] && [[ ",$NICSEL," != *",$i,"* ]]; then continue; fi
      gbps="$(awk -v b="$(to_bps "$(nth "$RATES" "$i")")" 'BEGIN{printf "%g", b / 1e9}')"
      local near="" r
      for ((r = i; r < SLOTS; r += NICS)); do near+="${near:+, }$r"; done
      local fitted=""
      [ -n "${ALPHA[$i]:-}" ] && fitted=", \"alpha_us\": ${ALPHA[$i]}, \"goodput_gbps\": ${GOODPUT[$i]}"
      printf '%s\n      {"name": "eth%d", "address": "10.79.%d.%d", "gbps": %s, "rail": %d, "near_ranks": [%s]%s}' \
        "$([ "$first" = 0 ] && echo ,)" "$i" $((i + 1)) $((j + 1)) "$gbps" "$i" "$near" "$fitted"
      first=0
    done
    printf ']}%s\n' "$([ "$j" -lt $((HOSTS - 1)) ] && echo ,)"
  done
  printf '  ]\n}\n'
}

# For each NIC: a cluster file listing only that NIC, one rank on each of hosts 0 and 1, sendrecv_perf both
# ways at once (with more hosts in the ring, ranks sharing the machine's 2 cores would measure the CPU); alpha = the 8-byte time, goodput from the 1 -> 16 MiB slope. Progress goes to stderr.
calibrate() {
  load
  [ "$HOSTS" -ge 2 ] || die "calibrate needs >= 2 hosts"
  [ -x "$BUILD/perf/sendrecv_perf" ] || die "calibrate: -b BUILD_DIR must hold perf/sendrecv_perf"
  local work i; work="$(mktemp -d /tmp/topoccl-calibrate.XXXXXX)"
  for ((i = 0; i < NICS; i++)); do
    local rate; rate="$(to_bps "$(nth "$RATES" "$i")")"
    printf '{"format": "topoccl-cluster", "version": 1, "hosts": [\n' > "$work/nic$i.json"
    for ((j = 0; j < HOSTS; j++)); do
      printf '  {"name": "%s", "ranks": 1, "nics": [{"name": "eth%d", "address": "10.79.%d.%d", "gbps": %s}]}%s\n' \
        "$PREFIX$j" "$i" $((i + 1)) $((j + 1)) "$(awk -v b="$rate" 'BEGIN{printf "%g", (b > 0 ? b : 1e10) / 1e9}')" \
        "$([ "$j" -lt $((HOSTS - 1)) ] && echo ,)" >> "$work/nic$i.json"
    done
    echo ']}' >> "$work/nic$i.json"
    echo "cluster.sh: calibrating eth$i ($(nth "$RATES" "$i"))..." >&2
    (SLOTS=1; JOB_HOSTS=2; EXTRA=(-x TOPOCCL_CLUSTER_FILE="$work/nic$i.json")
     run_mpi "$BUILD/perf/sendrecv_perf" -b 8 -e 16M -f 2 -n 5 -w 2 -c 0) > "$work/out$i.txt" 2>&1 ||
      { cat "$work/out$i.txt" >&2; rm -rf "$work"; die "calibration run over eth$i failed"; }
    read -r ALPHA[$i] GOODPUT[$i] < <(awk '$1 ~ /^[0-9]+$/ { t[$1] = $6 }
      END { b = (t[16777216] - t[1048576]) / (16777216 - 1048576); printf "%.1f %.4f\n", t[8], 8e-3 / b }' "$work/out$i.txt")
    echo "cluster.sh: eth$i alpha ${ALPHA[$i]} us, goodput ${GOODPUT[$i]} Gbit/s" >&2
  done
  rm -rf "$work"
  topology
}

run_mpi() {
  load
  command -v mpirun >/dev/null || die "mpirun not found (apt-get install openmpi-bin)"
  [ $# -ge 1 ] || die "mpirun: nothing to run (cluster.sh mpirun [-s N] -- PROGRAM ARGS)"
  local hostfile; hostfile="$(mktemp /tmp/topoccl-cluster-hosts.XXXXXX)"
  local hosts="${JOB_HOSTS:-$HOSTS}"  # calibrate runs on the first two hosts only
  for ((j = 0; j < hosts; j++)); do echo "$PREFIX$j slots=$SLOTS" >> "$hostfile"; done
  local btl="10.79.1.0/24"
  if [ -n "$NICSEL" ]; then btl=""; for i in ${NICSEL//,/ }; do btl+="${btl:+,}10.79.$((i + 1)).0/24"; done; fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TOPOCCL_CLUSTER_PREFIX="$PREFIX"
  local line; line=$(printf '%q ' timeout -k 5 "$TIMEOUT" mpirun --hostfile "$hostfile" -np $((hosts * SLOTS)) \
    --map-by "ppr:$SLOTS:node" --bind-to none --mca plm_rsh_agent "$HERE/agent.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include 10.79.1.0/24 --mca btl tcp,self,vader --mca btl_tcp_if_include "$btl" \
    "${EXTRA[@]}" "$@")
  local rc=0
  in_host "${PREFIX}0" sh -c "$line" || rc=$?
  rm -f "$hostfile"
  # A failed job may leave orted or ranks behind in the hosts: end them by PID.
  for ((j = 0; j < HOSTS; j++)); do
    for pid in $(ip netns pids "$PREFIX$j" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  return $rc
}

case "$cmd" in
  up) up;;
  down) need_root; down_quiet; echo "cluster.sh: $PREFIX removed" >&2;;
  status) status;;
  counters) counters;;
  topology) topology;;
  calibrate) calibrate;;
  exec) load; [ -n "${EXEC_HOST:-}" ] || die "exec: which host?"; in_host "$EXEC_HOST" "$@";;
  mpirun) run_mpi "$@";;
  *) die "unknown command '$cmd' (up, down, status, counters, topology, exec, mpirun)";;
esac
