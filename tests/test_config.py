"""Configuration: documented keys and defaults, interpolation, overrides, validation, loading."""

import re
from pathlib import Path

import pytest
import yaml
from helpers import flatten

from jrl.config import (
    ConfigError,
    apply_overrides,
    default_config,
    load_config_file,
    parse_command_line,
    resolve,
    to_yaml,
)
from jrl.config.tree import key_paths, lookup
from jrl.config.values import parse_value
from jrl.runspec import apply_preset, load_config, uses_critic, uses_reference, validate

REPO = Path(__file__).parents[1]
PPO = str(REPO / "configs" / "gsm8k_ppo.py")
GRPO = str(REPO / "configs" / "gsm8k_grpo.py")
DOCUMENT = Path(__file__).parents[2] / "shared" / "reference" / "000_6f542af57068b9ca.txt"
AR = "actor_rollout_ref"


# --- the document's PPO part: every key with its documented default --------------------------

_BLOCK = re.compile(
    r"(data|actor_rollout_ref|custom_cls|reward_model|custom_reward_function|algorithm|trainer):\s*"
)


def _document_defaults() -> dict:
    """Leaf path -> value of every YAML block of the PPO part (before the evaluation config)."""
    lines = DOCUMENT.read_text(encoding="utf-8").split("评估配置")[0].splitlines()
    flat, start = {}, 0
    while start < len(lines):
        if not _BLOCK.fullmatch(lines[start]):
            start += 1
            continue
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace()):
            end += 1
        block = yaml.safe_load("\n".join(lines[start:end]))
        flat.update(flatten({"data": block} if "custom_cls" in block else block))
        start = end
    return flat


def _documented(value, doc: dict):
    """A document value as a Hydra user gets it: `1e-6` is a float, `${a.b}` is a.b's value."""
    if not isinstance(value, str):
        return value
    if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value):
        return float(value)
    whole = re.fullmatch(r"\$\{([^}]+)\}", value)
    if whole:
        return _documented(doc[whole.group(1)], doc)
    return re.sub(r"\$\{([^}]+)\}", lambda m: str(_documented(doc[m.group(1)], doc)), value)


@pytest.mark.skipif(not DOCUMENT.exists(), reason=f"configuration document absent: {DOCUMENT}")
def test_ppo_config_has_every_documented_key_and_default():
    doc = _document_defaults()
    assert len(doc) >= 140, "document extraction found too few keys"
    config = resolve(load_config_file(PPO)[0])
    wrong = []
    for path, raw in doc.items():
        expected = _documented(raw, doc)
        try:
            parent, key = lookup(config, path)
        except ConfigError:
            wrong.append(f"{path}: missing")
            continue
        value = parent[key]
        value = value.to_dict() if hasattr(value, "to_dict") else value
        if value != expected or isinstance(value, bool) != isinstance(expected, bool):
            wrong.append(f"{path}: {value!r} != documented {expected!r}")
    assert not wrong, "\n".join(wrong)


def test_every_null_default_is_typed_and_interpolations_are_linked():
    config = default_config()
    for path in key_paths(config):
        parent, key = lookup(config, path)
        assert not (parent[key] is None and parent.get_type(key) is type(None)), path
        assert "${" not in str(parent[key]), path


# --- interpolation ---------------------------------------------------------------------------


def test_overriding_a_source_moves_every_dependent():
    config = apply_overrides(
        default_config(),
        [
            ("data.max_prompt_length", 64),
            (f"{AR}.actor.ppo_max_token_len_per_gpu", 1000),
            ("critic.ppo_max_token_len_per_gpu", 7),
            (f"{AR}.actor.checkpoint.save_contents", ["model"]),
            ("trainer.experiment_name", "run1"),
            (f"{AR}.model.path", "/m"),
            (f"{AR}.actor.use_dynamic_bsz", True),
            (f"{AR}.rollout.n", 3),
        ],
    )
    assert config.actor_rollout_ref.rollout.prompt_length == 64
    assert config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 1000
    assert config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 1000
    assert config.critic.forward_max_token_len_per_gpu == 7
    assert config.actor_rollout_ref.actor.checkpoint.load_contents == ["model"]
    assert config.critic.checkpoint.load_contents == ["model", "optimizer", "extra"]
    assert config.trainer.default_local_dir == "checkpoints/verl_examples/run1"
    assert config.critic.model.path == config.reward_model.model.input_tokenizer == "/m"
    assert config.reward_model.use_dynamic_bsz is True  # via critic.use_dynamic_bsz
    assert config.actor_rollout_ref.actor.rollout_n == config.critic.rollout_n == 3


