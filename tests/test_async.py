"""Split meshes (``hybrid_engine=False``): the weight-sync program, the one-step-off pipeline
and its exact resume, on 8 CPU devices (4 for the trainer, 4 for the rollout)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fake_vllm import prompt_batch
from helpers import FULLY_ASYNC_KEYS, TINY_LLAMA, digits_scale
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jrl import train
from jrl.models import init_random
from jrl.parallel import make_mesh
from jrl.parallel.transfer import MeshTransfer, buckets
from jrl.rollout import JaxRollout, SamplingParams
from jrl.rollout.jax_rollout import SESSION_DECODE_STEPS
from jrl.runspec import load_config
from jrl.runspec.spec import resolve_run
from jrl.trainer.loop.fit import Cadence
from jrl.trainer.overlap.fully_async import Rollouter, SingleTurns, group_cap
from jrl.trainer.overlap.split import split_rollout
from jrl.trainer.overlap.versions import VERSIONS, version_metrics
from jrl.trainer.ppo.trainer import PPOTrainer

SPLIT = (
    "--config=configs/digits_grpo.py",
    "actor_rollout_ref.hybrid_engine=False",
    "trainer.n_gpus_per_node=4",
    "rollout.n_gpus_per_node=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "trainer.val_before_train=False",
    "trainer.logger=['console','file']",
)
# Timings differ between runs, and a run's last step starts no sync; the rest must not differ.
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/", "sync/", "overlap/")


def test_buckets_hold_at_most_their_bytes_in_order():
    assert buckets([4, 4, 4, 10, 1], 8) == [[0, 1], [2], [3], [4]]
    assert buckets([4, 4], 0) == [[0, 1]]
    assert buckets([], 8) == []


def test_mesh_transfer_sends_each_shard_to_its_mirror_device():
    devices = jax.devices()
    source = make_mesh(4, fsdp_size=2, tensor_parallel=2, devices=devices[:4])
    transfer = MeshTransfer(source, devices[4:])
    rng = np.random.default_rng(0)
    values = [rng.normal(size=(8, 6)).astype(np.float32), rng.normal(size=(6,)).astype(np.float32)]
    specs = [P("fsdp", "tensor"), P()]
    arrays = [
        jax.device_put(v, NamedSharding(source, s)) for v, s in zip(values, specs, strict=True)
    ]
    moved = transfer.move(arrays, [jnp.bfloat16, jnp.float32])
    for out, value, spec in zip(moved, values, specs, strict=True):
        assert out.sharding == NamedSharding(transfer.mirror, spec)
        assert set(out.devices()) == set(devices[4:])
        expected = value.astype(jnp.bfloat16) if out.dtype == jnp.bfloat16 else value
        np.testing.assert_array_equal(np.asarray(out), expected)
    # the matrix: 4 shards of 4x3 bf16; the vector: 4 replicas of 6 fp32
    assert transfer.sent_bytes(arrays, [jnp.bfloat16, jnp.float32]) == 4 * 12 * 2 + 4 * 6 * 4
    hlo = transfer.lower(
        [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding) for a in arrays]
    )
    text = hlo.compile().as_text()
    assert "collective-permute" in text and "all-gather" not in text


def test_mesh_transfer_to_fewer_devices_sends_from_one_copy():
    """6 trainer devices, 2 rollout devices: the trainer lays each array out split in 2 and
    repeated 3 times, and devices 0 and 3 send one half each."""
    devices = jax.devices()
    source = make_mesh(6, fsdp_size=3, tensor_parallel=2, devices=devices[:6])
    transfer = MeshTransfer(source, devices[6:])
    rng = np.random.default_rng(1)
    values = [rng.normal(size=(6, 4)), rng.normal(size=(3, 5)), rng.normal(size=())]
    specs = [P("fsdp", "tensor"), P("fsdp"), P()]
    arrays = [
        jax.device_put(v.astype(np.float32), NamedSharding(source, s))
        for v, s in zip(values, specs, strict=True)
    ]
    moved = transfer.move(arrays)
    assert transfer.senders == 2
    expected_specs = [P("shard"), P(), P()]  # (3, 5): no dimension splits in 2
    for out, value, spec in zip(moved, values, expected_specs, strict=True):
        assert set(out.devices()) == set(devices[6:])
        assert out.sharding.spec == spec
        np.testing.assert_array_equal(np.asarray(out), value.astype(np.float32))
    # the matrix: 2 halves; the rest: 2 whole copies
    assert transfer.sent_bytes(arrays, [jnp.float32] * 3) == (24 + 2 * 15 + 2 * 1) * 4


def test_mesh_transfer_refuses_other_splits_or_shared_devices():
    devices = jax.devices()
    source = make_mesh(4, devices=devices[:4])
    with pytest.raises(ValueError, match="must divide the trainer's"):
        MeshTransfer(source, devices[4:7])
    with pytest.raises(ValueError, match="disjoint"):
        MeshTransfer(source, devices[2:6])


def _trainer(*overrides: str) -> PPOTrainer:
    config, _ = load_config([*SPLIT, *overrides], num_devices=len(jax.devices()))
    return PPOTrainer.from_config(config)


@pytest.mark.parametrize("rollout_devices", [4, 2])
def test_weight_sync_moves_the_actors_weights_bucket_by_bucket(tmp_path, rollout_devices):
    trainer = _trainer(
        f"trainer.default_local_dir={tmp_path}", f"rollout.n_gpus_per_node={rollout_devices}"
    )
    assert trainer.split.weight_sync.transfer.senders == rollout_devices
    assert trainer.split.weight_sync.bucket_bytes == 512 << 20  # the key's default, in bytes
    trainer.split.weight_sync.bucket_bytes = 50_000  # the digits model has 0.3 MB of weights
    actor_devices = set(trainer.mesh.devices.flat)
    rollout_state = jax.tree.leaves(trainer.rollout.state)
    assert all(set(x.devices()).isdisjoint(actor_devices) for x in rollout_state)
    prompts = next(iter(trainer.train_loader.epoch(0)))
    greedy = trainer.val_sampling
    key = jax.random.key(0)

    def answers():
        out = trainer.rollout.generate(trainer.tagged(prompts, 1, 0), greedy, key)
        return np.asarray(out.tensors["responses"])

    before = answers()
    original = trainer.actor.params
    noisy = jax.tree.map(lambda x: x + 0.5 * jax.random.normal(key, x.shape, x.dtype), original)
    metrics = trainer.split.weight_sync(noisy, 1)
    assert metrics["sync/buckets"] > 1
    for ours, theirs in zip(
        jax.tree.leaves(trainer.rollout.state), jax.tree.leaves(noisy), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs).astype(ours.dtype))
    assert not np.array_equal(answers(), before)
    trainer.split.weight_sync(original, 2)
    np.testing.assert_array_equal(answers(), before)


def _run(run_dir: Path, steps: int, monkeypatch, *overrides: str) -> dict[int, dict]:
    metrics_file = run_dir / "metrics.jsonl"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(metrics_file))
    train.main(
        [
            *SPLIT,
            f"trainer.total_training_steps={steps}",
            "trainer.test_freq=-1",
            "trainer.save_freq=2",
            f"trainer.default_local_dir={run_dir / 'checkpoints'}",
            *overrides,
        ]
    )
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    return {row["step"]: row["data"] for row in rows}


def _comparable(data: dict) -> dict:
    return {k: v for k, v in data.items() if not k.startswith(NOT_COMPARED)}


def test_one_step_off_trains_on_rows_one_version_old_and_resumes_exactly(tmp_path, monkeypatch):
    whole = _run(tmp_path / "whole", 4, monkeypatch)
    assert whole[1]["training/staleness_max"] == 0
    perf = whole[2]  # over the trainer's 4 devices and the rollout's 4, as verl's recipe counts
    per_device = perf["perf/total_num_tokens"] / (perf["perf/time_per_step"] * 8)
    assert perf["perf/throughput"] == pytest.approx(per_device)
    for step in (2, 3, 4):
        assert whole[step]["training/staleness_mean"] == 1
    for step in (2, 3):  # the sync before the next step's generation (none after the last)
        assert whole[step]["sync/bytes"] > 0
    # a run stopped after step 2 (its checkpoint holds step 3's rows, generated on version 1)
    step_2 = tmp_path / "whole" / "checkpoints" / "global_step_2"
    resumed = _run(
        tmp_path / "resumed",
        4,
        monkeypatch,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={step_2}",
    )
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert _comparable(resumed[step]) == _comparable(whole[step])


def _partial_rollouter(engine, prompts, key, response: int):
    greedy = SamplingParams(
        max_new_tokens=response, pad_token_id=0, do_sample=False, ignore_eos=True,
        calculate_log_probs=True,
    )  # fmt: skip
    rollouter = Rollouter(
        lambda rows: engine.open_session(rows, prompts.tensors["input_ids"].shape[1], greedy, key),
        iter([(0, prompts)]),
        SingleTurns(response, pad_token_id=0),
        n=2,
        cap=len(prompts),
        partial=True,
        devices=jax.devices()[:1],
    )
    rollouter.overlaps = False  # the test's thread drives it, step by step
    return rollouter


def test_partial_rollout_rows_keep_their_tokens_and_go_on_with_new_weights():
    response = 40
    model = init_random(TINY_LLAMA, seed=0)
    engine = JaxRollout(model, response_length=response, pad_token_id=0, eos_token_ids=(1,))
    ids = np.array([[0, 0, 5, 9, 13, 7], [0, 3, 8, 2, 11, 4]], np.int32)
    prompts = prompt_batch(ids, (ids > 0).astype(np.int32))
    key = jax.random.key(3)
    original = engine.state
    whole = _partial_rollouter(engine, prompts, key, response).take(2)
    rollouter = _partial_rollouter(engine, prompts, key, response)
    assert rollouter.advance()  # the rows start: their first token and 16 more on version 0
    rollouter.pause(drain=False)
    noisy = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(key, x.shape, x.dtype), original)
    engine.update_weights(noisy)
    rollouter.resume(version=1)
    partial = rollouter.take(2)
    first = 1 + SESSION_DECODE_STEPS
    changed = 0
    for done, ref in zip(partial, whole, strict=True):
        versions = done.tensors[VERSIONS]
        assert (versions[:, :first] == 0).all() and (versions[:, first:] == 1).all()
        tokens, ref_tokens = done.tensors["responses"], ref.tensors["responses"]
        np.testing.assert_array_equal(tokens[:, :first], ref_tokens[:, :first])
        logps = done.tensors["rollout_log_probs"][:, :first]
        np.testing.assert_allclose(logps, ref.tensors["rollout_log_probs"][:, :first])
        changed += int((tokens[:, first:] != ref_tokens[:, first:]).any())
        assert version_metrics(versions, 1)["training/partial_rows"] == 2
    assert changed  # the rows went on with the new weights


def test_fully_async_without_staleness_syncs_every_trigger_steps_and_resumes_exactly(
    tmp_path, monkeypatch
):
    """staleness_threshold=0: the rollouter makes each version's 32 groups (2 updates of 2
    mini-batches of 8 prompts), so the first update of a version trains on its own rows and
    the second on rows one version old; a checkpoint in the middle drains and resumes exactly."""
    whole = _run(tmp_path / "whole", 4, monkeypatch, *FULLY_ASYNC_KEYS, "trainer.save_freq=1")
    assert [whole[s]["training/staleness_mean"] for s in (1, 2, 3, 4)] == [0, 1, 0, 1]
    assert [("sync/bytes" in whole[s]) for s in (1, 2, 3, 4)] == [False, True, False, True]
    step_1 = tmp_path / "whole" / "checkpoints" / "global_step_1"
    resumed = _run(
        tmp_path / "resumed",
        4,
        monkeypatch,
        *FULLY_ASYNC_KEYS,
        "trainer.save_freq=1",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={step_1}",
    )
    assert sorted(resumed) == [2, 3, 4]
    for step in (2, 3, 4):
        assert _comparable(resumed[step]) == _comparable(whole[step])


# verl's experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_12.sh, its keys scaled to the
# digits task on 8 CPU devices (4 train, 2 generate: its 12 + 4 split), with its batch keys as
# verl's fully-async trainer requires them (train_batch_size 0, gen_batch_size 1) and its run
# counted in prompts (total_rollout_steps; no total_training_steps).
FULLY_ASYNC_SCRIPT = (
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.hybrid_engine=False",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=4",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=2",
    "rollout.total_rollout_steps=48",
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=2",
    "async_training.require_batches=2",
    "async_training.partial_rollout=True",
    "actor_rollout_ref.actor.use_rollout_log_probs=True",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "data.train_batch_size=0",
    "data.gen_batch_size=1",
    "trainer.total_training_steps=null",  # digits_scale's 2 off: the script sets none
    "trainer.test_freq=-1",
    "trainer.logger=['console','file']",
)


def test_verls_fully_async_script_runs_under_its_config_name(tmp_path, monkeypatch):
    argv = ["--config-name=fully_async_ppo_trainer", *digits_scale(tmp_path), *FULLY_ASYNC_SCRIPT]
    config, _ = load_config(argv, num_devices=len(jax.devices()))
    run = resolve_run(config)
    assert run.placement.fully_async and run.placement.partial_rollout
    # a step trains on require_batches x ppo_mini_batch_size prompts; 48 prompts make 3 steps
    assert (run.data.files.train_batch_size, run.data.gen_batch_size) == (16, 16)
    assert run.cadence.total_training_steps == 3
    assert run.algorithm.rollout_correction.bypass_mode  # the recipe's rollout log-probs
    # verl's fully-async trainer counts test_freq in weight versions: a sync every 2 steps here
    every = dataclasses.replace(run.cadence, test_freq=2, save_freq=3, total_training_steps=8)
    cadence = Cadence.of(every, 1)
    assert [s for s in range(1, 9) if cadence.validates_at(s)] == [4, 8]
    assert [s for s in range(1, 9) if cadence.saves_at(s)] == [3, 6, 8]
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(metrics_file))
    train.main(argv)
    rows = [json.loads(line)["data"] for line in metrics_file.read_text().splitlines()]
    assert len(rows) == 3 and all("training/staleness_mean" in row for row in rows)
    assert rows[1]["sync/bytes"] > 0  # after 2 updates


def test_verls_fully_async_recipe_runs_100_prompts_unless_told(tmp_path):
    script = [k for k in FULLY_ASYNC_SCRIPT if not k.startswith("rollout.total_rollout_steps")]
    argv = ["--config-name=fully_async_ppo_trainer", *digits_scale(tmp_path), *script]
    config, _ = load_config(argv, num_devices=len(jax.devices()))
    assert resolve_run(config).cadence.total_training_steps == 100 // 16  # steps of 16 prompts


def test_the_cap_and_the_staleness_figures_count_as_verls():
    # verl multiplies 5 * (0.2 + 1) * 9 = 54.0; (1 + 0.2) * 9 * 5 rounds down to 53.99...
    assert group_cap(0.2, 9, 5) == 54
    versions = np.array([[2, 3, -1], [-1, -1, -1], [3, 3, 3]], np.int32)  # row 1: no token
    figures = version_metrics(versions, 3)
    assert figures["training/staleness_mean"] == 0.5 and figures["training/partial_rows"] == 1
    assert version_metrics(versions[1:2], 3) == {}


def test_a_sync_between_the_trainers_starts_no_new_cap():
    """A sync for validation between two of the trainer's (`SplitRun.idle`) relabels the
    rows that start after it, but lets no more groups start before the trainer's next sync."""
    model = init_random(TINY_LLAMA, seed=0)
    engine = JaxRollout(model, response_length=4, pad_token_id=0, eos_token_ids=(1,))
    ids = np.array([[0, 5, 9, 13], [3, 8, 2, 11], [7, 7, 4, 2], [6, 1, 9, 9]], np.int32)
    prompts = prompt_batch(ids, (ids > 0).astype(np.int32))
    rollouter = _partial_rollouter(engine, prompts, jax.random.key(0), 4)
    rollouter.cap = 2
    assert len(rollouter.take(2)) == 2  # the version's cap of groups
    rollouter.pause(drain=False)
    rollouter.resume(version=1, new_cap=False)
    assert rollouter.version == 1 and rollouter.started == 2
    with pytest.raises(RuntimeError, match="may start no group before the next sync"):
        rollouter.take(1)
    rollouter.pause(drain=False)
    rollouter.resume(version=2)
    groups = rollouter.take(2)
    assert all((g.tensors[VERSIONS][g.tensors["response_mask"] > 0] == 2).all() for g in groups)


