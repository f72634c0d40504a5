#!/usr/bin/env bash
# The MPI runtime's report is byte-identical to the thread runtime's (ctest
# mpi_parity_test, registered when PREFLIGHT_WITH_MPI is on): for each case,
# `mpirun -np N preflight simulate R ...` and `preflight simulate R ... --runtime
# threads` print the same table and the same JSON and exit alike.
# Usage: mpi_parity_test.sh BINARY SOURCE_DIR MPIEXEC
set -euo pipefail
binary="$1"
source="$2"
mpiexec="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# CI runs as root; Open MPI refuses root without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# No recipe's own scaled layout has 16 ranks or fewer (the smallest is 32),
# so each case caps dp with max_world and, where tp x pp x ep alone exceeds
# 16, shrinks pp or ep. Together they cover dense, MoE (all-to-all), Mamba,
# SP, interleaved 1F1B over pipeline sends, ZeRO-1, a disagreeing run, and
# DeepSeek-V3 as shipped but smaller (DualPipe's mirror groups, MTP, MLA,
# full recompute), Megatron's layer-wise optimizer (uneven all-gathers) and
# HSDP replicas under ZeRO 3.
cases=(
  "8|llama3-8b-h200.yaml|--scale max_world=8"
  "16|llama3-405b-h200.yaml|--set parallel.pp=2 --scale max_world=16"
  "8|mixtral-8x7b-h200.yaml|--scale max_world=8"
  "16|nam56r-h200.yaml|--set parallel.pp=2 --set parallel.ep=4 --scale max_world=16"
  "8|gpt-oss-120b-h200.yaml|--set parallel.ep=8 --scale max_world=8"
  "16|jamba-v0.1-h200.yaml|--scale max_world=16"
  "8|deepseek-v3-h200.yaml|--set parallel.pp=4 --set parallel.ep=2 --scale max_world=8"
  "8|llama3-8b-h200.yaml|--set parallel.optimizer_sharding=layer_wise --scale max_world=8"
  "8|llama3-8b-h200.yaml|--set parallel.dp_replicate=2 --set parallel.zero=3 --scale max_world=8"
)
failed=0
for c in "${cases[@]}"; do
  IFS='|' read -r np recipe extra <<<"$c"
  for format in table json; do
    # shellcheck disable=SC2086
    set +e
    "$binary" simulate "$source/recipes/$recipe" $extra --format "$format" --runtime threads >"$work/threads" 2>/dev/null
    threads_rc=$?
    # shellcheck disable=SC2086
    timeout 300 "$mpiexec" --oversubscribe -np "$np" "$binary" simulate "$source/recipes/$recipe" $extra \
      --format "$format" >"$work/mpi" 2>"$work/mpi.err"
    mpi_rc=$?
    set -e
    if [[ $threads_rc != "$mpi_rc" ]] || ! cmp -s "$work/threads" "$work/mpi" || [[ ! -s "$work/mpi" ]]; then
      failed=$((failed + 1))
      echo "mpi_parity_test: $recipe $extra --format $format: threads exit $threads_rc, mpirun -np $np exit $mpi_rc" >&2
      diff "$work/threads" "$work/mpi" | head -10 >&2 || true
      head -5 "$work/mpi.err" >&2
    else
      echo "mpi_parity_test: $recipe $extra --format $format on $np ranks: identical (exit $mpi_rc)"
    fi
  done
done
((failed == 0))
