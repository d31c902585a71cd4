"""Tokenizers and RLDataset: files, template, truncation, padding, filtering, custom classes."""

import sys
import warnings

import fsspec
import ml_collections
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jrl.assets import cache_dir
from jrl.data import RLDataset, create_rl_dataset, load_tokenizer, train_tiny_tokenizer
from jrl.data.gsm8k import INSTRUCTION, gsm8k_rows, make_offline_rows
from jrl.data.prompts import truncate


@pytest.fixture(scope="session")
def tokenizer(train_tokenizer):
    texts = [r["prompt"][0]["content"] for r in make_offline_rows(300, seed=0, split="train")]
    texts += [r["extra_info"]["answer"] for r in make_offline_rows(300, seed=0, split="train")]
    return train_tokenizer(texts, vocab_size=512)


@pytest.fixture
def cfg(tmp_path):
    """A data config factory whose remote-file cache lives in the test's folder."""

    def make(**overrides):
        base = dict(
            prompt_key="prompt",
            max_prompt_length=64,
            truncation="error",
            filter_overlong_prompts=False,
            filter_overlong_prompts_workers=1,
            return_raw_input_ids=False,
            return_raw_chat=False,
            return_full_prompt=False,
            shuffle=True,
            seed=7,
            image_key="images",
            cache_dir=str(tmp_path / "cache"),
            custom_cls={"path": None, "name": None},
        )
        return ml_collections.ConfigDict({**base, **overrides})

    return make


def write_rows(path, questions):
    rows = gsm8k_rows(
        [{"question": q, "answer": f"#### {i}"} for i, q in enumerate(questions)], "t"
    )
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def template_ids(tokenizer, content):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


def questions_of(dataset):
    return [dataset[i]["extra_info"]["question"] for i in range(len(dataset))]


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


# ---------------------------------------------------------------- prompts and truncation


def test_truncate_modes_exact():
    ids = list(range(1, 11))
    assert truncate(ids, 4, "left") == [7, 8, 9, 10]
    assert truncate(ids, 4, "right") == [1, 2, 3, 4]
    assert truncate(ids, 4, "middle") == [1, 2, 9, 10]
    assert truncate(ids, 5, "middle") == [1, 2, 8, 9, 10]
    assert truncate(ids, 10, "left") == ids
    assert truncate(ids, 4, "error") == ids


def test_left_padding_position_ids_and_fields(tokenizer, tmp_path, cfg):
    question = "Tom has 3 apples and gets 5 more. How many apples does Tom have?"
    content = question + " " + INSTRUCTION
    text, ids = template_ids(tokenizer, content)
    length = len(ids) + 3
    config = cfg(
        max_prompt_length=length,
        return_raw_chat=True,
        return_full_prompt=True,
        return_raw_input_ids=True,
    )
    row = RLDataset(write_rows(tmp_path / "d.parquet", [question]), tokenizer, config)[0]
    pad = tokenizer.pad_token_id
    assert row["input_ids"].dtype == np.int32 and row["input_ids"].shape == (length,)
    np.testing.assert_array_equal(row["input_ids"], [pad] * 3 + ids)
    np.testing.assert_array_equal(row["attention_mask"], [0, 0, 0] + [1] * len(ids))
    np.testing.assert_array_equal(row["position_ids"], [0, 0, 0] + list(range(len(ids))))
    assert row["raw_prompt_ids"] == ids
    assert row["full_prompts"] == text
    assert row["raw_prompt"] == [{"role": "user", "content": content}]
    assert row["raw_input_ids"] == tokenizer(content, add_special_tokens=False)["input_ids"]
    assert len(row["raw_input_ids"]) < len(ids)  # no template tokens
    assert row["index"] == 0 and row["data_source"] == "openai/gsm8k"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "0"}
    assert row["extra_info"]["question"] == question  # every other column is carried through
    assert "prompt" not in row  # the messages move to raw_prompt, as verl


def test_optional_fields_are_off_by_default(tokenizer, tmp_path, cfg):
    row = RLDataset(write_rows(tmp_path / "d.parquet", ["hi"]), tokenizer, cfg())[0]
    assert not {"raw_prompt", "full_prompts", "raw_input_ids"} & set(row)


