"""`python -m jrl.compile`: the tiny cards compiled for real TPU slices by the TPU compiler (libtpu,
no TPU needed), the plan's figures, the verdict and the measured advice, and the layer
extrapolation against a full-depth compile."""

import json
from pathlib import Path

import pytest

from jrl.parallel.topology import libtpu_missing, parse_topology
from jrl.plan.compiled import count_collectives, needed_bytes
from jrl.plan.programs import per_chip_bytes

needs_libtpu = pytest.mark.skipif(
    libtpu_missing() is not None, reason=f"cannot compile for TPU here: {libtpu_missing()}"
)
GRPO = "configs/gsm8k_grpo.py:tiny"
PPO = "configs/gsm8k_ppo.py:tiny"
# Four chips split a tiny card's mini-batch of 4 prompts x n answers into one row per chip.
SMALL_MICRO = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
]


def test_topology_names_as_jax_and_cloud_write_them():
    assert parse_topology("v5p:4x4x4") == ("v5p", "v5p:4x4x4", 64)
    assert parse_topology("v5p-128") == ("v5p", "v5p:4x4x4", 64)  # v5p counts TensorCores
    assert parse_topology("v5litepod-16") == ("v5e", "v5e:4x4", 16)
    assert parse_topology("v6e-64") == ("v6e", "v6e:8x8", 64)
    assert parse_topology("v5e:1x1") == ("v5e", "v5e:2x2", 1)  # one chip of the smallest grid
    for bad, why in [("v5e:3x3", "no 3x3 grid"), ("v5p-6", "slices come as"), ("tpu", "not a")]:
        with pytest.raises(ValueError, match=why):
            parse_topology(bad)


def test_out_of_memory_messages_and_collectives_parse():
    temps = "RESOURCE_EXHAUSTED: ... required for HLO temporaries (18.80G) exceeds available HBM"
    assert needed_bytes(temps, arguments=1 << 30) == int(18.8 * (1 << 30)) + (1 << 30)
    used = "Ran out of memory in memory space hbm. Used 20.50G of 15.75G hbm."
    assert needed_bytes(used, arguments=0) == int(20.5 * (1 << 30))
    assert needed_bytes("INTERNAL: something else", arguments=0) is None
    hlo = "%a = f32[8] all-gather-start(x)\n%b = f32[8] all-reduce(y)\n%c = f32[8] all-reduce(z)"
    hlo += "\n%d = (f32[1,8]{1,0:T(1,128)}, u32[]) collective-permute-start(%p)"
    hlo += "\n%e = f32[1,8] copy(%collective-permute-done)"
    counts = count_collectives(hlo)
    assert counts["all-gather"] == 1 and counts["all-reduce"] == 2 and counts["all-to-all"] == 0
    assert counts["collective-permute"] == 1  # a tuple result; the -done half is not counted


def _plan(*argv: str) -> tuple[int, dict]:
    from jrl.compile import run

    return run([*argv, "--rollout-buckets=largest"])


@needs_libtpu
@pytest.mark.parametrize("topology", ["v5e:2x2", "v5p:2x2x1"])
@pytest.mark.parametrize("card", [GRPO, PPO], ids=["grpo", "ppo"])
def test_tiny_cards_compile_for_tpu_slices_and_fit(card, topology, capsys):
    status, report = _plan(f"--config={card}", f"--topology={topology}", *SMALL_MICRO)
    printed = capsys.readouterr().out
    assert status == 0 and report["fits"] and "fits: the largest phase" in printed
    assert report["chips"] == 4 and report["device_kind"].startswith("TPU v5")
    phases = {p["phase"]: p for p in report["phases"]}
    roles = {"rollout", "old_log_prob", "update_actor"}
    roles |= {"values", "update_critic"} if card == PPO else {"ref"}
    assert set(phases) == roles
    for phase in phases.values():
        assert 0 < phase["peak_bytes"] <= phase["total_bytes"] <= report["hbm_bytes"]
        assert phase["flops_analytic"] > 0 and phase["seconds_estimate"] > 0
        for program in phase["programs"]:
            memory = program["memory"]
            assert memory["argument"] > 0 and program["out_of_memory"] is None
            argument_output_temp = memory["argument"] + memory["output"] + memory["temp"]
            assert program["peak_bytes"] == argument_output_temp - memory["alias"]
    # FSDP over 4 chips: the update gathers parameters and reduces gradients.
    update = phases["update_actor"]["collectives"]
    assert update["all-gather"] > 0 and update["all-reduce"] + update["reduce-scatter"] > 0
    assert report["resident"]["actor params"]["device"] > 0
    json.dumps(report)  # every figure is plain JSON


