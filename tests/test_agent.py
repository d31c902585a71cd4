"""Agent loops (`jrl.agent`): ``single_turn_agent`` is today's rollout exactly; ``tool_agent``'s
turns, masks and token deltas; tools, interactions and the containment of user code.

A random model never writes a tool call, so the tool-loop tests drive `AgentRollout` with
`ScriptedEngine`, a stand-in for a model that answers each turn with given text; everything
else (server, loops, tools, chat template, SmolLM2's real tokenizer) is jrl's real code."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
import time

import jax
import numpy as np
import pytest
from fake_vllm import TINY_PROMPTS, prompt_batch
from helpers import TINY_LLAMA

from jrl.agent import AgentContext, AgentRollout, AgentSettings, BaseTool, ToolResponse
from jrl.agent.parser import parse_hermes
from jrl.agent.settings import TraceSettings
from jrl.agent.tool_agent import truncate_text
from jrl.agent.tools.calculator import evaluate
from jrl.agent.tools.sandbox import run_python
from jrl.agent.trace import NO_TRACES, RolloutTracer
from jrl.batch import Batch
from jrl.models import init_random
from jrl.rollout import JaxRollout, SamplingParams
from jrl.trainer.io.tracking import mlflow_store_uri


def with_prompt_ids(prompts: Batch) -> Batch:
    ids, mask = np.asarray(prompts["input_ids"]), np.asarray(prompts["attention_mask"])
    raw = [row[m.astype(bool)].tolist() for row, m in zip(ids, mask, strict=True)]
    return prompts.union(Batch(meta={"raw_prompt_ids": object_column(raw)}))


def test_single_turn_agent_is_todays_rollout_exactly():
    engine = JaxRollout(init_random(TINY_LLAMA, seed=3), response_length=8, pad_token_id=0,
                        eos_token_ids=1)  # fmt: skip
    sampling = SamplingParams(max_new_tokens=8, eos_token_ids=(1,), pad_token_id=0, n=2,
                              calculate_log_probs=True)  # fmt: skip
    prompts = with_prompt_ids(prompt_batch(*TINY_PROMPTS))
    key = jax.random.key(5)
    today = engine.generate(prompts, sampling, key).to_numpy()
    context = AgentContext.build(AgentSettings(), tokenizer=None)
    agent = AgentRollout(engine, context, {})
    ours = agent.generate(prompts, sampling, key)
    assert set(today.tensors) == set(ours.tensors)
    for name, value in today.tensors.items():
        np.testing.assert_array_equal(np.asarray(ours[name]), value, err_msg=name)
    assert agent.stats["agent/rounds"] == 1
    assert ours.meta["num_turns"].tolist() == [2] * len(ours)


# -- the tool loop, driven by scripted turns ------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from jrl.assets import smollm2_folder
    from jrl.data.tokenizer import load_tokenizer

    return load_tokenizer(str(smollm2_folder()))


class ScriptedEngine:
    """Stand-in for a model: row r's k-th turn is `script[r][k]` tokenised plus EOS (cut at the
    call's max_new_tokens); it records each call's prompts."""

    def __init__(self, tokenizer, script, response_length=160):
        self.tokenizer, self.script = tokenizer, script
        self.response_length, self.pad_token_id = response_length, tokenizer.pad_token_id
        self.eos_token_ids = (tokenizer.eos_token_id,)
        self.stats, self.calls, self.turn = {}, [], {}

    def generate(self, prompts, sampling, key):
        ids = np.asarray(prompts["input_ids"]).repeat(sampling.n, 0)
        mask = np.asarray(prompts["attention_mask"]).repeat(sampling.n, 0).astype(bool)
        contexts = [row[m].tolist() for row, m in zip(ids, mask, strict=True)]
        self.calls.append(contexts)
        responses = np.full((len(ids), self.response_length), self.pad_token_id, np.int32)
        response_mask = np.zeros_like(responses)
        for i, context in enumerate(contexts):
            row = self.row_of(context)
            k = self.turn.get(row, 0)
            self.turn[row] = k + 1
            text = self.script[row][min(k, len(self.script[row]) - 1)]
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            tokens = [*tokens, self.eos_token_ids[0]][: sampling.max_new_tokens]
            responses[i, : len(tokens)] = tokens
            response_mask[i, : len(tokens)] = 1
        return Batch({"responses": responses, "response_mask": response_mask})

    def row_of(self, context):
        for row, first in enumerate(self.first_prompts):
            if context[: len(first)] == first:
                return row
        raise AssertionError("a turn of an unknown row")


CALL = '<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def tool_call(name: str, **arguments) -> str:
    import json

    return CALL.format(name=name, arguments=json.dumps(arguments))


def object_column(values):
    column = np.empty(len(values), object)
    column[:] = values
    return column


def run_tool_agent(
    tokenizer, questions, script, tools=(), settings=None, extra_infos=None, tracer=NO_TRACES
):
    """`AgentRollout` over a `ScriptedEngine`, one row per question (with its ``extra_info``),
    ``tool_agent`` unless `settings` say otherwise."""
    settings = settings or AgentSettings(default_agent_loop="tool_agent")
    context = AgentContext.build(settings, tokenizer, tracer=tracer)
    context.tools.update({tool.name: tool for tool in tools})
    engine = ScriptedEngine(tokenizer, script)
    messages = [[{"role": "user", "content": q}] for q in questions]
    meta = {"raw_prompt": object_column(messages)}
    if extra_infos is not None:
        meta["extra_info"] = object_column(extra_infos)
    rows = len(questions)
    prompts = Batch(
        {
            "input_ids": np.ones((rows, 4), np.int32),
            "attention_mask": np.ones((rows, 4), np.int32),
            "position_ids": np.tile(np.arange(4, dtype=np.int32), (rows, 1)),
        },
        meta,
    )
    engine.first_prompts = [context.chat.prompt_ids(context.chat.show_tools(m)) for m in messages]
    sampling = SamplingParams(
        max_new_tokens=engine.response_length,
        eos_token_ids=engine.eos_token_ids,
        pad_token_id=engine.pad_token_id,
    )
    agent = AgentRollout(engine, context, {})
    return agent, engine, agent.generate(prompts, sampling, jax.random.key(0))


def calculator_settings(**changes):
    return AgentSettings(default_agent_loop="tool_agent", **changes)


def test_tool_agent_keeps_sampled_tokens_and_masks_the_tool_turn(tokenizer, tmp_path):
    config = tmp_path / "tools.yaml"
    config.write_text(
        "tools:\n  - class_name: jrl.agent.tools.calculator.CalculatorTool\n"
        "    config: {type: native}\n"
    )
    settings = calculator_settings(tool_config_path=str(config))
    first = tool_call("calculator", expression="17 * 23")
    script = [[first, "It is 391."], ["I know: 4."]]
    agent, engine, out = run_tool_agent(tokenizer, ["17*23?", "2+2?"], script, settings=settings)
    assert len(engine.calls) == 2 and len(engine.calls[1]) == 1  # round 2: only row 0 waits
    responses, mask = np.asarray(out["responses"]), np.asarray(out["response_mask"])
    present = np.asarray(out["attention_mask"])[:, -responses.shape[1] :]
    eos = tokenizer.eos_token_id
    turn1 = tokenizer(first, add_special_tokens=False)["input_ids"] + [eos]
    turn2 = tokenizer("It is 391.", add_special_tokens=False)["input_ids"] + [eos]
    n = int(present[0].sum())
    row = responses[0, :n].tolist()
    assert row[: len(turn1)] == turn1 and row[-len(turn2) :] == turn2  # sampled ids, untouched
    delta = row[len(turn1) : n - len(turn2)]
    assert mask[0, :n].tolist() == [1] * len(turn1) + [0] * len(delta) + [1] * len(turn2)
    assert tokenizer.decode(delta) == "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"
    # the second call's context is the first prompt, turn 1 and the delta: nothing re-tokenised
    assert engine.calls[1][0] == engine.first_prompts[0] + turn1 + delta
    assert out.meta["num_turns"].tolist() == [4, 2]
    stats = agent.stats
    assert stats["agent/tool_calls"] == 1 and stats["agent/tool_errors"] == 0
    assert stats["agent/tokenization_mismatch"] == 0  # strict: equals the whole chat at once
    # Round 2 prefills row 0's whole context again; a kept cache would need turn 1's EOS and the
    # delta only.
    first_round = sum(map(len, engine.calls[0]))
    assert stats["agent/prefill_tokens"] == first_round + len(engine.calls[1][0])
    assert stats["agent/prefill_tokens_if_kv_kept"] == first_round + 1 + len(delta)


def test_calls_are_found_where_the_tokenizer_marks_their_tags_special(tokenizer, tmp_path):
    """verl parses the model's turn with special tokens kept: a tokenizer whose call tags are
    special tokens still has its calls found (and a turn without a call at the turn limit is
    no stop by the limit)."""
    config = tmp_path / "tools.yaml"
    config.write_text(
        "tools:\n  - class_name: jrl.agent.tools.calculator.CalculatorTool\n"
        "    config: {type: native}\n"
    )
    special = copy.deepcopy(tokenizer)
    special.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    settings = calculator_settings(tool_config_path=str(config), max_assistant_turns=1)
    script = [[tool_call("calculator", expression="17 * 23")], ["4."]]
    agent, _, _ = run_tool_agent(special, ["17*23?", "2+2?"], script, settings=settings)
    assert agent.stats["agent/tool_parse_errors"] == 0
    assert agent.stats["agent/turn_limit_ratio"] == 0.5  # row 0 had a call to make, row 1 not
    settings = calculator_settings(tool_config_path=str(config))
    agent, _, _ = run_tool_agent(special, ["17*23?"], [[script[0][0], "391."]], settings=settings)
    assert agent.stats["agent/tool_calls"] == 1 and agent.stats["agent/tool_errors"] == 0


def test_traced_trajectories_hold_each_turn_and_tool_call(tokenizer, tmp_path, monkeypatch):
    """``rollout.trace``: with ``max_samples_per_step_per_worker=1`` one of the three prompts
    is traced; its trace holds the loop's run, both model turns and the calculator's call, with
    their decoded text."""
    import mlflow

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = tmp_path / "tools.yaml"
    config.write_text(
        "tools:\n  - class_name: jrl.agent.tools.calculator.CalculatorTool\n"
        "    config: {type: native}\n"
    )
    settings = calculator_settings(tool_config_path=str(config))
    script = [[tool_call("calculator", expression=f"{a} * 23"), "Done."] for a in (17, 18, 19)]
    questions, extra = ["17*23?", "18*23?", "19*23?"], [{"index": 10 + i} for i in range(3)]

    def traces(limit):
        store = tmp_path / f"run{limit}"
        trace = TraceSettings("mlflow", token2text=True, max_samples_per_step_per_worker=limit)
        tracer = RolloutTracer(trace, tokenizer, project="p", tracking_uri=mlflow_store_uri(store))
        run_tool_agent(tokenizer, questions, script, settings=settings, extra_infos=extra,
                       tracer=tracer)  # fmt: skip
        client = mlflow.MlflowClient((store / "mlruns").resolve().as_uri())
        experiment = client.get_experiment_by_name("p").experiment_id
        return client.search_traces(locations=[experiment], max_results=100)

    assert sorted(t.info.tags["sample_index"] for t in traces(None)) == ["10", "11", "12"]
    (trace,) = traces(1)
    row = int(trace.info.tags["sample_index"]) - 10
    names = [span.name for span in trace.data.spans]
    assert names[:2] == ["agent_loop", "ToolAgentLoop.run"]
    assert names.count("generate") == 2 and "CalculatorTool.execute" in names
    call = next(span for span in trace.data.spans if span.name == "CalculatorTool.execute")
    assert call.inputs["parameters"] == {"expression": f"{17 + row} * 23"}
    assert call.outputs["response"] == str((17 + row) * 23)
    run = trace.data.spans[1]
    assert (
        f"{17 + row}*23?" in run.outputs["prompt_text"] and "Done." in run.outputs["response_text"]
    )
    assert run.outputs["response_mask"].count(0) > 0  # the tool turn, masked


def test_tool_schemas_reach_the_prompt(tokenizer):
    from jrl.agent.chat import ChatTemplate
    from jrl.agent.tools.calculator import SCHEMA

    chat = ChatTemplate.of(tokenizer, {}, [SCHEMA])
    text = tokenizer.decode(chat.prompt_ids(chat.show_tools([{"role": "user", "content": "hi"}])))
    assert '"name": "calculator"' in text and "<tool_call>" in text  # SmolLM2 ignores tools=


# A ChatML template written for this test with the property of Qwen3's that matters here: the
# assistant turn after the last user turn gets an empty think block only while it is the last.
THINKS_WHEN_LAST = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last_user and loop.last -%}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def test_a_turn_follows_the_models_eos_where_the_template_rewrites_the_last_turn(tokenizer):
    """Qwen3's template writes the last assistant turn with an empty think block and the same
    turn without it once a tool turn follows: the delta still starts after the model's EOS."""
    from jrl.agent.chat import ChatTemplate

    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = THINKS_WHEN_LAST
    chat = ChatTemplate.of(thinking, {}, [])
    delta = thinking.decode(chat.turn_delta([{"role": "tool", "content": "42"}]))
    expected = "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
    assert delta == expected + "<|im_start|>assistant\n"
    plain = ChatTemplate.of(tokenizer, {}, [])  # SmolLM2's own template: the same delta
    assert tokenizer.decode(plain.turn_delta([{"role": "user", "content": "42"}])).startswith(
        "\n<|im_start|>user\n42<|im_end|>"
    )


