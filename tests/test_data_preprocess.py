"""Preprocessors: GSM8K and MATH to parquet in verl's schema (hub path and offline data)."""

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from jrl.data import math as math_data
from jrl.data.gsm8k import (
    ANSWER_ONLY,
    INSTRUCTION,
    gsm8k_rows,
    load_hub_records,
    main,
    make_offline_rows,
    write_gsm8k,
)
from jrl.reward.math import compute_score as math_score

SCHEMA = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def test_offline_rows_are_seeded_and_correct():
    rows = make_offline_rows(50, seed=4, split="train")
    assert rows == make_offline_rows(50, seed=4, split="train")
    assert rows != make_offline_rows(50, seed=4, split="test")
    assert rows != make_offline_rows(50, seed=5, split="train")
    for row in rows:
        answer = row["extra_info"]["answer"]
        expression = answer.split(".\n####")[0].split(", ")[-1]
        left, right = expression.split(" = ")
        assert eval(left) == int(right) == int(row["reward_model"]["ground_truth"])
        assert len(row["prompt"][0]["content"]) < 200


def test_one_step_rows_add_take_away_or_multiply_and_ask_for_the_bare_answer():
    rows = make_offline_rows(60, seed=4, split="test", generator="one_step")
    assert rows == make_offline_rows(60, seed=4, split="test", generator="one_step")
    operators = set()
    for row in rows:
        question = row["extra_info"]["question"]
        assert row["prompt"][0]["content"] == question + " " + ANSWER_ONLY
        assert row["data_source"] == "jrl/word_problems"
        left, right = row["extra_info"]["answer"].split(".\n####")[0].split(" = ")
        assert eval(left) == int(right) == int(row["reward_model"]["ground_truth"])
        operators.add(left.split()[1])
    assert operators == {"+", "-", "*"}  # one step each: no sharing, no two-step problems
    with pytest.raises(ValueError, match="built-in generators are 'arithmetic' and 'one_step'"):
        make_offline_rows(1, seed=0, split="test", generator="gsm_symbolic")


def test_gsm8k_cli_one_step_generator(tmp_path):
    args = ["--local_dir", str(tmp_path), "--offline", "--generator", "one_step"]
    main([*args, "--train_size", "5", "--test_size", "3"])
    rows = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert rows == make_offline_rows(3, seed=0, split="test", generator="one_step")


def test_gsm8k_rows_from_hub_style_records():
    records = [
        {"question": "Q one?", "answer": "Work <<48/2=24>>24.\n#### 72"},
        {"question": "Q two?", "answer": "Big.\n#### 1,234"},
    ]
    rows = gsm8k_rows(records, "test")
    assert rows[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Q one? " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {
            "split": "test",
            "index": 0,
            "answer": records[0]["answer"],
            "question": "Q one?",
        },
    }
    assert rows[1]["reward_model"]["ground_truth"] == "1234"
    with pytest.raises(ValueError, match="no '#### <number>'"):
        gsm8k_rows([{"question": "q", "answer": "no final answer"}], "train")


def test_hub_path_needs_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(ImportError, match="openai/gsm8k from the Hugging Face hub.*pip install"):
        load_hub_records("train", 2)


