"""verl's own command lines run unchanged: every example command line of verl v0.6.0's PPO family
and SFT (`data/verl_v060_examples.json`, the argument vectors of its scripts) loads, or is refused
with the key of a feature jrl does not have named; the same for current verl's
(`data/verl_current_examples.json`); and each rule of Hydra's grammar and verl's value forms that
makes them load, one at a time.

`verl_current_examples.json`: each script under ``examples/`` of verl-project/verl at commit
1dda039b9 that calls ``verl.trainer.main_ppo`` (or ``main_ppo_sync``, the fully-async main,
``verl.trainer.sft_trainer``), run by bash with HOME at a placeholder folder, VERL_USE_UV=0 and
stand-ins for python3, torchrun, ray and uv on PATH that record the argument vector after the
module name."""

import json
import re
from pathlib import Path

import pytest

from jrl.config import ConfigError, default_config, read_config
from jrl.config.entry import load_entry_config
from jrl.config.overrides import command_line_keys
from jrl.config.trees import SFT
from jrl.config.values import parse_value
from jrl.runspec import load_config, validate_sft
from jrl.runspec.effects import no_effect_notice
from jrl.runspec.spec import resolve_run

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = json.loads((REPO / "tests" / "data" / "verl_v060_examples.json").read_text())
CURRENT_EXAMPLES = json.loads((REPO / "tests" / "data" / "verl_current_examples.json").read_text())
PPO_CARD = str(REPO / "configs" / "gsm8k_ppo.py")
SFT_CARD = str(REPO / "configs" / "gsm8k_sft.py")
AR = "actor_rollout_ref"
MEGATRON = f"{AR}.actor.megatron"
_NPU = "trainer.device"
_PIPELINE = f"{MEGATRON}.pipeline_model_parallel_size"
_MEGATRON_OPTIMIZER = f"{AR}.actor.optim.override_optimizer_config"
_EMPTY = "data.return_raw_chat"  # `data.return_raw_chat=$return_raw_chat` with the variable unset
# Script (under examples/) -> the key its refusal names: features jrl does not have, and command
# lines that verl's own Hydra refuses too (a `+` on a key that exists, a key verl lacks, a blank
# argument left by `\ # comment`).
REFUSED = {
    "gpg_trainer/run_qwen2-7b_math_megatron.sh": _PIPELINE,
    "grpo_trainer/run_deepseek671b_math_megatron_80gb.sh": _PIPELINE,
    "grpo_trainer/run_deepseek671b_math_megatron_96gb.sh": _MEGATRON_OPTIMIZER,
    "grpo_trainer/run_deepseek7b_llm_math_megatron.sh": _PIPELINE,
    "grpo_trainer/run_gptoss_20b.sh": f"+{AR}.actor.fsdp_config.model_dtype",
    "grpo_trainer/run_moonlight16b_math_megatron.sh": _PIPELINE,
    "grpo_trainer/run_qwen2-7b_math_megatron.sh": _EMPTY,
    "grpo_trainer/run_qwen2-7b_sgl_megatron.sh": _PIPELINE,
    "grpo_trainer/run_qwen2-7b_seq_balance_math_megatron.sh": _PIPELINE,
    "grpo_trainer/run_qwen2_5-7b_math_megatron_diff_tp.sh": _PIPELINE,
    "grpo_trainer/run_qwen2_5_32b_grpo_npu.sh": _NPU,
    "grpo_trainer/run_qwen2_5_7b_grpo_discrete_prof_npu.sh": _NPU,
    "grpo_trainer/run_qwen2_5_7b_grpo_e2e_prof_npu.sh": _NPU,
    "grpo_trainer/run_qwen2_5_7b_grpo_npu.sh": _NPU,
    "grpo_trainer/run_qwen2_5_vl_32b_npu.sh": _NPU,
    "grpo_trainer/run_qwen2_5_vl_3b_npu.sh": _NPU,
    "grpo_trainer/run_qwen2_5_vl_7b_npu.sh": _NPU,
    "grpo_trainer/run_qwen2_5_vl-7b-sglang.sh": "global_profiler.tool",
    "grpo_trainer/run_qwen3-235b_megatron_96gb.sh": _MEGATRON_OPTIMIZER,
    "grpo_trainer/run_qwen3-32b_npu.sh": _NPU,
    "grpo_trainer/run_qwen3-8b_npu.sh": _NPU,
    "grpo_trainer/run_qwen3_8b_grpo_sglang_1k_spmd_npu.sh": _NPU,
    "grpo_trainer/run_qwen3_8b_grpo_sglang_32k_spmd_npu.sh": _NPU,
    "grpo_trainer/run_qwen3_vl-30b-megatron.sh": _MEGATRON_OPTIMIZER,
    # Megatron's scheduler key: jrl's schedule is optim.lr_scheduler_type.
    "grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh": f"{AR}.actor.optim.lr_decay_style",
    "ppo_trainer/run_deepseek7b_llm_pfppo.sh": "' '",
    "ppo_trainer/run_deepseek7b_llm_sandbox_fusion.sh": "reward_model.sandbox_fusion.url",
    "ppo_trainer/run_deepseek_full_hh_rlhf.sh": "reward_model.param_offload",
    "ppo_trainer/run_deepseek_math_gsm8k_megatron.sh": _PIPELINE,
    "ppo_trainer/run_deepseek_math_gsm8k_megatron_nsys.sh": _PIPELINE,
    "ppo_trainer/run_moonlight16b_a3b_gsm8k_megatron.sh": _PIPELINE,
    "ppo_trainer/run_qwen1.5_moe_a2.7b-gsm8k_megatron.sh": _PIPELINE,
    "ppo_trainer/run_qwen2-7b_math_gsm8k_megatron.sh": _PIPELINE,
    "ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys.sh": f"{AR}.actor.profiler.enable",
    "ppo_trainer/run_qwen2-7b_seq_balance.sh": _EMPTY,
    "ppo_trainer/run_qwen3-8b_npu.sh": _NPU,
}

