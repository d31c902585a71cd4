"""Advantage estimators and `compute_advantage` against numpy loops written from the formulas."""

import statistics

import numpy as np
import pytest
from reference import MASK, UIDS, B, R, close, outcome_rewards, rand, ref_gae, ref_grpo, ref_whiten

from jrl import algos
from jrl.algos import advantages as adv_module
from jrl.algos import group_baselines

EPS = 1e-6
# Groups of at least two rows for pass@k: "a" (rows 0, 2, 6), "b" (1, 3, 7), "c" (4, 5).
PASSK_UIDS = np.array(["a", "b", "a", "b", "c", "c", "a", "b"], dtype=object)


def make_rewards() -> np.ndarray:
    """Outcome scores with ties, zeros and an empty row, plus dense rewards on two rows."""
    rewards = outcome_rewards(np.array([1.0, 0.5, 0.0, 0.7, 0.5, 0.0, 2.0, -1.0]))
    rewards[0, :3] += rand(30)[0, :3]
    rewards[7, :2] += rand(31)[7, :2]
    return rewards


def members(index, i):
    return [j for j in range(len(index)) if index[j] == index[i]]


def scores_of(rewards):
    return rewards.astype(np.float64).sum(-1)


def spread(per_row):
    return np.asarray(per_row, np.float64)[:, None] * MASK


# ---------------------------------------------------------------- numpy references


def ref_rloo(rewards, index, singleton_zero=False):
    s = scores_of(rewards)
    out = []
    for i in range(B):
        others = [s[j] for j in members(index, i) if j != i]
        if others:
            out.append(s[i] - sum(others) / len(others))
        else:
            out.append(0.0 if singleton_zero else s[i])
    return spread(out)


def group_mean_or_zero(s, index, i):
    group = [s[j] for j in members(index, i)]
    return statistics.mean(group) if len(group) > 1 else 0.0


def ref_rf_baseline(rewards, index):
    s = scores_of(rewards)
    tiled = spread([s[i] - group_mean_or_zero(s, index, i) for i in range(B)])
    return ref_whiten(tiled, MASK) * MASK


def ref_opo(rewards, index):
    s, lengths = scores_of(rewards), MASK.sum(-1)
    out = []
    for i in range(B):
        group = members(index, i)
        total = sum(lengths[j] for j in group)
        weighted = sum(lengths[j] * s[j] for j in group) / total if total else 0.0
        out.append(s[i] - (weighted if len(group) > 1 else 0.0))
    return spread(out)


def ref_gpg(rewards, index):
    s = scores_of(rewards)
    alpha = B / max(sum(1 for v in s if v != 0), 1)
    return spread([alpha * (s[i] - group_mean_or_zero(s, index, i)) for i in range(B)])


def ref_passk(rewards, index, norm):
    s = scores_of(rewards)
    out = [0.0] * B
    for group_id in dict.fromkeys(index):
        group = [j for j in range(B) if index[j] == group_id]
        ordered = sorted(group, key=lambda j: (-s[j], j))
        margin = s[ordered[0]] - s[ordered[1]]
        if norm:
            margin /= statistics.stdev([s[j] for j in group]) + EPS
        out[ordered[0]] = margin
    return spread(out)


def ref_discounted_returns(rewards, gamma):
    returns = np.zeros((B, R))
    for i in range(B):
        running = 0.0
        for t in reversed(range(R)):
            running = rewards[i, t] + gamma * running
            returns[i, t] = running
            running *= MASK[i, t]
    return returns


def ref_reward_to_go(rewards):
    out = np.zeros((B, R))
    for i in range(B):
        for t in range(R):
            out[i, t] = sum(float(rewards[i, u]) * MASK[i, u] for u in range(t, R))
    return out


def ref_for(name, rewards, inputs, cfg):
    """(advantages, returns) that `name` must produce for these inputs."""
    index = list(inputs["index"])
    norm = cfg.norm_adv_by_std_in_grpo
    if name == "gae":
        return ref_gae(rewards, inputs["values"], MASK, cfg.gamma, cfg.lam)
    if name == "reinforce_plus_plus":
        returns = ref_discounted_returns(rewards, cfg.gamma)
        return ref_whiten(returns, MASK) * MASK, returns
    if name == "remax":
        returns = ref_reward_to_go(rewards)
        return returns - inputs["reward_baselines"][:, None] * MASK, returns
    if name == "reward":
        returns = ref_reward_to_go(rewards) * MASK
        return returns, returns
    if name == "none":
        return np.zeros((B, R)), np.zeros((B, R))
    advantages = {
        "grpo": lambda: ref_grpo(rewards, MASK, index, EPS, norm),
        # verl's trainer passes grpo_vectorized no norm_adv_by_std_in_grpo: it always divides
        "grpo_vectorized": lambda: ref_grpo(rewards, MASK, index, EPS, True),
        "grpo_passk": lambda: ref_passk(rewards, index, norm),
        "rloo": lambda: ref_rloo(rewards, index),
        "rloo_vectorized": lambda: ref_rloo(rewards, index, singleton_zero=True),
        "reinforce_plus_plus_baseline": lambda: ref_rf_baseline(rewards, index),
        "opo": lambda: ref_opo(rewards, index),
        "gpg": lambda: ref_gpg(rewards, index),
    }[name]()
    return advantages, advantages


