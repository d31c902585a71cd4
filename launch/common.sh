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

# fit_check TOPOLOGY TRAIN_ARGS...: compile the run for slice TOPOLOGY on this machine with
# `python -m jrl.compile` (no TPU needed; $JRL_COMPILE replaces the command, default
# `python3 -m jrl.compile`), say what it found and return its exit status: 0 fits, 1 does not
# fit, 2 bad input (topology name or config). Under --dry-run it only prints the command.
fit_check() {
  local topology="$1"
  shift
  local compile=()
  read -ra compile <<< "${JRL_COMPILE:-python3 -m jrl.compile}"
  local rc=0
  run "${compile[@]}" "--topology=${topology}" "$@" || rc=$?
  [[ "${DRY_RUN}" == 0 ]] || return 0
  case "${rc}" in
    0) printf '%s: check: the run fits %s\n' "$(basename "$0")" "${topology}" ;;
    1) printf '%s: check: the run does not fit %s, or the check itself failed (jrl.compile exited 1; its output above says which)\n' \
         "$(basename "$0")" "${topology}" >&2 ;;
    2) printf '%s: check: jrl.compile rejected its input (exit 2: a topology name or config it cannot use; see above)\n' \
         "$(basename "$0")" >&2 ;;
    *) printf '%s: check: jrl.compile failed (exit %s; see above)\n' "$(basename "$0")" "${rc}" >&2 ;;
  esac
  return "${rc}"
}

# skip_check: whether SKIP_CHECK asks to launch without the check (set, and not 0).
skip_check() {
  [[ -n "${SKIP_CHECK:-}" && "${SKIP_CHECK}" != 0 ]]
}

# check_before_launch WHAT TOPOLOGY TRAIN_ARGS...: fit_check before WHAT (e.g. "creating the
# slice") and exit with its status when the run does not fit; SKIP_CHECK=1 skips it.
check_before_launch() {
  local what="$1"
  shift
  if skip_check; then
    printf '%s: SKIP_CHECK=%s: %s without checking that the run fits %s\n' \
      "$(basename "$0")" "${SKIP_CHECK}" "${what}" "$1" >&2
    return 0
  fi
  local rc=0
  fit_check "$@" || rc=$?
  if [[ "${rc}" != 0 ]]; then
    printf '%s: error: stopped before %s; change the train arguments or the slice, or set SKIP_CHECK=1 to launch anyway\n' \
      "$(basename "$0")" "${what}" >&2
    exit "${rc}"
  fi
}
