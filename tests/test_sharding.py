"""Logical axes of the parameters and the sharding rules: every parameter names its dimensions,
the training and rollout rules give the expected layouts, and one update with 2-way tensor x
4-way FSDP parallelism on 8 devices equals the one-device update, as does a mixture of experts'
with 2-way expert x 4-way FSDP parallelism (the experts never gathered whole)."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import build_actor, left_padded_prompts, tiny_llama, tiny_rollout_spec
from jax.sharding import PartitionSpec as P

from jrl.assets import prepare_digits_moe
from jrl.config.errors import ConfigError
from jrl.models import CausalLM, LoraSettings, apply_lora, from_pretrained, init_random
from jrl.parallel import ROLLOUT_RULES, make_mesh, param_shardings, role_mesh
from jrl.parallel.sharding import axes_of
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.sampling import SamplingParams
from jrl.rollout.tensor_parallel import rollout_mesh
from jrl.trainer.update.learner import Learner, build_update, normalisers

# (parameter path under a layer or the model) -> (logical axes, training spec, rollout spec) on
# fsdp 4 x tensor 2 and on its rollout mesh (data 4 x tensor 2).
EXPECTED = {
    ("lm_head", "kernel"): (("embed", "vocab"), P("fsdp", "tensor"), P(None, "tensor")),
    ("embed_tokens", "embedding"): (("vocab", "embed"), P("tensor", "fsdp"), P("tensor", None)),
    ("self_attn", "q_proj", "kernel"): (("embed", "heads"), P("fsdp", "tensor"), P(None, "tensor")),
    ("self_attn", "q_proj", "bias"): (("heads",), P("tensor"), P("tensor")),
    ("self_attn", "k_proj", "kernel"): (
        ("embed", "kv_heads"),
        P("fsdp", "tensor"),
        P(None, "tensor"),
    ),
    ("self_attn", "o_proj", "kernel"): (("heads", "embed"), P("tensor", "fsdp"), P("tensor", None)),
    ("self_attn", "o_proj", "bias"): (("embed",), P("fsdp"), P(None)),
    ("mlp", "up_proj", "kernel"): (("embed", "mlp"), P("fsdp", "tensor"), P(None, "tensor")),
    ("mlp", "down_proj", "kernel"): (("mlp", "embed"), P("tensor", "fsdp"), P("tensor", None)),
    ("mlp", "down_proj", "lora_a"): (("mlp", "lora_rank"), P("tensor", None), P("tensor", None)),
    ("mlp", "down_proj", "lora_b"): (("lora_rank", "embed"), P(None, "fsdp"), P(None, None)),
    ("mlp", "up_proj", "lora_b"): (("lora_rank", "mlp"), P(None, "tensor"), P(None, "tensor")),
    ("input_layernorm", "scale"): (("norm",), P(None), P(None)),
}


def _flat(tree):
    return dict(nnx.to_flat_state(tree))


def _specs(state, mesh, **kw):
    return {
        path: v.get_value().spec for path, v in _flat(param_shardings(state, mesh, **kw)).items()
    }


def _key(path):
    """A parameter's path under its layer (or the model's last two names): an `EXPECTED` key."""
    return path[3:] if path[:2] == ("model", "layers") else path[-2:]


def test_parameters_carry_logical_axes_that_the_rules_lay_out():
    model = init_random(tiny_llama(tie_word_embeddings=False, attention_bias=True))
    apply_lora(model, LoraSettings(4, 8))
    state = nnx.state(model)
    train = make_mesh(8, fsdp_size=4, tensor_parallel=2)
    training = _specs(state, train)
    rollout = _specs(state, rollout_mesh(train, 2), rules=ROLLOUT_RULES)
    for path, var in _flat(state).items():
        axes = axes_of(var)
        assert axes is not None and len(axes) == var.get_value().ndim, path
        if _key(path) in EXPECTED:
            assert (axes, training[path], rollout[path]) == EXPECTED[_key(path)], path
    assert EXPECTED.keys() <= {_key(path) for path in training}
    # optax's moments mirror the parameters (and keep their axes); the step count is replicated
    params = nnx.state(model, nnx.Param)
    adam = jax.eval_shape(optax.adamw(1e-3).init, params)[0]
    assert param_shardings(adam.count, train).spec == P()
    assert _specs(adam.mu, train) == _specs(adam.nu, train) == _specs(params, train)


def test_uneven_dimensions_stay_whole_and_role_meshes_keep_the_tensor_axis():
    state = nnx.state(init_random(tiny_llama(vocab_size=65, intermediate_size=66)))
    specs = _specs(state, make_mesh(8, fsdp_size=2, tensor_parallel=4))
    assert specs[("model", "embed_tokens", "embedding")] == P(None, "fsdp")  # 65 % 4 != 0
    layer = ("model", "layers", 0)
    assert specs[(*layer, "mlp", "up_proj", "kernel")] == P("fsdp", None)  # 66 % 4 != 0
    assert specs[(*layer, "self_attn", "q_proj", "kernel")] == P("fsdp", "tensor")
    mesh = role_mesh(make_mesh(8, fsdp_size=2, tensor_parallel=2), 2, -1, "sp")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 2, "sequence": 2}
    assert dict(role_mesh(mesh, 2, -1, "sp", tensor_parallel=1).shape)["tensor"] == 1


def test_an_axis_without_a_rule_is_an_error():
    state = {"w": nnx.Param(jnp.ones((4, 4)), out_sharding=("unknown", None), eager_sharding=False)}
    with pytest.raises(KeyError, match="logical axis 'unknown' has no sharding rule"):
        param_shardings(state, make_mesh(8))


def _loss(model, micro, normaliser):
    logp = jax.nn.log_softmax(model(micro["input_ids"])[:, :-1], axis=-1)
    target = jnp.take_along_axis(logp, micro["input_ids"][:, 1:, None], axis=-1)
    mask = micro["response_mask"][:, 1:]
    return -jnp.sum(target[..., 0] * mask) / normaliser["tokens"], {}


def _one_update(mesh, model=None):
    """The learner of `model` (a tiny untied LM by default) after one SGD-with-momentum update
    on `mesh`, the update's metrics and its compiled program's text."""
    model = model or init_random(tiny_llama(tie_word_embeddings=False), seed=0)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=0.1, momentum=0.9)
    learner = Learner.create(model, tx, mesh)
    rng = np.random.default_rng(0)
    minibatch = {
        "input_ids": rng.integers(0, model.config.vocab_size, (2, 8, 12)).astype(np.int32),
        "response_mask": (rng.random((2, 8, 12)) < 0.8).astype(np.float32),
    }
    update = build_update(learner, _loss, 1.0, minibatch)
    normaliser = normalisers(minibatch["response_mask"], None)
    state = (learner.trainable, learner.frozen, learner.opt_state)
    with jax.set_mesh(mesh):
        program = update.lower(*state, minibatch, normaliser, 0.1).compile().as_text()
    metrics = learner.step(update, minibatch, normaliser, 0.1)
    return learner, jax.device_get(metrics), program


def _assert_same_update(sharded, sharded_metrics, single, single_metrics):
    assert single_metrics["grad_norm"] > 1e-2  # the update moves the parameters
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(sharded_metrics[key], single_metrics[key], rtol=1e-5)
    got, want = jax.device_get(sharded.params), jax.device_get(single.params)
    for path, value in _flat(got).items():
        np.testing.assert_allclose(
            value.get_value(), _flat(want)[path].get_value(), rtol=1e-5, atol=1e-5, err_msg=path
        )


def test_tensor_parallel_update_equals_the_one_device_update():
    mesh = make_mesh(8, fsdp_size=4, tensor_parallel=2)
    sharded, sharded_metrics, _ = _one_update(mesh)
    single, single_metrics, _ = _one_update(make_mesh(1))
    matrices = [x for x in jax.tree.leaves((sharded.params, sharded.opt_state)) if x.ndim == 2]
    assert matrices and all(
        {"tensor", "fsdp"} <= set(x.sharding.spec) and x.sharding.mesh == mesh for x in matrices
    )
    _assert_same_update(sharded, sharded_metrics, single, single_metrics)


def test_expert_parallel_update_equals_the_one_device_update():
    """The tiny Qwen3-MoE of the digits task (4 experts, 2 per token): 2-way expert (the
    ``data`` axis) x 4-way FSDP. Each device holds 2 experts; the update's program moves tokens
    with all-to-all and never gathers a whole expert stack."""
    mesh = make_mesh(8, fsdp_size=4)
    path = prepare_digits_moe()["model_path"]
    model = from_pretrained(path)
    sharded, sharded_metrics, program = _one_update(mesh, model)
    single, single_metrics, _ = _one_update(make_mesh(1), from_pretrained(path))
    _assert_same_update(sharded, sharded_metrics, single, single_metrics)
    stack = sharded.params["model"]["layers"][0]["mlp"]["experts"]["gate_proj"]
    assert stack.sharding.spec == P("data", "fsdp", None)  # tensor: one device
    # A micro-batch's 8 x 12 tokens pick 2 experts each: 24 (token, expert) pairs per device.
    # The pairs go to their experts' device by all-to-all ([devices / 2, 24 pairs, 64]); without
    # expert parallelism the partitioner instead all-reduces all 192 pairs' rows on every device.
    hidden = model.config.hidden_size
    assert re.search(rf"\(f32\[1,24,{hidden}\][^)]*\) all-to-all\(", program)
    assert f"f32[192,{hidden}]" not in program
    whole = ",".join(map(str, stack.shape))  # [4,64,64]: every expert's gate
    gathers = [line for line in program.splitlines() if "all-gather" in line and whole in line]
    assert not gathers, gathers[:2]


def test_the_dense_expert_path_holds_under_expert_parallelism():
    """``moe_implementation="dense"`` (every expert on every received row) is what each device
    runs under 2-way expert x 4-way FSDP too, and its logits are the grouped matmul's."""
    mesh = make_mesh(8, fsdp_size=4)
    model = from_pretrained(prepare_digits_moe()["model_path"])
    ids = jnp.asarray(np.random.default_rng(0).integers(2, model.config.vocab_size, (8, 12)))
    logits, programs = {}, {}
    for implementation in ("ragged", "dense"):
        config = dataclasses.replace(model.config, moe_implementation=implementation)
        graphdef = nnx.graphdef(nnx.eval_shape(lambda c=config: CausalLM(c, rngs=nnx.Rngs(0))))
        params = jax.device_put(nnx.state(model), param_shardings(nnx.state(model), mesh))

        def forward(params, ids, graphdef=graphdef):
            return nnx.merge(graphdef, params)(ids)

        with jax.set_mesh(mesh):
            logits[implementation] = np.asarray(jax.jit(forward)(params, ids))
            programs[implementation] = str(jax.make_jaxpr(forward)(params, ids))
    assert all("all_to_all" in program for program in programs.values())
    assert "ragged_dot" in programs["ragged"] and "ragged_dot" not in programs["dense"]
    np.testing.assert_allclose(logits["dense"], logits["ragged"], rtol=1e-5, atol=1e-5)


