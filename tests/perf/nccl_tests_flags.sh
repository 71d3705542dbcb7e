#!/usr/bin/env bash
# Checks of the nccl-tests flags whose effect a regular expression cannot see (tests/CMakeLists.txt, "perf:"):
#   nccl_tests_flags.sh per-iter BUILD_DIR   -I/-K/-S: per-iteration statistics that hang together, a timestamp
#   nccl_tests_flags.sh timeout BUILD_DIR threads|MPIRUN ARGS...   -T: a rank that stops calling ends the run, in
#     time; 3 ranks as threads of one process, or as the processes the given launcher starts
# Prints "PASSED" as its last line when every check holds.
set -euo pipefail
what=$1 build=$2
shift 2
fail() { echo "FAILED: $*" >&2; exit 1; }

case $what in
  per-iter)
    # CSV: per block, min <= p50 <= p95 <= p99 <= max and min <= avg <= max. Units: an iteration's slowest rank takes
    # at most the sum of the ranks' times for it, so i_min <= i_avg <= 3 ranks x the time column (the mean of the
    # ranks' loop times, which only gaps between iterations, such as a preemption, can raise). No speed is assumed.
    out=$("$build/perf/all_reduce_perf" -t 3 -b 8 -e 256K -f 8 -n 40 -w 2 -c 1 -I 1 -S 1 --csv)
    echo "$out"
    echo "$out" | awk -F, '
      NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
      {
        rows++
        for (b = 0; b < 2; ++b) {
          p = b ? "ip" : "oop"
          mn = $col[p "_i_min_us"]; mx = $col[p "_i_max_us"]; avg = $col[p "_i_avg_us"]
          p50 = $col[p "_i_p50_us"]; p95 = $col[p "_i_p95_us"]; p99 = $col[p "_i_p99_us"]; t = $col[p "_time_us"]
          if (!(mn > 0 && mn <= p50 && p50 <= p95 && p95 <= p99 && p99 <= mx)) { print "FAILED: order of " p " percentiles in row " NR ": " $0; bad = 1 }
          if (!(mn <= avg && avg <= mx)) { print "FAILED: " p " i_avg outside [i_min, i_max] in row " NR; bad = 1 }
          if (!(mn <= 3 * t * 1.001 + 0.01)) { print "FAILED: " p " i_min " mn " us above 3 ranks x time " t " us in row " NR; bad = 1 }
          if ($col[p "_wrong"] != 0) { print "FAILED: wrong results in row " NR; bad = 1 }
        }
        if ($col["timestamp"] !~ /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]$/) { print "FAILED: timestamp " $col["timestamp"]; bad = 1 }
      }
      END { if (rows != 6) { print "FAILED: " rows " rows, expected 6"; bad = 1 } exit bad }'
    # -K: the statistics count the iterations after the skipped ones.
    json=$("$build/perf/alltoall_perf" -t 2 -b 64 -e 64 -n 30 -w 1 -c 1 -I 1 -K 7 --json)
    [ "$(grep -c '"counted_iterations": 23,' <<<"$json")" = 2 ] || fail "-K 7 of -n 30 did not count 23 iterations: $json"
    [ "$(grep -c '"skipped_iterations": 7' <<<"$json")" = 2 ] || fail "-K 7 not reported"
    # The table: four more columns per block and the timestamp, as nccl-tests prints them.
    table=$("$build/perf/reduce_scatter_perf" -t 2 -b 1K -e 1K -n 5 -w 0 -I 1 -S 1)
    grep -q 'i_min    i_max    i_p99    i_cv%     time' <<<"$table" || fail "no per-iteration columns: $table"
    grep -Eq '^ +1024 +128 +float +sum +-1( +[0-9.e+-]+){4}( +[0-9.e+-]+){4}( +[0-9.e+-]+){4}( +[0-9.e+-]+){4} +20[0-9-]+ [0-9:]+$' <<<"$table" ||
      fail "a row is not size, count, type, redop, root, 2 x (4 + 4) numbers, a timestamp: $table"
    # A skip that leaves nothing is refused with the flags named.
    if err=$("$build/perf/all_reduce_perf" -t 2 -n 5 -I 1 -K 5 2>&1); then fail "-K 5 of -n 5 was accepted"; fi
    grep -q -- '-K/--per_iter_skip 5 must be >= 0 and leave some of the 5 iterations of -n/--iters' <<<"$err" || fail "message: $err"
    ;;
  timeout)
    # Rank 1 stops calling before its first size; the others wait in their first call. -T 1 must end the run with
    # "Test timeout" naming the rank, the call and the phase, well before TOPOCCL_TIMEOUT_MS (raised so it cannot).
    launcher=() ranks=(-t 3)
    if [ "$1" != threads ]; then launcher=("$@") ranks=(); fi
    start=$(date +%s)
    set +e
    out=$(TOPOCCL_TIMEOUT_MS=600000 timeout 120 ${launcher[@]+"${launcher[@]}"} "$build/perf/all_reduce_perf" ${ranks[@]+"${ranks[@]}"} -b 1K -e 1K -n 5 -c 1 \
          -T 1 --stall-rank 1 2>&1)
    rc=$?
    set -e
    elapsed=$(($(date +%s) - start))
    echo "$out"
    echo "exit $rc after $elapsed s"
    [ "$rc" -ne 0 ] || fail "the run succeeded with a rank that never calls"
    [ "$rc" -ne 124 ] || fail "-T did not end the run within 120 s"
    [ "$elapsed" -le 30 ] || fail "-T 1 took $elapsed s to end the run"
    grep -Eq 'Test timeout: rank [02]: all_reduce of 1024 B float sum out of place, warm-up call 1 has waited [0-9.]+ s, over the -T/--timeout of 1 s' <<<"$out" ||
      fail "no 'Test timeout' naming the rank and the call"
    ;;
  *) fail "unknown check '$what' (per-iter, timeout)" ;;
esac
echo PASSED
