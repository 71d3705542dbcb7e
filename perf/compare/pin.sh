#!/usr/bin/env bash
# Pins an MPI rank to one CPU, for runs where ranks are bound and outnumber the cores:
#   PIN=pairs mpirun -np 4 --oversubscribe perf/compare/pin.sh PROGRAM ARGS...
# PIN=pairs: ranks 2k and 2k+1 share CPU k mod CPUs (as mpirun --bind-to core --oversubscribe --map-by core
# places them when each core takes two); PIN=spread: rank r on CPU r mod CPUs; unset or none: no pinning.
set -euo pipefail
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
cpus=$(nproc --all)  # not nproc: mpirun may already have bound this rank to one CPU
case ${PIN:-none} in
  pairs) exec taskset -c $(((rank / 2) % cpus)) "$@" ;;
  spread) exec taskset -c $((rank % cpus)) "$@" ;;
  none) exec "$@" ;;
  *) echo "pin.sh: PIN=${PIN} is not pairs, spread or none" >&2; exit 2 ;;
esac