def test_the_rollouts_expert_parallelism_splits_each_replicas_experts():
    """``rollout.expert_parallel_size`` = ``tensor_model_parallel_size`` = 2 on 8 devices: each
    replica's 2 devices hold 2 of the tiny MoE's 4 experts whole (not half of every expert's
    width), the rows are those of the width split, and the program gathers nothing."""
    model = from_pretrained(prepare_digits_moe()["model_path"])
    prompts = left_padded_prompts((8, 6, 3, 5), 8, model.config.vocab_size, seed=3)
    sampling = SamplingParams(
        max_new_tokens=6, temperature=1.0, n=2, ignore_eos=True, calculate_log_probs=True
    )
    out, engines = {}, {}
    for experts in (1, 2):
        engines[experts] = JaxRollout(
            model,
            response_length=6,
            pad_token_id=0,
            eos_token_ids=None,
            mesh=make_mesh(8),
            tensor_parallel_size=2,
            expert_parallel_size=experts,
        )
        out[experts] = engines[experts].generate(prompts, sampling, jax.random.key(0)).to_numpy()
    stack = engines[2].state["model"]["layers"][0]["mlp"]["experts"]["gate_proj"]
    assert stack.get_value().sharding.spec == P("tensor", None, None)
    np.testing.assert_array_equal(out[2]["responses"], out[1]["responses"])
    np.testing.assert_allclose(out[2]["rollout_log_probs"], out[1]["rollout_log_probs"], atol=1e-5)
    # Each device runs its own experts over the replica's tokens and one all-reduce sums them:
    # nothing is gathered (left to the partitioner, the grouped matmul gathers group sizes).
    program = engines[2].lower(8, 8, sampling).compile().as_text()
    assert "all-gather(" not in program
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2 devices"):
        JaxRollout(model, response_length=6, pad_token_id=0, eos_token_ids=None,
                   mesh=make_mesh(8), tensor_parallel_size=2, expert_parallel_size=4)  # fmt: skip
    # The key, as the engines read it: the jax engine's too, and refused where no tensor split is.
    keys = dict(name="jax", expert_parallel_size=2)
    assert tiny_rollout_spec(tensor_model_parallel_size=2, **keys).expert_parallel_size == 2
    with pytest.raises(ConfigError, match=r"rollout.expert_parallel_size=2 must be 1 or"):
        tiny_rollout_spec(**keys)


