"""Data pipeline: tokenizers, RLDataset (template, truncation, padding), Grain loader, GSM8K CLI."""

import subprocess
import sys
import warnings

import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jrl.assets import cache_dir
from jrl.batch import Batch
from jrl.data import DataLoader, RLDataset, collate, load_tokenizer, train_tiny_tokenizer
from jrl.data.gsm8k import (
    INSTRUCTION,
    gsm8k_rows,
    load_hub_records,
    main,
    make_offline_rows,
    write_gsm8k,
)
from jrl.data.rl_dataset import truncate

ROLE_TEXT = "user"


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    texts = [r["prompt"][0]["content"] for r in make_offline_rows(300, seed=0, split="train")]
    texts += [r["extra_info"]["answer"] for r in make_offline_rows(300, seed=0, split="train")]
    return train_tiny_tokenizer(texts, tmp_path_factory.mktemp("tok") / "tiny", vocab_size=512)


def data_config(**overrides):
    base = dict(
        prompt_key="prompt",
        max_prompt_length=64,
        truncation="error",
        filter_overlong_prompts=False,
        return_raw_chat=False,
        return_full_prompt=False,
        shuffle=True,
        seed=7,
    )
    return ml_collections.ConfigDict({**base, **overrides})


def write_rows(path, questions):
    rows = gsm8k_rows(
        [{"question": q, "answer": f"#### {i}"} for i, q in enumerate(questions)], "t"
    )
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def template_ids(tokenizer, question):
    text = tokenizer.apply_chat_template(
        [{"role": ROLE_TEXT, "content": question + " " + INSTRUCTION}],
        add_generation_prompt=True,
        tokenize=False,
    )
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- tokenizer


def test_tiny_tokenizer_chatml_round_trip(tokenizer, tmp_path):
    folder = tmp_path / "tok"
    train_tiny_tokenizer(["Tom has 3 apples."], folder, vocab_size=300)
    loaded = load_tokenizer(folder)
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|endoftext|>"
    assert loaded.pad_token_id != loaded.eos_token_id
    text = loaded.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = loaded(text, add_special_tokens=False)["input_ids"]
    assert ids.count(loaded.convert_tokens_to_ids("<|im_start|>")) == 2
    assert loaded.decode(ids, skip_special_tokens=True) == "user\nhi\nassistant\n"
    # Training again into the same folder replaces it whole.
    train_tiny_tokenizer(["other words entirely"], folder, vocab_size=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]


def test_load_tokenizer_errors_pad_fallback_and_template(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_tokenizer(tmp_path)
    no_pad = tmp_path / "no_pad"
    tokenizer.save_pretrained(no_pad)
    config = (no_pad / "tokenizer_config.json").read_text()
    (no_pad / "tokenizer_config.json").write_text(config.replace('"<|endoftext|>"', "null"))
    with pytest.warns(UserWarning, match="no pad token"):
        loaded = load_tokenizer(no_pad, custom_chat_template="{{ messages[0]['content'] }}")
    assert loaded.pad_token_id == loaded.eos_token_id
    assert loaded.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == "x"


@pytest.mark.slow
def test_load_tokenizer_from_gguf():
    path = cache_dir() / "assets" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        from jrl.assets import smollm2_gguf_path

        path = smollm2_gguf_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = load_tokenizer(path)
    assert len(tok) == 49152 and tok.eos_token_id == 2 and tok.pad_token_id == 2
    assert "<|im_start|>assistant\n" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )


# ---------------------------------------------------------------- dataset


def test_truncate_modes_exact():
    ids = list(range(1, 11))
    assert truncate(ids, 4, "left") == [7, 8, 9, 10]
    assert truncate(ids, 4, "right") == [1, 2, 3, 4]
    assert truncate(ids, 4, "middle") == [1, 2, 9, 10]
    assert truncate(ids, 5, "middle") == [1, 2, 8, 9, 10]
    assert truncate(ids, 10, "left") == ids