@needs_libtpu
def test_a_card_that_cannot_fit_exits_1_with_measured_advice(capsys):
    from jrl.compile import main

    huge = "+actor_rollout_ref.model.override_config.model_config"
    status = main(
        [
            f"--config={GRPO}",
            "--topology=v5e:1x1",
            "--rollout-buckets=largest",
            f"{huge}.vocab_size=1000000",
            f"{huge}.hidden_size=2048",
            "actor_rollout_ref.model.use_fused_kernels=True",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        ]
    )
    printed = capsys.readouterr().out
    assert status == 1
    assert "does not fit: " in printed and "GiB over the 15.75 GiB of HBM" in printed
    assert "measured advice" in printed
    assert "enable_gradient_checkpointing=True saves" in printed


@needs_libtpu
def test_bad_topology_and_bad_card_exit_2_naming_the_problem(capsys):
    from jrl.compile import main

    assert main([f"--config={GRPO}", "--topology=v5e:3x3"]) == 2
    assert "--topology='v5e:3x3'" in capsys.readouterr().err
    assert main(["--config=configs/nothing.py", "--topology=v5e:2x2"]) == 2
    assert "config file 'configs/nothing.py' not found" in capsys.readouterr().err


@needs_libtpu
def test_layer_extrapolation_matches_a_full_depth_compile():
    depth = "+actor_rollout_ref.model.override_config.model_config.num_hidden_layers=6"
    no_reference = "actor_rollout_ref.actor.use_kl_loss=False"  # three programs per plan
    common = [f"--config={GRPO}", "--topology=v5e:1x1", depth, no_reference, "--json"]
    _, full = _plan(*common)
    _, extrapolated = _plan(*common, "--layers=2,4")
    assert "extrapolated to 6 decoder layers" in " ".join(extrapolated["notes"])
    # The training phases are affine in depth to a few percent; the rollout's temporaries grow a
    # little less than linearly (the compiler reuses buffers), so 2 -> 4 layers overestimates it
    # at 6 (by 9% for this tiny model): the extrapolation errs on the safe side.
    for a, b in zip(full["phases"], extrapolated["phases"], strict=True):
        assert a["phase"] == b["phase"]
        assert 0.97 * a["total_bytes"] <= b["total_bytes"] <= 1.12 * a["total_bytes"], a["phase"]
    for name, state in full["resident"].items():
        assert extrapolated["resident"][name]["total"] == pytest.approx(state["total"], rel=0.01)