_PIPELINE_ACTOR = f"{MEGATRON}.pipeline_model_parallel_size"
_VEOMNI = "model_engine=veomni"
_DISTILLATION = "unknown key 'distillation'"
_OFFLOAD_FRACTION = f"{_MEGATRON_OPTIMIZER}.optimizer_offload_fraction"
_MTP = f"{AR}.model.mtp.enable_train"
# Current verl's scripts (under examples/) -> the key its refusal names: features jrl does not
# have (current verl's newer engines, estimators, losses and sections among them), and command
# lines that verl refuses too (noted).
REFUSED_CURRENT = {
    "ascend_extras/grpo_trainer/run_qwen3_235b_256k_megatron.sh": _NPU,
    "ascend_extras/grpo_trainer/run_qwen3_30b_a3b_megatron.sh": _NPU,
    "ascend_extras/grpo_trainer/run_qwen3_5_122b_a10b_32k_megatron.sh": (
        f"{_MEGATRON_OPTIMIZER}.overlap_cpu_optimizer_d2h_h2d"
    ),
    "ascend_extras/grpo_trainer/run_qwen3_next_80b_fsdp.sh": _NPU,
    "dppo_trainer/run_qwen3_30b_a3b_megatron.sh": f"{AR}.actor.policy_loss.loss_mode='dppo_tv'",
    "gdpo_trainer/run_qwen3_8b_fsdp.sh": "algorithm.adv_estimator='gdpo'",
    "gpg_trainer/run_qwen3_8b_megatron.sh": _PIPELINE_ACTOR,
    "grpo_trainer/run_deepseek_v3_671b_megatron.sh": _OFFLOAD_FRACTION,
    # `+` on a key that current verl's FSDP config has: its Hydra refuses it too.
    "grpo_trainer/run_gpt_oss_20b_fsdp.sh": f"+{AR}.actor.fsdp_config.model_dtype",
    # Megatron's optimizer keys (jrl's schedule is v0.6.0's FSDP optim section).
    "grpo_trainer/run_hy_v3_megatron.sh": f"{AR}.actor.optim.min_lr",
    "grpo_trainer/run_mistral_nemo_12b_skyworkrm_fsdp.sh": "reward_model.rollout.gpu_memory_util",
    "grpo_trainer/run_moonlight_16b_a3b_megatron.sh": _PIPELINE_ACTOR,
    "grpo_trainer/run_qwen2_5_vl_7b_megatron.sh": _PIPELINE_ACTOR,
    "grpo_trainer/run_qwen3_235b_a22b_megatron.sh": _PIPELINE_ACTOR,
    "grpo_trainer/run_qwen3_30b_a3b_megatron.sh": _PIPELINE_ACTOR,
    "grpo_trainer/run_qwen3_30b_veomni.sh": _VEOMNI,
    "grpo_trainer/run_qwen3_5-122b-a10b_veomni.sh": _VEOMNI,
    "grpo_trainer/run_qwen3_5_122b_a10b_megatron.sh": _OFFLOAD_FRACTION,
    "grpo_trainer/run_qwen3_5_27b_fsdp_turbo.sh": "current verl's FSDP turbo plans",
    "grpo_trainer/run_qwen3_5_35b_a3b_veomni.sh": _VEOMNI,
    "grpo_trainer/run_qwen3_5_35b_fsdp_turbo.sh": "current verl's FSDP turbo plans",
    "grpo_trainer/run_qwen3_5_35b_megatron.sh": _OFFLOAD_FRACTION,
    # A config group of a package outside verl (hydra.searchpath=[pkg://verl_mlite.config]).
    "grpo_trainer/run_qwen3_5_35b_megatron_lite.sh": "actor@actor_rollout_ref",
    "grpo_trainer/run_qwen3_5_397b_megatron.sh": _OFFLOAD_FRACTION,
    "grpo_trainer/run_qwen3_8b_megatron.sh": _PIPELINE_ACTOR,
    "grpo_trainer/run_qwen3_next_80b_a3b_fsdp.sh": f"{AR}.model.enable_activation_offload",
    "grpo_trainer/run_qwen3_vl_235b_a22b_megatron.sh": _OFFLOAD_FRACTION,
    "grpo_trainer/run_qwen3_vl_30b_a3b_megatron.sh": _OFFLOAD_FRACTION,
    "grpo_trainer/run_qwen3_vl_30b_moe_veomni.sh": _VEOMNI,
    "grpo_trainer/run_qwen3_vl_8b_megatron.sh": _PIPELINE_ACTOR,
    "mtp_trainer/run_mimo_7b_mtp_fully_async_megatron_multinode.sh": _MTP,
    "mtp_trainer/run_mimo_7b_mtp_megatron.sh": _MTP,
    "mtp_trainer/run_mimo_7b_mtp_rl_vllm_sgl_megatron.sh": _MTP,
    "on_policy_distillation_trainer/run_qwen3_0.6b_opd_veomni.sh": _VEOMNI,
    "on_policy_distillation_trainer/run_qwen3_5_4b_fsdp.sh": _DISTILLATION,
    "on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh": _DISTILLATION,
    "on_policy_distillation_trainer/run_qwen3_8b_megatron.sh": _DISTILLATION,
    "on_policy_distillation_trainer/run_qwen3_8b_mopd_fsdp.sh": _DISTILLATION,
    "on_policy_distillation_trainer/run_qwen3_8b_mopd_veomni.sh": _VEOMNI,
    "on_policy_distillation_trainer/run_qwen3_vl_8b_fsdp.sh": _DISTILLATION,
    "otb_trainer/run_qwen3_8b_fsdp.sh": "algorithm.adv_estimator='optimal_token_baseline'",
    "ppo_trainer/run_qwen3_8b_megatron.sh": _PIPELINE_ACTOR,
    "prefix_grouper/run_qwen3_8b_fsdp.sh": f"{AR}.actor.use_prefix_grouper",
    "profile/run_qwen2_5_7b_torch_profile.sh": f"{AR}.actor.profiler.tool_config.torch.discrete",
    "profile/run_qwen2_5_vl_7b_torch_memory.sh": "global_profiler.tool",
    "profile/run_qwen3_8b_npu_profile_discrete.sh": f"{AR}.actor.profiler.enable",
    "profile/run_qwen3_8b_npu_profile_e2e.sh": f"{AR}.actor.profiler.enable",
    # 32 prompts x 1 sample over 8 devices is 4 rows, below the micro-batch of 8: verl v0.6.0's
    # worker asserts that its micro-batch divides a device's share too.
    "rollout_correction/run_qwen2_5_7b_fsdp.sh": f"{AR}.actor.ppo_mini_batch_size",
    "rollout_correction/run_qwen2_5_7b_fsdp_multi_rs.sh": f"{AR}.actor.ppo_mini_batch_size",
    # A key current verl lacks too (its engine is model_engine=...).
    "router_replay/run_qwen3_30b_a3b_megatron.sh": f"{AR}.actor.model_engine",
    "router_replay/run_qwen3_5_35b_a3b_veomni.sh": _VEOMNI,
    # verl's engine-based SFT trainer (verl.trainer.sft_trainer, config sft_trainer_engine; v0.6.0
    # has it too): jrl.sft runs fsdp_sft_trainer, whose loss is the token mean over the whole batch
    # (the engine's is each micro-batch's) and whose schedule is cosine (the engine's constant).
    "sft/gsm8k/run_qwen3_5_397b_a17b_megatron.sh": "data.pad_mode",
    "sft/gsm8k/run_qwen_megatron_fsdp.sh": "data.messages_key",
    "sft/vlm/run_qwen3_vl_2b_fsdp.sh": "data.pad_mode",
    "tuning/lora/run_qwen3_30b_a3b_megatron.sh": "current verl's model.lora section",
    "tuning/lora/run_qwen3_8b_merge_fsdp.sh": "current verl's model.lora section",
    "tuning/scaling/run_qwen2_5_32b_megatron.sh": f"{AR}.actor.model_engine",
}