def test_rows_carry_verls_fields_from_extra_info(tokenizer, tmp_path, cfg):
    """verl's dataset gives every row an extra_info ({} where missing or None) and lifts index,
    tools_kwargs and interaction_kwargs out of it."""
    prompt = [{"role": "user", "content": "hi"}]
    tools = {"calc": {"create_kwargs": {"x": 1}}}
    rows = [
        {"prompt": prompt, "data_source": "s", "extra_info": None},
        {"prompt": prompt, "data_source": "s", "extra_info": {"index": 5, "tools_kwargs": tools}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "e.parquet")
    dataset = RLDataset(str(tmp_path / "e.parquet"), tokenizer, cfg(shuffle=False))
    bare, full = dataset[0], dataset[1]
    assert (bare["extra_info"], bare["index"], bare["tools_kwargs"]) == ({}, 0, {})
    assert bare["interaction_kwargs"] == {}
    assert (full["index"], full["tools_kwargs"], full["interaction_kwargs"]) == (5, tools, {})


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_token_level(tokenizer, tmp_path, cfg, mode):
    question = "Ana has 9 books and gives away 4. How many books are left?"
    _, ids = template_ids(tokenizer, question + " " + INSTRUCTION)
    limit = len(ids) - 5
    expected = {
        "left": ids[-limit:],
        "right": ids[:limit],
        "middle": ids[: limit // 2] + ids[-(limit - limit // 2) :],
    }[mode]
    config = cfg(max_prompt_length=limit, truncation=mode)
    row = RLDataset(write_rows(tmp_path / "d.parquet", [question]), tokenizer, config)[0]
    np.testing.assert_array_equal(row["input_ids"], expected)
    assert row["raw_prompt_ids"] == expected
    assert row["attention_mask"].sum() == limit


def test_too_long_prompt_with_truncation_error(tokenizer, tmp_path, cfg):
    path = write_rows(tmp_path / "d.parquet", ["short", "a much longer question " * 10])
    dataset = RLDataset(path, tokenizer, cfg(max_prompt_length=40))
    dataset[0]
    with pytest.raises(ValueError, match=r"d.parquet row 1 has a prompt of \d+ tokens.*=40"):
        dataset[1]


def test_plain_string_prompts_become_one_user_message(tokenizer, tmp_path, cfg):
    pq.write_table(pa.table({"question": ["What is 2 + 2?"]}), tmp_path / "s.parquet")
    config = cfg(prompt_key="question", return_raw_chat=True)
    row = RLDataset(str(tmp_path / "s.parquet"), tokenizer, config)[0]
    assert row["raw_prompt"] == [{"role": "user", "content": "What is 2 + 2?"}]
    _, ids = template_ids(tokenizer, "What is 2 + 2?")
    assert row["raw_prompt_ids"] == ids


def test_chat_template_kwargs(tokenizer, tmp_path, cfg):
    config = cfg(
        return_full_prompt=True,
        apply_chat_template_kwargs={"chat_template": "Q: {{ messages[0]['content'] }}"},
    )
    row = RLDataset(write_rows(tmp_path / "d.parquet", ["hi"]), tokenizer, config)[0]
    assert row["full_prompts"] == "Q: hi " + INSTRUCTION


# ---------------------------------------------------------------- filtering and sampling


def test_filter_overlong_prompts(tokenizer, tmp_path, cfg):
    questions = ["a much longer question " * 10, "short", "long again " * 20]
    path = write_rows(tmp_path / "d.parquet", questions)
    dataset = RLDataset(path, tokenizer, cfg(filter_overlong_prompts=True))
    assert questions_of(dataset) == ["short"]
    with pytest.raises(ValueError, match=r"every prompt in .*d.parquet is longer than .*=5"):
        RLDataset(path, tokenizer, cfg(max_prompt_length=5, filter_overlong_prompts=True))


def test_filter_with_two_workers_matches_one(tokenizer, tmp_path, cfg):
    rng = np.random.default_rng(0)
    questions = [" ".join(["word"] * int(n)) for n in rng.integers(1, 40, size=40)]
    path = write_rows(tmp_path / "d.parquet", questions)
    limit = len(template_ids(tokenizer, questions[0] + " " + INSTRUCTION)[1]) + 5
    kept = {}
    for workers in (1, 2):
        config = cfg(
            max_prompt_length=limit,
            filter_overlong_prompts=True,
            filter_overlong_prompts_workers=workers,
        )
        kept[workers] = questions_of(RLDataset(path, tokenizer, config))
    assert kept[1] == kept[2]
    expected = [
        q for q in questions if len(template_ids(tokenizer, q + " " + INSTRUCTION)[1]) <= limit
    ]
    assert kept[1] == expected and 0 < len(expected) < len(questions)


def test_max_samples_and_file_lists(tokenizer, tmp_path, cfg):
    first = write_rows(tmp_path / "a.parquet", [f"q{i}" for i in range(6)])
    second = write_rows(tmp_path / "b.parquet", [f"r{i}" for i in range(4)])
    questions = [f"q{i}" for i in range(6)] + [f"r{i}" for i in range(4)]
    assert questions_of(RLDataset([first, second], tokenizer, cfg())) == questions
    # Any sequence of paths works (a tuple here), as does one path.
    assert questions_of(RLDataset((first,), tokenizer, cfg())) == questions[:6]
    assert questions_of(RLDataset(first, tokenizer, cfg())) == questions[:6]
    head = RLDataset([first, second], tokenizer, cfg(shuffle=False), max_samples=3)
    assert questions_of(head) == questions[:3]
    subset = RLDataset([first, second], tokenizer, cfg(seed=3), max_samples=4)
    chosen = np.random.default_rng(3).choice(10, size=4, replace=False)
    assert questions_of(subset) == [questions[i] for i in chosen]
    assert len(RLDataset([first, second], tokenizer, cfg(), max_samples=-1)) == 10


# ---------------------------------------------------------------- remote files


def test_remote_files_through_fsspec_are_cached_locally(tokenizer, tmp_path, cfg):
    local = write_rows(tmp_path / "d.parquet", ["remote one", "remote two"])
    url = "memory://bucket/jrl-test/train.parquet"
    fs = fsspec.filesystem("memory")
    fs.put_file(local, "/bucket/jrl-test/train.parquet")
    try:
        dataset = RLDataset([url, local], tokenizer, cfg(), config_key="data.val_files")
        assert questions_of(dataset) == ["remote one", "remote two"] * 2
        copies = list((tmp_path / "cache").rglob("train.parquet"))
        assert len(copies) == 1
        # A changed remote file is fetched again; an unchanged one reuses the copy.
        write_rows(tmp_path / "e.parquet", ["changed"])
        fs.put_file(str(tmp_path / "e.parquet"), "/bucket/jrl-test/train.parquet")
        assert questions_of(RLDataset(url, tokenizer, cfg())) == ["changed"]
        assert questions_of(RLDataset(url, tokenizer, cfg())) == ["changed"]
        assert len(list((tmp_path / "cache").rglob("train.parquet"))) == 2
        with pytest.raises(FileNotFoundError, match=r"data.val_files: remote file .*nope"):
            RLDataset("memory://bucket/nope.parquet", tokenizer, cfg(), config_key="data.val_files")
    finally:
        fs.rm("/bucket", recursive=True)


def test_unknown_protocol_names_the_backend(tokenizer, cfg):
    with pytest.raises(
        ImportError, match=r"data.train_files: cannot open 'nosuch://x/train.parquet'.*gcsfs"
    ):
        RLDataset("nosuch://x/train.parquet", tokenizer, cfg())


# ---------------------------------------------------------------- bad input


def test_dataset_errors_name_file_column_and_row(tokenizer, tmp_path, cfg):
    path = write_rows(tmp_path / "d.parquet", ["hi"])
    with pytest.raises(KeyError, match=r"d.parquet has no column 'question'.*data_source, prompt"):
        RLDataset(path, tokenizer, cfg(prompt_key="question"))
    with pytest.raises(FileNotFoundError, match=r"data.val_files.*nope.parquet.*jrl.data.gsm8k"):
        RLDataset(str(tmp_path / "nope.parquet"), tokenizer, cfg(), config_key="data.val_files")
    with pytest.raises(ValueError, match="data.truncation='sideways'"):
        RLDataset(path, tokenizer, cfg(truncation="sideways"))
    with pytest.raises(ValueError, match="data.train_files is empty"):
        RLDataset([], tokenizer, cfg())
    with pytest.raises(TypeError, match=r"data.train_files\[1\] must be a path"):
        RLDataset([path, 3], tokenizer, cfg())


def test_empty_and_non_parquet_files(tokenizer, tmp_path, cfg):
    path = write_rows(tmp_path / "d.parquet", ["hi"])
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=pq.read_schema(path)), empty)
    with pytest.raises(ValueError, match=r"data.train_files: .*empty.parquet has no rows"):
        RLDataset([path, str(empty)], tokenizer, cfg())
    text = tmp_path / "rows.json"
    text.write_text('[{"prompt": "hi"}]')
    with pytest.raises(ValueError, match=r"rows.json is not a readable parquet file"):
        RLDataset(str(text), tokenizer, cfg())


