"""LoRA: layer selection, adapter maths, adapter-only updates, the reference without adapters,
merged export to transformers, and a tiny GRPO run with LoRA."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import build_actor, randomise_adapters
from safetensors.numpy import load_file

from jrl import train
from jrl.assets import prepare_for
from jrl.batch import Batch
from jrl.models import (
    LoRAParam,
    ModelConfig,
    apply_lora,
    default_position_ids,
    from_pretrained,
    init_random,
    save_pretrained,
)
from jrl.models.lora import LoraSettings, adapted_modules, lora_targets
from jrl.models.lora_export import adapter_arrays, adapter_config, save_adapter
from jrl.parallel import make_mesh
from jrl.runspec import load_config
from jrl.runspec.spec import resolve_run
from jrl.trainer.io.step_folders import problems
from jrl.trainer.roles.reference import Reference
from jrl.trainer.update.learner import Learner, build_update

HF = dict(
    model_type="qwen2",
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _model(seed: int = 0):
    return init_random(ModelConfig.from_hf(HF), seed=seed)


def _inputs(rows: int = 3, length: int = 10, seed: int = 0):
    ids = np.random.RandomState(seed).randint(1, HF["vocab_size"], (rows, length))
    mask = np.ones((rows, length), np.int32)
    mask[1:, :3] = 0
    return jnp.asarray(ids), jnp.asarray(mask), default_position_ids(jnp.asarray(mask))


def _paths(*names: str, layers=(0, 1)) -> list[str]:
    where = {"o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
    return [
        f"model.layers.{i}.{where.get(n, 'self_attn')}.{n}"
        for i in layers
        for n in PROJECTIONS
        if n in names
    ]


@pytest.mark.parametrize(
    "targets, exclude, expected",
    [
        ("all-linear", None, _paths(*PROJECTIONS)),
        (["q_proj", "v_proj"], None, _paths("q_proj", "v_proj")),
        ("q_proj, v_proj", None, _paths("q_proj", "v_proj")),
        ("all-linear", ["o_proj", "mlp.down_proj"], _paths(*PROJECTIONS[:3], *PROJECTIONS[4:6])),
        ("all-linear", r".*layers\.0\..*", _paths(*PROJECTIONS, layers=(1,))),
        (["layers.1.mlp.up_proj", "lm_head"], None, ["model.layers.1.mlp.up_proj", "lm_head"]),
    ],
)
def test_target_and_exclude_modules_select_layers(targets, exclude, expected):
    model = _model()
    assert sorted(lora_targets(model, targets, exclude)) == sorted(expected)
    apply_lora(model, LoraSettings(4, 8, target_modules=targets, exclude_modules=exclude))
    assert sorted(adapted_modules(model)) == sorted(expected)
    adapters = nnx.to_flat_state(nnx.state(model, LoRAParam))
    assert len(adapters) == 2 * len(expected)


def test_adapter_shapes_init_and_errors():
    model = apply_lora(_model(), LoraSettings(4, 8, target_modules=["q_proj"]), seed=3)
    q = model.model.layers[0].self_attn.q_proj
    a, b = np.asarray(q.lora_a[...]), np.asarray(q.lora_b[...])
    assert a.shape == (64, 4) and b.shape == (4, 64) and q.lora_scale == 2.0
    assert not b.any() and 0 < np.abs(a).max() <= 1 / math.sqrt(64)  # kaiming-uniform bound
    again = apply_lora(_model(), LoraSettings(4, 8, target_modules=["q_proj"]), seed=3)
    np.testing.assert_array_equal(np.asarray(again.model.layers[0].self_attn.q_proj.lora_a[...]), a)
    with pytest.raises(ValueError, match="selects no linear layer.*q_proj"):
        apply_lora(_model(), LoraSettings(4, 8, target_modules=["qproj"]))
    with pytest.raises(ValueError, match="lora_rank must be a positive integer"):
        apply_lora(_model(), LoraSettings(0, 8))
    with pytest.raises(ValueError, match="exclude_modules=.*regular expression"):
        apply_lora(_model(), LoraSettings(4, 8, exclude_modules="(q_proj"))


def test_experts_get_no_adapters_and_a_warning_says_so():
    moe = {**HF, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2}
    model = init_random(ModelConfig.from_hf({**moe, "moe_intermediate_size": 32}), seed=0)
    with pytest.warns(UserWarning, match="experts of the 2 mixture-of-experts layers"):
        apply_lora(model, LoraSettings(4, 8))
    routers = [f"model.layers.{i}.mlp.gate" for i in (0, 1)]  # linear, as PEFT sees them
    assert sorted(adapted_modules(model)) == sorted(_paths(*PROJECTIONS[:4]) + routers)


def test_forward_equals_base_with_zero_b_and_follows_the_formula():
    model = _model()
    ids, mask, pos = _inputs()
    base = np.asarray(model(ids, mask, pos))
    q = model.model.layers[0].self_attn.q_proj
    x = jnp.asarray(np.random.RandomState(1).normal(size=(2, 64)), jnp.float32)
    plain_q = np.asarray(q(x))
    apply_lora(model, LoraSettings(4, 8))
    np.testing.assert_array_equal(np.asarray(model(ids, mask, pos)), base)
    randomise_adapters(model)
    a, b = np.asarray(q.lora_a[...]), np.asarray(q.lora_b[...])
    np.testing.assert_allclose(np.asarray(q(x)), plain_q + (x @ a @ b) * 2.0, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(model(ids, mask, pos)) - base).max() > 1e-3


def _next_token_loss(model, micro, normaliser):
    logits = model(micro["input_ids"])[:, :-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    target = jnp.take_along_axis(logp, micro["input_ids"][:, 1:, None], axis=-1)
    return -jnp.sum(target) / normaliser["tokens"], {}


def test_update_trains_only_the_adapters():
    model = apply_lora(_model(), LoraSettings(4, 8, target_modules=["q_proj", "down_proj"]))
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=0.0)
    state = Learner.create(model, tx, make_mesh(8), trainable=LoRAParam)
    adapter_sizes = [x.size for x in jax.tree.leaves(state.trainable)]
    assert len(adapter_sizes) == 8 and sum(adapter_sizes) == 2 * (64 * 4 + 4 * 64) + 2 * (
        96 * 4 + 4 * 64
    )
    moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
    assert sorted(x.size for x in moments) == sorted(adapter_sizes * 2)  # Adam's mu and nu
    frozen_before = jax.tree.leaves(state.frozen)
    frozen_copy = [np.array(x) for x in jax.device_get(frozen_before)]
    trainable_before = [np.array(x) for x in jax.device_get(jax.tree.leaves(state.trainable))]

    minibatch = {"input_ids": jnp.asarray(_inputs(rows=8)[0])[None]}
    update = build_update(state, _next_token_loss, 1.0, minibatch)
    metrics = state.step(update, minibatch, {"tokens": jnp.float32(8 * 9)}, 1e-2)
    assert math.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0

    frozen_after = jax.tree.leaves(state.frozen)
    assert all(x is y for x, y in zip(frozen_before, frozen_after, strict=True))
    assert not any(x.is_deleted() for x in frozen_before)
    for old, new in zip(frozen_copy, jax.device_get(frozen_after), strict=True):
        np.testing.assert_array_equal(old, np.asarray(new))  # bit-identical base
    after = jax.device_get(jax.tree.leaves(state.trainable))
    changed = [not np.array_equal(o, n) for o, n in zip(trainable_before, after, strict=True)]
    shapes = [x.shape for x in after]
    # With B = 0 the gradient reaches B only; every B moves, every A stays.
    assert changed == [shape[0] == 4 for shape in shapes]


@pytest.fixture(scope="module")
def lora_config(tmp_path_factory):
    config, _ = load_config(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.model.lora_alpha=8",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj,up_proj]",
            f"trainer.default_local_dir={tmp_path_factory.mktemp('run')}",
        ]
    )
    prepare_for(config)
    return config


def test_reference_is_the_actor_base_without_adapters(lora_config):
    mesh = make_mesh(1)
    actor = build_actor(lora_config, mesh)
    ref = Reference.create(resolve_run(lora_config).ref, mesh, actor)
    assert adapted_modules(actor.learner.model()) and not adapted_modules(
        nnx.merge(ref.log_probs.graphdef, ref.params)
    )
    frozen = {id(x) for x in jax.tree.leaves(actor.learner.frozen)}
    assert all(id(x) in frozen for x in jax.tree.leaves(ref.params))  # no copy of the base

    model = actor.learner.model()
    randomise_adapters(model)
    state = actor.learner
    state.trainable = jax.device_put(nnx.state(model, LoRAParam), state.trainable_shardings)
    ids, mask, pos = _inputs(rows=4, length=12)
    tensors = dict(input_ids=ids, attention_mask=mask, position_ids=pos, responses=ids[:, -5:])
    batch = Batch({k: np.asarray(v) for k, v in tensors.items()})
    ref_lp, _ = ref.compute_log_prob(batch)
    actor_lp, _ = actor.compute_log_prob(batch)

    base = from_pretrained(lora_config.actor_rollout_ref.model.path)
    logits = base(ids, mask, pos)[:, -6:-1] / actor.spec.loss.temperature
    base_lp = jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, -5:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(ref_lp, np.asarray(base_lp), rtol=1e-5, atol=1e-5)
    assert np.abs(actor_lp - ref_lp).max() > 1e-3


def _assert_torch_logits_match(torch_model, ours: np.ndarray, base_folder) -> None:
    """`torch_model`'s logits on `_inputs()` equal `ours` (jrl's, with adapters) within fp32
    noise, and the adapters moved them away from the base model's in `base_folder`."""
    torch = pytest.importorskip("torch")
    ids, mask, pos = _inputs()
    with torch.no_grad():
        theirs = torch_model(
            input_ids=torch.tensor(np.asarray(ids)),
            attention_mask=torch.tensor(np.asarray(mask)),
            position_ids=torch.tensor(np.asarray(pos)),
        ).logits.numpy()
    valid = np.asarray(mask).astype(bool)
    err = np.abs(ours[valid] - theirs[valid]).max()
    assert err <= 1e-4 * np.abs(theirs[valid]).max(), err
    base_logits = np.asarray(from_pretrained(base_folder)(ids, mask, pos))
    assert np.abs(base_logits - ours)[valid].max() > 1e-3  # the adapters count


