# Shared by the launch scripts: command echo/execution with --dry-run, and small checks.
# shellcheck shell=bash

DRY_RUN=0

# run CMD...: print the command (shell-quoted); execute it unless --dry-run was given.
run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ "${DRY_RUN}" == 0 ]]; then
    "$@"
  fi
}

# die MESSAGE: print an error naming the script and exit 2.
die() {
  printf '%s: error: %s\n' "$(basename "$0")" "$1" >&2
  exit 2
}

# need FLAG VALUE: fail when a required flag is empty.
need() {
  [[ -n "$2" ]] || die "$1 is required (see --help)"
}

# quoted ARGS...: the arguments as one shell-quoted string (for remote commands).
quoted() {
  local out=""
  local arg
  for arg in "$@"; do
    out+=" $(printf '%q' "${arg}")"
  done
  printf '%s' "${out# }"
}
