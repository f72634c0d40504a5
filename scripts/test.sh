#!/usr/bin/env bash
# The whole test run, as CI runs it (README "Test"; .ci/run calls it after
# scripts/install-deps.sh):
#   1. Release build with -Werror of the CLI, the benchmarks and the tests that
#      need a Release build: the README commands, the install package, MPI
#      parity and the allocation count (which replaces operator new);
#   2. a second tree, build-asan, with AddressSanitizer + UndefinedBehaviorSanitizer
#      (and float-cast-overflow, which GCC leaves out of "undefined")
#      at -O1 with line tables only (-g1: symbolized reports, cheaper to build),
#      the whole GoogleTest suite, compiled and run once, here (any report
#      fails the run). This tree is a unity build (CMAKE_UNITY_BUILD: eight
#      sources a unit; the suite as three executables), which compiles the
#      header code that sources share once a batch: the Release tree keeps
#      one unit a file, as users build it;
#   3. scripts/lint.sh: clang-format on the changed lines and clang-tidy on
#      the changed .cc files since PREFLIGHT_LINT_BASE (default HEAD~1);
#   4. when clang++ and its libFuzzer runtime are installed, libFuzzer runs of
#      30 seconds each over the recipe parser, the Hugging Face importer and
#      the Megatron-LM importer, pricing every input that loads (scripts/fuzz.sh).
# Prints the time of each step. Set PREFLIGHT_JOBS to change parallelism
# (default 2, the CI machine's cores), PREFLIGHT_FUZZ_SECONDS the fuzz time per target
# (0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${PREFLIGHT_JOBS:-2}
fuzz_seconds=${PREFLIGHT_FUZZ_SECONDS:-30}
timings=()

step() {  # step NAME COMMAND...: runs and times one step
  local name=$1 start end
  shift
  echo "==> ${name}"
  start=$(date +%s)
  "$@"
  end=$(date +%s)
  timings+=("$(printf '%-28s %4d s' "${name}" $((end - start)))")
}

release() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPREFLIGHT_WERROR=ON -DPREFLIGHT_UNIT_TESTS=OFF
  cmake --build build -j "${jobs}"
  ctest --test-dir build --output-on-failure -j "${jobs}"
}

sanitized() {
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DPREFLIGHT_SANITIZE="address;undefined;float-cast-overflow" -DPREFLIGHT_WERROR=ON -DPREFLIGHT_BUILD_BENCH=OFF \
    -DCMAKE_UNITY_BUILD=ON
  cmake --build build-asan -j "${jobs}"
  # halt_on_error: the first report fails the test; detect_leaks: LeakSanitizer at exit.
  # Left out of this pass only: the README's commands and the install package,
  # which the Release pass runs on the binary users get.
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "${jobs}" -E '^(readme_commands_test|package_test)$'
}

have_libfuzzer() {
  local cxx=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
  [[ -n "${cxx}" ]] &&
    echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
      "${cxx}" -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null
}

step "release build + ctest" release
step "lint (changed lines and files)" scripts/lint.sh
step "asan+ubsan build + ctest" sanitized
if [[ "${fuzz_seconds}" != 0 ]] && have_libfuzzer; then
  # A fixed seed keeps the CI run reproducible; longer exploratory runs use fuzz.sh directly.
  step "fuzz 3 targets (${fuzz_seconds} s each)" scripts/fuzz.sh "${fuzz_seconds}" -seed=1
else
  echo "==> fuzz: skipped (no clang++ with libFuzzer, or PREFLIGHT_FUZZ_SECONDS=0)"
fi
echo "==> timings"
printf '%s\n' "${timings[@]}"
