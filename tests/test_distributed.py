"""Multi-process runs: `jax.distributed` over CPU processes on localhost (gloo collectives) trains
as one process on the same number of devices does, and its checkpoints restore in one process."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from helpers import FULLY_ASYNC_KEYS
from sft_digits import digits_sft_args

from jrl import train
from jrl.assets import prepare_digits_moe
from jrl.parallel.distributed import Launch, launch_from_env
from jrl.runspec import load_config
from jrl.trainer.io.checkpoint import restore_role
from jrl.trainer.io.step_folders import problems, read_tracker
from jrl.trainer.io.tracking import Tracking
from jrl.trainer.ppo.trainer import PPOTrainer

REPO = Path(__file__).resolve().parents[1]
DEVICES = 4
SCORER = '''
import os


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A score that differs between answers, so GRPO's advantages and gradients are not zero."""
    log = os.environ.get("SCORER_LOG")
    if log:  # the trainer process whose reward worker this is
        with open(log, "a") as out:
            out.write(f"{os.getppid()}\\n")
    return (sum(map(ord, solution_str)) % 7) / 6.0
'''
IGNORED = ("timing", "perf/", "agent/tool_latency")  # wall-clock measurements
# The engine calls that start later turns in slots: they follow the tools' timing (the
# processes agree on each, but one process may have seen more turns by then).
SCHEDULING_WORK = ("agent/rounds", "agent/slot_steps")


# -- which runs start jax.distributed --------------------------------------------------------------
@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, None),
        (
            {
                "JRL_COORDINATOR_ADDRESS": "10.0.0.1:1234",
                "JRL_NUM_PROCESSES": "4",
                "JRL_PROCESS_ID": "3",
            },
            Launch("env", "10.0.0.1:1234", 4, 3),
        ),
        (
            {"JAX_COORDINATOR_ADDRESS": "h:9", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"},
            Launch("env", "h:9", 2, 0),
        ),
        ({"JRL_COORDINATOR_ADDRESS": "h:9", "JRL_NUM_PROCESSES": "1", "JRL_PROCESS_ID": "0"}, None),
        ({"SLURM_NTASKS": "8", "SLURM_PROCID": "5"}, Launch("slurm")),
        ({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, None),
        (  # one task per node drives all its GPUs
            {"SLURM_NTASKS": "2", "SLURM_NNODES": "2", "CUDA_VISIBLE_DEVICES": "4,5,6,7"},
            Launch("slurm", local_device_ids=(0, 1, 2, 3)),
        ),
        (  # one task per GPU: JAX picks each task's GPU
            {"SLURM_NTASKS": "16", "SLURM_NNODES": "2", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
            Launch("slurm"),
        ),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, Launch("openmpi")),
        (
            {
                "OMPI_COMM_WORLD_SIZE": "2",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                "CUDA_VISIBLE_DEVICES": "0",
            },
            Launch("openmpi", local_device_ids=(0,)),
        ),
        ({"JRL_DISTRIBUTED": "auto"}, Launch("auto")),
        ({"JRL_DISTRIBUTED": "off", "SLURM_NTASKS": "8"}, None),
    ],
)
def test_launch_from_env(env, expected):
    assert launch_from_env(env) == expected


@pytest.mark.parametrize(
    "env, message",
    [
        ({"JRL_NUM_PROCESSES": "2", "JRL_PROCESS_ID": "0"}, "JRL_COORDINATOR_ADDRESS"),
        ({"JRL_COORDINATOR_ADDRESS": "h:1", "JRL_NUM_PROCESSES": "2"}, "JRL_PROCESS_ID"),
        (
            {"JRL_COORDINATOR_ADDRESS": "h:1", "JRL_NUM_PROCESSES": "two", "JRL_PROCESS_ID": "0"},
            "$JRL_NUM_PROCESSES='two' must be an integer",
        ),
        (
            {"JRL_COORDINATOR_ADDRESS": "h:1", "JRL_NUM_PROCESSES": "2", "JRL_PROCESS_ID": "2"},
            "$JRL_PROCESS_ID=2 must be in [0, $JRL_NUM_PROCESSES=2)",
        ),
    ],
)
def test_launch_from_env_rejects_incomplete_settings(env, message):
    with pytest.raises(ValueError) as err:
        launch_from_env(env)
    assert message in str(err.value)


def test_tracking_logs_nowhere_off_process_zero(tmp_path, capsys):
    names = ["console", "file", "tensorboard"]
    tracking = Tracking(names, project="p", experiment="e", run_dir=tmp_path, primary=False)
    tracking.log({"actor/pg_loss": 1.0}, step=1)
    tracking.log_generations([{"step": 1, "input": "q", "output": "a", "score": 1.0}], 1)
    tracking.close()
    assert list(tmp_path.iterdir()) == [] and capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="unknown logger"):  # names are still checked
        Tracking(["consol"], project="p", experiment="e", run_dir=tmp_path, primary=False)


# -- whole runs ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _overrides(
    run_dir: Path, scorer: Path, nnodes: int, per_node: int, steps: int = 2
) -> list[str]:
    """`steps` GRPO steps of the `:tiny` card (validated and saved at step 2), scored by `scorer`,
    on `nnodes` x `per_node` devices with one row per device per micro-batch."""
    return [
        "--config=configs/gsm8k_grpo.py:tiny",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={per_node}",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=2",
        "trainer.save_freq=2",
        "data.max_response_length=8",
        f"custom_reward_function.path={scorer}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        f"trainer.default_local_dir={run_dir}",
    ]


def _start(
    processes: int,
    run_dir: Path,
    args: list[str],
    module: str = "jrl.train",
    devices: int = DEVICES,
) -> list[subprocess.Popen]:
    """``python -m MODULE ARGS`` in `processes` processes of ``devices // processes`` CPU
    devices, joined by jax.distributed on a free local port; each one's standard output and error
    go to ``run_dir/{stdout,stderr}.<rank>``."""
    port = _free_port()
    run_dir.mkdir(parents=True)
    children = []
    for rank in range(processes):
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices // processes}",
            "JRL_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "JRL_NUM_PROCESSES": str(processes),
            "JRL_PROCESS_ID": str(rank),
            "SCORER_LOG": str(run_dir / "scored.txt"),
        }
        with open(run_dir / f"stdout.{rank}", "w") as out:
            with open(run_dir / f"stderr.{rank}", "w") as err:
                command = [sys.executable, "-m", module, *args]
                children.append(
                    subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err)
                )
    return children


def _kill(children: list[subprocess.Popen]) -> None:
    for child in children:
        if child.poll() is None:
            child.kill()
            child.wait()


def _launch(
    processes: int, run_dir: Path, args: list[str], timeout: float = 900, devices: int = DEVICES
) -> list[int | None]:
    """`_start` ``python -m jrl.train ARGS`` and wait: the exit codes (`_wait`); processes still
    running then are killed."""
    children = _start(processes, run_dir, args, devices=devices)
    try:
        return _wait(children, timeout)
    finally:
        _kill(children)


def _wait(children: list[subprocess.Popen], timeout: float, grace: float = 20) -> list[int | None]:
    """Exit codes once all `children` end, or `grace` seconds after one fails (the others then
    wait on it in a collective), or at `timeout`; None for those still running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(c.poll() is None for c in children):
        if any(c.poll() not in (None, 0) for c in children):
            deadline = min(deadline, time.monotonic() + grace)
        time.sleep(0.1)
    return [child.poll() for child in children]


def _train(processes: int, run_dir: Path, args: list[str], devices: int = DEVICES) -> None:
    """`_launch` a training run that must succeed, with output on process 0 only."""
    codes = _launch(processes, run_dir, args, devices=devices)
    errors = [(run_dir / f"stderr.{rank}").read_text()[-3000:] for rank in range(processes)]
    assert codes == [0] * processes, "\n".join(errors)
    assert "step:1 - " in (run_dir / "stdout.0").read_text()
    for rank in range(1, processes):
        assert (run_dir / f"stdout.{rank}").read_text() == "", rank


def _metrics(run_dir: Path, ignored: tuple = ()) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    skip = IGNORED + tuple(ignored)
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert row["step"] not in steps, f"step {row['step']} logged twice"
        steps[row["step"]] = {k: v for k, v in row["data"].items() if not k.startswith(skip)}
    return steps


def _assert_same_metrics(
    single: Path, multi: Path, steps: list[int], learning_step: int = 1, ignored: tuple = ()
) -> None:
    """Every metric but timings (and those starting with `ignored`) equal to float tolerance:
    the cross-process all-reduces (gloo) add in another order than the in-process ones. The
    model learns at `learning_step`."""
    expected, got = _metrics(single, ignored), _metrics(multi, ignored)
    assert sorted(got) == steps
    learning = expected[learning_step]
    assert learning["actor/grad_norm"] > 1e-3 and learning["critic/advantages/max"] > 0
    for step in steps:
        assert sorted(got[step]) == sorted(expected[step]), step
        for key, value in expected[step].items():
            close = math.isclose(got[step][key], value, rel_tol=1e-5, abs_tol=1e-6)
            assert close, (step, key, value, got[step][key])


@pytest.fixture(scope="module")
def single_run(tmp_path_factory) -> tuple[Path, Path]:
    """The reference: one process on `DEVICES` devices; returns (run folder, scorer file)."""
    root = tmp_path_factory.mktemp("distributed")
    scorer = root / "scorer.py"
    scorer.write_text(SCORER)
    run_dir = root / "single"
    assert len(jax.devices()) >= DEVICES
    train.main(_overrides(run_dir, scorer, 1, DEVICES))
    return run_dir, scorer


@pytest.fixture(scope="module")
def two_process_run(single_run) -> Path:
    run_dir = single_run[0].parent / "two"
    _train(2, run_dir, _overrides(run_dir, single_run[1], 2, DEVICES // 2))
    return run_dir


def test_two_processes_match_one(single_run, two_process_run):
    _assert_same_metrics(single_run[0], two_process_run, [1, 2])
    scorers = (two_process_run / "scored.txt").read_text().split()
    # 2 steps x 8 answers and 8 validation answers: each process scores its half
    assert len(scorers) == 24 and sorted(scorers.count(pid) for pid in set(scorers)) == [12, 12]
    saved = [p.name for p in two_process_run.iterdir() if p.name.startswith(("global", ".global"))]
    assert saved == ["global_step_2"]


def test_four_processes_match_one(single_run):
    run_dir = single_run[0].parent / "four"
    args = _overrides(run_dir, single_run[1], 4, DEVICES // 4, steps=1)
    _train(4, run_dir, [*args, "trainer.test_freq=-1"])  # step 1 only: no validation
    _assert_same_metrics(single_run[0], run_dir, [1])


def test_device_count_is_checked_against_jax(tmp_path):
    run_dir = tmp_path / "run"
    args = _overrides(run_dir, tmp_path / "unused.py", 1, DEVICES // 2)
    assert _launch(2, run_dir, args) == [2, 2]
    error = (run_dir / "stderr.0").read_text()
    assert "trainer.nnodes * trainer.n_gpus_per_node = 1*2 = 2 devices, but JAX sees 2 " in error
    assert "set trainer.nnodes=2 and trainer.n_gpus_per_node=2" in error


def _relative_change(after: list, before: list, reference: list) -> float:
    """How far the update ``after - before`` is from ``reference - before``, relative to the
    latter (Adam divides by sqrt(v), so tiny gradient differences move single entries)."""
    delta = np.concatenate([np.ravel(a - b) for a, b in zip(after, before, strict=True)])
    expected = np.concatenate([np.ravel(r - b) for r, b in zip(reference, before, strict=True)])
    return float(np.linalg.norm(delta - expected) / np.linalg.norm(expected))


def test_checkpoint_of_two_processes_restores_in_one(single_run, two_process_run):
    single_dir, scorer = single_run
    config, _ = load_config(
        [
            *_overrides(single_dir.parent / "restored", scorer, 1, 1),
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={two_process_run / 'global_step_2'}",
        ]
    )
    trainer = PPOTrainer.from_config(config)
    assert trainer.mesh.devices.size == 1
    state = trainer.actor.learner
    initial = jax.tree.leaves(jax.device_get(state.params))
    assert trainer.resume() == 2
    restored = jax.tree.leaves(jax.device_get(state.params))
    restored_opt = jax.tree.leaves(jax.device_get(state.opt_state))
    loader_state = trainer.train_loader.get_state()
    items = ["model", "optimizer", "extra"]
    extra = restore_role(single_dir / "global_step_2" / "actor", state, items)
    assert extra["global_step"] == 2 and extra["data_loader"] == loader_state
    assert _relative_change(restored, initial, jax.tree.leaves(jax.device_get(state.params))) < 1e-3
    for a, b in zip(restored_opt, jax.tree.leaves(jax.device_get(state.opt_state)), strict=True):
        assert np.linalg.norm(a - b) <= 1e-3 * np.linalg.norm(b) + 1e-12


def test_sigterm_to_one_sft_process_stops_both_after_the_same_step(tmp_path):
    """SIGTERM to process 1 of a 2-process SFT run: every process finishes the step, they agree
    to stop after it, and one complete checkpoint of that step is left (exit status 0 on both)."""
    run_dir = tmp_path / "sft"
    args = digits_sft_args(
        run_dir,
        "trainer.nnodes=2",
        f"trainer.n_gpus_per_node={DEVICES // 2}",
        "trainer.total_training_steps=1000",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console']",
    )
    children = _start(2, run_dir, args, module="jrl.sft")
    try:
        deadline = time.monotonic() + 600
        while "step:2 - " not in (run_dir / "stdout.0").read_text():
            assert all(c.poll() is None for c in children), (run_dir / "stderr.0").read_text()
            assert time.monotonic() < deadline, "timed out waiting for step 2"
            time.sleep(0.05)
        children[1].send_signal(signal.SIGTERM)
        codes = _wait(children, timeout=300)
    finally:
        _kill(children)
    errors = "\n".join((run_dir / f"stderr.{rank}").read_text()[-3000:] for rank in (0, 1))
    assert codes == [0, 0], errors
    out = (run_dir / "stdout.0").read_text()
    stopped = read_tracker(run_dir)
    assert stopped is not None and 2 <= stopped < 1000
    assert f"stopped after step {stopped} on a signal to another process" in out
    assert f"step:{stopped + 1} - " not in out
    assert problems(run_dir / f"global_step_{stopped}", ["actor"]) == []


def _lookup_overrides(run_dir: Path, nnodes: int, per_node: int) -> list[str]:
    """2 steps of configs/lookup_tool_grpo.py (multi-turn rows with tool calls), validated at
    step 2, on `nnodes` x `per_node` devices."""
    return [
        "--config=configs/lookup_tool_grpo.py",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={per_node}",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        "trainer.test_freq=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"trainer.default_local_dir={run_dir}",
    ]


UNEVEN_TOOLS = '''
import asyncio
from types import SimpleNamespace

