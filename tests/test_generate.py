"""Batch generation: a prompts parquet in, the same rows with a ``responses`` list column out,
seeded sampling, and clear errors for bad settings."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import generate_args

from jrl.assets import prepare_digits
from jrl.config import ConfigError
from jrl.config.entry import load_entry_config
from jrl.config.trees import GENERATION
from jrl.data import load_tokenizer
from jrl.generate import main, prompt_dataset
from jrl.runspec.eval_checks import validate_generation

ROWS = 6


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> str:
    """The first test prompts of the digits task, with a stale ``responses`` column."""
    table = pq.read_table(prepare_digits()["val_files"]).slice(0, ROWS)
    table = table.append_column("responses", pa.array([["old"]] * ROWS))
    path = tmp_path_factory.mktemp("prompts") / "prompts.parquet"
    pq.write_table(table, path)
    return str(path)


def _args(prompts: str, output, *overrides: str) -> list[str]:
    model = prepare_digits()["model_path"]
    return generate_args(prompts, output, model, *overrides, samples=3, batch_size=ROWS)


def _responses(path) -> list[list[str]]:
    return pq.read_table(path).column("responses").to_pylist()


def test_every_row_gets_n_sampled_responses_seeded(prompts, tmp_path):
    first = main(_args(prompts, tmp_path / "a.parquet"))
    table, source = pq.read_table(first), pq.read_table(prompts)
    assert table.column_names == source.column_names  # the stale column is replaced
    assert table.drop_columns(["responses"]).equals(source.drop_columns(["responses"]))
    responses = _responses(first)
    assert [len(r) for r in responses] == [3] * ROWS
    texts = [text for row in responses for text in row]
    assert all(len(text) <= 3 and set(text) <= set("0123456789=") for text in texts)
    assert len(set(texts)) > 3  # sampled, not one constant answer
    assert _responses(main(_args(prompts, tmp_path / "b.parquet"))) == responses
    other_seed = main(_args(prompts, tmp_path / "c.parquet", "rollout.seed=1"))
    assert _responses(other_seed) != responses


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (["rollout.n=2"], ConfigError, "keep rollout.n=1"),
        (["rollout.temperature=0"], ConfigError, "data.n_samples=3 with greedy decoding"),
        (
            ["rollout.name=trtllm"],
            ConfigError,
            "rollout.name='trtllm' is not one of jax, vllm, sglang, hf",
        ),
        (["data.prompt_key=question"], KeyError, r"no column 'question' \(data.prompt_key\)"),
        (["trainer.device=cuda"], ValueError, "trainer.device='cuda' but JAX runs on 'cpu'"),
        (["rollout.prompt_length=3"], ValueError, r"row 0 has a prompt of 5 tokens"),
    ],
)
def test_bad_settings_fail_clearly(prompts, tmp_path, overrides, error, message):
    with pytest.raises(error, match=message):
        main(_args(prompts, tmp_path / "out.parquet", *overrides))
    assert not (tmp_path / "out.parquet").exists()


def test_defaults_are_verls_generation_config():
    config = load_entry_config([], GENERATION, validate_generation)
    assert (config.data.n_samples, config.data.batch_size, config.rollout.top_k) == (5, 128, 50)
    assert (config.rollout.top_p, config.rollout.prompt_length) == (0.7, 1536)


def test_chat_template_kwargs_reach_the_prompts(prompts, tmp_path):
    """As verl's generation: ``+data.apply_chat_template_kwargs`` go to the chat template."""
    args = _args(prompts, tmp_path / "out.parquet", "+data.apply_chat_template_kwargs.flag=true")
    config = load_entry_config(args, GENERATION, validate_generation)
    tokenizer = load_tokenizer(prepare_digits()["model_path"])
    assert prompt_dataset(config, tokenizer).chat_template_kwargs == {"flag": True}
