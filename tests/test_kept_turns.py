"""Multi-turn rounds on the JAX sampler keep each row's keys and values (`jrl.rollout.kept_turns`):
a later round prefills only the tokens its rows appended, and samples exactly what a full
re-prefill of every history samples. The agent loop here is a user loop that appends fixed
observation tokens after each model turn (a random model writes no tool calls); the engine,
the server and the cache are jrl's real ones."""

from __future__ import annotations

import asyncio
import time

import jax
import numpy as np
import pytest
from fake_vllm import TINY_PROMPTS, prompt_batch
from helpers import TINY_LLAMA
from jax.sharding import Mesh

from jrl.agent import AgentContext, AgentRollout, AgentSettings
from jrl.agent.loop import AgentLoopBase, AgentLoopOutput, register
from jrl.agent.server import ROW
from jrl.batch import Batch
from jrl.models import init_random
from jrl.parallel import MESH_AXES
from jrl.rollout import EngineLimits, JaxRollout, SamplingParams

TURNS, TURN_TOKENS = 3, 6
SLOW_TOOL_POLLS = 500  # 5 s: longer than the other rows' turns take, compilation included


@register("observations_after_each_turn")
class ObservationLoop(AgentLoopBase):
    """Three model turns of at most six tokens, each followed by three observation tokens;
    with ``extra_info.rewrite`` the third turn's history has its first response token changed
    (a loop that re-tokenised its history: the engine may take over only what still agrees)."""

    async def run(self, sampling_params, **row):
        prompt = list(row["raw_prompt_ids"])
        response, mask, log_probs = [], [], []
        for turn in range(TURNS):
            if turn == 2 and row["extra_info"].get("rewrite"):
                response[0] = (response[0] + 1) % TINY_LLAMA.vocab_size
            out = await self.server_manager.generate(
                "request",
                prompt_ids=prompt + response,
                sampling_params=sampling_params,
                max_tokens=TURN_TOKENS,
            )
            if row["extra_info"].get("tool_polls"):
                await self.tool(row["extra_info"]["tool_polls"])
            if turn == 0 and ROW.get() == 0 and row["extra_info"].get("first_row_waits"):
                await self.tool(row["extra_info"]["first_row_waits"])
            observation = [20 + turn, 30 + len(response) % 7, 40]
            response += out.token_ids + observation
            mask += [1] * len(out.token_ids) + [0] * len(observation)
            log_probs += out.log_probs + [0.0] * len(observation)
        self.server_manager.engine.ended[ROW.get()] = time.perf_counter()
        return AgentLoopOutput(prompt, response, mask, log_probs, num_turns=2 * TURNS + 1)

    async def tool(self, polls: int) -> None:
        """A slow tool (`polls` x 10 ms); notes on the engine when it ran."""
        start = time.perf_counter()
        await asyncio.sleep(0.01 * polls)
        self.server_manager.engine.tool_spans.append((start, time.perf_counter()))


