#!/usr/bin/env bash
# Train on TPU slices in a GKE cluster with a JobSet (the layout xpk uses): one Job per slice, one
# pod per TPU host, every pod running `python -m jrl.train` from a container image that has jrl
# installed (`pip install "jrl[tpu]"`). JAX finds its peers from the TPU environment GKE provides.
#
# Usage:
#   launch/gke_jobset.sh STEP [flags] [-- TRAIN_ARGS...]
# Steps:
#   check     compile the run for the slices here, before anything is submitted: `python -m
#             jrl.compile --topology=SLICE TRAIN_ARGS` (libtpu, no TPU) prints the per-chip memory
#             plan; exit 0 fits, 1 does not fit, 2 bad input. SLICE is GEN:TOPO (v5e:4x4 for
#             tpu-v5-lite-podslice, v5p:... for tpu-v5p-slice, v6e:... for tpu-v6e-slice); with
#             --num-slices N > 1, one slice of all N x chips (same chips, same per-chip plan)
#   manifest  print the JobSet manifest
#   submit    check, then apply the manifest with kubectl; when check fails nothing is applied and
#             the exit status is check's
#   logs      follow the logs of the first pod
#   delete    delete the JobSet
# Flags:
#   --name NAME          JobSet name (required)
#   --image IMAGE        container image with jrl installed (required for manifest/submit)
#   --tpu-type TYPE      GKE accelerator, default tpu-v5-lite-podslice
#   --topology TOPO      slice topology, default 4x4 (16 chips)
#   --chips-per-host N   default 4
#   --num-slices N       default 1 (several slices talk over DCN)
#   --dry-run            print the commands (and the manifest) without running them
#   -h, --help           this text
# Environment:
#   SKIP_CHECK=1         `submit` skips check (submit without knowing that the run fits)
#   JRL_COMPILE=CMD      check's command, default `python3 -m jrl.compile`
# Example:
#   launch/gke_jobset.sh submit --name jrl-grpo --image us-docker.pkg.dev/p/r/jrl:latest -- \
#       --config=configs/gsm8k_grpo.py trainer.nnodes=4 trainer.n_gpus_per_node=4 trainer.device=tpu
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

STEP="${1:-}"
[[ -n "${STEP}" && "${STEP}" != -* ]] || { usage; [[ "${STEP}" == -h || "${STEP}" == --help ]] && exit 0; exit 2; }
shift
NAME="" IMAGE="" TPU_TYPE="tpu-v5-lite-podslice" TOPOLOGY="4x4" CHIPS_PER_HOST=4 SLICES=1
TRAIN_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --image) IMAGE="$2"; shift 2 ;;
    --tpu-type) TPU_TYPE="$2"; shift 2 ;;
    --topology) TOPOLOGY="$2"; shift 2 ;;
    --chips-per-host) CHIPS_PER_HOST="$2"; shift 2 ;;
    --num-slices) SLICES="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) die "unknown flag $1 (see --help)" ;;
  esac
done
[[ "${STEP}" == check ]] || need --name "${NAME}"
[[ "${SLICES}" =~ ^[1-9][0-9]*$ ]] || die "--num-slices must be a positive integer"

# chips in one slice of the topology
slice_chips() {
  local chips=1 dim
  IFS=x read -ra dims <<< "${TOPOLOGY}"
  for dim in "${dims[@]}"; do
    [[ "${dim}" =~ ^[0-9]+$ ]] || die "--topology ${TOPOLOGY}: use numbers joined by x, e.g. 4x4"
    chips=$((chips * dim))
  done
  echo "${chips}"
}

# hosts per slice = chips in the topology / chips per host
hosts_per_slice() {
  local chips
  chips=$(slice_chips) || exit 2
  (( chips % CHIPS_PER_HOST == 0 )) || die "--topology ${TOPOLOGY} has ${chips} chips, not a multiple of --chips-per-host ${CHIPS_PER_HOST}"
  echo $((chips / CHIPS_PER_HOST))
}

# the slice name `jrl.compile --topology` takes for --tpu-type, --topology and --num-slices
compile_topology() {
  local generation per_slice
  case "${TPU_TYPE}" in
    tpu-v5-lite-podslice) generation=v5e ;;
    tpu-v5p-slice) generation=v5p ;;
    tpu-v6e-slice) generation=v6e ;;
    *) die "check knows --tpu-type tpu-v5-lite-podslice, tpu-v5p-slice and tpu-v6e-slice, not ${TPU_TYPE}; SKIP_CHECK=1 submits without it" ;;
  esac
  if [[ "${SLICES}" == 1 ]]; then
    echo "${generation}:${TOPOLOGY}"
    return
  fi
  # N slices as one slice of all their chips (Cloud TPU type names: v5p counts 2 cores a chip)
  per_slice=$(slice_chips) || exit 2
  case "${generation}" in
    v5e) echo "v5litepod-$((per_slice * SLICES))" ;;
    v5p) echo "v5p-$((per_slice * SLICES * 2))" ;;
    v6e) echo "v6e-$((per_slice * SLICES))" ;;
  esac
}

manifest() {
  need --image "${IMAGE}"
  local hosts args
  hosts=$(hosts_per_slice)
  args=$(quoted python3 -m jrl.train "${TRAIN_ARGS[@]}")
  cat <<YAML
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: ${NAME}
  annotations:
    alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool
spec:
  failurePolicy:
    maxRestarts: 3
  replicatedJobs:
  - name: slice
    replicas: ${SLICES}
    template:
      spec:
        parallelism: ${hosts}
        completions: ${hosts}
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            nodeSelector:
              cloud.google.com/gke-tpu-accelerator: ${TPU_TYPE}
              cloud.google.com/gke-tpu-topology: ${TOPOLOGY}
            containers:
            - name: jrl
              image: ${IMAGE}
              command:
              - bash
              - -c
              - |
                ${args}
              resources:
                limits:
                  google.com/tpu: ${CHIPS_PER_HOST}
YAML
}

case "${STEP}" in
  check)
    slice=$(compile_topology)
    fit_check "${slice}" "${TRAIN_ARGS[@]}"
    ;;
  manifest) manifest ;;
  submit)
    need --image "${IMAGE}"
    hosts_per_slice > /dev/null
    slice="${TPU_TYPE} ${TOPOLOGY}"
    skip_check || slice=$(compile_topology)
    check_before_launch "submitting the JobSet" "${slice}" "${TRAIN_ARGS[@]}"
    file=$(mktemp --suffix=.yaml)
    manifest > "${file}"
    [[ "${DRY_RUN}" == 1 ]] && cat "${file}"
    run kubectl apply -f "${file}"
    ;;
  logs) run kubectl logs -f "jobset/${NAME}" --all-containers=true ;;
  delete) run kubectl delete jobset "${NAME}" ;;
  *) die "unknown step ${STEP}; use check, manifest, submit, logs or delete" ;;
esac