@pytest.mark.parametrize(
    "prompt, problem",
    [
        ([{"role": "user"}], "message 0"),
        ([{"role": "user", "content": "ok"}, {"content": "no role"}], "message 1"),
        ([], "got list"),
        (None, "got NoneType"),
    ],
)
def test_malformed_chat_messages_name_the_row(tokenizer, tmp_path, cfg, prompt, problem):
    rows = [{"prompt": [{"role": "user", "content": "fine"}]}, {"prompt": prompt}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    with pytest.raises(TypeError, match=rf"chat.parquet row 1: column 'prompt'.*{problem}"):
        RLDataset(str(tmp_path / "chat.parquet"), tokenizer, cfg())


def test_images_on_a_text_only_model(tokenizer, tmp_path, cfg):
    rows = [
        {"prompt": "no image", "images": []},
        {"prompt": "with image", "images": [{"bytes": b"\x89PNG", "path": "a.png"}]},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mm.parquet")
    with pytest.raises(ValueError, match=r"mm.parquet row 1 has images in column 'images'"):
        RLDataset(str(tmp_path / "mm.parquet"), tokenizer, cfg())
    # With image_key pointing elsewhere, or no images in any row, the column is just carried.
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "text.parquet")
    assert RLDataset(str(tmp_path / "text.parquet"), tokenizer, cfg())[0]["images"] == []


# ---------------------------------------------------------------- custom dataset classes

CUSTOM_DATASET = '''
from jrl.data.rl_dataset import RLDataset


class Reversed(RLDataset):
    """Rows in reverse order."""

    def __getitem__(self, index):
        return super().__getitem__(len(self) - 1 - index)


class Plain:
    def __init__(self, data_files, tokenizer, config, max_samples):
        self.args = (data_files, config.max_prompt_length, max_samples)

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return {"args": self.args}


def not_a_dataset(**kwargs):
    return 42
'''


def test_custom_dataset_class(tokenizer, tmp_path, cfg, monkeypatch):
    path = write_rows(tmp_path / "d.parquet", ["q0", "q1", "q2"])
    module = tmp_path / "my_data.py"
    module.write_text(CUSTOM_DATASET)
    reversed_set = create_rl_dataset(
        path, tokenizer, cfg(custom_cls={"path": str(module), "name": "Reversed"})
    )
    assert questions_of(reversed_set) == ["q2", "q1", "q0"]
    monkeypatch.syspath_prepend(str(tmp_path))
    plain = create_rl_dataset(
        [path], tokenizer, cfg(custom_cls={"path": "pkg://my_data", "name": "Plain"}), 2
    )
    assert plain[0] == {"args": ([path], 64, 2)}
    assert type(create_rl_dataset(path, tokenizer, cfg())) is RLDataset
    sys.modules.pop("my_data", None)


def test_custom_dataset_errors(tokenizer, tmp_path, cfg):
    path = write_rows(tmp_path / "d.parquet", ["q0"])
    module = tmp_path / "my_data.py"
    module.write_text(CUSTOM_DATASET)
    cases = [
        ({"path": str(tmp_path / "missing.py"), "name": "X"}, FileNotFoundError, "does not"),
        ({"path": str(module), "name": None}, ValueError, "data.custom_cls.name is not set"),
        ({"path": None, "name": "Plain"}, ValueError, "data.custom_cls.path is not set"),
        ({"path": str(module), "name": "Nope"}, AttributeError, "defines Reversed, Plain"),
        ({"path": "pkg://no_such_module_here", "name": "X"}, ModuleNotFoundError, "cannot be"),
        ({"path": str(module), "name": "not_a_dataset"}, TypeError, "lacks __len__"),
    ]
    for custom_cls, error, message in cases:
        with pytest.raises(error, match=message):
            create_rl_dataset(path, tokenizer, cfg(custom_cls=custom_cls))
