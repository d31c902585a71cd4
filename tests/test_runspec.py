"""The RunSpec: resolved once from the keys through a view that records every key read."""

from __future__ import annotations

from pathlib import Path

import pytest
from ml_collections import ConfigDict

from jrl.config import sft_config
from jrl.runspec import load_config
from jrl.runspec.effects import explain
from jrl.runspec.reads import KeyReads, was_read
from jrl.runspec.spec import resolve_run, resolve_sft_run

REPO = Path(__file__).resolve().parents[1]
PPO = f"--config={REPO / 'configs' / 'gsm8k_ppo.py'}"
GRPO = f"--config={REPO / 'configs' / 'gsm8k_grpo.py'}"


def test_the_view_records_each_leaf_read_by_its_dotted_path():
    tree = ConfigDict({"a": {"b": 1, "c": {"d": 2}}, "e": 3})
    view = KeyReads(tree)
    assert view.a.b == 1 and view["a.c.d"] == 2 and view.get("a.missing", 7) == 7
    assert view.reads == {"a.b", "a.c.d"}  # sections passed through are not leaves
    assert view.a.c.whole() == {"d": 2} and "a.c" in view.reads
    assert view.record() == tree.to_dict() and "e" not in view.reads
    assert was_read("a.c.d", view.reads) and was_read("a.c.x", view.reads)
    assert not was_read("e", view.reads)


def test_a_ppo_run_resolves_its_shape_cadence_checkpoints_and_loggers():
    config, _ = load_config(
        [PPO, "trainer.max_actor_ckpt_to_keep=2", "trainer.logger=[console,file]"]
    )
    run = resolve_run(config)
    assert run.trains_critic and not run.has_reference  # gae, no KL
    assert run.mesh.devices == 8 and run.mesh.tensor_parallel == 1
    assert set(run.checkpoint.roles) == {"actor", "critic"}
    assert run.checkpoint.retention == {"actor": 2, "critic": None}
    assert run.checkpoint.roles["actor"].save_contents == ("model", "optimizer", "extra")
    assert run.logging.loggers == ("console", "file")
    assert run.cadence.total_steps(10) == 10 * config.trainer.total_epochs
    assert {"trainer.max_actor_ckpt_to_keep", "trainer.test_freq", "critic.enable"} <= run.reads
    assert "trainer.max_critic_ckpt_to_keep" in run.reads
    assert run.key_fields["trainer.max_actor_ckpt_to_keep"] == ("checkpoint",)
    assert run.key_fields["trainer.nnodes"] == ("mesh",)
    assert run.key_fields["critic.enable"] == ("trains_critic",)


def test_grpo_keeps_no_critic_checkpoints_and_reads_no_critic_keys():
    run = resolve_run(load_config([GRPO])[0])
    assert not run.trains_critic and run.has_reference
    assert set(run.checkpoint.roles) == {"actor"}
    assert not any(key.startswith("critic.checkpoint") for key in run.reads)
    assert "trainer.max_critic_ckpt_to_keep" not in run.reads


def test_the_deprecated_retention_key_keeps_one_of_each_with_a_warning():
    config, _ = load_config([PPO, "trainer.remove_previous_ckpt_in_save=true"])
    with pytest.warns(DeprecationWarning, match="max_actor_ckpt_to_keep"):
        run = resolve_run(config)
    assert run.checkpoint.retention == {"actor": 1, "critic": 1}


def test_sft_resolves_its_one_role():
    config = sft_config()
    run = resolve_sft_run(config, "actor")
    assert run.checkpoint.retention == {"actor": config.trainer.max_ckpt_to_keep}
    assert run.cadence.test_freq == config.trainer.test_freq


def test_explain_names_the_runspec_field_each_key_became():
    lines = explain([GRPO], lambda config: "jax").splitlines()
    line = {text.split(" = ")[0]: text for text in lines}
    assert line["trainer.save_freq"].endswith("-> cadence")
    assert line["trainer.nnodes"].endswith("-> mesh")
    assert "->" not in line["algorithm.gamma"]  # grpo does not read it: announced instead
    assert "no effect" in line["algorithm.gamma"]