def _load(entry: str, argv: list[str]):
    """The checked config of one example, as `jrl.train` (ppo) or `jrl.sft` (sft) loads it."""
    if entry == "ppo":
        return load_config([f"--config={PPO_CARD}", *argv])[0]
    return load_entry_config([f"--config={SFT_CARD}", *argv], SFT, validate_sft)


def test_the_fixture_is_verls_ppo_family_and_sft_examples():
    entries = {item["entry"] for item in EXAMPLES}
    assert entries == {"ppo", "sft"} and len(EXAMPLES) == 92
    scripts = {item["script"].removeprefix("examples/") for item in EXAMPLES}
    assert set(REFUSED) <= scripts


def test_the_current_fixture_is_current_verls_examples():
    scripts = {item["script"].removeprefix("examples/") for item in CURRENT_EXAMPLES}
    assert len(CURRENT_EXAMPLES) == 87 and set(REFUSED_CURRENT) <= scripts
    assert len(scripts - set(REFUSED_CURRENT)) == 30  # these load


# (verl's version, an example, the refusals of that version's examples)
_VERSIONED = [("v0.6.0", item, REFUSED) for item in EXAMPLES] + [
    ("current", item, REFUSED_CURRENT) for item in CURRENT_EXAMPLES
]


@pytest.mark.parametrize(
    ("version", "item", "refused"), _VERSIONED, ids=[f"{v}:{i['script']}" for v, i, _ in _VERSIONED]
)
def test_each_example_loads_or_names_the_missing_feature(version, item, refused):
    script, entry, argv = item["script"].removeprefix("examples/"), item["entry"], item["argv"]
    if script in refused:
        with pytest.raises(ConfigError, match=re.escape(refused[script])):
            _load(entry, argv)
    else:  # rollout.name=sglang too: jrl's JAX sampler serves it
        _load(entry, argv)


