#!/usr/bin/env bash
# Every preflight command shown in a code block of README.md or docs/*.md
# runs as the text says (ctest readme_commands_test): the exit code its
# comment states ("exit 1: ...", "..., exit 0"), or else a verdict (0 or 1), never bad input
# (2) or an internal error (3). Synopsis lines (with [options] or capitalised
# placeholders) are skipped; the placeholders R (a recipe), config.json and
# mamba2-2.7b/config.json get real files. Runs in a scratch copy, so commands
# that write (-o, --svg, > file) leave the source tree alone.
# Usage: readme_commands_test.sh BINARY SOURCE_DIR
set -euo pipefail
binary="$1"
source="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/build" "$work/mamba2-2.7b"
ln -s "$binary" "$work/build/preflight"
cp -r "$source/recipes" "$work/recipes"
cp "$source/tests/data/hf/llama-3.1-8b.json" "$work/config.json"
cp "$source/tests/data/hf/mamba2-2.7b-ssm.json" "$work/mamba2-2.7b/config.json"
export PATH="$work/build:$PATH"

# Code-block lines (fenced or indented by four spaces) that run preflight.
commands() {
  awk '
    /^ *```/ { fenced = !fenced; next }
    { line = $0 }
    fenced || line ~ /^    / {
      sub(/^ +/, "", line)
      if (line ~ /^(build\/)?preflight (validate|fit|plan|sweep|check|diff|simulate|import) /) print FILENAME "\t" line
    }' "$source/README.md" "$source"/docs/*.md
}

ran=0
failed=0
while IFS=$'\t' read -r file line; do
  case "$line" in
    *'['* | *'${{'* | *' A B'* | *CONFIG* | *RECIPE* | *' FILE'* | *' DIR'*) continue ;;  # a synopsis
  esac
  comment=""
  [[ "$line" == *" # "* ]] && comment="${line#* # }" && line="${line%% # *}"
  # The placeholder R: a recipe.
  line="$(sed -E 's#(preflight [a-z]+) R( |$)#\1 recipes/nam56r-h200.yaml\2#' <<<"$line")"
  expected="0|1"
  # "exit 1: see its # WARNING: block", "the same text, exit 0": one stated code.
  if [[ "$comment" =~ (^|, )exit\ ([0-3])(:|$) ]]; then expected="${BASH_REMATCH[2]}"; fi
  set +e
  (cd "$work" && timeout 120 bash -c "$line" >/dev/null 2>"$work/stderr")
  code=$?
  set -e
  ran=$((ran + 1))
  if [[ ! "$code" =~ ^($expected)$ ]]; then
    failed=$((failed + 1))
    echo "readme_commands_test: ${file#"$source"/}: '$line' exited $code, expected $expected" >&2
    sed 's/^/    /' "$work/stderr" | head -5 >&2
  fi
done < <(commands)
echo "readme_commands_test: $ran commands from README.md and docs/ run, $failed failed"
((ran >= 15)) || { echo "readme_commands_test: only $ran commands found; the extraction is broken" >&2; exit 1; }
((failed == 0))
