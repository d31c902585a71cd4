"""Policy losses (gspo, sapo, gpg, clip_cov, kl_cov, geo_mean, cispo) against numpy loops."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import MASK, B, R, close, rand, ref_agg, ref_masked_mean

from jrl import algos
from jrl.algos.policy_loss import POLICY_LOSS_TERMS, POLICY_LOSSES

LOSSES = ["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"]
# Registered too, tested with its rollout-correction options in test_rollout_correction.py.
BYPASS = "bypass_mode"
VALID = MASK > 0
ROWS = [i for i in range(B) if MASK[i].sum() > 0]


ACTOR_OPTIONS = {
    "clip_ratio": 0.2,
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.28,
    "clip_ratio_c": 3.0,
    "tau_pos": 1.0,
    "tau_neg": 1.05,
    "loss_scale_factor": None,
    "clip_cov_ratio": 0.0002,
    "clip_cov_lb": 1.0,
    "clip_cov_ub": 5.0,
    "kl_cov_ratio": 0.0002,
    "ppo_kl_coef": 0.1,
}


def actor_config(**policy_loss):
    return algos.PolicyLossSettings(**{**ACTOR_OPTIONS, **policy_loss})


def inputs(seed=40):
    old = rand(seed, scale=0.5) - 1.0
    new = old + rand(seed + 1, scale=0.3)
    new[0, 1] = old[0, 1] + 0.9  # far outside the clip range
    advantages = rand(seed + 2)
    weights = np.abs(rand(seed + 3, scale=0.3)) + 0.7
    return old, new, advantages, weights


def clip(x, lo, hi):
    return min(max(x, lo), hi)


def row_tokens(i):
    return [t for t in range(R) if MASK[i, t]]


# ---------------------------------------------------------------- numpy references


def ref_gspo(old, new, adv, w, lo, hi):
    loss, clipfrac = np.zeros((B, R)), np.zeros((B, R))
    for i in range(B):
        tokens = row_tokens(i)
        mean_log = sum(float(new[i, t]) - float(old[i, t]) for t in tokens) / max(len(tokens), 1)
        s = math.exp(min(mean_log, 10.0))
        for t in range(R):
            a = float(adv[i, t])
            l1, l2 = -a * s, -a * clip(s, 1 - lo, 1 + hi)
            loss[i, t] = max(l1, l2) * w[i, t]
            clipfrac[i, t] = l2 > l1
    return loss, clipfrac


def ref_gspo_grad(old, new, adv, w, lo, hi):
    """d loss / d logπ: the token ratio has value s_i and derivative s_i in its own logπ."""
    grad = np.zeros((B, R))
    for i in ROWS:
        tokens = row_tokens(i)
        s = math.exp(sum(float(new[i, t]) - float(old[i, t]) for t in tokens) / len(tokens))
        for t in tokens:
            a = float(adv[i, t])
            unclipped_wins = -a * s >= -a * clip(s, 1 - lo, 1 + hi)
            inside = 1 - lo < s < 1 + hi
            grad[i, t] = (-a * s if unclipped_wins or inside else 0.0) * w[i, t]
            grad[i, t] /= len(tokens) * len(ROWS)
    return grad


def ref_sapo(old, new, adv, w):
    loss = np.zeros((B, R))
    for i in range(B):
        for t in range(R):
            a = float(adv[i, t])
            r = math.exp(clip(float(new[i, t]) - float(old[i, t]), -20, 20))
            tau = 1.0 if a > 0 else 1.05
            loss[i, t] = -(1 / (1 + math.exp(-tau * (r - 1)))) * (4 / tau) * a * w[i, t]
    return loss


def ref_cispo(old, new, adv, w, lo, hi):
    loss, grad, clipfrac = np.zeros((B, R)), np.zeros((B, R)), np.zeros((B, R))
    for i in range(B):
        for t in range(R):
            a = float(adv[i, t])
            r = math.exp(clip(float(new[i, t]) - float(old[i, t]), -20, 20))
            rc = clip(r, 1 - lo, 1 + hi)
            loss[i, t] = -rc * a * float(new[i, t]) * w[i, t]
            grad[i, t] = -rc * a * w[i, t]
            clipfrac[i, t] = rc != r
    return loss, grad, clipfrac


def ref_geo_mean(old, new, adv, w, lo, hi):
    """Mean over non-empty rows of -Ā_i·ratio_i (× geometric-mean IS weight)."""
    row_losses = []
    for i in ROWS:
        tokens = row_tokens(i)
        kept = []
        for t in tokens:
            d = float(new[i, t]) - float(old[i, t])
            sign = float(np.sign(adv[i, t]))
            kept.append(sign * min(sign * d, sign * clip(d, -lo, hi)))
        ratio = math.exp(sum(kept) / len(tokens))
        mean_adv = sum(float(adv[i, t]) for t in tokens) / len(tokens)
        is_weight = math.exp(sum(math.log(float(w[i, t]) + 1e-10) for t in tokens) / len(tokens))
        row_losses.append(-mean_adv * ratio * is_weight)
    return sum(row_losses) / len(row_losses)


def ref_clip_cov_pieces(old, new, adv, lo, hi, lb, ub):
    """(ppo per-token loss, candidate tokens) before the random subset."""
    valid = [(i, t) for i in range(B) for t in range(R) if MASK[i, t]]
    mean_a = sum(float(adv[i, t]) for i, t in valid) / len(valid)
    mean_lp = sum(float(new[i, t]) for i, t in valid) / len(valid)
    loss, candidates = np.zeros((B, R)), np.zeros((B, R), bool)
    for i in range(B):
        for t in range(R):
            a = float(adv[i, t])
            r = math.exp(float(new[i, t]) - float(old[i, t]))
            l1, l2 = -a * r, -a * clip(r, 1 - lo, 1 + hi)
            loss[i, t] = max(l1, l2)
            cov = (a - mean_a) * (float(new[i, t]) - mean_lp)
            candidates[i, t] = MASK[i, t] and not l2 > l1 and lb < cov < ub
    return loss, candidates


def ref_kl_cov(old, new, adv, ratio, coef):
    valid = [(i, t) for i in range(B) for t in range(R) if MASK[i, t]]
    mean_a = sum(float(adv[i, t]) for i, t in valid) / len(valid)
    mean_lp = sum(float(new[i, t]) for i, t in valid) / len(valid)
    cov = {(i, t): (float(adv[i, t]) - mean_a) * (float(new[i, t]) - mean_lp) for i, t in valid}
    k = max(1, int(len(valid) * ratio))
    top = sorted(valid, key=lambda it: -cov[it])[:k]
    loss = np.zeros((B, R))
    for i in range(B):
        for t in range(R):
            d = float(new[i, t]) - float(old[i, t])
            loss[i, t] = -float(adv[i, t]) * math.exp(d) + (coef * abs(d) if (i, t) in top else 0)
    return loss, top


# ---------------------------------------------------------------- registry and shared behaviour


def test_every_loss_is_in_both_registries():
    assert POLICY_LOSSES.names() == sorted([*LOSSES, BYPASS]) == POLICY_LOSS_TERMS.names()
    for name in [*LOSSES, BYPASS]:
        fn = algos.get_policy_loss_fn(name)
        assert fn.__name__ == f"compute_policy_loss_{name}"
        assert fn is getattr(algos, f"compute_policy_loss_{name}")
        assert algos.get_policy_loss_terms_fn(name) is getattr(algos, f"policy_loss_terms_{name}")


# A second value of each option, every one changing the losses that read it on `inputs()`.
OTHER_OPTIONS = {
    "clip_ratio": 0.1,
    "clip_ratio_low": 0.05,
    "clip_ratio_high": 0.1,
    "clip_ratio_c": 1.01,
    "tau_pos": 3.0,
    "tau_neg": 3.0,
    "clip_cov_ratio": 0.0002,
    "clip_cov_lb": 0.0,
    "clip_cov_ub": 0.0,
    "kl_cov_ratio": 0.5,
    "ppo_kl_coef": 5.0,
}


@pytest.mark.parametrize("name", LOSSES)
def test_a_loss_reads_the_options_its_descriptor_names_and_no_other(name):
    """The no-effect notice announces an option the run's loss does not declare: it must not act."""
    loss = algos.get_policy_loss(name)
    assert not loss.follows_verl and loss.terms is getattr(algos, f"policy_loss_terms_{name}")
    old, new, adv, w = inputs()
    batch = algos.PolicyInputs(old, new, adv, MASK, w)
    # Clip-Cov detaches every token it may, so each of its options changes the loss.
    wide = {"clip_cov_ratio": 1.0, "clip_cov_lb": -50.0, "clip_cov_ub": 50.0}
    plain = {**ACTOR_OPTIONS, **wide, "clip_ratio_low": None, "clip_ratio_high": None}
    base = loss(batch, algos.PolicyLossSettings(**plain))
    for option, value in OTHER_OPTIONS.items():
        changed = loss(batch, algos.PolicyLossSettings(**{**plain, option: value}))
        same = np.array_equal(changed.loss_mat, base.loss_mat)
        assert same != loss.reads(option), (name, option)
    with pytest.raises(ValueError, match="unknown options \\['clip'\\]"):
        algos.register_policy_loss_terms("typo", options=("clip",))


