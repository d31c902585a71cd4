"""`RolloutSpec`: what the rollout engines read of a run, resolved once from verl's keys by
`jrl.runspec.rollout` (no JAX here)."""

from __future__ import annotations

import dataclasses

from jrl.config.errors import check_settings
from jrl.rollout.limits import EngineLimits
from jrl.rollout.sampling import SamplingParams
from jrl.rollout.vllm_args import VllmSettings


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """The rollout of a run.

    `engine` is the name of `jrl.rollout.engines.ENGINES` the run asks for (``rollout.name``);
    `sampling` and `validation` are the training and validation sampling (None: the run does not
    validate), their token ids still unset (`jrl.rollout.sampling_params` sets the engine's);
    `sampling.max_new_tokens` is the response length; `vllm` holds vLLM's own settings where the
    run names vLLM (None elsewhere: no other engine reads them). The engine computes in `dtype`
    over the actor's parameters, `tensor_parallel_size` devices per model replica; vLLM builds
    from the Hugging Face folder `model_path` and seeds with `seed`. `section` is the key of the
    rollout's config section, named in messages (``actor_rollout_ref.rollout`` in a PPO run,
    ``rollout`` in offline generation). With `record_routes` (verl's
    ``enable_rollout_routing_replay``) a mixture-of-experts model's rows carry the experts
    each token used (``routed_experts``); `expert_parallel_size` > 1 splits a mixture's
    experts over each replica's tensor-parallel devices. `lora_rank` > 0: the actor trains LoRA
    adapters of that rank, which vLLM applies apart from the base weights.
    """

    engine: str
    sampling: SamplingParams
    validation: SamplingParams | None
    limits: EngineLimits
    dtype: str
    model_path: str
    vllm: VllmSettings | None = None
    tensor_parallel_size: int = 1
    seed: int = 0
    trust_remote_code: bool = False
    section: str = "actor_rollout_ref.rollout"
    record_routes: bool = False
    expert_parallel_size: int = 1
    lora_rank: int = 0

    def __post_init__(self) -> None:
        rules = {
            "tensor_parallel_size": (self.tensor_parallel_size >= 1, "must be at least 1"),
            "expert_parallel_size": (
                self.expert_parallel_size in (1, self.tensor_parallel_size),
                f"must be 1 or tensor_model_parallel_size ({self.tensor_parallel_size}): the "
                "experts split over a replica's tensor-parallel devices",
            ),
        }
        check_settings(self, rules)

    @property
    def response_length(self) -> int:
        """Tokens per response (the engine's output width)."""
        return self.sampling.max_new_tokens
