#!/bin/sh
# ssh stand-in for OpenMPI's rsh launcher (plm_rsh_agent): runs the command "on" an emulated host, i.e. in
# its network namespace with its own hostname. HOST is a host name (tcl1) or an address 10.79.<nic>.<host+1>.
while [ $# -gt 0 ]; do
  case "$1" in
    -x|-X|-q|-T|-t|-n|-a|-A) shift;;
    -o|-p|-l|-i) shift 2;;
    *) break;;
  esac
done
host="$1"; shift
case "$host" in
  10.79.*.*) ns="${TOPOCCL_CLUSTER_PREFIX:-tcl}$(( ${host##*.} - 1 ))";;
  *) ns="$host";;
esac
ip netns list | awk '{print $1}' | grep -qx "$ns" || { echo "agent.sh: no namespace '$ns' for host '$host'" >&2; exit 255; }
exec ip netns exec "$ns" unshare --uts sh -c "hostname '$ns'; $*"
