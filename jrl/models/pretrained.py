"""Loading models from Hugging Face folders or GGUF files, and exporting Hugging Face folders."""

from __future__ import annotations

import collections
import dataclasses
import importlib
import json
import os
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl.models.config import ModelConfig
from jrl.models.decoder import CausalLM, RewardModel, ValueModel, model_class
from jrl.models.gguf_io import GGUFCheckpoint
from jrl.models.safetensors_io import (
    DEFAULT_MAX_SHARD_BYTES,
    SafetensorsCheckpoint,
    atomic_directory,
    write_safetensors,
)
from jrl.models.streaming import ArraySource, stream_params
from jrl.models.weights import TensorSpec, hf_tensor_specs, initial_score_head

_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def _resolve(
    path: str | os.PathLike, patterns: tuple[str, ...] = ("*.json", "*.safetensors")
) -> Path:
    """A local path, or a Hugging Face hub id whose files matching `patterns` are downloaded to
    the local hub cache."""
    local = Path(path).expanduser()
    if local.exists():
        return local
    if _HUB_ID.fullmatch(str(path)) and not str(path).startswith("."):
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(str(path), allow_patterns=list(patterns)))
        except Exception as err:
            raise FileNotFoundError(
                f"model path {path!r} is neither a local folder nor a reachable hub model: {err}"
            ) from err
    raise FileNotFoundError(
        f"model path {str(path)!r} does not exist; give a Hugging Face folder (config.json + "
        "model.safetensors) or a .gguf file"
    )


def _read_config_json(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if not file.is_file():
        names = sorted(p.name for p in folder.iterdir())
        found = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if names[12:] else "")
        ggufs = [name for name in names if name.endswith(".gguf")]
        hint = f"; to load the GGUF file, pass its path ({folder / ggufs[0]})" if ggufs else ""
        raise FileNotFoundError(
            f"folder {folder} has no config.json; it contains: {found or 'nothing'}. Expected a "
            f"Hugging Face model folder (config.json + model.safetensors) or a .gguf file{hint}"
        )
    return json.loads(file.read_text())


def _open_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, Mapping[str, ArraySource]]:
    resolved = _resolve(path)
    if resolved.is_file():
        if resolved.suffix != ".gguf":
            raise ValueError(
                f"file {resolved} is not a .gguf file; give a .gguf file or a Hugging Face model "
                "folder (config.json + model.safetensors)"
            )
        checkpoint = GGUFCheckpoint(resolved)
        return checkpoint.config, checkpoint
    config = ModelConfig.from_hf(_read_config_json(resolved))
    return config, SafetensorsCheckpoint(resolved)


def abstract_pretrained(
    path: str | os.PathLike,
    *,
    kind: str = "causal_lm",
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    seed: int = 0,
    external_lib: str | None = None,
    override_config: Mapping[str, Any] | None = None,
) -> CausalLM | ValueModel | RewardModel:
    """The model `from_pretrained` would load, as shapes only (`nnx.eval_shape`): built from the
    folder's config.json (or a GGUF file's metadata) with `override_config` applied; no weight is
    read. For compiling a run's programs without its weights (`jrl.compile`)."""
    if external_lib:
        _import_external_lib(external_lib)
    resolved = _resolve(path, patterns=("*.json",))
    if resolved.is_file():
        config = _open_checkpoint(resolved)[0]
    else:
        config = ModelConfig.from_hf(_read_config_json(resolved))
    config = apply_override_config(config, override_config or {})
    return _shapes(config, kind, dtype, param_dtype, seed)


def _shapes(config: ModelConfig, kind: str, dtype: Any, param_dtype: Any, seed: int) -> Any:
    """The `kind` model of `config` as shapes only."""
    cls = model_class(kind)
    return nnx.eval_shape(
        lambda: cls(config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed))
    )


# The entries of verl's override_config that are not model config values: the kernel's name
# (`apply_override_config` reads it) and Megatron's MoE options (the run's settings read them).
OVERRIDE_SECTIONS = ("model_config", "attn_implementation", "moe_config")


def apply_override_config(config: ModelConfig, override: Mapping[str, Any]) -> ModelConfig:
    """`config` with verl's ``override_config`` applied: its top-level config values (verl's FSDP
    form, e.g. ``rope_theta``) and those of ``model_config`` (Megatron's form) replace
    config.json's, a section merged into the value it names; ``attn_implementation`` picks the
    kernel. Dropout is not modelled, so a non-zero dropout is refused."""
    values = {k: v for k, v in override.items() if k not in OVERRIDE_SECTIONS}
    values.update(override.get("model_config") or {})
    dropouts = {k: v for k, v in values.items() if "dropout" in k and v}
    if dropouts:
        raise ValueError(f"override_config sets {dropouts}: dropout is not supported; use 0")
    if values:
        hf = config.to_hf()
        for key, value in values.items():
            hf[key] = {**(hf.get(key) or {}), **value} if isinstance(value, Mapping) else value
        config = ModelConfig.from_hf(hf)
    attn = override.get("attn_implementation")
    if attn:
        config = dataclasses.replace(config, attn_implementation=str(attn))
    return config


def _import_external_lib(name: str) -> None:
    """Imports verl's `external_lib` (a package that registers models or tokenizers)."""
    try:
        importlib.import_module(name)
    except Exception as err:
        raise ImportError(
            f"actor_rollout_ref.model.external_lib={name!r} cannot be imported "
            f"({type(err).__name__}: {err}); install it or add its folder to PYTHONPATH"
        ) from err