import jax

from jrl.agent.server import ROW
from jrl.agent.tool_agent import ToolAgentLoop


class UnevenToolAgent(ToolAgentLoop):
    """jrl's tool agent whose later turns are asked after a delay that differs between rows
    and between processes, as tools that end at different times on different hosts."""

    async def run(self, sampling_params, **kwargs):
        server, asked = self.server_manager, []

        async def generate(*args, **kw):
            if asked:
                await asyncio.sleep(0.1 * jax.process_index() * (ROW.get() % 4))
            asked.append(True)
            return await server.generate(*args, **kw)

        self.server_manager = SimpleNamespace(generate=generate, engine=server.engine)
        return await super().run(sampling_params, **kwargs)
'''


def test_processes_whose_tools_end_at_different_times_still_match_one(tmp_path, monkeypatch):
    """The rows' loops are the lookup card's tool agent, but on process 1 a row's later turns
    are asked up to 0.3 s later than on process 0: the processes agree on every admission of
    the slots, so the run still equals one process's (without the agreement their programs
    differ and the run hangs or fails)."""
    (tmp_path / "uneven_tools.py").write_text(UNEVEN_TOOLS)
    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: tool_agent\n  _target_: uneven_tools.UnevenToolAgent\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(tmp_path))
    uneven = [
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
        "actor_rollout_ref.rollout.agent.scheduling=slots",
    ]
    train.main(_lookup_overrides(tmp_path / "single", 1, DEVICES) + uneven)
    _train(2, tmp_path / "two", _lookup_overrides(tmp_path / "two", 2, DEVICES // 2) + uneven)
    _assert_same_metrics(
        tmp_path / "single", tmp_path / "two", [1, 2], learning_step=2, ignored=SCHEDULING_WORK
    )


@pytest.mark.parametrize("scheduling", ["rounds", "slots"])
def test_two_processes_match_one_with_multi_turn_rows(tmp_path, scheduling):
    """In rounds every metric agrees; in slots, where the two processes agree on each
    admission, the same tokens and work: every metric but the count of admissions
    (`SCHEDULING_WORK`)."""
    later = [f"actor_rollout_ref.rollout.agent.scheduling={scheduling}"]
    train.main(_lookup_overrides(tmp_path / "single", 1, DEVICES) + later)
    _train(2, tmp_path / "two", _lookup_overrides(tmp_path / "two", 2, DEVICES // 2) + later)
    # Step 1 has no reward signal yet (no call in the task's format); step 2 has.
    ignored = SCHEDULING_WORK if scheduling == "slots" else ()
    _assert_same_metrics(
        tmp_path / "single", tmp_path / "two", [1, 2], learning_step=2, ignored=ignored
    )
    assert _metrics(tmp_path / "two")[1]["agent/tool_calls"] > 0
    slot_steps = _metrics(tmp_path / "two")[2]["agent/slot_steps"]
    assert (slot_steps > 0) == (scheduling == "slots")


def _split_overrides(run_dir: Path, nnodes: int, card: str = "digits_grpo.py") -> list[str]:
    """3 one-step-off GRPO steps of the digits card (or `card`), the trainer and the rollout on
    4 devices each, split over `nnodes` hosts."""
    per_node = 4 // nnodes
    return [
        f"--config=configs/{card}",
        "actor_rollout_ref.hybrid_engine=False",
        f"trainer.nnodes={nnodes}",
        f"rollout.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={per_node}",
        f"rollout.n_gpus_per_node={per_node}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={run_dir}",
    ]


# One-step-off runs the digits card's tiny mixture of experts with router replay R3: the
# rollout's routes move with its rows from its devices to the trainer's, across the processes.
ROUTER_REPLAY_KEYS = (
    "actor_rollout_ref.actor.router_replay.mode=R3",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
)


@pytest.mark.parametrize(
    ("card", "mode"),
    [
        ("digits_grpo.py", ROUTER_REPLAY_KEYS),
        ("digits_grpo.py", FULLY_ASYNC_KEYS),
        ("lookup_tool_grpo.py", FULLY_ASYNC_KEYS),
    ],
    ids=["one_step_off_router_replay", "fully_async", "fully_async_agent_loops"],
)
def test_split_runs_across_two_processes_match_one(tmp_path, monkeypatch, card, mode):
    """Each host gives 2 devices to the trainer and 2 to the rollout: every weight sync moves
    shards between the processes, and the rows and updates match a one-process run's (with
    agent loops, both processes run every row's loop and agree on the turns of each step; with
    router replay, both replay the rollout's routes as one process does)."""
    replays = mode == ROUTER_REPLAY_KEYS
    if replays:
        mode = (f"actor_rollout_ref.model.path={prepare_digits_moe()['model_path']}", *mode)
    single = tmp_path / "single"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(single / "metrics.jsonl"))
    train.main([*_split_overrides(single, 1, card), *mode])
    two = tmp_path / "two"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(two / "metrics.jsonl"))
    _train(2, two, [*_split_overrides(two, 2, card), *mode], devices=8)
    timed = ("sync/seconds", "overlap/", "rollouter/queued_groups")  # when the rows came
    got = _metrics(two, timed)
    assert got[2]["sync/bytes"] > 0 and got[2]["training/staleness_mean"] == 1
    if replays:
        assert got[2]["training/routed_tokens"] > 0
        assert got[2]["training/routes_differ_fraction"] == 0
    _assert_same_metrics(single, two, [1, 2, 3], ignored=timed)


def _filtered_overrides(run_dir: Path, nnodes: int) -> list[str]:
    """2 GRPO steps of the digits card with DAPO's group filter, on 4 devices over `nnodes`
    hosts."""
    return [
        "--config=configs/digits_grpo.py",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=seq_reward",
        f"trainer.nnodes={nnodes}",
        f"trainer.n_gpus_per_node={4 // nnodes}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={run_dir}",
    ]


def test_dynamic_sampling_across_two_processes_matches_one(tmp_path, monkeypatch):
    """Each process scores its share of every generation batch; both filter the same groups
    and draw the same further batches as one process does."""
    single = tmp_path / "single"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(single / "metrics.jsonl"))
    train.main(_filtered_overrides(single, 1))
    two = tmp_path / "two"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(two / "metrics.jsonl"))
    _train(2, two, _filtered_overrides(two, 2))
    got = _metrics(two)
    assert got[1]["train/num_gen_batches"] > 1  # further batches were drawn
    _assert_same_metrics(single, two, [1, 2])
