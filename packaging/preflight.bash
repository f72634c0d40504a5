# bash completion for preflight                           -*- shell-script -*-
# Installed as /usr/share/bash-completion/completions/preflight. Commands
# and each command's options are read from the binary's own --help, so they
# always match the installed version; option values are listed here.

_preflight() {
  local cur prev cmd
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev="${COMP_WORDS[COMP_CWORD - 1]}"
  local bin="${COMP_WORDS[0]}"
  local commands="validate fit plan check diff sweep import simulate help"
  if ((COMP_CWORD == 1)); then
    mapfile -t COMPREPLY < <(compgen -W "$commands --help --version" -- "$cur")
    return
  fi
  cmd="${COMP_WORDS[1]}"
  case "$cmd" in
    help)
      ((COMP_CWORD == 2)) && mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
      return
      ;;
    import)
      if ((COMP_CWORD == 2)); then
        mapfile -t COMPREPLY < <(compgen -W "hf megatron" -- "$cur")
        return
      fi
      cmd="import ${COMP_WORDS[2]}"
      ;;
  esac
  case "$prev" in
    --format)
      local formats="table json"
      case "$cmd" in
        sweep) formats="table json csv" ;;
        check | diff) formats="table json md" ;;
      esac
      mapfile -t COMPREPLY < <(compgen -W "$formats" -- "$cur")
      return
      ;;
    --emit) mapfile -t COMPREPLY < <(compgen -W "megatron torchtitan" -- "$cur"); return ;;
    --sp) mapfile -t COMPREPLY < <(compgen -W "on off" -- "$cur"); return ;;
    --precision) mapfile -t COMPREPLY < <(compgen -W "fp64 fp32" -- "$cur"); return ;;
    --runtime) mapfile -t COMPREPLY < <(compgen -W "auto threads mpi" -- "$cur"); return ;;
    --recompute) mapfile -t COMPREPLY < <(compgen -W "none selective full none,selective,full" -- "$cur"); return ;;
    --baseline)
      compopt -o filenames 2>/dev/null
      mapfile -t COMPREPLY < <(compgen -d -- "$cur")
      return
      ;;
    -o | --out | --output | --svg | --html | --junit | --summary)
      compopt -o filenames 2>/dev/null
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      return
      ;;
    --set | --layout | --scale | --gpus | --top | --threads | --tp | --cp | --pp | --vpp | --ep | --expert-tp | \
      --micro-batch | --zero | --dp-replicate | --stage | --name | --baseline-ref | --max-regression-gib | \
      --max-regression-gib-category | --hang-timeout | --compute-efficiency | --nvlink-efficiency | --ib-efficiency | --latency-us)
      return  # a value the user types
      ;;
  esac
  if [[ "$cur" == -* ]]; then
    local options
    # shellcheck disable=SC2086  # $cmd is "import hf": two words on purpose
    options="$("$bin" $cmd --help 2>/dev/null | grep -oE -- '(^|[ ,])--?[a-zA-Z][a-zA-Z-]*' | tr -d ' ,' | sort -u)"
    mapfile -t COMPREPLY < <(compgen -W "$options" -- "$cur")
    return
  fi
  compopt -o filenames 2>/dev/null
  case "$cmd" in
    "import hf") mapfile -t COMPREPLY < <(compgen -f -X '!*.json' -- "$cur"; compgen -d -- "$cur") ;;
    "import megatron") mapfile -t COMPREPLY < <(compgen -f -- "$cur") ;;
    *) mapfile -t COMPREPLY < <(compgen -f -X '!*.@(yaml|yml)' -- "$cur"; compgen -d -- "$cur") ;;
  esac
}
complete -F _preflight preflight
