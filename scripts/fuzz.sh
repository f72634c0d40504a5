#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan (a
# unity build: eight sources a unit, less to compile), and
# fuzzes each for SECONDS (default 30): the recipe parser with --set overrides
# (recipe_fuzz), the Hugging Face importer (hf_import_fuzz) and the Megatron-LM
# importer (megatron_import_fuzz). Every input that loads is priced as `plan`
# prices it; each run ends with a "fuzz reach" line giving the share of inputs
# that were valid recipes and the share priced. The seed corpora in tests/fuzz
# stay untouched; new inputs go to build-fuzz/corpus-TARGET and a crash, leak
# or timeout to build-fuzz/artifacts/ (the run then fails).
# Usage: scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
shift || true
# Debian's clang-14 package installs clang++-14; the clang package adds clang++.
fuzz_cxx=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || echo clang++)}
CXX=${fuzz_cxx} cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DPREFLIGHT_FUZZ=ON -DPREFLIGHT_WERROR=ON \
  -DPREFLIGHT_BUILD_TESTS=OFF -DPREFLIGHT_BUILD_BENCH=OFF -DPREFLIGHT_WITH_MPI=OFF -DCMAKE_UNITY_BUILD=ON >/dev/null
cmake --build build-fuzz --target recipe_fuzz hf_import_fuzz megatron_import_fuzz
mkdir -p build-fuzz/artifacts

fuzz() {  # fuzz TARGET SEED_CORPUS DICT [extra flags]
  local target=$1 seeds=$2 dict=$3
  shift 3
  mkdir -p "build-fuzz/corpus-${target}"
  echo "==> ${target} for ${seconds} s"
  # Leaks are checked at exit and in each input (-detect_leaks=1, the default
  # with ASan); -timeout is per input, -rss_limit_mb for the whole process.
  # A recipe at the layer bound (100,000 Mamba layers: loaded twice and priced
  # as `plan` prices it, 0.3 s in Release) takes 5-6 s of CPU under ASan+UBSan
  # at -O1, linear in the layers (tests/fuzz/corpus/regression_layer_bound); a
  # hang still passes 20 s.
  "build-fuzz/tests/fuzz/${target}" "build-fuzz/corpus-${target}" "${seeds}" -dict="${dict}" \
    -max_total_time="${seconds}" -timeout=20 -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/artifacts/${target}-" "$@"
}

fuzz recipe_fuzz tests/fuzz/corpus tests/fuzz/recipe.dict "$@"
fuzz hf_import_fuzz tests/fuzz/corpus_hf tests/fuzz/hf.dict "$@"
fuzz megatron_import_fuzz tests/fuzz/corpus_megatron tests/fuzz/megatron.dict "$@"
