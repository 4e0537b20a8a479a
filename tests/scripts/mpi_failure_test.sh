#!/usr/bin/env bash
# One rank of an mpirun job throws: mpirun must exit non-zero within a few seconds (not hang, not time
# out), and the output must name the failing rank and its reason.
# Usage: mpi_failure_test.sh <mpiexec> <mpi_check> <np> <failing rank>
set -uo pipefail
mpiexec=$1 exe=$2 np=$3 rank=$4
start=$(date +%s%N)
out=$(timeout 60 "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$exe" fail "$rank" 2>&1)
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "$out"
echo "mpi_failure_test: exit code $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ]; then echo "FAIL: mpirun exited 0 although rank $rank failed"; exit 1; fi
if [ "$rc" -eq 124 ]; then echo "FAIL: mpirun hung (killed by timeout after 60 s)"; exit 1; fi
if ! grep -q "rank $rank of $np failed: deliberate failure on rank $rank" <<<"$out"; then
  echo "FAIL: the output does not name rank $rank and its reason"; exit 1
fi
if [ "$elapsed_ms" -gt 15000 ]; then echo "FAIL: took ${elapsed_ms} ms to stop (more than 15 s)"; exit 1; fi
echo "PASS"