def algorithm_config(**overrides):
    values = {"gamma": 0.9, "lam": 0.95, "norm_adv_by_std_in_grpo": True, **overrides}
    return algos.EstimatorOptions(**values)


def all_inputs(name):
    index = PASSK_UIDS if name == "grpo_passk" else UIDS
    return {
        "values": rand(32),
        "index": index,
        "reward_baselines": rand(33, (B,)),
        "old_log_prob": rand(34),
    }


NAMES = [
    "gae",
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
    "reward",
    "none",
]


# ---------------------------------------------------------------- tests


def test_every_estimator_is_registered():
    registered = algos.ADV_ESTIMATORS.names()
    assert sorted(NAMES) == registered


@pytest.mark.parametrize("name", NAMES)
def test_compute_advantage_dispatch_matches_reference(name):
    rewards, inputs, cfg = make_rewards(), all_inputs(name), algorithm_config()
    advantages, returns = algos.compute_advantage(
        name, token_level_rewards=rewards, response_mask=MASK, options=cfg, **inputs
    )
    ref_adv, ref_ret = ref_for(name, rewards, inputs, cfg)
    close(advantages, ref_adv, 1e-4)
    close(returns, ref_ret, 1e-4)
    assert np.asarray(advantages).dtype == np.float32
    # The registry entry takes the full keyword set the trainer passes and ignores the rest.
    fn = algos.get_adv_estimator_fn(name)
    direct, _ = fn(
        token_level_rewards=rewards,
        response_mask=MASK,
        config=cfg,
        gamma=cfg.gamma,
        lam=cfg.lam,
        norm_adv_by_std_in_grpo=cfg.norm_adv_by_std_in_grpo,
        unused_extra=object(),
        **inputs,
    )
    close(direct, ref_adv, 1e-4)


@pytest.mark.parametrize("name", ["grpo", "grpo_vectorized", "grpo_passk"])
def test_norm_flag_off_from_config(name):
    rewards, inputs = make_rewards(), all_inputs(name)
    cfg = algorithm_config(norm_adv_by_std_in_grpo=False)
    advantages, _ = algos.compute_advantage(
        name, token_level_rewards=rewards, response_mask=MASK, options=cfg, **inputs
    )
    close(advantages, ref_for(name, rewards, inputs, cfg)[0], 1e-4)


def test_grpo_vectorized_floors_the_group_variance_at_epsilon():
    """verl v0.6.0: σ = sqrt(max(var, 1e-6)), so two scores 0.001 apart get ±0.0005 / 0.001."""
    rewards = np.zeros((2, 3), np.float32)
    rewards[1, 0] = 0.001
    mask = np.ones((2, 3), np.float32)
    vectorized, _ = algos.compute_grpo_vectorized_outcome_advantage(rewards, mask, ["a", "a"])
    floored = 0.0005 / (1e-3 + 1e-6)
    close(vectorized[:, 0], [-floored, floored], 1e-6)
    plain, _ = algos.compute_grpo_outcome_advantage(rewards, mask, ["a", "a"])  # no floor
    close(plain[:, 0], [-0.0005 / (0.0005 * 2**0.5 + 1e-6), 0.0005 / (0.0005 * 2**0.5 + 1e-6)])


def test_group_edge_cases():
    """Singleton group, all-equal group, empty row and EOS-first row (see UIDS / MASK)."""
    rewards = make_rewards()
    rloo, _ = algos.compute_rloo_outcome_advantage(rewards, MASK, UIDS)
    rloo_vec, _ = algos.compute_rloo_vectorized_outcome_advantage(rewards, MASK, UIDS)
    close(rloo[3, 0], 0.7)  # singleton "c" (EOS first): A = s
    close(rloo_vec[3, 0], 0.0)  # vectorised variant: singleton gets 0
    for fn in (
        algos.compute_rloo_outcome_advantage,
        algos.compute_opo_outcome_advantage,
        algos.compute_gpg_outcome_advantage,
        algos.compute_grpo_vectorized_outcome_advantage,
    ):
        advantages = np.asarray(fn(rewards, MASK, UIDS)[0])
        assert np.all(advantages[[1, 4]] == 0)  # all-equal group "b"
        assert np.all(advantages[2] == 0)  # empty response
        assert np.all(advantages[MASK == 0] == 0)


