"""Router replay (verl's R2 / R3) on the digits task's tiny Qwen3-MoE (`jrl.assets.TINY_MOE`):
the JAX sampler records the experts each token used, the trainer's forward replays them (packed
or not), the old-log-prob pass and the update take them as each mode says, and the keys' rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import left_padded_prompts

from jrl.assets import prepare_digits_moe
from jrl.batch import Batch
from jrl.config.errors import ConfigError
from jrl.models import from_pretrained
from jrl.models.moe import ROUTE_NONE, ROUTED_EXPERTS
from jrl.parallel import make_mesh, shard_params
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.sampling import SamplingParams
from jrl.runspec import load_config
from jrl.runspec.spec import resolve_run
from jrl.trainer.ppo.trainer import PPOTrainer
from jrl.trainer.roles.log_probs import LogProbForward, response_scores
from jrl.trainer.roles.specs import ForwardSpec

MODE = "actor_rollout_ref.actor.router_replay.mode"
RECORD = "actor_rollout_ref.rollout.enable_rollout_routing_replay"


@pytest.fixture(scope="module")
def moe_path():
    return prepare_digits_moe()["model_path"]


def _config(moe_path, *overrides):
    argv = [
        "--config=configs/digits_grpo.py",
        f"actor_rollout_ref.model.path={moe_path}",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console']",
        *overrides,
    ]
    return load_config(argv)[0]


def _scores(model, batch, *, packed, replay=False):
    """The trainer's log-prob pass over `batch` (chunks of its rows, packed with shared prompts
    when `packed`), recording the experts each token used."""
    mesh = make_mesh(1)
    graphdef, params = nnx.split(model)
    params, shardings = shard_params(params, mesh)
    scoring = type("Scoring", (), {"temperature": 1.0, "impl": "naive"})
    spec = ForwardSpec(len(batch), None, packed, packed)
    forward = LogProbForward(graphdef, shardings, mesh, spec, scoring)
    return forward.scores(params, batch, replay=replay, record_routes=True)


def test_the_sampler_records_the_experts_that_training_routes_to(moe_path):
    model = from_pretrained(moe_path)
    prompts = left_padded_prompts((8, 6, 3), 8, model.config.vocab_size, seed=3)
    engine = JaxRollout(
        model, response_length=8, pad_token_id=0, eos_token_ids=None, record_routes=True
    )
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, n=2, ignore_eos=True)
    batch = engine.generate(prompts, sampling, jax.random.key(0))
    batch = Batch({k: np.asarray(v) for k, v in batch.tensors.items()})
    recorded = batch.tensors[ROUTED_EXPERTS]
    layers, k = len(model.config.sparse_layers), model.config.experts.experts_per_token
    assert recorded.shape == (6, 16, layers, k) and recorded.dtype == np.int8

    real = batch.tensors["attention_mask"].astype(bool)
    last = np.zeros_like(real)
    last[np.arange(6), real.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1)] = True
    assert (recorded[~real | last] == ROUTE_NONE).all()  # padding, and no step feeds the last
    for packed in (False, True):
        routes = _scores(model, batch, packed=packed).routes
        fed = real & ~last
        np.testing.assert_array_equal(np.sort(routes[fed], -1), np.sort(recorded[fed], -1))


def test_a_replayed_route_steers_the_forward_packed_or_not(moe_path):
    model = from_pretrained(moe_path)
    batch = left_padded_prompts((10, 7), 10, model.config.vocab_size, seed=4)
    batch = batch.union(Batch({"responses": batch.tensors["input_ids"][:, -4:]}))
    native = _scores(model, batch, packed=False)
    experts = model.config.experts.num_experts
    other = np.where(np.arange(10)[None, :, None, None] % 2, (native.routes + 1) % experts, -1)
    steered = batch.union(Batch({ROUTED_EXPERTS: other.astype(np.int8)}))
    for packed in (False, True):
        replayed = _scores(model, steered, packed=packed, replay=True)
        used = np.where(other >= 0, other, native.routes)  # ROUTE_NONE: the block's own
        real = batch.tensors["attention_mask"].astype(bool)
        np.testing.assert_array_equal(replayed.routes[real], used[real])
        assert np.abs(replayed.log_prob - native.log_prob).max() > 1e-3

    # The replayed experts' weights are the router's probabilities: its gradient flows.
    everywhere = batch.union(Batch({ROUTED_EXPERTS: (native.routes + 1) % experts}))
    tensors = {k: jnp.asarray(v) for k, v in everywhere.tensors.items()}
    graphdef, params = nnx.split(model)

    def total(params):
        return response_scores(nnx.merge(graphdef, params), tensors, 1.0).log_prob.sum()

    grads = nnx.to_pure_dict(jax.grad(total)(params))
    assert np.abs(grads["model"]["layers"][0]["mlp"]["gate"]["kernel"]).max() > 0


def _experience(config):
    trainer = PPOTrainer.from_config(config)
    _, prompts = next(iter(trainer.batches()))
    batch, metrics = trainer.make_experience(prompts, 1, {})
    return trainer, batch, metrics


def _random_routes(recorded, experts, seed=0):
    """Routes of `recorded`'s shape: k distinct random experts wherever it has a route."""
    noise = np.random.default_rng(seed).random((*recorded.shape[:-1], experts))
    picked = np.argsort(noise, -1)[..., : recorded.shape[-1]]
    return np.where(recorded >= 0, picked, ROUTE_NONE).astype(recorded.dtype)