def test_merged_export_loads_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_config = {k: v for k, v in HF.items() if k != "model_type"}
    torch.manual_seed(0)
    hf_model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**hf_config))
    hf_model.save_pretrained(tmp_path / "base")
    model = apply_lora(from_pretrained(tmp_path / "base"), LoraSettings(4, 8))
    randomise_adapters(model)
    ids, mask, pos = _inputs()
    ours = np.asarray(model(ids, mask, pos))

    save_pretrained(model, tmp_path / "merged")
    names = set(load_file(tmp_path / "merged" / "model.safetensors"))
    assert names == set(hf_model.state_dict())  # plain HF names, no adapter tensors
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    _assert_torch_logits_match(reloaded, ours, tmp_path / "base")


def test_peft_adapter_folder_loads_in_peft(tmp_path):
    """The checkpoint's ``lora_adapter`` folder: PEFT puts it on the HF base model and computes
    jrl's logits. Layer 0's o_proj is left out, so the config lists full paths."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    hf_config = {k: v for k, v in HF.items() if k != "model_type"}
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**hf_config)).save_pretrained(
        tmp_path / "base"
    )
    settings = LoraSettings(4, 6, exclude_modules=r".*layers\.0\.self_attn\.o_proj")
    model = apply_lora(from_pretrained(tmp_path / "base"), settings)
    randomise_adapters(model)
    ids, mask, pos = _inputs()
    ours = np.asarray(model(ids, mask, pos))
    config = adapter_config(model, str(tmp_path / "base"))
    assert "model.layers.0.self_attn.o_proj" not in config["target_modules"]
    assert "model.layers.1.self_attn.o_proj" in config["target_modules"]
    save_adapter(tmp_path / "adapter", adapter_arrays(model), config)

    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    assert not hasattr(loaded.base_model.model.model.layers[0].self_attn.o_proj, "lora_A")
    _assert_torch_logits_match(loaded, ours, tmp_path / "base")


def test_tiny_grpo_run_with_lora(tmp_path):
    metrics = train.main(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.model.lora_alpha=8",
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ]
    )
    assert metrics["training/global_step"] == 1
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
    # Before the first update the adapters are zero, so the actor equals its reference.
    assert abs(metrics["actor/kl_loss"]) < 1e-6
    # verl's PEFT folder beside the actor's checkpoint, in the step's manifest
    adapter = tmp_path / "run" / "global_step_1" / "actor" / "lora_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    assert sorted(config["target_modules"]) == sorted(PROJECTIONS)
    tensors = load_file(adapter / "adapter_model.safetensors")
    assert len(tensors) == 2 * len(PROJECTIONS) * 2  # A and B, 7 projections, 2 layers
    assert problems(tmp_path / "run" / "global_step_1", ("actor",), contents=True) == []