# --- Hydra's --config-name and --config-path ----------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--config-path=config", "--config-name=ppo_megatron_trainer"],
        ["--config-path", "./config", "--config-name", "ppo_megatron_trainer.yaml"],
        ["-cn", "ppo_trainer"],
    ],
)
def test_config_name_selects_the_programs_tree(args):
    config = read_config([*args, "data.train_batch_size=8"])[0]
    assert config.data.train_batch_size == 8
    assert config.trainer.total_epochs == default_config().trainer.total_epochs
    sft = load_entry_config(["--config-name=sft_trainer", "trainer.n_gpus_per_node=1"], SFT, _ok)
    assert sft.data.micro_batch_size_per_gpu == 4


def _ok(config) -> None:
    """A check that passes every config."""


def test_with_a_card_the_card_is_the_base_and_the_name_is_checked():
    config = read_config(
        [f"--config={PPO_CARD}:tiny", "--config-name=ppo_megatron_trainer", "trainer.test_freq=3"]
    )[0]
    assert config.trainer.experiment_name == "ppo_tiny"  # the card's preset
    assert config.trainer.test_freq == 3
    with pytest.raises(ConfigError, match="--config-name=sft_trainer is verl's config of python "):
        read_config([f"--config={PPO_CARD}:tiny", "--config-name=sft_trainer"])
    with pytest.raises(ConfigError, match="python -m jrl.sft reads sft_trainer"):
        load_entry_config(["--config-name=ppo_trainer"], SFT, _ok)


