"""Core RL algorithms: advantage estimators, policy/value/entropy losses, KL penalties, rollout IS.

Pure functions on JAX arrays under verl's names and keyword names; see `jrl.algos.aggregation`
for exact loss normalisation under micro-batch accumulation. Importing this package registers
every estimator and policy loss.
"""

from jrl.algos.advantage_dispatch import compute_advantage
from jrl.algos.advantages import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
)
from jrl.algos.aggregation import (
    LOSS_AGG_MODES,
    LossTerms,
    agg_loss,
    agg_loss_terms,
    global_denominator,
    reduce_loss_terms,
)
from jrl.algos.bypass_loss import compute_policy_loss_bypass_mode, policy_loss_terms_bypass_mode
from jrl.algos.correction_settings import CorrectionOptions, LegacyRolloutIS, RolloutCorrection
from jrl.algos.covariance_losses import (
    compute_policy_loss_clip_cov,
    compute_policy_loss_kl_cov,
    policy_loss_terms_clip_cov,
    policy_loss_terms_kl_cov,
)
from jrl.algos.estimator import (
    ADV_ESTIMATORS,
    Estimator,
    EstimatorOptions,
    get_adv_estimator,
    get_adv_estimator_fn,
    register_adv_est,
)
from jrl.algos.group_baselines import (
    compute_gpg_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from jrl.algos.groups import group_ids_to_segments
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
    POLICY_LOSS_TERMS,
    compute_policy_loss,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    get_policy_loss_terms_fn,
    policy_loss_terms,
    policy_loss_terms_vanilla,
    register_policy_loss,
    register_policy_loss_terms,
)
from jrl.algos.rollout_is import compute_rollout_importance_weights, rollout_importance_sampling
from jrl.algos.sequence_losses import (
    compute_policy_loss_geo_mean,
    compute_policy_loss_gspo,
    policy_loss_terms_geo_mean,
    policy_loss_terms_gspo,
)
from jrl.algos.settings import (
    KLControl,
    KLInReward,
    KLLoss,
    PolicyLossSettings,
    VerlSection,
)
from jrl.algos.token_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_gpg,
    compute_policy_loss_sapo,
    policy_loss_terms_cispo,
    policy_loss_terms_gpg,
    policy_loss_terms_sapo,
)
from jrl.algos.token_returns import (
    compute_no_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_reward_advantage,
)
from jrl.algos.value_loss import compute_value_loss, value_loss_terms

__all__ = [
    "ADV_ESTIMATORS",
    "POLICY_LOSS_TERMS",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "CorrectionOptions",
    "KLControl",
    "KLInReward",
    "KLLoss",
    "LegacyRolloutIS",
    "PolicyLossSettings",
    "RolloutCorrection",
    "VerlSection",
    "Estimator",
    "EstimatorOptions",
    "FixedKLController",
    "LossTerms",
    "agg_loss",
    "agg_loss_terms",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_no_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_reward_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_importance_weights",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator",
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
    "policy_loss_terms",
    "policy_loss_terms_bypass_mode",
    "policy_loss_terms_cispo",
    "policy_loss_terms_clip_cov",
    "policy_loss_terms_geo_mean",
    "policy_loss_terms_gpg",
    "policy_loss_terms_gspo",
    "policy_loss_terms_kl_cov",
    "policy_loss_terms_sapo",
    "policy_loss_terms_vanilla",
    "reduce_loss_terms",
    "register_adv_est",
    "register_policy_loss",
    "register_policy_loss_terms",
    "rollout_importance_sampling",
    "safe_divide",
    "value_loss_terms",
]
