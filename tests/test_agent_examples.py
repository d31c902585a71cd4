"""verl's GSM8K tool-agent example runs with its own data schema, tool config and command-line
keys: the rows written by ``python -m jrl.data.gsm8k --offline --agent tool``, a tool YAML naming
verl's class path, and the keys of ``run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh`` with a tiny
random model (which does not learn to call the tool: this run shows the plumbing, not learning)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import yaml
from helpers import REPO
from real_vllm import KV_CACHE, why_no_real_vllm

from jrl import train
from jrl.agent import AgentContext, AgentRollout, AgentSettings
from jrl.agent.parser import parse_hermes
from jrl.assets import prepare_lookup
from jrl.batch import Batch
from jrl.data import arithmetic, gsm8k, lookup
from jrl.data.lookup_tokens import CALL, TOOL_MARK
from jrl.data.tokenizer import load_tokenizer
from jrl.models import from_pretrained
from jrl.reward import default_compute_score
from jrl.rollout import JaxRollout, SamplingParams

AR = "actor_rollout_ref"


def column(values: list) -> np.ndarray:
    """`values` as an object column of a batch's meta."""
    out = np.empty(len(values), object)
    out[:] = values
    return out


# verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml: its keys, class
# path and schema.
VERL_GSM8K_TOOL_CONFIG = {
    "tools": [
        {
            "class_name": "verl.tools.gsm8k_tool.Gsm8kTool",
            "config": {"type": "native"},
            "tool_schema": {
                "type": "function",
                "function": {
                    "name": "calc_gsm8k_reward",
                    "description": "Checks a GSM8K answer: 1.0 if it is right, else 0.0.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "answer": {"type": "string", "description": "The answer, digits"}
                        },
                        "required": ["answer"],
                    },
                },
            },
        }
    ]
}
# The keys of verl's config gsm8k_multiturn_grpo.yaml (the script's --config-name; jrl has no
# Hydra search path, so they are given here).
MULTITURN_GRPO_YAML = [
    "data.max_prompt_length=1024",
    "data.max_response_length=1024",
    "data.train_batch_size=256",
    "data.return_raw_chat=True",
    f"{AR}.hybrid_engine=True",
    f"{AR}.rollout.name=sglang",
    f"{AR}.rollout.multi_turn.enable=True",
    f"{AR}.rollout.multi_turn.max_assistant_turns=5",
]
# run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh's keys as it passes them.
SCRIPT = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=256",
    "data.max_prompt_length=1024",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation=error",
    "data.return_raw_chat=True",
    f"{AR}.actor.optim.lr=1e-6",
    f"{AR}.model.use_remove_padding=True",
    f"{AR}.actor.ppo_mini_batch_size=256",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu=32",
    f"{AR}.actor.use_kl_loss=True",
    f"{AR}.actor.kl_loss_coef=0.001",
    f"{AR}.actor.kl_loss_type=low_var_kl",
    f"{AR}.actor.entropy_coeff=0",
    f"{AR}.model.enable_gradient_checkpointing=True",
    f"{AR}.actor.fsdp_config.param_offload=False",
    f"{AR}.actor.fsdp_config.optimizer_offload=False",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=32",
    f"{AR}.rollout.tensor_model_parallel_size=2",
    f"{AR}.rollout.name=sglang",
    f"{AR}.rollout.mode=async",
    f"{AR}.rollout.gpu_memory_utilization=0.5",
    f"{AR}.rollout.n=16",
    f"{AR}.rollout.trace.backend=mlflow",
    f"{AR}.rollout.trace.token2text=True",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu=32",
    f"{AR}.ref.fsdp_config.param_offload=True",
    "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0",
    "trainer.logger=['console','mlflow']",
    "trainer.project_name=gsm8k_tool-agent",
    "trainer.experiment_name=qwen2.5-3b_function_rm-gsm8k-sgl-tool-agent-verify-n16",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=20",
    "trainer.total_training_steps=2",
]
# One CPU and a tiny model: the sizes that the script sets for 8 H100s, scaled down.
TINY = [
    "data.train_batch_size=4",
    "data.max_prompt_length=256",
    "data.max_response_length=24",
    f"{AR}.actor.ppo_mini_batch_size=4",
    f"{AR}.actor.ppo_micro_batch_size_per_gpu=4",
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=4",
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu=4",
    f"{AR}.rollout.tensor_model_parallel_size=1",
    f"{AR}.rollout.n=2",
    "trainer.n_gpus_per_node=1",
    "trainer.val_before_train=False",
]


