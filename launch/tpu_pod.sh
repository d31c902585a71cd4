#!/usr/bin/env bash
# Train on a Cloud TPU pod slice: create it (queued resources), install jrl on every worker, run
# `python -m jrl.train` on all workers at once (JAX's multi-controller runtime joins them), stream the
# logs, and delete the slice.
#
# Usage:
#   launch/tpu_pod.sh STEP [flags] [-- TRAIN_ARGS...]
# Steps:
#   check     compile the run for the slice here, before anything is created: `python -m jrl.compile
#             --topology=TYPE TRAIN_ARGS` (libtpu, no TPU) prints the per-chip memory plan; exit 0 fits,
#             1 does not fit, 2 bad input (needs none of --name/--project/--zone)
#   create    request the slice as a queued resource and wait until it is ACTIVE
#   install   copy this checkout to every worker and `pip install -e ".[tpu]"` there
#   run       run `python -m jrl.train TRAIN_ARGS` on all workers (output also in ~/jrl-run.log)
#   logs      follow worker 0's ~/jrl-run.log
#   delete    delete the slice and its queued resource
#   all       check, create, install, run, delete (the slice is deleted even when the run fails);
#             when check fails nothing is created and the exit status is check's
# Flags:
#   --name NAME              slice and queued-resource name (required)
#   --project PROJECT        GCP project (required)
#   --zone ZONE              zone, e.g. us-west4-a (required)
#   --accelerator-type TYPE  default v5litepod-16 (4 hosts x 4 chips)
#   --runtime-version VER    default v2-alpha-tpuv5-lite
#   --spot                   request Spot capacity (cheaper, may be preempted: resume_mode=auto resumes)
#   --dry-run                print the commands without running them
#   -h, --help               this text
# Environment:
#   SKIP_CHECK=1             `all` skips check (launch without knowing that the run fits)
#   JRL_COMPILE=CMD          check's command, default `python3 -m jrl.compile`
# Example:
#   launch/tpu_pod.sh all --name jrl-grpo --project my-proj --zone us-west4-a --spot -- \
#       --config=configs/gsm8k_grpo.py trainer.nnodes=4 trainer.n_gpus_per_node=4 trainer.device=tpu
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

STEP="${1:-}"
[[ -n "${STEP}" && "${STEP}" != -* ]] || { usage; [[ "${STEP}" == -h || "${STEP}" == --help ]] && exit 0; exit 2; }
shift
NAME="" PROJECT="" ZONE="" TYPE="v5litepod-16" RUNTIME="v2-alpha-tpuv5-lite" SPOT=0
TRAIN_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --accelerator-type) TYPE="$2"; shift 2 ;;
    --runtime-version) RUNTIME="$2"; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) die "unknown flag $1 (see --help)" ;;
  esac
done
if [[ "${STEP}" != check ]]; then
  need --name "${NAME}"
  need --project "${PROJECT}"
  need --zone "${ZONE}"
fi
WHERE=(--project "${PROJECT}" --zone "${ZONE}")

create() {
  local spot=()
  [[ "${SPOT}" == 1 ]] && spot=(--spot)
  run gcloud compute tpus queued-resources create "${NAME}" --node-id "${NAME}" "${WHERE[@]}" \
    --accelerator-type "${TYPE}" --runtime-version "${RUNTIME}" "${spot[@]}"
  if [[ "${DRY_RUN}" == 0 ]]; then
    local state=""
    until [[ "${state}" == ACTIVE ]]; do
      sleep 30
      state=$(gcloud compute tpus queued-resources describe "${NAME}" "${WHERE[@]}" \
        --format='value(state.state)')
      echo "queued resource ${NAME}: ${state}"
      if [[ "${state}" == FAILED || "${state}" == SUSPENDED ]]; then
        die "the slice request ended in ${state}"
      fi
    done
  fi
}

install() {
  run gcloud compute tpus tpu-vm scp --recurse "$(pwd)" "${NAME}:~/jrl" --worker=all "${WHERE[@]}"
  run gcloud compute tpus tpu-vm ssh "${NAME}" --worker=all "${WHERE[@]}" \
    --command 'cd ~/jrl && python3 -m pip install -q -e ".[tpu]"'
}

train() {
  local command
  command="cd ~/jrl && python3 -m jrl.train $(quoted "${TRAIN_ARGS[@]}") 2>&1 | tee ~/jrl-run.log"
  run gcloud compute tpus tpu-vm ssh "${NAME}" --worker=all "${WHERE[@]}" --command "${command}"
}

logs() {
  run gcloud compute tpus tpu-vm ssh "${NAME}" --worker=0 "${WHERE[@]}" \
    --command 'tail -n +1 -f ~/jrl-run.log'
}

delete() {
  run gcloud compute tpus queued-resources delete "${NAME}" "${WHERE[@]}" --force --quiet
}

case "${STEP}" in
  check) fit_check "${TYPE}" "${TRAIN_ARGS[@]}" ;;
  create) create ;;
  install) install ;;
  run) train ;;
  logs) logs ;;
  delete) delete ;;
  all)
    check_before_launch "creating the slice" "${TYPE}" "${TRAIN_ARGS[@]}"
    create
    trap delete EXIT
    install
    train
    ;;
  *) die "unknown step ${STEP}; use check, create, install, run, logs, delete or all" ;;
esac