def test_an_unknown_config_name_lists_the_names_jrl_knows():
    with pytest.raises(ConfigError) as error:
        read_config(["--config-path=config", "--config-name=spin_trainer"])
    message = str(error.value)
    assert message.startswith("unknown --config-name=spin_trainer")
    for name in ("ppo_trainer", "ppo_megatron_trainer", "sft_trainer", "--config=FILE.py"):
        assert name in message
    with pytest.raises(ConfigError, match="--config-name needs a value"):
        read_config(["--config-name"])


# --- +, ++ and ~ --------------------------------------------------------------------------------


def test_plus_adds_a_key_or_sets_a_null_one():
    sft = read_config(["+data.response_dict_keys=[answer]", "+data.prompt_dict_keys=[q]"], SFT)[0]
    assert (sft.data.response_dict_keys, sft.data.prompt_dict_keys) == (["answer"], ["q"])
    config = read_config([f"+{AR}.actor.optim.override_optimizer_config.foreach=false"])[0]
    assert config.actor_rollout_ref.actor.optim.override_optimizer_config.foreach is False
    # As in Hydra, a list or a dict may also go onto a key that exists.
    config = read_config(["+trainer.logger=[console]", f"+{AR}.rollout.val_kwargs={{n: 2}}"])[0]
    assert (
        config.trainer.logger == ["console"] and config.actor_rollout_ref.rollout.val_kwargs.n == 2
    )
    with pytest.raises(ConfigError, match=re.escape("it is 42); write data.seed=... or ++data.se")):
        read_config(["+data.seed=1"])


def test_plus_plus_sets_or_adds():
    config = read_config(["++data.seed=7", f"++{AR}.model.override_config.rope_scaling_factor=2"])[
        0
    ]
    assert config.data.seed == 7
    assert config.actor_rollout_ref.model.override_config.rope_scaling_factor == 2