@pytest.mark.parametrize("name", LOSSES)
def test_losses_are_finite_on_padding_and_follow_their_mode(name):
    old, new, adv, w = inputs()
    dirty_new = np.where(VALID, new, np.nan)  # padding log-probs may be garbage
    padded = algos.PolicyInputs(old, dirty_new, adv, MASK)
    terms = algos.get_policy_loss_terms_fn(name)(padded, actor_config())
    expected_mode = {
        "gspo": "seq-mean-token-mean",
        "sapo": "seq-mean-token-mean",
        "geo_mean": "seq-mean-token-sum",
    }.get(name)
    assert terms.loss_agg_mode == expected_mode
    loss, metrics = algos.get_policy_loss_fn(name)(
        old, dirty_new, adv, MASK, "token-mean", actor_config()
    )
    assert np.isfinite(float(loss)) and all(np.isfinite(float(v)) for v in metrics.values())


EXACT_UNDER_SPLITS = ["vanilla", "gspo", "sapo", "gpg", "geo_mean", "cispo"]


@pytest.mark.parametrize("name", EXACT_UNDER_SPLITS)
def test_accumulated_gradient_equals_whole_batch(name):
    """Losses whose statistics stay inside a row split over micro-batches without change."""
    old, new, adv, w = inputs()
    cfg, mode = actor_config(), "seq-mean-token-sum-norm"
    terms_fn, loss_fn = algos.get_policy_loss_terms_fn(name), algos.get_policy_loss_fn(name)

    def whole(lp):
        return loss_fn(old, lp, adv, MASK, mode, cfg, w)[0]

    def accumulated(lp):
        total = 0.0
        for rows in np.split(np.arange(B), 4):
            rows_in = algos.PolicyInputs(old[rows], lp[rows], adv[rows], MASK[rows], w[rows])
            terms = terms_fn(rows_in, cfg)
            own_mode = terms.loss_agg_mode or mode
            numerator = algos.agg_loss_terms(terms.loss_mat, MASK[rows], own_mode)[0]
            total += numerator / algos.global_denominator(MASK, own_mode)
        return total

    new = jnp.asarray(new)
    close(accumulated(new), float(whole(new)), 1e-5)
    close(jax.grad(accumulated)(new), jax.grad(whole)(new), 1e-5)


