"""The RunSpec: resolved once from the keys through a view that records every key read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from ml_collections import ConfigDict

from jrl.config import apply_overrides, sft_config
from jrl.runspec import load_config
from jrl.runspec.explain import explain
from jrl.runspec.reads import KeyReads
from jrl.runspec.spec import resolve_run, resolve_sft_run
from jrl.trainer.ppo.trainer import PPOTrainer

REPO = Path(__file__).resolve().parents[1]
PPO = f"--config={REPO / 'configs' / 'gsm8k_ppo.py'}"
GRPO = f"--config={REPO / 'configs' / 'gsm8k_grpo.py'}"
FIELDS = ("critic", "reward_model")


def test_the_view_records_each_leaf_read_by_its_dotted_path():
    tree = ConfigDict({"a": {"b": 1, "c": {"d": 2}}, "e": 3})
    view = KeyReads(tree)
    assert view.a.b == 1 and view["a.c.d"] == 2 and view.get("a.missing", 7) == 7
    assert view.reads == {"a.b", "a.c.d"}  # sections passed through are not leaves
    assert view.a.c.whole() == {"d": 2} and "a.c" in view.reads
    assert view.record() == tree.to_dict() and "e" not in view.reads
    record = view.ledger.record()
    assert record.read("a.c.d") and record.read("a.c.x") and not record.read("e")
    view.skip("e", "why not")
    assert view.ledger.record().skip_of("e.f").reason == "why not" and "e" not in view.reads


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
    assert {"trainer.max_actor_ckpt_to_keep", "trainer.test_freq"} <= run.reads
    assert "trainer.max_critic_ckpt_to_keep" in run.reads
    assert run.keys.fields["trainer.max_actor_ckpt_to_keep"] == ("checkpoint",)
    assert run.keys.fields["trainer.nnodes"] == ("mesh",)
    # gae reads the critic's values: the critic trains whatever critic.enable says.
    assert "critic.enable" not in run.reads
    assert "whatever critic.enable says" in run.keys.skip_of("critic.enable").reason


def test_verls_deprecated_tracking_logger_is_wandb():
    config, _ = load_config([PPO, "trainer.logger=[console,tracking,wandb]"])
    with pytest.warns(DeprecationWarning, match="'tracking' is deprecated; use 'wandb'"):
        run = resolve_run(config)
    assert run.logging.loggers == ("console", "wandb")


def test_grpo_keeps_no_critic_checkpoints_and_reads_no_critic_keys():
    run = resolve_run(load_config([GRPO])[0])
    assert not run.trains_critic and run.has_reference
    assert run.keys.fields["critic.enable"] == ("critic",)
    assert run.keys.skip_of("critic.optim.lr").given_only  # the card's critic says nothing
    assert run.keys.read("trainer.critic_warmup")  # verl's actor waits with or without a critic
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


def test_the_roles_resolve_once_into_mesh_free_settings():
    config, _ = load_config(
        [
            PPO,
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            "actor_rollout_ref.actor.shuffle=True",
            "critic.shuffle=False",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
            "critic.ppo_micro_batch_size_per_gpu=null",
            "critic.ppo_micro_batch_size=16",
            "critic.model.fsdp_config.fsdp_size=2",
        ]
    )
    run = resolve_run(config)
    arr = config.actor_rollout_ref
    actor, ref, critic = run.actor, run.ref, run.critic
    assert actor.model.path == arr.model.path and actor.model.kind == "causal_lm"
    assert actor.offload.params and not actor.offload.optimizer
    assert actor.update.mini_rows == arr.actor.ppo_mini_batch_size * arr.rollout.n
    assert actor.update.shuffle_seed == 0  # data_loader_seed null: 0, as verl
    assert actor.update.split.micro_rows == arr.actor.ppo_micro_batch_size_per_gpu
    assert actor.log_probs.max_tokens == 4096 and actor.log_probs.micro_rows is None
    assert actor.log_probs.budget_key == "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
    assert ref is not None and ref.model is not None and ref.mesh.key == "actor_rollout_ref.ref"
    assert critic.model.kind == "value" and critic.mesh.fsdp_size == 2
    assert critic.update.split.global_rows == 16 and critic.update.split.micro_rows is None
    assert critic.update.optimizer.key == "critic.optim" and run.reward_model is None
    fields = run.keys.fields
    assert fields["actor_rollout_ref.actor.fsdp_config.param_offload"] == ("actor",)
    assert fields["critic.model.fsdp_config.fsdp_size"] == ("critic",)
    assert fields["critic.ppo_micro_batch_size"] == ("critic",)
    assert "actor" in fields["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]
    assert fields["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"] == ("ref",)
    assert set(fields["actor_rollout_ref.rollout.n"]) >= {"actor", "ref", "critic"}
    # what a setting leaves unused is not read: the per-device size beside the token budget,
    # the seed of an unshuffled critic, the reward model's keys of a run without one
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu" not in fields
    assert "critic.data_loader_seed" not in fields
    assert not any(key.startswith("reward_model.model") for key in fields)


def test_switched_off_roles_read_none_of_their_keys():
    run = resolve_run(load_config([GRPO])[0])
    assert run.critic is None and run.reward_model is None and run.ref is not None
    critic_keys = {key for key in run.reads if key.startswith("critic.")}
    assert critic_keys == {"critic.enable"}  # read to decide that there is no critic
    into = {field: sorted(k for k, f in run.keys.fields.items() if field in f) for field in FIELDS}
    # what decided that there is no critic, nor a reward model
    decided = {"critic": ["algorithm.adv_estimator", "critic.enable"]}
    assert into == {**decided, "reward_model": ["reward_model.enable"]}
    assert not any(key.startswith("reward_model.model.") for key in run.reads)
    config, _ = load_config([PPO])
    assert resolve_run(config).ref is None
    assert not any(key.startswith("actor_rollout_ref.ref.") for key in resolve_run(config).reads)


def test_override_config_values_at_the_top_level_reach_the_model():
    rope = "+actor_rollout_ref.model.override_config.rope_theta=5000.0"  # verl's FSDP form
    overridden = resolve_run(load_config([GRPO, rope])[0])
    assert overridden.actor.model.override_config["rope_theta"] == 5000.0
    assert "actor_rollout_ref.model.override_config.rope_theta" in overridden.reads


def test_null_lora_targets_are_pefts_default():
    lora = ["actor_rollout_ref.model.lora_rank=4"]
    run = resolve_run(load_config([GRPO, *lora, "actor_rollout_ref.model.target_modules=null"])[0])
    assert run.actor.model.lora.target_modules == ("q_proj", "v_proj")
    assert resolve_run(load_config([GRPO, *lora])[0]).actor.model.lora.target_modules == (
        "all-linear"
    )


def test_with_lora_the_reference_is_the_actors_base():
    config, _ = load_config([GRPO, "actor_rollout_ref.model.lora_rank=4", "data.seed=5"])
    run = resolve_run(config)
    assert run.actor.model.lora is not None and run.actor.model.lora_seed == 5
    assert run.ref.model is None and run.ref.mesh is None and run.ref.offload is None
    assert not any(key.startswith("actor_rollout_ref.ref.fsdp_config") for key in run.reads)
    assert "data.seed" in run.keys.fields and "actor" in run.keys.fields["data.seed"]
    without = resolve_run(load_config([GRPO, "data.seed=5"])[0])
    assert without.actor.model.lora_seed == 0  # the seed only initialises adapters
    assert "actor" not in without.keys.fields["data.seed"]


def test_the_reward_model_and_its_scoring_split():
    config, _ = load_config(
        [GRPO, "reward_model.enable=True", "reward_model.model.input_tokenizer=null"]
    )
    rm = resolve_run(config).reward_model
    assert rm.model.kind == "reward" and rm.model.key == "reward_model.model.path"
    assert rm.input_tokenizer is None and rm.max_length is None
    assert rm.scores.micro_rows == config.reward_model.micro_batch_size_per_gpu
    assert not rm.scores.remove_padding and not rm.scores.share_prompts


def test_the_data_tokenizer_and_step_options():
    config, _ = load_config(
        [
            GRPO,
            "data.train_files=[a.parquet,b.parquet]",
            "data.seed=null",
            "trainer.critic_warmup=2",
            "actor_rollout_ref.model.tokenizer_path=/tok",
        ]
    )
    run = resolve_run(config)
    assert run.data.files.train_files == ("a.parquet", "b.parquet")
    assert run.data.tokenizer.path == "/tok"
    assert run.data.tokenizer.key == "actor_rollout_ref.model.tokenizer_path"
    assert run.data.rows.seed is None and run.trainer.seed == 0  # null: 0 for the keys
    assert run.data.rows.custom_cls is None and "data" not in run.reads  # not read whole
    assert run.trainer.critic_warmup == 2 and run.keys.fields["trainer.critic_warmup"] == (
        "trainer",
    )
    assert run.keys.fields["data.train_files"] == ("data",)


def test_a_users_dataset_class_gets_the_whole_data_section():
    config, _ = load_config(
        [GRPO, "data.custom_cls.path=my.py", "data.custom_cls.name=Mine", "data.prompt_key=q"]
    )
    run = resolve_run(config)
    custom = run.data.rows.custom_cls
    assert (custom.path, custom.name) == ("my.py", "Mine")
    assert custom.config.prompt_key == "q" and custom.config.custom_cls.name == "Mine"
    assert "data" in run.reads and run.keys.read("data.video_key")


def test_sft_resolves_its_model_and_data():
    config = apply_overrides(
        sft_config(),
        [
            ("model.fsdp_config.cpu_offload", True),
            ("model.lora_rank", 4),
            ("data.micro_batch_size_per_gpu", None),
            ("data.micro_batch_size", 16),
            ("data.prompt_dict_keys", ["question"]),
            ("use_remove_padding", True),
        ],
    )
    run = resolve_sft_run(config, "actor")
    model, data = run.model, run.data
    assert model.model.key == "model.partial_pretrain" and model.model.lora is not None
    assert model.model.lora_seed == config.trainer.seed
    assert model.split.global_rows == 16 and model.split.remove_padding
    assert model.host_offload == ("cpu_offload",) and not model.fused_loss
    assert run.mesh.devices == config.trainer.n_gpus_per_node
    # verl's SFT sampler (DistributedSampler) keeps its own seed, 0: trainer.seed seeds LoRA only
    assert data.tokenizer.key == "model.partial_pretrain" and data.seed == 0
    assert data.rows.prompt_dict_keys == ("question",) and not data.rows.multiturn.enable
    assert run.keys.fields["data.micro_batch_size"] == ("model",)
    assert run.keys.fields["data.prompt_key"] == ("data",)
    assert "data.micro_batch_size_per_gpu" in run.keys.fields and "data" not in run.keys.fields


def test_a_trainer_is_built_from_a_runspec_changed_in_python(tmp_path):
    """The Python API of the README: resolve, replace a typed field, train from the spec alone."""
    config, _ = load_config(
        [f"{GRPO}:tiny", f"trainer.default_local_dir={tmp_path}", "trainer.logger=[console]"]
    )
    run = resolve_run(config)
    assert run.cadence.total_training_steps == 3
    one_step = dataclasses.replace(run.cadence, total_training_steps=1, test_freq=-1)
    trainer = PPOTrainer(dataclasses.replace(run, cadence=one_step))
    assert trainer.cadence.total_steps == 1
    assert trainer.fit()["training/global_step"] == 1