class Misbehaving(BaseTool):
    """A tool that fails in the way its name says."""

    def __init__(self, name, how):
        schema = {"type": "function", "function": {"name": name, "description": how}}
        super().__init__({}, schema)
        self.how = how

    async def execute(self, instance_id, parameters, **kwargs):
        if self.how == "raise":
            raise RuntimeError("the tool broke")
        if self.how == "hang":
            time.sleep(30)  # blocks its thread: only the gate's timeout gets the loop past it
        if self.how == "huge":
            return ToolResponse(text="x" * 100_000), 0.0, {}
        if self.how == "nonsense":
            return 42, float("nan"), {}
        return ToolResponse(text="fine"), 0.0, {}


def test_misbehaving_tools_become_error_turns_and_counted_metrics(tokenizer):
    kinds = ("raise", "hang", "huge", "nonsense")
    tools = [Misbehaving(f"t_{how}", how) for how in kinds]
    script = [[tool_call(f"t_{how}"), "done"] for how in kinds]
    settings = calculator_settings(tool_timeout=1.0)
    start = time.perf_counter()
    agent, engine, out = run_tool_agent(tokenizer, list(kinds), script, tools, settings)
    assert time.perf_counter() - start < 15  # the hung call held the rollout 1 s, not 30
    stats = agent.stats
    assert stats["agent/tool_calls"] == 4
    assert stats["agent/tool_errors"] == 3  # raise, hang, nonsense
    assert stats["agent/tool_timeouts"] == 1
    assert stats["agent/tool_truncated"] == 1  # huge, cut to 256 characters
    texts = [tokenizer.decode(np.asarray(out["responses"])[i]) for i in range(4)]
    assert "Error when executing tool: the tool broke<|im_end|>" in texts[0]  # verl's text
    assert "no answer within 1 s" in texts[1]
    assert "(truncated)" in texts[2]
    assert "it answered 42, not text" in texts[3]
    assert all("done" in t for t in texts)  # every row went on to its next turn


