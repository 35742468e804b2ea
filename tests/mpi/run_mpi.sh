#!/usr/bin/env bash
# Runs an MPI program on N ranks of this machine, over shared memory and loopback only;
# exits 77 (skipped) where the build found no MPI or no mpirun is installed.
# usage: run_mpi.sh RANKS PROGRAM [ARGS...]   (PROGRAM "none": built without MPI)
set -uo pipefail
ranks=$1 program=$2
shift 2
if [ "$program" = none ]; then
  echo "SKIP: the build found no MPI (apt-get install openmpi-bin libopenmpi-dev, then reconfigure)"
  exit 77
fi
mpirun=$(command -v mpirun || true)
[ -n "$mpirun" ] || { echo "SKIP: no mpirun on PATH"; exit 77; }
flags=()
if "$mpirun" --version 2>/dev/null | grep -q "Open MPI"; then
  # More ranks than cores, root in containers, and no network: shared memory (without the
  # cross-memory attach containers forbid) and the process itself.
  flags=(--oversubscribe --allow-run-as-root --mca btl self,vader
         --mca btl_vader_single_copy_mechanism none --mca oob_tcp_if_include lo)
fi
exec "$mpirun" "${flags[@]}" -np "$ranks" "$program" "$@"
