"""`compute_advantage`: run the estimator named by `algorithm.adv_estimator` with what its
descriptor (`jrl.algos.estimator.Estimator`) says it needs and reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from jrl.algos.estimator import INPUTS, OPTIONS, EstimatorOptions, get_adv_estimator


def compute_advantage(
    adv_estimator: str,
    *,
    token_level_rewards: jax.Array,
    response_mask: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    options: EstimatorOptions | None = None,
    config: Mapping[str, Any] | None = None,
    **inputs: Any,
) -> tuple[jax.Array, jax.Array]:
    """(advantages, returns) from the estimator registered as `adv_estimator`.

    `response_mask` defaults to the last R columns of `attention_mask` (R = reward width), as in
    verl. The estimator gets the batch inputs its descriptor names (``index``, ``values``,
    ``reward_baselines``, from `inputs`) and the options it reads (``gamma``, ``lam``,
    ``norm_adv_by_std_in_grpo``: a keyword of `inputs`, else the field of `options`); inputs
    given as None count as absent, and the rest of `inputs` is not passed on. One registered
    with verl's plain decorator gets ``index`` and verl's `config` (the algorithm section).
    Raises ValueError for an unknown estimator (listing the registered names) or a missing
    input, or option that its function has no default for.
    """
    estimator = get_adv_estimator(adv_estimator)
    if response_mask is None:
        if attention_mask is None:
            raise ValueError(
                f"adv_estimator {estimator.name!r} needs response_mask (or attention_mask to "
                "derive it)"
            )
        response_mask = attention_mask[:, -token_level_rewards.shape[-1] :]
    given = {key: value for key, value in inputs.items() if value is not None}
    for key in estimator.options:
        if key not in given and getattr(options, key, None) is not None:
            given[key] = getattr(options, key)
    for key in estimator.required():
        if key not in given:
            meaning = INPUTS.get(key) or f"{OPTIONS[key]} (pass {key}=... or options=...)"
            raise ValueError(
                f"algorithm.adv_estimator={estimator.name!r} needs `{key}`: {meaning}; it was "
                "not provided"
            )
    wanted = (*estimator.inputs, *estimator.options)
    kwargs = {key: given[key] for key in wanted if key in given}
    if estimator.follows_verl:
        kwargs["config"] = config
    return estimator.fn(
        token_level_rewards=token_level_rewards, response_mask=response_mask, **kwargs
    )
