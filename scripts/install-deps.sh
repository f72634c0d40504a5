#!/usr/bin/env bash
# Installs everything preflight needs from Debian 12 packages (run as root).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
packages=(
  build-essential cmake ninja-build git
  libcli11-dev nlohmann-json3-dev libyaml-cpp-dev libfmt-dev libeigen3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # simulate's MPI runtime (CMake option PREFLIGHT_WITH_MPI, on by default).
  libopenmpi-dev openmpi-bin
  # scripts/test.sh's fuzz step: clang and its libFuzzer/sanitizer runtimes.
  clang-14 libclang-rt-14-dev
  # scripts/lint.sh: clang-format (with clang-format-diff) and clang-tidy.
  clang-format-14 clang-tidy-14
  # Packaging (cpack -G DEB reads library dependencies with dpkg-shlibdeps)
  # and the man page check (groff).
  dpkg-dev groff-base
  # tests/html_page_test.cc opens the --html pages in a headless browser.
  chromium
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