def test_left_padding_position_ids_and_fields(tokenizer, tmp_path):
    question = "Tom has 3 apples and gets 5 more. How many apples does Tom have?"
    text, ids = template_ids(tokenizer, question)
    length = len(ids) + 3
    cfg = data_config(max_prompt_length=length, return_raw_chat=True, return_full_prompt=True)
    row = RLDataset(write_rows(tmp_path / "d.parquet", [question]), tokenizer, cfg)[0]
    pad = tokenizer.pad_token_id
    assert row["input_ids"].dtype == np.int32 and row["input_ids"].shape == (length,)
    np.testing.assert_array_equal(row["input_ids"], [pad] * 3 + ids)
    np.testing.assert_array_equal(row["attention_mask"], [0, 0, 0] + [1] * len(ids))
    np.testing.assert_array_equal(row["position_ids"], [0, 0, 0] + list(range(len(ids))))
    assert row["raw_prompt_ids"] == ids
    assert row["full_prompts"] == text
    assert row["raw_prompt"] == [{"role": "user", "content": question + " " + INSTRUCTION}]
    assert row["index"] == 0 and row["data_source"] == "openai/gsm8k"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert "prompt" not in row  # the messages move to raw_prompt, as verl


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_token_level(tokenizer, tmp_path, mode):
    question = "Ana has 9 books and gives away 4. How many books are left?"
    _, ids = template_ids(tokenizer, question)
    limit = len(ids) - 5
    expected = {
        "left": ids[-limit:],
        "right": ids[:limit],
        "middle": ids[: limit // 2] + ids[-(limit - limit // 2) :],
    }[mode]
    cfg = data_config(max_prompt_length=limit, truncation=mode)
    row = RLDataset(write_rows(tmp_path / "d.parquet", [question]), tokenizer, cfg)[0]
    np.testing.assert_array_equal(row["input_ids"], expected)
    assert row["raw_prompt_ids"] == expected
    assert row["attention_mask"].sum() == limit


def test_too_long_prompt_with_truncation_error(tokenizer, tmp_path):
    path = write_rows(tmp_path / "d.parquet", ["short", "a much longer question " * 10])
    dataset = RLDataset(path, tokenizer, data_config(max_prompt_length=40))
    dataset[0]
    with pytest.raises(ValueError, match=r"d.parquet row 1 has a prompt of \d+ tokens.*=40"):
        dataset[1]


def test_filter_overlong_prompts(tokenizer, tmp_path):
    questions = ["a much longer question " * 10, "short", "long again " * 20]
    path = write_rows(tmp_path / "d.parquet", questions)
    dataset = RLDataset(path, tokenizer, data_config(filter_overlong_prompts=True))
    assert len(dataset) == 1
    assert dataset[0]["extra_info"]["question"] == "short"
    with pytest.raises(ValueError, match="no rows left"):
        RLDataset(path, tokenizer, data_config(max_prompt_length=5, filter_overlong_prompts=True))


def test_max_samples_and_file_lists(tokenizer, tmp_path):
    first = write_rows(tmp_path / "a.parquet", [f"q{i}" for i in range(6)])
    second = write_rows(tmp_path / "b.parquet", [f"r{i}" for i in range(4)])
    questions = [f"q{i}" for i in range(6)] + [f"r{i}" for i in range(4)]

    def picked(dataset):
        return [dataset[i]["extra_info"]["question"] for i in range(len(dataset))]

    assert picked(RLDataset([first, second], tokenizer, data_config())) == questions
    head = RLDataset([first, second], tokenizer, data_config(shuffle=False), max_samples=3)
    assert picked(head) == questions[:3]
    subset = RLDataset([first, second], tokenizer, data_config(seed=3), max_samples=4)
    chosen = np.random.default_rng(3).choice(10, size=4, replace=False)
    assert picked(subset) == [questions[i] for i in chosen]


def test_chat_template_kwargs(tokenizer, tmp_path):
    cfg = data_config(
        return_full_prompt=True,
        apply_chat_template_kwargs={"chat_template": "Q: {{ messages[0]['content'] }}"},
    )
    row = RLDataset(write_rows(tmp_path / "d.parquet", ["hi"]), tokenizer, cfg)[0]
    assert row["full_prompts"] == "Q: hi " + INSTRUCTION


def test_dataset_errors(tokenizer, tmp_path):
    path = write_rows(tmp_path / "d.parquet", ["hi"])
    with pytest.raises(KeyError, match=r"no column 'question'.*data_source, prompt, ability"):
        RLDataset(path, tokenizer, data_config(prompt_key="question"))
    with pytest.raises(FileNotFoundError, match=r"data.val_files.*nope.parquet.*jrl.data.gsm8k"):
        RLDataset(
            str(tmp_path / "nope.parquet"), tokenizer, data_config(), config_key="data.val_files"
        )
    with pytest.raises(ValueError, match="data.truncation='sideways'"):
        RLDataset(path, tokenizer, data_config(truncation="sideways"))
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=pq.read_schema(path)), empty)
    with pytest.raises(ValueError, match="no rows left"):
        RLDataset(str(empty), tokenizer, data_config())
    pq.write_table(pa.table({"prompt": ["plain text"]}), tmp_path / "text.parquet")
    with pytest.raises(TypeError, match="text.parquet row 0: column 'prompt' must hold chat"):
        RLDataset(str(tmp_path / "text.parquet"), tokenizer, data_config())[0]


# ---------------------------------------------------------------- loader


