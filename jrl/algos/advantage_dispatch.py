"""`compute_advantage`: run the estimator named by `algorithm.adv_estimator` on a batch's inputs.

Follows verl's trainer: GAE gets (rewards, values, mask, γ, λ); GRPO gets (rewards, mask, index,
norm flag) with the default ε; every other estimator gets rewards, mask and the algorithm config
plus whatever other inputs are given (index, reward_baselines, old_log_prob, ...).
"""

from __future__ import annotations

from typing import Any

import jax

from jrl.algos.advantages import get_adv_estimator_fn
from jrl.algos.options import config_option

SETTINGS = ("gamma", "lam", "norm_adv_by_std_in_grpo")
GROUPED = (
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "reinforce_plus_plus_baseline",
    "opo",
    "gpg",
)
# Inputs an estimator cannot run without: (keyword, what it is and where it comes from).
REQUIRED: dict[str, tuple[tuple[str, str], ...]] = {
    "gae": (
        ("values", "the critic's values per response token (enable the critic)"),
        ("gamma", "the discount algorithm.gamma (pass gamma=... or config=<algorithm>)"),
        ("lam", "the GAE λ algorithm.lam (pass lam=... or config=<algorithm>)"),
    ),
    "remax": (
        (
            "reward_baselines",
            "a greedy baseline rollout: the summed reward of a greedy response per prompt",
        ),
    ),
    **{
        name: (("index", "one group id per row (the prompt's `uid`) to form groups"),)
        for name in GROUPED
    },
}


def compute_advantage(
    adv_estimator: str,
    *,
    token_level_rewards: jax.Array,
    response_mask: jax.Array | None = None,
    attention_mask: jax.Array | None = None,
    config: Any = None,
    **inputs: Any,
) -> tuple[jax.Array, jax.Array]:
    """(advantages, returns) from the estimator registered as `adv_estimator`.

    `response_mask` defaults to the last R columns of `attention_mask` (R = reward width), as in
    verl. γ, λ and `norm_adv_by_std_in_grpo` come from the arguments, else from `config` (the
    `algorithm` section); unlike verl, the norm flag therefore also reaches grpo_vectorized.
    Inputs passed as None count as absent. Raises ValueError for an unknown estimator (listing
    the registered names) or a missing required input.
    """
    fn = get_adv_estimator_fn(adv_estimator)
    name = str(getattr(adv_estimator, "value", adv_estimator))
    if response_mask is None:
        if attention_mask is None:
            raise ValueError(
                f"adv_estimator {name!r} needs response_mask (or attention_mask to derive it)"
            )
        response_mask = attention_mask[:, -token_level_rewards.shape[-1] :]
    given = {key: value for key, value in inputs.items() if value is not None}
    for key in SETTINGS:
        if key not in given and config_option(config, key) is not None:
            given[key] = config_option(config, key)
    for key, meaning in REQUIRED.get(name, ()):
        if key not in given:
            raise ValueError(
                f"algorithm.adv_estimator={name!r} needs `{key}`: {meaning}; it was not provided"
            )
    common = {"token_level_rewards": token_level_rewards, "response_mask": response_mask}
    if name == "gae":
        return fn(**common, values=given["values"], gamma=given["gamma"], lam=given["lam"])
    if name == "grpo":
        norm = bool(given.get("norm_adv_by_std_in_grpo", True))
        return fn(**common, index=given["index"], norm_adv_by_std_in_grpo=norm)
    return fn(**common, config=config, **given)
