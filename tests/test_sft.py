"""SFT: documented keys, config rules, the dataset (nested keys, chat prompts, EOS in the loss,
truncation, multi-turn, custom classes), optimizers and schedules against torch, the loss with
every kernel and packing, and tiny training runs (held-out loss falls, exact resume, LoRA, memory
options)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from flax import nnx
from helpers import flatten, tiny_llama
from sft_digits import SFT_CARD, digits_sft_args

from jrl.assets import prepare_digits, prepare_tiny
from jrl.compile_cache import enable_compilation_cache
from jrl.config import (
    ConfigError,
    apply_overrides,
    evaluation_config,
    generation_config,
    load_config_file,
    resolve,
    sft_config,
)
from jrl.config.entry import load_entry_config
from jrl.config.tree import key_paths, lookup
from jrl.config.trees import SFT
from jrl.data.sft_dataset import SFTDataset, create_sft_dataset
from jrl.data.tokenizer import load_tokenizer
from jrl.models import LoRAParam, init_random
from jrl.models.lora import adapted_modules, linear_layers
from jrl.optim.optimizers import make_sft_optimizer
from jrl.optim.schedule import Schedule, wsd_multiplier
from jrl.optim.settings import optimizer_family
from jrl.runspec.optim import sft_optimizer_settings
from jrl.runspec.spec import resolve_sft_run
from jrl.runspec.validate import validate_sft
from jrl.trainer.sft.loss import SFTLoss, row_nll
from jrl.trainer.update.packing import with_packing

REPO = Path(__file__).parents[1]
DOCUMENT = Path(__file__).parents[2] / "shared" / "reference" / "000_6f542af57068b9ca.txt"
EVAL_CARD = str(REPO / "configs" / "eval.py")
FORWARD = ("input_ids", "attention_mask", "position_ids")


# --- the document's SFT and evaluation sections ------------------------------------------------


def _document_section(start: str, end: str) -> dict:
    """Leaf path -> value of every YAML block between the headings `start` and `end`."""
    text = DOCUMENT.read_text(encoding="utf-8")
    lines = text[text.index(start) : text.index(end)].splitlines()
    flat, first = {}, 0
    while first < len(lines):
        if not re.fullmatch(r"[a-z_]+:\s*", lines[first]):
            first += 1
            continue
        last = first + 1
        while last < len(lines) and (not lines[last].strip() or lines[last][0].isspace()):
            last += 1
        flat.update(flatten(yaml.safe_load("\n".join(lines[first:last]))))
        first = last
    return flat


def _value(config, path):
    parent, key = lookup(config, path)
    value = parent[key]
    return value.to_dict() if hasattr(value, "to_dict") else value


@pytest.mark.skipif(not DOCUMENT.exists(), reason=f"configuration document absent: {DOCUMENT}")
@pytest.mark.parametrize(
    "card, start, end, at_least",
    [
        (SFT_CARD, "SFT 训练配置", "其他补充说明", 20),
        (EVAL_CARD, "评估配置（evaluation.yaml）", "SFT 训练配置", 7),
    ],
)
def test_cards_hold_every_documented_key_with_its_default(card, start, end, at_least):
    documented = _document_section(start, end)
    assert len(documented) >= at_least, "document extraction found too few keys"
    card_config = resolve(load_config_file(card)[0])
    defaults = sft_config() if card == SFT_CARD else evaluation_config()
    wrong = []
    for path, expected in documented.items():
        if isinstance(expected, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", expected):
            expected = float(expected)
        for name, config in (("card", card_config), ("defaults", defaults)):
            try:
                value = _value(config, path)
            except ConfigError:
                wrong.append(f"{name}: {path} missing")
                continue
            if value != expected or isinstance(value, bool) != isinstance(expected, bool):
                wrong.append(f"{name}: {path}: {value!r} != documented {expected!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("make", [sft_config, generation_config, evaluation_config])
def test_every_null_default_is_typed(make):
    config = make()
    for path in key_paths(config):
        parent, key = lookup(config, path)
        assert not (parent[key] is None and parent.get_type(key) is type(None)), path
        assert "${" not in str(parent[key]), path


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.train_batch_size=10"], r"multiple of the data-parallel ranks .* = 32"),
        (["data.micro_batch_size_per_gpu=null"], "set data.micro_batch_size_per_gpu"),
        (["data.truncation=middle"], "data.truncation='middle' is not supported"),
        (["optim.lr_scheduler=linear"], "use one of cosine, wsd"),
        (["optim.override_optimizer_config={amsgrad: true}"], "amsgrad=True is not supported"),
        (["model.lora_rank=4", "model.lora_alpha=0"], "model: lora_alpha must be positive"),
        (["model.fsdp_config.model_dtype=fp16"], "model_dtype='fp16'"),
        (["trainer.resume_mode=resume_path"], "needs trainer.resume_from_path"),
        (["trainer.checkpoint.save_contents=[model,weights]"], r"unknown \['weights'\]"),
        (["data.max_length=1"], "at least 2"),
        (["model.strategy=megatron"], "model.strategy='megatron' is not supported"),
        (["ulysses_sequence_parallel_size=2"], "needs use_remove_padding=True"),
    ],
)
def test_config_rules_name_the_keys(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_entry_config(overrides, SFT, validate_sft)


def test_deprecated_global_micro_batch_size_is_divided_by_the_devices():
    config = load_entry_config(
        ["data.micro_batch_size=64", "data.micro_batch_size_per_gpu=null"],
        SFT,
        validate_sft,
    )
    assert config.data.micro_batch_size == 64
    with pytest.raises(ConfigError, match="multiple of the data-parallel ranks"):
        load_entry_config(
            ["data.micro_batch_size=96", "data.micro_batch_size_per_gpu=null"],
            SFT,
            validate_sft,
        )


def test_with_micro_batch_size_per_gpu_set_the_global_size_has_no_effect():
    """verl's SFT trainer reads only micro_batch_size_per_gpu (its scripts set both)."""
    config = load_entry_config(["data.micro_batch_size=3"], SFT, validate_sft)
    with pytest.warns(UserWarning, match=r"data.micro_batch_size=3 has no effect: .* \(4\)"):
        run = resolve_sft_run(config, "actor")
    assert run.model.split.micro_rows == 4


