#!/usr/bin/env bash
# Layout and static checks on what a change touches (scripts/test.sh runs it
# after the Release build, which writes build/compile_commands.json):
#   - clang-format (.clang-format) on the changed lines of C++ files;
#   - clang-tidy (.clang-tidy) on the changed .cc files of the libraries and CLI.
# The change is everything since PREFLIGHT_LINT_BASE (default HEAD~1); with no
# such commit (a first commit, a shallow clone) there is nothing to compare.
# Exits 1 on any finding, printing it.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${PREFLIGHT_LINT_BASE:-HEAD~1}
build=${PREFLIGHT_LINT_BUILD:-build}
format_diff=$(command -v clang-format-diff-14 || command -v clang-format-diff || true)
tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)

if ! git rev-parse --verify --quiet "${base}^{commit}" >/dev/null; then
  echo "lint: no base commit ${base}; nothing to check"
  exit 0
fi
status=0

if [[ -n "${format_diff}" ]]; then
  layout=$(git diff -U0 --no-color "${base}" -- '*.cc' '*.h' | "${format_diff}" -p1 -style=file || true)
  if [[ -n "${layout}" ]]; then
    echo "lint: changed lines that .clang-format would lay out differently:"
    echo "${layout}"
    status=1
  fi
else
  echo "lint: clang-format-diff not installed; layout not checked"
fi

mapfile -t sources < <(git diff --name-only --diff-filter=d "${base}" -- \
  'src/*.cc' 'estimator/*.cc' 'planner/*.cc' 'simulator/*.cc')
if [[ -n "${tidy}" && ${#sources[@]} -gt 0 ]]; then
  if [[ ! -f "${build}/compile_commands.json" ]]; then
    echo "lint: ${build}/compile_commands.json missing; configure the build first" >&2
    exit 2
  fi
  for f in "${sources[@]}"; do
    if ! out=$("${tidy}" -p "${build}" --quiet "${f}" 2>/dev/null) || grep -q "warning:\|error:" <<<"${out}"; then
      echo "${out}"
      status=1
    fi
  done
fi
if ((status == 0)); then echo "lint: ok (${#sources[@]} changed source files since ${base})"; fi
exit "${status}"