@pytest.mark.parametrize("by_attribute", [False, True])
def test_overriding_a_dependent_changes_only_that_key(by_attribute):
    config = default_config()
    if by_attribute:
        config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu = 5
    else:
        apply_overrides(config, [(f"{AR}.ref.log_prob_max_token_len_per_gpu", 5)])
    assert config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 16384
    apply_overrides(config, [(f"{AR}.actor.ppo_max_token_len_per_gpu", 99)])
    assert config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 5
    assert config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 99


def test_interpolations_on_the_command_line():
    config = apply_overrides(
        default_config(),
        [
            (f"{AR}.rollout.response_length", "${.prompt_length}"),
            ("trainer.experiment_name", "run_${data.seed}"),
            ("data.max_prompt_length", 77),
        ],
    )
    assert config.actor_rollout_ref.rollout.response_length == 77
    assert config.trainer.default_local_dir == "checkpoints/verl_examples/run_42"
    with pytest.raises(ConfigError, match="cycle"):
        apply_overrides(config, [("data.max_prompt_length", f"${{{AR}.rollout.prompt_length}}")])
    with pytest.raises(ConfigError, match="ppo_epochs expects int; "):
        apply_overrides(config, [(f"{AR}.actor.ppo_epochs", "${trainer.project_name}")])
    # a key of several types (one file or a list) followed by another, which follows its changes
    files = ["a.parquet", "b.parquet"]
    apply_overrides(
        config, [("data.val_files", "${data.train_files}"), ("data.train_files", files)]
    )
    assert resolve(config).data.val_files == files


def test_resolve_gives_plain_values_and_evaluates_templates_set_in_python():
    config = default_config()
    config.trainer.experiment_name = "${data.prompt_key}"
    resolved = resolve(config)
    assert resolved.trainer.default_local_dir == "checkpoints/verl_examples/prompt"
    resolved.data.max_prompt_length = 1
    assert resolved.actor_rollout_ref.rollout.prompt_length == 512
    with pytest.raises(ConfigError, match="data_loader_seed expects int"):
        apply_overrides(resolved, [(f"{AR}.actor.data_loader_seed", "abc")])


# --- command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", 1),
        ("-3", -3),
        ("1e-6", 1e-6),
        ("0.5", 0.5),
        (".5", 0.5),
        ("true", True),
        ("False", False),
        ("null", None),
        ("'abc'", "abc"),
        ('"1"', "1"),
        ("abc", "abc"),
        ("007", "007"),
        ("", ""),
        ("['console','tensorboard']", ["console", "tensorboard"]),
        ("[console, wandb]", ["console", "wandb"]),
        ("[]", []),
        ("{a:1, b:[x, 2.0], c: {d: null}}", {"a": 1, "b": ["x", 2.0], "c": {"d": None}}),
        ("${a.b}", "${a.b}"),
        # backslashes escape only where they run into the quote
        (r"'it\'s'", "it's"),
        (r"'a\\'", "a\\"),
        (r"'.*\.py'", r".*\.py"),
        (r"['a\b', 'c']", [r"a\b", "c"]),
    ],
)
def test_values_are_read_as_hydra_reads_them(text, value):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("text", ["[a, b", "{a}", "'abc", "[a] b"])
def test_malformed_values_fail(text):
    with pytest.raises(ConfigError, match="cannot read value"):
        parse_value(text)


