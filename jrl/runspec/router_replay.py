"""verl's router replay for mixture-of-experts models: ``actor.router_replay.mode`` (current verl
also spells it under the engine, ``actor.megatron.router_replay.mode``, which jrl's tree
interpolates into the actor's) and ``rollout.enable_rollout_routing_replay``.

- ``disabled``: every forward routes its tokens itself.
- ``R2``: the old-log-prob pass records the experts each token used; the update replays them,
  so that every mini-batch of the step routes as the weights that made the old log-probs did.
- ``R3``: the rollout records its experts (``enable_rollout_routing_replay``); the old-log-prob
  pass and the update replay them, so training routes as generation did.

``enable_rollout_routing_replay`` without R3 only measures: the rollout records its experts and
the old-log-prob pass reports how many tokens training routes elsewhere
(``training/routes_differ_fraction``). The reference policy routes its tokens itself.
"""

from __future__ import annotations

from collections.abc import Iterator

from ml_collections import ConfigDict

ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")
MODE_KEY = "actor_rollout_ref.actor.router_replay.mode"
RECORD_KEY = "actor_rollout_ref.rollout.enable_rollout_routing_replay"


def router_replay_problems(config: ConfigDict) -> Iterator[str]:
    """verl's rules of the two keys, and where jrl's rollout records routes: the JAX sampler's
    single-turn rows (agent loops and fully-async sessions assemble rows from turns that do not
    carry them)."""
    mode, records = config[MODE_KEY], bool(config[RECORD_KEY])
    if mode not in ROUTER_REPLAY_MODES:
        yield f"{MODE_KEY}={mode!r} is not supported; use one of {', '.join(ROUTER_REPLAY_MODES)}"
        return
    if mode == "R3" and not records:
        yield (
            f"{MODE_KEY}=R3 replays the rollout's experts: set {RECORD_KEY}=True so that the "
            "rollout records them, or use R2 (the old-log-prob pass records them)"
        )
    if mode == "R2" and records:
        yield (
            f"{MODE_KEY}=R2 records the experts in the old-log-prob pass; {RECORD_KEY}=True "
            "belongs to R3 (as in verl, the two conflict): drop one of them"
        )
    if mode == "R2" and config.algorithm.rollout_correction.bypass_mode:
        yield (
            f"{MODE_KEY}=R2 records the experts in the old-log-prob pass, which "
            "algorithm.rollout_correction.bypass_mode=True skips: use R3 (the rollout records "
            "them) or turn bypass_mode off"
        )
    if not records:
        return
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "jax":
        yield (
            f"{RECORD_KEY}=True: only jrl's JAX sampler records the experts it routes to here "
            "(vLLM's capture, enable_return_routed_experts, needs its V2 model runner, which "
            "needs Triton, and jrl does not wire it); set actor_rollout_ref.rollout.name=jax "
            f"(it is {rollout.name!r})"
        )
    loops = rollout.multi_turn.enable or rollout.agent.default_agent_loop != "single_turn_agent"
    if loops or rollout.agent.agent_loop_config_path:
        yield (
            f"{RECORD_KEY}=True records single-turn rollouts only: agent loops assemble their "
            "rows from turns that do not carry the experts; turn it off for multi-turn runs"
        )
    split = not config.actor_rollout_ref.hybrid_engine
    if split and config.async_training.mode == "fully_async":
        yield (
            f"{RECORD_KEY}=True with async_training.mode=fully_async is not implemented (the "
            "rollouter's sessions do not record experts); use async_training.mode=one_step_off"
        )
