"""Config checks of the rollout's sampling keys: the log-prob modes jrl's engines return, the
ranges `SamplingParams` accepts (training and validation settings), and the temperatures vLLM
samples with (for ``rollout.name=vllm``), so that neither engine changes or refuses a setting in
the middle of a run."""

from __future__ import annotations

from collections.abc import Iterator

from ml_collections import ConfigDict

from jrl.rollout.sampling import LOGPROBS_MODES, SamplingParams

_ROLLOUT = "actor_rollout_ref.rollout"
# vLLM raises a temperature in (0, 0.01) to 0.01 (every version) and refuses one above 2 (0.33).
VLLM_TEMPERATURES = (0.01, 2.0)


def sampling_problems(config: ConfigDict) -> Iterator[str]:
    """Each sampling setting that an engine would not honour, with the fix."""
    rollout = config.actor_rollout_ref.rollout
    mode = rollout.get("logprobs_mode")
    if mode not in LOGPROBS_MODES:
        yield (
            f"{_ROLLOUT}.logprobs_mode={mode!r} is not supported (jrl keeps log-probs, not "
            f"logits); use one of {', '.join(LOGPROBS_MODES)}"
        )
    # The training and the validation settings, as the engines build them (logprobs_mode has
    # its own message above).
    settings = {**rollout.to_dict(), "logprobs_mode": LOGPROBS_MODES[0]}
    for validating in (False, True):
        try:
            SamplingParams.from_rollout_config(
                settings, response_length=1, eos_token_ids=(), pad_token_id=0, validate=validating
            )
        except ValueError as err:
            yield str(err)
    if rollout.name != "vllm":
        return
    low, high = VLLM_TEMPERATURES
    for prefix, section in ((_ROLLOUT, rollout), (f"{_ROLLOUT}.val_kwargs", rollout.val_kwargs)):
        temperature = section.temperature
        if section.do_sample and temperature != 0 and not low <= temperature <= high:
            yield (
                f"{prefix}.temperature={temperature} is outside what vLLM samples with (0, or "
                f"{low} to {high}: it raises lower temperatures to {low} and refuses higher "
                f"ones); choose a temperature in that range or set {_ROLLOUT}.name=jax"
            )