def toy_rows(n):
    return [
        {
            "input_ids": np.full(3, i),
            "attention_mask": np.ones(3, int),
            "position_ids": np.arange(3),
            "uid": f"u{i}",
        }
        for i in range(n)
    ]


def epoch_ids(loader, epoch):
    return [batch["input_ids"][:, 0].tolist() for batch in loader.epoch(epoch)]


def test_collate():
    batch = collate(toy_rows(2))
    assert isinstance(batch, Batch) and len(batch) == 2
    assert batch["input_ids"].dtype == np.int32 and batch["input_ids"].shape == (2, 3)
    assert batch.meta["uid"].dtype == object and list(batch.meta["uid"]) == ["u0", "u1"]
    rows = toy_rows(2)
    del rows[1]["uid"]
    with pytest.raises(KeyError, match="row 1 has fields"):
        collate(rows)


def test_loader_length_order_and_reshuffle():
    rows = toy_rows(10)
    assert len(DataLoader(rows, 4, shuffle=True, seed=1)) == 2
    assert len(DataLoader(rows, 4, shuffle=True, seed=1, drop_last=False)) == 3
    assert epoch_ids(DataLoader(rows, 5, shuffle=False, seed=1), 3) == [
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
    ]
    full = DataLoader(rows, 4, shuffle=True, seed=1, drop_last=False)
    epochs = [sum(epoch_ids(full, e), []) for e in range(3)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    again = DataLoader(rows, 4, shuffle=True, seed=1, drop_last=False)
    assert sum(epoch_ids(again, 1), []) == epochs[1]
    other_seed = DataLoader(rows, 4, shuffle=True, seed=2, drop_last=False)
    assert sum(epoch_ids(other_seed, 0), []) != epochs[0]
    assert [len(b) for b in epoch_ids(DataLoader(rows, 4, shuffle=True, seed=1), 0)] == [4, 4]
    with pytest.raises(ValueError, match="larger than the dataset"):
        DataLoader(rows, 11, shuffle=True, seed=1)


def test_loader_state_round_trip():
    rows = toy_rows(12)
    reference = epoch_ids(DataLoader(rows, 3, shuffle=True, seed=5), 1)
    loader = DataLoader(rows, 3, shuffle=True, seed=5)
    assert loader.get_state() == {"epoch": 0, "position": 0}
    stream = loader.epoch(1)
    seen = [next(stream)["input_ids"][:, 0].tolist() for _ in range(2)]
    state = loader.get_state()
    assert state == {"epoch": 1, "position": 2}
    resumed = DataLoader(rows, 3, shuffle=True, seed=5)
    resumed.set_state(state)
    assert seen + epoch_ids(resumed, 1) == reference
    assert resumed.get_state() == {"epoch": 2, "position": 0}
    assert len(epoch_ids(resumed, 2)) == 4


def test_loader_over_rl_dataset(tokenizer, tmp_path):
    path = write_rows(tmp_path / "d.parquet", [f"q{i}" for i in range(5)])
    dataset = RLDataset(path, tokenizer, data_config(return_raw_chat=True))
    (batch,) = list(DataLoader(dataset, 4, shuffle=True, seed=0).epoch(0))
    assert sorted(batch.tensors) == ["attention_mask", "input_ids", "position_ids"]
    assert batch["input_ids"].shape == (4, 64) and batch["input_ids"].dtype == np.int32
    assert {"raw_prompt", "raw_prompt_ids", "reward_model", "extra_info", "index"} <= set(
        batch.meta
    )
    assert sorted(batch.meta["index"]) != [0, 1, 2, 3] or len(set(batch.meta["index"])) == 4
    row = batch.meta["index"][0]
    np.testing.assert_array_equal(batch["input_ids"][0], dataset[row]["input_ids"])


# ---------------------------------------------------------------- gsm8k


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


def test_hub_path_needs_datasets():
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install datasets"):
            load_hub_records("train", 2)
    else:
        pytest.skip("datasets is installed; the hub path would need the network")


def test_offline_rows_are_seeded_short_and_correct(tokenizer):
    rows = make_offline_rows(50, seed=4, split="train")
    assert rows == make_offline_rows(50, seed=4, split="train")
    assert rows != make_offline_rows(50, seed=4, split="test")
    assert rows != make_offline_rows(50, seed=5, split="train")
    for row in rows:
        answer = row["extra_info"]["answer"]
        expression = answer.split(".\n####")[0].split(", ")[-1]
        left, right = expression.split(" = ")
        assert eval(left) == int(right) == int(row["reward_model"]["ground_truth"])
        _, ids = template_ids(tokenizer, row["extra_info"]["question"])
        assert len(ids) <= 100


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
