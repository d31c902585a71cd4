#!/usr/bin/env bash
# The prepared GPU check: the train-step, rollout (JAX sampler against HF generate, and against
# vLLM where installed), fused log-prob kernel and actor-memory benches, each against its
# baseline in the same run, then the goal summary (bench/goals.py). See bench/README.md.
#
#   bash bench/gpu_check.sh                       # on a lent GPU: the Qwen2.5-0.5B shape
#   bash bench/gpu_check.sh --shape tiny          # on a CPU (CI): every step at toy sizes
#   bash bench/gpu_check.sh --wheels .whl --out DIR --budget SECONDS
#
# --wheels DIR installs DIR/*.whl (no index, no dependencies) into a scratch folder first, for
# machines without jrl's lighter dependencies (the GPU image lacks ml-collections and gguf).
# Results: DIR/<step>.jsonl (default outputs/gpu_check). PYTHON picks the interpreter (python3).
# Exit status: 0 when every step ran, whatever the goals say; 1 when a bench crashed; 2 on a
# usage error or a machine that cannot run the benches; 3 when the time budget ran out.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
shape=qwen2.5-0.5b
out=outputs/gpu_check
budget=
wheels=

usage() {
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

while (($#)); do
  case $1 in
    --shape) shape=${2:?--shape needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    --wheels) wheels=${2:?--wheels needs a folder}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

# Each step's arguments per shape: the benches' own shapes, at the sizes the goals name on a GPU
# and at toy sizes on a CPU. The HF baseline runs at 128 rows only (its goal); jrl's 512-row
# and mixed-length figures need no baseline run.
case $shape in
  qwen2.5-0.5b)
    budget=${budget:-450}
    train=(--shape qwen2.5-0.5b)
    rollout=(--shape qwen2.5-0.5b --batches 128 --mixed-rows 0)
    rollout_jrl=(--shape qwen2.5-0.5b --impl jrl --batches 512)
    rollout_vllm=(--shape qwen2.5-0.5b --vs vllm --batches 128 --dtype bf16 --sampling sample)
    kernel=(--impls "naive,chunked,pallas_gpu")
    actor=(--shape qwen2.5-0.5b)
    ;;
  tiny)
    budget=${budget:-240}
    train=(--shape tiny --steps 1 --warmup 1)
    rollout=(--shape tiny --prompt 8 --new 6 --batches 128 --mixed-rows 0)
    rollout_jrl=(--shape tiny --prompt 8 --new 6 --impl jrl --batches 512 --mixed-rows 16
      --slots 4 --mixed-new 12 --min-prompt 2 --stop-every 6)
    rollout_vllm=(--shape tiny --vs vllm --prompt 8 --new 6 --batches 128 --dtype fp32
      --sampling sample --repeats 1)
    kernel=(--small --impls "naive,chunked,pallas_gpu")
    actor=(--shape tiny data.max_prompt_length=16 data.max_response_length=16
      actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2)
    ;;
  *) echo "gpu_check: --shape must be qwen2.5-0.5b or tiny, got '$shape'" >&2; exit 2 ;;
esac

steps=(env train_step rollout logprob_kernel rollout_vllm actor_memory)
out=$(mkdir -p "$out" && cd "$out" && pwd) || exit 2  # absolute: the steps run from $ROOT
if [[ -n $wheels ]]; then
  wheels=$(cd "$wheels" && pwd) || exit 2
fi
for name in "${steps[@]}"; do rm -f "$out/$name.jsonl"; done
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# JAX must not take 75% of the GPU up front: torch (the HF baselines, vLLM) shares it, and each
# bench's parent process would otherwise hold memory its workers need.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 2
deadline=$((SECONDS + budget))
crashed=()
late=()

note() {
  echo "[gpu_check ${SECONDS}s/${budget}s] $*" >&2
}