def test_verls_gsm8k_tool_agent_example_runs(tmp_path):
    gsm8k.main(
        ["--offline", "--agent", "tool", f"--local_dir={tmp_path}", "--train_size=8"]
        + ["--test_size=4"]
    )
    tool_config = tmp_path / "gsm8k_tool_config.yaml"
    tool_config.write_text(yaml.safe_dump(VERL_GSM8K_TOOL_CONFIG))
    run_dir = tmp_path / "run"
    train.main(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            *MULTITURN_GRPO_YAML,
            *SCRIPT,
            f"data.train_files={tmp_path / 'train.parquet'}",
            f"data.val_files={tmp_path / 'test.parquet'}",
            f"{AR}.rollout.multi_turn.tool_config_path={tool_config}",
            *TINY,
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    steps = [json.loads(line)["data"] for line in (run_dir / "metrics.jsonl").open()]
    assert [s["training/global_step"] for s in steps] == [1, 2]
    for step in steps:
        # Every row ran the tool agent (agent_name "tool_agent" in the data).
        assert step["num_turns/min"] >= 2
        assert "agent/tool_calls_per_row" in step
    assert (run_dir / "mlruns").is_dir()  # the script's mlflow logger
    assert_rollouts_were_traced(run_dir / "mlruns")


def assert_rollouts_were_traced(store) -> None:
    """``rollout.trace``: one mlflow trace per trajectory (2 steps of 4 prompts x 2, and the
    last step's validation of 4 prompts x 1), tagged verl's way, whose spans are the loop's
    run and each model turn, with the decoded text (``token2text``)."""
    import mlflow

    client = mlflow.MlflowClient(store.resolve().as_uri())
    experiment = client.get_experiment_by_name("gsm8k_tool-agent")
    traces = client.search_traces(locations=[experiment.experiment_id], max_results=1000)
    tags = sorted(
        (
            t.info.tags["validate"],
            int(t.info.tags["step"]),
            t.info.tags["sample_index"],
            int(t.info.tags["rollout_n"]),
        )
        for t in traces
    )
    assert len(set(tags)) == len(tags) == 2 * 4 * 2 + 4
    training = [tag[1:] for tag in tags if tag[0] == "False"]
    assert {(step, n) for step, _, n in training} == {(1, 0), (1, 1), (2, 0), (2, 1)}
    assert {tag[1:] for tag in tags if tag[0] == "True"} == {(2, str(i), 0) for i in range(4)}
    spans = traces[0].data.spans
    names = [span.name for span in spans]
    assert names[0] == "agent_loop" and "ToolAgentLoop.run" in names and "generate" in names
    turn = next(span for span in spans if span.name == "generate")
    assert turn.inputs["prompt_ids"] and "<|im_start|>" in turn.outputs["prompt_text"]
    assert len(turn.outputs["token_ids"]) >= 1 and "response_text" in turn.outputs


def assert_the_tool_was_learnt(run_dir) -> None:
    """The lookup run in `run_dir` went from greedy accuracy about 0 to 0.9 or more, calling the
    tool."""
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    accuracy = "val-core/jrl/lookup/acc/mean@1"
    validations = {s["step"]: s["data"] for s in steps if accuracy in s["data"]}
    first, last = validations[0], validations[max(validations)]
    assert first[accuracy] <= 0.15
    assert last[accuracy] >= 0.9
    assert last["val-aux/jrl/lookup/called/mean@1"] >= 0.9
    assert last["val-aux/num_turns/max"] >= 3  # verl's turn counts of validation's loops


def test_a_tiny_random_model_learns_a_task_only_the_tool_can_solve(tmp_path):
    """configs/lookup_tool_grpo.py on the JAX sampler: the secret is only in the tool's answer.
    Breaking the tool's answer keeps the accuracy at chance (checked once)."""
    run_dir = tmp_path / "run"
    train.main(["--config=configs/lookup_tool_grpo.py", f"trainer.default_local_dir={run_dir}"])
    assert_the_tool_was_learnt(run_dir)


@pytest.mark.skipif(why_no_real_vllm() is not None, reason=str(why_no_real_vllm()))
def test_the_tool_is_learnt_on_vllm_too(tmp_path):
    """The same card with vLLM's CPU build sampling every turn (in a process of its own: one
    vLLM engine per process)."""
    run_dir = tmp_path / "run"
    args = ["--config=configs/lookup_tool_grpo.py", f"trainer.default_local_dir={run_dir}"]
    # The tests' KV cache: without a size vLLM's CPU build reserves gpu_memory_utilization of the
    # host's memory, more than is free beside this test process on a 24 GiB machine.
    ((key, size),) = KV_CACHE.items()
    vllm = [f"{AR}.rollout.name=vllm", f"++{AR}.rollout.engine_kwargs.vllm.{key}={size}"]
    done = subprocess.run(
        [sys.executable, "-m", "jrl.train", *args, *vllm],
        cwd=REPO,
        env={**os.environ, "XLA_FLAGS": ""},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert_the_tool_was_learnt(run_dir)


def test_lookup_rollouts_mask_the_tool_turn_and_carry_each_rows_secret():
    """The lookup task on the real JAX sampler (random weights, 128 trajectories): each one that
    calls the tool reads [..., CALL, EOS, @, secret, answer...], with the tool's two tokens
    masked out of the loss and every model token in it."""
    paths = prepare_lookup()
    tokenizer = load_tokenizer(paths["model_path"])
    engine = JaxRollout(
        from_pretrained(paths["model_path"]),
        response_length=8,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=tokenizer.eos_token_id,
    )
    settings = AgentSettings(max_assistant_turns=2, tool_config_path=paths["tool_config_path"])
    context = AgentContext.build(settings, tokenizer)
    agent = AgentRollout(engine, context, {})
    rows = lookup.make_rows(16, 1, seed=3)["train"]
    messages = [row["prompt"] for row in rows]
    prompt_ids = [context.chat.prompt_ids(context.chat.show_tools(m)) for m in messages]
    meta = {key: column([row[key] for row in rows]) for key in ("agent_name", "extra_info")} | {
        "raw_prompt": column(messages),
        "raw_prompt_ids": column(prompt_ids),
    }
    width = len(prompt_ids[0])
    prompts = Batch(
        {
            "input_ids": np.asarray(prompt_ids, np.int32),
            "attention_mask": np.ones((len(rows), width), np.int32),
            "position_ids": np.tile(np.arange(width, dtype=np.int32), (len(rows), 1)),
        },
        meta,
    )
    sampling = SamplingParams(max_new_tokens=8, eos_token_ids=(tokenizer.eos_token_id,),
                              pad_token_id=tokenizer.pad_token_id, n=8)  # fmt: skip
    batch = agent.generate(prompts, sampling, jax.random.key(0)).to_numpy()
    call, eos = tokenizer.convert_tokens_to_ids(CALL), tokenizer.eos_token_id
    mark = tokenizer.convert_tokens_to_ids(TOOL_MARK)
    answered = 0
    for i, (ids, mask) in enumerate(zip(batch["responses"], batch["response_mask"], strict=True)):
        expected = batch["attention_mask"][i, width:].astype(np.int32)  # every real token
        ends = np.flatnonzero(ids == eos)
        secret = rows[i // 8]["reward_model"]["ground_truth"]
        # A call in the first turn, and room left for the tool's answer after its EOS.
        if len(ends) and call in ids[: ends[0]] and expected[ends[0] + 1 :].sum() >= 2:
            tool_turn = slice(ends[0] + 1, ends[0] + 3)
            assert ids[tool_turn][0] == mark and tokenizer.decode(ids[tool_turn][1:]) == secret
            expected[tool_turn] = 0
            answered += 1
        np.testing.assert_array_equal(mask, expected, err_msg=f"row {i}: {ids}")
    assert answered >= 2  # random weights call now and then; key 0 gives a few calls
    assert agent.stats["agent/tool_calls"] >= answered


def test_arithmetic_traces_call_the_calculator_with_the_question_and_score():
    """bench/tool_use.py's data: each warm-up trace's call parses (Hermes) to the calculator
    with the question's expression, and the tool's answer is the value the reward wants."""
    rows = arithmetic.make_rows(4, 0, "test")
    assert rows == arithmetic.make_rows(4, 0, "test") != arithmetic.make_rows(4, 1, "test")
    for trace in arithmetic.sft_traces(4, 0, "tools here"):
        system, user, call, tool, answer = trace["messages"]
        (parsed,) = parse_hermes(call["content"]).calls
        expression = json.loads(parsed.arguments)["expression"]
        assert parsed.name == "calculator" and f"What is {expression}?" in user["content"]
        assert system["content"] == "tools here"
        assert answer["content"] == f"#### {tool['content']}"
        assert int(tool["content"]) == eval(expression)  # the test's own two-digit expression
    score = default_compute_score("jrl/arithmetic", "<tool_call>{}</tool_call>\n#### 131", "131")
    assert score == {"score": 1.0, "acc": 1.0, "called": 1.0}
    assert default_compute_score("jrl/arithmetic", "#### 130", "131")["score"] == 0.0
