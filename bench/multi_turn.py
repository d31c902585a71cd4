"""Multi-turn rollout speed on the JAX sampler: keys and values kept between turns against one
re-prefill of the whole history per turn; row groups that decode while the others' tools run,
and slots that admit each turn as soon as it is asked, against rounds that wait for every row;
same run, same model, same rows.

The workload: SmolLM2-135M-Instruct (float32 on the CPU), `--rows` arithmetic questions
(`jrl.data.arithmetic`) in its chat template, `--turns` model turns of at most `--turn-tokens`
tokens each (sampled greedily; a turn also ends at the model's EOS), each followed by the same
tool turn of about `--observation-tokens` tokens (the chat template's delta of a tool message)
that takes `--tool-seconds` to answer, or with `--tool-spread` s between (1 - s) and (1 + s)
times that, drawn per row and turn (the same draws in every mode). A history grows by a turn
and an observation per round, so a full re-prefill runs ever longer prompts while the kept
cache prefills only the appended tokens.

Modes: `reprefill` (rounds, `keep_kv=False`), `kept` (rounds, the default
``rollout.agent.scheduling=rounds``), `kept_groups` (also ``rollout.agent.row_groups=--groups``)
and `slots` (``scheduling=slots``). Each first runs once to compile its programs,
then `--repeats` timed runs. Prints one JSON line per mode (model tokens per second, the
prefill's tokens, engine calls that started turns) and ratio lines: kept / reprefill,
kept_groups / kept, slots / kept and slots / reprefill tokens per second, and whether the
compared modes sampled the same tokens:

    python bench/multi_turn.py                   # a few minutes on 2 CPU cores
    python bench/multi_turn.py --tool-spread 0.9 --modes kept,slots
    python bench/multi_turn.py --rows 64 --turns 6 --tool-seconds 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from jrl.agent import AgentContext, AgentRollout, AgentSettings  # noqa: E402
from jrl.agent.chat import ChatTemplate  # noqa: E402
from jrl.agent.loop import AgentLoopBase, AgentLoopOutput, register  # noqa: E402
from jrl.agent.server import ROW, left_padded  # noqa: E402
from jrl.assets import prepare_smollm2  # noqa: E402
from jrl.batch import Batch  # noqa: E402
from jrl.data import arithmetic  # noqa: E402
from jrl.data.tokenizer import load_tokenizer  # noqa: E402
from jrl.models import from_pretrained  # noqa: E402
from jrl.rollout import JaxRollout, SamplingParams  # noqa: E402
from jrl.rollout.limits import ceil_pow2  # noqa: E402

OBSERVATION_WORDS = "The calculator checked the last step and found the same value again."


@register("bench_observations")
class ObservationLoop(AgentLoopBase):
    """`turns` model turns, each followed by the same tool turn (`observation` token ids)."""

    turns: int = 4
    turn_tokens: int = 32
    observation: list[int] = []
    tool_seconds: float = 0.0
    tool_spread: float = 0.0

    async def run(self, sampling_params, **row):
        prompt = list(row["raw_prompt_ids"])
        response, mask = [], []
        draws = np.random.default_rng(ROW.get()).uniform(-1, 1, self.turns)
        for turn in range(self.turns):
            out = await self.server_manager.generate(
                "bench",
                prompt_ids=prompt + response,
                sampling_params=sampling_params,
                max_tokens=self.turn_tokens,
            )
            # the tool's latency
            await asyncio.sleep(self.tool_seconds * (1 + self.tool_spread * draws[turn]))
            response += out.token_ids + self.observation
            mask += [1] * len(out.token_ids) + [0] * len(self.observation)
        return AgentLoopOutput(prompt, response, mask, None, num_turns=2 * self.turns + 1)


def observation_ids(template: ChatTemplate, tokens: int) -> list[int]:
    """The tool turn's delta, its message about `tokens` tokens long."""
    words = OBSERVATION_WORDS.split()
    text = " ".join(words[i % len(words)] for i in range(tokens))
    return template.turn_delta([{"role": "tool", "content": text}])