# --- the dataset ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_tokenizer():
    """One token per character: '0'..'9' are ids 1..10, '=' is 11, EOS = pad = 0."""
    return load_tokenizer(prepare_digits()["model_path"])


def _parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def _data(**changes):
    return apply_overrides(sft_config(), [(f"data.{k}", v) for k, v in changes.items()]).data


def test_nested_keys_chat_template_and_eos_in_the_loss(tmp_path, digits_tokenizer):
    rows = [{"extra_info": {"question": "12=", "answer": "3"}}, {"extra_info": {"question": "4="}}]
    rows[1]["extra_info"]["answer"] = "56"
    files = _parquet(tmp_path / "t.parquet", rows)
    dict_keys = _data(
        prompt_key="extra_info",
        response_key="extra_info",
        prompt_dict_keys=["question"],
        response_dict_keys=["answer"],
        max_length=8,
    )
    by_dict_keys = SFTDataset(files, digits_tokenizer, dict_keys)
    by_path = SFTDataset(
        files,
        digits_tokenizer,
        _data(prompt_key="extra_info.question", response_key="extra_info.answer", max_length=8),
    )
    wrapped = _parquet(
        tmp_path / "w.parquet", [{"extra_info": [row["extra_info"]]} for row in rows]
    )
    in_lists = SFTDataset(wrapped, digits_tokenizer, dict_keys)  # verl's series_to_item
    for index in range(2):
        for key in ("input_ids", "attention_mask", "position_ids", "loss_mask"):
            np.testing.assert_array_equal(by_path[index][key], by_dict_keys[index][key])
            np.testing.assert_array_equal(in_lists[index][key], by_dict_keys[index][key])
    row = by_path[0]  # "12=" then "3" then EOS (0), padded with 0
    np.testing.assert_array_equal(row["input_ids"], [2, 3, 11, 4, 0, 0, 0, 0])
    np.testing.assert_array_equal(row["attention_mask"], [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(row["position_ids"], [0, 1, 2, 3, 4, 4, 4, 4])
    np.testing.assert_array_equal(row["loss_mask"], [0, 0, 0, 1, 1, 0, 0, 0])  # EOS trained
    np.testing.assert_array_equal(by_path[1]["loss_mask"], [0, 0, 1, 1, 1, 0, 0, 0])


def test_chat_message_prompts_template_kwargs_and_max_samples(tmp_path):
    template = "{% if flag %}9{% endif %}{{ messages | map(attribute='content') | join('') }}"
    tokenizer = load_tokenizer(prepare_digits()["model_path"], custom_chat_template=template)
    rows = [
        {"prompt": [{"role": "user", "content": "7"}, {"role": "user", "content": "="}], "a": "9"},
        {"prompt": "8=", "a": "1"},
    ]
    files = _parquet(tmp_path / "t.parquet", [rows[0]])
    data = _data(prompt_key="prompt", response_key="a", max_length=6)
    row = SFTDataset(files, tokenizer, data)[0]
    np.testing.assert_array_equal(row["input_ids"], [8, 11, 10, 0, 0, 0])
    np.testing.assert_array_equal(row["loss_mask"], [0, 0, 1, 1, 0, 0])
    flagged = _data(prompt_key="prompt", response_key="a", max_length=6)
    flagged = apply_overrides(flagged, [("+apply_chat_template_kwargs.flag", True)])
    np.testing.assert_array_equal(
        SFTDataset(files, tokenizer, flagged)[0]["input_ids"], [10, 8, 11, 10, 0, 0]
    )
    second = _parquet(tmp_path / "u.parquet", [rows[1]] * 3)
    assert len(SFTDataset([files, second], tokenizer, data)) == 4
    assert len(SFTDataset([files, second], tokenizer, data, max_samples=2)) == 2


@pytest.mark.parametrize(
    "truncation, ids, loss",
    [
        ("left", [3, 4, 11, 5, 6, 0], [0, 0, 0, 1, 1, 1]),
        ("right", [1, 2, 3, 4, 11, 5], [0, 0, 0, 0, 0, 1]),
    ],
)
def test_truncation_keeps_the_end_or_the_start(tmp_path, digits_tokenizer, truncation, ids, loss):
    files = _parquet(tmp_path / "t.parquet", [{"q": "0123=", "a": "45"}])
    data = _data(prompt_key="q", response_key="a", max_length=6, truncation=truncation)
    row = SFTDataset(files, digits_tokenizer, data)[0]
    np.testing.assert_array_equal(row["input_ids"], ids)
    np.testing.assert_array_equal(row["loss_mask"], loss)


def test_bad_rows_fail_naming_the_file_row_and_key(tmp_path, digits_tokenizer):
    files = _parquet(tmp_path / "t.parquet", [{"q": "12=", "a": "3"}, {"q": "0123456=", "a": "5"}])
    with pytest.raises(ValueError, match=r"t.parquet row 1 has 10 tokens .* data.max_length=8"):
        SFTDataset(files, digits_tokenizer, _data(prompt_key="q", response_key="a", max_length=8))[
            1
        ]
    numbers = _parquet(tmp_path / "n.parquet", [{"q": "1=", "a": 5}])
    data = _data(prompt_key="q", response_key="a", max_length=16)
    with pytest.raises(TypeError, match=r"n.parquet row 0: the response \(a\) must be a string"):
        SFTDataset(numbers, digits_tokenizer, data)[0]
    with pytest.raises(KeyError, match=r"no column 'answer' \(data.response_key\); its columns"):
        SFTDataset(files, digits_tokenizer, _data(prompt_key="q", response_key="answer"))
    with pytest.raises(KeyError, match=r"row 0: no field 'q.text' \(data.prompt_key"):
        SFTDataset(files, digits_tokenizer, _data(prompt_key="q.text", response_key="a"))[0]


@pytest.fixture(scope="module")
def chatml_tokenizer():
    return load_tokenizer(prepare_tiny()["model_path"])


def test_multiturn_trains_on_assistant_replies_and_their_end_of_turn(tmp_path, chatml_tokenizer):
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How many?"},
        {"role": "assistant", "content": "3 books"},
        {"role": "user", "content": "And pens?"},
        {"role": "assistant", "content": "5 pens"},
    ]
    files = _parquet(tmp_path / "t.parquet", [{"messages": conversation}])
    data = _data(max_length=128)
    data.multiturn.enable = True
    row = SFTDataset(files, chatml_tokenizer, data)[0]
    ids, loss = row["input_ids"], row["loss_mask"].astype(bool)
    length = int(row["attention_mask"].sum())
    full = chatml_tokenizer.apply_chat_template(conversation, tokenize=False)
    assert chatml_tokenizer.decode(ids[:length]) == full
    trained = chatml_tokenizer.decode(ids[loss])
    assert trained == "3 books<|im_end|>\n5 pens<|im_end|>\n"
    untrained = chatml_tokenizer.decode(ids[:length][~loss[:length]])
    assert "How many?" in untrained and "<|im_start|>assistant\n" in untrained


def test_a_messages_own_loss_mask_overrides_its_tokens(tmp_path, chatml_tokenizer):
    """verl's multi-turn override: loss_mask 0 keeps an assistant reply out of the loss, and
    loss_mask 1 trains every token a message adds, the assistant header included."""
    conversation = [
        {"role": "user", "content": "one?", "loss_mask": None},
        {"role": "assistant", "content": "one", "loss_mask": 0},
        {"role": "user", "content": "two?", "loss_mask": None},
        {"role": "assistant", "content": "two", "loss_mask": 1},
    ]
    files = _parquet(tmp_path / "t.parquet", [{"messages": conversation}])
    data = _data(max_length=128)
    data.multiturn.enable = True
    row = SFTDataset(files, chatml_tokenizer, data)[0]
    trained = chatml_tokenizer.decode(row["input_ids"][row["loss_mask"].astype(bool)])
    assert trained == "<|im_start|>assistant\ntwo<|im_end|>\n"
    conversation[1]["loss_mask"] = 2
    bad = _parquet(tmp_path / "b.parquet", [{"messages": conversation}])
    with pytest.raises(ValueError, match="row 0: message 1 has loss_mask=2; use 0, 1 or null"):
        SFTDataset(bad, chatml_tokenizer, data)[0]


def test_multiturn_passes_tools_and_thinking_columns_to_the_template(tmp_path, digits_tokenizer):
    template = (
        "{% if tools %}{{ tools | length }}{% endif %}{% if enable_thinking %}9{% endif %}"
        "{{ messages | map(attribute='content') | join('') }}"
    )
    data = _data(max_length=8, chat_template=template)
    data.multiturn.enable = True
    messages = [{"role": "user", "content": "1="}, {"role": "assistant", "content": "2"}]
    tools = [{"name": "a"}, {"name": "b"}]
    files = [
        _parquet(tmp_path / "t.parquet", [{"messages": messages, "tools": tools}]),
        _parquet(
            tmp_path / "u.parquet",
            [{"messages": messages, "tools": json.dumps(tools), "enable_thinking": True}],
        ),
    ]
    tokenizer = load_tokenizer(prepare_digits()["model_path"], custom_chat_template=template)
    dataset = SFTDataset(files, tokenizer, data)
    # "2" (two tools), "9" (thinking), "1=" (user), "2" (assistant, trained), EOS padding
    np.testing.assert_array_equal(dataset[0]["input_ids"], [3, 2, 11, 3, 0, 0, 0, 0])
    np.testing.assert_array_equal(dataset[1]["input_ids"], [3, 10, 2, 11, 3, 0, 0, 0])
    np.testing.assert_array_equal(dataset[1]["loss_mask"], [0, 0, 0, 0, 1, 0, 0, 0])


def test_custom_dataset_class(tmp_path, digits_tokenizer):
    module = tmp_path / "mine.py"
    module.write_text(
        "class Mine:\n"
        "    def __init__(self, parquet_files, tokenizer, config, max_samples):\n"
        "        self.files, self.length = parquet_files, config.max_length\n"
        "    def __len__(self):\n"
        "        return 1\n"
        "    def __getitem__(self, i):\n"
        "        return {'input_ids': [1] * self.length}\n"
    )
    data = _data(max_length=4)
    data.custom_cls.path, data.custom_cls.name = str(module), "Mine"
    dataset = create_sft_dataset("x.parquet", digits_tokenizer, data)
    assert type(dataset).__name__ == "Mine" and dataset.files == ["x.parquet"]
    assert dataset[0]["input_ids"] == [1, 1, 1, 1]
    # verl v0.6.0's signature has no max_samples: the class is called without it
    module.write_text(module.read_text().replace(", max_samples):", "):"))
    data.custom_cls.name = "Mine"
    old = create_sft_dataset("x.parquet", digits_tokenizer, data)
    assert old.files == ["x.parquet"]


# --- optimizers and schedules ----------------------------------------------------------------


@pytest.mark.parametrize(
    "name, impl, family, low",
    [
        ("AdamW", "torch.optim", "adamw", False),
        ("SGD", "torch.optim", "sgd", False),
        ("AdamW8bit", "torchao.optim", "adamw", True),
        ("_AdamW", "torchao.optim", "adamw", False),
        ("AdamWFp8", "torchao.optim", "adamw", True),
        ("PagedAdamW32bit", "bitsandbytes.optim", "adamw", False),
        ("Adam8bit", "bitsandbytes.optim", "adam", True),
        ("SGD8bit", "bitsandbytes.optim", "sgd", True),
    ],
)
def test_optimizer_names_map_to_optax_families(name, impl, family, low):
    assert optimizer_family(name, impl) == (family, low)


@pytest.mark.parametrize(
    "name, impl, message",
    [
        ("Lion", "bitsandbytes.optim", "has no optax equivalent"),
        ("AdamW8bit", "torch.optim", "use AdamW, Adam or SGD$"),
        ("AdamW", "apex.optimizers", "optim.optimizer_impl='apex.optimizers' is not supported"),
    ],
)
def test_unknown_optimizers_fail_clearly(name, impl, message):
    with pytest.raises(ValueError, match=message):
        optimizer_family(name, impl)


def _optim(**changes):
    """The settings of SFT's ``optim`` section with `changes`."""
    section = apply_overrides(sft_config(), [(f"optim.{k}", v) for k, v in changes.items()]).optim
    return sft_optimizer_settings(section)


def sft_lr(settings, step, total_steps):
    return Schedule.from_settings(settings, total_steps)(step)


def test_low_precision_variants_warn_and_bad_options_fail():
    with pytest.warns(UserWarning, match="float32 state"):
        make_sft_optimizer(_optim(optimizer="AdamW8bit", optimizer_impl="torchao.optim"))
    with pytest.raises(ValueError, match=r"\['momentum'\] are not options of adamw"):
        _optim(override_optimizer_config={"momentum": 0.9})
    with pytest.raises(ValueError, match="amsgrad=True is not supported"):
        _optim(override_optimizer_config={"amsgrad": True})
    with pytest.raises(ValueError, match="dampening must be 0"):
        _optim(optimizer="SGD", override_optimizer_config={"dampening": 0.1})
    make_sft_optimizer(_optim(override_optimizer_config={"fused": True, "foreach": False}))


@pytest.mark.parametrize(
    "optimizer, override",
    [
        ("AdamW", None),
        ("Adam", {"eps": 1e-3, "betas": [0.8, 0.9]}),
        ("SGD", {"momentum": 0.9, "nesterov": True}),
        ("SGD", None),
    ],
)
def test_optimizers_follow_torch(optimizer, override):
    torch = pytest.importorskip("torch")
    cfg = _optim(optimizer=optimizer, lr=0.1, weight_decay=0.3, override_optimizer_config=override)
    rng = np.random.default_rng(0)
    start = rng.standard_normal(5).astype(np.float32)
    grads = [rng.standard_normal(5).astype(np.float32) for _ in range(3)]
    kwargs = {"lr": 0.1, "weight_decay": 0.3, **(override or {})}
    if optimizer != "SGD":
        kwargs.setdefault("betas", (0.9, 0.95))
    weight = torch.nn.Parameter(torch.tensor(start))
    reference = getattr(torch.optim, optimizer)([weight], **kwargs)
    tx = make_sft_optimizer(cfg)
    params = {"w": jnp.asarray(start)}
    state = tx.init(params)
    for grad in grads:
        weight.grad = torch.tensor(grad)
        reference.step()
        updates, state = tx.update({"w": jnp.asarray(grad)}, state, params)
        params = optax.apply_updates(params, updates)
    np.testing.assert_allclose(params["w"], weight.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_cosine_and_wsd_schedules():
    cosine = _optim(lr=2.0, lr_warmup_steps_ratio=0.25)
    lrs = [sft_lr(cosine, step, 8) for step in range(9)]
    np.testing.assert_allclose(lrs[:3], [0.0, 1.0, 2.0])  # warmup int(0.25 * 8) = 2 steps
    np.testing.assert_allclose(lrs[5], 1.0, atol=1e-12)  # half way through the cosine
    assert lrs[8] == pytest.approx(0.0, abs=1e-12)
    wsd = _optim(lr=2.0, lr_warmup_steps_ratio=0.1, lr_scheduler="wsd")
    # 100 steps: 10 warmup, 81 stable (90% of 90), 9 of cosine decay
    values = {s: sft_lr(wsd, s, 100) for s in (0, 5, 10, 90, 91, 95, 100)}
    assert values == pytest.approx(
        {0: 0.0, 5: 1.0, 10: 2.0, 90: 2.0, 91: 2.0, 95: 1.0 + np.cos(np.pi * 4 / 9), 100: 0.0}
    )
    assert wsd_multiplier(3, 0, 3) == 0.0
    # verl v0.6.0's SFT name of the warm-up ratio, read over lr_warmup_steps_ratio when set
    old_name = _optim(lr=2.0, lr_warmup_steps_ratio=0.0, warmup_steps_ratio=0.25)
    assert [sft_lr(old_name, step, 8) for step in range(3)] == pytest.approx([0.0, 1.0, 2.0])


def test_optim_eps_reaches_the_optimizer():
    """verl's SFT reads ``+optim.eps`` (default 1e-8)."""
    section = apply_overrides(sft_config(), [("+optim.eps", 1e-3)]).optim
    assert sft_optimizer_settings(section).options()["eps"] == 1e-3
    assert _optim().options()["eps"] == 1e-8


# --- the loss ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_and_batch():
    model = init_random(tiny_llama(), seed=3)
    rng = np.random.default_rng(1)
    ids = rng.integers(2, 64, (4, 12)).astype(np.int32)
    lengths = np.array([12, 9, 5, 7])
    attention = (np.arange(12)[None] < lengths[:, None]).astype(np.int32)
    loss_mask = attention * (np.arange(12)[None] >= 3)
    tensors = {
        "input_ids": ids,
        "attention_mask": attention,
        "position_ids": np.clip(np.cumsum(attention, 1) - 1, 0, None).astype(np.int32),
        "responses": ids[:, 1:],
        "response_mask": loss_mask[:, 1:].astype(np.float32),
    }
    return model, tensors


def test_loss_is_the_token_mean_cross_entropy_with_every_kernel_and_packing(
    tiny_model_and_batch,
):
    model, tensors = tiny_model_and_batch
    graphdef, state = nnx.split(model)
    logits = jax.jit(lambda s, t: nnx.merge(graphdef, s)(*(t[k] for k in FORWARD)))(state, tensors)
    log_probs = jax.nn.log_softmax(logits[:, :-1], -1)
    picked = np.take_along_axis(np.asarray(log_probs), tensors["responses"][..., None], -1)[..., 0]
    mask = tensors["response_mask"]
    expected = -(picked * mask).sum() / mask.sum()
    norm = {"token-mean": jnp.asarray(mask.sum())}
    for impl in ("naive", "auto"):  # model.use_liger false / true
        loss = jax.jit(lambda s, t, i=impl: SFTLoss(i)(nnx.merge(graphdef, s), t, norm)[0])
        assert float(loss(state, tensors)) == pytest.approx(expected, rel=1e-5)
    packed, layout = with_packing(tensors, 4, None)  # use_remove_padding
    assert layout.rows < 4  # the four sequences share fewer rows
    per_row = jax.jit(lambda s, t: row_nll(nnx.merge(graphdef, s), t, "naive", layout))
    np.testing.assert_allclose(per_row(state, packed), -(picked * mask).sum(-1), rtol=1e-5)


# --- training runs --------------------------------------------------------------------------------


def _trainer(run_dir: Path, *overrides: str):
    """An SFT trainer of the digits task (compiled programs shared through the persistent
    cache, as `python -m jrl.sft` shares them)."""
    from jrl.trainer.sft.trainer import SFTTrainer

    enable_compilation_cache()
    return SFTTrainer.from_config(
        load_entry_config(digits_sft_args(run_dir, *overrides), SFT, validate_sft)
    )


def _metrics(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {row["step"]: row["data"] for row in map(json.loads, lines)}


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """8 steps on the digits task, 2 devices x 2 micro-batches, checkpoints at steps 4 and 8."""
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    trainer = _trainer(run_dir)
    before = trainer.validate(0)["val/loss"]
    last = trainer.fit()
    return run_dir, before, last


def test_sft_lowers_the_held_out_loss(digits_run):
    run_dir, before, last = digits_run
    assert before > 2.0  # a random model: about ln(12) per token
    assert last["val/loss"] < before - 0.4
    metrics = _metrics(run_dir)
    assert sorted(metrics) == list(range(1, 9))
    assert {"val/loss"} <= set(metrics[4]) and "val/loss" not in metrics[3]
    for key in ("train/loss", "train/lr(1e-3)", "train/grad_norm", "train/time(s)"):
        assert np.isfinite(metrics[1][key]), key
    # verl's schedule spans total_epochs (4) x 64 steps, not total_training_steps, and the rate
    # logged is the one after the step (its scheduler steps first): cosine, no warm-up
    for step in (1, 8):
        expected = 3.0 * 0.5 * (1 + math.cos(math.pi * step / 256))
        assert metrics[step]["train/lr(1e-3)"] == pytest.approx(expected, rel=1e-6)
    assert metrics[8]["train/loss"] < metrics[1]["train/loss"]
    assert (run_dir / "global_step_4" / "actor" / "optimizer").is_dir()
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == "8"


def test_resume_from_a_checkpoint_replays_the_same_steps(digits_run, tmp_path):
    run_dir, _, _ = digits_run
    resumed_dir = tmp_path / "resumed"
    trainer = _trainer(  # resume_mode=auto (the default) reads resume_from_path in verl's SFT
        resumed_dir,
        f"trainer.resume_from_path={run_dir / 'global_step_4'}",
        "trainer.save_freq=1",
        "trainer.max_ckpt_to_keep=1",
    )
    trainer.fit()
    original, resumed = _metrics(run_dir), _metrics(resumed_dir)
    assert sorted(resumed) == [5, 6, 7, 8]
    for step in resumed:
        for key in ("train/loss", "train/grad_norm", "train/lr(1e-3)"):
            assert resumed[step][key] == pytest.approx(original[step][key], rel=1e-6), (step, key)
    assert resumed[8]["val/loss"] == pytest.approx(original[8]["val/loss"], rel=1e-6)
    assert sorted(p.name for p in resumed_dir.glob("global_step_*")) == ["global_step_8"]
    auto = _trainer(run_dir)  # resume_mode=auto: the run is complete, nothing to do
    assert auto.fit() == {}


def test_the_run_ends_with_its_last_epoch_before_total_training_steps(tmp_path):
    """verl's SFT loop runs total_epochs epochs at most: total_training_steps past them stops
    nothing later (here 2 steps of 64 rows, 1 epoch, 5 steps asked for)."""
    run_dir = tmp_path / "run"
    trainer = _trainer(
        run_dir,
        "data.train_max_samples=128",
        "trainer.total_epochs=1",
        "trainer.total_training_steps=5",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
    )
    trainer.fit()
    assert sorted(_metrics(run_dir)) == [1, 2]


def test_lora_trains_the_adapters_of_the_target_modules_with_clipped_sgd(tmp_path):
    trainer = _trainer(
        tmp_path,
        "model.lora_rank=4",
        "model.lora_alpha=8",
        "model.target_modules=[q_proj,v_proj]",
        "optim.optimizer=SGD",
        "optim.lr=1.0",
        "optim.weight_decay=0.0",
        "optim.clip_grad=0.001",
    )
    model = trainer.learner.model()
    adapted = adapted_modules(model)
    assert adapted and all(p.endswith(("q_proj", "v_proj")) for p in adapted)
    layers = linear_layers(model)
    assert {layers[path].lora_scale for path in adapted} == {2.0}  # alpha / rank
    variables = jax.tree.leaves(
        trainer.learner.trainable, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )
    assert {type(v) for v in variables} == {LoRAParam}
    before = jax.tree.map(np.asarray, (trainer.learner.trainable, trainer.learner.frozen))
    metrics = trainer.train_step(next(iter(trainer.train_loader.epoch(0))), 1, 0, {}).metrics
    after = jax.tree.map(np.asarray, (trainer.learner.trainable, trainer.learner.frozen))
    jax.tree.map(np.testing.assert_array_equal, before[1], after[1])
    # plain SGD at lr 1 moves the adapters by the clipped gradient: a step of norm clip_grad
    moved = optax.tree.norm(jax.tree.map(np.subtract, after[0], before[0]))
    assert metrics["train/grad_norm"] > 0.01
    assert float(moved) == pytest.approx(0.001, rel=1e-3)
    trainer.save_checkpoint(1)
    trainer.checkpoints.close()
    manifest = json.loads((tmp_path / "global_step_1" / "checkpoint.json").read_text())
    assert manifest["roles"]["actor"]["lora"]["rank"] == 4


def test_command_line_help_and_errors(tmp_path, capsys):
    from jrl import sft

    assert sft.main(["--help"]) == {}
    assert "python -m jrl.sft --config=configs/gsm8k_sft.py" in capsys.readouterr().out
    failed = subprocess.run(
        [sys.executable, "-m", "jrl.sft", "data.truncation=middle", "optim.lr_scheduler=linear"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 2
    assert failed.stderr.startswith("jrl.sft: error: invalid configuration:")
    assert "data.truncation='middle'" in failed.stderr and "optim.lr_scheduler" in failed.stderr


def test_model_options_reach_the_model(tmp_path):
    with pytest.warns(UserWarning, match="cpu_offload and .offload_params: parameters"):
        trainer = _trainer(
            tmp_path,
            "model.fsdp_config.model_dtype=bf16",
            "model.enable_gradient_checkpointing=true",
            "model.use_liger=true",
            "use_remove_padding=true",
            "model.fsdp_config.cpu_offload=true",
            "model.fsdp_config.offload_params=true",
        )
    dtypes = {x.dtype for x in jax.tree.leaves(trainer.learner.params)}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    assert trainer.learner.model().config.remat_policy == "full"
    assert trainer.spec.loss.impl == "auto" and trainer.spec.plan.packing is not None
    with pytest.raises(FileNotFoundError, match="model.partial_pretrain"):
        _trainer(tmp_path, f"model.partial_pretrain={tmp_path / 'nowhere'}")


@pytest.mark.parametrize("liger", [False, True])
def test_sequence_parallelism_trains_as_without_it(tmp_path, monkeypatch, liger):
    """``ulysses_sequence_parallel_size=2`` on 4 devices (2 data-parallel ranks, as the 2 devices
    without it): the same losses, gradient norms and held-out loss, step by step, with the naive
    loss and the fused one (``model.use_liger``); only that run traces Ulysses' all-to-alls."""
    steps = ["trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=-1"]
    traced = []
    all_to_all = jax.lax.all_to_all
    monkeypatch.setattr(
        jax.lax, "all_to_all", lambda *a, **k: traced.append(1) or all_to_all(*a, **k)
    )
    runs, swaps = {}, {}
    for sp, devices in ((1, 2), (2, 4)):
        run_dir = tmp_path / f"sp{sp}"
        trainer = _trainer(
            run_dir,
            *steps,
            "use_remove_padding=True",
            f"ulysses_sequence_parallel_size={sp}",
            f"trainer.n_gpus_per_node={devices}",
            f"model.use_liger={liger}",
        )
        assert dict(trainer.mesh.shape)["sequence"] == sp
        traced.clear()
        trainer.fit()
        runs[sp], swaps[sp] = _metrics(run_dir), len(traced)
    assert swaps[1] == 0 and swaps[2] > 0
    for step in (1, 2):
        for key in ("train/loss", "train/grad_norm"):
            assert runs[2][step][key] == pytest.approx(runs[1][step][key], rel=1e-4), (step, key)
    assert runs[2][2]["val/loss"] == pytest.approx(runs[1][2]["val/loss"], rel=1e-4)


def test_sequence_parallelism_needs_packed_rows_and_a_dividing_size():
    args = digits_sft_args(Path("unused"), "ulysses_sequence_parallel_size=2")
    with pytest.raises(ConfigError, match="needs use_remove_padding=True"):
        load_entry_config(args, SFT, validate_sft)
    args = digits_sft_args(Path("unused"), "ulysses_sequence_parallel_size=3")
    with pytest.raises(ConfigError, match=r"ulysses_sequence_parallel_size \(3\) must divide"):
        load_entry_config([*args, "use_remove_padding=True"], SFT, validate_sft)
    # The batch splits over the data-parallel ranks: 4 devices / 2 = 2 ranks x 16 rows.
    args = digits_sft_args(
        Path("unused"), "ulysses_sequence_parallel_size=2", "use_remove_padding=True"
    )
    load_entry_config(
        [*args, "trainer.n_gpus_per_node=4", "data.train_batch_size=32"], SFT, validate_sft
    )
    with pytest.raises(ConfigError, match=r"ranks \(trainer.nnodes \* trainer.n_gpus_per_node = "):
        load_entry_config(
            [*args, "trainer.n_gpus_per_node=4", "data.train_batch_size=48"], SFT, validate_sft
        )
