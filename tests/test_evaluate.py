"""Offline evaluation: exact scores and pass@k on a fixture with known answers, the data keys,
custom reward functions, clear errors, and the command line."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jrl.config import apply_overrides, evaluation_config
from jrl.evaluate import default_ks, evaluate, main, pass_at_k

REPO = Path(__file__).parents[1]


def _row(source: str, truth: str, responses: list[str]) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": "?"}],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"index": 0},
        "responses": responses,
    }


# digits: the first character must be the ground truth; gsm8k: the number after "####".
ROWS = [
    _row("jrl/digits", "3", ["3", "3x", "4", ""]),  # 2 of 4 right
    _row("jrl/digits", "7", ["1", "2", "3", "7"]),  # 1 of 4 right
    _row("openai/gsm8k", "72", ["so #### 72"]),
    _row("openai/gsm8k", "10", ["The answer is 10"]),  # no "####": wrong
]
EXPECTED = {
    "test_score/jrl/digits": (2 / 4 + 1 / 4) / 2,
    "pass@1/jrl/digits": (2 / 4 + 1 / 4) / 2,
    "pass@2/jrl/digits": ((1 - 1 / 6) + (1 - 3 / 6)) / 2,  # 1 - C(n-c, 2) / C(4, 2)
    "pass@4/jrl/digits": 1.0,
    "test_score/openai/gsm8k": 0.5,
}


@pytest.fixture
def generated(tmp_path) -> str:
    path = tmp_path / "gen.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    return str(path)


def _config(path: str, **changes):
    return apply_overrides(evaluation_config(), [("data.path", path), *changes.items()])


def test_scores_and_pass_at_k_per_data_source(generated):
    assert evaluate(_config(generated)) == pytest.approx(EXPECTED, abs=1e-12)
    assert set(evaluate(_config(generated))) == set(EXPECTED)


def test_pass_at_k_settings(generated):
    metrics = evaluate(_config(generated, **{"pass_at_k.k": [3], "pass_at_k.threshold": 2.0}))
    assert metrics["pass@3/jrl/digits"] == 0.0 and "pass@1/jrl/digits" not in metrics
    with pytest.raises(ValueError, match=r"pass_at_k.k=\[5\]: \[5\] exceed the 4 responses"):
        evaluate(_config(generated, **{"pass_at_k.k": [5]}))


@pytest.mark.parametrize("n", [1, 4, 7])
def test_pass_at_k_is_the_chance_over_all_draws(n):
    for correct in range(n + 1):
        outcomes = [True] * correct + [False] * (n - correct)
        for k in range(1, n + 1):
            draws = list(itertools.combinations(outcomes, k))
            assert pass_at_k(n, correct, k) == pytest.approx(sum(map(any, draws)) / len(draws))
    assert default_ks(6) == [1, 2, 4, 6] and default_ks(4) == [1, 2, 4]


def test_renamed_columns(tmp_path):
    names = {"data_source": "src", "reward_model": "ref", "responses": "gen", "prompt": "q"}
    rows = [{names.get(k, k): v for k, v in row.items()} for row in ROWS]
    path = tmp_path / "renamed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    keys = {
        "data.data_source_key": "src",
        "data.reward_model_key": "ref",
        "data.response_key": "gen",
        "data.prompt_key": "q",
    }
    assert evaluate(_config(str(path), **keys)) == pytest.approx(EXPECTED, abs=1e-12)


def test_custom_reward_function_with_kwargs(generated, tmp_path):
    module = tmp_path / "scores.py"
    module.write_text(
        "def length(data_source, solution_str, ground_truth, bonus=0.0):\n"
        "    return {'score': len(solution_str) + bonus, 'extra': 1}\n"
    )
    config = _config(
        generated,
        **{
            "custom_reward_function.path": str(module),
            "custom_reward_function.name": "length",
            "+custom_reward_function.reward_kwargs.bonus": 1.0,
        },
    )
    metrics = evaluate(config)
    assert metrics["test_score/openai/gsm8k"] == pytest.approx((11 + 17) / 2)
    assert metrics["test_score/jrl/digits"] == pytest.approx(((2 + 3 + 2 + 1) + (2 * 4)) / 8)


def test_bad_inputs_fail_clearly(generated, tmp_path):
    with pytest.raises(KeyError, match=r"no column 'answers' \(data.response_key\)"):
        evaluate(_config(generated, **{"data.response_key": "answers"}))
    with pytest.raises(KeyError, match=r"no column 'question' \(data.prompt_key\)"):
        evaluate(_config(generated, **{"data.prompt_key": "question"}))
    other = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist([_row("my/source", "1", ["1"])]), other)
    with pytest.raises(RuntimeError, match="no built-in reward for data_source='my/source'"):
        evaluate(_config(str(other)))
    single = tmp_path / "single.parquet"
    rows = [{**ROWS[0], "responses": "3"}]
    pq.write_table(pa.Table.from_pylist(rows), single)
    with pytest.raises(TypeError, match="row 0: 'responses' .* non-empty list of responses"):
        evaluate(_config(str(single)))
    with pytest.raises(FileNotFoundError, match="data.path"):
        evaluate(_config(str(tmp_path / "missing.parquet")))


def test_command_line(generated, tmp_path, capsys):
    assert main(["--config=configs/eval.py", f"data.path={generated}"]) == pytest.approx(EXPECTED)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == pytest.approx(EXPECTED)
    failed = subprocess.run(
        [sys.executable, "-m", "jrl.evaluate", f"data.path={tmp_path / 'missing.parquet'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("jrl.evaluate: error: data.path:")
    assert len(failed.stderr.strip().splitlines()) == 1