# ---------------------------------------------------------------- each loss


def test_gspo_matches_loop_and_has_token_gradients():
    old, new, adv, w = inputs()
    loss, metrics = algos.compute_policy_loss_gspo(
        old, new, adv, MASK, "token-mean", actor_config(), rollout_is_weights=w
    )
    ref_loss, clipfrac = ref_gspo(old, new, adv, w, 0.2, 0.28)
    assert clipfrac[VALID].any() and not clipfrac[VALID].all()
    close(loss, ref_agg(ref_loss, MASK, "seq-mean-token-mean"), 1e-5)
    close(metrics["actor/pg_clipfrac"], ref_masked_mean(clipfrac, MASK))
    close(metrics["actor/ppo_kl"], ref_masked_mean(old.astype(np.float64) - new, MASK), 1e-5)
    assert float(metrics["actor/pg_clipfrac_lower"]) == 0.0
    grad = jax.grad(
        lambda lp: algos.compute_policy_loss_gspo(
            old, lp, adv, MASK, config=actor_config(), rollout_is_weights=w
        )[0]
    )(jnp.asarray(new))
    close(grad, ref_gspo_grad(old, new, adv, w, 0.2, 0.28), 1e-5)


def test_gspo_clamps_the_sequence_log_ratio_at_ten():
    old, new, adv, _ = inputs()
    new[3, 0] = old[3, 0] + 14.0  # row 3 has a single token: log s = 14 -> clamped to 10
    loss, _ = algos.compute_policy_loss_gspo(old, new, adv, MASK, config=actor_config())
    ref_loss, _ = ref_gspo(old, new, adv, np.ones((B, R)), 0.2, 0.28)
    close(loss, ref_agg(ref_loss, MASK, "seq-mean-token-mean"), 1e-4)