class WatchedEngine(JaxRollout):
    """jrl's engine, noting when each call ran; a call takes at least 50 ms (as on a device
    with a real model), so that a tool that starts as a call starts overlaps it for sure."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.call_spans, self.tool_spans, self.ended = [], [], {}

    def generate_turn(self, *args, **kwargs):
        start = time.perf_counter()
        out = super().generate_turn(*args, **kwargs)
        time.sleep(max(0.0, 0.05 - (time.perf_counter() - start)))
        self.call_spans.append((start, time.perf_counter()))
        return out

    def sampled_during_tools(self) -> int:
        """How many (call, tool) pairs ran at the same time."""
        return sum(c0 < t1 and t0 < c1 for c0, c1 in self.call_spans for t0, t1 in self.tool_spans)


def prompts(rewrite: bool = False, tool_polls: int = 0, first_row_waits: int = 0) -> Batch:
    ids, mask = TINY_PROMPTS
    raw = np.empty(len(ids), object)
    raw[:] = [[t for t, m in zip(r, k, strict=True) if m] for r, k in zip(ids, mask, strict=True)]
    extra = np.empty(len(ids), object)
    fields = {"rewrite": rewrite, "tool_polls": tool_polls, "first_row_waits": first_row_waits}
    extra[:] = [fields] * len(ids)
    loops = np.asarray(["observations_after_each_turn"] * len(ids), object)
    meta = {"raw_prompt_ids": raw, "extra_info": extra, "agent_name": loops}
    return prompt_batch(ids, mask).union(Batch(meta=meta))


def rollout(keep_kv: bool, devices: int = 1, tensor: int = 1, rewrite: bool = False,
            scheduling: str = "slots", groups: int = 1, tool_polls: int = 0,
            first_row_waits: int = 0, **limits):  # fmt: skip
    mesh = Mesh(np.asarray(jax.devices()[:devices]).reshape(devices, 1, 1, 1), MESH_AXES)
    engine = WatchedEngine(init_random(TINY_LLAMA, seed=3), response_length=32, pad_token_id=0,
                           eos_token_ids=1, mesh=mesh, tensor_parallel_size=tensor,
                           limits=EngineLimits(**limits))  # fmt: skip
    settings = AgentSettings(scheduling=scheduling, row_groups=groups)
    agent = AgentRollout(engine, AgentContext.build(settings, tokenizer=None), {},
                         keep_kv=keep_kv)  # fmt: skip
    sampling = SamplingParams(max_new_tokens=32, eos_token_ids=(1,), pad_token_id=0, n=2,
                              calculate_log_probs=True)  # fmt: skip
    batch = prompts(rewrite, tool_polls, first_row_waits)
    out = agent.generate(batch, sampling, jax.random.key(5))
    stats = {**agent.stats, "sampled_during_tools": engine.sampled_during_tools()}
    return out, {**stats, "kept_streams": engine.kept_streams, "engine": engine}


@pytest.fixture(scope="module")
def reprefilled():
    """Every round prefills every history whole."""
    return rollout(keep_kv=False)


def assert_same_samples(ours: Batch, theirs: Batch) -> None:
    for name in ("responses", "response_mask", "attention_mask", "input_ids"):
        np.testing.assert_array_equal(np.asarray(ours[name]), np.asarray(theirs[name]), name)
    np.testing.assert_allclose(
        np.asarray(ours["rollout_log_probs"]), np.asarray(theirs["rollout_log_probs"]), atol=1e-5
    )


@pytest.mark.parametrize("scheduling", ["slots", "rounds"])
@pytest.mark.parametrize(("devices", "tensor"), [(1, 1), (4, 2)])
def test_kept_keys_and_values_sample_what_a_full_reprefill_samples(
    reprefilled, devices, tensor, scheduling
):
    """One device, and two replicas of a 2-way tensor-parallel model (in rounds, rows move
    between replicas from round to round). Later turns prefill each row's new tokens only: its
    last sampled token and the three observation tokens (in slots, fewer where round 0 sampled
    past a turn's limit: the row's slot holds those tokens' keys and values too)."""
    full, full_stats = reprefilled
    kept, stats = rollout(keep_kv=True, devices=devices, tensor=tensor, scheduling=scheduling)
    assert_same_samples(kept, full)
    assert full_stats["agent/rounds"] == TURNS
    assert full_stats["agent/prefill_tokens"] > 2.5 * stats["agent/prefill_tokens"]
    if scheduling == "rounds":
        assert stats["agent/rounds"] == TURNS
        assert stats["agent/prefill_tokens"] == stats["agent/prefill_tokens_if_kv_kept"]
    else:
        assert stats["agent/prefill_tokens"] <= stats["agent/prefill_tokens_if_kv_kept"]


def test_rows_that_rewrote_their_history_take_over_only_the_agreeing_prefix(reprefilled):
    """The third round's histories differ from the second round's contexts just after the
    prompt: that round prefills them (almost) whole, and samples what a full re-prefill does."""
    full, full_stats = rollout(keep_kv=False, rewrite=True)
    kept, stats = rollout(keep_kv=True, rewrite=True)
    assert_same_samples(kept, full)
    assert not np.array_equal(
        np.asarray(full["responses"]), np.asarray(reprefilled[0]["responses"])
    )
    no_rewrite = rollout(keep_kv=True)[1]["agent/prefill_tokens"]
    assert no_rewrite < stats["agent/prefill_tokens"] < full_stats["agent/prefill_tokens"]


def test_when_the_slots_cannot_hold_every_row_rounds_prefill_whole(reprefilled):
    full, full_stats = reprefilled
    kept, stats = rollout(keep_kv=True, scheduling="rounds", max_num_seqs=2)
    assert_same_samples(kept, full)
    assert stats["agent/prefill_tokens"] == full_stats["agent/prefill_tokens"]


def test_when_the_slots_cannot_hold_every_row_rows_wait_for_a_freed_slot(reprefilled):
    """Two slots, four trajectories: two rows take the slots, the other two wait until a
    trajectory ends and frees one; each row's later turns still prefill only what it
    appended."""
    full, full_stats = reprefilled
    kept, stats = rollout(keep_kv=True, max_num_seqs=2)
    assert_same_samples(kept, full)
    ideal, prefilled = stats["agent/prefill_tokens_if_kv_kept"], stats["agent/prefill_tokens"]
    assert ideal < prefilled < full_stats["agent/prefill_tokens"]


def test_a_row_back_from_its_tool_joins_the_others_decoding(reprefilled):
    """Row 0's first tool call takes a long time: in slots, the other rows run all their turns
    meanwhile (each turn admitted as soon as it is asked), and row 0's turns then run alone;
    in rounds, every round waits for it. The samples are the same either way."""
    ours, stats = rollout(keep_kv=True, first_row_waits=SLOW_TOOL_POLLS)
    assert_same_samples(ours, reprefilled[0])
    engine = stats["engine"]
    ((_, tool_end),) = engine.tool_spans
    assert max(engine.ended[row] for row in (1, 2, 3)) < tool_end < engine.ended[0]


def test_row_groups_decode_while_the_other_groups_tools_run(reprefilled):
    """Two groups of rows take later rounds in turn: one group's turns sample (in a thread)
    while the other group's slow tool runs. Samples follow the groups' own keys, so the same
    call gives the same rows whatever the timing, with or without kept keys and values."""
    ours, stats = rollout(keep_kv=True, scheduling="rounds", groups=2, tool_polls=10)
    again, _ = rollout(keep_kv=True, scheduling="rounds", groups=2, tool_polls=3)
    full, full_stats = rollout(keep_kv=False, scheduling="rounds", groups=2)
    assert_same_samples(ours, again)
    assert_same_samples(ours, full)
    assert stats["agent/rounds"] == 1 + 2 * (TURNS - 1)
    assert stats["sampled_during_tools"] > 0
    assert stats["agent/prefill_tokens"] < full_stats["agent/prefill_tokens"]
    assert stats["kept_streams"] == (1, 2)  # the groups' own; round 0's went once both read it
    _, alone = rollout(keep_kv=True, scheduling="rounds", tool_polls=10)
    assert alone["sampled_during_tools"] == 0 and alone["kept_streams"] == (0,)


def test_a_continuing_call_samples_each_row_once():
    engine = JaxRollout(init_random(TINY_LLAMA, seed=3), response_length=8, pad_token_id=0,
                        eos_token_ids=1)  # fmt: skip
    sampling = SamplingParams(max_new_tokens=8, eos_token_ids=(1,), pad_token_id=0, n=2)
    with pytest.raises(ValueError, match="sampling.n=2 must be 1"):
        engine.generate_turn(prompts(), sampling, jax.random.key(0), [0, 1, 2, 3])
