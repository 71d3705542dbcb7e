# Reads `ss -tnpi` in a host: per all_reduce_perf process, the NICs (10.79.<nic>.x) of its sockets that sent more
# than 1 MB, i.e. its data streams (bootstrap sockets carry kilobytes). Used by cluster_test.sh.
/users:\(\("all_reduce_perf"/ { split($0, f, /[ \t]+/); local = ""; for (i = 1; i <= NF; i++) if ($i ~ /^10\.79\./) { local = $i; break }
  match($0, /pid=[0-9]+/); pid = substr($0, RSTART + 4, RLENGTH - 4); want = 1; next }
want { want = 0; if (match($0, /bytes_sent:[0-9]+/) && substr($0, RSTART + 11, RLENGTH - 11) + 0 > 1000000 && local != "") {
  split(local, a, "."); nics[pid] = nics[pid] (index(nics[pid], "nic" a[3]) ? "" : " nic" a[3]) } }
END { for (p in nics) print p nics[p] }