def test_parse_command_line_forms(capsys):
    spec, overrides, name = parse_command_line(
        [
            "--config",
            "configs/gsm8k_ppo.py:tiny",
            "--config.trainer.total_epochs=3",
            "--config.data.seed",
            "7",
            "trainer.logger=[console]",
            "+actor_rollout_ref.model.override_config.attention_dropout=0.1",
        ]
    )
    assert (spec, name) == ("configs/gsm8k_ppo.py:tiny", None)
    assert overrides == [
        ("trainer.total_epochs", 3),
        ("data.seed", 7),
        ("trainer.logger", ["console"]),
        ("+actor_rollout_ref.model.override_config.attention_dropout", 0.1),
    ]
    assert parse_command_line(["--config=a.py"]) == ("a.py", [], None)
    hydra = ["hydra.run.dir=/tmp/x", "+hydra/job_logging=disabled", "--config-path=my/yaml"]
    assert parse_command_line(["--config=a.py", *hydra, "data.seed=1"]) == (
        "a.py",
        [("data.seed", 1)],
        None,
    )
    printed = capsys.readouterr().out
    assert "jrl: hydra.run.dir=/tmp/x is ignored: it sets Hydra's own" in printed
    assert "+hydra/job_logging=disabled is ignored" in printed
    assert "jrl: --config-path=my/yaml is not read" in printed
    for bad in (["trainer"], ["--help"], ["a..b=1"], ["--config"]):
        with pytest.raises(ConfigError):
            parse_command_line(bad)


def test_unknown_key_names_the_nearest_keys():
    with pytest.raises(ConfigError) as error:
        apply_overrides(default_config(), [("data.train_batch_sise", 8)])
    assert str(error.value) == (
        "unknown key 'data.train_batch_sise'; did you mean data.train_batch_size?"
    )
    with pytest.raises(ConfigError, match=r"did you mean actor_rollout_ref\.rollout\.temperature"):
        apply_overrides(default_config(), [(f"{AR}.actor.temperature", 0.5)])


def test_wrong_types_fail_and_safe_conversions_apply():
    config = default_config()
    for key, value in [
        (f"{AR}.actor.ppo_epochs", "abc"),
        (f"{AR}.actor.ppo_epochs", 1.5),
        (f"{AR}.actor.ppo_epochs", True),
        (f"{AR}.actor.use_kl_loss", 1),
        (f"{AR}.actor.optim.betas", "abc"),
        (f"{AR}.actor.ppo_micro_batch_size", "abc"),
    ]:
        with pytest.raises(ConfigError, match=f"{re.escape(key)} expects"):
            apply_overrides(config, [(key, value)])
    with pytest.raises(ConfigError, match="ppo_epochs expects int, got 'abc'"):
        apply_overrides(config, [(f"{AR}.actor.ppo_epochs", "abc")])
    apply_overrides(
        config,
        [
            (f"{AR}.actor.optim.lr", 1),
            ("trainer.experiment_name", 2024),
            ("data.train_files", ["a.parquet", "b.parquet"]),
            ("data.val_files", "c.parquet"),
            (f"{AR}.actor.ppo_micro_batch_size", 4),
            ("trainer.total_epochs", None),
        ],
    )
    assert config.actor_rollout_ref.actor.optim.lr == 1.0
    assert isinstance(config.actor_rollout_ref.actor.optim.lr, float)
    assert config.trainer.experiment_name == "2024"
    assert config.data.train_files == ["a.parquet", "b.parquet"]
    assert config.actor_rollout_ref.actor.ppo_micro_batch_size == 4
    assert config.trainer.total_epochs is None
    with pytest.raises(ConfigError, match="total_epochs expects int"):
        apply_overrides(config, [("trainer.total_epochs", "abc")])