def test_a_call_to_an_unknown_tool_reads_as_verls_error(tokenizer):
    script = [[tool_call("nope"), "done"]]
    agent, _, out = run_tool_agent(tokenizer, ["?"], script, settings=calculator_settings())
    text = tokenizer.decode(np.asarray(out["responses"])[0])
    assert "<|im_start|>tool\nError when executing tool: 'nope'<|im_end|>" in text
    assert agent.stats["agent/tool_errors"] == 1


class Recording(BaseTool):
    """Keeps the keyword arguments of its create and execute calls."""

    def __init__(self):
        super().__init__({}, {"type": "function", "function": {"name": "rec", "description": "r"}})
        self.seen: list[dict] = []

    async def create(self, instance_id=None, **kwargs):
        self.seen.append(kwargs)
        return await super().create(instance_id)

    async def execute(self, instance_id, parameters, **kwargs):
        self.seen.append(kwargs)
        return ToolResponse(text="ok"), 0.0, {}


def test_a_tool_gets_create_kwargs_and_nothing_more_from_its_row(tokenizer):
    """verl creates the instance with the row's ``create_kwargs`` and executes it with the
    call's arguments only (no ``execute_kwargs``)."""
    tool = Recording()
    own = {"rec": {"create_kwargs": {"secret": 7}, "execute_kwargs": {"lang": "py"}}}
    script = [[tool_call("rec"), "done"]]
    run_tool_agent(tokenizer, ["?"], script, [tool], extra_infos=[{"tools_kwargs": own}])
    assert tool.seen == [{"create_kwargs": {"secret": 7}}, {}]


