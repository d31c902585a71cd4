#!/usr/bin/env bash
# Train on a multi-node GPU cluster with SLURM: submits launch/slurm_job.sbatch, which runs
# `python -m jrl.train` once per node (one process per node drives all its GPUs; the processes join
# through jax.distributed). Run it from the checkout, with jrl installed (`pip install -e ".[cuda]"`)
# in the environment the job inherits.
#
# Usage:
#   launch/slurm_gpu.sh [flags] [-- TRAIN_ARGS...]
# Flags:
#   --nodes N            nodes (default 2)
#   --gpus-per-node N    GPUs per node (default 8)
#   --rollout-gpus-per-node R
#                        give R of each node's GPUs to the rollout (a split run, verl's
#                        one-step-off / fully-async layout): R must divide N - R
#   --partition NAME     SLURM partition
#   --account NAME       SLURM account
#   --time HH:MM:SS      time limit (default 24:00:00)
#   --job-name NAME      default jrl
#   --dry-run            print the sbatch command without submitting
#   -h, --help           this text
# trainer.nnodes and trainer.n_gpus_per_node are set from --nodes/--gpus-per-node (with
# --rollout-gpus-per-node: trainer.n_gpus_per_node=N-R, rollout.nnodes, rollout.n_gpus_per_node=R,
# actor_rollout_ref.hybrid_engine=False: on every node GPUs 0..N-R-1 train, the rest generate).
# Example:
#   launch/slurm_gpu.sh --nodes 2 --gpus-per-node 8 --partition gpu -- --config=configs/gsm8k_ppo.py
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$0")/common.sh"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

NODES=2 GPUS=8 ROLLOUT_GPUS=0 PARTITION="" ACCOUNT="" TIME="24:00:00" JOB="jrl"
TRAIN_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --gpus-per-node) GPUS="$2"; shift 2 ;;
    --rollout-gpus-per-node) ROLLOUT_GPUS="$2"; shift 2 ;;
    --partition) PARTITION="$2"; shift 2 ;;
    --account) ACCOUNT="$2"; shift 2 ;;
    --time) TIME="$2"; shift 2 ;;
    --job-name) JOB="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) die "unknown flag $1 (see --help)" ;;
  esac
done
[[ "${NODES}" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got ${NODES}"
[[ "${GPUS}" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node must be a positive integer, got ${GPUS}"
[[ "${ROLLOUT_GPUS}" =~ ^[0-9]+$ ]] || die "--rollout-gpus-per-node must be an integer, got ${ROLLOUT_GPUS}"
if (( ROLLOUT_GPUS > 0 )); then
  (( ROLLOUT_GPUS < GPUS && (GPUS - ROLLOUT_GPUS) % ROLLOUT_GPUS == 0 )) ||
    die "--rollout-gpus-per-node ${ROLLOUT_GPUS} must divide the ${GPUS} - ${ROLLOUT_GPUS} GPUs left to train"
fi

options=(--nodes="${NODES}" --gpus-per-node="${GPUS}" --time="${TIME}" --job-name="${JOB}"
  --output="logs/%x-%j.out" --export="ALL,JRL_GPUS_PER_NODE=${GPUS},JRL_ROLLOUT_GPUS_PER_NODE=${ROLLOUT_GPUS}")
[[ -n "${PARTITION}" ]] && options+=(--partition="${PARTITION}")
[[ -n "${ACCOUNT}" ]] && options+=(--account="${ACCOUNT}")
run mkdir -p logs
run sbatch "${options[@]}" "$(dirname "$0")/slurm_job.sbatch" "${TRAIN_ARGS[@]}"