def test_sections_new_keys_and_plus_prefix():
    config = default_config()
    with pytest.raises(ConfigError, match="'data' is a section"):
        apply_overrides(config, [("data", 5)])
    apply_overrides(config, [(f"{AR}.rollout.val_kwargs", {"temperature": 0.5, "n": 2})])
    assert config.actor_rollout_ref.rollout.val_kwargs.n == 2
    key = f"{AR}.model.override_config.attention_dropout"
    with pytest.raises(ConfigError, match=re.escape(f"write +{key}=")):
        apply_overrides(config, [(key, 0.1)])
    apply_overrides(
        config,
        [(f"+{key}", 0.1), (f"++{AR}.rollout.engine_kwargs.vllm", {"swap_space": 4})],
    )
    assert config.actor_rollout_ref.model.override_config.attention_dropout == 0.1
    assert config.actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space == 4
    with pytest.raises(ConfigError, match="exists already"):
        apply_overrides(config, [("+data.seed", 1)])
    # verl's FSDP override_config is {}: its command lines add what jrl's defaults hold
    added = [(f"+{AR}.model.override_config.attn_implementation", "eager")]
    added.append((f"+{AR}.model.override_config.moe_config.freeze_moe_router", True))
    apply_overrides(config, added)
    override = config.actor_rollout_ref.model.override_config
    assert (override.attn_implementation, override.moe_config.freeze_moe_router) == ("eager", True)


# --- validation ------------------------------------------------------------------------------


def _tiny(path: str, *overrides: str, num_devices: int | None = None):
    return load_config([f"--config={path}:tiny", *overrides], num_devices=num_devices)[0]


def test_batch_rules_count_data_parallel_ranks_as_verl():
    """Token budgets are per device times the sequence-parallel size, deprecated global
    micro-batch sizes split over the data-parallel ranks (not every device), a mini-batch must
    split evenly over those ranks, and the deprecated global micro size must divide the
    un-normalised mini-batch size."""
    two = ["trainer.n_gpus_per_node=2", "data.train_batch_size=4"]
    sp = [f"{AR}.actor.ulysses_sequence_parallel_size=2", f"{AR}.model.use_remove_padding=true"]
    dynamic = [*two, *sp, f"{AR}.actor.use_dynamic_bsz=true"]
    budget = f"{AR}.actor.ppo_max_token_len_per_gpu"
    _tiny(GRPO, *dynamic, f"{budget}=80", num_devices=2)  # 80 x 2 >= 144
    with pytest.raises(ConfigError, match=re.escape(f"{budget}=70 times {AR}.actor.ulysses")):
        _tiny(GRPO, *dynamic, f"{budget}=70", num_devices=2)
    deprecated = [
        f"{AR}.actor.ppo_micro_batch_size=2",
        f"{AR}.actor.ppo_micro_batch_size_per_gpu=null",
    ]
    _tiny(GRPO, "trainer.n_gpus_per_node=4", *sp, *deprecated, num_devices=4)  # 2 ranks, 1 row
    uneven = ["data.train_batch_size=12", f"{AR}.actor.ppo_mini_batch_size=3"]
    with pytest.raises(
        ConfigError, match="3\\*2 rows do not split evenly over the 4 data-parallel"
    ):
        _tiny(GRPO, "trainer.n_gpus_per_node=4", *uneven, num_devices=4)
    micro = [f"{AR}.actor.ppo_micro_batch_size=6", f"{AR}.actor.ppo_micro_batch_size_per_gpu=null"]
    with pytest.raises(ConfigError, match=re.escape("ppo_mini_batch_size (4) must be divisible")):
        _tiny(GRPO, f"{AR}.rollout.n=3", *micro)


