"""Stopping cleanly: SIGTERM ends a run after the current step with a loadable checkpoint and exit
status 0; a NaN loss stops a run before that step is saved."""

from __future__ import annotations

import os
import signal

import pytest
from helpers import WatchedRun

from jrl import train
from jrl.assets import prepare_tiny, tiny_paths
from jrl.models import from_pretrained
from jrl.optim.optimizers import make_optimizer
from jrl.parallel import make_mesh
from jrl.runspec import load_config
from jrl.runspec.optim import optimizer_settings
from jrl.trainer.io.checkpoint import restore_role
from jrl.trainer.io.step_folders import problems, read_tracker
from jrl.trainer.loop.stopping import NonFiniteLossError, StopRequest
from jrl.trainer.update.learner import Learner

QUIET = ["trainer.val_before_train=false", "trainer.test_freq=-1"]


def test_stop_request_turns_signals_into_a_flag():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signal_name == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):  # a second signal aborts at once
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_finishes_the_step_and_leaves_a_loadable_checkpoint(tmp_path):
    prepare_tiny()
    run_dir = tmp_path / "run"
    card = "--config=configs/gsm8k_grpo.py:tiny"
    run = WatchedRun(
        [card, "trainer.total_training_steps=100", f"trainer.default_local_dir={run_dir}", *QUIET]
    )
    run.wait_for(lambda: any(line.startswith("step:2 - ") for line in run.lines))
    run.process.send_signal(signal.SIGTERM)
    assert run.finish() == 0
    lines = run.lines
    out = run.output
    stopped = read_tracker(run_dir)
    assert stopped is not None and 2 <= stopped < 100
    assert f"stopped after step {stopped} on SIGTERM" in out
    assert not any(line.startswith(f"step:{stopped + 1} - ") for line in lines)
    folder = run_dir / f"global_step_{stopped}"
    assert problems(folder, ["actor"]) == []

    # the checkpoint loads into the actor's state
    config, _ = load_config([card])
    model = from_pretrained(tiny_paths()["model_path"], mesh=make_mesh(1))
    optimizer = optimizer_settings(config.actor_rollout_ref.actor.optim, "optim")
    state = Learner.create(model, make_optimizer(optimizer), make_mesh(1))
    extra = restore_role(folder / "actor", state, ["model", "optimizer", "extra"])
    assert extra["global_step"] == stopped
    assert extra["data_loader"]["position"] == stopped


def test_nan_loss_stops_before_saving_that_step(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"step 2: .*pg_loss=nan") as err:
        train.main(
            [
                "--config=configs/gsm8k_grpo.py:tiny",
                f"trainer.default_local_dir={run_dir}",
                "trainer.save_freq=1",
                "trainer.total_training_steps=4",
                # Step 1's update (the entropy bonus's gradient; Adam moves each weight by about
                # lr) makes the weights overflow, so step 2's loss is NaN. (A reward cannot:
                # rewards are checked, jrl.reward.guard.)
                "actor_rollout_ref.actor.optim.lr=1e38",
                "actor_rollout_ref.actor.entropy_coeff=0.1",
                *QUIET,
            ]
        )
    assert f"Last good checkpoint: {run_dir.absolute() / 'global_step_1'}" in str(err.value)
    assert read_tracker(run_dir) == 1
    assert not (run_dir / "global_step_2").exists()
