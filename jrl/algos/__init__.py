"""Core RL algorithms: advantage estimators, policy/value/entropy losses, KL penalties.

Pure functions on JAX arrays under verl's names and keyword names; see `jrl.algos.aggregation`
for exact loss normalisation under micro-batch accumulation.
"""

from jrl.algos.advantages import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    get_adv_estimator_fn,
    group_ids_to_segments,
    register_adv_est,
)
from jrl.algos.aggregation import (
    LOSS_AGG_MODES,
    LossTerms,
    agg_loss,
    agg_loss_terms,
    global_denominator,
    reduce_loss_terms,
)
from jrl.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from jrl.algos.logits import compute_entropy_loss, entropy_from_logits, logprobs_from_logits
from jrl.algos.numerics import masked_mean, masked_sum, masked_var, masked_whiten, safe_divide
from jrl.algos.policy_loss import (
    compute_policy_loss,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    get_policy_loss_terms_fn,
    policy_loss_terms_vanilla,
    register_policy_loss,
    register_policy_loss_terms,
)
from jrl.algos.value_loss import compute_value_loss, value_loss_terms

__all__ = [
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "LossTerms",
    "agg_loss",
    "agg_loss_terms",
    "apply_kl_penalty",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "get_policy_loss_terms_fn",
    "global_denominator",
    "group_ids_to_segments",
    "kl_penalty",
    "kl_penalty_forward",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss_terms_vanilla",
    "reduce_loss_terms",
    "register_adv_est",
    "register_policy_loss",
    "register_policy_loss_terms",
    "safe_divide",
    "value_loss_terms",
]