def test_sapo_matches_loop_with_config_temperatures():
    old, new, adv, w = inputs()
    new[1, 0] = old[1, 0] + 25.0  # exercises the ±20 clamp
    loss, metrics = algos.compute_policy_loss_sapo(
        old, new, adv, MASK, "token-mean", actor_config(), w
    )
    close(loss, ref_agg(ref_sapo(old, new, adv, w), MASK, "seq-mean-token-mean"), 1e-5)
    assert float(metrics["actor/pg_clipfrac"]) == 0.0
    cfg = actor_config(tau_neg=3.0)
    assert not np.isclose(
        float(
            algos.compute_policy_loss_sapo(old, new, adv, MASK, config=cfg, rollout_is_weights=w)[0]
        ),
        float(loss),
    )


def test_gpg_is_plain_policy_gradient():
    old, new, adv, w = inputs()
    for mode in ("token-mean", "seq-mean-token-sum"):
        loss, metrics = algos.compute_policy_loss_gpg(old, new, adv, MASK, mode, actor_config(), w)
        close(loss, ref_agg(-new.astype(np.float64) * adv * w, MASK, mode), 1e-5)
        zero = {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0, "actor/pg_clipfrac_lower": 0.0}
        assert {name: float(value) for name, value in metrics.items()} == zero  # verl's zeros


def test_cispo_matches_loop_with_stopped_ratio():
    old, new, adv, w = inputs()
    loss, metrics = algos.compute_policy_loss_cispo(
        old, new, adv, MASK, "token-mean", actor_config(), w
    )
    ref_loss, ref_grad, clipfrac = ref_cispo(old, new, adv, w, 0.2, 0.28)
    assert clipfrac[VALID].any()
    close(loss, ref_agg(ref_loss, MASK, "token-mean"), 1e-5)
    close(metrics["actor/pg_clipfrac"], ref_masked_mean(clipfrac, MASK))
    grad = jax.grad(
        lambda lp: algos.compute_policy_loss_cispo(
            old, lp, adv, MASK, "token-mean", actor_config(), w
        )[0]
    )(jnp.asarray(new))
    close(grad, ref_grad * MASK / MASK.sum(), 1e-5)