def test_tilde_puts_a_key_back_to_its_default():
    argv = [f"--config={PPO_CARD}:tiny", "~trainer.total_epochs", "~trainer.experiment_name"]
    config = read_config(argv)[0]
    defaults = default_config()
    assert config.trainer.total_epochs == defaults.trainer.total_epochs
    assert config.trainer.experiment_name == defaults.trainer.experiment_name
    # A key that follows another by default follows it again; a null one is null again.
    config = read_config(
        [
            "critic.ppo_mini_batch_size=3",
            "trainer.total_training_steps=5",
            "~critic.ppo_mini_batch_size",
            "~trainer.total_training_steps",
            f"{AR}.actor.ppo_mini_batch_size=64",
        ]
    )[0]
    assert config.critic.ppo_mini_batch_size == 64
    assert config.trainer.total_training_steps is None
    # A section: each of its keys; a key added with + goes; ~key=value only while it holds value.
    config = read_config(
        [
            f"{AR}.rollout.val_kwargs.n=4",
            f"+{AR}.rollout.val_kwargs.extra=1",
            f"~{AR}.rollout.val_kwargs",
            "trainer.nnodes=2",
            "~trainer.nnodes=2",
        ]
    )[0]
    assert config.actor_rollout_ref.rollout.val_kwargs.n == 1
    assert "extra" not in config.actor_rollout_ref.rollout.val_kwargs
    assert config.trainer.nnodes == 1
    with pytest.raises(ConfigError, match=re.escape("cannot reset 'trainer.nnodes'")):
        read_config(["~trainer.nnodes=3"])
    assert command_line_keys(["~trainer.nnodes", "++data.seed=1"]) == {
        "trainer.nnodes",
        "data.seed",
    }


# --- verl's value forms -------------------------------------------------------------------------


def test_a_logger_given_as_one_name_is_a_one_logger_list():
    assert read_config(["trainer.logger=console"])[0].trainer.logger == ["console"]
    assert read_config(["trainer.logger=wandb"], SFT)[0].trainer.logger == ["wandb"]
    with pytest.raises(ConfigError, match=re.escape(f"{AR}.actor.optim.betas expects list")):
        read_config([f"{AR}.actor.optim.betas=0.9"])


def test_empty_values_and_blank_arguments_are_named():
    with pytest.raises(
        ConfigError, match=r"data\.return_raw_chat expects bool, got an empty value"
    ):
        read_config(["data.return_raw_chat="])
    with pytest.raises(ConfigError, match=r"cannot read argument ' ': it is blank"):
        read_config(["algorithm.gamma=1.0", " "])


# --- explicit beats default for the deprecated micro-batch sizes --------------------------------

_DEPRECATED = f"{AR}.actor.ppo_micro_batch_size"
_CARD = """
from jrl.config import load_config_file

def get_config():
    config = load_config_file({card!r})[0]
    {changes}
    return config
"""


def _card(tmp_path: Path, *changes: str) -> str:
    path = tmp_path / "card.py"
    path.write_text(_CARD.format(card=f"{PPO_CARD}", changes="\n    ".join(changes)))
    return str(path)


def test_a_deprecated_size_on_the_command_line_wins_over_the_default_and_the_card():
    # The defaults and the card hold ppo_micro_batch_size_per_gpu=8.
    config = read_config([f"{_DEPRECATED}=64", f"{AR}.ref.log_prob_micro_batch_size=32"])[0]
    assert config[_DEPRECATED] == 64 and config[f"{_DEPRECATED}_per_gpu"] is None
    assert config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu is None
    config = load_config(
        [f"--config={PPO_CARD}", f"{_DEPRECATED}=64", "critic.ppo_micro_batch_size=64"]
    )[0]
    assert config[f"{_DEPRECATED}_per_gpu"] is None
    assert config.critic.ppo_micro_batch_size_per_gpu is None
    assert config.critic.forward_micro_batch_size == 64  # follows critic.ppo_micro_batch_size
    # Both on the command line: the pair is reported.
    with pytest.raises(ConfigError, match="both are set"):
        load_config([f"--config={PPO_CARD}", f"{_DEPRECATED}=64", f"{_DEPRECATED}_per_gpu=4"])


