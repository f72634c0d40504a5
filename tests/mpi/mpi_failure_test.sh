#!/usr/bin/env bash
# A rank that fails or hangs under the MPI runtime ends the whole job with a
# message naming the rank and its pending operation, within the hang timeout,
# and the thread runtime's exit code for a failed run (1) (ctest
# mpi_failure_test and mpi_hang_test).
# Usage: mpi_failure_test.sh CHECK_BINARY MPIEXEC fail|hang
set -euo pipefail
check="$1"
mpiexec="$2"
mode="$3"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
err="$(mktemp)"
trap 'rm -f "$err"' EXIT
start=$SECONDS
set +e
timeout 60 "$mpiexec" --oversubscribe -np 4 "$check" "$mode" 2 >/dev/null 2>"$err"
rc=$?
set -e
elapsed=$((SECONDS - start))
case "$mode" in
  # Rank 2 threw between the two all-reduces; the thread runtime says "rank 2 failed: <what>".
  fail) patterns=("the simulated ranks failed: rank 2 failed: injected failure") ;;
  # Rank 3 skipped the second all-reduce and finished; 0, 1, 2 wait in it.
  hang) patterns=("deadlock: no pending operation completed within --hang-timeout 2 s;"
                  "rank 0 waits in all_reduce on dp_cp group \[0,1,2,3\] \(8 elements\) #0;"
                  "rank 2 waits in all_reduce on dp_cp group \[0,1,2,3\] \(8 elements\) #0;"
                  "rank 3 finished;") ;;
  *) echo "mode fail or hang" >&2; exit 2 ;;
esac
ok=1
[[ $rc == 1 ]] || { echo "mpi_failure_test $mode: exit $rc, expected 1" >&2; ok=0; }
((elapsed < 30)) || { echo "mpi_failure_test $mode: took $elapsed s" >&2; ok=0; }
for p in "${patterns[@]}"; do
  grep -Eq -- "$p" "$err" || { echo "mpi_failure_test $mode: no '$p' in stderr" >&2; ok=0; }
done
((ok)) || { sed 's/^/    /' "$err" | head -20 >&2; exit 1; }
echo "mpi_failure_test $mode: exit $rc after $elapsed s: $(grep -m1 'failed' "$err")"