@pytest.mark.parametrize("with_weights", [False, True])
def test_geo_mean_matches_loop(with_weights):
    old, new, adv, w = inputs()
    adv[0, 2] = 0.0  # sign(A) = 0 drops the token from the geometric mean
    weights = w if with_weights else None
    loss, metrics = algos.compute_policy_loss_geo_mean(
        old, new, adv, MASK, "token-mean", actor_config(), weights
    )
    expected = ref_geo_mean(old, new, adv, w if with_weights else np.ones((B, R)), 0.2, 0.28)
    close(loss, expected, 1e-5)
    d = new.astype(np.float64) - old
    clipped = (d < -0.2) | (d > 0.28)
    assert clipped[VALID].any()
    close(metrics["actor/pg_clipfrac"], ref_masked_mean(clipped & (adv > 0), MASK))
    close(metrics["actor/pg_clipfrac_lower"], ref_masked_mean(clipped & (adv < 0), MASK))


def test_clip_cov_detaches_all_candidates_when_ratio_allows():
    old, new, adv, w = inputs()
    cfg = actor_config(clip_cov_ratio=1.0, clip_cov_lb=0.05, clip_cov_ub=2.0)
    loss, metrics = algos.compute_policy_loss_clip_cov(old, new, adv, MASK, "token-mean", cfg, w)
    ppo_loss, candidates = ref_clip_cov_pieces(old, new, adv, 0.2, 0.28, 0.05, 2.0)
    assert 3 <= candidates.sum() < VALID.sum()
    close(loss, ref_agg(np.where(candidates, 0.0, ppo_loss) * w, MASK, "token-mean"), 1e-5)
    close(metrics["actor/pg_clipfrac"], candidates.sum() / VALID.sum())
    close(metrics["actor/ppo_kl"], ref_masked_mean(old.astype(np.float64) - new, MASK), 1e-5)


def test_clip_cov_random_subset_has_the_verl_size_and_follows_the_key():
    old, new, adv, _ = inputs()
    cfg = actor_config(clip_cov_ratio=2.5 / VALID.sum(), clip_cov_lb=0.05)  # k = int(2.5) = 2
    ppo_loss, candidates = ref_clip_cov_pieces(old, new, adv, 0.2, 0.28, 0.05, 5.0)
    loss_fn = algos.compute_policy_loss_clip_cov

    def detached_set(rng):
        grad = jax.grad(lambda lp: loss_fn(old, lp, adv, MASK, "token-mean", cfg, rng=rng)[0])(
            jnp.asarray(new)
        )
        return set(zip(*np.nonzero(candidates & (np.asarray(grad) == 0)), strict=True))

    chosen = detached_set(None)
    assert len(chosen) == 2
    assert detached_set(None) == chosen  # the default key comes from the batch: a rerun agrees
    corr = np.ones((B, R))
    for i, t in chosen:
        corr[i, t] = 0
    loss, metrics = loss_fn(old, new, adv, MASK, "token-mean", cfg)
    close(loss, ref_agg(ppo_loss * corr, MASK, "token-mean"), 1e-5)
    close(metrics["actor/pg_clipfrac"], 2 / VALID.sum())
    assert float(metrics["actor/pg_clipfrac_lower"]) == 0
    others = [detached_set(jax.random.key(seed)) for seed in (1, 2, 3)]
    assert any(s != chosen for s in others) and all(len(s) == 2 for s in others)