# record STEP KEY TEXT: a line {"KEY": "TEXT"} in the step's results file (bench/goals.py shows
# it where the step's figures are missing).
record() {
  local text=${3//\\/\\\\}
  text=${text//\"/\\\"}
  echo "{\"$2\": \"$text\"}" >>"$out/$1.jsonl"
}

skip() {
  record "$1" skipped "$2"
  note "$1: skipped: $2"
}

# field NAME: a field of the environment's line (empty for null).
field() {
  "$PYTHON" -c 'import json, sys
value = json.loads(open(sys.argv[1]).readline()).get(sys.argv[2])
print("" if value is None else value)' "$out/env.jsonl" "$1"
}

# step NAME SCRIPT ARGS...: runs one bench within what is left of the budget; its JSON lines go
# to stdout and to $out/NAME.jsonl.
step() {
  local name=$1 left=$((deadline - SECONDS)) started=$SECONDS rc
  shift
  if ((left <= 0)); then
    skip "$name" "not run: the ${budget} s budget was spent before it"
    late+=("$name")
    return
  fi
  note "$name: $PYTHON $* (${left}s of the budget left)"
  timeout --kill-after=10 "$left" "$PYTHON" "$@" | tee "$scratch/step.jsonl"
  rc=${PIPESTATUS[0]}
  cat "$scratch/step.jsonl" >>"$out/$name.jsonl"
  if ((rc == 124 || rc == 137)); then
    record "$name" failed "stopped at the ${budget} s budget"
    late+=("$name")
  elif ((rc != 0)); then
    record "$name" failed "the bench crashed (exit code $rc)"
    crashed+=("$name")
  elif grep -q '"error":' "$scratch/step.jsonl"; then
    crashed+=("$name")  # a worker failed; the bench's own line says how
  elif ! grep -q '^{' "$scratch/step.jsonl"; then
    record "$name" failed "the bench printed no JSON line"
    crashed+=("$name")
  fi
  note "$name: done in $((SECONDS - started))s (exit code $rc)"
}

if [[ -n $wheels ]]; then
  note "installing $wheels/*.whl into $scratch/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$scratch/site" \
    "$wheels"/*.whl || exit 2
  export PYTHONPATH="$PYTHONPATH:$scratch/site"
fi

note "env: $PYTHON bench/env_probe.py"
"$PYTHON" bench/env_probe.py | tee "$out/env.jsonl"
((PIPESTATUS[0] == 0)) || exit 2
backend=$(field backend)
if [[ $shape != tiny && $backend == cpu ]]; then
  echo "gpu_check: the $shape shape needs a GPU and JAX sees only a CPU; use --shape tiny" >&2
  exit 2
fi
no_hf=$(field no_hf_baseline)
no_vllm=$(field no_vllm)

baseline=()
if [[ -n $no_hf ]]; then
  baseline=(--impl jrl)
  skip train_step "transformers + torch baseline: $no_hf"
  skip rollout "HF generate baseline: $no_hf"
fi
weights=(--weights "$scratch/weights")
step train_step bench/train_step.py "${train[@]}" "${baseline[@]}"
step rollout bench/rollout.py "${rollout[@]}" "${weights[@]}" "${baseline[@]}"
step logprob_kernel bench/logprob_kernel.py "${kernel[@]}"
step rollout bench/rollout.py "${rollout_jrl[@]}" "${weights[@]}"
if [[ -n $no_vllm ]]; then
  skip rollout_vllm "$no_vllm"
else
  step rollout_vllm bench/rollout.py "${rollout_vllm[@]}" "${weights[@]}"
fi
step actor_memory bench/actor_memory.py "${actor[@]}"

echo
echo "goal summary (bench/goals.py $out; the goals: bench/README.md, Goals):"
"$PYTHON" bench/goals.py "$out" || crashed+=(goals)
note "finished in ${SECONDS}s"
if ((${#crashed[@]})); then
  echo "gpu_check: FAILED: ${crashed[*]} crashed (see above and $out/)" >&2
  exit 1
fi
if ((${#late[@]})); then
  echo "gpu_check: INCOMPLETE: ${late[*]} ran out of the ${budget} s budget" >&2
  exit 3
fi