def from_pretrained(
    path: str | os.PathLike,
    *,
    kind: str = "causal_lm",
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    seed: int = 0,
    mesh: Mesh | None = None,
    trust_remote_code: bool = False,
    external_lib: str | None = None,
    override_config: Mapping[str, Any] | None = None,
) -> CausalLM | ValueModel | RewardModel:
    """Loads a model from an HF folder (single or sharded safetensors), a hub id or a .gguf file.

    Tensors are streamed one at a time onto the default device, or onto `mesh` as
    `jrl.parallel.param_shardings` lays them out, so host memory never holds the whole model.
    kind='value' builds a ValueModel: the backbone comes from the checkpoint (causal-LM or
    token-classification); its `score` head is loaded if present, else initialised from `seed`.
    kind='reward' builds a RewardModel from a sequence-classification checkpoint with one label
    (its `score` head is required). `external_lib` is imported first. `trust_remote_code` is
    verl's key, accepted unchanged: the decoder is always jrl's own, built from config.json, so no
    repository code runs here whatever its value.
    `override_config` is verl's ``model.override_config``: its config values (top-level or under
    ``model_config``) replace config.json's, and ``attn_implementation`` (eager / sdpa /
    flash_attention_2) picks the attention kernel.
    """
    if external_lib:
        _import_external_lib(external_lib)
    config, checkpoint = _open_checkpoint(path)
    config = apply_override_config(config, override_config or {})
    abstract = _shapes(config, kind, dtype, param_dtype, seed)
    if kind == "value":  # a fresh head, or a reward model's (bias 0), as transformers loads it
        fresh = initial_score_head(config, seed)
        missing = {name: fresh[name] for name in fresh if name not in checkpoint}
        if "score.weight" in missing:
            missing = fresh
        checkpoint = collections.ChainMap(checkpoint, missing)
    if kind == "reward":
        _check_reward_head(checkpoint, str(path))
    return stream_params(abstract, checkpoint, where=str(path), mesh=mesh)


def _check_reward_head(checkpoint: Mapping[str, ArraySource], where: str) -> None:
    """A reward checkpoint must hold a one-label sequence-classification head."""
    if "score.weight" not in checkpoint:
        raise KeyError(
            f"{where}: kind='reward' needs a sequence-classification checkpoint (e.g. "
            "Qwen2ForSequenceClassification with num_labels=1), but it has no score.weight"
        )
    labels = tuple(checkpoint["score.weight"].shape)[0]
    if labels != 1:
        raise ValueError(
            f"{where}: score.weight has {labels} labels; a reward model needs num_labels=1"
        )
    bias = checkpoint.get("score.bias")
    if bias is not None and np.any(bias[tuple(slice(None) for _ in bias.shape)] != 0):
        raise ValueError(
            f"{where}: score.bias is not 0, but jrl's reward head has no bias (the "
            "sequence-classification layout), so every reward would move; use a checkpoint "
            "without it or with it 0"
        )


_HEAD_ARCHITECTURES = {
    "causal_lm": "ForCausalLM",
    "value": "ForTokenClassification",
    "reward": "ForSequenceClassification",
}


def _hf_config(config: ModelConfig, kind: str) -> dict[str, Any]:
    hf = config.to_hf()
    hf["architectures"] = [config.family.architecture + _HEAD_ARCHITECTURES[kind]]
    if kind != "causal_lm":
        hf["id2label"], hf["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    return hf


def _write_hf_folder(
    path: str | os.PathLike,
    config: ModelConfig,
    kind: str,
    specs: list[TensorSpec],
    tokenizer: Any = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> None:
    dtypes = {str(spec.dtype) for spec in specs}
    hf_config = {
        **_hf_config(config, kind),
        "torch_dtype": dtypes.pop() if len(dtypes) == 1 else "float32",
    }
    ids = config.to_hf()
    generation = {
        k: ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if ids[k] is not None
    }
    with atomic_directory(path) as tmp:
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
        if specs:
            write_safetensors(tmp, specs, max_shard_bytes)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)


def save_pretrained(
    model: CausalLM | ValueModel | RewardModel,
    path: str | os.PathLike,
    tokenizer: Any = None,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    weights: bool = True,
) -> None:
    """Writes an HF folder that transformers loads (config.json, generation_config.json,
    safetensors weights in the parameter dtype, and the tokenizer if given). With
    ``weights=False`` only the configs and the tokenizer are written.

    Parameters (sharded over a mesh or not) are gathered to host and written one at a time; LoRA
    adapters are merged into their base kernels, so the folder is a plain model. The folder is
    written next to `path` and renamed into place, replacing any previous one.
    """
    kinds = {ValueModel: "value", RewardModel: "reward"}
    kind = kinds.get(type(model), "causal_lm")
    specs = hf_tensor_specs(model) if weights else []
    _write_hf_folder(path, model.config, kind, specs, tokenizer, max_shard_bytes)


def gguf_to_hf_folder(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Converts a llama GGUF into an HF folder: float32 safetensors, config.json,
    generation_config.json and the tokenizer (with the GGUF's chat template). Atomic."""
    from jrl.models.gguf_tokenizer import tokenizer_from_gguf  # imports transformers (slow)

    checkpoint = GGUFCheckpoint(gguf_path)
    specs = [
        TensorSpec(
            name, checkpoint.hf_shape(name), np.dtype(np.float32), partial(checkpoint.get, name)
        )
        for name in checkpoint
    ]
    tokenizer = tokenizer_from_gguf(checkpoint.reader, gguf_path)
    _write_hf_folder(out_dir, checkpoint.config, "causal_lm", specs, tokenizer)
    return Path(out_dir).expanduser().absolute()