def test_clip_cov_draws_afresh_for_each_batch():
    """verl draws its subset anew at every call; jrl's default key follows the log-probs, so
    micro-batches, epochs and steps draw different subsets of the same candidates."""
    old, new, adv, _ = inputs()
    cfg = actor_config(clip_cov_ratio=2.5 / VALID.sum(), clip_cov_lb=0.05)
    _, candidates = ref_clip_cov_pieces(old, new, adv, 0.2, 0.28, 0.05, 5.0)
    loss_fn = algos.compute_policy_loss_clip_cov
    subsets = set()
    for shift in range(6):  # log-probs a few float32 steps apart: the same candidates
        nudged = jnp.asarray(new) * (1 + 1e-6 * shift)
        grad = jax.grad(lambda lp: loss_fn(old, lp, adv, MASK, "token-mean", cfg)[0])(nudged)
        subsets.add(frozenset(zip(*np.nonzero(candidates & (np.asarray(grad) == 0)), strict=True)))
    assert len(subsets) > 1 and all(len(subset) == 2 for subset in subsets)


def test_kl_cov_matches_loop_and_jit():
    old, new, adv, w = inputs()
    ratio = 3.5 / VALID.sum()  # k = 3
    cfg = actor_config(kl_cov_ratio=ratio, ppo_kl_coef=0.1)
    loss, metrics = algos.compute_policy_loss_kl_cov(old, new, adv, MASK, "token-mean", cfg, w)
    ref_loss, top = ref_kl_cov(old, new, adv, ratio, 0.1)
    assert len(top) == 3
    close(loss, ref_agg(ref_loss * w, MASK, "token-mean"), 1e-5)
    close(
        metrics["actor/ppo_kl"], ref_masked_mean(np.abs(new.astype(np.float64) - old), MASK), 1e-5
    )
    assert float(metrics["actor/pg_clipfrac"]) == float(metrics["actor/pg_clipfrac_lower"]) == 0
    jitted = jax.jit(lambda lp: algos.compute_policy_loss_kl_cov(old, lp, adv, MASK, config=cfg))
    eager = algos.compute_policy_loss_kl_cov(old, new, adv, MASK, config=cfg)[0]
    close(jitted(new)[0], float(eager), 1e-6)
    # The loss's own coefficient (the key null: `test_null_loss_options_keep_the_loss_defaults`)
    # is verl's 1.0.
    options = {k: v for k, v in ACTOR_OPTIONS.items() if k != "ppo_kl_coef"}
    cfg = algos.PolicyLossSettings(**{**options, "kl_cov_ratio": ratio})
    loss_default, _ = algos.compute_policy_loss_kl_cov(old, new, adv, MASK, config=cfg)
    close(loss_default, ref_agg(ref_kl_cov(old, new, adv, ratio, 1.0)[0], MASK, "token-mean"), 1e-5)


def test_kl_cov_with_one_token():
    old, new, adv, _ = inputs()
    mask = np.zeros_like(MASK)
    mask[3, 0] = 1  # EOS-first row only: k = max(int(1·ratio), 1) = 1
    loss, _ = algos.compute_policy_loss_kl_cov(old, new, adv, mask, config=actor_config())
    d = float(new[3, 0]) - float(old[3, 0])
    close(loss, -float(adv[3, 0]) * math.exp(d) + 0.1 * abs(d), 1e-5)


def test_config_errors_name_the_key():
    old, new, adv, _ = inputs()
    with pytest.raises(ValueError, match="actor.policy_loss.clip_cov_ratio must be positive"):
        algos.compute_policy_loss_clip_cov(
            old, new, adv, MASK, config=actor_config(clip_cov_ratio=0.0)
        )
    with pytest.raises(ValueError, match="needs the actor config"):
        algos.compute_policy_loss_gspo(old, new, adv, MASK)
    cfg = actor_config(clip_ratio_c=1.0)  # only dual-clip PPO needs c > 1
    algos.compute_policy_loss_cispo(old, new, adv, MASK, config=cfg)
    with pytest.raises(ValueError, match="clip_ratio_c must be greater than 1"):
        algos.compute_policy_loss_vanilla(old, new, adv, MASK, config=cfg)
