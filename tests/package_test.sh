#!/usr/bin/env bash
# Installing preflight (ctest package_test): `cmake --install` puts the
# binary, man page, bash completion, recipes and docs where Debian expects
# them and the installed binary runs; the man page renders without warnings
# and documents every command and every option the binary's --help lists
# (and no option it lacks); the completion completes commands, options and
# values; `cpack -G DEB` builds a .deb holding the same files, its
# dependencies read off the binary.
# Usage: package_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
source="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "package_test: $*" >&2
  exit 1
}

# 1. cmake --install
cmake --install "$build" --prefix "$work/usr" >/dev/null
for f in bin/preflight share/man/man1/preflight.1 share/bash-completion/completions/preflight \
  share/preflight/recipes/nam56r-h200.yaml share/doc/preflight/README.md share/doc/preflight/docs/recipe.md \
  share/doc/preflight/docs/glossary.md; do
  [[ -f "$work/usr/$f" ]] || fail "cmake --install did not write $f"
done
bin="$work/usr/bin/preflight"
version_line="$("$bin" --version)"
grep -q "^preflight [0-9.]* (git " <<<"$version_line" || fail "installed --version: $version_line"
"$bin" fit "$work/usr/share/preflight/recipes/nam56r-h200.yaml" >/dev/null || fail "installed binary cannot fit the installed default recipe"

# 2. The man page: renders cleanly, every command and option is in it.
man="$work/usr/share/man/man1/preflight.1"
warnings="$(groff -man -Tutf8 -ww -z "$man" 2>&1)" || fail "groff failed on the man page"
[[ -z "$warnings" ]] || fail "man page warnings: $warnings"
version="$("$bin" --version | awk '{print $2}')"
grep -q "^\.TH .*\"preflight $version\"" "$man" || fail "man page header does not name version $version"
text="$(sed 's/\\-/-/g; s/\\f[BIRP]//g' "$man")"
options_of() { "$bin" "$@" --help | grep -oE -- '(^|[ ,])--[a-zA-Z][a-zA-Z-]*' | tr -d ' ,' | sort -u; }
for cmd in validate fit plan check diff sweep simulate "import hf" "import megatron"; do
  grep -qE "^\.BI? \"?$cmd" <<<"$(sed 's/\\-/-/g' "$man")" || fail "man page has no entry for '$cmd'"
  # shellcheck disable=SC2086  # "import hf" is two words on purpose
  for option in $(options_of $cmd); do
    grep -q -- "$option\b" <<<"$text" || fail "man page does not document $cmd $option"
  done
done
# Every option the man page names exists on some command.
all_options="$(for cmd in validate fit plan check diff sweep simulate "import hf" "import megatron"; do
  # shellcheck disable=SC2086
  options_of $cmd
done | sort -u)"
for option in $(grep -oE -- '--[a-z][a-z-]*[a-z]' <<<"$text" | sort -u); do
  [[ "$option" == --version ]] && continue
  grep -qx -- "$option" <<<"$all_options" || fail "man page names $option, which no command has"
done

# 3. Bash completion, as bash-completion sources it (extglob on).
complete_words() { # WORD... : the completions for the last word
  bash -c 'shopt -s extglob; source "$0"; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _preflight; printf "%s\n" "${COMPREPLY[@]}"' \
    "$work/usr/share/bash-completion/completions/preflight" "$bin" "$@"
}
[[ "$(complete_words fi)" == fit ]] || fail "completion of 'fi': $(complete_words fi)"
[[ "$(complete_words sweep r.yaml --format '' | tr '\n' ' ')" == "table json csv " ]] || fail "sweep --format values"
[[ "$(complete_words plan r.yaml --emit '' | tr '\n' ' ')" == "megatron torchtitan " ]] || fail "plan --emit values"
# (Each list is taken whole before grep reads it: grep -q may exit at its
# first match, and under pipefail the writer's SIGPIPE would fail the test.)
words="$(complete_words fit --e)"
grep -qx -- --explain <<<"$words" || fail "fit --e does not complete to --explain: $words"
words="$(complete_words check --s)"
grep -qx -- --set <<<"$words" || fail "check --s does not complete to --set: $words"
words="$(complete_words import '')"
grep -qx megatron <<<"$words" || fail "import does not complete to megatron: $words"
words="$(cd "$source" && complete_words fit recipes/nam)"
grep -qx recipes/nam56r-h200.yaml <<<"$words" || fail "recipe file completion: $words"

# 4. The Debian package.
(cd "$build" && cpack --config CPackConfig.cmake -B "$work/pkg" >/dev/null) || fail "cpack -G DEB failed"
deb="$(ls "$work"/pkg/preflight_*.deb)"
contents="$(dpkg-deb -c "$deb" | awk '{print $6}')"
for f in ./usr/bin/preflight ./usr/share/man/man1/preflight.1 ./usr/share/bash-completion/completions/preflight \
  ./usr/share/preflight/recipes/nam56r-h200.yaml ./usr/share/doc/preflight/README.md; do
  grep -qx -- "$f" <<<"$contents" || fail "the .deb lacks $f"
done
[[ "$(dpkg-deb -f "$deb" Version)" == "$version" ]] || fail ".deb version $(dpkg-deb -f "$deb" Version) != $version"
depends="$(dpkg-deb -f "$deb" Depends)"
grep -q libyaml-cpp <<<"$depends" || fail ".deb Depends lacks libyaml-cpp: $depends"
echo "package_test: install, man page, completion and .deb ok ($deb)"