def prompts(tokenizer, template: ChatTemplate, rows: int) -> Batch:
    questions = arithmetic.make_rows(rows, seed=0, split="test")
    ids = [template.prompt_ids(row["prompt"]) for row in questions]
    batch = left_padded(ids, ceil_pow2(max(map(len, ids))), tokenizer.pad_token_id)
    raw = np.empty(rows, object)
    raw[:] = ids
    names = np.asarray(["bench_observations"] * rows, object)
    return batch.union(Batch(meta={"raw_prompt_ids": raw, "agent_name": names}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--observation-tokens", type=int, default=48)
    parser.add_argument("--tool-seconds", type=float, default=1.0)
    parser.add_argument("--tool-spread", type=float, default=0.0)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default="reprefill,kept,kept_groups,slots")
    args = parser.parse_args()

    folder = prepare_smollm2()
    tokenizer = load_tokenizer(str(folder))
    template = ChatTemplate.of(tokenizer, {}, [])
    ObservationLoop.turns, ObservationLoop.turn_tokens = args.turns, args.turn_tokens
    ObservationLoop.tool_seconds, ObservationLoop.tool_spread = args.tool_seconds, args.tool_spread
    ObservationLoop.observation = observation_ids(template, args.observation_tokens)
    batch = prompts(tokenizer, template, args.rows)
    response = ceil_pow2(args.turns * (args.turn_tokens + len(ObservationLoop.observation)))
    eos = tokenizer.eos_token_id
    sampling = SamplingParams(
        max_new_tokens=response, eos_token_ids=(eos,), pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )  # fmt: skip
    model = from_pretrained(str(folder))
    results = {}
    modes = (
        ("reprefill", False, "rounds", 1),
        ("kept", True, "rounds", 1),
        ("kept_groups", True, "rounds", args.groups),
        ("slots", True, "slots", 1),
    )
    chosen = args.modes.split(",")
    for mode, keep, scheduling, groups in (m for m in modes if m[0] in chosen):
        settings = AgentSettings(scheduling=scheduling, row_groups=groups)
        context = AgentContext.build(settings, tokenizer=tokenizer)
        engine = JaxRollout(model, response_length=response, pad_token_id=tokenizer.pad_token_id,
                            eos_token_ids=eos)  # fmt: skip
        agent = AgentRollout(engine, context, {}, keep_kv=keep)
        agent.generate(batch, sampling, jax.random.key(1))  # compiles
        seconds = []
        for repeat in range(args.repeats):
            start = time.perf_counter()
            out = agent.generate(batch, sampling, jax.random.key(2 + repeat))
            responses = np.asarray(out["responses"])
            seconds.append(time.perf_counter() - start)
        model_tokens = int(np.asarray(out["response_mask"]).sum())
        stats = agent.stats
        results[mode] = responses
        line = {
            "bench": "multi_turn",
            "mode": mode,
            "rows": args.rows,
            "turns": args.turns,
            "tool_seconds": args.tool_seconds,
            "tool_spread": args.tool_spread,
            "scheduling": scheduling,
            "row_groups": groups,
            "rounds": stats["agent/rounds"],
            "model_tokens": model_tokens,
            "prefill_tokens": stats["agent/prefill_tokens"],
            "prefill_tokens_if_kv_kept": stats["agent/prefill_tokens_if_kv_kept"],
            "seconds": statistics.median(seconds),
            "tokens_per_s": model_tokens / statistics.median(seconds),
            "device": jax.devices()[0].platform,
        }
        results[mode + "_line"] = line
        print(json.dumps(line), flush=True)
    pairs = (("kept", "reprefill"), ("kept_groups", "kept"), ("slots", "kept"))
    for ours, theirs in (*pairs, ("slots", "reprefill")):
        if ours not in chosen or theirs not in chosen:
            continue
        a, b = results[ours + "_line"], results[theirs + "_line"]
        ratio = {
            "bench": "multi_turn",
            "ratio": f"{ours} / {theirs} tokens_per_s",
            "value": a["tokens_per_s"] / b["tokens_per_s"],
            "prefill_tokens_ratio": b["prefill_tokens"] / a["prefill_tokens"],
            "same_tokens": bool(np.array_equal(results[ours], results[theirs])),
        }
        print(json.dumps(ratio), flush=True)


if __name__ == "__main__":
    main()