def test_tool_schemas_are_rendered_as_verls_pydantic_dump():
    """verl validates a tool's schema (OpenAIFunctionToolSchema) and renders its dump without
    unset fields: keys it does not know go, and one it requires must be there."""
    from jrl.agent.tools.base import check_tool_schema

    given = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "array", "item": {"type": "string"}, "minimum": 1},
                    "mode": {"enum": ["a", "b"], "type": "string", "description": None},
                },
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    }
    assert check_tool_schema(given, "t") == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "array"},
                    "mode": {"type": "string", "enum": ["a", "b"]},
                },
                "required": ["query"],
            },
        },
    }
    bare = {"type": "function", "function": {"name": "search", "description": "Searches."}}
    assert check_tool_schema(bare, "t") == bare  # no parameters given: none rendered
    del given["function"]["description"]
    with pytest.raises(ValueError, match="t: a tool schema needs function.description"):
        check_tool_schema(given, "t")


class Meeting(BaseTool):
    """Answers whether the other tool of its pair started while it ran (it waits up to 10 s),
    with reward 1 if so."""

    def __init__(self, name, mine, other):
        schema = {"type": "function", "function": {"name": name, "description": "meets"}}
        super().__init__({}, schema)
        self.mine, self.other = mine, other

    async def execute(self, instance_id, parameters, **kwargs):
        self.mine.set()
        met = self.other.wait(10)
        return ToolResponse(text="together" if met else "alone"), float(met), {}