@needs_libtpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_rollout_keeps_one_copy_of_its_kv_cache_on_tpu(head_dim):
    """One kv head per chip (2 heads, tensor parallel 2). The TPU compiler tiles an array's two
    minor dimensions; the cache layout of `jrl.models.kv_layout` keeps the decode loop from
    holding a second, re-laid-out copy of the whole cache for either head_dim."""
    from jrl.parallel.topology import open_slice
    from jrl.plan.compiled import compile_program
    from jrl.plan.memory import plan_kv_cache
    from jrl.plan.programs import step_programs
    from jrl.plan.roles import build_roles
    from jrl.runspec import load_config

    model = "+actor_rollout_ref.model.override_config.model_config"
    where = open_slice("v5e:2x2")
    config = load_config(
        [
            f"--config={GRPO}",
            "trainer.n_gpus_per_node=4",
            f"{model}.head_dim={head_dim}",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "data.max_prompt_length=256",
            "data.max_response_length=256",
            "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        ]
    )[0]
    roles = build_roles(config, where)
    plan_kv_cache(roles, config, where.hbm_bytes)
    rollout = step_programs(roles, config, largest_bucket_only=True)[0]
    compiled = compile_program(rollout, "v5e:2x2", local=False)
    cache = rollout.arguments - per_chip_bytes(roles.rollout.state)
    assert cache > 16 * 2**20, "the cache should dominate this program"
    assert compiled.memory["temp"] < cache / 8, compiled.memory


# The later turns' programs of the lookup card (4 prompt + 8 response tokens, 128 rows, 32 per
# replica, one slot each), by rollout.agent.scheduling.
LATER_TURNS = {
    # Round 0's keys and values go into each trajectory's slot of 4 + 8 columns; a turn then
    # admits at most the 8 tokens of a response and its last token (16 columns); decode steps.
    "slots": [
        "later turns in slots: admission of 16 tokens into every slot",
        "later turns in slots: 16 decode steps of every slot",
        "later turns in slots: round 0's keys and values copied, 128 rows",
    ],
    # 4 + 8 -> 16: the round takes over the last one's keys and values (a copy), then
    # prefills the appended tokens (at most the 8 of a response).
    "rounds": [
        "later turns: kept keys and values copied, 128 rows, bucket 16",
        "later turns: history bucket 16, 128 rows, 32 slots, prefill of the last 8 columns",
    ],
}


@needs_libtpu
@pytest.mark.parametrize("scheduling", sorted(LATER_TURNS))
def test_multi_turn_rollouts_plan_their_later_turns(capsys, scheduling):
    """With agent loops the rollout phase also compiles the later turns' programs: in slots,
    the copy of round 0's keys and values into the trajectories' slots, the admission of
    appended tokens and the decode steps between admissions; in rounds, a later round's
    widest call (every trajectory once more, n=1, after its whole history padded to a power of
    two) and the copy of the previous round's keys and values that spares it the history's
    prefill."""
    status, report = _plan(
        "--config=configs/lookup_tool_grpo.py",
        "--topology=v5e:2x2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"actor_rollout_ref.rollout.agent.scheduling={scheduling}",
    )
    assert status == 0 and report["fits"]
    (rollout,) = [p for p in report["phases"] if p["phase"] == "rollout"]
    names = [program["label"] for program in rollout["programs"]]
    later = LATER_TURNS[scheduling]
    assert names[-len(later) :] == later
    assert all(program["out_of_memory"] is None for program in rollout["programs"])


def _tiny_weight_bytes(trainer_chips: int) -> int:
    """The bytes one weight sync of the tiny model moves (float32, as its rollout holds them):
    every matrix element once (FSDP splits each over the trainer's chips) and every vector
    (norm scales, biases: not split) once per trainer chip."""
    from jrl.assets import TINY_MODEL, tiny_paths

    config = json.loads(Path(tiny_paths()["model_path"], "config.json").read_text())
    shape = TINY_MODEL
    d, f, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_layers"]
    q, kv = (shape[heads] * shape["head_dim"] for heads in ("num_heads", "num_kv_heads"))
    matrices = config["vocab_size"] * d + layers * (3 * d * f + 2 * d * q + 2 * d * kv)
    vectors = layers * (2 * d + q + 2 * kv) + d  # norms and q/k/v biases; the final norm
    return 4 * (matrices + trainer_chips * vectors)


@needs_libtpu
def test_a_split_card_plans_both_meshes_and_the_weight_sync(capsys):
    """hybrid_engine=False on v5p:2x2x2 (2 hosts of 4 chips): the trainer on 2 chips of each host,
    the rollout on the other 2, each mesh's memory on its own chips, and the sync program over
    both compiled for the TPU: shards sent chip to chip, nothing gathered."""
    from jrl.parallel.topology import open_slice

    status, report = _plan(
        f"--config={GRPO}",
        "--topology=v5p:2x2x2",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    )
    printed = capsys.readouterr().out
    assert status == 0 and report["fits"]
    split = report["split"]
    host_of = {d.id: d.process_index for d in open_slice("v5p:2x2x2").devices}
    assert [h["host"] for h in split["hosts"]] == [0, 1]
    for host in split["hosts"]:
        trainer, rollout = host["trainer"], host["rollout"]
        assert len(trainer) == len(rollout) == 2 and not set(trainer) & set(rollout)
        assert {host_of[i] for i in trainer + rollout} == {host["host"]}
    assert "host 0: trainer 0-1; rollout 2-3" in printed
    assert "host 1: trainer 4-5; rollout 6-7" in printed

    resident = report["resident"]
    assert resident["actor params"]["mesh"] == "trainer"
    assert resident["rollout weights"]["mesh"] == resident["rollout KV cache"]["mesh"] == "rollout"
    phases = {p["phase"]: p for p in report["phases"]}
    assert phases["rollout"]["other_resident_bytes"] == 0  # no trainer state on its chips
    # The actor's update keeps the reference's parameters beside its own, not the rollout's.
    assert phases["update_actor"]["other_resident_bytes"] == resident["reference params"]["device"]
    meshes = split["meshes"]
    assert meshes["trainer"]["worst_phase"] == "update_actor"
    assert meshes["rollout"]["worst_phase"] == "rollout"
    for mesh in ("trainer", "rollout"):
        assert 0 < meshes[mesh]["total_bytes"] <= report["hbm_bytes"]
        assert f"{mesh} mesh per chip: " in printed

    (sync,) = phases["update_weights"]["programs"]
    assert sync["out_of_memory"] is None and sync["peak_bytes"] > 0
    collectives = sync["collectives"]
    assert collectives["collective-permute"] > 0
    assert collectives["all-gather"] == collectives["all-reduce"] == collectives["all-to-all"] == 0
    figures = split["sync"]
    assert figures["sent_bytes"] == _tiny_weight_bytes(trainer_chips=4)
    assert figures["buckets"] == 1 and figures["per_chip_bytes"] * 4 == figures["sent_bytes"]
    assert figures["seconds_estimate"] == pytest.approx(figures["per_chip_bytes"] / 600e9)
    assert "weight sync: " in printed and "at 600 GB/s per chip" in printed


def _moe_card() -> list[str]:
    """The digits GRPO card with its tiny Qwen3-MoE on 4 v5p chips."""
    from jrl.assets import prepare_digits_moe

    return [
        "--config=configs/digits_grpo.py",
        "--topology=v5p:2x2x1",
        f"actor_rollout_ref.model.path={prepare_digits_moe()['model_path']}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    ]


@needs_libtpu
def test_a_mixture_of_experts_card_compiles_with_expert_parallelism():
    """The digits GRPO card with its tiny Qwen3-MoE on 4 v5p chips, 2-way expert x 2-way FSDP
    (Megatron's expert_model_parallel_size), against 4-way FSDP: the TPU compiler takes the
    experts' dispatch, at least 2 more all-to-alls per sparse layer in the old-log-prob pass
    (the pairs with their experts out, which the compiler may combine into one; the outputs
    back), and both runs fit."""
    common = _moe_card()
    counts = {}
    for experts in (1, 2):
        key = f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={experts}"
        status, report = _plan(*common, key)
        assert status == 0 and report["fits"]
        phases = {p["phase"]: p["collectives"]["all-to-all"] for p in report["phases"]}
        counts[experts] = phases
    layers = 2  # the tiny MoE's sparse layers
    assert counts[2]["old_log_prob"] >= counts[1]["old_log_prob"] + 2 * layers, counts
    assert counts[2]["update_actor"] > counts[1]["update_actor"], counts


@needs_libtpu
def test_router_replay_and_the_rollouts_expert_parallelism_compile_for_tpu():
    """The digits MoE card on 4 v5p chips, its rollout in 2 replicas of 2-way tensor parallelism,
    with router replay R3 and the replicas' experts split over their 2 devices
    (``rollout.expert_parallel_size``), against the same card without either. The TPU compiler
    takes:
    - the rollout that records each token's experts (more output), splitting the experts without
      gathering anything;
    - the old-log-prob pass that replays and records them (more input and output);
    - the update that replays them (more input);
    and both runs fit."""
    rollout = "actor_rollout_ref.rollout"
    replicas = [f"{rollout}.name=jax", f"{rollout}.tensor_model_parallel_size=2"]
    changed = [
        "actor_rollout_ref.actor.router_replay.mode=R3",
        f"{rollout}.enable_rollout_routing_replay=True",
        f"{rollout}.expert_parallel_size=2",
    ]
    memory, collectives = {}, {}
    for name, extra in (("plain", []), ("changed", changed)):
        status, report = _plan(*_moe_card(), *replicas, *extra)
        assert status == 0 and report["fits"]
        memory[name] = {p["phase"]: p["programs"][0]["memory"] for p in report["phases"]}
        collectives[name] = {p["phase"]: p["collectives"] for p in report["phases"]}
    plain, replayed = memory["plain"], memory["changed"]
    assert replayed["rollout"]["output"] > plain["rollout"]["output"]
    for kind in ("argument", "output"):
        assert replayed["old_log_prob"][kind] > plain["old_log_prob"][kind], kind
    assert replayed["update_actor"]["argument"] > plain["update_actor"]["argument"]
    split = collectives["changed"]["rollout"]
    assert split.get("all-gather", 0) == 0 and split["all-reduce"] > 0
