#!/usr/bin/env bash
# Builds the libFuzzer target over the recipe parser (tests/fuzz) with clang,
# ASan and UBSan, and fuzzes it for SECONDS (default 60). The seed corpus in
# tests/fuzz/corpus stays untouched; new inputs go to build-fuzz/corpus and a
# crash, leak or timeout to build-fuzz/artifacts/ (the run then fails).
# Usage: scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
# Debian's clang-14 package installs clang++-14; the clang package adds clang++.
fuzz_cxx=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || echo clang++)}
CXX=${fuzz_cxx} cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DPREFLIGHT_FUZZ=ON -DPREFLIGHT_WERROR=ON \
  -DPREFLIGHT_BUILD_TESTS=OFF -DPREFLIGHT_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target recipe_fuzz
mkdir -p build-fuzz/corpus build-fuzz/artifacts
# Leaks are checked at exit and in each input (-detect_leaks=1, the default
# with ASan); -timeout is per input, -rss_limit_mb for the whole process.
build-fuzz/tests/fuzz/recipe_fuzz build-fuzz/corpus tests/fuzz/corpus \
  -dict=tests/fuzz/recipe.dict -max_total_time="$seconds" -timeout=2 -rss_limit_mb=2048 -max_len=16384 \
  -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/ "$@"