def test_a_turns_tool_calls_run_together(tokenizer):
    """verl gathers a turn's calls: each of two calls waits for the other to have started,
    which only calls running at the same time see (one after the other: "alone" twice)."""
    first, second = threading.Event(), threading.Event()
    tools = [Meeting("a", first, second), Meeting("b", second, first)]
    settings = calculator_settings(max_parallel_calls=2)
    script = [[tool_call("a") + tool_call("b"), "Done."]]
    _, _, out = run_tool_agent(tokenizer, ["meet?"], script, tools, settings)
    text = tokenizer.decode(np.asarray(out["responses"])[0])
    assert text.count("together") == 2 and "alone" not in text


def test_the_call_gate_serves_one_event_loop_after_another():
    """Each rollout call runs its own event loop; the gate's worker limit must follow it."""
    from jrl.agent.calls import CallGate

    gate = CallGate(workers=1, timeout=5.0)

    async def answer():
        await asyncio.sleep(0.01)
        return 1

    async def three_at_once():
        return await asyncio.gather(*(gate.call(answer) for _ in range(3)))

    for _ in range(2):  # two training steps, more calls than workers
        assert [o.value for o in asyncio.run(three_at_once())] == [1, 1, 1]


def test_unknown_tool_and_malformed_calls_are_counted(tokenizer):
    script = [['<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "ok"],
              ["<tool_call>not json</tool_call>"]]  # fmt: skip
    agent, _, out = run_tool_agent(tokenizer, ["a", "b"], script)
    assert agent.stats["agent/tool_errors"] == 1
    assert agent.stats["agent/tool_parse_errors"] == 1
    assert out.meta["num_turns"].tolist() == [4, 2]


def test_gsm8k_interaction_lets_the_model_try_again(tokenizer, tmp_path):
    config = tmp_path / "interaction.yaml"
    config.write_text(
        "interaction:\n  - name: gsm8k\n"
        "    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n"
    )
    settings = calculator_settings(interaction_config_path=str(config))
    script = [["#### 3", "#### 4", "#### 9"]]
    extra = {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "4"}}
    _, _, out = run_tool_agent(tokenizer, ["2+2?"], script, settings=settings, extra_infos=[extra])
    text = tokenizer.decode(np.asarray(out["responses"])[0])
    assert "incorrect" in text and "Your response is correct!" in text and "#### 9" not in text
    assert out.meta["num_turns"].tolist() == [5]  # 2 model turns, 2 user turns, the prompt