@pytest.mark.parametrize(
    "path, overrides, message",
    [
        (PPO, ["trainer.n_gpus_per_node=2"], "2 devices, but only 1 are visible"),
        (PPO, ["trainer.n_gpus_per_node=0"], "must be positive"),
        (PPO, ["trainer.n_gpus_per_node=8", "trainer.nnodes=1"], "= 4 must be divisible by"),
        (
            PPO,
            [f"{AR}.actor.ppo_micro_batch_size=4", f"{AR}.actor.ppo_micro_batch_size_per_gpu=2"],
            f"{AR}.actor.ppo_micro_batch_size (deprecated); both are set",
        ),
        (PPO, [f"{AR}.actor.ppo_micro_batch_size_per_gpu=null"], "neither is set"),
        (PPO, [f"{AR}.actor.ppo_mini_batch_size=8"], f"must be >= {AR}.actor.ppo_mini_batch_size"),
        (
            PPO,
            ["data.train_batch_size=6", f"{AR}.actor.ppo_mini_batch_size=4"],
            "so that all mini-batches have the same size",
        ),
        (
            PPO,
            [
                "trainer.n_gpus_per_node=8",
                "data.train_batch_size=8",
                f"{AR}.actor.ppo_mini_batch_size=4",
            ],
            "= 4*1//8 is 0",
        ),
        (
            PPO,
            [f"{AR}.actor.ppo_micro_batch_size_per_gpu=3"],
            f"= 4 must be a positive multiple of {AR}.actor.ppo_micro_batch_size_per_gpu (3)",
        ),
        (
            PPO,
            [f"{AR}.actor.ppo_micro_batch_size_per_gpu=null", f"{AR}.actor.ppo_micro_batch_size=3"],
            "ppo_micro_batch_size // 1 ranks (3)",
        ),
        (PPO, [f"{AR}.actor.ulysses_sequence_parallel_size=2"], "(2) must divide"),
        (
            GRPO,
            [
                f"{AR}.ref.log_prob_micro_batch_size=4",
                f"{AR}.ref.log_prob_micro_batch_size_per_gpu=2",
            ],
            f"{AR}.ref.log_prob_micro_batch_size",
        ),
        (PPO, [f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=null"], "rollout.log_prob"),
        (PPO, ["critic.ppo_micro_batch_size_per_gpu=null"], "critic.ppo_micro_batch_size_per_gpu"),
        (
            GRPO,
            ["critic.enable=true", "critic.ppo_micro_batch_size_per_gpu=3"],
            "= 8 must be a positive multiple of critic.ppo_micro_batch_size_per_gpu (3)",
        ),
        (
            PPO,
            [
                "reward_model.enable=true",
                "reward_model.micro_batch_size=4",
                "reward_model.micro_batch_size_per_gpu=2",
            ],
            "reward_model.micro_batch_size (deprecated); both are set",
        ),
        (
            PPO,
            [f"{AR}.rollout.val_kwargs.do_sample=true", f"{AR}.rollout.temperature=0"],
            "temperature > 0",
        ),
        (PPO, [f"{AR}.actor.loss_agg_mode=mean"], "use one of token-mean, seq-mean-token-sum"),
        (PPO, ["algorithm.adv_estimator=ppo"], "algorithm.adv_estimator='ppo' is not supported"),
        (
            PPO,
            [f"{AR}.rollout.name=trtllm"],
            "rollout.name='trtllm' is not supported; use one of jax, vllm, sglang, hf",
        ),
        (PPO, ["data.truncation=both"], "data.truncation='both'"),
        (PPO, ["trainer.resume_mode=latest"], "trainer.resume_mode='latest'"),
        (PPO, ["trainer.use_legacy_worker_impl=yes"], "trainer.use_legacy_worker_impl='yes'"),
        (PPO, [f"{AR}.actor.fsdp_config.tensor_parallel_size=2"], "(2) must divide"),
        (PPO, [f"{AR}.model.lora_adapter_path=/a"], "lora_adapter_path='/a': loading a saved"),
        (PPO, ["critic.model.lora_rank=4"], "critic.model.lora_rank=4: LoRA on the critic is not"),
        (
            PPO,
            [f"{AR}.actor.optim.lr_scheduler_type=linear"],
            f"{AR}.actor.optim.lr_scheduler_type='linear' is not supported",
        ),
        (PPO, ["critic.optim.warmup_style=wsd"], "critic.optim.warmup_style='wsd'"),
        (
            PPO,
            [f"{AR}.model.enable_activation_offload=true"],
            f"{AR}.model.enable_activation_offload=True needs {AR}.model.enable_gradient",
        ),
        (
            GRPO,
            [f"{AR}.model.lora_rank=4", f"{AR}.ref.ulysses_sequence_parallel_size=2"],
            "the reference shares the actor's weights and mesh",
        ),
        (
            GRPO,
            [f"{AR}.model.lora_rank=4", f"{AR}.model.lora_alpha=-1"],
            f"{AR}.model: lora_alpha must be positive, got -1.0",
        ),
    ],
)
def test_each_validation_rule_names_its_keys(path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _tiny(path, *overrides, num_devices=1)


def test_rules_apply_only_to_roles_in_use():
    ppo = _tiny(PPO, f"{AR}.ref.log_prob_micro_batch_size=4")
    assert not uses_reference(ppo) and uses_critic(ppo)
    grpo = _tiny(GRPO, "critic.ppo_micro_batch_size_per_gpu=null")
    assert uses_reference(grpo) and not uses_critic(grpo)
    dynamic = _tiny(
        PPO, f"{AR}.actor.use_dynamic_bsz=true", f"{AR}.actor.ppo_micro_batch_size_per_gpu=null"
    )
    validate(dynamic, num_devices=1)


def test_validation_lists_every_problem():
    with pytest.raises(ConfigError) as error:
        _tiny(PPO, "data.truncation=both", "trainer.resume_mode=latest")
    assert "data.truncation" in str(error.value) and "trainer.resume_mode" in str(error.value)


# --- loading ---------------------------------------------------------------------------------


def test_load_config_on_both_experiments():
    ppo, module = load_config([f"--config={PPO}", "trainer.total_epochs=2"])
    assert callable(module.get_config)
    assert ppo.algorithm.adv_estimator == "gae" and uses_critic(ppo) and not uses_reference(ppo)
    assert ppo.critic.model.path == ppo.actor_rollout_ref.model.path
    assert ppo.trainer.total_epochs == 2
    grpo, _ = load_config([f"--config={GRPO}"])
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.actor_rollout_ref.rollout.n == 5
    assert grpo.actor_rollout_ref.actor.use_kl_loss and not uses_critic(grpo)


@pytest.mark.parametrize(
    "card",
    [
        "digits_ppo.py",
        "digits_grpo.py",
        "gsm8k_ppo.py:tiny",
        "gsm8k_grpo.py:quickstart",
        "word_problems_ppo.py",
        "word_problems_grpo.py",
        "word_problems_grpo.py:quickstart",
    ],
)
def test_every_training_card_loads_and_validates(card):
    config, _ = load_config([f"--config={Path(PPO).parent / card}"])  # load_config validates
    assert config.trainer.device == "cpu" and config.actor_rollout_ref.rollout.name == "jax"
    if card.startswith("word_problems"):
        assert config.data.train_files.endswith("word_problems/data/train.parquet")
        assert config.actor_rollout_ref.model.use_remove_padding


@pytest.mark.parametrize("path, algo, n", [(PPO, "ppo", 1), (GRPO, "grpo", 2)])
def test_tiny_preset(path, algo, n):
    config = _tiny(path, num_devices=1)
    assert config.trainer.experiment_name == f"{algo}_tiny"
    assert config.trainer.default_local_dir == f"checkpoints/jrl/{algo}_tiny"
    assert config.actor_rollout_ref.rollout.n == n
    assert config.actor_rollout_ref.rollout.name == "jax"
    assert config.critic.forward_micro_batch_size_per_gpu == 4
    assert config.actor_rollout_ref.rollout.prompt_length == 128
    assert config.data.train_files.endswith("train.parquet")


def test_preset_and_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="valid presets: tiny, quickstart"):
        apply_preset(default_config(), "huge")
    with pytest.raises(ConfigError, match="not found"):
        load_config_file(str(tmp_path / "missing.py"))
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no get_config"):
        load_config_file(str(empty))


def test_to_yaml_round_trips_in_config_order():
    config = _tiny(GRPO)
    text = to_yaml(config)
    assert text.startswith("data:")
    assert yaml.safe_load(text) == resolve(config).to_dict()


# --- enumerated values: each checked at load time, naming the key and the valid values -------


def _valid(values) -> str:
    return ", ".join(values)


def _enumerated_cases() -> list:
    from jrl.algos.kl import KL_CONTROLLERS, KL_ESTIMATORS
    from jrl.models.dtypes import DTYPES
    from jrl.optim.settings import LR_SCHEDULER_TYPES, RL_OPTIMIZERS
    from jrl.parallel.devices import BACKENDS
    from jrl.reward.settings import REWARD_MANAGERS, SOURCES

    kl_in_reward = "algorithm.use_kl_in_reward=true"
    estimators = f"use one of {_valid(KL_ESTIMATORS)} (each optionally with a '+' suffix)"
    return [
        (
            PPO,
            ["critic.optim.lr_scheduler_type=linear"],
            f"critic.optim.lr_scheduler_type='linear' is not supported; use one of "
            f"{_valid(LR_SCHEDULER_TYPES)}",
        ),
        (
            PPO,
            [f"{AR}.actor.optim.warmup_style=wsd"],
            f"{AR}.actor.optim.warmup_style='wsd' is not supported; use one of "
            f"{_valid(LR_SCHEDULER_TYPES)}",
        ),
        (
            PPO,
            ["critic.optim.optimizer=SGD"],
            f"critic.optim.optimizer='SGD' is not supported; use one of {_valid(RL_OPTIMIZERS)}",
        ),
        (
            GRPO,
            [f"{AR}.actor.kl_loss_type=full"],
            f"{AR}.actor.kl_loss_type='full' needs the full distributions over the vocabulary, "
            f"which jrl does not keep (it keeps the sampled tokens' log-probs); {estimators}",
        ),
        (
            GRPO,
            [f"{AR}.actor.kl_loss_type=k4"],
            f"{AR}.actor.kl_loss_type='k4' is not supported; {estimators}",
        ),
        (
            PPO,
            [kl_in_reward, "algorithm.kl_penalty=full+"],
            "algorithm.kl_penalty='full+' needs the full distributions over the vocabulary, "
            f"which jrl does not keep (it keeps the sampled tokens' log-probs); {estimators}",
        ),
        (
            PPO,
            [kl_in_reward, "algorithm.kl_penalty=k5"],
            f"algorithm.kl_penalty='k5' is not supported; {estimators}",
        ),
        (
            PPO,
            [kl_in_reward, "algorithm.kl_ctrl.type=linear"],
            f"algorithm.kl_ctrl.type='linear' is not supported; use one of "
            f"{_valid(KL_CONTROLLERS)}",
        ),
        (
            PPO,
            ["reward_model.reward_manager=nave"],
            f"reward_model.reward_manager='nave' is not supported; use one of "
            f"{_valid(REWARD_MANAGERS)}",
        ),
        (
            PPO,
            ["reward_manager.source=hub"],
            f"reward_manager.source='hub' is not supported; use one of {_valid(SOURCES)}",
        ),
        (
            PPO,
            [f"{AR}.rollout.dtype=float16"],
            f"{AR}.rollout.dtype='float16' is not supported; use one of {_valid(DTYPES)}",
        ),
        (
            PPO,
            ["critic.model.fsdp_config.model_dtype=fp8"],
            f"critic.model.fsdp_config.model_dtype='fp8' is not supported; use one of "
            f"{_valid(DTYPES)}",
        ),
        (
            PPO,
            ["trainer.device=npu"],
            f"trainer.device='npu' is not supported; use one of {_valid(BACKENDS)}",
        ),
    ]


@pytest.mark.parametrize("path, overrides, message", _enumerated_cases())
def test_enumerated_values_fail_at_load_naming_key_and_valid_values(path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _tiny(path, *overrides, num_devices=1)


@pytest.mark.parametrize(
    "path, overrides, message",
    [
        (
            GRPO,
            [f"{AR}.actor.loss_scale_factor=0"],
            f"{AR}.actor.loss_scale_factor=0.0 must be positive, or null",
        ),
        (
            PPO,
            ["critic.optim.betas=[0.9,0.999,0.9]"],
            "critic.optim.betas=[0.9, 0.999, 0.9] must be two decay rates in [0, 1)",
        ),
        (GRPO, [f"{AR}.actor.optim.betas=[0.9,1.0]"], "must be two decay rates in [0, 1)"),
        (
            GRPO,
            [f"{AR}.actor.optim.lr_scheduler_type=cosine", f"{AR}.actor.optim.min_lr_ratio=1.5"],
            f"{AR}.actor.optim.min_lr_ratio=1.5 must be in [0, 1] for a cosine schedule",
        ),
        (
            GRPO,
            [f"{AR}.rollout.top_k=-2"],
            f"invalid sampling settings under {AR}.rollout: SamplingParams.top_k=-2",
        ),
        (
            GRPO,
            [f"{AR}.rollout.val_kwargs.top_p=0"],
            f"invalid sampling settings under {AR}.rollout.val_kwargs: SamplingParams.top_p=0.0",
        ),
        (
            GRPO,
            ["algorithm.adv_estimator=gae"],
            "algorithm.adv_estimator='gae' needs the critic's values, but critic.enable=False",
        ),
        (
            GRPO,
            [f"{AR}.actor.policy_loss.loss_mode=bypass_mode"],
            f"{AR}.actor.policy_loss.loss_mode='bypass_mode' is the loss of "
            "algorithm.rollout_correction.bypass_mode=True",
        ),
        (
            GRPO,
            ["reward_manager.source=importlib"],
            "reward_manager.source=importlib loads the manager from reward_manager.module.path, "
            "which is not set",
        ),
        (GRPO, ["data.custom_cls.path=x.py"], "data.custom_cls.name is not set"),
        (GRPO, ["data.custom_cls.name=MyData"], "data.custom_cls.path is not set"),
        (
            GRPO,
            [f"{AR}.model.override_config.attn_implementation=flash"],
            f"{AR}.model.override_config.attn_implementation='flash' is not supported; use one "
            "of eager, sdpa, flash_attention_2",
        ),
        (
            GRPO,
            [
                f"{AR}.ref.log_prob_micro_batch_size=0",
                f"{AR}.ref.log_prob_micro_batch_size_per_gpu=null",
            ],
            f"{AR}.ref.log_prob_micro_batch_size=0 gives fewer than one row per data-parallel rank",
        ),
    ],
    ids=[
        *(
            "loss_scale_factor",
            "three-betas",
            "beta-1",
            "cosine-floor",
            "top_k",
            "val-top_p",
            "gae",
            "bypass",
        ),
        *("importlib-manager", "dataset-name", "dataset-path", "attention", "micro-0"),
    ],
)
def test_values_a_run_would_refuse_mid_step_fail_at_load(path, overrides, message):
    """Each of these passed the load and failed inside the run (the per-key behaviour sweep
    found them): a loss, an optimizer, a sampler, a reward manager or a dataset built after the
    config was accepted."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        _tiny(path, *overrides, num_devices=1)


def test_kl_types_are_checked_only_where_used():
    config = _tiny(PPO, "algorithm.kl_penalty=full", f"{AR}.actor.kl_loss_type=full")
    assert not config.algorithm.use_kl_in_reward and not config.actor_rollout_ref.actor.use_kl_loss
    custom = ["reward_manager.source=importlib", "reward_manager.module.path=manager.py"]
    _tiny(PPO, *custom, "reward_model.reward_manager=mine")


@pytest.mark.parametrize(
    "key, instead",
    [
        ("lr_decay_style=cosine", "set optim.lr_scheduler_type (constant or cosine) instead"),
        ("min_lr=0.0", "set optim.min_lr_ratio (a fraction of optim.lr) instead"),
        ("lr_decay_steps=10", "the schedule spans optim.total_training_steps"),
    ],
)
def test_megatron_scheduler_keys_name_the_key_to_use(key, instead):
    with pytest.raises(
        ConfigError, match=re.escape(f"critic.optim.{key.split('=')[0]} is Megatron's: {instead}")
    ):
        _tiny(PPO, f"+critic.optim.{key}", num_devices=1)