def test_r3_replays_the_rollouts_routes_in_the_old_log_prob_pass_and_the_update(moe_path):
    trainer, batch, metrics = _experience(_config(moe_path, f"{MODE}=R3", f"{RECORD}=True"))
    assert metrics["training/routed_tokens"] > 0
    assert metrics["training/routes_differ_fraction"] == 0.0
    experts = trainer.actor.learner.model().config.experts.num_experts
    shuffled = batch.union(
        Batch({ROUTED_EXPERTS: _random_routes(batch.tensors[ROUTED_EXPERTS], experts)})
    )
    replayed = {}
    trainer.add_old_log_probs(shuffled, replayed)
    assert replayed["training/routes_differ_fraction"] == 0.0  # training took the given routes

    # The update's forward replays them too: other routes, other log-probs.
    model = trainer.actor.learner.model()
    temperature = trainer.actor.spec.loss.temperature
    given, shuffled_given = (trainer.actor.update_tensors(b.tensors) for b in (batch, shuffled))
    assert ROUTED_EXPERTS in given
    log_probs = [response_scores(model, t, temperature).log_prob for t in (given, shuffled_given)]
    assert np.abs(np.asarray(log_probs[0] - log_probs[1])).max() > 1e-3
    np.testing.assert_allclose(log_probs[0], batch.tensors["old_log_probs"], atol=1e-5)

    # Measured only (no replay): the same shuffled routes differ from training's own.
    config = _config(moe_path, f"{RECORD}=True")
    measuring, batch, metrics = _experience(config)
    assert metrics["training/routes_differ_fraction"] == 0.0  # fp32: rollout routes as training
    shuffled = batch.union(
        Batch({ROUTED_EXPERTS: _random_routes(batch.tensors[ROUTED_EXPERTS], experts)})
    )
    measured = {}
    measuring.add_old_log_probs(shuffled, measured)
    assert measured["training/routes_differ_fraction"] > 0.5
    assert ROUTED_EXPERTS not in measuring.actor.update_tensors(shuffled.tensors)


def test_r2_records_the_old_log_prob_passs_routes_for_the_update(moe_path):
    trainer, batch, metrics = _experience(_config(moe_path, f"{MODE}=R2"))
    assert "training/routes_differ_fraction" not in metrics  # the rollout records nothing
    routes = batch.tensors[ROUTED_EXPERTS]
    real = batch.tensors["attention_mask"].astype(bool)
    assert (routes[real] >= 0).all()  # every token, the last one too
    assert ROUTED_EXPERTS in trainer.actor.update_tensors(batch.tensors)


def test_router_replay_keys_follow_verls_rules(moe_path):
    cases = {
        (f"{MODE}=R3",): f"set {RECORD}=True",
        (f"{MODE}=R2", f"{RECORD}=True"): "the two conflict",
        (f"{MODE}=R5",): "use one of disabled, R2, R3",
        (f"{MODE}=R2", "algorithm.rollout_correction.bypass_mode=True"): "bypass_mode=True skips",
        (f"{RECORD}=True", "actor_rollout_ref.rollout.name=vllm"): "rollout.name=jax",
        (f"{RECORD}=True", "actor_rollout_ref.rollout.multi_turn.enable=True"): "single-turn",
    }
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            _config(moe_path, *overrides)
    engine_spelling = "actor_rollout_ref.actor.megatron.router_replay.mode=R2"
    assert resolve_run(_config(moe_path, engine_spelling)).actor.router_replay == "R2"