def test_critic_warm_up_steps_count_as_versions_under_fully_async(tmp_path, monkeypatch):
    """verl's split trainers count a critic's warm-up step as a version: with a cap of exactly
    one version's groups, a run whose first step only warms the critic up syncs after step 2
    and goes on (counting actor updates, step 3 found the cap spent and no sync to come)."""
    rows = _run(
        tmp_path,
        3,
        monkeypatch,
        *FULLY_ASYNC_KEYS,
        "algorithm.adv_estimator=gae",
        "critic.enable=True",
        "critic.model.fsdp_config.dtype=float32",
        "critic.ppo_micro_batch_size_per_gpu=16",
        "trainer.critic_warmup=2",  # step 1 updates only the critic
        "trainer.save_freq=-1",
    )
    assert "actor/pg_loss" not in rows[1] and "actor/pg_loss" in rows[2]
    assert [("sync/bytes" in rows[s]) for s in (1, 2, 3)] == [False, True, False]
    assert [rows[s]["training/staleness_mean"] for s in (1, 2, 3)] == [0, 1, 0]


def test_one_step_off_runs_agent_loops_in_the_rollouts_thread(tmp_path, monkeypatch):
    """The lookup card's tool agent loop (multi-turn rows, tool calls) on the rollout's own
    devices, one batch ahead."""
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(metrics_file))
    train.main(
        [
            "--config=configs/lookup_tool_grpo.py",
            *SPLIT[1:],
            "trainer.total_training_steps=2",
            "trainer.test_freq=-1",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    rows = [json.loads(line)["data"] for line in metrics_file.read_text().splitlines()]
    assert [row["training/staleness_mean"] for row in rows] == [0, 1]
    for row in rows:
        assert row["num_turns/max"] > 1 and row["agent/rounds"] >= 1


def test_fully_async_streams_agent_loop_rows(tmp_path, monkeypatch):
    """The lookup card's tool agent loop under fully async: each row's loop asks its turns of
    the rollouter's session and calls its tool between session steps; verl's fully-async batch
    keys size the step."""
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(metrics_file))
    argv = [
        "--config=configs/lookup_tool_grpo.py",
        *SPLIT[1:],
        *FULLY_ASYNC_KEYS,
        "data.train_batch_size=0",  # verl's fully-async spelling: require_batches x mini-batch
        "trainer.total_training_steps=3",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path}",
    ]
    train.main(argv)
    rows = [json.loads(line)["data"] for line in metrics_file.read_text().splitlines()]
    assert len(rows) == 3  # 3 steps of require_batches x ppo_mini_batch_size = 16 prompts
    assert sum(row["agent/tool_calls"] for row in rows) > 0  # the tool ran between turns
    assert max(row["num_turns/max"] for row in rows) > 2  # and its answer was read
    staleness = [row["training/staleness_max"] for row in rows]
    assert staleness == [0, 1, 0]  # 2 updates' groups per version (staleness_threshold=0)