def test_gsm8k_cli_offline_writes_verl_schema(tmp_path):
    paths = main(
        ["--local_dir", str(tmp_path), "--offline", "--train_size", "20", "--test_size", "5"]
    )
    assert [p.name for p in paths] == ["train.parquet", "test.parquet"]
    table = pq.read_table(tmp_path / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert table.num_rows == 20 and pq.read_table(tmp_path / "test.parquet").num_rows == 5
    row = table.to_pylist()[3]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["prompt"][0]["content"].endswith(" " + INSTRUCTION)
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 3
    assert row["extra_info"]["answer"].endswith("#### " + row["reward_model"]["ground_truth"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.parquet", "train.parquet"]
    # The module entry point writes the same files for the same seed.
    out = tmp_path / "cli"
    command = [sys.executable, "-m", "jrl.data.gsm8k", "--local_dir", str(out), "--offline"]
    command += ["--train_size", "20", "--test_size", "5"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    assert str(out / "train.parquet") in result.stdout
    assert pq.read_table(out / "train.parquet").equals(table)


def test_gsm8k_cli_gsm_symbolic_generator(tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is in the test extra")
    args = ["--local_dir", str(tmp_path), "--offline", "--generator", "gsm_symbolic"]
    main([*args, "--train_size", "6", "--test_size", "3"])
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    test_rows = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert len(rows) == 6 and len(test_rows) == 3
    assert rows[0]["extra_info"]["question"] != test_rows[0]["extra_info"]["question"]
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        assert truth.lstrip("-").isdigit()
        assert row["extra_info"]["answer"] == f"#### {truth}"
        assert row["prompt"][0]["content"].endswith(" " + INSTRUCTION)
    main([*args, "--train_size", "6", "--test_size", "3", "--local_dir", str(tmp_path / "b")])
    assert pq.read_table(tmp_path / "b" / "train.parquet").to_pylist() == rows


def test_write_gsm8k_replaces_existing_file(tmp_path):
    write_gsm8k(tmp_path, {"train": make_offline_rows(3, 0, "train")})
    write_gsm8k(tmp_path, {"train": make_offline_rows(2, 0, "train")})
    assert pq.read_table(tmp_path / "train.parquet").num_rows == 2
    assert [p.name for p in tmp_path.iterdir()] == ["train.parquet"]


# ---------------------------------------------------------------- MATH


def test_math_rows_from_hub_style_records():
    records = [
        {"problem": "What is $1+1$?", "solution": "Clearly $\\boxed{2}$.", "level": "Level 1"},
        {
            "problem": "Half?",
            "solution": "First \\boxed{1}, then really $\\boxed{\\frac{1}{2}}$.",
            "type": "Algebra",
        },
    ]
    rows = math_data.math_rows(records, "test")
    assert rows[0] == {
        "level": "Level 1",  # the record's other columns stay, as verl's datasets.map keeps them
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [
            {
                "role": "user",
                "content": "What is $1+1$? Let's think step by step and output the final answer "
                "within \\boxed{}.",
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2"},
        "extra_info": {"split": "test", "index": 0},
    }
    assert rows[1]["reward_model"]["ground_truth"] == "\\frac{1}{2}"  # last box, nested braces
    assert rows[1]["type"] == "Algebra"
    with pytest.raises(ValueError, match=r"train record 0: solution has no \\boxed"):
        math_data.math_rows([{"problem": "p", "solution": "no box"}], "train")


def test_math_hub_path_needs_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    with pytest.raises(ImportError, match="MATH-lighteval from the Hugging Face hub.*datasets"):
        math_data.main(["--local_dir", "unused"])


def test_math_cli_offline(tmp_path):
    # verl's --local_save_dir (jrl's docs use its older spelling --local_dir, also accepted)
    command = [sys.executable, "-m", "jrl.data.math", "--local_save_dir", str(tmp_path)]
    command.append("--offline")
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    assert str(tmp_path / "train.parquet") in result.stdout
    train = pq.read_table(tmp_path / "train.parquet")
    test = pq.read_table(tmp_path / "test.parquet").to_pylist()
    assert train.column_names == SCHEMA
    assert train.num_rows + len(test) == len(math_data.OFFLINE_PROBLEMS)
    assert len(test) == math_data.OFFLINE_TEST_SIZE
    rows = train.to_pylist()
    assert rows[2]["extra_info"] == {"split": "train", "index": 2}
    assert test[0]["extra_info"] == {"split": "test", "index": 0}
    truths = {r["reward_model"]["ground_truth"] for r in rows + test}
    assert {"\\frac{5}{6}", "5\\sqrt{2}", "\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}"} <= truths
    for row, (_, solution) in zip(rows + test, math_data.OFFLINE_PROBLEMS, strict=True):
        assert row["prompt"][0]["content"].endswith(" " + math_data.INSTRUCTION)
        # The reference solution earns full reward from the MATH scorer.
        assert math_score(solution, row["reward_model"]["ground_truth"]) == 1.0
    math_data.main(["--local_dir", str(tmp_path / "small"), "--offline", "--train_size", "3"])
    assert pq.read_table(tmp_path / "small" / "train.parquet").num_rows == 3


def test_tool_agent_rows_ask_the_query_verls_example_asks():
    """verl's gsm8k_tool_agent_loop.py: the user turn and the interaction's query are both the
    question with the instruction; the tool's ground truth rides in tools_kwargs."""
    from jrl.data.gsm8k import TOOL_AGENT_INSTRUCTION, gsm8k_rows, tool_agent_rows

    (row,) = tool_agent_rows(gsm8k_rows([{"question": "Q?", "answer": "w\n#### 1,234"}], "train"))
    asked = "Q? " + TOOL_AGENT_INSTRUCTION
    assert row["prompt"][1] == {"role": "user", "content": asked}
    assert row["extra_info"]["interaction_kwargs"] == {"query": asked, "ground_truth": "1234"}
    assert row["extra_info"]["question"] == "Q?" and row["agent_name"] == "tool_agent"
    tools = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "1234"}}}
    assert row["extra_info"]["tools_kwargs"] == tools