def test_turn_limits_stop_the_conversation(tokenizer):
    script = [[tool_call("t_fine")] * 5]
    settings = calculator_settings(max_assistant_turns=2)
    agent, _, out = run_tool_agent(tokenizer, ["a"], script, [Misbehaving("t_fine", "ok")],
                                   settings)  # fmt: skip
    assert out.meta["num_turns"].tolist() == [4]
    assert agent.stats["agent/turn_limit_ratio"] == 1.0


# -- parser and built-in tools --------------------------------------------------------------------


def test_hermes_parser_reads_calls_in_order_and_counts_malformed_ones():
    text = (
        'a<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>b<tool_call>{"name": 3}'
        '</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "h", "arguments": "{\\"x\\": 2}"}</tool_call>'  # encoded twice
    )
    parsed = parse_hermes(text)
    assert [c.name for c in parsed.calls] == ["f", "g", "h"] and parsed.malformed == 1
    assert parsed.calls[0].arguments == '{"x": 1}' and parsed.content == "ab"
    assert parsed.calls[2].arguments == '"{\\"x\\": 2}"'  # called as verl calls it


def test_calculator_is_arithmetic_only():
    assert evaluate("(12 + 7) * 3") == 57 and evaluate("-2 ** 3") == -8
    for bad in ("__import__('os')", "2 ** 100000", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            evaluate(bad)


def test_python_sandbox_prints_and_enforces_its_limits():
    assert run_python("print(6 * 7)", 5, 256, 10.0) == "42"
    assert "killed by signal" in run_python("while True: pass", 1, 256, 10.0)
    assert "MemoryError" in run_python("x = bytearray(400 * 2**20)", 5, 256, 10.0)
    assert "ran past" in run_python("import time; time.sleep(5)", 5, 256, 0.5)


def test_verl_tool_config_names_jrls_tools(tmp_path, capsys):
    from jrl.agent.tools.gsm8k import Gsm8kTool
    from jrl.agent.tools.registry import load_tools

    config = tmp_path / "gsm8k_tool_config.yaml"
    config.write_text(
        "tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n    config: {type: native}\n"
        "    tool_schema:\n      type: function\n      function:\n        name: calc_gsm8k_reward\n"
        "        description: d\n        parameters: {type: object, properties: {answer: "
        "{type: string}}, required: [answer]}\n"
    )
    tools = load_tools(str(config), None)
    assert isinstance(tools["calc_gsm8k_reward"], Gsm8kTool)
    assert "jrl.agent.tools.gsm8k:Gsm8kTool runs it" in capsys.readouterr().out

    async def submit(answers):
        tool = tools["calc_gsm8k_reward"]
        iid, _ = await tool.create(create_kwargs={"ground_truth": "72"})
        return [await tool.execute(iid, {"answer": a}) for a in answers]

    (_, r1, _), (_, r2, _), (_, r3, _) = asyncio.run(submit(["70", "72", "72"]))
    assert (r1, r2, r3) == (-0.05, 0.0, -0.05)
    ((text, _, _),) = asyncio.run(submit(["abc"]))
    assert text.text == "Current parsed answer='abc' reward=0"  # verl's text: no number, int 0
    assert tools["calc_gsm8k_reward"].config == {"type": "native"}  # verl hands it all over
    config.write_text(config.read_text().replace("config: {type: native}", "config: {}"))
    with pytest.raises(ValueError, match=r"tools\[0\]: config.type is required"):
        load_tools(str(config), None)


def test_function_tools_get_their_schema_from_the_signature(tmp_path):
    from jrl.agent.tools.function import load_function_tools

    file = tmp_path / "tools.py"
    file.write_text(
        "from jrl.agent import function_tool\n\n@function_tool\ndef lookup(city: str) -> dict:\n"
        '    """Look a city up.\n\n    Args:\n        city: The city.\n    """\n'
        "    return {'city': city, 'temperature_c': 17.3}\n"
    )
    (tool,) = load_function_tools(str(file))
    assert tool.tool_schema["function"]["parameters"]["required"] == ["city"]
    response, reward, _ = asyncio.run(tool.execute("i", {"city": "Tokyo"}))
    assert response.text == '{"city": "Tokyo", "temperature_c": 17.3}' and reward == 0.0


def test_truncation_keeps_the_side_verl_keeps():
    text = "abcdefghij"
    assert truncate_text(text, 4, "left") == "abcd...(truncated)"
    assert truncate_text(text, 4, "right") == "(truncated)...ghij"
    assert truncate_text(text, 4, "middle") == "ab...(truncated)...ij"


def test_agent_settings_refuse_bad_values():
    from jrl.config.errors import SettingsError

    with pytest.raises(SettingsError, match="tool_response_truncate_side"):
        AgentSettings(tool_response_truncate_side="top")
    with pytest.raises(SettingsError, match="tool_timeout"):
        dataclasses.replace(AgentSettings(), tool_timeout=0)
    with pytest.raises(SettingsError, match="scheduling.*must be one of rounds, slots"):
        AgentSettings(scheduling="eager")
    with pytest.raises(SettingsError, match="row_groups.*only with rollout.agent.scheduling"):
        AgentSettings(scheduling="slots", row_groups=2)
    assert AgentSettings(row_groups=2).row_groups == 2
    with pytest.raises(SettingsError, match="backend.*must be one of mlflow"):
        TraceSettings(backend="weave")
    with pytest.raises(SettingsError, match="max_samples_per_step_per_worker"):
        TraceSettings(backend="mlflow", max_samples_per_step_per_worker=0)


class RecordingEngine:
    """Stand-in for an engine (the test is about the calls the server makes): answers row i of
    a call with the token 100 + i, and records each call's prompt ids and n."""

    response_length, pad_token_id, eos_token_ids, stats = 4, 0, (1,), {}

    def __init__(self):
        self.calls = []

    def generate(self, prompts, sampling, key):
        ids, mask = np.asarray(prompts["input_ids"]), np.asarray(prompts["attention_mask"])
        self.calls.append(([r[m > 0].tolist() for r, m in zip(ids, mask, strict=True)], sampling.n))
        rows = len(ids) * sampling.n
        responses = np.full((rows, 4), 1, np.int32)
        responses[:, 0] = 100 + np.arange(rows)
        return Batch({"responses": responses, "response_mask": np.ones_like(responses)})


def test_a_first_round_with_a_system_message_still_prefills_each_prompt_once():
    """Round 0 whose contexts differ from the batch's prompts (a loop added the tools' listing)
    but agree within each group: one call, n answers per prompt, each row its own answer."""
    from jrl.agent.server import ROW, TurnServer

    engine = RecordingEngine()
    prompts = Batch({"input_ids": np.array([[5, 6], [7, 8]], np.int32),
                     "attention_mask": np.ones((2, 2), np.int32)})  # fmt: skip
    sampling = SamplingParams(max_new_tokens=4, eos_token_ids=(1,), pad_token_id=0, n=2)
    server = TurnServer(engine, prompts, sampling, jax.random.key(0))
    contexts = [[9, 5, 6], [9, 5, 6], [9, 7, 8], [9, 7, 8]]  # system token 9, then the prompt

    async def ask(row):
        ROW.set(row)
        return await server.generate(str(row), prompt_ids=contexts[row])

    async def main():
        tasks = [asyncio.create_task(ask(row)) for row in range(4)]
        while len(server.waiting) < 4:
            await asyncio.sleep(0)
        server.flush()
        return await asyncio.gather(*tasks)

    answers = asyncio.run(main())
    assert engine.calls == [([[9, 5, 6], [9, 7, 8]], 2)]
    assert [a.token_ids[0] for a in answers] == [100, 101, 102, 103]
    assert server.tokens_prefilled == 6


def test_zero_turns_sets_no_limit_as_in_verl():
    """verl tests ``if self.max_assistant_turns and ...``: 0 (or null) sets no limit."""
    from jrl.runspec import load_config
    from jrl.runspec.spec import resolve_run

    multi_turn = "actor_rollout_ref.rollout.multi_turn"
    config, _ = load_config(
        [
            "--config=configs/lookup_tool_grpo.py",
            f"{multi_turn}.max_assistant_turns=0",
            f"{multi_turn}.max_user_turns=0",
        ]
    )
    agent = resolve_run(config).agent
    assert (agent.max_assistant_turns, agent.max_user_turns) == (None, None)