def test_a_deprecated_size_in_the_card_wins_over_the_default(tmp_path):
    card = _card(tmp_path, "config.actor_rollout_ref.actor.ppo_micro_batch_size = 64")
    config = load_config([f"--config={card}"])[0]
    assert config[_DEPRECATED] == 64 and config[f"{_DEPRECATED}_per_gpu"] is None
    # The command line's per-device size wins over the card's deprecated one.
    config = load_config([f"--config={card}", f"{_DEPRECATED}_per_gpu=4"])[0]
    assert config[_DEPRECATED] is None and config[f"{_DEPRECATED}_per_gpu"] == 4
    both = _card(
        tmp_path,
        "config.actor_rollout_ref.actor.ppo_micro_batch_size = 64",
        "config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 4",
    )
    with pytest.raises(ConfigError, match="both are set"):
        load_config([f"--config={both}"])


# --- Megatron's sections ------------------------------------------------------------------------


def test_megatron_tensor_parallel_size_is_jrls_and_pipelines_are_refused():
    config = read_config(
        [f"{MEGATRON}.tensor_model_parallel_size=4", "critic.megatron.tensor_model_parallel_size=2"]
    )[0]
    assert config.actor_rollout_ref.actor.fsdp_config.tensor_parallel_size == 4
    assert config.critic.model.fsdp_config.tensor_parallel_size == 2
    assert config.actor_rollout_ref.ref.fsdp_config.tensor_parallel_size == 1  # verl's: its own
    for key, value in [
        ("pipeline_model_parallel_size", 2),
        ("virtual_pipeline_model_parallel_size", 2),
        ("context_parallel_size", 2),
    ]:
        with pytest.raises(ConfigError, match=re.escape(f"{MEGATRON}.{key}={value}: ")):
            load_config([f"--config={PPO_CARD}", f"{MEGATRON}.{key}={value}"])


def test_other_megatron_keys_are_announced():
    argv = [
        f"--config={PPO_CARD}",
        f"{MEGATRON}.param_offload=true",
        f"{MEGATRON}.use_dist_checkpointing=true",
        f"+{MEGATRON}.override_transformer_config.apply_rope_fusion=true",
        f"{MEGATRON}.sequence_parallel=false",
    ]
    config = load_config(argv)[0]
    notice = no_effect_notice(config, resolve_run(config).keys, "vllm", command_line_keys(argv))
    assert f"{MEGATRON}.param_offload=True" in notice and "fsdp_config.param_offload" in notice
    assert f"{MEGATRON}.use_dist_checkpointing=True" in notice
    assert f"{MEGATRON}.override_transformer_config.apply_rope_fusion=True" in notice
    assert f"{MEGATRON}.sequence_parallel=False" in notice


# --- current verl's spellings -------------------------------------------------------------------

# (current verl's key = value, the v0.6.0 key that takes it): current verl's
# `migrate_legacy_reward_impl` read backwards, its critic's engine section, Megatron's dtype.
CURRENT_SPELLINGS = [
    ("reward.num_workers=3", "reward_model.num_workers", 3),
    ("+reward.reward_kwargs.max_resp_len=8", "reward_model.reward_kwargs.max_resp_len", 8),
    ("reward.custom_reward_function.path=/s.py", "custom_reward_function.path", "/s.py"),
    ("reward.custom_reward_function.name=score", "custom_reward_function.name", "score"),
    ("reward.reward_manager.name=dapo", "reward_model.reward_manager", "dapo"),
    ("reward.reward_manager.source=importlib", "reward_model.reward_loop_source", "importlib"),
    ("reward.reward_manager.module.path=/m.py", "reward_model.reward_loop_module_path", "/m.py"),
    ("reward.reward_manager.module.name=Loop", "reward_model.reward_loop_class_name", "Loop"),
    ("reward.reward_model.enable=true", "reward_model.enable", True),
    ("reward.reward_model.n_gpus_per_node=2", "reward_model.n_gpus_per_node", 2),
    ("reward.reward_model.model_path=/rm", "reward_model.model.path", "/rm"),
    ("reward.reward_model.rollout.prompt_length=9", "reward_model.rollout.prompt_length", 9),
    ("reward.sandbox_fusion.max_concurrent=3", "reward_model.sandbox_fusion.max_concurrent", 3),
    ("critic.fsdp.param_offload=true", "critic.model.fsdp_config.param_offload", True),
    (f"{MEGATRON}.dtype=float32", f"{AR}.actor.fsdp_config.dtype", "float32"),
    ("critic.megatron.dtype=float32", "critic.model.fsdp_config.dtype", "float32"),
]


