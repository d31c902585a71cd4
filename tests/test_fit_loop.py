"""verl's loop keys in a real run: total_training_steps derived from the data, val_before_train and
test_freq (1-based, plus the last step), critic_warmup, the LR schedule injected at run time,
log_val_generations and the end-of-run plots;
AdamW's betas and weight decay against the closed form."""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import one_tiny_ppo_step

from jrl import train
from jrl.optim.optimizers import make_optimizer, set_learning_rate
from jrl.optim.schedule import Schedule
from jrl.optim.settings import OptimizerSettings, ScheduleSettings


def test_loop_keys_follow_verls_rules(tmp_path, capsys):
    run_dir = tmp_path / "run"
    lr = 1e-4
    train.main(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            f"trainer.default_local_dir={run_dir}",
            "trainer.logger=['file']",
            "trainer.total_training_steps=null",  # derived: 20 rows // batch 4 * 1 epoch = 5
            "data.train_max_samples=20",
            "trainer.total_epochs=1",
            "trainer.test_freq=2",
            "trainer.val_before_train=true",
            "trainer.critic_warmup=2",
            f"actor_rollout_ref.actor.optim.lr={lr}",
            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.4",
            "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
            "actor_rollout_ref.actor.optim.min_lr_ratio=0.1",
            "trainer.log_val_generations=2",
        ]
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_step = {row["step"]: row["data"] for row in rows}
    val_key = "val-core/openai/gsm8k/reward/mean@1"
    assert sorted(by_step) == [0, 1, 2, 3, 4, 5]
    assert [s for s in sorted(by_step) if val_key in by_step[s]] == [0, 2, 4, 5]
    printed = capsys.readouterr().out  # verl's two printouts, the last step's validation only
    assert f"Initial validation metrics: {{'{val_key}': {by_step[0][val_key]!r}" in printed
    final = f"Final validation metrics: {{'{val_key}': {by_step[5][val_key]!r}"
    assert final in printed and "'actor/lr'" not in printed.split(final)[1].split("}")[0]
    assert "actor/pg_loss" not in by_step[1]  # critic_warmup=2: the actor waits one step
    schedule = _schedule(ScheduleSettings("cosine", None, 0.4, min_lr_ratio=0.1), 5)
    for step in range(2, 6):  # the schedule counts the actor's updates, as verl's scheduler
        expected = lr * schedule.multiplier(step - 2)
        assert by_step[step]["actor/lr"] == pytest.approx(expected, rel=1e-6), step
    # warmup 2 steps over 5: factors 0 (step 2), 0.5, then cosine from 1.0 down towards 0.1
    assert by_step[2]["actor/lr"] == 0.0
    assert by_step[3]["actor/lr"] == pytest.approx(0.5 * lr)
    assert by_step[4]["actor/lr"] == pytest.approx(lr)
    # two validation samples kept per validation, and the end-of-run plots
    samples = [json.loads(x) for x in (run_dir / "val_generations.jsonl").read_text().splitlines()]
    assert [row["step"] for row in samples] == [0, 0, 2, 2, 4, 4, 5, 5]
    assert all(isinstance(row["output"], str) and "score" in row for row in samples)
    assert (run_dir / "plots" / "reward.png").stat().st_size > 0


def _schedule(schedule: ScheduleSettings, total: int, lr: float = 1.0) -> Schedule:
    """The schedule of an AdamW at `lr` under `schedule` over `total` steps."""
    settings = OptimizerSettings("AdamW", lr, (0.9, 0.999), 0.0, schedule)
    return Schedule.from_settings(settings, total)


def test_cosine_with_cycles_closed_form():
    schedule = _schedule(ScheduleSettings("cosine", 0, 0.0, min_lr_ratio=0.0, num_cycles=1.0), 8)
    # one full cycle: down to 0 at the middle, back to 1 at the end
    assert schedule.multiplier(0) == pytest.approx(1.0)
    assert schedule.multiplier(4) == pytest.approx(0.0, abs=1e-12)
    assert schedule.multiplier(2) == pytest.approx(0.5)
    assert schedule.multiplier(8) == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["AdamW", "adam"])  # adam: Megatron's, decoupled decay too
def test_adamw_betas_and_weight_decay_closed_form(name):
    constant = ScheduleSettings("constant", None, 0.0)
    tx = make_optimizer(OptimizerSettings(name, 0.1, (0.8, 0.9), 0.5, constant))
    params = {"w": jnp.array([1.0, -2.0])}
    grads = [np.array([0.5, 0.25]), np.array([-1.0, 0.5])]
    state = tx.init(params)
    w, m, v = np.array([1.0, -2.0]), np.zeros(2), np.zeros(2)
    for t, g in enumerate(grads, start=1):
        lr_t = 0.1 * (0.5 if t == 2 else 1.0)  # the injected rate changes between steps
        state = set_learning_rate(state, lr_t)
        updates, state = tx.update({"w": jnp.asarray(g)}, state, params)
        params = {"w": params["w"] + updates["w"]}
        m = 0.8 * m + 0.2 * g
        v = 0.9 * v + 0.1 * g**2
        m_hat, v_hat = m / (1 - 0.8**t), v / (1 - 0.9**t)
        w = w - lr_t * (m_hat / (np.sqrt(v_hat) + 1e-8) + 0.5 * w)
        np.testing.assert_allclose(np.asarray(params["w"]), w, rtol=1e-6)
    assert math.isfinite(float(params["w"][0]))


def test_critic_has_its_own_schedule(tmp_path):
    metrics = one_tiny_ppo_step(
        tmp_path / "run",
        "critic.optim.lr=0.002",
        "critic.optim.lr_warmup_steps=2",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    )
    # step 1 is scheduler step 0: the critic is still warming up (0/2), the actor is not
    assert metrics["critic/lr"] == 0.0
    assert metrics["actor/lr"] == pytest.approx(1e-4)  # the :tiny preset's actor lr