def test_one_response_per_prompt():
    rewards, index = make_rewards(), np.arange(B)
    close(algos.compute_rloo_outcome_advantage(rewards, MASK, index)[0], ref_rloo(rewards, index))
    close(algos.compute_gpg_outcome_advantage(rewards, MASK, index)[0], ref_gpg(rewards, index))
    close(algos.compute_opo_outcome_advantage(rewards, MASK, index)[0], spread(scores_of(rewards)))
    with pytest.raises(ValueError, match="grpo_passk needs at least 2 responses.*rollout.n"):
        algos.compute_grpo_passk_outcome_advantage(rewards, MASK, index)


def test_passk_ties_give_zero_margin():
    rewards = outcome_rewards(np.array([1.0, 0.0, 0.0, 0.0, 0.3, 0.3, 1.0, 0.0]))
    advantages, _ = algos.compute_grpo_passk_outcome_advantage(rewards, MASK, PASSK_UIDS)
    assert np.all(np.asarray(advantages) == 0)  # "a" ties at 1.0 (rows 0, 6), "b" all 0, "c" tie
    rewards[6, 0] = 5.0  # row 6 now leads group "a"
    advantages, _ = algos.compute_grpo_passk_outcome_advantage(
        rewards, MASK, PASSK_UIDS, norm_adv_by_std_in_grpo=False
    )
    close(advantages, ref_passk(rewards, list(PASSK_UIDS), norm=False))
    assert np.count_nonzero(np.asarray(advantages)[:, 0]) == 1


def test_opo_group_of_empty_responses_gets_zero_baseline():
    rewards = make_rewards()
    mask = MASK.copy()
    mask[[6, 7]] = 0  # group "d" is all empty
    advantages, _ = algos.compute_opo_outcome_advantage(rewards, mask, UIDS)
    assert np.isfinite(np.asarray(advantages)).all()
    assert np.all(np.asarray(advantages)[[6, 7]] == 0)


def test_grouping_changes_do_not_recompile():
    rewards = make_rewards()
    algos.compute_rloo_outcome_advantage(rewards, MASK, UIDS)
    algos.compute_grpo_outcome_advantage(rewards, MASK, UIDS)
    sizes = (group_baselines._run._cache_size(), adv_module._grpo._cache_size())
    shuffled = np.random.default_rng(0).permutation(UIDS)
    algos.compute_rloo_outcome_advantage(rewards, MASK, shuffled)
    algos.compute_grpo_outcome_advantage(rewards, MASK, np.arange(B))
    assert (group_baselines._run._cache_size(), adv_module._grpo._cache_size()) == sizes


def test_missing_inputs_and_unknown_name_fail_clearly():
    rewards = make_rewards()
    common = {"token_level_rewards": rewards, "response_mask": MASK}
    with pytest.raises(ValueError, match="adv_estimator='remax' needs `reward_baselines`.*greedy"):
        algos.compute_advantage("remax", **common, reward_baselines=None)
    with pytest.raises(ValueError, match="remax needs a greedy baseline rollout"):
        algos.compute_remax_outcome_advantage(rewards, MASK)
    with pytest.raises(ValueError, match=r"one value per row, shape \(8,\)"):
        algos.compute_remax_outcome_advantage(rewards, MASK, reward_baselines=np.zeros(3))
    with pytest.raises(ValueError, match="'gae' needs `values`.*critic"):
        algos.compute_advantage("gae", **common, options=algorithm_config())
    with pytest.raises(ValueError, match="'rloo' needs `index`.*uid"):
        algos.compute_advantage("rloo", **common)
    with pytest.raises(ValueError, match="needs `lam`: the GAE"):
        algos.compute_advantage("gae", **common, values=rand(32), gamma=1.0)
    with pytest.raises(ValueError, match="reinforce_plus_plus needs the discount algorithm.gamma"):
        algos.compute_advantage("reinforce_plus_plus", **common)
    with pytest.raises(ValueError, match="opo index has 4 group ids but .* 8 rows"):
        algos.compute_opo_outcome_advantage(rewards, MASK, UIDS[:4])
    with pytest.raises(
        ValueError, match="Unknown advantage estimator 'ppo'.*algorithm.adv_estimator"
    ):
        algos.compute_advantage("ppo", **common)


def test_response_mask_from_attention_mask():
    rewards = make_rewards()
    attention = np.concatenate([np.ones((B, 3), np.float32), MASK], axis=1)
    advantages, _ = algos.compute_advantage(
        "grpo", token_level_rewards=rewards, attention_mask=attention, index=UIDS
    )
    close(advantages, ref_grpo(rewards, MASK, list(UIDS), EPS, True), 1e-4)