def test_the_tensor_parallel_key_reaches_the_actor(tmp_path):
    """``actor.fsdp_config.tensor_parallel_size=2`` on 8 devices: the actor's mesh is 4-way fsdp x
    2-way tensor, its attention and MLP kernels split over both, and the batch rules count 4
    data-parallel ranks (a mini-batch that 8 ranks could not split is fine)."""
    from jrl.assets import prepare_for
    from jrl.runspec import load_config

    actor_key = "actor_rollout_ref.actor"
    config, _ = load_config(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            "trainer.n_gpus_per_node=8",
            f"{actor_key}.fsdp_config.tensor_parallel_size=2",
            f"{actor_key}.ppo_mini_batch_size=2",  # 2 x 2 answers: 1 row per rank of 4
            f"{actor_key}.ppo_micro_batch_size_per_gpu=1",
            "data.train_batch_size=4",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    prepare_for(config)
    actor = build_actor(config, make_mesh(8))
    assert dict(actor.mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 2, "sequence": 1}
    placed = {path[-2:]: v.get_value().sharding.spec for path, v in _flat(actor.params).items()}
    assert placed[("q_proj", "kernel")] == P("fsdp", "tensor")
    assert placed[("down_proj", "kernel")] == P("tensor", "fsdp")
    assert actor.spec.train.plan.micro_rows == 4  # 4 data-parallel ranks x 1 row


def test_a_role_mesh_follows_the_roles_own_fsdp_size():
    """As verl's workers each build a device mesh from their own fsdp_size: the reference or
    critic gets its FSDP width even where its parallel sizes match the actor's."""
    actor = make_mesh(8, fsdp_size=2)
    assert dict(role_mesh(actor, 1, 4, "critic").shape) == {
        "data": 2,
        "fsdp": 4,
        "tensor": 1,
        "sequence": 1,
    }
    assert dict(role_mesh(actor, 1, -1, "critic").shape)["fsdp"] == 8  # -1: every device
    assert role_mesh(actor, 1, 2, "critic") is actor
    with pytest.raises(ValueError, match="critic: fsdp_config.fsdp_size=3 must divide the 8"):
        role_mesh(actor, 1, 3, "critic")


def test_the_expert_parallel_key_reaches_the_actor(tmp_path):
    """Megatron's ``expert_model_parallel_size=2`` (the actor's
    ``fsdp_config.expert_parallel_size`` follows it) on 8 devices: the actor's mesh puts 2
    devices on ``data`` (the expert axis) and 4 on ``fsdp``; its MoE experts split over both."""
    from jrl.runspec import load_config

    moe = prepare_digits_moe()["model_path"]
    config, _ = load_config(
        [
            "--config=configs/digits_grpo.py",
            f"actor_rollout_ref.model.path={moe}",
            "trainer.n_gpus_per_node=8",
            "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    assert config.actor_rollout_ref.actor.fsdp_config.expert_parallel_size == 2
    actor = build_actor(config, make_mesh(8))
    assert dict(actor.mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1, "sequence": 1}
    stack = actor.params["model"]["layers"][0]["mlp"]["experts"]["down_proj"]
    assert stack.sharding.spec == P("data", None, "fsdp")
    with pytest.raises(ValueError, match="expert_parallel_size is 2"):
        make_mesh(8, fsdp_size=2, expert_parallel=2)
