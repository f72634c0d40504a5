#!/usr/bin/env bash
# The "limits" table of bench/README.md: for each command, the deepest recipe
# (the default recipe with pattern AEME repeated N times: 4N layers) it
# finishes within 1 s and within 10 s on one core, with its peak memory; for
# sweep, the widest space (and its size) on two shipped
# recipes over wide axes. Pinned to one core with taskset. Prints Markdown rows.
# Usage: bench/limits.sh [BUILD_DIR]   (a Release build; default build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build}/preflight
recipe=recipes/nam56r-h200.yaml
core="taskset -c 0"

timing=$(mktemp)
trap 'rm -f "$timing"' EXIT
seconds_and_kb() {  # seconds_and_kb CMD...: prints "SECONDS KB" of one run (exit status ignored)
  /usr/bin/time -f "%e %M" -o "$timing" $core "$@" >/dev/null 2>&1 || true
  tail -1 "$timing"
}

deep() {  # deep VERB N [args]: the command on the 4N-layer recipe
  local verb=$1 n=$2
  shift 2
  case $verb in
    diff) echo "$bin diff $recipe $recipe --set model.pattern=AEME --set model.repeat=$n $*" ;;
    check) # check reads files only: write the deep recipe once
      local f=/tmp/preflight-limits-$n.yaml
      "$bin" validate "$recipe" >/dev/null
      sed -e "s/^  pattern: .*/  pattern: AEME/" -e "s/^  repeat: .*/  repeat: $n/" "$recipe" >"$f"
      echo "$bin check $f" ;;
    *) echo "$bin $verb $recipe --set model.pattern=AEME --set model.repeat=$n $*" ;;
  esac
}

largest() {  # largest VERB BOUND: the largest N (of a doubling then bisection) within BOUND seconds
  local verb=$1 bound=$2 lo=0 hi=1 t kb best_kb=0
  while :; do
    read -r t kb < <(seconds_and_kb $(deep "$verb" "$hi"))
    if awk -v t="$t" -v b="$bound" 'BEGIN{exit !(t <= b)}'; then
      lo=$hi best_kb=$kb
      [[ $hi -ge 25000 ]] && break
      hi=$((hi * 2 > 25000 ? 25000 : hi * 2))
    else
      break
    fi
  done
  if [[ $lo -lt 25000 ]]; then
    while ((hi - lo > lo / 20 + 1)); do
      local mid=$(((lo + hi) / 2))
      read -r t kb < <(seconds_and_kb $(deep "$verb" "$mid"))
      if awk -v t="$t" -v b="$bound" 'BEGIN{exit !(t <= b)}'; then lo=$mid best_kb=$kb; else hi=$mid; fi
    done
  fi
  echo "$((lo * 4)) layers, $((best_kb / 1024)) MiB"
}

echo "| command | within 1 s | within 10 s |"
echo "| --- | --- | --- |"
for verb in validate fit plan check diff; do
  echo "| \`$verb\` | $(largest "$verb" 1) | $(largest "$verb" 10) |"
done

# sweep: 16,384 GPUs, every integer degree in tp 1..8, cp 1..8, vpp 1..8,
# micro-batch 1..8 (ep, expert_tp, recompute, zero at their defaults) and pp
# 1..N, N doubling until a run takes longer than the bound.
sweep_largest() {  # sweep_largest RECIPE BOUND
  local r=$1 bound=$2 n=1 best="none" t kb size
  local axes=(--gpus 16384 --threads 1 --tp 1..8 --cp 1..8 --vpp 1..8 --micro-batch 1..8)
  while ((n <= 128)); do
    read -r t kb < <(seconds_and_kb "$bin" sweep "$r" "${axes[@]}" --pp "1..$n" --format csv)
    awk -v t="$t" -v b="$bound" 'BEGIN{exit !(t <= b)}' || break
    size=$("$bin" sweep "$r" "${axes[@]}" --pp "1..$n" 2>/dev/null | grep -o '^[0-9]* layouts' | head -1 || true)
    [[ -n $size ]] || break  # refused: not a sweep that ran
    best="pp 1..$n: $size in $t s, $((kb / 1024)) MiB"
    n=$((n * 2))
  done
  echo "$best"
}
echo
echo "| sweep on 16,384 GPUs, one thread | within 1 s | within 10 s |"
echo "| --- | --- | --- |"
for r in recipes/llama3-405b-h200.yaml recipes/deepseek-v3-h200.yaml; do
  echo "| \`$(basename "$r")\` | $(sweep_largest "$r" 1) | $(sweep_largest "$r" 10) |"
done