@pytest.mark.parametrize(("arg", "legacy", "value"), CURRENT_SPELLINGS)
def test_a_key_in_current_verls_spelling_sets_the_v060_key(arg, legacy, value, capsys):
    config = read_config([arg])[0]
    assert config[legacy] == value
    current = arg.partition("=")[0].lstrip("+")
    assert f"jrl: {current} is current verl's spelling of " in capsys.readouterr().out


def test_a_reward_key_without_a_v060_counterpart_is_named():
    with pytest.raises(ConfigError, match=re.escape("'reward.launch_async': current verl's rew")):
        read_config(["reward.launch_async=true"])


def test_model_engine_names_an_engine_whose_keys_jrl_reads():
    for engine in ("dp", "megatron"):
        config = read_config([f"model_engine={engine}", f"{MEGATRON}.tensor_model_parallel_size=2"])
        assert config[0].actor_rollout_ref.actor.fsdp_config.tensor_parallel_size == 2
    with pytest.raises(ConfigError, match="model_engine=veomni: the VeOmni engine"):
        read_config(["model_engine=veomni"])
    with pytest.raises(ConfigError, match="model_engine='fsdp' is not one of current verl's"):
        read_config(["model_engine=fsdp"])


def test_the_megatron_configs_of_the_async_recipes_are_their_fsdp_layers():
    for recipe in ("one_step_off_ppo", "fully_async_ppo"):
        fsdp = read_config([f"--config-name={recipe}_trainer"])[0]
        megatron = read_config([f"--config-name={recipe}_megatron_trainer"])[0]
        assert fsdp.to_dict() == megatron.to_dict()
        assert fsdp.actor_rollout_ref.hybrid_engine is False


@pytest.mark.parametrize(
    ("arg", "feature"),
    [
        ("distillation.enabled=true", "on-policy distillation"),
        (f"+{AR}.model.lora.merge=true", "model.lora section"),
        (f"{AR}.model.mtp.enable_train=true", "multi-token prediction"),
        ("critic.fsdp.qat.enable=true", "quantization-aware training"),
        (f"{AR}.rollout.disaggregation.enabled=true", "prefill/decode disaggregation"),
        ("global_profiler.finish_hook_cmd=x", "profilers"),
        ("data.pad_mode=no_padding", "engine-based SFT trainer"),
    ],
)
def test_a_key_of_a_current_verl_feature_jrl_lacks_names_the_feature(arg, feature):
    with pytest.raises(ConfigError, match=f"configures current verl's {re.escape(feature)}"):
        read_config([arg])


def test_a_backslash_escapes_hydras_special_characters_in_bare_text():
    assert parse_value(r"a\,b\=c\ d\:e") == "a,b=c d:e"
    assert parse_value(r"{blocks.\{*\}:{}, head:[x\]y]}") == {"blocks.{*}": {}, "head": ["x]y"]}
    assert parse_value(r"C:\data\x.py") == r"C:\data\x.py"  # no escape: the backslash stays
    assert parse_value(r"a\\b") == "a\\b"