def test_fully_async_dapo_filter_takes_what_it_needs_and_refills(tmp_path, monkeypatch):
    """DAPO's filter under fully async with staleness_threshold=0: a version's cap is exactly
    its 2 updates' groups, so a step that drops groups only finds enough because each dropped
    group gives its place back to a fresh prompt; every draw after the first takes the groups
    still needed (no kept prompt is discarded)."""
    filtered = ("algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=seq_reward")
    rows = _run(tmp_path, 3, monkeypatch, *FULLY_ASYNC_KEYS, *filtered, "trainer.save_freq=-1")
    assert sum(rows[step]["training/filter_groups/evicted_samples"] for step in rows) > 0
    assert max(rows[step]["train/num_gen_batches"] for step in rows) > 1
    for step in rows:
        assert rows[step]["training/filter_groups/discarded_surplus_samples"] == 0
    assert [rows[step]["training/staleness_max"] for step in (1, 2, 3)] == [0, 1, 0]


def test_one_step_off_refuses_dapo_filter_and_names_the_mode_that_runs_it():
    filtered = ("algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=seq_reward")
    with pytest.raises(ValueError, match="use async_training.mode=fully_async"):
        load_config([*SPLIT, *filtered], num_devices=len(jax.devices()))


def test_the_rollouts_first_weights_move_bucket_by_bucket(tmp_path, monkeypatch):
    trainer = _trainer(f"trainer.default_local_dir={tmp_path}")
    moves = []
    original_move = MeshTransfer.move

    def counted(self, arrays, dtypes=None):
        moves.append(len(arrays))
        return original_move(self, arrays, dtypes)

    monkeypatch.setattr(MeshTransfer, "move", counted)
    placement = dataclasses.replace(trainer.run.placement, bucket_bytes=50_000)
    engine, _ = split_rollout(
        trainer.run.rollout, placement, trainer.actor, trainer.rollout_devices, trainer.tokenizer
    )
    leaves = jax.tree.leaves(trainer.actor.params)
    assert len(moves) > 1 and sum(moves) == len(leaves)  # the 0.3 MB model in 50 kB buckets
    for ours, theirs in zip(jax.tree.leaves(engine.state), leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs).astype(ours.dtype))
