"""Loading models from Hugging Face folders or GGUF files, and exporting Hugging Face folders."""

from __future__ import annotations

import collections
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

from jrl.models.config import ARCHITECTURE_PREFIX, ModelConfig
from jrl.models.decoder import CausalLM, ValueModel, model_class
from jrl.models.gguf_io import GGUFCheckpoint
from jrl.models.safetensors_io import (
    DEFAULT_MAX_SHARD_BYTES,
    SafetensorsCheckpoint,
    atomic_directory,
    write_safetensors,
)
from jrl.models.weights import TensorSpec, hf_tensor_specs, initial_score_head, load_params

_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def _resolve(path: str | os.PathLike) -> Path:
    """A local path, or a Hugging Face hub id downloaded to the local hub cache."""
    local = Path(path).expanduser()
    if local.exists():
        return local
    if _HUB_ID.fullmatch(str(path)) and not str(path).startswith("."):
        from huggingface_hub import snapshot_download

        try:
            return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))
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
        raise FileNotFoundError(
            f"{folder} has no config.json; expected a Hugging Face model folder "
            "(config.json + model.safetensors) or a .gguf file"
        )
    return json.loads(file.read_text())


def _open_checkpoint(path: str | os.PathLike) -> tuple[ModelConfig, Mapping[str, Any]]:
    resolved = _resolve(path)
    if resolved.is_file():
        if resolved.suffix != ".gguf":
            raise ValueError(f"{resolved}: expected a Hugging Face folder or a .gguf file")
        checkpoint = GGUFCheckpoint(resolved)
        return checkpoint.config, checkpoint
    config = ModelConfig.from_hf(_read_config_json(resolved))
    return config, SafetensorsCheckpoint(resolved)


def from_pretrained(
    path: str | os.PathLike,
    *,
    kind: str = "causal_lm",
    dtype: Any = jnp.float32,
    param_dtype: Any = jnp.float32,
    seed: int = 0,
) -> CausalLM | ValueModel:
    """Loads a model from an HF folder (single or sharded safetensors), a hub id or a .gguf file.

    kind='value' builds a ValueModel: the backbone comes from the checkpoint (causal-LM or
    token-classification); its `score` head is loaded if present, else initialised from `seed`.
    """
    config, checkpoint = _open_checkpoint(path)
    cls = model_class(kind)
    abstract = nnx.eval_shape(
        lambda: cls(config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed))
    )
    if kind == "value" and "score.weight" not in checkpoint:
        checkpoint = collections.ChainMap(checkpoint, initial_score_head(config, seed))
    return load_params(abstract, checkpoint, where=str(path))


def _hf_config(config: ModelConfig, kind: str) -> dict[str, Any]:
    hf = config.to_hf()
    prefix = ARCHITECTURE_PREFIX[config.model_type]
    if kind == "value":
        hf["architectures"] = [f"{prefix}ForTokenClassification"]
        hf["id2label"], hf["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    else:
        hf["architectures"] = [f"{prefix}ForCausalLM"]
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
        write_safetensors(tmp, specs, max_shard_bytes)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)


def save_pretrained(
    model: CausalLM | ValueModel,
    path: str | os.PathLike,
    tokenizer: Any = None,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> None:
    """Writes an HF folder that transformers loads (config.json, generation_config.json,
    safetensors weights in the parameter dtype, and the tokenizer if given).

    The folder is written next to `path` and renamed into place, replacing any previous one.
    """
    kind = "value" if isinstance(model, ValueModel) else "causal_lm"
    _write_hf_folder(path, model.config, kind, hf_tensor_specs(model), tokenizer, max_shard_bytes)


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
